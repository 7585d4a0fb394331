"""Findings in plain words, computed from the catalog query frames the report draws.

Each finding is one sentence with its numbers (formats from :mod:`nsys2comm.units`) and points at the chart that
shows it (``anchor``). Functions are pure: frames in, findings out, reading only the columns they declare with
``@consumes``. A finding whose data is missing is not produced (the section says why), and neither is one about
something that takes less than :data:`MIN_SHARE_PCT` of the time it is measured against: advice about ~0 % is noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from ..units import NS_PER_UNIT, duration, gbps, is_num, pct, size
from .data import consumes

MIN_SHARE_PCT = 1.0  # a finding about less than this share of the time is not worth a line
WARN_PCT = 30.0  # exposed / latency-bound shares from which a finding is a warning


@dataclass
class Finding:
    text: str
    anchor: str  # id of the chart/section that shows it
    level: str = "info"  # 'info' | 'warning' (worth acting on)


def _sum(df: pl.DataFrame, col: str) -> float:
    v = df[col].sum()
    return float(v) if is_num(v) else 0.0


@consumes(overlap_by_rank=("comm_ns", "exposed_comm_ns", "gemm_overlapped_ns"),
          overlap_worst_rank=("rank", "exposed_busy_pct", "ranks_compared"))
def overlap_findings(df: pl.DataFrame, worst: pl.DataFrame | None = None) -> list[Finding]:
    """Exposed share of communication; the worst rank (overlap_worst_rank, the summary's rule: exposed
    communication as a share of the rank's GPU-busy time) when more than one rank was compared; GEMM overlap when
    it is not negligible."""
    total = _sum(df, "comm_ns")
    if total <= 0:
        return []
    exposed = _sum(df, "exposed_comm_ns")
    share = 100 * exposed / total
    text = (f"{pct(share)} of communication time ({duration(exposed)} of {duration(total)}, all ranks) is exposed: "
            "no computation runs beside it.")
    w = worst.row(0, named=True) if worst is not None and worst.height else None
    if w is not None and w["ranks_compared"] > 1 and is_num(w["exposed_busy_pct"]):
        text += (f" Worst is rank {w['rank']}: exposed communication is {pct(w['exposed_busy_pct'])} of its "
                 "GPU-busy time.")
    out = [Finding(text, "sec-overlap", "warning" if share >= WARN_PCT else "info")]
    gemm = _sum(df, "gemm_overlapped_ns")
    if 100 * gemm / total >= MIN_SHARE_PCT:
        out.append(Finding(f"{pct(100 * gemm / total)} of communication time overlaps GEMM kernels "
                           f"({duration(gemm)}); GEMMs share SMs and memory bandwidth with NCCL, so both may run "
                           "slower than alone.", "sec-overlap"))
    return out


@consumes(time_breakdown_by_rank=("rank", "category", "span_pct"))
def breakdown_findings(df: pl.DataFrame) -> list[Finding]:
    """Mean idle share of the span, the idlest rank, and the mean exposed-communication share."""
    idle = df.filter(pl.col("category") == "idle").sort(["span_pct", "rank"], descending=[True, False],
                                                        nulls_last=True)
    mean = idle["span_pct"].mean() if idle.height else None
    if not is_num(mean):
        return []
    text = f"GPUs are idle {pct(mean)} of their profiled span on average"
    if idle.height > 1 and is_num(idle["span_pct"][0]):
        text += f"; rank {idle['rank'][0]} idles most ({pct(idle['span_pct'][0])})"
    exp = df.filter(pl.col("category") == "communication")["span_pct"].mean()
    if is_num(exp):
        text += f". Exposed communication (nothing else running) takes {pct(exp)} of the span on average"
    return [Finding(text + ".", "sec-breakdown", "warning" if mean >= 20 else "info")]


@consumes(msg_size_histogram=("collective", "total_ns"))
def histogram_findings(df: pl.DataFrame) -> list[Finding]:
    """The collective with the most communication kernel time."""
    per = df.group_by("collective").agg(pl.col("total_ns").sum().alias("t")).sort(["t", "collective"],
                                                                                  descending=[True, False])
    total = _sum(per, "t")
    if total <= 0:
        return []
    top = per.row(0, named=True)
    return [Finding(f"{top['collective']} takes {pct(100 * top['t'] / total)} of communication kernel time "
                    f"({duration(top['t'])} of {duration(total)}).", "sec-msgsize")]


@consumes(collective_bandwidth=("collective", "bucket_lo_bytes", "headline_busbw_gbps", "group_size",
                                "group_size_assumed", "bandwidth_basis", "busbw_pct_of_peak", "peak_busbw_gbps",
                                "bandwidth_check"))
def bandwidth_findings(df: pl.DataFrame) -> list[Finding]:
    """Highest bus bandwidth per collective (four at most; collective_bandwidth's headline figure), with its share of
    the physical peak, flagged when it includes waiting or the group size is assumed; figures above the peak are
    named as impossible, never shown as a bandwidth."""
    out = []
    sized = df.filter(pl.col("headline_busbw_gbps").is_not_null())
    for (coll,), g in sized.group_by("collective", maintain_order=True):
        best = g.sort(["headline_busbw_gbps", "bucket_lo_bytes"], descending=[True, False]).row(0, named=True)
        smaller = g.filter(pl.col("bucket_lo_bytes") < best["bucket_lo_bytes"]).height
        wait = best["bandwidth_basis"] == "incl_wait"
        peak = (f", {pct(best['busbw_pct_of_peak'])} of the {gbps(best['peak_busbw_gbps'])} physical peak"
                if best["busbw_pct_of_peak"] is not None else "")
        text = (f"{coll} peaks at {'at least ' if wait else ''}{gbps(best['headline_busbw_gbps'])} bus bandwidth "
                f"(messages of {size(best['bucket_lo_bytes'])}+{peak})"
                + ("; smaller messages get less, see the curve." if smaller else "."))
        if wait:
            text += (" No instance was matched on its whole group, so this figure includes waiting for late ranks: "
                     "a lower bound.")
        if best["group_size_assumed"]:
            text += (f" This assumes a group of {best['group_size']} ranks (the world size): the trace records no "
                     "process group.")
        out.append(Finding(text, "sec-busbw"))
    impossible = df.filter(pl.col("bandwidth_check") == "above_peak")
    if impossible.height:
        r = impossible.row(0, named=True)
        out.append(Finding(f"{impossible.height} size bucket(s) measure a bus bandwidth above the physical peak "
                           f"(e.g. {r['collective']} at {size(r['bucket_lo_bytes'])}+, peak "
                           f"{gbps(r['peak_busbw_gbps'])}): a message size, group size or clock is wrong there, "
                           "so their bandwidth is not shown.", "sec-busbw"))
    return out[:5]


@consumes(latency_model=("collective", "group_size", "transfer_source", "sized_instances", "alpha_us", "beta_gbps",
                         "beta_busbw_gbps", "peak_busbw_gbps", "n_half_bytes", "fit_quality", "total_transfer_ns",
                         "latency_floor_ns", "duration_incl_wait_p50_ns", "instances"),
          latency_bound_total=("latency_bound_pct", "below_threshold_ops", "fitted_instances", "fitted_transfer_ns",
                               "coalescing_saving_ns", "covered_comm_pct"))
def latency_findings(model: pl.DataFrame, total: pl.DataFrame) -> list[Finding]:
    """The job's latency-bound share ('ok' α-β fits only, latency_bound_total), the α, β, n½ of the three shown fits
    with the most transfer time ('ok' first; a rejected fit says it is not used), else what the data do allow: the
    latency floor of matched transfers, or the kernel duration with waiting included."""
    out = _small_message_finding(total)
    shown = (model.filter(pl.col("alpha_us").is_not_null())
             .sort([pl.col("fit_quality") != "ok", pl.col("total_transfer_ns"), pl.col("collective")],
                   descending=[False, True, False]))
    for m in shown.head(3).iter_rows(named=True):
        alpha_ns = m["alpha_us"] * NS_PER_UNIT["us"]
        out.append(Finding(f"{m['collective']} (group of {m['group_size']}): α ≈ {duration(alpha_ns)}, "
                           f"β ≈ {gbps(m['beta_gbps'])}, n½ ≈ {size(m['n_half_bytes'])} (fit: {m['fit_quality']}, "
                           f"{m['sized_instances']:,} sized instances{_fit_not_used(m)}).", "sec-latency"))
    if not shown.height:
        m = model.sort(["instances", "collective"], descending=[True, False]).row(0, named=True)
        if m["transfer_source"] == "matched" and is_num(m["latency_floor_ns"]):
            out.append(Finding(f"No α-β fit ({m['fit_quality']}); the latency floor of {m['collective']} is "
                               f"{duration(m['latency_floor_ns'])} (5th percentile transfer time, waiting excluded).",
                               "sec-latency"))
        elif is_num(m["duration_incl_wait_p50_ns"]):
            out.append(Finding(f"No α-β fit: no {m['collective']} was matched on its complete group "
                               f"({m['transfer_source'].replace('_', ' ')}), so its median kernel duration of "
                               f"{duration(m['duration_incl_wait_p50_ns'])} includes waiting for peers and is no "
                               "transfer time.", "sec-latency"))
    return out


def _fit_not_used(m: dict) -> str:
    """Why a shown fit is not used ('' for 'ok'); an implausible β names the peak it passes."""
    if m["fit_quality"] == "ok":
        return ""
    why = f"; not used: fit {m['fit_quality'].replace('_', ' ')}"
    bw, peak = m["beta_busbw_gbps"], m["peak_busbw_gbps"]
    if is_num(bw) and is_num(peak) and bw > peak:
        why += f", bus bandwidth {gbps(bw)} above the {gbps(peak)} peak"
    return why


def _small_message_finding(total: pl.DataFrame) -> list[Finding]:
    """latency_bound_total as one sentence, with the share of communication time it covers. A warning only when the
    share is large and the 'ok' fits cover at least half of the communication time."""
    t = total.row(0, named=True)
    share, fitted = t["latency_bound_pct"], t["fitted_instances"]
    if not is_num(share) or share < MIN_SHARE_PCT or not fitted:
        return []
    small_ops = t["below_threshold_ops"] or 0
    text = (f"{pct(100 * small_ops / fitted)} of sized communication operations with an 'ok' α-β fit "
            f"({small_ops:,.0f} of {fitted:,.0f}) are latency-bound, smaller than n½ = α·β of their operation's fit; "
            f"they take {pct(share)} of those operations' transfer time (waiting excluded). The fits cover "
            f"{pct(t['covered_comm_pct'])} of communication kernel time.")
    saving = t["coalescing_saving_ns"]
    if is_num(saving) and t["fitted_transfer_ns"] and 100 * saving / t["fitted_transfer_ns"] >= MIN_SHARE_PCT:
        text += f" Sending the same bytes in operations of at least n½ would save about {duration(saving)}."
    warn = share >= WARN_PCT and is_num(t["covered_comm_pct"]) and t["covered_comm_pct"] >= 50
    return [Finding(text, "sec-latency", "warning" if warn else "info")]


@consumes(rank_wait=("rank", "collectives", "times_arrived_last", "arrived_last_pct", "chance_last_pct",
                     "arrived_last_p_value", "is_straggler"))
def straggler_findings(df: pl.DataFrame) -> list[Finding]:
    """Ranks that arrive last significantly more often than chance: rank_wait.is_straggler, the one rule the summary
    and diff use too; otherwise "no consistent straggler"."""
    if _sum(df, "times_arrived_last") <= 0:
        return []
    s = df.filter(pl.col("is_straggler")).sort(["arrived_last_p_value", "rank"])
    if not s.height:
        return [Finding("No consistent straggler: no rank arrives last significantly more often than chance "
                        "(binomial test, p < 0.01 after Bonferroni over ranks).", "sec-skew", "info")]
    r = s.row(0, named=True)
    text = (f"Rank {r['rank']} arrives last in {r['times_arrived_last']:,} of {r['collectives']:,} collective "
            f"instances ({pct(r['arrived_last_pct'])}, chance {pct(r['chance_last_pct'])}; p = "
            f"{r['arrived_last_p_value']:.2g}): a consistent straggler.")
    if s.height > 1:
        text += " Also late more often than chance: rank " + ", ".join(str(x) for x in s["rank"][1:4].to_list()) + "."
    return [Finding(text, "sec-skew", "warning")]


@consumes(collective_skew=("start_skew_ns",))
def start_skew_findings(df: pl.DataFrame) -> list[Finding]:
    """Median and largest start skew, when ranks do not start together."""
    med, mx = df["start_skew_ns"].median(), df["start_skew_ns"].max()
    if not (is_num(med) and is_num(mx)) or mx <= 0:
        return []
    return [Finding(f"Ranks start a collective {duration(med)} apart (median start skew; max {duration(mx)}); "
                    "the early ranks wait that long inside NCCL.", "sec-skew")]


@consumes(exposed_comm_causes=("collective", "cause", "exposed_ns", "late_rank"))
def exposed_cause_findings(df: pl.DataFrame) -> list[Finding]:
    """Per collective with the most exposed time (up to 3): its causes, biggest first, each at least MIN_SHARE_PCT."""
    by = df.group_by("collective", "cause").agg(pl.col("exposed_ns").sum())
    per_coll = by.group_by("collective").agg(pl.col("exposed_ns").sum().alias("total")).sort(
        ["total", "collective"], descending=[True, False])
    everything = _sum(per_coll, "total")
    out = []
    for coll, total in per_coll.head(3).iter_rows():
        if total <= 0 or 100 * total / everything < MIN_SHARE_PCT:
            continue
        rows = by.filter(pl.col("collective") == coll).sort(["exposed_ns", "cause"], descending=[True, False])
        parts = []
        for cause, ns in rows.select("cause", "exposed_ns").iter_rows():
            share = 100 * ns / total
            if share < MIN_SHARE_PCT or len(parts) == 3:
                break
            what = cause.replace("_", " ")
            if cause == "arrival_skew":
                late = (df.filter((pl.col("collective") == coll) & (pl.col("cause") == cause)
                                  & pl.col("late_rank").is_not_null())
                        .group_by("late_rank").agg(pl.col("exposed_ns").sum())
                        .sort(["exposed_ns", "late_rank"], descending=[True, False]))
                if late.height:
                    what += f" (rank {late['late_rank'][0]} late)"
            parts.append(f"{pct(share)} is {what}" if parts else f"{pct(share)} of exposed {coll} time "
                         f"({duration(total)}) is {what}")
        if parts:
            top = rows["cause"][0]
            out.append(Finding(", ".join(parts) + ".", "sec-causes",
                               "warning" if 100 * total / everything >= WARN_PCT and top != "nothing_to_overlap"
                               else "info"))
    return out


@consumes(volume_check=("step_ord", "kind", "collective", "scheme", "ratio", "measured_bytes", "verdict", "reason"))
def volume_findings(df: pl.DataFrame) -> list[Finding]:
    """Expected against measured volume: the (kind, collective) furthest from the model, unexpected traffic of at
    least 1 MiB per rank per step, or that everything evaluated matched."""
    out = []
    off = (df.filter(pl.col("verdict").is_in(["over", "under"]) & pl.col("ratio").is_not_null() & (pl.col("ratio") > 0))
           .with_columns((pl.col("ratio").log().abs()).alias("_off"))
           .sort(["_off", "step_ord", "kind", "collective"], descending=[True, False, False, False]))
    if off.height:
        r = off.row(0, named=True)
        pairs = off.select("kind", "collective").unique().height
        more = f" ({pairs} kind/collective pairs are off the model)" if pairs > 1 else ""
        out.append(Finding(f"Communication volume is off the model in step {r['step_ord']}: {r['reason']}{more}.",
                           "sec-volume", "warning"))
    unexpected = (df.filter((pl.col("verdict") == "unexpected") & (pl.col("measured_bytes") >= 1 << 20))
                  .sort(["measured_bytes", "kind", "collective"], descending=[True, False, False]))
    if unexpected.height:
        out.append(Finding(unexpected["reason"][0] + ".", "sec-volume"))
    evaluated = df.filter(pl.col("verdict").is_in(["match", "over", "under"]))
    if evaluated.height and not off.height:
        out.append(Finding(f"Measured communication volume matches the model (within the match band) for all "
                           f"{evaluated.height} evaluated step × kind × collective rows.", "sec-volume"))
    return out


@consumes(gemm_contention=("scope", "slowdown_pct", "lost_ns", "measured_groups", "mixed_groups", "status"))
def contention_findings(df: pl.DataFrame) -> list[Finding]:
    """GEMM contention from the job row only: its time-weighted median slowdown lies within the measured groups'
    range; groups of mixed durations are named as left out, never averaged in."""
    job = df.filter(pl.col("scope") == "job")
    if not job.height:
        return []
    r = job.row(0, named=True)
    mixed = r["mixed_groups"] or 0
    left_out = (f"; {mixed} group(s) whose durations mix different work were left out" if mixed else "")
    if r["status"] != "measured" or not is_num(r["slowdown_pct"]):
        if mixed:
            return [Finding(f"GEMM contention could not be measured: the {mixed} GEMM group(s) with enough samples "
                            "mix durations of different work; record shapes (record_shapes=True) to group GEMMs by "
                            "problem size.", "chart-contention")]
        return []
    v = r["slowdown_pct"]
    how = f"{pct(v)} longer" if v >= 0 else f"{pct(-v)} shorter"
    lost = f"; contention costs {duration(r['lost_ns'])} of GEMM time" if (r["lost_ns"] or 0) > 0 else ""
    return [Finding(f"GEMMs beside communication run a median {how} than alone (time-weighted over "
                    f"{r['measured_groups']} measured GEMM group(s){left_out}){lost}.", "chart-contention",
                    "warning" if v >= 10 else "info")]


LATE_CAUSE_WORDS = {  # primary_cause -> (the late rank's part, what its GPU was doing in the gap)
    "host": ("host_bound", "idle with nothing launched (waiting for its host to launch work)"),
    "queued": ("queued_idle", "idle although work was launched (queued behind another stream, an event or a copy)"),
    "gpu_compute": ("gpu_compute", "running computation"),
    "earlier_comm": ("earlier_comm", "busy in other communication"),
}
TOP_HOST_OPS = 3  # host ops named in a lateness finding


@consumes(late_arrival_causes=("collective", "late_rank", "lateness_ns", "late_segment_ns", "late_gpu_compute_ns",
                               "late_host_bound_ns", "late_queued_idle_ns", "late_earlier_comm_ns", "host_share_ns",
                               "gpu_compute_share_ns", "queued_share_ns", "earlier_comm_share_ns", "carried_ns",
                               "primary_cause"),
          late_rank_host_ops=("late_rank", "op_name", "self_ns"),
          rank_wait=("rank", "is_straggler"))
def lateness_findings(causes: pl.DataFrame, host_ops: pl.DataFrame | None = None,
                      wait: pl.DataFrame | None = None) -> list[Finding]:
    """The rank that arrives last most often (late_arrival_causes, lateness > 0): at how many of the instances, the
    median lateness, the most frequent primary cause and what its GPU did in those gaps (the cause's part as a share
    of its segments), the host ops with the most self time when the cause is the host (late_rank_host_ops). A
    straggler is named only where rank_wait.is_straggler says so."""
    late = causes.filter(pl.col("lateness_ns") > 0)
    if not late.height:
        return []
    per = (late.group_by("late_rank").agg(pl.len().alias("n"), pl.col("lateness_ns").sum().alias("t"))
           .sort(["n", "t", "late_rank"], descending=[True, True, False]))
    rank = per["late_rank"][0]
    mine = late.filter(pl.col("late_rank") == rank)
    colls = mine["collective"].unique().sort().to_list()
    coll = colls[0] if len(colls) == 1 else None
    total = causes.filter(pl.col("collective") == coll).height if coll else causes.height
    what = f"{coll} instances" if coll else "collective instances"
    text = (f"Rank {rank} arrives last at {mine.height} of {total} {what}, a median "
            f"{duration(mine['lateness_ns'].median())} after the earliest rank")
    causes_n = (mine.filter(pl.col("primary_cause").is_not_null()).group_by("primary_cause").agg(pl.len().alias("n"))
                .sort(["n", "primary_cause"], descending=[True, False]))
    top = causes_n["primary_cause"][0] if causes_n.height else None
    if top in LATE_CAUSE_WORDS:
        part, words = LATE_CAUSE_WORDS[top]
        seg = _sum(mine.filter(pl.col("primary_cause") == top), "late_segment_ns")
        spent = _sum(mine.filter(pl.col("primary_cause") == top), f"late_{part}_ns")
        n_top = causes_n["n"][0]
        where = "" if n_top == mine.height else f" (the primary cause at {n_top} of them)"
        text += f": its GPU is {words} {pct(100 * spent / seg)} of the gap since its previous collective{where}" \
            if seg > 0 else f": primary cause {top.replace('_', ' ')}{where}"
        share = 100 * _sum(mine, f"{top}_share_ns") / _sum(mine, "lateness_ns")
        if share >= 100:  # shares may be negative where the earliest rank spent longer in another part
            text += "; that accounts for all of its lateness"
        elif share > 0:
            text += f"; that accounts for {pct(share)} of its lateness"
    elif top == "carried":
        text += ": mostly lateness carried from its previous collective (its ranks left it at different times)"
    if top == "host" and host_ops is not None and host_ops.height:
        ops = (host_ops.filter(pl.col("late_rank") == rank).group_by("op_name").agg(pl.col("self_ns").sum())
               .sort(["self_ns", "op_name"], descending=[True, False]).head(TOP_HOST_OPS))
        if ops.height:
            text += "; top host ops by self time: " + ", ".join(
                f"{n} ({duration(t)})" for n, t in ops.select("op_name", "self_ns").iter_rows())
    straggler = wait is not None and wait.filter((pl.col("rank") == rank) & pl.col("is_straggler")).height > 0
    if straggler:
        text += f". Rank {rank} is a consistent straggler (rank_wait)"
    return [Finding(text + ".", "sec-lateness", "warning" if straggler or 2 * mine.height >= total else "info")]


@consumes(gemm_overview=("gemm_time_pct", "covered_pct", "gemm_efficiency_pct", "low_efficiency_time_pct",
                         "low_pct", "device_model", "main_math", "above_peak_ops", "mfu_pct"),
          gemm_shape_groups=("m", "n", "k", "batch", "dtype", "gemm_time_pct", "efficiency_pct", "rule_broken",
                             "rule_detail"))
def gemm_findings(overview: pl.DataFrame, groups: pl.DataFrame | None = None) -> list[Finding]:
    """The share of GEMM time below the low-efficiency line against the device's peak, the largest shape group
    with the rule it breaks, rates above the peak, and MFU when a model was given."""
    o = overview.row(0, named=True)
    out: list[Finding] = []
    if is_num(o["gemm_efficiency_pct"]) and is_num(o["gemm_time_pct"]) and o["gemm_time_pct"] >= MIN_SHARE_PCT:
        peak = f"the {o['device_model']}'s {o['main_math']} peak" if o["device_model"] else "the peak"
        text = (f"GEMMs take {pct(o['gemm_time_pct'])} of GPU-busy time at {pct(o['gemm_efficiency_pct'])} of their "
                f"peak (time-weighted over the {pct(o['covered_pct'])} of GEMM time with shapes); "
                f"{pct(o['low_efficiency_time_pct'])} of that time runs at < {o['low_pct']:g} % of {peak}")
        top = groups.row(0, named=True) if groups is not None and groups.height else None
        if top and top["rule_broken"] and top["rule_broken"] != "none" and top["rule_detail"]:
            text += (f"; the largest group (M={top['m']}, N={top['n']}, K={top['k']}"
                     + (f", batch {top['batch']}" if top["batch"] != 1 else "")
                     + f", {top['dtype'] or 'dtype unknown'}: {pct(top['gemm_time_pct'])} of GEMM time) breaks a "
                     f"shape rule: {top['rule_detail'].split('; ')[0]}")
        low = is_num(o["low_efficiency_time_pct"]) and o["low_efficiency_time_pct"] >= WARN_PCT
        out.append(Finding(text + ".", "sec-gemm", "warning" if low else "info"))
    if o["above_peak_ops"]:
        out.append(Finding(f"{o['above_peak_ops']} GEMM op(s) would run faster than the device's peak: a wrong shape, "
                           "device or clock; their rates are left out.", "sec-gemm", "warning"))
    if is_num(o["mfu_pct"]):
        out.append(Finding(f"Model FLOPs utilisation: {pct(o['mfu_pct'])} (gemm_overview.mfu_basis says what it "
                           "assumes).", "sec-gemm"))
    return out


# finding function, the catalog objects it takes (in order), the section it belongs to
FINDINGS: list[tuple[Callable[..., list[Finding]], tuple[str, ...], str]] = [
    (overlap_findings, ("overlap_by_rank", "overlap_worst_rank"), "sec-overlap"),
    (breakdown_findings, ("time_breakdown_by_rank",), "sec-breakdown"),
    (exposed_cause_findings, ("exposed_comm_causes",), "sec-causes"),
    (contention_findings, ("gemm_contention",), "sec-causes"),
    (latency_findings, ("latency_model", "latency_bound_total"), "sec-latency"),
    (histogram_findings, ("msg_size_histogram",), "sec-msgsize"),
    (bandwidth_findings, ("collective_bandwidth",), "sec-busbw"),
    (straggler_findings, ("rank_wait",), "sec-skew"),
    (start_skew_findings, ("collective_skew",), "sec-skew"),
    (lateness_findings, ("late_arrival_causes", "late_rank_host_ops", "rank_wait"), "sec-lateness"),
    (volume_findings, ("volume_check",), "sec-volume"),
    (gemm_findings, ("gemm_overview", "gemm_shape_groups"), "sec-gemm"),
]


# inputs a finding can do without (passed as None when missing)
OPTIONAL_INPUTS: dict[Callable, set[str]] = {overlap_findings: {"overlap_worst_rank"},
                                             lateness_findings: {"late_rank_host_ops", "rank_wait"},
                                             gemm_findings: {"gemm_shape_groups"}}


def all_findings(frames: dict[str, pl.DataFrame | None]) -> list[Finding]:
    """Every finding whose data is there. A finding that fails says so in the list instead of vanishing."""
    out: list[Finding] = []
    for fn, inputs, anchor in FINDINGS:
        args = [frames.get(name) for name in inputs]
        args = [a if a is not None and a.height else None for a in args]
        optional = OPTIONAL_INPUTS.get(fn, set())
        if any(a is None and name not in optional for name, a in zip(inputs, args, strict=True)):
            continue
        try:
            out.extend(fn(*args))
        except Exception as e:  # noqa: BLE001 - shown, not raised: the rest of the report still stands
            out.append(Finding(f"The {fn.__name__.removesuffix('_findings').replace('_', ' ')} finding could not be "
                               f"computed ({type(e).__name__}: {str(e)[:200]}).", anchor, "warning"))
    return out
