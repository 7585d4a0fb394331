"""iterations: marker, detected and whole-capture iteration boundaries on generated kernel sequences.

Tier 2 (SQL on kernels written straight into the canonical tables): N identical iterations with timing jitter, with
a warm-up, with a last iteration that differs, with two groups interleaved on two streams; the expected count and
boundaries come from the generator, never from the product. Tier 3: markers win over detection, and detection
ignoring them finds the same boundaries (fixtures.synthetic). Tier 4: the same on the bundled example, from its JSON.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

from fixtures import synthetic as syn

US = 1000
GEMMS = [f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize{t}x128x64" for t in (64, 128, 256)]
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
EXAMPLE = Path(__file__).parent.parent / "fixtures" / "example"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float*)"


def _db(per_rank: dict[int, list[tuple[str, int, int]]]) -> duckdb.DuckDBPyConnection:
    """Kernels (name, stream, start_ns) per rank, 20 µs long each."""
    con = synth_db.catalog_db()  # a copy of the catalog template (≈ 0.1 s; installing binds for seconds)
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source, clock_offset_ns) "
                "VALUES (1, '/synthetic', 'x', 0, 'kineto', 0)")
    kid = 0
    for r, ks in per_rank.items():
        con.execute("INSERT INTO ranks VALUES (?, 1, ?, 'host', ?, 'cli')", [r, 100 + r, len(per_rank)])
        rows = []
        for name, stream, start in ks:
            kid += 1
            rows.append((kid, r, stream, start, start + 20 * US, name, kid))
        con.executemany("INSERT INTO kernels (kernel_id, file_id, rank, device_id, stream_id, start_ns, end_ns, name, "
                        "short_name, correlation_id, kernel_class) VALUES (?, 1, ?, 0, ?, ?, ?, ?, '', ?, '')", rows)
    # classified once, by the catalog's own rules (a macro call per inserted row binds it again each time: ~20 s)
    con.execute("UPDATE kernels SET short_name = kernel_short_name(name), kernel_class = kernel_class(name)")
    return con


def _iteration(rng: random.Random, layers: int = 3) -> list[str]:
    """One training iteration's GEMM / communication names (and elementwise kernels, which detection ignores)."""
    out = []
    for _ in range(layers):
        out += [GEMMS[0], ELEMENTWISE, GEMMS[1], AR]
    out += [GEMMS[2], AG, ELEMENTWISE]  # once per iteration: the loss and the optimizer's gather
    return out


def _job(iters: list[list[str]], t0: int, rng: random.Random) -> tuple[list[tuple[str, int, int]], list[int]]:
    """Lay iterations out on one stream with jittered gaps; returns the kernels and each iteration's start."""
    ks, starts, t = [], [], t0
    for it in iters:
        starts.append(t)
        for name in it:
            ks.append((name, 7, t))
            t += (20 + 5 + rng.randint(0, 30)) * US
        t += rng.randint(100, 400) * US
    return ks, starts


def _detected(con) -> dict[int, list[int]]:
    rows = con.execute("SELECT rank, iteration_source, start_ns FROM iterations() ORDER BY rank, iteration").fetchall()
    assert {r[1] for r in rows} == {"detected"}
    out: dict[int, list[int]] = {}
    for r, _, s in rows:
        out.setdefault(r, []).append(s)
    return out


def _within_one_kernel(got: list[int], want: list[int], ks: list[tuple[str, int, int]]) -> None:
    """Each boundary is the expected iteration start or an adjacent kernel's start."""
    starts = sorted(s for _, _, s in ks)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert abs(starts.index(g) - starts.index(w)) <= 1, (g, w)


@pytest.mark.parametrize("n", [2, 5, 12])
def test_identical_iterations_with_jitter(n):
    rng = random.Random(n)
    per, want = {}, {}
    for r in range(3):
        per[r], want[r] = _job([_iteration(rng) for _ in range(n)], 10**9 + r * 37 * US, rng)
    con = _db(per)
    got = _detected(con)
    for r in range(3):
        _within_one_kernel(got[r], want[r], per[r])
    assert con.execute("SELECT bool_and(ranks_agree), min(rank_iterations), max(rank_iterations) "
                       "FROM iterations()").fetchone() == (True, n, n)


def test_warmup_joins_the_first_iteration():
    """A warm-up shorter than half an iteration (3 of 11 kernels) joins the first iteration."""
    rng = random.Random(3)
    warm = [GEMMS[2], GEMMS[0], AR] + _iteration(rng)  # extra kernels, then a normal iteration
    ks, want = _job([warm] + [_iteration(rng) for _ in range(6)], 10**9, rng)
    got = _detected(_db({0: ks}))
    _within_one_kernel(got[0], want, ks)


