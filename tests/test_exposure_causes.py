"""exposed_comm_causes / exposed_comm_by_kernel: synthetic jobs with one known cause each, then mixed.

Jobs are written straight into the canonical tables (times in µs, stored as ns). Every case states the exact
attribution; the sums must equal comm_kernels.exposed_ns.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

from fixtures import synthetic as syn

US = 1000
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float*)"
COMM_STREAM, COMPUTE_STREAM = 20, 7


class Job:
    """A tiny job: kernels with their launch calls, and comm_ops rows for the communication kernels."""

    def __init__(self, ranks: int = 2):
        self.con = synth_db.empty_job(ranks)
        self.kid = 0

    def kernel(self, rank: int, name: str, start_us: float, end_us: float, *, stream: int = COMPUTE_STREAM,
               launch_us: tuple[float, float] | None = None, collective: str | None = None, pg: str = "0",
               seq: int | None = None) -> int:
        self.kid += 1
        k = self.kid
        launch = None if launch_us is None else (int(launch_us[0] * US), int(launch_us[1] * US))
        synth_db.add_kernel(self.con, k, rank, name, int(start_us * US), int(end_us * US), stream, launch)
        if collective is not None:
            self.con.execute("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, group_size, "
                             "pg_name, seq, n_ops, collective_source) VALUES (?, 1, ?, ?, 1048576, 2, ?, ?, 1, 'test')",
                             [k, rank, collective, pg, seq])
        return k

    def comm(self, rank: int, start_us: float, end_us: float, seq: int, **kw) -> int:
        kw.setdefault("stream", COMM_STREAM)
        kw.setdefault("collective", "all_reduce")
        return self.kernel(rank, ALL_REDUCE if kw["collective"] == "all_reduce" else ALL_GATHER, start_us, end_us,
                           seq=seq, **kw)

    def causes(self, **params) -> dict[tuple[int, str], int]:
        args = ", ".join(f"{k} := {v}" for k, v in params.items())
        rows = self.con.execute(f"SELECT kernel_id, cause, exposed_ns FROM exposed_comm_by_kernel({args})").fetchall()
        return {(k, c): ns // US for k, c, ns in rows}

    def check_sums(self) -> None:
        by_rank = self.con.execute("""
            SELECT c.rank, c.exposed_ns, coalesce(a.exposed_ns, 0)
            FROM (SELECT rank, sum(exposed_ns) AS exposed_ns FROM comm_kernels() GROUP BY rank) c
            LEFT JOIN (SELECT rank, sum(exposed_ns) AS exposed_ns FROM exposed_comm_causes() GROUP BY rank) a
              USING (rank)""").fetchall()
        assert by_rank and all(c == a for _, c, a in by_rank), by_rank


def test_shared_stream():
    j = Job()
    expected = {}
    for r in range(2):
        j.kernel(r, GEMM, 0, 100, stream=7, launch_us=(0, 1))
        k = j.comm(r, 100 + 10 * r, 200, seq=1, stream=7, launch_us=(1, 2))  # rank 0 waits 10 µs for rank 1
        j.kernel(r, GEMM, 200, 300, stream=7, launch_us=(2, 3))
        if r == 0:
            expected[(k, "arrival_skew")] = 10  # arrival skew first, even on the serialised stream
        expected[(k, "serialised_stream")] = 100 - 10 * r - (10 if r == 0 else 0)
    assert j.causes() == expected
    j.check_sums()


def test_serialised_stream_with_a_late_peer_shows_the_waiting():
    """NCCL on the compute stream, rank 1 late by 60 % of the collective: the wait is arrival_skew, not hidden in
    serialised_stream, and the late rank is named."""
    j = Job()
    ks = {}
    for r in range(2):
        j.kernel(r, GEMM, 0, 100, stream=COMPUTE_STREAM, launch_us=(0, 1))
        ks[r] = j.comm(r, 100 + 60 * r, 200, seq=1, stream=COMPUTE_STREAM, launch_us=(1, 2))
        j.kernel(r, GEMM, 200, 300, stream=COMPUTE_STREAM, launch_us=(2, 3))
    assert j.causes() == {(ks[0], "arrival_skew"): 60, (ks[0], "serialised_stream"): 40,
                          (ks[1], "serialised_stream"): 40}
    rows = j.con.execute("SELECT rank, cause, exposed_ns, late_rank, late_ranks_visible FROM exposed_comm_causes() "
                         "ORDER BY rank, cause").fetchall()
    assert rows == [(0, "arrival_skew", 60 * US, 1, True), (0, "serialised_stream", 40 * US, None, True),
                    (1, "serialised_stream", 40 * US, None, True)]
    ev = j.con.execute("SELECT stream_compute_kernels FROM exposed_comm_by_kernel() WHERE cause = 'arrival_skew'")
    assert ev.fetchall() == [(2,)]  # the serialised-stream evidence stays on the arrival_skew row
    j.check_sums()


def test_single_rank_caveat():
    """One rank: no other rank's start is seen, so arrival skew cannot be told apart: the rows say so."""
    j = Job(ranks=1)
    j.kernel(0, GEMM, 0, 100, launch_us=(0, 1))
    k = j.comm(0, 100, 200, seq=1, launch_us=(50, 51))
    j.kernel(0, GEMM, 205, 300, launch_us=(60, 61))
    assert j.causes() == {(k, "dependency_wait"): 100}
    vis = j.con.execute("SELECT DISTINCT late_ranks_visible FROM exposed_comm_causes()").fetchall()
    assert vis == [(False,)]


