"""Kineto importer, stage 2: decoded events -> canonical rows (kernels, mem_ops, api_calls, cpu_ranges).

The hot loop keeps only what the schema needs; communication kernels' args are staged as cpu_ranges rows of kind
'_kernel_args' for stage 3 (kineto_resolve). Values that cannot be stored raise BadValue.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pyarrow as pa
from msgspec import Raw, ValidationError

from .base import Batch
from .kineto_decode import (
    _EMPTY_ARGS,
    _EXACT_TS_US,
    _NULL,
    Args,
    BadValue,
    Event,
    NeedsExactTs,
    _args_decoder,
    _canonical_args,
    _encode,
    exact_ns,
    stream_id,
    tolerant_raw_args,
)

_KIND = {
    "kernel": 1, "Kernel": 1,
    "gpu_memcpy": 2, "Memcpy": 2,
    "gpu_memset": 3, "Memset": 3,
    "cuda_runtime": 4, "Runtime": 4, "xpu_runtime": 4, "privateuse1_runtime": 4, "mtia_runtime": 4,
    "cuda_driver": 5, "xpu_driver": 5, "privateuse1_driver": 5,
    "user_annotation": 6,
    "gpu_user_annotation": 7,
    "cpu_op": 8, "Operator": 8,
    # with_stack=True: Python frames (PyTorch's Python tracer), args {"Python id", "Python parent id"[, "Python
    # thread", "Python module id"]}; kept as ranges without args (the host ops behind host-bound lateness)
    "python_function": 9,
}
# CPU ops that may describe a collective (kineto_comm_ops.sql): c10d ops, functional collectives (their group_size
# argument) and SymmetricMemory ops (the input of a multimem/one-shot/two-shot all-reduce kernel)
_COMM_CPU_PREFIX = ("record_param_comms", "c10d::", "nccl:", "gloo:", "ProfilerStep", "_c10d_functional::",
                    "c10d_functional::", "symm_mem::")
_COMM_ANNOTATION_PREFIX = ("nccl:", "gloo:")
# matrix-multiply CPU ops kept (with 'Input Dims'/'Input type' under record_shapes=True) for queries/gemm/gemm.sql:
# each GEMM kernel gets the problem shape of the op whose range encloses its launch
GEMM_CPU_OPS = frozenset({"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::matmul",
                          "aten::linear", "aten::_scaled_mm", "aten::mv"})
# the same rule as SQL is_comm_kernel_name (classify.sql); used only to decide which kernels get staged args
_COMM_KERNEL_RE = re.compile(
    r"^(nccl|rccl)|multimem_|one_shot_all_reduce|two_shot_all_reduce|symm_mem|cross_device_reduce|"
    r"custom_all_reduce|allreduce_fusion|deep_ep::|nvshmem", re.I)
# kernel name -> whether it is a communication kernel, kept for the process's life: a worker decodes range after
# range of one trace, and a long template name takes ~20 µs to search (a trace of few, long names spent 15 % of its
# row loop in the search when each range started with an empty cache)
_COMM_NAMES: dict[str, bool] = {}
_COMM_NAMES_MAX = 200_000
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


_STREAM_TID = re.compile(r"stream\s*(\d+)", re.I)


def _stream_of(tid):
    """A GPU event's stream from its tid: an int, or (2020-2021 traces) a string like 'stream 7'."""
    if type(tid) is int:
        return tid
    m = _STREAM_TID.match(tid) if isinstance(tid, str) else None
    return int(m.group(1)) if m else None


def _describe_bad_event(e, err: Exception) -> str:
    what = f"'{e.cat}' event '{(e.name or '')[:60]}'" if e is not None else "an event"
    return f"has a {what} with ts {e.ts!r} and dur {e.dur!r}, which are not finite times ({err})"


def _copy_kind(name: str) -> str:
    m = _MEMCPY_TOKEN.search(name)
    if m:
        return _COPY_KINDS.get(m.group(1), "other")
    return "other"


def _column(values, field: pa.Field, table: str) -> pa.Array:
    try:
        return pa.array(values, type=field.type)
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
        bad = next((v for v in values if isinstance(v, int) and not _fits(v, field.type)), None)
        what = {"start_ns": "a timestamp", "end_ns": "an end time"}.get(field.name, f"a {field.name}")
        shown = str(bad) if len(str(bad)) <= 24 else f"{str(bad)[:8]}… ({len(str(bad))} digits)"
        raise BadValue(f"has {what} ({table}.{field.name} = {shown}) outside the {field.type} range") from None


