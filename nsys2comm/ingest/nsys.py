"""Nsight Systems SQLite export importer (``nsys export --type sqlite``), export schemas 2.9.1 to 3.25.0.

Modules
    ``nsys`` (this one): the importer's entry points (``base.Importer``) and the orchestration: export checks,
    clock, rank assignment, the files/ranks/devices batches, the row tables' read, ``finalize``.
    ``nsys_export``: the export handle (``Export``), header check, row-id arrays, rowid-range filters.
    ``nsys_tables``: one reader per canonical table (``read_table``, ``read_devices``) and the notes they yield.
    ``nsys_ranges``: the row tables read by rowid ranges in decoder processes; ``nsys_values``: bad values.

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

import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from ..limits import MAX_EVENT_BYTES
from . import nsys_values as values
from .base import Batch, ReadOptions, decoder_processes_for
from .nsys_export import (
    CHUNK_ROWS,
    KERNEL,
    MEMCPY,
    MEMSET,
    NVTX,
    PID_MASK,
    PID_SHIFT,
    REEXPORT,
    SQLITE_MAGIC,
    Export,
    check_header,
    open_export,
    refuse,
)
from .nsys_ranges import read_tables
from .nsys_tables import SOURCES, Placement, notes_from_counts, read_devices, read_table
from .nvtx_payload import PayloadDecoder
from .ranks import resolve_ranks

SOURCE = "nsys"
SUFFIXES: tuple[str, ...] = (".sqlite", ".sqlite3", ".db")
FORMAT_HINT = "an Nsight Systems SQLite export from nsys export --type sqlite"


def sniff(path, head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def _meta(ex: Export, path: Path) -> dict:
    table = "META_DATA_EXPORT" if "META_DATA_EXPORT" in ex.tables else (
        "EXPORT_META_DATA" if "EXPORT_META_DATA" in ex.tables else None)
    if "StringIds" not in ex.tables or table is None:
        raise refuse(path, "is an SQLite database but not an Nsight Systems export (no StringIds or export meta table)",
                     f"give the file written by: {REEXPORT}")
    return dict(ex.con.execute(
        f"SELECT name, value FROM {table} WHERE name IN ('EXPORT_SCHEMA_VERSION', 'EXPORT_PRODUCT_VERSION', "
        "'EXPORT_HOST')").fetchall())


def _clock(ex: Export) -> tuple[int, str]:
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


def _gpu_processes(ex: Export) -> dict[int, set[int]]:
    """globalPid -> device ids it used (kernels, memcpy, memset)."""
    out: dict[int, set[int]] = {}
    for t in (KERNEL, MEMCPY, MEMSET):
        if t in ex.tables and {"globalPid", "deviceId"} <= ex.cols(t):
            for gpid, dev in ex.con.execute(f"SELECT DISTINCT globalPid, deviceId FROM {t}"):
                if gpid is not None and dev is not None:
                    values.check_device(ex, t, gpid, dev)
                    out.setdefault(gpid, set()).add(dev)
    return out


def _nccl_string_ids(ex: Export) -> dict[int, str]:
    return dict(ex.con.execute("SELECT id, value FROM StringIds WHERE value LIKE 'nccl%'").fetchall())


def _domains(ex: Export, nccl_ids: dict[int, str]) -> dict[tuple[int, int], str]:
    """(process key = globalTid >> 24, domainId) -> domain name."""
    out: dict[tuple[int, int], str] = {}
    if NVTX not in ex.tables or not {"eventType", "domainId", "globalTid"} <= ex.cols(NVTX):
        return out
    text = '"text"' if "text" in ex.cols(NVTX) else "NULL"
    for gtid, dom, name in ex.con.execute(
            f"SELECT globalTid, domainId, {text} FROM {NVTX} WHERE eventType = 75 AND domainId IS NOT NULL"):
        if gtid is not None and name:
            out[(gtid >> PID_SHIFT, dom)] = name
    conds = []
    if "text" in ex.cols(NVTX):
        conds.append("text LIKE 'nccl%'")
    if "textId" in ex.cols(NVTX) and nccl_ids:
        conds.append(f"textId IN ({','.join(str(i) for i in nccl_ids)})")
    if conds:
        for pkey, dom in ex.con.execute(
                f"SELECT DISTINCT globalTid >> {PID_SHIFT}, domainId FROM {NVTX} WHERE eventType IN (59, 60) "
                f"AND domainId IS NOT NULL AND domainId <> 0 AND ({' OR '.join(conds)})"):
            out.setdefault((pkey, dom), "NCCL")
    return out


def _comm_init_ranks(ex: Export, nccl_ids: dict[int, str], dec: PayloadDecoder) -> dict[int, tuple[int, int]]:
    """process key -> (rank, nranks) from the largest decoded NCCL comm-init payload of that process."""
    out: dict[int, tuple[int, int]] = {}
    ids = [i for i, v in nccl_ids.items() if v.startswith(("ncclCommInit", "ncclCommSplit"))]
    if not dec.entries or not ids or not {"binaryData", "textId", "domainId"} <= ex.cols(NVTX):
        return out
    for gtid, dom, blob in ex.con.execute(
            f"SELECT globalTid, domainId, binaryData FROM {NVTX} WHERE binaryData IS NOT NULL "
            f"AND textId IN ({','.join(str(i) for i in ids)})"):
        d = dec.decode(dom, blob)
        if d and "rank" in d and "nranks" in d and gtid is not None:
            key = gtid >> PID_SHIFT
            if key not in out or d["nranks"] > out[key][1]:
                out[key] = (d["rank"], d["nranks"])
    return out


def _assign_ranks(path: Path, procs: dict[int, set[int]], init: dict[int, tuple[int, int]],
                  options: ReadOptions) -> tuple[dict[int, int], str, dict[int, int | None]]:
    order = sorted(procs, key=lambda g: (min(procs[g]), (g >> PID_SHIFT) & PID_MASK, g))
    got = [init.get(g >> PID_SHIFT) for g in order]
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
    check_header(path)
    try:
        yield from _read(path, options)
    except sqlite3.DatabaseError as e:
        raise refuse(path, f"is a corrupt or unreadable SQLite file ({e})", "copy or export the file again") from None


def _read(path: Path, options: ReadOptions) -> Iterator[Batch]:
    ex = Export(path, int(options.extra.get("max_event_bytes") or MAX_EVENT_BYTES))
    meta = _meta(ex, path)
    if KERNEL not in ex.tables or ex.con.execute(f"SELECT 1 FROM {KERNEL} LIMIT 1").fetchone() is None:
        raise refuse(path, "is an Nsight Systems export without CUDA kernels",
                     "profile with: nsys profile --trace=cuda,nvtx ... then " + REEXPORT)
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
        "pid": pa.array([(g >> PID_SHIFT) & PID_MASK for g in gpids], pa.int64()),
        "host": pa.array([host] * len(gpids), pa.string()),
        "world_size": pa.array([world[g] for g in gpids], pa.int32()),
        "rank_source": [source] * len(gpids)}))
    yield read_devices(ex, procs, rank_of)

    pad = 128 - len(gpids)  # index 127 = not a rank (launchers, nsys): take() gives NULL there, rows are dropped
    ctx = Placement(
        offset=offset, pkeys=pa.array([g >> PID_SHIFT for g in gpids], pa.int64()),
        ranks=pa.array([rank_of[g] for g in gpids], pa.int32()), rank_keys=[g >> PID_SHIFT for g in gpids],
        api_ranks=pa.array([rank_of[g] for g in gpids] + [None] * pad, pa.int32()),
        api_pids=pa.array([(g >> PID_SHIFT) & PID_MASK for g in gpids] + [None] * pad, pa.int64()),
        domains=_domains(ex, nccl_ids))
    counts: Counter = Counter()
    yield from read_tables(ex, ctx, dec, counts, decoder_processes(path, options),
                           int(options.extra.get("nsys_range_rows") or CHUNK_ROWS),
                           sources=SOURCES, read_table=read_table, open_export=open_export)
    notes = notes_from_counts(counts)
    if notes:
        yield Batch("ingest_notes", values.note_batch(notes))
    ex.con.close()


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
                      f"export has no NCCL NVTX payloads; re-export with: {REEXPORT} (needs NCCL >= 2.16)"))
    for rank, sev, code, msg in notes:
        con.execute("INSERT INTO ingest_notes VALUES (?, ?, ?, ?, ?)", [f, rank, sev, code, msg])
