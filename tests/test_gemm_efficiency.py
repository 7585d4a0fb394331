"""GEMM efficiency (issue 39 parts 2-4): the peak table (queries/devices/gemm_peaks.sql), gemm_efficiency,
gemm_shape_groups and gemm_overview (queries/gemm/efficiency.sql).

- tier 2: SQL on inline values against hand-computed cases: tile and wave quantization (a wave just above a
  multiple of the SM count, a batch GEMM, split-K, the swapped orientation, a persistent kernel), tile sizes from
  kernel names, dtypes and alignment granularities, device-name matching and the table's own consistency;
- tier 3: a Kineto trace and an nsys export built by code (record_shapes in PyTorch's argument orders): achieved
  TFLOP/s, the physical check, the shape rules with their numbers, the suggested shape and its modelled gain,
  the job figures and MFU, equal to values written down here; both sources give the same rows;
- tier 4: the real traces in ../shared that record shapes: every GEMM kernel's FLOPs / duration recomputed from the
  JSON (test_gemm's independent reader) equals achieved_tflops, and no achieved figure exceeds the listed device's
  peak.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_gemm import _expected_from_json

from fixtures.kineto_writer import GemmOp, write_kineto
from fixtures.nsys_writer import write_nsys
from fixtures.synthetic import T0_NS, US, Kernel, RankRun, Run, Step
from nsys2comm import Job

# ------------------------------------------------------------------------------------------------ tier 2: formulas


def _quant(con, m, n, k, batch, ta, tb, tk, grid, sms) -> dict:
    return con.execute("SELECT _gemm_quant(?::BIGINT, ?::BIGINT, ?::BIGINT, ?::BIGINT, ?::INTEGER, ?::INTEGER, "
                       "?::INTEGER, ?::BIGINT, ?::INTEGER)", [m, n, k, batch, ta, tb, tk, grid, sms]).fetchone()[0]


# tier 2: tile and wave quantization against hand-computed values
def test_wave_just_above_a_multiple_of_the_sm_count(con):
    """1536 × 1536 with 128 × 128 tiles: 12 · 12 = 144 CTAs on 132 SMs = 1.09 waves; the second wave holds 12 CTAs
    (9.1 % of the SMs), so only 144 / 264 = 54.5 % of the two waves' SM time is used."""
    q = _quant(con, 1536, 1536, 4096, 1, 128, 128, 64, 144, 132)
    assert (q["orient"], q["tiles"], q["split_k"], q["ctas"], q["wave_basis"]) == ("blas_grid", 144, 1, 144, "grid")
    assert q["waves"] == pytest.approx(144 / 132) and q["full_waves"] == 2
    assert q["last_wave_fill_pct"] == pytest.approx(100 * 12 / 132)
    assert q["wave_efficiency_pct"] == pytest.approx(100 * 144 / 264)
    assert q["tile_efficiency_pct"] == pytest.approx(100.0)


# tier 2
def test_batch_gemm_tiles_and_partial_tiles(con):
    """bmm, batch 8, M = 100, N = 200, K = 64 with the name's 128 × 64 × 32 tile (128 along PyTorch's N):
    ⌈200/128⌉ · ⌈100/64⌉ · 8 = 32 tiles = the grid; useful share 100·200 / (128·256) (K = 64 fills 2 K tiles)."""
    q = _quant(con, 100, 200, 64, 8, 128, 64, 32, 32, 108)
    assert (q["orient"], q["tile_m"], q["tile_n"], q["tiles"], q["split_k"]) == ("blas_grid", 64, 128, 32, 1)
    assert q["tile_efficiency_pct"] == pytest.approx(100 * 100 * 200 / (128 * 256))
    assert q["waves"] == pytest.approx(32 / 108) and q["last_wave_fill_pct"] == pytest.approx(100 * 32 / 108)


# tier 2
def test_split_k_factor_from_the_grid(con):
    """64 × 64 × 16384 with a 64 × 64 tile is one output tile; a grid of 8 CTAs splits K eight ways."""
    q = _quant(con, 64, 64, 16384, 1, 64, 64, 32, 8, 108)
    assert (q["tiles"], q["split_k"], q["ctas"]) == (1, 8, 8)
    assert q["wave_efficiency_pct"] == pytest.approx(100 * 8 / 108)


