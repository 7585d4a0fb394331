"""Kineto (PyTorch profiler) JSON importer: .json / .json.gz / .pt.trace.json[.gz].

Streaming: the file is cut into blocks at event boundaries (kineto_stream) and each block is decoded by msgspec into
typed Structs that name only the keys nsys2comm needs; a block whose values have odd types is re-decoded with
orjson and converted tolerantly. Only canonical rows are kept: kernels, mem_ops, api_calls (runtime/driver calls
with a correlation id), cpu_ranges (user annotations incl. ProfilerStep#N, GPU user annotations, and the
communication CPU ops: record_param_comms, c10d::*, nccl:*, gloo:*).

Time: rows are written as ``round(ts_us * 1000)`` (integer ts: ``ts * 1000`` exactly). ``baseTimeNanoseconds``
usually sits in the trailer, after the events, so ``finalize`` adds it (``files.clock_offset_ns``) to the file's
rows with one UPDATE per table in DuckDB; integer-epoch traces have offset 0 and skip it.

Rank: ``--rank`` (options.rank) > ``distributedInfo.rank`` > the file name (rank-3, rank3, rank_3, worker3_...) >
0 ('process_order', with a warning note).

Communication kernels: the kernel args (>= PyTorch 2.2) are staged as ``cpu_ranges`` rows of kind
``'_kernel_args'`` (args JSON; ``tid`` holds the kernel's index in the file); ``finalize`` resolves every
communication kernel (kineto.md §1.8: kernel args, External id -> record_param_comms, correlation -> launch ->
enclosing nccl:*/record_param_comms/c10d:: range via ASOF joins, kernel name), fills ``comm_ops`` and
``ingest_notes`` and deletes the staged rows.

A JSON without a traceEvents array is an InputError; a trace with no GPU kernels ingests with a warning note
``no_gpu_kernels``.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path
from typing import Iterator

import msgspec
import orjson
import pyarrow as pa

from ..errors import InputError
from .base import Batch, ReadOptions, process_pool
from .kineto_stream import BLOCK

SOURCE = "kineto"

# ---------------------------------------------------------------------------------------------- decoding types

_NULL = msgspec.Raw(b"null")


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    device: int | None = None
    stream: int | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    bytes: int | None = None
    graph_id: int | None = msgspec.field(default=None, name="graph id")
    coll: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    in_size: int | None = msgspec.field(default=None, name="In msg size")
    out_size: int | None = msgspec.field(default=None, name="Out msg size")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=_NULL, name="Process Group Ranks")
    pg_id: str | int | None = msgspec.field(default=None, name="Process Group ID")
    src_rank: int | None = msgspec.field(default=None, name="Src Rank")
    dst_rank: int | None = msgspec.field(default=None, name="Dst Rank")
    seq: int | None = msgspec.field(default=None, name="Seq")
    comms_id: int | str | None = msgspec.field(default=None, name="Comms Id")
    input_dims: msgspec.Raw = msgspec.field(default=_NULL, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NULL, name="Input type")


class Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: Args | None = None


_events_decoder = msgspec.json.Decoder(list[Event])
_EMPTY_ARGS = Args()
_encode = msgspec.json.Encoder().encode

# JSON key for each Args attribute that goes into cpu_ranges.args
_ARG_KEYS = [(f.name, f.encode_name) for f in msgspec.structs.fields(Args)
             if f.name not in ("device", "stream", "grid", "block", "bytes", "graph_id")]
_COLL_ATTRS = ("coll", "in_nelems", "out_nelems", "in_size", "out_size", "group_size", "dtype", "pg_name",
               "pg_desc", "pg_id", "src_rank", "dst_rank", "seq", "comms_id")


def _to_int(v):
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 9e18 else None
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            try:
                return _to_int(float(v))
            except ValueError:
                return None
    return None


def _to_num(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return None
    return None


def _to_str(v):
    if v is None:
        return None
    return v if isinstance(v, str) else orjson.dumps(v).decode()


def _pidlike(v):
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        return v
    return _to_int(v)


_ARG_CONVERT = {
    "grid": lambda v: [_to_int(x) for x in v] if isinstance(v, list) else None,
    "block": lambda v: [_to_int(x) for x in v] if isinstance(v, list) else None,
    "coll": _to_str, "dtype": _to_str, "pg_desc": _to_str,
    "pg_name": lambda v: v if isinstance(v, (str, int)) else _to_str(v),
    "pg_id": lambda v: v if isinstance(v, (str, int)) else _to_str(v),
    "comms_id": lambda v: v if isinstance(v, (str, int)) else _to_str(v),
    "pg_ranks": lambda v: msgspec.Raw(orjson.dumps(v)),
    "input_dims": lambda v: msgspec.Raw(orjson.dumps(v)),
    "input_type": lambda v: msgspec.Raw(orjson.dumps(v)),
}


def _tolerant_event(d) -> Event | None:
    """An Event from a plain dict whose values may have unexpected types (slow path)."""
    if not isinstance(d, dict):
        return None
    a = d.get("args")
    args = None
    if isinstance(a, dict):
        kw = {}
        for attr, key in _ALL_ARG_KEYS:
            if key in a:
                v = a[key]
                conv = _ARG_CONVERT.get(attr, _to_int)
                kw[attr] = conv(v)
        args = Args(**kw)
    return Event(ph=_to_str(d.get("ph")), cat=_to_str(d.get("cat")), name=_to_str(d.get("name")),
                 pid=_pidlike(d.get("pid")), tid=_pidlike(d.get("tid")), ts=_to_num(d.get("ts")),
                 dur=_to_num(d.get("dur")), args=args)


_ALL_ARG_KEYS = [(f.name, f.encode_name) for f in msgspec.structs.fields(Args)]


def decode_events(data: bytes) -> list[Event]:
    """Decode a JSON array of events; msgspec.DecodeError when it is not valid JSON."""
    was = gc.isenabled()
    gc.disable()  # millions of small allocations: generation-0 collections would cost ~40 %
    try:
        return _events_decoder.decode(data)
    except msgspec.ValidationError:
        try:
            objs = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise msgspec.DecodeError(str(e)) from None
        return [ev for ev in map(_tolerant_event, objs) if ev is not None]
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------------------------------------- sniffing


def _peek_decompressed(path: Path, n: int = 4096) -> bytes:
    import gzip
    import zlib

    try:
        with gzip.open(path, "rb") as f:
            return f.read(n)
    except (OSError, EOFError, zlib.error):
        return b""


def sniff(path, head: bytes) -> bool:
    if head[:2] == b"\x1f\x8b":
        head = _peek_decompressed(Path(path))
    s = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not s.startswith((b"{", b"[")):  # '[': Chrome trace JSON array format
        return False
    # JSON object start: ours (traceEvents may come later in the file; the reader says so if it never does)
    return True


# ---------------------------------------------------------------------------------------------- row builders

_KIND = {
    "kernel": 1, "Kernel": 1,
    "gpu_memcpy": 2, "Memcpy": 2,
    "gpu_memset": 3, "Memset": 3,
    "cuda_runtime": 4, "Runtime": 4, "xpu_runtime": 4, "privateuse1_runtime": 4, "mtia_runtime": 4,
    "cuda_driver": 5, "xpu_driver": 5, "privateuse1_driver": 5,
    "user_annotation": 6,
    "gpu_user_annotation": 7,
    "cpu_op": 8, "Operator": 8,
}
_COMM_CPU_PREFIX = ("record_param_comms", "c10d::", "nccl:", "gloo:", "ProfilerStep")
# the same rule as SQL is_comm_kernel_name (20_classify.sql); used only to decide which kernels get staged args
_COMM_KERNEL_RE = re.compile(
    r"^(nccl|rccl)|multimem_|one_shot_all_reduce|two_shot_all_reduce|symm_mem|cross_device_reduce|"
    r"custom_all_reduce|allreduce_fusion|deep_ep::|nvshmem", re.I)
_COPY_KINDS = {"HtoD": "HtoD", "DtoH": "DtoH", "DtoD": "DtoD", "HtoH": "HtoH", "PtoP": "PtoP"}
_MEMCPY_TOKEN = re.compile(r"(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD|AtoH|HtoA|AtoA)")

SCHEMAS = {
    "kernels": pa.schema([("kernel_id", pa.int64()), ("rank", pa.int32()), ("device_id", pa.int32()),
                          ("stream_id", pa.int64()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                          ("name", pa.string()), ("correlation_id", pa.int64()),
                          ("grid_x", pa.int32()), ("grid_y", pa.int32()), ("grid_z", pa.int32()),
                          ("block_x", pa.int32()), ("block_y", pa.int32()), ("block_z", pa.int32()),
                          ("graph_id", pa.int64())]),
    "mem_ops": pa.schema([("memop_id", pa.int64()), ("rank", pa.int32()), ("device_id", pa.int32()),
                          ("stream_id", pa.int64()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                          ("kind", pa.string()), ("copy_kind", pa.string()), ("bytes", pa.int64()),
                          ("name", pa.string()), ("correlation_id", pa.int64())]),
    "api_calls": pa.schema([("call_id", pa.int64()), ("rank", pa.int32()), ("pid", pa.int64()), ("tid", pa.int64()),
                            ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("name", pa.string()),
                            ("correlation_id", pa.int64()), ("api", pa.string())]),
    "cpu_ranges": pa.schema([("range_id", pa.int64()), ("rank", pa.int32()), ("pid", pa.int64()),
                             ("tid", pa.int64()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                             ("name", pa.string()), ("kind", pa.string()), ("device_id", pa.int32()),
                             ("args", pa.string())]),
}


_NONE3 = (None, None, None)

# _State flags that date a trace (kineto.md §1.7), as files.producer reports them
_ERA_MARKERS = (("kernel_coll_args", "collective args on kernels"),
                ("kernel_pg_args", "process-group args on kernels"),
                ("kernel_p2p_args", "Src/Dst Rank on kernels"),
                ("kernel_seq", "Seq on kernels"),
                ("driver", "cuda_driver events"))


def _int_or_none(v):
    return v if type(v) is int else None


def _copy_kind(name: str) -> str:
    m = _MEMCPY_TOKEN.search(name)
    if m:
        return _COPY_KINDS.get(m.group(1), "other")
    return "other"


class _State:
    def __init__(self, rank: int):
        self.rank = rank
        self.rows: dict[str, list[tuple]] = {t: [] for t in SCHEMAS}
        self.next_id = {t: 0 for t in SCHEMAS}
        self.devices: set[int] = set()
        self.n_kernels = 0
        self.n_events = 0
        self.float_ts = False
        self.int_ts = False
        self.kernel_coll_args = False
        self.kernel_pg_args = False
        self.kernel_p2p_args = False
        self.kernel_seq = False
        self.legacy_cats = False
        self.driver = False
        self.first_cpu_pid: int | None = None
        self.min_ts: float | None = None
        self.comm_name_cache: dict[str, bool] = {}

    def flush(self) -> Iterator[Batch]:
        for table, rows in self.rows.items():
            if rows:
                schema = SCHEMAS[table]
                arrays = [pa.array(col, type=f.type) for col, f in zip(zip(*rows), schema)]
                rows.clear()
                yield Batch(table, pa.Table.from_arrays(arrays, schema=schema))

    def add_events(self, events) -> None:  # noqa: C901 - the hot loop, kept flat on purpose
        rank = self.rank
        K = self.rows["kernels"].append
        M = self.rows["mem_ops"].append
        A = self.rows["api_calls"].append
        C = self.rows["cpu_ranges"].append
        kind_of = _KIND.get
        nid = self.next_id
        nk, nm, na = nid["kernels"], nid["mem_ops"], nid["api_calls"]
        comm_cache = self.comm_name_cache
        devices = self.devices
        empty = _EMPTY_ARGS
        min_ts = self.min_ts
        int_ts = float_ts = False
        self.n_events += len(events)
        for e in events:
            kind = kind_of(e.cat)
            if kind is None or e.ph != "X":
                continue
            t = e.ts
            if t is None:
                continue
            if type(t) is int:
                start = t * 1000
                int_ts = True
            else:
                start = round(t * 1000)
                float_ts = True
            d = e.dur
            if d is None:
                end = start
            elif type(d) is int:
                end = start + d * 1000
            else:
                end = start + round(d * 1000)
            if min_ts is None or t < min_ts:
                min_ts = t
            a = e.args
            if a is None:
                a = empty
            name = e.name
            if name is None:
                name = ""
            if kind == 1:  # kernel
                pid = e.pid
                dev = a.device
                if dev is None:
                    dev = pid if type(pid) is int else 0
                stream = a.stream
                if stream is None:
                    stream = _int_or_none(e.tid)
                g = a.grid
                if g is None or len(g) != 3:
                    g = _NONE3
                b = a.block
                if b is None or len(b) != 3:
                    b = _NONE3
                K((nk, rank, dev, stream, start, end, name, a.correlation, g[0], g[1], g[2], b[0], b[1], b[2],
                   a.graph_id))
                devices.add(dev)
                is_comm = comm_cache.get(name)
                if is_comm is None:
                    is_comm = comm_cache[name] = bool(_COMM_KERNEL_RE.search(name[5:] if name.startswith("void ") else name))
                if is_comm or a.coll is not None:
                    self._stage_kernel_args(nk, e, a, start, end, dev)
                nk += 1
            elif kind == 2 or kind == 3:  # memcpy / memset
                pid = e.pid
                dev = a.device
                if dev is None:
                    dev = pid if type(pid) is int else 0
                stream = a.stream
                if stream is None:
                    stream = _int_or_none(e.tid)
                if kind == 2:
                    M((nm, rank, dev, stream, start, end, "memcpy", _copy_kind(name), a.bytes, name, a.correlation))
                else:
                    M((nm, rank, dev, stream, start, end, "memset", None, a.bytes, name, a.correlation))
                nm += 1
                devices.add(dev)
            elif kind == 4 or kind == 5:  # runtime / driver call
                if a.correlation is None:
                    continue
                pid = e.pid
                if type(pid) is not int:
                    pid = None
                elif self.first_cpu_pid is None:
                    self.first_cpu_pid = pid
                A((na, rank, pid, _int_or_none(e.tid), start, end, name, a.correlation,
                   "runtime" if kind == 4 else "driver"))
                na += 1
                if kind == 5:
                    self.driver = True
            else:  # 6 user_annotation, 7 gpu_user_annotation, 8 cpu_op
                if kind == 8:
                    if not name.startswith(_COMM_CPU_PREFIX):
                        continue
                    ckind = "cpu_op" if not name.startswith("ProfilerStep") else "user_annotation"
                    args_json = self._args_json(a)
                elif kind == 6:
                    ckind = "user_annotation"
                    args_json = None
                else:
                    ckind = "gpu_user_annotation"
                    args_json = None
                rid = nid["cpu_ranges"]
                nid["cpu_ranges"] = rid + 1
                pid = _int_or_none(e.pid)
                C((rid, rank, pid, _int_or_none(e.tid), start, end, name, ckind, pid if kind == 7 else None, args_json))
                if kind != 7 and self.first_cpu_pid is None and pid is not None:
                    self.first_cpu_pid = pid
        nid["kernels"], nid["mem_ops"], nid["api_calls"] = nk, nm, na
        self.min_ts = min_ts
        self.int_ts |= int_ts
        self.float_ts |= float_ts

    @staticmethod
    def _args_json(a: Args) -> str | None:
        b = _encode(a)
        return None if b == b"{}" else b.decode()

    def _stage_kernel_args(self, kid: int, e: Event, a: Args, start: int, end: int, dev: int) -> None:
        if a.coll is not None:
            self.kernel_coll_args = True
            if a.pg_name is not None or a.pg_ranks is not _NULL:
                self.kernel_pg_args = True
            if a.src_rank is not None or a.dst_rank is not None:
                self.kernel_p2p_args = True
            if a.seq is not None:
                self.kernel_seq = True
        rid = self.next_id["cpu_ranges"]
        self.next_id["cpu_ranges"] = rid + 1
        self.rows["cpu_ranges"].append((rid, self.rank, None, kid, start, end, e.name or "", "_kernel_args", dev,
                                        _encode(a).decode()))


# ---------------------------------------------------------------------------------------------- rank


_RANK_IN_NAME = [re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)", re.I), re.compile(r"^worker[-_]?(\d+)(?:[^0-9]|$)", re.I)]


def rank_from_file_name(name: str) -> int | None:
    for rx in _RANK_IN_NAME:
        m = rx.search(name)
        if m:
            return int(m.group(1))
    return None


def _dist_info(header: dict, trailer: dict) -> dict:
    d = header.get("distributedInfo") or trailer.get("distributedInfo")
    return d if isinstance(d, dict) else {}


def _resolve_rank(path: Path, options: ReadOptions, dist: dict) -> tuple[int, str]:
    if options.rank is not None:
        return int(options.rank), "cli"
    r = _to_int(dist.get("rank"))
    if r is not None and r >= 0:
        return r, "distributedInfo"
    r = rank_from_file_name(path.name)
    if r is not None:
        return r, "file_name"
    return 0, "process_order"


# ---------------------------------------------------------------------------------------------- read


def _process(events, rank: int) -> tuple[dict[str, pa.Table], "_State"]:
    st = _State(rank)
    st.add_events(events)
    tables = {b.table: b.data for b in st.flush()}
    st.comm_name_cache = {}
    return tables, st


def _work(piece: bytes, rank: int):
    """Worker: decode one raw piece (see kineto_stream.iter_raw); None when the cut was not at top level."""
    try:
        events = decode_events(b"[" + piece + b"{}]")
    except msgspec.DecodeError:
        return None
    return _process(events, rank)


def _workers(path: Path, options: ReadOptions) -> int:
    """Decoder processes: 0 (in-process) for small files, inside pool workers, or on one core."""
    n = options.extra.get("kineto_workers")
    if n is not None:
        return int(n)
    import multiprocessing
    import os

    if multiprocessing.parent_process() is not None or (os.cpu_count() or 1) < 2:
        return 0
    size = path.stat().st_size
    gz = path.name.endswith(".gz")
    return min(2, os.cpu_count() or 1) if size > (8 << 20 if gz else 64 << 20) else 0


class _Totals:
    """Running per-file counters; shifts per-piece row ids to per-file ids."""

    def __init__(self, rank: int):
        self.st = _State(rank)

    def merge(self, tables: dict[str, pa.Table], st: "_State") -> Iterator[Batch]:
        import pyarrow.compute as pc

        from .base import ID_COLUMNS

        tot = self.st
        koff = tot.next_id["kernels"]
        for table, data in tables.items():
            off = tot.next_id[table]
            if off:
                idc = ID_COLUMNS[table]
                data = data.set_column(data.schema.get_field_index(idc), idc, pc.add(data[idc], pa.scalar(off, pa.int64())))
            if table == "cpu_ranges" and koff:
                staged = pc.equal(data["kind"], "_kernel_args")
                data = data.set_column(data.schema.get_field_index("tid"), "tid",
                                       pc.if_else(staged, pc.add(data["tid"], pa.scalar(koff, pa.int64())), data["tid"]))
            yield Batch(table, data)
        for t in tot.next_id:
            tot.next_id[t] += st.next_id[t]
        tot.devices |= st.devices
        tot.n_events += st.n_events
        for flag in ("float_ts", "int_ts", "kernel_coll_args", "kernel_pg_args", "kernel_p2p_args", "kernel_seq",
                     "driver"):
            setattr(tot, flag, getattr(tot, flag) or getattr(st, flag))
        if tot.first_cpu_pid is None:
            tot.first_cpu_pid = st.first_cpu_pid
        if st.min_ts is not None and (tot.min_ts is None or st.min_ts < tot.min_ts):
            tot.min_ts = st.min_ts


def _read_events(path: Path, options: ReadOptions, block: int, out: dict) -> Iterator[Batch]:
    """Stream the event array: parallel speculative decoding of raw pieces, sequential validated fallback."""
    from collections import deque

    from .kineto_stream import Limits, finish, iter_raw, split_validated

    limits = Limits.from_options(options)
    src = iter_raw(path, block, limits)
    _, header = next(src)
    out["header"] = header
    rank, _ = _resolve_rank(path, options, _dist_info(header, {}))
    totals = _Totals(rank)
    out["totals"] = totals
    nworkers = _workers(path, options)
    pending = b""  # sequential mode: bytes not yet cut at a validated boundary
    tail = b""
    pool = None
    inflight: deque = deque()

    def sequential(piece: bytes) -> Iterator[Batch]:
        nonlocal pending
        if not pending:
            res = _work(piece, rank)
            if res is not None:
                yield from totals.merge(*res)
                return
        pending = pending + piece if pending else piece
        cut, events = split_validated(pending, path, decode_events, limits.max_event_bytes)
        if cut > 0:
            pending = pending[cut:]
            yield from totals.merge(*_process(events, rank))

    try:
        if nworkers > 0:
            pool = process_pool(nworkers)
        parallel = pool is not None
        for what, piece in src:
            if what == "tail":
                tail = piece
                break
            if not parallel:
                yield from sequential(piece)
                continue
            inflight.append((piece, pool.submit(_work, piece, rank)))
            while len(inflight) > nworkers:
                p0, fut = inflight.popleft()
                res = fut.result()
                if res is None:  # a cut inside a string or nested object: go sequential from here on
                    parallel = False
                    rest = [p0] + [p for p, f in inflight]
                    for _, f in inflight:
                        f.cancel()
                    inflight.clear()
                    for p in rest:
                        yield from sequential(p)
                    break
                yield from totals.merge(*res)
        while inflight:
            p0, fut = inflight.popleft()
            res = fut.result() if parallel else None
            if res is None:
                parallel = False
                yield from sequential(p0)
                for p, f in inflight:
                    f.cancel()
                    yield from sequential(p)
                inflight.clear()
                break
            yield from totals.merge(*res)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    events, trailer = finish(pending + tail if pending else tail, path)
    out["trailer"] = trailer
    if events:
        yield from totals.merge(*_process([ev for ev in map(_tolerant_event, events) if ev is not None], rank))


def read(path, options: ReadOptions | None = None, *, block: int = BLOCK) -> Iterator[Batch]:
    path = Path(path)
    options = options or ReadOptions()
    out: dict = {}
    yield from _read_events(path, options, block, out)
    header, trailer = out["header"], out["trailer"]
    state = out["totals"].st
    dist = _dist_info(header, trailer)
    rank, rank_source = _resolve_rank(path, options, dist)  # the final word (distributedInfo may be in the trailer)
    base = _to_int(trailer.get("baseTimeNanoseconds", header.get("baseTimeNanoseconds")))
    notes = []
    if base is None:
        base = 0
        if state.min_ts is not None and state.min_ts < 1e14:  # < 1973 as epoch µs: relative ts without a base
            notes.append(("warning", "relative_ts_no_base",
                          "timestamps are relative but the trace has no baseTimeNanoseconds; times are not on the "
                          "Unix epoch, so this rank cannot be aligned with others"))
        clock_rule = "kineto: ns = round(ts_us * 1000) (ts are epoch µs; no baseTimeNanoseconds)"
    else:
        clock_rule = "kineto: ns = baseTimeNanoseconds + round(ts_us * 1000)"
    markers = []
    if base:
        markers.append("baseTimeNanoseconds")
    if state.float_ts:
        markers.append("fractional ts")
    elif state.int_ts:
        markers.append("integer ts")
    markers += [label for flag, label in _ERA_MARKERS if getattr(state, flag)]
    if "pg_config" in dist:
        markers.append("distributedInfo.pg_config")
    if dist.get("nccl_version"):
        markers.append(f"nccl_version {dist['nccl_version']}")
    for k in ("cupti_version", "cuda_runtime_version", "cuda_driver_version", "roctracer_version"):
        if k in header or k in trailer:
            markers.append(f"{k} {header.get(k, trailer.get(k))}")
    sv = header.get("schemaVersion", trailer.get("schemaVersion"))
    yield Batch("files", pa.table({
        "format_version": pa.array([f"schemaVersion {sv}" if sv is not None else None], pa.string()),
        "producer": pa.array([", ".join(markers) or None], pa.string()),
        "host": pa.array([None], pa.string()),
        "clock_rule": pa.array([clock_rule], pa.string()),
        "clock_offset_ns": pa.array([base], pa.int64()),
    }))
    world = _to_int(dist.get("world_size"))
    yield Batch("ranks", pa.table({
        "rank": pa.array([rank], pa.int32()), "pid": pa.array([state.first_cpu_pid], pa.int64()),
        "host": pa.array([None], pa.string()), "world_size": pa.array([world], pa.int32()),
        "rank_source": pa.array([rank_source], pa.string())}))
    props = {}
    for p in header.get("deviceProperties") or trailer.get("deviceProperties") or []:
        if isinstance(p, dict) and _to_int(p.get("id")) is not None:
            props[_to_int(p.get("id"))] = p
    devs = sorted(state.devices)
    if devs:
        yield Batch("devices", pa.table({
            "rank": pa.array([rank] * len(devs), pa.int32()),
            "device_id": pa.array(devs, pa.int32()),
            "name": pa.array([_to_str(props.get(d, {}).get("name")) for d in devs], pa.string()),
            "sm_count": pa.array([_to_int(props.get(d, {}).get("numSms")) for d in devs], pa.int32()),
            "total_memory_bytes": pa.array([_to_int(props.get(d, {}).get("totalGlobalMem")) for d in devs], pa.int64()),
        }))
    if rank_source == "file_name":
        notes.append(("warning", "no_rank_info", f"the trace has no distributedInfo; rank {rank} was taken from the "
                      "file name (initialise the process group before profiling, or pass --rank)"))
    elif rank_source == "process_order":
        notes.append(("warning", "no_rank_info", "the trace has no distributedInfo and its file name holds no rank; "
                      "assumed rank 0 (pass --rank, or initialise the process group before profiling)"))
    if world is None and rank_source != "cli":
        notes.append(("info", "no_world_size", "the trace does not record the world size (distributedInfo.world_size)"))
    if state.next_id["kernels"] == 0:
        notes.append(("warning", "no_gpu_kernels", "the trace has no GPU kernels: profile with "
                      "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"))
    if notes:
        yield Batch("ingest_notes", pa.table({
            "rank": pa.array([rank] * len(notes), pa.int32()),
            "severity": pa.array([n[0] for n in notes], pa.string()),
            "code": pa.array([n[1] for n in notes], pa.string()),
            "message": pa.array([n[2] for n in notes], pa.string())}))


# ---------------------------------------------------------------------------------------------- finalize

_TABLES = ("kernels", "mem_ops", "api_calls", "cpu_ranges")

# fields of a Kineto args JSON (kernel args or record_param_comms) in canonical units; `a` is the JSON column
_FIELDS = """
    canonical_collective(a->>'Collective name') AS coll,
    lower(a->>'Collective name') = 'wait' AS is_wait,
    coalesce(TRY_CAST(a->>'In msg nelems' AS BIGINT), TRY_CAST(a->>'In msg size' AS BIGINT)) AS in_n,
    coalesce(TRY_CAST(a->>'Out msg nelems' AS BIGINT), TRY_CAST(a->>'Out msg size' AS BIGINT)) AS out_n,
    canonical_dtype(a->>'dtype') AS dtype,
    TRY_CAST(a->>'Group size' AS INTEGER) AS group_size,
    coalesce(a->>'Process Group Name', a->>'Process Group ID') AS pg_name,
    a->>'Process Group Description' AS pg_desc,
    CASE WHEN json_type(a->'Process Group Ranks') = 'VARCHAR' THEN TRY_CAST(a->>'Process Group Ranks' AS INTEGER[])
         ELSE TRY_CAST(CAST(a->'Process Group Ranks' AS VARCHAR) AS INTEGER[]) END AS pg_ranks,
    TRY_CAST(a->>'Src Rank' AS INTEGER) AS src_rank,
    TRY_CAST(a->>'Dst Rank' AS INTEGER) AS dst_rank,
    TRY_CAST(a->>'Seq' AS BIGINT) AS seq,
    a->>'Comms Id' AS comm_id,
    TRY_CAST(a->>'External id' AS BIGINT) AS ext_id,
    canonical_dtype((a->'Input type')->>0) AS dims_dtype,
    list_aggregate(TRY_CAST(CAST((a->'Input Dims')->0 AS VARCHAR) AS BIGINT[]), 'product') AS dims_nelems
