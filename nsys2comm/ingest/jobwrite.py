"""Write traces into a Parquet job directory (``nsys2comm ingest TRACES --out DIR``; layout in :mod:`.jobdir`).

Each trace goes through the ordinary importer pipeline (:func:`nsys2comm.ingest.ingest`) into an in-memory
database, then every canonical table's rows of that file are written per rank as Parquet: to a temp file in the
partition's own directory, then renamed (atomic on one file system), the ``files`` part last. Writers need no
coordination: a file's parts carry its sha256 in their name, and its ids are its own:

- ``file_id`` = the file's smallest rank + 1 (ranks are job-unique), so a job whose files hold one rank each,
  ranks 0…N−1, gets the file ids of a DuckDB file ingested in rank order;
- every id column (``kernel_id``, ``memop_id``, ``range_id``, ``call_id``) is ``file_id << 40 | row index``, as
  in a DuckDB job database (ingest.base.ID_SHIFT).

A file whose ``files`` part exists is skipped (re-ingest). A killed writer leaves temp files (never read); a
later writer on the same host removes those whose process is gone, and any writer those older than a day.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa

from ..errors import InputError, as_user_error
from ..storage import connect, jobdir
from . import FileResult, detect, expand_paths, ingest, sha256_of
from .base import ID_COLUMNS, ID_SHIFT, alive, process_pool, stop_pool

_MAX_FILE_ID = 1 << (63 - ID_SHIFT)  # ids are file_id << 40 | index and must stay within BIGINT
_STALE_S = 24 * 3600  # temp files of other hosts older than this are a dead writer's
_HOST = socket.gethostname().replace(".", "_")
_con = None  # one in-memory pipeline per process (installing the catalog takes a second or two)


def prepare(out: str | Path) -> Path:
    """Create the job directory (or check an existing one) and remove dead writers' temp files."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise InputError("exists and is not a directory", path=str(root),
                         hint="give a new or empty directory for a Parquet job, or --db FILE.duckdb")
    # listed before the marker is looked for: a writer starting beside this one may be writing the marker (its temp
    # file is there, the marker not yet), and it writes the marker before anything else
    if root.is_dir() and _foreign_entries(root) and not jobdir.is_job_dir(root):
        raise InputError("is a directory but not an nsys2comm Parquet job", path=str(root),
                         hint="give a new or empty directory, or one written by nsys2comm ingest --out")
    root.mkdir(parents=True, exist_ok=True)
    if jobdir.is_job_dir(root):
        jobdir.check_marker(root)
    else:
        _atomic_write_text(root / jobdir.MARKER, jobdir.marker_text())  # every writer writes the same bytes
    remove_stale_temps(root)
    remove_orphan_parts(root)
    return root


_TEMP_GLOB = ".*.tmp"  # a writer's temp file: .NAME.HOST.PID.tmp (_tmp_name)


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.{_HOST}.{os.getpid()}.tmp")


def _foreign_entries(root: Path) -> list[Path]:
    """What a directory holds besides the marker and nsys2comm writers' temp files."""
    return [p for p in root.iterdir() if p.name != jobdir.MARKER and not fnmatch.fnmatch(p.name, _TEMP_GLOB)]


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = _tmp_name(path)
    tmp.write_text(text)
    os.replace(tmp, path)


def _dead_temps(root: Path) -> list[Path]:
    """Temp files of writers that died: this host's whose process is gone, any host's older than a day."""
    found = []
    now = time.time()
    for tmp in root.glob("**/" + _TEMP_GLOB):
        parts = tmp.name.rsplit(".", 3)  # .NAME . HOST . PID . tmp
        host, pid = (parts[1], parts[2]) if len(parts) == 4 else ("", "")
        try:
            if (host == _HOST and pid.isdigit() and not alive(int(pid))) or now - tmp.stat().st_mtime > _STALE_S:
                found.append(tmp)
        except FileNotFoundError:
            continue
    return found


def _remove(paths: list[Path]) -> list[str]:
    import shutil

    for path in paths:
        if path.is_dir() and not path.is_symlink():  # a batch's temp directory (write_many)
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return [str(path) for path in paths]


