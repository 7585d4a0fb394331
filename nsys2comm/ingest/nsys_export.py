"""nsys importer: the SQLite export handle (read-only connection, columns by name, StringIds lookup, chunked fetch),
the header check that refuses truncated files, row-id arrays and rowid-range filters, and the export's table names.

What the importer reads, and why (privacy, clock, ranks, bad values), is written in ``nsys.py``'s docstring; the
readers of the row tables are in ``nsys_tables``. This module imports nothing from either.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputError
from ..limits import MAX_EVENT_BYTES
from .nvtx_payload import PayloadDecoder

SQLITE_MAGIC = b"SQLite format 3\x00"
CHUNK_ROWS = 200_000

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX = "NVTX_EVENTS"
PID_SHIFT = 24
PID_MASK = 0xFFFFFF

REEXPORT = "nsys export --type sqlite --include-blobs=true REPORT.nsys-rep"


def refuse(path: Path, what: str, hint: str) -> InputError:
    return InputError(what, path=str(path), hint=hint)


def check_header(path: Path) -> None:
    """Refuse truncated files before SQLite silently reads what is left of them."""
    try:
        with open(path, "rb") as f:
            hdr = f.read(100)
        size = path.stat().st_size
    except OSError as e:
        raise refuse(path, f"cannot read ({e.strerror})", "check the path and permissions") from None
    if len(hdr) < 100 or not hdr.startswith(SQLITE_MAGIC):
        raise refuse(path, "is a truncated SQLite file (incomplete header)", "copy or export the file again")
    page_size = int.from_bytes(hdr[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    n_pages = int.from_bytes(hdr[28:32], "big")
    if page_size < 512 or (n_pages and hdr[24:28] == hdr[92:96] and size < page_size * n_pages) or size % page_size:
        raise refuse(path, f"is a truncated or corrupt SQLite file ({size} bytes, header says "
                           f"{n_pages} pages of {page_size} bytes)", "copy or export the file again")


def _read_only_fs(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class Export:
    def __init__(self, path: Path, max_bytes: int = MAX_EVENT_BYTES):
        self.path, self.max_bytes = path, max_bytes
        wal = Path(str(path) + "-wal").exists()
        uri = f"file:{quote(str(path.resolve()))}?mode=ro" + ("" if wal else "&immutable=1")
        self.con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        try:
            self.tables = {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.OperationalError:
            self.con.close()  # a handle left open keeps the file (and its file system) busy
            if wal and (not os.access(path.parent, os.W_OK) or _read_only_fs(path.parent)):
                # reading a write-ahead log needs its -shm file beside it, which a read-only directory refuses
                raise refuse(path, "has a write-ahead log (-wal) beside it in a directory SQLite cannot write to",
                             "copy the .sqlite file and its -wal file to a writable directory, or merge the log "
                             "where it was written: sqlite3 FILE 'PRAGMA wal_checkpoint(TRUNCATE)'") from None
            raise
        self._cols: dict[str, set[str]] = {}
        self._strings: dict[int, str | None] = {}

    def cols(self, table: str) -> set[str]:
        if table not in self._cols:
            self._cols[table] = ({r[1] for r in self.con.execute(f"PRAGMA table_info('{table}')")}
                                 if table in self.tables else set())
        return self._cols[table]

    def col(self, table: str, name: str, alias: str | None = None, default: str = "NULL") -> str:
        alias = alias or name
        return f'"{name}" AS {alias}' if name in self.cols(table) else f"{default} AS {alias}"

    def strings(self, ids) -> dict[int, str | None]:
        missing = [i for i in ids if i is not None and i not in self._strings]
        for j in range(0, len(missing), 900):
            part = missing[j:j + 900]
            for i in part:
                self._strings[i] = None
            # a string over the event-size limit is refused before it is read into Python (bounded memory)
            q = (f"SELECT id, CASE WHEN length(value) <= {int(self.max_bytes)} THEN value END, length(value) "
                 f"FROM StringIds WHERE id IN ({','.join('?' * len(part))})")
            for i, v, n in self.con.execute(q, part):
                if n is not None and n > self.max_bytes:
                    raise refuse(self.path, f"has a string of {n >> 20} MB (StringIds id {i}), more than the "
                                            f"{self.max_bytes >> 20} MB event-size limit",
                                 "if the export is genuine, raise the limit with --max-event-mb")
                self._strings[i] = v
        return self._strings

    def name_array(self, ids: pa.Array, fix=None) -> pa.Array:
        """Dictionary-encoded names for an array of StringIds ids (fix: applied once per distinct name)."""
        uniq = pc.unique(ids).drop_null()
        keys = uniq.to_pylist()
        s = self.strings(keys)
        vals = [s.get(k) for k in keys]
        if fix:
            vals = [fix(v) for v in vals]
        idx = pc.index_in(ids, value_set=uniq)
        return pa.DictionaryArray.from_arrays(idx, pa.array(vals, pa.string()))

    def rows(self, sql: str, params=()) -> Iterator[list[tuple]]:
        cur = self.con.execute(sql, params)
        while True:
            rows = cur.fetchmany(CHUNK_ROWS)
            if not rows:
                return
            yield rows


@functools.cache
def _chunk_ids() -> pa.Array:
    """0 .. CHUNK_ROWS-1, built on first use: 17 ms that every ingest paid at import, Kineto ones included."""
    return pa.array(range(CHUNK_ROWS), pa.int64())


def row_ids(n: int, m: int) -> pa.Array:
    """Row indexes n .. n+m-1."""
    return pc.add(_chunk_ids().slice(0, m), n) if m <= CHUNK_ROWS else pa.array(range(n, n + m), pa.int64())


def open_export(path: str) -> tuple[Export, PayloadDecoder]:
    """A decoder process's own read-only connection to an export, and its NVTX payload decoder (nsys_ranges)."""
    ex = Export(Path(path))
    return ex, PayloadDecoder(ex.con, ex.tables, ex.cols)


def rowid_filter(rows: tuple[int, int] | None, where: str = "") -> str:
    conds = ([where] if where else []) + ([f"rowid >= {int(rows[0])} AND rowid < {int(rows[1])}"] if rows else [])
    return f" WHERE {' AND '.join(conds)}" if conds else ""
