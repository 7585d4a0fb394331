"""Chart builders: pure functions from catalog query frames (polars) to Altair charts.

Each function takes the frame one catalog query returns and reads only the columns it declares with
``@consumes`` (the catalog's documented names, tested against the catalog). It draws aggregated data only (a few
hundred marks at most, whatever the trace size) and returns a chart whose title states what it shows. They work
as well in a notebook as in the report::

    from nsys2comm.analysis import run_query
    from nsys2comm.report import overlap_by_rank_chart
    overlap_by_rank_chart(run_query(con, "overlap_by_rank", {}))

Colours are fixed per class of GPU work (:data:`CLASS_COLORS`) so that every chart reads the same way. The catalog
gives integer nanoseconds; charts convert to ms or µs, with the unit in the axis title. Sizes use binary prefixes
on log2 axes, bandwidths GB/s (1e9 bytes per second).
"""

from __future__ import annotations

import math

import altair as alt
import polars as pl

from ..units import NS_PER_UNIT
from ..units import size as fmt_bytes
from .data import consumes

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
# One colour per cause of exposed communication (exposed_comm_causes), in the attribution order.
CAUSE_COLORS: dict[str, str] = {
    "arrival_skew": "#F58518",  # orange: waiting for a late rank (first in the attribution order)
    "serialised_stream": "#B5323A",  # dark red: cannot overlap at all
    "serialised_communicators": "#9467BD",  # purple
    "dependency_wait": "#4C78A8",  # blue
    "nothing_to_overlap": "#BAB0AC",  # grey: no computation was ready
    "unattributed": "#333333",
}
COLLECTIVE_ORDER = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                    "gather", "scatter", "send", "recv", "send_recv", "barrier", "p2p", "unknown"]
WIDTH = 760
MAX_BARS = 64  # ranks shown in per-rank bar charts
MAX_SKEW_INSTANCES = 60  # heatmap columns: the most skewed instances
MAX_HEATMAP_RANKS = 64
# axis labels for sizes in bytes, with binary prefixes (Vega expression)
BYTES_LABEL = ("datum.value >= 1073741824 ? datum.value / 1073741824 + ' GiB' : "
               "datum.value >= 1048576 ? datum.value / 1048576 + ' MiB' : "
               "datum.value >= 1024 ? datum.value / 1024 + ' KiB' : datum.value + ' B'")


def _scale(domain: list[str]) -> alt.Scale:
    return alt.Scale(domain=domain, range=[CLASS_COLORS[d] for d in domain])


def _title(text: str, subtitle: str | None = None) -> alt.TitleParams:
    return alt.TitleParams(text=text, subtitle=subtitle or alt.Undefined, anchor="start", fontSize=14,
                           subtitleColor="#555", subtitleFontSize=11)


def _size_x(field: str, title: str, **scale) -> alt.X:
    """Quantitative log2 size axis labelled with binary prefixes (one tick per power of two at most)."""
    return alt.X(field, title=title, scale=alt.Scale(type="log", base=2, **scale),
                 axis=alt.Axis(labelExpr=BYTES_LABEL, tickCount=12, labelOverlap="greedy", labelFlush=False))


def _in(col: str, unit: str) -> pl.Expr:
    """An ns column as a float in ``unit`` (for axes; the column keeps its ns in the data)."""
    return pl.col(col).cast(pl.Float64) / NS_PER_UNIT[unit]


def _collective_order(values: pl.Series) -> list[str]:
    present = set(values.to_list())
    return [c for c in COLLECTIVE_ORDER if c in present] + sorted(present - set(COLLECTIVE_ORDER))


def _runs(d: pl.DataFrame, key: str) -> pl.DataFrame:
    """Number the runs of adjacent size buckets per ``key`` (``run``), so lines break where buckets are missing."""
    d = d.sort(key, "bucket_lo_bytes")
    gap = (pl.col("bucket_lo_bytes") != pl.col("bucket_hi_bytes").shift(1).over(key)).fill_null(True)
    return d.with_columns(gap.cast(pl.Int32).cum_sum().over(key).alias("run"))


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


@consumes(time_breakdown_by_rank=("rank", "category", "time_ns", "span_pct"))
def time_breakdown_chart(df: pl.DataFrame) -> alt.Chart:
    """Stacked horizontal bars: where each rank's GPU span goes, in exclusive combinations of running classes."""
    ranks = df["rank"].unique().sort().head(MAX_BARS)
    d = df.filter(pl.col("rank").is_in(ranks.implode())).select(
        "rank", pl.col("category").cast(pl.Utf8), _in("time_ns", "ms").alias("time_ms"),
        pl.col("span_pct").cast(pl.Float64))
    present = set(d["category"].to_list())
    cats = [c for c in BREAKDOWN_COLORS if c in present] + sorted(present - set(BREAKDOWN_COLORS))
    labels = [BREAKDOWN_LABELS.get(c, c) for c in cats]
    colors = [BREAKDOWN_COLORS.get(c, "#7f7f7f") for c in cats]
    order = {c: i for i, c in enumerate(cats)}
    d = d.with_columns(pl.col("category").replace(BREAKDOWN_LABELS).alias("activity"),
                       pl.col("category").replace_strict(order, default=99).alias("order")).drop("category")
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
    ).properties(width=WIDTH - 300, height=max(60, min(18 * d["rank"].n_unique(), 600)))


# ---------------------------------------------------------------------------------------------------------------
# Overlap

OVERLAP_PARTS = ["exposed communication", "overlapped by other compute", "overlapped by GEMM"]


def _overlap_long(df: pl.DataFrame, key: str) -> pl.DataFrame:
    """comm_ns / comm_overlapped_ns / gemm_overlapped_ns -> one row per (key, part) with time_ms and share_pct."""
    d = df.select(
        pl.col(key).cast(pl.Utf8),
        (pl.col("comm_ns") - pl.col("comm_overlapped_ns")).cast(pl.Float64).alias("exposed communication"),
        (pl.col("comm_overlapped_ns") - pl.col("gemm_overlapped_ns")).clip(0).cast(pl.Float64)
        .alias("overlapped by other compute"),
        pl.col("gemm_overlapped_ns").cast(pl.Float64).alias("overlapped by GEMM"),
        pl.col("comm_ns").cast(pl.Float64).alias("_total"),
    )
    long = d.unpivot(index=[key, "_total"], on=OVERLAP_PARTS, variable_name="part", value_name="ns")
    order = {c: i for i, c in enumerate(OVERLAP_PARTS)}
    total = pl.when(pl.col("_total") > 0).then(pl.col("_total"))
    return long.with_columns(_in("ns", "ms").alias("time_ms"),
                             (100 * pl.col("ns") / total).fill_null(0).alias("share_pct"),
                             pl.col("part").replace_strict(order, default=9).alias("order")).drop("ns", "_total")


def _overlap_tooltip(key: str, share_title: str) -> list:
    return [alt.Tooltip(f"{key}:N"), alt.Tooltip("part:N", title="part"),
            alt.Tooltip("time_ms:Q", title="time (ms)", format=",.3f"),
            alt.Tooltip("share_pct:Q", title=share_title, format=".1f")]