# tier 2
def test_swapped_orientation_and_persistent_kernels(con):
    """A grid that counts the tiles only with the name's tile swapped confirms the swap; a grid of one CTA per SM
    (a persistent kernel) does not count tiles: the BLAS orientation is assumed and the waves come from the tiles."""
    q = _quant(con, 256, 128, 64, 1, 256, 64, None, 2, 132)  # BLAS: 1·4 = 4 tiles; swapped: 1·2 = 2 = the grid
    assert (q["orient"], q["tile_m"], q["tile_n"], q["tiles"], q["split_k"]) == ("swapped_grid", 256, 64, 2, 1)
    p = _quant(con, 1536, 1536, 4096, 1, 128, 128, 64, 132, 132)
    assert (p["orient"], p["ctas"], p["wave_basis"], p["split_k"]) == ("blas_assumed", 144, "tiles", None)
    u = _quant(con, 1536, 1536, 4096, 1, None, None, None, 100, 132)
    assert (u["orient"], u["ctas"], u["wave_basis"], u["tile_efficiency_pct"]) == (None, 100, "grid", None)


@pytest.mark.parametrize("op, dims, strides, want", [
    # a real record (PyTorch 2.x 'Input Strides'): mm(x, w.t()) with w [128, 2048] row-major: B held transposed
    ("aten::mm", [[38, 2048], [2048, 128]], [[2048, 1], [1, 2048]], "NT"),
    ("aten::addmm", [[512], [64, 256], [256, 512], [], []], [[1], [1, 64], [512, 1], [], []], "TN"),
    ("aten::bmm", [[8, 64, 32], [8, 32, 16]], [[2048, 32, 1], [512, 1, 32]], "NT"),
    # linear(x, weight [N, K] row-major) computes x · weightᵀ: B is held transposed
    ("aten::linear", [[8, 512, 1024], [3000, 1024], [3000]], [[524288, 1024, 1], [1024, 1], [1]], "NT"),
    ("aten::linear", [[8, 512, 1024], [3000, 1024], []], [[524288, 1024, 1], [1, 3000], []], "NN"),  # W.t()
    ("aten::mm", [[4, 8], [8, 2]], [[16, 2], [2, 1]], None),  # a strided slice: neither layout
    ("aten::mm", [[4, 8], [8, 2]], None, None),  # no strides recorded (PyTorch < 2.1, NVTX sizes)
])
def test_transposes_from_recorded_strides(con, op, dims, strides, want):  # tier 2
    got = con.execute("SELECT _gemm_transposes(?, ?::BIGINT[][], ?::BIGINT[][])", [op, dims, strides]).fetchone()[0]
    assert got == want


@pytest.mark.parametrize("name, tile", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     (128, 256, 64)),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel"
     "__5x_cublas", (64, 256, 8)),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x256_32x3_tn_align4>(cutlass_80_tensorop_s1688gemm_"
     "128x256_32x3_tn_align4::Params)", (128, 256, 32)),
    ("nvjet_tst_192x208_64x4_1x1_h_bz_coopB_bias_TNT", (192, 208, 64)),
    # names from a PyTorch 2.11 profile on an H200 (the device check of issue 39)
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", (256, 128, 64)),
    ("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT", (128, 128, 128)),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::"
     "Params)", (256, 128, 8)),
    ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_nn_align1>(cutlass_75_tensorop_bf16_"
     "s1688gemm_bf16_256x128_nn_align1::Params)", (256, 128, None)),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", (128, 64, 64)),
    ("ampere_sgemm_32x128_tn", (32, 128, None)),
    ("volta_sgemm_32x32_sliced1x4_tn", (32, 32, None)),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1", (128, 128, 32)),
    ("void cutlass::gemm::kernel::Gemm<cutlass::gemm::threadblock::MmaPipelined<cutlass::gemm::GemmShape<128, 64, "
     "8>, float>>(Params)", (128, 64, 8)),
    ("gemmSN_TN_kernel", None),
    ("void splitKreduce_kernel<32, 16, int, float>(cublasSplitKParams<float>)", None),
])
def test_tile_from_kernel_name(con, name, tile):  # tier 2
    got = con.execute("SELECT _gemm_tile(?)", [name]).fetchone()[0]
    assert (None if got is None else (got["a"], got["b"], got["k"])) == tile


