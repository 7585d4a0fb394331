"""Many small files: written in batches (one transaction, one INSERT per table and one finalize per batch), with
the rows a file-by-file ingest gives; a bad file fails alone and the good files of its batch commit. The rate is
measured by tests/benchmarks/many_files.py, never here."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

import nsys2comm.ingest as ingest_mod
from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm import catalog
from nsys2comm.ingest import ingest
from nsys2comm.storage import db
from tests.benchmarks.many_files import write_one_kernel_traces

# every canonical table, compared whole (ingested_at is the clock at the commit)
_TABLES = [o.name for o in catalog.load_catalog() if o.kind == "table"]


def _rows(path: Path) -> dict[str, list]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        out = {}
        for t in _TABLES:
            cols = [r[0] for r in con.execute(f"DESCRIBE {t}").fetchall() if r[0] != "ingested_at"]
            out[t] = con.execute(f"SELECT {', '.join(cols)} FROM {t} ORDER BY ALL").fetchall()
        return out
    finally:
        con.close()


def _ingest(paths, dbfile: Path, **kw):
    con = db.connect(dbfile, write=True)
    try:
        return ingest(con, paths, **kw)
    finally:
        con.close()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> list[Path]:
    """Files with communication (finalize file by file) and one-kernel files (finalized together), with
    baseTimeNanoseconds offsets."""
    d = tmp_path_factory.mktemp("mixed")
    comm = write_kineto(make_run(world_size=4, steps=2), d / "comm")
    small = write_one_kernel_traces(d / "small", 12, start_rank=10, world_size=32)
    return [comm[0], *small[:6], comm[1], *small[6:], comm[2], comm[3]]


# tier 3: generated traces; the batched ingest against the same files one transaction each
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_batches_store_the_rows_of_a_file_by_file_ingest(mixed, tmp_path, monkeypatch):
    res = _ingest(mixed, tmp_path / "batched.duckdb", jobs=1)
    assert [r.status for r in res] == ["ingested"] * len(mixed)
    assert [r.file_id for r in res] == list(range(1, len(mixed) + 1))
    monkeypatch.setattr(ingest_mod, "BATCH_FILES", 1)
    res1 = _ingest(mixed, tmp_path / "each.duckdb", jobs=1)
    assert [(r.file_id, r.ranks) for r in res1] == [(r.file_id, r.ranks) for r in res]
    batched, each = _rows(tmp_path / "batched.duckdb"), _rows(tmp_path / "each.duckdb")
    assert batched["comm_ops"] and batched["kernels"]  # the comparison compares something
    for t in _TABLES:
        assert batched[t] == each[t], t


# tier 3: a bad file inside a batch
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_a_bad_file_fails_alone_and_its_batch_commits(tmp_path):
    paths = write_one_kernel_traces(tmp_path / "t", 8)
    (tmp_path / "t" / "rank00003.pt.trace.json").write_text('{"traceEvents": [')  # cut short: fails to decode
    doc = json.loads(paths[5].read_text())
    doc["distributedInfo"]["rank"] = 1  # claims rank 1 again: the batch fails at its insert, retried one by one
    doc["traceEvents"][0]["ts"] += 1  # another file, not a copy
    paths[5].write_text(json.dumps(doc))
    res = _ingest([tmp_path / "t"], tmp_path / "job.duckdb", jobs=1, keep_going=True)
    by = {Path(r.path).name: r for r in res}
    assert by["rank00003.pt.trace.json"].status == "failed"
    assert "truncated" in by["rank00003.pt.trace.json"].message
    assert by["rank00005.pt.trace.json"].status == "failed"
    assert "rank 1 is already in this job database" in by["rank00005.pt.trace.json"].message
    assert sorted(r.ranks[0] for r in res if r.status == "ingested") == [0, 1, 2, 4, 6, 7]
    rows = _rows(tmp_path / "job.duckdb")
    assert len(rows["files"]) == len(rows["kernels"]) == len(rows["ranks"]) == 6


# tier 3: many generated files through the pool, both targets; counts exact (the rate: tests/benchmarks)
@pytest.mark.slow
@pytest.mark.subprocess
def test_300_one_kernel_traces_all_arrive(tmp_path, cli_process):
    write_one_kernel_traces(tmp_path / "t", 300)
    r = cli_process("ingest", str(tmp_path / "t"), "--db", str(tmp_path / "job.duckdb"), "--quiet", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    con = duckdb.connect(str(tmp_path / "job.duckdb"), read_only=True)
    counts = con.execute("SELECT (SELECT count(*) FROM files), (SELECT count(DISTINCT rank) FROM ranks), "
                         "(SELECT count(*) FROM kernels), (SELECT count(*) FROM api_calls), "
                         "(SELECT count(DISTINCT rank) FROM kernels), (SELECT min(rank) FROM kernels), "
                         "(SELECT max(rank) FROM kernels)").fetchone()
    con.close()
    assert counts == (300, 300, 300, 300, 300, 0, 299)
    r = cli_process("ingest", str(tmp_path / "t"), "--out", str(tmp_path / "dir"), "--quiet", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    r = cli_process("sql", str(tmp_path / "dir"), "SELECT count(*) AS n, count(DISTINCT rank) AS r FROM kernels",
                    "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "300,300"


def test_the_pipeline_databases_are_named_as_spools():
    from nsys2comm.ingest import base
    from nsys2comm.storage import sweeps as cache

    # tier 1: jobwrite's pipeline database lives in a spool directory; cache skips its content-key record by name
    assert cache._SPOOL_PREFIX == base.SPOOL_PREFIX


# tier 3: a full disk while a batch of files is renamed into a job directory
def test_a_full_disk_in_a_batch_keeps_the_committed_files_and_leaves_no_half_part(tmp_path, monkeypatch):
    import errno

    from typer.testing import CliRunner

    from nsys2comm.cli import app
    from nsys2comm.ingest import jobwrite
    from nsys2comm.storage import jobdir

    write_one_kernel_traces(tmp_path / "t", 6)
    real, n = jobwrite._publish, [0]

    def publish(src, final):
        n[0] += 1
        if n[0] == 27:  # 5 tables x 6 files: the data parts are in place, two files committed (the files part last)
            raise OSError(errno.ENOSPC, "No space left on device", str(final))
        return real(src, final)

    monkeypatch.setattr(jobwrite, "_publish", publish)
    out = tmp_path / "job"
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "t"), "--out", str(out), "--keep-going", "-j", "1"])
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert sum(ln.startswith("ingested") for ln in lines) == 2 and "2 ingested, 0 skipped, 4 failed" in res.output
    assert sum("the disk is full" in ln for ln in lines if ln.startswith("failed")) == 4
    commits = sorted(p.name for p in (out / jobdir.COMMIT_TABLE).glob("rank=*/part-*.parquet"))
    parts = {p.name for p in out.glob("*/rank=*/part-*.parquet")}
    assert len(commits) == 2 and parts == set(commits)  # the failed files' parts are gone
    assert not list(out.rglob(".*.tmp"))
    monkeypatch.setattr(jobwrite, "_publish", real)
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "t"), "--out", str(out), "-j", "1"])
    assert res.exit_code == 0 and "4 ingested, 2 skipped, 0 failed" in res.output, res.output
