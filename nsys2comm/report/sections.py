"""The report's content as data: the catalog queries it runs, when their numbers are not available, and the
sections with their charts and tables. html.py turns these specs into a page; nothing here builds HTML.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import polars as pl

from .. import catalog
from ..analysis import check_query
from ..errors import UsageError
from ..results import GAP_COLUMNS, GAPS
from . import charts as ch
from .data import Query, consumes, declare

TIMELINE_SEGMENTS = 150
TIMELINE_RANKS = 16
TOP_KERNELS = 25
TOP_PAIRS = 20
MAX_OVERVIEW_RANKS = 64
HOST_OPS_PER_INSTANCE = 10  # late_rank_host_ops' top_n
TOP_HOST_OPS = 15  # rows of the report's host-ops table


@consumes(iteration_trend=("rank", "iteration_source"))
def _trend_needs_iterations(trend: pl.DataFrame) -> str | None:
    """A trend needs two iterations on some rank."""
    if trend.group_by("rank").len()["len"].max() >= 2:
        return None
    if set(trend["iteration_source"].to_list()) == {"whole_capture"}:
        return ("the trace has no step markers and no repeating iteration was detected: the whole capture is one "
                "iteration")
    return "every rank has a single iteration"


# job facts a query may need (Query.needs): the results layer's GAPS, read from the catalog's diagnostics
FACTS = GAPS
declare(f"{__name__}.FACTS", diagnostics=GAP_COLUMNS)

QUERIES: list[Query] = [
    Query("run_overview"),
    Query("report_files"),
    Query("diagnostics"),
    Query("report_notes"),
    Query("time_breakdown_by_rank"),
    Query("overlap_by_rank", needs=("comm",)),
    Query("overlap_worst_rank", needs=("comm",)),
    Query("comm_overlap_by_collective", needs=("comm",)),
    Query("exposed_comm_causes", needs=("comm",), empty="no communication time is exposed"),
    Query("gemm_contention", needs=("comm",), empty="the job has no GEMM kernels",
          all_null=("slowdown_pct", "no GEMM shape has enough kernels both alone and under communication in the "
                                    "same steps (gemm_contention's min_samples)")),
    Query("serialised_pairs", needs=("comm",),
          empty="no collective starts right after the GEMM that produced its input while exposed"),
    Query("msg_size_histogram", needs=("comm",),
          all_null=("bucket_lo_bytes", "no communication operation has a known message size")),
    Query("collective_bandwidth", needs=("comm",), empty="no collective has a known message size",
          all_null=("busbw_incl_wait_gbps", "bus bandwidth needs the group size of each collective, which the trace "
                                            "does not record")),
    Query("latency_model", needs=("comm",)),
    Query("latency_by_size", needs=("comm",)),
    Query("latency_bound_total", needs=("comm",)),
    Query("transfer_by_pair", needs=("comm",)),
    Query("collective_skew", needs=("comm", "two_ranks"),
          all_null=("start_skew_ns", "no collective was matched on two or more ranks")),
    Query("rank_wait", needs=("comm", "two_ranks")),
    Query("late_arrival_causes", needs=("comm", "two_ranks"),
          empty="no collective instance was matched consistently on two or more ranks"),
    Query("late_rank_host_ops", {"top_n": HOST_OPS_PER_INSTANCE}, needs=("comm", "two_ranks"),
          empty="no late arrival has host-bound lateness with CPU ops recorded on the late rank's launching thread"),
    Query("iteration_trend", check=_trend_needs_iterations),
    Query("iterations"),  # the timeline's step: choose_step() gives step_timeline's parameters (html.collect)
    Query("step_timeline", {"max_segments": TIMELINE_SEGMENTS, "max_ranks": TIMELINE_RANKS}),
    Query("top_comm_kernels", {"n": TOP_KERNELS}, needs=("comm",)),
    Query("parallel_degrees"),
    Query("parallel_layout", empty="the trace records no process group or communication"),
    Query("volume_check", empty="the job has no communication and no layout to predict any",
          all_null=("predicted_bytes", "no prediction: no model given (report --model layers=…,hidden=…,seq=…,"
                                       "micro_batch=…,vocab=…,dtype=bf16, or a config.json), or the layout's degrees "
                                       "are unknown (--layout); the measured bytes are in 'nsys2comm query DB "
                                       "volume_check'")),
    Query("gemm_efficiency", empty="the job has no GEMM kernels",
          all_null=("achieved_tflops", "no GEMM rate: the trace records no shapes (record_shapes=True), or the device "
                                       "has no known peak (see gemm_overview.efficiency_reason; --peak-tflops)")),
    Query("gemm_shape_groups", empty="no GEMM kernel has a recorded shape (profile with record_shapes=True)"),
    Query("gemm_overview"),
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
    max_rows: int | None = None  # the first rows only; the page says how many more the query has
    prepare: Callable[[pl.DataFrame], pl.DataFrame] | None = None  # rows to show, from the query's (declared)


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
PAIR_COLUMNS = (
    ("rank", "rank", ""), ("gemm_short_name", "producer GEMM", ""), ("gemm_duration_ns", "GEMM (µs)", "us"),
    ("collective", "then collective", ""), ("msg_bytes", "size", "bytes"), ("gap_ns", "gap (µs)", "us"),
    ("comm_exposed_ns", "exposed (µs)", "us"), ("overlap_bound_ns", "overlap bound (µs)", "us"),
    ("slowdown_pct", "GEMM slowdown (%)", "pct"), ("headroom_ns", "T3 headroom (µs)", "us"),
    ("link_source", "link", ""),
)
DEGREE_COLUMNS = (
    ("kind", "dimension", ""), ("degree", "degree", "int"), ("groups", "groups", "int"),
    ("confidence", "confidence", ""), ("source", "source", ""), ("evidence", "evidence", ""),
)
GROUP_COLUMNS = (
    ("kind", "kind", ""), ("degree", "ranks", "int"), ("pg_name", "group", ""), ("pg_desc", "description", ""),
    ("group_ranks", "members", ""), ("confidence", "confidence", ""), ("evidence", "evidence", ""),
    ("collectives", "traffic", ""),
)
VOLUME_COLUMNS = (
    ("step_ord", "step", ""), ("kind", "kind", ""), ("collective", "collective", ""), ("scheme", "scheme", ""),
    ("degree", "degree", "int"), ("predicted_bytes", "predicted / rank", "bytes"),
    ("measured_bytes", "measured / rank", "bytes"), ("ratio", "ratio", "pct"), ("verdict", "verdict", ""),
    ("reason", "reason", "title:formula"),
)
HOST_OP_COLUMNS = (
    ("late_rank", "late rank", ""), ("op_name", "host op", ""), ("op_kind", "kind", ""),
    ("instances", "late arrivals", "int"), ("calls", "calls", "int"), ("self_ns", "self time (ms)", "ms"),
)


@consumes(late_rank_host_ops=("instance_key", "late_rank", "op_name", "op_kind", "calls", "self_ns"))
def host_ops_rows(df: pl.DataFrame) -> pl.DataFrame:
    """late_rank_host_ops summed over the late arrivals of each rank: per (rank, op, kind), the arrivals it appears
    in, its calls and its self time inside the late rank's segments; the most self time first."""
    return (df.group_by("late_rank", "op_name", "op_kind")
            .agg(pl.col("instance_key").n_unique().alias("instances"), pl.col("calls").sum(),
                 pl.col("self_ns").sum())
            .sort(["self_ns", "late_rank", "op_name", "op_kind"], descending=[True, False, False, False])
            .head(TOP_HOST_OPS))


