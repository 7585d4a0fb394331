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

from . import jobdir
from .db import connect
from .errors import InputError, as_user_error
from .ingest import FileResult, detect, expand_paths, ingest, sha256_of
from .ingest.base import ID_COLUMNS, ID_SHIFT, alive, process_pool, stop_pool

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
    for path in paths:
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
    global _con
    if _con is None:
        _con = connect(None, objects=False)  # ingest installs the macros while the first trace decodes
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
    res = ingest(con, [path], rank=rank, world_size=world_size, keep_going=False, jobs=1, read_extra=read_extra)[0]
    if res.status != "ingested" or res.file_id is None:  # the same file twice in one process: its rows are gone
        return FileResult(path, "skipped", "already ingested")
    try:
        fid = _export(con, root, res.file_id, sha, path)
    finally:
        for table in jobdir.table_columns():
            con.execute(f"DELETE FROM {table} WHERE file_id = ?", [res.file_id])
    return FileResult(path, "ingested", "", fid, res.ranks)


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


def _check_rank_collisions(con, root: Path, ranks: list[int], sha: str, path: str) -> None:
    """A rank already committed by another trace: refused as for a DuckDB file (the reader checks it too)."""
    mine = jobdir.part_name(sha)
    commits = {p.name for p in (root / jobdir.COMMIT_TABLE).glob("rank=*/part-*.parquet")}
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


def _run_all(args: list[tuple], jobs: int, done) -> None:
    """write_one over the files, in this process or in ``jobs`` processes; results in input order."""
    if jobs == 1:
        for a in args:
            try:
                res = write_one(*a)
            except Exception as err:  # noqa: BLE001 - reported per file
                done(a[0], None, err)
                continue
            done(a[0], res, None)
        return
    pool = process_pool(jobs)
    try:
        futures = [(a[0], pool.submit(write_one, *a)) for a in args]
        for path, fut in futures:
            try:
                res = fut.result()
            except Exception as err:  # noqa: BLE001
                done(path, None, err)
                continue
            done(path, res, None)
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