@consumes(overlap_by_rank=("rank", "comm_ns", "comm_overlapped_ns", "gemm_overlapped_ns"))
def overlap_by_rank_chart(df: pl.DataFrame) -> alt.Chart:
    """Per rank: communication time split into exposed / hidden under GEMM / hidden under other compute."""
    long = _overlap_long(df.head(MAX_BARS), "rank")
    return alt.Chart(long, title=_title("Communication overlap per rank",
                                        "Communication kernel time split into exposed (nothing else running) and "
                                        "hidden under GEMM or other compute")).mark_bar().encode(
        y=alt.Y("rank:O", title="rank", sort=None),
        x=alt.X("time_ms:Q", title="communication time (ms)", stack="zero"),
        color=alt.Color("part:N", scale=_scale(OVERLAP_PARTS), title="communication time", sort=OVERLAP_PARTS),
        order=alt.Order("order:Q"),
        tooltip=_overlap_tooltip("rank", "share of comm time (%)"),
    ).properties(width=WIDTH - 200, height=max(60, min(18 * long["rank"].n_unique(), 600)))


@consumes(comm_overlap_by_collective=("collective", "comm_ns", "comm_overlapped_ns", "gemm_overlapped_ns"))
def overlap_by_collective_chart(df: pl.DataFrame) -> alt.Chart:
    """Per collective: share of its time exposed / hidden under GEMM / hidden under other compute (100% bars)."""
    long = _overlap_long(df, "collective")
    cols = _collective_order(long["collective"])
    return alt.Chart(long, title=_title("Communication overlap per collective",
                                        "Share of each collective's kernel time that is exposed or hidden under "
                                        "compute (all ranks)")).mark_bar().encode(
        y=alt.Y("collective:N", title="collective", sort=cols),
        x=alt.X("share_pct:Q", title="share of collective time (%)", stack="zero", scale=alt.Scale(domain=[0, 100])),
        color=alt.Color("part:N", scale=_scale(OVERLAP_PARTS), title="communication time", sort=OVERLAP_PARTS),
        order=alt.Order("order:Q"),
        tooltip=_overlap_tooltip("collective", "share (%)"),
    ).properties(width=WIDTH - 200, height=max(60, 24 * len(cols)))


# ---------------------------------------------------------------------------------------------------------------
# Message sizes and bandwidth


def _sized(df: pl.DataFrame) -> pl.DataFrame:
    """Rows with a known size bucket (unknown sizes have no place on a size axis), with a 'size' label."""
    return df.filter(pl.col("bucket_lo_bytes").is_not_null()).with_columns(
        pl.col("bucket_lo_bytes").map_elements(fmt_bytes, return_dtype=pl.Utf8).alias("size"),
        pl.col("bucket_lo_bytes").cast(pl.Float64), pl.col("bucket_hi_bytes").cast(pl.Float64))


@consumes(msg_size_histogram=("collective", "bucket_lo_bytes", "bucket_hi_bytes", "ops", "total_ns"))
def msg_size_histogram_chart(df: pl.DataFrame) -> alt.Chart:
    """Per collective: kernel time in each power-of-two message-size bucket, bars spanning the bucket on a log2
    axis, stacked by collective; calls in the tooltip."""
    d = _sized(df).select("collective", "size", "bucket_lo_bytes", "bucket_hi_bytes",
                          _in("total_ns", "ms").alias("time_ms"), pl.col("ops").alias("calls"))
    cols = _collective_order(d["collective"])
    # stacked by hand: Vega-Lite does not stack bars that span a continuous x range (x, x2)
    rank = {c: i for i, c in enumerate(cols)}
    d = d.with_columns(pl.col("collective").replace_strict(rank).alias("order")).sort("bucket_lo_bytes", "order")
    d = d.with_columns(pl.col("time_ms").cum_sum().over("bucket_lo_bytes").alias("top_ms"))
    d = d.with_columns((pl.col("top_ms") - pl.col("time_ms")).alias("base_ms"))
    return alt.Chart(d, title=_title("Message-size histogram per collective",
                                     "Kernel time per power-of-two message-size bucket (nccl-tests size convention), "
                                     "stacked by collective")).mark_bar(stroke="white", strokeWidth=0.5).encode(
        x=_size_x("bucket_lo_bytes:Q", "message size (bytes, log2 scale)"),
        x2="bucket_hi_bytes:Q",
        y=alt.Y("base_ms:Q", title="kernel time (ms)"),
        y2="top_ms:Q",
        color=alt.Color("collective:N", title="collective", sort=cols, scale=alt.Scale(scheme="tableau10")),
        tooltip=[alt.Tooltip("collective:N"), alt.Tooltip("size:N", title="bucket from"),
                 alt.Tooltip("calls:Q", title="calls", format=","),
                 alt.Tooltip("time_ms:Q", title="time (ms)", format=",.3f")],
    ).properties(width=WIDTH - 140, height=260)


@consumes(collective_bandwidth=("collective", "group_size", "group_size_assumed", "spans_hosts", "bucket_lo_bytes",
                                "bucket_hi_bytes", "ops", "matched_ops", "headline_algbw_gbps", "headline_busbw_gbps",
                                "bandwidth_basis", "busbw_pct_of_peak"))
def busbw_chart(df: pl.DataFrame) -> alt.Chart:
    """Bus bandwidth (nccl-tests busbw, GB/s, log scale) against message size per collective: collective_bandwidth's
    headline figure (transfer time of matched instances; kernel durations, labelled as a lower bound, where none was
    matched; none above the physical peak), points per bucket, lines only between adjacent buckets."""
    d = _sized(df).filter(pl.col("headline_busbw_gbps").is_not_null() & (pl.col("headline_busbw_gbps") > 0))
    # each series says what its figure rests on: an assumed group size, hosts spanned, waiting included
    label = pl.col("collective")
    label = pl.when(pl.col("group_size_assumed")).then(
        label + " (group size " + pl.col("group_size").cast(pl.Utf8) + " assumed)").otherwise(label)
    label = pl.when(pl.col("spans_hosts").fill_null(False)).then(label + " across hosts").otherwise(label)
    label = pl.when(pl.col("bandwidth_basis") == "incl_wait").then(
        label + " (includes waiting, lower bound)").otherwise(label)
    d = d.with_columns(label.alias("collective"), pl.col("headline_busbw_gbps").alias("busbw_gbps"),
                       pl.col("headline_algbw_gbps").alias("algbw_gbps"))
    d = _runs(d.select("collective", "size", "bucket_lo_bytes", "bucket_hi_bytes", "busbw_gbps", "algbw_gbps",
                       "busbw_pct_of_peak", "matched_ops", pl.col("ops").alias("calls")), "collective")
    cols = _collective_order(d["collective"])
    enc = dict(x=_size_x("bucket_lo_bytes:Q", "message size (bucket lower bound, bytes, log2 scale)"),
               y=alt.Y("busbw_gbps:Q", title="bus bandwidth (GB/s, log scale)", scale=alt.Scale(type="log")),
               color=alt.Color("collective:N", title="collective", sort=cols, scale=alt.Scale(scheme="tableau10")))
    tip = [alt.Tooltip("collective:N"), alt.Tooltip("size:N", title="bucket from"),
           alt.Tooltip("calls:Q", title="calls", format=","),
           alt.Tooltip("matched_ops:Q", title="calls matched on their whole group", format=","),
           alt.Tooltip("busbw_gbps:Q", title="busbw (GB/s)", format=",.2f"),
           alt.Tooltip("algbw_gbps:Q", title="algbw (GB/s)", format=",.2f"),
           alt.Tooltip("busbw_pct_of_peak:Q", title="% of physical peak", format=",.1f")]
    base = alt.Chart(d)
    return alt.layer(
        base.mark_line().encode(detail="run:N", **enc),
        base.mark_point(filled=True, size=50).encode(tooltip=tip, **enc),
        title=_title("Bus bandwidth against message size",
                     "nccl-tests busbw from the transfer time of instances matched on their whole group (waiting "
                     "excluded); higher is better; lines join adjacent buckets only"),
    ).properties(width=WIDTH - 140, height=280)


