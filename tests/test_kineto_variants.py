"""Kineto format variants users still have, and values no trace can hold (issue 9 items 4 and 5).

Every variant is built here as a small JSON document and ingested through the normal path; each bad value either
refuses the file with a one-line error that names it, or is stored right with an ingest note."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from nsys2comm.errors import InputError
from nsys2comm.ingest import ingest
from nsys2comm.storage import db

EPOCH_US = 1_700_000_000_000_000
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _doc(events, **top) -> dict:
    d = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
         "traceEvents": events}
    d.update(top)
    return d


def _kernel(**kw) -> dict:
    e = {"ph": "X", "cat": "kernel", "name": NCCL, "pid": 0, "tid": 7, "ts": EPOCH_US, "dur": 10,
         "args": {"device": 0, "stream": 7, "correlation": 5}}
    e.update(kw)
    return e


def _ingest(path: Path, text: str | bytes, **kw):
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    con = db.connect(None)
    ingest(con, [path], jobs=1, **kw)
    return con


def _notes(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT code FROM ingest_notes").fetchall()}


# ---------------------------------------------------------------------------------------------- format variants


def test_2020_category_spellings_lowercase_external_id_and_stream_tids(tmp_path):
    """≈1.8-1.9 traces: Operator/Runtime/Kernel/Memcpy/Memset, 'external id', GPU tids like 'stream 7 '."""
    ev = [
        {"ph": "X", "cat": "Operator", "name": "nccl:all_reduce", "pid": 10, "tid": 11, "ts": EPOCH_US, "dur": 50,
         "args": {"external id": 3, "Input Dims": [[256]], "Input type": ["float"]}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": EPOCH_US + 5,
         "dur": 5, "args": {"correlation": 77, "external id": 3}},
        {"ph": "X", "cat": "Kernel", "name": NCCL, "pid": 0, "tid": "stream 7 ", "ts": EPOCH_US + 20, "dur": 10,
         "args": {"correlation": 77, "external id": 3}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": "stream 13",
         "ts": EPOCH_US + 40, "dur": 2, "args": {"correlation": 78, "bytes": 64}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 13", "ts": EPOCH_US + 45,
         "dur": 1, "args": {"correlation": 79, "bytes": 32}},
    ]
    con = _ingest(tmp_path / "old.json", json.dumps(_doc(ev)))
    assert con.execute("SELECT stream_id, start_ns FROM kernels").fetchall() == [(7, (EPOCH_US + 20) * 1000)]
    assert con.execute("SELECT kind, copy_kind, stream_id, bytes FROM mem_ops ORDER BY start_ns").fetchall() == [
        ("memcpy", "HtoD", 13, 64), ("memset", None, 13, 32)]
    assert con.execute("SELECT count(*) FROM api_calls WHERE correlation_id = 77").fetchone()[0] == 1
    args = json.loads(con.execute("SELECT args FROM cpu_ranges WHERE name = 'nccl:all_reduce'").fetchone()[0])
    assert args["External id"] == 3 and "external id" not in args  # stored under the current name
    assert con.execute("SELECT collective, msg_bytes, collective_source FROM comm_ops").fetchall() == [
        ("all_reduce", 1024, "launch_annotation")]


def test_old_msg_size_keys_are_element_counts(tmp_path):
    """'In msg size'/'Out msg size' (PyTorch 2.2, before kineto #849) count elements, like 'In msg nelems'."""
    k = _kernel(args={"device": 0, "stream": 7, "correlation": 5, "Collective name": "allgather",
                      "In msg size": 100, "Out msg size": 200, "dtype": "Float", "Group size": 2,
                      "Process Group ID": "0"})
    con = _ingest(tmp_path / "t.json", json.dumps(_doc([k])))
    assert con.execute("SELECT collective, in_bytes, out_bytes, msg_bytes, pg_name FROM comm_ops").fetchall() == [
        ("all_gather", 400, 800, 800, "0")]


@pytest.mark.parametrize("where", ["block", "tail"])
def test_epoch_ts_with_a_nanosecond_fraction_is_exact(tmp_path, where):
    """1700000000123456.789 µs is not a float64: the digits give 1700000000123456789 ns exactly."""
    ts = "1700000000123456.789"
    k = json.dumps(_kernel(ts=0)).replace('"ts": 0', f'"ts": {ts}')
    filler = ",".join(json.dumps(_kernel(ts=EPOCH_US + i, name="gemm_kernel")) for i in range(3))
    events = f"{k},{filler}" if where == "block" else f"{filler},{k}"
    text = '{"schemaVersion": 1, "traceEvents": [' + events + ']}'
    con = db.connect(None)
    path = tmp_path / "t.json"
    path.write_text(text)
    from nsys2comm.ingest import ReadOptions  # noqa: F401  (the block size is the reader's own)
    ingest(con, [path], jobs=1)
    got = con.execute("SELECT start_ns, end_ns FROM kernels WHERE name = ?", [NCCL]).fetchone()
    assert got == (1700000000123456789, 1700000000123466789)
    assert float(ts) * 1000 != 1700000000123456789  # the float route would be wrong


def test_graph_replay_one_launch_many_kernels(tmp_path):
    """A CUDA graph launch owns every kernel it replays: each gets the collective and size of the launch's range."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 10, "tid": 11, "ts": EPOCH_US,
           "dur": 100, "args": {"Input Dims": [[1000]], "Input type": ["c10::BFloat16"]}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 10, "tid": 11, "ts": EPOCH_US + 10,
           "dur": 5, "args": {"correlation": 9}}]
    ev += [_kernel(ts=EPOCH_US + 20 + 15 * i, args={"device": 0, "stream": 7, "correlation": 9, "graph id": 1})
           for i in range(3)]
    con = _ingest(tmp_path / "g.json", json.dumps(_doc(ev)))
    assert con.execute("SELECT collective, msg_bytes, dtype, group_size, group_source FROM comm_ops").fetchall() == [
        ("all_reduce", 2000, "bfloat16", 2, "assumed_world_size")] * 3
    assert con.execute("SELECT count(DISTINCT graph_id) FROM kernels").fetchone()[0] == 1


def test_cpu_only_trace_and_collectives_without_kernels(tmp_path):
    """No GPU kernels (a CPU-only or MTIA trace) and collectives that launched none (a size-1 group): ingested with
    notes; no communication is invented, so nothing reads as a measured 0."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": EPOCH_US, "dur": 4,
           "args": {"Collective name": "allreduce", "In msg nelems": 10, "Out msg nelems": 10, "dtype": "Float",
                    "Group size": 1}},
          {"ph": "X", "cat": "mtia_runtime", "name": "mtiaLaunch", "pid": 1, "tid": 1, "ts": EPOCH_US + 1,
           "dur": 1, "args": {"correlation": 3}}]
    con = _ingest(tmp_path / "cpu.json", json.dumps(_doc(ev)))
    assert {"no_gpu_kernels", "collectives_without_kernels"} <= _notes(con)
    assert con.execute("SELECT count(*) FROM comm_ops").fetchone()[0] == 0
    from nsys2comm.summary import build_summary

    s = build_summary(con)
    for key in ("gpu_busy_ns", "comm_ns", "exposed_comm_ns", "comm_share_pct", "overlap_pct"):
        assert s[key] is None and any(m.startswith(f"{key}: not available") for m in s["missing"]), key


