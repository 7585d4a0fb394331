"""nsys importer: one reader per canonical table (devices, kernels, mem_ops, api_calls, cpu_ranges) over an open
export (``nsys_export.Export``), and the ingest notes for what they stored with a caveat.

``read_table`` and the ``Placement`` it receives are sent to decoder processes (``nsys_ranges``), so readers are
module-level functions and ``Placement`` holds plain values and Arrow arrays. The orchestration (ranks, clock,
files and ranks batches, finalize) is in ``nsys.py``, which this module does not import.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputError
from . import nsys_values as values
from .base import Batch
from .nsys_export import (
    KERNEL,
    MEMCPY,
    MEMSET,
    NVTX,
    PID_MASK,
    PID_SHIFT,
    REEXPORT,
    RUNTIME,
    Export,
    row_ids,
    rowid_filter,
)
from .nvtx_payload import PayloadDecoder

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


def normalise_kernel_name(name: str) -> str:
    """nsys prints template integer arguments as ``(unsigned long)4096``; Kineto (c++filt) as ``4096ul``."""
    if "(" not in name:
        return name
    return _TEMPLATE_INT.sub(lambda m: m.group(2) + _INT_SUFFIX[m.group(1)], name)


def _api_name(name: str | None) -> str:
    return re.sub(r"_v\d+$", "", name) if name else "unknown"


@dataclass(frozen=True)
class Placement:
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
SOURCES = (("kernels", KERNEL), ("mem_ops", MEMCPY), ("mem_ops", MEMSET), ("api_calls", RUNTIME),
           ("cpu_ranges", NVTX))


def read_table(ex: Export, ctx: Placement, source: str, rows: tuple[int, int] | None, counts: Counter,
               dec: PayloadDecoder | None) -> Iterator[Batch]:
    """Batches of one export table (``rows``: only rowids in [lo, hi)), row ids from 0. ``counts`` gains the rows
    read (under the canonical table's name, for the ids of what follows) and what the notes report."""
    if source == KERNEL:
        return _kernels(ex, ctx, counts, rows)
    if source in (MEMCPY, MEMSET):
        return _memops(ex, ctx, counts, source, rows)
    if source == RUNTIME:
        return _api_calls(ex, ctx, counts, rows)
    return _nvtx(ex, ctx, counts, dec or PayloadDecoder(ex.con, ex.tables, ex.cols), rows)


def notes_from_counts(counts: Counter) -> list[tuple[str, str, str]]:
    notes = []
    if counts["kernels_dropped"]:
        notes.append(("warning", "negative_durations", f"{counts['kernels_dropped']} kernels with end < start were "
                      f"not stored ({KERNEL}); analyses miss them"))
    if counts["short_only"]:
        notes.append(("info", "kernel_short_names", f"{counts['short_only']} kernels have no demangledName: stored "
                      "under their shortName (no parameter list)"))
    if counts["unnamed"]:
        notes.append(("warning", "unnamed_kernels", f"{counts['unnamed']} kernels have neither demangledName nor "
                      "shortName: stored as 'unknown' and classified as compute"))
    for t, kind in ((MEMCPY, "memcpy"), (MEMSET, "memset")):
        if counts[f"{kind}_dropped"]:
            notes.append(("warning", "negative_durations", f"{counts[f'{kind}_dropped']} {kind} operations with "
                          f"end < start were not stored ({t})"))
    if counts["api_dropped"]:
        notes.append(("warning", "negative_durations", f"{counts['api_dropped']} CUDA API calls with end < start "
                      f"were not stored ({RUNTIME}); kernels they launched lose their CPU link"))
    if counts["no_runtime_table"] and counts["kernels"]:
        notes.append(("warning", "no_cuda_runtime", f"the export has no CUDA runtime table ({RUNTIME}): "
                      f"{counts['kernels']} kernels have no launch, so launch delays, host-bound idle and queued work "
                      "cannot be told apart; profile with --trace=cuda"))
    if counts["nvtx_dropped"]:
        notes.append(("warning", "negative_durations", f"{counts['nvtx_dropped']} NVTX ranges with end < start were "
                      f"not stored ({NVTX})"))
    return notes


def read_devices(ex: Export, procs: dict[int, set[int]], rank_of: dict[int, int]) -> Batch:
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
        pid = (g >> PID_SHIFT) & PID_MASK
        for dev in sorted(procs[g]):
            name, sms, mem = info.get(dev, (None, None, None))
            rows.append((rank_of[g], dev, name, sms if sms is not None else cuda.get((pid, dev)), mem))
    cols = list(zip(*rows, strict=False)) if rows else [[]] * 5
    return Batch("devices", pa.table({
        "rank": pa.array(cols[0], pa.int32()), "device_id": pa.array(cols[1], pa.int32()),
        "name": pa.array(cols[2], pa.string()), "sm_count": pa.array(cols[3], pa.int32()),
        "total_memory_bytes": pa.array(cols[4], pa.int64())}))


def _kernels(ex: Export, ctx: Placement, counts: Counter, rows) -> Iterator[Batch]:
    """Kernels. Small integer columns are packed into one SQLite integer per group (fewer Python objects per row:
    the fetch is what costs) and unpacked with Arrow: process key << 16 | deviceId, demangledName << 31 |
    shortName (StringIds ids < 2^31; NULL -> an id that names nothing), streamId << 32 | correlationId,
    grid/block x << 32 | y << 16 | z."""
    t = KERNEL
    need = {"start", "end", "deviceId", "globalPid", "demangledName", "shortName"}
    if not need <= ex.cols(t):
        raise InputError(f"kernel table lacks columns {sorted(need - ex.cols(t))}", path=str(ex.path),
                         hint="re-export with a supported nsys version: " + REEXPORT)
    have = ex.cols(t)
    c = lambda n: f'"{n}"' if n in have else "0"  # noqa: E731
    corr = f'ifnull("correlationId", {_NO_CORR})' if "correlationId" in have else str(_NO_CORR)
    graph = '"graphId"' if "graphId" in have else "NULL"
    sql = (f'SELECT "start", "end", CASE WHEN deviceId BETWEEN 0 AND {values.MAX_DEVICE} '
           f'THEN ((globalPid >> {PID_SHIFT}) << 16) | deviceId END, '
           f'(ifnull(demangledName, {_NO_NAME}) << 31) | ifnull(shortName, {_NO_NAME}), '
           f'({c("streamId")} << 32) | {corr}, '
           f'({c("gridX")} << 32) | ({c("gridY")} << 16) | {c("gridZ")}, '
           f'({c("blockX")} << 32) | ({c("blockY")} << 16) | {c("blockZ")}, {graph} FROM {t}' + rowid_filter(rows))
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
            "kernel_id": row_ids(n, m),
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


def _kernel_name_ids(ex: Export, packed: pa.Array) -> tuple[pa.Array, int, int]:
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


def _memops(ex: Export, ctx: Placement, counts: Counter, t: str, rows) -> Iterator[Batch]:
    kind = "memcpy" if t == MEMCPY else "memset"
    if t not in ex.tables or not {"start", "end", "deviceId", "globalPid"} <= ex.cols(t):
        return
    c = ex.col
    sql = (f'SELECT "start", "end", deviceId, globalPid >> {PID_SHIFT}, {c(t, "streamId")}, '
           f'{c(t, "correlationId")}, {c(t, "bytes")}, {c(t, "copyKind")}, {c(t, "srcKind")}, '
           f'{c(t, "dstKind")}, {c(t, "memKind")} FROM {t}' + rowid_filter(rows))
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
            "memop_id": row_ids(n, m),
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


def _api_calls(ex: Export, ctx: Placement, counts: Counter, rows) -> Iterator[Batch]:
    """Runtime/driver calls. Packed per row (fewer Python objects): rank index (position of the process in
    rank_keys, 127 = not a rank) << 56 | TID << 32 | correlationId, and nameId << 8 | eventClass."""
    t = RUNTIME
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
    sql = (f'SELECT "start", "end", (({case}) << 56) | ((globalTid & {PID_MASK}) << 32) | ({corr} & 4294967295), '
           f'(ifnull(nameId, {_NO_NAME}) << 8) | ({ec} & 255) FROM {t}' + rowid_filter(rows))
    n = 0
    for cols in values.chunks(ex, t, sql, [pa.int64()] * 4, ["start", "end", "globalTid", "nameId"]):
        m = len(cols[0])
        packed, name_ec = cols[2], cols[3]
        values.require(ex, t, packed, "globalTid")
        start, end, keep = values.times(ex, t, cols[0], cols[1], ctx.offset)
        idx = pc.shift_right(packed, 56)
        corr_arr = pc.bit_wise_and(packed, 0xFFFFFFFF)
        tbl = pa.table({
            "call_id": row_ids(n, m),
            "rank": pc.take(ctx.api_ranks, idx),
            "pid": pc.take(ctx.api_pids, idx),
            "tid": pc.bit_wise_and(pc.shift_right(packed, 32), PID_MASK),
            "start_ns": start, "end_ns": end,
            "name": ex.name_array(pc.shift_right(name_ec, 8), _api_name),
            "correlation_id": pc.if_else(pc.equal(corr_arr, _NO_CORR), pa.scalar(None, pa.int64()), corr_arr),
            "api": pc.if_else(pc.equal(pc.bit_wise_and(name_ec, 255), 1), "driver", "runtime"),
        })
        n += m
        yield _counted("api_calls", tbl, keep, counts, "api_dropped")


def _counted(table: str, tbl: pa.Table, keep: pa.Array | None, counts: Counter, dropped: str) -> Batch:
    """The batch of ``table``'s rows that have valid times and a rank, counting the rows read and those dropped."""
    counts[table] += tbl.num_rows
    if keep is not None:
        counts[dropped] += tbl.num_rows - pc.sum(keep).as_py()
        tbl = tbl.filter(keep)
    return Batch(table, _keep_ranked(tbl))


def _nvtx(ex: Export, ctx: Placement, counts: Counter, dec: PayloadDecoder, rows) -> Iterator[Batch]:
    t = NVTX
    if t not in ex.tables or not {"start", "eventType", "globalTid"} <= ex.cols(t):
        return
    blob = ex.col(t, "binaryData") if dec.entries else "NULL AS binaryData"
    sql = (f'SELECT "start", {ex.col(t, "end")}, globalTid, {ex.col(t, "text")}, {ex.col(t, "textId")}, '
           f'{ex.col(t, "domainId", default="0")}, {blob} FROM {t}' + rowid_filter(rows, "eventType IN (59, 60)"))
    dkeys = pa.array([k * 65536 + d for (k, d) in ctx.domains if 0 <= d < 65536], pa.int64())
    dnames = pa.array([v for (k, d), v in ctx.domains.items() if 0 <= d < 65536], pa.string())
    n = 0
    types = [pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.int64(), pa.int64(), pa.binary()]
    for cols in values.chunks(ex, t, sql, types, ["start", "end", "globalTid", "textId", "domainId"]):
        m = len(cols[0])
        gtid, dom, blobs = cols[2], cols[5], cols[6]
        values.require(ex, t, gtid, "globalTid")
        start, end, keep = values.times(ex, t, cols[0], cols[1], ctx.offset, end_optional=True)
        pkey = pc.shift_right(gtid, PID_SHIFT)
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
            "range_id": row_ids(n, m),
            "rank": ctx.rank_from_key(pkey),
            "pid": pc.bit_wise_and(pkey, PID_MASK),
            "tid": pc.bit_wise_and(gtid, PID_MASK),
            "start_ns": start,
            "end_ns": end,
            "name": names,
            "kind": pa.repeat(pa.scalar("nvtx"), m),
            "domain": doms,
            "args": args,
        })
        n += m
        yield _counted("cpu_ranges", tbl, keep, counts, "nvtx_dropped")