# ---------------------------------------------------------------------------------------------------------------
# Point-to-point latency


@consumes(p2p_latency_by_size=("collective", "bucket_lo_bytes", "ops", "min_ns", "p50_ns", "p90_ns"),
          latency_model=("collective", "alpha_us", "beta_gbps", "fit_quality", "small_threshold_bytes",
                         "threshold_rule"))
def p2p_latency_chart(by_size: pl.DataFrame, model: pl.DataFrame | None = None) -> alt.Chart:
    """Log-log scatter of p2p kernel duration (median, min-p90 whisker) against size; with latency_model, its
    'p2p' fit t = α + bytes/β and the latency-bound region below its threshold (n½, or the labelled fallback)."""
    d = by_size.filter(pl.col("bucket_lo_bytes") > 0).select(
        pl.col("bucket_lo_bytes").cast(pl.Float64).alias("size_bytes"), _in("p50_ns", "us").alias("p50_us"),
        _in("p90_ns", "us").alias("p90_us"), _in("min_ns", "us").alias("min_us"), pl.col("ops").alias("calls"),
        pl.col("collective").cast(pl.Utf8).alias("op"))
    d = d.filter(pl.col("p50_us") > 0).with_columns(
        pl.col("size_bytes").map_elements(fmt_bytes, return_dtype=pl.Utf8).alias("size"))
    lo = max(1.0, float(d["size_bytes"].min() or 1) / 2)
    hi = float(d["size_bytes"].max() or 1) * 2
    xs = _size_x("size_bytes:Q", "message size (bytes, log2 scale)", domain=[lo, hi])
    ys = alt.Y("p50_us:Q", title="duration (µs, log scale)", scale=alt.Scale(type="log"))
    base = alt.Chart(d)
    layers = [base.mark_rule(color="#4C78A8", opacity=0.6).encode(x=xs, y=alt.Y("min_us:Q"), y2="p90_us:Q"),
              base.mark_point(filled=True, size=60).encode(
                  x=xs, y=ys, color=alt.Color("op:N", title="operation", scale=alt.Scale(scheme="tableau10")),
                  tooltip=[alt.Tooltip("op:N", title="operation"), alt.Tooltip("size:N", title="size"),
                           alt.Tooltip("calls:Q", title="calls", format=","),
                           alt.Tooltip("min_us:Q", title="min (µs)", format=",.1f"),
                           alt.Tooltip("p50_us:Q", title="median (µs)", format=",.1f"),
                           alt.Tooltip("p90_us:Q", title="p90 (µs)", format=",.1f")])]
    subtitle = "Median kernel duration per size (dots), min-p90 range (whiskers)"
    m = _p2p_model(model)
    if m is not None:
        threshold = float(m["small_threshold_bytes"])
        rule = "n½ of the fit" if m["threshold_rule"] == "n_half" else "64 KiB fallback: no usable fit"
        shade = pl.DataFrame({"x": [lo], "x2": [max(lo, threshold)],
                              "label": [f"latency-bound: below {fmt_bytes(threshold)} ({rule})"]})
        layers.insert(0, alt.Chart(shade).mark_rect(color="#BAB0AC", opacity=0.25).encode(
            x="x:Q", x2="x2:Q", tooltip=[alt.Tooltip("label:N", title="region")]))
        subtitle += f"; shaded: latency-bound sizes (below {fmt_bytes(threshold)}, {rule})"
        alpha, beta = m["alpha_us"], m["beta_gbps"]
        if alpha is not None and beta and beta > 0 and not math.isnan(alpha):
            pts = [lo * (hi / lo) ** (i / 40) for i in range(41)]
            fit = pl.DataFrame({"size_bytes": pts, "fit_us": [alpha + s / (beta * 1e3) for s in pts]})
            layers.append(alt.Chart(fit.filter(pl.col("fit_us") > 0)).mark_line(color="#E45756", strokeDash=[6, 3])
                          .encode(x=xs, y=alt.Y("fit_us:Q"),
                                  tooltip=[alt.Tooltip("fit_us:Q", title="model (µs)", format=",.1f")]))
            subtitle += (f"; dashed: fit t = α + bytes/β with α = {alpha:.1f} µs, β = {beta:.1f} GB/s "
                         f"(fit: {m['fit_quality']})")
    return alt.layer(*layers, title=_title("Point-to-point latency against message size", subtitle)).properties(
        width=WIDTH - 140, height=300)


def _p2p_model(model: pl.DataFrame | None) -> dict | None:
    if model is None:
        return None
    rows = model.filter((pl.col("collective") == "p2p") & pl.col("small_threshold_bytes").is_not_null())
    return rows.row(0, named=True) if rows.height else None


# ---------------------------------------------------------------------------------------------------------------
# Cross-rank skew


def _instance_label(key: str | None, collective: str | None, with_group: bool) -> str:
    """'all_reduce #17' (+ ' (pg 0)' when several groups are shown) from instance_key '0#17'; 'all_to_all #3' from
    '#3' (matched by order)."""
    group, _, number = (key or "").rpartition("#")
    label = f"{collective or 'unknown'} #{number or key}"
    return f"{label} (pg {group})" if group and with_group else label


@consumes(collective_skew=("instance_key", "collective", "first_start_ns", "start_skew_ns", "rank_wait_ns"))
def skew_heatmap_chart(df: pl.DataFrame) -> alt.Chart:
    """Heatmap rank × collective instance (the MAX_SKEW_INSTANCES most skewed, in time order among equal skews):
    how long each rank waited for the last rank to arrive (µs)."""
    top = (df.filter(pl.col("start_skew_ns").is_not_null())
           .sort(["start_skew_ns", "first_start_ns", "instance_key"], descending=[True, False, False])
           .head(MAX_SKEW_INSTANCES).with_row_index("order"))
    groups = top["instance_key"].str.replace(r"#[^#]*$", "").n_unique() > 1
    top = top.with_columns(pl.struct("instance_key", "collective").map_elements(
        lambda r: _instance_label(r["instance_key"], r["collective"], groups), return_dtype=pl.Utf8).alias("instance"))
    d = (top.select("order", "instance", "rank_wait_ns").explode("rank_wait_ns").drop_nulls("rank_wait_ns")
         .unnest("rank_wait_ns").filter(pl.col("rank") < MAX_HEATMAP_RANKS).sort("order", "rank")
         .select("rank", "instance", _in("wait_ns", "us").alias("wait_us")))
    order = top["instance"].to_list()
    return alt.Chart(d, title=_title("Cross-rank wait per collective instance",
                                     "Time each rank waited for the last rank to arrive (start skew), per instance; "
                                     "darker = longer wait")).mark_rect().encode(
        x=alt.X("instance:N", title="collective instance (largest skew first)", sort=order,
                axis=alt.Axis(labels=len(order) <= 40, labelAngle=-60, labelLimit=140)),
        y=alt.Y("rank:O", title="rank"),
        color=alt.Color("wait_us:Q", title="wait (µs)", scale=alt.Scale(scheme="orangered")),
        tooltip=[alt.Tooltip("instance:N"), alt.Tooltip("rank:O"),
                 alt.Tooltip("wait_us:Q", title="wait (µs)", format=",.1f")],
    ).properties(width=WIDTH - 140, height=max(80, min(16 * d["rank"].n_unique(), 520)))


