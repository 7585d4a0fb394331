"""Nsight Systems SQLite export importer (``nsys export --type sqlite``), export schemas 2.9.1 to 3.25.0.

Reading
    Only stdlib ``sqlite3`` on a read-only URI (``mode=ro``, plus ``immutable=1`` when no ``-wal`` file is beside
    it); rows are streamed with ``fetchmany`` in chunks of ``CHUNK_ROWS`` and turned into Arrow columns, names are
    resolved from ``StringIds`` by id (only the ids the chunk needs, cached). Columns are read by name (PRAGMA
    table_info), absent tables are normal (lazy exports) and user-added columns are ignored. Large exports are read
    by rowid ranges in decoder processes, each on its own read-only connection (``nsys_ranges``).

Privacy
    ``META_DATA_CAPTURE``, ``TARGET_INFO_SYSTEM_ENV`` and ``ProcessStreams`` are never queried; from the export
    meta table only ``EXPORT_SCHEMA_VERSION``, ``EXPORT_PRODUCT_VERSION`` and ``EXPORT_HOST`` are read; StringIds
    values are fetched only for ids referenced by kernel, runtime and NVTX rows (plus values starting with
    ``nccl``). Credentials anywhere in NVTX texts are redacted with every other source's free text
    (``ingest/redact.py``).

Ranks (``ranks.rank_source``)
    The ranks of a report are its processes with GPU activity (kernels, memcpy or memset); rows of other
    processes (launchers, nsys itself) are dropped. Process order = lowest device id used, then PID. Rank numbers:
      1. ``cli``: ``--rank N`` given -> N + position in process order;
      2. ``nccl_comm_init``: every GPU process has a decoded NCCL comm-init payload (CommInitRank*/CommSplit
         ``Rank`` field, needs ``--include-blobs=true``) and the ranks are distinct -> the rank in the process's
         largest communicator (``No. of ranks`` = world_size);
      3. ``file_name``: a single GPU process and the file name holds ``rank<N>`` (``rank_3``, ``rank-3``) -> N;
      4. ``process_order``: position in process order (0, 1, ...).
    At most 126 GPU processes per report (runtime rows pack a 7-bit process index).

Clock (``files.clock_rule``)
    With ``TARGET_INFO_SESSION_START_TIME``: ``utcEpochNs + (t - systemClockNs)`` when ``systemClockNs`` exists
    (2026.x), else ``utcEpochNs + t``; without it raw timestamps are kept (offset 0).

NCCL and PyTorch ranges
    NVTX ranges of domain ``NCCL`` (domain-create rows, eventType 75, per process; fallback: a domain whose
    ranges start with ``nccl``) become ``cpu_ranges``; their extended payloads (``binaryData``) are decoded by
    ``nvtx_payload.PayloadDecoder`` into ``cpu_ranges.args`` (``msg_bytes`` = NCCL's raw size field, ``peer``,
    ``comm_id``, ``nranks``, ``rank``, ``root``, ``cuda_device``, ``redop``); what was verified against NVTX's and
    NCCL's headers is written down there. PyTorch's ``emit_nvtx`` ranges (default domain, ``nccl:<op>, op_id = N
    [, sizes = [[...]]]``) are stored as they are. ``finalize`` runs ``_ingest_nsys_comm_ops`` (queries/ingest/
    nsys_comm_ops.sql): the PyTorch range around the launch names the operation, NCCL's ranges (with nested
    groups) give n_ops, payload sizes, communicator and peer.

Bad values (nsys_values.py)
    Refused with one line naming the file: NULL ``start``/``end`` (``end`` may be NULL for NVTX ranges),
    ``globalPid``/``globalTid`` or ``deviceId``; non-integer timestamps or ids; TEXT in
    TARGET_INFO_SESSION_START_TIME; a clock offset or shifted timestamp outside int64; device ids outside 0..65535;
    an impossible clock: a session start (``utcEpochNs``) before 2000 (under one day: an offset, kept) or over a
    year past the file's mtime, the rule of Kineto's ``baseTimeNanoseconds``.
    Stored with an ingest note: rows with ``end < start`` are left out (``negative_durations``); kernels without
    ``demangledName`` take their ``shortName`` (``kernel_short_names``), without any name they are ``unknown``
    (``unnamed_kernels``).
"""

from __future__ import annotations

import functools
import os
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputError
from ..limits import MAX_EVENT_BYTES
from . import nsys_values as values
from .base import Batch, ReadOptions, decoder_processes_for
from .nsys_ranges import read_tables
from .nvtx_payload import PayloadDecoder
from .ranks import resolve_ranks

SOURCE = "nsys"
SUFFIXES: tuple[str, ...] = (".sqlite", ".sqlite3", ".db")
FORMAT_HINT = "an Nsight Systems SQLite export from nsys export --type sqlite"
SQLITE_MAGIC = b"SQLite format 3\x00"
CHUNK_ROWS = 200_000

