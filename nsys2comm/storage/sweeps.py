"""The shared helper sweeps: in-session snapshots and the cache stored in the job database.

``run_query(con, name, params)`` is the one entry point the CLI and the report use: the name must be a public
table macro or view of the catalog, parameter names must be among the macro's ``@param`` list, values must be of
the kind of the parameter's default (a count, a number, one of the quoted choices of its doc), and are bound as
prepared-statement parameters (never pasted into the SQL text). ``check_query`` does the checks alone; they raise
:class:`UsageError` naming the query or parameter, in words that fit the Python API (the CLI adds its hints).

``materialize(con)`` snapshots the shared helper sweeps into TEMP tables: the iteration ranges, the GPU timeline
(behind overlap_by_rank, time_breakdown_by_rank and overlap_by_step), the per-communication-kernel overlap (behind
comm_kernels, comm_overlap_by_collective and top_comm_kernels) and its groups by name, the cross-rank matching, its
clock alignment and its instances (behind collective_skew, host_clock_offsets, rank_wait, comm_transfer and the
latency model), the launch lookup, the producer-GEMM links, the GEMMs' communication coverage and the evidence
behind each exposed communication kernel's causes (behind the exposure analyses), and every operation's process
group and step and every group's members and traffic (behind parallel_layout and volume_check), so a caller running
several analyses pays for each sweep once. The snapshot does not follow later ingests: call ``materialize`` again
(or ``unmaterialize``) after changing the data.

``refresh_cache(con)`` stores the same sweeps in the job database (``_cache_*`` tables) together with the
content key of the data they were computed from; ``use_cache(con)``, called by ``db.connect`` for read-only
sessions, points the helper views at them only while the key still matches. Ingest refreshes the cache at its end
and ``sql --write`` after its statements; any other change (a plain ``duckdb`` client, a killed ingest) leaves a
cache that simply no longer matches, so sessions compute live until the next refresh. A writable session never
reads the cache: its helpers stay live, and a refresh computes from the canonical tables.

The content key (``content_key``): per canonical table ``count(*)`` and ``sum(hash(row))`` (any insert, delete or
update of any column changes it), plus a digest of the catalog's SQL (a new nsys2comm with other definitions
invalidates old caches). Measured on 2 shared cores (DuckDB 2.0): nsys job with 1M kernels + 1M API calls + 200k
ranges, key 0.14 s cold / 0.08 s warm, against 1.7 s for the three sweeps it saves (8 %); Kineto 100 MB job, key
0.03 s against 0.2 s. So a fingerprint checked on every read was chosen over invalidating the cache inside each
writing transaction: the latter cannot see writes by other clients, and would still need this check.

At 10M kernels the key takes ≈ 0.4 s, most of a fresh process's open. So a read-only session that has computed a
matching key records the file's committed state beside it (``_file_state``, in the user cache directory), and the
next session that finds the file in that state and the same stored key skips the recount. The state is read while
the session's shared lock keeps writers out; it changes with every checkpoint (DuckDB writes the next database
header, with a higher iteration count) and counts as unknown while a write-ahead log exists (commits not yet
checkpointed leave the file itself unchanged), so any change to the data sends the next session back to the count.

"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import hashlib
import json
import os
import re
import threading

import duckdb

from .. import catalog
from . import usercache


def settle(con):
    """Finish any half-read ``execute()`` result so the connection takes new work (DuckDB >= 2 refuses otherwise)."""
    complete = getattr(con, "complete", None)
    if complete is not None:
        complete()
    return con


def held_descriptor(path: str | os.PathLike[str]) -> int | None:
    """A descriptor this process already holds on the file (DuckDB's, while a connection has it open), found
    without opening the file; None where there is none or no /proc to look in.

    DuckDB locks database files with POSIX record locks, and a process loses those on closing *any* descriptor of
    the file: reading a database this process has open must go through the descriptor it holds."""
    real = os.path.realpath(path)
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == real:
                return int(fd)
        except OSError:  # closed meanwhile (listdir's own descriptor)
            continue
    return None


# Writers (ingest, sql --write) hold a file's rows until its transaction commits and then run the resolution SQL:
# bounded, they spill to a temp directory instead of growing with the trace (decoder processes run beside them).
WRITER_MEMORY_LIMIT = "256MB"


def sweep_memory_limit() -> str:
    """Memory for the shared sweeps a writer stores once its files are in (``refresh_cache``): the decoders
    have finished by then, and at ``WRITER_MEMORY_LIMIT`` the sweeps over 10M kernels spill (58.8 s against 38.3 s
    at 2 GB). An eighth of the machine's RAM, between 256 MB and 4 GB; DuckDB takes only what the sweeps need."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): stay at the writer's limit
        return WRITER_MEMORY_LIMIT
    return f"{min(max(ram // 8, 256 << 20), 4 << 30) >> 20}MB"

# The shared helper sweeps, declared where they are defined (``-- @sweep per_rank|cross_rank [order=...]`` in
# queries/, catalog.CatalogObject.sweep), in catalog order: a sweep comes after the sweeps it reads.
SWEEPS: tuple[str, ...] = tuple(o.name for o in catalog.sweeps())
# the sweeps whose rows for a rank read that rank's rows only (distributed computes them one task per rank)
PER_RANK_SWEEPS: tuple[str, ...] = tuple(o.name for o in catalog.sweeps() if o.sweep == "per_rank")


def snapshot_table(view: str) -> str:
    """TEMP table holding ``materialize``'s snapshot of a sweep."""
    return f"{view}_snapshot"


_CACHE_TABLES = ["_cache_key"] + [f"_cache{v}" for v in SWEEPS]

# Sweeps stored in the order of the public queries that return all their rows sorted (their @sweep order=): DuckDB
# sorts presorted rows faster. At 10M kernels, comm_kernels 0.22 -> 0.18-0.20 s, producer_links 0.27 -> 0.16-0.20 s
# and serialised_pairs 0.43-0.45 -> 0.23-0.26 s; storing _exposure_kernel_evidence or _skew_comm_instances in their
# queries' order gained nothing (they are unioned or aggregated first).
_STORED_ORDER = {o.name: ", ".join(o.sweep_order) for o in catalog.sweeps() if o.sweep_order}


def _rows_to_store(view: str) -> str:
    """The SELECT whose rows a stored sweep or a snapshot of ``view`` holds."""
    order = _STORED_ORDER.get(view)
    return f"SELECT * FROM {view}" + (f" ORDER BY {order}" if order else "")


def content_key(con) -> str:
    """Fingerprint of everything the cached sweeps depend on: every canonical table's rows, and the catalog SQL."""
    tables = [o.name for o in catalog.load_catalog() if o.kind == "table"]
    parts = " UNION ALL ".join(
        f"SELECT {i} AS i, count(*) || ':' || coalesce(sum(hash(_t)), 0) AS k FROM {t} AS _t"
        for i, t in enumerate(tables))
    key = settle(con).execute(f"SELECT string_agg(k, ',' ORDER BY i) FROM ({parts})").fetchall()[0][0]
    return f"{catalog.digest()}|{key}"


def _stored_key(con) -> str | None:
    have = {r[0] for r in settle(con).execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary "
        "AND list_contains(?, table_name)", [_CACHE_TABLES]).fetchall()}
    if have != set(_CACHE_TABLES):
        return None
    rows = con.execute("SELECT content_key FROM _cache_key").fetchall()
    return rows[0][0] if len(rows) == 1 else None


