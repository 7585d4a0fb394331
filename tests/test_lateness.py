"""late_arrival_causes: why the last rank arrived late, on synthetic jobs with one known cause each.

Tier 2: jobs written straight into the canonical tables (times in µs, stored as ns), each with its attribution
worked out by hand in the test; a hypothesis property test that the parts add up to the segment and the shares to
lateness_ns on random jobs. Tier 4: the bundled 8-rank example (fixtures/example): rank 7's lateness at the first
all_to_all is host-bound, recomputed from the JSON (gzip + json).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

US = 1000
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
EXAMPLE = Path(__file__).parent.parent / "fixtures" / "example"
SHARES = ("host_share_ns", "gpu_compute_share_ns", "queued_share_ns", "earlier_comm_share_ns", "carried_ns")


class Job:
    def __init__(self, ranks: int = 2):
        self.con = synth_db.empty_job(ranks)
        self.kid = 0

    def kernel(self, rank, name, start_us, end_us, launch_us=None, *, stream=7, collective=None, pg="0", seq=None):
        self.kid += 1
        k = self.kid
        launch = None if launch_us is None else (int(launch_us * US), int((launch_us + 1) * US))
        synth_db.add_kernel(self.con, k, rank, name, int(start_us * US), int(end_us * US), stream, launch)
        if collective:
            self.con.execute("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, group_size, "
                             "pg_name, seq, n_ops, collective_source) VALUES (?, 1, ?, ?, 1048576, 2, ?, ?, 1, 'test')",
                             [k, rank, collective, pg, seq])

    def cpu(self, rank, name, start_us, end_us, kind="user_annotation"):
        self.kid += 1
        self.con.execute("INSERT INTO cpu_ranges (range_id, file_id, rank, pid, tid, start_ns, end_ns, name, kind) "
                         "VALUES (?, 1, ?, ?, 1, ?, ?, ?, ?)",
                         [self.kid, rank, 100 + rank, int(start_us * US), int(end_us * US), name, kind])

    def rows(self):
        cur = self.con.execute("SELECT * FROM late_arrival_causes() ORDER BY first_start_ns")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _base(job: Job, late_rank_body) -> None:
    """Both ranks end all_reduce #1 at 200 µs. Rank 0 (the earliest) then runs a 50 µs GEMM [210, 260), launched at
    205 (ends 206), and arrives at all_reduce #2 at 270 (launched 262): host-bound idle 10 + 10, compute 50.
    ``late_rank_body`` lays out rank 1's segment."""
    for r in (0, 1):
        job.kernel(r, AR, 100, 200, 90, stream=20, collective="all_reduce", seq=1)
    job.kernel(0, GEMM, 210, 260, 205)
    job.kernel(0, AR, 270, 300 + 200, 262, stream=20, collective="all_reduce", seq=2)
    late_rank_body(job)


def _second(job):
    rows = job.rows()
    assert len(rows) == 2 and rows[0]["lateness_ns"] == 0 and rows[0]["primary_cause"] is None
    row = rows[1]
    assert (row["late_rank"], row["early_rank"]) == (1, 0)
    assert (row["early_gpu_compute_ns"], row["early_host_bound_ns"], row["early_queued_idle_ns"]) == (
        50 * US, 20 * US, 0)
    assert sum(row[c] for c in SHARES) == row["lateness_ns"]
    return row


def _second_of(body) -> dict:
    """The second all_reduce's causes in the two-rank base job with ``body`` added on rank 1."""
    job = Job()
    _base(job, body)
    return _second(job)


def test_host_launches_late():
    """Rank 1 runs the same GEMM, then its host launches all_reduce #2 at 400 (it starts at 405): GPU idle with
    nothing launched. Lateness 135 = host (10 + 145) − (10 + 10)."""
    def body(job):
        job.kernel(1, GEMM, 210, 260, 205)
        job.kernel(1, AR, 405, 500, 400, stream=20, collective="all_reduce", seq=2)
    row = _second_of(body)
    assert row["lateness_ns"] == 135 * US and row["late_host_bound_ns"] == 155 * US
    assert (row["host_share_ns"], row["gpu_compute_share_ns"], row["queued_share_ns"]) == (135 * US, 0, 0)
    assert row["primary_cause"] == "host" and row["primary_share_pct"] == 100.0


