"""Kineto python_function events (with_stack=True: PyTorch's Python tracer) stored as cpu_ranges of kind
'python_function' and listed among the host ops behind host-bound lateness (issue 38).

Tier 3: a 2-rank trace built by code, ingested by the importer: rank 1 arrives late at its second all_reduce while
its launching thread runs nested Python frames around aten::mm; late_rank_host_ops' self times and ranking equal a
brute-force computation from the JSON events (each op's direct children found by comparing every pair), and the
frames change nothing else (late_arrival_causes, rank_iteration_breakdown, iterations and the phase of each
collective are those of the same trace without them). Both decoders give the same rows. Tier 4: every real Kineto
trace in ../shared stores as many python_function ranges as its JSON holds (recounted with gzip + json; none of
the traces there was recorded with with_stack, so today the count is 0 on each).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import nsys2comm
from fixtures.kineto_writer import CALL_T0_US, _device_props
from nsys2comm.ingest import kineto
from nsys2comm.ingest.base import ReadOptions

US = 1000
T0 = CALL_T0_US
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
HOST_KINDS = {"cpu_op": "cpu_op", "user_annotation": "user_annotation", "python_function": "python_function",
              "cuda_runtime": "cuda_api"}


def _x(cat, name, pid, tid, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0 + ts, "dur": dur, "args": args}


def _doc(rank: int, second_at: int, frames: bool) -> dict:
    """Two all_reduces (c10d op, nccl annotation, launch, kernel) at 0 and ``second_at`` µs; rank 1 also runs Python
    frames (step > forward > aten::mm with a GEMM launch; step > loss; step > the second all_reduce's ranges)."""
    pid, tid = 100 + rank, 200 + rank
    ev = []
    for i, t in enumerate((0, second_at)):
        c = 1 + i
        ev += [_x("cpu_op", "c10d::allreduce_", pid, tid, t, 100, **{
                   "External id": 10 * c, "Input Dims": [[], [], [], []],
                   "Input type": ["TensorList", "", "", "Scalar"]}),
               _x("user_annotation", "nccl:all_reduce", pid, tid, t + 1, 98, **{
                   "External id": 10 * c + 1, "Input Dims": [[1048576]], "Input type": ["float"]}),
               _x("cuda_runtime", "cudaLaunchKernel", pid, tid, t + 50, 5, correlation=c, **{"External id": c}),
               _x("kernel", AR, 0, 7, t + 60, 40, device=0, stream=7, correlation=c, grid=[8, 1, 1],
                  block=[512, 1, 1], **{"External id": c})]
    if rank == 1:
        ev += [_x("cpu_op", "aten::mm", pid, tid, 300, 100, **{"External id": 50}),
               _x("cuda_runtime", "cudaLaunchKernel", pid, tid, 350, 5, correlation=9, **{"External id": 9}),
               _x("kernel", GEMM, 0, 7, 360, 20, device=0, stream=7, correlation=9, grid=[8, 1, 1],
                  block=[512, 1, 1], **{"External id": 9}),
               # record_function('## backward ##') around the second all_reduce: its phase
               _x("user_annotation", "## backward ##", pid, tid, 1990, 120, **{"External id": 60})]
        if frames:  # "Python id" / "Python parent id" as PyTorch writes them (torch/csrc/profiler/collection.cpp)
            ev += [_x("python_function", "train.py(10): step", pid, tid, 150, 2000,
                      **{"Python id": 1, "Python parent id": None}),
                   _x("python_function", "model.py(20): forward", pid, tid, 200, 700,
                      **{"Python id": 2, "Python parent id": 1}),
                   _x("python_function", "model.py(40): loss", pid, tid, 1000, 500,
                      **{"Python id": 3, "Python parent id": 1}),
                   # a frame named like a phase inside it (activation recomputation): not a phase range
                   _x("python_function", "model.py(60): forward", pid, tid, 2000, 105,
                      **{"Python id": 5, "Python parent id": 1}),
                   # a frame open when the profiler started: with_stack dates it from the start
                   _x("python_function", "train.py(1): <module>", pid, tid, -500, 3000,
                      **{"Python id": 4, "Python parent id": None})]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "deviceProperties": _device_props(1), "traceEvents": ev}


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[bool, list[Path]]:
    out = {}
    for frames in (True, False):
        d = tmp_path_factory.mktemp(f"frames_{frames}")
        paths = []
        for r, second in ((0, 1000), (1, 2000)):
            p = d / f"rank{r}.json"
            p.write_text(json.dumps(_doc(r, second, frames)))
            paths.append(p)
        out[frames] = paths
    return out


@pytest.fixture(scope="module")
def jobs(traces):
    opened = {f: nsys2comm.Job.open(p) for f, p in traces.items()}
    yield opened
    for j in opened.values():
        j.close()


