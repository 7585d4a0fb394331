"""The stored sweeps (_cache_* tables): used by read-only sessions only while their content key matches the data;
never read by a writable session; refreshed by ingest and 'sql --write'; repaired after a killed ingest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm import analysis, catalog, storage
from nsys2comm.ingest import ingest
from nsys2comm.storage import db
from nsys2comm.storage import sweeps as cache

HTA_2RANK = Path("/work/shared/traces/kineto/hta_trace_filter_2rank")
NAMES = ("overlap_by_rank", "time_breakdown_by_rank", "comm_kernels", "collective_skew", "exposed_comm_by_kernel",
         "exposed_comm_causes", "gemm_contention", "latency_model", "volume_check")

# tier: subprocess (every test here starts nsys2comm or Python processes)
pytestmark = pytest.mark.subprocess


def _frames(con) -> dict:
    return {n: analysis.run_query(con, n) for n in NAMES}


def _uses_cache(con) -> bool:
    return con.execute("SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = '_overlap_gpu_timeline' "
                       "AND sql LIKE '%_cache_overlap_gpu_timeline%'").fetchall()[0][0] == 1


def _live(path: Path) -> dict:
    """The same rows in memory, no cache: the reference."""
    con = db.connect(None)
    con.execute("ATTACH ? AS src (READ_ONLY)", [str(path)])
    for t in ("files", "ranks", "devices", "kernels", "mem_ops", "cpu_ranges", "api_calls", "comm_ops"):
        con.execute(f"INSERT INTO main.{t} SELECT * FROM src.{t}")
    con.execute("DETACH src")
    with storage.snapshotted(con):  # each sweep computed once for the nine queries
        out = _frames(con)
    con.close()
    return out


def _same(a: dict, b: dict) -> None:
    for name in NAMES:
        assert a[name].equals(b[name]), f"{name}\n{a[name]}\nvs\n{b[name]}"


def _reader_sees_live_rows(path: Path, *, cached: bool) -> None:
    """A read-only session uses the stored sweeps (or not), and its rows equal a computation without any cache."""
    ro = db.connect(path)
    assert _uses_cache(ro) == cached
    _same(_frames(ro), _live(path))
    ro.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    return write_kineto(make_run(world_size=3, steps=2), tmp_path_factory.mktemp("c"), style="new")


def _ingest(path: Path, files) -> None:
    con = db.connect(path, write=True)
    ingest(con, files, jobs=1)
    con.close()


def test_incremental_ingest_refreshes_and_readers_use_it(tmp_path, files):
    path = tmp_path / "job.duckdb"
    _ingest(path, files[:1])
    _ingest(path, files[1:])
    ro = db.connect(path)
    assert _uses_cache(ro)
    _same(_frames(ro), _live(path))
    assert analysis.run_query(ro, "overlap_by_rank")["rank"].to_list() == [0, 1, 2]
    ro.close()


def test_writable_session_never_reads_the_cache(tmp_path, files):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    rw = db.connect(path, write=True)
    assert not cache.use_cache(rw) and not _uses_cache(rw)
    rw.execute("DELETE FROM kernels WHERE kernel_class = 'gemm'")
    assert analysis.run_query(rw, "overlap_by_rank")["gemm_ns"].to_list() == [0, 0, 0]
    rw.close()


def test_the_writer_computes_live_after_its_refresh(tmp_path, files):
    """The refresh reads each stored sweep back for the next one: afterwards the writer's helpers are live again."""
    path = tmp_path / "job.duckdb"
    con = db.connect(path, write=True)
    ingest(con, files, jobs=1)
    shadows = con.execute("SELECT view_name FROM duckdb_views() WHERE temporary AND list_contains(?, view_name)",
                          [list(cache.SWEEPS)]).fetchall()
    assert shadows == []
    con.execute("DELETE FROM kernels WHERE kernel_class = 'gemm'")
    assert analysis.run_query(con, "gemm_contention").height == 0
    con.close()


def test_plain_duckdb_edit_makes_the_cache_unused(tmp_path, files):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    con = duckdb.connect(str(path))  # knows nothing about the cache
    con.execute("UPDATE kernels SET end_ns = end_ns + 5000 WHERE kernel_class = 'communication'")
    con.close()
    ro = db.connect(path)
    assert not _uses_cache(ro)
    _same(_frames(ro), _live(path))
    ro.close()


def test_sql_write_refreshes_the_cache(tmp_path, files):
    from typer.testing import CliRunner

    from nsys2comm.cli import app

    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    res = CliRunner().invoke(app, ["sql", str(path), "--write", "DELETE FROM kernels WHERE kernel_class='gemm'"])
    assert res.exit_code == 0, res.output
    ro = db.connect(path)
    assert _uses_cache(ro)
    assert analysis.run_query(ro, "overlap_by_rank")["gemm_ns"].to_list() == [0, 0, 0]
    _same(_frames(ro), _live(path))
    ro.close()