def _db_state(con) -> tuple[str | None, bool]:
    """(file path or None for in-memory, read-only?) of the connection's database."""
    path, ro = settle(con).execute("SELECT path, readonly FROM duckdb_databases() "
                                   "WHERE database_name = current_database()").fetchall()[0]
    return path, bool(ro)


def refresh_cache(con) -> bool:
    """Store the shared sweeps in the job database with the content key they were computed from.

    A no-op (returns False) for in-memory and read-only databases and while the stored key still matches. The
    sweeps are computed from the live helper views, never from a cache or a snapshot. The stored key is dropped
    first and written last, so a refresh that stops half-way leaves sweeps that no session uses. The sweeps run
    in transactions of their own, several at a time on a small job (``_store_sweeps``, ``_sweep_workers``): the
    caller's process holds the database's write lock and writes nothing meanwhile, so they all see the data the
    key was computed from. Where only some ranks changed since the stored key (``changed_scope``), the per-rank
    sweeps are computed again for those ranks only. A refresh ends with one checkpoint.
    """
    path, read_only = _db_state(con)
    if path is None or read_only:
        return False
    _restore_live(con)
    writer_limit, threshold = con.execute("SELECT current_setting('memory_limit'), "
                                          "current_setting('checkpoint_threshold')").fetchall()[0]
    con.execute(f"SET memory_limit = '{sweep_memory_limit()}'")
    # one checkpoint at the end instead of DuckDB's own at each commit whose log passed the threshold: every
    # checkpoint rewrites the metadata of every table (440 MB Kineto trace: 0.068 + 0.072 s against 0.07 s)
    con.execute("SET checkpoint_threshold = '1TB'")
    try:
        # the key's parts (one scan of every table, as content_key): the key, and the ranks that changed
        con.execute(f"CREATE OR REPLACE TEMP TABLE _refresh_parts AS {_parts_sql()}")
        parts = _read_parts(con, "temp._refresh_parts")
        key = _key_of(parts)
        stored = _stored_key(con)
        if stored == key:
            return False
        scope = changed_scope(_stored_parts(con, stored), parts)
        con.execute("DROP TABLE IF EXISTS _cache_key")
        _store_sweeps(con, _sweep_workers(con), scope)
        con.execute("BEGIN TRANSACTION")
        con.execute("CREATE OR REPLACE TABLE _cache_key AS SELECT ?::VARCHAR AS content_key", [key])
        con.execute(f"CREATE OR REPLACE TABLE {PARTS_TABLE} AS SELECT * FROM temp._refresh_parts")
        con.execute("DROP TABLE IF EXISTS _cache_fingerprint")  # the key of older versions
        con.execute("COMMIT")
        con.execute("CHECKPOINT")  # readers then open a file without a log to replay
        return True
    finally:
        con.execute("DROP TABLE IF EXISTS temp._refresh_parts")
        _restore_live(con)  # a writable session computes live (use_cache)
        con.execute(f"SET memory_limit = '{writer_limit}'")
        con.execute(f"SET checkpoint_threshold = '{threshold}'")


