"""The report's content as data: the catalog queries it runs, when their numbers are not available, and the
sections with their charts and tables. html.py turns these specs into a page; nothing here builds HTML.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from . import charts as ch
from .data import Query, consumes, declare

TIMELINE_SEGMENTS = 150
TIMELINE_RANKS = 16
TOP_KERNELS = 25
MAX_OVERVIEW_RANKS = 64


@consumes(run_overview=("n_comm_kernels",))
def _has_comm(overview: pl.DataFrame) -> str | None:
    return None if overview["n_comm_kernels"].sum() > 0 else "the job has no communication kernels"


@consumes(run_overview=("rank",))
def _two_ranks(overview: pl.DataFrame) -> str | None:
    n = overview.height
    return None if n >= 2 else f"cross-rank skew needs at least two ranks; this job has {n}"


# job facts a query may need: name -> check of run_overview returning why not (None: the fact holds)
FACTS: dict[str, Callable[[pl.DataFrame], str | None]] = {"comm": _has_comm, "two_ranks": _two_ranks}

QUERIES: list[Query] = [
    Query("run_overview"),
    Query("report_files"),
    Query("diagnostics"),
    Query("report_notes"),
    Query("time_breakdown_by_rank"),
    Query("overlap_by_rank", needs=("comm",)),
    Query("comm_overlap_by_collective", needs=("comm",)),
    Query("exposed_comm_causes", needs=("comm",), empty="no communication time is exposed"),
    Query("msg_size_histogram", needs=("comm",)),
    Query("collective_bandwidth", needs=("comm",), empty="no collective has a known message size",
          all_null=("busbw_gbps", "bus bandwidth needs the group size of each collective, which the trace does "
                                  "not record")),
    Query("latency_model"),
    Query("latency_by_size"),
    Query("transfer_by_pair"),
    Query("collective_skew", needs=("comm", "two_ranks"),
          all_null=("start_skew_ns", "no collective was matched on two or more ranks")),
    Query("rank_wait", needs=("comm", "two_ranks")),
    Query("step_timeline", {"max_segments": TIMELINE_SEGMENTS, "max_ranks": TIMELINE_RANKS}),
    Query("top_comm_kernels", {"n": TOP_KERNELS}, needs=("comm",)),
]


@dataclass(frozen=True)
class ChartSpec:
    """A chart: ``draw(*frames of inputs)``; the first input is required, later ones may be None. ``hint``:
    words ('|'-separated) picking the diagnostics that explain an empty input."""

    id: str
    caption: str
    draw: Callable
    inputs: tuple[str, ...]
    hint: str | None = None


@dataclass(frozen=True)
class TableSpec:
    """A table of one query: (column, header, format) per column; formats as in html.cell()."""

    id: str
    source: str
    columns: tuple[tuple[str, str, str], ...]
    cls: str = ""
    hint: str | None = None


@dataclass(frozen=True)
class SectionSpec:
    id: str
    title: str
    intro: str
    blocks: tuple[ChartSpec | TableSpec, ...]


TOP_KERNEL_COLUMNS = (
    ("short_name", "kernel", "title:top_name"), ("n_names", "variants", "int"), ("collective", "collective", ""),
    ("calls", "calls", "int"), ("ranks", "ranks", "int"), ("total_ns", "total (ms)", "ms"),
    ("mean_ns", "mean (µs)", "us"), ("max_ns", "max (µs)", "us"), ("exposed_pct", "exposed (%)", "pct"),
    ("median_msg_bytes", "median size", "bytes"), ("time_share_pct", "share of comm time (%)", "pct"),
)
RANK_COLUMNS = (
    ("rank", "rank", ""), ("host", "host", ""), ("gpus", "GPUs", ""), ("source", "source", ""),
    ("n_kernels", "kernels", "int"), ("n_comm_kernels", "comm kernels", "int"), ("n_mem_ops", "memory ops", "int"),
    ("span_ns", "span (ms)", "ms"), ("file_path", "file", ""),
)

SECTIONS: list[SectionSpec] = [
    SectionSpec("sec-breakdown", "Per-rank time breakdown", "Where each rank's GPU time goes over the profiled span.", (
        ChartSpec("chart-breakdown", "Stacked bars, one per rank: exposed communication, compute classes, memory and "
                  "idle time (ms).", ch.time_breakdown_chart, ("time_breakdown_by_rank",)),
    )),
    SectionSpec("sec-overlap", "Communication / compute / GEMM overlap",
                "How much communication runs hidden under computation, per rank and per collective.", (
        ChartSpec("chart-overlap-rank", "Per rank, communication kernel time split into exposed, hidden under GEMM "
                  "and hidden under other compute (ms).", ch.overlap_by_rank_chart, ("overlap_by_rank",)),
        ChartSpec("chart-overlap-coll", "Per collective, the share of its kernel time that is exposed or hidden (%).",
                  ch.overlap_by_collective_chart, ("comm_overlap_by_collective",)),
    )),
    SectionSpec("sec-causes", "Why communication is exposed",
                "Each exposed ns of a communication kernel gets one cause, in this order: its stream also runs "
                "computation; it waited for a late rank; it queued behind another collective on its stream or "
                "communicator; the next computation was queued but waited for it; no computation was launched yet.", (
        ChartSpec("chart-causes", "Stacked bars, one per rank: exposed communication-kernel time by cause (ms); "
                  "concurrent communication kernels each count.", ch.exposed_causes_chart, ("exposed_comm_causes",),
                  "exposed|communication"),
    )),
    SectionSpec("sec-msgsize", "Message sizes", "How much time each collective spends at each message size.", (
        ChartSpec("chart-msgsize", "Kernel time per power-of-two message-size bucket on a log2 size axis, stacked by "
                  "collective (ms).", ch.msg_size_histogram_chart, ("msg_size_histogram",), "size|blob|bytes"),
    )),
    SectionSpec("sec-busbw", "Bandwidth against message size",
                "Achieved bus bandwidth per collective; flat low values at small sizes mean latency-bound calls.", (
        ChartSpec("chart-busbw", "nccl-tests bus bandwidth (GB/s) per message-size bucket, log2 size axis; lines "
                  "join adjacent buckets only.", ch.busbw_chart, ("collective_bandwidth",), "size|blob|bytes|group"),
    )),
    SectionSpec("sec-latency", "Latency-bound communication",
                "Transfer time apart from waiting (matched across ranks) against size, the α-β fit per collective and "
                "for point-to-point, and who waits for whom in send/recv.", (
        ChartSpec("chart-latency", "Log-log: median transfer time per size (p10–p90 whisker), fitted t = α + bytes/β "
                  "(dashed) and n½ = α·β (dotted rule); without sizes, the transfer-time range per collective from "
                  "the latency floor.", ch.latency_chart, ("latency_model", "latency_by_size"),
                  "latency|transfer|size|blob|communication"),
        ChartSpec("chart-p2p-pairs", "Point-to-point, sender × receiver: colour = median transfer time (µs), number = "
                  "median wait of the earlier side (µs).", ch.pair_heatmap_chart, ("transfer_by_pair",),
                  "p2p|send|recv|peer"),
    )),
    SectionSpec("sec-skew", "Cross-rank skew and stragglers",
                "How long ranks wait for each other at collectives, and who arrives last.", (
        ChartSpec("chart-skew", f"Heatmap rank × collective instance (the {ch.MAX_SKEW_INSTANCES} most skewed): wait "
                  "until the last rank arrived (µs).", ch.skew_heatmap_chart, ("collective_skew",),
                  "collective_skew|skew|seq"),
        ChartSpec("chart-straggler", "Per rank: how often it arrived last at a collective, and how long it waited for "
                  "the others (ms).", ch.straggler_chart, ("rank_wait",), "rank_wait|skew|seq"),
    )),
    SectionSpec("sec-timeline", "Timeline of one step",
                f"Communication, compute and memory lanes for up to {TIMELINE_RANKS} ranks, merged into at most "
                f"{TIMELINE_SEGMENTS} segments per lane.", (
        ChartSpec("chart-timeline", "GPU activity per rank and lane; colour = kernel class, faint = partly idle "
                  "segment.", ch.step_timeline_chart, ("step_timeline",), "step"),
    )),
    SectionSpec("sec-kernels", "Top communication kernels",
                f"The {TOP_KERNELS} communication kernels (by name and collective) with the most total time.", (
        TableSpec("table-kernels", "top_comm_kernels", TOP_KERNEL_COLUMNS, "kernels"),
    )),
]


def _title_columns(columns) -> tuple[str, ...]:
    """Columns a table layout reads, tooltip columns ('title:COL') included."""
    out = [c for c, _, _ in columns] + [f.removeprefix("title:") for _, _, f in columns if f.startswith("title:")]
    return tuple(dict.fromkeys(out))


declare(f"{__name__}.TOP_KERNEL_COLUMNS", top_comm_kernels=_title_columns(TOP_KERNEL_COLUMNS))
declare(f"{__name__}.RANK_COLUMNS", run_overview=_title_columns(RANK_COLUMNS))