@consumes(rank_wait=("rank", "times_arrived_last", "total_wait_ns", "arrived_last_p_value", "is_straggler"))
def straggler_chart(df: pl.DataFrame) -> alt.Chart:
    """Straggler ranking, two bar panels on one rank axis: times each rank arrived last, and how long it waited
    for peers in total (a straggler arrives last often and waits little). Ranks that rank_wait's test names
    (is_straggler) are named in the title and tooltip: the others arrive last within chance."""
    d = df.sort("times_arrived_last", "rank", descending=[True, False]).head(MAX_BARS).select(
        pl.col("rank").cast(pl.Int64), "times_arrived_last", _in("total_wait_ns", "ms").alias("wait_ms"),
        "arrived_last_p_value",
        pl.when(pl.col("is_straggler")).then(pl.lit("straggler (p < 0.01)"))
        .otherwise(pl.lit("within chance")).alias("verdict"))
    ranks = d["rank"].to_list()
    y = alt.Y("rank:O", title="rank", sort=ranks)
    tip = [alt.Tooltip("rank:O"), alt.Tooltip("times_arrived_last:Q", title="arrived last (count)"),
           alt.Tooltip("arrived_last_p_value:Q", title="p-value (Bonferroni)", format=".2g"),
           alt.Tooltip("verdict:N"), alt.Tooltip("wait_ms:Q", title="waited for peers (ms)", format=",.3f")]
    height = max(60, min(18 * d.height, 600))
    base = alt.Chart(d)
    last = base.mark_bar(color=CLASS_COLORS["exposed communication"]).encode(
        y=y, x=alt.X("times_arrived_last:Q", title="instances where the rank arrived last (count)"),
        tooltip=tip).properties(width=(WIDTH - 220) // 2, height=height)
    wait = base.mark_bar(color=CLASS_COLORS["idle"]).encode(
        y=alt.Y("rank:O", sort=ranks, axis=None),
        x=alt.X("wait_ms:Q", title="time waited for peers (ms)", axis=alt.Axis(labelFlush=False, tickCount=6)),
        tooltip=tip).properties(width=(WIDTH - 220) // 2, height=height)
    named = df.filter(pl.col("is_straggler")).sort("rank")["rank"].to_list()
    verdict = (f"straggler: rank {', '.join(map(str, named))}" if named else "no consistent straggler")
    return alt.hconcat(last, wait, spacing=12, title=_title(
        f"Straggler ranking ({verdict})",
        "Left: times each rank arrived last at a collective (a straggler: more often than chance, binomial test, "
        "p < 0.01 after Bonferroni); right: the time it waited for other ranks"))


@consumes(exposed_comm_causes=("rank", "cause", "exposed_ns"))
def exposed_causes_chart(df: pl.DataFrame) -> alt.Chart:
    """Stacked bars, one per rank: its exposed communication time split by cause (ms)."""
    d = (df.group_by("rank", "cause").agg(pl.col("exposed_ns").sum()).sort("rank", "cause")  # one spec per job
         .filter(pl.col("rank").is_in(df["rank"].unique().sort().head(MAX_BARS).implode()))
         .select(pl.col("rank").cast(pl.Int64), "cause", _in("exposed_ns", "ms").alias("exposed_ms")))
    present = set(d["cause"].to_list())
    causes = [c for c in CAUSE_COLORS if c in present] + sorted(present - set(CAUSE_COLORS))
    labels = [c.replace("_", " ") for c in causes]
    order = {c: i for i, c in enumerate(causes)}
    d = d.with_columns(pl.col("cause").str.replace_all("_", " ").alias("label"),
                       pl.col("cause").replace_strict(order, default=99).alias("order"))
    return alt.Chart(d, title=_title("Why communication is exposed, per rank",
                                     "Exposed communication-kernel time by cause, in the attribution order")).mark_bar(
    ).encode(
        y=alt.Y("rank:O", title="rank"),
        x=alt.X("exposed_ms:Q", title="exposed communication (ms)", stack="zero"),
        color=alt.Color("label:N", title="cause", sort=labels,
                        scale=alt.Scale(domain=labels, range=[CAUSE_COLORS.get(c, "#7f7f7f") for c in causes])),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("label:N", title="cause"),
                 alt.Tooltip("exposed_ms:Q", title="exposed (ms)", format=",.3f")],
    ).properties(width=WIDTH - 200, height=max(60, min(18 * d["rank"].n_unique(), 600)))


@consumes(gemm_contention=("scope", "short_name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                            "alone_samples", "overlapped_samples", "median_alone_ns", "median_overlapped_ns",
                            "slowdown_pct", "status"))
def gemm_contention_chart(df: pl.DataFrame) -> alt.Chart:
    """Paired bars per measured GEMM shape: median duration alone and under communication (µs)."""
    d = df.filter((pl.col("scope") == "shape_group") & (pl.col("status") == "measured")).sort(
        "slowdown_pct", "short_name", descending=[True, False]).head(MAX_BARS)
    # launch shape first: long kernel names are cut at the label limit
    shape = pl.concat_str([pl.lit("<<<"), pl.concat_str(
        [pl.col(c).cast(pl.Utf8).fill_null("?") for c in ("grid_x", "grid_y", "grid_z")], separator=","),
        pl.lit("|"), pl.concat_str([pl.col(c).cast(pl.Utf8).fill_null("?") for c in ("block_x", "block_y", "block_z")],
                                   separator=","), pl.lit(">>> "), pl.col("short_name").fill_null("?")])
    long = pl.concat([
        d.select(shape.alias("shape"), pl.lit("alone").alias("when"), _in("median_alone_ns", "us").alias("median_us"),
                 pl.col("alone_samples").alias("samples"), "slowdown_pct"),
        d.select(shape.alias("shape"), pl.lit("under communication").alias("when"),
                 _in("median_overlapped_ns", "us").alias("median_us"), pl.col("overlapped_samples").alias("samples"),
                 "slowdown_pct")])
    order = long["shape"].unique(maintain_order=True).to_list()
    title = _title("GEMM duration alone and under communication",
                   "Median per GEMM shape (<<<grid|block>>> name), same steps on both sides")
    return alt.Chart(long, title=title).mark_bar().encode(
        y=alt.Y("shape:N", title=None, sort=order, axis=alt.Axis(labelLimit=320)),
        yOffset=alt.YOffset("when:N", sort=["alone", "under communication"]),
        x=alt.X("median_us:Q", title="median duration (µs)"),
        color=alt.Color("when:N", title=None, sort=["alone", "under communication"],
                        scale=alt.Scale(range=[CLASS_COLORS["gemm"], CLASS_COLORS["exposed communication"]])),
        tooltip=[alt.Tooltip("shape:N"), alt.Tooltip("when:N"),
                 alt.Tooltip("median_us:Q", title="median (µs)", format=",.1f"), alt.Tooltip("samples:Q"),
                 alt.Tooltip("slowdown_pct:Q", title="slowdown (%)", format=",.1f")],
    ).properties(width=WIDTH - 420, height=max(60, min(30 * d.height, 600)))


# ---------------------------------------------------------------------------------------------------------------
# GEMM efficiency (gemm_efficiency)

MAX_GEMM_POINTS = 2000  # kernels drawn: the longest


@consumes(gemm_efficiency=("short_name", "m", "n", "k", "batch", "dtype", "duration_ns", "device_model", "math",
                           "peak_tflops", "ridge_flops_per_byte", "arithmetic_intensity", "achieved_tflops",
                           "pct_of_peak", "bound"))
def gemm_roofline_chart(df: pl.DataFrame) -> alt.LayerChart:
    """Log-log scatter of achieved TFLOP/s against arithmetic intensity, one point per main GEMM kernel (the
    longest MAX_GEMM_POINTS), with each (device, math type)'s roofline: the slope peak / ridge below the ridge point,
    the peak above it."""
    d = (df.filter(pl.col("achieved_tflops").is_not_null() & pl.col("arithmetic_intensity").is_not_null())
         .sort(["duration_ns", "m", "n", "k"], descending=[True, False, False, False]).head(MAX_GEMM_POINTS)
         .with_columns(pl.concat_str([pl.col("device_model").fill_null("?"), pl.col("math").fill_null("?")],
                                     separator=" ").alias("roofline"),
                       pl.format("{}×{}×{} ×{}", "m", "n", "k", "batch").alias("shape"),
                       _in("duration_ns", "us").alias("duration_us")))
    lo = max(float(d["arithmetic_intensity"].min()) / 2, 1e-3) if d.height else 1.0
    hi = float(d["arithmetic_intensity"].max()) * 2 if d.height else 1e3
    roofs = d.filter(pl.col("ridge_flops_per_byte").is_not_null()).unique(
        ["roofline", "peak_tflops", "ridge_flops_per_byte"], maintain_order=True)
    rows = []
    for r in roofs.iter_rows(named=True):
        peak, ridge = r["peak_tflops"], r["ridge_flops_per_byte"]
        for x in sorted({lo, min(max(ridge, lo), max(hi, ridge)), max(hi, ridge * 2)}):
            rows.append({"roofline": r["roofline"], "ai": x, "tflops": min(peak, x * peak / ridge)})
    lines = pl.DataFrame(rows, schema={"roofline": pl.Utf8, "ai": pl.Float64, "tflops": pl.Float64})
    title = _title("GEMM roofline", "Achieved TFLOP/s per kernel against FLOPs per byte moved; lines: the device's "
                                    "peak and memory-bandwidth roof per math type")
    x = alt.X("arithmetic_intensity:Q", title="arithmetic intensity (FLOP/byte, log)", scale=alt.Scale(type="log"))
    y = alt.Y("achieved_tflops:Q", title="achieved TFLOP/s (log)", scale=alt.Scale(type="log"))
    points = alt.Chart(d).mark_circle(opacity=0.6).encode(
        x=x, y=y, color=alt.Color("roofline:N", title="device, math"),
        size=alt.Size("duration_us:Q", title="duration (µs)", legend=None),
        tooltip=[alt.Tooltip("short_name:N", title="kernel"), alt.Tooltip("shape:N", title="M×N×K ×batch"),
                 alt.Tooltip("dtype:N"), alt.Tooltip("duration_us:Q", title="duration (µs)", format=",.1f"),
                 alt.Tooltip("achieved_tflops:Q", title="TFLOP/s", format=",.2f"),
                 alt.Tooltip("pct_of_peak:Q", title="% of peak", format=",.1f"), alt.Tooltip("bound:N")])
    roof = alt.Chart(lines).mark_line(strokeDash=[4, 3]).encode(
        x=alt.X("ai:Q", scale=alt.Scale(type="log")), y=alt.Y("tflops:Q", scale=alt.Scale(type="log")),
        color=alt.Color("roofline:N"), tooltip=[alt.Tooltip("roofline:N"), alt.Tooltip("tflops:Q", format=",.1f")])
    return alt.layer(roof, points, title=title).properties(width=WIDTH - 200, height=360)


# ---------------------------------------------------------------------------------------------------------------
# Why ranks arrive late (late_arrival_causes)

# the four parts of a rank's segment since its previous collective of the group, in the order they stack
LATENESS_PARTS: dict[str, tuple[str, str]] = {
    "host_bound": ("GPU idle, nothing launched (host-bound)", "#F58518"),
    "queued_idle": ("GPU idle, work launched but waiting (queued)", "#9467BD"),
    "gpu_compute": ("GPU compute", CLASS_COLORS["compute"]),
    "earlier_comm": ("other communication", CLASS_COLORS["communication"]),
}
MAX_LATE_INSTANCES = 30  # instances drawn: the latest arrivals, shown in time order


@consumes(late_arrival_causes=("instance_key", "collective", "first_start_ns", "late_rank", "early_rank",
                               "lateness_ns", "late_segment_from", "late_gpu_compute_ns", "late_host_bound_ns",
                               "late_queued_idle_ns", "late_earlier_comm_ns", "early_gpu_compute_ns",
                               "early_host_bound_ns", "early_queued_idle_ns", "early_earlier_comm_ns",
                               "primary_cause", "primary_share_pct"))
def late_arrival_chart(df: pl.DataFrame) -> alt.Chart:
    """Per instance where a rank arrives late (the MAX_LATE_INSTANCES latest, in time order): two stacked bars, the
    late rank's segment since its previous collective of the group and the earliest rank's, split into host-bound
    idle, queued idle, GPU compute and other communication (ms); lateness and primary cause in the tooltip."""
    late = (df.filter(pl.col("lateness_ns") > 0)
            .sort(["lateness_ns", "first_start_ns", "instance_key"], descending=[True, False, False])
            .head(MAX_LATE_INSTANCES).sort("first_start_ns", "instance_key"))
    groups = late["instance_key"].str.replace(r"#[^#]*$", "").n_unique() > 1
    late = late.with_columns(pl.struct("instance_key", "collective").map_elements(
        lambda r: _instance_label(r["instance_key"], r["collective"], groups), return_dtype=pl.Utf8)
        .alias("instance"))
    rows = []
    for r in late.iter_rows(named=True):
        for role, who in (("late", f"late: rank {r['late_rank']}"), ("early", f"earliest: rank {r['early_rank']}")):
            for i, (part, (label, _)) in enumerate(LATENESS_PARTS.items()):
                ns = r[f"{role}_{part}_ns"]
                rows.append({"instance": r["instance"], "role": who, "who": role, "part": label, "order": i,
                             "time_ms": None if ns is None else ns / NS_PER_UNIT["ms"],
                             "lateness_ms": r["lateness_ns"] / NS_PER_UNIT["ms"],
                             "cause": (r["primary_cause"] or "").replace("_", " "),
                             "cause_pct": r["primary_share_pct"]})
    d = pl.DataFrame(rows, schema={"instance": pl.Utf8, "role": pl.Utf8, "who": pl.Utf8, "part": pl.Utf8,
                                   "order": pl.Int64, "time_ms": pl.Float64, "lateness_ms": pl.Float64,
                                   "cause": pl.Utf8, "cause_pct": pl.Float64}).filter(pl.col("time_ms") > 0)
    order = late["instance"].to_list()
    labels = [v[0] for v in LATENESS_PARTS.values()]
    return alt.Chart(d, title=_title("Why ranks arrive late: the late rank's segment against the earliest rank's",
                                     "Each pair: time since the rank's previous collective of the group, by what its "
                                     "GPU did (top bar: the last-arriving rank)")).mark_bar().encode(
        y=alt.Y("instance:N", title="collective instance (time order)", sort=order,
                axis=alt.Axis(labelLimit=220)),
        yOffset=alt.YOffset("who:N", sort=["late", "early"]),
        x=alt.X("time_ms:Q", title="segment time (ms)", stack="zero"),
        color=alt.Color("part:N", title="the rank's GPU", sort=labels,
                        scale=alt.Scale(domain=labels, range=[v[1] for v in LATENESS_PARTS.values()]),
                        legend=alt.Legend(labelLimit=320)),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("instance:N"), alt.Tooltip("role:N", title="rank"), alt.Tooltip("part:N"),
                 alt.Tooltip("time_ms:Q", title="time (ms)", format=",.3f"),
                 alt.Tooltip("lateness_ms:Q", title="lateness (ms)", format=",.3f"),
                 alt.Tooltip("cause:N", title="primary cause"),
                 alt.Tooltip("cause_pct:Q", title="primary cause's share of lateness (%)", format=".0f")],
    ).properties(width=WIDTH - 260, height=max(60, min(30 * len(order), 900)))


