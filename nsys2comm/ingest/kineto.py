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
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Iterator

import duckdb
import msgspec
import orjson
import pyarrow as pa

from ..errors import InputError
from .base import Batch, ReadOptions, process_pool
from .kineto_stream import BLOCK
from .ranks import Ranks, resolve_ranks

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
    external_id_v1: int | None = msgspec.field(default=None, name="external id")


# Older spellings of a field -> the attribute that holds it (kineto.md §1.3, §1.6): the one map from Kineto's arg
# spellings to canonical fields. Staged args JSON carries only the current names, so the SQL reads one key each.
_ARG_ALIASES = {"external_id_v1": "external_id",  # ≈1.8-1.9 traces
                "in_size": "in_nelems", "out_size": "out_nelems",  # element counts, renamed in kineto #849 (Dec 2023)
                "pg_id": "pg_name"}  # PyTorch 2.2 'Process Group ID', later 'Process Group Name'


def _canonical_args(a: "Args") -> "Args":
    fix = {}
    for old, new in _ARG_ALIASES.items():
        v = getattr(a, old)
        if v is not None:
            if getattr(a, new) is None:
                fix[new] = v
            fix[old] = None
    return msgspec.structs.replace(a, **fix) if fix else a


class Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: Args | None = None


class EventExactTs(Event, gc=False):
    """An event whose ts is kept as the JSON number's digits (see decode_events)."""
    ts: msgspec.Raw = _NULL


_events_decoder = msgspec.json.Decoder(list[Event])
_exact_ts_decoder = msgspec.json.Decoder(list[EventExactTs])
# epoch µs beyond float64's exact ns: 2**53 ns. Above it a fractional ts is read from its digits.
_EXACT_TS_US = 2.0**53 / 1000


class _Events(list):
    """Decoded events that were read after replacing bytes that are not UTF-8 (invalid_utf8)."""
    invalid_utf8 = False


class BadValue(ValueError):
    """A value no trace could hold; read() turns it into an InputError naming the file."""
_EMPTY_ARGS = Args()
_encode = msgspec.json.Encoder().encode

# JSON key for each Args attribute that goes into cpu_ranges.args
_ARG_KEYS = [(f.name, f.encode_name) for f in msgspec.structs.fields(Args)
             if f.name not in ("device", "stream", "grid", "block", "bytes", "graph_id")]


def _to_int(v):
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, (float, Decimal)):
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
    if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool):
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
    if isinstance(v, str):
        return v
    if isinstance(v, (int, Decimal)) and not isinstance(v, bool):
        return str(v)
    return orjson.dumps(v, default=str).decode()


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


def _exact_ts(raw: msgspec.Raw):
    """A ts from its JSON digits: Decimal keeps every digit, and round(ts * 1000) stays exact."""
    b = bytes(raw)
    return None if b == b"null" else Decimal(b.decode())


def _needs_exact_ts(events) -> bool:
    lim = _EXACT_TS_US
    return any(type(e.ts) is float and e.ts > lim and not e.ts.is_integer() for e in events)


