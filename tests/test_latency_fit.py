"""α-β latency models only from clean data (issue 36, deliverable 2; "unknown is not zero").

Tier 2: inline jobs (two ranks, rows written here) for the fit-quality rules, and a hypothesis property test that
every 'ok' fit is physically possible with bounded, non-degenerate intervals. Tier 3: jobs built by
fixtures.synthetic.make_latency_run (exact α-β transfers, arrival skew up to 10× the transfer) with a known,
seeded noise on every instance's transfer time, so that the expected shares, savings and distributions are
computed here from the run, never read from the product.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_db import catalog_db
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

from fixtures import synthetic as syn
from nsys2comm import analysis, summary
from nsys2comm.storage import sweeps as cache
from nsys2comm.units import pct

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

US = syn.US
NOISE = 0.2  # each instance's transfer time × (1 + u), u uniform in [-NOISE, NOISE]


def _jitter(run: syn.Run, rel: float, seed: int) -> dict[tuple[str, int], list[int]]:
    """Scale each instance's transfer time (end − last start; all its kernels share one end) by 1 + u; returns the
    new transfer times per (operation, size). Host offsets must be 0 (instances are grouped by end time)."""
    rng = random.Random(seed)
    ops = {id(o.kernel): o for rr in run.ranks for o in rr.comm}
    by_end: dict[int, list[syn.Kernel]] = {}
    for rr in run.ranks:
        for k in rr.kernels:
            by_end.setdefault(k.end_ns, []).append(k)
    out: dict[tuple[str, int], list[int]] = {}
    for end in sorted(by_end):
        ks = by_end[end]
        tr = end - max(k.start_ns for k in ks)
        delta = round(tr * rng.uniform(-rel, rel))
        for k in ks:
            k.end_ns += delta
        op = ops[id(ks[0])]
        name = "p2p" if op.collective in ("send", "recv") else op.collective
        out.setdefault((name, op.msg_bytes), []).append(tr + delta)
    return out


def _ready(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    cache.unmaterialize(con)
    cache.materialize(con)  # the helper sweeps once, as the report does: the tests query them many times
    return con


@pytest.fixture(scope="module")
def noisy():
    run = syn.make_latency_run(world_size=8, ranks_per_host=4, reps=5)
    transfers = _jitter(run, NOISE, seed=1)
    return run, transfers, _ready(synth_db.build(run))


def _model(con) -> dict[str, dict]:
    return {r["collective"]: r for r in analysis.run_query(con, "latency_model").iter_rows(named=True)}


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_clean_job_recovers_alpha_beta_with_intervals(noisy):
    _, _, con = noisy
    m = _model(con)
    assert set(m) == set(syn.LATENCY_MODELS)
    for op, (alpha, beta) in syn.LATENCY_MODELS.items():
        r = m[op]
        assert r["fit_quality"] == "ok" and r["transfer_source"] == "matched", op
        assert r["alpha_lo_us"] <= alpha <= r["alpha_hi_us"], op
        assert r["beta_lo_gbps"] <= beta <= r["beta_hi_gbps"], op
        assert r["alpha_lo_us"] < r["alpha_hi_us"] and r["beta_lo_gbps"] < r["beta_hi_gbps"], op  # not degenerate
        assert r["alpha_us"] == pytest.approx(alpha, rel=0.15) and r["beta_gbps"] == pytest.approx(beta, rel=0.15)
        assert r["n_half_bytes"] == pytest.approx(r["alpha_us"] * r["beta_gbps"] * 1000, rel=1e-6)
        assert r["fit_min_bytes"] == min(syn.LATENCY_SIZES[op]) and r["fit_max_bytes"] == max(syn.LATENCY_SIZES[op])
        factor = 1.0 if op == "p2p" else {"all_reduce": 2 * 7 / 8, "all_gather": 7 / 8}[op]
        assert r["beta_busbw_gbps"] == pytest.approx(r["beta_gbps"] * factor)
        assert r["peak_source"] == "nvlink5_bound"  # the synthetic job lists no device
        assert r["peak_busbw_gbps"] == (1800.0 if op == "all_reduce" else 900.0)


def test_latency_bound_share_saving_and_coverage(noisy):
    run, transfers, con = noisy
    m = _model(con)
    comm_ns = sum(k.end_ns - k.start_ns for rr in run.ranks for k in rr.kernels)
    tot_lb = tot_all = tot_saving = tot_kernel = 0.0
    for op, sizes in syn.LATENCY_SIZES.items():
        r = m[op]
        n_half = r["alpha_us"] * r["beta_gbps"] * 1000  # no size lies within 2× of the true n½
        small = [b for b in sizes if b < n_half]
        lb = sum(sum(transfers[(op, b)]) for b in small)
        total = sum(sum(transfers[(op, b)]) for b in sizes)
        assert r["small_threshold_bytes"] == round(n_half) and r["threshold_rule"] == "n_half"
        assert r["latency_bound_ns"] == lb and r["below_threshold_ops"] == sum(len(transfers[(op, b)]) for b in small)
        assert r["latency_bound_pct"] == pytest.approx(100 * lb / total, abs=1e-9)
        nbytes = sum(b * len(transfers[(op, b)]) for b in small)
        coalesced = max(-(-nbytes // n_half), 1) * r["alpha_us"] * 1000 + nbytes / r["beta_gbps"]
        assert r["coalescing_saving_ns"] == pytest.approx(max(lb - coalesced, 0), abs=1)
        assert r["not_evaluated_reason"] is None
        kernel_ns = sum(k.end_ns - k.start_ns for rr in run.ranks for o in rr.comm for k in [o.kernel]
                        if ("p2p" if o.collective in ("send", "recv") else o.collective) == op)
        assert r["covered_comm_pct"] == pytest.approx(100 * kernel_ns / comm_ns)
        tot_lb, tot_all, tot_saving, tot_kernel = (tot_lb + lb, tot_all + total,
                                                   tot_saving + r["coalescing_saving_ns"], tot_kernel + kernel_ns)
    t = analysis.run_query(con, "latency_bound_total").row(0, named=True)
    assert t["latency_bound_pct"] == pytest.approx(100 * tot_lb / tot_all, abs=1e-9)
    assert t["coalescing_saving_ns"] == tot_saving and t["models_fitted"] == 3
    assert t["covered_comm_pct"] == pytest.approx(100 * tot_kernel / comm_ns) and t["covered_comm_pct"] > 99
    assert t["not_evaluated_reason"] is None


def test_beta_above_the_peak_is_implausible_and_left_out(noisy):
    _, transfers, con = noisy
    con.execute("SET VARIABLE nsys2comm_link_gbps = 30")  # busbw peak 30-60: all_reduce 140, all_gather 131, p2p 20
    try:
        m = _model(con)
        t = analysis.run_query(con, "latency_bound_total").row(0, named=True)
    finally:
        con.execute("SET VARIABLE nsys2comm_link_gbps = NULL")
    for op in ("all_reduce", "all_gather"):
        r = m[op]
        assert r["fit_quality"] == "implausible" and r["peak_source"] == "job_peak"
        assert r["beta_busbw_gbps"] > r["peak_busbw_gbps"]
        assert r["alpha_us"] is not None and r["beta_gbps"] is not None  # shown
        assert r["latency_bound_pct"] is None and r["coalescing_saving_ns"] is None  # not used
        assert r["small_threshold_bytes"] is None and r["not_evaluated_reason"] == "fit_implausible"
    p = m["p2p"]
    assert p["fit_quality"] == "ok"
    assert t["models_fitted"] == 1 and t["latency_bound_ns"] == p["latency_bound_ns"]
    assert t["fitted_transfer_ns"] == sum(sum(v) for (op, _), v in transfers.items() if op == "p2p")
    assert t["coalescing_saving_ns"] == p["coalescing_saving_ns"]
    assert t["covered_comm_pct"] == pytest.approx(p["covered_comm_pct"])


def test_noise_free_transfers_give_degenerate_intervals():
    """Identical transfers in every bucket: every replicate is the same fit, a zero-width interval: not 'ok'."""
    con = _ready(synth_db.build(syn.make_latency_run(world_size=4, ranks_per_host=4, reps=3)))
    m = _model(con)
    for op, (alpha, beta) in syn.LATENCY_MODELS.items():
        r = m[op]
        assert r["fit_quality"] == "degenerate_interval", op
        assert r["alpha_us"] == pytest.approx(alpha, rel=0.1)
        assert r["alpha_lo_us"] == r["alpha_hi_us"] and r["beta_lo_gbps"] == r["beta_hi_gbps"]
        assert r["beta_gbps"] == pytest.approx(beta, rel=0.1)  # shown
        assert r["latency_bound_pct"] is None and r["not_evaluated_reason"] == "fit_degenerate_interval"
    t = analysis.run_query(con, "latency_bound_total").row(0, named=True)
    assert t["latency_bound_pct"] is None and t["not_evaluated_reason"] == "no_ok_fit"
    assert t["coalescing_saving_ns"] is None and t["covered_comm_pct"] == 0


def test_single_rank_job_with_waits_gets_durations_only():
    run = syn.make_latency_run(world_size=4, ranks_per_host=4, reps=3)
    run.ranks = run.ranks[:1]
    con = _ready(synth_db.build(run))
    durations: dict[str, list[int]] = {}
    for o in run.ranks[0].comm:
        durations.setdefault("p2p" if o.collective in ("send", "recv") else o.collective, []).append(
            o.kernel.end_ns - o.kernel.start_ns)
    waited = sum(d > syn.model_transfer_ns("all_reduce", 64 << 20) for d in durations["all_reduce"])
    assert waited  # rank 0 waited for peers: some all_reduce durations exceed any transfer time
    m = analysis.run_query(con, "latency_model")
    for r in m.iter_rows(named=True):
        assert r["transfer_source"] == "single_rank" and r["fit_quality"] == "durations_only"
        assert r["matched_instances"] == 0
        for col in ("alpha_us", "beta_gbps", "n_half_bytes", "latency_floor_ns", "transfer_p50_ns", "wait_p50_ns",
                    "wait_p90_ns", "latency_bound_pct", "coalescing_saving_ns", "small_threshold_bytes"):
            assert r[col] is None, col
        d = sorted(durations[r["collective"]])
        assert r["duration_incl_wait_p50_ns"] == d[-(-len(d) // 2) - 1]  # nearest rank
        assert r["not_evaluated_reason"] == "fit_durations_only" and "waiting" in r["note"]
    t = analysis.run_query(con, "latency_bound_total").row(0, named=True)
    assert t["latency_bound_pct"] is None and t["coalescing_saving_ns"] is None
    assert t["not_evaluated_reason"] == "no_matched_transfers" and t["covered_comm_pct"] == 0
    s = summary.build_summary(con)
    assert s["latency_bound_pct"] is None and s["coalescing_saving_ms"] is None
    assert any(x.startswith("latency_bound_pct: not available (no instance was matched") for x in s["missing"])
    gate = summary.check_thresholds(s, max_latency_bound_pct=10.0)["thresholds"][0]
    assert gate["ok"] is None and gate["value"] is None  # not evaluated, never passed
    assert "latency-bound: not evaluated" in "\n".join(summary._latency_lines(s))


def test_findings_and_chart_follow_the_source(noisy):
    from nsys2comm.report import charts, findings

    run = syn.make_latency_run(world_size=4, ranks_per_host=4, reps=1)
    run.ranks = run.ranks[:1]
    con = _ready(synth_db.build(run))
    model = analysis.run_query(con, "latency_model")
    texts = [f.text for f in findings.latency_findings(model, analysis.run_query(con, "latency_bound_total"))]
    assert texts and all("waiting excluded" not in t for t in texts)
    assert any("includes waiting" in t for t in texts)
    spec = charts.latency_chart(model, analysis.run_query(con, "latency_by_size")).to_dict()
    assert "waiting for peers included" in str(spec) and "waiting excluded" not in str(spec)
    _, _, con = noisy
    model = analysis.run_query(con, "latency_model")
    total = analysis.run_query(con, "latency_bound_total")
    (lb,) = [f for f in findings.latency_findings(model, total) if "latency-bound" in f.text]
    assert f"The fits cover {pct(total['covered_comm_pct'][0])} of communication kernel time" in lb.text
    assert lb.level == "warning" or total["latency_bound_pct"][0] < findings.WARN_PCT


def test_chart_draws_the_model_curve_over_the_fitted_range(noisy):
    from nsys2comm.report import charts

    _, _, con = noisy
    model = analysis.run_query(con, "latency_model")
    spec = charts.latency_chart(model, analysis.run_query(con, "latency_by_size")).to_dict()
    assert len(spec["layer"]) == 4  # whiskers, medians, model curves, n½ rules
    curves = charts._latency_curves(model)
    for r in model.iter_rows(named=True):
        c = curves.filter(pl.col("op") == f"{r['collective']} n={r['group_size']}").sort("size_bytes")
        assert c["size_bytes"][0] == pytest.approx(r["fit_min_bytes"])
        assert c["size_bytes"][-1] == pytest.approx(r["fit_max_bytes"])
        b = c["size_bytes"][20]
        assert c["model_us"][20] == pytest.approx(r["alpha_us"] + b / (r["beta_gbps"] * 1e3))


# ---------------------------------------------------------------------------------------------------------------
# Inline two-rank jobs: one row per instance (size, transfer)


@pytest.fixture(scope="module")
def blank():
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    return con


def _load(con, instances: list[tuple[int, int]], collective: str = "all_reduce") -> duckdb.DuckDBPyConnection:
    """Two ranks, one group of 2; instance i: rank 1 starts 50 µs after rank 0, both end `transfer` later."""
    cache.unmaterialize(con)
    for t in ("comm_ops", "kernels", "ranks"):
        con.execute(f"DELETE FROM {t}")
    con.execute("INSERT INTO ranks VALUES (0, 1, 1, 'h', 2, 'cli'), (1, 1, 2, 'h', 2, 'cli')")
    krows, orows = [], []
    for i, (nbytes, transfer) in enumerate(instances):
        t0 = i * 10**8
        for r in (0, 1):
            kid = 2 * i + r
            krows.append((kid, r, t0 + r * 50 * US, t0 + 50 * US + transfer))
            orows.append((kid, r, collective, nbytes, i))
    con.executemany("INSERT INTO kernels (kernel_id, file_id, rank, device_id, start_ns, end_ns, name, short_name, "
                    "kernel_class) VALUES (?, 1, ?, 0, ?, ?, 'ncclKernel', 'ncclKernel', 'communication')", krows)
    con.executemany("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, pg_name, seq, n_ops, "
                    "collective_source, group_size) VALUES (?, 1, ?, ?, ?, '0', ?, 1, 'kernel_args', 2)", orows)
    return _ready(con)


def _noisy_points(alpha_ns: float, beta_gbps: float, sizes: list[int], reps: int, seed: int = 0):
    rng = random.Random(seed)
    return [(b, round((alpha_ns + b / beta_gbps) * rng.uniform(0.85, 1.15))) for b in sizes for _ in range(reps)]


def _row(con) -> dict:
    return analysis.run_query(con, "latency_model").row(0, named=True)


def test_two_sizes_are_not_ok(blank):
    r = _row(_load(blank, _noisy_points(20_000, 50, [4096, 1 << 20], reps=6)))
    assert r["fit_quality"] == "few_sizes" and r["alpha_us"] is None and r["beta_gbps"] is None
    assert r["latency_bound_pct"] is None and r["coalescing_saving_ns"] is None
    assert r["small_64kib_ops"] == 6 and r["not_evaluated_reason"] == "fit_few_sizes"


def test_three_single_instance_points_are_not_ok(blank):
    r = _row(_load(blank, _noisy_points(20_000, 50, [4096, 1 << 18, 1 << 24], reps=1)))
    assert r["sizes"] == 3 and r["sizes_used"] == 0
    assert r["fit_quality"] == "few_instances" and r["alpha_us"] is None and r["latency_bound_pct"] is None


def test_narrow_sizes_and_alpha_above_1ms(blank):
    r = _row(_load(blank, _noisy_points(20_000, 50, [1 << 20, 1 << 21, 1 << 22], reps=4)))
    assert r["fit_quality"] == "narrow_sizes"  # 4× span < 8×
    r = _row(_load(blank, _noisy_points(2_500_000, 5, [1 << 16, 1 << 20, 1 << 24], reps=4)))
    assert r["fit_quality"] == "implausible" and r["alpha_us"] > 1000  # α = 2.5 ms: waiting, not latency
    assert r["latency_bound_pct"] is None


def test_partial_group_gets_no_fit():
    """2 of 8 ranks traced: no collective is seen on its complete group, so none gets a transfer time or a fit."""
    run = syn.make_latency_run(world_size=8, ranks_per_host=4, reps=3)
    run.ranks = run.ranks[:2]
    m = _model(_ready(synth_db.build(run)))
    for op in ("all_reduce", "all_gather"):
        assert m[op]["transfer_source"] == "partial_group" and m[op]["fit_quality"] == "durations_only"
        assert m[op]["matched_instances"] == 0 and m[op]["alpha_us"] is None and m[op]["wait_p50_ns"] is None
    assert m["p2p"]["transfer_source"] == "matched"  # the pair 0 → 1 is complete
    assert m["p2p"]["matched_instances"] == 3 * len(syn.LATENCY_SIZES["p2p"])


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(alpha_us=st.floats(1, 3000), beta_gbps=st.floats(0.5, 4000), noise=st.floats(0, 0.3),
       exps=st.lists(st.integers(8, 28), min_size=2, max_size=6, unique=True),
       reps=st.lists(st.integers(1, 4), min_size=6, max_size=6),
       peak=st.one_of(st.none(), st.floats(5, 1000)), seed=st.integers(0, 1000))
def test_ok_fits_are_physical_and_bounded(blank, alpha_us, beta_gbps, noise, exps, reps, peak, seed):
    _check_fit(blank, alpha_us, beta_gbps, noise, exps, reps, peak, seed)


def test_the_property_test_reaches_both_branches(blank):
    """The property's checks of 'ok' fits run: a clean job is 'ok', the same job against a 10 GB/s link is not."""
    job = dict(alpha_us=20.0, beta_gbps=50.0, noise=0.2, exps=[10, 14, 18, 22], reps=[3] * 6, seed=1)
    assert _check_fit(blank, peak=None, **job) == "ok"
    assert _check_fit(blank, peak=10.0, **job) == "implausible"