def test_killed_ingest_leaves_no_stale_numbers_and_the_next_ingest_repairs(tmp_path, files, monkeypatch):
    path = tmp_path / "job.duckdb"
    _ingest(path, files[:1])

    def killed(con):
        raise KeyboardInterrupt  # the process died after the file's transaction, before the refresh

    monkeypatch.setattr(storage, "refresh_cache", killed)  # the name ingest calls
    con = db.connect(path, write=True)
    with pytest.raises(KeyboardInterrupt):
        ingest(con, files[1:], jobs=1)
    con.close()
    monkeypatch.undo()
    ro = db.connect(path)
    assert not _uses_cache(ro)
    _same(_frames(ro), _live(path))
    ro.close()
    _ingest(path, files)  # every file skipped: the refresh still runs
    ro = db.connect(path)
    assert _uses_cache(ro)
    _same(_frames(ro), _live(path))
    ro.close()


def test_new_catalog_sql_invalidates(tmp_path, files, monkeypatch):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    monkeypatch.setattr(catalog, "digest", lambda: "another-version")
    ro = db.connect(path)
    assert not _uses_cache(ro)
    ro.close()


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "nsys2comm", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))


def test_two_writers_wait_and_leave_nothing_stale(tmp_path, files):
    path = tmp_path / "job.duckdb"
    procs = [subprocess.Popen([sys.executable, "-m", "nsys2comm", "ingest", str(f), "--db", str(path), "-q",
                               "--lock-timeout", "300"], stderr=subprocess.PIPE, text=True) for f in files]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()
    ro = db.connect(path)
    assert ro.execute("SELECT count(*) FROM files").fetchall()[0][0] == 3
    _same(_frames(ro), _live(path))
    ro.close()


def test_second_writer_times_out_with_one_line(tmp_path, files):
    path = tmp_path / "job.duckdb"
    _ingest(path, files[:1])
    holder = db.connect(path, write=True)
    try:
        t = time.monotonic()
        res = _cli("ingest", str(files[1]), "--db", str(path), "--lock-timeout", "1")
        assert res.returncode == 1
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and "locked" in lines[0], res.stderr
        assert time.monotonic() - t < 120
    finally:
        holder.close()


@pytest.mark.skipif(not HTA_2RANK.is_dir(), reason="shared traces not mounted")
def test_issue_commands_two_calls_equal_one(tmp_path):
    """The issue's reproduction: rank files ingested one call each give the numbers of one call."""
    r0, r1 = HTA_2RANK / "sampled_rank-0.json.gz", HTA_2RANK / "sampled_rank-1.json.gz"
    two, one = tmp_path / "two.duckdb", tmp_path / "one.duckdb"
    _ingest(two, [r0])
    _ingest(two, [r1])
    _ingest(one, [r0, r1])
    a, b = db.connect(two), db.connect(one)
    for name in ("overlap_by_rank", "time_breakdown_by_rank"):
        assert analysis.run_query(a, name).equals(analysis.run_query(b, name)), name
    busy = analysis.run_query(a, "overlap_by_rank")["busy_ns"].to_list()
    assert all(v and v > 0 for v in busy), busy
    a.close()
    b.close()


@pytest.fixture
def key_records(tmp_path_factory, monkeypatch) -> Path:
    """An own user cache directory (one per module: the job template in it is built once)."""
    d = tmp_path_factory.getbasetemp() / "usercache-test-cache"
    monkeypatch.setenv("NSYS2COMM_CACHE_DIR", str(d))
    return d / "content-keys"


def _recount_forbidden(monkeypatch) -> None:
    def recount(con):
        raise AssertionError("the content key was counted again")
    monkeypatch.setattr(cache, "content_key", recount)


def test_a_recorded_key_spares_the_count_while_the_file_is_unchanged(tmp_path, files, key_records, monkeypatch):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    ro = db.connect(path)  # counts, matches, records the file's state
    assert _uses_cache(ro)
    ro.close()
    assert Path(cache._key_record(str(path))).parent == key_records
    assert json.loads(Path(cache._key_record(str(path))).read_text())["path"] == str(path.resolve())
    with monkeypatch.context() as m:
        _recount_forbidden(m)
        ro = db.connect(path)
        assert _uses_cache(ro)
        _same(_frames(ro), _live(path))
        ro.close()
        rw = db.connect(path, write=True)  # a writer that changes nothing leaves the file as it was
        rw.close()
        ro = db.connect(path)
        assert _uses_cache(ro)
        ro.close()


