"""Fetching the report's data: catalog queries only, each failure kept as a reason instead of an exception.

Every chart, finding and table declares the catalog columns it reads with :func:`consumes`; the registry
(:data:`CONSUMERS`) is tested against the catalog's ``@column`` docs, so a renamed column fails a test instead of
making a chart or finding vanish.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from ..analysis import run_query
from ..cache import materialize, unmaterialize

# consumer -> {catalog object: columns it reads}
CONSUMERS: dict[str, dict[str, tuple[str, ...]]] = {}


def consumes(**objects: tuple[str, ...]) -> Callable:
    """Declare the catalog columns a function reads: ``@consumes(overlap_by_rank=("rank", "comm_ns"))``."""
    def mark(fn: Callable) -> Callable:
        declare(f"{fn.__module__}.{fn.__qualname__}", **objects)
        fn.consumes = objects
        return fn
    return mark


def declare(consumer: str, **objects: tuple[str, ...]) -> None:
    """Register columns read by something that is not a function (a table layout)."""
    CONSUMERS[consumer] = {name: tuple(cols) for name, cols in objects.items()}


@dataclass(frozen=True)
class Query:
    """One catalog query of the report, and when its numbers cannot be computed.

    ``needs``: job facts (keys of ``sections.FACTS``) without which the result is not available; ``empty``: why
    no rows means not available; ``all_null``: a column that, NULL on every row, means not available, and why."""

    name: str
    params: dict = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    empty: str | None = None
    all_null: tuple[str, str] | None = None
    check: Callable[[pl.DataFrame], str | None] | None = None  # rows in, why not available (None: available)


@dataclass
class Fetched:
    """Query results by catalog name, and why the ones that failed or are not available are missing."""

    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    # what holds for the whole job (no communication, no message sizes, one rank): (diagnostics code, sentence),
    # said once in the report's banner; the sections then give their own one-line reason
    banner: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> pl.DataFrame | None:
        df = self.frames.get(name)
        return df if df is not None and df.height else None

    def drop(self, name: str, why: str) -> None:
        self.frames.pop(name, None)
        self.errors.setdefault(name, f"not available: {why}")


def fetch(con, queries: list[Query], more: Callable[[Fetched], list[Query]] | None = None) -> Fetched:
    """Run the queries once each (shared sweeps snapshotted for the batch); failures are recorded, not raised.
    ``more(fetched)``, given the results so far, names further queries for the same batch (the timeline's step,
    chosen from the iterations)."""
    out = Fetched()
    try:
        materialize(con)
    except Exception:  # noqa: BLE001 - a helper that cannot be snapshotted computes live; its queries say why
        unmaterialize(con)
    try:
        for q in queries:
            _run(con, q, out)
        for q in more(out) if more is not None else []:
            _run(con, q, out)
    finally:
        unmaterialize(con)
    return out


def _run(con, q: Query, out: Fetched) -> None:
    try:
        out.frames[q.name] = run_query(con, q.name, q.params)
    except Exception as e:  # noqa: BLE001 - one failing analysis must not sink the report
        out.errors[q.name] = f"analysis '{q.name}' failed: {str(e).strip()[:600] or type(e).__name__}"
