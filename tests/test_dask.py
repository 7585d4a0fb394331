"""The per-rank stage on Dask distributed (a local cluster of 2 worker processes): every public catalog query equals
the DuckDB file's, the gathered per-rank sweeps equal the whole-job ones, and the options fail in one line where
Dask cannot run. CI installs the extra (.ci/run), so none of this is skipped there."""

from __future__ import annotations

import builtins
import sys
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import jobs_util as ju

from nsys2comm import Job
from nsys2comm.cli import app
from nsys2comm.errors import UsageError
from nsys2comm.storage import dask_stage as distributed
from nsys2comm.storage import jobdir
from nsys2comm.storage import sweeps as cache

if not ju.os.environ.get("CI"):
    pytest.importorskip("distributed")  # outside CI only: CI installs the extra, and there these must run

# tier: subprocess (every test here starts nsys2comm or Python processes)
pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def client():
    with distributed.client(local_workers=2) as c:
        yield c


@pytest.fixture(scope="session")
def jobs_base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("jobs")


# multihost8 (two hosts' clocks, p2p, every collective): the per-rank stage reads canonical Parquet parts whatever
# format they came from, every directory is held to its DuckDB file in test_jobdir, and the per-rank sweeps of the
# real example job equal its whole-job sweeps (the test below), so the same SQL gives the same rows there too
@pytest.mark.parametrize("name", ["multihost8"])
def test_every_query_equals_the_duckdb_file(name, jobs_base, client):
    job = ju.build(name, jobs_base)
    with Job.open(job["dir"], scheduler=client) as j:
        assert j.stages["ranks"] == len(job["traces"])
        views = dict(j.con.execute("SELECT view_name, sql FROM duckdb_views() WHERE temporary").fetchall())
        for view in cache.SWEEPS:  # the helpers read the gathered tables
            assert cache.session_table(view) in views[view]
        ju.assert_same(job["want"], ju.frames(j.con))


def test_per_rank_sweeps_equal_the_whole_job_sweeps(jobs_base, client):
    """The views run per rank on Dask really depend on one rank's rows only (multihost8: clocks of two hosts;
    example8: the real job, with GEMMs); each view has rows in at least one of the jobs."""
    had_rows = set()
    for name in ("multihost8", "example8"):
        job = ju.build(name, jobs_base)
        live = jobdir.connect(job["dir"])
        with Job.open(job["dir"], scheduler=client) as j:
            for view in distributed.PER_RANK:
                got = j.con.sql(f"SELECT * FROM {cache.session_table(view)}").pl()
                want = live.sql(f"SELECT * FROM {view}").pl()
                assert got.sort(got.columns).equals(want.sort(want.columns)), (name, view)
                if got.height:
                    had_rows.add(view)
    assert had_rows == set(distributed.PER_RANK)


def test_cli_query_on_a_local_cluster(jobs_base):
    job = ju.build("kineto6", jobs_base)
    r = CliRunner().invoke(app, ["query", str(job["dir"]), "rank_wait", "-f", "csv", "--dask-local", "2"])
    assert r.exit_code == 0, r.output
    want = job["want"]["rank_wait"]
    assert pl.read_csv(r.stdout.encode()).height == want.height


def test_dask_needs_a_job_directory(jobs_base):
    job = ju.build("kineto6", jobs_base)
    with pytest.raises(UsageError, match="Dask runs on a Parquet job directory"):
        Job.open(job["db"], dask_local=2)
    r = CliRunner().invoke(app, ["summary", str(job["db"]), "--dask-local", "2"])
    assert r.exit_code == 2 and "ingest TRACES --out DIR" in r.output


def test_without_dask_the_option_says_how_to_install_it(jobs_base, monkeypatch):
    job = ju.build("kineto6", jobs_base)
    real = builtins.__import__

    def no_dask(name, *a, **kw):
        if name == "distributed" or name.startswith("distributed."):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    r = CliRunner().invoke(app, ["query", str(job["dir"]), "overlap_by_rank", "--dask-local", "2"])
    assert r.exit_code == 2, r.output
    assert "Error:" in r.output and "pip install 'nsys2comm[dask]'" in r.output
    assert len(r.output.strip().splitlines()) == 1