@pytest.mark.parametrize("name, recorded, dtype, math", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", None, "bfloat16", "bf16"),
    ("cutlass_80_tensorop_s1688gemm_128x128_32x5_tn_align4", "float32", "float32", "tf32"),
    ("ampere_sgemm_32x128_tn", "float32", "float32", "fp32"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_64x3_nn", None, "float16", "fp16"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128", None, "float8_e4m3", "fp8"),
    ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x32", None, "bfloat16", "bf16"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", None, None, None),
    ("cutlass_80_simt_sgemm_256x128_8x4_nn_align1", "float32", "float32", "fp32"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x256x32_warpgroupsize2x1x1", "float32", "float32", "tf32"),
    ("cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_nn_align1", None, "bfloat16", "bf16"),
])
def test_dtype_and_math_type(con, name, recorded, dtype, math):  # tier 2
    got = con.execute("SELECT coalesce(?, _gemm_name_dtype(?)) AS d, _gemm_math(coalesce(?, _gemm_name_dtype(?)), ?)",
                      [recorded, name, recorded, name, name]).fetchone()
    assert got == (dtype, math)


def test_alignment_granularities(con):  # tier 2: 16 bytes minimum, 128 bytes preferred
    got = {d: con.execute("SELECT _gemm_align(?)", [d]).fetchone()[0] for d in
           ("bfloat16", "float16", "float8_e4m3", "float32", "int8")}
    assert {d: (a["min"], a["preferred"]) for d, a in got.items()} == {
        "bfloat16": (8, 64), "float16": (8, 64), "float8_e4m3": (16, 128), "float32": (4, 32), "int8": (16, 128)}
    assert con.execute("SELECT _gemm_align(NULL)").fetchone()[0] is None


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"), ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"), ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA A100-PG509-200", "A100 SXM 40GB"), ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-PCIE-16GB", "V100 PCIe"), ("Tesla V100S-PCIE-32GB", "V100S PCIe"), ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"), ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI250X / MI250", "MI250X (per GCD)"), ("AMD Instinct MI250", "MI250 (per GCD)"),
    ("NVIDIA GeForce RTX 4090", None), (None, None),
])
def test_device_names_match_the_peak_table(con, name, model):  # tier 2
    got = con.execute("SELECT _devices_gemm_match(?)", [name]).fetchone()[0]
    assert (got["model"] if got else None) == model


def test_peak_table_is_consistent(con):
    """tier 2: dense figures only: FP16 and BF16 equal, FP8 twice BF16, TF32 half of BF16 where present (within
    the datasheets' rounding), FP32 below TF32; every device has a bandwidth and an SM count."""
    cur = con.execute("SELECT * FROM gemm_device_table()")
    cols = [d[0] for d in cur.description]
    rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    assert len(rows) >= 18 and len({r["model"] for r in rows}) == len(rows)
    for r in rows:
        assert r["mem_bandwidth_gbps"] > 0 and r["sm_count"] > 0 and r["source"], r
        if r["bf16_tflops"] is not None:
            assert r["fp16_tflops"] == r["bf16_tflops"], r
        if r["fp8_tflops"] is not None:
            assert r["fp8_tflops"] == pytest.approx(2 * r["bf16_tflops"], rel=2e-3), r
        if r["tf32_tflops"] is not None:
            assert r["tf32_tflops"] == pytest.approx(r["bf16_tflops"] / 2, rel=3e-2), r  # B200: 2.2 PF sparse
            assert r["fp32_tflops"] < r["tf32_tflops"], r


# ------------------------------------------------------------------------------------------ tier 3: built traces

H100_SMS, H100_BF16, H100_BW = 132, 989.5, 3350.0
XMMA = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize{}_warpgroupsize1x1x1_execute_segment_k_off_kernel"
BF16 = "c10::BFloat16"
TID = 4100
# (op, dims, types, kernel name, grid, duration µs); M, N, K as PyTorch records them
CASES = [
    # the example: K = 1365 breaks the bf16 minimum of 8; tile 128 (N) × 256 (M): ⌈5120/128⌉·⌈4096/256⌉ = 640
    ("aten::mm", [[4096, 1365], [1365, 5120]], [BF16, BF16], XMMA.format("128x256x64"), (40, 16, 1), 100),
    # aligned, a wave just above 132 SMs: 12·12 = 144 CTAs
    ("aten::mm", [[1536, 4096], [4096, 1536]], [BF16, BF16], XMMA.format("128x128x64"), (12, 12, 1), 50),
    # linear [8, 512, 1024] · [3000, 1024]ᵀ: M = 4096, N = 3000 (a multiple of 8, not of 64), K = 1024
    ("aten::linear", [[8, 512, 1024], [3000, 1024], [3000]], [BF16, BF16, BF16], XMMA.format("128x128x64"),
     (24, 32, 1), 60),
    # faster than the H100's bf16 peak: 2·4096·4096·4096 FLOPs in 10 µs = 13 744 TFLOP/s, physically impossible
    ("aten::mm", [[4096, 4096], [4096, 4096]], [BF16, BF16], XMMA.format("128x128x64"), (32, 32, 1), 10),
]


