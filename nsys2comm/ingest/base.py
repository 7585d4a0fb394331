"""What every importer produces: a stream of batches of canonical rows.

An importer is a module that satisfies :class:`Importer` (``SOURCE``, ``SUFFIXES``, ``FORMAT_HINT``, ``sniff``,
``read``, ``finalize``, ``decoder_processes``); ``ingest._importers`` lists them, and the directory search's suffixes
and the "what can be read" hints are built from their declarations (tests/test_importers.py checks both).

``read`` streams: it yields ``Batch(table, arrow_table)`` as soon as a chunk is parsed, so memory stays bounded.
Batch rows use canonical column names without ``file_id``; id columns (``kernel_id``, ``memop_id``,
``range_id``, ``call_id``) hold the row's index inside the file and the writer makes them job-unique.
``kernels`` batches need no ``short_name`` or ``kernel_class``: the writer derives both in SQL (one rule for every
source).
One ``files`` batch (one row: format_version, producer, host, clock_rule, clock_offset_ns) and one ``ranks``
batch must be yielded, in any order. ``finalize`` runs inside the file's transaction after all batches are
written and fills ``comm_ops`` (and ``ingest_notes``) with SQL over the file's canonical rows.
"""

from __future__ import annotations

import contextlib
import multiprocessing.context as mpc
import multiprocessing.popen_forkserver as mpf
import multiprocessing.spawn as mps
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

# + owner pid + '-': temp files of a running ingest (decoded batches, gzip pieces); spools of dead owners (SIGKILL)
# are removed by the next ingest
SPOOL_PREFIX = "nsys2comm-spool-"


@dataclass
class Batch:
    table: str
    data: pa.Table


@dataclass
class ReadOptions:
    rank: int | None = None  # --rank: explicit rank (kineto) / first rank (nsys)
    world_size: int | None = None  # --world-size: used when the trace does not record it
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Importer(Protocol):
    """One trace format: a module with these members (a module satisfies a Protocol, for mypy and ``isinstance``).

    An importer may also define ``finalize_many(con, file_ids)``: several small files' finalize in a few statements
    (else they are finalized one by one); and ``read_ahead(path, options)``: start decoding a single large trace
    before the job database is open, returning the call that discards that work if no read takes it over (or None
    where it starts nothing; ``ingest.start_decoders``).
    """

    SOURCE: str  # files.source, e.g. "kineto"
    SUFFIXES: tuple[str, ...]  # file name endings a directory search picks up, e.g. (".json", ".json.gz")
    FORMAT_HINT: str  # the format in a user's words, e.g. "a PyTorch profiler (Kineto) JSON trace"

    def sniff(self, path: Path, head: bytes) -> bool:
        """Whether the file (``head``: its first 4096 bytes) is of this format."""
        ...

    def read(self, path: Path, options: ReadOptions | None = None) -> Iterator[Batch]:
        """The file's canonical rows as a stream of batches (see the module docstring)."""
        ...

    def finalize(self, con: Any, file_id: int) -> None:
        """Inside the file's transaction, after its batches: fill ``comm_ops`` (and ``ingest_notes``) in SQL."""
        ...

    def decoder_processes(self, path: Path, options: ReadOptions) -> int:
        """Worker processes ``read`` will start for this file (0: it reads in-process)."""
        ...


ID_COLUMNS = {"kernels": "kernel_id", "mem_ops": "memop_id", "cpu_ranges": "range_id", "api_calls": "call_id"}
ID_SHIFT = 40  # job-unique id = file_id << 40 | index in file


def shift_ids(table: str, data: pa.Table, by: int) -> pa.Table:
    """``data`` with its id column (ID_COLUMNS) raised by ``by``: a piece's row indexes -> the file's."""
    if not by:
        return data
    import pyarrow.compute as pc

    idc = ID_COLUMNS[table]
    return data.set_column(data.schema.get_field_index(idc), idc, pc.add(data[idc], pa.scalar(by, pa.int64())))


def decoder_processes_for(size_bytes: int, min_bytes: int) -> int:
    """Decoder processes for a file of ``size_bytes`` read by pieces: none below ``min_bytes`` (starting them costs
    more than they save), inside a pool worker (files are already spread over the cores) or on one core; else 2,
    beside the process that inserts."""
    import multiprocessing

    cpus = os.cpu_count() or 1
    if multiprocessing.parent_process() is not None or cpus < 2 or size_bytes <= min_bytes:
        return 0
    return min(2, cpus)