MAX_GROUP_ROWS = 32
GEMM_GROUP_COLUMNS = (
    ("m", "M", "int"), ("n", "N", "int"), ("k", "K", "int"), ("batch", "batch", "int"), ("dtype", "dtype", ""),
    ("ops", "ops", "int"), ("total_ns", "total (ms)", "ms"), ("gemm_time_pct", "share of GEMM time (%)", "pct"),
    ("achieved_tflops", "TFLOP/s", "pct"), ("efficiency_pct", "% of peak", "pct"),
    ("rule_broken", "rule broken", "title:rule_detail"), ("suggested_m", "suggested M", "title:gain_basis"),
    ("suggested_n", "suggested N", "int"), ("suggested_k", "suggested K", "int"),
    ("expected_gain_pct", "estimated gain (%)", "pct"),
)
MAX_GEMM_GROUPS = 20
MAX_VOLUME_ROWS = 60
RANK_COLUMNS = (
    ("rank", "rank", ""), ("host", "host", ""), ("gpus", "GPUs", ""), ("source", "source", ""),
    ("n_kernels", "kernels", "int"), ("n_comm_kernels", "comm kernels", "int"), ("n_mem_ops", "memory ops", "int"),
    ("span_ns", "span (ms)", "ms"), ("file_path", "file", ""),
)

