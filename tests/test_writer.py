"""The writer inserts a file's batches in one transaction without holding them: memory stays flat as a file grows."""

from __future__ import annotations

import gc
import weakref

import pyarrow as pa

from nsys2comm.ingest.base import Batch
from nsys2comm.ingest.kineto_rows import SCHEMAS
from nsys2comm.ingest.writer import insert_batch
from nsys2comm.storage import db


def _batch(table: str, n: int, name: str) -> Batch:
    schema = SCHEMAS[table]
    cols = {f.name: pa.array([None] * n, f.type) for f in schema}
    cols.update(rank=pa.array([0] * n, pa.int32()), start_ns=pa.array(range(n), pa.int64()),
                end_ns=pa.array(range(1, n + 1), pa.int64()), name=pa.array([name] * n))
    cols[{"kernels": "kernel_id", "api_calls": "call_id"}[table]] = pa.array(range(n), pa.int64())
    if table == "kernels":
        cols["device_id"] = pa.array([0] * n, pa.int32())
    else:
        cols["api"] = pa.array(["runtime"] * n)
    return Batch(table, pa.table(cols, schema=schema))


def test_a_batch_is_released_once_inserted_not_at_the_commit(tmp_path):
    con = db.connect(tmp_path / "job.duckdb", write=True)
    con.execute("BEGIN TRANSACTION")
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source) "
                "VALUES (1, 'x', 'pending:1', 1, 'kineto')")
    names: set[str] = set()
    for table, name in (("api_calls", "cudaLaunchKernel"), ("kernels", "ncclDevKernel_AllReduce_Sum_f32_RING_LL")):
        batch = _batch(table, 1000, name)
        alive = weakref.ref(batch.data)
        insert_batch(con, 1, batch, names)
        del batch
        gc.collect()
        # a view registered and dropped inside the transaction kept its Arrow table until the commit
        assert alive() is None, f"the {table} batch is still referenced after its insert"
    con.execute("COMMIT")
    assert con.execute("SELECT count(*) FROM api_calls").fetchall()[0][0] == 1000
    assert con.execute("SELECT count(*), min(kernel_class) FROM kernels").fetchall()[0] == (1000, "communication")
    con.close()


def test_an_ingest_ends_with_one_checkpoint_and_leaves_no_log(tmp_path):
    """Automatic checkpoints wait for the end of the ingest, which checkpoints once: readers open a file with no
    write-ahead log to replay, and the connection's own threshold is back."""
    from pathlib import Path

    from nsys2comm.ingest import ingest

    path = tmp_path / "job.duckdb"
    con = db.connect(path, write=True)
    before = con.execute("SELECT current_setting('checkpoint_threshold')").fetchall()[0][0]
    example = sorted((Path(__file__).parents[1] / "fixtures" / "example").glob("*.json.gz"))[:2]
    ingest(con, example, jobs=1)
    assert not Path(str(path) + ".wal").exists() or Path(str(path) + ".wal").stat().st_size == 0
    assert con.execute("SELECT current_setting('checkpoint_threshold')").fetchall()[0][0] == before
    assert con.execute("SELECT count(*) FROM files").fetchone()[0] == 2
    con.close()
