"""iteration_critical_path and critical_path_segments: which rank and which chain bound each iteration.

Tier 2: two-rank jobs written straight into the canonical tables (synth_db), with a known late rank and the path
worked out by hand. Tier 4: the bundled 8-rank example (fixtures/example): the backward walk recomputed in Python
from the JSON (the k-th NCCL kernel of every rank is one collective; the rank that starts it last bounds it).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_iterations_breakdown import AR, GEMM, US, Job

EXAMPLE = Path(__file__).parent.parent / "fixtures" / "example"
PARTS = ("gpu_compute_ns", "comm_transfer_ns", "comm_wait_ns", "host_bound_idle_ns", "queued_idle_ns",
         "other_idle_ns")


def _job(*, second_collective: bool) -> Job:
    """One step [0, 1000) µs on both ranks. Rank 1 is late at all_reduce #1: its GEMM [10, 300) (launched 5) runs
    while rank 0, after a GEMM [10, 100), waits in all_reduce #1 [110, 400) for it. Rank 0 then runs a GEMM
    [410, 500) launched 402. With ``second_collective``, rank 1 waits for rank 0 at all_reduce #2 (rank 1 [420, 600),
    rank 0 [500, 600)) and then runs a GEMM [600, 650)."""
    job = Job()
    for r in (0, 1):
        job.step(r, 1, 0, 1000)
        job.kernel(r, GEMM, 10, 300 if r else 100, 5)
    job.kernel(0, AR, 110, 400, 105, stream=20, seq=1)
    job.kernel(1, AR, 300, 400, 295, stream=20, seq=1)
    job.kernel(0, GEMM, 410, 500, 402)
    if second_collective:
        job.kernel(0, AR, 500, 600, 495, stream=20, seq=2)
        job.kernel(1, AR, 420, 600, 415, stream=20, seq=2)
        job.kernel(1, GEMM, 600, 650, 590)
    return job


def _segments(job):
    return [(s["segment"], s["rank"], s["start_ns"] // US, s["end_ns"] // US, s["reached_by"], s["waiting_rank"])
            + tuple(s[p] // US for p in PARTS) for s in job.rows("critical_path_segments")]


# tier 2: one jump to the late rank
def test_path_jumps_to_the_late_rank():
    """The path ends at rank 0's last GEMM (500) and holds rank 0 back to 300, when rank 1 arrived at all_reduce #1:
    transfer [300, 400), host-bound [400, 410) (launch end 403 + ε), compute [410, 500). Rank 0 waited there, so
    the path jumps to rank 1 and holds it back to its step start: host-bound [0, 10), its long GEMM [10, 300)."""
    job = _job(second_collective=False)
    segs = _segments(job)
    assert segs == [(0, 0, 300, 500, "iteration_end", None, 90, 100, 0, 10, 0, 0),
                    (1, 1, 0, 300, "last_arrival", 0, 290, 0, 0, 10, 0, 0)]
    row = job.rows("critical_path_segments")[1]
    assert row["waiting_rank_wait_ns"] == 190 * US and row["via_instance_key"] is not None
    (cp,) = job.rows("iteration_critical_path")
    assert (cp["bound_rank"], cp["origin_rank"], cp["path_ranks"], cp["hops"]) == (0, 1, [1, 0], 1)
    assert (cp["iteration_ns"], cp["path_ns"], cp["compute_ns"], cp["comm_transfer_ns"], cp["host_bound_idle_ns"],
            cp["waiting_ns"], cp["other_idle_ns"]) == tuple(v * US for v in (500, 500, 380, 100, 20, 0, 0))
    assert cp["compute_pct"] == pytest.approx(76.0) and cp["comm_transfer_pct"] == pytest.approx(20.0)
    assert cp["iteration_source"] == "marker"
    # every segment carries its iteration's start (earliest over the ranks: both start at 0) and source
    starts = {r["rank"]: r["start_ns"] for r in job.rows("iterations")}
    for seg in job.rows("critical_path_segments"):
        assert (seg["iteration_start_ns"], seg["iteration_source"]) == (min(starts.values()), "marker")
    assert cp["iteration_start_ns"] == min(starts.values())


# tier 2: two jumps, back and forth
def test_path_chains_two_waits():
    """Rank 1 ends last (650) and waited for rank 0 at all_reduce #2 (rank 0 arrived at 500): the path holds rank 1
    on [500, 650), rank 0 on [300, 500), rank 1 on [0, 300)."""
    job = _job(second_collective=True)
    assert _segments(job) == [(0, 1, 500, 650, "iteration_end", None, 50, 100, 0, 0, 0, 0),
                              (1, 0, 300, 500, "last_arrival", 1, 90, 100, 0, 10, 0, 0),
                              (2, 1, 0, 300, "last_arrival", 0, 290, 0, 0, 10, 0, 0)]
    (cp,) = job.rows("iteration_critical_path")
    assert (cp["bound_rank"], cp["path_ranks"], cp["hops"], cp["path_ns"]) == (1, [1, 0, 1], 2, 650 * US)
    assert cp["compute_ns"] + cp["comm_transfer_ns"] + cp["host_bound_idle_ns"] + cp["waiting_ns"] \
        + cp["other_idle_ns"] == cp["path_ns"]


# tier 2: the walk stays inside the iteration
def test_path_stays_in_its_iteration():
    """Two steps; the wait in step 1 does not pull step 2's path back into step 1."""
    job = _job(second_collective=False)
    for r in (0, 1):
        job.step(r, 2, 1000, 2000)
        job.kernel(r, GEMM, 1100, 1200 + 100 * r, 1090)
    paths = {r["iteration_index"]: r for r in job.rows("iteration_critical_path")}
    assert paths[1]["path_ranks"] == [1] and paths[1]["path_start_ns"] == 1000 * US
    assert paths[1]["path_ns"] == 300 * US and paths[0]["path_ranks"] == [1, 0]


