"""Kineto (PyTorch profiler) JSON importer: .json / .json.gz / .pt.trace.json[.gz].

Three stages, one module each:
1. kineto_decode: the file is cut into blocks at event boundaries (kineto_stream) and each block is decoded by
   msgspec into typed Structs that name only the keys nsys2comm needs;
2. kineto_rows: canonical rows are kept: kernels, mem_ops, api_calls (runtime/driver calls with a correlation
   id), cpu_ranges (user annotations incl. ProfilerStep#N, GPU user annotations, and the communication CPU ops:
   record_param_comms, c10d::*, nccl:*, gloo:*; the matrix-multiply ops; with_stack's python_function frames,
   name and interval only); communication kernels' args are staged as cpu_ranges of kind '_kernel_args';
3. kineto_resolve (``finalize``): in the job DB, the file's rows move onto the job timeline and every
   communication kernel is resolved into comm_ops (queries/ingest/kineto_comm_ops.sql).
This module reads the file: blocks in parallel, the header/trailer (distributedInfo, baseTimeNanoseconds), ranks.

Time: rows are written as ``round(ts_us * 1000)`` (integer ts: ``ts * 1000`` exactly). ``baseTimeNanoseconds``
usually sits in the trailer, after the events, so ``finalize`` adds it (``files.clock_offset_ns``).

Rank: the one rule of ingest.ranks (``--rank`` > ``distributedInfo.rank`` > the file name > 0).

A JSON without a traceEvents array is an InputError; a trace with no GPU kernels ingests with a warning note
``no_gpu_kernels``; a value no trace can hold refuses the file (InputError naming it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import orjson
import pyarrow as pa

from ..errors import InputError
from .base import (
    SPOOL_PREFIX,
    Batch,
    ReadOptions,
    decoder_processes_for,
    impossible_clock,
    only_thread,
    process_pool,
    shift_ids,
)
from .kineto_decode import (
    HINT_BAD_VALUE,
    BadValue,
    NeedsExactTs,
    NeedsSlowDecode,
    _to_int,
    _to_str,
    _tolerant_event,
    decode_events,
    decode_events_exact,
    decode_events_slow,
    has_epoch_fraction_ts,
)
from .kineto_resolve import finalize, finalize_many  # noqa: F401  (the importer interface, base.Importer)
from .kineto_rows import _ERA_MARKERS, _State
from .kineto_stream import BLOCK, CLOSE_PIECE
from .ranks import Ranks, resolve_ranks

SOURCE = "kineto"
SUFFIXES: tuple[str, ...] = (".json", ".json.gz")
FORMAT_HINT = "a PyTorch profiler (Kineto) JSON trace"
# bytes per worker range (plain files) or per piece (gzip): measured on a 440 MB tiled real trace, 2 cores: 16 MB
# 4.25 s / 695 MB peak RSS of all processes, 8 MB 4.05 s / 616 MB, 4 MB 4.57 s / 585 MB (per-task costs show)
RANGE_BYTES = 8 << 20

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
    # a JSON object ('{': traceEvents may come later; the reader says so if it never does) or the Chrome trace
    # JSON array format ('[')
    return s.startswith((b"{", b"["))


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


def _process(events, rank: int) -> tuple[dict[str, pa.Table], _State]:
    st = _State(rank)
    st.invalid_utf8 = getattr(events, "invalid_utf8", False)
    st.add_events(events)
    tables = {b.table: b.data for b in st.flush()}
    return tables, st


# Decoders a reader can be told to use (ReadOptions.extra["kineto_decoder"], or NSYS2COMM_KINETO_DECODER where
# the options do not say): "fast" (msgspec Structs, the default) or "tolerant" (decode_events_slow for every block:
# orjson and a conversion per event, 3-4x slower). The tolerant one is the reference the fast one is held to: the
# same canonical rows on every fixture, real trace and format variant (tests/test_decoder_equality.py).
DECODERS = ("fast", "tolerant")
DECODER_ENV = "NSYS2COMM_KINETO_DECODER"


def decoder_of(options: ReadOptions) -> str:
    """The decoder a read uses; an unknown name is refused (a typo must not silently measure the default)."""
    name = options.extra.get("kineto_decoder") or os.environ.get(DECODER_ENV) or "fast"
    if name not in DECODERS:
        raise InputError(f"names an unknown Kineto decoder {name!r} (kineto_decoder / {DECODER_ENV})",
                         hint=f"use one of {', '.join(DECODERS)}")
    return name


def _decode_process(data: bytes, rank: int, decoder: str = "fast"):
    """Decode a JSON array of events and build its rows: the fast path; for epoch ts finer than float64 the one
    that keeps their digits; else (event fields of odd types) the tolerant one, which ``decoder="tolerant"`` uses
    for every block. msgspec.DecodeError when ``data`` is not a JSON array."""
    was = gc.isenabled()
    gc.disable()  # millions of small objects, none cyclic: collections would cost ~40 % of the time
    try:
        if decoder == "tolerant":
            return _process(decode_events_slow(data), rank)
        try:
            try:
                return _process((decode_events_exact if has_epoch_fraction_ts(data) else decode_events)(data), rank)
            except NeedsExactTs:
                return _process(decode_events_exact(data), rank)
        except NeedsSlowDecode:
            return _process(decode_events_slow(data), rank)
    finally:
        if was:
            gc.enable()


def _work(piece: bytes, rank: int, decoder: str = "fast"):
    """Worker: decode one raw piece (see kineto_stream.iter_raw); None when the cut was not at top level."""
    try:
        return _decode_process(b"[" + piece + CLOSE_PIECE, rank, decoder)
    except msgspec.DecodeError:
        return None


def _work_range(path: str, lo: int, hi: int, rank: int, decoder: str = "fast", out: str | None = None):
    """Worker: read bytes [lo, hi) of an uncompressed trace itself (no copy through the parent) and decode them.
    ``out``: a spool path prefix the tables are written under (see :func:`_to_spool`)."""
    n = len(CLOSE_PIECE)
    buf = bytearray(hi - lo + 1 + n)  # '[' + bytes + CLOSE_PIECE without a copy: msgspec decodes a bytearray
    buf[0:1], buf[-n:] = b"[", CLOSE_PIECE
    with open(path, "rb") as f:
        f.seek(lo)
        f.readinto(memoryview(buf)[1:-n])
    try:
        res = _decode_process(buf, rank, decoder)
    except msgspec.DecodeError:
        return None
    del buf
    return _to_spool(res, out)


def _work_file(path: str, rank: int, decoder: str = "fast"):
    """Worker: decode a raw piece the parent wrote to a spool file (the parent removes it once the result is in).
    Through a pipe, pieces were pickled, copied in 64 KB writes and unpickled: 1.0 s for 440 MB against 0.3 s
    through files. The tables come back the same way (``_to_spool``)."""
    return _work_range(path, 0, os.path.getsize(path), rank, decoder, out=path)


def _to_spool(res, out: str | None):
    """Worker: a result's tables written as Arrow IPC files ``<out>-<table>.arrow``, their names returned instead.
    The parent maps them (:func:`_from_spool`): through the result pipe each was pickled, copied in 64 KB writes
    while the parent's result thread waited for the GIL, and unpickled (a 440 MB trace: 1.30 against 1.15 s of
    decoding, 2 workers). Where the files cannot be written, the tables go through the pipe."""
    if res is None or out is None:
        return res
    tables, st = res
    names: dict[str, str] = {}
    try:
        for table, data in tables.items():
            names[table] = name = f"{out}-{table}.arrow"
            with pa.OSFile(name, "wb") as f, pa.ipc.new_file(f, data.schema) as w:
                w.write_table(data)
    except OSError:  # temp space full or gone
        for name in names.values():
            with contextlib.suppress(OSError):
                os.unlink(name)
        return res
    return names, st


def _from_spool(res):
    """Parent: a worker's result with its spooled tables mapped (each file removed at once; the mapping keeps its
    pages until the table is freed)."""
    if res is None:
        return None
    tables, st = res
    mapped = {}
    for table, data in tables.items():
        if isinstance(data, str):
            try:
                data = pa.ipc.open_file(pa.memory_map(data)).read_all()
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tables[table])
        mapped[table] = data
    return mapped, st


def decoder_processes(path: Path, options: ReadOptions) -> int:
    """Decoder processes for this file: 0 (in-process) for small files, inside pool workers, or on one core."""
    n = options.extra.get("kineto_workers")
    if n is not None:
        return int(n)
    return decoder_processes_for(path.stat().st_size, 8 << 20 if path.name.endswith(".gz") else 64 << 20)


class _Totals:
    """Running per-file counters; shifts per-piece row ids to per-file ids."""

    def __init__(self, rank: int):
        self.st = _State(rank)

    def merge(self, tables: dict[str, pa.Table], st: _State) -> Iterator[Batch]:
        import pyarrow.compute as pc

        tot = self.st
        koff = tot.next_id["kernels"]
        for table, data in tables.items():
            data = shift_ids(table, data, tot.next_id[table])
            if table == "cpu_ranges" and koff:
                staged = pc.equal(data["kind"], "_kernel_args")
                data = data.set_column(data.schema.get_field_index("tid"), "tid",
                                       pc.if_else(staged, pc.add(data["tid"], pa.scalar(koff, pa.int64())),
                                                  data["tid"]))
            yield Batch(table, data)
        for t in tot.next_id:
            tot.next_id[t] += st.next_id[t]
        tot.devices |= st.devices
        tot.n_events += st.n_events
        tot.n_negative_dur += st.n_negative_dur
        tot.n_bad_ts += st.n_bad_ts
        for flag in ("float_ts", "int_ts", "kernel_coll_args", "kernel_pg_args", "kernel_p2p_args", "kernel_seq",
                     "driver", "invalid_utf8"):
            setattr(tot, flag, getattr(tot, flag) or getattr(st, flag))
        if tot.first_cpu_pid is None:
            tot.first_cpu_pid = st.first_cpu_pid
        if st.min_ts is not None and (tot.min_ts is None or st.min_ts < tot.min_ts):
            tot.min_ts = st.min_ts


class _Pieces:
    """Decodes raw pieces in file order: speculatively in a process pool while every cut proves to sit at the top
    level, then (from the first cut that does not) sequentially, with validated cuts."""

    def __init__(self, path: Path, rank: int, limits, totals: _Totals, pool, nworkers: int,
                 spool: str | None = None, decoder: str = "fast"):
        self.path, self.rank, self.limits, self.totals, self.decoder = path, rank, limits, totals, decoder
        self.pool, self.nworkers = pool, nworkers
        self.parallel = pool is not None
        self.pending = b""  # sequential mode: bytes not yet cut at a validated boundary
        self.inflight: deque = deque()
        self.spool, self.n_spooled = spool, 0  # a directory for pieces on their way to the workers

    def add(self, piece: bytes) -> Iterator[Batch]:
        if not self.parallel:
            yield from self._sequential(piece)
            return
        self.inflight.append(self._submit(piece))
        yield from self._drain(keep=self.nworkers)

    def _submit(self, piece: bytes) -> tuple[bytes | str, object]:
        """(the piece, or the spool file holding it, for a sequential re-read; its decode's future)."""
        if self.spool is not None:
            name = os.path.join(self.spool, str(self.n_spooled))
            self.n_spooled += 1
            try:
                with open(name, "wb") as f:
                    f.write(piece)
                return name, self.pool.submit(_work_file, name, self.rank, self.decoder)
            except OSError:  # temp space full or gone: through the pipe from now on
                with contextlib.suppress(OSError):
                    os.unlink(name)
                self.spool = None
        return piece, self.pool.submit(_work, piece, self.rank, self.decoder)

    @staticmethod
    def _take(kept: bytes | str) -> bytes:
        """The piece itself, read back (and removed) where it went through a spool file."""
        if isinstance(kept, bytes):
            return kept
        try:
            with open(kept, "rb") as f:
                return f.read()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(kept)

    def finish(self) -> Iterator[Batch]:
        yield from self._drain(keep=0)

    def _drain(self, keep: int) -> Iterator[Batch]:
        while len(self.inflight) > keep:
            kept, fut = self.inflight.popleft()
            res = _from_spool(fut.result())
            if res is None:  # a cut inside a string or nested object: go sequential from here on
                self.parallel = False
                for _, f in self.inflight:
                    f.cancel()
                rest = [kept] + [k for k, _ in self.inflight]
                self.inflight.clear()
                for k in rest:
                    yield from self._sequential(self._take(k))
                return
            if isinstance(kept, str):
                with contextlib.suppress(OSError):
                    os.unlink(kept)
            yield from self.totals.merge(*res)

    def _sequential(self, piece: bytes) -> Iterator[Batch]:
        from .kineto_stream import split_validated

        if not self.pending:
            res = _work(piece, self.rank, self.decoder)
            if res is not None:
                yield from self.totals.merge(*res)
                return
        self.pending = self.pending + piece if self.pending else piece
        cut, res = split_validated(self.pending, self.path, lambda data: _decode_process(data, self.rank, self.decoder),
                                   self.limits.max_event_bytes)
        if cut > 0:
            self.pending = self.pending[cut:]
            yield from self.totals.merge(*res)


class _Ranges:
    """Decodes an uncompressed trace by byte ranges in a process pool: each worker reads its own range (cut at
    candidate event boundaries, see kineto_stream.next_boundary), so the parent neither reads nor copies the
    bytes. Results are merged in file order; from the first range that does not decode (a cut that was not at
    the top level), the rest of the file is read sequentially with validated cuts (``seq_from``).

    Making one reads the header, plans the ranges and submits the first ones: :func:`read_ahead` makes it before the
    job database is open, and the read takes it over (``_take_ahead``)."""

    def __init__(self, path: Path, options: ReadOptions, block: int, nworkers: int):
        from .kineto_stream import Limits, array_start

        self.path, self.options, self.block, self.nworkers = path, options, block, nworkers
        self.stamp = _stamp(path)
        self.limits = Limits.from_options(options)
        self.decoder = decoder_of(options)
        self.header, start = array_start(path, block, self.limits)
        self.rank = _resolve_rank(path, options, _dist_info(self.header, {})).ranks[0]
        self.totals = _Totals(self.rank)
        self.inflight: deque = deque()
        bounds = _plan_ranges(path, start, RANGE_BYTES if block == BLOCK else block, self.limits)
        self.todo = deque(zip(bounds, bounds[1:], strict=False))
        self.seq_from = bounds[-1]
        self.pool = process_pool(nworkers, fork_if_alone=True)
        self.spool: str | None = None  # a directory for the workers' tables (_to_spool)
        try:  # a SIGTERM lands here (submit forks with it held): no one else holds this object yet to close it
            with contextlib.suppress(OSError):
                self.spool = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
            self._fill()
        except BaseException:
            self.close()
            raise

    def _fill(self) -> None:
        """Keep two ranges queued beyond the workers' own, so none waits while the parent inserts."""
        while self.todo and len(self.inflight) < self.nworkers + 2:
            lo, hi = self.todo.popleft()
            out = None if self.spool is None else os.path.join(self.spool, f"r{lo}")
            self.inflight.append((lo, self.pool.submit(_work_range, str(self.path), lo, hi, self.rank, self.decoder,
                                                        out)))

    def run(self) -> Iterator[Batch]:
        while self.inflight:
            lo, fut = self.inflight.popleft()
            res = _from_spool(fut.result())
            if res is None:
                self.cancel()
                self.seq_from = lo
                return
            self._fill()
            yield from self.totals.merge(*res)

    def cancel(self) -> None:
        for _, f in self.inflight:
            f.cancel()
        self.inflight.clear()
        self.todo.clear()

    def close(self) -> None:
        self.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.spool is not None:
            shutil.rmtree(self.spool, ignore_errors=True)


def _stamp(path: Path) -> tuple:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


_ahead: list[_Ranges] = []  # at most one read started before the job database opened


def read_ahead(path, options: ReadOptions) -> Callable[[], None] | None:
    """Start decoding a large uncompressed trace's first byte ranges now, while the caller opens the job database
    (≈ 0.2 s on 2 cores in which a worker core sat idle). The read of the same file with the same options takes
    them over; returns the call that discards them where no read does (the file was already in the job, or an
    error came first), or None where this file is not read by ranges or cannot be (ingest reports why), and where
    the workers could not be forked at once (another thread runs, such as a progress bar's: a forkserver would make
    the caller wait for its start-up instead of opening the database meanwhile)."""
    from .kineto_stream import is_gzip

    path = Path(path)
    discard_read_ahead()
    ranges = None
    try:
        nworkers = decoder_processes(path, options)
        if nworkers == 0 or is_gzip(path) or not only_thread():
            return None
        ranges = _Ranges(path, options, BLOCK, nworkers)
        _ahead.append(ranges)
    except (InputError, BadValue, OSError, ValueError):
        return None
    except BaseException:  # a SIGTERM between making it and keeping it: nothing else would close it
        if ranges is not None and ranges not in _ahead:
            ranges.close()
        raise
    return discard_read_ahead


def discard_read_ahead() -> None:
    while _ahead:
        _ahead.pop().close()


def _take_ahead(path: Path, options: ReadOptions, block: int) -> _Ranges | None:
    ranges = _ahead.pop() if _ahead else None
    if ranges is None:
        return None
    try:
        same = (ranges.stamp, ranges.options, ranges.block) == (_stamp(path), options, block)
    except OSError:
        same = False
    if same:
        return ranges
    ranges.close()
    return None


def _plan_ranges(path: Path, start: int, step: int, limits) -> list[int]:
    """Range bounds: ``start``, then a candidate boundary about every ``step`` bytes; the last MiB (the last
    events, ']' and the trailer) is left to the sequential reader."""
    from .kineto_stream import next_boundary

    size = path.stat().st_size
    tail = size - min(step, 1 << 20)
    bounds = [start]
    with open(path, "rb") as f:
        x = start + step
        while x <= tail or bounds[-1] < tail:
            b = next_boundary(f.fileno(), min(x, tail), size, limits.max_event_bytes)
            if b is None or b <= bounds[-1]:
                break
            bounds.append(b)
            x = b + step
    return bounds


def _read_events(path: Path, options: ReadOptions, block: int, out: dict) -> Iterator[Batch]:
    """The event array: by byte ranges in parallel (large uncompressed files), or streamed with parallel
    speculative decoding of raw pieces (gzip), with a sequential validated fallback in both."""
    from .kineto_stream import Limits, finish, is_gzip, iter_raw

    limits = Limits.from_options(options)
    decoder = decoder_of(options)
    nworkers = decoder_processes(path, options)
    if nworkers > 0 and not is_gzip(path):
        ranges = _take_ahead(path, options, block) or _Ranges(path, options, block, nworkers)
        out["header"], out["totals"], rank, totals = ranges.header, ranges.totals, ranges.rank, ranges.totals
        try:
            yield from ranges.run()
        finally:
            ranges.close()
        # the rest, sequentially; its tail stays pending
        pieces = _Pieces(path, rank, limits, totals, None, 0, decoder=decoder)
        with open(path, "rb") as f:
            f.seek(ranges.seq_from)
            while data := f.read(block):
                yield from pieces.add(data)
        tail = b""
    else:
        src = iter_raw(path, RANGE_BYTES if block == BLOCK else block, limits)
        _, header = next(src)
        out["header"] = header
        rank = _resolve_rank(path, options, _dist_info(header, {})).ranks[0]
        totals = _Totals(rank)
        out["totals"] = totals
        tail = b""
        pool = spool = None
        try:
            if nworkers > 0:
                pool = process_pool(nworkers)
                with contextlib.suppress(OSError):
                    spool = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
            pieces = _Pieces(path, rank, limits, totals, pool, nworkers, spool, decoder)
            for what, piece in src:
                if what == "tail":
                    tail = piece
                    break
                yield from pieces.add(piece)
            yield from pieces.finish()
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            if spool is not None:
                shutil.rmtree(spool, ignore_errors=True)
    pending = pieces.pending
    events, trailer, out["invalid_utf8"] = finish(pending + tail if pending else tail, path)
    out["trailer"] = trailer
    if events:
        yield from totals.merge(*_process([ev for ev in map(_tolerant_event, events) if ev is not None], rank))


def read(path, options: ReadOptions | None = None, *, block: int = BLOCK) -> Iterator[Batch]:
    path = Path(path)
    try:
        yield from _read(path, options or ReadOptions(), block)
    except BadValue as e:
        raise InputError(str(e), path=str(path), hint=HINT_BAD_VALUE) from None
    except RecursionError:
        raise InputError("has JSON nested deeper than any trace", path=str(path), hint=HINT_BAD_VALUE) from None


def _base_time_ns(header: dict, trailer: dict, path: Path | None = None) -> int | None:
    v = trailer.get("baseTimeNanoseconds", header.get("baseTimeNanoseconds"))
    if v is None:
        return None
    n = _to_int(v)
    if n is None or not -(2**63) <= n < 2**63:
        raise BadValue(f"has baseTimeNanoseconds {_to_str(v)[:40]}, which is not an epoch time in ns")
    why = impossible_clock(n, path)
    if why:
        raise BadValue(f"has baseTimeNanoseconds {n} {why}")
    return n


def _read(path: Path, options: ReadOptions, block: int) -> Iterator[Batch]:
    out: dict = {}
    yield from _read_events(path, options, block, out)
    header, trailer = out["header"], out["trailer"]
    state = out["totals"].st
    dist = _dist_info(header, trailer)
    ranks = _resolve_rank(path, options, dist)  # the final word (distributedInfo may be in the trailer)
    rank = ranks.ranks[0]
    base = _base_time_ns(header, trailer, path)
    yield _files_batch(header, trailer, dist, state, base)
    groups = _process_groups(dist)
    if groups:
        yield Batch("process_groups", pa.Table.from_pylist(
            [dict(g, rank=rank) for g in groups], schema=PROCESS_GROUPS_SCHEMA))
    yield Batch("ranks", pa.table({
        "rank": pa.array([rank], pa.int32()), "pid": pa.array([state.first_cpu_pid], pa.int64()),
        "host": pa.array([None], pa.string()), "world_size": pa.array([ranks.world_sizes[0]], pa.int32()),
        "rank_source": pa.array([ranks.source], pa.string())}))
    if state.devices:
        yield _devices_batch(header, trailer, state, rank)
    notes = _notes(state, ranks, base, invalid_utf8=out.get("invalid_utf8") or state.invalid_utf8)
    if notes:
        yield Batch("ingest_notes", pa.table({
            "rank": pa.array([rank] * len(notes), pa.int32()),
            "severity": pa.array([n[0] for n in notes], pa.string()),
            "code": pa.array([n[1] for n in notes], pa.string()),
            "message": pa.array([n[2] for n in notes], pa.string())}))


def _producer_markers(header: dict, trailer: dict, dist: dict, state: _State, base: int | None) -> list[str]:
    """What dates the trace (files.producer): time format, era flags, distributedInfo fields, library versions."""
    markers = ["baseTimeNanoseconds"] if base else []
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
    return markers


def _files_batch(header: dict, trailer: dict, dist: dict, state: _State, base: int | None) -> Batch:
    clock_rule = ("kineto: ns = round(ts_us * 1000) (ts are epoch µs; no baseTimeNanoseconds)" if base is None
                  else "kineto: ns = baseTimeNanoseconds + round(ts_us * 1000)")
    sv = header.get("schemaVersion", trailer.get("schemaVersion"))
    rocm = any(k in header or k in trailer for k in ("roctracer_version", "hip_runtime_version"))
    return Batch("files", pa.table({
        "comm_library_version": pa.array([_comm_library_version(dist, rocm=rocm)], pa.string()),
        "format_version": pa.array([f"schemaVersion {sv}" if sv is not None else None], pa.string()),
        "producer": pa.array([", ".join(_producer_markers(header, trailer, dist, state, base)) or None], pa.string()),
        "host": pa.array([None], pa.string()),
        "clock_rule": pa.array([clock_rule], pa.string()),
        "clock_offset_ns": pa.array([base or 0], pa.int64()),
    }))


def _in_range(v: int | None, bits: int) -> int | None:
    return v if v is not None and 0 <= v < (1 << bits) else None


def _devices_batch(header: dict, trailer: dict, state: _State, rank: int) -> Batch:
    props = {}
    for p in header.get("deviceProperties") or trailer.get("deviceProperties") or []:
        if isinstance(p, dict) and _to_int(p.get("id")) is not None:
            props[_to_int(p.get("id"))] = p
    devs = sorted(state.devices)

    def prop(key: str, conv) -> list:
        return [conv(props.get(d, {}).get(key)) for d in devs]

    return Batch("devices", pa.table({
        "rank": pa.array([rank] * len(devs), pa.int32()),
        "device_id": pa.array(devs, pa.int32()),
        "name": pa.array(prop("name", _to_str), pa.string()),
        # a value no device has (beyond the column's range) is unknown, not a failed file
        "sm_count": pa.array(prop("numSms", lambda v: _in_range(_to_int(v), 31)), pa.int32()),
        "total_memory_bytes": pa.array(prop("totalGlobalMem", lambda v: _in_range(_to_int(v), 63)), pa.int64()),
    }))


def _notes(state: _State, ranks: Ranks, base: int | None, *, invalid_utf8: bool) -> list[tuple[str, str, str]]:
    """(severity, code, message) of what the reader noticed about this file."""
    rank, source, world = ranks.ranks[0], ranks.source, ranks.world_sizes[0]
    notes = []
    if state.n_negative_dur:
        notes.append(("warning", "negative_dur", f"{state.n_negative_dur} events with a negative dur were dropped "
                      "(they place no interval on the timeline)"))
    if state.n_bad_ts:
        notes.append(("warning", "unreadable_ts", f"{state.n_bad_ts} events with a missing or non-numeric ts were "
                      "dropped (nothing places them on the timeline)"))
    if invalid_utf8:
        notes.append(("warning", "invalid_utf8", "the trace holds bytes that are not UTF-8: they were read as U+FFFD "
                      "(names that hold them may not match other ranks)"))
    if base is None and state.min_ts is not None and state.min_ts < 1e14:  # < 1973 as epoch µs: relative ts
        notes.append(("warning", "relative_ts_no_base",
                      "timestamps are relative but the trace has no baseTimeNanoseconds; times are not on the "
                      "Unix epoch, so this rank cannot be aligned with others"))
    if ranks.world_from_cli:
        notes.append(("info", "world_size_from_cli", f"world size {world} given with --world-size"))
    if source == "file_name":
        notes.append(("warning", "no_rank_info", f"the trace has no distributedInfo; rank {rank} was taken from the "
                      "file name (initialise the process group before profiling, or pass --rank)"))
    elif source == "process_order":
        notes.append(("warning", "no_rank_info", "the trace has no distributedInfo and its file name holds no rank; "
                      "assumed rank 0 (pass --rank, or initialise the process group before profiling)"))
    if world is None and source != "cli":
        notes.append(("info", "no_world_size", "the trace does not record the world size (distributedInfo.world_size)"))
    if state.next_id["kernels"] == 0:
        notes.append(("warning", "no_gpu_kernels", "the trace has no GPU kernels: profile with "
                      "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"))
    return notes