_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
_NVTX = "NVTX_EVENTS"
_PID_SHIFT = 24
_PID_MASK = 0xFFFFFF

_REEXPORT = "nsys export --type sqlite --include-blobs=true REPORT.nsys-rep"
_COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
_CANON_COPY = {"HtoD", "DtoH", "DtoD", "HtoH", "PtoP"}
# ENUM_CUDA_MEM_KIND (nsys numbering, not CUPTI's): labels as Kineto prints them
_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
             6: "Managed Static", 7: "Unknown"}
_NO_CORR = 0xFFFFFFFF
_TEMPLATE_INT = re.compile(r"\((unsigned long long|long long|unsigned long|long|unsigned int|unsigned short|"
                           r"unsigned char|int|short|char)\)(-?\d+)")
_INT_SUFFIX = {"unsigned long long": "ull", "long long": "ll", "unsigned long": "ul", "long": "l",
               "unsigned int": "u", "int": "", "unsigned short": "", "short": "", "unsigned char": "", "char": ""}


def sniff(path, head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def normalise_kernel_name(name: str) -> str:
    """nsys prints template integer arguments as ``(unsigned long)4096``; Kineto (c++filt) as ``4096ul``."""
    if "(" not in name:
        return name
    return _TEMPLATE_INT.sub(lambda m: m.group(2) + _INT_SUFFIX[m.group(1)], name)


def _api_name(name: str | None) -> str:
    return re.sub(r"_v\d+$", "", name) if name else "unknown"


def _err(path: Path, what: str, hint: str) -> InputError:
    return InputError(what, path=str(path), hint=hint)


def _check_header(path: Path) -> None:
    """Refuse truncated files before SQLite silently reads what is left of them."""
    try:
        with open(path, "rb") as f:
            hdr = f.read(100)
        size = path.stat().st_size
    except OSError as e:
        raise _err(path, f"cannot read ({e.strerror})", "check the path and permissions") from None
    if len(hdr) < 100 or not hdr.startswith(SQLITE_MAGIC):
        raise _err(path, "is a truncated SQLite file (incomplete header)", "copy or export the file again")
    page_size = int.from_bytes(hdr[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    n_pages = int.from_bytes(hdr[28:32], "big")
    if page_size < 512 or (n_pages and hdr[24:28] == hdr[92:96] and size < page_size * n_pages) or size % page_size:
        raise _err(path, f"is a truncated or corrupt SQLite file ({size} bytes, header says "
                         f"{n_pages} pages of {page_size} bytes)", "copy or export the file again")


def _read_only_fs(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class _Export:
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
                raise _err(path, "has a write-ahead log (-wal) beside it in a directory SQLite cannot write to",
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
                    raise _err(self.path, f"has a string of {n >> 20} MB (StringIds id {i}), more than the "
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


def _ids(n: int, m: int) -> pa.Array:
    """Row indexes n .. n+m-1."""
    return pc.add(_chunk_ids().slice(0, m), n) if m <= CHUNK_ROWS else pa.array(range(n, n + m), pa.int64())


def _meta(ex: _Export, path: Path) -> dict:
    table = "META_DATA_EXPORT" if "META_DATA_EXPORT" in ex.tables else (
        "EXPORT_META_DATA" if "EXPORT_META_DATA" in ex.tables else None)
    if "StringIds" not in ex.tables or table is None:
        raise _err(path, "is an SQLite database but not an Nsight Systems export (no StringIds or export meta table)",
                   f"give the file written by: {_REEXPORT}")
    return dict(ex.con.execute(
        f"SELECT name, value FROM {table} WHERE name IN ('EXPORT_SCHEMA_VERSION', 'EXPORT_PRODUCT_VERSION', "
        "'EXPORT_HOST')").fetchall())


def _clock(ex: _Export) -> tuple[int, str]:
    t = "TARGET_INFO_SESSION_START_TIME"
    if t in ex.tables and "utcEpochNs" in ex.cols(t):
        sys_col = "systemClockNs" if "systemClockNs" in ex.cols(t) else "NULL"
        row = ex.con.execute(f"SELECT utcEpochNs, {sys_col} FROM {t} WHERE utcEpochNs IS NOT NULL LIMIT 1").fetchone()
        if row:
            offset = values.session_clock(ex, *row)
            if row[1] is not None:
                return offset, ("utcEpochNs + (t - systemClockNs) from TARGET_INFO_SESSION_START_TIME "
                                "(Unix epoch ns)")
            return offset, "utcEpochNs + t from TARGET_INFO_SESSION_START_TIME (no systemClockNs; approximate epoch)"
    return 0, "raw nsys timestamps (no TARGET_INFO_SESSION_START_TIME; not aligned to Unix epoch)"


def _gpu_processes(ex: _Export) -> dict[int, set[int]]:
    """globalPid -> device ids it used (kernels, memcpy, memset)."""
    out: dict[int, set[int]] = {}
    for t in (_KERNEL, _MEMCPY, _MEMSET):
        if t in ex.tables and {"globalPid", "deviceId"} <= ex.cols(t):
            for gpid, dev in ex.con.execute(f"SELECT DISTINCT globalPid, deviceId FROM {t}"):
                if gpid is not None and dev is not None:
                    values.check_device(ex, t, gpid, dev)
                    out.setdefault(gpid, set()).add(dev)
    return out


def _nccl_string_ids(ex: _Export) -> dict[int, str]:
    return dict(ex.con.execute("SELECT id, value FROM StringIds WHERE value LIKE 'nccl%'").fetchall())


def _domains(ex: _Export, nccl_ids: dict[int, str]) -> dict[tuple[int, int], str]:
    """(process key = globalTid >> 24, domainId) -> domain name."""
    out: dict[tuple[int, int], str] = {}
    if _NVTX not in ex.tables or not {"eventType", "domainId", "globalTid"} <= ex.cols(_NVTX):
        return out
    text = '"text"' if "text" in ex.cols(_NVTX) else "NULL"
    for gtid, dom, name in ex.con.execute(
            f"SELECT globalTid, domainId, {text} FROM {_NVTX} WHERE eventType = 75 AND domainId IS NOT NULL"):
        if gtid is not None and name:
            out[(gtid >> _PID_SHIFT, dom)] = name
    conds = []
    if "text" in ex.cols(_NVTX):
        conds.append("text LIKE 'nccl%'")
    if "textId" in ex.cols(_NVTX) and nccl_ids:
        conds.append(f"textId IN ({','.join(str(i) for i in nccl_ids)})")
    if conds:
        for pkey, dom in ex.con.execute(
                f"SELECT DISTINCT globalTid >> {_PID_SHIFT}, domainId FROM {_NVTX} WHERE eventType IN (59, 60) "
                f"AND domainId IS NOT NULL AND domainId <> 0 AND ({' OR '.join(conds)})"):
            out.setdefault((pkey, dom), "NCCL")
    return out


def _comm_init_ranks(ex: _Export, nccl_ids: dict[int, str], dec: PayloadDecoder) -> dict[int, tuple[int, int]]:
    """process key -> (rank, nranks) from the largest decoded NCCL comm-init payload of that process."""
    out: dict[int, tuple[int, int]] = {}
    ids = [i for i, v in nccl_ids.items() if v.startswith(("ncclCommInit", "ncclCommSplit"))]
    if not dec.entries or not ids or not {"binaryData", "textId", "domainId"} <= ex.cols(_NVTX):
        return out
    for gtid, dom, blob in ex.con.execute(
            f"SELECT globalTid, domainId, binaryData FROM {_NVTX} WHERE binaryData IS NOT NULL "
            f"AND textId IN ({','.join(str(i) for i in ids)})"):
        d = dec.decode(dom, blob)
        if d and "rank" in d and "nranks" in d and gtid is not None:
            key = gtid >> _PID_SHIFT
            if key not in out or d["nranks"] > out[key][1]:
                out[key] = (d["rank"], d["nranks"])
    return out


def _assign_ranks(path: Path, procs: dict[int, set[int]], init: dict[int, tuple[int, int]],
                  options: ReadOptions) -> tuple[dict[int, int], str, dict[int, int | None]]:
    order = sorted(procs, key=lambda g: (min(procs[g]), (g >> _PID_SHIFT) & _PID_MASK, g))
    got = [init.get(g >> _PID_SHIFT) for g in order]
    # the comm-init payloads count only when every process has one (a partial set would mix rules)
    complete = all(got)
    res = resolve_ranks(path.name, options, [r[0] if complete else None for r in got], "nccl_comm_init",
                        [r[1] if complete else None for r in got])
    return dict(zip(order, res.ranks, strict=False)), res.source, dict(zip(order, res.world_sizes, strict=False))


def decoder_processes(path: Path, options: ReadOptions) -> int:
    """Processes that read the row tables by rowid ranges beside the inserting one (nsys_ranges); 0: in-process."""
    n = options.extra.get("nsys_workers")
    return int(n) if n is not None else decoder_processes_for(path.stat().st_size, 64 << 20)


def read(path, options: ReadOptions | None = None) -> Iterator[Batch]:
    path = Path(path)
    options = options or ReadOptions()
    _check_header(path)
    try:
        yield from _read(path, options)
    except sqlite3.DatabaseError as e:
        raise _err(path, f"is a corrupt or unreadable SQLite file ({e})", "copy or export the file again") from None


def _read(path: Path, options: ReadOptions) -> Iterator[Batch]:
    ex = _Export(path, int(options.extra.get("max_event_bytes") or MAX_EVENT_BYTES))
    meta = _meta(ex, path)
    if _KERNEL not in ex.tables or ex.con.execute(f"SELECT 1 FROM {_KERNEL} LIMIT 1").fetchone() is None:
        raise _err(path, "is an Nsight Systems export without CUDA kernels",
                   "profile with: nsys profile --trace=cuda,nvtx ... then " + _REEXPORT)
    offset, rule = _clock(ex)
    host = meta.get("EXPORT_HOST") or None
    yield Batch("files", pa.table({
        "format_version": [meta.get("EXPORT_SCHEMA_VERSION")], "producer": [meta.get("EXPORT_PRODUCT_VERSION")],
        "host": [host], "clock_rule": [rule], "clock_offset_ns": pa.array([offset], pa.int64())}))

    procs = _gpu_processes(ex)
    nccl_ids = _nccl_string_ids(ex)
    dec = PayloadDecoder(ex.con, ex.tables, ex.cols)
    rank_of, source, world = _assign_ranks(path, procs, _comm_init_ranks(ex, nccl_ids, dec), options)
    gpids = sorted(rank_of)
    yield Batch("ranks", pa.table({
        "rank": pa.array([rank_of[g] for g in gpids], pa.int32()),
        "pid": pa.array([(g >> _PID_SHIFT) & _PID_MASK for g in gpids], pa.int64()),
        "host": pa.array([host] * len(gpids), pa.string()),
        "world_size": pa.array([world[g] for g in gpids], pa.int32()),
        "rank_source": [source] * len(gpids)}))
    yield _devices(ex, procs, rank_of)

    pad = 128 - len(gpids)  # index 127 = not a rank (launchers, nsys): take() gives NULL there, rows are dropped
    ctx = _Placement(
        offset=offset, pkeys=pa.array([g >> _PID_SHIFT for g in gpids], pa.int64()),
        ranks=pa.array([rank_of[g] for g in gpids], pa.int32()), rank_keys=[g >> _PID_SHIFT for g in gpids],
        api_ranks=pa.array([rank_of[g] for g in gpids] + [None] * pad, pa.int32()),
        api_pids=pa.array([(g >> _PID_SHIFT) & _PID_MASK for g in gpids] + [None] * pad, pa.int64()),
        domains=_domains(ex, nccl_ids))
    counts: Counter = Counter()
    yield from read_tables(ex, ctx, dec, counts, decoder_processes(path, options),
                           int(options.extra.get("nsys_range_rows") or CHUNK_ROWS),
                           sources=SOURCES, read_table=read_table, open_export=open_export)
    notes = _notes(counts)
    if notes:
        yield Batch("ingest_notes", values.note_batch(notes))
    ex.con.close()


@dataclass(frozen=True)
class _Placement:
    """What the row readers need besides the export: the clock offset and the ranks of the processes. Sent to
    decoder processes (nsys_ranges), so only plain values and Arrow arrays."""
    offset: int
    pkeys: pa.Array  # process key (globalPid >> 24) of each rank's process
    ranks: pa.Array  # its rank
    rank_keys: list[int]
    api_ranks: pa.Array  # rank by position in rank_keys, padded to 128 (127: not a rank)
    api_pids: pa.Array
    domains: dict[tuple[int, int], str]

    def rank_from_key(self, keys: pa.Array) -> pa.Array:
        return pc.take(self.ranks, pc.index_in(keys, value_set=self.pkeys))


# The row tables in reading order: (canonical table, export table). Row ids count on across a canonical table's
# export tables (memcpy, then memset).
SOURCES = (("kernels", _KERNEL), ("mem_ops", _MEMCPY), ("mem_ops", _MEMSET), ("api_calls", _RUNTIME),
           ("cpu_ranges", _NVTX))


def read_table(ex: _Export, ctx: _Placement, source: str, rows: tuple[int, int] | None, counts: Counter,
               dec: PayloadDecoder | None) -> Iterator[Batch]:
    """Batches of one export table (``rows``: only rowids in [lo, hi)), row ids from 0. ``counts`` gains the rows
    read (under the canonical table's name, for the ids of what follows) and what the notes report."""
    if source == _KERNEL:
        return _kernels(ex, ctx, counts, rows)
    if source in (_MEMCPY, _MEMSET):
        return _memops(ex, ctx, counts, source, rows)
    if source == _RUNTIME:
        return _api_calls(ex, ctx, counts, rows)
    return _nvtx(ex, ctx, counts, dec or PayloadDecoder(ex.con, ex.tables, ex.cols), rows)


def open_export(path: str) -> tuple[_Export, PayloadDecoder]:
    """A decoder process's own read-only connection to an export, and its NVTX payload decoder (nsys_ranges)."""
    ex = _Export(Path(path))
    return ex, PayloadDecoder(ex.con, ex.tables, ex.cols)


def _rowids(rows: tuple[int, int] | None, where: str = "") -> str:
    conds = ([where] if where else []) + ([f"rowid >= {int(rows[0])} AND rowid < {int(rows[1])}"] if rows else [])
    return f" WHERE {' AND '.join(conds)}" if conds else ""


def _notes(counts: Counter) -> list[tuple[str, str, str]]:
    notes = []
    if counts["kernels_dropped"]:
        notes.append(("warning", "negative_durations", f"{counts['kernels_dropped']} kernels with end < start were "
                      f"not stored ({_KERNEL}); analyses miss them"))
    if counts["short_only"]:
        notes.append(("info", "kernel_short_names", f"{counts['short_only']} kernels have no demangledName: stored "
                      "under their shortName (no parameter list)"))
    if counts["unnamed"]:
        notes.append(("warning", "unnamed_kernels", f"{counts['unnamed']} kernels have neither demangledName nor "
                      "shortName: stored as 'unknown' and classified as compute"))
    for t, kind in ((_MEMCPY, "memcpy"), (_MEMSET, "memset")):
        if counts[f"{kind}_dropped"]:
            notes.append(("warning", "negative_durations", f"{counts[f'{kind}_dropped']} {kind} operations with "
                          f"end < start were not stored ({t})"))
    if counts["api_dropped"]:
        notes.append(("warning", "negative_durations", f"{counts['api_dropped']} CUDA API calls with end < start "
                      f"were not stored ({_RUNTIME}); kernels they launched lose their CPU link"))
    if counts["no_runtime_table"] and counts["kernels"]:
        notes.append(("warning", "no_cuda_runtime", f"the export has no CUDA runtime table ({_RUNTIME}): "
                      f"{counts['kernels']} kernels have no launch, so launch delays, host-bound idle and queued work "
                      "cannot be told apart; profile with --trace=cuda"))
    if counts["nvtx_dropped"]:
        notes.append(("warning", "negative_durations", f"{counts['nvtx_dropped']} NVTX ranges with end < start were "
                      f"not stored ({_NVTX})"))
    return notes


def _devices(ex: _Export, procs: dict[int, set[int]], rank_of: dict[int, int]) -> Batch:
    info: dict[int, tuple] = {}
    t = "TARGET_INFO_GPU"
    if t in ex.tables and "id" in ex.cols(t):
        for row in ex.con.execute(f"SELECT id, {ex.col(t, 'name')}, {ex.col(t, 'smCount')}, "
                                  f"{ex.col(t, 'totalMemory')} FROM {t}"):
            info.setdefault(row[0], row[1:])
    cuda: dict[tuple[int, int], int] = {}
    t = "TARGET_INFO_CUDA_DEVICE"
    if t in ex.tables and {"gpuId", "pid"} <= ex.cols(t):
        for gid, pid, sms in ex.con.execute(f"SELECT gpuId, pid, {ex.col(t, 'numMultiprocessors')} FROM {t}"):
            cuda[(pid, gid)] = sms
    rows = []
    for g in sorted(rank_of):
        pid = (g >> _PID_SHIFT) & _PID_MASK
        for dev in sorted(procs[g]):
            name, sms, mem = info.get(dev, (None, None, None))
            rows.append((rank_of[g], dev, name, sms if sms is not None else cuda.get((pid, dev)), mem))
    cols = list(zip(*rows, strict=False)) if rows else [[]] * 5
    return Batch("devices", pa.table({
        "rank": pa.array(cols[0], pa.int32()), "device_id": pa.array(cols[1], pa.int32()),
        "name": pa.array(cols[2], pa.string()), "sm_count": pa.array(cols[3], pa.int32()),
        "total_memory_bytes": pa.array(cols[4], pa.int64())}))


def _kernels(ex: _Export, ctx: _Placement, counts: Counter, rows) -> Iterator[Batch]:
    """Kernels. Small integer columns are packed into one SQLite integer per group (fewer Python objects per row:
    the fetch is what costs) and unpacked with Arrow: process key << 16 | deviceId, demangledName << 31 |
    shortName (StringIds ids < 2^31; NULL -> an id that names nothing), streamId << 32 | correlationId,
    grid/block x << 32 | y << 16 | z."""
    t = _KERNEL
    need = {"start", "end", "deviceId", "globalPid", "demangledName", "shortName"}
    if not need <= ex.cols(t):
        raise InputError(f"kernel table lacks columns {sorted(need - ex.cols(t))}", path=str(ex.path),
                         hint="re-export with a supported nsys version: " + _REEXPORT)
    have = ex.cols(t)
    c = lambda n: f'"{n}"' if n in have else "0"  # noqa: E731
    corr = f'ifnull("correlationId", {_NO_CORR})' if "correlationId" in have else str(_NO_CORR)
    graph = '"graphId"' if "graphId" in have else "NULL"
    sql = (f'SELECT "start", "end", CASE WHEN deviceId BETWEEN 0 AND {values.MAX_DEVICE} '
           f'THEN ((globalPid >> {_PID_SHIFT}) << 16) | deviceId END, '
           f'(ifnull(demangledName, {_NO_NAME}) << 31) | ifnull(shortName, {_NO_NAME}), '
           f'({c("streamId")} << 32) | {corr}, '
           f'({c("gridX")} << 32) | ({c("gridY")} << 16) | {c("gridZ")}, '
           f'({c("blockX")} << 32) | ({c("blockY")} << 16) | {c("blockZ")}, {graph} FROM {t}' + _rowids(rows))
    n = 0
    for cols in values.chunks(ex, t, sql, [pa.int64()] * 8, ["start", "end", "globalPid", "deviceId"]):
        m = len(cols[0])
        pkdev, names, sc, grid, block = cols[2:7]
        if pkdev.null_count:
            raise values.explain_process_device(ex, t)
        start, end, keep = values.times(ex, t, cols[0], cols[1], ctx.offset)
        name_ids, k_short, k_none = _kernel_name_ids(ex, names)
        corr_arr = pc.bit_wise_and(sc, 0xFFFFFFFF)
        data = {
            "kernel_id": _ids(n, m),
            "rank": ctx.rank_from_key(pc.shift_right(pkdev, 16)),
            "device_id": pc.bit_wise_and(pkdev, 0xFFFF).cast(pa.int32()),
            "stream_id": pc.shift_right(sc, 32),
            "start_ns": start, "end_ns": end,
            "name": ex.name_array(name_ids, lambda v: normalise_kernel_name(v) if v else "unknown"),
            "correlation_id": pc.if_else(pc.equal(corr_arr, _NO_CORR), pa.scalar(None, pa.int64()), corr_arr),
        }
        for arr, axis in ((grid, "grid"), (block, "block")):
            data[f"{axis}_x"] = pc.shift_right(arr, 32).cast(pa.int32())
            data[f"{axis}_y"] = pc.bit_wise_and(pc.shift_right(arr, 16), 0xFFFF).cast(pa.int32())
            data[f"{axis}_z"] = pc.bit_wise_and(arr, 0xFFFF).cast(pa.int32())
        data["graph_id"] = cols[7]
        n += m
        tbl = pa.table(data)
        if keep is not None:
            counts["kernels_dropped"] += m - pc.sum(keep).as_py()
            tbl = tbl.filter(keep)
        counts["short_only"] += k_short
        counts["unnamed"] += k_none
        counts["kernels"] += m
        yield Batch("kernels", tbl)


_NO_NAME = 0x7FFFFFFF  # stands for a NULL StringIds id in the packed name column


def _kernel_name_ids(ex: _Export, packed: pa.Array) -> tuple[pa.Array, int, int]:
    """StringIds id naming each kernel: demangledName, else shortName; and how many fell back / have none."""
    dn, sn = pc.shift_right(packed, 31), pc.bit_wise_and(packed, 0x7FFFFFFF)
    uniq = pc.unique(pa.concat_arrays([pc.unique(dn), pc.unique(sn)])).to_pylist()
    strings = ex.strings(uniq)
    missing = pa.array([i for i in uniq if strings.get(i) is None], pa.int64())
    if not len(missing):
        return dn, 0, 0
    no_dn = pc.is_in(dn, value_set=missing)
    ids = pc.if_else(no_dn, sn, dn)
    none = pc.sum(pc.is_in(ids, value_set=missing)).as_py() or 0
    return ids, (pc.sum(no_dn).as_py() or 0) - none, none


def _memops(ex: _Export, ctx: _Placement, counts: Counter, t: str, rows) -> Iterator[Batch]:
    kind = "memcpy" if t == _MEMCPY else "memset"
    if t not in ex.tables or not {"start", "end", "deviceId", "globalPid"} <= ex.cols(t):
        return
    c = ex.col
    sql = (f'SELECT "start", "end", deviceId, globalPid >> {_PID_SHIFT}, {c(t, "streamId")}, '
           f'{c(t, "correlationId")}, {c(t, "bytes")}, {c(t, "copyKind")}, {c(t, "srcKind")}, '
           f'{c(t, "dstKind")}, {c(t, "memKind")} FROM {t}' + _rowids(rows))
    n = 0
    for arrs in values.chunks(ex, t, sql, [pa.int64()] * 11, ["start", "end", "deviceId", "globalPid"]):
        m = len(arrs[0])
        values.require(ex, t, arrs[3], "globalPid")
        outside = pc.or_(pc.less(arrs[2], 0), pc.greater(arrs[2], values.MAX_DEVICE))
        if arrs[2].null_count or pc.any(outside).as_py():
            raise values.explain_process_device(ex, t)
        start, end, keep = values.times(ex, t, arrs[0], arrs[1], ctx.offset)
        cols = [a.to_pylist() for a in arrs[7:11]]
        if kind == "memcpy":
            ck = [_COPY_KIND.get(k) for k in cols[0]]
            names = [f"Memcpy {k or 'other'} ({_MEM_KIND.get(s, 'Unknown')} -> {_MEM_KIND.get(d, 'Unknown')})"
                     for k, s, d in zip(ck, cols[1], cols[2], strict=False)]
            ck = [k if k in _CANON_COPY else "other" for k in ck]
        else:
            ck = [None] * m
            names = [f"Memset ({_MEM_KIND.get(k, 'Unknown')})" for k in cols[3]]
        tbl = pa.table({
            "memop_id": _ids(n, m),
            "rank": ctx.rank_from_key(arrs[3]),
            "device_id": arrs[2].cast(pa.int32()),
            "stream_id": arrs[4],
            "start_ns": start, "end_ns": end,
            "kind": pa.repeat(pa.scalar(kind), m), "copy_kind": pa.array(ck, pa.string()),
            "bytes": arrs[6], "name": pa.array(names, pa.string()), "correlation_id": arrs[5]})
        if keep is not None:
            counts[f"{kind}_dropped"] += m - pc.sum(keep).as_py()
            tbl = tbl.filter(keep)
        yield Batch("mem_ops", tbl)
        n += m
        counts["mem_ops"] += m


def _keep_ranked(tbl: pa.Table) -> pa.Table:
    mask = pc.is_valid(tbl["rank"])
    return tbl if pc.all(mask).as_py() else tbl.filter(mask)


def _api_calls(ex: _Export, ctx: _Placement, counts: Counter, rows) -> Iterator[Batch]:
    """Runtime/driver calls. Packed per row (fewer Python objects): rank index (position of the process in
    rank_keys, 127 = not a rank) << 56 | TID << 32 | correlationId, and nameId << 8 | eventClass."""
    t = _RUNTIME
    if t not in ex.tables or not {"start", "end", "globalTid", "nameId"} <= ex.cols(t):
        counts["no_runtime_table"] = 1
        return
    if len(ctx.rank_keys) > 126:
        raise InputError(f"has {len(ctx.rank_keys)} processes with GPU activity; at most 126 per report are "
                         "supported", path=str(ex.path), hint="split the report per node")
    ec = '"eventClass"' if "eventClass" in ex.cols(t) else "0"
    corr = f'ifnull("correlationId", {_NO_CORR})' if "correlationId" in ex.cols(t) else str(_NO_CORR)
    case = ("CASE globalTid >> 24 " + " ".join(f"WHEN {k} THEN {i}" for i, k in enumerate(ctx.rank_keys))
            + " ELSE 127 END")
    sql = (f'SELECT "start", "end", (({case}) << 56) | ((globalTid & {_PID_MASK}) << 32) | ({corr} & 4294967295), '
           f'(ifnull(nameId, {_NO_NAME}) << 8) | ({ec} & 255) FROM {t}' + _rowids(rows))
    n = 0
    for cols in values.chunks(ex, t, sql, [pa.int64()] * 4, ["start", "end", "globalTid", "nameId"]):
        m = len(cols[0])
        packed, name_ec = cols[2], cols[3]
        values.require(ex, t, packed, "globalTid")
        start, end, keep = values.times(ex, t, cols[0], cols[1], ctx.offset)
        idx = pc.shift_right(packed, 56)
        corr_arr = pc.bit_wise_and(packed, 0xFFFFFFFF)
        tbl = pa.table({
            "call_id": _ids(n, m),
            "rank": pc.take(ctx.api_ranks, idx),
            "pid": pc.take(ctx.api_pids, idx),
            "tid": pc.bit_wise_and(pc.shift_right(packed, 32), _PID_MASK),
            "start_ns": start, "end_ns": end,
            "name": ex.name_array(pc.shift_right(name_ec, 8), _api_name),
            "correlation_id": pc.if_else(pc.equal(corr_arr, _NO_CORR), pa.scalar(None, pa.int64()), corr_arr),
            "api": pc.if_else(pc.equal(pc.bit_wise_and(name_ec, 255), 1), "driver", "runtime"),
        })
        n += m
        counts["api_calls"] += m
        if keep is not None:
            counts["api_dropped"] += m - pc.sum(keep).as_py()
            tbl = tbl.filter(keep)
        yield Batch("api_calls", _keep_ranked(tbl))


def _nvtx(ex: _Export, ctx: _Placement, counts: Counter, dec: PayloadDecoder, rows) -> Iterator[Batch]:
    t = _NVTX
    if t not in ex.tables or not {"start", "eventType", "globalTid"} <= ex.cols(t):
        return
    blob = ex.col(t, "binaryData") if dec.entries else "NULL AS binaryData"
    sql = (f'SELECT "start", {ex.col(t, "end")}, globalTid, {ex.col(t, "text")}, {ex.col(t, "textId")}, '
           f'{ex.col(t, "domainId", default="0")}, {blob} FROM {t}' + _rowids(rows, "eventType IN (59, 60)"))
    dkeys = pa.array([k * 65536 + d for (k, d) in ctx.domains if 0 <= d < 65536], pa.int64())
    dnames = pa.array([v for (k, d), v in ctx.domains.items() if 0 <= d < 65536], pa.string())
    n = 0
    types = [pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.int64(), pa.int64(), pa.binary()]
    for cols in values.chunks(ex, t, sql, types, ["start", "end", "globalTid", "textId", "domainId"]):
        m = len(cols[0])
        gtid, dom, blobs = cols[2], cols[5], cols[6]
        values.require(ex, t, gtid, "globalTid")
        start, end, keep = values.times(ex, t, cols[0], cols[1], ctx.offset, end_optional=True)
        pkey = pc.shift_right(gtid, _PID_SHIFT)
        names = pc.coalesce(cols[3], ex.name_array(cols[4]).cast(pa.string()), pa.scalar("", pa.string()))
        doms = pc.take(dnames, pc.index_in(pc.add(pc.multiply(pkey, 65536), dom), value_set=dkeys))
        args = pa.nulls(m, pa.string())
        if dec.entries and blobs.null_count < m:
            at = pc.indices_nonzero(pc.is_valid(blobs))
            dj = dec.decode_json
            vals = [dj(d, b) for d, b in zip(pc.take(dom, at).to_pylist(), pc.take(blobs, at).to_pylist(),
                                             strict=True)]
            args = pc.replace_with_mask(args, pc.is_valid(blobs), pa.array(vals, pa.string()))
        tbl = pa.table({
            "range_id": _ids(n, m),
            "rank": ctx.rank_from_key(pkey),
            "pid": pc.bit_wise_and(pkey, _PID_MASK),
            "tid": pc.bit_wise_and(gtid, _PID_MASK),
            "start_ns": start,
            "end_ns": end,
            "name": names,
            "kind": pa.repeat(pa.scalar("nvtx"), m),
            "domain": doms,
            "args": args,
        })
        n += m
        counts["cpu_ranges"] += m
        if keep is not None:
            counts["nvtx_dropped"] += m - pc.sum(keep).as_py()
            tbl = tbl.filter(keep)
        yield Batch("cpu_ranges", _keep_ranked(tbl))


# ---------------------------------------------------------------------------------------------------------------
# finalize: comm_ops (queries/ingest/nsys_comm_ops.sql) and ingest_notes over this file's canonical rows


def finalize(con, file_id: int) -> None:
    f = int(file_id)
    con.execute("INSERT INTO comm_ops BY NAME SELECT * FROM _ingest_nsys_comm_ops(?)", [f])
    n_comm, n_sized, n_elems_only = con.execute(
        "SELECT count(*), count(msg_bytes), count(*) FILTER (WHERE msg_bytes IS NULL AND element_count IS NOT NULL) "
        "FROM comm_ops WHERE file_id = ?", [f]).fetchone()
    if not n_comm:
        return
    n_nccl, n_pt = con.execute(
        "SELECT count(*) FILTER (WHERE domain = 'NCCL'), count(*) FILTER (WHERE domain IS NULL AND name LIKE 'nccl:%') "
        "FROM cpu_ranges WHERE file_id = ? AND kind = 'nvtx'", [f]).fetchone()
    notes = []
    if not n_nccl and not n_pt:
        notes.append((None, "warning", "no_nccl_nvtx",
                      f"{n_comm} communication kernels but no NCCL or PyTorch NVTX ranges: collectives come from "
                      "kernel names only; profile with nsys profile --trace=cuda,nvtx (NCCL >= 2.8.3, "
                      "NCCL_NVTX_DISABLE unset), and torch.autograd.profiler.emit_nvtx(record_shapes=True)"))
    else:
        for rank, n in con.execute(
                "SELECT rank, count(*) FROM comm_ops WHERE file_id = ? AND collective_source = 'kernel_name' "
                "GROUP BY rank ORDER BY rank", [f]).fetchall():
            notes.append((rank, "info", "orphan_kernels",
                          f"{n} communication kernels not linked to an NCCL or PyTorch NVTX range (launched outside "
                          "the captured window or outside NCCL API calls); collective taken from the kernel name"))
    if n_sized < n_comm:
        why = (f"{n_elems_only} of them have element counts from PyTorch's NVTX sizes but no dtype; " if n_elems_only
               else "")
        notes.append((None, "warning", "no_msg_sizes",
                      f"message sizes unknown for {n_comm - n_sized} of {n_comm} communication kernels: {why}the "
                      f"export has no NCCL NVTX payloads; re-export with: {_REEXPORT} (needs NCCL >= 2.16)"))
    for rank, sev, code, msg in notes:
        con.execute("INSERT INTO ingest_notes VALUES (?, ?, ?, ?, ?)", [f, rank, sev, code, msg])