def test_launch_gap_is_nothing_to_overlap():
    j = Job(ranks=1)
    j.kernel(0, GEMM, 0, 100, launch_us=(0, 1))
    k = j.comm(0, 100, 200, seq=1, launch_us=(50, 51))
    j.kernel(0, GEMM, 300, 400, launch_us=(250, 260))  # launched after the collective ended
    assert j.causes() == {(k, "nothing_to_overlap"): 100}
    j.check_sums()


def test_no_compute_after_is_nothing_to_overlap():
    j = Job(ranks=1)
    k = j.comm(0, 100, 200, seq=1, launch_us=(50, 51))
    assert j.causes() == {(k, "nothing_to_overlap"): 100}


def test_dependency_wait():
    j = Job(ranks=1)
    j.kernel(0, GEMM, 0, 100, launch_us=(0, 1))
    k = j.comm(0, 100, 200, seq=1, launch_us=(50, 51))
    nxt = j.kernel(0, GEMM, 205, 300, launch_us=(60, 61))  # queued long before, starts 5 µs after the end
    assert j.causes() == {(k, "dependency_wait"): 100}
    row = j.con.execute("SELECT next_compute_kernel_id, next_compute_gap_ns FROM exposed_comm_by_kernel()").fetchall()
    assert row == [(nxt, 5 * US)]
    # the tolerance is a parameter: 4 µs is too tight for a 5 µs gap; queued in time, so not 'nothing to overlap'
    assert j.causes(right_after_ns=4 * US) == {(k, "unattributed"): 100}


def test_dependency_wait_without_launch_information():
    j = Job(ranks=1)
    k = j.comm(0, 100, 200, seq=1)
    j.kernel(0, GEMM, 203, 300)
    assert j.causes() == {(k, "dependency_wait"): 100}
    j2 = Job(ranks=1)
    k2 = j2.comm(0, 100, 200, seq=1)
    j2.kernel(0, GEMM, 260, 300)
    assert j2.causes() == {(k2, "nothing_to_overlap"): 100}


def test_late_rank_is_arrival_skew_then_the_rest():
    j = Job()
    k0 = j.comm(0, 100, 200, seq=1, launch_us=(90, 91))
    k1 = j.comm(1, 160, 200, seq=1, launch_us=(150, 151))  # rank 1 arrives 60 µs late
    for r in range(2):
        j.kernel(r, GEMM, 400, 500, launch_us=(350, 351))  # launched after the end: nothing to overlap
    assert j.causes() == {(k0, "arrival_skew"): 60, (k0, "nothing_to_overlap"): 40, (k1, "nothing_to_overlap"): 40}
    late = j.con.execute("SELECT rank, late_rank FROM exposed_comm_causes() WHERE cause = 'arrival_skew'").fetchall()
    assert late == [(0, 1)]
    j.check_sums()


