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
worst_collective           {collective, msg_bytes, msg_bytes_hi, group_size, count, total_ns, busbw_gbps, algbw_gbps}:
                           the collective and message-size bucket [msg_bytes, msg_bytes_hi) taking the most time
p2p                        {small_msg_share_pct, small_msg_bytes, threshold_rule, alpha_us, beta_gbps, n_half_bytes,
                           fit_quality, n_ops, small_ops}: matched send/recv (latency_model row 'p2p'): share of
                           p2p transfer time in messages below small_msg_bytes (n½ = α·β of the fit, or 64 KiB when
                           threshold_rule is 'fallback_64KiB'), and the fit transfer = α + bytes/β
latency_bound_pct          share of sized communication transfer time (waiting excluded) in operations below n½ of
                           their (collective, group size) model, % (latency_bound_total)
coalescing_saving_ms       transfer time saved if latency-bound operations were sent as operations of size n½
                           (α-β model), ms
latency_models             [{collective, group_size, instances, alpha_us, beta_gbps, n_half_bytes, fit_quality,
                           latency_bound_pct, coalescing_saving_ms}] one per (collective, group size), 'p2p' for
                           matched send/recv (latency_model)
max_skew_ms                largest start skew of one collective instance across its ranks, ms
stragglers                 [{rank, times_last, wait_ns}] up to 3 likeliest stragglers (rank_wait's TraceLens
                           order: least total wait first), only ranks that arrived last at least once
missing                    [str] what data was missing and what to do about it (ingest notes, absent queries);
                           a metric that cannot be computed is null and named here as "KEY: not available (why)";
                           a job without traces says "no traces"
thresholds                 [{name, metric, limit, value, ok, what}] filled by :func:`check_thresholds`; ok is
                           null when the metric is not available (the threshold was not evaluated)
ok                         false when a threshold is violated, null when none is but one was not evaluated,
                           true when every threshold was evaluated and held
=========================  ====================================================================================

Not available, never 0: skew needs a collective matched on at least two ranks, overlap needs communication,
bandwidth needs message sizes.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from . import __version__, catalog

SCHEMA_VERSION = 1

# TODO(analysis owner): the analysis objects below are being written in queries/; the column names this
# module looks for are the likely spellings (first match wins). Settle them here once the SQL lands.
OVERLAP = "overlap_by_rank"
BANDWIDTH = "collective_bandwidth"
LATENCY = "latency_model"
LATENCY_TOTAL = "latency_bound_total"
WAIT = "rank_wait"
SKEW = "collective_skew"
BREAKDOWN = "time_breakdown_by_rank"
DIAGNOSTICS = "diagnostics"

SUMMARY_KEYS = ["schema_version", "nsys2comm_version", "ranks", "files", "sources", "gpu_busy_ns", "comm_ns",
                "comm_share_pct", "overlap_pct", "exposed_comm_ns", "exposed_comm_pct", "worst_rank",
                "worst_rank_exposed_comm_pct", "worst_collective", "p2p", "latency_bound_pct",
                "coalescing_saving_ms", "latency_models", "max_skew_ms", "stragglers", "missing",
                "thresholds", "ok"]