# ---------------------------------------------------------------------------------------------------------------
# Per-iteration trend (iteration_trend)

MAX_TREND_RANKS = 16  # lines drawn: the lowest ranks
TREND_FLAGS = {"normal": "#4C78A8", "warmup": "#F58518", "outlier": "#B5323A", "not evaluated": "#BAB0AC"}
_TREND_SOURCE = {"marker": "iterations from the step markers", "detected": "iterations detected from the repeating "
                 "kernel sequence or set of collectives (no step markers)", "whole_capture": "the whole capture as "
                 "one iteration"}


@consumes(iteration_trend=("iteration_index", "rank", "iteration_source", "step_no", "iteration_ns",
                           "comm_exposed_ns", "is_outlier", "comm_is_outlier", "trend_flag"))
def iteration_trend_chart(df: pl.DataFrame) -> alt.VConcatChart:
    """Two panels on one iteration axis, one line per rank (the MAX_TREND_RANKS lowest): iteration time and exposed
    communication per iteration (ms); points coloured by iteration_trend's flag (warm-up, outlier, normal; the
    exposed-communication panel by its own outlier rule), so that warm-up, drift and outliers show."""
    ranks = df["rank"].unique().sort().head(MAX_TREND_RANKS)
    d = df.filter(pl.col("rank").is_in(ranks.implode())).select(
        pl.col("iteration_index").cast(pl.Int64), pl.col("rank").cast(pl.Utf8), "step_no",
        _in("iteration_ns", "ms").round(6).alias("iteration_ms"),
        _in("comm_exposed_ns", "ms").round(6).alias("exposed_ms"),
        pl.col("trend_flag").fill_null("not evaluated").alias("flag"),
        pl.when(pl.col("comm_is_outlier")).then(pl.lit("outlier"))
        .when(pl.col("comm_is_outlier").not_()).then(pl.lit("normal"))
        .otherwise(pl.lit("not evaluated")).alias("comm_flag"))
    sources = sorted(set(df["iteration_source"].drop_nulls().to_list()))
    said = "; ".join(_TREND_SOURCE.get(x, x) for x in sources) or "iterations"
    more = df["rank"].n_unique() - ranks.len()
    sub = f"{said[0].upper()}{said[1:]}" + (f"; the {ranks.len()} lowest ranks of {ranks.len() + more}" if more else "")
    flags = [f for f in TREND_FLAGS if f in set(d["flag"].to_list()) | set(d["comm_flag"].to_list())]
    color = alt.Color("flag:N", title="iteration", sort=flags,
                      scale=alt.Scale(domain=flags, range=[TREND_FLAGS[f] for f in flags]))
    x = alt.X("iteration_index:Q", title="iteration (0 = first on the rank)", axis=alt.Axis(tickMinStep=1,
                                                                                          format="d"))
    tip = [alt.Tooltip("rank:N"), alt.Tooltip("iteration_index:Q", title="iteration"),
           alt.Tooltip("step_no:Q", title="step marker"),
           alt.Tooltip("iteration_ms:Q", title="iteration (ms)", format=",.3f"),
           alt.Tooltip("exposed_ms:Q", title="exposed communication (ms)", format=",.3f"),
           alt.Tooltip("flag:N", title="iteration time"), alt.Tooltip("comm_flag:N", title="exposed communication")]

    def panel(field: str, title: str, flag: str) -> alt.LayerChart:
        base = alt.Chart(d).encode(x=x, y=alt.Y(f"{field}:Q", title=title))
        return alt.layer(
            base.mark_line(strokeWidth=1, opacity=0.6, color="#9aa3ad").encode(detail="rank:N"),
            base.mark_point(filled=True, size=36).encode(color=color if flag == "flag" else alt.Color(
                "comm_flag:N", title="iteration", sort=flags,
                scale=alt.Scale(domain=flags, range=[TREND_FLAGS[f] for f in flags])), tooltip=tip),
        ).properties(width=WIDTH - 200, height=180)

    return alt.vconcat(panel("iteration_ms", "iteration time (ms)", "flag"),
                       panel("exposed_ms", "exposed communication (ms)", "comm_flag"), spacing=14,
                       title=_title("Iteration time and exposed communication per iteration", sub)
                       ).resolve_scale(color="shared")