def test_warmup_iteration_of_its_own():
    """A warm-up step unlike the others, at least half an iteration long (7 of 11 kernels), is an iteration."""
    rng = random.Random(6)
    warm = [GEMMS[2], AR, GEMMS[0], GEMMS[0], AG, GEMMS[1], RS]
    ks, want = _job([warm] + [_iteration(rng) for _ in range(6)], 10**9, rng)
    con = _db({0: ks})
    got = _detected(con)
    _within_one_kernel(got[0], want, ks)
    assert con.execute("SELECT any_value(warmup_kernels), any_value(period_kernels) FROM iterations()").fetchone() \
        == (7, 11)


def test_last_iteration_differs():
    rng = random.Random(4)
    last = _iteration(rng)[:-4] + [GEMMS[1], RS, GEMMS[1], RS, GEMMS[0]]
    ks, want = _job([_iteration(rng) for _ in range(7)] + [last], 10**9, rng)
    got = _detected(_db({0: ks}))
    _within_one_kernel(got[0], want, ks)


def test_two_interleaved_groups():
    """TP all_reduces on stream 7 with the GEMMs, DP reduce_scatters on stream 20, their start order varying."""
    rng = random.Random(5)
    ks, want, t = [], [], 10**9
    for _ in range(9):
        want.append(t)
        for layer in range(4):
            for name in (GEMMS[0], AR, GEMMS[1]):
                ks.append((name, 7, t))
                if name == AR and layer % 2:  # the DP bucket lands near the TP all_reduce, before or after it
                    ks.append((RS, 20, t + rng.choice([-1, 1]) * rng.randint(1, 9) * US))
                t += (30 + rng.randint(0, 20)) * US
        ks.append((GEMMS[2], 7, t))
        t += (60 + rng.randint(100, 300)) * US
    con = _db({0: ks, 1: ks})
    got = _detected(con)
    _within_one_kernel(got[0], want, ks)
    row = con.execute("SELECT any_value(stream_id), any_value(period_kernels) FROM iterations()").fetchone()
    assert row == (7, 13)


def test_markers_and_whole_capture():
    """Ranks with ProfilerStep markers use them; a rank with too few kernels to repeat is the whole capture."""
    run = syn.make_run(world_size=2, steps=3)
    con = synth_db.build(run)
    rows = con.execute("SELECT rank, iteration_source, step_no, start_ns, end_ns FROM iterations() "
                       "ORDER BY rank, iteration").fetchall()
    want = [(rr.rank, "marker", s.number, s.start_ns, s.end_ns) for rr in run.ranks for s in rr.steps]
    assert rows == want
    con2 = _db({0: [(GEMMS[0], 7, 10**9), (AR, 7, 10**9 + 50 * US)]})
    assert con2.execute("SELECT iteration_source, start_ns, end_ns FROM iterations()").fetchall() == [
        ("whole_capture", 10**9, 10**9 + 70 * US)]


# tier 3: marker and detected boundaries agree (fixtures.synthetic, markers ignored with use_markers := false)
def test_detection_agrees_with_markers():
    """Each detected boundary is, within one kernel, the first kernel of the detected stream launched inside the
    next ProfilerStep (a step is a CPU range: its kernels run later on the GPU, so launches place them)."""
    run = syn.make_run(world_size=2, steps=5)
    con = synth_db.build(run)
    rows = con.execute("SELECT rank, iteration_source, start_ns, stream_id FROM iterations(use_markers := false) "
                       "ORDER BY rank, iteration").fetchall()
    assert {r[1] for r in rows} == {"detected"}
    for rr in run.ranks:
        got = [r for r in rows if r[0] == rr.rank]
        assert len(got) == len(rr.steps) == 5
        stream = got[0][3]
        ks = sorted((k for k in rr.kernels if k.stream == stream), key=lambda k: k.start_ns)
        starts = [k.start_ns for k in ks]
        assert got[0][2] == min(k.start_ns for k in rr.kernels)
        for (_, _, start, _), step in zip(got[1:], rr.steps[1:], strict=True):
            want = next(i for i, k in enumerate(ks) if k.launch_start_ns >= step.start_ns)
            assert abs(starts.index(start) - want) <= 1, (rr.rank, step.number)


