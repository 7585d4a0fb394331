"""Kineto importer, stage 3: after a file's rows are in the job DB, place them on the job timeline and resolve each
communication kernel's collective, sizes and group (queries/ingest/kineto_comm_ops.sql) into comm_ops and
ingest_notes.
"""

from __future__ import annotations

from ..errors import InputError
from .kineto_decode import HINT_BAD_VALUE

_TABLES = ("kernels", "mem_ops", "api_calls", "cpu_ranges")

# the file's communication records and launch chains, staged once for comm_ops and for the notes (TEMP tables of
# the writer's transaction: a failed file leaves none behind)
_RECORDS, _CHAIN = "_ingest_kineto_records_staged", "_ingest_kineto_chain_staged"


def finalize(con, file_id: int) -> None:
    fid = int(file_id)
    rank, = con.execute("SELECT rank FROM ranks WHERE file_id = ? LIMIT 1", [fid]).fetchone()
    _place_on_job_timeline(con, fid, rank)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_RECORDS} AS SELECT * FROM _ingest_kineto_comm_records(?)", [fid])
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_CHAIN} AS "
                f"SELECT * FROM _ingest_kineto_launch_chain(?, '{_RECORDS}')", [fid])
    con.execute(f"INSERT INTO comm_ops BY NAME SELECT * FROM _ingest_kineto_comm_ops(?, '{_RECORDS}', '{_CHAIN}')",
                [fid])
    for sev, code, msg in _comm_notes(con, fid):
        con.execute("INSERT INTO ingest_notes VALUES (?, ?, ?, ?, ?)", [fid, rank, sev, code, msg])
    con.execute(f"DROP TABLE {_RECORDS}")
    con.execute(f"DROP TABLE {_CHAIN}")
    con.execute(f"DELETE FROM cpu_ranges WHERE file_id = {fid} AND kind = '_kernel_args'")


def _collectives_without_kernels(con) -> int:
    """record_param_comms operations that no communication kernel links to (by External id or launch nesting)."""
    return con.execute(f"""
      WITH linked AS (
        SELECT unnest([e1, e2, e3, e4]) AS range_id FROM {_CHAIN}
        UNION SELECT x.range_id FROM {_RECORDS} x JOIN {_RECORDS} k ON k.kind = '_kernel_args' AND x.ext_id = k.ext_id
                                                                  AND x.kind = 'cpu_op')
      SELECT count(*) FROM {_RECORDS}
      WHERE name = 'record_param_comms' AND NOT is_wait AND coll IS NOT NULL
        AND range_id NOT IN (SELECT range_id FROM linked WHERE range_id IS NOT NULL)""").fetchone()[0]


def _place_on_job_timeline(con, fid: int, rank: int) -> None:
    """Add baseTimeNanoseconds to the file's times, and give its rows the rank read from the trailer."""
    off, path = con.execute("SELECT coalesce(clock_offset_ns, 0), path FROM files WHERE file_id = ?", [fid]).fetchone()
    for t in _TABLES + ("devices",):
        sets = []
        if off and t != "devices":
            sets.append(f"start_ns = start_ns + {int(off)}, end_ns = end_ns + {int(off)}")
        stale = con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE file_id = {fid} AND rank <> {rank} "
                            "LIMIT 1)").fetchone()[0]
        if stale:
            sets.append(f"rank = {rank}")
        if not sets:
            continue
        import duckdb  # late: decoder workers import this module and must stay light (no DuckDB in them)

        try:
            con.execute(f"UPDATE {t} SET {', '.join(sets)} WHERE file_id = {fid}")
        except duckdb.OutOfRangeException:
            raise InputError(f"has timestamps that overflow int64 nanoseconds once baseTimeNanoseconds ({off}) "
                             "is added", path=path, hint=HINT_BAD_VALUE) from None