def remove_stale_temps(root: Path) -> list[str]:
    """Remove the temp files of writers that died (:func:`_dead_temps`)."""
    return _remove(_dead_temps(root))


def committed(root: Path, sha: str) -> bool:
    return committed_sha16(root, sha[:16])


def committed_sha16(root: Path, sha16: str) -> bool:
    return any((root / jobdir.COMMIT_TABLE).glob(f"rank=*/{jobdir.part_name(sha16)}"))


def _pipeline():
    """This process's pipeline database: a temp DuckDB file copied from the catalog template (≈ 1 ms; installing
    the catalog into an in-memory database took 2-15 s of each writer process), else in memory. Removed at exit,
    or by the next ingest when this process was killed (its name starts with the spool prefix and this pid)."""
    global _con
    if _con is None:
        import atexit
        import shutil
        import tempfile

        from .base import SPOOL_PREFIX

        d = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-pipeline-")
        atexit.register(shutil.rmtree, d, True)
        try:
            _con = connect(Path(d) / "pipeline.duckdb", write=True)
        except Exception:  # noqa: BLE001 - no template here: in memory, the catalog installed by ingest
            _con = connect(None, objects=False)
    return _con


def write_one(path: str, out: str, rank: int | None = None, world_size: int | None = None,
              read_extra: dict | None = None) -> FileResult:
    """One trace into the job directory (the unit of work of a writer process). Raises InputError for a bad file."""
    root = Path(out)
    detect(Path(path))  # not a trace: fail before hashing
    sha = sha256_of(Path(path))
    if committed(root, sha):
        return FileResult(path, "skipped", "already ingested")
    con = _pipeline()
    res = ingest(con, [path], rank=rank, world_size=world_size, keep_going=False, jobs=1, read_extra=read_extra,
                 store_sweeps=False)[0]
    if res.status != "ingested" or res.file_id is None:  # the same file twice in one process: its rows are gone
        return FileResult(path, "skipped", "already ingested")
    try:
        fid = _export(con, root, res.file_id, sha, path)
    finally:
        for table in jobdir.table_columns():
            con.execute(f"DELETE FROM {table} WHERE file_id = ?", [res.file_id])
    return FileResult(path, "ingested", "", fid, res.ranks)


def write_many(paths: list[str], out: str, rank: int | None = None, world_size: int | None = None,
               read_extra: dict | None = None) -> list[tuple[FileResult | None, Exception | None]]:
    """Several small traces into the job directory (the unit of work of a writer process for small files): one
    in-memory ingest for all of them (batched, see ingest._write_batch), one COPY per table for all their parts,
    then each file's parts renamed into place, its ``files`` part last: every file still commits on its own, and a
    bad one fails alone. Per file (its result, or its error)."""
    root = Path(out)
    results: list[tuple[FileResult | None, Exception | None]] = [(None, None)] * len(paths)
    done = _committed_names(root)  # once per batch: each glob over rank=* lists every rank's directory
    todo: dict[str, tuple[int, str]] = {}
    for i, path in enumerate(paths):
        try:
            detect(Path(path))  # not a trace: fail before hashing
            sha = sha256_of(Path(path))
        except Exception as err:  # noqa: BLE001 - per file
            results[i] = (None, err)
            continue
        if jobdir.part_name(sha) in done:
            results[i] = (FileResult(path, "skipped", "already ingested"), None)
        else:
            todo[str(Path(path).resolve())] = (i, sha)
    if not todo:
        return results
    con = _pipeline()
    order = list(todo)
    try:
        ingested = []
        for res in ingest(con, order, world_size=world_size, keep_going=True, jobs=1, read_extra=read_extra,
                          store_sweeps=False):
            i, sha = todo[str(Path(res.path).resolve())]
            if res.status == "failed":
                results[i] = (None, InputError(res.message.split(": ", 1)[-1], path=paths[i]))
            elif res.status != "ingested" or res.file_id is None:
                results[i] = (FileResult(paths[i], "skipped", "already ingested"), None)
            else:
                ingested.append((i, sha, res))
        ranks_of = {i: res.ranks for i, _sha, res in ingested}
        for i, fid, error in _export_many(con, root, [(int(res.file_id or 0), sha, i, paths[i], res.ranks)
                                                      for i, sha, res in ingested], done):
            results[i] = ((None, error) if error is not None
                          else (FileResult(paths[i], "ingested", "", fid, ranks_of[i]), None))
    finally:
        for table in jobdir.table_columns():
            con.execute(f"DELETE FROM {table}")
    return results


