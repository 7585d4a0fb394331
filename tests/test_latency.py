"""Latency-bound communication: matching, host clock alignment, transfer time and the α-β model (tiers 2-4).

Synthetic jobs (fixtures.synthetic.make_latency_run) follow known α-β models per operation exactly, with arrival
skew up to 10× the transfer time, host clock offsets and pipeline send/recv; the real 8-rank example is checked
against TraceLens. Expected values are computed here from the run model, never read from the product.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth_db import catalog_db

from fixtures import synthetic as syn
from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import write_nsys
from nsys2comm import analysis
from nsys2comm.ingest import ingest
from nsys2comm.storage import db

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

US = syn.US
OFFSETS = (0, 37_123_456, -5_432_109)  # ns; not whole µs on purpose


def _hosted(run: syn.Run) -> duckdb.DuckDBPyConnection:
    con = synth_db.build(run)
    for rr in run.ranks:
        con.execute("UPDATE ranks SET host = ? WHERE rank = ?", [rr.host, rr.rank])
    return con


@pytest.fixture(scope="module")
def job():
    run = syn.make_latency_run(world_size=12, ranks_per_host=4, host_offsets_ns=OFFSETS, reps=3)
    return run, _hosted(run)


def _model_of(collective: str) -> str:
    return "p2p" if collective == "p2p" else collective


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_host_offsets_recovered(job):
    _, con = job
    off = analysis.run_query(con, "host_clock_offsets")
    got = dict(zip(off["host"], off["offset_ns"], strict=False))
    for h, want in enumerate(OFFSETS):
        assert abs(got[f"synth-node-{h}"] - want) <= 1000, h
    assert off.filter(~off["is_reference"])["instances"].min() > 0


def test_transfer_exact_despite_skew_and_offsets(job):
    run, con = job
    tr = analysis.run_query(con, "comm_transfer")
    assert (tr["transfer_source"] == "matched").all()
    sizes = {op: set(v) for op, v in syn.LATENCY_SIZES.items()}
    n_coll = 3 * (len(sizes["all_reduce"]) + len(sizes["all_gather"]))
    n_p2p = 3 * len(sizes["p2p"]) * (run.world_size - 1)
    assert tr.height == n_coll + n_p2p
    skew_ratio = 0.0
    for r in tr.iter_rows(named=True):
        want = syn.model_transfer_ns(_model_of(r["collective"]), r["msg_bytes"])
        assert r["transfer_ns"] == want, r["instance_key"]
        skew_ratio = max(skew_ratio, r["max_wait_ns"] / want)
    assert skew_ratio > 5  # the skew really dwarfs the transfer
    p2p = tr.filter(tr["kind"] == "p2p")
    assert set(zip(p2p["src_rank"], p2p["dst_rank"], strict=False)) == {(s, s + 1) for s in range(run.world_size - 1)}


def test_fit_recovers_alpha_beta(job):
    """Exact transfers: the fit finds α and β, but every bootstrap replicate is the same fit (zero-width intervals),
    so it is shown and not used ('degenerate_interval'); noisy jobs that pass are in test_latency_fit.py."""
    _, con = job
    m = analysis.run_query(con, "latency_model")
    assert set(m["collective"]) == {"all_reduce", "all_gather", "p2p"}
    for r in m.iter_rows(named=True):
        alpha, beta = syn.LATENCY_MODELS[r["collective"]]
        assert r["alpha_us"] == pytest.approx(alpha, rel=0.10), r["collective"]
        assert r["beta_gbps"] == pytest.approx(beta, rel=0.10), r["collective"]
        assert r["alpha_lo_us"] == r["alpha_us"] == r["alpha_hi_us"]
        assert r["beta_lo_gbps"] == r["beta_gbps"] == r["beta_hi_gbps"]
        assert r["n_half_bytes"] == pytest.approx(alpha * beta * 1000, rel=0.2)
        assert r["fit_quality"] == "degenerate_interval" and r["threshold_rule"] is None
        assert r["transfer_source"] == "matched"


def test_no_share_without_an_ok_fit_but_the_labelled_64kib_columns(job):
    run, con = job
    m = {r["collective"]: r for r in analysis.run_query(con, "latency_model").iter_rows(named=True)}
    for op, sizes in syn.LATENCY_SIZES.items():
        per_size = 3 * (run.world_size - 1 if op == "p2p" else 1)
        small = [b for b in sizes if b < 65536]
        r = m[op]
        for col in ("latency_bound_ns", "latency_bound_pct", "below_threshold_ops", "coalescing_saving_ns",
                    "small_threshold_bytes"):
            assert r[col] is None, (op, col)
        assert r["small_64kib_ops"] == len(small) * per_size
        total = sum(syn.model_transfer_ns(op, b) for b in sizes)
        assert r["small_64kib_time_pct"] == pytest.approx(
            100 * sum(syn.model_transfer_ns(op, b) for b in small) / total, abs=1e-9)
    t = analysis.run_query(con, "latency_bound_total").row(0, named=True)
    assert t["latency_bound_pct"] is None and t["coalescing_saving_ns"] is None
    assert t["not_evaluated_reason"] == "no_ok_fit" and t["models_fitted"] == 0 and t["covered_comm_pct"] == 0


def test_pairs_and_points(job):
    run, con = job
    pairs = analysis.run_query(con, "transfer_by_pair")
    assert pairs.height == run.world_size - 1
    assert (pairs["instances"] == 3 * len(syn.LATENCY_SIZES["p2p"])).all()
    pts = analysis.run_query(con, "latency_by_size")
    p = pts.filter(pts["collective"] == "p2p")
    assert p["msg_bytes"].to_list() == syn.LATENCY_SIZES["p2p"]
    assert p["transfer_p50_ns"].to_list() == [syn.model_transfer_ns("p2p", b) for b in syn.LATENCY_SIZES["p2p"]]
    assert p["model_ns"].to_list() == pytest.approx(p["transfer_p50_ns"].to_list(), rel=0.10)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_without_sizes_distributions_remain():
    run = syn.make_latency_run(world_size=4, ranks_per_host=4, reps=2)
    con = synth_db.build(run)
    con.execute("UPDATE comm_ops SET msg_bytes = NULL, in_bytes = NULL, out_bytes = NULL, element_count = NULL")
    m = analysis.run_query(con, "latency_model")
    assert set(m["fit_quality"]) == {"no_sizes"}
    assert m["alpha_us"].is_null().all() and m["latency_bound_pct"].is_null().all()
    assert set(m["not_evaluated_reason"]) == {"fit_no_sizes"} and m["small_64kib_ops"].is_null().all()
    assert m["note"].str.contains("re-export").all()
    ar = m.filter(m["collective"] == "all_reduce").row(0, named=True)
    assert ar["latency_floor_ns"] == syn.model_transfer_ns("all_reduce", min(syn.LATENCY_SIZES["all_reduce"]))
    t = analysis.run_query(con, "latency_bound_total").row(0, named=True)
    assert t["latency_bound_pct"] is None and t["not_evaluated_reason"] == "no_sizes"
    assert analysis.run_query(con, "transfer_by_pair").height == 3


def test_single_rank_has_no_transfer_time():
    """One rank: kernel durations include waiting for the ranks not seen, so no transfer time (single_rank)."""
    run = syn.make_latency_run(world_size=4, ranks_per_host=4, reps=1)
    run.ranks = run.ranks[:1]
    con = synth_db.build(run)
    tr = analysis.run_query(con, "comm_transfer")
    assert tr.height == len(run.ranks[0].kernels)
    assert set(tr["transfer_source"]) == {"single_rank"}
    assert tr["transfer_ns"].is_null().all()
    k = sum(k.end_ns - k.start_ns for k in run.ranks[0].kernels)
    assert con.execute("SELECT sum(max_duration_ns) FROM _skew_comm_instances").fetchall()[0][0] == k


def test_one_size_gives_no_share():
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    con.execute("INSERT INTO ranks VALUES (0, 1, 1, 'h', 2, 'cli'), (1, 1, 2, 'h', 2, 'cli')")
    for i in range(4):  # 4 all_reduces of 1 KiB, both ranks, 10 µs transfer
        for r in (0, 1):
            kid = 10 * i + r
            con.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, start_ns, end_ns, name, short_name, "
                        "kernel_class) VALUES (?, 1, ?, 0, ?, ?, 'ncclKernel', 'ncclKernel', 'communication')",
                        [kid, r, i * 100_000 + r * 3000, i * 100_000 + 13_000])
            con.execute("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, pg_name, seq, n_ops, "
                        "collective_source) VALUES (?, 1, ?, 'all_reduce', 1024, '0', ?, 1, 'kernel_args')",
                        [kid, r, i])
    m = analysis.run_query(con, "latency_model").row(0, named=True)
    assert m["fit_quality"] == "one_size" and m["threshold_rule"] is None
    assert m["latency_bound_pct"] is None and m["coalescing_saving_ns"] is None
    assert m["not_evaluated_reason"] == "fit_one_size"
    assert m["small_64kib_ops"] == 4 and m["small_64kib_time_pct"] == 100.0  # the labelled rule of thumb only
    assert m["transfer_p50_ns"] == 10_000


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_example_matches_tracelens(reference_values):
    con = db.connect(None)
    ingest(con, [syn.__file__.rsplit("/", 1)[0] + "/example"], jobs=1)
    ref = reference_values["param_dlrm_8rank"]["tracelens_nccl_analyser"]["per_collective"]
    tr = analysis.run_query(con, "comm_transfer")
    assert tr.height == len(ref)
    for row, want in zip(tr.iter_rows(named=True), ref, strict=False):
        assert abs(row["transfer_ns"] - want["comm_latency_us"] * 1000) <= 1000, row["instance_key"]
    m = analysis.run_query(con, "latency_model")
    assert m.height > 0 and (m["instances"] > 0).all()


def test_cross_source_matched_rows_identical(tmp_path):
    run = syn.make_latency_run(world_size=4, ranks_per_host=4, reps=2)
    cols = ["kind", "collective", "group_size", "msg_bytes", "src_rank", "dst_rank", "ranks_seen", "first_start_ns",
            "last_start_ns", "transfer_ns", "transfer_source", "max_wait_ns", "last_arriving_rank", "rank_wait_ns"]
    out = []
    for paths in (write_kineto(run, tmp_path / "k", style="new"), [write_nsys(run, tmp_path / "r.sqlite")]):
        con = db.connect(None)
        res = ingest(con, paths, jobs=1)
        assert all(r.status == "ingested" for r in res)
        df = analysis.run_query(con, "comm_transfer").select(cols)
        out.append(df.sort(cols[:-1]).rows())
    assert len(out[0]) == 2 * (len(syn.LATENCY_SIZES["all_reduce"]) + len(syn.LATENCY_SIZES["all_gather"])
                               + 3 * len(syn.LATENCY_SIZES["p2p"]))
    assert out[0] == out[1]


@pytest.mark.slow  # tier: slow (brute force over generated cases; CI runs it)
@settings(max_examples=12, deadline=None)  # ≈ 0.9 s each: the catalog's whole fit per example
@given(st.integers(2, 40), st.floats(0.5, 200), st.integers(0, 3), st.integers(0, 10_000))
def test_theil_sen_vs_brute_force(alpha_us, beta_gbps, outliers, seed):
    """The SQL fit equals a brute-force Theil–Sen (median of all pairwise slopes of per-size medians)."""
    rng = random.Random(seed)
    sizes = sorted(rng.sample([2 ** k for k in range(6, 28)], 6))
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    con.execute("INSERT INTO ranks VALUES (0, 1, 1, 'h', 2, 'cli'), (1, 1, 2, 'h', 2, 'cli')")
    pts, kid = {}, 0
    for i, b in enumerate(sizes * 3):
        t = round(alpha_us * 1000 + b / beta_gbps) + (rng.randint(1, 10) * 100_000 if i < outliers else 0)
        pts.setdefault(b, []).append(t)
        for r in (0, 1):
            kid += 1
            con.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, start_ns, end_ns, name, short_name, "
                        "kernel_class) VALUES (?, 1, ?, 0, ?, ?, 'ncclKernel', 'ncclKernel', 'communication')",
                        [kid, r, i * 10**9, i * 10**9 + t])
            con.execute("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, pg_name, seq, n_ops, "
                        "collective_source) VALUES (?, 1, ?, 'all_reduce', ?, '0', ?, 1, 'kernel_args')",
                        [kid, r, b, i])
    med = {b: sorted(v)[1] for b, v in pts.items()}
    slopes = sorted((med[y] - med[x]) / (y - x) for i, x in enumerate(sizes) for y in sizes[i + 1:])
    n = len(slopes)
    slope = (slopes[n // 2] + slopes[(n - 1) // 2]) / 2
    f = con.execute("SELECT slope_ns_per_byte FROM _skew_latency_fit").fetchall()[0][0]
    assert f == pytest.approx(slope, rel=1e-9)
    m = analysis.run_query(con, "latency_model").row(0, named=True)
    if max(sizes) / beta_gbps > 10_000:  # bandwidth term well above the 1 ns rounding
        assert m["beta_gbps"] == pytest.approx(beta_gbps, rel=0.10)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_report_charts_draw(job):
    from nsys2comm.report import charts

    _, con = job
    model = analysis.run_query(con, "latency_model")
    spec = charts.latency_chart(model, analysis.run_query(con, "latency_by_size")).to_dict()
    assert "layer" in spec and len(spec["layer"]) == 3  # whiskers, medians, model curves; n½ only of 'ok' fits
    assert charts.pair_heatmap_chart(analysis.run_query(con, "transfer_by_pair")).to_dict()
    assert charts.latency_chart(model.with_columns(alpha_us=None), None).to_dict()  # sizes unknown: ranges


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_example_report_section_has_data():
    from nsys2comm.report.html import collect

    con = db.connect(None)
    ingest(con, [syn.__file__.rsplit("/", 1)[0] + "/example"], jobs=1)
    _, sections, findings, _ = collect(con)
    sec = next(s for s in sections if s.title == "Latency-bound communication")
    assert sec.blocks[0].chart is not None
    assert any(f.anchor == "sec-latency" for f in findings)