def _check_fit(blank, alpha_us, beta_gbps, noise, exps, reps, peak, seed) -> str:
    """Every 'ok' fit: busbw within the peak, 0 <= α <= 1 ms, intervals bounded and not degenerate, >= 3 used sizes
    spanning >= 8×; any other fit feeds no share. Returns the fit quality."""
    rng = random.Random(seed)
    sizes = [1 << e for e in sorted(exps)]
    rows = [(b, max(1, round((alpha_us * 1000 + b / beta_gbps) * (1 + rng.uniform(-noise, noise)))))
            for b, n in zip(sizes, reps, strict=False) for _ in range(n)]
    con = _load(blank, rows)
    con.execute("SET VARIABLE nsys2comm_link_gbps = ?", [peak])
    try:
        r = _row(con)
        job_peak = con.execute("SELECT _devices_peak_busbw_gbps()").fetchall()[0][0]
        t = analysis.run_query(con, "latency_bound_total").row(0, named=True)
    finally:
        con.execute("SET VARIABLE nsys2comm_link_gbps = NULL")
    used = [b for b, n in zip(sizes, reps, strict=False) if n >= 2]
    if r["fit_quality"] != "ok":
        assert r["latency_bound_pct"] is None and r["coalescing_saving_ns"] is None
        assert t["latency_bound_pct"] is None and t["models_fitted"] == 0
        return r["fit_quality"]
    bound = job_peak if job_peak is not None else 1800.0
    assert r["beta_gbps"] * 2 * (2 - 1) / 2 <= bound * (1 + 1e-12)  # all_reduce of 2: busbw factor 1
    assert 0 <= r["alpha_us"] <= 1000
    assert 0 < r["alpha_lo_us"] < r["alpha_hi_us"]
    assert r["beta_hi_gbps"] is not None and r["beta_lo_gbps"] < r["beta_hi_gbps"]
    assert len(used) >= 3 and max(used) >= 8 * min(used)
    assert r["latency_bound_pct"] is not None and t["models_fitted"] == 1
    return "ok"
