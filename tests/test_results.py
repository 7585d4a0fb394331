"""The results layer (nsys2comm.results, issue 40 item 1): one batch runner for summary, diff and report, columns
narrowed to what each consumer declares, failures in one format, "not available" reasons from the diagnostics;
and the same figure from summary, diff and report on the same job.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from synth_db import catalog_db
from test_report import fill_job

from fixtures.synthetic import make_run
from nsys2comm import catalog, compare, results, summary
from nsys2comm.api import Job
from nsys2comm.db import connect
from nsys2comm.report import findings, html
from nsys2comm.report.data import CONSUMERS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_FILES = sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))


@pytest.fixture(scope="module")
def synth():
    return fill_job(connect(None), make_run(world_size=4, steps=3))


# tier 3: the runner on a synthetic job
def test_batch_narrows_to_declared_columns_and_records_failures_in_one_format(synth):
    got = results.run_batch(synth, ["overlap_by_rank", results.Request("no_such_query"), "overlap_worst_rank"],
                            {"overlap_by_rank": ("rank", "exposed_comm_ns")})
    assert got.frames["overlap_by_rank"].columns == ["rank", "exposed_comm_ns"]
    assert "busy_ns" in got.frames["overlap_worst_rank"].columns  # undeclared object: whole frame
    assert got.errors["no_such_query"].startswith("analysis 'no_such_query' failed: ")
    assert got.why("no_such_query") == got.errors["no_such_query"].removeprefix("analysis 'no_such_query' failed: ")
    assert "\n" not in got.errors["no_such_query"]
    got.drop("overlap_by_rank", "why")
    assert got.errors["overlap_by_rank"] == "not available: why" and got.why("overlap_by_rank") == "why"


# tier 2: not-available facts come from the diagnostics' job-wide codes, on canonical tables built here
def test_gaps_come_from_diagnostics():
    con = catalog_db()
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source, format_version, producer, host, "
                "clock_rule, clock_offset_ns, ingested_at) VALUES (1, 'a', '0', 1, 'kineto', '1', 'x', 'h', 'x', 0, "
                "now()::TIMESTAMP)")
    con.execute("INSERT INTO ranks VALUES (0, 1, 1, 'h', 1, 'x')")
    got = results.run_batch(con, ["diagnostics"], {"diagnostics": results.GAP_COLUMNS})
    assert results.gap(got, "comm") == results.GAPS["comm"][1]  # no kernels at all: no communication either
    assert results.gap(got, "two_ranks") == results.GAPS["two_ranks"][1]
    assert results.gap(results.Results(), "comm") is None  # diagnostics not run: no claim


def _consumers() -> dict[str, dict[str, tuple[str, ...]]]:
    return {"summary": dict(summary.COLUMNS), "diff": dict(compare.COLUMNS), **CONSUMERS}


# tier 1: every consumer (summary, diff, report, findings) names public, documented columns only
@pytest.mark.parametrize("consumer", sorted(_consumers()))
def test_every_consumer_reads_public_documented_columns(consumer):
    for name, cols in _consumers()[consumer].items():
        obj = catalog.find(name)
        assert obj is not None and obj.public and not name.startswith("_"), f"{consumer} reads {name!r}"
        assert set(cols) <= set(obj.columns), f"{consumer} reads {name}.{sorted(set(cols) - set(obj.columns))}"


# tier 3: consumers run on frames narrowed to their declarations, so an undeclared read fails here
def test_consumers_run_on_narrowed_frames(synth):
    s = summary.build_summary(synth)
    assert not [m for m in s["missing"] if "failed" in m]
    fetched, _, found, _ = html.collect(synth)
    assert not [k for k, v in fetched.errors.items() if "failed" in v]
    assert not [f.text for f in found if "could not be computed" in f.text]
    assert findings.FINDINGS  # findings ran through all_findings above
    c = compare.compare(synth, synth)
    assert not [m for m in c.missing if "failed" in m]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    db = tmp_path_factory.mktemp("results") / "ex.duckdb"
    job = Job.ingest(EXAMPLE_FILES, db=db, jobs=1)
    yield job.con
    job.close()


# tier 4 (bundled example): summary, diff and report give the same figure for the same metric
@pytest.mark.slow
def test_summary_diff_and_report_agree(example):
    s = summary.build_summary(example)
    c = compare.compare(example, example)
    fetched, _, _, _ = html.collect(example)
    job = {r["metric"]: r["base"] for r in c.rows.filter(pl.col("section") == "job").iter_rows(named=True)}
    # max start skew: summary (ms), diff (ns), report's collective_skew frame (ns)
    report_skew = fetched.frames["collective_skew"]["start_skew_ns"].max()
    assert s["max_skew_ms"] * 1e6 == pytest.approx(job["max_start_skew_ns"]) == pytest.approx(report_skew)
    # exposed communication: one capture step, so the diff's per-step figure is the job total
    assert c.base["steps"] == 1
    report_exposed = fetched.frames["overlap_by_rank"]["exposed_comm_ns"].sum()
    assert s["exposed_comm_ns"] == pytest.approx(job["exposed_comm_ns_per_step"]) == pytest.approx(report_exposed)
    pct = 100 * job["exposed_comm_ns_per_step"] / job["busy_ns_per_step"]
    assert s["exposed_comm_pct"] == pytest.approx(pct, rel=1e-5)
    # the worst rank: summary and the report's overlap_worst_rank frame (the catalog's one rule)
    w = fetched.frames["overlap_worst_rank"].row(0, named=True)
    assert (s["worst_rank"], s["worst_rank_exposed_comm_pct"]) == (w["rank"], pytest.approx(w["exposed_busy_pct"]))
    # bus bandwidth of the worst collective's bucket: summary's headline figure is the report's
    wc = s["worst_collective"]
    bw = fetched.frames["collective_bandwidth"].filter(
        (pl.col("collective") == wc["collective"]) & (pl.col("bucket_lo_bytes") == wc["msg_bytes"])
        & (pl.col("group_size") == wc["group_size"]))
    assert wc["busbw_gbps"] == pytest.approx(bw["headline_busbw_gbps"][0], rel=1e-5)
    # diff X X: no change anywhere
    assert c.headline["exposed_comm_change_pct"] == 0