def decode_events(data: bytes) -> list[Event]:
    """Decode a JSON array of events; msgspec.DecodeError when it is not valid JSON, BadValue when it nests deeper
    than any trace does.

    Epoch ts with a fractional part beyond float64 precision (> 2**53 ns) are re-read from their digits."""
    was = gc.isenabled()
    gc.disable()  # millions of small allocations: generation-0 collections would cost ~40 %
    try:
        events = _events_decoder.decode(data)
        if _needs_exact_ts(events):
            events = _exact_ts_decoder.decode(data)
            for e in events:
                e.ts = _exact_ts(e.ts)
        return events
    except msgspec.ValidationError:
        invalid_utf8 = False
        try:
            objs = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            if "recursion" in str(e):
                raise BadValue("has JSON nested deeper than any trace event (over 1,024 levels)") from None
            try:
                data.decode("utf-8")
                raise msgspec.DecodeError(str(e)) from None
            except UnicodeDecodeError:  # read what it says; the note tells names may hold U+FFFD
                data = data.decode("utf-8", errors="replace").encode()
                invalid_utf8 = True
            try:
                objs = orjson.loads(data)
            except orjson.JSONDecodeError as e2:
                raise msgspec.DecodeError(str(e2)) from None
        events = _Events(ev for ev in map(_tolerant_event, objs) if ev is not None)
        if _needs_exact_ts(events):
            objs = json.loads(data, parse_float=Decimal)
            events = _Events(ev for ev in map(_tolerant_event, objs) if ev is not None)
        events.invalid_utf8 = invalid_utf8
        return events
    except RecursionError:
        raise BadValue("has JSON nested deeper than any trace event") from None
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
_COMM_ANNOTATION_PREFIX = ("nccl:", "gloo:")
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
        self.n_negative_dur = 0
        self.invalid_utf8 = False

    def flush(self) -> Iterator[Batch]:
        for table, rows in self.rows.items():
            if rows:
                schema = SCHEMAS[table]
                arrays = [_column(col, f, table) for col, f in zip(zip(*rows), schema)]
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
        n_negative = 0
        e = None
        try:  # free until it raises: a NaN/inf ts or dur is found where it breaks, not by a check per event
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
                if end < start:  # a negative dur: no interval to place (counted, noted, dropped)
                    n_negative += 1
                    continue
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
                        stream = _stream_of(e.tid)
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
                        stream = _stream_of(e.tid)
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
                        # nccl:*/gloo:* annotations carry the collective's input shapes (PyTorch < 2.2)
                        args_json = self._args_json(a) if name.startswith(_COMM_ANNOTATION_PREFIX) else None
                    else:
                        ckind = "gpu_user_annotation"
                        args_json = None
                    rid = nid["cpu_ranges"]
                    nid["cpu_ranges"] = rid + 1
                    pid = _int_or_none(e.pid)
                    C((rid, rank, pid, _int_or_none(e.tid), start, end, name, ckind, pid if kind == 7 else None, args_json))
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


# ---------------------------------------------------------------------------------------------- rank


def _dist_info(header: dict, trailer: dict) -> dict:
    d = header.get("distributedInfo") or trailer.get("distributedInfo")
    return d if isinstance(d, dict) else {}


def _resolve_rank(path: Path, options: ReadOptions, dist: dict) -> Ranks:
    recorded = {}
    for key in ("rank", "world_size"):
        v = dist.get(key)
        n = _to_int(v)
        if v is not None and (n is None or not (0 if key == "rank" else 1) <= n < 2**31):
            raise InputError(f"has distributedInfo.{key} = {_to_str(v)[:40]}, which is not a {key.replace('_', ' ')}",
                             path=str(path), hint="pass --rank and --world-size to ingest it")
        recorded[key] = n
    return resolve_ranks(path.name, options, [recorded["rank"]], "distributedInfo", [recorded["world_size"]])


# ---------------------------------------------------------------------------------------------- distributedInfo

PROCESS_GROUPS_SCHEMA = pa.schema([("rank", pa.int32()), ("pg_name", pa.string()), ("pg_desc", pa.string()),
                                   ("group_size", pa.int32()), ("pg_ranks", pa.list_(pa.int32())),
                                   ("backend", pa.string())])


def _rank_list(v) -> list[int] | None:
    """pg_config 'ranks': a list, or (Kineto's on-demand writer) a string like '[0, 1]'."""
    if isinstance(v, str):
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            return None
    if isinstance(v, list) and v and all(type(x) is int for x in v):
        return v
    return None


