"""Ingest trace files into a job database: discovery, format detection, parallel parsing, one transaction per file."""

from __future__ import annotations

import glob
import hashlib
import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from ..errors import InputError, as_user_error
from .base import (
    ID_COLUMNS,
    SPOOL_PREFIX,
    Batch,
    ReadOptions,
    alive,
    process_pool,
    remove_dead_leftovers,
    start_forkserver,
    stop_pool,
)
from .redact import redacted

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".sqlite3", ".db")


@dataclass
class FileResult:
    path: str
    status: str  # 'ingested' | 'skipped' | 'failed'
    message: str = ""
    file_id: int | None = None
    ranks: list[int] = field(default_factory=list)


def _importers():
    from . import kineto, nsys

    return {kineto.SOURCE: kineto, nsys.SOURCE: nsys}


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files, directories (searched recursively for traces) and globs, in a stable order without duplicates."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise InputError("directory holds no trace files", path=str(p),
                                 hint="expected *.json, *.json.gz (Kineto) or *.sqlite (nsys export --type sqlite)")
            out.extend(found)
        else:
            matches = sorted(Path(m) for m in glob.glob(str(raw), recursive=True) if Path(m).is_file())
            if not matches:
                raise InputError("no such file, directory or matching glob", path=str(raw),
                                 hint="check the path; quote globs so the shell does not expand them")
            out.extend(matches)
    seen, unique = set(), []
    for p in out:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def detect(path: Path):
    """The importer module for a file, judged by its first bytes, or an InputError saying what it is not."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise InputError(f"cannot read ({e.strerror})", path=str(path), hint="check the path and permissions") from None
    if path.name.endswith(".nsys-rep") or head.startswith(b"\x00\x00\x00\x00NSYS") :
        raise InputError("is an Nsight Systems report, not an SQLite export", path=str(path),
                         hint=f"convert it: nsys export --type sqlite --include-blobs=true {path}")
    if not head:
        raise InputError("is empty", path=str(path),
                         hint="give a Kineto trace (.json/.json.gz) or an nsys SQLite export")
    for mod in _importers().values():
        if mod.sniff(path, head):
            return mod
    if path.suffix in (".nsys-rep", ".qdrep"):
        raise InputError("is an Nsight Systems report, not an SQLite export", path=str(path),
                         hint=f"convert it: nsys export --type sqlite --include-blobs=true {path}")
    raise InputError("is not a trace nsys2comm can read", path=str(path),
                     hint="expected a PyTorch profiler JSON (.json/.json.gz) or an Nsight Systems SQLite export "
                          "(nsys export --type sqlite)")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class _PendingHash:
    """The sha256 of a file that no file of the job can equal (none has its size): hashed in a thread once the
    file's rows are read (``start``), beside the last inserts and the finalize, which leave a core idle; or at once
    when asked before (``result``). Hashed beside the decoders of one file, it took 0.25-0.4 CPU-s of a 440 MB trace
    from them, on a machine whose cores they keep busy. Files decoded several at a time start at once (_write_all)."""

    def __init__(self, pool: ThreadPoolExecutor, path: Path):
        self.pool, self.path = pool, path
        self.future: Future | None = None

    def start(self) -> None:
        if self.future is None:
            self.future = self.pool.submit(sha256_of, self.path)

    def result(self) -> str:
        self.start()
        return self.future.result()


def _then(batches, callback: Callable[[], None]):
    """The batches, then ``callback()`` once the importer has yielded the last one."""
    yield from batches
    callback()


def _spool(path: str, options: ReadOptions, tmpdir: str) -> list[tuple[str, str]]:
    """Worker: parse one file and spool its batches as Arrow IPC files (memory stays bounded)."""
    mod = detect(Path(path))
    out = []
    for i, batch in enumerate(redacted(mod.read(Path(path), options))):
        fn = os.path.join(tmpdir, f"{i:06d}.arrow")
        with pa.ipc.new_file(fn, batch.data.schema) as w:
            w.write_table(batch.data)
        out.append((batch.table, fn))
    return out


def _replay(spooled: list[tuple[str, str]]):
    for table, fn in spooled:
        with pa.ipc.open_file(fn) as r:
            yield Batch(table, r.read_all())


COALESCE_ROWS = 1 << 18


def _coalesce(batches, min_rows: int = COALESCE_ROWS):
    """Importer batches joined per table into inserts of at least ``min_rows`` rows: each INSERT costs ~10 ms
    to plan and bind, whatever its size (a 2 GB trace arrives in hundreds of batches)."""
    held: dict[str, list[pa.Table]] = {}
    for batch in batches:
        if batch.table not in ID_COLUMNS:  # metadata (files, ranks, ...): as it comes
            yield batch
            continue
        parts = held.setdefault(batch.table, [])
        parts.append(batch.data)
        if sum(t.num_rows for t in parts) >= min_rows:
            yield from _joined(batch.table, parts)
            parts.clear()
    for table, parts in held.items():
        if parts:
            yield from _joined(table, parts)


def _joined(table: str, parts: list[pa.Table]) -> list[Batch]:
    try:  # batches of one table may differ in optional columns: the insert is by name, missing ones are NULL
        return [Batch(table, pa.concat_tables(parts, promote_options="default"))]
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return [Batch(table, p) for p in parts]


class _CatalogInstall:
    """The catalog's macros and views installed on a cursor in a thread while the first file decodes: DuckDB
    binds them for about 1 s with the GIL released. Waited for before the first transaction, which needs them
    (a transaction sees only the catalog committed before it began)."""

    def __init__(self, con):
        self.error: BaseException | None = None
        self._cursor = con.cursor()
        self._thread = threading.Thread(target=self._run, args=(self._cursor,), name="nsys2comm-catalog",
                                        daemon=True)
        self._thread.start()

    def _run(self, cursor) -> None:
        try:
            from .. import catalog

            catalog.install(cursor)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.error = e
        finally:
            cursor.close()

    def busy(self) -> bool:
        return self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Interrupt and join: the connection refuses to close while the cursor is busy, and a thread still
        inside DuckDB at interpreter exit aborts the process."""
        if self._thread.is_alive():
            self._cursor.interrupt()
        self._thread.join()


