"""Chart builders: pure functions from catalog query frames (polars) to Altair charts.

Every function takes the frame a catalog query returns (``run_query(con, name, params)``), draws aggregated data
only (a few hundred marks at most, whatever the trace size) and returns an ``alt.Chart`` whose title states what
it shows. They work as well in a notebook as in the report::

    from nsys2comm.analysis import run_query
    from nsys2comm.report import overlap_by_rank_chart
    overlap_by_rank_chart(run_query(con, "overlap_by_rank", {}))

Colours are fixed per class of GPU work (:data:`CLASS_COLORS`) so that every chart reads the same way.
Times are shown in milliseconds (or microseconds where noted), sizes in bytes with binary prefixes, bandwidths
in GB/s (1e9 bytes per second), always with the unit in the axis title.
"""

from __future__ import annotations

import math

import altair as alt
import polars as pl

# One colour per class of GPU time, used by every chart (Tableau 10 hues).
CLASS_COLORS: dict[str, str] = {
    "communication": "#E45756",  # red
    "exposed communication": "#B5323A",  # dark red: communication nothing hides
    "overlapped by GEMM": "#54A24B",  # green: communication hidden under GEMM
    "overlapped by other compute": "#9467BD",  # purple: computation + communication, as in the breakdown
    "gemm": "#54A24B",  # green
    "convolution": "#72B7B2",  # teal
    "attention": "#B279A2",  # purple
    "compute": "#4C78A8",  # blue
    "memory": "#F58518",  # orange
    "idle": "#BAB0AC",  # grey
}
COLLECTIVE_ORDER = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                    "gather", "scatter", "send", "recv", "send_recv", "barrier", "unknown"]
WIDTH = 760
MAX_BARS = 64  # ranks shown in per-rank bar charts (the report keeps the most interesting ones)


def _scale(domain: list[str]) -> alt.Scale:
    return alt.Scale(domain=domain, range=[CLASS_COLORS[d] for d in domain])


def _title(text: str, subtitle: str | None = None) -> alt.TitleParams:
    return alt.TitleParams(text=text, subtitle=subtitle or alt.Undefined, anchor="start", fontSize=14,
                           subtitleColor="#555", subtitleFontSize=11)


