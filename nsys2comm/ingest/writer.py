"""Writes importer batches into the job database: a file's batches inside its transaction (``insert_batch``), or
the batches of several small files at once inside the transaction of their batch (``insert_files``)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputError
from .base import ID_COLUMNS, ID_SHIFT, Batch

_FILE_COLUMNS = ("format_version", "producer", "host", "clock_rule", "clock_offset_ns", "comm_library_version")


def insert_batch(con, file_id: int, batch: Batch, names: set[str] | None = None) -> None:
    """Insert one batch; adds file_id, makes ids job-unique, derives kernel short names and classes.

    ``names``: kernel names classified so far for this file (kept by the caller across its batches); each name is
    classified once, into the TEMP table _ingest_kernel_names, instead of once per batch (the SQL rules take
    ~30 ms to plan, and a large trace has dozens of batches with the same few hundred names)."""
    data = batch.data
    if data.num_rows == 0:
        return
    if batch.table == "files":
        row = data.to_pylist()[0]
        sets = ", ".join(f"{c} = ?" for c in _FILE_COLUMNS if c in row)
        if sets:
            con.execute(f"UPDATE files SET {sets} WHERE file_id = ?",
                        [row[c] for c in _FILE_COLUMNS if c in row] + [file_id])
        return
    _insert(con, batch.table, data, names, file_id)


def insert_files(con, meta: list[dict], tables: dict[str, list[pa.Table]], names: set[str] | None = None) -> None:
    """Insert the rows of several files at once, one INSERT per table: what ``insert_batch`` does file by file,
    with the same rows (each statement costs its planning, ≈ 5-30 ms, whatever its size). ``tables``' rows carry
    their ``file_id``; ``files`` rows must already exist, and ``meta`` (one dict per file: file_id and the
    metadata its importer gave) updates them in one statement."""
    cols = [c for c in _FILE_COLUMNS if any(c in m for m in meta)]
    if cols:
        _meta = pa.Table.from_pylist([{"file_id": m["file_id"]} | {c: m.get(c) for c in cols} for m in meta])
        con.execute(f"UPDATE files SET {', '.join(f'{c} = _meta.{c}' for c in cols)} FROM _meta "
                    "WHERE files.file_id = _meta.file_id")
    for table, parts in tables.items():
        try:
            joined = [pa.concat_tables(parts, promote_options="default")]
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # optional columns of different types: part by part
            joined = parts
        for data in joined:
            if not data.num_rows:
                continue
            if table == "ranks":
                wanted = [r for r in data.column("rank").to_pylist() if r is not None]
                if len(wanted) != len(set(wanted)):
                    raise InputError("two files of one batch claim one rank")  # the writer retries them one by one
            _insert(con, table, data, names)


def _insert(con, table: str, data: pa.Table, names: set[str] | None, file_id: int | None = None) -> None:
    """One INSERT of ``data`` into ``table``: ids made job-unique (file_id << ID_SHIFT), kernel short names and
    classes derived. ``file_id``: the file every row belongs to, or None when the rows carry their own."""
    if table == "ranks":
        _check_rank_collisions(con, data)
    cols = set(data.column_names)
    idc = ID_COLUMNS.get(table)
    exprs, excl = [], []
    if file_id is not None:
        exprs.append(f"{file_id}::INTEGER AS file_id")
        excl += ["file_id"] if "file_id" in cols else []
    fid = "file_id" if file_id is None else str(file_id)
    if idc and idc in cols:
        exprs.append(f"({fid}::BIGINT << {ID_SHIFT}) + {idc} AS {idc}")
        excl.append(idc)
    src = "_batch"
    if table == "kernels":
        # one naming rule for every source, so identical kernels get identical rows
        _classify_new_names(con, data, names)
        derived = [c for c in ("kernel_class", "short_name") if c in cols]
        keep = f"b.* EXCLUDE ({', '.join(derived)})" if derived else "b.*"
        src = (f"(SELECT {keep}, n.kernel_class, n.short_name FROM _batch b JOIN _ingest_kernel_names n "
               "USING (name))")
    exclude = f" EXCLUDE ({', '.join(excl)})" if excl else ""
    # DuckDB reads _batch from this frame's locals (its replacement scan), not from con.register: a view registered
    # and dropped inside the file's transaction keeps its Arrow table alive until the commit, so the writer held
    # every batch of the file at once (main-process memory grew with the file).
    _batch = data
    extra = f", {', '.join(exprs)}" if exprs else ""
    con.execute(f"INSERT INTO {table} BY NAME SELECT *{exclude}{extra} FROM {src}")


def _classify_new_names(con, data: pa.Table, names: set[str] | None) -> None:
    if names is None or not names:
        con.execute("CREATE OR REPLACE TEMP TABLE _ingest_kernel_names (name VARCHAR, kernel_class VARCHAR, "
                    "short_name VARCHAR)")
        names = set() if names is None else names
    new = [n for n in pc.unique(data["name"]).to_pylist() if n not in names]
    if new:
        con.execute("INSERT INTO _ingest_kernel_names SELECT name, kernel_class(name), kernel_short_name(name) "
                    "FROM unnest(?::VARCHAR[]) t(name)", [new])
        names.update(new)


def _check_rank_collisions(con, ranks: pa.Table) -> None:
    """Two files claiming one rank are two jobs mixed in one database (or a rank the trace could not tell)."""
    wanted = [r for r in ranks.column("rank").to_pylist() if r is not None]
    if not wanted:
        return
    clash = con.execute(
        "SELECT r.rank, f.path FROM ranks r JOIN files f USING (file_id) WHERE r.rank IN (SELECT unnest(?)) "
        "ORDER BY r.rank LIMIT 1", [wanted]).fetchone()
    if clash:
        raise InputError(f"rank {clash[0]} is already in this job database (from {clash[1]})",
                         hint="traces of another job belong in another --db; give --rank N if the rank was guessed")