# "What changed" (report --baseline): built by html.changes_section from the rows of nsys2comm.compare, right
# after the findings; its inputs are those rows (not catalog queries), split by html.changes_frames.
CHANGES_TOP = 30
CHANGES_COLUMNS = (
    ("section", "section", ""), ("metric_text", "metric", "title:metric"), ("key", "subject", ""),
    ("base_text", "baseline", ""), ("new_text", "this run", ""), ("delta_text", "change", ""),
    ("delta_pct", "change (%)", "pct"), ("impact_text", "impact", ""),
)
# the intro when the runs do not both have steps, markers or detected iterations (nsys2comm.compare: per window)
CHANGES_WINDOW_INTRO = (
    "This run against the baseline (nsys2comm diff BASE NEW), per capture window: the runs do not both have step "
    "markers or detected iterations, so no figure is per step or a step-time impact. The windows may hold different "
    "work: compare the "
    "per-operation rows (*_per_op). Impact is the change in exposed communication over the work both runs hold "
    "(per collective and size bucket: the operations found in both × the change in exposed time per operation); "
    "rows are sorted by it.")
CHANGES_SECTION = SectionSpec(
    "sec-changes", "What changed",
    "This run against the baseline (nsys2comm diff BASE NEW), per step: totals are divided by each run's steps. "
    "A step is a marked step, or an iteration detected from the repeating kernel pattern where a run has no "
    "markers. Impact is, on the rows of exposed communication and idle time (the job's, a rank's, a collective's size "
    "bucket's), their own change per step; the rows that explain it have none. Rows are sorted by it.", (
        ChartSpec("chart-changes-rank", "Grouped bars, one pair per rank: exposed communication per step in the "
                  "baseline (grey) and this run (ms).", ch.changes_by_rank_chart, ("diff_rank",)),
        ChartSpec("chart-changes-coll", "Grouped bars, one pair per collective: kernel time per step, summed over "
                  "ranks and message sizes, in the baseline (grey) and this run (ms).",
                  ch.changes_by_collective_chart, ("diff_collective",)),
        TableSpec("table-changes", "diff_top", CHANGES_COLUMNS, "changes"),
    ))

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
                "communicator; the next computation was queued but waited for it; no computation was launched yet. "
                "Then what overlapping costs (GEMMs slow down beside communication) and the producer GEMM → "
                "collective pairs that run back to back, with the headroom a tile-by-tile overlap (T3) could win "
                "after paying that slowdown (– where no slowdown could be measured).", (
        ChartSpec("chart-causes", "Stacked bars, one per rank: exposed communication-kernel time by cause (ms); "
                  "concurrent communication kernels each count.", ch.exposed_causes_chart, ("exposed_comm_causes",),
                  "exposed|communication"),
        ChartSpec("chart-contention", "GEMM contention (T3): median duration of each GEMM shape alone and while "
                  "communication runs, in the same steps (µs); shapes with too few samples are left out.",
                  ch.gemm_contention_chart, ("gemm_contention",), "gemm"),
        TableSpec("table-pairs", "serialised_pairs", PAIR_COLUMNS, "pairs", "gemm|launch", max_rows=TOP_PAIRS),
    )),
    SectionSpec("sec-msgsize", "Message sizes", "How much time each collective spends at each message size.", (
        ChartSpec("chart-msgsize", "Kernel time per power-of-two message-size bucket on a log2 size axis, stacked by "
                  "collective (ms).", ch.msg_size_histogram_chart, ("msg_size_histogram",), "size|blob|bytes"),
    )),
    SectionSpec("sec-busbw", "Bandwidth against message size",
                "Achieved bus bandwidth per collective from the transfer time of instances matched on their whole "
                "group (waiting excluded), against the physical peak of the devices and network; series marked "
                "'includes waiting, lower bound' had no such instance; flat low values at small sizes mean "
                "latency-bound calls.", (
        ChartSpec("chart-busbw", "nccl-tests bus bandwidth (GB/s, log scale) per message-size bucket, log2 size "
                  "axis; lines join adjacent buckets only; figures above the physical peak are left out.",
                  ch.busbw_chart, ("collective_bandwidth",), "size|blob|bytes|group"),
    )),
    SectionSpec("sec-latency", "Latency-bound communication",
                "Transfer time apart from waiting (matched on the complete group) against size, the α-β fit per "
                "collective and for point-to-point, and who waits for whom in send/recv. Only fits of quality 'ok' "
                "feed the latency-bound share and the coalescing saving; kernel durations (single-rank jobs, partial "
                "groups) include waiting and get no fit.", (
        ChartSpec("chart-latency", "Log-log: median transfer time per size (p10–p90 whisker), the model t = α + "
                  "bytes/β over the fitted sizes (dashed: 'ok'; dotted: shown, not used) and n½ = α·β of 'ok' fits "
                  "(dotted rule); without sized matched transfers, the range per collective: transfer time from the "
                  "latency floor, or kernel duration with waiting included.", ch.latency_chart,
                  ("latency_model", "latency_by_size"),
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
    SectionSpec("sec-lateness", "Why ranks arrive late",
                "For each collective instance where a rank arrives last, its segment since its previous collective of "
                "the same group (or since its iteration start), against the earliest rank's, split by what its GPU "
                "did: idle with nothing launched (the host had not launched the work: host-bound), idle although "
                "work was launched (queued behind another stream, an event or a copy), computing, or in other "
                "communication. The lateness is split by the differences (late_arrival_causes; shares add up to the "
                "lateness, and a segment that started later carries lateness from before). Then the CPU ops with the "
                "most self time on the late rank's launching thread where the lateness is host-bound "
                "(late_rank_host_ops: the ops the trace records).", (
        ChartSpec("chart-lateness", f"Per instance (the {ch.MAX_LATE_INSTANCES} latest arrivals, in time order): the "
                  "late rank's segment (upper bar) and the earliest rank's (lower bar), by what the GPU did (ms).",
                  ch.late_arrival_chart, ("late_arrival_causes",), "skew|seq"),
        TableSpec("table-host-ops", "late_rank_host_ops", HOST_OP_COLUMNS, "hostops", prepare=host_ops_rows),
    )),
    SectionSpec("sec-trend", "Iterations over time",
                "Each rank's iteration time and exposed communication per iteration, so that warm-up, drift and "
                "outliers show (iteration_trend: an iteration is an outlier when it is further from the rank's "
                "median than 3 × 1.4826 × MAD or 5 % of the median; warm-up: the slow outliers from the first "
                "iteration on).", (
        ChartSpec("chart-trend", f"Per iteration, one line per rank (up to {ch.MAX_TREND_RANKS}): iteration time and "
                  "exposed communication (ms); colour = warm-up, outlier or normal.", ch.iteration_trend_chart,
                  ("iteration_trend",), "step|iteration"),
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
    SectionSpec("sec-volume", "Parallel layout and expected volume",
                "Which process group is tensor (tp), data (dp), pipeline (pp), expert (ep) or context (cp) parallel "
                "and how sure that is ('named' by its description, 'assumed' from --layout, 'inferred' from its "
                "ranks and traffic); then, per step and per kind and collective, the bytes the model predicts "
                "(docs/comm-models.md formulas: DDP, ZeRO-1/2/3, Megatron TP, PP) against the bytes measured, both per "
                "rank in nccl-tests' size convention. Verdict: match when 0.8 ≤ ratio ≤ 1.25, over, under, "
                "unexpected (traffic no formula predicts) or not evaluated (model, layout or sizes unknown); "
                "the reason's tooltip shows the formula with its numbers.", (
        TableSpec("table-degrees", "parallel_degrees", DEGREE_COLUMNS, "layout"),
        TableSpec("table-groups", "parallel_layout", GROUP_COLUMNS, "layout", "group|pg_", max_rows=MAX_GROUP_ROWS),
        TableSpec("table-volume", "volume_check", VOLUME_COLUMNS, "volume", max_rows=MAX_VOLUME_ROWS),
    )),
    SectionSpec("sec-gemm", "GEMM efficiency",
                "How fast each GEMM ran against the device's dense peak for its dtype (docs/gemm-peaks.md; "
                "--peak-tflops overrides it), from the shapes the trace records for the op that launched it. A rate "
                "above the peak cannot be real and is left out. Then the GEMM shapes that cost most time: their "
                "time-weighted efficiency, the first shape rule they break (alignment to the dtype's tensor-core "
                "granularity, tile or wave quantization; the tooltip has the numbers) and the nearest aligned shape "
                "with its estimated gain under the tile-and-wave model (tooltip: the basis).", (
        ChartSpec("chart-gemm-roofline", "Achieved TFLOP/s against arithmetic intensity (log-log), one point per GEMM "
                  "kernel, size = duration; dashed: the roofline of each device and math type.",
                  ch.gemm_roofline_chart, ("gemm_efficiency",), "gemm|shape|record_shapes"),
        TableSpec("table-gemm-groups", "gemm_shape_groups", GEMM_GROUP_COLUMNS, "gemm", "gemm|shape",
                  max_rows=MAX_GEMM_GROUPS),
    )),
]

# The one chart registry: every ChartSpec of the page (SECTIONS, CHANGES_SECTION) and the charts a notebook draws
# that the page leaves out, by id. The report and Job.chart draw each from its entry: the same queries and
# parameters, the same not-available rules (html.report_results), the same draw function.
NOTEBOOK_CHARTS = (
    ChartSpec("chart-p2p-latency", "Point-to-point: median kernel duration per message size (min–p90 whisker), "
              "log-log; kernel durations include waiting.", ch.p2p_latency_chart, ("p2p_latency_by_size",),
              "p2p|send|recv|peer"),
)
NOTEBOOK_QUERIES = [Query("p2p_latency_by_size", needs=("comm",))]  # queries of NOTEBOOK_CHARTS outside QUERIES
CHARTS: dict[str, ChartSpec] = {b.id: b for s in (*SECTIONS, CHANGES_SECTION) for b in s.blocks
                                if isinstance(b, ChartSpec)} | {c.id: c for c in NOTEBOOK_CHARTS}
CHANGES_CHARTS = frozenset(b.id for b in CHANGES_SECTION.blocks if isinstance(b, ChartSpec))  # they need a baseline
# what the report's banner reads: in every batch that draws a chart, so that its reason is the page's
CHART_CONTEXT = ("run_overview", "report_files", "diagnostics", "msg_size_histogram")


def _chart_aliases() -> dict[str, str]:
    """Names that find a chart: its id, the id without 'chart-', the catalog query it draws (its first input) and
    its draw function's name with and without '_chart' (the names of the former api.CHARTS)."""
    out: dict[str, str] = {}
    for cid, spec in CHARTS.items():
        fn = spec.draw.__name__
        for alias in (cid, cid.removeprefix("chart-"), spec.inputs[0], fn, fn.removesuffix("_chart")):
            out.setdefault(alias, cid)
    return out


CHART_NAMES = _chart_aliases()


def find_chart(name: str) -> ChartSpec:
    """The registry's chart for ``name`` (see :func:`_chart_aliases`); a UsageError naming the charts otherwise."""
    cid = CHART_NAMES.get(name)
    if cid is None:
        raise UsageError(f"no chart named {name!r}",
                         hint="charts: " + ", ".join(sorted(c.removeprefix("chart-") for c in CHARTS)))
    return CHARTS[cid]


def chart_queries(spec: ChartSpec, params: dict | None = None) -> list[Query]:
    """The batch that draws ``spec`` as the report does: the report's query of each input (``params`` over the
    report's parameters, each given to the inputs that take it, checked against the catalog), what the banner reads
    (CHART_CONTEXT), and ``iterations`` for the timeline's step (html.report_results chooses it as the report does
    unless ``params`` set step_timeline's own). A parameter no input takes is a UsageError."""
    params = dict(params or {})
    known = {q.name: q for q in (*QUERIES, *NOTEBOOK_QUERIES)}
    names = (*CHART_CONTEXT, *(("iterations",) if "step_timeline" in spec.inputs else ()), *spec.inputs)
    taken: set[str] = set()
    out = []
    for name in dict.fromkeys(names):
        q = known.get(name, Query(name))
        obj = catalog.find(name)
        mine = {k: v for k, v in params.items() if name in spec.inputs and obj is not None and k in obj.params}
        if mine:
            check_query(name, mine)  # a value of the wrong kind: a UsageError before any work
            q = replace(q, params={**q.params, **mine})
            taken |= set(mine)
        out.append(q)
    if set(params) - taken:
        allowed = sorted({p for n in spec.inputs if (o := catalog.find(n)) is not None for p in o.params})
        raise UsageError(f"chart {spec.id.removeprefix('chart-')} has no parameter "
                         f"{', '.join(sorted(set(params) - taken))}",
                         hint=f"parameters of {', '.join(spec.inputs)}: {', '.join(allowed) or 'none'}")
    return out


TIMELINE_PARAMS = {"max_segments": TIMELINE_SEGMENTS, "max_ranks": TIMELINE_RANKS}


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


@consumes(iterations=("rank", "iteration", "step_no", "iteration_source", "start_ns", "end_ns", "ranks_agree"))
def choose_step(its: pl.DataFrame | None, step: int | None = None) -> tuple[Query, str, str]:
    """The timeline's window from ``iterations`` (markers, else detected iterations): ``step`` (the marker's number
    N, or the detected iteration's index), else the median-length one (window = earliest start to latest end over
    the ranks; ties: the lower number). Returns the step_timeline query, the section title and a sentence saying
    which step is shown and how it was chosen. A ``step`` the trace does not have is a usage error."""
    its = its if its is not None else pl.DataFrame(schema={"iteration_source": pl.Utf8})
    marked = its.filter(pl.col("iteration_source") == "marker")
    detected = its.filter(pl.col("iteration_source") == "detected")
    src = marked if marked.height else detected
    if not src.height:
        if step is not None:
            raise UsageError(f"--step {step}: the trace has no step markers and no repeating iteration was detected",
                             hint="leave --step out: the timeline shows the whole capture")
        return (Query("step_timeline", TIMELINE_PARAMS), "Timeline of the whole capture",
                "Shown: the whole capture: the trace has no step markers (ProfilerStep#N, NVTX 'step N') and no "
                "repeating iteration was detected.")
    key = "step_no" if marked.height else "iteration"
    steps = (src.group_by(key).agg(pl.col("start_ns").min().alias("w0"), pl.col("end_ns").max().alias("w1"))
             .with_columns((pl.col("w1") - pl.col("w0")).alias("length")).sort(key))
    numbers = steps[key].to_list()
    what = "step" if marked.height else "iteration"
    if step is not None and step not in numbers:
        raise UsageError(f"--step {step}: the trace has no {what} {step}",
                         hint=f"its {what}s are {numbers[0]}–{numbers[-1]}" if len(numbers) > 1
                         else f"its only {what} is {numbers[0]}")
    if step is None:
        by_length = steps.sort(["length", key])
        step = by_length[key][(by_length.height - 1) // 2]
        how = f"the median-length {what}; report --step N shows another"
    else:
        how = f"chosen with --step {step}"
    pos = numbers.index(step) + 1
    row = steps.filter(pl.col(key) == step).row(0, named=True)
    if marked.height:
        query = Query("step_timeline", {**TIMELINE_PARAMS, "pick_step": step})
        which = "the only step" if len(numbers) == 1 else f"the {_ordinal(pos)} of {len(numbers)} steps"
        said = f"Shown: step {step}, {which} the step markers define (step marker {step}; {how})."
    else:
        query = Query("step_timeline", {**TIMELINE_PARAMS, "window_start_ns": row["w0"], "window_end_ns": row["w1"],
                                        "window_label": f"iteration {step}"})
        agree = detected["ranks_agree"].drop_nulls()
        doubt = "" if agree.is_empty() or agree.all() else "; the ranks found different numbers of iterations"
        which = "the only iteration" if len(numbers) == 1 else f"the {_ordinal(pos)} of {len(numbers)} iterations"
        said = (f"Shown: iteration {step}, {which} detected from the repeating communication and GEMM kernel "
                f"sequence (the trace has no step markers{doubt}; {how}).")
    return query, f"Timeline of {what} {step}", said


def _title_columns(columns) -> tuple[str, ...]:
    """Columns a table layout reads, tooltip columns ('title:COL') included."""
    out = [c for c, _, _ in columns] + [f.removeprefix("title:") for _, _, f in columns if f.startswith("title:")]
    return tuple(dict.fromkeys(out))


declare(f"{__name__}.TOP_KERNEL_COLUMNS", top_comm_kernels=_title_columns(TOP_KERNEL_COLUMNS))
declare(f"{__name__}.RANK_COLUMNS", run_overview=_title_columns(RANK_COLUMNS))
declare(f"{__name__}.DEGREE_COLUMNS", parallel_degrees=_title_columns(DEGREE_COLUMNS))
declare(f"{__name__}.GROUP_COLUMNS", parallel_layout=_title_columns(GROUP_COLUMNS))
declare(f"{__name__}.VOLUME_COLUMNS", volume_check=_title_columns(VOLUME_COLUMNS))
declare(f"{__name__}.PAIR_COLUMNS", serialised_pairs=_title_columns(PAIR_COLUMNS))
declare(f"{__name__}.GEMM_GROUP_COLUMNS", gemm_shape_groups=_title_columns(GEMM_GROUP_COLUMNS))
declare(f"{__name__}.HOST_OP_COLUMNS", late_rank_host_ops=("late_rank", "op_name", "op_kind", "calls", "self_ns"))
