"""No process outlives an ingest (issue 10 item 6): SIGTERM during a multi-file ingest ends it at once with no
children and no spool; after SIGKILL of the parent its pool processes exit within 5 s and the next ingest removes
the spool it left.

The ingest runs as a subprocess in its own session, so every process it starts (forkserver, pool workers) carries
that session id in /proc, whoever its parent is."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fork_signal import run_with_sigterm_at_fork

from nsys2comm.ingest.base import mp_temp_base

# tier: subprocess (every test here signals a running nsys2comm process)
pytestmark = [pytest.mark.subprocess,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]

ROOT = Path(__file__).resolve().parents[1]
EVENT = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 1, "ts": 1, "dur": 1, "args": {}}'


def _slow_trace(path: Path, rank: int) -> Path:
    """A small gzip that takes seconds to parse: events separated by 24 MiB of whitespace (under the event limit),
    2.4 GiB decompressed."""
    gap = gzip.compress(b" " * (24 << 20) + b", " + EVENT, compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(b'{"distributedInfo": {"rank": %d, "world_size": 3}, "traceEvents": [' % rank + EVENT))
        for _ in range(100):
            f.write(gap)
        f.write(gzip.compress(b"]}"))
    return path


def _session(sid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields[0] state, [3] session id
            pids.append(int(d))
    return pids


def _wait_gone(sid: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := _session(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("slow")
    return [_slow_trace(d / f"rank{r}.json.gz", r) for r in range(3)]


def _start(traces, tmp: Path) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    db = tmp / "job.duckdb"
    proc = subprocess.Popen([sys.executable, "-m", "nsys2comm", "ingest", *map(str, traces), "--db", str(db),
                             "--jobs", "2", "-q", "--max-decompressed-gb", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(_session(proc.pid)) < 4:  # the CLI, the forkserver and two parsers
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the pool never started"
        time.sleep(0.1)
    while not list(tmp.glob("nsys2comm-spool-*/*/*")):  # a parser has spooled something, or is about to
        time.sleep(0.1)
        if time.monotonic() > deadline:
            break
    return proc, {"db": db}


def test_sigterm_leaves_nothing(traces, tmp_path):
    proc, info = _start(traces, tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)  # would hang while a child still holds the pipes
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took < 5, took
    assert _wait_gone(proc.pid, 2) == []
    assert list(tmp_path.glob("nsys2comm-spool-*")) == []
    assert not info["db"].exists() and not Path(str(info["db"]) + ".wal").exists()  # the DB it was creating


def test_sigkill_children_exit_and_next_ingest_cleans_up(traces, tmp_path):
    proc, _ = _start(traces, tmp_path)
    proc.kill()
    t0 = time.monotonic()
    proc.communicate(timeout=10)
    assert _wait_gone(proc.pid, 5) == [], "pool processes outlived their SIGKILLed parent"
    assert time.monotonic() - t0 < 5.5
    left = list(tmp_path.glob(f"nsys2comm-spool-{proc.pid}-*"))
    assert left  # SIGKILL leaves the spool: nothing in the process can run
    # a live owner's spool is kept, a dead owner's is removed by the next ingest
    live = tmp_path / f"nsys2comm-spool-{os.getpid()}-keep"
    live.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    small = ROOT / "fixtures" / "example"
    r = subprocess.run([sys.executable, "-m", "nsys2comm", "ingest", str(small), "--db", str(tmp_path / "b.duckdb"),
                        "-q", "--jobs", "1"], env=env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() for p in left) and live.exists()


def test_process_group_sigkill_leaves_nothing_after_the_next_invocation(traces, tmp_path):
    """What Slurm and timeout send: SIGKILL to the whole group, resource tracker and forkserver included. The POSIX
    semaphores and the forkserver's directory it leaves are named after the dead pid; the next ingest removes them."""
    proc, _ = _start(traces, tmp_path)
    pid = proc.pid
    os.killpg(pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert _wait_gone(pid, 5) == []
    sems = list(Path("/dev/shm").glob(f"sem.nsys2comm-mp-{pid}-*")) if Path("/dev/shm").is_dir() else []
    dirs = list(Path(mp_temp_base(str(tmp_path))).glob(f"nsys2comm-mp-{pid}"))
    assert dirs, "the pool's temp directory is named after its process"
    assert not list(tmp_path.glob("pymp-*"))
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "nsys2comm", "ingest", str(ROOT / "fixtures" / "example"), "--db",
                        str(tmp_path / "c.duckdb"), "-q", "--jobs", "1"], env=env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() for p in sems + dirs)
    assert not list(tmp_path.glob(f"nsys2comm-spool-{pid}-*"))


