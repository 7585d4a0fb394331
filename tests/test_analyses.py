"""Golden outputs of the analyses on the synthetic run (canonical tables built directly, no importer)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth_db import catalog_db

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

from fixtures import synthetic as syn
from nsys2comm import analysis, catalog
from nsys2comm.errors import UsageError
from nsys2comm.storage import snapshotted
from nsys2comm.storage import sweeps as cache

US = syn.US


@pytest.fixture(scope="module")
def run():
    return syn.make_run(world_size=4, steps=2)


@pytest.fixture(scope="module")
def con(run):
    return synth_db.build(run)


class _Set:
    """Exact union of half-open ns intervals (brute force over elementary segments)."""

    def __init__(self, iv):
        self.iv = [(a, b) for a, b in iv if b > a]

    def covers(self, a, b):
        return any(s <= a and b <= e for s, e in self.iv)


def _measure(pred, *sets):
    pts = sorted({t for st_ in sets for iv in st_.iv for t in iv})
    return sum(b - a for a, b in zip(pts, pts[1:], strict=False) if pred(*(x.covers(a, b) for x in sets)))


def test_overlap_by_rank_matches_brute_force(con, run):
    df = analysis.run_query(con, "overlap_by_rank")
    for rr in run.ranks:
        comm = _Set([(k.start_ns, k.end_ns) for k in rr.kernels if k.name.startswith("ncclDev")])
        comp = _Set([(k.start_ns, k.end_ns) for k in rr.kernels if not k.name.startswith("ncclDev")])
        gemm = _Set([(k.start_ns, k.end_ns) for k in rr.kernels if "gemm" in k.name or "nvjet" in k.name])
        mem = _Set([(m.start_ns, m.end_ns) for m in rr.memops])
        row = df.filter(df["rank"] == rr.rank).to_dicts()[0]
        assert row["comm_ns"] == _measure(lambda c: c, comm)
        assert row["comm_overlapped_ns"] == _measure(lambda c, p: c and p, comm, comp)
        assert row["gemm_overlapped_ns"] == _measure(lambda c, g: c and g, comm, gemm)
        assert row["exposed_comm_ns"] == _measure(lambda c, p: c and not p, comm, comp)
        assert row["compute_ns"] == _measure(lambda p: p, comp)
        assert row["memory_ns"] == _measure(lambda m: m, mem)
        assert row["busy_ns"] == _measure(lambda *x: any(x), comm, comp, mem)
        assert row["idle_ns"] == row["span_ns"] - row["busy_ns"]
        assert row["comm_overlap_pct"] == pytest.approx(100 * row["comm_overlapped_ns"] / row["comm_ns"])


def test_comm_kernels_consistent_with_rank_totals(con):
    ck = analysis.run_query(con, "comm_kernels")
    ov = analysis.run_query(con, "overlap_by_rank")
    assert ck.height == sum(len(r.comm) for r in syn.make_run(world_size=4, steps=2).ranks)
    assert (ck["exposed_ns"] == ck["duration_ns"] - ck["overlapped_by_compute_ns"]).all()
    assert (ck["overlapped_by_gemm_ns"] <= ck["overlapped_by_compute_ns"]).all()
    # comm kernels of one rank never overlap each other here, so per-kernel sums equal the unions
    per = ck.group_by("rank").agg(pl.col("overlapped_by_compute_ns").sum().alias("o")).sort("rank")
    assert per["o"].to_list() == ov.sort("rank")["comm_overlapped_ns"].to_list()
    assert set(ck["collective"]) == {"all_reduce", "all_gather", "reduce_scatter", "send", "recv"}


def test_time_breakdown_adds_up_to_span(con):
    tb = analysis.run_query(con, "time_breakdown_by_rank")
    ov = analysis.run_query(con, "overlap_by_rank")
    for r in ov.iter_rows(named=True):
        part = tb.filter(tb["rank"] == r["rank"])
        assert part["time_ns"].sum() == r["span_ns"]
        assert part["span_pct"].sum() == pytest.approx(100.0)
        both = part.filter(part["category"] == "computation overlapping communication")["time_ns"].sum()
        assert both == r["comm_overlapped_ns"]


def test_overlap_by_step(con, run):
    st_df = analysis.run_query(con, "overlap_by_step")
    assert st_df.height == 4 * 2
    assert sorted(set(st_df["step_name"])) == ["ProfilerStep#100", "ProfilerStep#101"]
    ov = analysis.run_query(con, "overlap_by_rank")
    # the synthetic steps contain all GPU work, so steps add up to the rank totals
    agg = st_df.group_by("rank").agg(pl.col("comm_ns").sum(), pl.col("comm_overlapped_ns").sum()).sort("rank")
    assert agg["comm_ns"].to_list() == ov.sort("rank")["comm_ns"].to_list()
    assert agg["comm_overlapped_ns"].to_list() == ov.sort("rank")["comm_overlapped_ns"].to_list()


def test_no_steps_gives_no_rows():
    c = synth_db.build(syn.make_run(world_size=2, steps=1), steps=False)
    assert analysis.run_query(c, "overlap_by_step").height == 0
    assert "no_steps" in analysis.run_query(c, "diagnostics")["code"].to_list()


def test_msg_size_histogram(con, run):
    h = analysis.run_query(con, "msg_size_histogram")
    ar = h.filter(h["collective"] == "all_reduce").sort("bucket_lo_bytes")
    # 8 Mi bf16 elements = 16 MiB; 256 float = 1 KiB; 2 steps x 4 ranks each
    assert ar["bucket_lo_bytes"].to_list() == [1024, 16 * 1024 * 1024]
    assert ar["ops"].to_list() == [8, 8]
    assert ar["total_bytes"].to_list() == [8 * 1024, 8 * 16 * 1024 * 1024]
    assert ar["time_share_pct"].sum() == pytest.approx(100.0)
    ag = h.filter(h["collective"] == "all_gather")
    assert ag["total_bytes"].to_list() == [8 * 2 * 1024 * 1024 * 4]  # gathered output: in x world_size


def test_collective_bandwidth(con):
    op = analysis.run_query(con, "collective_bandwidth_by_op")
    r = op.filter(op["collective"] == "all_reduce").row(0, named=True)
    # kernel duration includes waiting: the *_incl_wait figures; the headline ones divide by the matched transfer
    assert r["algbw_incl_wait_gbps"] == pytest.approx(r["msg_bytes"] / r["duration_ns"])
    assert r["busbw_incl_wait_gbps"] == pytest.approx(r["algbw_incl_wait_gbps"] * 2 * 3 / 4)
    assert r["algbw_gbps"] == pytest.approx(r["msg_bytes"] / r["transfer_ns"])
    assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 3 / 4)
    bw = analysis.run_query(con, "collective_bandwidth")
    rs = bw.filter(bw["collective"] == "reduce_scatter").row(0, named=True)
    assert rs["busbw_gbps"] == pytest.approx(rs["algbw_gbps"] * 3 / 4)
    assert rs["busbw_incl_wait_gbps"] == pytest.approx(rs["algbw_incl_wait_gbps"] * 3 / 4)


def test_p2p_latency_by_size(con):
    by = analysis.run_query(con, "p2p_latency_by_size")
    assert set(by["collective"]) == {"send", "recv"}
    s = by.filter(by["collective"] == "send").sort("bucket_lo_bytes")
    assert s["bucket_lo_bytes"].to_list() == syn.P2P_SIZES
    assert s["min_ns"].to_list() == [syn.p2p_duration_ns(b) for b in syn.P2P_SIZES]
    # the α-β model of matched p2p transfer (latency_model) replaced the duration fit: see tests/test_latency.py
    m = analysis.run_query(con, "latency_model").filter(pl.col("collective") == "p2p").row(0, named=True)
    assert m["instances"] == 2 * 4 * len(syn.P2P_SIZES)  # 2 steps x 4 ring pairs
    assert m["beta_gbps"] == pytest.approx(syn.BETA_GBPS, rel=0.10)


def test_collective_skew_and_rank_wait(con):
    sk = analysis.run_query(con, "collective_skew")
    assert set(sk["match_rule"]) == {"pg_seq"}
    assert sk.height == 4 * 2  # 4 collectives x 2 steps; p2p not matched under pg_seq
    assert (sk["ranks_seen"] == 4).all()
    assert (sk["start_skew_ns"] == 15 * US).all()
    assert (sk["end_skew_ns"] == 0).all()
    assert (sk["last_arriving_rank"] == 3).all()
    assert (sk["first_arriving_rank"] == 0).all()
    assert sk["rank_wait_ns"][0].to_list() == [{"rank": r, "wait_ns": (3 - r) * 5 * US} for r in range(4)]
    rw = analysis.run_query(con, "rank_wait")
    assert rw["rank"].to_list() == [3, 2, 1, 0]
    assert rw["straggler_rank_order"].to_list() == [1, 2, 3, 4]
    assert rw["total_wait_ns"].to_list() == [0, 8 * 5 * US, 8 * 10 * US, 8 * 15 * US]
    assert rw["times_arrived_last"].to_list() == [8, 0, 0, 0]


def test_skew_rank_order_without_metadata():
    c = synth_db.build(syn.make_run(world_size=3, steps=1), comm_ops=False)
    sk = analysis.run_query(c, "collective_skew")
    assert set(sk["match_rule"]) == {"rank_order"}
    assert sk.height == 4 + 2 * len(syn.P2P_SIZES)
    assert analysis.run_query(c, "rank_wait")["rank"][0] == 2
    d = analysis.run_query(c, "diagnostics")
    assert "skew_match_rule" in d["code"].to_list()


def test_hta_compat_on_synthetic(con, run):
    # ncclDevKernel_* matches HTA 0.5.0's '^nccl.*Kernel', so HTA mode sees the same comm kernels, but only in the
    # first of the two steps (last step dropped), with ends floored to whole µs.
    hta = analysis.run_query(con, "overlap_by_rank", {"compat": "hta"}).sort("rank")
    step1 = analysis.run_query(con, "overlap_by_step").filter(pl.col("step_ord") == 1).sort("rank")
    per_step_kernels = len(run.ranks[0].comm) // 2
    for h, s in zip(hta.iter_rows(named=True), step1.iter_rows(named=True), strict=False):
        assert s["comm_ns"] - per_step_kernels * US < h["comm_ns"] <= s["comm_ns"]
        assert h["comm_ns"] % US == 0
        assert h["comm_overlap_pct"] == round(h["comm_overlap_pct"], 2)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_empty_db_every_object_runs():
    c = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    for obj in catalog.public_queries():
        if obj.area in ("intervals", "diff"):  # helpers over tables named by the caller
            continue
        df = analysis.run_query(c, obj.name)
        if obj.name == "diagnostics":
            assert df["code"].to_list() == ["no_traces"]
        elif obj.area == "meta":  # describes the schema itself, which an empty job has too
            assert "kernels" in df["object"].to_list()
        elif obj.name in ("device_link_peaks", "gemm_device_table"):  # documented peak tables: reference data
            assert df.height > 0
        elif obj.name == "gemm_overview":  # the job's row: every figure NULL, with its reason
            assert df.height == 1 and df["gemm_kernels"][0] == 0
            figures = [c for c in df.columns if c.endswith(("_pct", "_ns", "_tflops")) and c != "low_pct"]
            assert all(df[c][0] is None for c in figures)
        else:
            assert df.height == 0, obj.name


@pytest.mark.slow  # tier: slow (every catalog query twice, ~40 CPU-s on the synthetic job; CI runs it)
@pytest.mark.parametrize("job", ["synthetic", "empty"])
def test_rows_frame_equals_duckdb_polars_conversion(con, job):
    """run_query's rows travel through the Arrow C stream (analysis.rows_frame), not DuckDB's .pl(): the frames
    must be the same, schemas included, for every catalog query (a column type that polars reads differently from
    the stream fails here)."""
    if job == "empty":
        con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    checked = 0
    with snapshotted(con):  # each sweep computed once, not once per query (the conversion is under test)
        for obj in catalog.public_queries():
            if obj.area == "intervals" or obj.required_params:
                continue
            sql = f"SELECT * FROM {obj.name}" + ("()" if obj.kind == "macro" else "")
            want, got = con.sql(sql).pl(), analysis.rows_frame(con.sql(sql))
            assert got.schema == want.schema, obj.name
            assert got.equals(want, null_equal=True), obj.name
            checked += 1
    assert checked >= 30


def test_run_query_validation(con):
    with pytest.raises(UsageError):
        analysis.run_query(con, "kernels")
    with pytest.raises(UsageError):
        analysis.run_query(con, "overlap_by_rank; DROP TABLE kernels")
    with pytest.raises(UsageError):
        analysis.run_query(con, "overlap_by_rank", {"bogus": 1})
    # a value that is not one of the documented choices is refused before any SQL runs; values are bound anyway
    with pytest.raises(UsageError, match="compat"):
        analysis.run_query(con, "overlap_by_rank", {"compat": "'; DROP TABLE kernels; --"})
    assert con.execute("SELECT count(*) FROM kernels").fetchall()[0][0] > 0
    assert analysis.run_query(con, "overlap_by_rank", {"compat": "hta"}).height == 4


def test_materialize_gives_same_results(con):
    before = analysis.run_query(con, "overlap_by_rank")
    cache.materialize(con)
    try:
        assert analysis.run_query(con, "overlap_by_rank").equals(before)
        assert analysis.run_query(con, "overlap_by_step").height == 8
    finally:
        cache.unmaterialize(con)
    assert analysis.run_query(con, "overlap_by_rank").equals(before)


k_strat = st.lists(st.tuples(st.sampled_from(["ncclDevKernel_AllReduce", "nvjet_gemm", "elementwise", "Memcpy DtoD"]),
                             st.integers(0, 50), st.integers(0, 20)), max_size=30)


@pytest.mark.slow  # tier: slow (brute force over generated cases; CI runs it)
@settings(max_examples=40, deadline=None)
@given(ks=k_strat)
def test_sweep_property(ks):
    c = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    c.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source) VALUES (1, 'x', 'x', 0, 'kineto')")
    c.execute("INSERT INTO ranks VALUES (0, 1, NULL, NULL, 1, 'cli')")
    for i, (n, s, d) in enumerate(ks):  # kernel_class by the catalog's macro, bound once per name (synth_db.classify)
        c.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, start_ns, end_ns, name, short_name, "
                  "kernel_class) VALUES (?, 1, 0, 0, ?, ?, ?, ?, ?)", [i, s, s + d, n, n, synth_db.classify(c, n)[1]])
    cls = {"ncclDevKernel_AllReduce": "comm", "nvjet_gemm": "gemm", "elementwise": "comp", "Memcpy DtoD": "mem"}
    sets = {k: set() for k in cls.values()}
    for n, s, d in ks:
        sets[cls[n]].update(range(s, s + d))
    comp = sets["gemm"] | sets["comp"]
    row = analysis.run_query(c, "overlap_by_rank").row(0, named=True)
    assert row["comm_ns"] == len(sets["comm"])
    assert row["comm_overlapped_ns"] == len(sets["comm"] & comp)
    assert row["gemm_overlapped_ns"] == len(sets["comm"] & sets["gemm"])
    assert row["busy_ns"] == len(sets["comm"] | comp | sets["mem"])
    tb = analysis.run_query(c, "time_breakdown_by_rank")
    if ks:
        assert tb["time_ns"].sum() == row["span_ns"]


# several ranks, each with its own kernels and (on some ranks) sequential steps: the sweep runs over every rank at
# once, so a rank's state and step must never carry over from the rank sorted before it
rank_strat = st.lists(
    st.tuples(k_strat, st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), max_size=3)),
    min_size=1, max_size=3)


@pytest.mark.slow  # tier: slow (brute force over generated cases; CI runs it)
@settings(max_examples=30, deadline=None)
@given(ranks=rank_strat)
def test_timeline_sweep_per_rank_and_step_property(ranks):
    """Tier 2: _overlap_gpu_timeline's time per state, per rank and per step, equals a per-ns brute force."""
    c = catalog_db()
    c.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source) VALUES (1, 'x', 'x', 0, 'kineto')")
    bit = {"ncclDevKernel_AllReduce": 1, "nvjet_gemm": 2, "elementwise": 4, "Memcpy DtoD": 8}
    want: dict[tuple, int] = {}
    kid = rid = 0
    for r, (ks, gaps) in enumerate(ranks):
        c.execute("INSERT INTO ranks VALUES (?, 1, NULL, NULL, ?, 'cli')", [r, len(ranks)])
        state: dict[int, int] = {}
        for n, s, d in ks:
            c.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, start_ns, end_ns, name, short_name, "
                      "kernel_class) VALUES (?, 1, ?, 0, ?, ?, ?, ?, ?)",
                      [kid, r, s, s + d, n, n, synth_db.classify(c, n)[1]])
            kid += 1
            for t in range(s, s + d):
                state[t] = state.get(t, 0) | bit[n]
        t0 = 0
        for ordinal, (gap, length) in enumerate(gaps, start=1):  # sequential steps: [t0 + gap, t0 + gap + length)
            lo, hi = t0 + gap, t0 + gap + length
            c.execute("INSERT INTO cpu_ranges (range_id, file_id, rank, start_ns, end_ns, name, kind) "
                      "VALUES (?, 1, ?, ?, ?, ?, 'user_annotation')", [rid, r, lo, hi, f"ProfilerStep#{ordinal}"])
            rid += 1
            for t in range(lo, hi):
                if state.get(t):
                    want[(r, ordinal, state[t])] = want.get((r, ordinal, state[t]), 0) + 1
            t0 = hi
        for st_ in state.values():
            want[(r, None, st_)] = want.get((r, None, st_), 0) + 1
    got = {(r, s, state): dur for r, s, state, dur in c.execute(
        "SELECT rank, step_ord, state, dur_ns FROM _overlap_gpu_timeline WHERE state >= 0 AND dur_ns <> 0").fetchall()}
    assert got == want
