"""The report's contract with the catalog and with its reader (issue 15 items 4, 7, 8, 9, 11, report side).

Consumers name documented columns only; catalog numbers are integer ns; findings say only what is so; chart
details; the page comes from package templates; sections are data.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import polars as pl
import pytest
import test_catalog_lint as lint
from synth_db import catalog_db
from test_report import fill_job

from fixtures.synthetic import make_run
from nsys2comm import catalog
from nsys2comm.analysis import run_query
from nsys2comm.report import build_report, charts, findings, html
from nsys2comm.report.data import CONSUMERS, Fetched
from nsys2comm.report.sections import FACTS, QUERIES, SECTIONS, ChartSpec, TableSpec
from nsys2comm.storage.db import connect

REPORT_DIR = Path(html.__file__).parent
REPORT_OBJECTS = [o for o in catalog.load_catalog() if o.area == "report"]
PARAMS = {q.name: q.params for q in QUERIES}


@pytest.fixture(scope="module")
def job():
    return fill_job(connect(None), make_run(world_size=4, steps=3))


def _frame(con, name: str, consumer: str) -> pl.DataFrame:
    """The catalog object's rows, with only the columns ``consumer`` declares (so any other read fails)."""
    return run_query(con, name, PARAMS.get(name, {})).select(CONSUMERS[consumer][name])


