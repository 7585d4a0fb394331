"""The per-rank stage of the catalog on Dask distributed, for a Parquet job directory (optional extra
``pip install 'nsys2comm[dask]'``).

Per-rank stage, one Dask task per rank partition, DuckDB SQL inside the task: the shared sweeps that read one
rank's rows only (``PER_RANK``, the views tagged ``-- @sweep per_rank``: the GPU timeline behind overlap_by_rank /
time_breakdown_by_rank / overlap_by_step, and the per-communication-kernel overlap behind comm_kernels and
everything built on it). Each task opens that
rank's parts (and its trace's ``files`` row) and returns the rows as Arrow. The driver gathers them into TEMP
tables (``cache.session_table``) that the helper views read, as ``cache.materialize`` does, then computes the
cross-rank matching (``_skew_ops``: clock alignment and matching need every rank) once, and every catalog query
runs in the driver over the gathered tables and the Parquet views. The workers must see the job directory at the
same path (a shared file system).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from ..errors import UsageError
from . import jobdir
from . import sweeps as cache
from .db import catalog_session

# the sweeps whose rows for a rank depend only on that rank's rows (tagged '-- @sweep per_rank' where they are
# defined; tests/test_dask.py checks them equal to the whole-job computation); the rest is the driver's cross-rank
# stage, in catalog order
PER_RANK = cache.PER_RANK_SWEEPS
CROSS_RANK = tuple(v for v in cache.SWEEPS if v not in PER_RANK)
INSTALL_HINT = "pip install 'nsys2comm[dask]'"


def _distributed():
    try:
        import distributed
    except ImportError:
        raise UsageError("Dask is not installed (needed for --scheduler / --dask-local)", hint=INSTALL_HINT) from None
    return distributed


@contextlib.contextmanager
def client(scheduler=None, local_workers: int | None = None) -> Iterator:
    """A Dask client: ``scheduler`` an address (``tcp://host:8786``) or a ``distributed.Client``; or a local cluster
    of ``local_workers`` processes (one thread each) for the duration."""
    distributed = _distributed()
    if scheduler is not None and local_workers is not None:
        raise UsageError("give either a scheduler address or a local cluster size, not both",
                         hint="--scheduler tcp://host:8786 or --dask-local N")
    if isinstance(scheduler, distributed.Client):
        yield scheduler
        return
    if scheduler is not None:
        try:
            c = distributed.Client(scheduler, timeout="30s")
        except OSError as e:
            raise UsageError(f"cannot reach the Dask scheduler {scheduler} ({e})",
                             hint="start one (dask scheduler, or dask-jobqueue's SLURMCluster) and give its address"
                             ) from None
        try:
            yield c
        finally:
            c.close()
        return
    import logging
    import warnings

    n = int(local_workers or 1)
    if n < 1:
        raise UsageError(f"--dask-local {n}: need at least one worker", hint="e.g. --dask-local 2")
    # the scheduler's HTTP routes move to a free port when 8787 is taken (another cluster): nothing to say about it
    warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
    with distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            distributed.Client(cluster) as c:
        yield c


_local = threading.local()  # one DuckDB session per worker thread: the catalog is installed once


def rank_task(parts: dict[str, list[str]]) -> dict:
    """Worker side: the PER_RANK sweeps over one rank's parts, as Arrow tables."""
    con = getattr(_local, "con", None)
    if con is None:
        con = catalog_session()
        jobdir.create_views(con, parts, comments=False)
        _local.con = con
    else:
        jobdir.create_views(con, parts, comments=False)  # the catalog's objects read whatever the views hold now
    return {v: con.sql(f"SELECT * FROM {v}").to_arrow_table() for v in PER_RANK}


def gather(con, snap: jobdir.Snapshot, dask_client) -> dict:
    """Run the per-rank stage on ``dask_client``, gather it into the session's TEMP tables, then the cross-rank
    stage in ``con``. Returns seconds per stage."""
    import pyarrow as pa

    ranks = snap.ranks()
    t0 = time.perf_counter()
    futures = dask_client.map(rank_task, [snap.rank_slice(r) for r in ranks], pure=False)
    results = dask_client.gather(futures)
    t1 = time.perf_counter()
    for view in PER_RANK:
        table = cache.session_table(view)
        # the live view's own types, whatever Arrow made of them
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM {view} LIMIT 0")
        rows = [r[view] for r in results if r[view].num_rows]
        if rows:
            con.register("_gathered", pa.concat_tables(rows, promote_options="permissive"))
            try:
                con.execute(f"INSERT INTO {table} SELECT * FROM _gathered")
            finally:
                con.unregister("_gathered")
    cache.use_cache(con)
    t2 = time.perf_counter()
    for view in CROSS_RANK:  # in catalog order: each may read the ones before it
        con.execute(f"CREATE OR REPLACE TEMP TABLE {cache.session_table(view)} AS SELECT * FROM {view}")
        cache.use_cache(con)
    t3 = time.perf_counter()
    return {"ranks": len(ranks), "per_rank_s": t1 - t0, "gather_s": t2 - t1, "cross_rank_s": t3 - t2}
