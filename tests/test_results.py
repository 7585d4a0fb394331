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
from nsys2comm.report import findings, html, sections
from nsys2comm.report.data import CONSUMERS
from nsys2comm.storage.db import connect

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


def _job_columns() -> dict[str, tuple[str, ...]]:
    """What Job reads of the catalog itself: the frames Job.chart hands to the registry's draw functions (its
    summary, report and diff are those consumers'; Job.query hands the caller a whole documented object)."""
    out: dict[str, tuple[str, ...]] = {}
    for spec in sections.CHARTS.values():
        for name, cols in (spec.draw.consumes.items() if spec.id not in sections.CHANGES_CHARTS else ()):
            out[name] = tuple(dict.fromkeys((*out.get(name, ()), *cols)))
    return out


def _consumers() -> dict[str, dict[str, tuple[str, ...]]]:
    return {"summary": dict(summary.COLUMNS), "diff": dict(compare.COLUMNS), "job": _job_columns(), **CONSUMERS}


# tier 1: every consumer (summary, diff, report, findings, Job) names public, documented columns only
@pytest.mark.parametrize("consumer", sorted(_consumers()))
def test_every_consumer_reads_public_documented_columns(consumer):
    for name, cols in _consumers()[consumer].items():
        obj = catalog.find(name)
        assert obj is not None and obj.public and not name.startswith("_"), f"{consumer} reads {name!r}"
        assert set(cols) <= set(obj.columns), f"{consumer} reads {name}.{sorted(set(cols) - set(obj.columns))}"


# tier 1: Job reads the catalog only through the consumers and the results layer: no column of its own, no query
# run outside results.run_one, no chart outside the report's registry
def test_job_reads_through_the_results_layer():
    import ast

    import nsys2comm.api as api

    src = Path(api.__file__).read_text(encoding="utf-8")
    tree = ast.parse(src)
    imported = {(n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "analysis" not in imported and "report.charts" not in imported, imported
    reads = [ast.unparse(n) for n in ast.walk(tree)
             if (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str))
             or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr in ("col", "select", "filter", "with_columns", "group_by", "get_column"))]
    assert not reads, f"api.py reads columns itself: {reads}"
    assert "run_one(" in src and "sections.find_chart(" in src and "html.chart_block(" in src


@pytest.fixture(scope="module")
def views(synth):
    """The synthetic job as summary, report (collect), diff (against itself) and Job see it."""
    return (summary.build_summary(synth), html.collect(synth), compare.compare(synth, synth), Job(synth))


# tier 3: consumers run on frames narrowed to their declarations, so an undeclared read fails here
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_consumers_run_on_narrowed_frames(views):
    s, (fetched, _, found, _), c, _ = views
    assert not [m for m in s["missing"] if "failed" in m]
    assert not [k for k, v in fetched.errors.items() if "failed" in v]
    assert not [f.text for f in found if "could not be computed" in f.text]
    assert findings.FINDINGS  # findings ran through all_findings above
    assert not [m for m in c.missing if "failed" in m]


# tier 3: summary, diff, report and Job give the same figure for the same metric on a synthetic job
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_summary_diff_report_and_job_agree_on_a_synthetic_job(views):
    s, (fetched, secs, _, _), c, job = views
    diff_job = {r["metric"]: r["base"] for r in c.rows.filter(pl.col("section") == "job").iter_rows(named=True)}
    skew_ns = fetched.frames["collective_skew"]["start_skew_ns"].max()
    assert skew_ns > 0
    assert (s["max_skew_ms"] * 1e6 == pytest.approx(diff_job["max_start_skew_ns"]) == pytest.approx(skew_ns)
            == pytest.approx(job.query("collective_skew")["start_skew_ns"].max())
            == pytest.approx(job.summary()["max_skew_ms"] * 1e6))
    exposed = fetched.frames["overlap_by_rank"]["exposed_comm_ns"].sum()
    assert exposed > 0 and s["exposed_comm_ns"] == exposed == job.query("overlap_by_rank")["exposed_comm_ns"].sum()
    assert diff_job["exposed_comm_ns_per_step"] == pytest.approx(exposed / c.base["steps"])
    w = fetched.frames["overlap_worst_rank"].row(0, named=True)
    jw = job.query("overlap_worst_rank").row(0, named=True)
    assert s["worst_rank"] == w["rank"] == jw["rank"]
    assert s["worst_rank_exposed_comm_pct"] == pytest.approx(w["exposed_busy_pct"]) == pytest.approx(
        jw["exposed_busy_pct"])
    # the figures a chart shows are the report's: Job.chart draws the page's spec from the same frames
    block = next(b for sec in secs for b in sec.blocks if b.id == "chart-overlap-rank")
    got = job.chart("overlap_by_rank").to_dict()
    got.pop("$schema", None)
    assert got == block.spec()


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    db = tmp_path_factory.mktemp("results") / "ex.duckdb"
    job = Job.ingest(EXAMPLE_FILES, db=db, jobs=1)
    yield job.con
    job.close()


# tier 4 (bundled example): summary, diff, report and Job give the same figure for the same metric
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
    job_api = Job(example)  # the same connection through the Python API (the fixture closes it)
    assert job_api.summary()["max_skew_ms"] == s["max_skew_ms"]
    assert job_api.query("overlap_worst_rank").row(0, named=True)["rank"] == w["rank"]
    # bus bandwidth of the worst collective's bucket: summary's headline figure is the report's
    wc = s["worst_collective"]
    bw = fetched.frames["collective_bandwidth"].filter(
        (pl.col("collective") == wc["collective"]) & (pl.col("bucket_lo_bytes") == wc["msg_bytes"])
        & (pl.col("group_size") == wc["group_size"]))
    assert wc["busbw_gbps"] == pytest.approx(bw["headline_busbw_gbps"][0], rel=1e-5)
    # diff X X: no change anywhere
    assert c.headline["exposed_comm_change_pct"] == 0
