"""Assembling the self-contained HTML report.

The page has no external reference of any kind: Vega, Vega-Lite and vega-embed are inlined from
vl-convert-python's bundle, charts travel as JSON in a ``<script type="application/json">`` tag (every ``<``,
``>`` and ``&`` escaped as ``\\u003c`` ... so no trace text can close the tag), every interpolated string is
HTML-escaped, and a Content-Security-Policy forbids any network request. Render errors are written into the
DOM (``#report-errors``) so a headless browser test can see them.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import altair as alt
import polars as pl

from . import charts as ch
from .data import Fetched, fetch
from .findings import Finding, all_findings

MAX_SKEW_INSTANCES = 60  # heatmap columns
MAX_HEATMAP_RANKS = 64
TIMELINE_SEGMENTS = 150
TIMELINE_RANKS = 16
TOP_KERNELS = 25
MAX_OVERVIEW_RANKS = 64


def esc(x) -> str:
    """HTML-escape any value for text or attribute context."""
    return html.escape("" if x is None else str(x), quote=True)


def script_json(obj) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' survives literally."""
    s = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)
    return (s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one classic script (cached on disk per vl-convert version: ~5 s to build)."""
    import vl_convert as vlc

    version = getattr(vlc, "__version__", None) or "unknown"
    try:
        from importlib.metadata import version as _v

        version = _v("vl-convert-python")
    except Exception:  # noqa: BLE001
        pass
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nsys2comm"
    cache = cache_dir / f"vega-bundle-{re.sub(r'[^0-9A-Za-z._-]', '_', version)}.js"
    try:
        if cache.is_file():
            return cache.read_text(encoding="utf-8")
    except OSError:
        pass
    js = vlc.javascript_bundle()
    if "</script" in js.lower():  # cannot happen with today's bundle; never emit a broken page
        js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.I)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(js, encoding="utf-8")
        tmp.replace(cache)
    except OSError:
        pass
    return js


# ---------------------------------------------------------------------------------------------------------------
# Page model


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
    blocks: list[ChartBlock] = field(default_factory=list)
    html: str = ""  # extra pre-escaped HTML (tables)


def _reason(fetched: Fetched, keys: list[str], diag_hint: str | None, diag: list[str]) -> str:
    """Why a section has no data: the analysis error if one failed, else the matching diagnostics."""
    errs = [fetched.errors[k] for k in keys if k in fetched.errors]
    notes = []
    if diag_hint:
        words = diag_hint.split("|")
        notes = [d for d in diag if any(w in d.lower() for w in words)]
    if errs:
        return "; ".join(dict.fromkeys(errs)) + (f" (see also: {'; '.join(dict.fromkeys(notes))})" if notes else "")
    return "; ".join(dict.fromkeys(notes)) or "the trace has no rows for this analysis"


def _block(fetched: Fetched, keys: list[str], cid: str, caption: str, make, diag: list[str],
           hint: str | None) -> ChartBlock:
    frames = [fetched.get(k) for k in keys]
    if frames[0] is None:
        return ChartBlock(cid, None, caption, _reason(fetched, keys, hint, diag))
    try:
        return ChartBlock(cid, make(*frames), caption)
    except Exception as e:  # noqa: BLE001 - a chart that cannot be drawn says so instead of failing the report
        return ChartBlock(cid, None, caption, f"could not draw this chart ({type(e).__name__}: {str(e)[:200]})")


def _diag_lines(fetched: Fetched) -> list[tuple[str, str]]:
    """(severity, message) from the diagnostics analysis, else from ingest_notes."""
    out: list[tuple[str, str]] = []
    for key in ("diagnostics", "ingest_notes"):
        df = fetched.get(key)
        if df is None:
            continue
        msg = ch._col(df, "message", "detail", "why", "text")
        sev = ch._col(df, "severity", "level")
        extra = [c for c in ("affects", "analysis", "area", "what", "missing") if c in df.columns]
        for r in df.iter_rows(named=True):
            text = str(r[msg]) if msg else "; ".join(f"{k}={v}" for k, v in r.items())
            if extra:
                text = " / ".join(str(r[c]) for c in extra if r[c]) + (": " if any(r[c] for c in extra) else "") + text
            out.append((str(r[sev]) if sev else "info", text))
        if out:
            break
    return list(dict.fromkeys(out))


def _table(df: pl.DataFrame, columns: list[tuple[str, str, str]], cls: str = "") -> str:
    """columns: (column, header, format) -> escaped HTML table; format: '' | 'int' | 'ms' | 'us' | 'pct' | 'bytes'."""
    def cell(v, f):
        if v is None:
            return "<td class=num>–</td>" if f else "<td>–</td>"
        if f == "int":
            return f"<td class=num>{int(v):,}</td>"
        if f == "ms":
            return f"<td class=num>{float(v) / 1e6:,.3f}</td>"
        if f == "ms_":
            return f"<td class=num>{float(v):,.3f}</td>"
        if f == "us":
            return f"<td class=num>{float(v) / 1e3:,.1f}</td>"
        if f == "pct":
            return f"<td class=num>{float(v):.1f}</td>"
        if f == "bytes":
            return f"<td class=num>{esc(ch.fmt_bytes(v))}</td>"
        return f"<td>{esc(v)}</td>"

    def titled(v, f, r):  # 'title:COL': the cell's tooltip shows column COL (a full kernel name behind a base name)
        if f.startswith("title:"):
            tip = r.get(f[6:])
            return f'<td title="{esc(tip)}">{esc(v)}</td>' if tip is not None else cell(v, "")
        return cell(v, f)

    cols = [c for c in columns if c[0] in df.columns]
    head = "".join(f"<th>{esc(h)}</th>" for _, h, _ in cols)
    body = "".join("<tr>" + "".join(titled(r[c], f, r) for c, _, f in cols) + "</tr>" for r in df.iter_rows(named=True))
    return f'<div class="tablewrap"><table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


# ---------------------------------------------------------------------------------------------------------------
# Data preparation (caps rows so the page stays small whatever the trace size)


def _skew_long(skew: pl.DataFrame | None, wait: pl.DataFrame | None) -> pl.DataFrame | None:
    """collective_skew -> (instance, rank, wait_ns) for the heatmap, the MAX_SKEW_INSTANCES largest skews."""
    if skew is None:
        return None
    inst = ch._col(skew, "instance_id", "instance", "instance_label", "seq")
    s = ch._col(skew, "start_skew_ns", "latency_ns")
    if "rank" in skew.columns and ch._col(skew, "wait_ns", "rank_wait_ns"):
        w = ch._col(skew, "wait_ns", "rank_wait_ns")
        top = (skew.group_by(inst).agg(pl.col(w).max().alias("_m")).sort("_m", descending=True)
               .head(MAX_SKEW_INSTANCES)[inst])
        d = skew.filter(pl.col(inst).is_in(top.implode()) & (pl.col("rank") < MAX_HEATMAP_RANKS))
        order = {v: i for i, v in enumerate(top.to_list())}
        return d.with_columns(pl.col(inst).replace_strict(order, default=None).alias("_o")).sort("_o", "rank") \
                .drop("_o")
    # collective_skew: one row per instance, rank_wait_ns = list of {rank, wait_ns}
    if "rank_wait_ns" in skew.columns and s:
        key = ch._col(skew, "instance_key", "instance_id", "instance") or inst
        top = skew.sort(s, descending=True, nulls_last=True).head(MAX_SKEW_INSTANCES)
        top = top.with_row_index("_o")
        d = top.select("_o", pl.col(key).cast(pl.Utf8).alias("instance"), "collective", "rank_wait_ns") \
               .explode("rank_wait_ns").drop_nulls("rank_wait_ns").unnest("rank_wait_ns")
        d = d.filter(pl.col("rank") < MAX_HEATMAP_RANKS).sort("_o", "rank").drop("_o")
        return d if d.height else None
    return None


def _queries() -> dict[str, tuple[str, dict]]:
    return {
        "run_overview": ("run_overview", {}),
        "files": ("files", {}),
        "diagnostics": ("diagnostics", {}),
        "ingest_notes": ("ingest_notes", {}),
        "time_breakdown_by_rank": ("time_breakdown_by_rank", {}),
        "overlap_by_rank": ("overlap_by_rank", {}),
        "overlap_by_collective": ("comm_overlap_by_collective", {}),
        "msg_size_histogram": ("msg_size_histogram", {}),
        "busbw": ("collective_bandwidth", {}),
        "latency_model": ("latency_model", {}),
        "latency_by_size": ("latency_by_size", {}),
        "latency_bound_total": ("latency_bound_total", {}),
        "transfer_by_pair": ("transfer_by_pair", {}),
        "collective_skew": ("collective_skew", {}),
        "rank_wait": ("rank_wait", {}),
        "step_timeline": ("step_timeline", {"max_segments": TIMELINE_SEGMENTS, "max_ranks": TIMELINE_RANKS}),
        "top_comm_kernels": ("top_comm_kernels", {"n": TOP_KERNELS}),
    }


def _mark_not_available(con, F: Fetched) -> None:
    """Frames whose numbers cannot be computed are dropped with the reason, so their blocks show a "not available"
    box instead of an empty chart frame, a one-row heatmap or a finding built on zeros."""
    n_ranks = con.execute("SELECT count(DISTINCT rank) FROM ranks").fetchone()[0]
    n_comm = con.execute("SELECT count(*) FROM kernels WHERE kernel_class = 'communication'").fetchone()[0]

    def drop(key: str, why: str) -> None:
        F.frames.pop(key, None)
        F.errors.setdefault(key, f"not available: {why}")

    if not n_comm:
        for key in ("overlap_by_rank", "overlap_by_collective", "msg_size_histogram", "busbw", "collective_skew",
                    "rank_wait", "top_comm_kernels"):
            drop(key, "the job has no communication kernels")
    if n_ranks < 2:
        for key in ("collective_skew", "rank_wait"):
            drop(key, f"cross-rank skew needs at least two ranks; this job has {n_ranks}")
    skew = F.get("collective_skew")
    if skew is not None and skew["start_skew_ns"].null_count() == skew.height:
        drop("collective_skew", "no collective was matched on two or more ranks")
    bw = F.get("busbw")
    if F.get("busbw") is None and "busbw" not in F.errors:
        drop("busbw", "no collective has a known message size")
    elif bw is not None and bw["busbw_gbps"].null_count() == bw.height:
        drop("busbw", "bus bandwidth needs the group size of each collective, which the trace does not record")


def collect(con) -> tuple[Fetched, list[Section], list[Finding], list[tuple[str, str]]]:
    """Run the catalog queries and lay out sections (no HTML yet): reusable for other front ends."""
    fetched = fetch(con, _queries())
    _mark_not_available(con, fetched)
    diag = _diag_lines(fetched)
    dtext = [m for _, m in diag]
    F = fetched

    sections: list[Section] = []
    sec = Section("sec-breakdown", "Per-rank time breakdown",
                  "Where each rank's GPU time goes over the profiled span.")
    sec.blocks.append(_block(F, ["time_breakdown_by_rank"], "chart-breakdown",
                             "Stacked bars, one per rank: exposed communication, compute classes, memory and idle "
                             "time (ms).", ch.time_breakdown_chart, dtext, None))
    sections.append(sec)

    sec = Section("sec-overlap", "Communication / compute / GEMM overlap",
                  "How much communication runs hidden under computation, per rank and per collective.")
    sec.blocks.append(_block(F, ["overlap_by_rank"], "chart-overlap-rank",
                             "Per rank, communication kernel time split into exposed, hidden under GEMM and hidden "
                             "under other compute (ms).", ch.overlap_by_rank_chart, dtext, None))
    sec.blocks.append(_block(F, ["overlap_by_collective"], "chart-overlap-coll",
                             "Per collective, the share of its kernel time that is exposed or hidden (%).",
                             ch.overlap_by_collective_chart, dtext, None))
    sections.append(sec)

    sec = Section("sec-msgsize", "Message sizes", "How much time each collective spends at each message size.")
    sec.blocks.append(_block(F, ["msg_size_histogram"], "chart-msgsize",
                             "Kernel time per power-of-two message-size bucket, one colour per collective (ms).",
                             ch.msg_size_histogram_chart, dtext, "size|blob|bytes"))
    sections.append(sec)

    sec = Section("sec-busbw", "Bandwidth against message size",
                  "Achieved bus bandwidth per collective; flat low values at small sizes mean latency-bound calls.")
    sec.blocks.append(_block(F, ["busbw"], "chart-busbw",
                             "nccl-tests bus bandwidth (GB/s) per message-size bucket, log-scale size axis.",
                             ch.busbw_chart, dtext, "size|blob|bytes|group"))
    sections.append(sec)

    sec = Section("sec-latency", "Latency-bound communication",
                  "Transfer time apart from waiting (matched across ranks) against size, the α-β fit per "
                  "collective and for point-to-point, and who waits for whom in send/recv.")
    sec.blocks.append(_block(F, ["latency_model", "latency_by_size"], "chart-latency",
                             "Log-log: median transfer time per size (p10–p90 whisker), fitted t = α + bytes/β "
                             "(dashed) and n½ = α·β (dotted rule); without sizes, the transfer-time range per "
                             "collective from the latency floor.",
                             ch.latency_chart, dtext, "latency|transfer|size|blob|communication"))
    sec.blocks.append(_block(F, ["transfer_by_pair"], "chart-p2p-pairs",
                             "Point-to-point, sender × receiver: colour = median transfer time (µs), number = "
                             "median wait of the earlier side (µs).",
                             ch.pair_heatmap_chart, dtext, "p2p|send|recv|peer"))
    sections.append(sec)

    sec = Section("sec-skew", "Cross-rank skew and stragglers",
                  "How long ranks wait for each other at collectives, and who arrives last.")
    heat = _skew_long(F.get("collective_skew"), F.get("rank_wait"))
    if heat is not None and heat.height:
        F.frames["_skew_heat"] = heat
    elif "collective_skew" in F.errors:
        F.errors["_skew_heat"] = F.errors["collective_skew"]
    sec.blocks.append(_block(F, ["_skew_heat"], "chart-skew",
                             f"Heatmap rank × collective instance (the {MAX_SKEW_INSTANCES} most skewed): wait until "
                             "the last rank arrived (µs).", ch.skew_heatmap_chart, dtext, "collective_skew|skew|seq"))
    sec.blocks.append(_block(F, ["rank_wait"], "chart-straggler",
                             "Ranks by how often they arrived last at a collective; colour = wait (ms).",
                             ch.straggler_chart, dtext, "rank_wait|skew|seq"))
    sections.append(sec)

    sec = Section("sec-timeline", "Timeline of one step",
                  f"Communication, compute and memory lanes for up to {TIMELINE_RANKS} ranks, merged into at most "
                  f"{TIMELINE_SEGMENTS} segments per lane.")
    sec.blocks.append(_block(F, ["step_timeline"], "chart-timeline",
                             "GPU activity per rank and lane; colour = kernel class, faint = partly idle segment.",
                             ch.step_timeline_chart, dtext, "step"))
    sections.append(sec)

    sec = Section("sec-kernels", "Top communication kernels",
                  f"The {TOP_KERNELS} communication kernels (by name and collective) with the most total time.")
    top = F.get("top_comm_kernels")
    if top is not None:
        sec.html = _table(top, [("short_name", "kernel", "title:top_name"), ("n_names", "variants", "int"),
                                ("collective", "collective", ""),
                                ("calls", "calls", "int"), ("ranks", "ranks", "int"),
                                ("total_ms", "total (ms)", "ms_"), ("mean_us", "mean (µs)", "pct"),
                                ("max_us", "max (µs)", "pct"), ("exposed_pct", "exposed (%)", "pct"),
                                ("median_msg_bytes", "median size", "bytes"),
                                ("time_share_pct", "share of comm time (%)", "pct")], "kernels")
    else:
        sec.html = f'<p class="missing">No data: {esc(_reason(F, ["top_comm_kernels"], None, dtext))}</p>'
    sections.append(sec)

    findings = all_findings({k: F.get(k) for k in _queries()} | {"busbw": F.get("busbw")}, 0)
    return fetched, sections, findings, diag


# ---------------------------------------------------------------------------------------------------------------
# HTML

CSS = """
:root{--fg:#1d2330;--muted:#5b6472;--line:#e3e6eb;--bg:#f6f7f9;--warn:#b5323a;--accent:#4c78a8}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);background:var(--bg)}
header{background:#1d2330;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px;font-weight:600}
header .sub{color:#c9ced6;font-size:13px;margin-top:2px}
nav{background:#fff;border-bottom:1px solid var(--line);padding:8px 32px;position:sticky;top:0;z-index:2;font-size:13px}
nav a{color:var(--accent);text-decoration:none;margin-right:16px;white-space:nowrap}
main{max-width:1040px;margin:0 auto;padding:8px 24px 48px}
section{background:#fff;border:1px solid var(--line);border-radius:6px;padding:16px 22px;margin:18px 0}
h2{font-size:18px;margin:0 0 4px}
p.intro{color:var(--muted);margin:0 0 12px}
figure{margin:14px 0 20px}
figcaption{color:var(--muted);font-size:12.5px;margin-top:4px}
.chart{min-height:40px;overflow-x:auto}
.missing{background:#fff8e6;border-left:4px solid #f58518;padding:8px 12px;color:#5a4500;margin:8px 0}
ul.findings{padding-left:0;list-style:none;margin:0}
ul.findings li{padding:8px 12px;border-left:4px solid var(--accent);background:#f3f6fa;margin:6px 0}
ul.findings li.warning{border-left-color:var(--warn);background:#fbf1f1}
ul.findings a{font-size:12px;margin-left:6px}
ul.notes li.warning{color:var(--warn)}
.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 18px;margin:0 0 12px}
.kv dt{color:var(--muted)}.kv dd{margin:0}
.tablewrap{overflow-x:auto}
table{border-collapse:collapse;font-size:12.5px;width:100%}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f4f6;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.kernels td:first-child{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;word-break:break-all}
#report-errors{background:#fbf1f1;border:1px solid var(--warn);color:var(--warn);padding:8px 12px;margin:12px 0}
footer{color:var(--muted);font-size:12px;text-align:center;padding:12px}
"""

RENDER_JS = r"""
(function () {
  var errBox = document.getElementById('report-errors');
  function fail(msg) {
    errBox.hidden = false;
    var li = document.createElement('li');
    li.textContent = String(msg);
    errBox.querySelector('ul').appendChild(li);
    document.body.setAttribute('data-report-errors', String(errBox.querySelectorAll('li').length));
  }
  window.addEventListener('error', function (e) { fail('script error: ' + e.message); });
  window.addEventListener('unhandledrejection', function (e) { fail('unhandled: ' + e.reason); });
  var specs;
  try {
    specs = JSON.parse(document.getElementById('report-charts').textContent);
  } catch (e) { fail('chart data: ' + e); return; }
  if (typeof vegaEmbed !== 'function') { fail('vega-embed did not load'); return; }
  var logger = {
    _level: 0,
    level: function (l) { if (l !== undefined) { this._level = l; return this; } return this._level; },
    error: function () { fail('vega error: ' + Array.prototype.join.call(arguments, ' ')); return this; },
    warn: function () { fail('vega warning: ' + Array.prototype.join.call(arguments, ' ')); return this; },
    info: function () { return this; },
    debug: function () { return this; }
  };
  var pending = Object.keys(specs).map(function (id) {
    var el = document.getElementById(id);
    if (!el) { fail('no container for ' + id); return Promise.resolve(); }
    return vegaEmbed(el, specs[id], {
      renderer: 'svg', logger: logger, tooltip: true,
      actions: {export: true, source: false, compiled: false, editor: false}
    }).then(function () { el.setAttribute('data-status', 'rendered'); })
      .catch(function (e) { el.setAttribute('data-status', 'error'); fail(id + ': ' + e); });
  });
  Promise.all(pending).then(function () { document.body.setAttribute('data-charts-done', 'true'); });
})();
"""

CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:; connect-src 'none'; form-action 'none'; base-uri 'none'")


def _overview_html(fetched: Fetched, diag: list[tuple[str, str]]) -> str:
    ov = fetched.get("run_overview")
    files = fetched.get("files")
    parts = []
    if ov is not None:
        first = ov["first_ns"].min() if "first_ns" in ov.columns else None
        last = ov["last_ns"].max() if "last_ns" in ov.columns else None
        gpus = sorted({g for s in ov["gpus"].drop_nulls().to_list() for g in [s]}) if "gpus" in ov.columns else []
        names = sorted({re.sub(r"\s*\(\d+\)$", "", x) for s in ov["gpus"].drop_nulls().to_list()
                        for x in s.split(", ")}) if "gpus" in ov.columns else []
        n_gpus = sum(len(s.split(", ")) for s in ov["gpus"].drop_nulls().to_list()) if "gpus" in ov.columns else 0
        kv = [("Ranks", f"{ov.height}"),
              ("GPUs", f"{n_gpus} ({', '.join(names)})" if n_gpus else "unknown"),
              ("Trace files", f"{files.height}" if files is not None else "?"),
              ("Sources", ", ".join(sorted({f"{r['source']} {r['format_version'] or ''}".strip()
                                           for r in files.iter_rows(named=True)})) if files is not None else "?"),
              ("Producers", "; ".join(sorted({str(r['producer']) for r in files.iter_rows(named=True)
                                              if r['producer']}))[:400] if files is not None else "?"),
              ("Time span", f"{(last - first) / 1e6:,.3f} ms of GPU activity" if first is not None and last is not None
               else "no GPU activity"),
              ("Kernels", f"{int(ov['n_kernels'].sum()):,} ({int(ov['n_comm_kernels'].sum()):,} communication)")]
        parts.append('<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in kv) + "</dl>")
        del gpus
    else:
        parts.append(f'<p class="missing">No run overview: {esc(fetched.errors.get("run_overview", "empty job"))}</p>')
    if diag:
        items = "".join(f'<li class="{esc(s)}">{esc(m)}</li>' for s, m in diag[:50])
        more = f"<li>… and {len(diag) - 50} more</li>" if len(diag) > 50 else ""
        parts.append(f'<h3>Warnings and missing data</h3><ul class="notes">{items}{more}</ul>')
    if ov is not None:
        parts.append("<details><summary>Ranks and files</summary>" + _table(ov.head(MAX_OVERVIEW_RANKS), [
            ("rank", "rank", ""), ("host", "host", ""), ("gpus", "GPUs", ""), ("source", "source", ""),
            ("n_kernels", "kernels", "int"), ("n_comm_kernels", "comm kernels", "int"),
            ("n_mem_ops", "memory ops", "int"), ("span_ms", "span (ms)", "ms_"), ("file_path", "file", "")]) +
            (f"<p>… {ov.height - MAX_OVERVIEW_RANKS} more ranks</p>" if ov.height > MAX_OVERVIEW_RANKS else "") +
            "</details>")
    return "".join(parts)


def render_html(title: str, fetched: Fetched, sections: list[Section], findings: list[Finding],
                diag: list[tuple[str, str]], specs: dict[str, dict]) -> str:
    nav = ['<a href="#sec-overview">Overview</a>', '<a href="#sec-findings">Findings</a>']
    nav += [f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections]
    body = [f'<section id="sec-overview"><h2>Run overview</h2>{_overview_html(fetched, diag)}</section>']
    if findings:
        items = "".join(f'<li class="{esc(f.level)}">{esc(f.text)}<a href="#{esc(f.anchor)}">see chart</a></li>'
                        for f in findings)
        body.append(f'<section id="sec-findings"><h2>Findings</h2><ul class="findings">{items}</ul></section>')
    else:
        body.append('<section id="sec-findings"><h2>Findings</h2><p class="missing">No findings: the analyses they '
                    'need have no data (see the warnings above).</p></section>')
    for s in sections:
        inner = [f"<h2>{esc(s.title)}</h2><p class=intro>{esc(s.intro)}</p>"]
        for b in s.blocks:
            if b.id in specs:
                inner.append(f'<figure><div class="chart" id="{esc(b.id)}" data-chart="1"></div>'
                             f"<figcaption>{esc(b.caption)}</figcaption></figure>")
            else:
                inner.append(f'<figure><p class="missing"><strong>Not available:</strong> {esc(b.caption)} '
                             f'<br>Why: {esc(b.missing or "no data")}</p></figure>')
        inner.append(s.html)
        body.append(f'<section id="{esc(s.id)}">{"".join(inner)}</section>')
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f'<header><h1>{esc(title)}</h1><div class="sub">nsys2comm communication report · generated {esc(generated)}'
        f"</div></header><nav>{''.join(nav)}</nav><main>",
        '<div id="report-errors" hidden><strong>Some charts failed to render:</strong><ul></ul></div>',
        "".join(body),
        "</main><footer>Self-contained report: works offline, makes no network requests. Charts: Vega-Lite.</footer>",
        f'<script type="application/json" id="report-charts">{script_json(specs)}</script>',
        f"<script>{vega_bundle()}</script>",
        f"<script>{RENDER_JS}</script>",
        "</body></html>\n",
    ])


def build_report(con, out_path, *, png_dir=None, svg_dir=None, title: str | None = None) -> Path:
    """Write the self-contained HTML report of the job in ``con`` to ``out_path`` and return its path.

    With ``png_dir`` / ``svg_dir`` every chart is also written there as ``<chart id>.png`` / ``.svg``.
    """
    out_path = Path(out_path)
    fetched, sections, findings, diag = collect(con)
    if title is None:
        ov = fetched.get("run_overview")
        title = f"Communication report: {ov.height} rank{'s' if ov.height != 1 else ''}" if ov is not None \
            else "Communication report"
    specs: dict[str, dict] = {}
    for s in sections:
        for b in s.blocks:
            if b.chart is None:
                continue
            try:
                specs[b.id] = b.spec()
            except Exception as e:  # noqa: BLE001
                b.missing, b.chart = f"could not build this chart ({type(e).__name__}: {str(e)[:200]})", None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render_html(title, fetched, sections, findings, diag, specs), encoding="utf-8")
    if png_dir or svg_dir:
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
    return out_path