def _run():
    rr = RankRun(rank=0, pid=TID, tid=TID, device=0, steps=[Step(1, T0_NS, T0_NS + 50_000 * US)])
    ops = []
    for i, (op, dims, types, kname, grid, dur) in enumerate(CASES):
        s = T0_NS + (100 + 1000 * i) * US
        ops.append(GemmOp(op, dims, types, s, s + 60 * US, TID))
        rr.kernels.append(Kernel(rank=0, device=0, stream=7, start_ns=s + 200 * US, end_ns=s + (200 + dur) * US,
                                 name=kname, correlation=900 + i, grid=grid, block=(256, 1, 1),
                                 launch_start_ns=s + 10 * US, launch_end_ns=s + 12 * US, launch_tid=TID))
    return Run(world_size=1, nccl_era="new", ranks=[rr]), {0: ops}


@pytest.fixture(scope="module")
def kineto_job(tmp_path_factory):
    run, ops = _run()
    job = Job.ingest(write_kineto(run, tmp_path_factory.mktemp("geff-k"), "new", gemm_ops=ops), db=None, jobs=1)
    yield job
    job.close()


@pytest.fixture(scope="module")
def nsys_file(tmp_path_factory) -> Path:
    """The same run as an nsys 3.25 export with emit_nvtx sizes (no dtypes, no device name)."""
    run, ops = _run()
    return write_nsys(run, tmp_path_factory.mktemp("geff-n") / "n.sqlite", gemm_ops=ops)


@pytest.fixture(scope="module")
def nsys_job(nsys_file):
    job = Job.ingest([nsys_file], db=None, jobs=1)
    yield job
    job.close()


def test_achieved_rate_and_the_physical_check(kineto_job):
    """tier 3: achieved = 2·M·N·K / duration against the H100 SXM's dense bf16 peak (989.5 TFLOP/s); the kernel
    that would run at 13 744 TFLOP/s is withheld and flagged, never shown as achieved."""
    rows = sorted(kineto_job.query("gemm_efficiency").to_dicts(), key=lambda r: r["start_ns"])
    assert [r["status"] for r in rows] == ["main"] * 4
    for r, (_, _, _, _, _, dur) in zip(rows, CASES, strict=True):
        flops = 2 * r["m"] * r["n"] * r["k"]
        assert r["flops"] == flops and r["device_model"] == "H100 SXM" and r["math"] == "bf16"
        assert r["peak_tflops"] == H100_BF16 and r["mem_bandwidth_gbps"] == H100_BW
        raw = flops / (dur * 1e3) / 1e3
        if raw <= H100_BF16:
            assert r["achieved_tflops"] == pytest.approx(raw) and r["physically_possible"] is True
            assert r["pct_of_peak"] == pytest.approx(100 * raw / H100_BF16) and r["efficiency_check"] == "ok"
        else:
            assert r["achieved_tflops"] is None and r["pct_of_peak"] is None
            assert r["physically_possible"] is False and r["efficiency_check"] == "above_peak"
    mm = rows[0]  # roofline: intensity = flops / bytes of A, B and C in bf16
    ai = 2 * 4096 * 5120 * 1365 / (2 * (4096 * 1365 + 1365 * 5120 + 4096 * 5120))
    assert mm["arithmetic_intensity"] == pytest.approx(ai)
    assert mm["ridge_flops_per_byte"] == pytest.approx(H100_BF16 * 1000 / H100_BW)
    assert mm["bound"] == ("compute" if ai >= H100_BF16 * 1000 / H100_BW else "memory")


def _model_time(m, n, k, tm, tn, tk, sms):
    return math.ceil(math.ceil(m / tm) * math.ceil(n / tn) / sms) * math.ceil(k / tk)


