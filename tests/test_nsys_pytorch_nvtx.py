"""nsys exports with PyTorch's emit_nvtx ranges, NCCL payload blobs laid out per NCCL's headers, nested NCCL groups.

Expected values come from the synthetic Run (what the fixture wrote), from NCCL's struct layouts, or from brute force.
"""

from __future__ import annotations

import sqlite3
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth_db import catalog_db

from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import comm_id, pytorch_title, write_nsys
from fixtures.synthetic import DTYPE_BYTES, make_run
from nsys2comm import catalog
from nsys2comm.ingest import ingest
from nsys2comm.ingest.nvtx_payload import PayloadDecoder
from nsys2comm.storage import db


def _job(paths):
    con = db.connect(None)
    res = ingest(con, paths, jobs=1)
    assert [r.status for r in res] == ["ingested"] * len(paths), [r.message for r in res]
    return con


def _ops(con):
    return {(r[0], r[1]): r[2:] for r in con.execute(
        "SELECT k.rank, k.start_ns, c.collective, c.collective_source, c.size_source, c.element_count, c.msg_bytes, "
        "c.in_bytes, c.out_bytes, c.group_size, c.peer_rank, c.n_ops, c.seq "
        "FROM comm_ops c JOIN kernels k USING (kernel_id)").fetchall()}


def _elems(c) -> int:
    """Elements of nccl-tests' S for one operation of the Run."""
    return c.msg_bytes // DTYPE_BYTES[c.dtype]


@pytest.mark.parametrize("schema,era", [("2.9.1", "old"), ("3.25.0", "new")])
def test_ranges_without_sizes_name_the_operation(tmp_path, schema, era):
    run = make_run(world_size=4, steps=1, era=era)
    con = _job([write_nsys(run, tmp_path / "pt.sqlite", schema, pytorch_nvtx="ranges")])
    ops = _ops(con)
    all_ops = [c for r in run.ranks for c in r.comm]
    assert len(ops) == len(all_ops)
    for c in all_ops:
        coll, src, size_src, elems, msg, *_rest, n_ops, seq = ops[(c.kernel.rank, c.kernel.start_ns)]
        assert (coll, src, n_ops, seq) == (c.collective, "pytorch_nvtx", 1, None)
        if schema == "2.9.1":  # no sizes anywhere: visibly absent
            assert (size_src, elems, msg) == (None, None, None)
        else:  # NCCL payloads still give the size
            assert (size_src, msg) == ("nvtx_payload", c.msg_bytes)


@pytest.mark.parametrize("schema,era", [("2.9.1", "old"), ("3.25.0", "new")])
def test_ranges_with_sizes(tmp_path, schema, era):
    """'sizes' give elements; bytes need the dtype, which only reduction kernels' names carry; all_gather's S
    needs the group size, which only the NCCL payloads carry."""
    run = make_run(world_size=4, steps=1, era=era)
    con = _job([write_nsys(run, tmp_path / "pt.sqlite", schema, pytorch_nvtx="sizes")])
    ops = _ops(con)
    payloads = schema == "3.25.0"
    for c in (c for r in run.ranks for c in r.comm):
        coll, src, size_src, elems, msg, in_b, out_b, gsize, peer, n_ops, seq = ops[(c.kernel.rank, c.kernel.start_ns)]
        assert (coll, src) == (c.collective, "pytorch_nvtx")
        if c.collective in ("all_reduce", "reduce_scatter"):  # dtype from the kernel name
            assert (size_src, msg, in_b, elems) == ("pytorch_nvtx", c.msg_bytes, c.in_bytes, _elems(c))
            assert out_b == (c.out_bytes if payloads or c.collective == "all_reduce" else None)
        elif payloads:
            assert (size_src, msg, elems) == ("nvtx_payload", c.msg_bytes, _elems(c))
        else:
            assert (size_src, msg, in_b, out_b) == (None, None, None, None)
            assert elems == (None if c.collective == "all_gather" else _elems(c))


