"""Opening job databases: path checks, schema install, read-only sessions that cannot touch other files, and the
writer lock.

A read-only session (``connect(path)``) reads its own database and nothing else: DuckDB's
``enable_external_access`` is off with the database's own files as ``allowed_paths`` (so no COPY TO, EXPORT,
ATTACH, file or URL readers, secrets, INSTALL or LOAD), extension autoload and autoinstall are off, and
``lock_configuration`` stops SQL from turning any of it back on or pointing profiling or query logs at a file.
"""

from __future__ import annotations

import os
import time
import weakref
from pathlib import Path
from typing import Any

import duckdb

from .. import catalog
from ..errors import InputError, UsageError
from . import template

# cache builds on nothing here: the connection primitives it needs (settle, held_descriptor, the sweeps' memory)
# live there, and this module re-exports them
from .sweeps import WRITER_MEMORY_LIMIT, catalog_installed, held_descriptor, use_cache
from .sweeps import settle as settle
from .sweeps import sweep_memory_limit as sweep_memory_limit

SCHEMA_VERSION = 1  # bump when the canonical tables change incompatibly
DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of every DuckDB database file
# never fetch or load an extension behind the user's back (must be set before the database starts)
_NO_EXTENSIONS: dict[str, Any] = {"autoload_known_extensions": False, "autoinstall_known_extensions": False}
THREADS_ENV = "NSYS2COMM_THREADS"


def _threads() -> dict[str, Any]:
    """DuckDB's threads where NSYS2COMM_THREADS sets them (default: one per core): for a job epilogue that shares its
    node with the next job, and for test workers that already keep every core busy."""
    v = os.environ.get(THREADS_ENV, "").strip()
    if not v:
        return {}
    if not v.isdigit() or int(v) < 1:
        raise UsageError(f"{THREADS_ENV}={v!r} is not a positive whole number",
                         hint=f"e.g. {THREADS_ENV}=4, or unset it")
    return {"threads": int(v)}


def base_config() -> dict[str, Any]:
    """The DuckDB configuration of every connection this package opens (no extensions; NSYS2COMM_THREADS)."""
    return {**_NO_EXTENSIONS, **_threads()}


_INGEST_IT = "to ingest it: nsys2comm ingest FILE --db run.duckdb"