# Sweeps stored at once. The sweeps of a small job are mostly queries that DuckDB runs on one thread (it splits a
# scan into row groups of 122,880 rows, and binding the macros is serial): two at a time took 0.50-0.52 s against
# 0.61-0.66 s for a 440 MB Kineto job (155k kernels), and 2.5-2.6 s against 2.7-2.8 s for 1M nsys kernels, on 2
# cores. At 10M kernels each sweep keeps every core busy by itself, and two at once only share the memory limit
# (31.5-33.7 s against 28.1-29.8 s): over PARALLEL_SWEEPS_MAX_KERNELS they are stored one at a time.
SWEEP_WORKERS = 4
PARALLEL_SWEEPS_MAX_KERNELS = 2_000_000


def _sweep_workers(con) -> int:
    kernels = con.execute("SELECT count(*) FROM kernels").fetchall()[0][0]
    return 1 if kernels > PARALLEL_SWEEPS_MAX_KERNELS else max(1, min(SWEEP_WORKERS, os.cpu_count() or 1))


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.cache
def sweep_dependencies() -> dict[str, frozenset[str]]:
    """The stored sweeps each sweep reads, through any helper views and macros between them (from the catalog's
    SQL). A sweep missed here would compute the one it reads live: slower, with the same rows."""
    names = {o.name for o in catalog.load_catalog()}
    refs = {o.name: (set(_WORD.findall(o.sql)) & names) - {o.name} for o in catalog.load_catalog()}
    memo: dict[str, set[str]] = {}

    def reads(name: str, path: tuple[str, ...] = ()) -> set[str]:
        if name not in memo:
            out: set[str] = set()
            for other in refs.get(name, ()):
                if other not in path:
                    out |= {other} if other in SWEEPS else reads(other, (*path, name))
            memo[name] = out
        return memo[name]

    return {view: frozenset(reads(view)) for view in SWEEPS}


