"""The job summary: the few numbers a person reads after a job, as a dict with stable keys.

``build_summary(con)`` computes it from catalog objects only (the same documented SQL anyone can run with
``nsys2comm query``). Each analysis object is optional: when it is missing from this build, or fails on this
job's data, its keys are ``null`` and ``missing`` says why, so the summary never fails on partial traces.

Keys (``schema_version`` 1; new keys may be added, existing keys keep their meaning and unit):

=========================  ====================================================================================
key                        meaning
=========================  ====================================================================================
schema_version             1
nsys2comm_version          package version that wrote it
ranks, files, sources      job shape: number of ranks, of trace files, and their sources ('kineto', 'nsys')
gpu_busy_ns                GPU-busy time summed over ranks (union of kernels and memory ops per rank), ns
comm_ns                    communication-kernel time summed over ranks (union per rank), ns
comm_share_pct             comm_ns / gpu_busy_ns × 100
overlap_pct                share of communication time overlapped by compute kernels, %
exposed_comm_ns            communication time not overlapped by compute, summed over ranks, ns
exposed_comm_pct           exposed_comm_ns / gpu_busy_ns × 100
worst_rank_exposed_comm_pct  the highest per-rank exposed_comm_pct, with ``worst_rank``
worst_collective           {collective, msg_bytes, msg_bytes_hi, group_size, group_size_assumed, spans_hosts, count,
                           total_ns, busbw_gbps, algbw_gbps, bandwidth_basis, matched_ops, peak_busbw_gbps,
                           busbw_pct_of_peak, bandwidth_check}: the collective and message-size bucket
                           [msg_bytes, msg_bytes_hi) taking the most time; busbw/algbw are collective_bandwidth's
                           headline figures: from the transfer time of instances matched on their whole group
                           (bandwidth_basis 'transfer', matched_ops of count), else from kernel durations
                           ('incl_wait': includes waiting, a lower bound); null when above the physical peak
                           (bandwidth_check 'above_peak'); group_size_assumed: busbw rests on the world size assumed
                           for a trace that records no process group
p2p                        {small_msg_share_pct, small_msg_bytes, threshold_rule, alpha_us, beta_gbps, n_half_bytes,
                           fit_quality, n_ops, small_ops}: matched send/recv (latency_model row 'p2p'): share of
                           p2p transfer time in messages below small_msg_bytes (n½ = α·β of an 'ok' fit; both null
                           otherwise), and the fit transfer = α + bytes/β
latency_bound_pct          share of sized transfer time (waiting excluded) in operations below n½ of their
                           (collective, group size) α-β model, over models whose fit is 'ok' only, %
                           (latency_bound_total); null with the reason in ``missing`` when no fit is 'ok' or the
                           fits cover < 10 % of communication time
latency_bound_covered_comm_pct  share of communication kernel time that latency_bound_pct and coalescing_saving_ms
                           cover (the 'ok' fits' sized matched instances), % (latency_bound_total.covered_comm_pct)
coalescing_saving_ms       transfer time saved if latency-bound operations were sent as operations of size n½
                           ('ok' α-β fits only), ms
latency_models             [{collective, group_size, transfer_source, instances, alpha_us, beta_gbps, n_half_bytes,
                           fit_quality, latency_bound_pct, coalescing_saving_ms, covered_comm_pct}] one per
                           (collective, group size), 'p2p' for matched send/recv (latency_model); α, β shown for
                           'ok' and rejected fits alike, only 'ok' ones are used
exposed_by_cause           [{cause, exposed_ns, share_pct}] why communication was exposed (exposed_comm_causes, summed
                           over the job, largest first); exposed_ns sums comm_kernels.exposed_ns, where concurrent
                           communication kernels each count, so its total can exceed exposed_comm_ns; share_pct is
                           of that total. In a single-rank job arrival skew cannot be seen: ``missing`` says so
                           (exposed_comm_causes.late_ranks_visible)
gemm_contention            {slowdown_pct, lost_ns, measured_groups, mixed_groups}: GEMMs under communication against
                           alone, in the same steps (gemm_contention's job row, T3's contention): slowdown_pct is
                           the time-weighted median over the measured groups (within their range), lost_ns their
                           sum; mixed_groups were left out (durations of different work, 'mixed_shapes'); null when
                           no group has enough samples on both sides
serialised_pairs           {pairs, headroom_ns}: producer GEMM → exposed collective pairs run back to back, and the
                           summed T3 headroom of a tile-by-tile overlap after contention (serialised_pairs);
                           headroom_ns null when no GEMM slowdown could be measured
gemm_time_pct              share of GPU-busy time in GEMM kernels, % (gemm_overview: union of GEMM kernel time per
                           rank over GPU-busy time, both summed over ranks)
gemm_efficiency_pct        time-weighted efficiency of the GEMMs with a shape and a known peak against the device's
                           dense peak for their dtype, % (gemm_overview: ideal time at peak / time taken;
                           docs/gemm-peaks.md); null with the reason in ``missing`` (no shapes, unknown device)
mfu_pct                    model FLOPs utilisation, % (gemm_overview: (6·P + 12·L·h·s) FLOPs per token × tokens per
                           iteration / (median iteration time × peak × GPUs per replica)); null without --model
max_skew_ms                largest start skew of one collective instance across its ranks, ms (collective_skew:
                           instances whose ranks disagree are left out)
stragglers                 [{rank, times_last, collectives, p_value, wait_ns}] ranks that arrive last significantly
                           more often than chance (rank_wait.is_straggler: binomial test against 1/ranks,
                           Bonferroni-adjusted p_value < 0.01), smallest p_value first, up to 3; empty: no
                           consistent straggler
late_rank_cause            {rank, instances_late, share_pct, primary_cause}: why the straggler arrives late: the
                           rank_wait straggler (is_straggler) that arrived last most often, the consistent instances
                           where it arrived last (late_arrival_causes rows with late_rank = rank), the cause whose
                           summed share over them is largest ('host', 'gpu_compute', 'queued', 'earlier_comm',
                           'carried') and share_pct = that summed share / their summed lateness_ns × 100; null with
                           the reason in ``missing`` when no rank is a straggler (share_pct exceeds 100 when the
                           other causes' shares are negative: the earliest rank spent longer there)
parallel_layout            [{kind, degree, groups, confidence, source, evidence}] one per dimension tp, cp, ep, dp,
                           pp (parallel_degrees: the trace's process groups, else --layout; degree null when
                           unknown; confidence 'named', 'assumed' (--layout, or a group size the importer
                           assumed) or 'inferred'; evidence says '(undecided: dp or tp)' where groups of
                           unknown kind leave it open)
volume_check               [{step_ord, step_no, kind, collective, scheme, degree, predicted_bytes, measured_bytes,
                           ratio, verdict, reason}] expected against measured bytes per rank per step (nccl-tests
                           size S; verdict 'match' within 0.8-1.25×, 'over', 'under', 'assumed' (the ratio rests
                           on an assumed group size, said in reason), 'unexpected', 'not_evaluated'); null when
                           no model is given (--model), named in ``missing``
failed_files               [{path, error}] traces that could not be ingested (one-off summaries of trace files
                           with --keep-going); ``missing`` names them too
missing                    [str] what data was missing and what to do about it (ingest notes, absent queries);
                           a metric that cannot be computed is null and named here as "KEY: not available (why)";
                           a job without traces says "no traces"
thresholds                 [{name, metric, limit, value, ok, what}] filled by :func:`check_thresholds`; ok is
                           null when the metric is not available (the threshold was not evaluated)
ok                         false when a threshold is violated, null when none is but one was not evaluated,
                           true when every threshold was evaluated and held
=========================  ====================================================================================

Every float has 6 significant digits. Per-rank notes appear once per kind ("on 8 ranks (e.g. rank 0: …)").

Not available, never 0: skew needs a collective matched on at least two ranks, overlap needs communication,
bandwidth needs message sizes.
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from . import __version__
from .results import GAP_COLUMNS, Request, Results, gap, run_batch
from .storage import settle
from .units import JSON_DIGITS, duration, ns_to, pct, round_floats, size

SCHEMA_VERSION = 1

OVERLAP = "overlap_by_rank"
WORST = "overlap_worst_rank"
BANDWIDTH = "collective_bandwidth"
LATENCY = "latency_model"
LATENCY_TOTAL = "latency_bound_total"
WAIT = "rank_wait"
SKEW = "collective_skew"
DIAGNOSTICS = "diagnostics"
CAUSES = "exposed_comm_causes"
DEGREES = "parallel_degrees"
VOLUME = "volume_check"
CONTENTION = "gemm_contention"
PAIRS = "serialised_pairs"
LATE = "late_arrival_causes"
GEMM = "gemm_overview"
OVERVIEW = "run_overview"
FILES = "report_files"
# the documented columns each summary section reads (tests check them against the catalog)
COLUMNS = {
    OVERLAP: ("rank", "busy_ns", "comm_ns", "comm_overlapped_ns", "exposed_comm_ns"),
    WORST: ("rank", "exposed_busy_pct"),
    BANDWIDTH: ("collective", "group_size", "group_size_assumed", "spans_hosts", "bucket_lo_bytes", "bucket_hi_bytes",
                "ops", "matched_ops", "total_ns", "headline_algbw_gbps", "headline_busbw_gbps", "bandwidth_basis",
                "peak_busbw_gbps", "busbw_pct_of_peak", "bandwidth_check"),
    LATENCY: ("collective", "group_size", "transfer_source", "instances", "alpha_us", "beta_gbps", "n_half_bytes",
              "fit_quality", "latency_bound_pct", "coalescing_saving_ns", "small_threshold_bytes", "threshold_rule",
              "below_threshold_ops", "covered_comm_pct"),
    LATENCY_TOTAL: ("latency_bound_pct", "coalescing_saving_ns", "covered_comm_pct", "not_evaluated_reason"),
    WAIT: ("rank", "collectives", "total_wait_ns", "times_arrived_last", "straggler_rank_order",
           "arrived_last_p_value", "is_straggler"),
    SKEW: ("start_skew_ns",),
    DIAGNOSTICS: ("severity", "message", *GAP_COLUMNS),
    CAUSES: ("cause", "exposed_ns", "late_ranks_visible"),
    DEGREES: ("kind", "degree", "groups", "confidence", "source", "evidence"),
    VOLUME: ("step_ord", "step_no", "kind", "collective", "scheme", "degree", "predicted_bytes", "measured_bytes",
             "ratio", "verdict", "reason"),
    CONTENTION: ("scope", "kernels", "slowdown_pct", "lost_ns", "measured_groups", "mixed_groups", "status"),
    PAIRS: ("headroom_ns",),
    LATE: ("late_rank", "lateness_ns", "host_share_ns", "gpu_compute_share_ns", "queued_share_ns",
           "earlier_comm_share_ns", "carried_ns"),
    GEMM: ("gemm_time_pct", "gemm_efficiency_pct", "covered_pct", "efficiency_reason", "mfu_pct", "mfu_reason"),
    OVERVIEW: ("rank", "source", "n_kernels", "n_comm_kernels"),
    FILES: ("file_id", "source"),
}

SUMMARY_KEYS = ["schema_version", "nsys2comm_version", "ranks", "files", "sources", "gpu_busy_ns", "comm_ns",
                "comm_share_pct", "overlap_pct", "exposed_comm_ns", "exposed_comm_pct", "worst_rank",
                "worst_rank_exposed_comm_pct", "worst_collective", "p2p", "latency_bound_pct",
                "latency_bound_covered_comm_pct", "coalescing_saving_ms", "latency_models", "exposed_by_cause",
                "gemm_contention", "serialised_pairs", "gemm_time_pct", "gemm_efficiency_pct", "mfu_pct",
                "max_skew_ms", "stragglers", "late_rank_cause", "parallel_layout", "volume_check", "failed_files",
                "missing",
                "thresholds", "ok"]
DIGITS = JSON_DIGITS  # every float in the summary: 6 significant digits (one precision for every key)


def _query(res: Results, name: str, missing: list[str]) -> pl.DataFrame | None:
    """A query's frame from the summary's batch; None when it failed or was not run (a failure is named in
    ``missing`` once, in the results layer's format)."""
    df = res.frame(name)
    why = res.errors.get(name)
    if df is None and why is not None and why not in missing:
        missing.append(why)
    return df


def _requests(volume: dict) -> list[Request]:
    """The summary's batch: every object of :data:`COLUMNS`, with the parameters of ``--model`` / ``--layout``."""
    from .model import layout_params

    params = {DEGREES: layout_params(volume), GEMM: _gemm_args(volume), VOLUME: volume}
    has_model = any(k in volume for k in ("layers", "hidden", "params"))
    return [Request(name, params.get(name, {})) for name in COLUMNS
            if name not in _IF_NEEDED and (name != VOLUME or has_model)]


_IF_NEEDED = (CONTENTION, PAIRS, LATE)  # run only when the job has communication time / a straggler


def _needed(res: Results) -> list[Request]:
    """The batch's further queries, given its first results: GEMM contention and serialised pairs when the job has
    communication time, the late-arrival causes when a rank is a straggler."""
    ov, wait = res.frame(OVERLAP), res.frame(WAIT)
    comm = ov is not None and bool(ov["comm_ns"].sum())
    straggler = wait is not None and bool(wait["is_straggler"].any())
    return [Request(n) for n in _IF_NEEDED if (comm if n != LATE else straggler)]


def _pct(num, den) -> float | None:
    if num is None or not den:
        return None
    return 100.0 * num / den


def _int(v) -> int | None:
    return None if v is None else int(round(v))


def not_available(s: dict, key: str, why: str) -> None:
    """Record that summary key ``key`` could not be computed: null value, named in ``missing``."""
    line = f"{key}: not available ({why})"
    if line not in s["missing"]:
        s["missing"].append(line)


NO_TRACES = "no traces"
SKEW_HIDDEN = ("exposed_by_cause: arrival skew cannot be seen in a single-rank job: time spent waiting for other "
               "ranks is counted in the other causes; ingest every rank's trace")


def empty_summary(why: str) -> dict[str, Any]:
    """The summary of a job without traces (nothing ingested): every metric null, ``missing`` says why."""
    s: dict[str, Any] = {k: None for k in SUMMARY_KEYS}
    s.update(schema_version=SCHEMA_VERSION, nsys2comm_version=__version__, ranks=0, files=0, sources=[],
             stragglers=[], failed_files=[], missing=[f"{NO_TRACES}: {why}"], thresholds=[], ok=True)
    return s


def build_summary(con, failed_files: list[dict] | None = None, volume: dict | None = None) -> dict[str, Any]:
    """The summary dict of the job in ``con`` (an open job database); ``failed_files`` ({path, error}) lists the
    traces a one-off ingest could not read; ``volume`` holds the volume_check parameters of ``--model`` and
    ``--layout`` (:func:`nsys2comm.model.volume_params`)."""
    missing: list[str] = []
    s: dict[str, Any] = {k: None for k in SUMMARY_KEYS}
    s.update(schema_version=SCHEMA_VERSION, nsys2comm_version=__version__, stragglers=[], missing=missing,
             failed_files=list(failed_files or []), thresholds=[], ok=True)
    if failed_files:  # --keep-going: the figures below rest on the other traces only
        missing.append(f"failed_files: {len(failed_files)} trace file(s) could not be read and were left out "
                       "(--keep-going): " + ", ".join(f["path"] for f in failed_files))
    res = run_batch(con, _requests(volume or {}), COLUMNS, _needed)
    _shape(s, res, missing)
    _overlap(s, res, missing)
    _worst_collective(s, res, missing)
    _latency(s, res, missing)
    _skew(s, res, missing)
    _causes(s, res, missing)
    _volume(s, res, missing, volume or {})
    _contention(s, res, missing)
    _gemm(s, res, missing)
    _late(s, res, missing)
    _notes(s, res, missing)
    if s["files"] == 0:
        missing.insert(0, f"{NO_TRACES}: the job holds no trace files")
    else:
        _name_unavailable(s, res)
    settle(con)  # the connection takes new work after the summary
    return round_floats(s, DIGITS)  # the rule of every JSON output (units.round_floats)


def _shape(s: dict, res: Results, missing: list[str]) -> None:
    """Ranks, files and sources (run_overview, report_files)."""
    ov, files = _query(res, OVERVIEW, missing), _query(res, FILES, missing)
    s["ranks"] = ov.height if ov is not None else 0
    s["files"] = files.height if files is not None else 0
    s["sources"] = sorted(set(files["source"].to_list())) if files is not None else []


def _overview_sum(res: Results, col: str) -> int | None:
    """A run_overview count summed over ranks (None when run_overview failed)."""
    ov = res.frame(OVERVIEW)
    return None if ov is None else int(ov[col].sum() or 0)


def _overlap(s: dict, res: Results, missing: list[str]) -> None:
    """Communication share, overlap and exposed communication (overlap_by_rank, summed over ranks)."""
    ov = _query(res, OVERLAP, missing)
    if ov is not None and ov.height:
        busy, comm = ov["busy_ns"].sum(), ov["comm_ns"].sum()
        olap, exposed = ov["comm_overlapped_ns"].sum(), ov["exposed_comm_ns"].sum()
        s["gpu_busy_ns"], s["comm_ns"], s["exposed_comm_ns"] = _int(busy), _int(comm), _int(exposed)
        s["comm_share_pct"] = _pct(comm, busy)
        s["overlap_pct"] = _pct(olap, comm)
        s["exposed_comm_pct"] = _pct(exposed, busy)
        worst = _query(res, WORST, missing)  # the catalog's one worst-rank rule
        if worst is not None and worst.height:
            s["worst_rank"] = int(worst["rank"][0])
            s["worst_rank_exposed_comm_pct"] = worst["exposed_busy_pct"][0]
    if _overview_sum(res, "n_kernels") == 0 and not s["gpu_busy_ns"]:
        for key in ("gpu_busy_ns", "comm_ns", "exposed_comm_ns"):  # nothing measured on a GPU: not a measured 0
            s[key] = None
            not_available(s, key, "the job has no GPU kernels")


def _worst_collective(s: dict, res: Results, missing: list[str]) -> None:
    """The (collective, group size, size bucket) with the most kernel time (collective_bandwidth)."""
    bw = _query(res, BANDWIDTH, missing)
    if bw is None or not bw.height:
        return
    top = bw.sort(["total_ns", "collective"], descending=[True, False], nulls_last=True).row(0, named=True)
    s["worst_collective"] = {
        "collective": top["collective"], "msg_bytes": top["bucket_lo_bytes"], "msg_bytes_hi": top["bucket_hi_bytes"],
        "group_size": top["group_size"], "group_size_assumed": top["group_size_assumed"],
        "spans_hosts": top["spans_hosts"], "count": top["ops"], "total_ns": top["total_ns"],
        "busbw_gbps": top["headline_busbw_gbps"], "algbw_gbps": top["headline_algbw_gbps"],
        "bandwidth_basis": top["bandwidth_basis"], "matched_ops": top["matched_ops"],
        "peak_busbw_gbps": top["peak_busbw_gbps"], "busbw_pct_of_peak": top["busbw_pct_of_peak"],
        "bandwidth_check": top["bandwidth_check"]}


def _latency(s: dict, res: Results, missing: list[str]) -> None:
    """Latency-bound communication (latency_model, latency_bound_total): shares and savings come from 'ok' α-β fits
    only, with the share of communication time they cover; otherwise null, and ``missing`` says why."""
    models = _query(res, LATENCY, missing)
    total = _query(res, LATENCY_TOTAL, missing)
    t = total.row(0, named=True) if total is not None and total.height else None
    if t:
        s["latency_bound_pct"] = t["latency_bound_pct"]
        s["latency_bound_covered_comm_pct"] = t["covered_comm_pct"]
        s["coalescing_saving_ms"] = ns_to(t["coalescing_saving_ns"], "ms")
    if models is not None and models.height:
        s["latency_models"] = [
            {"collective": r["collective"], "group_size": r["group_size"], "transfer_source": r["transfer_source"],
             "instances": r["instances"], "alpha_us": r["alpha_us"], "beta_gbps": r["beta_gbps"],
             "n_half_bytes": r["n_half_bytes"], "fit_quality": r["fit_quality"],
             "latency_bound_pct": r["latency_bound_pct"],
             "coalescing_saving_ms": ns_to(r["coalescing_saving_ns"], "ms"), "covered_comm_pct": r["covered_comm_pct"]}
            for r in models.iter_rows(named=True)]
        p2p = models.filter(pl.col("collective") == "p2p")
        if p2p.height:
            row = p2p.row(0, named=True)
            s["p2p"] = {"small_msg_share_pct": row["latency_bound_pct"],
                        "small_msg_bytes": row["small_threshold_bytes"], "threshold_rule": row["threshold_rule"],
                        "alpha_us": row["alpha_us"], "beta_gbps": row["beta_gbps"],
                        "n_half_bytes": row["n_half_bytes"], "fit_quality": row["fit_quality"],
                        "n_ops": row["instances"], "small_ops": row["below_threshold_ops"]}
    if s["ranks"] and (s.get("latency_bound_pct") is None or s.get("coalescing_saving_ms") is None):
        why = _latency_why(t, models)
        if s.get("latency_bound_pct") is None:
            not_available(s, "latency_bound_pct", why)
        if s.get("coalescing_saving_ms") is None:
            not_available(s, "coalescing_saving_ms", why)


def _latency_why(t: dict | None, models: pl.DataFrame | None) -> str:
    """Why the latency-bound share is null, in words (latency_bound_total.not_evaluated_reason)."""
    reason = t["not_evaluated_reason"] if t else "no_matched_transfers"
    if reason == "coverage_below_10pct":
        return (f"the 'ok' α-β fits cover only {pct(t['covered_comm_pct'], 1)} of communication kernel time, "
                "too little for a job-wide share")
    if reason == "no_sizes":
        return "no message sizes: re-export with sizes (see latency_model.note)"
    if reason == "no_ok_fit" or (reason is None and models is not None):
        quality = ", ".join(sorted({f"{r['collective']}: {r['fit_quality']}" for r in models.iter_rows(named=True)}
                                   if models is not None else []))
        return f"no α-β fit is 'ok' ({quality}; latency_model.fit_quality)"
    return ("no instance was matched on its complete group (a single-rank job or partial groups): kernel durations "
            "include waiting for peers, so there is no α-β fit")


def _skew(s: dict, res: Results, missing: list[str]) -> None:
    """Stragglers (rank_wait, TraceLens order: 1 = least total wait = likeliest straggler) and the largest start
    skew of one collective instance (collective_skew)."""
    wait = _query(res, WAIT, missing)
    if wait is not None and wait.height:  # rank_wait's one straggler rule (is_straggler), strongest evidence first
        top = wait.filter(pl.col("is_straggler")).sort(["arrived_last_p_value", "straggler_rank_order", "rank"])
        s["stragglers"] = [{"rank": int(r["rank"]), "times_last": r["times_arrived_last"],
                            "collectives": r["collectives"], "p_value": r["arrived_last_p_value"],
                            "wait_ns": r["total_wait_ns"]} for r in top.head(3).iter_rows(named=True)]
    skew = _query(res, SKEW, missing)
    if skew is not None and skew.height and skew["start_skew_ns"].max() is not None:
        s["max_skew_ms"] = ns_to(skew["start_skew_ns"].max(), "ms")


def _late(s: dict, res: Results, missing: list[str]) -> None:
    """Why the straggler arrives late (late_arrival_causes over the instances where it arrived last)."""
    if not s["stragglers"]:
        if s["ranks"] and s["ranks"] >= 2:
            not_available(s, "late_rank_cause", "no rank arrives last significantly more often than chance "
                          "(rank_wait.is_straggler)")
        return
    wait = _query(res, WAIT, missing)
    late = _query(res, LATE, missing)
    if wait is None or late is None:
        return
    top = wait.filter(pl.col("is_straggler")).sort(["times_arrived_last", "rank"], descending=[True, False])
    rank = int(top["rank"][0])
    mine = late.filter(pl.col("late_rank") == rank)
    causes = {"host": "host_share_ns", "gpu_compute": "gpu_compute_share_ns", "queued": "queued_share_ns",
              "earlier_comm": "earlier_comm_share_ns", "carried": "carried_ns"}
    sums = {c: int(mine[col].sum()) for c, col in causes.items()}
    total = int(mine["lateness_ns"].sum())
    if not mine.height or total <= 0:
        not_available(s, "late_rank_cause", f"rank {rank} has no consistent instance where it arrived late")
        return
    cause = max(causes, key=lambda c: sums[c])  # ties: the order of causes
    s["late_rank_cause"] = {"rank": rank, "instances_late": mine.height, "share_pct": _pct(sums[cause], total),
                            "primary_cause": cause}


def _causes(s: dict, res: Results, missing: list[str]) -> None:
    """Why communication was exposed: exposed time per cause over the job (exposed_comm_causes)."""
    causes = _query(res, CAUSES, missing)
    if causes is None or not s["comm_ns"]:
        return
    by = (causes.group_by("cause").agg(pl.col("exposed_ns").sum())
          .sort(["exposed_ns", "cause"], descending=[True, False]))
    total = by["exposed_ns"].sum()
    s["exposed_by_cause"] = [{"cause": r["cause"], "exposed_ns": _int(r["exposed_ns"]),
                              "share_pct": _pct(r["exposed_ns"], total)} for r in by.iter_rows(named=True)]
    if causes.height and not causes["late_ranks_visible"].all():
        missing.append(SKEW_HIDDEN)


def _contention(s: dict, res: Results, missing: list[str]) -> None:
    """What overlap costs GEMMs (gemm_contention's job row) and the T3 headroom of serialised pairs."""
    if not s["comm_ns"]:
        return
    cont = _query(res, CONTENTION, missing)
    if cont is not None:
        job = cont.filter(pl.col("scope") == "job")
        r = job.row(0, named=True) if job.height else None
        if r is not None and r["status"] == "measured":
            s["gemm_contention"] = {"slowdown_pct": r["slowdown_pct"], "lost_ns": _int(r["lost_ns"]),
                                    "measured_groups": _int(r["measured_groups"]),
                                    "mixed_groups": _int(r["mixed_groups"])}
        elif r is not None and r["status"] == "mixed_shapes":
            not_available(s, "gemm_contention", f"the {_int(r['mixed_groups'])} GEMM group(s) with enough samples "
                                                "mix durations of different work (mixed_shapes); record shapes "
                                                "(record_shapes=True) to group GEMMs by problem size")
        else:
            not_available(s, "gemm_contention", "no GEMM shape has enough kernels both alone and under "
                                                "communication in the same steps")
    pairs = _query(res, PAIRS, missing)
    if pairs is not None:
        known = pairs["headroom_ns"].drop_nulls()
        s["serialised_pairs"] = {"pairs": pairs.height,
                                 "headroom_ns": _int(known.sum()) if pairs.height and known.len() else None}
        if pairs.height and not known.len():
            not_available(s, "serialised_pairs.headroom_ns", "no GEMM slowdown under communication could be measured")


# the gemm_overview parameters among volume_check's (--model, --layout); the model's dtype is model_dtype there
_GEMM_PARAMS = ("params", "layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "tied", "gated", "seq",
                "micro_batch", "micro_batches", "tp", "pp", "cp")


def _gemm_args(params: dict) -> dict:
    """gemm_overview's parameters among volume_check's."""
    args = {k: v for k, v in params.items() if k in _GEMM_PARAMS}
    if params.get("dtype") is not None:
        args["model_dtype"] = params["dtype"]
    return args


def _gemm(s: dict, res: Results, missing: list[str]) -> None:
    """GEMM share of GPU time, time-weighted GEMM efficiency and MFU (gemm_overview)."""
    if not s["ranks"]:
        return
    ov = _query(res, GEMM, missing)
    if ov is None or not ov.height:
        return
    r = ov.row(0, named=True)
    s["gemm_time_pct"], s["gemm_efficiency_pct"], s["mfu_pct"] = \
        r["gemm_time_pct"], r["gemm_efficiency_pct"], r["mfu_pct"]
    if r["gemm_time_pct"] is None:
        not_available(s, "gemm_time_pct", "no GPU-busy time")
    if r["gemm_efficiency_pct"] is None:
        not_available(s, "gemm_efficiency_pct", r["efficiency_reason"] or "no GEMM op has FLOPs and a peak")
    if r["mfu_pct"] is None:
        not_available(s, "mfu_pct", r["mfu_reason"] or "unknown")


def _volume(s: dict, res: Results, missing: list[str], params: dict) -> None:
    """The parallel layout (parallel_degrees) and, with a model, expected against measured volume (volume_check)."""
    if not s["ranks"]:
        return  # no traces: nothing to infer a layout from
    degrees = _query(res, DEGREES, missing)
    if degrees is not None:
        s["parallel_layout"] = [{k: r[k] for k in COLUMNS[DEGREES]} for r in degrees.iter_rows(named=True)]
    if not any(k in params for k in ("layers", "hidden", "params")):
        if s["ranks"]:
            not_available(s, "volume_check", "no model given: --model layers=…,hidden=…,seq=…,micro_batch=…,"
                                             "vocab=…,dtype=bf16 or a config.json")
        return
    vol = _query(res, VOLUME, missing)
    if vol is not None:
        s["volume_check"] = [{k: r[k] for k in COLUMNS[VOLUME]} for r in vol.iter_rows(named=True)]


def _notes(s: dict, res: Results, missing: list[str]) -> None:
    """What was missing: the diagnostics' warnings, one line per code (per-rank notes say on how many ranks)."""
    diag = _query(res, DIAGNOSTICS, missing)
    if diag is None:
        return
    warn = diag.filter(pl.col("severity") == "warning")
    for code in dict.fromkeys(warn["code"].to_list()):
        rows = warn.filter(pl.col("code") == code)
        whole = rows.filter(pl.col("rank").is_null())
        if whole.height:  # a statement about a file or the job says it all; its per-rank details would repeat it
            lines = whole["message"].to_list()
        else:
            ranks = rows["rank"].to_list()
            first = rows.sort("rank").row(0, named=True)
            lines = [f"rank {first['rank']}: {first['message']}" if len(set(ranks)) == 1 else
                     f"on {len(set(ranks))} ranks (e.g. rank {first['rank']}: {first['message']})"]
        missing.extend(line for line in lines if line not in missing)


def _name_unavailable(s: dict, res: Results) -> None:
    """Say why each metric that is null could not be computed (from run_overview and diagnostics)."""
    no_comm = gap(res, "comm")
    if s["comm_share_pct"] is None:
        not_available(s, "comm_share_pct", no_comm or "no GPU-busy time")
    if s["overlap_pct"] is None:
        not_available(s, "overlap_pct", no_comm or "communication time is unknown")
    if s["exposed_by_cause"] is None:
        not_available(s, "exposed_by_cause", no_comm or "communication time is unknown")
    if s["max_skew_ms"] is None:
        why = gap(res, "two_ranks") or no_comm or "no collective was matched on two or more ranks"
        not_available(s, "max_skew_ms", why)
    w = s.get("worst_collective")
    if w is None or w.get("busbw_gbps") is None:
        why = no_comm or gap(res, "sizes") or (
            f"its bus bandwidth is above the physical peak of {w['peak_busbw_gbps']:.1f} GB/s, so a size, group "
            "or clock is wrong" if w and w.get("bandwidth_check") == "above_peak" else
            "the group size of the worst collective is unknown")
        not_available(s, "worst_collective.busbw_gbps", why)


# ---------------------------------------------------------------------------------------------------------------
# thresholds

THRESHOLDS = {
    # option name: (summary key, 'max' | 'min', readable name)
    "max_exposed_comm_pct": ("exposed_comm_pct", "max", "exposed communication (% of GPU-busy time)"),
    "min_overlap_pct": ("overlap_pct", "min", "communication overlapped by compute (%)"),
    "max_small_p2p_pct": ("p2p.small_msg_share_pct", "max", "small-message share of p2p operations (%)"),
    "max_latency_bound_pct": ("latency_bound_pct", "max", "latency-bound share of the transfer time of 'ok' α-β "
                                                          "fits (%)"),
    "max_skew_ms": ("max_skew_ms", "max", "largest collective arrival skew (ms)"),
}


def _get(s: dict, dotted: str):
    cur: Any = s
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def check_thresholds(s: dict, **limits: float | None) -> dict:
    """Compare the summary with limits (``max_exposed_comm_pct=20``, ...); fills ``thresholds`` and ``ok``.

    A metric that could not be computed is not evaluated: ``ok: null`` there, and ``s["ok"]`` is null unless another
    threshold is violated (never true: an unevaluated gate has not passed).
    """
    results = []
    for opt, limit in limits.items():
        if limit is None:
            continue
        key, kind, what = THRESHOLDS[opt]
        value = _get(s, key)
        ok = None if value is None else (value <= limit if kind == "max" else value >= limit)
        results.append({"name": opt, "metric": key, "limit": limit, "value": value, "ok": ok, "what": what})
    s["thresholds"] = results
    oks = [r["ok"] for r in results]
    s["ok"] = False if False in oks else (None if None in oks else True)
    return s


# ---------------------------------------------------------------------------------------------------------------
# for people


def _busbw_text(w: dict) -> str:
    """The worst collective's bus bandwidth as the summary prints it, with its basis and share of the peak."""
    if w.get("bandwidth_check") == "above_peak":
        return f", bus bandwidth not shown (above the {w['peak_busbw_gbps']:.1f} GB/s physical peak)"
    if not isinstance(w.get("busbw_gbps"), (int, float)):
        return ""
    peak = (f", {w['busbw_pct_of_peak']:.1f}% of the {w['peak_busbw_gbps']:.0f} GB/s peak"
            if isinstance(w.get("busbw_pct_of_peak"), (int, float)) else "")
    # the busbw factor rests on the group size: an assumed one is said beside the number
    assumed = (f"; assumes a group of {w['group_size']} ranks, the world size: the trace records none"
               if w.get("group_size_assumed") else "")
    if w.get("bandwidth_basis") == "incl_wait":
        return f", bus bandwidth >= {w['busbw_gbps']:.2f} GB/s (includes waiting, a lower bound{peak}{assumed})"
    part = (f"; {w['matched_ops']} of {w['count']} operations matched"
            if isinstance(w.get("matched_ops"), int) and w.get("count") and w["matched_ops"] < w["count"] else "")
    return f", bus bandwidth {w['busbw_gbps']:.2f} GB/s (transfer time, waiting excluded{peak}{part}{assumed})"


# the widest line of the text summary where no terminal says otherwise (summary --width, or the terminal's)
TEXT_WIDTH = 100


def wrap_lines(lines: list[str], width: int | None = TEXT_WIDTH) -> str:
    """Lines of text wrapped to ``width`` at spaces (a number or name is never split; a word longer than the
    width stays whole), continuation lines indented by two spaces; ``width=None``: as they are."""
    import textwrap

    if width is None:
        return "\n".join(lines)
    out: list[str] = []
    for line in lines:  # a number and its unit stay on one line: joined by a no-break space while wrapping
        glued = _NUMBER_UNIT.sub("\\1\u00a0\\2", line)
        out += [w.replace("\u00a0", " ") for w in textwrap.wrap(glued, width, subsequent_indent="  ",
                                                                  break_long_words=False, break_on_hyphens=False)
                or [""]]
    return "\n".join(out)


_NUMBER_UNIT = re.compile(r"(\d[\d.,]*) (ns|µs|ms|s|GB/s|B|KiB|MiB|GiB|TiB|ops?|ranks?|rank\(s\)|file\(s\)|"
                          r"group\(s\)|longer|shorter|lost)(?=[\s,;.)]|$)")


def format_summary(s: dict, width: int | None = None) -> str:
    """The summary as a few lines of text, wrapped to ``width`` (:func:`wrap_lines`; the CLI passes the terminal's,
    at most :data:`TEXT_WIDTH`); ``None``: one line per item."""
    return wrap_lines(_summary_lines(s), width)


def _summary_lines(s: dict) -> list[str]:
    if not s["files"]:
        lines = [f"job: {NO_TRACES}"] + [f"missing: {m}" for m in s["missing"]]
        lines += [f"threshold {t['name'].replace('_', '-')} {t['limit']:g}: not evaluated (no traces)"
                  for t in s["thresholds"]]
        return lines
    lines = [f"job: {s['ranks']} rank(s) from {s['files']} file(s) ({', '.join(s['sources']) or 'none'})"]
    lines += _communication_lines(s)
    lines += _latency_lines(s)
    if s.get("exposed_by_cause"):
        caveat = " (single-rank job: waiting for other ranks is not seen as arrival skew)" \
            if SKEW_HIDDEN in s["missing"] else ""
        lines.append("exposed communication by cause: " + ", ".join(
            f"{c['cause'].replace('_', ' ')} {pct(c['share_pct'], 1)}" for c in s["exposed_by_cause"]) + caveat)
    if s.get("gemm_contention"):
        c = s["gemm_contention"]
        mixed = f"; {c['mixed_groups']} mixed group(s) left out" if c.get("mixed_groups") else ""
        v = c["slowdown_pct"]
        how = f"{pct(v, 1)} longer" if v >= 0 else f"{pct(-v, 1)} shorter"
        lost = f"{duration(c['lost_ns'])} lost" if (c["lost_ns"] or 0) > 0 else "no net time lost"
        lines.append(f"GEMM contention: median {how} beside communication (time-weighted over "
                     f"{c['measured_groups']} measured group(s){mixed}), {lost}")
    if s.get("gemm_time_pct") is not None:
        eff = (f", {pct(s['gemm_efficiency_pct'], 1)} of peak (time-weighted)"
               if s.get("gemm_efficiency_pct") is not None else ", efficiency not available (see missing)")
        mfu = f"; MFU {pct(s['mfu_pct'], 1)}" if s.get("mfu_pct") is not None else ""
        lines.append(f"GEMMs: {pct(s['gemm_time_pct'], 1)} of GPU-busy time{eff}{mfu}")
    if s.get("serialised_pairs"):
        sp = s["serialised_pairs"]
        lines.append(f"serialised GEMM → collective pairs: {sp['pairs']}, T3 headroom {duration(sp['headroom_ns'])}")
    if s.get("stragglers"):
        parts = [f"rank {r['rank']}" + (f" (last in {r['times_last']} of {r['collectives']}, p = {r['p_value']:.2g})"
                                        if r.get("p_value") is not None else "") for r in s["stragglers"]]
        skew = f"; max skew {s['max_skew_ms']:.3f} ms" if s.get("max_skew_ms") is not None else ""
        lines.append("stragglers: " + ", ".join(parts) + skew)
    elif s.get("max_skew_ms") is None:
        lines.append("stragglers: not available (see missing: max_skew_ms)")
    else:
        lines.append(f"stragglers: no consistent straggler (max skew {s['max_skew_ms']:.3f} ms)")
    lines += _volume_lines(s)
    for m in s["missing"]:
        lines.append(f"missing: {m}")
    for t in s["thresholds"]:
        status = {True: "ok", False: "VIOLATED", None: "not evaluated (metric not available)"}[t["ok"]]
        val = "n/a" if t["value"] is None else f"{t['value']:g}"
        lines.append(f"threshold {t['name'].replace('_', '-')} {t['limit']:g}: {status} (value {val})")
    return lines


NO_COMM = "no communication kernels"


def _no_comm(s: dict) -> bool:
    """GPU work was measured and none of it is communication (not: nothing measured)."""
    return s.get("comm_ns") == 0 and bool(s.get("gpu_busy_ns"))


def _communication_lines(s: dict) -> list[str]:
    """Communication share, overlap, exposed communication and the worst collective; one reason where the job
    has no communication kernels, never "0.00 ns of 1.93 s"."""
    if _no_comm(s):
        return [f"communication: {NO_COMM} ({duration(s['gpu_busy_ns'])} GPU-busy time, summed over ranks)",
                f"overlap with compute: n/a ({NO_COMM})", f"exposed communication: none ({NO_COMM})",
                f"worst collective: n/a ({NO_COMM})"]
    worst = (f"; worst rank {s['worst_rank']}: {pct(s['worst_rank_exposed_comm_pct'], 1)}"
             if s.get("worst_rank") is not None else "")
    lines = [f"communication: {pct(s['comm_share_pct'], 1)} of GPU-busy time ({duration(s['comm_ns'])} of "
             f"{duration(s['gpu_busy_ns'])}, summed over ranks)",
             f"overlap with compute: {pct(s['overlap_pct'], 1)} of communication time",
             f"exposed communication: {duration(s['exposed_comm_ns'])} = {pct(s['exposed_comm_pct'], 1)} "
             f"of GPU-busy time{worst}"]
    w = s.get("worst_collective")
    if w:
        sizes = size(w.get("msg_bytes")) + (f"–{size(w['msg_bytes_hi'])}" if w.get("msg_bytes_hi") else "")
        ops = w.get("count")
        lines.append(f"worst collective: {w['collective']} {sizes}, {ops if ops is not None else '?'} "
                     f"op{'s' if ops != 1 else ''} = {duration(w['total_ns'])}{_busbw_text(w)}")
    else:
        lines.append("worst collective: n/a" + _see_missing(s, "worst_collective"))
    return lines


def _see_missing(s: dict, key: str) -> str:
    """' (see missing: key)' when ``missing`` has a line for ``key``, else '' (the reason is said there)."""
    return f" (see missing: {key})" if any(m.startswith(key + ":") for m in s["missing"]) else ""


def _latency_lines(s: dict) -> list[str]:
    """The point-to-point and the latency-bound lines ("not evaluated" where the share is null)."""
    lines = []
    p = s.get("p2p")
    if p:
        alpha = "n/a" if p.get("alpha_us") is None else f"{p['alpha_us']:.1f} µs"
        beta = "" if p.get("beta_gbps") is None else f", β {p['beta_gbps']:.1f} GB/s"
        share = (f"{pct(p['small_msg_share_pct'], 1)} of p2p time in messages <= {size(p.get('small_msg_bytes'))}"
                 if p.get("small_msg_share_pct") is not None else "small-message share not evaluated")
        fit = f" (fit: {p['fit_quality']})" if p.get("fit_quality") else ""
        lines.append(f"point-to-point: {share}; latency α {alpha}{beta}{fit}")
    elif _see_missing(s, "p2p"):
        lines.append("point-to-point: not available" + _see_missing(s, "p2p"))
    elif _no_comm(s):
        lines.append(f"point-to-point: n/a ({NO_COMM})")
    elif s.get("ranks") == 1:
        lines.append("point-to-point: n/a (a single-rank job: send/recv cannot be matched across ranks)")
    else:  # latency_model has no p2p row
        lines.append("point-to-point: n/a (no send/recv matched across ranks)")
    if s.get("latency_bound_pct") is not None:
        save = s.get("coalescing_saving_ms")
        lines.append(f"latency-bound: {pct(s['latency_bound_pct'], 1)} of transfer time below n½ of the 'ok' α-β fits "
                     f"(covering {pct(s.get('latency_bound_covered_comm_pct'), 1)} of communication time)"
                     + ("" if save is None else f"; coalescing would save {save:.3f} ms"))
    elif s.get("ranks"):
        lines.append("latency-bound: not evaluated (see missing: latency_bound_pct)")
    return lines


def _volume_lines(s: dict) -> list[str]:
    """One line for the parallel layout (none when no dimension is known), one for the volume check."""
    out = []
    dims = s.get("parallel_layout")
    if dims:
        parts = [f"{d['kind']} {d['degree']} ({d['confidence']})" for d in dims
                 if d["degree"] is not None and (d["degree"] != 1 or d["groups"])]
        unknown = [d["kind"] for d in dims if d["degree"] is None]
        undecided = next((d["evidence"].split("(undecided: ", 1)[1].split(")", 1)[0] for d in dims
                          if d["degree"] is None and "(undecided: " in (d["evidence"] or "")), None)
        if undecided:  # groups whose kind the trace leaves open: say so rather than guess
            parts.append(f"undecided groups ({undecided}: give --layout)")
        if parts and unknown:
            parts.append("unknown: " + ", ".join(unknown))
        # without communication, "no dimension" rests on absence alone: nothing is known, so no line
        if parts or not (unknown or _no_comm(s)):
            out.append("parallel layout: " + (", ".join(parts) if parts else "no parallel dimension found"))
    vol = s.get("volume_check")
    if vol is None:
        out.append("volume check: not available (see missing: volume_check)" if s.get("ranks") else
                   "volume check: n/a")
        return out
    counts: dict[str, int] = {}
    for r in vol:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    worst = sorted((r for r in vol if r["verdict"] in ("over", "under") and r["ratio"] is not None),
                   key=lambda r: -abs(r["ratio"] - 1))
    text = ", ".join(f"{counts.get(v, 0)} {v.replace('_', ' ')}"
                     for v in ("match", "over", "under", "assumed", "unexpected", "not_evaluated")
                     if v != "assumed" or counts.get(v))
    if worst:
        w = worst[0]
        text += f"; furthest: {w['kind']} {w['collective']} {w['ratio']:.2f}× expected"
    out.append(f"volume check (rows per step, kind and collective): {text}")
    return out