def quiet(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """No DuckDB progress bar: it prints to stdout, into the rows of a script or job epilogue that captures it (the
    CLI shows its own progress on stderr). Cursors of the connection inherit the setting. A further connection to
    a database this process has open read-only shares its sealed, unchangeable configuration: it keeps DuckDB's
    default (the setting is per connection and cannot be made global)."""
    if not con.execute("SELECT current_setting('lock_configuration')").fetchall()[0][0]:
        con.execute("SET enable_progress_bar = false")
    return con


def memory_connection() -> duckdb.DuckDBPyConnection:
    """A scratch in-memory DuckDB (no extensions, no progress bar) for SQL over frames or Parquet views."""
    return quiet(duckdb.connect(":memory:", config=base_config()))


def _install_temp_objects(con: duckdb.DuckDBPyConnection) -> None:
    """Macros and views as TEMP objects: work on read-only databases and always match this package."""
    catalog.install(con, temp=True)


def catalog_session() -> duckdb.DuckDBPyConnection:
    """A scratch in-memory DuckDB holding this package's catalog over empty canonical tables, for SQL over Parquet
    views: TEMP views of the canonical tables' names shadow the empty tables for every catalog object. A copy of
    the catalog template (≈ 0.1 s; installing the catalog binds for 1-5 s, paid by every open of a Parquet job)."""
    con = template.memory_copy(base_config())
    if con is None:
        con = memory_connection()
        _install_temp_objects(con)
    return quiet(con)


def _check_is_job_db(con: duckdb.DuckDBPyConnection, path: str) -> None:
    have = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary").fetchall()}
    if have and "files" not in have:
        raise InputError("is a DuckDB database but not an nsys2comm job database", path=path,
                         hint="give a new path, or a database created by 'nsys2comm ingest'")


def _what_is(head: bytes) -> str:
    if not head:
        return "is empty, not a DuckDB database"
    if head.startswith(b"SQLite format 3\x00"):
        return f"is an SQLite file, not a DuckDB database ({_INGEST_IT} if it is an nsys export)"
    if head[:2] == b"\x1f\x8b":
        return f"is a gzip file, not a DuckDB database ({_INGEST_IT} if it is a Kineto trace)"
    if head.lstrip()[:1] in (b"{", b"["):
        return f"is a JSON file, not a DuckDB database ({_INGEST_IT} if it is a Kineto trace)"
    return "is not a DuckDB database"


def read_head(path: str | Path, n: int) -> bytes:
    """The first ``n`` bytes of a file that may be a database this process has open (``held_descriptor``)."""
    fd = held_descriptor(path)
    if fd is not None:
        return os.pread(fd, n, 0)
    with open(path, "rb") as f:
        return f.read(n)


def check_db_path(path: str | Path, *, write: bool) -> None:
    """A job database is a DuckDB file or, for a writer, a new path; anything else is refused before DuckDB opens
    it (DuckDB opens an existing JSON or CSV file as an empty in-memory database, and autoloads the sqlite
    extension for an SQLite file)."""
    p = Path(path)
    if not p.exists():
        if write:
            return
        raise InputError("no such database", path=str(p),
                         hint="create it by ingesting traces into it (nsys2comm ingest, or Job.ingest)")
    if p.is_dir():
        raise InputError("is a directory, not a DuckDB database", path=str(p),
                         hint="give a .duckdb file made by 'nsys2comm ingest', or a new path")
    try:
        head = read_head(p, 4096)
    except OSError as e:
        raise InputError(f"cannot read ({e.strerror})", path=str(p), hint="check the path and permissions") from None
    if len(head) >= 12 and head[8:12] == DUCKDB_MAGIC:
        return
    if write and len(head) < 12 and _locked_by_another_process(p):
        return  # another writer is creating it: connect() waits for its lock, then finds a database
    raise InputError(_what_is(head), path=str(p),
                     hint="give a job database made by 'nsys2comm ingest', or a new path; the file was not changed")


def _locked_by_another_process(p: Path) -> bool:
    """True while another process holds a lock on the file (DuckDB locks a database file before it writes the
    header, so a new job DB can look empty for a moment to a second writer)."""
    import fcntl

    try:
        with open(p, "r+b") as f:
            try:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.lockf(f, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def seal_read_only(con: duckdb.DuckDBPyConnection, allowed_paths: list[str] | tuple[str, ...] = ()) -> None:
    """No file or network access beyond ``allowed_paths`` and no extension loading, for the rest of this
    database instance's life (the settings are global to the instance, and locked)."""
    if con.execute("SELECT current_setting('lock_configuration')").fetchall()[0][0]:
        # another connection of this process sealed the same instance already
        if con.execute("SELECT current_setting('enable_external_access')").fetchall()[0][0]:
            raise InputError("the database's configuration is locked with file access on",
                             hint="open it in a process that has not opened it otherwise")
        return
    if allowed_paths:
        con.execute("SET allowed_paths = ?", [list(allowed_paths)])
    con.execute("SET enable_external_access = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET lock_configuration = true")


def _writer_temp_directory() -> str:
    import tempfile

    d = os.path.join(tempfile.gettempdir(), "nsys2comm-duckdb-spill")
    os.makedirs(d, exist_ok=True)
    return d


# Rows per row group in what a writer stores (ATTACH's ROW_GROUP_SIZE; DuckDB's default is 122,880). DuckDB logs a
# table smaller than one row group in the write-ahead log, and the checkpoint then writes it again, on one core,
# after everything else: the stored sweeps of a 1M-kernel nsys export (100k rows each) left 116 MB in the log and
# took 0.3-0.5 s to checkpoint. Smaller row groups are written as they fill, by the threads that make them.
WRITER_ROW_GROUP_ROWS = 16_384
_RESERVED_ALIASES = {"memory", "system", "temp"}


def _connect_writer(path: str, config: dict) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(path)`` for writing, with ``WRITER_ROW_GROUP_ROWS``: the file is attached to an in-memory
    instance, whose own database is then detached so that the file is the default of the connection and its
    cursors. Where a DuckDB leaves cursors without a default after that (1.2-1.4), a plain connection."""
    stem = Path(path).stem
    name = stem if stem and stem.lower() not in _RESERVED_ALIASES else "job"
    alias = '"' + name.replace('"', '""') + '"'
    con = duckdb.connect(":memory:", config=dict(config, temp_directory=path + ".tmp"))  # DuckDB's spill default
    try:
        con.execute(f"ATTACH {catalog.sql_string(path)} AS {alias} (ROW_GROUP_SIZE {WRITER_ROW_GROUP_ROWS})")
        con.execute(f"USE {alias}")
        con.execute("DETACH memory")
        with con.cursor() as cur:
            if cur.execute("SELECT current_database()").fetchall()[0][0] == name:
                return con
    except duckdb.IOException:  # a lock, or not a database: as duckdb.connect says it
        con.close()
        raise
    except duckdb.Error:  # an older DuckDB without the option or this default
        pass
    con.close()
    return duckdb.connect(path, config=config)


def _open_waiting(path: str, write: bool, config: dict, lock_timeout_s: float) -> duckdb.DuckDBPyConnection:
    """duckdb.connect, waiting up to ``lock_timeout_s`` while another process holds the file."""
    deadline = time.monotonic() + lock_timeout_s
    while True:
        try:
            return quiet(_connect_writer(path, config) if write else
                         duckdb.connect(path, read_only=True, config=config))
        except duckdb.IOException as e:
            msg = str(e)
            if "lock" not in msg.lower():
                raise InputError(f"cannot open as a DuckDB database ({msg.splitlines()[0]})", path=path,
                                 hint="give the path of a job database created by 'nsys2comm ingest'") from None
            if time.monotonic() >= deadline:
                raise InputError("database is locked by another nsys2comm/duckdb process", path=path,
                                 hint=f"waited {lock_timeout_s:g} s; retry when it finishes, or wait longer "
                                      "(the lock timeout)") from None
            time.sleep(0.2)


def ensure_template() -> bool:
    """Build the catalog template that new job databases copy (``dbtemplate``) where this machine has none yet;
    otherwise the first new database on the machine builds it (≈ 1.3-1.9 s of DuckDB binding). True when this
    call built it. For images and nodes whose user cache starts empty, and for benchmarks of steady-state ingest."""
    return template.ensure(base_config())


def memory_job(config: dict[str, Any] | None = None, *, objects: bool = True) -> duckdb.DuckDBPyConnection:
    """A new in-memory job database (no extensions, no progress bar, DuckDB ``config`` besides) holding the catalog:
    a copy of the catalog template (``template.memory_copy``, ≈ 0.1 s). Where there is no usable template the
    catalog is installed (2-15 s of binding under load); ``objects=False`` then creates the canonical tables alone
    and the caller installs the macros and views (``ingest`` does, while the first file decodes)."""
    config = dict(base_config(), **(config or {}))
    con = template.memory_copy(config)
    if con is None:
        con = duckdb.connect(":memory:", config=config)
        catalog.install(con, tables_only=not objects)
    else:
        _FRESH_COPIES.add(con)
    return quiet(con)


# In-memory jobs that memory_job copied from a checked template and that no ingest has taken yet: their catalog is
# known to be this package's, so the ingest they are opened for skips a second catalog.is_installed (35-130 ms).
_FRESH_COPIES: weakref.WeakSet = weakref.WeakSet()


def take_fresh_copy(con) -> bool:
    """True, once, for a connection ``memory_job`` copied from a checked template (``ingest`` asks before it checks
    the catalog); False for any other connection and from then on."""
    if con in _FRESH_COPIES:
        _FRESH_COPIES.discard(con)
        return True
    return False


def connect(path: str | Path | None = None, *, write: bool = False, lock_timeout_s: float = 60.0,
            memory_limit: str | None = None, objects: bool = True) -> duckdb.DuckDBPyConnection:
    """Open a job database. ``path=None`` gives an in-memory job (writable; seal it with ``seal_read_only``).

    Read-only sessions are sealed (module docstring). Writers wait up to ``lock_timeout_s`` for another process
    holding the file, then fail with a one-line error naming the database. Writers and in-memory jobs get
    ``WRITER_MEMORY_LIMIT`` (unless ``memory_limit`` says otherwise) and spill beyond it: to ``<db>.tmp`` beside
    a database file, to the system temp directory for an in-memory job.

    A writer's new database file, and an in-memory job (``memory_job``), is a copy of the template that holds the
    catalog (``dbtemplate``). ``objects=False`` (writers and in-memory jobs): where the catalog is not installed
    yet, only the canonical tables are created; the caller installs the macros and views (``ingest`` does, while
    the first file decodes).
    """
    if memory_limit is None and (write or path is None):
        memory_limit = WRITER_MEMORY_LIMIT
    config: dict[str, Any] = dict(base_config(), **({"memory_limit": memory_limit} if memory_limit else {}))
    if path is None:
        config["temp_directory"] = _writer_temp_directory()
        return memory_job(config, objects=objects)
    path = str(path)
    check_db_path(path, write=write)
    if write:
        template.create(path, base_config())  # a new database: the catalog comes installed
    con = _open_waiting(path, write, config, lock_timeout_s)
    try:
        _check_is_job_db(con, path)
        if write:
            if not catalog_installed(con):
                catalog.install(con, tables_only=not objects)  # helpers stay live: a writer never reads the cache
            return con
        if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'files'").fetchall()[0][0]:
            raise InputError("database has no nsys2comm tables", path=path,
                             hint="create it by ingesting traces into it (nsys2comm ingest, or Job.ingest)")
        own = str(Path(path).resolve())
        seal_read_only(con, [own, own + ".wal"])
        if not catalog_installed(con):  # written by another nsys2comm, or changed by hand since
            _install_temp_objects(con)
        use_cache(con)
    except BaseException:
        con.close()
        raise
    return con