def _committed_names(root: Path) -> set[str]:
    """Names of the committed parts (``files`` parts), read once."""
    return {p.name for p in (root / jobdir.COMMIT_TABLE).glob("rank=*/part-*.parquet")}


def _export_many(con, root: Path, files: list[tuple[int, str, int, str, list]], commits: set[str]):
    """Yield (index, file id, error) per file, in index order. ``files``: (file id in the pipeline, sha256, the
    caller's index of the file, its path, its ranks). Claims first (a file whose rank is taken fails alone), then
    one COPY per table for the claimed files (``_copy_parts``), each file committed by its ``files`` part."""
    ok: list[tuple[int, int, str, int, list[Path]]] = []  # (f0, fid, sha, index, claims)
    out: list[tuple[int, int | None, Exception | None]] = []
    for f0, sha, i, path, ranks in files:
        try:
            fid, claims = _claim_file(con, root, sha, path, ranks, commits)
            ok.append((f0, fid, sha, i, claims))
        except Exception as err:  # noqa: BLE001 - per file
            out.append((i, None, err))
    if ok:
        try:
            _copy_parts(con, root, [(f0, fid, sha) for f0, fid, sha, _i, _c in ok])
            out += [(i, fid, None) for _f0, fid, _sha, i, _c in ok]
        except Exception as err:  # noqa: BLE001 - e.g. a full disk: nothing of the uncommitted files stays
            for _f0, fid, sha, i, claims in ok:
                if committed(root, sha):
                    out.append((i, fid, None))
                    continue
                _remove_parts(root, sha[:16])
                for c in claims:
                    c.unlink(missing_ok=True)
                out.append((i, None, err))
    yield from sorted(out, key=lambda o: o[0])


def _claim_file(con, root: Path, sha: str, path: str, ranks: list, commits: set[str]) -> tuple[int, list[Path]]:
    """A file's id in the job directory and its claims on its ranks (as _export, before any part is written)."""
    if not ranks or ranks[0] is None:
        raise InputError("holds no rank", path=path, hint="give --rank N")
    fid = ranks[0] + 1
    if not 0 < fid < _MAX_FILE_ID:
        raise InputError(f"rank {ranks[0]} is too large for a Parquet job (file ids are the smallest rank + 1, below "
                         f"{_MAX_FILE_ID})", path=path, hint="ingest it into a DuckDB file (--db FILE.duckdb)")
    claims = _claim_ranks(root, [r for r in ranks if r is not None], sha, path)
    try:
        _check_rank_collisions(con, root, [r for r in ranks if r is not None], sha, path, commits)
    except BaseException:
        for c in claims:
            c.unlink(missing_ok=True)
        raise
    return fid, claims


_COPIES = iter(range(1 << 62))  # tokens of this process's batch COPYs (their temp files' names)