def test_host_ops_by_self_time():
    """The late rank's launching thread in its segment [200, 405): a Python-level op [262, 398) holding an aten::mm
    [270, 300) holding aten::empty [280, 284); two launch calls of 1 µs (205, 400). Self: 106, 26, 4, 2 µs; an op
    on another thread and one after the window are left out."""
    def body(job):
        job.kernel(1, GEMM, 210, 260, 205)
        job.kernel(1, AR, 405, 500, 400, stream=20, collective="all_reduce", seq=2)
        job.cpu(1, "LinearWithGradAccumulationAndAsyncCommunication", 262, 398)
        job.cpu(1, "aten::mm", 270, 300, "cpu_op")
        job.cpu(1, "aten::empty", 280, 284, "cpu_op")
        job.cpu(1, "after", 420, 480)
        job.con.execute("INSERT INTO cpu_ranges (range_id, file_id, rank, pid, tid, start_ns, end_ns, name, kind) "
                        "VALUES (999, 1, 1, 101, 2, 300000, 390000, 'other thread', 'user_annotation')")
    job = Job()
    _base(job, body)
    got = job.con.execute("SELECT instance_key, late_rank, tid, op_name, op_kind, calls, self_ns, op_order "
                          "FROM late_rank_host_ops() ORDER BY op_order").fetchall()
    key = job.rows()[1]["instance_key"]
    assert got == [(key, 1, 1, "LinearWithGradAccumulationAndAsyncCommunication", "user_annotation", 1, 106 * US, 1),
                   (key, 1, 1, "aten::mm", "cpu_op", 1, 26 * US, 2),
                   (key, 1, 1, "aten::empty", "cpu_op", 1, 4 * US, 3),
                   (key, 1, 1, "cudaLaunchKernel", "cuda_api", 2, 2 * US, 4)]


def test_longer_gemm():
    """Rank 1's GEMM takes 150 µs, not 50; all_reduce #2 launched right after it (362) starts at 370."""
    def body(job):
        job.kernel(1, GEMM, 210, 360, 205)
        job.kernel(1, AR, 370, 500, 362, stream=20, collective="all_reduce", seq=2)
    row = _second_of(body)
    assert row["lateness_ns"] == 100 * US
    assert (row["gpu_compute_share_ns"], row["host_share_ns"], row["queued_share_ns"]) == (100 * US, 0, 0)
    assert row["primary_cause"] == "gpu_compute"


def test_queued_on_an_event():
    """Rank 1's GEMM is launched at 205 but waits on an event of another stream until 300; all_reduce #2, launched
    at 262, starts at 360 behind it. Idle [200, 300): host-bound up to launch end + ε = 216 (16), queued 84; idle
    [350, 360) queued 10. Lateness 90 = host (16 − 20) + queued (94 − 0)."""
    def body(job):
        job.kernel(1, GEMM, 300, 350, 205)
        job.kernel(1, AR, 360, 500, 262, stream=20, collective="all_reduce", seq=2)
    row = _second_of(body)
    assert row["lateness_ns"] == 90 * US and row["late_queued_idle_ns"] == 94 * US
    assert (row["host_share_ns"], row["queued_share_ns"], row["gpu_compute_share_ns"]) == (-4 * US, 94 * US, 0)
    assert row["primary_cause"] == "queued"


def test_stuck_in_an_earlier_collective_of_another_group():
    """Rank 1 runs an all_gather of group '1' [262, 400) before all_reduce #2 of group '0' (launched 398, starts
    405). Lateness 135 = earlier_comm 138 + host (10 + 2 + 5 − 20)."""
    def body(job):
        job.kernel(1, GEMM, 210, 260, 205)
        job.kernel(1, AG, 262, 400, 255, stream=21, collective="all_gather", pg="1", seq=1)
        job.kernel(1, AR, 405, 500, 398, stream=20, collective="all_reduce", seq=2)
    row = _second_of(body)
    assert row["lateness_ns"] == 135 * US and row["late_earlier_comm_ns"] == 138 * US
    assert (row["earlier_comm_share_ns"], row["host_share_ns"]) == (138 * US, -3 * US)
    assert row["primary_cause"] == "earlier_comm"