# An ingest adds ranks to a job: the refresh after it recomputes the per-rank sweeps for the ranks whose rows
# changed only, and the cross-rank ones whole (issue 37). The ranks come from the parts of the content key: per
# canonical table, file and rank, count(*) and sum(hash(row)) (the key holds their sums per table), stored beside the
# key (_cache_parts, written in the key's transaction). The ranks whose parts differ from the stored ones, closed
# over the files they share (a file's row, and the sweeps keyed by kernel id only, belong to every rank of the file),
# get their rows deleted from the stored sweep and computed again on a cursor whose canonical tables are TEMP views
# of those ranks' rows (as the Dask stage computes one rank from its slice). Anything else refreshes everything: no
# stored key or parts (a refresh that stopped half-way, an older version), another catalog, every rank changed, or
# a kernel id that names another file than its row's (an edit by hand).
PARTS_TABLE = "_cache_parts"
ID_SHIFT = 40  # ingest.base.ID_SHIFT (a layer above this one): a kernel id's file is kernel_id >> ID_SHIFT

Part = tuple[str, int | None, int | None]  # (table, file_id, rank)


@functools.cache
def _canonical_tables() -> tuple[tuple[str, frozenset[str]], ...]:
    return tuple((o.name, frozenset(o.columns)) for o in catalog.load_catalog() if o.kind == "table")


@functools.cache
def rank_scoped_sweeps() -> tuple[str, ...]:
    """The per-rank sweeps a refresh computes for the changed ranks only: those that read per-rank sweeps only and
    whose rows name their rank (or their kernel, hence its file); the rest are computed whole."""
    deps = sweep_dependencies()
    scoped: list[str] = []
    for v in PER_RANK_SWEEPS:  # in catalog order: a sweep after those it reads
        if deps[v] <= set(scoped) and ("rank" in _SWEEP_COLUMNS[v] or "kernel_id" in _SWEEP_COLUMNS[v]):
            scoped.append(v)
    return tuple(scoped)


def _parts_sql() -> str:
    selects = []
    for t, cols in _canonical_tables():
        fid = "file_id" if "file_id" in cols else "NULL"
        rank = "rank" if "rank" in cols else "NULL"
        stray = (f"count(*) FILTER (WHERE (kernel_id >> {ID_SHIFT}) <> file_id)"
                 if {"kernel_id", "file_id"} <= cols else "0")
        selects.append(f"SELECT '{t}' AS tbl, {fid}::INTEGER AS file_id, {rank}::INTEGER AS rank, "
                       f"count(*)::BIGINT AS n, sum(hash(_t))::HUGEINT AS h, {stray}::BIGINT AS stray "
                       f"FROM {t} AS _t GROUP BY ALL")
    return " UNION ALL ".join(selects)


def _read_parts(con, table: str) -> dict[Part, tuple[int, int, int]]:
    return {(t, f, r): (n, h, s) for t, f, r, n, h, s in settle(con).execute(
        f"SELECT tbl, file_id, rank, n, h, stray FROM {table}").fetchall()}