def test_same_run_via_kineto_and_nsys_with_pytorch_ranges(tmp_path):
    """Kineto >= 2.4 and nsys 3.25.0 with emit_nvtx(record_shapes=True) ranges agree row by row."""
    run = make_run(world_size=4, steps=2, era="new")
    kineto = _job(write_kineto(run, tmp_path / "kineto", style="new"))
    nsys = _job([write_nsys(run, tmp_path / "run.sqlite", "3.25.0", pytorch_nvtx="sizes")])
    q = ("SELECT k.rank, k.start_ns, c.collective, c.msg_bytes, c.in_bytes, c.group_size, c.peer_rank "
         "FROM comm_ops c JOIN kernels k USING (kernel_id) ORDER BY ALL")
    a, b = kineto.execute(q).fetchall(), nsys.execute(q).fetchall()
    assert len(a) == len(b) > 0
    assert a == b


def test_grouped_p2p_inside_a_pytorch_all_to_all(tmp_path):
    """A grouped ncclSend/ncclRecv launched inside 'nccl:all_to_all' is the all_to_all the user called; the group's
    payloads still give the bytes (sends in, receives out) and the peer stays unset for a collective."""
    run = make_run(world_size=2, steps=1, era="new")
    p2p = [c for r in run.ranks for c in r.comm if c.peer is not None]
    for c in p2p:
        c.torch_name = "all_to_all"  # the fixture titles the range nccl:all_to_all; NCCL's ranges stay send/recv
    con = _job([write_nsys(run, tmp_path / "a2a.sqlite", "3.25.0", pytorch_nvtx="ranges")])
    ops = _ops(con)
    for c in p2p:
        coll, src, size_src, elems, msg, in_b, out_b, gsize, peer, n_ops, seq = ops[(c.kernel.rank, c.kernel.start_ns)]
        assert (coll, src, n_ops, peer) == ("all_to_all", "pytorch_nvtx", 1, None)
        assert (size_src, msg) == ("nvtx_payload", c.in_bytes if c.collective == "send" else c.out_bytes)


def test_fixture_titles_follow_process_group_nccl():
    run = make_run(world_size=2, steps=1, era="new")
    send = next(c for c in run.ranks[0].comm if c.collective == "send")
    assert pytorch_title(send, 0) == f"nccl:send 0->{send.peer}"


# ------------------------------------------------------------------------------------------ parsing, nesting


def _ranges_db(rows):
    """A job DB holding only cpu_ranges rows: (range_id, tid, start, end, name, domain)."""
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    if rows:
        con.executemany("INSERT INTO cpu_ranges (range_id, file_id, rank, pid, tid, start_ns, end_ns, name, kind, "
                        "domain) VALUES (?, 1, 0, 1, ?, ?, ?, ?, 'nvtx', ?)", rows)
    return con


def test_getnvtxstr_variants_parse():
    names = ["nccl:all_reduce, op_id = 5, sizes = [[4, 1024], [], [8]]",  # two tensors and a non-tensor input
             "nccl:all_to_all, seq = 12, op_id = 999762, sizes = [[8, 1024, 8816]], input_op_ids = [(3,0), (4,1)]",
             "nccl:_all_gather_base, op_id = 7",
             "nccl:allreduce_coalesced, op_id = 8, sizes = [[], []]",  # TensorList inputs record no shape
             "nccl:send 0->1, sizes = [[9223372036854775807, 4]]"]  # overflows int64: unknown, not wrapped
    con = _ranges_db([(i, 1, 10 * i, 10 * i + 5, n, None) for i, n in enumerate(names)])
    got = con.execute("SELECT collective, input_elems, autograd_seq, op_id "
                      "FROM _ingest_nsys_pytorch_ranges(1)").fetchall()
    assert got == [("all_reduce", 4 * 1024 + 8, None, 5), ("all_to_all", 8 * 1024 * 8816, 12, 999762),
                   ("all_gather", None, None, 7), ("all_reduce", None, None, 8), ("send", None, None, None)]