def _write_file(con, path: Path, sha: str | _PendingHash, mod, batches, progress: Callable[[str], None] | None,
                installing: _CatalogInstall | None = None) -> int:
    """One file, one transaction: either every row lands or none does."""
    from .writer import insert_batch  # here: decoder processes import this package and stay light
    batches = _coalesce(batches if isinstance(sha, str) else _then(batches, sha.start))
    early: list[Batch] = []
    if installing is not None:
        while installing.busy() and (batch := next(batches, None)) is not None:
            early.append(batch)
        installing.wait()
    con.execute("BEGIN TRANSACTION")
    try:
        file_id = con.execute("SELECT coalesce(max(file_id), 0) + 1 FROM files").fetchone()[0]
        con.execute(
            "INSERT INTO files (file_id, path, sha256, size_bytes, source, ingested_at) VALUES (?, ?, ?, ?, ?, ?)",
            [file_id, str(path.resolve()), sha if isinstance(sha, str) else f"pending:{file_id}",
             path.stat().st_size, mod.SOURCE, datetime.now(UTC).replace(tzinfo=None)])
        names: set[str] = set()
        for batch in itertools.chain(early, batches):
            insert_batch(con, file_id, batch, names)
            if progress:
                progress(batch.table)
        mod.finalize(con, file_id)  # never reads sha256: a pending hash finishes beside it
        if not isinstance(sha, str):
            con.execute("UPDATE files SET sha256 = ? WHERE file_id = ?", [sha.result(), file_id])
        con.execute("COMMIT")
        return file_id
    except BaseException:
        con.execute("ROLLBACK")
        raise


