"""The report's "Why ranks arrive late" section, the per-iteration trend, ``report --step N``, one banner for what the
whole job lacks, and the polish of issue 41 item 6 (issues 38 item 5, 41 items 3, 5, 6).

Tier 3: job databases built by code (tests/synth_db.py, fixtures/synthetic.py through test_report.fill_job, the
two-rank lateness jobs of test_lateness), reports built from them and checked for structure and figures worked
out in the test; tier 2: the pure functions (step choice, findings, chart data) on hand-made frames. One browser
test renders the compute-only report in headless Chromium.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import test_report
from test_lateness import AR, GEMM, US, Job, _base
from test_report import dump_dom, fill_job

from fixtures.synthetic import make_run
from nsys2comm.analysis import run_query
from nsys2comm.cli import app
from nsys2comm.errors import UsageError
from nsys2comm.report import build_report, charts, findings
from nsys2comm.report import html as page
from nsys2comm.report.sections import choose_step
from nsys2comm.storage.db import connect
from nsys2comm.units import duration, pct


def _specs(html: str) -> dict:
    raw = re.search(r'<script type="application/json" id="report-charts">(.*?)</script>', html, re.S).group(1)
    return json.loads(raw)


def _section(html: str, sid: str) -> str:
    sec = html[html.index(f'id="{sid}"'):]
    return sec[:sec.index("</section>")]


def _host_late(job: Job) -> None:
    """test_lateness's host-late case with CPU ops on the late rank's launching thread: rank 1 runs the same GEMM as
    rank 0, then its host launches all_reduce #2 at 400 µs (starts 405): 135 µs late, host-bound 155 of its 205 µs
    segment; self time: the Python op 106 µs, aten::mm 30 µs."""
    def body(j):
        j.kernel(1, GEMM, 210, 260, 205)
        j.kernel(1, AR, 405, 500, 400, stream=20, collective="all_reduce", seq=2)
        j.cpu(1, "LinearWithGradAccumulationAndAsyncCommunication", 262, 398)
        j.cpu(1, "aten::mm", 270, 300, "cpu_op")
    _base(job, body)


@pytest.fixture(scope="module")
def late_job():
    job = Job()
    _host_late(job)
    return job.con


# ---------------------------------------------------------------------------------------------------------------
# Why ranks arrive late


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_lateness_section_on_a_host_late_rank(late_job, tmp_path):  # tier 3
    _, sections, found, _ = page.collect(late_job)
    sec = next(s for s in sections if s.id == "sec-lateness")
    chart = next(b for b in sec.blocks if b.id == "chart-lateness")
    assert chart.chart is not None, chart.missing
    (rows,) = [v for v in chart.spec()["datasets"].values()]
    got = {(r["who"], r["part"]): round(r["time_ms"] * 1e6) for r in rows}
    host, compute = charts.LATENESS_PARTS["host_bound"][0], charts.LATENESS_PARTS["gpu_compute"][0]
    # one instance is late (#2); #1 (both ranks at 100 µs) is not drawn; parts of 0 ns are not drawn
    assert got == {("late", host): 155 * US, ("late", compute): 50 * US,
                   ("early", host): 20 * US, ("early", compute): 50 * US}
    assert {r["lateness_ms"] for r in rows} == {0.135} and {r["cause"] for r in rows} == {"host"}
    # the host-ops table: summed per rank and op, most self time first
    ops = re.findall(r"<tr><td>1</td><td>([^<]+)</td><td>([^<]+)</td>(?:<td[^>]*>[^<]*</td>){2}"
                     r"<td class=\"num\">([^<]+)</td></tr>", sec.html)
    assert ops[:2] == [("LinearWithGradAccumulationAndAsyncCommunication", "user_annotation", "0.106"),
                       ("aten::mm", "cpu_op", "0.030")]
    (f,) = [f for f in found if f.anchor == "sec-lateness"]
    assert f.text.startswith(f"Rank 1 arrives last at 1 of 2 all_reduce instances, a median {duration(135 * US)} "
                             "after the earliest rank: its GPU is idle with nothing launched")
    assert f"{pct(100 * 155 / 205)} of the gap" in f.text
    assert "top host ops by self time: LinearWithGradAccumulationAndAsyncCommunication (106 µs), aten::mm" in f.text
    assert "straggler" not in f.text  # two instances: rank_wait names no straggler, so neither does the finding
    out = build_report(late_job, tmp_path / "late.html").read_text(encoding="utf-8")
    assert 'id="chart-lateness"' in _section(out, "sec-lateness") and "chart-lateness" in _specs(out)


def _causes(**over) -> pl.DataFrame:
    row = dict(collective="all_reduce", late_rank=0, lateness_ns=2_400_000, late_segment_ns=2_500_000,
               late_gpu_compute_ns=75_000, late_host_bound_ns=2_425_000, late_queued_idle_ns=0, late_earlier_comm_ns=0,
               host_share_ns=2_400_000, gpu_compute_share_ns=0, queued_share_ns=0, earlier_comm_share_ns=0,
               carried_ns=0, primary_cause="host")
    rows = [row | over] * 12 + [row | {"late_rank": 1, "lateness_ns": 1000, "primary_cause": "carried",
                                       "host_share_ns": 0, "carried_ns": 1000}]
    return pl.DataFrame(rows)


def test_lateness_finding_names_a_straggler_only_where_rank_wait_does():  # tier 2
    ops = pl.DataFrame({"late_rank": [0, 0, 0, 1], "op_name": ["b", "a", "b", "z"],
                        "self_ns": [100_000, 150_000, 100_000, 900_000]})
    for straggler in (False, True):
        wait = pl.DataFrame({"rank": [0, 1], "is_straggler": [straggler, False]})
        (f,) = findings.lateness_findings(_causes(), ops, wait)
        assert f.text.startswith("Rank 0 arrives last at 12 of 13 all_reduce instances, a median 2.40 ms after the "
                                 "earliest rank: its GPU is idle with nothing launched (waiting for its host to "
                                 f"launch work) {pct(97.0)} of the gap")
        assert "that accounts for all of its lateness; top host ops by self time: b (200 µs), a (150 µs)" in f.text
        assert ("consistent straggler" in f.text) is straggler
    # queued work: the queued part, and no host ops named
    (f,) = findings.lateness_findings(_causes(primary_cause="queued", late_queued_idle_ns=2_000_000,
                                              queued_share_ns=2_400_000, host_share_ns=0), ops, None)
    assert f"idle although work was launched (queued behind another stream, an event or a copy) {pct(80.0)}" in f.text
    assert "host ops" not in f.text and "straggler" not in f.text
    # nobody late: no finding
    assert findings.lateness_findings(_causes(lateness_ns=0).filter(pl.col("late_rank") == 0), None, None) == []


# ---------------------------------------------------------------------------------------------------------------
# The timeline's step


def _its(source: str, spans: dict[int, list[tuple[int, int]]], agree=None) -> pl.DataFrame:
    """iterations rows: per step (marker number or iteration index), (start, end) per rank."""
    rows = [dict(rank=r, iteration=i, step_no=n if source == "marker" else None, iteration_source=source,
                 start_ns=s, end_ns=e, ranks_agree=agree)
            for i, (n, per_rank) in enumerate(sorted(spans.items())) for r, (s, e) in enumerate(per_rank)]
    return pl.DataFrame(rows)


def test_choose_step():  # tier 2
    marked = _its("marker", {100: [(0, 10), (2, 9)], 101: [(20, 50), (21, 40)], 102: [(60, 80), (61, 78)]})
    q, title, said = choose_step(marked)  # lengths 10, 30, 20: the median-length step is 102
    assert q.params["pick_step"] == 102 and title == "Timeline of step 102"
    assert said.startswith("Shown: step 102, the 3rd of 3 steps the step markers define") and "median-length" in said
    q, title, said = choose_step(marked, 100)
    assert q.params["pick_step"] == 100 and "chosen with --step 100" in said
    with pytest.raises(UsageError, match="no step 7") as e:
        choose_step(marked, 7)
    assert "100–102" in str(e.value.hint)
    detected = _its("detected", {0: [(0, 50), (5, 60)], 1: [(50, 90), (60, 95)], 2: [(90, 200), (95, 210)]}, False)
    q, title, said = choose_step(detected)  # lengths 60, 45, 120: iteration 0
    assert title == "Timeline of iteration 0" and "pick_step" not in q.params
    assert (q.params["window_start_ns"], q.params["window_end_ns"], q.params["window_label"]) == (0, 60, "iteration 0")
    assert "detected from the repeating" in said and "different numbers of iterations" in said
    q, title, _ = choose_step(detected, 2)
    assert (q.params["window_start_ns"], q.params["window_end_ns"]) == (90, 210)
    whole = _its("whole_capture", {0: [(0, 10), (0, 12)]})
    q, title, said = choose_step(whole)
    assert title == "Timeline of the whole capture" and "no step markers" in said and q.params.get("pick_step") is None
    with pytest.raises(UsageError, match="no step markers"):
        choose_step(whole, 1)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_report_step_option(tmp_path):  # tier 3
    con = fill_job(connect(None), make_run(world_size=2, steps=3))
    html = build_report(con, tmp_path / "a.html", step=100).read_text(encoding="utf-8")
    sec = _section(html, "sec-timeline")
    assert "<h2>Timeline of step 100</h2>" in sec and "chosen with --step 100" in sec
    assert _specs(html)["chart-timeline"]["title"]["text"].startswith("Timeline of step 100")
    html = build_report(con, tmp_path / "b.html").read_text(encoding="utf-8")
    assert "the median-length step" in _section(html, "sec-timeline")
    with pytest.raises(UsageError, match="no step 7"):
        build_report(con, tmp_path / "c.html", step=7)
    # without markers: the detected iterations, shown by their window
    con.execute("DELETE FROM cpu_ranges")
    its = run_query(con, "iterations").filter(pl.col("iteration") == 2)
    assert set(its["iteration_source"]) == {"detected"}
    html = build_report(con, tmp_path / "d.html", step=2).read_text(encoding="utf-8")
    assert "<h2>Timeline of iteration 2</h2>" in _section(html, "sec-timeline")
    w0, w1 = its["start_ns"].min(), its["end_ns"].max()
    tl = run_query(con, "step_timeline", {"window_start_ns": w0, "window_end_ns": w1, "window_label": "iteration 2"})
    assert set(tl["step_label"]) == {"iteration 2"}
    assert set(tl["window_duration_ns"]) == {w1 - w0}


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_cli_step_that_does_not_exist(tmp_path):  # tier 3
    db = tmp_path / "job.duckdb"
    con = fill_job(connect(db, write=True), make_run(world_size=2, steps=3))
    con.close()
    r = CliRunner().invoke(app, ["report", str(db), "-o", str(tmp_path / "r.html"), "--step", "7"])
    assert r.exit_code == 2 and "no step 7" in r.output, r.output


# ---------------------------------------------------------------------------------------------------------------
# One banner, then only what is specific


def _compute_only(con):
    con.execute("DELETE FROM kernels WHERE kernel_class = 'communication'")
    con.execute("DELETE FROM comm_ops")
    return con


def _sizeless(con):
    con.execute("UPDATE comm_ops SET msg_bytes = NULL, in_bytes = NULL, out_bytes = NULL, element_count = NULL")
    return con


def _one_rank(con):
    for table in ("kernels", "comm_ops", "mem_ops", "cpu_ranges", "devices", "ranks"):
        con.execute(f"DELETE FROM {table} WHERE rank = 1")
    return con


JOBS = {"compute_only": (_compute_only, "no communication kernels"), "sizeless": (_sizeless, "known message size"),
        "one_rank": (_one_rank, "Only 1 rank in the job")}


@pytest.fixture(scope="module", params=sorted(JOBS))
def lacking(request, tmp_path_factory):
    build, said = JOBS[request.param]
    con = build(fill_job(connect(None), make_run(world_size=2, steps=3)))
    out = build_report(con, tmp_path_factory.mktemp(request.param) / "r.html")
    return request.param, said, con, out


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_one_banner_and_no_repeated_diagnostics(lacking):  # tier 3
    name, said, con, out = lacking
    html = out.read_text(encoding="utf-8")
    assert html.count('class="banner"') == 1
    banner = re.search(r'<div class="banner"[^>]*>(.*?)</div>', html, re.S).group(1)
    assert said in banner and "To add them" in banner
    assert "see also" not in html
    for msg in run_query(con, "diagnostics")["message"]:  # each diagnostic once at most, never per section
        assert html.count(page.esc(msg)) <= 1, msg
    for sec in re.findall(r"<section.*?</section>", html, re.S):  # a reason once per section
        lines = re.findall(r'<p class="missing na">(.*?)</p>', sec, re.S)
        assert len(lines) == len(set(lines)), lines
    if name == "sizeless":
        assert "Not available:</strong> no communication operation has a known message size" in _section(
            html, "sec-msgsize")
        assert "record_shapes=True" in banner  # what would add them, for the job's source (Kineto)


def test_no_empty_chart_frame(lacking):  # tier 3
    name, _, _, out = lacking
    specs = _specs(out.read_text(encoding="utf-8"))
    absent = ({"chart-skew", "chart-straggler", "chart-lateness"} if name == "one_rank"
              else {"chart-msgsize", "chart-busbw"})
    assert specs and not absent & set(specs)
    for cid, spec in specs.items():
        assert not page._drew_nothing(spec), f"{name}: {cid} has no data"


def test_msg_size_histogram_with_null_buckets_draws_no_frame():  # tier 2
    df = pl.DataFrame({"collective": ["all_reduce"], "bucket_lo_bytes": [None], "bucket_hi_bytes": [None],
                       "ops": [4], "total_ns": [1000]}, schema_overrides={"bucket_lo_bytes": pl.Int64,
                                                                          "bucket_hi_bytes": pl.Int64})
    assert page._drew_nothing(charts.msg_size_histogram_chart(df).to_dict())


chromium = test_report.browser  # the Chromium fixture (skips outside CI when none is installed)


@pytest.mark.browser
def test_compute_only_report_in_chromium(tmp_path, chromium):
    browser = chromium
    from test_report import assert_rendered

    con = _compute_only(fill_job(connect(None), make_run(world_size=2, steps=3)))
    out = build_report(con, tmp_path / "nocomm.html")
    dom = dump_dom(browser, out)
    assert assert_rendered(dom) >= 2
    assert len(re.findall(r'<div class="banner"', dom)) == 1
    # every rendered chart drew marks: an <svg> with a path or a symbol inside its plot
    for cid, inner in re.findall(r'<div[^>]*\sid="(chart-[^"]+)"[^>]*data-chart="1"[^>]*>(.*?)</figure>', dom, re.S):
        assert re.search(r'class="mark-(rect|line|symbol|point)', inner), cid


# ---------------------------------------------------------------------------------------------------------------
# Polish (issue 41 item 6)


def test_changes_table_labels_and_impact_once_per_subject():  # tier 2
    rows = pl.DataFrame({
        "section": ["job", "job", "rank"], "metric": ["exposed_comm_ns_per_step", "idle_ns_per_step",
                                                      "exposed_comm_ns_per_step"],
        "key": [None, None, "0"], "base": [2e6, 1e6, 1e6], "new": [3e6, 1.5e6, 1.2e6], "delta": [1e6, 5e5, 2e5],
        "delta_pct": [50.0, 50.0, 20.0], "impact_ns": [1.5e6, 1.5e6, 2e5]})
    top = page.changes_frames(rows).frames["diff_top"]
    assert top["metric_text"].to_list() == ["exposed comm per step", "idle per step", "exposed comm per step"]
    assert top["impact_text"].to_list() == [f"+{duration(1.5e6)}", "as above", f"+{duration(2e5)}"]
    # impacts of their own (per metric) are each said; an unknown one is no impact
    top = page.changes_frames(rows.with_columns(pl.Series("impact_ns", [1.5e6, 5e5, None]))).frames["diff_top"]
    assert top["impact_text"].to_list() == [f"+{duration(1.5e6)}", f"+{duration(5e5)}", None]
    html = page.table(top, page.CHANGES_SECTION.blocks[-1].columns)
    assert "_ns_per_step</td>" not in html and "exposed comm per step</td>" in html


def test_producers_are_tools_and_markers_are_not():  # tier 2
    files = pl.DataFrame({"source": ["kineto", "nsys"], "format_version": ["1.0", "3"],
                          "producer": ["integer ts, baseTimeNanoseconds", "2026.2.1.210"],
                          "comm_library_version": [None, "NCCL 2.21.5"]})
    ov = pl.DataFrame({"rank": [0], "n_gpus": [1], "gpu_models": ["H100"], "first_ns": [0], "last_ns": [10],
                       "n_kernels": [3], "n_comm_kernels": [1], "host": ["h"], "gpus": ["H100 (0)"],
                       "source": ["kineto"], "n_mem_ops": [0], "span_ns": [10], "file_path": ["/t.json"]})
    html = page.overview(page.Fetched({"run_overview": ov, "report_files": files}), [])
    kv = dict(re.findall(r"<dt>([^<]+)</dt><dd>([^<]*)</dd>", html))
    assert kv["Producers"] == "Nsight Systems 2026.2.1.210; PyTorch profiler (Kineto)"
    assert kv["Format markers"] == "baseTimeNanoseconds, integer ts"
    assert kv["Communication library"] == "NCCL 2.21.5"


def test_charts_use_the_page_width_and_names_do_not_break_mid_word():  # tier 2
    single = {"mark": "bar", "width": 460, "data": {"values": [{"a": 1}]}}
    assert page.page_width(single)["width"] == "container"
    concat = {"hconcat": [single, single]}
    assert page.page_width(concat) is concat
    css = page.template_text("page.css")
    assert "break-all" not in css and re.search(r"main\{max-width:1[2-9]\d\dpx", css)


def test_bandwidth_log_axis_and_model_curve():  # tier 2: already so; kept true
    bw = pl.DataFrame({"collective": ["all_reduce"] * 2, "group_size": [8] * 2, "group_size_assumed": [False] * 2,
                       "spans_hosts": [False] * 2, "bucket_lo_bytes": [1024, 2048], "bucket_hi_bytes": [2048, 4096],
                       "ops": [3, 3], "matched_ops": [3, 3], "headline_algbw_gbps": [0.01, 0.1],
                       "headline_busbw_gbps": [0.02, 0.2], "bandwidth_basis": ["transfer"] * 2,
                       "busbw_pct_of_peak": [0.1, 1.0]})
    spec = charts.busbw_chart(bw).to_dict()
    assert all(layer["encoding"]["y"]["scale"]["type"] == "log" for layer in spec["layer"])
    model = pl.DataFrame({"collective": ["all_reduce"], "group_size": [8], "alpha_us": [10.0], "beta_gbps": [100.0],
                          "fit_quality": ["ok"], "fit_min_bytes": [1024], "fit_max_bytes": [1 << 20]})
    curve = charts._latency_curves(model)
    assert curve["size_bytes"].min() == pytest.approx(1024) and curve["size_bytes"].max() == pytest.approx(1 << 20)
    for b, t in curve.select("size_bytes", "model_us").iter_rows():
        assert t == pytest.approx(10.0 + b / (100.0 * 1e3))


# ---------------------------------------------------------------------------------------------------------------
# Per-iteration trend


def test_iteration_trend_chart_marks_warmup_and_outliers():  # tier 2: a frame in iteration_trend's columns
    rows = [dict(iteration_index=i, rank=r, iteration_source="marker", step_no=10 + i,
                 iteration_ns=5_000_000 if i == 0 else 2_000_000 + (700_000 if (r, i) == (1, 3) else 0),
                 comm_exposed_ns=300_000, is_outlier=i == 0 or (r, i) == (1, 3), comm_is_outlier=False,
                 trend_flag="warmup" if i == 0 else "outlier" if (r, i) == (1, 3) else "normal")
            for r in (0, 1) for i in range(5)]
    spec = charts.iteration_trend_chart(pl.DataFrame(rows)).to_dict()
    (data,) = spec["datasets"].values()
    assert {(d["rank"], d["iteration_index"], d["flag"]) for d in data if d["flag"] != "normal"} == {
        ("0", 0, "warmup"), ("1", 0, "warmup"), ("1", 3, "outlier")}
    assert [d["iteration_ms"] for d in data if d["rank"] == "1"] == pytest.approx([5.0, 2.0, 2.0, 2.7, 2.0])
    assert "step markers" in spec["title"]["subtitle"]
    scale = spec["vconcat"][0]["layer"][1]["encoding"]["color"]["scale"]
    assert scale["domain"] == ["normal", "warmup", "outlier"]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("steps,drawn", [(4, True), (1, False)])
def test_trend_section(steps, drawn):  # tier 3
    con = fill_job(connect(None), make_run(world_size=2, steps=steps))
    _, sections, _, _ = page.collect(con)
    (block,) = next(s for s in sections if s.id == "sec-trend").blocks
    if drawn:
        assert block.chart is not None, block.missing
        (data,) = block.spec()["datasets"].values()
        trend = run_query(con, "iteration_trend")
        assert len(data) == trend.height == 2 * steps
    else:
        assert block.chart is None and block.missing == "every rank has a single iteration"
