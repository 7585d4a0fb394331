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
from .base import Batch, ReadOptions
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
    if not s.startswith(b"{"):
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




# ---------------------------------------------------------------------------------------------- row building (DuckDB)
#
# Each group of raw pieces is written as JSON arrays to a private temp dir and read by DuckDB's JSON reader
# (C++, one thread per file) on a private in-memory connection: one scan keeps the events of known categories,
# the per-table selects build the canonical columns. Values are converted as the tolerant Python rules did
# (_to_int, _pidlike, _to_num): numbers read as text keep int vs float apart, ids from args accept numeric
# strings and truncate floats. args JSON (cpu_ops and staged kernel args only, few rows) is normalised in
# Python through the Args struct, so cpu_ranges.args holds only the keys nsys2comm reads.

# integer args are read as text: numbers and numeric strings alike (as _to_int took them), converted by _strint
_INT_ARGS = ("external_id", "correlation", "device", "stream", "bytes", "graph_id")
_ARGS_SQL = "STRUCT(" + ", ".join(f'"{f.encode_name}" {"VARCHAR" if f.name in _INT_ARGS + ("grid", "block") else "JSON"}'
                                  for f in msgspec.structs.fields(Args)) + ")"
# the args of a row as JSON for _norm_args
_ARGS_JSON_SQL = "to_json({" + ", ".join(
    f"""'{f.encode_name}': {"_strint" if f.name in _INT_ARGS else "_dims" if f.name in ("grid", "block") else ""}"""
    f"""(args."{f.encode_name}")"""
    for f in msgspec.structs.fields(Args)) + "})"
_COLUMNS = ("{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'JSON', tid: 'JSON', ts: 'VARCHAR', "
            "dur: 'VARCHAR', args: '" + _ARGS_SQL.replace("'", "''") + "'}")
_KIND_SQL = "CASE cat " + " ".join(f"WHEN '{c}' THEN {k}" for c, k in _KIND.items()) + " END"
_COMM_PREFIX_SQL = " OR ".join(f"starts_with(name, '{p}')" for p in _COMM_CPU_PREFIX)
_COMM_KERNEL_SQL = _COMM_KERNEL_RE.pattern.replace("'", "''")

_MACROS = """
CREATE MACRO _isint(s) AS NOT (contains(s, '.') OR contains(s, 'e') OR contains(s, 'E') OR contains(lower(s), 'n'));
CREATE MACRO _trunc(x) AS CASE WHEN abs(x) < 9e18 THEN CAST(trunc(x) AS BIGINT) END;
CREATE MACRO _ns(s) AS CASE WHEN _isint(s) THEN TRY_CAST(s AS BIGINT) * 1000
                            ELSE CAST(round_even(TRY_CAST(s AS DOUBLE) * 1000, 0) AS BIGINT) END;
CREATE MACRO _pidint(j) AS CASE json_type(j) WHEN 'BIGINT' THEN CAST(j AS BIGINT) WHEN 'UBIGINT' THEN TRY_CAST(j AS BIGINT)
                                             WHEN 'DOUBLE' THEN _trunc(CAST(j AS DOUBLE)) END;
CREATE MACRO _strint(s) AS CASE WHEN _isint(s) THEN TRY_CAST(s AS BIGINT) ELSE _trunc(TRY_CAST(s AS DOUBLE)) END;
CREATE MACRO _int(j) AS CASE json_type(j) WHEN 'VARCHAR' THEN _strint(json_extract_string(j, '$')) ELSE _pidint(j) END;
-- grid / block: a JSON array read as text, e.g. '[132,1,1]'
CREATE MACRO _dims(v) AS CASE WHEN starts_with(v, '[') THEN list_transform(string_split(trim(v, '[] '), ','),
                                                                          lambda x: _strint(trim(x, ' "'))) END;
CREATE MACRO _dim(v, i) AS CASE WHEN len(_dims(v)) = 3 THEN _dims(v)[i] END;
CREATE MACRO _present(j) AS j IS NOT NULL AND j::VARCHAR <> 'null';
CREATE MACRO _copy_kind(tok) AS CASE WHEN tok IN ('HtoD', 'DtoH', 'DtoD', 'HtoH', 'PtoP') THEN tok ELSE 'other' END;
"""

_args_decoder = msgspec.json.Decoder(Args)


