"""Kineto importer: real shared traces (counted independently from the JSON), synthetic runs in both styles,
bad inputs, and the streaming splitter at any block size."""

from __future__ import annotations

import collections
import gzip
import json
import math
import os
import re
from pathlib import Path

import pytest
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm.errors import InputError
from nsys2comm.ingest import ingest, kineto
from nsys2comm.ingest.base import ReadOptions
from nsys2comm.ingest.ranks import rank_from_file_name
from nsys2comm.storage import db

COMM_RE = re.compile(r"^(void )?(nccl|rccl)", re.I)
ANNOTATION_COLL = {"nccl:all_reduce": "all_reduce", "nccl:all_to_all": "all_to_all",
                   "nccl:_all_gather_base": "all_gather", "nccl:broadcast": "broadcast"}
ARG_COLL = {"allreduce": "all_reduce", "broadcast": "broadcast"}
DTYPE_SIZE = {"Float": 4, "Long": 8, "Int": 4, "BFloat16": 2, "Half": 2, "Byte": 1, "Double": 8}
TABLES = ("files", "ranks", "devices", "kernels", "mem_ops", "cpu_ranges", "api_calls", "comm_ops", "ingest_notes")


def _load(path: Path) -> dict:
    op = gzip.open if path.name.endswith(".gz") else open
    with op(path, "rb") as f:
        return json.load(f)