@pytest.mark.parametrize("checkpoint", [True, False], ids=["checkpointed", "left-in-the-wal"])
def test_any_edit_after_a_recorded_key_sends_sessions_back_to_the_count(tmp_path, files, key_records, checkpoint):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    db.connect(path).close()  # records the key for this state
    con = duckdb.connect(str(path))  # knows nothing about the cache; same row count, one value changed
    con.execute("UPDATE kernels SET end_ns = end_ns + 5000 WHERE kernel_id = (SELECT min(kernel_id) FROM kernels "
                "WHERE kernel_class = 'communication')")
    if not checkpoint:
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.close()
    assert Path(f"{path}.wal").exists() != checkpoint
    ro = db.connect(path)
    assert not _uses_cache(ro)
    _same(_frames(ro), _live(path))
    ro.close()


@pytest.mark.parametrize("checkpoint", [True, False], ids=["checkpointed", "left-in-the-wal"])
def test_a_recorded_catalog_check_is_spared_until_the_file_changes(tmp_path, files, key_records, monkeypatch,
                                                                   checkpoint):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    db.connect(path).close()  # compares the stored definitions, records the result for this state
    assert json.loads(Path(cache._key_record(str(path))).read_text())["catalog"] == catalog.digest()

    def compare(con):
        raise AssertionError("the stored definitions were compared again")
    with monkeypatch.context() as m:
        m.setattr(catalog, "is_installed", compare)
        ro = db.connect(path)
        assert ro.execute("SELECT busbw_factor('all_reduce', 8)").fetchall()[0][0] == pytest.approx(2 * 7 / 8)
        ro.close()
    con = duckdb.connect(str(path))  # an outside edit of a stored definition
    con.execute("CREATE OR REPLACE MACRO busbw_factor(collective, n) AS 42.0")
    if not checkpoint:
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.close()
    compared: list[int] = []
    real = catalog.is_installed
    monkeypatch.setattr(catalog, "is_installed", lambda con: compared.append(1) or real(con))
    ro = db.connect(path)  # the package's own definition shadows the edited one
    assert ro.execute("SELECT busbw_factor('all_reduce', 8)").fetchall()[0][0] == pytest.approx(2 * 7 / 8)
    assert compared == [1]
    ro.close()


def test_a_record_of_another_state_or_key_is_not_trusted(tmp_path, files, key_records, monkeypatch):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    db.connect(path).close()
    record = Path(cache._key_record(str(path)))
    rec = json.loads(record.read_text())
    real = cache.content_key
    for changed in ({"state": rec["state"] + "0"}, {"content_key": rec["content_key"] + "0"},
                    {"path": rec["path"] + "0"}, ["not", "a", "record"], "{damaged"):
        record.write_text(json.dumps(rec | changed) if isinstance(changed, dict) else
                          changed if isinstance(changed, str) else json.dumps(changed))
        counted: list[int] = []
        monkeypatch.setattr(cache, "content_key", lambda con, counted=counted: counted.append(1) or real(con))
        ro = db.connect(path)
        assert _uses_cache(ro) and counted == [1], changed
        ro.close()
        assert json.loads(record.read_text()) == rec  # recorded again after the count


def test_key_records_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("NSYS2COMM_CACHE_DIR", str(tmp_path / "usercache"))
    key_records = tmp_path / "usercache" / "content-keys"
    monkeypatch.setattr(cache, "_MAX_KEY_RECORDS", 4)
    for i in range(6):
        cache._record(str(tmp_path / f"{i}.duckdb"), "state", content_key="key")
    assert 2 <= len(list(key_records.iterdir())) <= 4
    assert cache._recorded(str(tmp_path / "5.duckdb"), "state")["content_key"] == "key"


def _has_key(path: Path) -> bool:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = '_cache_key'").fetchall()[0][0] == 1
    finally:
        con.close()


def test_sweep_dependencies_name_every_stored_sweep_a_sweep_reads():
    """The order of the stored sweeps (cache._store_sweeps) comes from these; each edge checked by hand against the
    catalog SQL when written (a missed one would only compute the sweep it reads again)."""
    deps = cache.sweep_dependencies()
    assert set(deps) == set(cache.SWEEPS)
    assert deps["_overlap_comm_kernels"] == {"_overlap_comm_kernel_overlap"}
    assert deps["_skew_comm_instances"] == {"_skew_ops"}
    assert deps["_exposure_kernel_evidence"] == {"_exposure_launches", "_overlap_comm_kernels", "_overlap_step_ranges",
                                                 "_skew_ops", "_skew_comm_instances"}
    assert deps["_overlap_step_ranges"] == deps["_exposure_launches"] == set()
    for view, reads in deps.items():  # acyclic: every sweep can be stored after those it reads
        assert view not in reads


