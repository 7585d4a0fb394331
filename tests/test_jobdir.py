"""A job as a Parquet directory (nsys2comm ingest --out DIR): equal to a DuckDB file built from the same traces for
every public catalog query, written by concurrent processes, atomic per file, re-ingest skip, rank collisions,
typed views, rank filters pushed down to the partitions, sealed sessions, the commands."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import jobs_util as ju

from fixtures import synthetic as syn
from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import write_nsys
from nsys2comm import Job
from nsys2comm.cli import app
from nsys2comm.errors import InputError, UsageError
from nsys2comm.ingest import jobwrite
from nsys2comm.storage import db as dbmod
from nsys2comm.storage import jobdir

# tier: subprocess (every test here starts nsys2comm or Python processes)
pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="session")
def jobs_base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("jobs")


@pytest.mark.parametrize("name", ju.JOBS)
def test_every_query_equals_the_duckdb_file(name, jobs_base):
    job = ju.build(name, jobs_base)
    with Job.open(job["dir"]) as j:
        ju.assert_same(job["want"], ju.frames(j.con))


def test_tables_equal_with_the_schemas_types_and_docs(jobs_base):
    job = ju.build("kineto6", jobs_base)
    a, b = dbmod.connect(job["db"]), jobdir.connect(job["dir"])
    for table, cols in jobdir.table_columns().items():
        assert [r[:2] for r in b.execute(f"DESCRIBE {table}").fetchall()] == [c for c in cols], table
        order = "kernel_id" if table in ("kernels", "comm_ops") else "ALL"
        keep = "* EXCLUDE (ingested_at)" if table == "files" else "*"  # the wall-clock time of each ingest
        x = a.sql(f"SELECT {keep} FROM {table} ORDER BY {order}").fetchall()
        assert x == b.sql(f"SELECT {keep} FROM {table} ORDER BY {order}").fetchall(), table
    doc = b.execute("SELECT comment FROM duckdb_columns() WHERE table_name = 'kernels' AND column_name = 'start_ns'")
    assert doc.fetchone()[0].startswith("Start on the job timeline")


def test_a_nsys_file_of_several_ranks_written_by_three_processes_at_once(tmp_path):
    """Three writers given the same 4-rank file: one copy of each part (same names), equal to a DuckDB file."""
    path = write_nsys(syn.make_run(world_size=4, steps=2), tmp_path / "run.sqlite")
    con = dbmod.connect(ju.duckdb_file([path], tmp_path / "job.duckdb"))
    want = ju.frames(con)
    con.close()
    procs = [ju.cli("ingest", str(path), "--out", str(tmp_path / "job"), "-q") for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    assert len(list((tmp_path / "job" / "kernels").glob("rank=*/part-*.parquet"))) == 4
    with Job.open(tmp_path / "job") as j:
        ju.assert_same(want, ju.frames(j.con))
        assert j.sql("SELECT DISTINCT file_id FROM kernels").to_series().to_list() == [1]


def test_empty_job_has_typed_empty_tables(tmp_path):
    jobwrite.prepare(tmp_path / "empty")
    with Job.open(tmp_path / "empty") as j:
        assert j.sql("SELECT count(*) AS n FROM kernels")["n"][0] == 0
        assert [r[:2] for r in j.con.execute("DESCRIBE cpu_ranges").fetchall()] == jobdir.table_columns()["cpu_ranges"]
        assert j.query("overlap_by_rank").height == 0


def test_rank_filters_skip_other_partitions(jobs_base):
    job = ju.build("example8", jobs_base)
    con = jobdir.connect(job["dir"])
    plan = con.execute("EXPLAIN SELECT count(*) FROM kernels WHERE rank = 3").fetchall()[0][1]
    assert "File Filters: rank = 3" in plan and "Scanning Files: 1/8" in plan, plan
    assert con.execute("SELECT count(*) FROM kernels WHERE rank = 3").fetchone()[0] > 0


def test_sessions_read_the_committed_parts_only(jobs_base, tmp_path):
    job = ju.build("example8", jobs_base)
    con = jobdir.connect(job["dir"])
    outside = tmp_path / "x.parquet"
    for sql in (f"COPY (SELECT 1) TO '{job['dir']}/kernels/evil.parquet'", f"COPY (SELECT 1) TO '{outside}'",
                f"SELECT * FROM read_parquet('{job['dir']}/*/*/*.parquet')", "INSTALL httpfs",
                "SET enable_external_access = true"):
        with pytest.raises(duckdb.Error):
            con.execute(sql)
    assert not outside.exists() and not (job["dir"] / "kernels" / "evil.parquet").exists()
    with pytest.raises(UsageError, match="read-only"):
        Job.open(job["dir"], write=True)


def test_reingest_skips_by_sha256(jobs_base):
    job = ju.build("kineto6", jobs_base)
    before = {p: p.stat().st_mtime_ns for p in job["dir"].rglob("*.parquet")}
    res = jobwrite.write(job["traces"], job["dir"], jobs=1)
    assert [r.status for r in res] == ["skipped"] * len(job["traces"])
    assert {p: p.stat().st_mtime_ns for p in job["dir"].rglob("*.parquet")} == before


def test_rank_collision_is_refused_at_write_and_at_read(tmp_path):
    a = write_kineto(syn.make_run(world_size=2, steps=1, seed=1), tmp_path / "a")
    b = write_kineto(syn.make_run(world_size=2, steps=2, seed=2), tmp_path / "b")
    jobwrite.write(a, tmp_path / "job", jobs=1)
    with pytest.raises(InputError, match=r"rank 0 is already in this job directory \(from .*worker0"):
        jobwrite.write(b[:1], tmp_path / "job", jobs=1)
    # a conflict made by hand (or by an older version): readers leave rank 0 out, say so, and analyse rank 1
    jobwrite.write(b[:1], tmp_path / "other", jobs=1)
    for table_dir in (tmp_path / "other").iterdir():
        if table_dir.is_dir() and table_dir.name != jobwrite.CLAIMS:
            shutil.copytree(table_dir, tmp_path / "job" / table_dir.name, dirs_exist_ok=True)
    job = Job.open(tmp_path / "job")
    assert job.sql("SELECT DISTINCT rank FROM kernels ORDER BY rank").rows() == [(1,)]
    assert job.sql("SELECT rank FROM ranks").rows() == [(1,)]
    notes = job.sql("SELECT rank, code, message FROM ingest_notes WHERE code = 'rank_conflict'").rows()
    assert len(notes) == 1 and notes[0][0] == 0
    assert str(a[0]) in notes[0][2] and str(b[0]) in notes[0][2]
    summary = job.summary()
    assert any("rank 0 is claimed by 2 traces" in m for m in summary["missing"])
    assert summary["ranks"] == 1


_RACE = """
import sys, time
from nsys2comm.ingest import jobwrite
from nsys2comm.errors import InputError
real = jobwrite._check_rank_collisions
def slow(*a, **k):  # both writers hold their in-memory rows before either commits
    time.sleep(1.0)
    return real(*a, **k)