def _independent(doc: dict) -> dict:
    """What the file holds, by plain json + regex: comm kernels and their collectives (kernel args, else the
    nccl:* annotation enclosing the launch on the same thread), and kernel-arg message sizes."""
    ev = doc["traceEvents"]
    kernels = [e for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X"]
    comm = [k for k in kernels if COMM_RE.search(k["name"])]
    launches = {e["args"]["correlation"]: e for e in ev
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    anns = [e for e in ev if e.get("cat") == "user_annotation" and e["name"] in ANNOTATION_COLL]
    colls = collections.Counter()
    sizes = collections.Counter()
    for k in comm:
        a = k["args"]
        if "Collective name" in a:
            c = ARG_COLL[a["Collective name"]]
            colls[c] += 1
            sizes[c] += a["In msg nelems"] * DTYPE_SIZE[a["dtype"]]
            continue
        launch = launches[a["correlation"]]
        enclosing = [x for x in anns if x["tid"] == launch["tid"] and x["pid"] == launch["pid"]
                     and x["ts"] <= launch["ts"] and launch["ts"] + launch["dur"] <= x["ts"] + x["dur"]]
        assert len(enclosing) == 1
        colls[ANNOTATION_COLL[enclosing[0]["name"]]] += 1
    return {"kernels": len(kernels), "comm": len(comm), "colls": colls, "sizes": sizes,
            "rank": doc["distributedInfo"]["rank"], "world": doc["distributedInfo"]["world_size"]}


def _files(shared_traces: Path) -> list[Path]:
    return sorted((shared_traces / "kineto").rglob("*.json.gz"))


@pytest.fixture(scope="module")
def shared_ingest(shared_traces):
    """``shared_ingest(dataset)`` -> (paths, in-memory job, ingest results): each real dataset is ingested once for
    the module (tests only read the job) instead of once per test that checks it."""
    jobs: dict[str, tuple] = {}

    def get(dataset: str) -> tuple:
        if dataset not in jobs:
            paths = sorted((shared_traces / "kineto" / dataset).glob("*.json.gz"))
            con = db.connect(None)
            jobs[dataset] = (paths, con, ingest(con, paths, jobs=1))
        return jobs[dataset]

    yield get
    for _paths, con, _res in jobs.values():
        con.close()


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("dataset", ["hta_trace_filter_2rank", "hta_nccl_parser_config", "hta_df_index_resolver",
                                     "param_dlrm_8rank"])
def test_shared_traces_ingest(shared_ingest, dataset):
    paths, con, res = shared_ingest(dataset)
    assert paths
    assert [r.status for r in res] == ["ingested"] * len(paths)
    for r, path in zip(res, paths, strict=False):
        exp = _independent(_load(path))
        fid = r.file_id
        q = lambda sql, fid=fid: con.execute(sql, [fid]).fetchall()  # noqa: E731
        assert q("SELECT rank, world_size, rank_source FROM ranks WHERE file_id = ?") == [
            (exp["rank"], exp["world"], "distributedInfo")]
        assert q("SELECT count(*) FROM kernels WHERE file_id = ?")[0][0] == exp["kernels"]
        assert q("SELECT count(*) FROM kernels WHERE file_id = ? AND kernel_class = 'communication'")[0][0] == \
            exp["comm"]
        assert q("SELECT count(*) FROM comm_ops WHERE file_id = ?")[0][0] == exp["comm"]
        got = dict(q("SELECT collective, count(*) FROM comm_ops WHERE file_id = ? GROUP BY 1"))
        assert got == dict(exp["colls"])
        if exp["sizes"]:
            got_sizes = dict(q("SELECT collective, sum(msg_bytes) FROM comm_ops WHERE file_id = ? GROUP BY 1"))
            assert got_sizes == dict(exp["sizes"])
        # the staging rows are gone and every time is on the epoch (after 2020)
        assert q("SELECT count(*) FROM cpu_ranges WHERE file_id = ? AND kind = '_kernel_args'")[0][0] == 0
        assert q("SELECT min(start_ns) > 1577836800000000000 FROM kernels WHERE file_id = ?")[0][0]


def test_nccl_parser_config_details(shared_traces):
    path = shared_traces / "kineto" / "hta_nccl_parser_config" / "nccl_data.json.gz"
    doc = _load(path)
    first = min((e for e in doc["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    con = db.connect(None)
    ingest(con, [path], jobs=1)
    assert con.execute("SELECT clock_offset_ns FROM files").fetchone()[0] == doc["baseTimeNanoseconds"]
    assert con.execute("SELECT min(start_ns) FROM kernels").fetchone()[0] == \
        doc["baseTimeNanoseconds"] + round(first["ts"] * 1000)
    rows = con.execute("SELECT DISTINCT group_size, pg_name, pg_desc, pg_ranks, collective_source, size_source "
                       "FROM comm_ops").fetchall()
    assert rows == [(2, "0", "default_pg", [0, 1], "kernel_args", "kernel_args")]
    exp = collections.Counter(
        (ARG_COLL[e["args"]["Collective name"]], {"Float": "float32", "Long": "int64"}[e["args"]["dtype"]])
        for e in doc["traceEvents"] if e.get("cat") == "kernel" and "Collective name" in e.get("args", {}))
    got = collections.Counter(con.execute("SELECT collective, dtype FROM comm_ops").fetchall())
    assert got == exp


def test_old_traces_note_missing_sizes(shared_traces):
    path = shared_traces / "kineto" / "hta_df_index_resolver" / "df_index_resolver.json.gz"
    con = db.connect(None)
    ingest(con, [path], jobs=1)
    codes = {r[0] for r in con.execute("SELECT code FROM ingest_notes").fetchall()}
    assert "no_msg_sizes" in codes
    assert con.execute("SELECT DISTINCT collective_source FROM comm_ops").fetchall() == [("launch_annotation",)]


# ---------------------------------------------------------------------------------------------- synthetic


def _expected(run):
    return {(rr.rank, op.kernel.correlation): op for rr in run.ranks for op in rr.comm}


@pytest.mark.parametrize("style,gz", [("old", False), ("new", True), ("new", False)])
def test_synthetic_run(tmp_path, style, gz):
    run = make_run(world_size=4, steps=2, era=style)
    paths = write_kineto(run, tmp_path, style, gz=gz)
    con = db.connect(None)
    res = ingest(con, paths, jobs=1)
    assert [r.status for r in res] == ["ingested"] * 4
    assert con.execute("SELECT rank, world_size, rank_source FROM ranks ORDER BY 1").fetchall() == [
        (r, 4, "distributedInfo") for r in range(4)]
    # kernels: exact names, times (old style: integer µs), correlation
    got_k = sorted(con.execute("SELECT rank, correlation_id, name, start_ns, device_id, stream_id "
                               "FROM kernels").fetchall())
    exp_k = sorted((k.rank, k.correlation, k.name, k.start_ns // 1000 * 1000 if style == "old" else k.start_ns,
                    k.device, k.stream) for k in run.all_kernels())
    assert got_k == exp_k
    exp = _expected(run)
    got = {(r[0], r[1]): r[2:] for r in con.execute(
        "SELECT c.rank, k.correlation_id, collective, msg_bytes, in_bytes, peer_rank, group_size, pg_ranks, seq, dtype "
        "FROM comm_ops c JOIN kernels k USING (kernel_id)").fetchall()}
    assert set(got) == set(exp)
    for key, op in exp.items():
        coll, msg, in_b, peer, gs, pgr, seq, dtype = got[key]
        assert coll == op.collective, key
        if style == "new":
            in_exp = None if op.collective == "recv" else op.in_bytes  # a recv has no input buffer
            assert (msg, in_b, peer, gs, pgr, seq) == (op.msg_bytes, in_exp, op.peer, op.group_size,
                                                       op.pg_ranks, op.seq), key
        else:  # old: sizes from Input Dims x Input type; the group size is assumed from the world size
            assert msg == op.msg_bytes, key
            assert (peer, gs, seq) == (None, run.world_size, None)
        assert dtype == {"BFloat16": "bfloat16", "Float": "float32", "Byte": "uint8"}[op.dtype]
    assert con.execute("SELECT count(*) FROM mem_ops").fetchone()[0] == sum(len(rr.memops) for rr in run.ranks)
    assert con.execute("SELECT count(*) FROM cpu_ranges WHERE name LIKE 'ProfilerStep#%' AND kind = 'user_annotation'"
                       ).fetchone()[0] == 8
    assert con.execute("SELECT count(*) FROM devices").fetchone()[0] == 4
    assert con.execute("SELECT DISTINCT name FROM devices").fetchall() == [("NVIDIA H100 80GB HBM3",)]


@pytest.mark.parametrize("jobs", [1, 2])
def test_files_carry_each_traces_sha256_and_a_copy_is_skipped(tmp_path, jobs):
    """files.sha256 is the hash of the file's bytes (hashed once its rows are read, beside the finalize, when no
    file of the job has its size; at once when one has): a copy of an ingested file is skipped, in the same call or
    a later one."""
    import hashlib
    import shutil

    paths = write_kineto(make_run(world_size=2, steps=1), tmp_path, "new", gz=False)
    copy = tmp_path / "copy" / paths[0].name
    copy.parent.mkdir()
    shutil.copy(paths[0], copy)
    con = db.connect(None)
    res = ingest(con, [*paths, copy], jobs=jobs)
    assert [(Path(r.path), r.status, r.message) for r in res] == [  # a copy's outcome is its original's, after it
        (paths[0], "ingested", ""), (paths[1], "ingested", ""),
        (copy, "skipped", f"a copy of {paths[0]} (ingested as file 1)")]
    want = {str(p.resolve()): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert dict(con.execute("SELECT path, sha256 FROM files").fetchall()) == want
    again = ingest(con, [copy], jobs=jobs)
    assert [(r.status, r.message) for r in again] == [("skipped", "already ingested as file 1")]


def test_rank_from_file_name_and_cli(tmp_path):
    run = make_run(world_size=2, steps=1)
    p = write_kineto(run, tmp_path, "new")[1]
    doc = json.loads(p.read_bytes())
    del doc["distributedInfo"]
    q = tmp_path / "trace_rank_5.json"
    q.write_text(json.dumps(doc))
    con = db.connect(None)
    ingest(con, [q], jobs=1)
    assert con.execute("SELECT rank, rank_source FROM ranks").fetchall() == [(5, "file_name")]
    assert con.execute("SELECT DISTINCT rank FROM kernels").fetchall() == [(5,)]
    assert ("no_rank_info",) in con.execute("SELECT code FROM ingest_notes").fetchall()
    con2 = db.connect(None)
    ingest(con2, [p], rank=3, jobs=1)
    assert con2.execute("SELECT rank, rank_source FROM ranks").fetchall() == [(3, "cli")]
    assert con2.execute("SELECT DISTINCT rank FROM comm_ops").fetchall() == [(3,)]


@pytest.mark.parametrize("name,expected", [("rank-3.json", 3), ("rank3.json.gz", 3),
                                           ("worker3_step_1.pt.trace.json", 3), ("job_rank_12.json", 12),
                                           ("host_123.1700.pt.trace.json", None)])
def test_rank_from_file_name(name, expected):
    assert rank_from_file_name(name) == expected


def test_odd_types_fall_back(tmp_path):
    """String pid/tid, string numbers in args and float correlation take the tolerant path, not an error."""
    run = make_run(world_size=2, steps=1)
    p = write_kineto(run, tmp_path, "new")[0]
    doc = json.loads(p.read_bytes())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and "Group size" in e.get("args", {}):
            e["args"]["Group size"] = str(e["args"]["Group size"])
            e["args"]["correlation"] = float(e["args"]["correlation"])
    q = tmp_path / "odd.json"
    q.write_text(json.dumps(doc))
    con = db.connect(None)
    ingest(con, [q], jobs=1)
    assert con.execute("SELECT DISTINCT group_size FROM comm_ops WHERE collective = 'all_reduce'").fetchall() == [(2,)]


def test_no_kernels_note(tmp_path):
    p = tmp_path / "cpu_only.json"
    p.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1},
                             "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
                                              "ts": 1, "dur": 2}]}))
    con = db.connect(None)
    ingest(con, [p], jobs=1)
    assert ("no_gpu_kernels",) in con.execute("SELECT code FROM ingest_notes").fetchall()