def test_arrival_skew_counts_only_the_exposed_part_of_the_wait():
    j = Job()
    k0 = j.comm(0, 100, 200, seq=1, launch_us=(90, 91))
    j.comm(1, 160, 200, seq=1, launch_us=(150, 151))
    j.kernel(0, GEMM, 90, 130, launch_us=(80, 81))  # computation hides the first 30 µs of rank 0's 60 µs wait
    causes = j.causes()
    assert causes[(k0, "arrival_skew")] == 30
    assert causes[(k0, "nothing_to_overlap")] == 40
    j.check_sums()


def test_two_collectives_on_one_communicator():
    j = Job(ranks=1)
    ag = j.comm(0, 100, 200, seq=1, collective="all_gather", pg="fsdp", launch_us=(50, 51))
    rs = j.comm(0, 201, 300, seq=2, collective="all_gather", pg="fsdp", launch_us=(60, 61))  # queued behind ag
    j.kernel(0, GEMM, 400, 500, launch_us=(350, 351))
    assert j.causes() == {(ag, "nothing_to_overlap"): 100, (rs, "serialised_communicators"): 99}
    row = j.con.execute("SELECT queued_behind_kernel_id, queued_gap_ns FROM exposed_comm_by_kernel() "
                        "WHERE kernel_id = ?", [rs]).fetchall()
    assert row == [(ag, 1 * US)]


def test_same_communicator_on_another_stream_is_serialised_too():
    j = Job(ranks=1)
    a = j.comm(0, 100, 200, seq=1, pg="tp", stream=20, launch_us=(50, 51))
    b = j.comm(0, 202, 300, seq=2, pg="tp", stream=21, launch_us=(60, 61))
    assert j.causes() == {(a, "nothing_to_overlap"): 100, (b, "serialised_communicators"): 98}


def test_launched_after_the_previous_ended_is_not_queued():
    j = Job(ranks=1)
    a = j.comm(0, 100, 200, seq=1, launch_us=(50, 51))
    b = j.comm(0, 205, 300, seq=2, launch_us=(201, 202))  # its launch began after a ended: a launch gap
    assert j.causes() == {(a, "nothing_to_overlap"): 100, (b, "nothing_to_overlap"): 95}


def test_mixed_job_exact_and_steps():
    j = Job()
    j.con.execute("INSERT INTO cpu_ranges (range_id, file_id, rank, pid, tid, start_ns, end_ns, name, kind) VALUES "
                  "(1, 1, 0, 100, 1, 0, 1000000, 'ProfilerStep#5', 'user_annotation'), "
                  "(2, 1, 1, 101, 1, 0, 1000000, 'ProfilerStep#5', 'user_annotation')")
    expected = {}
    for r in range(2):
        # step 1: shared stream on rank 0 only
        if r == 0:
            j.kernel(r, GEMM, 0, 50, stream=7, launch_us=(0, 1))
            k = j.comm(r, 50, 100, seq=1, stream=7, launch_us=(1, 2))
            expected[(k, "serialised_stream")] = 50
        else:
            j.kernel(r, GEMM, 0, 50, launch_us=(0, 1))
            k = j.comm(r, 50, 100, seq=1, launch_us=(1, 2))
            j.kernel(r, ELEMENTWISE, 102, 110, launch_us=(3, 4))  # queued, starts 2 µs after: dependency wait
            expected[(k, "dependency_wait")] = 50
        # a late rank 1 on the second collective, then a launch gap
        start = 200 if r == 0 else 230
        k2 = j.comm(r, start, 300, seq=2, launch_us=(start - 10, start - 9))
        if r == 0:
            expected[(k2, "arrival_skew")] = 30
        expected[(k2, "nothing_to_overlap")] = 70
        j.kernel(r, GEMM, 500, 600, launch_us=(450, 451))
    assert j.causes() == expected
    j.check_sums()
    rows = j.con.execute("SELECT rank, step_ord, collective, cause, exposed_ns, share_pct FROM exposed_comm_causes() "
                         "ORDER BY rank, cause").fetchall()
    assert rows == [(0, 1, "all_reduce", "arrival_skew", 30 * US, pytest.approx(100 * 30 / 150)),
                    (0, 1, "all_reduce", "nothing_to_overlap", 70 * US, pytest.approx(100 * 70 / 150)),
                    (0, 1, "all_reduce", "serialised_stream", 50 * US, pytest.approx(100 * 50 / 150)),
                    (1, 1, "all_reduce", "dependency_wait", 50 * US, pytest.approx(100 * 50 / 120)),
                    (1, 1, "all_reduce", "nothing_to_overlap", 70 * US, pytest.approx(100 * 70 / 120))]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("run", [syn.make_run(), syn.make_run(world_size=8, steps=3, era="old", seed=3),
                                 syn.make_latency_run()], ids=["default", "old-8ranks", "latency"])