def _fits(v: int, t: pa.DataType) -> bool:
    bits = t.bit_width if pa.types.is_integer(t) else 64
    return -(1 << (bits - 1)) <= v < (1 << (bits - 1))


class _State:
    def __init__(self, rank: int):
        self.rank = rank
        self.rows: dict[str, list[tuple]] = {t: [] for t in SCHEMAS}
        # python_function ranges as columns (range_id, pid, tid, start_ns, end_ns, name): millions in a with_stack
        # trace, so no tuple per row and no transposition (a third of their cost); a cpu_ranges batch of their own
        self.py_cols: tuple[list, ...] = ([], [], [], [], [], [])
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
        self.n_negative_dur = 0
        self.n_bad_ts = 0  # kept events whose ts is missing or not a number: counted, noted, dropped
        self.invalid_utf8 = False

    def flush(self) -> Iterator[Batch]:
        for table, rows in self.rows.items():
            data = None
            if rows:
                schema = SCHEMAS[table]
                arrays = [_column(col, f, table) for col, f in zip(zip(*rows, strict=False), schema, strict=False)]
                rows.clear()
                data = pa.Table.from_arrays(arrays, schema=schema)
            if table == "cpu_ranges" and self.py_cols[0]:  # one batch per table (the pieces' merge keys on it)
                py = self._python_frames()
                data = py if data is None else pa.concat_tables([data, py])
            if data is not None:
                yield Batch(table, data)

    def _python_frames(self) -> pa.Table:
        schema = SCHEMAS["cpu_ranges"]
        py = self.py_cols
        n = len(py[0])
        cols = dict(zip(("range_id", "pid", "tid", "start_ns", "end_ns", "name"), py, strict=True))
        arrays = [_column(cols[f.name], f, "cpu_ranges") if f.name in cols
                  else pa.repeat(pa.scalar(self.rank, f.type), n) if f.name == "rank"
                  else pa.repeat(pa.scalar("python_function", f.type), n) if f.name == "kind"
                  else pa.nulls(n, f.type) for f in schema]
        for c in py:
            c.clear()
        return pa.Table.from_arrays(arrays, schema=schema)

    def add_events(self, events) -> None:  # noqa: C901 - the hot loop, kept flat on purpose
        rank = self.rank
        K = self.rows["kernels"].append
        M = self.rows["mem_ops"].append
        A = self.rows["api_calls"].append
        C = self.rows["cpu_ranges"].append
        py_id, py_pid, py_tid, py_start, py_end, py_name = (c.append for c in self.py_cols)
        kind_of = _KIND.get
        nid = self.next_id
        nk, nm, na = nid["kernels"], nid["mem_ops"], nid["api_calls"]
        comm_cache = _COMM_NAMES
        if len(comm_cache) > _COMM_NAMES_MAX:  # names that differ per launch (a suffix per call): bounded
            comm_cache.clear()
        devices = self.devices
        empty = _EMPTY_ARGS
        decode_args = _args_decoder.decode
        min_ts = self.min_ts
        exact_lim = _EXACT_TS_US
        int_ts = float_ts = False
        self.n_events += len(events)
        n_negative = 0
        e = None
        try:  # free until it raises: a NaN/inf ts or dur is found where it breaks, not by a check per event
            for e in events:
                kind = kind_of(e.cat)
                if kind is None or e.ph != "X":
                    continue
                name = e.name
                if name is None:
                    name = ""
                elif kind == 8 and not name.startswith(_COMM_CPU_PREFIX) and name not in GEMM_CPU_OPS:
                    continue  # most CPU ops: dropped before anything else is read
                t = e.ts
                if t is None:
                    self.n_bad_ts += 1
                    continue
                if type(t) is int:
                    start = t * 1000
                    int_ts = True
                elif type(t) is float:
                    if t > exact_lim:  # epoch µs as a float (a fraction, even .000): t * 1000 is not exact
                        raise NeedsExactTs
                    start = round(t * 1000)
                    float_ts = True
                else:  # the ts's digits (decode_events_exact) or a Decimal (decode_events_slow)
                    start = exact_ns(t)
                    if start is None:
                        self.n_bad_ts += 1
                        continue
                    t = start / 1000  # for min_ts only
                    float_ts = True
                d = e.dur
                if d is None:
                    end = start
                elif type(d) is int:
                    end = start + d * 1000
                else:
                    end = start + round(d * 1000)
                if end < start:  # a negative dur: no interval to place (counted, noted, dropped)
                    n_negative += 1
                    continue
                if min_ts is None or t < min_ts:
                    min_ts = t
                if kind == 9:  # a Python frame: name and interval only (millions with with_stack: no args read)
                    rid = nid["cpu_ranges"]
                    nid["cpu_ranges"] = rid + 1
                    py_id(rid)
                    pid = e.pid
                    py_pid(pid if type(pid) is int else None)
                    tid = e.tid
                    py_tid(tid if type(tid) is int else None)
                    py_start(start)
                    py_end(end)
                    py_name(name)
                    continue
                a = e.args
                if a.__class__ is Raw:  # a kept event's raw args (not decoded in the fast pass)
                    if len(a) <= 4:  # null, {}
                        a = empty
                    else:
                        try:
                            a = decode_args(a)
                        except ValidationError:  # a value of an odd type: this event's args converted
                            a = tolerant_raw_args(a) or empty
                elif a is None:
                    a = empty
                if kind <= 3:  # GPU work (kernel, memcpy, memset): its device and stream
                    dev = a.device
                    if dev is None:
                        pid = e.pid
                        dev = pid if type(pid) is int else 0
                    stream = a.stream
                    if stream.__class__ is not int:
                        stream = stream_id(stream)
                        if stream is None:
                            stream = _stream_of(e.tid)
                    devices.add(dev)
                if kind == 1:  # kernel
                    g = a.grid
                    if g is None or len(g) != 3:
                        g = _NONE3
                    b = a.block
                    if b is None or len(b) != 3:
                        b = _NONE3
                    K((nk, rank, dev, stream, start, end, name, a.correlation, g[0], g[1], g[2], b[0], b[1], b[2],
                       a.graph_id))
                    is_comm = comm_cache.get(name)
                    if is_comm is None:
                        bare = name[5:] if name.startswith("void ") else name
                        is_comm = comm_cache[name] = bool(_COMM_KERNEL_RE.search(bare))
                    if is_comm or a.coll is not None:
                        self._stage_kernel_args(nk, e, a, start, end, dev)
                    nk += 1
                elif kind == 2 or kind == 3:  # memcpy / memset
                    if kind == 2:
                        M((nm, rank, dev, stream, start, end, "memcpy", _copy_kind(name), a.bytes, name, a.correlation))
                    else:
                        M((nm, rank, dev, stream, start, end, "memset", None, a.bytes, name, a.correlation))
                    nm += 1
                elif kind == 4 or kind == 5:  # runtime / driver call
                    if a.correlation is None:
                        continue
                    pid = e.pid
                    if type(pid) is not int:
                        pid = None
                    elif self.first_cpu_pid is None:
                        self.first_cpu_pid = pid
                    tid = e.tid
                    A((na, rank, pid, tid if type(tid) is int else None, start, end, name, a.correlation,
                       "runtime" if kind == 4 else "driver"))
                    na += 1
                    if kind == 5:
                        self.driver = True
                else:  # 6 user_annotation, 7 gpu_user_annotation, 8 cpu_op (9 python_function: above)
                    if kind == 8:
                        ckind = "cpu_op" if not name.startswith("ProfilerStep") else "user_annotation"
                        args_json = self._args_json(a)
                    elif kind == 6:
                        ckind = "user_annotation"
                        # nccl:*/gloo:* annotations carry the collective's input shapes (PyTorch < 2.2)
                        args_json = self._args_json(a) if name.startswith(_COMM_ANNOTATION_PREFIX) else None
                    else:
                        ckind = "gpu_user_annotation"
                        args_json = None
                    rid = nid["cpu_ranges"]
                    nid["cpu_ranges"] = rid + 1
                    pid = _int_or_none(e.pid)
                    C((rid, rank, pid, _int_or_none(e.tid), start, end, name, ckind, pid if kind == 7 else None,
                       args_json))
                    if kind != 7 and self.first_cpu_pid is None and pid is not None:
                        self.first_cpu_pid = pid
        except (ValueError, OverflowError, TypeError) as err:  # e is the event that broke it
            raise BadValue(_describe_bad_event(e, err)) from None
        self.n_negative_dur += n_negative
        nid["kernels"], nid["mem_ops"], nid["api_calls"] = nk, nm, na
        self.min_ts = min_ts
        self.int_ts |= int_ts
        self.float_ts |= float_ts

    @staticmethod
    def _args_json(a: Args) -> str | None:
        b = _encode(_canonical_args(a))
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
                                        _encode(_canonical_args(a)).decode()))