# ---------------------------------------------------------------------------------------------- bad inputs


def _counts(con):
    return [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES]


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    run = make_run(world_size=2, steps=1)
    good = write_kineto(run, tmp_path / "good", "new")[0]
    data = good.read_bytes()
    out = {}
    out["truncated_json"] = tmp_path / "trunc.json"
    out["truncated_json"].write_bytes(data[: len(data) // 2])
    out["truncated_tail"] = tmp_path / "trunc_tail.json"
    out["truncated_tail"].write_bytes(data[:-40])
    gz = gzip.compress(data)
    out["truncated_gzip"] = tmp_path / "trunc.json.gz"
    out["truncated_gzip"].write_bytes(gz[: len(gz) * 2 // 3])
    out["not_a_trace"] = tmp_path / "config.json"
    out["not_a_trace"].write_text(json.dumps({"model": "llama", "layers": [1, 2, 3]}))
    out["empty"] = tmp_path / "empty.json"
    out["empty"].write_bytes(b"")
    return out


@pytest.mark.parametrize("kind", ["truncated_json", "truncated_tail", "truncated_gzip", "not_a_trace", "empty"])
def test_bad_inputs(tmp_path, kind):
    path = _bad_files(tmp_path)[kind]
    dbp = tmp_path / "job.duckdb"
    con = db.connect(dbp, write=True)
    good = write_kineto(make_run(world_size=1, steps=1), tmp_path / "ok", "old")
    ingest(con, good, jobs=1)
    before = _counts(con)
    with pytest.raises(InputError) as ei:
        ingest(con, [path], jobs=1)
    msg = str(ei.value)
    assert str(path) in msg and "\n" not in msg
    assert _counts(con) == before
    con.close()


# ---------------------------------------------------------------------------------------------- splitter


def _rows(paths_or_path, **extra):
    out = collections.defaultdict(list)
    for b in kineto.read(paths_or_path, ReadOptions(extra=extra.pop("extra", {})), **extra):
        out[b.table].extend(tuple(sorted(r.items())) for r in b.data.to_pylist())
    return {t: sorted(v, key=repr) for t, v in out.items()}


@pytest.fixture(scope="module")
def split_trace(tmp_path_factory):
    run = make_run(world_size=2, steps=1)
    d = tmp_path_factory.mktemp("split")
    return (write_kineto(run, d / "pretty", "old", pretty=True)[0],
            write_kineto(run, d / "compact", "new", pretty=False)[0])


@pytest.mark.parametrize("block", [1, 7, 64, 333, 4096, 1 << 20])
@pytest.mark.parametrize("which", [0, 1])
def test_splitter_block_size_invariant(split_trace, block, which):
    path = split_trace[which]
    ref = _rows(path, extra={"kineto_workers": 0})
    assert ref["kernels"]
    assert _rows(path, block=block, extra={"kineto_workers": 0}) == ref


def test_splitter_parallel_matches_sequential(split_trace):
    path = split_trace[1]
    ref = _rows(path, extra={"kineto_workers": 0})
    assert _rows(path, block=2048, extra={"kineto_workers": 2}) == ref


def test_splitter_property(tmp_path):
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies
    names = st.text(alphabet=st.sampled_from(list('ab}{,[]" \\\n:')), max_size=12)

    @hyp.settings(max_examples=examples(40), deadline=None)
    @hyp.given(st.lists(names, min_size=1, max_size=30), st.integers(1, 200), st.booleans())
    def check(kernel_names, block, pretty):
        events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": 1000 + i, "dur": 1,
                   "args": {"correlation": i, "nested": [{"x": "}, {"}, {"y": 1}]}} for i, n in enumerate(kernel_names)]
        doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events,
               "baseTimeNanoseconds": 5, "INFO": ["}, {", "]"]}
        p = tmp_path / "h.json"
        p.write_text(json.dumps(doc, indent=1 if pretty else None))
        got = [b.data for b in kineto.read(p, ReadOptions(extra={"kineto_workers": 0}), block=block)
               if b.table == "kernels"]
        rows = sorted((r["correlation_id"], r["name"]) for t in got for r in t.to_pylist())
        assert rows == [(i, n) for i, n in enumerate(kernel_names)]

    check()


def test_byte_ranges_property(tmp_path):
    """Workers reading their own byte ranges (uncompressed files) give the sequential rows, also when a cut
    candidate lies inside a string or a nested object (the range fails to decode and the rest goes sequential),
    and when values need the tolerant decoder (a string device, an epoch ts finer than float64)."""
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies
    names = st.text(alphabet=st.sampled_from(list('ab}{,[]" \\\n:')), max_size=12)

    @hyp.settings(max_examples=examples(8), deadline=None)
    @hyp.given(st.lists(names, min_size=1, max_size=40), st.integers(40, 400), st.booleans(), st.booleans())
    def check(kernel_names, block, pretty, odd):
        events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7,
                   "ts": (1_700_000_000_000_000.123 if odd and i == 3 else 1000 + i), "dur": 1,
                   "args": {"correlation": i, "device": "0" if odd and i == 5 else 0,
                            "nested": [{"x": "}, {"}, {"y": 1}]}}
                  for i, n in enumerate(kernel_names)]
        doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events,
               "baseTimeNanoseconds": 5, "INFO": ["}, {", "]"]}
        p = tmp_path / "r.json"
        p.write_text(json.dumps(doc, indent=1 if pretty else None))
        ref = _rows(p, extra={"kineto_workers": 0})
        assert _rows(p, block=block, extra={"kineto_workers": 2}) == ref
        assert sorted(dict(r)["correlation_id"] for r in ref["kernels"]) == list(range(len(events)))

    check()



