"""The Python API through the results layer and the one chart registry (issue 40 items 1 and 5): ``Job.query`` runs
on the results layer's runner and raises what the query raised; ``Job.chart`` draws every chart of the report from
the registry entry the report uses (``report.sections.CHARTS``), with the page's data, parameters and reasons."""

from __future__ import annotations

import pytest
from test_report import fill_job

from fixtures.synthetic import make_run
from nsys2comm import analysis
from nsys2comm.api import Job
from nsys2comm.errors import InputError, UnknownQuery, UsageError
from nsys2comm.report import html, sections
from nsys2comm.storage import connect

# the names the former api.CHARTS took (catalog query -> chart): each still finds the same draw function
FORMER_CHARTS = {
    "time_breakdown_by_rank": "time_breakdown_chart", "overlap_by_rank": "overlap_by_rank_chart",
    "comm_overlap_by_collective": "overlap_by_collective_chart", "msg_size_histogram": "msg_size_histogram_chart",
    "collective_bandwidth": "busbw_chart", "p2p_latency_by_size": "p2p_latency_chart",
    "collective_skew": "skew_heatmap_chart", "rank_wait": "straggler_chart", "step_timeline": "step_timeline_chart",
}


@pytest.fixture(scope="module")
def job():
    with Job(fill_job(connect(None), make_run(world_size=4, steps=3))) as j:
        yield j


@pytest.fixture(scope="module")
def changes(job):
    return job.diff(job)  # the rows "What changed" draws (against itself: every delta 0)


@pytest.fixture(scope="module")
def page(job, changes):
    """The report's blocks of ``job``, by chart id, "What changed" included."""
    _, secs, _, _ = html.collect(job.con)
    blocks = {b.id: b for s in secs for b in s.blocks}
    blocks.update({b.id: b for b in html.changes_section(changes).blocks})
    return blocks


# tier 3: every chart the page draws, Job.chart draws from the same entry with the same data (a synthetic job)
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("cid", sorted(sections.CHARTS))
def test_job_chart_is_the_report_chart(job, page, changes, cid):
    kw = {"baseline": changes} if cid in sections.CHANGES_CHARTS else {}
    if cid not in page:  # a notebook chart the page leaves out: drawn by its registry entry
        assert cid in {c.id for c in sections.NOTEBOOK_CHARTS}
        assert job.chart(cid, **kw).to_dict()
        return
    block = page[cid]
    if block.chart is None:  # not available on the page: the same one-line reason
        with pytest.raises(InputError, match="is not available: ") as e:
            job.chart(cid, **kw)
        assert str(e.value).endswith(block.missing)
        return
    got = job.chart(cid.removeprefix("chart-"), **kw).to_dict()
    got.pop("$schema", None)
    assert got == block.spec()


# tier 1: the one registry: every chart of the page, found by its id or its former api.CHARTS name
def test_the_registry_holds_every_chart_of_the_page_once():
    page = [b.id for s in (*sections.SECTIONS, sections.CHANGES_SECTION) for b in s.blocks
            if isinstance(b, sections.ChartSpec)]
    assert len(page) == len(set(page)) and set(page) <= set(sections.CHARTS)
    for cid, spec in sections.CHARTS.items():
        assert sections.find_chart(cid) is spec and sections.find_chart(cid.removeprefix("chart-")) is spec
    # an alias names one chart only (find_chart would otherwise pick one silently)
    seen: dict[str, str] = {}
    for cid, spec in sections.CHARTS.items():
        fn = spec.draw.__name__
        for alias in {cid, cid.removeprefix("chart-"), spec.inputs[0], fn, fn.removesuffix("_chart")}:
            assert seen.setdefault(alias, cid) == cid, f"{alias!r} names {seen[alias]} and {cid}"
    queries = {q.name for q in (*sections.QUERIES, *sections.NOTEBOOK_QUERIES)}
    for spec in sections.NOTEBOOK_CHARTS:  # what the page's contract test checks of its own charts
        assert set(spec.inputs) <= queries and set(spec.inputs) <= set(spec.draw.consumes), spec.id
    for name, fn in FORMER_CHARTS.items():
        assert sections.find_chart(name).draw.__name__ == fn, name
    import nsys2comm.api as api

    assert not hasattr(api, "CHARTS")  # one registry


# tier 3: a name, parameter or value the chart cannot take is a UsageError before any query runs
def test_chart_usage_errors(job):
    with pytest.raises(UsageError, match="no chart named 'nope'"):
        job.chart("nope")
    with pytest.raises(UsageError, match="has no parameter bogus"):
        job.chart("overlap-rank", bogus=1)
    with pytest.raises(UsageError, match="max_segments"):
        job.chart("timeline", max_segments="many")
    with pytest.raises(UsageError, match="baseline"):
        job.chart("changes-rank")
    with pytest.raises(UsageError, match="takes no parameters"):
        job.chart("changes-rank", baseline=job, max_ranks=2)


# tier 3: parameters reach the chart's query; without them the timeline's step is the report's choice
def test_chart_parameters_reach_its_query(job, page):
    def ranks(spec: dict) -> set:
        return {row["rank"] for rows in spec["datasets"].values() for row in rows}

    assert ranks(page["chart-timeline"].spec()) == {0, 1, 2, 3}
    assert ranks(job.chart("step_timeline", max_ranks=2).to_dict()) == {0, 1}
    assert page["chart-timeline"].spec()["title"]["text"].startswith("Timeline of step 101")  # the median step
    assert job.chart("timeline", step=100).to_dict()["title"]["text"].startswith("Timeline of step 100")


# tier 3: Job.query runs on the results layer's runner: the catalog's rows, and the query's own exceptions
def test_query_is_the_catalog_rows_and_raises_the_query_error(job):
    assert job.query("overlap_by_rank").equals(analysis.run_query(job.con, "overlap_by_rank"))
    with pytest.raises(UnknownQuery):
        job.query("overlap_by_rnk")
    with pytest.raises(UsageError, match="no parameter nope"):
        job.query("overlap_by_rank", nope=1)