def test_synthetic_runs_are_fully_attributed(run):
    con = synth_db.build(run)
    total = con.execute("SELECT sum(exposed_ns) FROM comm_kernels()").fetchone()[0]
    causes = dict(con.execute("SELECT cause, sum(exposed_ns) FROM exposed_comm_causes() GROUP BY cause").fetchall())
    assert total > 0 and sum(causes.values()) == total
    assert causes.get("unattributed", 0) == 0


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@settings(max_examples=examples(20), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30), st.booleans()), min_size=1, max_size=12),
       st.integers(0, 40))
def test_per_rank_sums_equal_exposed_time(kernels, late_us):
    """Random communication and computation kernels on two ranks: causes always add up to exposed_ns."""
    j = Job()
    for i, (start, length, is_comm) in enumerate(kernels):
        for r in range(2):
            s = start * 10 + (late_us if r == 1 else 0)
            if is_comm:
                j.comm(r, s, s + length * 10, seq=i, launch_us=(max(s - 5, 0), max(s - 4, 0)))
            else:
                j.kernel(r, GEMM, s, s + length * 10, launch_us=(max(s - 20, 0), max(s - 19, 0)))
    if j.con.execute("SELECT count(*) FROM comm_kernels()").fetchone()[0]:
        j.check_sums()


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@settings(max_examples=examples(20), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 20), st.integers(0, 25)), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60), st.integers(1, 25)), max_size=10))
def test_skew_window_coverage_equals_brute_force(colls, compute):
    """skew_exposed_ns (the exposed part of each kernel's wait window [start, start + min(wait, duration))) against
    a count over every µs, for computation under none, part or all of the kernel and waits shorter or longer than it:
    the window is looked up only where neither the kernel's own overlap nor its length already tells. Kernels with
    no exposed time have no evidence row."""
    j = Job()
    for i, (start, length, late) in enumerate(colls):
        for r in range(2):
            s = start * 3 + (late if r == 1 else 0)
            j.comm(r, s, s + length, seq=i)
    for r, s, length in compute:
        j.kernel(r, GEMM, s, s + length)
    busy = {r: {t for r2, s, length in compute if r2 == r for t in range(s, s + length)} for r in range(2)}
    got = dict(j.con.execute("SELECT kernel_id, skew_exposed_ns FROM _exposure_kernel_evidence").fetchall())
    kernels = j.con.execute("SELECT c.kernel_id, c.rank, c.start_ns, c.end_ns, w.wait_ns FROM comm_kernels() c "
                            "LEFT JOIN _skew_kernel_waits w USING (kernel_id)").fetchall()
    assert len(kernels) == 2 * len(colls)
    for k, rank, start, end, wait in kernels:
        s, e = start // US, end // US
        if all(t in busy[rank] for t in range(s, e)):
            assert k not in got
            continue
        window = range(s, s + min(wait // US, e - s)) if wait else range(0)
        assert got[k] == sum(US for t in window if t not in busy[rank]), (rank, s, e, wait, got[k])


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_summary_exposed_by_cause():
    from nsys2comm.summary import build_summary

    con = synth_db.build(syn.make_run())
    s = build_summary(con)
    by = s["exposed_by_cause"]
    want = con.execute("SELECT cause, sum(exposed_ns) FROM exposed_comm_by_kernel() GROUP BY cause "
                       "ORDER BY 2 DESC, 1").fetchall()
    assert [(c["cause"], c["exposed_ns"]) for c in by] == [(c, int(n)) for c, n in want]
    assert sum(c["share_pct"] for c in by) == pytest.approx(100, abs=1e-3)


def test_summary_exposed_by_cause_not_available_without_communication():
    from nsys2comm.summary import build_summary

    j = Job(ranks=1)
    j.kernel(0, GEMM, 0, 100)
    s = build_summary(j.con)
    assert s["exposed_by_cause"] is None
    assert any(m.startswith("exposed_by_cause: not available (the job has no communication kernels)")
               for m in s["missing"])


def test_cause_finding_names_the_biggest_cause_first_and_the_late_rank():
    import polars as pl

    from nsys2comm.report.findings import exposed_cause_findings

    df = pl.DataFrame({
        "rank": [0, 1, 0, 1, 0], "collective": ["all_to_all"] * 4 + ["all_reduce"],
        "cause": ["arrival_skew", "arrival_skew", "dependency_wait", "nothing_to_overlap", "dependency_wait"],
        "exposed_ns": [40_000_000, 22_000_000, 30_000_000, 8_000_000, 100],
        "late_rank": [7, 3, None, None, None]})
    (f,) = exposed_cause_findings(df)  # all_reduce: 100 ns of 100 ms is below MIN_SHARE_PCT
    assert f.text == ("62% of exposed all_to_all time (100 ms) is arrival skew (rank 7 late), 30% is dependency "
                      "wait, 8% is nothing to overlap.")
    assert f.anchor == "sec-causes" and f.level == "warning"


def test_dependency_wait_on_a_later_collective():
    """Computation queued early waits for a second collective that ends after this one: still a dependency wait."""
    j = Job(ranks=1)
    ag = j.comm(0, 100, 200, seq=1, pg="fsdp", stream=21, launch_us=(50, 51))
    ar = j.comm(0, 150, 260, seq=1, pg="tp", stream=20, launch_us=(55, 56))
    nxt = j.kernel(0, GEMM, 263, 300, launch_us=(60, 61))
    assert j.causes() == {(ag, "dependency_wait"): 100, (ar, "dependency_wait"): 110}
    rows = j.con.execute("SELECT kernel_id, waited_for_kernel_id, next_compute_kernel_id FROM "
                         "exposed_comm_by_kernel() ORDER BY kernel_id").fetchall()
    assert rows == [(ag, ar, nxt), (ar, ar, nxt)]


def test_tensor_parallel_layers_are_fully_attributed(tmp_path):
    """The TP layers of fixtures/synthetic_tp (through the Kineto importer): every exposed ns has a cause."""
    from fixtures import synthetic_tp as tpm
    from nsys2comm import Job as NJob

    job = NJob.ingest(tpm.write_tp_kineto(tpm.make_tp_run(world_size=2, steps=2), tmp_path), db=None, jobs=1)
    total = job.sql("SELECT sum(exposed_ns) AS n FROM comm_kernels()")["n"][0]
    causes = dict(job.sql("SELECT cause, sum(exposed_ns) AS n FROM exposed_comm_causes() GROUP BY cause").iter_rows())
    assert total > 0 and sum(causes.values()) == total
    assert causes.get("unattributed", 0) == 0 and causes["dependency_wait"] > 0


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_summary_contention_and_t3_headroom(tmp_path):
    from fixtures import synthetic_tp as tpm
    from nsys2comm import Job as NJob

    job = NJob.ingest(tpm.write_tp_kineto(tpm.make_tp_run(world_size=2, steps=4), tmp_path), db=None, jobs=1)
    s = job.summary()
    assert s["gemm_contention"]["slowdown_pct"] == pytest.approx(25.0)  # the fixture's 100 -> 125 µs GEMMs
    assert s["gemm_contention"]["measured_groups"] == 1
    pairs = job.sql("SELECT count(*) AS n, sum(headroom_ns) AS h FROM serialised_pairs()")
    assert s["serialised_pairs"] == {"pairs": pairs["n"][0], "headroom_ns": int(pairs["h"][0])}


def test_summary_contention_not_available_on_a_short_trace():
    from nsys2comm.summary import build_summary

    s = build_summary(synth_db.build(syn.make_run(world_size=2, steps=1)))
    assert s["gemm_contention"] is None
    assert any(m.startswith("gemm_contention: not available") for m in s["missing"])