@pytest.mark.parametrize("spool_dir", ["writable", "missing"])
def test_gzip_pieces_go_to_the_workers_through_spool_files(tmp_path, monkeypatch, spool_dir):
    """gzip: the parent cuts the decompressed stream into pieces and writes each to a spool file that a worker
    reads; the parent removes it once its rows are in (or reads it back when the piece goes sequential), so the
    spool holds only the pieces in flight. Where no spool can be made, pieces go through the pipe. The rows are the
    sequential ones either way, also when a cut candidate lies inside a string (that piece fails and the rest goes
    sequential), and no spool file is left behind."""
    import tempfile

    names = [f"k{i}" + ("}, {" if i % 7 == 3 else "") for i in range(300)]
    events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": 1000 + i, "dur": 1,
               "args": {"correlation": i}} for i, n in enumerate(names)]
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc, indent=1).encode()))
    root = tmp_path / "tmp"
    if spool_dir == "writable":
        root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    spools, held = [], []
    submit = kineto._Pieces._submit

    def counted(self, piece):
        spools.append(self.spool)
        # the pieces on their way to the workers (their tables come back as <piece>-<table>.arrow, read at once)
        held.append(len([n for n in os.listdir(self.spool) if not n.endswith(".arrow")]) if self.spool else 0)
        return submit(self, piece)

    monkeypatch.setattr(kineto._Pieces, "_submit", counted)
    ref = _rows(p, extra={"kineto_workers": 0})
    assert _rows(p, block=1024, extra={"kineto_workers": 2}) == ref
    assert len(spools) > 5 and max(held) <= 3  # the pieces in flight (2 workers + 1), not every piece
    assert sorted(dict(r)["correlation_id"] for r in ref["kernels"]) == list(range(len(events)))
    assert spools and all((s is not None) == (spool_dir == "writable") for s in spools)
    assert not list(root.glob("nsys2comm-spool-*"))  # (multiprocessing keeps its own pymp-* there)