def _copy_plan(con, files: list[tuple[int, int, str]]) -> tuple[dict, dict] | None:
    """Per table the SELECT of the batch's rows and the part name of each rank ({rank: part}); None where a rank
    holds rows of two files or rows have no rank (the files are then written part by part)."""
    _map = pa.table({"f0": pa.array([f[0] for f in files], pa.int32()),  # read by DuckDB below
                     "fid": pa.array([f[1] for f in files], pa.int32()),
                     "part": [jobdir.part_name(f[2]) for f in files]})
    con.execute("CREATE OR REPLACE TEMP TABLE _jobwrite_map AS SELECT * FROM _map")
    tables = [t for t in jobdir.table_columns() if t != jobdir.COMMIT_TABLE] + [jobdir.COMMIT_TABLE]
    selects, owners = {}, {}
    for table in tables:
        idc = ID_COLUMNS.get(table) or ("kernel_id" if table == "comm_ops" else None)
        shift = f", {idc} - (t.file_id::BIGINT << {ID_SHIFT}) + (m.fid::BIGINT << {ID_SHIFT}) AS {idc}" if idc else ""
        rank = "t.rank"
        if table == jobdir.COMMIT_TABLE:  # its part goes under the file's first rank (as _write_parts)
            rank = "(SELECT min(rank) FROM ranks r WHERE r.file_id = t.file_id)"
        rows = con.execute(f"SELECT {rank} AS rank, list(DISTINCT m.part) FROM {table} t "
                           "JOIN _jobwrite_map m ON t.file_id = m.f0 GROUP BY ALL").fetchall()
        if any(r is None or len(parts) != 1 for r, parts in rows):
            return None
        if rows:
            owners[table] = {r: parts[0] for r, parts in rows}
            extra = f", {rank} AS rank" if table == jobdir.COMMIT_TABLE else ""
            selects[table] = (f"SELECT t.* REPLACE (m.fid::INTEGER AS file_id{shift}){extra} FROM {table} t "
                              "JOIN _jobwrite_map m ON t.file_id = m.f0")
    return selects, owners


def _copy_parts(con, root: Path, files: list[tuple[int, int, str]]) -> None:
    """Every table's parts of ``files`` (pipeline file id, job file id, sha256): one COPY per table for all of
    them, partitioned by rank straight into the job's rank directories under temp names (``.*.tmp``: no reader
    sees them, and a dead writer's are removed), each then renamed to its part name; the ``files`` parts last.
    The same writer, columns and values as ``_write_parts``' COPY per part (≈ 5 ms of planning each, five or more
    per one-kernel trace). Where a rank of the batch holds rows of two files, or rows without a rank, the files are
    written part by part instead."""
    plan = _copy_plan(con, files)
    if plan is None:
        for f0, fid, sha in files:
            ranks = [r for (r,) in con.execute("SELECT rank FROM ranks WHERE file_id = ? ORDER BY rank",
                                               [f0]).fetchall()]
            _write_parts(con, root, f0, fid, sha, ranks)
        return
    selects, owners = plan
    token = f"w{os.getpid()}x{next(_COPIES)}"
    moves: list[tuple[Path, Path]] = []
    try:
        for table, select in selects.items():
            keep = "false" if table == jobdir.COMMIT_TABLE else "true"  # files parts have no rank column
            con.execute(f"COPY ({select}) TO {catalog_sql_string(str(root / table))} (FORMAT parquet, "
                        f"COMPRESSION zstd, PARTITION_BY (rank), WRITE_PARTITION_COLUMNS {keep}, "
                        f"OVERWRITE_OR_IGNORE true, FILENAME_PATTERN '.{token}_{{i}}.{_HOST}.{os.getpid()}', "
                        "FILE_EXTENSION 'tmp')")
            for r, part in owners[table].items():
                d = root / table / jobdir.rank_dir(r)
                moves.append((d / f".{token}_0.{_HOST}.{os.getpid()}.tmp", d / part))
                if (d / f".{token}_1.{_HOST}.{os.getpid()}.tmp").exists():
                    raise RuntimeError(f"a COPY wrote two files for one part in {d}")
        for src, final in sorted(moves, key=lambda m: m[1].parts[-3] == jobdir.COMMIT_TABLE):  # commits last
            _publish(src, final)
    except BaseException:
        for src, _final in moves:
            with contextlib.suppress(OSError):
                src.unlink()
        for table in selects:
            for leftover in (root / table).glob(f"rank=*/.{token}_*.tmp"):
                with contextlib.suppress(OSError):
                    leftover.unlink()
        raise


def _publish(src: Path, final: Path) -> None:
    os.replace(src, final)  # atomic on one file system; a function of its own for the tests' full disk


