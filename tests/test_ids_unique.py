"""Ids are unique by construction, not by declared keys (queries/prelude/schema.sql says why): every id column
holds no duplicate and no NULL after ingesting every real trace in ../shared, the bundled example and synthetic
runs of both sources, and comm_ops holds at most one row per kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import synthetic as syn
from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import write_nsys
from nsys2comm import Job

ROOT = Path(__file__).resolve().parents[1]
IDS = {"kernels": "kernel_id", "mem_ops": "memop_id", "cpu_ranges": "range_id", "api_calls": "call_id",
       "comm_ops": "kernel_id"}


def _assert_unique(db: Path) -> None:
    with Job.open(db) as job:
        for table, col in IDS.items():
            rows, distinct, nulls = job.con.execute(
                f"SELECT count(*), count(DISTINCT {col}), count(*) - count({col}) FROM {table}").fetchall()[0]
            assert (distinct, nulls) == (rows, 0), (db.name, table, rows, distinct, nulls)
        orphans = job.con.execute("SELECT count(*) FROM comm_ops WHERE kernel_id NOT IN "
                                  "(SELECT kernel_id FROM kernels)").fetchall()[0][0]
        assert orphans == 0, db.name


def _real_jobs(traces: Path) -> list[list[Path]]:
    """Each nsys export alone, each Kineto directory as one job."""
    jobs = [[p] for p in sorted((traces / "nsys").glob("*.sqlite"))]
    jobs += [sorted(d.glob("*.json*")) for d in sorted((traces / "kineto").iterdir()) if d.is_dir()]
    return jobs


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_real_traces(shared_traces, tmp_path):
    jobs = _real_jobs(shared_traces)
    assert len(jobs) >= 8 and all(jobs)
    for i, paths in enumerate(jobs):
        db = tmp_path / f"real{i}.duckdb"
        job = Job.ingest(paths, db=db, jobs=2)
        assert [r.status for r in job.results] == ["ingested"] * len(paths), paths
        job.close()
        _assert_unique(db)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("source", ["kineto", "nsys", "example"])
def test_synthetic_and_bundled(source, tmp_path):
    run = syn.make_run(world_size=4, steps=2)
    if source == "kineto":
        paths = write_kineto(run, tmp_path)
    elif source == "nsys":
        paths = [write_nsys(run, tmp_path / "run.sqlite")]
    else:
        paths = sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))
    db = tmp_path / "job.duckdb"
    Job.ingest(paths, db=db, jobs=1).close()
    _assert_unique(db)
