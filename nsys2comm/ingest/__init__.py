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
    Importer,
    ReadOptions,
    alive,
    process_pool,
    remove_dead_leftovers,
    start_forkserver,
    stop_pool,
)
from .redact import redacted


@dataclass
class FileResult:
    path: str
    status: str  # 'ingested' | 'skipped' | 'failed'
    message: str = ""
    file_id: int | None = None
    ranks: list[int] = field(default_factory=list)


def _importers() -> dict[str, Importer]:
    """Every importer (base.Importer), by SOURCE, in the order ``detect`` tries them. Here, not at module level:
    decoder processes import this package and stay light."""
    from . import kineto, nsys

    mods: tuple[Importer, ...] = (kineto, nsys)  # mypy checks each module against the Protocol
    return {m.SOURCE: m for m in mods}


def trace_suffixes() -> tuple[str, ...]:
    """File name endings a directory search picks up: the union of the importers' SUFFIXES."""
    return tuple(dict.fromkeys(s for m in _importers().values() for s in m.SUFFIXES))


def formats_hint() -> str:
    """The formats nsys2comm reads, in a user's words, from the importers' FORMAT_HINT and SUFFIXES."""
    return " or ".join(f"{m.FORMAT_HINT} ({', '.join('*' + s for s in m.SUFFIXES)})" for m in _importers().values())


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files, directories (searched recursively for traces) and globs, in a stable order without duplicates."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(trace_suffixes()))
            if not found:
                raise InputError("directory holds no trace files", path=str(p), hint=f"expected {formats_hint()}")
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
        raise InputError("is empty", path=str(path), hint=f"give {formats_hint()}")
    for mod in _importers().values():
        if mod.sniff(path, head):
            return mod
    if path.suffix in (".nsys-rep", ".qdrep"):
        raise InputError("is an Nsight Systems report, not an SQLite export", path=str(path),
                         hint=f"convert it: nsys export --type sqlite --include-blobs=true {path}")
    raise InputError("is not a trace nsys2comm can read", path=str(path), hint=f"expected {formats_hint()}")


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
           progress: Callable[[str], None] | None = None, read_extra: dict | None = None,
           store_sweeps: bool = True) -> list[FileResult]:
    """Ingest traces into an open job database. Returns one FileResult per file.

    ``read_extra`` goes to the importers as ``ReadOptions.extra`` (e.g. the limits of
    :class:`~nsys2comm.ingest.kineto_stream.Limits`: ``max_decompressed_bytes``, ``max_event_bytes``).

    ``store_sweeps=False``: no refresh of the stored sweeps at the end (a pipeline database whose rows are copied
    elsewhere: ``jobwrite``).

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

    def record(path: Path, fid: int, ranks: list[int] | None = None) -> None:
        if ranks is None:
            ranks = [r[0] for r in con.execute("SELECT rank FROM ranks WHERE file_id = ? ORDER BY rank",
                                               [fid]).fetchall()]
        done(FileResult(str(path), "ingested", "", fid, ranks))

    from ..storage import (  # late: decoder processes import this package without DuckDB
        catalog_installed,
        take_fresh_copy,
    )

    # a pipeline database (store_sweeps=False) is checked without a record in the user cache: it lives for one process;
    # an in-memory job just copied from a checked catalog template (db.memory_job) needs no check
    installed = take_fresh_copy(con) or (catalog_installed(con) if store_sweeps else _catalog_is_installed(con))
    installing = None if installed else _CatalogInstall(con)
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
                  wrote=store_sweeps and (completed or any(r.status == "ingested" for r in results)))
    return results


def _catalog_is_installed(con) -> bool:
    from .. import catalog

    return catalog.is_installed(con)


def _complete(con, installing: _CatalogInstall | None, *, terminated: bool, wrote: bool) -> None:
    if terminated:  # a signal: leave at once, with no thread left inside DuckDB
        if installing is not None:
            installing.stop()
        return
    if installing is not None:
        installing.wait()
    if wrote:
        from ..storage import refresh_cache

        # the shared sweeps, once per ingest rather than once per later session; a no-op while they match
        # the data, and a repair after a killed ingest or an outside edit
        refresh_cache(con)


def start_decoders(paths: Iterable[str | Path], *, jobs: int | None = None, read_extra: dict | None = None,
                   rank: int | None = None, world_size: int | None = None) -> Callable[[], None]:
    """Start the decoding early (before the caller opens the database) where the ingest will use worker processes:
    a single trace its importer reads ahead (``read_ahead``: its first parts decode meanwhile), else the decoder
    processes' forkserver (several files on several cores, or a file decoded in worker processes). Returns the call
    that discards a read ahead that the ingest did not take; the caller makes it whatever happens."""
    files = expand_paths(paths)
    try:
        options = _read_options(rank, world_size, read_extra, len(files))
    except InputError:  # ingest reports it
        return _nothing

    def decoded_in_workers(path: Path) -> bool:
        try:
            return detect(path).decoder_processes(path, options) > 0
        except (InputError, OSError):  # ingest reports it, file by file
            return False

    if len(files) == 1 and decoded_in_workers(files[0]):
        read_ahead = getattr(detect(files[0]), "read_ahead", None)
        discard = read_ahead(files[0], options) if read_ahead is not None else None
        if discard is not None:
            return discard
    if (len(files) > 1 and (jobs or os.cpu_count() or 1) > 1) or any(map(decoded_in_workers, files)):
        start_forkserver()
    return _nothing


def _nothing() -> None:
    pass


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
    hashed by ``hasher`` (a thread) once the file is parsed (a _PendingHash). The job's sizes and hashes are read in
    one query each, not one per file (10,000 small files: seconds of queries)."""
    todo: list[tuple[Path, str | _PendingHash, object]] = []
    found: list[tuple[Path, object, int]] = []
    for path in files:
        try:
            found.append((path, detect(path), path.stat().st_size))
        except Exception as err:  # noqa: BLE001 - reported per file
            fail(path, err)
    in_job = {r[0]: r[1] for r in con.execute(
        "SELECT sha256, min(file_id) FROM files WHERE list_contains(?, size_bytes) GROUP BY sha256",
        [sorted({size for _p, _m, size in found})]).fetchall()}
    job_sizes = {r[0] for r in con.execute("SELECT DISTINCT size_bytes FROM files").fetchall()}
    sizes: set[int] = set()
    by_sha: dict[str, Path] = {}
    pending: dict[int, tuple[Path, _PendingHash]] = {}  # size -> the one file of that size not hashed yet
    for path, mod, size in found:
        if size not in sizes and size not in job_sizes:
            # no file of this size in the job: it cannot be a re-ingest, so hash it once it is parsed
            sizes.add(size)
            ph = _PendingHash(hasher, path)
            pending[size] = (path, ph)
            todo.append((path, ph, mod))
            continue
        sizes.add(size)
        try:
            sha = sha256_of(path)
        except Exception as err:  # noqa: BLE001 - reported per file
            fail(path, err)
            continue
        if size in pending:  # the first file of this size: its hash is needed now
            first, ph = pending.pop(size)
            by_sha.setdefault(ph.result(), first)
        if sha in in_job:
            done(FileResult(str(path), "skipped", f"already ingested as file {in_job[sha]}", in_job[sha]))
            continue
        original = by_sha.get(sha)
        if original is not None:  # its outcome is the original's, known once that is read
            copies.append((path, original))
            continue
        by_sha[sha] = path
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