def _comm_notes(con, fid: int) -> list[tuple[str, str, str]]:
    n_comm, n_nosize, n_unknown, n_kargs, n_assumed = con.execute(f"""
      SELECT count(*), count(*) FILTER (WHERE msg_bytes IS NULL), count(*) FILTER (WHERE collective = 'unknown'),
             count(*) FILTER (WHERE collective_source = 'kernel_args'),
             count(*) FILTER (WHERE group_source = 'assumed_world_size')
      FROM comm_ops WHERE file_id = {fid}""").fetchone()
    notes = []
    if n_assumed:
        notes.append(("info", "assumed_group_size",
                      f"{n_assumed} of {n_comm} communication kernels record no process group; the trace shows only "
                      "the default group, so its size was assumed to be the world size"))
    n_cpu_only = _collectives_without_kernels(con)
    if n_cpu_only:
        notes.append(("info", "collectives_without_kernels",
                      f"{n_cpu_only} collectives recorded on the CPU launched no communication kernel (e.g. a "
                      "size-1 group, or a backend without GPU kernels); they are not in comm_ops"))
    if n_nosize:
        notes.append(("warning", "no_msg_sizes",
                      f"{n_nosize} of {n_comm} communication kernels have no message size: profile with "
                      "record_shapes=True, or with PyTorch >= 2.2 (collective args on kernels)"))
    if n_unknown:
        notes.append(("warning", "unknown_collective",
                      f"{n_unknown} of {n_comm} communication kernels could not be matched to a collective"))
    if n_comm and not n_kargs:
        notes.append(("info", "no_collective_args",
                      "communication kernels carry no collective args (PyTorch < 2.2): collectives were found "
                      "through their launches"))
    return notes


def finalize_many(con, file_ids: list[int]) -> None:
    """``finalize`` for the files of one transaction (the writer's batches of small files).

    A file with a communication kernel or a record_param_comms range goes through ``finalize``. Any other file gets
    no comm_ops row and no note from it, only its move onto the job timeline and the removal of its staged kernel
    args: done here for all such files at once, in a few statements instead of a dozen per file (each statement
    binds the catalog's macros: ≈ 0.1 s per file of one kernel). Same rows as ``finalize`` file by file."""
    import duckdb

    fids = sorted({int(f) for f in file_ids})
    if not fids:
        return
    lo, hi = fids[0], fids[-1]
    within = f"file_id BETWEEN {lo} AND {hi} AND list_contains(?, file_id)"
    busy = {r[0] for r in con.execute(
        f"SELECT file_id FROM kernels WHERE {within} AND kernel_class = 'communication' UNION "
        f"SELECT file_id FROM cpu_ranges WHERE {within} AND name = 'record_param_comms' "
        "AND kind IN ('cpu_op', 'user_annotation')", [fids, fids]).fetchall()}
    for fid in sorted(busy):
        finalize(con, fid)
    quiet = [f for f in fids if f not in busy]
    if not quiet:
        return
    # each file's offset and rank (as finalize reads them); `stale` per table: finalize rewrites a table's ranks
    # only where a row's rank differs from the file's
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_kineto_place AS "
                "SELECT f.file_id, coalesce(f.clock_offset_ns, 0) AS off, "
                "(SELECT rank FROM ranks r WHERE r.file_id = f.file_id LIMIT 1) AS rank "
                f"FROM files f WHERE {within.replace('file_id', 'f.file_id')}", [quiet])
    try:
        for t in _TABLES + ("devices",):
            stale = [r[0] for r in con.execute(
                f"SELECT DISTINCT x.file_id FROM {t} x JOIN _ingest_kineto_place p USING (file_id) "
                f"WHERE x.file_id BETWEEN {lo} AND {hi} AND x.rank <> p.rank", []).fetchall()]
            shift = "" if t == "devices" else "start_ns = start_ns + p.off, end_ns = end_ns + p.off, "
            cond = "list_contains(?, p.file_id)" if t == "devices" else "(p.off <> 0 OR list_contains(?, p.file_id))"
            con.execute(f"UPDATE {t} SET {shift}rank = CASE WHEN list_contains(?, p.file_id) THEN p.rank "
                        f"ELSE {t}.rank END FROM _ingest_kineto_place p WHERE {t}.file_id = p.file_id AND {cond}",
                        [stale, stale])
    except duckdb.OutOfRangeException:
        raise InputError("has timestamps that overflow int64 nanoseconds once baseTimeNanoseconds is added "
                         "(one of the files written together)", hint=HINT_BAD_VALUE) from None
    con.execute("DROP TABLE _ingest_kineto_place")
    con.execute(f"DELETE FROM cpu_ranges WHERE {within} AND kind = '_kernel_args'", [quiet])
