"""GEMM problems (issue 39 part 1, issue 36 part 7): M, N, K, batch, FLOPs and bytes of every GEMM kernel from the
shapes the trace records for the op that launched it.

- tier 2: the shape rules on inline VALUES (mm, addmm with bias, bmm, linear with a 3-D input, matmul), and a
  hypothesis property test of torch.matmul's rules against a brute-force output shape;
- tier 3: a Kineto trace and an nsys export built by code (fixtures.kineto_writer.GemmOp, record_shapes in
  PyTorch's argument orders), ingested by the real importers: every kernel's op, shape, FLOPs, main/auxiliary
  status and bytes equal the values written down here, and both sources give the same rows;
- tier 4: the real Kineto traces in ../shared that record shapes: every GEMM kernel gets M, N, K and FLOPs,
  recomputed here straight from the JSON (the launch → innermost matrix-multiply op, by the same rule).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

from fixtures.kineto_writer import GemmOp, write_kineto
from fixtures.nsys_writer import write_nsys
from fixtures.synthetic import T0_NS, US, Kernel, RankRun, Run, Step
from nsys2comm import Job

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
SPLITK = ("void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>"
          "(cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*, float const*, float const*, "
          "__nv_bfloat16 const*, float const*, __nv_bfloat16*, void*, long, float*, int*)")
PID, TID = 4100, 4100
BF16, F32, F16 = "c10::BFloat16", "float", "c10::Half"
SIZE = {BF16: 2, F32: 4, F16: 2, "c10::Float8_e4m3fn": 1}
CANON = {BF16: "bfloat16", F32: "float32", F16: "float16", "c10::Float8_e4m3fn": "float8_e4m3"}



# ------------------------------------------------------------------------------------------------ tier 2: rules

def _problem(con, op: str, dims: list) -> dict | None:
    return con.execute("SELECT _gemm_problem(?, ?::BIGINT[][])", [op, dims]).fetchone()[0]


@pytest.mark.parametrize("op, dims, mnkb, bias", [
    ("aten::mm", [[128, 256], [256, 512]], (128, 512, 256, 1), False),               # mm(self [M,K], mat2 [K,N])
    ("aten::addmm", [[512], [64, 256], [256, 512], [], []], (64, 512, 256, 1), True),  # addmm(bias, mat1, mat2, β, α)
    ("aten::addmm_", [[64, 512], [64, 256], [256, 512], [], []], (64, 512, 256, 1), True),
    ("aten::bmm", [[8, 64, 32], [8, 32, 16]], (64, 16, 32, 8), False),                # bmm(self [B,M,K], mat2 [B,K,N])
    ("aten::baddbmm", [[8, 64, 16], [8, 64, 32], [8, 32, 16], [], []], (64, 16, 32, 8), True),
    ("aten::linear", [[4, 16, 256], [128, 256], [128]], (64, 128, 256, 1), True),     # M = 4 × 16 (leading dims)
    ("aten::linear", [[4, 16, 256], [128, 256], []], (64, 128, 256, 1), False),       # bias=None is recorded as []
    ("aten::linear", [[256], [128, 256], []], (1, 128, 256, 1), False),
    ("aten::matmul", [[2, 3, 64, 32], [32, 48]], (384, 48, 32, 1), False),           # N-D · 2-D folded into one mm
    ("aten::matmul", [[5, 1, 64, 32], [3, 32, 16]], (64, 16, 32, 15), False),        # batch dims broadcast [5, 3]
    ("aten::matmul", [[32], [32]], (1, 1, 32, 1), False),                            # dot
    ("aten::matmul", [[64, 32], [32]], (64, 1, 32, 1), False),
    ("aten::matmul", [[32], [7, 32, 16]], (1, 16, 32, 7), False),
    ("aten::mv", [[64, 32], [32]], (64, 1, 32, 1), False),
])
def test_shape_rules(con, op, dims, mnkb, bias):
    p = _problem(con, op, dims)
    assert (p["m"], p["n"], p["k"], p["batch"]) == mnkb and p["bias"] is bias


@pytest.mark.parametrize("op, dims", [
    ("aten::mm", [[4, 8], [9, 2]]),         # inner dims disagree
    ("aten::mm", [[4, 8, 2], [2, 3]]),      # mm takes 2-D tensors only
    ("aten::bmm", [[2, 4, 8], [3, 8, 5]]),  # batch sizes disagree
    ("aten::addmm", [[4], [4, 8]]),         # too few inputs
    ("aten::mm", [[-1, 8], [8, 2]]),
    ("aten::linear", [[], [8, 4], []]),
])
def test_shapes_that_do_not_fit_give_null(con, op, dims):
    assert _problem(con, op, dims) is None


def test_flop_formulas_on_inline_values(con):
    """flops = 2·M·N·K·batch and bias_flops = M·N·batch, computed by the view over one-row tables built here."""
    cases = [("aten::mm", [[128, 256], [256, 512]], 2 * 128 * 512 * 256, 0),
             ("aten::addmm", [[512], [64, 256], [256, 512], [], []], 2 * 64 * 512 * 256, 64 * 512),
             ("aten::bmm", [[8, 64, 32], [8, 32, 16]], 2 * 8 * 64 * 16 * 32, 0),
             ("aten::linear", [[4, 16, 256], [128, 256], [128]], 2 * 64 * 128 * 256, 64 * 128)]
    rows = con.execute("""
        SELECT op, TRY_CAST(2::HUGEINT * p.m * p.n * p.k * p.batch AS BIGINT) AS flops,
               CASE WHEN p.bias THEN p.m * p.n * p.batch ELSE 0 END AS bias_flops
        FROM (SELECT op, _gemm_problem(op, dims::BIGINT[][]) AS p
              FROM (VALUES """ + ", ".join("(?, ?)" for _ in cases) + """) v(op, dims))""",
                       [x for op, d, *_ in cases for x in (op, d)]).fetchall()
    assert [(f, b) for _, f, b in rows] == [(f, b) for *_, f, b in cases]


def _np_matmul_shape(a: list[int], b: list[int]) -> tuple[list[int], int]:
    """torch.matmul's output shape by its documented rules, written out independently: 1-D operands are promoted
    (a prepended / b appended 1) and removed from the result; batch dims broadcast."""
    a2 = [1] + a if len(a) == 1 else a
    b2 = b + [1] if len(b) == 1 else b
    ba, bb = a2[:-2], b2[:-2]
    n = max(len(ba), len(bb))
    ba, bb = [1] * (n - len(ba)) + ba, [1] * (n - len(bb)) + bb
    out = [max(x, y) for x, y in zip(ba, bb, strict=True)] + [a2[-2], b2[-1]]
    if len(a) == 1:
        out.pop(-2)
    if len(b) == 1:
        out.pop(-1)
    return out, a2[-1]


@settings(max_examples=examples(150), deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.lists(st.sampled_from([1, 2, 3]), max_size=3),
       st.lists(st.sampled_from([1, 2, 3]), max_size=3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 9),
       st.booleans())
def test_matmul_flops_equal_output_elements_times_k(con, ra, rb, batch_a, batch_b, m, n, k, bcast_ones):
    """2·M·N·K·batch of aten::matmul = 2 × (elements of torch.matmul's output) × K, for 1-D to 4-D operands."""
    a = [m, k][-ra:] if ra <= 2 else batch_a[: ra - 2] + [1] * (ra - 2 - len(batch_a[: ra - 2])) + [m, k]
    b = [k, n][-rb:] if rb <= 2 else batch_b[: rb - 2] + [1] * (rb - 2 - len(batch_b[: rb - 2])) + [k, n]
    if ra == 1:
        a = [k]
    if rb == 1:
        b = [k]
    # batch dims must broadcast: where both are > 1 they must agree
    la, lb = a[:-2] if len(a) > 2 else [], b[:-2] if len(b) > 2 else []
    for x, y in zip(reversed(la), reversed(lb), strict=False):
        if x != y and 1 not in (x, y):
            return
    out, kk = _np_matmul_shape(a, b)
    p = _problem(con, "aten::matmul", [a, b])
    assert p is not None, (a, b)
    assert kk == p["k"] == k
    assert p["m"] * p["n"] * p["batch"] == math.prod(out)


# ------------------------------------------------------------------------------------- tier 3: built traces

def _case_run():
    """One rank, one step; each case's op range [s, s + 60 µs] holds its kernels' launches; kernels run later.
    Returns the Run, the ops and the expected row per kernel start (ns)."""
    rr = RankRun(rank=0, pid=PID, tid=TID, device=0, steps=[Step(1, T0_NS, T0_NS + 50_000 * US)])
    ops: list[GemmOp] = []
    expect: dict[int, tuple] = {}
    corr = [500]
    slot = [0]

    def kernel(name: str, launch: int, start: int, dur_us: int) -> int:
        corr[0] += 1
        rr.kernels.append(Kernel(rank=0, device=0, stream=7, start_ns=start, end_ns=start + dur_us * US, name=name,
                                 correlation=corr[0], grid=(132, 1, 1), block=(256, 1, 1), launch_start_ns=launch,
                                 launch_end_ns=launch + 2 * US, launch_tid=TID))
        return start

    def case(name, dims, types, durations, want, *, outer=None, with_op=True):
        """want: (m, n, k, batch, has_bias) or a status; durations: kernel durations (µs), first = GEMM."""
        s = T0_NS + (100 + 1000 * slot[0]) * US
        slot[0] += 1
        if outer is not None:  # a composite op starting at the same µs, ending later (innermost: the inner op)
            ops.append(GemmOp(outer[0], outer[1], outer[2], s, s + 80 * US, TID))
        if with_op:
            ops.append(GemmOp(name, dims, types, s, s + 60 * US, TID))
        starts = []
        for i, d in enumerate(durations):
            kname = GEMM if i == 0 else SPLITK
            starts.append(kernel(kname, s + (10 + 10 * i) * US, s + (200 + 100 * i) * US, d))
        main = max(range(len(durations)), key=lambda i: (durations[i], -i))
        for i, st_ in enumerate(starts):
            if isinstance(want, str):
                expect[st_] = (name if with_op else None, None, None, None, None, None, want)
                continue
            m, n, k, b, bias = want
            if i == main:
                moved = None
                if types is not None and name != "aten::_scaled_mm":
                    moved = sum(math.prod(d) * SIZE[t] for d, t in zip(dims, types, strict=True) if d and t in SIZE)
                    moved += m * n * b * SIZE[types[1 if name in ("aten::addmm", "aten::baddbmm") else 0]]
                bias_flops = None if bias is None else (m * n * b if bias else 0)
                expect[st_] = (name, (m, n, k, b), bias, 2 * m * n * k * b, bias_flops, moved, "main")
            else:
                expect[st_] = (name, (m, n, k, b), bias, None, None, None, "auxiliary")

    case("aten::mm", [[128, 256], [256, 512]], [BF16, BF16], [40], (128, 512, 256, 1, False))
    case("aten::addmm", [[512], [64, 256], [256, 512], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"], [30, 5],
         (64, 512, 256, 1, True))  # split-K: the GEMM and its splitKreduce
    case("aten::bmm", [[8, 64, 32], [8, 32, 16]], [F32, F32], [20], (64, 16, 32, 8, False))
    case("aten::linear", [[4, 16, 256], [128, 256], [128]], [BF16, BF16, BF16], [25], (64, 128, 256, 1, True))
    case("aten::addmm", [[128], [64, 256], [256, 128], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"], [26],
         (64, 128, 256, 1, True), outer=("aten::linear", [[4, 16, 256], [128, 256], [128]], [BF16, BF16, BF16]))
    case("aten::matmul", [[2, 3, 64, 32], [32, 48]], [F16, F16], [15], (384, 48, 32, 1, False))
    case("aten::matmul", [[5, 1, 64, 32], [3, 32, 16]], [F32, F32], [18], (64, 16, 32, 15, False))
    case("aten::_scaled_mm", [[128, 256], [256, 64], [], [], [], [], [], []],
         ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float", "", "", "ScalarType", "Scalar"], [12],
         (128, 64, 256, 1, None))
    case("aten::mm", None, None, [10], "no_shapes")
    case("aten::mm", [[4, 8], [9, 2]], [BF16, BF16], [10], "unknown_layout")
    case("aten::mm", None, None, [10], "no_op", with_op=False)
    run = Run(world_size=1, nccl_era="new", ranks=[rr])
    return run, ops, expect


@pytest.fixture(scope="module")
def cases():
    return _case_run()


@pytest.fixture(scope="module", params=[("kineto", "new"), ("kineto", "old"), ("nsys", "3.25.0")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def built(request, cases, tmp_path_factory):
    source, style = request.param
    run, ops, _ = cases
    d = tmp_path_factory.mktemp(f"gemm-{source}-{style}")
    paths = (write_kineto(run, d, style, gemm_ops={0: ops}) if source == "kineto"
             else [write_nsys(run, d / "run.sqlite", style, gemm_ops={0: ops})])
    job = Job.ingest(paths, db=None, jobs=1)
    assert all(r.status == "ingested" for r in job.results), [r.message for r in job.results]
    yield source, job
    job.close()


def _rows(job) -> dict[int, dict]:
    return {r["start_ns"]: r for r in job.query("gemm_problems").to_dicts()}


def test_built_trace_gives_every_kernel_its_problem(cases, built):
    source, job = built
    _, ops, expect = cases
    got = _rows(job)
    assert set(got) == set(expect)
    for start, want in expect.items():
        r = got[start]
        if len(want) == 7 and isinstance(want[1], tuple):
            name, mnkb, bias, flops, bias_flops, moved, status = want
            assert (r["op_name"], (r["m"], r["n"], r["k"], r["batch"]), r["status"]) == (name, mnkb, status), r
            assert (r["has_bias"], r["flops"], r["bias_flops"]) == (bias, flops, bias_flops), r
            if source == "kineto":
                assert r["moved_bytes"] == moved and r["shape_source"] == "kineto_input_dims", r
            else:  # emit_nvtx records sizes without types: no dtype, no bytes
                assert r["dtype"] is None and r["moved_bytes"] is None and r["shape_source"] == "nvtx_sizes", r
        else:
            name, *_, status = want
            assert (r["op_name"], r["status"], r["m"], r["flops"]) == (name, status, None, None), r


def test_main_kernel_and_op_links(cases, built):
    """The split-K addmm launches two GEMM-class kernels: the longer one carries the FLOPs; every kernel of an op
    counts the op's kernels; the dtype is the first matrix operand's (Kineto)."""
    source, job = built
    rows = sorted(job.query("gemm_problems").to_dicts(), key=lambda r: r["start_ns"])
    split = [r for r in rows if r["op_gemm_kernels"] == 2]
    assert [r["status"] for r in split] == ["main", "auxiliary"]
    assert split[0]["short_name"] != split[1]["short_name"] and split[1]["short_name"].startswith("splitKreduce")
    assert split[0]["op_range_id"] == split[1]["op_range_id"]
    if source == "kineto":
        by_op = {(r["op_name"], r["m"]): r["dtype"] for r in rows if r["status"] == "main"}
        assert by_op[("aten::addmm", 64)] == "bfloat16" and by_op[("aten::bmm", 64)] == "float32"
        assert by_op[("aten::matmul", 384)] == "float16" and by_op[("aten::_scaled_mm", 128)] == "float8_e4m3"


def test_op_figures_in_gemm_efficiency_are_gemm_problems(built):
    """gemm_efficiency carries each kernel's op_gemm_kernels from gemm_problems, and its op_duration_ns on the main
    kernel is the summed duration of the op's GEMM kernels."""
    _, job = built
    problems = {r["kernel_id"]: r for r in job.query("gemm_problems").to_dicts()}
    per_op: dict[int, int] = {}
    for r in problems.values():
        if r["op_range_id"] is not None:
            per_op[r["op_range_id"]] = per_op.get(r["op_range_id"], 0) + r["duration_ns"]
    for r in job.query("gemm_efficiency").to_dicts():
        assert r["op_gemm_kernels"] == problems[r["kernel_id"]]["op_gemm_kernels"], r
        want = per_op[r["op_range_id"]] if r["status"] == "main" else None
        assert r["op_duration_ns"] == want, r


def test_a_trace_without_op_ranges_gives_no_op_everywhere(cases, tmp_path):
    """tier 3: no rank records matrix-multiply ops (nsys without emit_nvtx): every GEMM kernel with a launch is
    'no_op' with no op figures (this path skips the launch-to-op as-of join)."""
    run, _, expect = cases
    job = Job.ingest([write_nsys(run, tmp_path / "run.sqlite", "3.25.0")], db=None, jobs=1)
    try:
        rows = job.query("gemm_problems").to_dicts()
        assert len(rows) == len(expect)
        assert {r["status"] for r in rows} == {"no_op"}
        assert all(r["op_range_id"] is None and r["op_gemm_kernels"] is None and r["m"] is None for r in rows)
        eff = job.query("gemm_efficiency").to_dicts()
        assert [r["kernel_id"] for r in eff] == [r["kernel_id"] for r in rows]
        assert all(r["op_duration_ns"] is None and r["op_gemm_kernels"] is None for r in eff)
    finally:
        job.close()


def test_both_sources_give_the_same_problems(cases, tmp_path):
    """The same run from Kineto and from nsys: identical rows but for what NVTX cannot carry (dtypes, bytes)."""
    run, ops, _ = cases
    k = Job.ingest(write_kineto(run, tmp_path / "k", "new", gemm_ops={0: ops}), db=None, jobs=1)
    n = Job.ingest([write_nsys(run, tmp_path / "n.sqlite", gemm_ops={0: ops})], db=None, jobs=1)
    cols = ["start_ns", "duration_ns", "short_name", "op_name", "m", "n", "k", "batch", "has_bias", "op_gemm_kernels",
            "flops", "bias_flops", "status"]
    try:
        assert k.query("gemm_problems").select(cols).to_dicts() == n.query("gemm_problems").select(cols).to_dicts()
    finally:
        k.close()
        n.close()


# ------------------------------------------------------------------------------------------ tier 4: real traces

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
            "aten::_scaled_mm", "aten::mv"}


def _mnkb(op: str, d: list) -> tuple[int, int, int, int] | None:
    """The file header's argument orders, written again in Python (the real traces hold mm, addmm, bmm, linear,
    matmul)."""
    if op == "aten::mm" and len(d[0]) == 2 and len(d[1]) == 2 and d[0][1] == d[1][0]:
        return d[0][0], d[1][1], d[0][1], 1
    if op == "aten::addmm" and len(d[1]) == 2 and len(d[2]) == 2 and d[1][1] == d[2][0]:
        return d[1][0], d[2][1], d[1][1], 1
    if op == "aten::bmm" and len(d[0]) == 3 and len(d[1]) == 3 and d[0][2] == d[1][1]:
        return d[0][1], d[1][2], d[0][2], d[0][0]
    if op == "aten::linear" and len(d[1]) == 2 and d[0][-1] == d[1][1]:
        return math.prod(d[0][:-1]), d[1][0], d[1][1], 1
    if op == "aten::matmul" and len(d[0]) >= 2 and len(d[1]) == 2 and d[0][-1] == d[1][0]:
        return math.prod(d[0][:-1]), d[1][1], d[1][0], 1
    return None


def _read_events(path: Path) -> tuple[dict, dict, list]:
    """Launch calls by correlation (the earliest: ts ns, pid, tid), matrix-multiply ops per thread (start, end,
    composite flag, name, 'Input Dims') and GEMM kernels (ts ns, dur ns, correlation), from the raw JSON."""
    with gzip.open(path) as f:
        doc = json.loads(f.read())
    launches: dict[int, tuple] = {}
    ops: dict[tuple, list] = defaultdict(list)
    gemms = []
    for e in doc["traceEvents"] if isinstance(doc, dict) else doc:
        if e.get("ph") != "X":
            continue
        cat, a, ts = e.get("cat"), e.get("args") or {}, round(e.get("ts", 0) * 1000)
        if cat in ("cuda_runtime", "cuda_driver") and "correlation" in a:
            c = a["correlation"]
            launches[c] = min(launches.get(c, (ts, e["pid"], e["tid"])), (ts, e["pid"], e["tid"]))
        elif cat == "cpu_op" and e["name"] in GEMM_OPS:
            composite = 1 if e["name"] in ("aten::linear", "aten::matmul") else 0
            ops[(e["pid"], e["tid"])].append((ts, ts + round(e["dur"] * 1000), composite, e["name"],
                                              a.get("Input Dims")))
        elif cat == "kernel" and _is_gemm_name(e["name"]):
            gemms.append((ts, round(e["dur"] * 1000), a.get("correlation")))
    return launches, ops, gemms


def _expected_from_json(path: Path) -> dict[int, tuple]:
    """Per GEMM kernel (by its ts in ns): (op, M, N, K, batch, flops or None) recomputed from the raw events: the
    kernel's launch (runtime/driver event with its correlation, the earliest), then on the launch's thread the
    matrix-multiply op that started last at or before it (innermost on equal starts: the earlier end, mm-like ops
    before linear/matmul) and has not ended; the op's longest GEMM kernel gets the FLOPs."""
    launches, ops, gemms = _read_events(path)
    for v in ops.values():
        v.sort(key=lambda o: (o[0], -o[1], -o[2]))  # per start, the innermost last
    per_op: dict[tuple, list] = defaultdict(list)
    out = {}
    for ts, dur, corr in gemms:
        la = launches.get(corr)
        before = [o for o in ops[(la[1], la[2])] if o[0] <= la[0]] if la else []
        op = before[-1] if before and la[0] <= before[-1][1] else None
        p = _mnkb(op[3], op[4]) if op and op[4] else None
        out[ts] = [op[3] if op else None, p, None]
        if p:
            per_op[(op[0], op[1], op[3])].append((dur, ts))
    for ks in per_op.values():
        dur, ts = sorted(ks, key=lambda x: (-x[0], x[1]))[0]
        m, n, k, b = out[ts][1]
        out[ts][2] = 2 * m * n * k * b
    return {ts: (o, *(p or (None,) * 4), f) for ts, (o, p, f) in out.items()}


def _is_gemm_name(name: str) -> bool:
    """kernel_class 'gemm' for the names these traces hold (checked against the catalog by the test): the base
    name (no return type, template arguments or parameters) names a GEMM, GEMV or split-K reduction; cuBLAS's
    dot_kernel<…cublasGemv…> is not one."""
    bare = name
    while re.search(r"<[^<>]*>", bare):  # template arguments, innermost first
        bare = re.sub(r"<[^<>]*>", "", bare)
    base = bare.split("(")[0].split()[-1].lower() if bare.split("(")[0].split() else ""
    if base.endswith("::kernel"):  # a launch wrapper (cutlass::Kernel<…gemm…>): the wrapped kernel tells
        base = name.lower()
    base = base.replace("fbgemm", "")
    return any(w in base for w in ("gemm", "gemv", "splitkreduce")) and "conv" not in base


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("dataset", ["hta_trace_filter_2rank", "param_dlrm_8rank"])
def test_real_traces_every_shaped_gemm_gets_its_problem(shared_traces, dataset):
    files = sorted((shared_traces / "kineto" / dataset).glob("*.json.gz"))
    job = Job.ingest(files, db=None, jobs=1)
    try:
        got = job.sql("SELECT g.*, f.path, f.clock_offset_ns FROM gemm_problems() g "
                      "JOIN kernels k USING (kernel_id) JOIN files f ON f.file_id = k.file_id").to_dicts()
        n_gemm = job.sql("SELECT count(*) AS n FROM kernels WHERE kernel_class = 'gemm'").to_dicts()[0]["n"]
        assert len(got) == n_gemm
        shaped = 0
        for path in files:
            want = _expected_from_json(path)
            mine = [r for r in got if Path(r["path"]).name == path.name]
            assert len(mine) == len(want), path.name
            for r in mine:
                ts = r["start_ns"] - (r["clock_offset_ns"] or 0)
                op, m, n, k, b, flops = want[ts]
                assert (r["op_name"], r["m"], r["n"], r["k"], r["batch"], r["flops"]) == (op, m, n, k, b, flops), r
                shaped += m is not None
        assert shaped > 0 and shaped == sum(r["m"] is not None for r in got)
    finally:
        job.close()