def _norm_args(s: str | None) -> Args:
    """Args from DuckDB's to_json of the args struct (absent keys are null)."""
    if s is None:
        return _EMPTY_ARGS
    try:
        a = _args_decoder.decode(s)
    except msgspec.ValidationError:
        d = orjson.loads(s)
        return Args(**{attr: _ARG_CONVERT.get(attr, _to_int)(d[key]) for attr, key in _ALL_ARG_KEYS
                       if d.get(key) is not None})
    if a.pg_ranks is not _NULL or a.input_dims is not _NULL or a.input_type is not _NULL:
        fix = {attr: _NULL for attr in ("pg_ranks", "input_dims", "input_type") if bytes(getattr(a, attr)) == b"null"}
        if fix:
            a = msgspec.structs.replace(a, **fix)
    return a


class _State:
    """Per-file counters and flags, carried across piece groups."""

    def __init__(self, rank: int):
        self.rank = rank
        self.next_id = {t: 0 for t in SCHEMAS}
        self.devices: set[int] = set()
        self.float_ts = False
        self.int_ts = False
        self.kernel_coll_args = False
        self.kernel_pg_args = False
        self.kernel_p2p_args = False
        self.kernel_seq = False
        self.driver = False
        self.first_cpu_pid: int | None = None
        self.min_ts: float | None = None


def _tmp_root() -> str | None:
    import os
    import shutil

    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        try:
            if shutil.disk_usage("/dev/shm").free > (1 << 30):
                return "/dev/shm"
        except OSError:
            pass
    return None