# ---------------------------------------------------------------------------------------------------------------
# Step timeline

TIMELINE_CLASSES = ["communication", "gemm", "convolution", "attention", "compute", "memory"]


@consumes(step_timeline=("step_label", "window_duration_ns", "rank", "lane", "op_class", "start_offset_ns",
                         "end_offset_ns", "busy_ns", "busy_pct", "n_ops", "longest_op_name",
                         "longest_op_full_name"))
def step_timeline_chart(df: pl.DataFrame) -> alt.Chart:
    """Timeline of one step: one row per rank and lane, bars coloured by kernel class, opacity = how busy the
    merged segment is. Times in ms for windows of 10 ms or more, else µs."""
    window = float(df["window_duration_ns"].max() or 0)
    unit, scale = ("ms", NS_PER_UNIT["ms"]) if window >= 10 * NS_PER_UNIT["ms"] else ("µs", NS_PER_UNIT["us"])
    d = df.select(
        "rank", "lane", "op_class", "busy_pct", "n_ops", "longest_op_name", "longest_op_full_name",
        (pl.col("start_offset_ns") / scale).alias("start"), (pl.col("end_offset_ns") / scale).alias("end"),
        ((pl.col("end_offset_ns") - pl.col("start_offset_ns")).clip(lower_bound=0) / scale).alias("length"),
        (pl.col("busy_ns") / scale).alias("busy"),
        pl.concat_str([pl.lit("rank "), pl.col("rank").cast(pl.Utf8), pl.lit(" · "),
                       pl.col("lane").replace({"communication": "comm"})]).alias("lane_label"))
    lanes = (d.select("rank", "lane", "lane_label").unique()
             .with_columns(pl.col("lane").replace_strict({"communication": 0, "compute": 1, "memory": 2},
                                                         default=3).alias("lo"))
             .sort("rank", "lo")["lane_label"].to_list())
    label = df["step_label"][0] if df.height else ""
    present = [c for c in TIMELINE_CLASSES if c in set(d["op_class"].to_list())]
    fmt = ",.1f" if unit == "ms" else ",.0f"
    return alt.Chart(d, title=_title(f"Timeline of {label}: communication and compute lanes per rank",
                                     "GPU activity merged into short segments (opacity = share of the segment that is "
                                     "busy); hover for the longest kernel")).mark_bar(height={"band": 0.8}).encode(
        x=alt.X("start:Q", title=f"time since {label} start ({unit})",
                axis=alt.Axis(format=fmt, tickCount=8, labelOverlap="greedy", labelFlush=False)),
        x2="end:Q",
        y=alt.Y("lane_label:N", title=None, sort=lanes),
        color=alt.Color("op_class:N", title="kernel class", scale=_scale(present), sort=present),
        opacity=alt.Opacity("busy_pct:Q", scale=alt.Scale(domain=[0, 100], range=[0.35, 1]), legend=None),
        tooltip=[alt.Tooltip("lane_label:N", title="lane"), alt.Tooltip("op_class:N", title="main class"),
                 alt.Tooltip("start:Q", title=f"start ({unit})", format=",.1f"),
                 alt.Tooltip("length:Q", title=f"length ({unit})", format=",.1f"),
                 alt.Tooltip("busy:Q", title=f"busy ({unit})", format=",.1f"),
                 alt.Tooltip("n_ops:Q", title="operations"),
                 alt.Tooltip("longest_op_name:N", title="longest operation"),
                 alt.Tooltip("longest_op_full_name:N", title="full name")],
    ).properties(width=WIDTH - 160, height=max(60, min(14 * len(lanes), 700)))


