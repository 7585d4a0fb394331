"""A single large Kineto trace starts decoding before the job database is open (kineto.read_ahead): the ingest takes
the ranges over and stores the same rows as a read without workers; a read ahead that no read takes (the file is
already in the job, other options) is discarded with its workers and spool. Workers are forked only where the
process runs no other thread (base.only_thread); their tables come back through spool files (kineto._to_spool)."""

# tier 3: a generated trace of 20 MB (several byte ranges), ingested with and without workers

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pyarrow as pa
import pytest
from fork_signal import run_with_sigterm_at_fork

from fixtures.kineto_writer import write_large_kineto
from nsys2comm import Job
from nsys2comm.ingest import kineto, start_decoders
from nsys2comm.ingest.base import SPOOL_PREFIX, ReadOptions

TABLES = ("kernels", "mem_ops", "api_calls", "cpu_ranges", "comm_ops", "devices", "ranks", "ingest_notes")


@pytest.fixture(autouse=True)
def alone(monkeypatch):
    """Read ahead as in a process of one thread (pytest-xdist's workers run execnet's threads): the pool itself
    still checks the real process (base.only_thread), so here it uses the forkserver."""
    monkeypatch.setattr(kineto, "only_thread", lambda: True)


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    path = tmp_path_factory.mktemp("ahead") / "rank0.pt.trace.json"
    write_large_kineto(path, 20 << 20)
    return path


def _rows(job: Job) -> dict[str, list[tuple]]:
    return {t: job.con.execute(f"SELECT * EXCLUDE (file_id) FROM {t} ORDER BY ALL").fetchall() for t in TABLES}


def _spools() -> set[str]:
    """This process's spool directories (other tests of the process may keep their own: compare before and after)."""
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"{SPOOL_PREFIX}{os.getpid()}-")}


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_the_ingest_takes_the_read_ahead_over_with_the_same_rows(large, tmp_path, monkeypatch):
    before = _spools()
    taken = []
    take = kineto._take_ahead
    monkeypatch.setattr(kineto, "_take_ahead", lambda *a: taken.append(take(*a)) or taken[-1])
    with Job.ingest([large], tmp_path / "ahead.duckdb", read_extra={"kineto_workers": 2}) as job:
        got = _rows(job)
    assert len(taken) == 1 and taken[0] is not None  # submitted before the database opened, then taken over
    assert len(taken[0].inflight) == 0 and taken[0].seq_from > 0
    with Job.ingest([large], read_extra={"kineto_workers": 0}) as job:
        want = _rows(job)
    assert got["kernels"] and got["comm_ops"]
    assert got == want
    assert not kineto._ahead and _spools() == before


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_a_read_ahead_nobody_takes_is_discarded(large, tmp_path):
    before = _spools()
    db = tmp_path / "job.duckdb"
    Job.ingest([large], db, read_extra={"kineto_workers": 2}).close()
    # the file is already in the job: nothing reads it, and the read ahead goes with its workers and spool
    with Job.ingest([large], db, read_extra={"kineto_workers": 2}) as job:
        assert [r.status for r in job.results] == ["skipped"]
    assert not kineto._ahead and _spools() == before
    # other options than the read's: the read starts its own ranges
    discard = start_decoders([large], read_extra={"kineto_workers": 2})
    assert len(kineto._ahead) == 1 and kineto._ahead[0].inflight
    pool = kineto._ahead[0].pool
    assert kineto._take_ahead(large, ReadOptions(rank=3, extra={"kineto_workers": 2}), kineto.BLOCK) is None
    assert not kineto._ahead and pool._shutdown_thread and _spools() == before
    discard()


def test_no_read_ahead_for_small_gzip_or_bad_files(large, tmp_path):
    small = tmp_path / "small.json"
    small.write_bytes(large.read_bytes()[: 1 << 20].rsplit(b"},", 1)[0] + b"}]}")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x00not a trace")
    for path, extra in ((small, {}), (bad, {"kineto_workers": 2}), (large, {"kineto_workers": 0})):
        start_decoders([path], read_extra=extra)()
        assert not kineto._ahead
    assert kineto.read_ahead(bad, ReadOptions(extra={"kineto_workers": 2})) is None  # ingest reports it


def test_no_read_ahead_while_another_thread_runs(large, monkeypatch):
    """A progress bar's thread, for one: the read would wait for a forkserver instead of opening the database
    meanwhile, so only the forkserver starts early."""
    import nsys2comm.ingest as ingest_mod

    started = []
    monkeypatch.setattr(ingest_mod, "start_forkserver", lambda: started.append(True))
    monkeypatch.setattr(kineto, "only_thread", lambda: False)
    start_decoders([large], read_extra={"kineto_workers": 2})()
    assert not kineto._ahead and started == [True]


def test_spooled_tables_round_trip(tmp_path):
    t = pa.table({"a": pa.array([1, None, 3], pa.int64()), "s": ["x", None, "z"]})
    names, st = kineto._to_spool(({"kernels": t}, "state"), str(tmp_path / "r0"))
    assert names == {"kernels": str(tmp_path / "r0-kernels.arrow")} and st == "state"
    tables, _ = kineto._from_spool((names, st))
    assert tables["kernels"].equals(t) and not os.listdir(tmp_path)  # mapped, and the file removed
    # no spool directory (temp space full): the tables go through the result pipe as they are
    assert kineto._to_spool(({"kernels": t}, st), None)[0]["kernels"] is t
    assert kineto._to_spool(({"kernels": t}, st), str(tmp_path / "gone" / "r0"))[0]["kernels"] is t


@pytest.mark.subprocess
def test_workers_fork_only_in_a_process_without_other_threads():
    code = ("import threading, pyarrow, duckdb\n"
            "from nsys2comm.ingest.base import only_thread\n"
            "alone = only_thread()\n"  # pyarrow's jemalloc thread does not count
            "con = duckdb.connect(); con.execute('SELECT 1')\n"
            "print(alone, only_thread())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]


@pytest.mark.subprocess
def test_sigterm_while_the_read_ahead_starts_leaves_no_spool(large, tmp_path):
    """tier 3: a SIGTERM taken while the read ahead forks its workers (inside _Ranges' constructor, before anything
    holds the object) still removes its spool directory: the constructor closes what it made."""
    proc = run_with_sigterm_at_fork("""
        from pathlib import Path
        from nsys2comm.ingest import kineto
        from nsys2comm.ingest.base import ReadOptions
        kineto.read_ahead(Path(sys.argv[1]), ReadOptions(extra={"kineto_workers": 2}))
    """, str(large), env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 143, proc.stderr.decode()
    assert [n for n in os.listdir(tmp_path) if n.startswith(SPOOL_PREFIX)] == []