jobwrite._check_rank_collisions = slow
try:
    jobwrite.write([sys.argv[1]], sys.argv[2], jobs=1)
except InputError as e:
    print(e.line()); sys.exit(1)
"""


@pytest.mark.subprocess
def test_two_writers_racing_for_one_rank_exactly_one_wins(tmp_path):
    import subprocess

    a = write_kineto(syn.make_run(world_size=2, steps=1, seed=1), tmp_path / "a")[0]
    b = write_kineto(syn.make_run(world_size=2, steps=2, seed=2), tmp_path / "b")[0]
    jobwrite.prepare(tmp_path / "job")
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(p), str(tmp_path / "job")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent) for p in (a, b)]
    outs = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _o, _e in outs) == [0, 1], outs
    loser = next(o for rc, o, _e in outs if rc == 1)
    assert "rank 0 is" in loser and len(loser.strip().splitlines()) == 1
    winner = a if outs[0][0] == 0 else b
    assert str(winner) in loser
    job = Job.open(tmp_path / "job")
    assert job.sql("SELECT count(*) FROM files").item() == 1
    assert job.sql("SELECT count(*) FROM ingest_notes WHERE code = 'rank_conflict'").item() == 0


_KILL_AT_THIRD_RENAME = """
import os, signal, sys
real, n = os.replace, [0]
def replace(a, b):
    n[0] += 1
    if n[0] == 3:  # two parts renamed, the third written but not renamed, no files part (commit)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(a, b)
