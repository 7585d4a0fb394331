"""rank_iteration_breakdown and iteration_trend: where each iteration's time goes, and how iterations trend.

Tier 2: jobs written straight into the canonical tables (synth_db.empty_job / add_kernel), with the parts worked
out by hand in the test; a hypothesis property test against a brute force over every nanosecond of small random
jobs; the trend's outlier rule recomputed with Python's statistics. Tier 4: the bundled example (fixtures/example),
each rank's ProfilerStep window recomputed from its JSON (gzip + json), independently of the importer.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

US = 1000
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
EXAMPLE = Path(__file__).parent.parent / "fixtures" / "example"
SPLIT = ("gpu_compute_ns", "comm_exposed_ns", "host_bound_idle_ns", "queued_idle_ns", "other_idle_ns")


class Job:
    """A hand-built job: kernels (µs, launches on thread 1), collectives with (group, seq), step markers."""

    def __init__(self, ranks: int = 2, unit: int = US):
        self.con = synth_db.empty_job(ranks)
        self.kid = 0
        self.unit = unit

    def kernel(self, rank, name, start, end, launch=None, *, stream=7, seq=None):
        self.kid += 1
        u = self.unit
        synth_db.add_kernel(self.con, self.kid, rank, name, int(start * u), int(end * u), stream,
                            None if launch is None else (int(launch * u), int((launch + 1) * u)))
        if seq is not None:
            self.con.execute("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, group_size, "
                             "pg_name, seq, n_ops, collective_source) VALUES (?, 1, ?, 'all_reduce', 1048576, 2, '0', "
                             "?, 1, 'test')", [self.kid, rank, seq])

    def step(self, rank, no, start, end, name=None):
        self.kid += 1
        u = self.unit
        self.con.execute("INSERT INTO cpu_ranges (range_id, file_id, rank, pid, tid, start_ns, end_ns, name, kind) "
                         "VALUES (?, 1, ?, ?, 1, ?, ?, ?, 'user_annotation')",
                         [self.kid, rank, 100 + rank, int(start * u), int(end * u), name or f"ProfilerStep#{no}"])

    def rows(self, query, **params):
        args = ", ".join(f"{k} := ${k}" for k in params)
        cur = self.con.execute(f"SELECT * FROM {query}({args})", params or None)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# tier 2: a hand-built job, every part worked out by hand
def test_breakdown_by_hand():
    """Two ranks, steps [0, 1000) and [1000, 2000) µs.
    Rank 0: GEMM [100, 300) launched 95; all_reduce [250, 400) launched 240; GEMM [600, 700) launched 450;
    GEMM [1200, 1500) launched 1150. Rank 1: the all_reduce [350, 400) launched 340, nothing else.
    Rank 0, step 1: compute 200 + 100; communication [250, 400): 50 under the GEMM (hidden), 100 exposed, of which
    [350, 400) after rank 1 arrived (transfer 50) and 50 waiting; idle [0, 100) host-bound (launch end 96 + ε ≥ 100),
    [400, 600) host-bound to 451 + 10 = 461 (61) then queued (139), [700, 1000) host-bound (the next kernel's launch
    ends at 1151). Step 2: idle [1000, 1161) host-bound, [1161, 1200) queued, compute 300, [1500, 2000) idle with no
    kernel after it (other). Rank 1: [0, 350) host-bound, 50 transfer, 600 + 1000 other."""
    job = Job()
    for r in (0, 1):
        job.step(r, 1, 0, 1000)
        job.step(r, 2, 1000, 2000)
    job.kernel(0, GEMM, 100, 300, 95)
    job.kernel(0, AR, 250, 400, 240, stream=20, seq=1)
    job.kernel(0, GEMM, 600, 700, 450)
    job.kernel(0, GEMM, 1200, 1500, 1150)
    job.kernel(1, AR, 350, 400, 340, stream=20, seq=1)
    got = {(r["rank"], r["iteration_index"]): r for r in job.rows("rank_iteration_breakdown")}
    cols = ("iteration_ns",) + SPLIT + ("comm_hidden_ns", "comm_transfer_ns", "comm_wait_ns", "collectives",
                                        "times_last", "times_first", "mean_arrival_pos", "mean_arrival_pct")
    want = {
        (0, 0): (1000, 300, 100, 461, 139, 0, 50, 50, 50, 1, 0, 1, 0.0, 0.0),
        (0, 1): (1000, 300, 0, 161, 39, 500, 0, 0, 0, 0, 0, 0, None, None),
        (1, 0): (1000, 0, 50, 350, 0, 600, 0, 50, 0, 1, 1, 0, 1.0, 100.0),
        (1, 1): (1000, 0, 0, 0, 0, 1000, 0, 0, 0, 0, 0, 0, None, None),
    }
    for key, vals in want.items():
        exp = tuple(v * US if c.endswith("_ns") else v for c, v in zip(cols, vals, strict=True))
        assert tuple(got[key][c] for c in cols) == exp, key
        assert got[key]["iteration_source"] == "marker" and got[key]["launch_unknown_idle_ns"] == 0
        assert sum(got[key][c] for c in SPLIT) == got[key]["iteration_ns"]


# tier 2: the marker parameter of iterations, on hand-built ranges
def test_user_marker_name():
    """marker := 'train_step' takes NVTX/annotation ranges named so (with or without a number), outermost only,
    over ProfilerStep markers; a rank without them keeps its ProfilerStep markers."""
    job = Job()
    job.kernel(0, GEMM, 100, 200, 95)
    job.kernel(1, GEMM, 100, 200, 95)
    for r in (0, 1):
        job.step(r, 1, 0, 500)
    job.step(0, None, 10, 300, name="train_step 7")
    job.step(0, None, 20, 100, name="train_step")  # nested: dropped
    job.step(0, None, 300, 450, name="train_step")
    job.step(0, None, 460, 470, name="train_step_x")  # not the name followed by a number
    rows = job.rows("iterations", marker="train_step")
    assert [(r["rank"], r["step_no"], r["start_ns"], r["end_ns"], r["iteration_source"]) for r in rows] == [
        (0, 7, 10 * US, 300 * US, "marker"), (0, None, 300 * US, 450 * US, "marker"),
        (1, 1, 0, 500 * US, "marker")]
    assert [r["iteration_ns"] for r in job.rows("rank_iteration_breakdown", marker="train_step")] == [
        290 * US, 150 * US, 500 * US]
    assert [r["iteration_source"] for r in job.rows("iterations", use_markers=False)] == ["whole_capture"] * 2


# tier 2: hypothesis against a brute force over every nanosecond
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 190), st.integers(1, 40), st.one_of(st.none(),
                                                                                           st.integers(0, 60)),
                          st.booleans()), min_size=1, max_size=12),
       st.lists(st.integers(20, 120), min_size=1, max_size=3))
def test_split_matches_brute_force(kernels, steps):
    """Random kernels (compute or all_reduce, launched up to 60 ns before they start or with no launch) in random
    steps, times in ns: every part equals a count over each nanosecond of the window of what the rank is doing
    there, by the documented rule (ε = 10 ns)."""
    eps = 10
    job = Job(ranks=1, unit=1)
    t = 5
    windows = []
    for i, d in enumerate(steps):
        job.step(0, i, t, t + d)
        windows.append((t, t + d))
        t += d
    ks = []
    for _, start, dur, early, comm in kernels:
        launch = None if early is None else start - early
        job.kernel(0, AR if comm else GEMM, start, start + dur, launch, stream=20 if comm else 7)
        ks.append((start, start + dur, None if launch is None else launch + 1, comm))
    got = job.rows("rank_iteration_breakdown", epsilon_ns=eps)
    assert len(got) == len(windows)
    for row, (a, b) in zip(got, windows, strict=True):
        want = dict.fromkeys(SPLIT + ("comm_hidden_ns", "launch_unknown_idle_ns"), 0)
        for x in range(a, b):
            comp = any(s <= x < e and not c for s, e, _, c in ks)
            comm = any(s <= x < e and c for s, e, _, c in ks)
            if comp:
                want["gpu_compute_ns"] += 1
                want["comm_hidden_ns"] += comm
            elif comm:
                want["comm_exposed_ns"] += 1
            else:
                later = [s for s, *_ in ks if s > x]
                if not later:
                    want["other_idle_ns"] += 1
                    continue
                nxt = min(later)
                launches = [le for s, _, le, _ in ks if s == nxt and le is not None]
                if not launches or x < min(launches) + eps:
                    want["host_bound_idle_ns"] += 1
                    want["launch_unknown_idle_ns"] += not launches
                else:
                    want["queued_idle_ns"] += 1
        assert {k: row[k] for k in want} == want
        assert sum(row[c] for c in SPLIT) == row["iteration_ns"] == b - a


# tier 2: the documented outlier rule recomputed with statistics
def test_trend_outlier_rule():
    """Nine steps of one rank: a slow first step (warm-up), one slow step in the middle; the flags follow the
    documented rule recomputed here: |x − median| > max(3 × 1.4826 × MAD, 5 % of the median)."""
    lengths = [3000, 1000, 1010, 990, 1005, 2000, 995, 1000, 1020]
    job = Job(ranks=1)
    t = 0
    for i, d in enumerate(lengths):
        job.step(0, i, t, t + d)
        job.kernel(0, GEMM, t + 10, t + 50, t + 5)
        t += d
    rows = job.rows("iteration_trend")
    xs = [d * US for d in lengths]
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    thr = max(3 * 1.4826 * mad, 0.05 * med)
    assert [r["iteration_ns"] for r in rows] == xs
    assert [r["is_outlier"] for r in rows] == [abs(x - med) > thr for x in xs]
    assert [r["trend_flag"] for r in rows] == ["warmup"] + ["normal"] * 4 + ["outlier"] + ["normal"] * 3
    assert rows[0]["iteration_median_ns"] == med and rows[0]["outlier_threshold_ns"] == pytest.approx(thr)
    ok = [(i, x) for i, x in enumerate(xs) if abs(x - med) <= thr]
    mi, mx = statistics.mean(i for i, _ in ok), statistics.mean(x for _, x in ok)
    slope = sum((i - mi) * (x - mx) for i, x in ok) / sum((i - mi) ** 2 for i, _ in ok)
    assert rows[0]["drift_ns_per_iteration"] == pytest.approx(slope)
    # fewer than three iterations: no flags, and the note says why
    two = Job(ranks=1)
    two.step(0, 1, 0, 100)
    two.step(0, 2, 100, 300)
    assert {(r["is_outlier"], r["trend_flag"], r["trend_note"]) for r in two.rows("iteration_trend")} == {
        (None, None, "fewer than 3 iterations on the rank")}


# --- tier 4: the bundled example --------------------------------------------------------------------------------


def _example_rank(rank: int) -> dict:
    """The rank's ProfilerStep window and, inside it, the union of its non-NCCL kernels and the NCCL time outside
    that union, straight from the JSON (µs → ns), with plain interval arithmetic."""
    f = next(EXAMPLE.glob(f"worker{rank}_*.json.gz"))
    with gzip.open(f) as fh:
        ev = json.loads(fh.read())["traceEvents"]
    ns = lambda x: round(x * 1000)  # noqa: E731
    step = next(e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    a, b = ns(step["ts"]), ns(step["ts"] + step["dur"])
    ks = [(ns(e["ts"]), ns(e["ts"] + e["dur"]), e["name"].startswith("nccl")) for e in ev if e.get("cat") == "kernel"]

    def union(iv):
        out: list[list[int]] = []
        for s, e in sorted((max(s, a), min(e, b)) for s, e in iv if min(e, b) > max(s, a)):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return sum(e - s for s, e in out)

    comp = union([(s, e) for s, e, n in ks if not n])
    every = union([(s, e) for s, e, _ in ks])
    return {"iteration_ns": b - a, "gpu_compute_ns": comp, "comm_exposed_ns": every - comp,
            "nccl_starts": sorted(s for s, _, n in ks if n)}


# tier 4: the bundled example against its JSON
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="fixtures/example absent")
def test_example_breakdown_against_json():
    from nsys2comm.api import Job as ApiJob

    with ApiJob.open(str(EXAMPLE)) as job:
        rows = job.query("rank_iteration_breakdown").to_dicts()
    ref = {r: _example_rank(r) for r in range(8)}
    assert [(r["rank"], r["iteration_index"], r["iteration_source"]) for r in rows] == [
        (r, 0, "marker") for r in range(8)]
    last = [max(range(8), key=lambda r: (ref[r]["nccl_starts"][k], -r)) for k in range(8)]
    for row in rows:
        want = ref[row["rank"]]
        assert (row["iteration_ns"], row["gpu_compute_ns"], row["comm_exposed_ns"]) == (
            want["iteration_ns"], want["gpu_compute_ns"], want["comm_exposed_ns"])
        assert sum(row[c] for c in SPLIT) == row["iteration_ns"]
        assert row["collectives"] == 8 and row["times_last"] == last.count(row["rank"])
    # rank 7 arrives last at the first five collectives; its idle GPU is mostly waiting for launches
    r7 = rows[7]
    assert r7["times_last"] == 5 and r7["host_bound_idle_ns"] > 0.5 * r7["iteration_ns"]


# tier 2: the CLI's --step-marker onto the catalog's marker parameter
def test_step_marker_option():
    from nsys2comm.cli import _with_step_marker
    from nsys2comm.errors import UsageError

    assert _with_step_marker("iteration_trend", {"epsilon_ns": 5}, "train_step") == {
        "epsilon_ns": 5, "marker": "train_step"}
    assert _with_step_marker("rank_wait", {}, None) == {}
    with pytest.raises(UsageError, match="rank_wait takes no step marker"):
        _with_step_marker("rank_wait", {}, "train_step")
    with pytest.raises(UsageError, match="disagree"):
        _with_step_marker("iterations", {"marker": "a"}, "b")