def test_shape_rules_with_numbers(kineto_job):
    """tier 3: per shape group, the first rule broken, its detail, the suggested shape and the modelled gain."""
    g = {(r["m"], r["n"], r["k"]): r for r in kineto_job.query("gemm_shape_groups").to_dicts()}
    a = g[(4096, 5120, 1365)]
    assert (a["rule_broken"], a["misaligned_dims"], a["align_min"], a["align_preferred"]) == ("alignment", "K", 8, 64)
    assert a["rule_detail"].startswith("K=1365 not a multiple of 8 (bfloat16")
    assert (a["tile_m"], a["tile_n"], a["tile_k"], a["tile_orientation"], a["ctas"]) == (256, 128, 64, "grid", 640)
    assert (a["suggested_m"], a["suggested_n"], a["suggested_k"]) == (4096, 5120, 1408)
    t0, t1 = _model_time(4096, 5120, 1365, 256, 128, 64, 132), _model_time(4096, 5120, 1408, 256, 128, 64, 132)
    assert a["expected_gain_pct"] == pytest.approx(100 * ((1408 / t1) / (1365 / t0) - 1))
    assert a["gain_basis"].startswith("estimate:")
    assert a["efficiency_pct"] == pytest.approx(100 * 2 * 4096 * 5120 * 1365 / 100e3 / 1e3 / H100_BF16)
    w = g[(1536, 1536, 4096)]
    assert (w["rule_broken"], w["suggested_m"], w["expected_gain_pct"]) == ("wave_quantization", None, None)
    assert w["waves"] == pytest.approx(144 / 132) and w["wave_efficiency_pct"] == pytest.approx(100 * 144 / 264)
    assert "144 CTAs on 132 SMs = 1.09 waves, the last 9.1 % full" in w["rule_detail"]
    lin = g[(4096, 3000, 1024)]
    assert (lin["rule_broken"], lin["unpreferred_dims"], lin["suggested_n"]) == ("preferred_alignment", "N", 3008)
    big = g[(4096, 4096, 4096)]
    assert big["above_peak_ops"] == 1 and big["achieved_tflops"] is None and big["efficiency_pct"] is None
    assert [r["total_ns"] for r in g.values()] == sorted((r["total_ns"] for r in g.values()), reverse=True)


def test_job_figures_and_mfu(kineto_job):
    """tier 3: the job row: GEMM share of busy time, time-weighted efficiency over the ops within the peak, the
    share below 40 %, and MFU = 6·P·tokens / (iteration time × peak) for a model given by its parameter count."""
    r = kineto_job.query("gemm_overview", params=1e9, seq=2048, micro_batch=1, model_dtype="bf16").row(0, named=True)
    ok = [(m, n, k, d) for (_, _, _, _, _, d), (m, n, k) in zip(
        CASES, [(4096, 5120, 1365), (1536, 1536, 4096), (4096, 3000, 1024), (4096, 4096, 4096)], strict=True)
        if 2 * m * n * k / (d * 1e3) / 1e3 <= H100_BF16]
    ideal = sum(2 * m * n * k / H100_BF16 / 1e3 for m, n, k, _ in ok)
    taken = sum(d * 1e3 for *_, d in ok)
    assert r["covered_ns"] == taken and r["above_peak_ops"] == 1
    assert r["gemm_efficiency_pct"] == pytest.approx(100 * ideal / taken)
    low = sum(d * 1e3 for m, n, k, d in ok if 100 * 2 * m * n * k / (d * 1e3) / 1e3 / H100_BF16 < 40)
    assert r["low_efficiency_time_pct"] == pytest.approx(100 * low / taken)
    assert r["gemm_time_pct"] == pytest.approx(100 * r["gemm_ns"] / r["busy_ns"]) and r["gemm_ns"] == 220_000
    assert r["iterations"] == 1 and r["iteration_ns"] == 50_000 * US
    assert r["mfu_pct"] == pytest.approx(100 * 6e9 * 2048 / (50_000 * US * H100_BF16 * 1e3))
    assert "6·P FLOPs per token" in r["mfu_basis"] and r["mfu_reason"] is None
    none = kineto_job.query("gemm_overview").row(0, named=True)
    assert none["mfu_pct"] is None and none["mfu_reason"].startswith("no model given")


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_peak_override_and_unknown_device(kineto_job, nsys_job):
    """tier 3: --peak-tflops replaces the table's figure; a device the trace does not name has no peak, and says why."""
    try:
        kineto_job.set_peaks(peak_tflops=500.0)
        r = kineto_job.query("gemm_efficiency").to_dicts()[1]
        assert (r["peak_tflops"], r["peak_source"]) == (500.0, "peak_tflops")
    finally:
        kineto_job.set_peaks()
    u = nsys_job.query("gemm_efficiency").to_dicts()[1]
    assert u["peak_tflops"] is None and u["efficiency_check"] == "no_peak"
    assert u["peak_reason"] == "the trace lists no device name: give --peak-tflops"
    ov = nsys_job.query("gemm_overview").row(0, named=True)
    assert ov["gemm_efficiency_pct"] is None and "give --peak-tflops" in ov["efficiency_reason"]
    groups = nsys_job.query("gemm_shape_groups")  # an unknown device still groups, with NULL efficiency
    assert groups.height == 4 and groups["device_model"].is_null().all() and groups["efficiency_pct"].is_null().all()
    assert set(groups["rule_broken"]) == {"alignment", "wave_quantization", "preferred_alignment", "none"}
    assert kineto_job.query("gemm_efficiency").to_dicts()[1]["peak_source"] == "device_table"


