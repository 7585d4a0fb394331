"""Run the documented SQL analyses (queries/<area>/*.sql) from Python.

``run_query(con, name, params)`` is the one entry point the CLI and the report use: the name must be a public
table macro or view of the catalog, parameter names must be among the macro's ``@param`` list, and values are
bound as prepared-statement parameters (never pasted into the SQL text).

``materialize(con)`` snapshots the shared helper sweeps into TEMP tables: the GPU timeline (behind
overlap_by_rank, time_breakdown_by_rank and overlap_by_step), the per-communication-kernel overlap (behind
comm_kernels, comm_overlap_by_collective and top_comm_kernels) and the cross-rank matching (behind
collective_skew and rank_wait), so a caller running several analyses pays for
each sweep once. The snapshot does not follow later ingests: call ``materialize`` again (or ``unmaterialize``)
after changing the data.

``refresh_cache(con)`` stores the same sweeps in the job database at the end of an ingest (``_cache_*``
tables, tagged with the ingested files) and ``use_cache(con)``, called by ``db.connect``, points the helper views
at them when they still match, so a fresh session pays for none of them.
"""

from __future__ import annotations

import re

import polars as pl

from . import catalog
from .errors import InputError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# helper views whose snapshot may replace the live computation: view name -> snapshot table
_MATERIALIZABLE = {"_gpu_timeline": "_gpu_timeline_snapshot",
                   "_comm_kernel_overlap": "_comm_kernel_overlap_snapshot",
                   "_skew_ops": "_skew_ops_snapshot"}


def _public_object(name: str) -> catalog.CatalogObject:
    obj = catalog.find(name) if isinstance(name, str) and _IDENT.match(name) else None
    if obj is None or not obj.public or obj.area == "prelude" or obj.kind == "table":
        known = ", ".join(sorted(o.name for o in catalog.public_queries()))
        raise InputError(f"unknown analysis {name!r}", hint=f"choose one of: {known}")
    return obj


def run_query(con, name: str, params: dict | None = None) -> pl.DataFrame:
    """Run a public analysis by name with named parameters; returns a polars DataFrame."""
    obj = _public_object(name)
    params = dict(params or {})
    if obj.kind == "view":
        if params:
            raise InputError(f"{name} takes no parameters", hint="drop the parameters")
        sql = f"SELECT * FROM {obj.name}"
        return con.sql(sql).pl()
    unknown = sorted(set(params) - set(obj.params))
    if unknown:
        allowed = ", ".join(obj.params) or "none"
        raise InputError(f"{name}: unknown parameter(s) {', '.join(unknown)}", hint=f"parameters of {name}: {allowed}")
    # names are validated identifiers from the catalog; values travel as bound parameters
    args = ", ".join(f"{k} := ${k}" for k in params)
    sql = f"SELECT * FROM {obj.name}({args})"
    return con.sql(sql, params=params or None).pl()


_CACHE_FINGERPRINT = "SELECT count(*) || ':' || coalesce(max(file_id), 0) FROM files"


def refresh_cache(con) -> None:
    """Store the shared sweeps in the job database (``_cache_*`` tables), tagged with the set of ingested files.

    Called by ingest after the last file, so later sessions (report, summary, query) read the sweeps instead of
    recomputing them; ``use_cache`` ignores a cache whose files no longer match.
    """
    con.execute("BEGIN TRANSACTION")
    try:
        for view, _ in _MATERIALIZABLE.items():
            con.execute(f"CREATE OR REPLACE TABLE _cache{view} AS SELECT * FROM {view}")
        con.execute(f"CREATE OR REPLACE TABLE _cache_fingerprint AS SELECT ({_CACHE_FINGERPRINT}) AS files_key")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def use_cache(con) -> bool:
    """Point the helper views at the stored sweeps when they match the ingested files (TEMP views only)."""
    names = ["_cache_fingerprint"] + [f"_cache{v}" for v in _MATERIALIZABLE]
    have = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND list_contains(?, table_name)", [names]).fetchall()}
    if "_cache_fingerprint" not in have or any(f"_cache{v}" not in have for v in _MATERIALIZABLE):
        return False
    stored = con.execute("SELECT files_key FROM _cache_fingerprint").fetchall()
    if not stored or stored[0][0] != con.execute(_CACHE_FINGERPRINT).fetchall()[0][0]:
        return False
    for view in _MATERIALIZABLE:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM _cache{view}")
    return True


def materialize(con) -> None:
    """Compute the shared helper views once (TEMP tables) and point the helpers at the snapshots."""
    for view, table in _MATERIALIZABLE.items():
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM {view}")
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {table}")


def unmaterialize(con) -> None:
    """Drop the snapshots: the helpers compute from the canonical tables again."""
    for view, table in _MATERIALIZABLE.items():
        obj = catalog.find(view)
        con.execute(f"DROP VIEW IF EXISTS temp.{view}")
        con.execute(f"DROP TABLE IF EXISTS temp.{table}")
        # read-only sessions hold the helper as a TEMP view only: recreate it
        if not con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [view]).fetchall()[0][0]:
            con.execute(obj.sql.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1))
    use_cache(con)
