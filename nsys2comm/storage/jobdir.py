"""A job as a Parquet directory: the layout, what a reader sees of it, and read-only sessions over it.

Layout (written by :mod:`nsys2comm.ingest.jobwrite`, ``nsys2comm ingest TRACES --out DIR``)::

    DIR/_nsys2comm.json                                   marker: format and schema version
    DIR/<table>/rank=<R>/part-<sha16>.parquet             one part per trace file and rank, every canonical table
    DIR/<table>/rank=__HIVE_DEFAULT_PARTITION__/part-…    rows whose rank is NULL (process_groups, ingest_notes)

``sha16`` is the first 16 hex digits of the trace's sha256, the same in every table. ``files`` has no rank
column; its part sits under the file's smallest rank and is renamed into place last, so it is the file's commit
record: readers take a table part only when a ``files`` part of the same name exists. A writer killed before that
leaves nothing visible; temp files (``.part-….tmp``, dot-prefixed) are never read.

A reader (:func:`connect`) lists the committed parts once (one consistent snapshot, whatever writers do later),
then each canonical table is a TEMP view on ``read_parquet([parts], hive_partitioning = true)`` with the
documented column types and docs, so a filter on ``rank`` skips the other ranks' files. Everything job-wide (the
sweeps, clock offsets, the timeline's origin) is computed at read time by the catalog, as for a DuckDB file.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from .. import catalog
from ..errors import InputError, UsageError
from .db import SCHEMA_VERSION, catalog_session, memory_connection, seal_read_only

MARKER = "_nsys2comm.json"
FORMAT = "nsys2comm parquet job"
NULL_RANK = "__HIVE_DEFAULT_PARTITION__"  # Hive's (and DuckDB's) directory name for a NULL partition value
COMMIT_TABLE = "files"  # renamed into place last: a file's parts count only once its files part exists
_PART = re.compile(r"^part-([0-9a-f]{16})\.parquet$")
_WRITE_IT = "write one with: nsys2comm ingest TRACES --out DIR"


def part_name(sha256: str) -> str:
    return f"part-{sha256[:16]}.parquet"


def rank_dir(rank: int | None) -> str:
    return f"rank={NULL_RANK if rank is None else int(rank)}"


@functools.cache
def table_columns() -> dict[str, list[tuple[str, str]]]:
    """Canonical table -> [(column, DuckDB type)], from the schema itself (one definition)."""
    con = memory_connection()
    out = {}
    for obj in catalog.load_catalog():
        if obj.kind == "table":
            con.execute(obj.sql)
            out[obj.name] = [(r[0], r[1]) for r in con.execute(f"DESCRIBE {obj.name}").fetchall()]
    con.close()
    return out


def is_job_dir(path: str | Path) -> bool:
    """True for a directory written by ``nsys2comm ingest --out`` (it holds the marker file)."""
    p = Path(path)
    return p.is_dir() and (p / MARKER).is_file()


def check_marker(root: Path) -> None:
    try:
        meta = json.loads((root / MARKER).read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {MARKER} ({e})", path=str(root), hint=_WRITE_IT) from None
    if meta.get("format") != FORMAT:
        raise InputError(f"{MARKER} does not describe an nsys2comm Parquet job", path=str(root), hint=_WRITE_IT)
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"written with schema version {meta.get('schema_version')}, this nsys2comm reads "
                         f"{SCHEMA_VERSION}", path=str(root), hint="re-ingest the traces with this version")


def marker_text() -> str:
    return json.dumps({"format": FORMAT, "schema_version": SCHEMA_VERSION,
                       "layout": "<table>/rank=<R>/part-<sha256[:16]>.parquet"}, indent=1) + "\n"


def _rank_of(dirname: str) -> int | None | bool:
    """Rank of a ``rank=R`` directory name; None for the NULL partition; False for anything else."""
    if not dirname.startswith("rank="):
        return False
    v = dirname[5:]
    if v == NULL_RANK:
        return None
    return int(v) if re.fullmatch(r"-?\d+", v) else False


def _scan(table_dir: Path) -> list[tuple[int | None, str, str]]:
    """(rank, sha16, path) of every part file under one table's directory (committed or not)."""
    out: list[tuple[int | None, str, str]] = []
    try:
        rank_dirs = list(os.scandir(table_dir))
    except FileNotFoundError:
        return out
    for d in rank_dirs:
        rank = _rank_of(d.name)
        if rank is False or not d.is_dir():
            continue
        for f in os.scandir(d.path):
            m = _PART.match(f.name)
            if m:
                out.append((rank, m.group(1), f.path))
    return out


@dataclass
class Snapshot:
    """The committed parts of a job directory at one moment, less the ranks that two traces claim (``conflicts``:
    rank -> the sha16 of every trace claiming it; those ranks' parts are left out of every table)."""
    root: Path
    commits: dict[str, str] = field(default_factory=dict)  # sha16 -> path of its files part
    parts: dict[str, list[tuple[int | None, str, str]]] = field(default_factory=dict)  # table -> (rank, sha16, path)
    conflicts: dict[int, list[str]] = field(default_factory=dict)

    def paths(self, table: str, rank: int | None | bool = False) -> list[str]:
        """Part paths of a table in read order (rank, then name); ``rank`` given: that rank's only."""
        return [p for r, _s, p in self.parts.get(table, []) if rank is False or r == rank]

    def all_paths(self) -> list[str]:
        return [p for parts in self.parts.values() for _r, _s, p in parts]

    def ranks(self) -> list[int]:
        return sorted({r for r, _s, _p in self.parts.get("ranks", []) if r is not None})

    def rank_slice(self, rank: int) -> dict[str, list[str]]:
        """One rank's parts of every table, and the files parts of the traces that hold the rank."""
        shas = {s for r, s, _p in self.parts.get("ranks", []) if r == rank}
        out = {t: self.paths(t, rank) for t in self.parts if t != COMMIT_TABLE}
        out[COMMIT_TABLE] = [p for _r, s, p in self.parts.get(COMMIT_TABLE, []) if s in shas]
        return out