class _Scanner:
    """A private in-memory DuckDB that turns files of JSON event arrays into canonical batches."""

    def __init__(self, rank: int, threads: int):
        import duckdb

        self.con = duckdb.connect(config={"threads": max(1, threads), "memory_limit": "512MB",
                                          "preserve_insertion_order": True})
        self.con.execute(_MACROS)
        self.st = _State(rank)

    def close(self) -> None:
        self.con.close()

    def scan(self, files: list[str]) -> Iterator[Batch]:
        """Batches for the events in files (read in order); duckdb.Error when DuckDB rejects one of them."""
        con, st = self.con, self.st
        flist = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
        con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ev AS
        SELECT k, coalesce(name, '') AS name, pid, tid, ts, dur, args, _ns(ts) AS s, _ns(dur) AS d
        FROM (SELECT {_KIND_SQL} AS k, * FROM read_json({flist}, format = 'array', columns = {_COLUMNS}))
        WHERE k IS NOT NULL AND ph = 'X' AND _ns(ts) IS NOT NULL""")
        return self._batches()

    def _batches(self) -> Iterator[Batch]:
        con, st = self.con, self.st
        rank = st.rank
        nid = st.next_id
        n, mn, has_float, has_int, driver = con.execute(
            "SELECT count(*), min(TRY_CAST(ts AS DOUBLE)), bool_or(NOT _isint(ts)), bool_or(_isint(ts)), "
            "bool_or(k = 5 AND _strint(args.correlation) IS NOT NULL) FROM _ev").fetchone()
        if not n:
            return
        if mn is not None and (st.min_ts is None or mn < st.min_ts):
            st.min_ts = mn
        st.float_ts |= bool(has_float)
        st.int_ts |= bool(has_int)
        st.driver |= bool(driver)
        if st.first_cpu_pid is None:
            row = con.execute("SELECT _pidint(pid) FROM _ev WHERE _pidint(pid) IS NOT NULL AND ("
                              "(k IN (4, 5) AND _strint(args.correlation) IS NOT NULL) OR k = 6 OR "
                              f"(k = 8 AND ({_COMM_PREFIX_SQL}))) ORDER BY rowid LIMIT 1").fetchone()
            if row:
                st.first_cpu_pid = row[0]
        con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _comm_names AS
        SELECT name FROM (SELECT DISTINCT name FROM _ev WHERE k = 1)
        WHERE regexp_matches(CASE WHEN starts_with(name, 'void ') THEN name[6:] ELSE name END, '{_COMM_KERNEL_SQL}', 'i');
        CREATE OR REPLACE TEMP TABLE _k AS
        SELECT rowid AS o, row_number() OVER (ORDER BY rowid) - 1 + {nid['kernels']} AS kernel_id, {rank} AS rank,
          coalesce(_strint(args.device), _pidint(pid), 0) AS device_id,
          coalesce(_strint(args.stream), _pidint(tid)) AS stream_id, s AS start_ns, s + coalesce(d, 0) AS end_ns, name,
          _strint(args.correlation) AS correlation_id,
          _dim(args.grid, 1) AS grid_x, _dim(args.grid, 2) AS grid_y, _dim(args.grid, 3) AS grid_z,
          _dim(args.block, 1) AS block_x, _dim(args.block, 2) AS block_y, _dim(args.block, 3) AS block_z,
          _strint(args."graph id") AS graph_id,
          _present(args."Collective name") OR name IN (SELECT name FROM _comm_names) AS stage
        FROM _ev WHERE k = 1""")
        kernels = con.sql("SELECT * EXCLUDE (o, stage) FROM _k ORDER BY o").to_arrow_table()
        mem = con.sql(f"""
        SELECT row_number() OVER (ORDER BY rowid) - 1 + {nid['mem_ops']} AS memop_id, {rank} AS rank,
          coalesce(_strint(args.device), _pidint(pid), 0) AS device_id,
          coalesce(_strint(args.stream), _pidint(tid)) AS stream_id, s AS start_ns, s + coalesce(d, 0) AS end_ns,
          CASE k WHEN 2 THEN 'memcpy' ELSE 'memset' END AS kind,
          CASE WHEN k = 2 THEN _copy_kind(regexp_extract(name, '(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD|AtoH|HtoA|AtoA)', 1))
               END AS copy_kind,
          _strint(args.bytes) AS bytes, name, _strint(args.correlation) AS correlation_id
        FROM _ev WHERE k IN (2, 3) ORDER BY rowid""").to_arrow_table()
        api = con.sql(f"""
        SELECT row_number() OVER (ORDER BY rowid) - 1 + {nid['api_calls']} AS call_id, {rank} AS rank,
          _pidint(pid) AS pid, _pidint(tid) AS tid, s AS start_ns, s + coalesce(d, 0) AS end_ns, name,
          _strint(args.correlation) AS correlation_id, CASE k WHEN 4 THEN 'runtime' ELSE 'driver' END AS api
        FROM _ev WHERE k IN (4, 5) AND _strint(args.correlation) IS NOT NULL ORDER BY rowid""").to_arrow_table()
        cpu = con.sql(f"""
        SELECT row_number() OVER (ORDER BY o) - 1 + {nid['cpu_ranges']} AS range_id, * EXCLUDE (o) FROM (
          SELECT rowid AS o, {rank} AS rank, _pidint(pid) AS pid, _pidint(tid) AS tid, s AS start_ns,
            s + coalesce(d, 0) AS end_ns, name,
            CASE k WHEN 6 THEN 'user_annotation' WHEN 7 THEN 'gpu_user_annotation'
                   ELSE (CASE WHEN starts_with(name, 'ProfilerStep') THEN 'user_annotation' ELSE 'cpu_op' END) END AS kind,
            CASE WHEN k = 7 THEN _pidint(pid) END AS device_id,
            CASE WHEN k = 8 THEN {_ARGS_JSON_SQL} END AS args
          FROM _ev WHERE k IN (6, 7) OR (k = 8 AND ({_COMM_PREFIX_SQL}))
          UNION ALL
          SELECT k.o, k.rank, NULL, k.kernel_id, k.start_ns, k.end_ns, k.name, '_kernel_args', k.device_id,
                 CASE WHEN e.args IS NULL THEN '{{}}' ELSE {_ARGS_JSON_SQL} END
          FROM _k k JOIN _ev e ON e.rowid = k.o WHERE k.stage) ORDER BY o""").to_arrow_table()
        devs = con.execute("SELECT DISTINCT device_id FROM _k UNION SELECT DISTINCT coalesce(_strint(args.device), "
                           "_pidint(pid), 0) FROM _ev WHERE k IN (2, 3)").fetchall()
        st.devices.update(d for d, in devs)
        if cpu.num_rows:
            kinds = cpu["kind"].to_pylist()
            out = []
            for kind, s in zip(kinds, cpu["args"].to_pylist()):
                if s is None:
                    out.append(None)
                    continue
                a = _norm_args(s)
                if kind == "_kernel_args":
                    self._flags(a)
                    out.append(_encode(a).decode())
                else:
                    b = _encode(a)
                    out.append(None if b == b"{}" else b.decode())
            cpu = cpu.set_column(cpu.schema.get_field_index("args"), "args", pa.array(out, pa.string()))
        for table, data in (("kernels", kernels), ("mem_ops", mem), ("api_calls", api), ("cpu_ranges", cpu)):
            if data.num_rows:
                nid[table] += data.num_rows
                yield Batch(table, data.cast(SCHEMAS[table]))

    def _flags(self, a: Args) -> None:
        st = self.st
        if a.coll is not None:
            st.kernel_coll_args = True
            if a.pg_name is not None or a.pg_ranks is not _NULL:
                st.kernel_pg_args = True
            if a.src_rank is not None or a.dst_rank is not None:
                st.kernel_p2p_args = True
            if a.seq is not None:
                st.kernel_seq = True



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