def _key_of(parts: dict[Part, tuple[int, int, int]]) -> str:
    """``content_key`` from the parts (the same string)."""
    total = {t: [0, 0] for t, _cols in _canonical_tables()}
    for (t, _f, _r), (n, h, _s) in parts.items():
        total[t][0] += n
        total[t][1] += h
    return f"{catalog.digest()}|" + ",".join(f"{n}:{h}" for n, h in total.values())


def _stored_parts(con, stored_key: str | None) -> dict[Part, tuple[int, int, int]] | None:
    """The parts stored with ``stored_key``; None without a key, or where they do not add up to it (stored by
    another catalog, or left by this version beside a key that an older one wrote)."""
    if stored_key is None or not settle(con).execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary "
            "AND table_name = ?", [PARTS_TABLE]).fetchall()[0][0]:
        return None
    try:
        parts = _read_parts(con, PARTS_TABLE)
    except duckdb.Error:  # altered by hand
        return None
    return parts if _key_of(parts) == stored_key else None


@dataclasses.dataclass(frozen=True)
class Scope:
    """What a refresh computes again of the per-rank sweeps: the rows of these ranks, and of these files' kernels."""
    ranks: tuple[int, ...]
    files: tuple[int, ...]

    def rank_filter(self) -> str:
        return f"rank IN ({', '.join(map(str, self.ranks))})" if self.ranks else "false"

    def file_filter(self, column: str = "file_id") -> str:
        return f"{column} IN ({', '.join(map(str, self.files))})" if self.files else "false"

    def rows(self, view: str) -> str:
        """The rows of a stored sweep that this scope computes again."""
        if "rank" in _SWEEP_COLUMNS[view]:
            return self.rank_filter()
        return self.file_filter(f"(kernel_id >> {ID_SHIFT})")


_SWEEP_COLUMNS = {o.name: frozenset(o.columns) for o in catalog.sweeps()}


def changed_scope(old: dict[Part, tuple[int, int, int]] | None, new: dict[Part, tuple[int, int, int]]
                  ) -> Scope | None:
    """The ranks (and their files) whose per-rank sweep rows differ between the data of the ``old`` parts and of
    the ``new`` ones; None where everything is to be computed again."""
    if old is None or any(p[2] for p in old.values()) or any(p[2] for p in new.values()):
        return None
    keys = old.keys() | new.keys()
    changed = {k for k in keys if old.get(k) != new.get(k)}
    files = {f for _t, f, _r in changed}
    ranks = {r for _t, _f, r in changed if r is not None}
    while True:  # a rank's rows all go with its files, and a file's with its ranks
        more_files = files | {f for _t, f, r in keys if r in ranks}
        more_ranks = ranks | {r for _t, f, r in keys if f in more_files and r is not None}
        if (more_files, more_ranks) == (files, ranks):
            break
        files, ranks = more_files, more_ranks
    every_rank = {r for _t, _f, r in keys if r is not None}
    if not changed or None in files or ranks >= every_rank:
        return None
    return Scope(tuple(sorted(ranks)), tuple(sorted(f for f in files if f is not None)))


def _store_sweeps(con, workers: int, scope: Scope | None = None) -> None:
    """CREATE OR REPLACE TABLE _cache<view> for every sweep, ``workers`` at a time, each on a cursor of its own and
    in its own transaction. A sweep starts once the sweeps it reads are stored, and reads their tables (a TEMP view
    on its cursor) rather than computing them again. With a ``scope``, the per-rank sweeps (``rank_scoped_sweeps``)
    replace the scope's rows only, computed on a second cursor of the worker whose canonical tables are the scope's
    rows (``_SweepRun.scoped``). A signal or an error interrupts the others."""
    db = settle(con).execute("SELECT current_database()").fetchall()[0][0]
    run = _SweepRun(sweep_dependencies(), scope, '"' + db.replace('"', '""') + '"')
    cursors = [(con.cursor(), con.cursor() if scope is not None else None) for _ in range(workers)]
    # finished, not Thread.is_alive: after a join() that a signal interrupted, is_alive() can say False while the
    # thread still runs (CPython issue 90882)
    finished = [threading.Event() for _ in cursors]
    try:
        for c, f in zip(cursors, finished, strict=True):
            threading.Thread(target=run.work, args=(*c, f), name="nsys2comm-sweep", daemon=True).start()
        for f in finished:
            f.wait()
    except BaseException as e:  # a signal in this thread: the workers take no more sweeps
        run.fail(e)
        raise
    finally:  # no thread may stay inside DuckDB: the connection cannot close under it, nor the interpreter exit
        owned = [(c, f) for pair, f in zip(cursors, finished, strict=True) for c in pair if c is not None]
        while not all(f.is_set() for f in finished):
            for c, f in owned:
                if not f.is_set():
                    c.interrupt()
            finished[0].wait(0.05)
        for c, _f in owned:
            c.close()
    if run.failed:
        raise run.failed[0]