def catalog_sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _export(con, root: Path, f0: int, sha: str, path: str) -> int:
    ranks = [r[0] for r in con.execute("SELECT rank FROM ranks WHERE file_id = ? ORDER BY rank", [f0]).fetchall()]
    if not ranks:
        raise InputError("holds no rank", path=path, hint="give --rank N")
    fid = ranks[0] + 1
    if not 0 < fid < _MAX_FILE_ID:
        raise InputError(f"rank {ranks[0]} is too large for a Parquet job (file ids are the smallest rank + 1, "
                         f"below {_MAX_FILE_ID})", path=path, hint="ingest it into a DuckDB file (--db FILE.duckdb)")
    claims = _claim_ranks(root, ranks, sha, path)
    try:
        _check_rank_collisions(con, root, ranks, sha, path)
        _write_parts(con, root, f0, fid, sha, ranks)
    except BaseException:
        if not committed(root, sha):  # a full disk or a signal: take back what this file wrote
            _remove_parts(root, sha[:16])
            for c in claims:
                c.unlink(missing_ok=True)
        raise
    return fid


def _remove_parts(root: Path, sha16: str) -> None:
    name = jobdir.part_name(sha16)
    for table in jobdir.table_columns():
        for p in (root / table).glob(f"rank=*/{name}"):
            p.unlink(missing_ok=True)


def _orphans(root: Path) -> list[Path]:
    """Parts of a file that never committed whose writer is gone (no live claim holds it): a killed writer's, or
    one that failed where it could not clean up; and dead writers' claims of nothing committed. Invisible to
    readers, but they fill the disk."""
    commits = {p.name for p in (root / jobdir.COMMIT_TABLE).glob("rank=*/part-*.parquet")}
    claims = [(c, _read_claim(c)) for c in (root / CLAIMS).glob("rank=*")]
    live = {rec.get("sha16") for c, rec in claims if rec and _claim_alive(rec, c)}
    found = [c for c, rec in claims
             if rec is not None and rec.get("sha16") not in live
             and jobdir.part_name(str(rec.get("sha16"))) not in commits]
    for table in jobdir.table_columns():
        found += [p for p in (root / table).glob("rank=*/part-*.parquet")
                  if p.name not in commits and p.name[5:21] not in live]
    return found


def remove_orphan_parts(root: Path) -> list[str]:
    """Remove :func:`_orphans`."""
    return _remove(_orphans(root))


def _write_parts(con, root: Path, f0: int, fid: int, sha: str, ranks: list[int]) -> None:
    name = jobdir.part_name(sha)
    for table in jobdir.table_columns():
        if table == jobdir.COMMIT_TABLE:
            continue
        idc = ID_COLUMNS.get(table) or ("kernel_id" if table == "comm_ops" else None)
        shift = f", {idc} - ({f0}::BIGINT << {ID_SHIFT}) + ({fid}::BIGINT << {ID_SHIFT}) AS {idc}" if idc else ""
        select = f"SELECT * REPLACE ({fid}::INTEGER AS file_id{shift}) FROM {table} WHERE file_id = {f0}"
        for (r,) in con.execute(f"SELECT DISTINCT rank FROM {table} WHERE file_id = ? ORDER BY rank", [f0]).fetchall():
            cond = "rank IS NULL" if r is None else f"rank = {int(r)}"
            _copy(con, f"{select} AND {cond}", root / table / jobdir.rank_dir(r) / name)
    # the commit record, last: until it is renamed into place no reader sees this file's other parts
    _copy(con, f"SELECT * REPLACE ({fid}::INTEGER AS file_id) FROM files WHERE file_id = {f0}",
          root / jobdir.COMMIT_TABLE / jobdir.rank_dir(ranks[0]) / name)


CLAIMS = "_claims"  # DIR/_claims/rank=R: the trace that writes or wrote rank R (never read as a table)


def _claim_ranks(root: Path, ranks: list[int], sha: str, path: str) -> list[Path]:
    """Claim every rank of a trace before any of its parts is written, each claim created whole by one link(2), which
    fails if the claim exists: of two writers racing for one rank exactly one wins, the other is refused naming both
    traces. A claim of the same trace is kept (a re-run); a dead writer's claim of nothing committed is taken over."""
    taken: list[Path] = []
    try:
        for r in ranks:
            claim = root / CLAIMS / jobdir.rank_dir(r)
            if _claim(claim, {"sha16": sha[:16], "path": path, "host": _HOST, "pid": os.getpid()}, root, r, path):
                taken.append(claim)
    except BaseException:
        for c in taken:
            c.unlink(missing_ok=True)
        raise
    return taken