# ---------------------------------------------------------------------------------------------- recorded sizes

# element sizes of the dtype spellings the shared traces use in 'Input type' (PyTorch's scalar type names)
SHAPE_DTYPE_SIZE = {"float": 4, "double": 8, "long": 8, "long int": 8, "int": 4, "short int": 2, "c10::Half": 2,
                    "c10::BFloat16": 2, "signed char": 1, "unsigned char": 1, "bool": 1}
BASE_C10D = {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::alltoall_base_"}


def _shape_elems(name: str, a: dict) -> tuple[int, int] | None:
    """(input elements, element size) a range's 'Input Dims'/'Input type' record, or None (no shape)."""
    tensors = [(d, SHAPE_DTYPE_SIZE[t]) for d, t in zip(a.get("Input Dims", []), a.get("Input type", []), strict=False)
               if t in SHAPE_DTYPE_SIZE]
    if name.startswith("nccl:"):
        picked = tensors
    else:
        idx = 1 if name in BASE_C10D else 0
        dims, types = a.get("Input Dims", []), a.get("Input type", [])
        picked = ([(dims[idx], SHAPE_DTYPE_SIZE[types[idx]])]
                  if idx < len(types) and types[idx] in SHAPE_DTYPE_SIZE else [])
    if not picked:
        return None
    n = 0
    for dims, _ in picked:
        p = 1
        for x in dims:
            p *= x
        n += p
    return n, picked[0][1]


def _io_group(x: dict) -> int | None:
    """Group size from a c10d (output, input) op's 'Input Dims' (c10d/Ops.cpp: _allgather_base_(output, input, ...)
    gathers group x input into output; _reduce_scatter_base_(output, input, ...) the reverse)."""
    order = {"c10d::_allgather_base_": (0, 1), "c10d::_reduce_scatter_base_": (1, 0)}.get(x["name"])
    dims = x.get("args", {}).get("Input Dims")
    if order is None or not dims or len(dims) < 2 or not dims[0] or not dims[1]:
        return None
    big, small = (math.prod(dims[i]) for i in order)
    return big // small if small and big % small == 0 else None


def _recorded(doc: dict) -> dict:
    """Per communication kernel (correlation id): the collective, message bytes, group size and its source that the
    file records, read straight from the JSON: kernel args first, else the innermost range enclosing the launch that
    carries a shape (nccl:*, record_param_comms, c10d::*); the group from kernel args, distributedInfo.pg_config, the
    output/input ratio of an enclosing c10d::_allgather_base_/_reduce_scatter_base_, or (only when the file shows no
    other group: no group named but the default, no ratio other than the world size) the assumed world size."""
    ev = doc["traceEvents"]
    dist = doc.get("distributedInfo", {})
    world = dist.get("world_size")
    pg_sizes = {str(g["pg_name"]): g.get("pg_size") for g in dist.get("pg_config", [])}
    launches = {e["args"]["correlation"]: e for e in ev
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    ranges = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op")
              and (e["name"].startswith(("nccl:", "c10d::")) or e["name"] == "record_param_comms")]
    out, shaped = {}, {}
    for k in ev:
        if k.get("cat") != "kernel" or not COMM_RE.search(k["name"]):
            continue
        a = k["args"]
        if "Collective name" in a:
            c = ARG_COLL[a["Collective name"]]
            n = a["In msg nelems"] if c != "all_gather" else a["Out msg nelems"]
            src = "kernel_args" if "Group size" in a else "pg_config"
            gs = a.get("Group size", pg_sizes.get(str(a.get("Process Group Name"))))
            out[a["correlation"]] = (c, n * DTYPE_SIZE[a["dtype"]], gs, src)
            continue
        launch = launches[a["correlation"]]
        enclosing = sorted((x for x in ranges if x["tid"] == launch["tid"] and x["pid"] == launch["pid"]
                            and x["ts"] <= launch["ts"] and launch["ts"] + launch["dur"] <= x["ts"] + x["dur"]),
                           key=lambda x: (-x["ts"], x["dur"]))  # innermost first
        coll = next(ANNOTATION_COLL[x["name"]] for x in enclosing if x["name"] in ANNOTATION_COLL)
        shape = next((s for s in (_shape_elems(x["name"], x.get("args", {})) for x in enclosing) if s), None)
        ratio = next((g for g in map(_io_group, enclosing) if g), None)
        shaped[a["correlation"]] = (coll, shape, ratio)
    # the world size is assumed only where the file shows no group but the default one
    only_default = len(pg_sizes) <= 1 and all(r in (None, world) for _, _, r in shaped.values())
    for corr, (coll, shape, ratio) in shaped.items():
        gs, src = (ratio, "io_ratio") if ratio else (world, "assumed_world_size") if only_default else (None, None)
        m = None if shape is None or (coll == "all_gather" and gs is None) else \
            shape[0] * shape[1] * (gs if coll == "all_gather" else 1)
        out[corr] = (coll, m, gs, src)
    return out


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("dataset", ["hta_trace_filter_2rank", "hta_nccl_parser_config", "hta_df_index_resolver",
                                     "param_dlrm_8rank"])
def test_shared_traces_every_recorded_size_found(shared_ingest, dataset):
    """Every communication kernel whose size the file records has that size, its collective and its group size in
    comm_ops (issue 9: 100 % found, 0 wrong)."""
    paths, con, res = shared_ingest(dataset)
    for r, path in zip(res, paths, strict=False):
        exp = _recorded(_load(path))
        got = {corr: (c, m, g, src) for corr, c, m, g, src in con.execute(
            "SELECT k.correlation_id, o.collective, o.msg_bytes, o.group_size, o.group_source FROM comm_ops o "
            "JOIN kernels k USING (kernel_id) WHERE o.file_id = ?", [r.file_id]).fetchall()}
        assert got == exp, path.name
        if dataset == "hta_df_index_resolver":  # the file records no shapes: none may be invented
            assert all(m is None for _, m, _, _ in got.values())
        else:
            assert all(m is not None for _, m, _, _ in got.values())
        if dataset == "hta_trace_filter_2rank":
            # c10d::_allgather_base_ records [[1073741824], [16777216]]: a group of 64 in this 128-rank job, so the
            # all_gathers carry 64 (not the world size) and nothing else is assumed to span the world
            ag = {v for v in got.values() if v[0] == "all_gather"}
            assert ag == {("all_gather", 1073741824, 64, "io_ratio")}
            assert {v[3] for v in got.values() if v[0] != "all_gather"} == {None}


def test_decoders_start_early_only_where_the_ingest_uses_them(tmp_path, monkeypatch):
    """Job.ingest starts the decoder processes' forkserver before it opens the database where the ingest will use a
    pool (several files on several cores, or a file decoded in worker processes); a bad file is left to ingest."""
    import nsys2comm.ingest as ingest_mod

    started = []
    monkeypatch.setattr(ingest_mod, "start_forkserver", lambda: started.append(True))
    one, two = write_kineto(make_run(world_size=2, steps=1), tmp_path, style="new")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x00not a trace")

    def starts(paths, **kw) -> str | None:
        started.clear()
        discard = ingest_mod.start_decoders(paths, **kw)
        ahead = bool(kineto._ahead)
        discard()
        assert not kineto._ahead
        return "read ahead" if ahead else "forkserver" if started else None

    assert starts([one]) is None  # small: decoded in-process
    assert starts([one, two], jobs=1) is None
    assert starts([one, two], jobs=2) == "forkserver"
    monkeypatch.setattr(kineto, "only_thread", lambda: True)  # a process of one thread: workers fork at once
    assert starts([one], read_extra={"kineto_workers": 2}) == "read ahead"  # a single file: its ranges at once
    monkeypatch.setattr(kineto, "only_thread", lambda: False)  # else the forkserver, as for several files
    assert starts([one], read_extra={"kineto_workers": 2}) == "forkserver"
    assert starts([bad]) is None  # no error here: ingest reports it with the file's name
