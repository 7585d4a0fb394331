"""nsys importer: the row tables (SOURCES) read in-process, or by rowid ranges in decoder processes.

Fetching rows through sqlite3 and turning them into Arrow columns is most of an export's ingest, and one process
does it on one core. With decoder processes, each export table is cut into ranges of rowids (SQLite finds a range
through the table's B-tree) and each range is read on the process's own read-only connection. Results are merged in
table and rowid order, their row ids shifted by the rows read before them, so the batches are those of a read in one
process (tests/test_ingest_nsys.py compares them).

This module knows nothing of the export's tables: ``nsys`` passes its table list, its table reader and how a decoder
process opens an export (module-level functions of ``nsys_tables`` and ``nsys_export``, so a decoder process
receives them by name), and this module imports nothing from them (tests/test_importers.py checks the ingest package
has no import circle).
"""

from __future__ import annotations

import sqlite3
from collections import Counter, deque
from collections.abc import Iterator

from .base import Batch, process_pool, shift_ids, stop_pool


def read_tables(ex, ctx, dec, counts: Counter, nworkers: int, range_rows: int, *, sources, read_table,
                open_export) -> Iterator[Batch]:
    """Every row table's batches with the file's row ids; ``counts`` gains what nsys_tables.notes_from_counts reports.

    ``sources``: (canonical table, export table) in reading order; ``read_table(ex, ctx, source, rows, counts, dec)``:
    one export table's batches, row ids from 0; ``open_export(path) -> (export, payload decoder)``: a decoder
    process's own connection. Both functions must be module-level (they are sent to decoder processes by name)."""
    if nworkers <= 0:
        for table, source in sources:
            before = counts[table]
            for b in read_table(ex, ctx, source, None, counts, dec):
                yield Batch(table, shift_ids(table, b.data, before))
        return
    pool = process_pool(nworkers)
    try:
        inflight: deque = deque()
        for table, source, lo, hi in _plan(ex, sources, range_rows):
            inflight.append((table, pool.submit(_read_range, str(ex.path), ctx, source, lo, hi, read_table,
                                                open_export)))
            if len(inflight) > nworkers:
                yield from _merge(*inflight.popleft(), counts)
        while inflight:
            yield from _merge(*inflight.popleft(), counts)
        pool.shutdown()
    except BaseException:
        stop_pool(pool)  # an error, a signal or a consumer that stopped: do not wait for the other ranges
        raise


def _plan(ex, sources, range_rows: int) -> list[tuple[str, str, int | None, int | None]]:
    """(canonical table, export table, lo, hi): rowids [lo, hi) of every export table, ``range_rows`` at a time; the
    whole table in one piece (lo = hi = None) where it has no rowid (a WITHOUT ROWID table, never written by nsys)."""
    plan = []
    for table, source in sources:
        if source not in ex.tables:
            continue
        try:  # one aggregate per query: SQLite reads min() or max() of the rowid from the B-tree's end only then
            lo = ex.con.execute(f"SELECT min(rowid) FROM {source}").fetchone()[0]
            hi = ex.con.execute(f"SELECT max(rowid) FROM {source}").fetchone()[0]
        except sqlite3.OperationalError:
            plan.append((table, source, None, None))
            continue
        if lo is None:
            continue
        plan += [(table, source, a, min(a + range_rows, hi + 1)) for a in range(lo, hi + 1, range_rows)]
    return plan


def _merge(table: str, fut, counts: Counter) -> Iterator[Batch]:
    tables, got = fut.result()
    before = counts[table]
    for data in tables:
        yield Batch(table, shift_ids(table, data, before))
    counts.update(got)


_open: tuple | None = None  # (path, export, NVTX payload decoder) of this decoder process


def _read_range(path: str, ctx, source: str, lo: int | None, hi: int | None, read_table,
                open_export) -> tuple[list, Counter]:
    """Decoder process: rowids [lo, hi) of one export table (all of it when lo is None) -> (Arrow tables with ids
    from 0, counts)."""
    global _open
    if _open is None or _open[0] != path:
        if _open is not None:
            _open[1].con.close()
        _open = (path, *open_export(path))
    _, ex, dec = _open
    counts: Counter = Counter()
    rows = None if lo is None else (lo, hi)
    return [b.data for b in read_table(ex, ctx, source, rows, counts, dec)], counts
