"""Opening job databases: schema install, read-only sessions, and the writer lock."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from . import analysis, catalog
from .errors import InputError

SCHEMA_VERSION = 1  # bump when the canonical tables change incompatibly


def _install_temp_objects(con: duckdb.DuckDBPyConnection) -> None:
    """Macros and views as TEMP objects: work on read-only databases and always match this package."""
    for obj in catalog.load_catalog():
        if obj.kind == "table":
            continue
        con.execute(obj.sql.replace("CREATE OR REPLACE MACRO", "CREATE OR REPLACE TEMP MACRO", 1)
                    .replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1))


def _check_is_job_db(con: duckdb.DuckDBPyConnection, path: str) -> None:
    have = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary").fetchall()}
    if have and "files" not in have:
        raise InputError("is a DuckDB database but not an nsys2comm job database", path=path,
                         hint="give a new --db path, or a database created by 'nsys2comm ingest'")


def connect(path: str | Path | None = None, *, write: bool = False, lock_timeout_s: float = 60.0,
            memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """Open a job database. ``path=None`` gives an in-memory job.

    Writers wait up to ``lock_timeout_s`` for another process holding the file, then fail with a clear message.
    """
    config = {"memory_limit": memory_limit} if memory_limit else {}
    if path is None:
        con = duckdb.connect(":memory:", config=config)
        catalog.install(con)
        return con
    path = str(path)
    if not write and not Path(path).exists():
        raise InputError("no such database", path=path, hint="create it with 'nsys2comm ingest TRACES --db PATH'")
    deadline = time.monotonic() + lock_timeout_s
    while True:
        try:
            con = duckdb.connect(path, read_only=not write, config=config)
            break
        except duckdb.IOException as e:
            msg = str(e)
            if "lock" not in msg.lower():
                raise InputError(f"cannot open as a DuckDB database ({msg.splitlines()[0]})", path=path,
                                 hint="give the path of a job database created by 'nsys2comm ingest'") from None
            if time.monotonic() >= deadline:
                raise InputError("database is locked by another nsys2comm/duckdb process", path=path,
                                 hint=f"waited {lock_timeout_s:.0f} s; retry when it finishes or raise --lock-timeout") from None
            time.sleep(0.2)
    _check_is_job_db(con, path)
    if write:
        catalog.install(con)
        analysis.use_cache(con)
        return con
    else:
        if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'files'").fetchone()[0]:
            raise InputError("database has no nsys2comm tables", path=path,
                             hint="create it with 'nsys2comm ingest TRACES --db PATH'")
        _install_temp_objects(con)
        analysis.use_cache(con)
    return con
