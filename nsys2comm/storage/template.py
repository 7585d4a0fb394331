"""New job databases start as a copy of a template that already holds the catalog.

Installing the catalog costs ≈ 1.9 s of DuckDB binding (a thousand CREATE and COMMENT statements) in every new job
database, against ≈ 1 ms to copy the 1 MB database file that holds them. The template is built once per catalog
digest and DuckDB version in the user cache directory (``usercache``), and is a cache like any other: the copy is
opened like any job database, whose catalog ``catalog.is_installed`` checks (digest and definitions) before a writer
trusts it, and reinstalls where it does not match.

In-memory job databases (traces opened directly, tests) copy it too (``memory_copy``): ``COPY FROM DATABASE`` takes
≈ 0.1 s where installing binds for 2-15 s under load. The first copy of a template file in a process is checked;
later copies of the same file (same inode, size and modification time) are the same bytes and are trusted.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb

from .. import catalog
from . import usercache


def template_path() -> Path:
    return usercache.directory() / f"job-template-{catalog.digest()}-duckdb-{duckdb.__version__}.duckdb"


def _build(target: Path, config: dict) -> None:
    """Write the template beside ``target`` and move it into place whole (concurrent builders: the last wins)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        con = duckdb.connect(str(tmp), config=config)
        try:
            catalog.install(con)
        finally:
            con.close()  # checkpoints: the template is one file, no WAL
        os.replace(tmp, target)
    finally:
        for leftover in (tmp, Path(f"{tmp}.wal")):
            leftover.unlink(missing_ok=True)


def ensure(config: dict) -> bool:
    """Build the template where this machine has none for this catalog and DuckDB version (True when this call
    built it). ``config`` is the DuckDB configuration to build it with."""
    tpl = template_path()
    if tpl.is_file():
        return False
    _build(tpl, config)
    return True


def create(path: str | Path, config: dict) -> bool:
    """Create the new job database ``path`` as a copy of the template (built first where missing). False where
    the caller must create it itself: ``path`` or its WAL exists, the cache directory cannot be written, or the file
    system has no hard links. ``config`` is the DuckDB configuration to build the template with.

    The copy appears at ``path`` whole, by a hard link that fails where ``path`` appeared meanwhile: a database
    another writer has just created is never replaced."""
    path = Path(path)
    if path.exists() or Path(f"{path}.wal").exists():
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.creating")
    try:
        ensure(config)
        shutil.copyfile(template_path(), tmp)
        os.link(tmp, path)
        return True
    except (OSError, duckdb.Error):  # another writer created it meanwhile (open theirs), no cache, no hard links
        return False
    finally:
        tmp.unlink(missing_ok=True)


# This process's verdicts on template files: (path, inode, size, mtime_ns) -> whether a copy passed
# catalog.is_installed. A file of one digest never changes in place (builders replace it whole).
_CHECKED: dict[tuple[str, int, int, int], bool] = {}
_ALIAS = "_nsys2comm_template"


def memory_copy(config: dict) -> duckdb.DuckDBPyConnection | None:
    """A new in-memory DuckDB (``config``) holding the catalog and empty canonical tables, copied from the template
    (built first where missing). None where there is no usable template: the cache directory cannot be written, the
    copy fails, or the template does not hold this package's catalog unchanged; the caller installs the catalog."""
    try:
        ensure(config)
        tpl = template_path()
        st = tpl.stat()
    except (OSError, duckdb.Error):
        return None
    state = (str(tpl), st.st_ino, st.st_size, st.st_mtime_ns)
    if _CHECKED.get(state) is False:
        return None
    con = duckdb.connect(":memory:", config=config)
    try:
        con.execute(f"ATTACH {catalog.sql_string(str(tpl))} AS {_ALIAS} (READ_ONLY)")
        try:
            con.execute(f"COPY FROM DATABASE {_ALIAS} TO memory")
        finally:
            con.execute(f"DETACH {_ALIAS}")
        if state not in _CHECKED:
            _CHECKED[state] = catalog.is_installed(con)
        if _CHECKED[state]:
            return con
    except duckdb.Error:
        pass
    con.close()
    return None