def test_unknown_launch_is_flagged():
    """Without launch calls the idle before a kernel counts as host-bound, and launch_unknown_idle_ns says so."""
    job = Job()
    for r in (0, 1):
        job.kernel(r, AR, 100, 200, collective="all_reduce", seq=1)
    job.kernel(0, AR, 230, 300, collective="all_reduce", seq=2)
    job.kernel(1, AR, 280, 300, collective="all_reduce", seq=2)
    row = job.rows()[1]
    assert row["late_host_bound_ns"] == row["late_launch_unknown_idle_ns"] == 80 * US
    assert row["host_share_ns"] == row["lateness_ns"] == 50 * US


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@settings(max_examples=examples(12), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 400), st.integers(1, 80), st.integers(0, 60),
                          st.booleans()), max_size=14),
       st.lists(st.integers(0, 300), min_size=3, max_size=3))
def test_parts_and_shares_add_up(extra, arrivals):
    """Random kernels (compute or another group's collective, launched up to 60 µs early) around three collectives:
    every segment splits exactly into its four parts, every lateness into its shares."""
    job = Job(3)
    for r in range(3):
        job.kernel(r, AR, 0, 50, 0, stream=20, collective="all_reduce", seq=1)
        job.kernel(r, AR, 500 + arrivals[r], 900, 450 + arrivals[r], stream=20, collective="all_reduce", seq=2)
    for r, start, dur, early, comm in extra:
        job.kernel(r, AG if comm else GEMM, 60 + start, 60 + start + dur, 60 + start - early,
                   stream=21 if comm else 7, collective="all_gather" if comm else None, pg="1", seq=None)
    for row in job.rows():
        for side in ("late", "early"):
            parts = sum(row[f"{side}_{p}"] for p in ("gpu_compute_ns", "host_bound_ns", "queued_idle_ns",
                                                     "earlier_comm_ns"))
            assert parts == row[f"{side}_segment_ns"]
            assert min(row[f"{side}_{p}"] for p in ("gpu_compute_ns", "host_bound_ns", "queued_idle_ns",
                                                    "earlier_comm_ns")) >= 0
        assert sum(row[c] for c in SHARES) == row["lateness_ns"]


# --- tier 4: the bundled example --------------------------------------------------------------------------------


def _rank_json(rank: int) -> dict:
    f = next(EXAMPLE.glob(f"worker{rank}_*.json.gz"))
    with gzip.open(f) as fh:
        return json.loads(fh.read())