def _brute_host_ops(events: list[dict], tid: int, w_start: int, w_end: int) -> dict[tuple[str, str], list[int]]:
    """(name, kind) -> [calls, self ns] for the ops of ``tid`` starting in [w_start, w_end) (ns on the trace's µs
    clock x 1000): self = duration - the durations of the ops it directly encloses (found by testing every pair),
    counted pro rata of its part inside the window, rounded down per op."""
    ops = [(e["ts"] * US, (e["ts"] + e["dur"]) * US, e["name"], HOST_KINDS[e["cat"]], i)
           for i, e in enumerate(events) if e["cat"] in HOST_KINDS and e["tid"] == tid]

    def encloses(a, b):  # a strictly outside b in the nesting order (longer first at equal starts)
        return a is not b and a[0] <= b[0] and b[1] <= a[1] and (a[0], -a[1], a[4]) < (b[0], -b[1], b[4])

    out: dict[tuple[str, str], list[int]] = {}
    for o in ops:
        if not w_start <= o[0] < w_end:
            continue
        kids = [c for c in ops if encloses(o, c) and not any(encloses(o, m) and encloses(m, c) for m in ops)]
        self_ns = max(o[1] - o[0] - sum(c[1] - c[0] for c in kids), 0)
        part = self_ns * (min(o[1], w_end) - o[0]) // (o[1] - o[0])
        acc = out.setdefault((o[2], o[3]), [0, 0])
        acc[0] += 1
        acc[1] += part
    return out


# tier 3: host ops on a trace built by code, against a brute-force computation from its JSON
def test_host_ops_rank_python_frames_by_self_time(jobs, traces):
    job = jobs[True]
    causes = job.query("late_arrival_causes").rows(named=True)
    late = [c for c in causes if c["lateness_ns"]]
    assert len(late) == 1 and (late[0]["late_rank"], late[0]["primary_cause"]) == (1, "host")
    got = job.query("late_rank_host_ops").rows(named=True)
    assert {(g["window_start_ns"] - T0 * US, g["window_end_ns"] - T0 * US) for g in got} == {(100 * US, 2060 * US)}
    events = json.loads(traces[True][1].read_text())["traceEvents"]
    brute = _brute_host_ops(events, 201, (T0 + 100) * US, (T0 + 2060) * US)
    assert {(g["op_name"], g["op_kind"]): [g["calls"], g["self_ns"]] for g in got} == brute
    ranked = sorted(brute.items(), key=lambda kv: (-kv[1][1], kv[0][0], kv[0][1]))
    assert [(g["op_name"], g["op_kind"]) for g in sorted(got, key=lambda g: g["op_order"])] == [k for k, _ in ranked]
    # by hand: step [150, 2150) holds forward 700, loss 500 and '## backward ##' 120: self 680, of which 1910/2000
    # in the window; forward [200, 900) holds aten::mm: 600; the frame opened before the capture starts before it
    assert [(g["op_name"], g["self_ns"]) for g in got][:4] == [
        ("train.py(10): step", 649_400), ("model.py(20): forward", 600 * US), ("model.py(40): loss", 500 * US),
        ("aten::mm", 95 * US)]
    assert "train.py(1): <module>" not in {g["op_name"] for g in got}


# tier 3: the frames are host ops only; every other figure is that of the trace without them
@pytest.mark.parametrize("query", ["late_arrival_causes", "rank_iteration_breakdown", "iterations",
                                   "_model_op_phases"])
def test_frames_change_nothing_else(jobs, query):
    with_frames, without = (jobs[f].sql(f"SELECT * FROM {query}" + ("()" if not query.startswith("_") else ""))
                            for f in (True, False))
    assert with_frames.height > 0
    assert with_frames.equals(without)


# tier 3: both decoders store the same rows, python_function ranges included (name and interval, no args)
def test_decoders_store_the_same_frames(traces):
    path = traces[True][1]
    rows = {}
    for dec in ("fast", "tolerant"):
        batches = [b.data for b in kineto.read(path, ReadOptions(extra={"kineto_decoder": dec}))
                   if b.table == "cpu_ranges"]
        rows[dec] = [r for t in batches for r in t.to_pylist()]
    assert rows["fast"] == rows["tolerant"]
    frames = [r for r in rows["fast"] if r["kind"] == "python_function"]
    assert sorted((r["name"], r["start_ns"], r["end_ns"], r["tid"], r["pid"]) for r in frames) == sorted(
        (e["name"], e["ts"] * US, (e["ts"] + e["dur"]) * US, e["tid"], e["pid"])
        for e in json.loads(path.read_text())["traceEvents"] if e["cat"] == "python_function")
    assert all(r["args"] is None and r["device_id"] is None for r in frames)
    assert len({r["range_id"] for r in rows["fast"]}) == len(rows["fast"])


# the small real traces (the 54 MB df_index_resolver would take most of this file's time)
SMALL = ("hta_trace_filter_2rank/sampled_rank-0.json.gz", "hta_nccl_parser_config/nccl_data.json.gz",
         "param_dlrm_8rank/worker7_step_12.1694128201553.pt.trace.json.gz")


# tier 4: the real traces, their python_function events recounted from the JSON (gzip + json), not by the importer
@pytest.mark.parametrize("name", SMALL)
def test_real_traces_store_every_python_frame(shared_traces, name):
    path = shared_traces / "kineto" / name
    doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    expected = sum(1 for e in doc["traceEvents"] if e.get("cat") == "python_function" and e.get("ph") == "X")
    with nsys2comm.Job.open([path]) as job:
        n, = job.sql("SELECT count(*) FROM cpu_ranges WHERE kind = 'python_function'").row(0)
    assert n == expected