def _process_groups(dist: dict) -> list[dict]:
    """distributedInfo.pg_config entries (a list, or a dict keyed by group name in some writers)."""
    cfg = dist.get("pg_config")
    if isinstance(cfg, dict):
        cfg = [dict(v, pg_name=v.get("pg_name", k)) if isinstance(v, dict) else None for k, v in cfg.items()]
    out = []
    for g in cfg if isinstance(cfg, list) else []:
        if not isinstance(g, dict) or g.get("pg_name") is None:
            continue
        ranks = _rank_list(g.get("ranks"))
        size = _to_int(g.get("pg_size"))
        out.append({"pg_name": _to_str(g["pg_name"]), "pg_desc": _to_str(g.get("pg_desc", g.get("uid"))),
                    "group_size": size if size is not None and 0 < size < 2**31 else (len(ranks) if ranks else None),
                    "pg_ranks": ranks, "backend": _to_str(g.get("backend_config"))})
    return out


def _comm_library_version(dist: dict, rocm: bool) -> str | None:
    """distributedInfo.nccl_version; on ROCm builds PyTorch's NCCL backend is RCCL."""
    v = dist.get("nccl_version")
    if v is None or v == "":
        return None
    return f"{'RCCL' if rocm else 'NCCL'} {_to_str(v)}"


# ---------------------------------------------------------------------------------------------- read


def _process(events, rank: int) -> tuple[dict[str, pa.Table], "_State"]:
    st = _State(rank)
    st.invalid_utf8 = getattr(events, "invalid_utf8", False)
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
        tot.n_negative_dur += st.n_negative_dur
        for flag in ("float_ts", "int_ts", "kernel_coll_args", "kernel_pg_args", "kernel_p2p_args", "kernel_seq",
                     "driver", "invalid_utf8"):
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
    rank = _resolve_rank(path, options, _dist_info(header, {})).ranks[0]
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
    events, trailer, out["invalid_utf8"] = finish(pending + tail if pending else tail, path)
    out["trailer"] = trailer
    if events:
        yield from totals.merge(*_process([ev for ev in map(_tolerant_event, events) if ev is not None], rank))


_HINT_BAD_VALUE = "the trace is damaged or was edited: export it again from the profiler"


def read(path, options: ReadOptions | None = None, *, block: int = BLOCK) -> Iterator[Batch]:
    path = Path(path)
    try:
        yield from _read(path, options or ReadOptions(), block)
    except BadValue as e:
        raise InputError(str(e), path=str(path), hint=_HINT_BAD_VALUE) from None
    except RecursionError:
        raise InputError("has JSON nested deeper than any trace", path=str(path), hint=_HINT_BAD_VALUE) from None


def _base_time_ns(header: dict, trailer: dict) -> int | None:
    v = trailer.get("baseTimeNanoseconds", header.get("baseTimeNanoseconds"))
    if v is None:
        return None
    n = _to_int(v)
    if n is None or not -(2**63) <= n < 2**63:
        raise BadValue(f"has baseTimeNanoseconds {_to_str(v)[:40]}, which is not an epoch time in ns")
    return n


def _read(path: Path, options: ReadOptions, block: int) -> Iterator[Batch]:
    out: dict = {}
    yield from _read_events(path, options, block, out)
    header, trailer = out["header"], out["trailer"]
    state = out["totals"].st
    dist = _dist_info(header, trailer)
    ranks = _resolve_rank(path, options, dist)  # the final word (distributedInfo may be in the trailer)
    rank, rank_source, world = ranks.ranks[0], ranks.source, ranks.world_sizes[0]
    base = _base_time_ns(header, trailer)
    notes = []
    if state.n_negative_dur:
        notes.append(("warning", "negative_dur", f"{state.n_negative_dur} events with a negative dur were dropped "
                      "(they place no interval on the timeline)"))
    if out.get("invalid_utf8") or state.invalid_utf8:
        notes.append(("warning", "invalid_utf8", "the trace holds bytes that are not UTF-8: they were read as U+FFFD "
                      "(names that hold them may not match other ranks)"))
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
        "comm_library_version": pa.array([_comm_library_version(
            dist, rocm=any(k in header or k in trailer for k in ("roctracer_version", "hip_runtime_version")))],
            pa.string()),
        "format_version": pa.array([f"schemaVersion {sv}" if sv is not None else None], pa.string()),
        "producer": pa.array([", ".join(markers) or None], pa.string()),
        "host": pa.array([None], pa.string()),
        "clock_rule": pa.array([clock_rule], pa.string()),
        "clock_offset_ns": pa.array([base], pa.int64()),
    }))
    if ranks.world_from_cli:
        notes.append(("info", "world_size_from_cli", f"world size {world} given with --world-size"))
    groups = _process_groups(dist)
    if groups:
        yield Batch("process_groups", pa.Table.from_pylist(
            [dict(g, rank=rank) for g in groups], schema=PROCESS_GROUPS_SCHEMA))
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