# --- tier 4: the bundled example --------------------------------------------------------------------------------


def _walk_from_json() -> tuple[list[int], list[int]]:
    """The ranks on the path (time order) and the segment lengths, by the documented walk on the JSON: the
    collectives are the k-th NCCL kernels; every rank's step starts at its ProfilerStep; the bound rank's last
    kernel in its step ends last."""
    ns = lambda x: round(x * 1000)  # noqa: E731
    nccl, step, last_end = {}, {}, {}
    for r in range(8):
        f = next(EXAMPLE.glob(f"worker{r}_*.json.gz"))
        with gzip.open(f) as fh:
            ev = json.loads(fh.read())["traceEvents"]
        st = next(e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
        step[r] = (ns(st["ts"]), ns(st["ts"] + st["dur"]))
        ks = [e for e in ev if e.get("cat") == "kernel"]
        nccl[r] = sorted(ns(e["ts"]) for e in ks if e["name"].startswith("nccl"))
        last_end[r] = max(ns(e["ts"] + e["dur"]) for e in ks if step[r][0] <= ns(e["ts"]) < step[r][1])
    n = len(nccl[0])
    latest = [max(nccl[r][k] for r in range(8)) for k in range(n)]
    last = [min(r for r in range(8) if nccl[r][k] == latest[k]) for k in range(n)]
    rank = max(range(8), key=lambda r: (last_end[r], -r))
    t, ranks, lengths = last_end[rank], [], []
    while True:
        waits = [k for k in range(n)
                 if last[k] != rank and nccl[rank][k] < latest[k] and step[rank][0] <= latest[k] < t]
        ranks.append(rank)
        if not waits:
            lengths.append(t - step[rank][0])
            break
        k = max(waits, key=lambda k: latest[k])
        lengths.append(t - latest[k])
        rank, t = last[k], latest[k]
    return ranks[::-1], lengths


# tier 4: the example's path recomputed from the JSON
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="fixtures/example absent")
def test_example_path_against_json():
    from nsys2comm.api import Job as ApiJob

    ranks, lengths = _walk_from_json()
    with ApiJob.open(str(EXAMPLE)) as job:
        (cp,) = job.query("iteration_critical_path").to_dicts()
        segs = job.query("critical_path_segments").to_dicts()
    assert cp["path_ranks"] == ranks == [7, 5, 4]
    assert [s["segment_ns"] for s in segs] == lengths
    for s in segs:
        assert sum(s[p] for p in PARTS) == s["segment_ns"]
    # the path is mostly the late ranks' GPUs idle with nothing launched (the host-bound lateness of issue 38)
    assert cp["host_bound_idle_pct"] > 80 and cp["bound_rank"] == 4 and cp["origin_rank"] == 7