class _SweepRun:
    """The sweeps left to store, handed out to worker threads once the sweeps they read are stored."""

    def __init__(self, deps: dict[str, frozenset[str]], scope: Scope | None = None, db: str = "main"):
        self.deps = deps
        self.scope = scope
        self.db = db  # the job database's name, quoted: its tables under the scoped cursor's TEMP views
        # the sweeps that read most others first: they come last in a chain and are the largest queries
        self.todo = sorted(deps, key=lambda v: -len(deps[v]))
        self.stored: set[str] = set()
        self.failed: list[BaseException] = []
        self.ready = threading.Condition()

    def fail(self, e: BaseException) -> None:
        with self.ready:
            self.failed.append(e)
            self.ready.notify_all()

    def take(self) -> str | None:
        with self.ready:
            while self.todo and not self.failed:
                view = next((v for v in self.todo if self.deps[v] <= self.stored), None)
                if view is not None:
                    self.todo.remove(view)
                    return view
                self.ready.wait()
            return None

    def scoped(self, cur) -> None:
        """Make ``cur``'s canonical tables TEMP views of the scope's rows: the ranks' rows, and the files' rows of
        the table without ranks (a rank's slice, as the Dask stage reads it: rows of no rank are in none)."""
        assert self.scope is not None
        for t, cols in _canonical_tables():
            rows = self.scope.rank_filter() if "rank" in cols else self.scope.file_filter()
            cur.execute(f"CREATE OR REPLACE TEMP VIEW {t} AS SELECT * FROM {self.db}.main.{t} WHERE {rows}")

    def work(self, cur, scoped_cur, finished: threading.Event) -> None:
        redirected: set[str] = set()
        scoped_redirected: set[str] | None = None
        try:
            while (view := self.take()) is not None:
                if self.scope is not None and scoped_cur is not None and view in rank_scoped_sweeps():
                    if scoped_redirected is None:
                        self.scoped(scoped_cur)
                        scoped_redirected = set()
                    for d in sorted(self.deps[view] - scoped_redirected):
                        scoped_cur.execute(f"CREATE OR REPLACE TEMP VIEW {d} AS SELECT * FROM _cache{d} "
                                           f"WHERE {self.scope.rows(d)}")
                        scoped_redirected.add(d)
                    scoped_cur.execute("BEGIN TRANSACTION")
                    scoped_cur.execute(f"DELETE FROM _cache{view} WHERE {self.scope.rows(view)}")
                    scoped_cur.execute(f"INSERT INTO _cache{view} {_rows_to_store(view)}")
                    scoped_cur.execute("COMMIT")
                else:
                    for d in sorted(self.deps[view] - redirected):
                        cur.execute(f"CREATE OR REPLACE TEMP VIEW {d} AS SELECT * FROM _cache{d}")
                        redirected.add(d)
                    cur.execute(f"CREATE OR REPLACE TABLE _cache{view} AS {_rows_to_store(view)}")
                with self.ready:
                    self.stored.add(view)
                    self.ready.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.fail(e)
        finally:
            finished.set()


