"""Findings in plain words, computed from the catalog query frames the report draws.

Each finding is one sentence with its numbers and points at the chart that shows it (``anchor``). Functions are
pure: frames in, findings out; a finding whose data is missing is simply not produced (the section says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from .charts import _col, fmt_bytes


@dataclass
class Finding:
    text: str
    anchor: str  # id of the chart/section that shows it
    level: str = "info"  # 'info' | 'warning' (worth acting on)


def _num(x) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.2f} ms" if ns >= 1e5 else f"{ns / 1e3:,.1f} µs"


def overlap_findings(df: pl.DataFrame | None) -> list[Finding]:
    if df is None or not df.height:
        return []
    comm = _col(df, "comm_ns", "comm_time_ns")
    exp = _col(df, "exposed_comm_ns", "comm_exposed_ns")
    ov = _col(df, "comm_overlapped_ns", "overlapped_ns")
    gm = _col(df, "gemm_overlapped_ns")
    if not comm:
        return []
    total = _num(df[comm].sum()) or 0.0
    if total <= 0:
        return []
    exposed = _num(df[exp].sum()) if exp else (total - (_num(df[ov].sum()) or 0.0) if ov else None)
    out = []
    if exposed is not None:
        pct = 100 * exposed / total
        worst = df.with_columns(((pl.col(exp) if exp else pl.col(comm) - pl.col(ov)) /
                                 pl.when(pl.col(comm) > 0).then(pl.col(comm)).otherwise(None)).alias("_x")) \
                  .sort("_x", descending=True, nulls_last=True).row(0, named=True)
        text = (f"{pct:.0f}% of communication time ({_ms(exposed)} of {_ms(total)}, all ranks) is exposed: "
                f"no compute kernel runs beside it.")
        if df.height > 1 and worst["_x"] is not None:
            text += f" Worst is rank {worst['rank']} with {100 * worst['_x']:.0f}% exposed."
        out.append(Finding(text, "sec-overlap", "warning" if pct >= 30 else "info"))
    if gm:
        g = _num(df[gm].sum()) or 0.0
        out.append(Finding(f"{100 * g / total:.0f}% of communication time overlaps GEMM kernels ({_ms(g)}); "
                           "GEMMs share SMs and memory bandwidth with NCCL, so both may run slower than alone.",
                           "sec-overlap"))
    return out


def breakdown_findings(df: pl.DataFrame | None) -> list[Finding]:
    """From time_breakdown_by_rank (long: rank, category, time_ns, span_pct)."""
    if df is None or not df.height or "category" not in df.columns:
        return []
    idle = df.filter(pl.col("category") == "idle").select("rank", pl.col("span_pct").alias("_p"))
    if not idle.height:
        return []
    d = idle.sort("_p", descending=True, nulls_last=True)
    top, mean = d.row(0, named=True), _num(d["_p"].mean())
    if top["_p"] is None or mean is None:
        return []
    text = f"GPUs are idle {mean:.0f}% of their profiled span on average"
    if d.height > 1:
        text += f"; rank {top['rank']} idles most ({top['_p']:.0f}%)"
    exp = df.filter(pl.col("category") == "communication")
    if exp.height:
        text += (f". Exposed communication (nothing else running) takes {_num(exp['span_pct'].mean()):.0f}% of the "
                 "span on average")
    return [Finding(text + ".", "sec-breakdown", "warning" if mean >= 20 else "info")]


def histogram_findings(df: pl.DataFrame | None) -> list[Finding]:
    if df is None or not df.height:
        return []
    t = _col(df, "total_ns", "time_ns", "duration_ns", "sum_ns")
    b = _col(df, "bucket_bytes", "bucket_lo_bytes", "size_bucket_bytes", "bucket_min_bytes", "bucket")
    cnt = _col(df, "ops", "count", "n", "calls", "n_ops")
    if not (t and b):
        return []
    per = df.group_by("collective").agg(pl.col(t).sum().alias("t")).sort("t", descending=True)
    total = _num(per["t"].sum()) or 0
    if total <= 0:
        return []
    top = per.row(0, named=True)
    out = [Finding(f"{top['collective']} takes {100 * top['t'] / total:.0f}% of communication kernel time "
                   f"({_ms(top['t'])} of {_ms(total)}).", "sec-msgsize")]
    if cnt:
        small = df.filter(pl.col(b) < 65536)
        n_all = _num(df[cnt].sum()) or 0
        n_small = _num(small[cnt].sum()) or 0
        if n_all and n_small:
            out.append(Finding(f"{100 * n_small / n_all:.0f}% of communication calls move less than 64 KiB "
                               f"but take only {100 * (_num(small[t].sum()) or 0) / total:.0f}% of the time; "
                               "such calls are latency-bound, so batching or bucketing them saves launch and "
                               "α costs.", "sec-msgsize"))
    return out


def bandwidth_findings(df: pl.DataFrame | None) -> list[Finding]:
    if df is None or not df.height:
        return []
    bw = _col(df, "busbw_gbps", "busbw_GBps", "bus_bw_gbps", "median_busbw_gbps", "avg_busbw_gbps")
    b = _col(df, "bucket_bytes", "bucket_lo_bytes", "size_bucket_bytes", "bucket_min_bytes", "bucket")
    if not (bw and b):
        return []
    out = []
    for coll, g in df.filter(pl.col(bw).is_not_null()).group_by("collective", maintain_order=True):
        if g.height < 1:
            continue
        best = g.sort(bw, descending=True).row(0, named=True)
        assumed = (f" This assumes a group of {best['group_size']} ranks (the world size): the trace records no "
                   "process group." if best["group_size_assumed"] else "")
        out.append(Finding(f"{coll[0]} peaks at {best[bw]:.1f} GB/s bus bandwidth (messages of "
                           f"{fmt_bytes(best[b])}+); smaller messages get less, see the curve.{assumed}", "sec-busbw"))
    return out[:4]


def latency_findings(model: pl.DataFrame | None, total: pl.DataFrame | None) -> list[Finding]:
    """Latency-bound share and coalescing saving (latency_bound_total), and the fitted α, β, n½ per operation."""
    out = []
    if total is not None and total.height:
        t = total.row(0, named=True)
        pct, save = _num(t.get("latency_bound_pct")), _num(t.get("coalescing_saving_ns"))
        if pct is not None:
            tail = f"; sending the same bytes in operations of at least n½ would save {_ms(save)}" if save else ""
            out.append(Finding(f"{pct:.0f}% of sized communication transfer time (waiting excluded) is in latency-bound "
                               f"operations, smaller than n½ = α·β of their fit{tail}.", "sec-latency",
                               "warning" if pct >= 30 else "info"))
    if model is not None and model.height:
        fitted = model.filter(pl.col("alpha_us").is_not_null()).sort("total_transfer_ns", descending=True)
        for m in fitted.head(3).iter_rows(named=True):
            out.append(Finding(f"{m['collective']} (group of {m['group_size']}): α ≈ {m['alpha_us']:.1f} µs, "
                               f"β ≈ {m['beta_gbps']:.1f} GB/s, n½ ≈ {fmt_bytes(m['n_half_bytes'])} "
                               f"(fit: {m['fit_quality']}, {m['sized_instances']} instances).", "sec-latency"))
        if not fitted.height:
            m = model.sort("total_transfer_ns", descending=True).row(0, named=True)
            out.append(Finding(f"No α-β fit ({m['fit_quality']}); the latency floor of {m['collective']} is "
                               f"{_ms(m['latency_floor_ns'])} (5th percentile transfer time).", "sec-latency"))
    return out


def skew_findings(rank_wait: pl.DataFrame | None, skew: pl.DataFrame | None) -> list[Finding]:
    out = []
    if rank_wait is not None and rank_wait.height:
        last = _col(rank_wait, "times_last", "n_last", "arrived_last_count", "last_arrivals", "times_arrived_last")
        if last:
            d = rank_wait.sort(last, descending=True)
            top = d.row(0, named=True)
            n = _num(d[last].sum()) or 0
            if n:
                out.append(Finding(f"Rank {top['rank']} arrives last in {top[last]} of {n:.0f} collective instances "
                                   f"({100 * top[last] / n:.0f}%): the likeliest straggler.", "sec-skew",
                                   "warning" if top[last] / n >= 0.5 and d.height > 2 else "info"))
    if skew is not None and skew.height:
        s = _col(skew, "start_skew_ns")
        if s:
            med, mx = _num(skew[s].median()), _num(skew[s].max())
            if med is not None and mx is not None:
                out.append(Finding(f"Ranks start a collective {_ms(med)} apart (median start skew; max {_ms(mx)}); "
                                   "the early ranks wait that long inside NCCL.", "sec-skew"))
    return out


def all_findings(frames: dict[str, pl.DataFrame | None], small_bytes: int) -> list[Finding]:
    g = frames.get
    out: list[Finding] = []
    for f in (lambda: overlap_findings(g("overlap_by_rank")),
              lambda: breakdown_findings(g("time_breakdown_by_rank")),
              lambda: latency_findings(g("latency_model"), g("latency_bound_total")),
              lambda: histogram_findings(g("msg_size_histogram")),
              lambda: bandwidth_findings(g("busbw")),
              lambda: skew_findings(g("rank_wait"), g("collective_skew"))):
        try:
            out.extend(f())
        except Exception:  # noqa: BLE001 - a finding that cannot be computed is left out, never fatal
            continue
    return out