# Small files (one-kernel traces, per-rank or per-step files of a large job) are decoded whole, several per task of
# the pool, and written in batches: one transaction, one INSERT per table and one finalize per batch instead of per
# file (≈ 0.1-0.2 s of statement planning per file). The failure unit is the batch: if anything in it fails, the
# batch is rolled back and its files are written again one transaction each, so a bad file fails alone with its own
# message and the good files of its batch still commit.
SMALL_FILE_BYTES = 4 << 20  # a file at most this large, decoded in one process, goes into a batch
BATCH_FILES = 256  # files per batch transaction ...
BATCH_BYTES = 64 << 20  # ... and their bytes
_CHUNK_FILES, _CHUNK_BYTES = 32, 8 << 20  # small files decoded per pool task


@dataclass
class _Decoded:
    """Small files decoded whole (a pool task's result): per file its error or its ``files`` row, and per table
    the rows of all its good files at once, each row with ``_file`` (the file's index in ``paths``), as Arrow IPC
    bytes (pickling a pa.Table per batch cost the decoders more than decoding one-kernel traces)."""

    paths: list[str]
    errors: list[Exception | None]
    meta: list[dict]
    tables: dict[str, list[bytes]]

    def table(self, name: str) -> list[pa.Table]:
        return [pa.ipc.open_stream(b).read_all() for b in self.tables.get(name, [])]

    def batches(self, i: int) -> list[Batch]:
        """File ``i``'s batches (the one-file-per-transaction path, when its batch could not commit)."""
        import pyarrow.compute as pc

        out = [Batch("files", pa.Table.from_pylist([self.meta[i]]))]
        for name in self.tables:
            for t in self.table(name):
                part = t.filter(pc.equal(t["_file"], i)).drop_columns(["_file"])
                if part.num_rows:
                    out.append(Batch(name, part))
        return out


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _decode_whole(paths: list[str], options: ReadOptions) -> _Decoded:
    """Worker (or inline): small files decoded whole."""
    errors: list[Exception | None] = []
    meta: list[dict] = []
    parts: dict[str, list[pa.Table]] = {}
    for i, p in enumerate(paths):
        try:
            batches = list(redacted(detect(Path(p)).read(Path(p), options)))
        except Exception as err:  # noqa: BLE001 - reported per file by the writer
            errors.append(err)
            meta.append({})
            continue
        errors.append(None)
        row: dict = {}
        for b in batches:
            if b.table == "files":
                row |= b.data.to_pylist()[0] if b.data.num_rows else {}
            elif b.data.num_rows:
                parts.setdefault(b.table, []).append(
                    b.data.append_column("_file", pa.array([i] * b.data.num_rows, pa.int32())))
        meta.append(row)
    tables: dict[str, list[bytes]] = {}
    for name, ts in parts.items():
        try:
            joined = [pa.concat_tables(ts, promote_options="default")]
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # optional columns of different types: one table per batch
            joined = ts
        tables[name] = [_ipc(t) for t in joined]
    return _Decoded(paths, errors, meta, tables)