def drop_cache(con) -> None:
    """Remove the stored sweeps (for example when a refresh cannot run on a damaged database)."""
    for table in _CACHE_TABLES + [PARTS_TABLE, "_cache_fingerprint"]:
        settle(con).execute(f"DROP TABLE IF EXISTS main.{table}")


def session_table(view: str) -> str:
    """TEMP table holding a sweep the session computed for itself at open (a Parquet job's per-rank stage on
    Dask, gathered by the driver): the helper view reads it, like a stored cache, for the session's life."""
    return f"_session{view}"


def _use_session_sweeps(con) -> bool:
    have = {r[0] for r in settle(con).execute(
        "SELECT table_name FROM duckdb_tables() WHERE temporary AND list_contains(?, table_name)",
        [[session_table(v) for v in SWEEPS]]).fetchall()}
    for view in SWEEPS:
        if session_table(view) in have:
            con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {session_table(view)}")
    return bool(have)


def use_cache(con) -> bool:
    """In a read-only session, point the helper views at the stored sweeps when their key matches the data
    (or at the session's own sweeps, ``session_table``, where it computed them at open).

    Writable sessions keep live helpers: they may change the data at any time after this check.
    """
    if _use_session_sweeps(con):
        return True
    path, read_only = _db_state(con)
    if path is None or not read_only:
        return False
    try:
        stored = _stored_key(con)
        if stored is None or not stored.startswith(f"{catalog.digest()}|"):
            return False
        state = _file_state(path)
        if state is None or _recorded(path, state).get("content_key") != stored:
            if stored != content_key(con):
                return False
            if state is not None:
                _record(path, state, content_key=stored)
    except duckdb.Error:  # e.g. a canonical table dropped by hand: the live views report it
        return False
    for view in SWEEPS:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM _cache{view}")
    return True


# Headers at the start of a DuckDB file: the main header and the two database headers that checkpoints alternate.
_HEADER_BYTES = 3 * 4096
_MAX_KEY_RECORDS = 512


def _file_state(path: str) -> str | None:
    """The database file's committed state as the file system shows it (identity, size, mtime, headers), or None
    while a write-ahead log holds commits the file does not show yet, or where it cannot be read safely.

    Read while the caller's connection holds the file's lock, through DuckDB's own descriptor (``held_descriptor``:
    opening the file here would drop that lock). Without /proc (not Linux) there is no state, and sessions count."""
    try:
        if any(os.path.getsize(w) for w in glob.glob(glob.escape(path) + ".wal*")):
            return None
        fd = held_descriptor(path)
        if fd is None:
            return None
        st = os.fstat(fd)
        head = os.pread(fd, _HEADER_BYTES, 0)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{hashlib.sha256(head).hexdigest()}"


_SPOOL_PREFIX = "nsys2comm-spool-"  # ingest.base.SPOOL_PREFIX (a layer above this one)


def _key_record(path: str) -> str:
    real = os.path.realpath(path)
    return str(usercache.directory() / "content-keys" / hashlib.sha256(real.encode()).hexdigest()[:32])


def _recorded(path: str, state: str) -> dict:
    """What earlier sessions checked on the file in this state (``content_key``, ``catalog``), or {}."""
    try:
        with open(_key_record(path), "rb") as f:
            rec = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    if not isinstance(rec, dict) or rec.get("path") != os.path.realpath(path) or rec.get("state") != state:
        return {}
    return rec


