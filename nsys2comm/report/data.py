"""Fetching the report's data: catalog queries only, each failure kept as a reason instead of an exception."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from .. import catalog


def _fallback_run_query(con, name: str, params: dict | None) -> pl.DataFrame:
    obj = catalog.find(name)
    if obj is None:
        raise LookupError(f"the catalog has no object named {name!r}")
    params = params or {}
    if obj.kind == "macro":
        args = ", ".join(f"{k} := ${k}" for k in params)
        return con.sql(f"SELECT * FROM {name}({args})", params=params).pl()
    return con.sql(f"SELECT * FROM {name}").pl()


def run_query(con, name: str, params: dict | None = None) -> pl.DataFrame:
    """nsys2comm.analysis.run_query when present, else a direct catalog call (same result).

    Canonical tables (documented catalog objects too) are read directly."""
    obj = catalog.find(name)
    if obj is not None and obj.kind == "table":
        return _fallback_run_query(con, name, params)
    try:
        from ..analysis import run_query as rq  # type: ignore[attr-defined]
    except ImportError:
        return _fallback_run_query(con, name, params)
    return rq(con, name, params or {})


@dataclass
class Fetched:
    """Query results by name, and why the ones that failed did."""

    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> pl.DataFrame | None:
        df = self.frames.get(name)
        return df if df is not None and df.height else None


def fetch(con, queries: dict[str, tuple[str, dict]]) -> Fetched:
    """Run ``{key: (catalog name, params)}``; a query that fails or is missing is recorded, not raised."""
    out = Fetched()
    try:  # compute the shared sweeps once for all the queries below (TEMP snapshots, dropped afterwards)
        from ..analysis import materialize, unmaterialize
        materialize(con)
    except Exception:  # noqa: BLE001 - without snapshots every query computes live (same results, slower)
        try:
            unmaterialize(con)  # drop a partial snapshot
        except Exception:  # noqa: BLE001
            pass
        unmaterialize = None
    try:
        _fetch_all(con, queries, out)
    finally:
        if unmaterialize is not None:
            unmaterialize(con)
    return out


def _fetch_all(con, queries: dict[str, tuple[str, dict]], out: Fetched) -> None:
    for key, (name, params) in queries.items():
        if catalog.find(name) is None:
            out.errors[key] = f"analysis '{name}' is not in this version's catalog"
            continue
        try:
            out.frames[key] = run_query(con, name, params)
        except Exception as e:  # noqa: BLE001 - one failing analysis must not sink the report
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            out.errors[key] = f"analysis '{name}' failed: {first[:300]}"