def test_distributed_info_pg_config_names_the_group(tmp_path):
    """pg_config (PyTorch >= 2.3) gives a named group's size; 'ranks' may be a string (Kineto's on-demand writer)."""
    dist = {"backend": "nccl", "rank": 0, "world_size": 8, "nccl_version": "2.21.5",
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 8,
                           "ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"},
                          {"pg_name": "3", "pg_desc": "tp", "backend_config": "cuda:nccl", "pg_size": 2,
                           "ranks": [0, 1]}]}
    k = _kernel(args={"device": 0, "stream": 7, "correlation": 5, "Collective name": "allreduce",
                      "In msg nelems": 8, "Out msg nelems": 8, "dtype": "Float", "Process Group Name": "3"})
    con = _ingest(tmp_path / "t.json", json.dumps(_doc([k], distributedInfo=dist)))
    assert con.execute("SELECT group_size, group_source, pg_desc, pg_ranks FROM comm_ops").fetchall() == [
        (2, "pg_config", "tp", [0, 1])]
    assert con.execute("SELECT comm_library_version FROM files").fetchone()[0] == "NCCL 2.21.5"
    assert con.execute("SELECT pg_name, group_size, pg_ranks FROM process_groups ORDER BY 1").fetchall() == [
        ("0", 8, [0, 1, 2, 3, 4, 5, 6, 7]), ("3", 2, [0, 1])]