def _record(path: str, state: str, **checked: str) -> None:
    """Remember what a session checked on the file in this state, beside what others checked in the same state
    (best effort: an unwritable cache only costs time)."""
    if os.path.basename(os.path.dirname(path)).startswith(_SPOOL_PREFIX):
        return  # a writer's pipeline database (jobwrite): removed when its process ends, never opened again
    target = _key_record(path)
    tmp = f"{target}.{os.getpid()}.tmp"
    rec = _recorded(path, state) | checked | {"path": os.path.realpath(path), "state": state}
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, target)
        _prune_key_records(os.path.dirname(target))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _prune_key_records(directory: str) -> None:
    """Keep the most recent records: one per database path ever opened would grow without end."""
    names = os.listdir(directory)
    if len(names) <= _MAX_KEY_RECORDS:
        return
    paths = [os.path.join(directory, n) for n in names]
    paths.sort(key=lambda p: os.stat(p).st_mtime_ns if os.path.exists(p) else 0)
    for p in paths[:len(paths) - _MAX_KEY_RECORDS // 2]:
        with contextlib.suppress(OSError):
            os.unlink(p)


def catalog_installed(con) -> bool:
    """``catalog.is_installed``, taken from the file's record when a session already found this package's catalog
    in the file's current state (comparing every stored definition costs 35-65 ms of each fresh process's open,
    and of each ingest's start)."""
    path, _ = _db_state(con)
    if path is None:
        return catalog.is_installed(con)
    state = _file_state(path)
    if state is not None and _recorded(path, state).get("catalog") == catalog.digest():
        return True
    if not catalog.is_installed(con):
        return False
    if state is not None:
        _record(path, state, catalog=catalog.digest())
    return True


def _restore_live(con) -> None:
    """Helper views compute from the canonical tables again (no snapshot, no cache). Only what needs it is
    dropped or made, in the catalog's order (a helper reads those before it): a session that never redirected a
    helper (an ingest) runs two queries, not 48 statements."""
    temp: set[str] = set()
    persistent: set[str] = set()
    for name, is_temp in settle(con).execute(
            "SELECT view_name, temporary FROM duckdb_views() UNION ALL "
            "SELECT table_name, true FROM duckdb_tables() WHERE temporary").fetchall():
        (temp if is_temp else persistent).add(name)
    for view in SWEEPS:
        table = snapshot_table(view)
        if view in temp:
            con.execute(f"DROP VIEW temp.{view}")
        if table in temp:
            con.execute(f"DROP TABLE temp.{table}")
        if view not in persistent:  # read-only sessions hold the helper as a TEMP view only: made again
            obj = catalog.find(view)
            if obj is None:  # SWEEPS names catalog views only
                raise LookupError(f"{view} is not in the catalog")
            con.execute(obj.sql.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1))


def materialize(con) -> None:
    """Compute the shared helper views once (TEMP tables) and point the helpers at the snapshots. Helpers that
    read stored sweeps already (``use_cache``, ``session_table``) are left so: copying them took 2.2 s at 10M
    kernels and made no query faster."""
    stored = _reading_stored_sweeps(con)
    for view in SWEEPS:
        table = snapshot_table(view)
        if view in stored:
            continue
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {_rows_to_store(view)}")
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {table}")


@contextlib.contextmanager
def snapshotted(con):
    """The shared sweeps snapshotted (``materialize``) for a batch of queries on ``con``, the live helpers restored
    after it. A helper that cannot be snapshotted computes live: the queries that read it say why."""
    settle(con)
    try:
        materialize(con)
    except Exception:  # noqa: BLE001 - the batch still runs, on live helpers
        unmaterialize(con)
    try:
        yield con
    finally:
        unmaterialize(con)
        settle(con)


def _reading_stored_sweeps(con) -> set[str]:
    """The helper views of this session that read a stored sweep (TEMP views over _cache_* or _session_* tables)."""
    rows = settle(con).execute("SELECT view_name, sql FROM duckdb_views() WHERE temporary "
                               "AND list_contains(?, view_name)", [list(SWEEPS)]).fetchall()
    return {v for v, sql in rows if re.search(rf"\b(_cache{v}|{session_table(v)})\b", sql or "")}


def unmaterialize(con) -> None:
    """Drop the snapshots: the helpers read the stored cache again when it matches, else compute live."""
    _restore_live(con)
    use_cache(con)