def _is_small(path: Path, mod, options: ReadOptions) -> bool:
    try:
        # a compressed file's size says nothing of what it expands to: it streams through the decoder instead
        return (path.stat().st_size <= SMALL_FILE_BYTES and not path.name.endswith(".gz")
                and mod.decoder_processes(path, options) == 0)
    except (OSError, AttributeError):
        return False


class _Tasks:
    """The decoding work in input order: a large file alone (spooled by a pool worker, or read inline), small files
    in chunks. Submitted to the pool at most ``window`` tasks ahead of the writer, so decoded rows waiting for the
    writer stay bounded."""

    def __init__(self, todo, options: ReadOptions, jobs: int, tmp: str | None):
        self.options, self.tmp, self.pool = options, tmp, None
        self.tasks: list[tuple[str, list]] = []  # ('small', [todo items]) | ('large', [todo item])
        chunk: list = []
        chunk_bytes = 0
        for item in todo:
            if _is_small(item[0], item[2], options):
                size = item[0].stat().st_size
                if chunk and (len(chunk) >= _CHUNK_FILES or chunk_bytes + size > _CHUNK_BYTES):
                    self.tasks.append(("small", chunk))
                    chunk, chunk_bytes = [], 0
                chunk.append(item)
                chunk_bytes += size
            else:
                if chunk:
                    self.tasks.append(("small", chunk))
                    chunk, chunk_bytes = [], 0
                self.tasks.append(("large", [item]))
        if chunk:
            self.tasks.append(("small", chunk))
        self.futures: list[Future | None] = [None] * len(self.tasks)
        self.submitted = 0
        self.window = 2 * jobs + 2
        if jobs > 1 and (len(self.tasks) > 1 or any(k == "large" for k, _ in self.tasks)):
            self.pool = process_pool(jobs)

    def _submit_until(self, i: int) -> None:
        while self.pool is not None and self.submitted < min(len(self.tasks), i + self.window):
            j = self.submitted
            kind, items = self.tasks[j]
            if kind == "small":
                self.futures[j] = self.pool.submit(_decode_whole, [str(it[0]) for it in items], self.options)
            else:
                d = os.path.join(self.tmp, str(j))
                os.makedirs(d)
                self.futures[j] = self.pool.submit(_spool, str(items[0][0]), self.options, d)
            self.submitted += 1

    def __iter__(self):
        """(kind, items, outcome): for 'small', their _Decoded; for 'large', a callable giving the file's batch
        stream (raises the decoder's error)."""
        for i, (kind, items) in enumerate(self.tasks):
            self._submit_until(i)
            fut = self.futures[i]
            if kind == "small":
                if fut is None:
                    yield kind, items, _decode_whole([str(it[0]) for it in items], self.options)
                else:
                    yield kind, items, fut.result()
            else:
                path, _sha, mod = items[0]
                if fut is None:
                    yield kind, items, (lambda p=path, m=mod: redacted(m.read(p, self.options)))
                else:
                    yield kind, items, (lambda f=fut: _replay(f.result()))
            self.futures[i] = None

    def close(self, *, failed: bool) -> None:
        if self.pool is None:
            return
        if failed:
            stop_pool(self.pool)  # a failure or a signal: do not wait for the other files' parsers
        else:
            self.pool.shutdown()