def process_pool(workers: int, *, fork_if_alone: bool = False):
    """A process pool safe to start from a process that runs DuckDB threads: forkserver, not fork
    (a forked child can inherit locks held by other threads and hang or crash).

    ``fork_if_alone``: fork where this process has no thread but its main one (Linux; before the job database
    is open): the workers start at once with the decoders already imported, while a forkserver first imports them
    (≈ 0.2 s before the first worker runs).

    Each worker exits within a second of its creator's death, however it died (see :func:`_exit_with_creator`);
    the forkserver itself exits when its creator's end of its pipe closes. Stop a pool early with :func:`stop_pool`.
    """
    from concurrent.futures import ProcessPoolExecutor

    class Pool(ProcessPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            # A fork-context pool forks its workers inside submit. A SIGTERM or SIGINT whose handler runs in the
            # fork's Python hooks (logging's lock release) has its exception printed and dropped, and the command
            # goes on to exit 0: hold both until submit returns, when the handler runs in this frame.
            with _signals_held():
                return super().submit(fn, *args, **kwargs)

    ctx = _fork_context() if fork_if_alone and only_thread() else _worker_context()
    return Pool(max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(os.getpid(),))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    import signal

    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: nothing to hold
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def only_thread() -> bool:
    """Whether this process runs no thread but the calling one (Python's or native: DuckDB's, polars'), apart from
    the allocator threads of pyarrow's jemalloc, which its own fork handlers make safe (pthread_atfork)."""
    import threading

    if threading.active_count() != 1:
        return False
    try:
        others = [t for t in os.listdir("/proc/self/task") if int(t) != threading.get_native_id()]
        return all(_thread_name(t) == "jemalloc_bg_thd" for t in others)
    except (OSError, ValueError):  # no /proc: not known
        return False


def _thread_name(tid: str) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


def _fork_context() -> mpc.ForkContext:
    _own_mp_names()
    return mpc.ForkContext()


class _NoMainPopen(mpf.Popen):
    """forkserver Popen whose child never imports the caller's ``__main__`` (see :func:`_worker_context`)."""

    def _launch(self, process_obj):
        prepare = mps.get_preparation_data

        def without_main(name):
            d = prepare(name)
            d.pop("init_main_from_name", None)
            d.pop("init_main_from_path", None)
            return d

        mps.get_preparation_data = without_main  # read by Popen._launch just below, restored at once
        try:
            super()._launch(process_obj)
        finally:
            mps.get_preparation_data = prepare


class _NoMainProcess(mpc.ForkServerProcess):
    _Popen = staticmethod(_NoMainPopen)


def _worker_context() -> mpc.ForkServerContext:
    """forkserver whose processes never import the caller's ``__main__``.

    Workers run nsys2comm code only. By default multiprocessing re-runs the parent's main script in each child (and
    the forkserver preloads it), so a script without an ``if __name__ == "__main__":`` guard would ingest again in
    every worker, and stdin or a notebook cell cannot be re-run at all. Leaving ``__main__`` alone (as
    multiprocessing itself does when main has no file) lets the API work from scripts, stdin and notebooks.
    """
    _own_mp_names()
    ctx = mpc.ForkServerContext()
    ctx.Process = _NoMainProcess
    ctx.set_forkserver_preload(["nsys2comm.ingest.kineto"])  # not "__main__" (the default): warms the decoders
    return ctx


MP_PREFIX = "nsys2comm-mp-"  # POSIX semaphores /dev/shm/sem.nsys2comm-mp-<pid>-…, temp dirs <tmp>/nsys2comm-mp-<pid>


def _own_mp_names() -> None:
    """Name this process's multiprocessing semaphores and temp directory (the forkserver's socket) after its pid.

    With forkserver they outlive a SIGKILL of the process group (what Slurm and timeout send): the resource tracker
    that would unlink them dies with the group. Named after the pid, the next invocation tells a dead process's
    leftovers from a live one's and removes them (:func:`remove_dead_leftovers`)."""
    import atexit
    import multiprocessing
    import shutil
    import tempfile

    cfg = multiprocessing.current_process()._config  # the names multiprocessing reads: semprefix, tempdir
    pid = os.getpid()
    if cfg.get("semprefix", "").startswith("/" + MP_PREFIX) and str(pid) in cfg.get("semprefix", ""):
        return
    remove_dead_leftovers()
    cfg["semprefix"] = f"/{MP_PREFIX}{pid}"
    tmp = os.path.join(mp_temp_base(tempfile.gettempdir()), f"{MP_PREFIX}{pid}")
    os.makedirs(tmp, exist_ok=True)
    cfg["tempdir"] = tmp  # multiprocessing then makes no pymp-* directory of its own, and removes none: we do
    atexit.register(shutil.rmtree, tmp, True)


# The forkserver listens on <tempdir>/listener-XXXXXXXX; sun_path holds 108 bytes on Linux (104 on macOS)
_SOCKET_PATH_MAX = 104
_SOCKET_TAIL = len(f"/{MP_PREFIX}4194304/listener-xxxxxxxx")


def mp_temp_base(tempdir: str) -> str:
    """Where the pools' temp directory goes: ``tempdir``, unless its socket path would not fit in an AF_UNIX
    address (a deep TMPDIR, as batch systems and pytest make), then the first short system temp directory."""
    if len(os.fsencode(tempdir)) + _SOCKET_TAIL < _SOCKET_PATH_MAX:
        return tempdir
    for short in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK):
            return short
    return tempdir  # nothing shorter: multiprocessing's own error then names the problem