def _collectives_without_kernels(con, fid: int) -> int:
    """record_param_comms operations that no communication kernel links to (by External id or launch nesting)."""
    return con.execute("""
      WITH rec AS (SELECT * FROM _kineto_comm_records($fid)),
      linked AS (
        SELECT unnest([e1, e2, e3, e4]) AS range_id FROM _kineto_launch_chain($fid)
        UNION SELECT x.range_id FROM rec x JOIN rec k ON k.kind = '_kernel_args' AND x.ext_id = k.ext_id
                                                  AND x.kind = 'cpu_op')
      SELECT count(*) FROM rec
      WHERE name = 'record_param_comms' AND NOT is_wait AND coll IS NOT NULL
        AND range_id NOT IN (SELECT range_id FROM linked WHERE range_id IS NOT NULL)""", {"fid": fid}).fetchone()[0]


def finalize(con, file_id: int) -> None:
    fid = int(file_id)
    idbase = fid << 40
    off, path = con.execute("SELECT coalesce(clock_offset_ns, 0), path FROM files WHERE file_id = ?", [fid]).fetchone()
    rank, = con.execute("SELECT rank FROM ranks WHERE file_id = ? LIMIT 1", [fid]).fetchone()
    for t in _TABLES:
        sets = []
        if off:
            sets.append(f"start_ns = start_ns + {int(off)}, end_ns = end_ns + {int(off)}")
        stale = con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE file_id = {fid} AND rank <> {rank} LIMIT 1)").fetchone()[0]
        if stale:
            sets.append(f"rank = {rank}")
        if sets:
            try:
                con.execute(f"UPDATE {t} SET {', '.join(sets)} WHERE file_id = {fid}")
            except duckdb.OutOfRangeException:
                raise InputError(f"has timestamps that overflow int64 nanoseconds once baseTimeNanoseconds ({off}) "
                                 "is added", path=path, hint=_HINT_BAD_VALUE) from None
    if con.execute(f"SELECT count(*) FROM (SELECT 1 FROM devices WHERE file_id = {fid} AND rank <> {rank} LIMIT 1)").fetchone()[0]:
        con.execute(f"UPDATE devices SET rank = {rank} WHERE file_id = {fid}")

    con.execute("INSERT INTO comm_ops BY NAME SELECT * FROM _kineto_comm_ops(?)", [fid])
    n_comm, n_nosize, n_unknown, n_kargs, n_assumed = con.execute(f"""
      SELECT count(*), count(*) FILTER (WHERE msg_bytes IS NULL), count(*) FILTER (WHERE collective = 'unknown'),
             count(*) FILTER (WHERE collective_source = 'kernel_args'),
             count(*) FILTER (WHERE group_source = 'assumed_world_size')
      FROM comm_ops WHERE file_id = {fid}""").fetchone()
    notes = []
    if n_assumed:
        notes.append(("info", "assumed_group_size",
                      f"{n_assumed} of {n_comm} communication kernels record no process group; the trace shows only "
                      "the default group, so its size was assumed to be the world size"))
    n_cpu_only = _collectives_without_kernels(con, fid)
    if n_cpu_only:
        notes.append(("info", "collectives_without_kernels",
                      f"{n_cpu_only} collectives recorded on the CPU launched no communication kernel (e.g. a "
                      "size-1 group, or a backend without GPU kernels); they are not in comm_ops"))
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