def _write_all(con, todo, options, jobs, record, fail, progress, installing) -> None:
    # Files decoded in a pool, several at a time, keep the cores busy until the last one is in: hashing each only
    # once its rows are read made the parent wait for it (8 x 1 GB: 65.3-65.7 s against 64.2-64.7 s)
    if jobs > 1 and len(todo) > 1:
        for _path, sha, _mod in todo:
            if isinstance(sha, _PendingHash):
                sha.start()
    tmp = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-") if jobs > 1 and len(todo) > 1 else None
    tasks = _Tasks(todo, options, jobs if len(todo) > 1 else 1, tmp)
    failed = True
    try:
        batch: list = []  # (path, sha, importer, _Decoded, index in it) of small files decoded, not yet written
        batch_bytes = 0
        for kind, items, outcome in tasks:
            if kind == "large":
                _write_batch_or_each(con, batch, record, fail, progress, installing)
                batch, batch_bytes = [], 0
                path, sha, mod = items[0]
                try:
                    record(path, _write_file(con, path, sha, mod, outcome(), progress, installing))
                except Exception as err:  # noqa: BLE001
                    fail(path, err)
                continue
            for i, ((path, sha, mod), err) in enumerate(zip(items, outcome.errors, strict=True)):
                if err is not None:
                    fail(path, err)
                    continue
                size = path.stat().st_size
                if batch and (len(batch) >= BATCH_FILES or batch_bytes + size > BATCH_BYTES):
                    _write_batch_or_each(con, batch, record, fail, progress, installing)
                    batch, batch_bytes = [], 0
                batch.append((path, sha, mod, outcome, i))
                batch_bytes += size
        _write_batch_or_each(con, batch, record, fail, progress, installing)
        failed = False
    finally:
        tasks.close(failed=failed)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_batch_or_each(con, batch: list, record, fail, progress, installing) -> None:
    """A batch of small files in one transaction; if it fails, each file in a transaction of its own."""
    if not batch:
        return
    if len(batch) > 1:
        try:
            fids = _write_batch(con, batch, progress, installing)
        except Exception:  # noqa: BLE001 - the files are written again one by one: the bad one fails alone
            pass
        else:
            ranks: dict[int, list[int]] = {f: [] for f in fids}
            for fid, rank in con.execute(
                    "SELECT file_id, rank FROM ranks WHERE file_id BETWEEN ? AND ? "
                    "ORDER BY file_id, rank", [fids[0], fids[-1]]).fetchall():
                ranks[fid].append(rank)
            for (path, *_rest), fid in zip(batch, fids, strict=True):
                record(path, fid, ranks[fid])
            return
    for path, sha, mod, dec, i in batch:
        try:
            record(path, _write_file(con, path, sha, mod, iter(dec.batches(i)), progress, installing))
        except Exception as err:  # noqa: BLE001
            fail(path, err)