def _claim(claim: Path, rec: dict, root: Path, rank: int, path: str) -> bool:
    """True when this writer created the claim (False: it was this trace's already)."""
    claim.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(claim)
    tmp.write_text(json.dumps(rec))
    try:
        for _ in range(3):
            try:
                os.link(tmp, claim)
                return True
            except FileExistsError:
                other = _read_claim(claim)
            if other is None:  # removed meanwhile: try again
                continue
            if other.get("sha16") == rec["sha16"]:
                return False
            done = committed_sha16(root, str(other.get("sha16")))
            if done or _claim_alive(other, claim):
                raise InputError(f"rank {rank} is {'already in this job directory' if done else 'being written'} "
                                 f"(from {other.get('path')})", path=path,
                                 hint="traces of another job belong in another directory; give --rank N if the "
                                      "rank was guessed")
            claim.unlink(missing_ok=True)  # a dead writer's claim: nothing of it is visible
        raise InputError(f"could not claim rank {rank}: other writers keep changing it", path=path,
                         hint="run the ingest again")
    finally:
        tmp.unlink(missing_ok=True)


def _read_claim(claim: Path) -> dict | None:
    try:
        return json.loads(claim.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}


def _claim_alive(rec: dict, claim: Path) -> bool:
    """Whether the claim's writer may still be writing: its process on this host, or a claim under a day old."""
    if rec.get("host") == _HOST and isinstance(rec.get("pid"), int):
        return alive(rec["pid"])
    try:
        return time.time() - claim.stat().st_mtime < _STALE_S
    except FileNotFoundError:
        return False