def ingest(con, paths: Iterable[str | Path], *, rank: int | None = None, world_size: int | None = None,
           keep_going: bool = False,
           jobs: int | None = None, on_file: Callable[[FileResult], None] | None = None,
           progress: Callable[[str], None] | None = None, read_extra: dict | None = None) -> list[FileResult]:
    """Ingest traces into an open job database. Returns one FileResult per file.

    ``read_extra`` goes to the importers as ``ReadOptions.extra`` (e.g. the limits of
    :class:`~nsys2comm.ingest.kineto_stream.Limits`: ``max_decompressed_bytes``, ``max_event_bytes``).

    Without ``keep_going`` the first bad file raises InputError (files before it stay ingested, each in its own
    committed transaction; the bad one leaves nothing behind).
    """
    files = expand_paths(paths)
    remove_stale_spools()
    remove_dead_leftovers()  # semaphores and forkserver directories of SIGKILLed pools
    options = _read_options(rank, world_size, read_extra, len(files))
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(files)))
    results: list[FileResult] = []

    def done(res: FileResult) -> None:
        results.append(res)
        if on_file:
            on_file(res)

    def fail(path: Path, err: Exception) -> None:
        err = as_user_error(err) or err
        if isinstance(err, InputError):
            if err.path is None:
                err.path = str(path)
            line = err.line()
        else:
            line = f"{path}: failed to ingest ({type(err).__name__}: {err}) (rerun with --debug and report it)"
        if not keep_going:
            if isinstance(err, InputError):
                raise InputError(err.what, path=err.path, hint=err.hint) from err
            raise err
        done(FileResult(str(path), "failed", line))

    hasher = ThreadPoolExecutor(1, thread_name_prefix="nsys2comm-sha256")  # hashlib releases the GIL
    copies: list[tuple[Path, Path]] = []
    try:
        todo = _identify(con, files, done, fail, hasher, copies)
    except BaseException:
        hasher.shutdown(cancel_futures=True)
        raise

    def record(path: Path, fid: int) -> None:
        ranks = [r[0] for r in con.execute("SELECT rank FROM ranks WHERE file_id = ? ORDER BY rank", [fid]).fetchall()]
        done(FileResult(str(path), "ingested", "", fid, ranks))

    from ..cache import catalog_installed  # late: decoder processes import this package without DuckDB

    installing = None if catalog_installed(con) else _CatalogInstall(con)
    completed = terminated = False
    try:
        _write_all(con, todo, options, jobs, record, fail, progress, installing)
        _copies_done(copies, results, done)
        completed = True
    except (SystemExit, KeyboardInterrupt):
        terminated = True  # a signal: leave at once; sessions compute what the cache would hold
        raise
    finally:
        hasher.shutdown(wait=not terminated, cancel_futures=True)
        _complete(con, installing, terminated=terminated,
                  wrote=completed or any(r.status == "ingested" for r in results))
    return results


def _complete(con, installing: _CatalogInstall | None, *, terminated: bool, wrote: bool) -> None:
    if terminated:  # a signal: leave at once, with no thread left inside DuckDB
        if installing is not None:
            installing.stop()
        return
    if installing is not None:
        installing.wait()
    if wrote:
        from ..cache import refresh_cache

        # the shared sweeps, once per ingest rather than once per later session; a no-op while they match
        # the data, and a repair after a killed ingest or an outside edit
        refresh_cache(con)


def start_decoders(paths: Iterable[str | Path], *, jobs: int | None = None, read_extra: dict | None = None) -> None:
    """Start the decoder processes' forkserver early (before the caller opens the database) where the ingest
    will use one: several files on several cores, or a file its importer decodes in worker processes."""
    files = expand_paths(paths)
    options = ReadOptions(extra=dict(read_extra or {}))

    def decoded_in_workers(path: Path) -> bool:
        try:
            return detect(path).decoder_processes(path, options) > 0
        except (InputError, OSError):  # ingest reports it, file by file
            return False

    if (len(files) > 1 and (jobs or os.cpu_count() or 1) > 1) or any(map(decoded_in_workers, files)):
        start_forkserver()


def _read_options(rank: int | None, world_size: int | None, extra: dict | None, n_files: int) -> ReadOptions:
    if rank is not None and n_files > 1:
        raise InputError("--rank applies to a single trace file", hint="ingest files one at a time to set their ranks")
    if world_size is not None and not 0 < world_size < 2**31:
        raise InputError(f"--world-size {world_size} is not a world size",
                         hint="give the number of ranks in the job (1 to 2^31-1)")
    if rank is not None and not 0 <= rank < 2**31:
        raise InputError(f"--rank {rank} is not a rank", hint="give a rank from 0 to 2^31-1")
    return ReadOptions(rank=rank, world_size=world_size, extra=dict(extra or {}))