os.replace = replace
from nsys2comm.ingest.jobwrite import write
write(sys.argv[1:-1], sys.argv[-1], jobs=1)
"""


def test_a_killed_writer_leaves_nothing_visible_and_the_next_ingest_completes(jobs_base, tmp_path):
    job = ju.build("kineto6", jobs_base)
    out = tmp_path / "job"
    jobwrite.prepare(out)  # the marker first, so the kill lands among the parts
    p = ju.subprocess.run([sys.executable, "-c", _KILL_AT_THIRD_RENAME, str(job["traces"][0]), str(out)], cwd=ju.ROOT,
                          env=dict(ju.os.environ, PYTHONPATH=str(ju.ROOT)), capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert len(list(out.rglob("part-*.parquet"))) == 2 and len(list(out.rglob(".*.tmp"))) == 1
    with Job.open(out) as j:  # the two renamed parts are not committed: invisible
        assert j.sql("SELECT (SELECT count(*) FROM ranks) + (SELECT count(*) FROM kernels) AS n")["n"][0] == 0
    res = jobwrite.write(job["traces"], out, jobs=1)
    assert [r.status for r in res] == ["ingested"] * len(job["traces"])
    assert not list(out.rglob(".*.tmp"))  # the dead writer's temp file is gone
    with Job.open(out) as j:
        ju.assert_same(job["want"], ju.frames(j.con))


def test_commands_read_a_job_directory(jobs_base, tmp_path):
    job = ju.build("example8", jobs_base)
    runner = CliRunner()
    d = str(job["dir"])
    out = {}  # each command runs once (a diff or a report of this job takes seconds); its output is checked below
    for args in (["query", d, "overlap_by_rank", "-f", "csv"], ["sql", d, "SELECT count(*) FROM ranks", "-f", "csv"],
                 ["summary", d, "--json"], ["schema", d, "-f", "csv"], ["diff", str(job["db"]), d, "--json"],
                 ["report", d, "-o", str(tmp_path / "r.html")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args, r.output)
        out[args[0]] = r.stdout
    want = runner.invoke(app, ["query", str(job["db"]), "overlap_by_rank", "-f", "csv"])
    assert out["query"] == want.stdout
    assert '"step_impact_ns": 0' in out["diff"]
    r = runner.invoke(app, ["sql", d, "--write", "SELECT 1"])
    assert r.exit_code == 2 and "read-only" in r.output


def test_ingest_db_with_a_trailing_slash_or_an_existing_directory_writes_a_parquet_job(tmp_path):
    paths = write_kineto(syn.make_run(world_size=2, steps=1), tmp_path / "t")
    runner = CliRunner()
    r = runner.invoke(app, ["ingest", str(paths[0]), "--db", str(tmp_path / "job") + "/"])
    assert r.exit_code == 0, r.output
    assert jobdir.is_job_dir(tmp_path / "job")
    r = runner.invoke(app, ["ingest", *map(str, paths), "--db", str(tmp_path / "job")])
    assert r.exit_code == 0 and "1 ingested, 1 skipped" in r.output, r.output
    r = runner.invoke(app, ["ingest", str(paths[0]), "--out", str(tmp_path / "t")])  # a folder of traces
    assert r.exit_code == 1 and "not an nsys2comm Parquet job" in r.output
    r = runner.invoke(app, ["ingest", str(paths[0])])
    assert r.exit_code == 2 and "--db FILE or --out DIR" in r.output


def test_a_writer_starting_while_another_writes_the_marker_joins_the_job(tmp_path):
    """Epilogues of several nodes start at once: one may find the directory holding only another writer's temp
    marker (written, not yet renamed into place). That is a job being created, not a foreign directory; a
    directory with anything else and no marker is still refused."""
    out = tmp_path / "job"
    out.mkdir()
    other = out / f".{jobdir.MARKER}.otherhost.4242.tmp"
    other.write_text(jobdir.marker_text())
    jobwrite.prepare(out)
    assert jobdir.is_job_dir(out)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / f".{jobdir.MARKER}.otherhost.4242.tmp").write_text(jobdir.marker_text())
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not an nsys2comm Parquet job"):
        jobwrite.prepare(foreign)