def _brute_groups(names):
    """Clamped group depth before each range and the outermost-group counter, by walking the list."""
    depth, group, out = 0, 0, []
    for n in names:
        before = depth
        if n == "ncclGroupStart":
            group += before == 0
            depth += 1
        elif n == "ncclGroupEnd":
            depth = max(0, depth - 1)
        out.append((before, group))
    return out


@pytest.mark.slow  # tier: slow (brute force over generated cases; CI runs it)
@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["ncclGroupStart", "ncclGroupEnd", "ncclSend", "ncclRecv"]), max_size=25))
def test_group_depth_matches_brute_force(names):
    con = _ranges_db([(i, 7, 100 * i, 100 * i + 50, n, "NCCL") for i, n in enumerate(names)])
    got = con.execute("SELECT depth_before, outer_group FROM _ingest_nsys_nccl_ranges(1) ORDER BY range_id").fetchall()
    assert got == _brute_groups(names)


def test_nested_groups_launch_from_the_outer_end(tmp_path):
    run = make_run(world_size=2, steps=1, era="new")
    con = _job([write_nsys(run, tmp_path / "nested.sqlite", "3.25.0", nested_groups=True)])
    ops = _ops(con)
    for c in (c for r in run.ranks for c in r.comm):
        coll, src, size_src, elems, msg, in_b, out_b, gsize, peer, n_ops, seq = ops[(c.kernel.rank, c.kernel.start_ns)]
        assert (coll, src, n_ops, msg) == (c.collective, "nvtx", 1, c.msg_bytes)
        if c.peer is not None:
            assert peer == c.peer


# ------------------------------------------------------------------------------------------ payload decoding


def test_payload_fields_decoded(tmp_path):
    run = make_run(world_size=2, steps=1, era="new")
    con = _job([write_nsys(run, tmp_path / "p.sqlite", "3.25.0")])
    ar = [c for r in run.ranks for c in r.comm if c.collective == "all_reduce"]
    got = con.execute("SELECT args->>'comm_id', TRY_CAST(args->>'msg_bytes' AS BIGINT), args->>'redop' "
                      "FROM cpu_ranges WHERE name = 'ncclAllReduce' ORDER BY start_ns, rank").fetchall()
    assert sorted(got) == sorted((str(comm_id(c.pg_name)), c.in_bytes, "Sum") for c in ar)
    init = con.execute("SELECT rank, args->>'nranks', args->>'rank', args->>'cuda_device' FROM cpu_ranges "
                       "WHERE name = 'ncclCommInitRankConfig' AND args->>'comm_id' = ? ORDER BY rank",
                       [str(comm_id("0"))]).fetchall()
    assert init == [(r.rank, "2", str(r.rank), str(r.device)) for r in run.ranks]


_DDL = """
CREATE TABLE NVTX_PAYLOAD_SCHEMAS (domainId INTEGER, schemaId INTEGER, name TEXT, type INTEGER, flags INTEGER,
  numEntries INTEGER, payloadSize INTEGER, alignTo INTEGER);
CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId INTEGER NOT NULL, schemaId INTEGER NOT NULL, idx INTEGER NOT NULL,
  flags INTEGER, type INTEGER, name TEXT, description TEXT, arrayOrUnionDetail INTEGER, offset INTEGER);
CREATE TABLE NVTX_PAYLOAD_ENUMS (domainId INTEGER, schemaId INTEGER, name TEXT, numEntries INTEGER, size INTEGER);
"""


def _decoder(entries, schemas=(), enums=()):
    c = sqlite3.connect(":memory:")
    c.executescript(_DDL)
    c.executemany("INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId, schemaId, idx, type, name, offset) "
                  "VALUES (1, ?, ?, ?, ?, ?)", entries)
    c.executemany("INSERT INTO NVTX_PAYLOAD_SCHEMAS (domainId, schemaId, type) VALUES (1, ?, 1)", schemas)
    c.executemany("INSERT INTO NVTX_PAYLOAD_ENUMS (domainId, schemaId, size) VALUES (1, ?, ?)", enums)
    tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master")}
    return PayloadDecoder(c, tables, lambda t: {r[1] for r in c.execute(f"PRAGMA table_info('{t}')")})