def _identify(con, files: list[Path], done, fail, hasher,
              copies: list[tuple[Path, Path]]) -> list[tuple[Path, str | _PendingHash, object]]:
    """Format and identity first (cheap, and bad files fail before any parsing work); files already in the job
    are skipped, and files given twice are put in ``copies`` as (copy, original): their outcome is the original's.
    Returns (path, sha256, importer) of the files to read; the sha256 of a file whose size no other file has is
    hashed by ``hasher`` (a thread) once the file is parsed (a _PendingHash)."""
    todo: list[tuple[Path, str | _PendingHash, object]] = []
    sizes: set[int] = set()
    for path in files:
        try:
            mod = detect(path)
            size = path.stat().st_size
            if size not in sizes and not con.execute("SELECT 1 FROM files WHERE size_bytes = ?", [size]).fetchone():
                # no file of this size in the job: it cannot be a re-ingest, so hash it once it is parsed
                sizes.add(size)
                todo.append((path, _PendingHash(hasher, path), mod))
                continue
            sizes.add(size)
            sha = sha256_of(path)
        except Exception as err:  # noqa: BLE001 - reported per file
            fail(path, err)
            continue
        prior = con.execute("SELECT file_id FROM files WHERE sha256 = ?", [sha]).fetchone()
        if prior:
            done(FileResult(str(path), "skipped", f"already ingested as file {prior[0]}", prior[0]))
            continue
        original = next((t[0] for t in todo if (t[1] if isinstance(t[1], str) else t[1].result()) == sha), None)
        if original is not None:  # its outcome is the original's, known once that is read
            copies.append((path, original))
            continue
        todo.append((path, sha, mod))
    return todo


def _copies_done(copies: list[tuple[Path, Path]], results: list[FileResult], done) -> None:
    """Each copy of a file given twice gets its original's outcome: skipped if that was ingested, failed if not."""
    by_path = {r.path: r for r in results}
    for path, original in copies:
        res = by_path.get(str(original))
        if res is not None and res.status == "ingested":
            done(FileResult(str(path), "skipped", f"a copy of {original} (ingested as file {res.file_id})",
                            res.file_id))
        else:
            done(FileResult(str(path), "failed", f"{path}: a copy of {original}, which could not be ingested"))


def _write_all(con, todo, options, jobs, record, fail, progress, installing) -> None:
    if jobs == 1 or len(todo) <= 1:
        for path, sha, mod in todo:
            try:
                record(path, _write_file(con, path, sha, mod, redacted(mod.read(path, options)), progress,
                                         installing))
            except Exception as err:  # noqa: BLE001
                fail(path, err)
        return

    # Files decoded in a pool, several at a time, keep the cores busy until the last one is in: hashing each only
    # once its rows are read made the parent wait for it (8 x 1 GB: 65.3-65.7 s against 64.2-64.7 s)
    for _path, sha, _mod in todo:
        if isinstance(sha, _PendingHash):
            sha.start()
    tmp = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
    pool = None
    try:
        pool = process_pool(jobs)
        futures = []
        for i, (path, _sha, _mod) in enumerate(todo):
            d = os.path.join(tmp, str(i))
            os.makedirs(d)
            futures.append(pool.submit(_spool, str(path), options, d))
        for (path, sha, mod), fut in zip(todo, futures, strict=True):  # input order: deterministic file ids
            try:
                spooled = fut.result()
                record(path, _write_file(con, path, sha, mod, _replay(spooled), progress, installing))
            except Exception as err:  # noqa: BLE001
                fail(path, err)
        pool.shutdown()
    except BaseException:
        if pool is not None:
            stop_pool(pool)  # a failure or a signal: do not wait for the other files' parsers
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)



def remove_stale_spools(tmpdir: str | None = None) -> list[str]:
    """Remove spool directories whose owner process is gone (left by a SIGKILLed ingest). Returns their paths."""
    removed = []
    for d in Path(tmpdir or tempfile.gettempdir()).glob(SPOOL_PREFIX + "*"):
        pid = d.name[len(SPOOL_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or d.is_symlink() or not d.is_dir() or alive(int(pid)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed

