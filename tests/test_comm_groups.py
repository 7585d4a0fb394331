"""Group sizes from the trace, with the assumption carried through, and what communication / convolution kernel
names mean (issue 36 items 3 and 10).

Tier 2: the classification macros (queries/prelude/classify.sql) on inline names with expected values written here.
Tier 3: Kineto jobs built by fixtures/kineto_writer.py (c10d (output, input) ops, record_param_comms, functional
collectives, SymmetricMemory ops), ingested through the normal path; every expected group size and byte count is
computed here from the builder's inputs. Tier 4: the real traces in ../shared, group sizes recomputed straight from
the JSON."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from fixtures.kineto_writer import (
    CommCall,
    allgather_base_call,
    allreduce_call,
    reduce_scatter_base_call,
    write_comm_calls,
)
from nsys2comm.ingest import ingest
from nsys2comm.storage import db

F32 = 4
BF16 = 2



def _ops(paths, **kw):
    c = db.connect(None)
    assert all(r.status == "ingested" for r in ingest(c, paths, jobs=1, **kw))
    return c


def _rows(c, cols="collective, group_size, group_source, in_bytes, out_bytes, msg_bytes"):
    return c.execute(f"SELECT o.rank, {cols} FROM comm_ops o JOIN kernels k USING (kernel_id) "
                     "ORDER BY o.rank, k.start_ns").fetchall()


def _notes(c) -> set[str]:
    return {r[0] for r in c.execute("SELECT code FROM ingest_notes").fetchall()}


# ------------------------------------------------------------------------------------------ tier 2: names

SYMM = {  # kernel name -> (collective, group size the name records)
    "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, "
    "unsigned int**, unsigned long, unsigned long)": ("all_reduce", None),
    "void <unnamed>::multimem_all_reduce_kernel<c10::BFloat16, (int)16>(T1 *, unsigned long, unsigned int **, "
    "unsigned long, unsigned long)": ("all_reduce", None),
    "void (anonymous namespace)::multimem_one_shot_all_reduce_kernel<float, 16>(float*, float*, unsigned long, "
    "unsigned int**, unsigned long, unsigned long)": ("all_reduce", None),
    "void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, c10::BFloat16*, "
    "c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)": ("all_reduce", 8),
    "void <unnamed>::one_shot_all_reduce_kernel<float, (int)8, (int)2>(T1 **, T1 *, T1 *, unsigned long, "
    "unsigned long, unsigned int **, unsigned long, unsigned long)": ("all_reduce", 2),
    "void (anonymous namespace)::one_shot_all_reduce_kernel<float, 16, -1>(float**, float*, float*, unsigned long, "
    "unsigned long, unsigned int**, unsigned long, unsigned long)": ("all_reduce", None),  # -1: any other size
    "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<float, 16, 4>(float**, unsigned long, "
    "unsigned long, unsigned int**, unsigned long, unsigned long)": ("all_reduce", 4),
    "void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8, false, false>(c10::BFloat16**, "
    "c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long, unsigned long)":
        ("all_reduce", 8),
    # reduce_scatter = true: launched by symm_mem::reduce_scatter_out
    "void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8, true, false>(c10::BFloat16**, "
    "c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long, unsigned long)":
        ("reduce_scatter", 8),
    "void <unnamed>::two_shot_all_reduce_kernel<float, (int)16, (int)4, (bool)1, (bool)1>(T1 **, T1 *, "
    "unsigned long, unsigned long, unsigned int **, unsigned long, unsigned long, unsigned long)":
        ("reduce_scatter", 4),
    "void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*, unsigned long, unsigned int**, "
    "unsigned long, unsigned long)": ("all_gather", None),
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": ("all_gather", None),
    "ncclKernel_ReduceScatter_RING_SIMPLE_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": ("reduce_scatter", None),
    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)": (None, None),
}


def test_symmetric_memory_kernels_are_all_reduce_with_their_group(con):
    got = con.execute("SELECT n, kernel_class(n), kernel_name_collective(n), kernel_name_group_size(n) "
                      "FROM (VALUES " + ", ".join("(?)" for _ in SYMM) + ") t(n)", list(SYMM)).fetchall()
    assert {n: (c, coll, g) for n, c, coll, g in got} == {n: ("communication", *v) for n, v in SYMM.items()}


OPS = {  # op or collective name as a trace spells it -> canonical collective
    "symm_mem::multimem_all_reduce_": "all_reduce", "symm_mem::one_shot_all_reduce": "all_reduce",
    "symm_mem::one_shot_all_reduce_copy_out": "all_reduce", "symm_mem::two_shot_all_reduce_": "all_reduce",
    "symm_mem::multimem_one_shot_all_reduce_out": "all_reduce", "symm_mem::reduce_scatter_out": "reduce_scatter",
    "symm_mem::multimem_all_gather_out": "all_gather", "_c10d_functional::all_gather_into_tensor": "all_gather",
    "_c10d_functional::all_gather_into_tensor_out": "all_gather",
    "_c10d_functional::reduce_scatter_tensor": "reduce_scatter", "_c10d_functional::all_reduce_": "all_reduce",
    "_c10d_functional::all_to_all_single": "all_to_all", "c10d_functional::all_reduce": "all_reduce",
    "_c10d_functional::wait_tensor": None, "symm_mem::fused_all_gather_matmul": None,
    "c10d::_allgather_base_": "all_gather", "c10d::_reduce_scatter_base_": "reduce_scatter",
    "nccl:_all_gather_base": "all_gather", "allreduce": "all_reduce", "coalesced": "send_recv",
}


def test_op_spellings_name_their_collective(con):
    got = con.execute("SELECT s, canonical_collective(s) FROM (VALUES " + ", ".join("(?)" for _ in OPS) + ") t(s)",
                      list(OPS)).fetchall()
    assert dict(got) == OPS


CONV = {  # implicit-GEMM convolutions are convolutions; the GEMMs beside them stay GEMMs
    "void ck::kernel_batched_gemm_xdlops_bwd_weight<ck::GridwiseGemm_bk0mk1_bk0nk1_mn_xdlops_bwd_weight<256, "
    "ck::half_t>, ck::half_t, ck::half_t, float, true>(ck::half_t const*, ck::half_t const*, float*)": "convolution",
    "ck::kernel_grouped_conv_bwd_data_multiple_d_xdl_cshuffle": "convolution",
    "ck::kernel_grouped_conv_fwd_multiple_abd_xdl_cshuffle": "convolution",
    "naive_conv_nonpacked_bwd_nchw_half_double_half": "convolution",
    "igemm_bwd_gtcx_nhwc_fp16_bx0_ex1_bt128x128x16": "convolution",
    "igemm_v4r1_dynamic_wrw_128x128x16_8x8_4x4x4x4x4x4_16x1x16x1_4x64": "convolution",
    "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, true, false, true>(int, int, "
    "int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, "
    "float const*, float const*, bool, int, int)": "convolution",
    "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4": "convolution",
    "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64": "convolution",
    "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x64": "convolution",
    # GEMMs
    "void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3<ck::half_t>, true>(ck::half_t*)": "gemm",
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma": "gemm",
    "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1": "gemm",
    # a normalisation backward is neither
    "void ck::kernel_normalization_bwd_data<float>(float const*)": "compute",
}


def test_implicit_gemm_convolutions_are_convolution(con):
    got = con.execute("SELECT n, kernel_class(n) FROM (VALUES " + ", ".join("(?)" for _ in CONV) + ") t(n)",
                      list(CONV)).fetchall()
    assert dict(got) == CONV


# ------------------------------------------------------------------------------------------ tier 3: Kineto jobs


def test_allgather_group_from_the_c10d_output_input_ratio(tmp_path):
    """A 16-rank job whose all_gather group is 8: c10d::_allgather_base_ records [[output], [input]], whose ratio is
    the group. msg_bytes = input x 8 (not x 16), and the reduce_scatter of the same buffer has the same S and group,
    hence the same busbw factor. An all_reduce with no group in the same files is not assumed to span the world:
    the files show a group that does not."""
    world, group, n = 16, 8, 1 << 20  # n: the all_gather's input elements (float32)
    calls = {r: [allgather_base_call(n, group), reduce_scatter_base_call(n, group), allreduce_call(3 * n)]
             for r in (0, 9)}
    c = _ops(write_comm_calls(tmp_path, world, calls))
    full = n * group * F32
    expected = [("all_gather", group, "io_ratio", n * F32, full, full),
                ("reduce_scatter", group, "io_ratio", full, n * F32, full),
                ("all_reduce", None, None, 3 * n * F32, 3 * n * F32, 3 * n * F32)]
    assert _rows(c) == [(r, *e) for r in (0, 9) for e in expected]
    assert "assumed_group_size" not in _notes(c)
    f = c.execute("SELECT DISTINCT busbw_factor(collective, group_size), msg_bytes FROM comm_ops "
                  "WHERE collective IN ('all_gather', 'reduce_scatter')").fetchall()
    assert f == [(pytest.approx((group - 1) / group), full)]


def test_no_group_anywhere_assumes_the_world_and_says_so(tmp_path):
    """Nothing names a group or a size: the world size is assumed, group_source says so (what the catalog's
    group_size_assumed columns read), and a note counts it."""
    world, n = 16, 1000
    c = _ops(write_comm_calls(tmp_path, world, {0: [allreduce_call(n), allreduce_call(2 * n)]}))
    assert _rows(c) == [(0, "all_reduce", world, "assumed_world_size", n * F32, n * F32, n * F32),
                        (0, "all_reduce", world, "assumed_world_size", 2 * n * F32, 2 * n * F32, 2 * n * F32)]
    assert "assumed_group_size" in _notes(c)


def test_ratio_equal_to_the_world_keeps_the_assumption_for_the_rest(tmp_path):
    """An all_gather over the whole world (ratio 16 of 16) shows no other group: the all_reduce beside it still gets
    the assumed world size, flagged, while the all_gather's size is recorded ('io_ratio')."""
    world, n = 16, 64
    c = _ops(write_comm_calls(tmp_path, world, {0: [allgather_base_call(n, world), allreduce_call(n)]}))
    assert _rows(c, "collective, group_size, group_source") == [(0, "all_gather", world, "io_ratio"),
                                                                (0, "all_reduce", world, "assumed_world_size")]


def _rpc(args: dict) -> tuple:
    """A record_param_comms CPU op (PyTorch >= 2.2 args) enclosing the launch; the kernel itself carries no
    collective args (e.g. launched from a CUDA graph or after the scope ended)."""
    base = {"Collective name": "allreduce", "In msg nelems": 256, "Out msg nelems": 256, "dtype": "BFloat16",
            "Process Group Name": "3", "Process Group Description": "tp"}
    return ("cpu_op", "record_param_comms", {**base, **args})


def test_record_param_comms_group_ranks_and_group_size(tmp_path):
    """'Process Group Ranks' gives the group when 'Group size' is absent; a list PyTorch truncated ('[0, 1, ...,
    28, ..., 63]', over 30 ranks before 2.7) is no list: 'Group size' decides, or the size stays unknown (the
    operation names group '3', so the world size is not assumed)."""
    kern = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    truncated = "[" + ", ".join(map(str, range(29))) + ", ..., 63]"
    calls = [CommCall(kern, [_rpc({"Process Group Ranks": "[0, 2, 4, 6]"})]),
             CommCall(kern, [_rpc({"Process Group Ranks": truncated, "Group size": 64})]),
             CommCall(kern, [_rpc({"Process Group Ranks": truncated})])]
    c = _ops(write_comm_calls(tmp_path, 128, {0: calls}))
    b = 256 * BF16
    assert _rows(c, "collective, group_size, group_source, pg_ranks, msg_bytes") == [
        (0, "all_reduce", 4, "record_param_comms", [0, 2, 4, 6], b),
        (0, "all_reduce", 64, "record_param_comms", None, b),
        (0, "all_reduce", None, None, None, b)]


def test_functional_collective_group_size_argument(tmp_path):
    """_c10d_functional::all_gather_into_tensor(input, group_size, group_name): the group_size scalar is in
    'Concrete Inputs' (ivalueListToStr: '' for non-scalars)."""
    n, group = 4096, 8
    call = CommCall("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", [
        ("cpu_op", "_c10d_functional::all_gather_into_tensor",
         {"Input Dims": [[n], [], []], "Input type": ["c10::BFloat16", "Scalar", ""],
          "Concrete Inputs": ["", str(group), ""]})])
    rs = CommCall("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", [
        ("cpu_op", "_c10d_functional::reduce_scatter_tensor",
         {"Input Dims": [[n * group], [], [], []], "Input type": ["c10::BFloat16", "", "Scalar", ""],
          "Concrete Inputs": ["", "", str(group), ""]})])
    c = _ops(write_comm_calls(tmp_path, 32, {0: [call, rs]}))
    assert _rows(c, "collective, group_size, group_source, msg_bytes") == [
        (0, "all_gather", group, "launch_annotation", n * BF16 * group),
        (0, "reduce_scatter", group, "launch_annotation", n * group * BF16)]


def test_symmetric_memory_ops_and_kernels(tmp_path):
    """A one-shot all-reduce under symm_mem::one_shot_all_reduce: all_reduce, its size from the op's input, its group
    from the kernel's k_world_size (4). A multimem all-reduce launched with no op around it: all_reduce by name, no
    size, and no assumed group (the file shows a group of 4 in an 8-rank job)."""
    n = 1 << 16
    one = CommCall("void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 4>(c10::BFloat16**, "
                   "c10::BFloat16*, c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, "
                   "unsigned long)",
                   [("cpu_op", "symm_mem::one_shot_all_reduce", {"Input Dims": [[n], [], []],
                                                                 "Input type": ["c10::BFloat16", "", ""],
                                                                 "Concrete Inputs": ["", "", ""]})])
    mm = CommCall("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, "
                  "unsigned long, unsigned int**, unsigned long, unsigned long)", [])
    c = _ops(write_comm_calls(tmp_path, 8, {0: [one, mm]}))
    assert _rows(c, "collective, collective_source, group_size, group_source, msg_bytes") == [
        (0, "all_reduce", "launch_annotation", 4, "kernel_name", n * BF16),
        (0, "all_reduce", "kernel_name", None, None, None)]
    assert c.execute("SELECT count(*) FROM comm_ops WHERE collective = 'unknown'").fetchone()[0] == 0


# ------------------------------------------------------------------------------------------ tier 4: real traces


def _world_and_ratios(path) -> tuple[int, list[int]]:
    """distributedInfo.world_size and every c10d::_allgather_base_ output/input ratio, straight from the JSON."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    ratios = []
    for e in doc["traceEvents"]:
        if e.get("name") == "c10d::_allgather_base_":
            out, inp = (math.prod(d) for d in e["args"]["Input Dims"][:2])
            ratios.append(out // inp)
    return doc["distributedInfo"]["world_size"], ratios


def test_shared_trace_allgather_group_is_the_recorded_ratio(shared_traces):
    """hta trace_filter (ranks 0 and 1 of a 128-rank DLRM job): each all_gather's group is the c10d op's ratio (64),
    never the world size, and nothing in these files is assumed to span the world."""
    paths = sorted((shared_traces / "kineto" / "hta_trace_filter_2rank").glob("*.json.gz"))
    c = _ops(paths)
    for p in paths:
        world, ratios = _world_and_ratios(p)
        assert ratios and world == 128 and set(ratios) == {64}
    got = c.execute("SELECT collective, group_size, group_source, count(*) FROM comm_ops "
                    "WHERE collective = 'all_gather' GROUP BY ALL").fetchall()
    assert got == [("all_gather", 64, "io_ratio", sum(len(_world_and_ratios(p)[1]) for p in paths))]
    assert c.execute("SELECT count(*) FROM comm_ops WHERE group_source = 'assumed_world_size'").fetchone()[0] == 0