def _copy(con, select: str, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(final)
    try:
        con.execute(f"COPY ({select}) TO '{str(tmp).replace(chr(39), chr(39) * 2)}' "
                    "(FORMAT parquet, COMPRESSION zstd)")
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _check_rank_collisions(con, root: Path, ranks: list[int], sha: str, path: str,
                           commits: set[str] | None = None) -> None:
    """A rank already committed by another trace: refused as for a DuckDB file (the reader checks it too).
    ``commits``: the committed part names, when the caller has read them."""
    mine = jobdir.part_name(sha)
    if commits is None:
        commits = _committed_names(root)
    for r in ranks:
        d = root / "ranks" / jobdir.rank_dir(r)
        other = sorted(p for p in d.glob("part-*.parquet") if p.name != mine and p.name in commits)
        if other:
            files_part = next((root / jobdir.COMMIT_TABLE).glob(f"rank=*/{other[0].name}"))
            prior = con.execute("SELECT path FROM read_parquet(?)", [str(files_part)]).fetchone()[0]
            raise InputError(f"rank {r} is already in this job directory (from {prior})", path=path,
                             hint="traces of another job belong in another directory; give --rank N if the rank "
                                  "was guessed")


def write(paths: Iterable[str | Path], out: str | Path, *, rank: int | None = None, world_size: int | None = None,
          keep_going: bool = False, jobs: int | None = None, on_file: Callable[[FileResult], None] | None = None,
          read_extra: dict | None = None) -> list[FileResult]:
    """Ingest traces into a Parquet job directory; one FileResult per file (ingested, skipped or failed).

    ``jobs`` > 1 writes that many files at once (one process each). Without ``keep_going`` the first bad file
    raises InputError; files written before it stay.
    """
    files = expand_paths(paths)
    if rank is not None and len(files) > 1:
        raise InputError("--rank applies to a single trace file", hint="ingest files one at a time to set their ranks")
    root = prepare(out)
    results: list[FileResult] = []
    args = [(str(p), str(root), rank, world_size, read_extra) for p in files]

    def done(path: str, res: FileResult | None, err: Exception | None) -> None:
        if err is not None:
            err = as_user_error(err, str(root)) or err
            if not keep_going:
                raise err
            line = err.line() if isinstance(err, InputError) else f"{path}: failed to ingest ({type(err).__name__}: " \
                                                                   f"{err})"
            if isinstance(err, InputError) and err.path is None:
                line = f"{path}: {line}"
            res = FileResult(path, "failed", line)
        assert res is not None  # a result or an error, never neither
        results.append(res)
        if on_file:
            on_file(res)

    _run_all(args, max(1, min(jobs or os.cpu_count() or 1, len(files))), done)
    return results


WRITE_MANY_FILES = 64  # small files per writer task (write_many)


def _tasks(args: list[tuple]) -> list[list[tuple]]:
    """The files in input order: consecutive small files in groups (write_many), any other file alone."""
    from . import SMALL_FILE_BYTES

    tasks: list[list[tuple]] = []
    for a in args:
        try:
            small = os.path.getsize(a[0]) <= SMALL_FILE_BYTES
        except OSError:
            small = False  # write_one reports it
        small = small and a[2] is None  # --rank: one file, written alone
        if small and tasks and len(tasks[-1]) < WRITE_MANY_FILES and tasks[-1][0][5]:
            tasks[-1].append((*a, True))
        else:
            tasks.append([(*a, small)])
    return tasks


def _work(task: list[tuple]) -> list[tuple[FileResult | None, Exception | None]]:
    """A task's files: write_many for several small ones, write_one for one file; per file (result, error)."""
    if len(task) > 1:
        path0, out, rank, world_size, extra, _small = task[0]
        return write_many([t[0] for t in task], out, rank, world_size, extra)
    try:
        return [(write_one(*task[0][:5]), None)]
    except Exception as err:  # noqa: BLE001 - reported per file
        return [(None, err)]


def _run_all(args: list[tuple], jobs: int, done) -> None:
    """The files in this process or in ``jobs`` processes; results in input order."""
    tasks = _tasks(args)
    if jobs == 1 or len(tasks) == 1:
        for task in tasks:
            for t, (res, err) in zip(task, _work(task), strict=True):
                done(t[0], res, err)
        return
    pool = process_pool(jobs)
    try:
        futures = [(task, pool.submit(_work, task)) for task in tasks]
        for task, fut in futures:
            try:
                outcome = fut.result()
            except Exception as err:  # noqa: BLE001 - the worker died: every file of its task failed
                outcome = [(None, err)] * len(task)
            for t, (res, error) in zip(task, outcome, strict=True):
                done(t[0], res, error)
        pool.shutdown()
    except BaseException:
        stop_pool(pool)  # a failure or a signal: do not wait for the other files
        raise


def doctor(out: str | Path, *, fix: bool = False) -> list[dict]:
    """What is wrong with a Parquet job directory: ranks two traces claim (kept: which trace belongs is the
    user's call), a dead writer's temp files, orphan parts and claims (removed with ``fix``: no reader sees them).
    One dict per finding: kind, path, detail, action."""
    root = Path(out)
    if not jobdir.is_job_dir(root):
        raise InputError("is not an nsys2comm Parquet job directory (no " + jobdir.MARKER + ")", path=str(root),
                         hint="give a directory written by nsys2comm ingest --out")
    rows = []
    con = connect(None, objects=False)
    try:
        snap = jobdir.snapshot(root)
        for rank, paths in jobdir.conflict_paths(con, snap).items():
            rows.append({"kind": "rank_conflict", "path": str(root / "ranks" / jobdir.rank_dir(rank)),
                         "detail": f"rank {rank} is claimed by " + " and ".join(paths),
                         "action": "kept: move the trace of the other job out, then ingest it elsewhere"})
    finally:
        con.close()
    for kind, found in (("temp_file", _dead_temps(root)), ("orphan", _orphans(root))):
        for p in found:
            rows.append({"kind": kind, "path": str(p), "detail": "left by a writer that is gone; no reader sees it",
                         "action": "removed" if fix else "remove with --fix"})
    if fix:
        remove_stale_temps(root)
        remove_orphan_parts(root)
    return rows