def test_world_size_flag_when_the_trace_has_none(tmp_path):
    k = _kernel()
    ev = [{"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 10, "tid": 11, "ts": EPOCH_US - 30,
           "dur": 40, "args": {"Input Dims": [[4]], "Input type": ["float"]}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": EPOCH_US - 20,
           "dur": 5, "args": {"correlation": 5}}, k]
    text = json.dumps({"schemaVersion": 1, "traceEvents": ev})
    con = _ingest(tmp_path / "rank-1.json", text)
    assert con.execute("SELECT group_size FROM comm_ops").fetchone()[0] is None
    con = _ingest(tmp_path / "rank-1.json", text, world_size=4)
    assert con.execute("SELECT world_size FROM ranks").fetchone()[0] == 4
    assert con.execute("SELECT group_size, group_source FROM comm_ops").fetchall() == [(4, "assumed_world_size")]
    assert "world_size_from_cli" in _notes(con)


# ---------------------------------------------------------------------------------------------- bad values

BAD = {  # name: (JSON text, words the one-line error must hold)
    "dur_nan": (json.dumps(_doc([_kernel(dur=float("nan"))])), "not finite"),
    "dur_infinity": (json.dumps(_doc([_kernel(dur=float("inf"))])), "not finite"),
    "dur_1e400": (json.dumps(_doc([_kernel(dur=1)])).replace('"dur": 1', '"dur": 1e400'), "outside the int64"),
    "ts_nan": (json.dumps(_doc([_kernel(ts=float("nan"))])), "not finite"),
    "ts_2_63": (json.dumps(_doc([_kernel(ts=2**63)])), "outside the int64"),
    "ts_2_64": (json.dumps(_doc([_kernel(ts=2**64 + 5)])), "outside the int64"),
    "ts_ns_overflow": (json.dumps(_doc([_kernel(ts=2**62)])), "outside the int64"),
    "dur_2_63": (json.dumps(_doc([_kernel(dur=2**63)])), "outside the int64"),
    "correlation_2_63": (json.dumps(_doc([_kernel(args={"device": 0, "stream": 7, "correlation": 2**63})])),
                         "correlation_id"),
    "stream_2_63": (json.dumps(_doc([_kernel(args={"device": 0, "stream": 2**63, "correlation": 5})])), "stream_id"),
    "pid_2_63": (json.dumps(_doc([_kernel(cat="cuda_runtime", name="cudaLaunchKernel", pid=2**63)])), "pid"),
    "device_int32": (json.dumps(_doc([_kernel(args={"device": 2**31, "stream": 7, "correlation": 5})])),
                     "device_id"),
    "grid_int32": (json.dumps(_doc([_kernel(args={"device": 0, "stream": 7, "correlation": 5,
                                                  "grid": [2**31, 1, 1]})])), "grid_x"),
    "rank_int32": (json.dumps(_doc([_kernel()], distributedInfo={"rank": 2**31, "world_size": 2})),
                   "distributedInfo.rank"),
    "rank_negative": (json.dumps(_doc([_kernel()], distributedInfo={"rank": -3, "world_size": 2})),
                      "distributedInfo.rank"),
    "world_size_int32": (json.dumps(_doc([_kernel()], distributedInfo={"rank": 0, "world_size": 2**31})),
                         "distributedInfo.world_size"),
    "deeply_nested_kernel_args": (json.dumps(_doc([_kernel()])).replace(
        '"correlation": 5', '"correlation": 5, "deep": ' + "[" * 100_000 + "]" * 100_000), "nested deeper"),
    "deeply_nested_input_dims": (json.dumps(_doc([_kernel(cat="cpu_op", name="record_param_comms")])).replace(
        '"correlation": 5', '"Input Dims": ' + "[" * 100_000 + "]" * 100_000), "nested deeper"),
    "deeply_nested_header": ('{"distributedInfo": ' + "[" * 100_000 + "]" * 100_000 + ', "traceEvents": []}',
                             "nested deeper|not a"),
    "base_time_overflow": (json.dumps(_doc([_kernel(ts=5)], baseTimeNanoseconds=2**63 - 1)),
                           "overflow int64|impossible clock"),
    "base_time_2_64": (json.dumps(_doc([_kernel(ts=5)], baseTimeNanoseconds=2**64)), "baseTimeNanoseconds"),
    "base_time_text": (json.dumps(_doc([_kernel(ts=5)], baseTimeNanoseconds="abc")), "baseTimeNanoseconds"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_value_refused_naming_the_file(tmp_path, kind):
    text, words = BAD[kind]
    path = tmp_path / f"{kind}.json"
    path.write_text(text)
    con = db.connect(None)
    with pytest.raises(InputError) as ei:
        ingest(con, [path], jobs=1)
    line = ei.value.line()
    assert str(path) in line and "\n" not in line
    assert any(w in line for w in words.split("|")), line
    assert con.execute("SELECT count(*) FROM files").fetchone()[0] == 0  # nothing half-written


@pytest.mark.parametrize("flag,value", [("rank", 2**31), ("rank", -1), ("world_size", 2**31), ("world_size", 0)])
def test_bad_cli_rank_or_world_size(tmp_path, flag, value):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc([_kernel()])))
    with pytest.raises(InputError, match=f"--{flag.replace('_', '-')}"):
        ingest(db.connect(None), [path], jobs=1, **{flag: value})