def _threads(options: ReadOptions) -> int:
    """DuckDB threads for the JSON scans (kineto_workers: a test/bench override)."""
    import os

    n = options.extra.get("kineto_workers")
    if n is not None:
        return max(1, int(n))
    return max(1, min(os.cpu_count() or 1, 8))


def _read_events(path: Path, options: ReadOptions, block: int, out: dict) -> Iterator[Batch]:
    """Stream the event array: groups of raw pieces scanned by DuckDB (one file per thread), with a sequential,
    validated fallback (kineto_stream.split_validated + msgspec/orjson) for pieces DuckDB rejects."""
    import os
    import shutil
    import tempfile

    import duckdb

    from .kineto_stream import finish, iter_raw, split_validated

    src = iter_raw(path, block)
    _, header = next(src)
    out["header"] = header
    rank, _ = _resolve_rank(path, options, _dist_info(header, {}))
    threads = _threads(options)
    scanner = _Scanner(rank, threads)
    out["state"] = scanner.st
    tmp = tempfile.mkdtemp(prefix="nsys2comm-kineto-", dir=_tmp_root())
    counter = 0
    pending = b""  # sequential mode: bytes not yet cut at a validated boundary
    parallel = True

    def write(*chunks: bytes) -> str:
        nonlocal counter
        fn = os.path.join(tmp, f"{counter:06d}.json")
        counter += 1
        with open(fn, "wb") as f:
            for c in chunks:
                f.write(c)
        return fn

    def scan(files: list[str]):
        """Batches of the files, or None when DuckDB rejects one (nothing was yielded then)."""
        try:
            batches = scanner.scan(files)
        except duckdb.Error:
            return None
        finally:
            for f in files:
                os.remove(f)
        return list(batches)

    def clean(events: list[Event]) -> list[Batch]:
        """Events decoded in Python (validated): re-encoded as plain JSON, which DuckDB always reads."""
        if not events:
            return []
        res = scan([write(_encode(events))])
        if res is None:
            raise InputError("has event values nsys2comm cannot read", path=str(path),
                             hint="the trace file is damaged; re-export it")
        return res

    def sequential(piece: bytes) -> Iterator[Batch]:
        nonlocal pending
        if not pending:
            res = scan([write(b"[", piece, b"{}]")])
            if res is not None:
                yield from res
                return
        pending = pending + piece if pending else piece
        cut, events = split_validated(pending, path, decode_events)
        if cut > 0:
            pending = pending[cut:]
            yield from clean(events)

    group: list[bytes] = []

    def flush() -> Iterator[Batch]:
        nonlocal parallel
        pieces = group[:]
        group.clear()
        if parallel:
            res = scan([write(b"[", p, b"{}]") for p in pieces])
            if res is not None:
                yield from res
                return
            parallel = False  # a cut inside a string or nested object (or odd values): validated cuts from here on
        for p in pieces:
            yield from sequential(p)

    try:
        tail = b""
        for what, piece in src:
            if what == "tail":
                tail = piece
                break
            group.append(piece)
            if len(group) >= threads:
                yield from flush()
        if group:
            yield from flush()
        events, trailer = finish(pending + tail if pending else tail, path)
        out["trailer"] = trailer
        yield from clean([ev for ev in map(_tolerant_event, events) if ev is not None])
    finally:
        scanner.close()
        shutil.rmtree(tmp, ignore_errors=True)



def read(path, options: ReadOptions | None = None, *, block: int = BLOCK) -> Iterator[Batch]:
    path = Path(path)
    options = options or ReadOptions()
    out: dict = {}
    yield from _read_events(path, options, block, out)
    header, trailer = out["header"], out["trailer"]
    state = out["state"]
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
    if state.kernel_coll_args:
        markers.append("collective args on kernels")
    if state.kernel_pg_args:
        markers.append("process-group args on kernels")
    if state.kernel_p2p_args:
        markers.append("Src/Dst Rank on kernels")
    if state.kernel_seq:
        markers.append("Seq on kernels")
    if state.driver:
        markers.append("cuda_driver events")
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