def _batch_finalizer(mod):
    """The importer's ``finalize_many(con, file_ids)`` (several files' finalize in a few statements), else None
    (its files are finalized one by one)."""
    return getattr(mod, "finalize_many", None)


def _write_batch(con, batch: list, progress, installing) -> list[int]:
    """Small files (path, sha, importer, _Decoded, index in it) in one transaction: all commit, or none (the
    caller retries them one by one). Returns their file ids, consecutive, in the batch's order."""
    from .writer import insert_files

    if installing is not None:
        installing.wait()
    shas = [sha if isinstance(sha, str) else sha.result() for _p, sha, *_ in batch]
    con.execute("BEGIN TRANSACTION")
    try:
        first = con.execute("SELECT coalesce(max(file_id), 0) + 1 FROM files").fetchone()[0]
        fids = list(range(first, first + len(batch)))
        now = datetime.now(UTC).replace(tzinfo=None)
        _files = pa.table({
            "file_id": pa.array(fids, pa.int32()),
            "path": [str(p.resolve()) for p, *_ in batch],
            "sha256": shas,
            "size_bytes": pa.array([p.stat().st_size for p, *_ in batch], pa.int64()),
            "source": [m.SOURCE for _p, _s, m, *_ in batch],
            "ingested_at": pa.array([now] * len(batch), pa.timestamp("us"))})
        con.execute("INSERT INTO files BY NAME SELECT * FROM _files")
        chunks: dict[int, tuple[_Decoded, list[int | None]]] = {}
        meta = []
        for fid, (_p, _s, _m, dec, i) in zip(fids, batch, strict=True):
            chunks.setdefault(id(dec), (dec, [None] * len(dec.paths)))[1][i] = fid
            meta.append({"file_id": fid} | dec.meta[i])
        tables: dict[str, list[pa.Table]] = {}
        for dec, to_fid in chunks.values():
            ids = pa.array(to_fid, pa.int32())
            for name in dec.tables:
                for t in dec.table(name):
                    fid_col = ids.take(t["_file"])
                    t = t.drop_columns(["_file"] + [c for c in ("file_id",) if c in t.column_names])
                    t = t.append_column("file_id", fid_col).filter(fid_col.is_valid())
                    tables.setdefault(name, []).append(t)
                    if progress:
                        progress(name)
        insert_files(con, meta, tables, set())
        by_mod: dict[str, list[int]] = {}
        mods = {}
        for fid, (_p, _s, mod, *_rest) in zip(fids, batch, strict=True):
            by_mod.setdefault(mod.SOURCE, []).append(fid)
            mods[mod.SOURCE] = mod
        for source, ids_of in by_mod.items():
            many = _batch_finalizer(mods[source])
            if many is not None:
                many(con, ids_of)
            else:
                for fid in ids_of:
                    mods[source].finalize(con, fid)
        con.execute("COMMIT")
        return fids
    except BaseException:
        con.execute("ROLLBACK")
        raise


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