# ---------------------------------------------------------------------------------------------------------------
# Latency-bound communication


@consumes(latency_model=("collective", "group_size", "transfer_source", "instances", "latency_floor_ns",
                         "transfer_p50_ns", "transfer_p90_ns", "duration_incl_wait_p10_ns",
                         "duration_incl_wait_p50_ns", "duration_incl_wait_p90_ns", "alpha_us", "beta_gbps",
                         "n_half_bytes", "fit_quality", "fit_min_bytes", "fit_max_bytes"),
          latency_by_size=("collective", "group_size", "msg_bytes", "instances", "transfer_p10_ns",
                           "transfer_p50_ns", "transfer_p90_ns"))
def latency_chart(model: pl.DataFrame, points: pl.DataFrame | None = None) -> alt.Chart:
    """Log-log matched transfer time (median per size, p10–p90 whisker) against size per collective and p2p, with the
    model curve t = α + bytes/β over each shown fit's size range (dashed: 'ok'; dotted: shown, not used) and n½ of
    'ok' fits (latency_by_size, latency_model). Without sized matched transfers: per collective, the range of what
    the data measure, labelled by source: transfer time from the latency floor to p90, or kernel duration p10–p90
    with waiting included."""
    if points is None or not points.height:
        return _latency_ranges(model)
    d = points.select(
        (pl.col("collective") + " n=" + pl.col("group_size").cast(pl.Utf8)).alias("op"), "msg_bytes", "instances",
        pl.col("msg_bytes").cast(pl.Float64).alias("size_bytes"), _in("transfer_p10_ns", "us").alias("p10_us"),
        _in("transfer_p50_ns", "us").alias("p50_us"), _in("transfer_p90_ns", "us").alias("p90_us"))
    x = _size_x("size_bytes:Q", "message size (bytes, log2 scale)")
    y = alt.Y("p50_us:Q", scale=alt.Scale(type="log"), title="transfer time, waiting excluded (µs)")
    base = alt.Chart(d).encode(x=x, color=alt.Color("op:N", title="operation"))
    layers = [base.mark_rule().encode(y=alt.Y("p10_us:Q", scale=alt.Scale(type="log")), y2="p90_us:Q"),
              base.mark_point(filled=True, size=50).encode(
                  y=y, tooltip=["op", "msg_bytes", "instances",
                                alt.Tooltip("p50_us:Q", title="median (µs)", format=",.1f")])]
    curves = _latency_curves(model)
    if curves.height:
        layers.append(alt.Chart(curves).mark_line().encode(
            x=x, y=alt.Y("model_us:Q", scale=alt.Scale(type="log")), color="op:N", detail="fit:N",
            strokeDash=alt.StrokeDash("fit:N", title="α-β fit", scale=alt.Scale(
                domain=["ok", "shown, not used"], range=[[6, 3], [1, 3]])),
            tooltip=["op", "fit", alt.Tooltip("model_us:Q", title="model (µs)", format=",.1f")]))
    nh = (model.filter((pl.col("fit_quality") == "ok") & pl.col("n_half_bytes").is_not_null())
          .select((pl.col("collective") + " n=" + pl.col("group_size").cast(pl.Utf8)).alias("op"),
                  pl.col("n_half_bytes").cast(pl.Float64)).sort("op"))
    if nh.height:
        layers.append(alt.Chart(nh).mark_rule(strokeDash=[1, 2]).encode(
            x="n_half_bytes:Q", color="op:N", tooltip=["op", alt.Tooltip("n_half_bytes:Q", title="n½ (bytes)")]))
    return alt.layer(*layers, title=_title(
        "Transfer time against message size",
        "Median (dot), p10–p90 (whisker), model α + bytes/β over the fitted sizes (dashed: 'ok'; dotted: not used), "
        "n½ of 'ok' fits (dotted rule)")).properties(width=560, height=320)


def _latency_curves(model: pl.DataFrame) -> pl.DataFrame:
    """The model t = α + bytes/β of every shown fit, 40 log-spaced sizes over its fitted range (µs)."""
    rows = []
    for m in model.filter(pl.col("alpha_us").is_not_null() & (pl.col("beta_gbps") > 0)).iter_rows(named=True):
        lo, hi = float(m["fit_min_bytes"]), float(m["fit_max_bytes"])
        fit = "ok" if m["fit_quality"] == "ok" else "shown, not used"
        for i in range(41):
            b = lo * (hi / lo) ** (i / 40)
            rows.append({"op": f"{m['collective']} n={m['group_size']}", "fit": fit, "size_bytes": b,
                         "model_us": m["alpha_us"] + b / (m["beta_gbps"] * 1e3)})
    return pl.DataFrame(rows, schema={"op": pl.Utf8, "fit": pl.Utf8, "size_bytes": pl.Float64,
                                      "model_us": pl.Float64}).filter(pl.col("model_us") > 0)


