"""HTML report: self-contained, renders in a real headless Chromium, escapes hostile names, stays small.

The job databases here are filled directly with canonical rows (from fixtures.synthetic), so these tests do not
depend on the importers. The browser tests skip only outside CI when no Chromium is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import altair as alt
import polars as pl
import pytest

from fixtures.synthetic import make_run
from nsys2comm import catalog
from nsys2comm.report import (
    build_report,
    busbw_chart,
    msg_size_histogram_chart,
    overlap_by_collective_chart,
    overlap_by_rank_chart,
    p2p_latency_chart,
    skew_heatmap_chart,
    step_timeline_chart,
    straggler_chart,
    time_breakdown_chart,
)
from nsys2comm.report.html import script_json
from nsys2comm.storage.db import connect

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HOSTILE = "<script>document.body.setAttribute('data-pwned','1')</script>\"'&<img src=x onerror=alert(1)> Ωµ–日本"


# ---------------------------------------------------------------------------------------------------------------
# Job databases filled with canonical rows


def fill_job(con, run, *, hostile: bool = False):
    """Insert a synthetic Run as canonical rows (what an importer would write)."""
    host = HOSTILE if hostile else run.host
    path = f"/traces/{HOSTILE}.json" if hostile else "/traces/synthetic.pt.trace.json"
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source, format_version, producer, host, "
                "clock_rule, clock_offset_ns, ingested_at) VALUES (1, ?, ?, 1234, 'kineto', 'schemaVersion 1', "
                "'synthetic', ?, 'synthetic', 0, now()::TIMESTAMP)", [path, "0" * 64, host])
    for r in run.ranks:
        con.execute("INSERT INTO ranks VALUES (?, 1, ?, ?, ?, 'distributedInfo')",
                    [r.rank, r.pid, host, run.world_size])
        con.execute("INSERT INTO devices VALUES (1, ?, ?, 'NVIDIA H100 80GB HBM3', 132, 85899345920)",
                    [r.rank, r.device])
    krows, crows, mrows, rrows = [], [], [], []
    kid: dict[int, int] = {}
    for rr in run.ranks:
        for i, k in enumerate(rr.kernels):
            kid[id(k)] = len(krows) + 1
            name = k.name
            if hostile and i % 7 == 0:
                name = f"{'nccl' if k.stream == 20 else ''}{HOSTILE}_{i}"
            krows.append((len(krows) + 1, 1, k.rank, k.device, k.stream, k.start_ns, k.end_ns, name, k.correlation))
        for c in rr.comm:
            crows.append(dict(kernel_id=kid[id(c.kernel)], file_id=1, rank=rr.rank, collective=c.collective,
                              dtype=c.dtype.lower(), in_bytes=c.in_bytes, out_bytes=c.out_bytes, msg_bytes=c.msg_bytes,
                              group_size=c.group_size, pg_name=c.pg_name, pg_desc=c.pg_desc, peer_rank=c.peer,
                              seq=c.seq, n_ops=1, collective_source="kernel_args", size_source="kernel_args"))
        for m in rr.memops:
            mrows.append(dict(memop_id=len(mrows) + 1, file_id=1, rank=m.rank, device_id=m.device, stream_id=m.stream,
                              start_ns=m.start_ns, end_ns=m.end_ns, kind=m.kind, copy_kind=m.copy_kind, bytes=m.bytes,
                              name=f"Memcpy {m.copy_kind}" if m.kind == "memcpy" else "Memset",
                              correlation_id=m.correlation))
        for s in rr.steps:
            rrows.append(dict(range_id=len(rrows) + 1, file_id=1, rank=rr.rank, pid=rr.pid, tid=rr.tid,
                              start_ns=s.start_ns, end_ns=s.end_ns, name=f"ProfilerStep#{s.number}",
                              kind="user_annotation"))
    k = pl.DataFrame(krows, schema=["kernel_id", "file_id", "rank", "device_id", "stream_id", "start_ns", "end_ns",
                                    "name", "correlation_id"], orient="row").to_arrow()
    con.register("_k", k)
    con.execute("INSERT INTO kernels BY NAME SELECT *, kernel_short_name(name) AS short_name, "
                "kernel_class(name) AS kernel_class FROM _k")
    con.unregister("_k")
    for table, rows in (("comm_ops", crows), ("mem_ops", mrows), ("cpu_ranges", rrows)):
        con.register("_t", pl.DataFrame(rows).to_arrow())
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _t")
        con.unregister("_t")
    if not crows or not any(c["msg_bytes"] for c in crows):
        pass
    con.execute("INSERT INTO ingest_notes VALUES (1, NULL, 'warning', 'no_msg_sizes', "
                "'message sizes unavailable for some kernels: re-export with --include-blobs=true')")
    return con


def replicate(con, steps: int, rank_copies: int) -> None:
    """Grow a job in place: copy every kernel / comm op / mem op / step ``steps`` times along the timeline and
    ``rank_copies`` times across ranks (a large job in seconds, without Python loops over rows)."""
    period = con.execute("SELECT max(end_ns) - min(start_ns) + 10000 FROM kernels").fetchall()[0][0]
    n_ranks = con.execute("SELECT count(*) FROM ranks").fetchall()[0][0]
    kmax = con.execute("SELECT max(kernel_id) + 1 FROM kernels").fetchall()[0][0]
    mmax = con.execute("SELECT max(memop_id) + 1 FROM mem_ops").fetchall()[0][0]
    rmax = con.execute("SELECT max(range_id) + 1 FROM cpu_ranges").fetchall()[0][0]
    copies = f"(SELECT s, c FROM range({steps}) a(s), range({rank_copies}) b(c) WHERE s > 0 OR c > 0)"
    idx = f"(s * {rank_copies} + c)"
    con.execute(f"INSERT INTO ranks SELECT rank + c * {n_ranks}, file_id, pid, host, world_size * {rank_copies}, "
                f"rank_source FROM ranks, range(1, {rank_copies}) b(c)")
    con.execute(f"INSERT INTO devices SELECT file_id, rank + c * {n_ranks}, device_id, name, sm_count, "
                f"total_memory_bytes FROM devices, range(1, {rank_copies}) b(c)")
    con.execute(f"INSERT INTO comm_ops SELECT t.* REPLACE (kernel_id + {idx} * {kmax} AS kernel_id, "
                f"rank + c * {n_ranks} AS rank, seq + s * 1000 AS seq, group_size * {rank_copies} AS group_size) "
                f"FROM comm_ops t, {copies}")
    con.execute(f"INSERT INTO kernels SELECT t.* REPLACE (kernel_id + {idx} * {kmax} AS kernel_id, "
                f"rank + c * {n_ranks} AS rank, start_ns + s * {period} AS start_ns, end_ns + s * {period} AS end_ns) "
                f"FROM kernels t, {copies}")
    con.execute(f"INSERT INTO mem_ops SELECT t.* REPLACE (memop_id + {idx} * {mmax} AS memop_id, "
                f"rank + c * {n_ranks} AS rank, start_ns + s * {period} AS start_ns, end_ns + s * {period} AS end_ns) "
                f"FROM mem_ops t, {copies}")
    con.execute(f"INSERT INTO cpu_ranges SELECT t.* REPLACE (range_id + {idx} * {rmax} AS range_id, "
                f"rank + c * {n_ranks} AS rank, start_ns + s * {period} AS start_ns, end_ns + s * {period} AS end_ns, "
                f"regexp_replace(name, '\\d+$', CAST(s * 10 + CAST(regexp_extract(name, '(\\d+)$', 1) AS BIGINT) "
                f"AS VARCHAR)) AS name) FROM cpu_ranges t, {copies}")


@pytest.fixture(scope="module")
def job():
    return fill_job(connect(None), make_run(world_size=4, steps=3))


@pytest.fixture(scope="module")
def report(job, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    return build_report(job, out / "report.html", png_dir=out / "png", svg_dir=out / "svg")


# ---------------------------------------------------------------------------------------------------------------
# Headless Chromium


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def browser() -> str:
    path = _browser()
    if path is None:
        if IN_CI:
            pytest.fail("no headless Chromium in CI: install the Debian 'chromium' package (.ci/run does)")
        pytest.skip("no Chromium installed (outside CI)")
    return path


def _chrome(browser: str, html: Path, *extra: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
             "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=15000", *extra,
             html.resolve().as_uri()],
            capture_output=True, text=True, timeout=120)


def dump_dom(browser: str, html: Path) -> str:
    proc = _chrome(browser, html, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def screenshot(browser: str, html: Path, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / name
    proc = _chrome(browser, html, "--window-size=1100,4200", f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    return shot


def assert_rendered(dom: str) -> int:
    """Every chart container holds a rendered <svg> and the page recorded no error. Returns the chart count."""
    assert 'data-charts-done="true"' in dom, "chart rendering did not finish"
    errors = re.search(r'<div id="report-errors"[^>]*>(.*?)</div>', dom, re.S)
    assert errors is not None
    assert "<li>" not in errors.group(1), f"render errors: {re.sub('<[^>]+>', ' ', errors.group(1))[:2000]}"
    containers = re.findall(r'(<div[^>]*\sdata-chart="1"[^>]*>)(.*?)</figure>', dom, re.S)
    assert containers, "no chart containers"
    for tag, inner in containers:
        cid = re.search(r'\sid="([^"]+)"', tag).group(1)
        assert 'data-status="rendered"' in tag, f"{cid} did not render"
        assert "<svg" in inner, f"{cid} has no <svg>"
    return len(containers)


# ---------------------------------------------------------------------------------------------------------------
# Tests


def test_step_timeline_macro_is_documented_and_bounded(job):
    obj = catalog.find("step_timeline")
    assert obj is not None and obj.is_table_macro
    df = job.sql("SELECT * FROM step_timeline(max_segments := 10, max_ranks := 3)").pl()
    assert set(df.columns) == set(obj.columns), "every column documented"
    assert df["rank"].n_unique() == 3
    assert df.group_by("rank", "lane").len()["len"].max() <= 10
    assert df["step_label"][0] == "step 101"  # middle of steps 100, 101, 102
    assert (df["end_offset_ns"] >= df["start_offset_ns"]).all() and (df["start_offset_ns"] >= 0).all()
    assert set(df["lane"]) == {"communication", "compute", "memory"}
    picked = job.sql("SELECT DISTINCT step_label FROM step_timeline(pick_step := 100)").fetchall()
    assert picked == [("step 100",)]


def test_step_timeline_without_steps_uses_whole_trace():
    con = fill_job(connect(None), make_run(world_size=2, steps=1))
    con.execute("DELETE FROM cpu_ranges")
    df = con.sql("SELECT * FROM step_timeline()").pl()
    assert df.height and set(df["step_label"]) == {"whole trace"}


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_report_is_self_contained(report):
    html = report.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    assert len(html.encode()) < 2_000_000
    # no external script, stylesheet, font, image or import of any kind
    assert not re.search(r"<script[^>]*\ssrc\s*=", html, re.I)
    assert not re.search(r"<link\b", html, re.I)
    assert not re.search(r"""\s(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?(?:https?:)?//", html, re.I)
    assert "Content-Security-Policy" in html and "default-src &#x27;none&#x27;" in html
    assert "vegaEmbed" in html  # the library is inlined


def test_report_sections_and_missing_data(report):
    html = report.read_text(encoding="utf-8")
    for sid in ("sec-overview", "sec-findings", "sec-breakdown", "sec-overlap", "sec-causes", "sec-msgsize",
                "sec-busbw", "sec-latency", "sec-skew", "sec-timeline", "sec-kernels"):
        assert f'id="{sid}"' in html, sid
    # the ingest note is shown as a warning in the overview
    assert "re-export with --include-blobs=true" in html
    # a section without data says why, in one line, instead of vanishing
    for m in re.findall(r'<p class="missing">(.*?)</p>', html, re.S):
        assert "No data:" in m or "No findings" in m, m
    lines = re.findall(r'<p class="missing na">(.*?)</p>', html, re.S)
    assert lines and all(re.fullmatch(r"<strong>Not available:</strong> \S.*", m, re.S) for m in lines), lines


def test_report_images(report):
    pngs = sorted((report.parent / "png").glob("*.png"))
    svgs = sorted((report.parent / "svg").glob("*.svg"))
    assert pngs and len(pngs) == len(svgs)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert all("<svg" in p.read_text()[:500] for p in svgs)


def test_report_renders_in_chromium(report, browser):
    dom = dump_dom(browser, report)
    n = assert_rendered(dom)
    assert n >= 1
    screenshot(browser, report, "report.png")


@pytest.mark.parametrize("width", [1400, 800])
def test_nav_fits_the_window(report, tmp_path, browser, width):
    """Every nav link lies inside the window (the bar wraps rather than overflowing), measured by the browser."""
    probe = ("<script>addEventListener('load',()=>{const n=document.querySelector('nav');"
             "const out=[...n.querySelectorAll('a')].filter(a=>a.getBoundingClientRect().right>innerWidth).length;"
             "document.body.setAttribute('data-nav',n.scrollWidth<=n.clientWidth&&out===0?'fits':'overflows:'+out);"
             "});</script>")
    page = tmp_path / "nav.html"
    page.write_text(report.read_text(encoding="utf-8").replace("</body>", probe + "</body>"), encoding="utf-8")
    proc = _chrome(browser, page, f"--window-size={width},900", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'data-nav="fits"' in proc.stdout, re.search(r'data-nav="[^"]*"', proc.stdout)


def test_hostile_names_show_as_text(tmp_path, browser):
    con = fill_job(connect(None), make_run(world_size=3, steps=2), hostile=True)
    out = build_report(con, tmp_path / "hostile.html", title=f"Report {HOSTILE}")
    html = out.read_text(encoding="utf-8")
    # nothing from the trace reaches the page as markup
    assert "<script>document" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.body.setAttribute(&#x27;data-pwned&#x27;" in html  # shown as text
    dom = dump_dom(browser, out)
    assert_rendered(dom)
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert "data-pwned" not in body, "hostile name executed"
    assert "Ωµ–日本" in dom
    screenshot(browser, out, "report-hostile.png")


def test_script_json_cannot_close_the_tag():
    s = script_json({"name": "</script><script>alert(1)</script><!--", "u": "\u2028"})
    assert "<" not in s and ">" not in s and "\u2028" not in s


@pytest.mark.slow  # tier: slow (a 300,000-kernel report, ~20 CPU-s: a benchmark; CI runs it)
def test_large_job_stays_small_and_fast(tmp_path):
    con = fill_job(connect(None), make_run(world_size=8, steps=2))
    replicate(con, steps=50, rank_copies=16)  # 128 ranks x 100 steps
    n = con.execute("SELECT count(*) FROM kernels").fetchall()[0][0]
    assert n > 300_000
    t0 = time.perf_counter()
    out = build_report(con, tmp_path / "large.html")
    took = time.perf_counter() - t0
    size = out.stat().st_size
    print(f"large job: {n:,} kernels, 128 ranks -> {size / 1e6:.2f} MB HTML in {took:.1f} s")
    assert size < 2_000_000
    html = out.read_text(encoding="utf-8")
    assert 'id="chart-timeline"' in html


# ---------------------------------------------------------------------------------------------------------------
# Chart functions on hand-made frames in the shapes of the catalog analyses (pure: frame -> chart)


def _compiles(chart: alt.TopLevelMixin) -> None:
    import vl_convert as vlc

    spec = chart.to_dict()
    svg = vlc.vegalite_to_svg(spec)
    assert "<svg" in svg
    assert spec.get("title") or any("title" in layer for layer in spec.get("layer", []))


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_chart_functions_are_pure_and_compile(job):
    """Every chart of the report, and the notebook-only p2p chart, on the frames its catalog objects return."""
    from nsys2comm.analysis import run_query
    from nsys2comm.report.sections import QUERIES, SECTIONS, ChartSpec

    params = {q.name: q.params for q in QUERIES}
    for spec in (b for s in SECTIONS for b in s.blocks if isinstance(b, ChartSpec)):
        _compiles(spec.draw(*[run_query(job, name, params.get(name, {})) for name in spec.inputs]))
    _compiles(p2p_latency_chart(run_query(job, "p2p_latency_by_size"), run_query(job, "latency_model")))
    _compiles(p2p_latency_chart(run_query(job, "p2p_latency_by_size")))
    for chart in (time_breakdown_chart, overlap_by_rank_chart, overlap_by_collective_chart, msg_size_histogram_chart,
                  busbw_chart, skew_heatmap_chart, straggler_chart, step_timeline_chart):
        assert chart.consumes, chart.__name__  # each names the catalog columns it reads



def test_step_timeline_breaks_ties_the_documented_way():
    """Equal durations and equal class totals in one segment (max_segments := 1): the earliest operation, then
    kernels before memory operations, then the lower id; the class first in name order. Without these rules the
    rows depended on the order DuckDB's threads met them."""
    con = connect(None)
    kernels = [  # id, start, end, full name, class; every operation lasts 100 ns
        (7, 100, 200, "void late_gemm<1>(int)", "gemm"),
        (6, 0, 100, "void twin_compute<1>(int)", "compute"),
        (5, 0, 100, "void early_gemm<1>(int)", "gemm"),
        (8, 300, 400, "void later_compute<1>(int)", "compute"),
        (3, 0, 100, "void copy_kernel<1>(int)", "memory"),
        (9, 900, 1000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "communication"),
    ]
    con.executemany("INSERT INTO kernels (kernel_id, file_id, rank, device_id, start_ns, end_ns, name, short_name, "
                    "kernel_class) VALUES (?, 1, 0, 0, ?, ?, ?, ?, ?)",
                    [(i, s, e, n, n.removeprefix("void ").split("<")[0].split("(")[0], c) for i, s, e, n, c in kernels])
    con.execute("INSERT INTO mem_ops (memop_id, file_id, rank, device_id, start_ns, end_ns, kind, name) VALUES "
                "(2, 1, 0, 0, 0, 100, 'memset', 'Memset'), (1, 1, 0, 0, 800, 900, 'memcpy', 'Memcpy DtoD')")
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT lane, op_class, longest_op_name, longest_op_full_name, n_ops FROM step_timeline(max_segments := 1)"
    ).fetchall()}
    assert rows == {
        "compute": ("compute", "early_gemm", "void early_gemm<1>(int)", 4),  # gemm and compute 200 ns each
        "memory": ("memory", "copy_kernel", "void copy_kernel<1>(int)", 3),  # the kernel before the memset
        "communication": ("communication", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                          "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 1),
    }