def test_stored_order_names_documented_columns_of_stored_sweeps():
    """A sweep's storage order (a speed matter only) names columns its view documents; a renamed column fails here,
    not in every ingest."""
    for view, order in cache._STORED_ORDER.items():
        assert view in cache.SWEEPS
        documented = catalog.find(view).columns
        assert all(c.strip() in documented for c in order.split(",")), (view, order)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_sweeps_stored_by_several_cursors_equal_a_live_computation(tmp_path, files, workers, monkeypatch):
    path = tmp_path / "job.duckdb"
    monkeypatch.setattr(cache, "SWEEP_WORKERS", workers)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    _ingest(path, files)
    _reader_sees_live_rows(path, cached=True)


def test_sweeps_of_a_large_job_are_stored_one_at_a_time(tmp_path, files, monkeypatch):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    con = db.connect(path, write=True)
    n = con.execute("SELECT count(*) FROM kernels").fetchall()[0][0]
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(cache, "PARALLEL_SWEEPS_MAX_KERNELS", n)
    assert cache._sweep_workers(con) == min(cache.SWEEP_WORKERS, 8)
    monkeypatch.setattr(cache, "PARALLEL_SWEEPS_MAX_KERNELS", n - 1)
    assert cache._sweep_workers(con) == 1
    con.close()


def test_a_refresh_that_fails_half_way_leaves_no_key_and_the_next_one_repairs(tmp_path, files):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    rw = db.connect(path, write=True)
    rw.execute("DELETE FROM kernels WHERE kernel_class = 'gemm'")
    # one sweep's table cannot be replaced (a view of that name is in the way): the others are stored, then it fails
    rw.execute("DROP TABLE _cache_model_group_records")
    rw.execute("CREATE VIEW _cache_model_group_records AS SELECT 1 AS x")
    with pytest.raises(duckdb.Error):
        cache.refresh_cache(rw)
    assert cache._stored_key(rw) is None
    assert len(rw.execute("SELECT * FROM duckdb_views() WHERE view_name = '_overlap_gpu_timeline' "
                          "AND temporary").fetchall()) == 0  # the writer computes live again
    rw.close()
    assert not _has_key(path)
    _reader_sees_live_rows(path, cached=False)
    rw = db.connect(path, write=True)
    rw.execute("DROP VIEW _cache_model_group_records")
    assert cache.refresh_cache(rw)
    rw.close()
    _reader_sees_live_rows(path, cached=True)


@pytest.mark.subprocess
def test_sigterm_during_the_refresh_ends_it_at_once_with_no_key(tmp_path, files):
    """A sweep that would run for minutes (a helper view replaced by hand) is interrupted: the process leaves
    promptly instead of waiting in DuckDB, and no session reads the half-stored sweeps."""
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    slow = ("CREATE OR REPLACE VIEW _model_group_records AS SELECT sum(i) AS s FROM range(1000000000000) t(i); "
            "DELETE FROM kernels WHERE kernel_class = 'gemm'")
    proc = subprocess.Popen([sys.executable, "-m", "nsys2comm", "sql", str(path), "--write", slow],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("job.duckdb.wal")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(3)  # the small sweeps are stored by now; the slow one runs
    assert proc.poll() is None, proc.communicate()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == 128 + signal.SIGTERM, err
    ro = db.connect(path)  # (the package's helpers shadow the slow one the SQL stored)
    assert not _uses_cache(ro)
    ro.close()


def test_a_snapshot_of_a_session_on_stored_sweeps_reads_them_and_gives_the_same_rows(tmp_path, files):
    path = tmp_path / "job.duckdb"
    _ingest(path, files)
    live = _live(path)
    ro = db.connect(path)
    assert _uses_cache(ro)
    cache.materialize(ro)  # as the report and the diff do
    assert _uses_cache(ro)
    assert not ro.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name LIKE '%_snapshot'"
                          ).fetchall()[0][0]
    _same(_frames(ro), live)
    cache.unmaterialize(ro)
    assert _uses_cache(ro)
    ro.close()
    rw = db.connect(path, write=True)  # a writable session computes live: its snapshot is taken
    cache.materialize(rw)  # every @sweep view snapshotted, under its regular name
    assert {r[0] for r in rw.execute("SELECT table_name FROM duckdb_tables() WHERE temporary "
                                     "AND table_name LIKE '%_snapshot'").fetchall()} == {
        cache.snapshot_table(v) for v in cache.SWEEPS}
    _same(_frames(rw), live)
    cache.unmaterialize(rw)
    rw.close()