def _name(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


# ---------------------------------------------------------------------------------------------------------------
# Item 9: consumers trust the documented columns


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_consumers_name_documented_columns(consumer):
    for name, cols in CONSUMERS[consumer].items():
        obj = catalog.find(name)
        assert obj is not None, f"{consumer} reads {name!r}, which is not in the catalog"
        missing = [c for c in cols if c not in obj.columns]
        assert not missing, f"{consumer} reads {name}.{missing}, not documented columns ({list(obj.columns)})"


def test_every_chart_finding_and_query_is_declared():
    names = {q.name for q in QUERIES}
    for spec in (b for s in SECTIONS for b in s.blocks):
        inputs = spec.inputs if isinstance(spec, ChartSpec) else (spec.source,)
        assert set(inputs) <= names, spec.id
        if isinstance(spec, ChartSpec):
            assert set(inputs) <= set(spec.draw.consumes), spec.id
    for fn, inputs, _ in findings.FINDINGS:
        assert set(inputs) <= names and set(inputs) <= set(fn.consumes), fn.__name__
    assert set(FACTS) >= {f for q in QUERIES for f in q.needs}
    for q in QUERIES:
        if q.all_null:
            assert q.all_null[0] in catalog.find(q.name).columns


def test_no_synonym_guessing_left():
    for path in REPORT_DIR.glob("*.py"):
        src = path.read_text()
        assert not re.search(r"\b(_col|pick)\(", src), f"{path.name} still guesses column names"


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("spec", [b for s in SECTIONS for b in s.blocks if isinstance(b, ChartSpec)],
                         ids=lambda s: s.id)
def test_charts_read_only_declared_columns(job, spec):
    consumer = _name(spec.draw)
    spec.draw(*[_frame(job, name, consumer) for name in spec.inputs]).to_dict()


@pytest.mark.parametrize("fn,inputs", [(f, i) for f, i, _ in findings.FINDINGS],
                         ids=lambda x: getattr(x, "__name__", ""))
def test_findings_read_only_declared_columns(job, fn, inputs):
    assert fn(*[_frame(job, name, _name(fn)) for name in inputs]) is not None


def test_page_parts_read_only_declared_columns(job):
    cols: dict[str, set] = {}
    for reader in ("nsys2comm.report.html.overview", "nsys2comm.report.html.diagnostics",
                   "nsys2comm.report.sections.RANK_COLUMNS"):
        for name, c in CONSUMERS[reader].items():
            cols.setdefault(name, set()).update(c)
    f = Fetched({name: run_query(job, name).select(sorted(c)) for name, c in cols.items()})
    assert "Ranks" in html.overview(f, html.diagnostics(f))
    del f.frames["diagnostics"]  # the importers' notes stand in
    assert html.diagnostics(f)


def test_a_renamed_column_fails_loudly_not_silently(job):
    """A finding whose input lost a column says so on the page instead of vanishing."""
    ov = run_query(job, "overlap_by_rank").rename({"exposed_comm_ns": "exposed_ns"})
    out = findings.all_findings({"overlap_by_rank": ov})
    assert len(out) == 1 and out[0].level == "warning" and "could not be computed" in out[0].text


# ---------------------------------------------------------------------------------------------------------------
# Item 4: units


@pytest.mark.parametrize("obj", REPORT_OBJECTS, ids=lambda o: o.name)
def test_report_objects_pass_the_catalog_lint(obj):
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    lint.test_documented(obj)
    lint.test_columns_match_and_units(con, obj)
    if obj.public and obj.is_table_macro:  # the catalog lint's rule: a stored helper view is unordered on purpose
        lint.test_order_by(obj)


def test_report_objects_return_integer_nanoseconds(job):
    for name in ("step_timeline", "top_comm_kernels", "run_overview"):
        df = run_query(job, name, PARAMS.get(name, {}))
        assert not [c for c in df.columns if c.endswith(("_us", "_ms"))], name
        for c in (c for c in df.columns if c.endswith("_ns")):
            assert df.schema[c] == pl.Int64, f"{name}.{c} is {df.schema[c]}"
    top = run_query(job, "top_comm_kernels")
    assert (top["mean_ns"] <= top["max_ns"]).all() and (top["max_ns"] <= top["total_ns"]).all()


# ---------------------------------------------------------------------------------------------------------------
# Item 7: findings that say things that are so

MODEL_ROW = dict(collective="all_reduce", group_size=8, transfer_source="matched", sized_instances=100,
                 alpha_us=20.0, beta_gbps=100.0, beta_busbw_gbps=175.0, peak_busbw_gbps=900.0,
                 n_half_bytes=2_000_000, fit_quality="ok", total_transfer_ns=2_000_000, latency_floor_ns=15_000,
                 duration_incl_wait_p50_ns=40_000, instances=100)
TOTAL_ROW = dict(latency_bound_pct=80.0, below_threshold_ops=60, fitted_instances=100, fitted_transfer_ns=1_000_000,
                 coalescing_saving_ns=0, covered_comm_pct=90.0)


def _model(**changes) -> pl.DataFrame:
    return pl.DataFrame([MODEL_ROW | changes])


def _total(**changes) -> pl.DataFrame:
    return pl.DataFrame([TOTAL_ROW | changes])


def _small(fs) -> list[str]:
    return [f.text for f in fs if "latency-bound" in f.text]


def test_small_message_finding_uses_sized_operations_and_says_no_only():
    (text,) = _small(findings.latency_findings(_model(), _total()))
    assert "60% of sized communication operations with an 'ok' α-β fit (60 of 100)" in text
    assert "80% of those operations' transfer time" in text and "cover 90% of communication kernel time" in text
    assert "only" not in text and "n½" in text and "fallback" not in text
    # no share (no 'ok' fit): no latency-bound sentence, and a rejected fit says it is not used
    fs = findings.latency_findings(_model(fit_quality="implausible", beta_busbw_gbps=1000.0),
                                   _total(latency_bound_pct=None, below_threshold_ops=None, fitted_instances=None))
    assert not _small(fs) and "not used: fit implausible, bus bandwidth" in fs[0].text


def test_no_finding_about_a_negligible_share():
    assert not _small(findings.latency_findings(_model(), _total(latency_bound_pct=0.5)))  # 0.5 % of the time
    (text,) = _small(findings.latency_findings(_model(), _total(coalescing_saving_ns=100)))
    assert "would save" not in text  # saving 0.01 % is no advice
    ov = pl.DataFrame({"rank": [0, 1], "busy_ns": [10_000, 10_000], "comm_ns": [1_000, 1_000],
                       "exposed_comm_ns": [500, 400], "gemm_overlapped_ns": [0, 0]})
    texts = [f.text for f in findings.overlap_findings(ov)]
    assert texts and not any("GEMM" in t for t in texts)  # no "0 % overlaps GEMM ... both may run slower"
    assert not findings.start_skew_findings(pl.DataFrame({"start_skew_ns": [0, 0]}))


def test_worst_rank_is_the_catalogs():
    """The finding says overlap_worst_rank's rank and share, as such; one rank compared: no "worst"."""
    ov = pl.DataFrame({"rank": [0, 1], "busy_ns": [100_000, 10_000], "comm_ns": [50_000, 2_000],
                       "exposed_comm_ns": [40_000, 1_000], "gemm_overlapped_ns": [0, 0]})
    worst = pl.DataFrame({"rank": [0], "exposed_busy_pct": [40.0], "ranks_compared": [2]})
    (first,) = [f.text for f in findings.overlap_findings(ov, worst) if "Worst" in f.text]
    assert "Worst is rank 0: exposed communication is 40% of its GPU-busy time" in first
    alone = worst.with_columns(pl.lit(1).alias("ranks_compared"))
    assert not [f for f in findings.overlap_findings(ov, alone) if "Worst" in f.text]


# tier 3: overlap_worst_rank against a brute force over overlap_by_rank on a synthetic job
@pytest.mark.parametrize("world_size", [1, 4])
def test_overlap_worst_rank_is_the_largest_exposed_share_of_busy(world_size):
    con = fill_job(connect(None), make_run(world_size=world_size, steps=3))
    ov = run_query(con, "overlap_by_rank").filter(pl.col("busy_ns") > 0)
    shares = {r["rank"]: 100.0 * r["exposed_comm_ns"] / r["busy_ns"] for r in ov.iter_rows(named=True)}
    best = max(shares.values())
    (row,) = run_query(con, "overlap_worst_rank").iter_rows(named=True)
    assert row["rank"] == min(k for k, v in shares.items() if v == best)
    assert row["exposed_busy_pct"] == pytest.approx(best) and row["ranks_compared"] == len(shares)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_worst_rank_matches_the_summary_on_a_job(job):
    from nsys2comm.summary import build_summary

    fs = findings.overlap_findings(run_query(job, "overlap_by_rank"), run_query(job, "overlap_worst_rank"))
    (text,) = [f.text for f in fs if "Worst" in f.text]
    s = build_summary(job)
    assert f"Worst is rank {s['worst_rank']}: exposed communication is {s['worst_rank_exposed_comm_pct']:.0f}%" in text


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_finding_numbers_have_one_precision(job):
    _, _, found, _ = html.collect(job)
    assert found
    for f in found:
        assert not re.search(r"\d\.\d+ ?%", f.text), f.text  # percentages are whole numbers
        for value, _unit in re.findall(r"(\d[\d,]*(?:\.\d+)?) (ms|µs|ns|s)\b", f.text):
            digits = value.replace(",", "").replace(".", "").lstrip("0")
            assert len(digits) <= 3 or "." not in value, f.text  # three significant digits


# ---------------------------------------------------------------------------------------------------------------
# Item 8: chart details


def test_size_axes_are_log2_quantitative(job):
    for chart in (charts.msg_size_histogram_chart(run_query(job, "msg_size_histogram")),
                  charts.busbw_chart(run_query(job, "collective_bandwidth"))):
        spec = chart.to_dict()
        xs = [layer["encoding"]["x"] for layer in spec.get("layer", [spec])]
        for x in xs:
            assert x["type"] == "quantitative" and x["scale"] == {"type": "log", "base": 2}, x


def test_bandwidth_lines_break_where_buckets_are_missing():
    df = pl.DataFrame({"collective": ["all_reduce"] * 3 + ["all_gather"],
                       "bucket_lo_bytes": [1024, 2048, 16384, 1024], "bucket_hi_bytes": [2048, 4096, 32768, 2048]})
    runs = charts._runs(df, "collective").filter(pl.col("collective") == "all_reduce")["run"].to_list()
    assert runs[0] == runs[1] != runs[2]
    spec = charts.busbw_chart(df.with_columns(group_size=pl.lit(8), group_size_assumed=pl.lit(False), ops=pl.lit(1),
                                              spans_hosts=pl.lit(False), matched_ops=pl.lit(1),
                                              headline_algbw_gbps=pl.lit(1.0), headline_busbw_gbps=pl.lit(2.0),
                                              bandwidth_basis=pl.lit("transfer"),
                                              busbw_pct_of_peak=pl.lit(1.0))).to_dict()
    (line,) = [layer for layer in spec["layer"] if layer["mark"] in ("line", {"type": "line"})]
    assert line["encoding"]["detail"]["field"] == "run"


def test_heatmap_labels_are_clean(job):
    spec = charts.skew_heatmap_chart(run_query(job, "collective_skew")).to_dict()
    labels = spec["encoding"]["x"]["sort"]
    assert labels and not any("##" in x for x in labels)
    assert all(re.fullmatch(r"\w+ #\d+( \(pg .+\))?", x) for x in labels), labels


def test_straggler_wait_is_a_bar_length_not_a_colour(job):
    spec = charts.straggler_chart(run_query(job, "rank_wait")).to_dict()
    xs = [panel["encoding"]["x"]["field"] for panel in spec["hconcat"]]
    assert xs == ["times_arrived_last", "wait_ms"]
    assert not any("color" in panel["encoding"] for panel in spec["hconcat"])


def test_timeline_ticks_do_not_collide(job):
    spec = charts.step_timeline_chart(run_query(job, "step_timeline")).to_dict()
    axis = spec["encoding"]["x"]["axis"]
    assert axis["labelOverlap"] and axis["tickCount"] <= 10 and axis["format"]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_unknown_gpu_model_is_said_so(tmp_path):
    con = fill_job(connect(None), make_run(world_size=2, steps=1))
    con.execute("UPDATE devices SET name = NULL")
    page = build_report(con, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<dt>GPUs</dt><dd>2 (model not recorded)</dd>" in page
    assert "(device)" not in page


def test_nav_wraps():
    css = html.template_text("page.css")
    nav = re.search(r"(?m)^nav\{[^}]*\}", css).group(0)
    assert "flex-wrap:wrap" in nav


def test_page_comes_from_package_templates():
    for name in ("page.html", "fragments.html", "page.css", "page.js"):
        assert resources.files("nsys2comm.report").joinpath("templates", name).is_file(), name
    src = (REPORT_DIR / "html.py").read_text()
    assert not re.search(r"""f["'][^"']*<[a-zA-Z/!]""", src), "HTML built with an f-string"


def test_fill_escapes_everything_but_html_values():
    out = html.fill("td_title", title='"><script>', text="<b>")
    assert "<script>" not in out and "<b>" not in out and "&lt;b&gt;" in out


# ---------------------------------------------------------------------------------------------------------------
# Item 11: sections are data, no direct table reads


def test_sections_are_data():
    ids = [s.id for s in SECTIONS]
    assert len(ids) == len(set(ids)) and all(s.title and s.intro and s.blocks for s in SECTIONS)
    for spec in (b for s in SECTIONS for b in s.blocks):
        assert isinstance(spec, ChartSpec | TableSpec) and spec.id


def test_report_reads_only_catalog_objects():
    names = {q.name for q in QUERIES}
    assert {"report_files", "report_notes"} <= names and not names & {"files", "ingest_notes"}
    for name in names:
        assert catalog.find(name).kind != "table", name
    for path in REPORT_DIR.glob("*.py"):
        assert not re.search(r"\bFROM\s+\w+", path.read_text()), f"{path.name} runs SQL of its own"