def test_negative_dur_is_dropped_with_a_note(tmp_path):
    con = _ingest(tmp_path / "t.json", json.dumps(_doc([_kernel(dur=-5), _kernel(ts=EPOCH_US + 100)])))
    assert con.execute("SELECT count(*), min(end_ns - start_ns) FROM kernels").fetchone() == (1, 10_000)
    assert "negative_dur" in _notes(con)


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_is_read_with_a_note(tmp_path, gz):
    raw = json.dumps(_doc([_kernel(name="nccl\udcffKernel_x")]), ensure_ascii=False).encode("utf-8", "surrogateescape")
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    con = _ingest(path, gzip.compress(raw) if gz else raw)
    assert con.execute("SELECT name FROM kernels").fetchone()[0] == "nccl\ufffdKernel_x"
    assert "invalid_utf8" in _notes(con)


# every phase of the Trace Event Format but 'X', with values of any type: the importer keeps only 'X' events
_OTHER_PHASES = [
    {"ph": "s", "id": 1, "pid": 0, "tid": 1, "ts": EPOCH_US, "cat": "ac2g", "name": "ac2g"},
    {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": EPOCH_US + 1, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    {"ph": "i", "s": "t", "name": "Iteration Start: PyTorch Profiler", "pid": 0, "tid": 1, "ts": EPOCH_US},
    {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
    {"ph": "C", "name": {"odd": "type"}, "cat": ["kernel"], "pid": "Spans", "ts": "soon", "args": {"x": [1]}},
    {"ph": "b", "cat": "kernel", "name": NCCL, "id": "0x1", "pid": 0, "tid": 7, "ts": EPOCH_US},
]


@pytest.mark.parametrize("extra", [[], _OTHER_PHASES, [{"ph": "Z", "cat": "kernel", "name": "x", "ts": 1}],
                                   [{"cat": "kernel", "name": "no phase", "ts": 1, "dur": 1}]],
                         ids=["x-only", "every-other-phase", "unknown-phase", "no-phase"])
def test_only_complete_events_are_kept_whatever_the_other_phases_hold(tmp_path, extra):
    events = [_kernel(), {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 0, "tid": 1,
                          "ts": EPOCH_US - 5, "dur": 4, "args": {"correlation": 5}}]
    con = _ingest(tmp_path / "t.json", json.dumps(_doc(extra[:3] + events + extra[3:])))
    assert con.execute("SELECT name, start_ns FROM kernels").fetchall() == [(NCCL, EPOCH_US * 1000)]
    assert con.execute("SELECT name, correlation_id FROM api_calls").fetchall() == [("cudaLaunchKernel", 5)]


def test_fast_decoder_skips_other_phases_and_falls_back_on_unknown_ones():
    from nsys2comm.ingest import kineto_decode as kd

    x = json.dumps(_kernel()).encode()
    fast = kd.decode_events(b"[" + b",".join([json.dumps(e).encode() for e in _OTHER_PHASES] + [x]) + b"]")
    assert [type(e) is kd.CompleteEventArgs for e in fast] == [False] * len(_OTHER_PHASES) + [True]
    assert type(fast[-1].args) is kd.Args  # decoded in the same pass
    assert all(e.cat is None for e in fast[:-1]) and fast[-1].cat == "kernel"
    slow = kd.decode_events(b'[{"ph": "Z"},' + x + b"]")
    assert [type(e) for e in slow] == [kd.Event, kd.Event] and slow[1].ph == "X" and slow[1].name == NCCL