# tier 4: the bundled example (one ProfilerStep per rank), markers against detection, from the JSON
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="fixtures/example absent")
def test_example_markers_and_detection_agree():
    """Detection ignoring the markers finds no repeating unit in the one captured step, so it keeps one iteration
    per rank (the whole capture), as the markers say; it holds every kernel launched inside the step and ends where
    they end."""
    from nsys2comm.api import Job

    with Job.open(str(EXAMPLE)) as job:
        marked = job.query("iterations").to_dicts()
        det = job.query("iterations", use_markers=False).to_dicts()
    assert [(r["rank"], r["iteration_source"], r["step_no"]) for r in marked] == [(r, "marker", 10) for r in range(8)]
    assert [(r["rank"], r["iteration_source"]) for r in det] == [(r, "whole_capture") for r in range(8)]
    mismatched = []
    for m, d in zip(marked, det, strict=True):
        f = next(EXAMPLE.glob(f"worker{m['rank']}_*.json.gz"))
        with gzip.open(f) as fh:
            ev = json.loads(fh.read())["traceEvents"]
        ns = lambda x: round(x * 1000)  # noqa: E731
        step = next(e for e in ev if e.get("cat") == "user_annotation" and e["name"] == "ProfilerStep#10")
        assert (m["start_ns"], m["end_ns"]) == (ns(step["ts"]), ns(step["ts"] + step["dur"]))
        launched = {e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime"
                    and "correlation" in e.get("args", {}) and m["start_ns"] <= ns(e["ts"]) < m["end_ns"]}
        ks = [(ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in ev if e.get("cat") == "kernel"
              and e["args"].get("correlation") in launched]
        before = [k for k in ev if k.get("cat") == "kernel" and k["args"].get("correlation") not in launched]
        # the end agrees exactly; the start too, except where the capture holds the previous step's last kernels
        # (launched before ProfilerStep#10 began: ranks 1 and 3), which no marker-free rule can tell apart
        assert ks and max(e for _, e in ks) == d["end_ns"]
        assert d["start_ns"] == min([s for s, _ in ks] + [ns(k["ts"]) for k in before])
        assert all(ns(k["ts"]) < min(s for s, _ in ks) for k in before)
        if before:
            mismatched.append(m["rank"])
    assert mismatched == [1, 3]


# tier 4: a real trace with five ProfilerSteps (../shared), detection against its markers, from the JSON
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_real_trace_detection_matches_its_steps(shared_traces):
    """HTA's df_index_resolver trace (one rank, ProfilerStep#2..#6, 564 GEMMs per step on stream 7, all its
    all_reduces on another stream): detection ignoring the markers finds five iterations, and each boundary is, within
    one GEMM, the first GEMM launched inside the next step (launches read from the JSON by correlation id; each step
    starts with some 400 other kernels, so a kernel's start time alone would not place it)."""
    from nsys2comm.api import Job

    trace = shared_traces / "kineto" / "hta_df_index_resolver" / "df_index_resolver.json.gz"
    with gzip.open(trace) as fh:
        ev = json.loads(fh.read())["traceEvents"]
    ns = lambda x: round(x * 1000)  # noqa: E731
    steps = sorted((ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in ev
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    launch = {e["args"]["correlation"]: ns(e["ts"]) for e in ev
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    with Job.open(str(trace)) as job:
        det = job.query("iterations", use_markers=False).to_dicts()
    assert len(steps) == 5 and [d["iteration_source"] for d in det] == ["detected"] * 5
    assert {d["ranks_agree"] for d in det} == {True} and {d["period_kernels"] for d in det} == {564}
    # the GEMMs of the detected stream by name (the trace's are volta_sgemm_* and the like), in start order
    stream = det[0]["stream_id"]
    ks = sorted((ns(e["ts"]), launch[e["args"]["correlation"]]) for e in ev
                if e.get("cat") == "kernel" and e["args"].get("stream") == stream and "gemm" in e["name"].lower()
                and e["args"].get("correlation") in launch)
    starts = [s for s, _ in ks]
    for d, (step_start, _) in zip(det[1:], steps[1:], strict=True):
        want = next(i for i, (_, lt) in enumerate(ks) if lt >= step_start)
        assert abs(starts.index(d["start_ns"]) - want) <= 1


def _shuffled_job(rng: random.Random, n: int, comm: list[str], t0: int = 10**9):
    """n iterations whose GEMM order changes every time (stage 1 finds no period) on stream 7, and whose collectives
    (``comm``, in an order shuffled per iteration) run on stream 20 between the GEMMs; returns the kernels and each
    iteration's first collective (its detected start)."""
    more = [f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize{t}x64x64" for t in (32, 96, 160)]
    ks, firsts, t = [], [], t0
    for _ in range(n):
        gemms = GEMMS + more
        rng.shuffle(gemms)
        order = comm[:]
        rng.shuffle(order)
        first = None
        for j, g in enumerate(gemms):
            ks.append((g, 7, t))
            t += (25 + rng.randint(0, 20)) * US
            if j < len(order):
                ks.append((order[j], 20, t))
                first = t if first is None else first
                t += (25 + rng.randint(0, 20)) * US
        firsts.append(first)
        t += rng.randint(100, 400) * US
    return ks, firsts


# tier 2: stage 2 (collective bags), the expected boundaries from the generator
@pytest.mark.parametrize("n", [2, 3, 9])
def test_collective_bags_when_the_gemm_order_changes(n):
    """Neither the GEMM order nor the collectives' order repeats; the bag of collectives does: n iterations, each
    starting at its first collective (iteration 0 at the rank's first kernel), the same count on both ranks."""
    rng = random.Random(10 + n)
    per, want = {}, {}
    for r in range(2):
        per[r], firsts = _shuffled_job(rng, n, [AR, AR, RS, AG])
        want[r] = [min(s for _, _, s in per[r])] + firsts[1:]
    con = _db(per)
    assert _detected(con) == want
    rows = con.execute("SELECT DISTINCT detected_from, period_kernels, warmup_kernels, stream_id, ranks_agree "
                       "FROM iterations()").fetchall()
    assert rows == [("collective_bags", 4, 0, None, True)]  # stage 1 (kernel_names, tried first) found none


def test_collective_bags_last_iteration_differs_and_single_collective():
    """A last iteration with other collectives is an iteration of its own (its first collective starts it); a rank
    whose only collective is one repeated all_reduce has no period to read from bags and stays whole_capture."""
    rng = random.Random(21)
    ks, firsts = _shuffled_job(rng, 10, [AR, RS, AG])  # 30 of 33 collectives in equal bags: score 0.91
    tail, tail_firsts = _shuffled_job(rng, 1, [RS, RS, AR], t0=max(s for _, _, s in ks) + 500 * US)
    single, _ = _shuffled_job(rng, 6, [AR, AR])
    con = _db({0: ks + tail, 1: single})
    rows = con.execute("SELECT rank, iteration_source, start_ns FROM iterations() ORDER BY rank, iteration").fetchall()
    assert [s for r, _, s in rows if r == 0] == [min(s for _, _, s in ks)] + firsts[1:] + tail_firsts
    assert {src for r, src, _ in rows if r == 0} == {"detected"}
    assert [src for r, src, _ in rows if r == 1] == ["whole_capture"]


# tier 4: HTA's sampled 2-rank trace (ProfilerStep#551, #552), detection against its markers, from the JSON
def test_hta_two_rank_detection_matches_its_steps(shared_traces):
    """Its GEMM order and, on rank 1, the order of its all_to_all and all_reduce kernels change between the two steps;
    the five collectives of each step (two all_to_all, two all_reduce, one all_gather) do not. Detection ignoring the
    markers finds two iterations per rank, and the second starts at the first NCCL kernel launched inside
    ProfilerStep#552 (launches by correlation id, read from the JSON)."""
    from nsys2comm.api import Job

    paths = sorted((shared_traces / "kineto" / "hta_trace_filter_2rank").glob("sampled_rank-*.json.gz"))
    ns = lambda x: round(x * 1000)  # noqa: E731
    want = {}
    for r, p in enumerate(paths):
        with gzip.open(p) as fh:
            ev = json.loads(fh.read())["traceEvents"]
        steps = sorted((ns(e["ts"]), e["name"]) for e in ev
                       if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
        assert [s for _, s in steps] == ["ProfilerStep#551", "ProfilerStep#552"]
        launch = {e["args"]["correlation"]: ns(e["ts"]) for e in ev
                  if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
        nccl = sorted((ns(e["ts"]), launch[e["args"]["correlation"]]) for e in ev
                      if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel"))
        first = min(ns(e["ts"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
        want[r] = [first, next(s for s, lt in nccl if lt >= steps[1][0])]
        assert len(nccl) == 10 and sum(lt >= steps[1][0] for _, lt in nccl) == 5
    with Job.open([str(p) for p in paths]) as job:
        det = job.query("iterations", use_markers=False).to_dicts()
    assert {(d["iteration_source"], d["detected_from"], d["period_kernels"], d["ranks_agree"]) for d in det} == {
        ("detected", "collective_bags", 5, True)}
    assert {r: [d["start_ns"] for d in det if d["rank"] == r] for r in (0, 1)} == want