def test_a_deep_tmpdir_still_starts_the_pool(traces, tmp_path):
    """A TMPDIR too deep for the forkserver's AF_UNIX socket (sun_path is 108 bytes) must not stop an ingest: the
    pools' directory moves to a short system temp directory, and nothing is left there."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    assert mp_temp_base(str(deep)) != str(deep)
    proc, _ = _start(traces, deep)
    pid = proc.pid
    os.killpg(pid, signal.SIGTERM)
    proc.communicate(timeout=30)
    assert _wait_gone(pid, 5) == []
    assert not list(Path(mp_temp_base(str(deep))).glob(f"nsys2comm-mp-{pid}"))


def test_a_short_tmpdir_is_kept():
    # tier: 2
    assert mp_temp_base("/tmp") == "/tmp"


def test_sigterm_while_a_single_trace_reads_ahead_leaves_nothing(tmp_path):
    """One large uncompressed trace: its byte ranges decode in forked workers from before the job database opens
    (kineto.read_ahead). SIGTERM then ends the command at once, with no worker, spool or database left."""
    from fixtures.kineto_writer import write_large_kineto

    big = tmp_path / "rank0.pt.trace.json"
    write_large_kineto(big, 300 << 20)
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NSYS2COMM_THREADS", None)
    db = tmp_path / "job.duckdb"
    proc = subprocess.Popen([sys.executable, "-m", "nsys2comm", "ingest", str(big), "--db", str(db), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(_session(proc.pid)) < 3:  # the CLI and its two forked decoders
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the decoders never started"
        time.sleep(0.02)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert time.monotonic() - t0 < 5
    assert _wait_gone(proc.pid, 2) == []
    assert list(tmp_path.glob("nsys2comm-spool-*")) == []
    assert not db.exists() and not Path(str(db) + ".wal").exists()


def test_a_signal_during_the_fork_of_a_worker_is_not_lost():
    """A fork-context pool forks in ``submit``; the SIGTERM handler's exception must not fall into the fork's hooks
    (where Python prints and drops it, and the command exits 0): base.process_pool holds the signal until submit
    returns."""
    proc = run_with_sigterm_at_fork("""
        from nsys2comm.ingest.base import process_pool, stop_pool
        pool = process_pool(1, fork_if_alone=True)
        try:
            pool.submit(os.getpid).result()
        finally:
            stop_pool(pool)
    """)
    assert proc.returncode == 143, proc.stderr.decode()
    assert b"Exception ignored" not in proc.stderr


def test_pool_workers_do_not_inherit_held_signals():
    """The workers forked while the creator held SIGTERM/SIGINT unblock both: stop and Ctrl-C still reach them."""
    from nsys2comm.ingest.base import process_pool, stop_pool

    pool = process_pool(1, fork_if_alone=True)
    try:
        blocked = int(pool.submit(_blocked_signals).result(timeout=60), 16)
    finally:
        stop_pool(pool)
    assert not blocked & (1 << (signal.SIGTERM - 1) | 1 << (signal.SIGINT - 1))


def _blocked_signals() -> str:
    with open("/proc/self/status") as f:
        return next(line.split()[1] for line in f if line.startswith("SigBlk:"))
