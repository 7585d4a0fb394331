"""What every importer produces: a stream of batches of canonical rows.

An importer is a module with ``SOURCE`` (str), ``sniff(path, head: bytes) -> bool``,
``read(path, options) -> Iterator[Batch]`` and ``finalize(con, file_id)``.

``read`` streams: it yields ``Batch(table, arrow_table)`` as soon as a chunk is parsed, so memory stays bounded.
Batch rows use canonical column names without ``file_id``; id columns (``kernel_id``, ``memop_id``,
``range_id``, ``call_id``) hold the row's index inside the file and the writer makes them job-unique.
``kernels`` batches need no ``short_name`` or ``kernel_class``: the writer derives both in SQL (one rule for every
source).
One ``files`` batch (one row: format_version, producer, host, clock_rule, clock_offset_ns) and one ``ranks``
batch must be yielded, in any order. ``finalize`` runs inside the file's transaction after all batches are
written and fills ``comm_ops`` (and ``ingest_notes``) with SQL over the file's canonical rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


@dataclass
class Batch:
    table: str
    data: pa.Table


@dataclass
class ReadOptions:
    rank: int | None = None  # --rank: explicit rank (kineto) / first rank (nsys)
    extra: dict[str, Any] = field(default_factory=dict)


ID_COLUMNS = {"kernels": "kernel_id", "mem_ops": "memop_id", "cpu_ranges": "range_id", "api_calls": "call_id"}
ID_SHIFT = 40  # job-unique id = file_id << 40 | index in file


def process_pool(workers: int):
    """A process pool safe to start from a process that runs DuckDB threads: forkserver, not fork
    (a forked child can inherit locks held by other threads and hang or crash)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("forkserver"))