def _blob(sid, payload: bytes, size=None):
    size = len(payload) if size is None else size
    return struct.pack("<QQQQ", 1, sid, size, 32 + size) + payload


SID = (1 << 24) + 8  # NVTX_SID_Reduce


def test_reduce_layout_with_natural_alignment():
    """NcclNvtxParamsReduce {u64 comm; size_t bytes; int root; ncclRedOp_t op}: offsets 0, 8, 16, 20; an export
    that leaves every offset NULL gets the same places from natural alignment."""
    payload = struct.pack("<QQii", 2**63 + 5, 4096, 3, 2)
    for offsets in ([None, 8, 16, 20], [None, None, None, None]):
        dec = _decoder([(SID, 0, 18, "NCCL communicator ID", offsets[0]),
                        (SID, 1, 22, "Message size [bytes]", offsets[1]),
                        (SID, 2, 5, "Root", offsets[2]), (SID, 3, (1 << 24) + 16, "Reduction operation", offsets[3])])
        assert dec.decode(1, _blob(SID, payload)) == \
            {"comm_id": str(2**63 + 5), "msg_bytes": 4096, "root": 3, "redop": 2}


def test_enum_size_nested_struct_and_bounds():
    enum8, nested = (1 << 24) + 40, (1 << 24) + 41
    ents = [(SID, 0, 18, "NCCL communicator ID", None), (SID, 1, enum8, "Reduction operation", 8),
            (SID, 2, 22, "Message size [bytes]", 16)]
    dec = _decoder(ents, enums=[(enum8, 8)])
    payload = struct.pack("<QqQ", 9, 4, 777)
    assert dec.decode(1, _blob(SID, payload)) == {"comm_id": "9", "redop": 4, "msg_bytes": 777}
    assert dec.decode(1, _blob(SID, payload, size=16)) is None  # the blob says the payload is shorter
    assert dec.decode(1, _blob(SID, payload[:16], size=24)) is None  # truncated blob
    assert dec.decode(1, _blob(SID + 1, payload)) is None  # unknown schema
    # a nested struct schema has no size here: the fields after it are not guessed
    dec = _decoder([(SID, 0, 18, "NCCL communicator ID", None), (SID, 1, nested, "x", 8),
                    (SID, 2, 22, "Message size [bytes]", None)], schemas=[(nested,)])
    assert dec.decode(1, _blob(SID, payload)) == {"comm_id": "9"}


def test_nccl_2_16_p2p_layout():
    """NCCL 2.16-2.24 Send/Recv: {size_t bytes 'Bytes'; int peer 'Peer rank'}, no communicator."""
    sid = (1 << 24) + 9
    dec = _decoder([(sid, 0, 22, "Bytes", None), (sid, 1, 5, "Peer rank", 8)])
    assert dec.decode(1, _blob(sid, struct.pack("<Qi4x", 1 << 20, 3))) == {"msg_bytes": 1 << 20, "peer": 3}


# ------------------------------------------------------------------------------------------ catalog


NSYS_OBJECTS = [o for o in catalog.load_catalog() if o.path.name == "nsys_comm_ops.sql"]


def test_nsys_sql_objects_documented_columns_are_real():
    """The catalog lint covers the analysis areas; the same check for the private ingest objects."""
    assert {o.name for o in NSYS_OBJECTS} == {"_ingest_nsys_pytorch_ranges", "_ingest_nsys_nccl_ranges",
                                              "_ingest_nsys_comm_ops"}
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    comm_ops = [r[0] for r in con.execute("DESCRIBE comm_ops").fetchall()]
    for o in NSYS_OBJECTS:
        assert o.description and o.params == {"fid": "File id."} and all(o.columns.values()), o.name
        real = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {o.name}(1)").fetchall()]
        assert real == list(o.columns), o.name
    assert list(next(o for o in NSYS_OBJECTS if o.name == "_ingest_nsys_comm_ops").columns) == comm_ops