def _latency_ranges(model: pl.DataFrame) -> alt.Chart:
    """Per collective, without sized matched transfers: the matched transfer-time range (latency floor to p90), or
    the kernel-duration range (p10–p90, waiting included) where nothing was matched; the axis says which."""
    matched = pl.col("transfer_source") == "matched"
    d = model.select(
        (pl.col("collective") + pl.when(matched).then(pl.lit("")).otherwise(pl.lit(" (incl. wait)"))).alias("op"),
        "instances", pl.when(matched).then(pl.lit("transfer time")).otherwise(
            pl.lit("kernel duration, waiting included")).alias("source"),
        pl.when(matched).then(_in("latency_floor_ns", "us")).otherwise(_in("duration_incl_wait_p10_ns", "us"))
        .alias("lo_us"),
        pl.when(matched).then(_in("transfer_p50_ns", "us")).otherwise(_in("duration_incl_wait_p50_ns", "us"))
        .alias("p50_us"),
        pl.when(matched).then(_in("transfer_p90_ns", "us")).otherwise(_in("duration_incl_wait_p90_ns", "us"))
        .alias("p90_us"))
    sources = set(d["source"].to_list())
    axis = ("transfer time, waiting excluded (µs)" if sources == {"transfer time"} else
            "kernel duration, waiting for peers included (µs)" if "transfer time" not in sources else
            "transfer time, or kernel duration incl. waiting where marked (µs)")
    base = alt.Chart(d).encode(y=alt.Y("op:N", title=None))
    return alt.layer(
        base.mark_rule().encode(x=alt.X("lo_us:Q", title=axis), x2="p90_us:Q"),
        base.mark_point(filled=True, size=60).encode(
            x="p50_us:Q", tooltip=["op", "source", "instances",
                                   alt.Tooltip("lo_us:Q", title="floor / p10 (µs)", format=",.1f"),
                                   alt.Tooltip("p50_us:Q", title="median (µs)", format=",.1f"),
                                   alt.Tooltip("p90_us:Q", title="p90 (µs)", format=",.1f")]),
        title=_title("Time per collective", "No sized matched transfers: latency floor (transfer) or p10 (duration) "
                     "to p90 (rule), median (dot); no α-β fit"),
    ).properties(width=560)


@consumes(transfer_by_pair=("src_rank", "dst_rank", "instances", "transfer_p50_ns", "wait_p50_ns",
                            "receiver_waited_pct"))
def pair_heatmap_chart(pairs: pl.DataFrame) -> alt.Chart:
    """Sender × receiver heatmap of median p2p transfer time, with the median wait in the tooltip and as text."""
    d = pairs.select("src_rank", "dst_rank", "instances", "receiver_waited_pct",
                     _in("transfer_p50_ns", "us").alias("transfer_us"), _in("wait_p50_ns", "us").alias("wait_us"))
    base = alt.Chart(d).encode(x=alt.X("dst_rank:O", title="receiver rank"), y=alt.Y("src_rank:O", title="sender rank"))
    return alt.layer(
        base.mark_rect().encode(color=alt.Color("transfer_us:Q", title="median transfer (µs)"),
                                tooltip=["src_rank", "dst_rank", "instances",
                                         alt.Tooltip("transfer_us:Q", title="median transfer (µs)", format=",.1f"),
                                         alt.Tooltip("wait_us:Q", title="median wait (µs)", format=",.1f"),
                                         alt.Tooltip("receiver_waited_pct:Q", title="receiver waited (%)",
                                                     format=".0f")]),
        base.mark_text(fontSize=9).encode(text=alt.Text("wait_us:Q", format=".0f")),
        title=_title("Point-to-point pairs", "Colour: median transfer time; number: median wait of the earlier "
                                             "side (µs)"),
    ).properties(width=320, height=320)


# ---------------------------------------------------------------------------------------------------------------
# What changed (report --baseline): frames are rows of nsys2comm.compare (base, new per section/metric/key)

RUN_COLORS = {"base": "#BAB0AC", "new": "#4C78A8"}  # grey: the baseline, blue: this run


def _paired(d: pl.DataFrame, key: str) -> pl.DataFrame:
    """(key, run, ms) long rows from base/new ns-per-step values; a side without the row has no bar."""
    return (d.select(key, pl.col("base").alias("base"), pl.col("new").alias("new"))
            .unpivot(index=key, on=["base", "new"], variable_name="run", value_name="ns")
            .drop_nulls("ns").with_columns((pl.col("ns") / NS_PER_UNIT["ms"]).alias("ms")))


def _paired_bars(long: pl.DataFrame, key: str, sort: list, title: alt.TitleParams, x_title: str) -> alt.Chart:
    return alt.Chart(long, title=title).mark_bar().encode(
        y=alt.Y(f"{key}:O", title=key, sort=sort),
        yOffset=alt.YOffset("run:N", sort=list(RUN_COLORS)),
        x=alt.X("ms:Q", title=x_title),
        color=alt.Color("run:N", title="run", sort=list(RUN_COLORS),
                        scale=alt.Scale(domain=list(RUN_COLORS), range=list(RUN_COLORS.values()))),
        tooltip=[alt.Tooltip(f"{key}:O"), alt.Tooltip("run:N"), alt.Tooltip("ms:Q", title=x_title, format=",.3f")],
    ).properties(width=WIDTH - 200, height=max(60, min(28 * len(sort), 700)))


def changes_by_rank_chart(df: pl.DataFrame) -> alt.Chart:
    """Grouped bars, one pair per rank: exposed communication per step in the baseline and in this run (the diff's
    rank / exposed_comm_ns_per_step rows)."""
    d = df.filter((pl.col("section") == "rank")  # per step, or per capture window without steps
                  & pl.col("metric").is_in(["exposed_comm_ns_per_step", "exposed_comm_ns_per_window"]))
    per = "per capture window" if d["metric"].str.ends_with("_per_window").any() else "per step"
    d = d.filter(pl.col("rank").is_in(d["rank"].unique().sort().head(MAX_BARS).implode()))
    long = _paired(d.with_columns(pl.col("rank").cast(pl.Int64)), "rank")
    return _paired_bars(long, "rank", sorted(long["rank"].unique().to_list()),
                        _title("Exposed communication per rank: baseline and this run",
                               f"Communication time with no computation running, {per} (grey: baseline)"),
                        f"exposed communication {per} (ms)")


def changes_by_collective_chart(df: pl.DataFrame) -> alt.Chart:
    """Grouped bars, one pair per collective: kernel time per step summed over ranks and size buckets, in the
    baseline and in this run (the diff's collective / time_ns_per_step rows)."""
    d = df.filter((pl.col("section") == "collective")
                  & pl.col("metric").is_in(["time_ns_per_step", "time_ns_per_window"]))
    per = "per capture window" if d["metric"].str.ends_with("_per_window").any() else "per step"
    d = (d
         .group_by("collective").agg(*[pl.when(pl.col(c).is_not_null().any()).then(pl.col(c).sum()).alias(c)
                                       for c in ("base", "new")])
         .sort("collective"))  # group_by's order varies from run to run: the spec would too
    long = _paired(d, "collective")
    return _paired_bars(long, "collective", _collective_order(long["collective"]),
                        _title("Communication time per collective: baseline and this run",
                               f"Kernel time {per}, summed over ranks and message sizes (grey: baseline)"),
                        f"kernel time {per} (ms)")