def fmt_bytes(n: float | int | None) -> str:
    """'512 B', '64 KiB', '1.5 MiB' ... (binary prefixes)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _col(df: pl.DataFrame, *names: str) -> str | None:
    """First of ``names`` that is a column of ``df``."""
    return next((n for n in names if n in df.columns), None)


def _ms(df: pl.DataFrame, col: str | None) -> pl.Expr:
    return (pl.col(col).cast(pl.Float64) / 1e6) if col else pl.lit(0.0)


# ---------------------------------------------------------------------------------------------------------------
# Per-rank time breakdown

# time_breakdown_by_rank categories (exclusive combinations of running classes) and their colours: communication
# alone is exposed (dark red), computation beside communication is purple (blue + red), memory work orange.
BREAKDOWN_COLORS: dict[str, str] = {
    "communication": CLASS_COLORS["exposed communication"],
    "computation overlapping communication": "#9467BD",
    "communication overlapping memory": "#FF9D98",
    "computation overlapping communication overlapping memory": "#C5B0D5",
    "computation": CLASS_COLORS["compute"],
    "computation overlapping memory": "#9ECAE9",
    "memory": CLASS_COLORS["memory"],
    "idle": CLASS_COLORS["idle"],
}
BREAKDOWN_LABELS = {
    "communication": "communication only (exposed)",
    "computation overlapping communication": "computation + communication",
    "communication overlapping memory": "communication + memory",
    "computation overlapping communication overlapping memory": "computation + communication + memory",
    "computation": "computation only",
    "computation overlapping memory": "computation + memory",
    "memory": "memory only",
    "idle": "idle",
}


def time_breakdown_chart(df: pl.DataFrame) -> alt.Chart:
    """Stacked horizontal bars from time_breakdown_by_rank (rank, category, time_ns, span_pct): where each rank's
    GPU span goes, in exclusive combinations of running classes."""
    ranks = df["rank"].unique().sort().head(MAX_BARS)
    d = df.filter(pl.col("rank").is_in(ranks.implode())).select(
        pl.col("rank"), pl.col("category").cast(pl.Utf8),
        (pl.col("time_ns").cast(pl.Float64) / 1e6).alias("time_ms"),
        pl.col("span_pct").cast(pl.Float64) if "span_pct" in df.columns else pl.lit(None, pl.Float64).alias("span_pct"))
    d = d.with_columns(pl.col("category").replace(BREAKDOWN_LABELS).alias("activity"))
    cats = [c for c in BREAKDOWN_COLORS if c in set(d["category"].to_list())]
    cats += sorted(set(d["category"].to_list()) - set(cats))
    labels = [BREAKDOWN_LABELS.get(c, c) for c in cats]
    colors = [BREAKDOWN_COLORS.get(c, "#7f7f7f") for c in cats]
    order = {lab: i for i, lab in enumerate(labels)}
    d = d.with_columns(pl.col("activity").replace_strict(order, default=99).alias("order")).drop("category")
    n = d["rank"].n_unique()
    return alt.Chart(d, title=_title("GPU time per rank by activity",
                                     "Each bar is one rank's GPU span, split into exclusive combinations of what runs; "
                                     "dark red = communication nothing hides")).mark_bar().encode(
        y=alt.Y("rank:O", title="rank"),
        x=alt.X("time_ms:Q", title="time (ms)", stack="zero"),
        color=alt.Color("activity:N", scale=alt.Scale(domain=labels, range=colors), title="activity",
                        sort=labels, legend=alt.Legend(labelLimit=260)),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("activity:N", title="activity"),
                 alt.Tooltip("time_ms:Q", title="time (ms)", format=",.3f"),
                 alt.Tooltip("span_pct:Q", title="share of span (%)", format=".1f")],
    ).properties(width=WIDTH - 300, height=max(60, min(18 * n, 600)))


# ---------------------------------------------------------------------------------------------------------------
# Overlap

OVERLAP_PARTS = ["exposed communication", "overlapped by other compute", "overlapped by GEMM"]


def _overlap_long(df: pl.DataFrame, key: str, total: str, overlapped: str, gemm: str) -> pl.DataFrame:
    d = df.select(
        pl.col(key).cast(pl.Utf8).alias(key),
        (pl.col(total) - pl.col(overlapped)).cast(pl.Float64).alias("exposed communication"),
        (pl.col(overlapped) - pl.col(gemm)).clip(0).cast(pl.Float64).alias("overlapped by other compute"),
        pl.col(gemm).cast(pl.Float64).alias("overlapped by GEMM"),
        pl.col(total).cast(pl.Float64).alias("_total"),
    )
    long = d.unpivot(index=[key, "_total"], on=OVERLAP_PARTS, variable_name="part", value_name="ns")
    order = {c: i for i, c in enumerate(OVERLAP_PARTS)}
    return long.with_columns((pl.col("ns") / 1e6).alias("time_ms"),
                             (100 * pl.col("ns") / pl.when(pl.col("_total") > 0).then(pl.col("_total"))
                              .otherwise(None)).fill_null(0).alias("share_pct"),
                             pl.col("part").replace_strict(order, default=9).alias("order")).drop("ns", "_total")


def overlap_by_rank_chart(df: pl.DataFrame) -> alt.Chart:
    """Per rank: communication time split into exposed / hidden under GEMM / hidden under other compute."""
    total = _col(df, "comm_ns", "comm_time_ns")
    ov = _col(df, "comm_overlapped_ns", "overlapped_ns")
    gm = _col(df, "gemm_overlapped_ns", "comm_gemm_overlapped_ns")
    long = _overlap_long(df.head(MAX_BARS), "rank", total, ov, gm)
    n = long["rank"].n_unique()
    return alt.Chart(long, title=_title("Communication overlap per rank",
                                        "Communication kernel time split into exposed (nothing else running) and "
                                        "hidden under GEMM or other compute")).mark_bar().encode(
        y=alt.Y("rank:O", title="rank", sort=None),
        x=alt.X("time_ms:Q", title="communication time (ms)", stack="zero"),
        color=alt.Color("part:N", scale=_scale(OVERLAP_PARTS), title="communication time", sort=OVERLAP_PARTS),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("rank:N"), alt.Tooltip("part:N", title="part"),
                 alt.Tooltip("time_ms:Q", title="time (ms)", format=",.3f"),
                 alt.Tooltip("share_pct:Q", title="share of comm time (%)", format=".1f")],
    ).properties(width=WIDTH - 200, height=max(60, min(18 * n, 600)))


def overlap_by_collective_chart(df: pl.DataFrame) -> alt.Chart:
    """Per collective: share of its time exposed / hidden under GEMM / hidden under other compute (100% bars)."""
    total = _col(df, "comm_ns", "duration_ns", "total_ns")
    ov = _col(df, "comm_overlapped_ns", "overlapped_by_compute_ns", "overlapped_ns")
    gm = _col(df, "gemm_overlapped_ns", "overlapped_by_gemm_ns")
    long = _overlap_long(df, "collective", total, ov, gm)
    cols = [c for c in COLLECTIVE_ORDER if c in set(long["collective"].to_list())]
    cols += sorted(set(long["collective"].to_list()) - set(cols))
    return alt.Chart(long, title=_title("Communication overlap per collective",
                                        "Share of each collective's kernel time that is exposed or hidden under "
                                        "compute (all ranks)")).mark_bar().encode(
        y=alt.Y("collective:N", title="collective", sort=cols),
        x=alt.X("share_pct:Q", title="share of collective time (%)", stack="zero", scale=alt.Scale(domain=[0, 100])),
        color=alt.Color("part:N", scale=_scale(OVERLAP_PARTS), title="communication time", sort=OVERLAP_PARTS),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("collective:N"), alt.Tooltip("part:N", title="part"),
                 alt.Tooltip("time_ms:Q", title="time (ms)", format=",.3f"),
                 alt.Tooltip("share_pct:Q", title="share (%)", format=".1f")],
    ).properties(width=WIDTH - 200, height=max(60, 24 * len(cols)))


# ---------------------------------------------------------------------------------------------------------------
# Message sizes and bandwidth


def _bucket_col(df: pl.DataFrame) -> str:
    c = _col(df, "bucket_bytes", "bucket_lo_bytes", "size_bucket_bytes", "bucket_min_bytes", "msg_bytes_bucket",
             "bucket")
    if c is None:
        raise KeyError(f"no size-bucket column in {df.columns}")
    return c


def _with_size_label(df: pl.DataFrame, col: str) -> pl.DataFrame:
    df = df.filter(pl.col(col).is_not_null())  # unknown sizes have no place on a size axis
    return df.with_columns(pl.col(col).cast(pl.Float64).alias("size_bytes"),
                           pl.col(col).map_elements(fmt_bytes, return_dtype=pl.Utf8).alias("size"))


def msg_size_histogram_chart(df: pl.DataFrame) -> alt.Chart:
    """Per collective: time spent in each power-of-two message-size bucket (bars), calls in the tooltip."""
    b = _bucket_col(df)
    t = _col(df, "total_ns", "time_ns", "duration_ns", "sum_ns")
    cnt = _col(df, "ops", "count", "n", "calls", "n_ops")
    d = _with_size_label(df, b).with_columns(_ms(df, t).alias("time_ms"),
                                             pl.col(cnt).alias("calls") if cnt else pl.lit(None).alias("calls"))
    sizes = d.sort("size_bytes")["size"].unique(maintain_order=True).to_list()
    cols = [c for c in COLLECTIVE_ORDER if c in set(d["collective"].to_list())]
    cols += sorted(set(d["collective"].to_list()) - set(cols))
    keep = ["collective", "size", "size_bytes", "time_ms", "calls"]
    d = d.select(keep)
    return alt.Chart(d, title=_title("Message-size histogram per collective",
                                     "Kernel time per power-of-two message-size bucket (nccl-tests size convention)"
                                     )).mark_bar().encode(
        x=alt.X("size:O", title="message size (bucket lower bound)", sort=sizes, axis=alt.Axis(labelAngle=-45)),
        y=alt.Y("time_ms:Q", title="kernel time (ms)"),
        color=alt.Color("collective:N", title="collective", sort=cols, scale=alt.Scale(scheme="tableau10")),
        xOffset=alt.XOffset("collective:N", sort=cols),
        tooltip=[alt.Tooltip("collective:N"), alt.Tooltip("size:O", title="bucket"),
                 alt.Tooltip("calls:Q", title="calls", format=","),
                 alt.Tooltip("time_ms:Q", title="time (ms)", format=",.3f")],
    ).properties(width=WIDTH - 140, height=260)


def busbw_chart(df: pl.DataFrame) -> alt.Chart:
    """Bus bandwidth (nccl-tests busbw, GB/s) against message size, one line per collective."""
    b = _bucket_col(df)
    bw = _col(df, "busbw_gbps", "busbw_GBps", "bus_bw_gbps", "median_busbw_gbps", "avg_busbw_gbps")
    d = _with_size_label(df, b).filter(pl.col(bw).is_not_null() & (pl.col(bw) > 0))
    alg = _col(df, "algbw_gbps", "algbw_GBps", "avg_algbw_gbps", "median_algbw_gbps")
    cnt = _col(df, "ops", "count", "n", "calls", "n_ops")
    # busbw from an assumed group size (the world size of a trace that records no group) is labelled as such
    d = d.with_columns(pl.when(pl.col("group_size_assumed"))
                       .then(pl.col("collective") + " (group size " + pl.col("group_size").cast(pl.Utf8) + " assumed)")
                       .otherwise(pl.col("collective")).alias("collective"))
    d = d.select("collective", "size", "size_bytes", pl.col(bw).alias("busbw_gbps"),
                 (pl.col(alg) if alg else pl.lit(None, pl.Float64)).alias("algbw_gbps"),
                 (pl.col(cnt) if cnt else pl.lit(None, pl.Int64)).alias("calls"))
    cols = [c for c in COLLECTIVE_ORDER if c in set(d["collective"].to_list())]
    cols += sorted(set(d["collective"].to_list()) - set(cols))
    base = alt.Chart(d, title=_title("Bus bandwidth against message size",
                                     "nccl-tests busbw per collective and message-size bucket; higher is better"))
    enc = dict(
        x=alt.X("size_bytes:Q", title="message size (bytes, log scale)", scale=alt.Scale(type="log", base=2),
                axis=alt.Axis(labelExpr="datum.value >= 1073741824 ? datum.value / 1073741824 + ' GiB' : "
                                        "datum.value >= 1048576 ? datum.value / 1048576 + ' MiB' : "
                                        "datum.value >= 1024 ? datum.value / 1024 + ' KiB' : datum.value + ' B'",
                              tickCount=10)),
        y=alt.Y("busbw_gbps:Q", title="bus bandwidth (GB/s)"),
        color=alt.Color("collective:N", title="collective", sort=cols, scale=alt.Scale(scheme="tableau10")),
    )
    tip = [alt.Tooltip("collective:N"), alt.Tooltip("size:N", title="bucket"),
           alt.Tooltip("busbw_gbps:Q", title="busbw (GB/s)", format=".2f"),
           alt.Tooltip("algbw_gbps:Q", title="algbw (GB/s)", format=".2f"),
           alt.Tooltip("calls:Q", title="calls", format=",")]
    return (base.mark_line(strokeWidth=1.5).encode(**enc) +
            base.mark_point(filled=True, size=50).encode(**enc, tooltip=tip)).properties(width=WIDTH - 140, height=280)


# ---------------------------------------------------------------------------------------------------------------
# Point-to-point latency


def p2p_latency_chart(by_size: pl.DataFrame, model: pl.DataFrame | None = None, small_bytes: int = 65536) -> alt.Chart:
    """Log-log scatter of p2p duration (median, p90 whisker) against size, with the fitted α-β line
    (t = α + bytes / β) and the small-message region (< small_bytes) shaded."""
    size = _col(by_size, "size_bytes", "bucket_bytes", "msg_bytes", "bucket_lo_bytes", "bytes")
    p50 = _col(by_size, "p50_us", "p50_duration_us", "median_us")
    p50_ns = _col(by_size, "p50_ns", "p50_duration_ns", "median_ns")
    p90 = _col(by_size, "p90_us", "p90_duration_us")
    p90_ns = _col(by_size, "p90_ns", "p90_duration_ns")
    mn = _col(by_size, "min_us", "min_duration_us")
    mn_ns = _col(by_size, "min_ns", "min_duration_ns")
    cnt = _col(by_size, "ops", "count", "n", "calls")
    coll = _col(by_size, "collective", "op")

    def us(c_us, c_ns):
        if c_us:
            return pl.col(c_us).cast(pl.Float64)
        return (pl.col(c_ns).cast(pl.Float64) / 1e3) if c_ns else pl.lit(None, pl.Float64)

    d = by_size.select(pl.col(size).cast(pl.Float64).alias("size_bytes"), us(p50, p50_ns).alias("p50_us"),
                       us(p90, p90_ns).alias("p90_us"), us(mn, mn_ns).alias("min_us"),
                       (pl.col(cnt) if cnt else pl.lit(None, pl.Int64)).alias("calls"),
                       (pl.col(coll).cast(pl.Utf8) if coll else pl.lit("p2p")).alias("op"))
    d = d.filter((pl.col("size_bytes") > 0) & (pl.col("p50_us") > 0))
    d = d.with_columns(pl.col("size_bytes").map_elements(fmt_bytes, return_dtype=pl.Utf8).alias("size"))
    lo = max(1.0, float(d["size_bytes"].min() or 1) / 2)
    hi = float(d["size_bytes"].max() or 1) * 2
    layers = []
    shade = pl.DataFrame({"x": [lo], "x2": [float(small_bytes)],
                          "label": [f"small messages (<= {fmt_bytes(small_bytes)})"]})
    layers.append(alt.Chart(shade).mark_rect(color="#BAB0AC", opacity=0.25).encode(
        x="x:Q", x2="x2:Q", tooltip=[alt.Tooltip("label:N", title="region")]))
    xs = alt.X("size_bytes:Q", title="message size (bytes, log scale)", scale=alt.Scale(type="log", base=2,
               domain=[lo, hi]), axis=alt.Axis(labelExpr="datum.value >= 1048576 ? datum.value / 1048576 + ' MiB' : "
                                                         "datum.value >= 1024 ? datum.value / 1024 + ' KiB' : "
                                                         "datum.value + ' B'"))
    ys = alt.Y("p50_us:Q", title="duration (µs, log scale)", scale=alt.Scale(type="log"))
    base = alt.Chart(d)
    layers.append(base.mark_rule(color="#4C78A8", opacity=0.6).encode(x=xs, y=alt.Y("min_us:Q"), y2="p90_us:Q"))
    layers.append(base.mark_point(filled=True, size=60).encode(
        x=xs, y=ys, color=alt.Color("op:N", title="operation", scale=alt.Scale(scheme="tableau10")),
        tooltip=[alt.Tooltip("op:N", title="operation"), alt.Tooltip("size:N", title="size"),
                 alt.Tooltip("calls:Q", title="calls", format=","),
                 alt.Tooltip("min_us:Q", title="min (µs)", format=",.1f"),
                 alt.Tooltip("p50_us:Q", title="median (µs)", format=",.1f"),
                 alt.Tooltip("p90_us:Q", title="p90 (µs)", format=",.1f")]))
    subtitle = "Median duration per size (dots), min-p90 range (whiskers); shaded: small-message region"
    if model is not None and "scope" in model.columns:
        model = model.filter(pl.col("scope") == "all")
    if model is not None and model.height:
        m = model.row(0, named=True)
        alpha, beta = m.get("alpha_us"), m.get("beta_gbps")
        if alpha is not None and beta and beta > 0 and not math.isnan(alpha):
            pts = [lo * (hi / lo) ** (i / 40) for i in range(41)]
            fit = pl.DataFrame({"size_bytes": pts, "fit_us": [alpha + s / (beta * 1e3) for s in pts]})
            fit = fit.filter(pl.col("fit_us") > 0)
            layers.append(alt.Chart(fit).mark_line(color="#E45756", strokeDash=[6, 3]).encode(
                x=xs, y=alt.Y("fit_us:Q"), tooltip=[alt.Tooltip("fit_us:Q", title="model (µs)", format=",.1f")]))
            subtitle += f"; dashed: fit t = α + bytes/β with α = {alpha:.1f} µs, β = {beta:.1f} GB/s"
            r2 = m.get("r2")
            if r2 is not None and not math.isnan(r2):
                subtitle += f" (R² = {r2:.3f})"
    return alt.layer(*layers, title=_title("Point-to-point latency against message size", subtitle)).properties(
        width=WIDTH - 140, height=300)


# ---------------------------------------------------------------------------------------------------------------
# Cross-rank skew


def skew_heatmap_chart(df: pl.DataFrame) -> alt.Chart:
    """Heatmap rank × collective instance: how long each rank waited in each instance (µs).

    Input: one row per (instance, rank) with a wait column (``wait_ns`` or ``wait_us``) and an instance label
    (``instance``/``instance_id``, optionally ``collective``)."""
    inst = _col(df, "instance_label", "instance", "instance_id", "seq")
    w_ns = _col(df, "wait_ns", "rank_wait_ns")
    d = df.with_columns(((pl.col(w_ns).cast(pl.Float64) / 1e3) if w_ns else pl.col("wait_us")).alias("wait_us"),
                        pl.col(inst).cast(pl.Utf8).alias("instance"))
    if "collective" in d.columns:
        d = d.with_columns(pl.concat_str([pl.col("collective").cast(pl.Utf8), pl.lit(" #"), pl.col("instance")])
                           .alias("instance"))
    order = d["instance"].unique(maintain_order=True).to_list()
    d = d.select("rank", "instance", "wait_us")
    n_ranks = d["rank"].n_unique()
    return alt.Chart(d, title=_title("Cross-rank wait per collective instance",
                                     "Time each rank waited for the last rank to arrive (start skew), per instance; "
                                     "darker = longer wait")).mark_rect().encode(
        x=alt.X("instance:N", title="collective instance (largest skew first)", sort=order,
                axis=alt.Axis(labels=len(order) <= 40, labelAngle=-60, labelLimit=120)),
        y=alt.Y("rank:O", title="rank"),
        color=alt.Color("wait_us:Q", title="wait (µs)", scale=alt.Scale(scheme="orangered")),
        tooltip=[alt.Tooltip("instance:N"), alt.Tooltip("rank:O"),
                 alt.Tooltip("wait_us:Q", title="wait (µs)", format=",.1f")],
    ).properties(width=WIDTH - 140, height=max(80, min(16 * n_ranks, 520)))


def straggler_chart(df: pl.DataFrame) -> alt.Chart:
    """Straggler ranking: per rank, the time others waited for it (or its own total wait) and times it arrived last."""
    last = _col(df, "times_last", "n_last", "arrived_last_count", "last_arrivals", "times_arrived_last")
    w = _col(df, "caused_wait_ns", "total_wait_ns", "wait_ns")
    d = df.head(MAX_BARS).select(pl.col("rank").cast(pl.Int64),
                                 (pl.col(w).cast(pl.Float64) / 1e6 if w else pl.lit(None, pl.Float64)).alias("wait_ms"),
                                 (pl.col(last) if last else pl.lit(None, pl.Int64)).alias("times_last"))
    what = "time other ranks waited for it" if w == "caused_wait_ns" else "total time spent waiting for peers"
    return alt.Chart(d, title=_title("Straggler ranking",
                                     f"Bars: times each rank arrived last at a collective; colour: {what} (ms)")
                     ).mark_bar().encode(
        y=alt.Y("rank:O", title="rank", sort=alt.EncodingSortField("times_last", order="descending")),
        x=alt.X("times_last:Q", title="collective instances where the rank arrived last (count)"),
        color=alt.Color("wait_ms:Q", title="wait (ms)", scale=alt.Scale(scheme="reds")),
        tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("times_last:Q", title="arrived last (count)"),
                 alt.Tooltip("wait_ms:Q", title="wait (ms)", format=",.3f")],
    ).properties(width=WIDTH - 200, height=max(60, min(18 * d.height, 600)))


# ---------------------------------------------------------------------------------------------------------------
# Step timeline

TIMELINE_CLASSES = ["communication", "gemm", "convolution", "attention", "compute", "memory"]


def step_timeline_chart(df: pl.DataFrame) -> alt.Chart:
    """Timeline of one step (step_timeline query): one row per rank and lane, bars coloured by kernel class,
    opacity = how busy the merged segment is."""
    d = df.select("rank", "lane", "op_class", "start_us", "end_us", "busy_us", "busy_fraction", "n_ops",
                  "longest_op_name", "longest_op_full_name").with_columns(
        pl.concat_str([pl.lit("rank "), pl.col("rank").cast(pl.Utf8), pl.lit(" · "),
                       pl.col("lane").replace({"communication": "comm"})]).alias("lane_label"),
        (pl.col("end_us") - pl.col("start_us")).clip(lower_bound=0).alias("span_us"))
    lanes = (d.select("rank", "lane", "lane_label").unique()
             .with_columns(pl.col("lane").replace_strict({"communication": 0, "compute": 1, "memory": 2},
                                                         default=3).alias("lo"))
             .sort("rank", "lo")["lane_label"].to_list())
    label = df["step_label"][0] if df.height else ""
    present = [c for c in TIMELINE_CLASSES if c in set(d["op_class"].to_list())]
    return alt.Chart(d, title=_title(f"Timeline of {label}: communication and compute lanes per rank",
                                     "GPU activity merged into short segments (opacity = share of the segment that is "
                                     "busy); hover for the longest kernel")).mark_bar(height={"band": 0.8}).encode(
        x=alt.X("start_us:Q", title=f"time since {label} start (µs)"),
        x2="end_us:Q",
        y=alt.Y("lane_label:N", title=None, sort=lanes),
        color=alt.Color("op_class:N", title="kernel class", scale=_scale(present), sort=present),
        opacity=alt.Opacity("busy_fraction:Q", scale=alt.Scale(domain=[0, 1], range=[0.35, 1]), legend=None),
        tooltip=[alt.Tooltip("lane_label:N", title="lane"), alt.Tooltip("op_class:N", title="main class"),
                 alt.Tooltip("start_us:Q", title="start (µs)", format=",.1f"),
                 alt.Tooltip("span_us:Q", title="length (µs)", format=",.1f"),
                 alt.Tooltip("busy_us:Q", title="busy (µs)", format=",.1f"),
                 alt.Tooltip("n_ops:Q", title="operations"),
                 alt.Tooltip("longest_op_name:N", title="longest operation"),
                 alt.Tooltip("longest_op_full_name:N", title="full name")],
    ).properties(width=WIDTH - 160, height=max(60, min(14 * len(lanes), 700)))


# ---------------------------------------------------------------------------------------------------------------
# Latency-bound communication


def latency_chart(model: pl.DataFrame, points: pl.DataFrame | None = None) -> alt.Chart:
    """Log-log transfer time (median per size, p10–p90 whisker) against size per collective and p2p, with the
    fitted α + bytes/β line and n½ marked (latency_by_size, latency_model). Without sizes: per collective, the
    transfer-time distribution and the latency floor (α estimate) as bars."""
    if points is None or not points.height:
        d = model.select("collective", (pl.col("latency_floor_ns") / 1e3).alias("floor_us"),
                         (pl.col("transfer_p50_ns") / 1e3).alias("p50_us"),
                         (pl.col("transfer_p90_ns") / 1e3).alias("p90_us"), "instances")
        base = alt.Chart(d).encode(y=alt.Y("collective:N", title=None))
        return alt.layer(
            base.mark_rule().encode(x=alt.X("floor_us:Q", title="transfer time (µs), sizes unknown"), x2="p90_us:Q"),
            base.mark_point(filled=True, size=60).encode(
                x="p50_us:Q", tooltip=["collective", "instances", alt.Tooltip("floor_us:Q", title="latency floor µs"),
                                       alt.Tooltip("p50_us:Q", title="median µs"), alt.Tooltip("p90_us:Q", title="p90 µs")]),
        ).properties(width=560)
    d = points.with_columns((pl.col("collective") + " n=" + pl.col("group_size").cast(pl.Utf8)).alias("op"),
                            (pl.col("transfer_p10_ns") / 1e3).alias("p10_us"),
                            (pl.col("transfer_p50_ns") / 1e3).alias("p50_us"),
                            (pl.col("transfer_p90_ns") / 1e3).alias("p90_us"),
                            (pl.col("model_ns") / 1e3).alias("model_us"),
                            pl.col("msg_bytes").cast(pl.Float64).alias("size_bytes"))
    x = alt.X("size_bytes:Q", scale=alt.Scale(type="log"), title="message size (bytes)")
    y = alt.Y("p50_us:Q", scale=alt.Scale(type="log"), title="transfer time, waiting excluded (µs)")
    base = alt.Chart(d).encode(x=x, color=alt.Color("op:N", title="operation"))
    layers = [base.mark_rule().encode(y=alt.Y("p10_us:Q", scale=alt.Scale(type="log")), y2="p90_us:Q"),
              base.mark_point(filled=True, size=50).encode(
                  y=y, tooltip=["op", "msg_bytes", "instances", alt.Tooltip("p50_us:Q", title="median µs", format=".1f"),
                                alt.Tooltip("model_us:Q", title="model µs", format=".1f")])]
    fitted = d.filter(pl.col("model_us").is_not_null())
    if fitted.height:
        layers.append(alt.Chart(fitted).mark_line(strokeDash=[4, 3]).encode(
            x=x, y=alt.Y("model_us:Q", scale=alt.Scale(type="log")), color="op:N"))
        nh = fitted.group_by("op").agg(pl.col("n_half_bytes").first().cast(pl.Float64).alias("n_half_bytes"))
        layers.append(alt.Chart(nh).mark_rule(strokeDash=[1, 2]).encode(
            x="n_half_bytes:Q", color="op:N", tooltip=["op", alt.Tooltip("n_half_bytes:Q", title="n½ (bytes)")]))
    return alt.layer(*layers).properties(width=560, height=320)


def pair_heatmap_chart(pairs: pl.DataFrame) -> alt.Chart:
    """Sender × receiver heatmap of median p2p transfer time, with the median wait in the tooltip and as text."""
    d = pairs.with_columns((pl.col("transfer_p50_ns") / 1e3).alias("transfer_us"),
                           (pl.col("wait_p50_ns") / 1e3).alias("wait_us"))
    base = alt.Chart(d).encode(x=alt.X("dst_rank:O", title="receiver rank"), y=alt.Y("src_rank:O", title="sender rank"))
    return alt.layer(
        base.mark_rect().encode(color=alt.Color("transfer_us:Q", title="median transfer (µs)"),
                                tooltip=["src_rank", "dst_rank", "instances",
                                         alt.Tooltip("transfer_us:Q", title="median transfer µs", format=".1f"),
                                         alt.Tooltip("wait_us:Q", title="median wait µs", format=".1f"),
                                         alt.Tooltip("receiver_waited_pct:Q", title="receiver waited %", format=".0f")]),
        base.mark_text(fontSize=9).encode(text=alt.Text("wait_us:Q", format=".0f")),
    ).properties(width=320, height=320)