def test_both_sources_give_the_same_efficiency_rows(kineto_job, nsys_job):
    """tier 3: the same run from Kineto (recorded dtypes) and nsys (emit_nvtx sizes; the dtype from the kernel name,
    the peak from --peak-tflops: the 3.25 export names no device) gives identical figures."""
    cols = ["start_ns", "duration_ns", "m", "n", "k", "batch", "dtype", "flops", "math", "peak_tflops",
            "achieved_tflops", "pct_of_peak", "physically_possible", "efficiency_check", "tile_m", "tile_n", "tile_k",
            "tile_orientation", "grid_ctas", "output_tiles", "split_k", "ctas", "sm_count", "waves",
            "last_wave_fill_pct", "wave_efficiency_pct", "tile_efficiency_pct"]
    try:
        for j in (kineto_job, nsys_job):
            j.set_peaks(peak_tflops=H100_BF16)
        a, b = kineto_job.query("gemm_efficiency"), nsys_job.query("gemm_efficiency")
        assert a.select(cols).to_dicts() == b.select(cols).to_dicts()
        assert set(a["dtype_source"]) == {"recorded"} and set(b["dtype_source"]) == {"kernel_name"}
    finally:
        for j in (kineto_job, nsys_job):
            j.set_peaks()


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_summary_keys_and_findings(kineto_job, nsys_job):
    """tier 3: summary --json's gemm_time_pct, gemm_efficiency_pct and mfu_pct are gemm_overview's; null ones are
    named in missing with their reason; the report's finding states the largest group's broken rule."""
    model = "params=1e9,seq=2048,micro_batch=1,dtype=bf16"
    ov = kineto_job.query("gemm_overview", params=1e9, seq=2048, micro_batch=1, model_dtype="bf16").row(0, named=True)
    s = kineto_job.summary(model=model)
    for key in ("gemm_time_pct", "gemm_efficiency_pct", "mfu_pct"):
        assert s[key] == pytest.approx(ov[key], rel=1e-5), key
    n = nsys_job.summary()
    assert n["gemm_efficiency_pct"] is None and n["mfu_pct"] is None and n["gemm_time_pct"] is not None
    assert ("gemm_efficiency_pct: not available (the trace lists no device name: give --peak-tflops)"
            in n["missing"])
    assert any(m.startswith("mfu_pct: not available (no model given") for m in n["missing"])
    from nsys2comm.report.findings import gemm_findings
    texts = [f.text for f in gemm_findings(kineto_job.query("gemm_overview"), kineto_job.query("gemm_shape_groups"))]
    assert any("of the H100 SXM's bf16 peak" in t and "(M=4096, N=5120, K=1365, bfloat16" in t
               and "K=1365 not a multiple of 8" in t for t in texts), texts
    assert any(t.startswith("1 GEMM op(s) would run faster than the device's peak") for t in texts), texts


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_cli_peak_tflops(nsys_file):
    """tier 3: --peak-tflops gives the unnamed device a peak in summary --json; a non-positive value is a usage
    error."""
    import json

    from typer.testing import CliRunner

    from nsys2comm.cli import app
    r = CliRunner().invoke(app, ["summary", str(nsys_file), "--json", "--peak-tflops", "989.5"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["gemm_efficiency_pct"] is not None and 0 < doc["gemm_efficiency_pct"] <= 100
    bad = CliRunner().invoke(app, ["summary", str(nsys_file), "--peak-tflops", "0"])
    assert bad.exit_code != 0 and "peak-tflops must be a positive number of TFLOP/s" in bad.output


# ------------------------------------------------------------------------------------------ tier 4: real traces

@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("dataset", ["hta_trace_filter_2rank", "param_dlrm_8rank"])
def test_real_traces_achieved_never_exceeds_the_peak(shared_traces, dataset):
    """tier 4: every GEMM kernel with a recorded shape: FLOPs from the JSON (test_gemm's reader, not the importer)
    over its duration from the JSON is achieved_tflops, within the listed device's peak for its math type; the DLRM
    ranks list Tesla V100-SXM2-32GB (fp32: 15.7 TFLOP/s), the trace_filter pair lists no device (no peak: NULL with
    its reason)."""
    files = sorted((shared_traces / "kineto" / dataset).glob("*.json.gz"))
    job = Job.ingest(files, db=None, jobs=1)
    try:
        got = job.sql("SELECT e.*, f.path, f.clock_offset_ns FROM gemm_efficiency() e JOIN kernels k USING "
                      "(kernel_id) JOIN files f ON f.file_id = k.file_id").to_dicts()
        checked = 0
        for path in files:
            want = _expected_from_json(path)
            durs = _durations(path)
            for r in (x for x in got if Path(x["path"]).name == path.name):
                ts = r["start_ns"] - (r["clock_offset_ns"] or 0)
                op, m, n, k, b, flops = want[ts]
                assert (r["m"], r["n"], r["k"], r["flops"]) == (m, n, k, flops), r
                if flops is None:
                    assert r["achieved_tflops"] is None
                    continue
                if dataset == "param_dlrm_8rank":
                    assert r["device_model"] == "V100 SXM2" and r["math"] == "fp32" and r["peak_tflops"] == 15.7
                    raw = flops / durs[ts] / 1e3
                    assert raw <= 15.7 and r["achieved_tflops"] == pytest.approx(raw), r
                    assert r["physically_possible"] is True and r["pct_of_peak"] <= 100
                    checked += 1
                else:
                    assert r["peak_tflops"] is None and r["achieved_tflops"] is None
                    assert r["peak_reason"] == "the trace lists no device name: give --peak-tflops"
        assert checked > 0 or dataset != "param_dlrm_8rank"
        assert all(r["achieved_tflops"] is None or r["achieved_tflops"] <= r["peak_tflops"] for r in got)
    finally:
        job.close()


def _durations(path: Path) -> dict[int, int]:
    """GEMM kernels' durations in ns by their ts in ns, straight from the JSON."""
    import gzip
    import json
    with gzip.open(path) as f:
        doc = json.loads(f.read())
    return {round(e["ts"] * 1000): round(e["dur"] * 1000) for e in doc["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "kernel"}


# ------------------------------------------------- tier 4: a real H200 profile with 'Input Strides' (fixtures/)

_H200_TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "h200_gemms" / "h200_gemms.pt.trace.json.gz"


def _layout(d: list, s: list) -> str | None:
    """'N' when the last dimension is contiguous, 'T' when the second-to-last is (a transposed view)."""
    if len(d) < 2 or len(s) != len(d):
        return None
    return "N" if s[-1] == 1 else "T" if s[-2] == 1 else None


def _h200_expected() -> dict[int, tuple]:
    """Per GEMM kernel (its ts in ns): (op, M, N, K, batch, FLOPs, transposes, dur ns, math), straight from the JSON:
    the kernel's launch by correlation, the innermost matrix-multiply op open on the launch's thread, its shapes in
    PyTorch's argument orders (mm/_scaled_mm(a, b); addmm(bias, a, b); bmm(a, b); linear(x, weight [N, K]): B is
    weightᵀ; matmul(x [..., K], w [K, N]) folded into one mm) and the layouts from its strides. Math type from the
    recorded dtype (fp32 kernels named '…tf32…' ran on TF32 tensor cores, which allow_tf32 selects)."""
    import gzip
    import json

    with gzip.open(_H200_TRACE) as f:
        doc = json.loads(f.read())
    launches, ops, kernels = {}, [], []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        a, ts = e.get("args") or {}, round(e["ts"] * 1000)
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in a:
            launches.setdefault(a["correlation"], (ts, e["tid"]))
        elif e.get("cat") == "cpu_op" and e["name"] in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear",
                                                         "aten::matmul", "aten::_scaled_mm"):
            ops.append((ts, ts + round(e["dur"] * 1000), e["tid"], e["name"], a))
        elif e.get("cat") == "kernel":
            kernels.append((ts, round(e["dur"] * 1000), a["correlation"], e["name"]))
    out = {}
    for ts, dur, corr, kname in kernels:
        lts, tid = launches[corr]
        op, _s, _e, a = max(((o[3], o[0], -o[1], o[4]) for o in ops if o[2] == tid and o[0] <= lts <= o[1]),
                            key=lambda o: (o[1], o[2], o[0] not in ("aten::linear", "aten::matmul")))
        d, s, t = a["Input Dims"], a["Input Strides"], a["Input type"]
        if op in ("aten::mm", "aten::_scaled_mm"):
            m, k, n, b, tr = d[0][0], d[0][1], d[1][1], 1, _layout(d[0], s[0]) + _layout(d[1], s[1])
        elif op == "aten::addmm":
            m, k, n, b, tr = d[1][0], d[1][1], d[2][1], 1, _layout(d[1], s[1]) + _layout(d[2], s[2])
        elif op == "aten::bmm":
            b, m, k, n, tr = d[0][0], d[0][1], d[0][2], d[1][2], _layout(d[0], s[0]) + _layout(d[1], s[1])
        elif op == "aten::linear":
            m, k, n, b = math.prod(d[0][:-1]), d[1][1], d[1][0], 1
            tr = _layout(d[0], s[0]) + {"N": "T", "T": "N"}[_layout(d[1], s[1])]
        else:  # matmul, N-D · 2-D
            m, k, n, b, tr = math.prod(d[0][:-1]), d[1][0], d[1][1], 1, _layout(d[0], s[0]) + _layout(d[1], s[1])
        dt = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "c10::Float8_e4m3fn": "fp8", "float": "fp32"}[t[0]]
        if dt == "fp32" and "tf32" in kname:
            dt = "tf32"
        out[ts] = (op, m, n, k, b, 2 * m * n * k * b, tr, dur, dt)
    return out


def test_h200_profile_problems_transposes_and_peak():
    """tier 4: a PyTorch 2.11 profile recorded on an H200 (fixtures/h200_gemms, record_shapes=True, 'Input
    Strides'): every GEMM kernel's M, N, K, batch, FLOPs and transposes recomputed from the JSON equal
    gemm_problems; achieved TFLOP/s (FLOPs / the JSON's duration) equals gemm_efficiency's and stays within the
    H200 SXM peak that queries/devices/gemm_peaks.sql lists for its math type."""
    want = _h200_expected()
    assert len(want) == 33 and {w[6] for w in want.values()} == {"NN", "NT"}
    # hand check of the layouts PyTorch recorded: linear's row-major weight, mm(x, w.t()), _scaled_mm(a, b.t())
    assert {w[0]: w[6] for w in want.values() if w[0] in ("aten::linear", "aten::_scaled_mm", "aten::bmm")} == {
        "aten::_scaled_mm": "NT", "aten::bmm": "NN"}  # linear launches through its addmm (the innermost op)
    assert sorted({(w[1], w[2], w[3], w[6]) for w in want.values() if w[0] == "aten::addmm"}) == [
        (2048, 4096, 1024, "NN"), (4096, 3000, 1024, "NT")]
    job = Job.ingest([_H200_TRACE], db=None, jobs=1)
    try:
        peaks = job.sql("SELECT fp32_tflops, tf32_tflops, fp16_tflops, bf16_tflops, fp8_tflops "
                        "FROM gemm_device_table() WHERE model = 'H200 SXM'").to_dicts()[0]
        got = job.sql("SELECT g.*, e.achieved_tflops, e.peak_tflops, e.math, e.device_model FROM gemm_problems() g "
                      "JOIN gemm_efficiency() e USING (kernel_id) ORDER BY g.start_ns").to_dicts()
        assert len(got) == len(want)
        t0 = min(want)
        t0_job = got[0]["start_ns"]
        for r in got:
            op, m, n, k, b, flops, tr, dur, dt = want[r["start_ns"] - t0_job + t0]
            assert (r["op_name"], r["m"], r["n"], r["k"], r["batch"], r["flops"], r["transposes"]) == (
                op, m, n, k, b, flops, tr), r
            peak = peaks[f"{dt}_tflops"]
            assert (r["device_model"], r["math"], r["peak_tflops"]) == ("H200 SXM", dt, peak), r
            assert r["achieved_tflops"] == pytest.approx(flops / dur / 1e3) and flops / dur / 1e3 <= peak, r
    finally:
        job.close()
