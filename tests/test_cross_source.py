"""The same synthetic run, written as Kineto JSON and as an nsys export, ingests to identical canonical rows.

Pairs compared: Kineto new style (>= 2.4) vs nsys 3.25.0 (payload blobs), and Kineto old style (<= 2.1) vs
nsys 2.9.1 (no payloads). Columns that say where a value came from (*_source, file_id, ids) are left out, and so
are values one of the two sources cannot carry, listed per pair below with the reason.
"""

from __future__ import annotations

import pytest

from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import write_nsys
from fixtures.synthetic import make_run
from nsys2comm.ingest import ingest
from nsys2comm.storage import db

KERNEL_COLS = ("rank", "device_id", "stream_id", "start_ns", "end_ns", "name", "short_name", "correlation_id",
               "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "kernel_class")


def _job(paths):
    con = db.connect(None)
    res = ingest(con, paths, jobs=1)
    assert all(r.status == "ingested" for r in res), [r.message for r in res]
    return con


def _rows(con, table, cols, order):
    return con.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {order}").fetchall()


@pytest.fixture(scope="module", params=[("new", "3.25.0"), ("old", "2.9.1")], ids=["new-3.25.0", "old-2.9.1"])
def pair(request, tmp_path_factory):
    style, schema = request.param
    run = make_run(world_size=4, steps=2, era=style)
    d = tmp_path_factory.mktemp(f"x-{style}")
    kineto = _job(write_kineto(run, d / "kineto", style=style))
    nsys = _job([write_nsys(run, d / "run.sqlite", schema=schema)])
    return style, kineto, nsys


def test_kernels_identical(pair):
    _, kineto, nsys = pair
    order = "rank, start_ns, correlation_id"
    a, b = _rows(kineto, "kernels", KERNEL_COLS, order), _rows(nsys, "kernels", KERNEL_COLS, order)
    assert len(a) == len(b) > 0
    assert a == b


def test_mem_ops_identical(pair):
    _, kineto, nsys = pair
    cols = ("rank", "device_id", "stream_id", "start_ns", "end_ns", "kind", "copy_kind", "bytes", "correlation_id")
    order = "rank, start_ns, correlation_id"
    assert _rows(kineto, "mem_ops", cols, order) == _rows(nsys, "mem_ops", cols, order)


def test_comm_ops_identical(pair):
    style, kineto, nsys = pair
    # Carried by both sources in every pair: the operation itself.
    cols = ["k.rank", "k.start_ns", "c.collective"]
    if style == "new":
        # Kineto >= 2.4 kernel args and NCCL >= 2.25 payloads both carry sizes, group size and peers.
        # pg_name/comm_id differ by nature (PyTorch PG name vs NCCL communicator hash), seq exists only in Kineto.
        cols += ["c.msg_bytes", "c.in_bytes", "c.group_size", "c.peer_rank"]
    # old style: nsys 2.9.1 has no NVTX payloads, so only the collective is comparable
    q = (f"SELECT {', '.join(cols)} FROM comm_ops c JOIN kernels k USING (kernel_id) "
         "ORDER BY k.rank, k.start_ns, c.collective")
    a, b = kineto.execute(q).fetchall(), nsys.execute(q).fetchall()
    assert len(a) == len(b) > 0
    assert a == b