"""


def finalize(con, file_id: int) -> None:
    fid = int(file_id)
    idbase = fid << 40
    off, = con.execute("SELECT coalesce(clock_offset_ns, 0) FROM files WHERE file_id = ?", [fid]).fetchone()
    rank, = con.execute("SELECT rank FROM ranks WHERE file_id = ? LIMIT 1", [fid]).fetchone()
    for t in _TABLES:
        sets = []
        if off:
            sets.append(f"start_ns = start_ns + {int(off)}, end_ns = end_ns + {int(off)}")
        stale = con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE file_id = {fid} AND rank <> {rank} LIMIT 1)").fetchone()[0]
        if stale:
            sets.append(f"rank = {rank}")
        if sets:
            con.execute(f"UPDATE {t} SET {', '.join(sets)} WHERE file_id = {fid}")
    if con.execute(f"SELECT count(*) FROM (SELECT 1 FROM devices WHERE file_id = {fid} AND rank <> {rank} LIMIT 1)").fetchone()[0]:
        con.execute(f"UPDATE devices SET rank = {rank} WHERE file_id = {fid}")

    con.execute(f"""
    CREATE OR REPLACE TEMP TABLE _kt_ck AS
    SELECT k.kernel_id, k.rank, k.correlation_id, k.short_name, k.start_ns, k.end_ns
    FROM kernels k WHERE k.file_id = {fid} AND k.kernel_class = 'communication';

    CREATE OR REPLACE TEMP TABLE _kt_ka AS
    SELECT {idbase} + kidx AS kernel_id, TRY_CAST(a->>'correlation' AS BIGINT) AS corr, {_FIELDS}
    FROM (SELECT tid AS kidx, args AS a FROM cpu_ranges WHERE file_id = {fid} AND kind = '_kernel_args');

    CREATE OR REPLACE TEMP TABLE _kt_rpc AS
    SELECT range_id, pid, tid, start_ns, end_ns, {_FIELDS}
    FROM (SELECT *, args AS a FROM cpu_ranges WHERE file_id = {fid} AND kind = 'cpu_op' AND name = 'record_param_comms');

    -- launch of each comm kernel (correlation -> runtime/driver call)
    CREATE OR REPLACE TEMP TABLE _kt_launch AS
    SELECT ck.kernel_id, c.pid, c.tid, c.start_ns, c.end_ns
    FROM _kt_ck ck JOIN (SELECT correlation_id, arg_min(pid, start_ns) AS pid, arg_min(tid, start_ns) AS tid,
                                min(start_ns) AS start_ns, min(end_ns) AS end_ns
                         FROM api_calls WHERE file_id = {fid} GROUP BY correlation_id) c
      ON c.correlation_id = ck.correlation_id;

    CREATE OR REPLACE TEMP TABLE _kt_ann AS
    SELECT pid, tid, start_ns, end_ns, name, canonical_collective(name) AS coll
    FROM cpu_ranges WHERE file_id = {fid} AND kind IN ('user_annotation', 'cpu_op')
      AND (name LIKE 'nccl:%' OR name LIKE 'gloo:%') AND pid IS NOT NULL AND tid IS NOT NULL;

    CREATE OR REPLACE TEMP TABLE _kt_c10d AS
    SELECT pid, tid, start_ns, end_ns, name, canonical_collective(name) AS coll
    FROM cpu_ranges WHERE file_id = {fid} AND kind = 'cpu_op' AND name LIKE 'c10d::%'
      AND pid IS NOT NULL AND tid IS NOT NULL;
    """)
    # innermost enclosing range of each class on the launching thread (ASOF: latest start <= launch start)
    con.execute(f"""
    CREATE OR REPLACE TEMP TABLE _kt_encl AS
    WITH ann AS (
      SELECT l.kernel_id, r.coll AS ann_coll
      FROM _kt_launch l ASOF JOIN _kt_ann r ON l.pid = r.pid AND l.tid = r.tid AND l.start_ns >= r.start_ns
      WHERE r.end_ns >= l.end_ns AND r.coll IS NOT NULL),
    c10d AS (
      SELECT l.kernel_id, r.coll AS c10d_coll
      FROM _kt_launch l ASOF JOIN _kt_c10d r ON l.pid = r.pid AND l.tid = r.tid AND l.start_ns >= r.start_ns
      WHERE r.end_ns >= l.end_ns AND r.coll IS NOT NULL),
    rpc AS (
      SELECT l.kernel_id, r.range_id AS rpc_range
      FROM _kt_launch l ASOF JOIN (SELECT * FROM _kt_rpc WHERE NOT coalesce(is_wait, false)) r
        ON l.pid = r.pid AND l.tid = r.tid AND l.start_ns >= r.start_ns
      WHERE r.end_ns >= l.end_ns)
    SELECT ck.kernel_id, ann.ann_coll, c10d.c10d_coll, rpc.rpc_range
    FROM _kt_ck ck LEFT JOIN ann USING (kernel_id) LEFT JOIN c10d USING (kernel_id) LEFT JOIN rpc USING (kernel_id);
    """)
    con.execute(f"""
    INSERT INTO comm_ops BY NAME
    WITH j AS (
      SELECT ck.kernel_id, ck.rank, ck.short_name,
        ka.coll AS k_coll, ka.in_n AS k_in, ka.out_n AS k_out, ka.dtype AS k_dtype, ka.group_size AS k_gs,
        ka.pg_name AS k_pg, ka.pg_desc AS k_pgd, ka.pg_ranks AS k_pgr, ka.src_rank AS k_src, ka.dst_rank AS k_dst,
        ka.seq AS k_seq, ka.comm_id AS k_cid,
        x.coll AS x_coll, x.in_n AS x_in, x.out_n AS x_out, x.dtype AS x_dtype, x.group_size AS x_gs,
        x.pg_name AS x_pg, x.pg_desc AS x_pgd, x.pg_ranks AS x_pgr, x.src_rank AS x_src, x.dst_rank AS x_dst,
        x.seq AS x_seq, x.comm_id AS x_cid, x.dims_nelems AS x_dn, x.dims_dtype AS x_dd,
        e.ann_coll, e.c10d_coll,
        r.coll AS r_coll, r.in_n AS r_in, r.out_n AS r_out, r.dtype AS r_dtype, r.group_size AS r_gs,
        r.pg_name AS r_pg, r.pg_desc AS r_pgd, r.pg_ranks AS r_pgr, r.src_rank AS r_src, r.dst_rank AS r_dst,
        r.seq AS r_seq, r.comm_id AS r_cid, r.dims_nelems AS r_dn, r.dims_dtype AS r_dd
      FROM _kt_ck ck
      LEFT JOIN _kt_ka ka ON ka.kernel_id = ck.kernel_id
      LEFT JOIN (SELECT * FROM _kt_rpc WHERE NOT coalesce(is_wait, false) AND ext_id IS NOT NULL
                 QUALIFY row_number() OVER (PARTITION BY ext_id ORDER BY start_ns DESC) = 1) x
        ON x.ext_id = ka.ext_id AND ka.ext_id IS DISTINCT FROM ka.corr
      LEFT JOIN _kt_encl e ON e.kernel_id = ck.kernel_id
      LEFT JOIN _kt_rpc r ON r.range_id = e.rpc_range
    ),
    s AS (
      SELECT *,
        coalesce(k_coll, x_coll, r_coll, ann_coll, c10d_coll, kernel_name_collective(short_name), 'unknown') AS collective,
        CASE WHEN k_coll IS NOT NULL THEN 'kernel_args' WHEN x_coll IS NOT NULL OR r_coll IS NOT NULL THEN 'record_param_comms'
             WHEN ann_coll IS NOT NULL OR c10d_coll IS NOT NULL THEN 'launch_annotation' ELSE 'kernel_name' END
          AS collective_source,
        -- size source: first of kernel args, External-id record_param_comms, enclosing record_param_comms
        CASE WHEN k_in IS NOT NULL OR k_out IS NOT NULL THEN 'k'
             WHEN x_in IS NOT NULL OR x_out IS NOT NULL THEN 'x'
             WHEN r_in IS NOT NULL OR r_out IS NOT NULL THEN 'r'
             WHEN x_dn IS NOT NULL AND x_dd IS NOT NULL THEN 'xd'
             WHEN r_dn IS NOT NULL AND r_dd IS NOT NULL THEN 'rd' END AS ss,
        CASE WHEN k_gs IS NOT NULL OR k_pg IS NOT NULL OR k_pgr IS NOT NULL THEN 'k'
             WHEN x_gs IS NOT NULL OR x_pg IS NOT NULL OR x_pgr IS NOT NULL THEN 'x'
             WHEN r_gs IS NOT NULL OR r_pg IS NOT NULL OR r_pgr IS NOT NULL THEN 'r' END AS gsrc,
        CASE WHEN k_src IS NOT NULL OR k_dst IS NOT NULL THEN 'k'
             WHEN x_src IS NOT NULL OR x_dst IS NOT NULL THEN 'x'
             WHEN r_src IS NOT NULL OR r_dst IS NOT NULL THEN 'r' END AS psrc
      FROM j
    ),
    g AS (
      SELECT *,
        CASE gsrc WHEN 'k' THEN k_gs WHEN 'x' THEN x_gs WHEN 'r' THEN r_gs END AS gs0,
        CASE gsrc WHEN 'k' THEN k_pg WHEN 'x' THEN x_pg WHEN 'r' THEN r_pg END AS pg_name,
        CASE gsrc WHEN 'k' THEN k_pgd WHEN 'x' THEN x_pgd WHEN 'r' THEN r_pgd END AS pg_desc,
        CASE gsrc WHEN 'k' THEN k_pgr WHEN 'x' THEN x_pgr WHEN 'r' THEN r_pgr END AS pgr0,
        CASE ss WHEN 'k' THEN k_dtype WHEN 'x' THEN x_dtype WHEN 'r' THEN r_dtype WHEN 'xd' THEN x_dd WHEN 'rd' THEN r_dd END
          AS dtype,
        CASE ss WHEN 'k' THEN k_in WHEN 'x' THEN x_in WHEN 'r' THEN r_in END AS in_n,
        CASE ss WHEN 'k' THEN k_out WHEN 'x' THEN x_out WHEN 'r' THEN r_out END AS out_n,
        CASE ss WHEN 'xd' THEN x_dn WHEN 'rd' THEN r_dn END AS dims_n,
        CASE psrc WHEN 'k' THEN (CASE WHEN collective = 'recv' THEN k_src ELSE k_dst END)
                  WHEN 'x' THEN (CASE WHEN collective = 'recv' THEN x_src ELSE x_dst END)
                  WHEN 'r' THEN (CASE WHEN collective = 'recv' THEN r_src ELSE r_dst END) END AS peer0,
        coalesce(k_seq, x_seq, r_seq) AS seq,
        coalesce(k_cid, x_cid, r_cid) AS comm_id
      FROM s
    ),
    b AS (
      SELECT *,
        nullif(pgr0, []::INTEGER[]) AS pg_ranks,
        coalesce(gs0, CASE WHEN len(pgr0) > 0 THEN len(pgr0) END) AS group_size,
        dtype_bytes(dtype) AS db
      FROM g
    ),
    z AS (
      SELECT *,
        CASE WHEN in_n IS NOT NULL OR out_n IS NOT NULL THEN in_n * db
             WHEN dims_n IS NOT NULL THEN (CASE WHEN collective = 'recv' THEN NULL ELSE dims_n * db END) END AS in_bytes,
        CASE WHEN in_n IS NOT NULL OR out_n IS NOT NULL THEN out_n * db
             WHEN dims_n IS NOT NULL THEN (CASE
               WHEN collective IN ('all_reduce', 'broadcast', 'all_to_all', 'recv') THEN dims_n * db
               WHEN collective = 'all_gather' THEN dims_n * db * group_size
               WHEN collective = 'reduce_scatter' THEN dims_n * db // group_size END) END AS out_bytes
      FROM b
    ),
    p AS (  -- point-to-point: a send has no output buffer, a recv no input buffer (as NCCL's payloads say)
      SELECT * REPLACE (CASE WHEN collective = 'recv' THEN NULL ELSE in_bytes END AS in_bytes,
                        CASE WHEN collective = 'send' THEN NULL ELSE out_bytes END AS out_bytes)
      FROM z
    ),
    m AS (
      SELECT *,
        CASE WHEN collective IN ('all_gather', 'recv') THEN out_bytes
             WHEN collective = 'unknown' THEN coalesce(in_bytes, out_bytes)
             ELSE in_bytes END AS msg_bytes
      FROM p
    )
    SELECT kernel_id, {fid} AS file_id, rank, collective,
      CASE WHEN db > 0 THEN msg_bytes // db END AS element_count,
      dtype, in_bytes, out_bytes, msg_bytes, group_size, pg_name, pg_desc, pg_ranks,
      CASE WHEN collective IN ('send', 'recv') THEN peer0 END AS peer_rank,
      seq, comm_id, 1 AS n_ops, collective_source,
      CASE ss WHEN 'k' THEN 'kernel_args' WHEN 'x' THEN 'record_param_comms' WHEN 'r' THEN 'record_param_comms'
              WHEN 'xd' THEN 'input_dims' WHEN 'rd' THEN 'input_dims' END AS size_source,
      CASE gsrc WHEN 'k' THEN 'kernel_args' WHEN 'x' THEN 'record_param_comms' WHEN 'r' THEN 'record_param_comms' END
        AS group_source,
      CASE WHEN collective IN ('send', 'recv') AND peer0 IS NOT NULL THEN
        (CASE psrc WHEN 'k' THEN 'kernel_args' ELSE 'record_param_comms' END) END AS peer_source
    FROM m
    """)
    n_comm, n_nosize, n_unknown, n_kargs = con.execute(f"""
      SELECT count(*), count(*) FILTER (WHERE msg_bytes IS NULL), count(*) FILTER (WHERE collective = 'unknown'),
             count(*) FILTER (WHERE collective_source = 'kernel_args')
      FROM comm_ops WHERE file_id = {fid}""").fetchone()
    notes = []
    if n_nosize:
        notes.append(("warning", "no_msg_sizes",
                      f"{n_nosize} of {n_comm} communication kernels have no message size: profile with "
                      "record_shapes=True, or with PyTorch >= 2.2 (collective args on kernels)"))
    if n_unknown:
        notes.append(("warning", "unknown_collective",
                      f"{n_unknown} of {n_comm} communication kernels could not be matched to a collective"))
    if n_comm and not n_kargs:
        notes.append(("info", "no_collective_args",
                      "communication kernels carry no collective args (PyTorch < 2.2): collectives were found "
                      "through their launches"))
    for sev, code, msg in notes:
        con.execute("INSERT INTO ingest_notes VALUES (?, ?, ?, ?, ?)", [fid, rank, sev, code, msg])
    con.execute(f"DELETE FROM cpu_ranges WHERE file_id = {fid} AND kind = '_kernel_args'")
    for t in ("_kt_ck", "_kt_ka", "_kt_rpc", "_kt_launch", "_kt_ann", "_kt_c10d", "_kt_encl"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