def snapshot(root: str | Path) -> Snapshot:
    root = Path(root).resolve()
    snap = Snapshot(root)
    snap.commits = {s: p for _r, s, p in _scan(root / COMMIT_TABLE)}
    for table in table_columns():
        parts = [x for x in _scan(root / table) if x[1] in snap.commits]
        parts.sort(key=lambda x: (x[0] is None, x[0] or 0, x[1]))
        snap.parts[table] = parts
    claims: dict[int, list[str]] = {}
    for rank, sha, _p in snap.parts["ranks"]:
        if rank is not None:
            claims.setdefault(rank, []).append(sha)
    # one bad rank must not cost the analysis of the job: a rank two traces claim is left out, and said
    snap.conflicts = {r: shas for r, shas in claims.items() if len(shas) > 1}
    if snap.conflicts:
        snap.parts = {t: [x for x in parts if x[0] not in snap.conflicts] for t, parts in snap.parts.items()}
    return snap


def _source(table: str, paths: list[str]) -> str:
    """SELECT of a canonical table over its parts, cast to the documented types (an empty one stays typed)."""
    cols = table_columns()[table]
    if not paths:
        return "SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in cols) + " LIMIT 0"
    files = "[" + ", ".join(map(catalog.sql_string, paths)) + "]"
    # the rank comes from the directory name (hive), which is what lets a rank filter skip files
    return ("SELECT " + ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t in cols)
            + f" FROM read_parquet({files}, hive_partitioning = true, hive_types = {{'rank': INTEGER}})")


def create_views(con, parts: dict[str, list[str]], *, comments: bool = True) -> None:
    """Each canonical table as a TEMP view on its parts (replacing any earlier one)."""
    for obj in catalog.load_catalog():
        if obj.kind != "table":
            continue
        con.execute(f"CREATE OR REPLACE TEMP VIEW {obj.name} AS {_source(obj.name, parts.get(obj.name, []))}")
        if comments:
            catalog.comment_view(con, obj)


def conflict_paths(con, snap: Snapshot) -> dict[int, list[str]]:
    """rank -> the paths of the traces that claim it (from their committed files parts)."""
    return {r: [con.execute("SELECT path FROM read_parquet(?)", [snap.commits[s]]).fetchone()[0] for s in shas]
            for r, shas in sorted(snap.conflicts.items())}


def _note_conflicts(con, snap: Snapshot) -> None:
    """Each conflicting rank as a warning in ingest_notes (so in diagnostics, the summary's missing and the report's
    notes): the rest of the job is analysed without it."""
    if not snap.conflicts:
        return
    rows = [(r, f"rank {r} is claimed by {len(paths)} traces ({', '.join(paths)}): left out of the analysis; "
                "move the trace of the other job out of the directory")
            for r, paths in conflict_paths(con, snap).items()]
    values = ", ".join(f"(NULL, {r}, 'warning', 'rank_conflict', {catalog.sql_string(m)})" for r, m in rows)
    stored = _source("ingest_notes", snap.paths("ingest_notes"))
    con.execute(f"CREATE OR REPLACE TEMP VIEW ingest_notes AS SELECT * FROM ({stored}) UNION ALL "
                f"SELECT * FROM (VALUES {values}) AS c(file_id, rank, severity, code, message)")
    catalog.comment_view(con, next(o for o in catalog.load_catalog() if o.name == "ingest_notes"))


def connect(root: str | Path, *, write: bool = False, gather=None) -> duckdb.DuckDBPyConnection:
    """A read-only session on a job directory: an in-memory database whose canonical tables are views on the
    committed parts (TEMP views shadowing the empty tables of a catalog template copy), sealed so that only those part
    files can be read.

    ``gather(con, snap)``, when given, runs before the seal (e.g. the per-rank stage on Dask filling TEMP tables).
    """
    if write:
        raise UsageError("a Parquet job directory is read-only", path=str(root),
                         hint="add traces with nsys2comm ingest TRACES --out DIR; for scratch objects use "
                              "CREATE TEMP")
    root = Path(root)
    if not is_job_dir(root):
        raise InputError("is not an nsys2comm Parquet job directory (no " + MARKER + ")", path=str(root),
                         hint=_WRITE_IT)
    check_marker(root)
    snap = snapshot(root)
    con = catalog_session()
    try:
        create_views(con, {t: snap.paths(t) for t in snap.parts})
        _note_conflicts(con, snap)
        if gather is not None:
            gather(con, snap)
        con.execute("SET parquet_metadata_cache = true")  # every query opens the same parts (set before the seal)
        seal_read_only(con, snap.all_paths())
    except BaseException:
        con.close()
        raise
    return con