def remove_dead_leftovers() -> list[str]:
    """Semaphores and temp directories of nsys2comm processes that are gone (this host's only: they are local)."""
    import shutil
    import tempfile
    from pathlib import Path

    removed = []
    tmp = tempfile.gettempdir()
    places = [(Path("/dev/shm"), "sem." + MP_PREFIX), (Path(tmp), MP_PREFIX)]
    if mp_temp_base(tmp) != tmp:
        places.append((Path(mp_temp_base(tmp)), MP_PREFIX))
    for where, prefix in places:
        try:
            entries = list(where.glob(prefix + "*"))
        except OSError:
            continue
        for e in entries:
            pid = e.name[len(prefix):].split("-", 1)[0]
            if pid.isdigit() and not alive(int(pid)):
                if e.is_dir():
                    shutil.rmtree(e, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        e.unlink()
                removed.append(str(e))
    return removed


def alive(pid: int) -> bool:
    """Whether a process of this pid exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_forkserver() -> None:
    """Start the pools' forkserver now, so that its start-up (a Python process importing the decoders, ≈ 0.3 s)
    runs beside the caller's own start-up instead of delaying the first pool."""
    import multiprocessing.forkserver

    _worker_context()  # sets the forkserver's preload list
    multiprocessing.forkserver.ensure_running()


def _init_worker(creator_pid: int) -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the CLI's handler (cli._on_sigterm)
    if hasattr(signal, "pthread_sigmask"):  # and the signals its creator held while forking it (_signals_held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    _exit_with_creator(creator_pid)
    # Arrow buffers from the system allocator: a worker builds and frees one range's tables after another, and
    # mimalloc (pyarrow's default) kept the freed pages (≈ 25 MB more peak RSS across two workers, same time)
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def _exit_with_creator(creator_pid: int) -> None:
    """Worker initializer: a daemon thread that ends this process when ``creator_pid`` exits.

    Workers are children of the forkserver, not of the creator, so a SIGKILLed creator would leave them waiting
    on their task queue forever (they hold its write end too, so they never see EOF). A pidfd becomes readable
    when the process exits and cannot be fooled by pid reuse; where there is none, poll the pid.
    """
    import select
    import threading

    try:
        fd = os.pidfd_open(creator_pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        fd = None

    def watch() -> None:
        while True:
            if fd is not None:
                if select.select([fd], [], [], 1.0)[0]:
                    os._exit(1)
                continue
            time.sleep(0.5)
            try:
                os.kill(creator_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="nsys2comm-exit-with-creator", daemon=True).start()


def stop_pool(pool) -> None:
    """Stop a process pool now: cancel queued work and kill the workers (shutdown alone waits for running tasks,
    which can take minutes on a large trace)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(5)


_DAY_NS = 86_400 * 10**9
_Y2000_NS = 946_684_800 * 10**9


def impossible_clock(epoch_ns: int, path) -> str | None:
    """Why a trace's epoch clock (Kineto baseTimeNanoseconds, nsys utcEpochNs) is one no profiler gives, or None.
    Such a rank would sit decades off the others (a skew of 1e9 s in every cross-rank figure): before 2000 (a value
    under one day is an offset some writers use, not a date) or over a year past the file's own date. A file date
    before 2000 is ignored: archive tools and reproducible builds reset mtimes to 1970/1980."""
    try:
        mtime_ns: int | None = os.stat(path).st_mtime_ns
    except (OSError, TypeError, ValueError):
        mtime_ns = None
    late = mtime_ns is not None and mtime_ns >= _Y2000_NS and epoch_ns > mtime_ns + 366 * _DAY_NS
    if epoch_ns < 0 or _DAY_NS <= epoch_ns < _Y2000_NS or late:
        when = datetime.fromtimestamp(epoch_ns / 1e9, UTC).strftime("%Y-%m-%d") if abs(epoch_ns) < 2**62 else "?"
        return f"({when}), an impossible clock (before 2000 or after the file was written)"
    return None