def _segment_from_json(rank: int, eps_ns: int = 10_000) -> dict:
    """Rank's first NCCL kernel start, its ProfilerStep start, the union of its other kernels in between and the idle
    time before kernels that started within eps of their launch's end, straight from the JSON (µs → ns)."""
    ev = _rank_json(rank)["traceEvents"]
    ns = lambda x: round(x * 1000)  # noqa: E731
    kernels = sorted((ns(e["ts"]), ns(e["ts"] + e["dur"]), e["name"], e["args"].get("correlation"))
                     for e in ev if e.get("cat") == "kernel")
    launch_end = {e["args"]["correlation"]: ns(e["ts"] + e["dur"]) for e in ev
                  if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    arrival = min(s for s, _, n, _ in kernels if n.startswith("nccl"))
    step = min(ns(e["ts"]) for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    compute = busy = host = 0
    cur_end = step
    for s, e, n, corr in kernels:  # one pass over kernels in start order: union and gaps
        if s >= arrival or e <= step:
            continue
        s2 = max(s, step)
        if s2 > cur_end:  # a gap [cur_end, s2) before this kernel
            h_end = s2 if corr not in launch_end else min(s2, max(cur_end, launch_end[corr] + eps_ns))
            host += h_end - cur_end
        if not n.startswith("nccl"):
            compute += max(0, min(e, arrival) - max(s2, cur_end))
        busy += max(0, min(e, arrival) - max(s2, cur_end))
        cur_end = max(cur_end, min(e, arrival))
    if arrival > cur_end:
        corr = next(c for s, _, n, c in kernels if s == arrival)
        host += min(arrival, max(cur_end, launch_end.get(corr, arrival) + eps_ns)) - cur_end
    return {"arrival": arrival, "step": step, "compute": compute, "host": host}


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="fixtures/example absent")
def test_example_rank7_is_host_bound():
    from nsys2comm.api import Job as ApiJob

    arr = {r: _segment_from_json(r)["arrival"] for r in range(8)}
    early = min(arr, key=lambda r: (arr[r], r))
    assert max(arr, key=lambda r: (arr[r], -r)) == 7 and early == 1
    r7, r1 = _segment_from_json(7), _segment_from_json(1)
    with ApiJob.open(str(EXAMPLE)) as job:
        row = job.query("late_arrival_causes").row(0, named=True)
        summary = job.summary()
    assert (row["late_rank"], row["early_rank"], row["late_segment_from"]) == (7, 1, "iteration_start")
    assert row["lateness_ns"] == arr[7] - arr[1]
    assert row["late_gpu_compute_ns"] == r7["compute"] < 200_000  # ~105 µs of kernels in 3.2 ms
    assert row["late_host_bound_ns"] == r7["host"]
    assert row["host_share_ns"] == (r7["step"] - r1["step"]) + r7["host"] - r1["host"]
    assert row["primary_cause"] == "host" and row["host_share_ns"] > 0.9 * row["lateness_ns"]
    # summary: rank 7 (rank_wait's straggler) arrived last at the k-th NCCL kernel of every rank this many times
    per = []
    for r in range(8):
        ks = sorted(e["ts"] for e in _rank_json(r)["traceEvents"]
                    if e.get("cat") == "kernel" and e["name"].startswith("nccl"))
        per.append(ks)
    last = [max(range(8), key=lambda r: (per[r][k], -r)) for k in range(len(per[0]))]
    assert summary["late_rank_cause"]["rank"] == 7 and summary["late_rank_cause"]["primary_cause"] == "host"
    assert summary["late_rank_cause"]["instances_late"] == last.count(7)


def test_summary_without_straggler_says_why():
    from nsys2comm.summary import build_summary

    job = Job()
    _base(job, lambda j: j.kernel(1, AR, 405, 500, 400, stream=20, collective="all_reduce", seq=2))
    s = build_summary(job.con)
    assert s["late_rank_cause"] is None
    assert any(m.startswith("late_rank_cause: not available (no rank arrives last") for m in s["missing"])


def _rows(job: Job, sql: str) -> list[dict]:
    cur = job.con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# tier 2: the segment starts at the user's iteration marker (the iterations object's marker), by hand
def test_user_marker_starts_the_segment():
    """The host-late job of test_host_launches_late with a user range 'fwd_bwd' per rank: [240, 600) on rank 0,
    [300, 600) on rank 1. With marker := 'fwd_bwd' each segment starts there (after all_reduce #1 ended at 200):
    E [240, 270): compute 20 (its GEMM's tail), host-bound 10; L [300, 405): host-bound 105. Shares: host
    (105 − 10) + the start difference 60 = 155, compute −20: lateness 135. Without the marker the segments start at
    all_reduce #1 as before."""
    def body(job):
        job.kernel(1, GEMM, 210, 260, 205)
        job.kernel(1, AR, 405, 500, 400, stream=20, collective="all_reduce", seq=2)
    job = Job()
    _base(job, body)
    job.cpu(0, "fwd_bwd", 240, 600)
    job.cpu(1, "fwd_bwd", 300, 600)
    plain = job.rows()[1]
    assert (plain["late_segment_from"], plain["late_host_bound_ns"]) == ("previous_collective", 155 * US)
    row = _rows(job, "SELECT * FROM late_arrival_causes(marker := 'fwd_bwd') ORDER BY first_start_ns")[1]
    assert (row["late_segment_from"], row["late_segment_start_ns"], row["late_segment_ns"]) == (
        "iteration_start", 300 * US, 105 * US)
    assert (row["early_segment_from"], row["early_segment_start_ns"]) == ("iteration_start", 240 * US)
    assert (row["early_gpu_compute_ns"], row["early_host_bound_ns"], row["late_host_bound_ns"]) == (
        20 * US, 10 * US, 105 * US)
    assert (row["host_share_ns"], row["gpu_compute_share_ns"], row["queued_share_ns"], row["carried_ns"]) == (
        155 * US, -20 * US, 0, 0)
    assert row["lateness_ns"] == 135 * US and row["primary_cause"] == "host"
    ops = _rows(job, "SELECT DISTINCT window_start_ns FROM late_rank_host_ops(marker := 'fwd_bwd')")
    assert ops == [{"window_start_ns": 300 * US}]


# tier 2: on ranks without markers a detected iteration starts the segment at its boundary kernel's launch
def test_detected_iteration_starts_the_segment():
    """Four iterations of 1000 µs, no markers: GEMMs A, B on stream 7 (detected period 2, boundary kernel A) and an
    all_reduce on stream 20 ending at b + 600 on both ranks. In iteration 2 rank 1's host launches A 100 µs late
    (at b + 150; A [b+160, b+260), B [b+260, b+360), all_reduce launched b + 450, starts b + 460): lateness 60.
    Segments from A's launch: E [b+50, b+400): host 11, queued 39, compute 200, host 100; L [b+150, b+460): host
    10, compute 200, host 100. Shares: host (110 − 111) + 100 = 99, queued −39."""
    job = Job()
    gemm_b = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize64x64x64"
    for i in range(4):
        b = 1000 * i
        for r in (0, 1):
            # (start, end, launch) of A, B and the all_reduce, in µs from b
            a, bb, ar = ((160, 260, 150), (260, 360, 155), (460, 600, 450)) if (i, r) == (2, 1) else (
                (100, 200, 50), (200, 300, 60), (400, 600, 390))
            job.kernel(r, GEMM, b + a[0], b + a[1], b + a[2])
            job.kernel(r, gemm_b, b + bb[0], b + bb[1], b + bb[2])
            job.kernel(r, AR, b + ar[0], b + ar[1], b + ar[2], stream=20, collective="all_reduce", seq=i + 1)
    its = _rows(job, "SELECT rank, iteration_source, period_kernels FROM iterations() WHERE iteration > 0")
    assert {(r["iteration_source"], r["period_kernels"]) for r in its} == {("detected", 2)} and len(its) == 6
    row = [r for r in job.rows() if r["lateness_ns"]][0]
    b = 2000 * US
    assert (row["late_rank"], row["lateness_ns"]) == (1, 60 * US)
    assert (row["late_segment_from"], row["late_segment_start_ns"], row["early_segment_start_ns"]) == (
        "iteration_start", b + 150 * US, b + 50 * US)
    assert (row["late_host_bound_ns"], row["late_gpu_compute_ns"], row["late_queued_idle_ns"]) == (
        110 * US, 200 * US, 0)
    assert (row["early_host_bound_ns"], row["early_gpu_compute_ns"], row["early_queued_idle_ns"]) == (
        111 * US, 200 * US, 39 * US)
    assert (row["host_share_ns"], row["queued_share_ns"], row["gpu_compute_share_ns"]) == (99 * US, -39 * US, 0)
    assert row["primary_cause"] == "host"


# tier 2: python_function ranges (Kineto with_stack; stored in cpu_ranges by kind) are host ops with self time
def test_python_function_ranges_are_host_ops():
    """The late rank's segment [200, 405) holds a Python frame 'nn.Module: Linear_0' [262, 398) (kind
    'python_function') around aten::mm [270, 300): self 106 and 30 µs, beside the two 1 µs launch calls."""
    def body(job):
        job.kernel(1, GEMM, 210, 260, 205)
        job.kernel(1, AR, 405, 500, 400, stream=20, collective="all_reduce", seq=2)
        job.cpu(1, "nn.Module: Linear_0", 262, 398, "python_function")
        job.cpu(1, "aten::mm", 270, 300, "cpu_op")
    job = Job()
    _base(job, body)
    got = job.con.execute("SELECT op_name, op_kind, calls, self_ns FROM late_rank_host_ops() "
                          "ORDER BY op_order").fetchall()
    assert got == [("nn.Module: Linear_0", "python_function", 1, 106 * US), ("aten::mm", "cpu_op", 1, 30 * US),
                   ("cudaLaunchKernel", "cuda_api", 2, 2 * US)]