def _query(con, name: str, missing: list[str], params: dict | None = None) -> pl.DataFrame | None:
    obj = catalog.find(name)
    if obj is None:
        missing.append(f"analysis '{name}' is not in this build")
        return None
    from .api import run_query

    try:
        return run_query(con, name, params or {})
    except Exception as e:  # noqa: BLE001 - a summary reports what it could not compute
        missing.append(f"analysis '{name}' failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return None


def _col(df: pl.DataFrame | None, *names: str) -> str | None:
    if df is None:
        return None
    return next((n for n in names if n in df.columns), None)


def _sum(df: pl.DataFrame, col: str | None) -> float | None:
    if col is None or df.is_empty():
        return None
    v = df.get_column(col).sum()
    return None if v is None else v


def _pct(num, den) -> float | None:
    if num is None or not den:
        return None
    return round(100.0 * num / den, 3)


def _share_pct(v) -> float | None:
    """A share given as a fraction (0..1) or a percentage, as a percentage."""
    if v is None:
        return None
    return round(100.0 * v, 3) if 0 <= v <= 1 else round(float(v), 3)


def _int(v) -> int | None:
    return None if v is None else int(round(v))


def not_available(s: dict, key: str, why: str) -> None:
    """Record that summary key ``key`` could not be computed: null value, named in ``missing``."""
    line = f"{key}: not available ({why})"
    if line not in s["missing"]:
        s["missing"].append(line)


NO_TRACES = "no traces"


def empty_summary(why: str) -> dict[str, Any]:
    """The summary of a job without traces (nothing ingested): every metric null, ``missing`` says why."""
    s: dict[str, Any] = {k: None for k in SUMMARY_KEYS}
    s.update(schema_version=SCHEMA_VERSION, nsys2comm_version=__version__, ranks=0, files=0, sources=[],
             stragglers=[], missing=[f"{NO_TRACES}: {why}"], thresholds=[], ok=True)
    return s


def build_summary(con) -> dict[str, Any]:
    """The summary dict of the job in ``con`` (an open job database)."""
    missing: list[str] = []
    s: dict[str, Any] = {k: None for k in SUMMARY_KEYS}
    s.update(schema_version=SCHEMA_VERSION, nsys2comm_version=__version__, stragglers=[], missing=missing,
             thresholds=[], ok=True)

    s["ranks"] = con.execute("SELECT count(*) FROM ranks").fetchall()[0][0]
    s["files"] = con.execute("SELECT count(*) FROM files").fetchall()[0][0]
    s["sources"] = [r[0] for r in con.execute("SELECT DISTINCT source FROM files ORDER BY source").fetchall()]

    # -- communication share, overlap, exposed communication ---------------------------------------------------
    ov = _query(con, OVERLAP, missing)
    if ov is not None and not ov.is_empty():
        busy_c = _col(ov, "gpu_busy_ns", "busy_ns", "gpu_time_ns", "kernel_busy_ns")
        comm_c = _col(ov, "comm_ns", "comm_busy_ns", "comm_time_ns")
        olap_c = _col(ov, "overlapped_ns", "comm_overlapped_ns", "overlap_ns", "comm_overlapped_by_compute_ns")
        exp_c = _col(ov, "exposed_comm_ns", "exposed_ns", "comm_exposed_ns")
        busy, comm = _sum(ov, busy_c), _sum(ov, comm_c)
        if busy is None:  # GPU-busy time from the time breakdown when overlap_by_rank does not carry it
            tb = _query(con, BREAKDOWN, missing)
            b_c = _col(tb, "gpu_busy_ns", "busy_ns", "kernel_busy_ns")
            if b_c:
                busy = _sum(tb, b_c)
            elif _col(tb, "span_ns") and _col(tb, "idle_ns"):
                busy = _sum(tb, "span_ns") - _sum(tb, "idle_ns")
        olap = _sum(ov, olap_c)
        exposed = _sum(ov, exp_c)
        if exposed is None and comm is not None and olap is not None:
            exposed = comm - olap
        if olap is None and comm is not None and exposed is not None:
            olap = comm - exposed
        s["gpu_busy_ns"], s["comm_ns"], s["exposed_comm_ns"] = _int(busy), _int(comm), _int(exposed)
        s["comm_share_pct"] = _pct(comm, busy)
        s["overlap_pct"] = _pct(olap, comm)
        s["exposed_comm_pct"] = _pct(exposed, busy)
        if busy_c and "rank" in ov.columns and (exp_c or (comm_c and olap_c)):
            per = ov.with_columns(
                (pl.col(exp_c) if exp_c else pl.col(comm_c) - pl.col(olap_c)).alias("_exp"))
            per = per.with_columns((100.0 * pl.col("_exp") / pl.col(busy_c)).alias("_pct")).filter(
                pl.col("_pct").is_not_null() & pl.col("_pct").is_not_nan()).sort(["_pct", "rank"],
                                                                                   descending=[True, False])
            if not per.is_empty():
                s["worst_rank"] = int(per.get_column("rank")[0])
                s["worst_rank_exposed_comm_pct"] = round(float(per.get_column("_pct")[0]), 3)
    if not con.execute("SELECT count(*) FROM (SELECT 1 FROM kernels LIMIT 1)").fetchone()[0]:
        for key in ("gpu_busy_ns", "comm_ns", "exposed_comm_ns"):  # nothing measured on a GPU: not a measured 0
            s[key] = None
            not_available(s, key, "the job has no GPU kernels")

    # -- worst collective --------------------------------------------------------------------------------------
    bw = _query(con, BANDWIDTH, missing)
    if bw is not None and not bw.is_empty():
        coll_c = _col(bw, "collective")
        tot_c = _col(bw, "total_ns", "sum_ns", "total_dur_ns", "dur_ns_sum", "time_ns")
        if coll_c and tot_c:
            top = bw.sort(tot_c, descending=True, nulls_last=True).row(0, named=True)
            bbw = _col(bw, "busbw_gbps", "bus_bw_gbps", "busbw_gb_s")
            algbw = _col(bw, "algbw_gbps", "alg_bw_gbps")
            size = _col(bw, "bucket_lo_bytes", "msg_bytes", "size_bytes")
            count = _col(bw, "ops", "count", "n_ops", "n", "calls")
            s["worst_collective"] = {
                "collective": top[coll_c],
                "msg_bytes": _int(top[size]) if size else None,
                "msg_bytes_hi": _int(top["bucket_hi_bytes"]) if "bucket_hi_bytes" in top else None,
                "group_size": _int(top["group_size"]) if top.get("group_size") is not None else None,
                "group_size_assumed": top["group_size_assumed"],
                "count": _int(top[count]) if count else None,
                "total_ns": _int(top[tot_c]),
                "busbw_gbps": top[bbw] if bbw else None,
                "algbw_gbps": top[algbw] if algbw else None,
            }

    # -- latency-bound communication (latency_model: n½ is the rule for "small", 64 KiB a labelled fallback) ------
    models = _query(con, LATENCY, missing)
    total = _query(con, LATENCY_TOTAL, missing)
    if total is not None and total.height:
        t = total.row(0, named=True)
        s["latency_bound_pct"] = None if t["latency_bound_pct"] is None else round(t["latency_bound_pct"], 3)
        s["coalescing_saving_ms"] = (None if t["coalescing_saving_ns"] is None
                                     else round(t["coalescing_saving_ns"] / 1e6, 6))
    if models is not None and models.height:
        s["latency_models"] = [
            {"collective": r["collective"], "group_size": r["group_size"], "instances": r["instances"],
             "alpha_us": r["alpha_us"], "beta_gbps": r["beta_gbps"], "n_half_bytes": r["n_half_bytes"],
             "fit_quality": r["fit_quality"], "latency_bound_pct": r["latency_bound_pct"],
             "coalescing_saving_ms": None if r["coalescing_saving_ns"] is None else r["coalescing_saving_ns"] / 1e6}
            for r in models.iter_rows(named=True)]
        p2p = models.filter(pl.col("collective") == "p2p")
        if p2p.height:
            row = p2p.row(0, named=True)
            s["p2p"] = {"small_msg_share_pct": row["latency_bound_pct"],
                        "small_msg_bytes": row["small_threshold_bytes"], "threshold_rule": row["threshold_rule"],
                        "alpha_us": row["alpha_us"], "beta_gbps": row["beta_gbps"],
                        "n_half_bytes": row["n_half_bytes"], "fit_quality": row["fit_quality"],
                        "n_ops": row["instances"], "small_ops": row["below_threshold_ops"]}
    if s.get("latency_bound_pct") is None and s["ranks"]:
        why = ("no matched communication" if total is None or not total.height
               else "no message sizes: re-export with sizes (see latency_model.note)")
        not_available(s, "latency_bound_pct", why)
    if s.get("coalescing_saving_ms") is None and s["ranks"]:
        not_available(s, "coalescing_saving_ms", "no α-β fit (needs sizes and two or more distinct sizes)")

    # -- skew and stragglers ----------------------------------------------------------------------------------
    wait = _query(con, WAIT, missing)
    if wait is not None and not wait.is_empty() and "rank" in wait.columns:
        last_c = _col(wait, "times_arrived_last", "times_last", "n_last", "arrived_last_count")
        wait_c = _col(wait, "total_wait_ns", "wait_ns", "caused_wait_ns")
        skew_c = _col(wait, "max_skew_ns", "skew_ns")
        order_c = _col(wait, "straggler_rank_order")
        if order_c:  # TraceLens ranking: 1 = lowest total wait = most likely straggler
            top = wait.sort([order_c, "rank"])
        elif last_c or wait_c:
            top = wait.sort([c for c in (last_c, wait_c) if c] + ["rank"],
                            descending=[True] * len([c for c in (last_c, wait_c) if c]) + [False])
        else:
            top = None
        if top is not None:
            if last_c:
                top = top.filter(pl.col(last_c) > 0)
            s["stragglers"] = [
                {"rank": int(r["rank"]), "times_last": _int(r[last_c]) if last_c else None,
                 "wait_ns": _int(r[wait_c]) if wait_c else None}
                for r in top.head(3).iter_rows(named=True)]
        if skew_c:
            m = wait.get_column(skew_c).max()
            s["max_skew_ms"] = None if m is None else round(m / 1e6, 6)
    skew = _query(con, SKEW, missing)
    sk_c = _col(skew, "start_skew_ns", "max_skew_ns", "skew_ns")
    if sk_c and not skew.is_empty():
        m = skew.get_column(sk_c).max()
        if m is not None:
            s["max_skew_ms"] = round(m / 1e6, 6)

    # -- what was missing --------------------------------------------------------------------------------------
    diag = _query(con, DIAGNOSTICS, []) if catalog.find(DIAGNOSTICS) else None
    if diag is not None and "message" in diag.columns:
        if "severity" in diag.columns:
            diag = diag.filter(pl.col("severity") == "warning")
        missing.extend(m for m in diag.get_column("message").to_list() if m and m not in missing)
    else:
        notes = con.execute("SELECT DISTINCT message FROM ingest_notes WHERE severity = 'warning' "
                            "ORDER BY message").fetchall()
        missing.extend(r[0] for r in notes if r[0] not in missing)
    if s["files"] == 0:
        missing.insert(0, f"{NO_TRACES}: the job holds no trace files")
        return s
    _name_unavailable(s, con)
    return s


def _name_unavailable(s: dict, con) -> None:
    """Say why each metric that is null could not be computed."""
    n_comm = con.execute("SELECT count(*) FROM kernels WHERE kernel_class = 'communication'").fetchone()[0]
    if s["comm_share_pct"] is None:
        not_available(s, "comm_share_pct", "no GPU-busy time" if n_comm else "the job has no communication kernels")
    if s["overlap_pct"] is None:
        not_available(s, "overlap_pct", "the job has no communication kernels" if not n_comm
                      else "communication time is unknown")
    if s["max_skew_ms"] is None:
        why = (f"cross-rank skew needs at least two ranks; the job has {s['ranks']}" if s["ranks"] < 2 else
               "no collective was matched on two or more ranks" if n_comm else "the job has no communication kernels")
        not_available(s, "max_skew_ms", why)
    w = s.get("worst_collective")
    if w is None or w.get("busbw_gbps") is None:
        n_sized = con.execute("SELECT count(*) FROM comm_ops WHERE msg_bytes IS NOT NULL").fetchone()[0]
        why = ("the job has no communication kernels" if not n_comm else
               "no collective has a known message size" if not n_sized else
               "the group size of the worst collective is unknown")
        not_available(s, "worst_collective.busbw_gbps", why)


# ---------------------------------------------------------------------------------------------------------------
# thresholds

THRESHOLDS = {
    # option name: (summary key, 'max' | 'min', readable name)
    "max_exposed_comm_pct": ("exposed_comm_pct", "max", "exposed communication (% of GPU-busy time)"),
    "min_overlap_pct": ("overlap_pct", "min", "communication overlapped by compute (%)"),
    "max_small_p2p_pct": ("p2p.small_msg_share_pct", "max", "small-message share of p2p operations (%)"),
    "max_latency_bound_pct": ("latency_bound_pct", "max", "latency-bound share of communication time (%)"),
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


def _ms(ns) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:,.3f} ms"


def _p(v) -> str:
    return "n/a" if v is None else f"{v:.1f} %"


def _bytes(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_summary(s: dict) -> str:
    """The summary as a few lines of text."""
    if not s["files"]:
        lines = [f"job: {NO_TRACES}"] + [f"missing: {m}" for m in s["missing"]]
        lines += [f"threshold {t['name'].replace('_', '-')} {t['limit']:g}: not evaluated (no traces)"
                  for t in s["thresholds"]]
        return "\n".join(lines)
    lines = [f"job: {s['ranks']} rank(s) from {s['files']} file(s) ({', '.join(s['sources']) or 'none'})"]
    lines.append(f"communication: {_p(s['comm_share_pct'])} of GPU-busy time ({_ms(s['comm_ns'])} of "
                 f"{_ms(s['gpu_busy_ns'])}, summed over ranks)")
    lines.append(f"overlap with compute: {_p(s['overlap_pct'])} of communication time")
    worst = (f"; worst rank {s['worst_rank']}: {_p(s['worst_rank_exposed_comm_pct'])}"
             if s.get("worst_rank") is not None else "")
    lines.append(f"exposed communication: {_ms(s['exposed_comm_ns'])} = {_p(s['exposed_comm_pct'])} of GPU-busy time{worst}")
    w = s.get("worst_collective")
    if w:
        bw = f", bus bandwidth {w['busbw_gbps']:.2f} GB/s" if isinstance(w.get("busbw_gbps"), (int, float)) else ""
        size = _bytes(w.get("msg_bytes")) + (f"–{_bytes(w['msg_bytes_hi'])}" if w.get("msg_bytes_hi") else "")
        lines.append(f"worst collective: {w['collective']} {size} × {w.get('count') or '?'}"
                     f" = {_ms(w['total_ns'])}{bw}")
    else:
        lines.append("worst collective: n/a")
    p = s.get("p2p")
    if p:
        alpha = "n/a" if p.get("alpha_us") is None else f"{p['alpha_us']:.1f} µs"
        beta = "" if p.get("beta_gbps") is None else f", β {p['beta_gbps']:.1f} GB/s"
        lines.append(f"point-to-point: {_p(p.get('small_msg_share_pct'))} of p2p time in messages <= "
                     f"{_bytes(p.get('small_msg_bytes'))}; latency α {alpha}{beta}")
    else:
        lines.append("point-to-point: n/a")
    if s.get("latency_bound_pct") is not None:
        save = s.get("coalescing_saving_ms")
        lines.append(f"latency-bound: {_p(s['latency_bound_pct'])} of communication transfer time below n½"
                     + ("" if save is None else f"; coalescing would save {save:.3f} ms"))
    if s.get("stragglers"):
        parts = [f"rank {r['rank']}" + (f" (last {r['times_last']}×)" if r.get("times_last") is not None else "")
                 for r in s["stragglers"]]
        skew = f"; max skew {s['max_skew_ms']:.3f} ms" if s.get("max_skew_ms") is not None else ""
        lines.append("stragglers: " + ", ".join(parts) + skew)
    elif s.get("max_skew_ms") is None:
        lines.append("stragglers: not available (see missing: max_skew_ms)")
    else:
        lines.append(f"stragglers: none found (max skew {s['max_skew_ms']:.3f} ms)")
    for m in s["missing"]:
        lines.append(f"missing: {m}")
    for t in s["thresholds"]:
        status = {True: "ok", False: "VIOLATED", None: "not evaluated (metric not available)"}[t["ok"]]
        val = "n/a" if t["value"] is None else f"{t['value']:g}"
        lines.append(f"threshold {t['name'].replace('_', '-')} {t['limit']:g}: {status} (value {val})")
    return "\n".join(lines)
