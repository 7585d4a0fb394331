"""Assembling the self-contained HTML report from the section specs (sections.py) and the package templates.

The page has no external reference of any kind: Vega, Vega-Lite and vega-embed are inlined from
vl-convert-python's bundle, charts travel as JSON in a ``<script type="application/json">`` tag (every ``<``,
``>`` and ``&`` escaped as ``\\u003c`` ... so no trace text can close the tag), and a Content-Security-Policy
forbids any network request. Markup lives in templates/ (page.html, fragments.html, page.css, page.js), filled
with ``string.Template`` by :func:`fill`, which HTML-escapes every value whose name does not end in ``_html``.
Render errors are written into the DOM (``#report-errors``) so a headless browser test can see them.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from string import Template

import altair as alt
import polars as pl

from ..results import gap
from ..storage import usercache
from ..units import duration, ns_to
from ..units import size as fmt_bytes
from .data import Fetched, Query, declare, fetch
from .findings import Finding, all_findings
from .sections import (
    CHANGES_SECTION,
    CHANGES_TOP,
    CHANGES_WINDOW_INTRO,
    MAX_OVERVIEW_RANKS,
    NOTEBOOK_QUERIES,
    QUERIES,
    RANK_COLUMNS,
    SECTIONS,
    ChartSpec,
    TableSpec,
    choose_step,
)

CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:; connect-src 'none'; form-action 'none'; base-uri 'none'")
MAX_NOTES = 50
_FRAGMENT = re.compile(r"^<!-- @fragment (\w+) -->\n", re.M)


def esc(x) -> str:
    """HTML-escape any value for text or attribute context."""
    return html.escape("" if x is None else str(x), quote=True)


def script_json(obj) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' survives literally."""
    s = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)
    return (s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def template_text(name: str) -> str:
    return resources.files(__package__).joinpath("templates", name).read_text(encoding="utf-8")


@cache
def _fragments() -> dict[str, Template]:
    parts = _FRAGMENT.split(template_text("fragments.html"))[1:]
    return {name: Template(text.strip("\n")) for name, text in zip(parts[::2], parts[1::2], strict=True)}


def fill(fragment: str, **values) -> str:
    """A fragment of templates/fragments.html (or 'page') with its values; escaped unless the name ends in _html."""
    t = Template(template_text("page.html")) if fragment == "page" else _fragments()[fragment]
    return t.substitute({k: (v if k.endswith("_html") else esc(v)) for k, v in values.items()})


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one classic script (cached on disk per vl-convert version: ~5 s to build)."""
    from importlib.metadata import version as _version

    import vl_convert as vlc

    ver = re.sub(r"[^0-9A-Za-z._-]", "_", _version("vl-convert-python"))
    cache_dir = usercache.directory()
    cached = cache_dir / f"vega-bundle-{ver}.js"
    try:
        if cached.is_file():
            return cached.read_text(encoding="utf-8")
    except OSError:
        pass
    js = vlc.javascript_bundle()
    if "</script" in js.lower():  # cannot happen with today's bundle; never emit a broken page
        js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.I)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(js, encoding="utf-8")
        tmp.replace(cached)
    except OSError:
        pass
    return js


# ---------------------------------------------------------------------------------------------------------------
# Page model: sections with their charts drawn (or the reason they are not available), no HTML yet


@dataclass
class ChartBlock:
    id: str
    chart: alt.TopLevelMixin | None
    caption: str
    missing: str | None = None  # why there is no chart

    def spec(self) -> dict:
        d = self.chart.to_dict()
        d.pop("$schema", None)
        return d


@dataclass
class Section:
    id: str
    title: str
    intro: str
    blocks: list[ChartBlock]
    html: str = ""  # pre-escaped HTML (tables)


def mark_not_available(fetched: Fetched) -> None:
    """Drop results whose numbers cannot be computed, with the reason, so their blocks show a "not available" box
    instead of an empty chart frame, a one-row heatmap or a finding built on zeros. Queries the batch did not run
    (a chart's batch, :func:`chart_block`) are left alone."""
    for q in (*QUERIES, *NOTEBOOK_QUERIES):
        if q.name not in fetched.frames and q.name not in fetched.errors:
            continue
        why = next((r for f in q.needs if (r := gap(fetched, f))), None)
        df = fetched.frames.get(q.name)
        if why is None and df is not None and not df.height:
            why = q.empty
        if why is None and df is not None and df.height and q.all_null and df[q.all_null[0]].null_count() == df.height:
            why = q.all_null[1]
        if why is None and df is not None and df.height and q.check is not None:
            why = q.check(df)
        if why:
            fetched.drop(q.name, why)


def _reason(fetched: Fetched, names: tuple[str, ...], hint: str | None, diag: list[str]) -> str:
    """Why a block has no data, in one line: its own reason (the analysis error, or why its numbers cannot be
    computed), else the first matching diagnostic; never the whole diagnostics list (the banner says what holds for
    the whole job)."""
    errs = list(dict.fromkeys(fetched.errors[k].removeprefix("not available: ") for k in names
                              if k in fetched.errors))
    if errs:
        return "; ".join(errs)
    words = hint.split("|") if hint else []
    notes = [d for d in diag if any(w in d.lower() for w in words)]
    return notes[0] if notes else "the trace has no rows for this analysis"


def _drew_nothing(spec: dict) -> bool:
    """True when a Vega-Lite spec has no data row to draw (an empty frame: axes without marks)."""
    def values(node) -> list[list]:
        if isinstance(node, dict):
            out = [node["data"]["values"]] if isinstance(node.get("data"), dict) and "values" in node["data"] else []
            if isinstance(node.get("datasets"), dict):
                out += list(node["datasets"].values())
            for key in ("layer", "hconcat", "vconcat", "concat"):
                for child in node.get(key, []):
                    out += values(child)
            return out
        return []
    found = values(spec)
    return bool(found) and not any(found)


def _chart_block(fetched: Fetched, spec: ChartSpec, diag: list[str]) -> ChartBlock:
    frames = [fetched.get(k) for k in spec.inputs]
    if frames[0] is None:
        return ChartBlock(spec.id, None, spec.caption, _reason(fetched, spec.inputs, spec.hint, diag))
    try:
        block = ChartBlock(spec.id, spec.draw(*frames), spec.caption)
        if _drew_nothing(block.spec()):
            return ChartBlock(spec.id, None, spec.caption, "no row of the analysis has data this chart can draw")
        return block
    except Exception as e:  # noqa: BLE001 - a chart that cannot be drawn says so, the report stands
        why = f"could not draw this chart ({type(e).__name__}: {str(e)[:200]})"
        return ChartBlock(spec.id, None, spec.caption, why)


def _table_html(fetched: Fetched, spec: TableSpec, diag: list[str]) -> str:
    df = fetched.get(spec.source)
    if df is not None and spec.prepare is not None:
        df = spec.prepare(df)
    if df is None or not df.height:
        return fill("not_available", why=_reason(fetched, (spec.source,), spec.hint, diag))
    if spec.max_rows is not None and df.height > spec.max_rows:
        more = df.height - spec.max_rows
        return table(df.head(spec.max_rows), spec.columns, spec.cls) + fill(
            "paragraph", text=f"… {more:,} more rows: nsys2comm query DB {spec.source}")
    return table(df, spec.columns, spec.cls)


declare(f"{__name__}.job_banner", msg_size_histogram=("bucket_lo_bytes",), report_files=("source",))

# what would add what the banner says is missing
_ADD_COMM = ("trace a run in which the ranks communicate, with GPU kernels traced (PyTorch profiler with CUDA "
             "activities, or nsys profile --trace=cuda,nvtx)")
_ADD_RANKS = "ingest every rank's trace of the run together (a directory, a quoted glob or several files)"
_ADD_SIZES = {"kineto": "profile with record_shapes=True, or with PyTorch >= 2.2 (collective arguments on kernels)",
              "nsys": "re-export with nsys export --type sqlite --include-blobs=true (NCCL >= 2.16 NVTX payloads)"}


# diagnostics the banner's sentence makes redundant (the overview's list leaves them out)
BANNER_COVERS = {"no_comm_kernels": {"no_comm_kernels", "no_msg_sizes", "no_sized_comm", "no_group_size", "no_p2p",
                                     "p2p_fit_impossible", "skew_match_rule"},
                 "no_msg_sizes": {"no_msg_sizes", "no_sized_comm", "no_group_size", "no_p2p", "p2p_fit_impossible"},
                 "single_rank": {"single_rank"}}


def job_banner(fetched: Fetched) -> list[tuple[str, str]]:
    """What holds for the whole job, once, with what would add it: no communication kernels, communication without
    any message size, a single rank. (diagnostics code, sentence) pairs; the banner shows them together."""
    ov = fetched.get("run_overview")
    if ov is None:
        return []
    out = []
    if gap(fetched, "comm"):
        out.append(("no_comm_kernels", "The job has no communication kernels (NCCL, RCCL, ...): the sections about "
                    f"communication, message sizes, bandwidth, latency, skew and late arrivals are not available. To "
                    f"add them, {_ADD_COMM}."))
    else:
        hist = fetched.get("msg_size_histogram")
        if hist is not None and hist["bucket_lo_bytes"].null_count() == hist.height:
            files = fetched.get("report_files")
            sources = sorted(set(files["source"].to_list())) if files is not None else []
            how = "; ".join(f"{src}: {_ADD_SIZES[src]}" for src in sources if src in _ADD_SIZES) or _ADD_SIZES["kineto"]
            out.append(("no_msg_sizes", "No communication operation has a known message size: message sizes, "
                        f"bandwidth and the α-β latency fit are not available. To add them ({how})."))
    if gap(fetched, "two_ranks"):
        out.append(("single_rank", f"Only {ov.height} rank{'s' if ov.height != 1 else ''} in the job: cross-rank skew, "
                    f"stragglers and late arrivals are not available. To add them, {_ADD_RANKS}."))
    return out


def report_results(con, step: int | None = None,
                   queries: list[Query] | None = None) -> tuple[Fetched, list[tuple[str, str]]]:
    """The report's batch of the results layer: ``queries`` (default all of QUERIES), the timeline's step chosen
    from ``iterations`` (unless the batch's step_timeline query has parameters of its own), the banner, and what
    is not available marked; with the timeline's (title, sentence) when it ran."""
    queries = QUERIES if queries is None else queries
    heading: list[tuple[str, str]] = []
    asked = [q for q in queries if q.name == "step_timeline"]

    def timeline(got: Fetched) -> list:
        if not asked or asked[0] not in QUERIES:  # no timeline, or one with the caller's own window
            return asked
        if "iterations" in got.errors and step is None:  # step_timeline's own choice, said as such
            heading.append(("Timeline of one step", "Shown: the middle one of the marked steps, or the whole capture "
                            f"without step markers ({got.errors['iterations']})."))
            return [q for q in QUERIES if q.name == "step_timeline"]
        query, title, said = choose_step(got.get("iterations"), step)
        heading.append((title, said))
        return [query]

    fetched = fetch(con, [q for q in queries if q.name != "step_timeline"], timeline)
    fetched.banner = job_banner(fetched)
    mark_not_available(fetched)
    return fetched, heading


def chart_block(con, spec: ChartSpec, queries: list[Query], step: int | None = None,
                changes: pl.DataFrame | None = None) -> ChartBlock:
    """One chart of the registry (``sections.CHARTS``) as the report draws it: ``queries``
    (``sections.chart_queries``) run as the report's batch, the same not-available rules and reasons, the same draw
    function; a "What changed" chart from ``changes`` (the rows of ``baseline.diff(job)``)."""
    if changes is not None:
        return _chart_block(changes_frames(changes), spec, [])
    fetched, _ = report_results(con, step, queries)
    return _chart_block(fetched, spec, [m for _, m in diagnostics(fetched)])


def collect(con, step: int | None = None) -> tuple[Fetched, list[Section], list[Finding], list[tuple[str, str]]]:
    """Run the catalog queries and lay out the sections (no HTML yet): reusable for other front ends. ``step``:
    the timeline's step (a step marker's number, or a detected iteration's index; default the median-length one)."""
    fetched, heading = report_results(con, step)
    diag = diagnostics(fetched)
    text = [m for _, m in diag]
    sections = []
    for s in SECTIONS:
        charts = [_chart_block(fetched, b, text) for b in s.blocks if isinstance(b, ChartSpec)]
        said = {fill("not_available", why=b.missing) for b in charts if b.chart is None}
        tables = list(dict.fromkeys(t for b in s.blocks if isinstance(b, TableSpec)
                                    if (t := _table_html(fetched, b, text)) not in said))
        title, intro = s.title, s.intro
        if s.id == "sec-timeline" and heading:
            title, intro = heading[0][0], f"{heading[0][1]} {s.intro}"
        sections.append(Section(s.id, title, intro, charts, "".join(tables)))
    findings = all_findings({q.name: fetched.get(q.name) for q in QUERIES})
    return fetched, sections, findings, diag


# ---------------------------------------------------------------------------------------------------------------
# What changed (report --baseline): the rows of nsys2comm.compare, split for CHANGES_SECTION's blocks


def _change_text(metric: str, v: float | None, signed: bool = False) -> str:
    """A diff value in the metric's unit: durations, sizes, GB/s, µs, % (percentage points for a change)."""
    if v is None:
        return "–"
    if v == 0:
        return "0"
    sign = ("+" if v > 0 else "-" if v < 0 else "±") if signed else ("-" if v < 0 else "")
    a = abs(v)
    if metric.endswith(("_ns", "_ns_per_step", "_ns_per_window", "_ns_per_op")):
        return sign + duration(a)
    if "bytes" in metric:
        return sign + fmt_bytes(a)
    if metric.endswith("_pct"):
        return f"{sign}{a:.1f}" + (" pp" if signed else "%")
    if metric.endswith("_gbps"):
        return f"{sign}{a:.1f} GB/s"
    if metric.endswith("_us"):
        return f"{sign}{a:.1f} µs"
    return f"{sign}{a:,.6g}"


def _metric_label(metric: str) -> str:
    """A diff metric for people: its unit suffix left out (the values carry their unit), words apart:
    'exposed_comm_ns_per_step' -> 'exposed comm per step'."""
    return re.sub(r"_(ns|us|bytes|pct|gbps)(?=_per_|$)", "", metric).replace("_", " ")


def changes_frames(changes: pl.DataFrame) -> Fetched:
    """The inputs of CHANGES_SECTION: per-rank and per-collective rows for the paired charts, and the rows that
    changed most (by impact, as sorted) with their values as text, for the table."""
    # per step, or per capture window when the runs do not both have steps (nsys2comm.compare)
    rank = changes.filter((pl.col("section") == "rank")
                          & pl.col("metric").is_in(["exposed_comm_ns_per_step", "exposed_comm_ns_per_window"]))
    coll = changes.filter((pl.col("section") == "collective")
                          & pl.col("metric").is_in(["time_ns_per_step", "time_ns_per_window"]))
    moved = changes.filter((pl.col("delta") != 0) | (pl.col("base").is_null() != pl.col("new").is_null()))
    top = moved.head(CHANGES_TOP).with_columns(
        *[pl.struct("metric", c).map_elements(lambda r, c=c: _change_text(r["metric"], r[c], c == "delta"),
                                              return_dtype=pl.String).alias(f"{c}_text")
          for c in ("base", "new", "delta")],
        pl.col("metric").map_elements(_metric_label, return_dtype=pl.String).alias("metric_text"))
    # each row's own impact (nsys2comm.compare: per metric, NULL on the rows that explain it); an impact that
    # repeats the one on the subject's (section, key) row above is said once
    prev = pl.col("impact_ns").shift(1).over("section", pl.col("key").fill_null(""))
    repeat = pl.col("impact_ns").is_not_null() & (pl.col("impact_ns") == prev).fill_null(False)
    top = top.with_columns(pl.when(repeat).then(pl.lit("as above")).otherwise(pl.col("impact_ns").map_elements(
        lambda v: _change_text("impact_ns", v, True), return_dtype=pl.String)).alias("impact_text"))
    out = Fetched({"diff_rank": rank, "diff_collective": coll, "diff_top": top})
    for name, df, why in (("diff_rank", rank, "no rank has communication in either run"),
                          ("diff_collective", coll, "neither run has communication kernels"),
                          ("diff_top", top, "nothing changed: every value is the same in both runs")):
        if not df.height:
            out.drop(name, why)
    return out


def changes_section(changes: pl.DataFrame) -> Section:
    """CHANGES_SECTION laid out from the diff rows (:meth:`nsys2comm.Job.diff` of the baseline against this job)."""
    fetched = changes_frames(changes)
    spec = CHANGES_SECTION
    charts = [_chart_block(fetched, b, []) for b in spec.blocks if isinstance(b, ChartSpec)]
    tables = "".join(_table_html(fetched, b, []) for b in spec.blocks if isinstance(b, TableSpec))
    windowed = changes["metric"].str.ends_with("_per_window").any()
    return Section(spec.id, spec.title, CHANGES_WINDOW_INTRO if windowed else spec.intro, charts, tables)


# ---------------------------------------------------------------------------------------------------------------
# Data shown outside the sections: diagnostics, overview

declare(f"{__name__}.diagnostics", diagnostics=("severity", "code", "affects", "message"),
        report_notes=("severity", "code", "file_path", "message"))
declare(f"{__name__}.overview", run_overview=("rank", "n_gpus", "gpu_models", "first_ns", "last_ns", "n_kernels",
                                              "n_comm_kernels"),
        report_files=("source", "format_version", "producer", "comm_library_version"))


def diagnostics(fetched: Fetched) -> list[tuple[str, str]]:
    """(severity, message) from the diagnostics analysis, else from the importers' notes; what the banner says
    (fetched.banner) is left out."""
    said = {c for code, _ in fetched.banner for c in BANNER_COVERS.get(code, {code})}
    diag = fetched.get("diagnostics")
    if diag is not None:
        rows = [(r["severity"], f"{r['affects']}: {r['message']}" if r["affects"] else r["message"])
                for r in diag.iter_rows(named=True) if r["code"] not in said]
    else:
        notes = fetched.get("report_notes")
        rows = [] if notes is None else [(r["severity"], f"{r['file_path']}: {r['message']}" if r["file_path"]
                                          else r["message"]) for r in notes.iter_rows(named=True)
                                         if r["code"] not in said]
    return list(dict.fromkeys(rows))


def _gpus(ov: pl.DataFrame) -> str:
    n = int(ov["n_gpus"].sum())
    models = sorted({m for s in ov["gpu_models"].drop_nulls().to_list() for m in s.split(", ")})
    unnamed = ov.filter((pl.col("n_gpus") > 0) & pl.col("gpu_models").is_null()).height
    if not n:
        return "none recorded"
    if not models:
        return f"{n} (model not recorded)"
    return f"{n} ({', '.join(models)}" + (f"; model not recorded on {unnamed} ranks)" if unnamed else ")")


_PRODUCER = {"nsys": "Nsight Systems", "kineto": "PyTorch profiler (Kineto)"}


def _producers(files: pl.DataFrame) -> str:
    """The tools that wrote the files: Nsight Systems with its version (files.producer of nsys files), the PyTorch
    profiler; a Kineto file's producer column holds format markers, which are no producer (_markers)."""
    out = {f"{_PRODUCER['nsys']} {r['producer']}" if r["source"] == "nsys" and r["producer"]
           else _PRODUCER.get(r["source"], str(r["source"])) for r in files.iter_rows(named=True)}
    return "; ".join(sorted(out))[:400]


def _markers(files: pl.DataFrame) -> str:
    """The format markers Kineto files carry (files.producer: time format, era flags, library versions)."""
    found = {m.strip() for r in files.iter_rows(named=True) if r["source"] != "nsys" and r["producer"]
             for m in str(r["producer"]).split(",") if m.strip()}
    return ", ".join(sorted(found))[:400]


def overview(fetched: Fetched, diag: list[tuple[str, str]]) -> str:
    ov, files = fetched.get("run_overview"), fetched.get("report_files")
    parts = []
    if ov is not None:
        first, last = ov["first_ns"].min(), ov["last_ns"].max()
        kv = [("Ranks", f"{ov.height}"), ("GPUs", _gpus(ov)),
              ("Trace files", f"{files.height}" if files is not None else "?"),
              ("Sources", ", ".join(sorted({f"{r['source']} {r['format_version'] or ''}".strip()
                                           for r in files.iter_rows(named=True)})) if files is not None else "?"),
              ("Producers", _producers(files) if files is not None else "?"),
              *([("Format markers", m)] if files is not None and (m := _markers(files)) else []),
              *([("Communication library", c)] if files is not None and (c := ", ".join(sorted(
                  set(files["comm_library_version"].drop_nulls().to_list())))[:400]) else []),
              ("Time span", f"{duration(last - first)} of GPU activity" if first is not None and last is not None
               else "no GPU activity"),
              ("Kernels", f"{int(ov['n_kernels'].sum()):,} ({int(ov['n_comm_kernels'].sum()):,} communication)")]
        parts.append(fill("kv", items_html="".join(fill("kv_item", key=k, value=v) for k, v in kv)))
    else:
        why = fetched.errors.get("run_overview", "the job has no ranks")
        parts.append(fill("missing", text=f"No data: no run overview ({why})"))
    if diag:
        items = [fill("note", severity=s, text=m) for s, m in diag[:MAX_NOTES]]
        if len(diag) > MAX_NOTES:
            items.append(fill("note", severity="info", text=f"… and {len(diag) - MAX_NOTES} more"))
        parts.append(fill("notes", items_html="".join(items)))
    if ov is not None:
        more = (fill("paragraph", text=f"… {ov.height - MAX_OVERVIEW_RANKS} more ranks")
                if ov.height > MAX_OVERVIEW_RANKS else "")
        parts.append(fill("details", summary="Ranks and files",
                          content_html=table(ov.head(MAX_OVERVIEW_RANKS), RANK_COLUMNS) + more))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# HTML


def cell(v, f: str, row: dict) -> str:
    """One table cell; format f: '' text | 'int' | 'ms' / 'us' (from ns) | 'pct' | 'bytes' | 'title:COL' (text
    with column COL as its tooltip, e.g. a full kernel name behind a base name)."""
    if f.startswith("title:"):
        tip = row.get(f.removeprefix("title:"))
        return fill("td_title", title=tip, text=v) if tip is not None else fill("td", text=v)
    if v is None:
        return fill("td_num" if f else "td", text="–")
    text = {"int": lambda: f"{int(v):,}", "ms": lambda: f"{ns_to(v, 'ms'):,.3f}",
            "us": lambda: f"{ns_to(v, 'us'):,.1f}", "pct": lambda: f"{v:.1f}", "bytes": lambda: fmt_bytes(v)}.get(f)
    return fill("td_num", text=text()) if text else fill("td", text=v)


def table(df: pl.DataFrame, columns, cls: str = "") -> str:
    """Escaped HTML table of ``columns`` ((column, header, format), ...), which must all be in ``df``."""
    head = "".join(fill("th", text=h) for _, h, _ in columns)
    rows = "".join(fill("tr", cells_html="".join(cell(r[c], f, r) for c, _, f in columns))
                   for r in df.iter_rows(named=True))
    return fill("table", cls=cls, head_html=head, rows_html=rows)


def _section_html(s: Section, specs: dict[str, dict]) -> str:
    """The section: its intro, charts and tables; a chart that is not available is one line with its reason, said
    once per section however many blocks share it."""
    blocks = [fill("figure", id=b.id, caption=b.caption) if b.id in specs
              else fill("not_available", why=b.missing or "no data") for b in s.blocks]
    return fill("section", id=s.id, title=s.title,
                content_html=fill("intro", text=s.intro) + "".join(dict.fromkeys(blocks)) + s.html)


def page_width(spec: dict) -> dict:
    """A chart spec for the page: single and layered views take the width of their container (the page's, up to
    main's max-width) instead of their fixed width; concatenated views keep theirs (Vega-Lite cannot fit them).
    PNG/SVG copies keep the fixed widths."""
    if not isinstance(spec.get("width"), int | float) or any(k in spec for k in ("hconcat", "vconcat", "concat")):
        return spec
    return {**spec, "width": "container", "autosize": {"type": "fit-x", "contains": "padding"}}


def render_html(title: str, fetched: Fetched, sections: list[Section], findings: list[Finding],
                diag: list[tuple[str, str]], specs: dict[str, dict]) -> str:
    nav = [("sec-overview", "Overview"), ("sec-findings", "Findings")] + [(s.id, s.title) for s in sections]
    if findings:
        found = fill("findings", items_html="".join(fill("finding", level=f.level, text=f.text, anchor=f.anchor)
                                                    for f in findings))
    else:
        found = fill("missing", text="No findings: the analyses they need have no data (see the warnings above).")
    body = [fill("banner", text=" ".join(t for _, t in fetched.banner))] if fetched.banner else []
    body += [fill("section", id="sec-overview", title="Run overview", content_html=overview(fetched, diag)),
            fill("section", id="sec-findings", title="Findings", content_html=found)]
    body += [_section_html(s, specs) for s in sections]
    return fill("page", title=title, csp=CSP, generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                css_html=template_text("page.css"), js_html=template_text("page.js"), vega_html=vega_bundle(),
                nav_html="".join(fill("nav_link", id=i, title=t) for i, t in nav), body_html="".join(body),
                charts_json_html=script_json({k: page_width(v) for k, v in specs.items()}))


def _write_images(specs: dict[str, dict], png_dir, svg_dir) -> None:
    import vl_convert as vlc

    for d, ext in ((png_dir, "png"), (svg_dir, "svg")):
        if not d:
            continue
        d = Path(d)
        d.mkdir(parents=True, exist_ok=True)
        for cid, spec in specs.items():
            name = cid.removeprefix("chart-")
            if ext == "png":
                (d / f"{name}.png").write_bytes(vlc.vegalite_to_png(spec, scale=2))
            else:
                (d / f"{name}.svg").write_text(vlc.vegalite_to_svg(spec), encoding="utf-8")


def build_report(con, out_path, *, png_dir=None, svg_dir=None, title: str | None = None,
                 changes: pl.DataFrame | None = None, step: int | None = None) -> Path:
    """Write the self-contained HTML report of the job in ``con`` to ``out_path`` and return its path.

    With ``png_dir`` / ``svg_dir`` every chart is also written there as ``<chart id>.png`` / ``.svg``. With
    ``changes`` (the rows of ``baseline.diff(job)``) a "What changed" section follows the findings. ``step``: the
    timeline's step (see :func:`collect`); one the trace does not have raises UsageError.
    """
    out_path = Path(out_path)
    fetched, sections, findings, diag = collect(con, step)
    if changes is not None:
        sections.insert(0, changes_section(changes))
    if title is None:
        ov = fetched.get("run_overview")
        title = f"Communication report: {ov.height} rank{'s' if ov.height != 1 else ''}" if ov is not None \
            else "Communication report"
    specs: dict[str, dict] = {}
    for b in (b for s in sections for b in s.blocks if b.chart is not None):
        try:
            specs[b.id] = b.spec()
        except Exception as e:  # noqa: BLE001
            b.missing, b.chart = f"could not build this chart ({type(e).__name__}: {str(e)[:200]})", None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render_html(title, fetched, sections, findings, diag, specs), encoding="utf-8")
    if png_dir or svg_dir:
        _write_images(specs, png_dir, svg_dir)
    return out_path
