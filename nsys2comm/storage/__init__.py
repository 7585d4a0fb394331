"""Storage: where a job's rows live and the one owner of opening them.

- :mod:`.db`: DuckDB job files and in-memory jobs (open, create, seal read-only, the catalog template copy);
- :mod:`.template`: the per-user catalog template that new databases copy;
- :mod:`.sweeps`: the stored sweeps (``-- @sweep`` helper views kept as tables) and ``settle``;
- :mod:`.jobdir`: the Parquet job directory's layout and its read-only views;
- :mod:`.dask_stage`: the per-rank stage of a job directory on Dask;
- :mod:`.usercache`: the per-user cache directory.

Modules above this layer import only the names below (``from nsys2comm.storage import connect``), never a
submodule's internals; ``jobdir`` is exported whole because the Parquet writer (``ingest.jobwrite``) follows its
layout. The architecture test holds both rules.
"""

from __future__ import annotations

from . import jobdir, usercache
from .dask_stage import client as dask_client
from .dask_stage import gather as dask_gather
from .db import DUCKDB_MAGIC, connect, read_head, seal_read_only, take_fresh_copy
from .jobdir import is_job_dir
from .sweeps import catalog_installed, drop_cache, materialize, refresh_cache, settle, snapshotted, unmaterialize

__all__ = ["DUCKDB_MAGIC", "catalog_installed", "connect", "dask_client", "dask_gather", "drop_cache", "is_job_dir",
           "jobdir", "materialize", "read_head", "refresh_cache", "seal_read_only", "settle", "snapshotted",
           "take_fresh_copy", "unmaterialize", "usercache"]

