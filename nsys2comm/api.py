"""The public Python API: a job database and what you can ask of it. The CLI is a thin layer over this.

    >>> import nsys2comm
    >>> job = nsys2comm.Job.ingest(["fixtures/example"], db="run.duckdb")   # or Job.open("run.duckdb")
    >>> job.query("step_timeline", max_segments=50)                         # polars.DataFrame
    >>> job.sql("SELECT rank, count(*) FROM comm_ops GROUP BY rank")
    >>> job.summary()["comm_share_pct"]
    >>> job.report("report.html")

A *source* is either a job database (a ``.duckdb`` file made by ``nsys2comm ingest``), a Parquet job directory
(``nsys2comm ingest --out DIR``, :mod:`nsys2comm.storage.jobdir`) or trace files, directories or globs; traces are
ingested into a temporary in-memory database (:meth:`Job.open`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError, UsageError
from .storage import DUCKDB_MAGIC, connect, read_head, seal_read_only, settle

if TYPE_CHECKING:  # imported where rows are made: commands that make none (ingest) start sooner
    import polars as pl

# Statement types that only read. Anything else needs write=True (the CLI's --write).
_READ_ONLY_TYPES = {"SELECT", "EXPLAIN", "PRAGMA", "CALL", "PREPARE", "EXECUTE", "VARIABLE_SET", "SET",
                    "RELATION", "LOGICAL_PLAN"}
_TEMP_CREATE = re.compile(r"^\s*CREATE\s+(OR\s+REPLACE\s+)?(TEMP|TEMPORARY)\b", re.I)
_ROW_TYPES = {"SELECT", "EXPLAIN", "PRAGMA", "CALL", "EXECUTE", "RELATION"}


def is_database(path: str | Path) -> bool:
    """True for a job database: a path ending ``.duckdb`` (existing or not) or a file that is a DuckDB database."""
    p = Path(path)
    if p.suffix.lower() == ".duckdb":
        return True
    if not p.is_file():
        return False
    try:
        head = read_head(p, 12)
    except OSError:
        return False
    return head[8:12] == DUCKDB_MAGIC


def is_job_dir(path: str | Path) -> bool:
    """True for a Parquet job directory written by ``nsys2comm ingest --out DIR``."""
    from .storage import is_job_dir as _is

    return _is(path)


def _parse_value(v: Any) -> Any:
    """``-p key=value`` values: integers, floats, true/false/null, else the string."""
    if not isinstance(v, str):
        return v
    low = v.strip().lower()
    if low in ("null", "none"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def parse_params(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``["key=value", ...]`` (the CLI's ``-p``) to a dict with typed values."""
    out: dict[str, Any] = {}
    for pair in pairs or ():
        if "=" not in pair:
            raise UsageError(f"parameter {pair!r} is not key=value", hint="e.g. -p max_segments=50")
        k, v = pair.split("=", 1)
        k = k.strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise UsageError(f"parameter name {k!r} is not an identifier", hint="e.g. -p max_segments=50")
        out[k] = _parse_value(v)
    return out


def run_query(con, name: str, params: dict[str, Any] | None = None) -> pl.DataFrame:
    """Run a documented catalog object by name with named parameters (validated once, in
    :func:`nsys2comm.analysis.run_query`) through the results layer's runner (:func:`nsys2comm.results.run_one`,
    a batch of one: no snapshot to pay for); returns a polars DataFrame, or raises what the query raised."""
    from .results import Request, Results, run_one

    out = Results()
    run_one(con, Request(name, dict(params or {})), out)
    out.raise_failure(name)
    return out.frames[name]


def _no_rows() -> pl.DataFrame:
    import polars as pl

    return pl.DataFrame()


class Job:
    """One job database (on disk, or in memory for one-off use on trace files)."""

    def __init__(self, con, *, path: str | None = None, read_only: bool = True, results: list | None = None):
        self.con = con
        self.path = path  # None: in-memory
        self.read_only = read_only
        self.results = results or []  # FileResult per trace when the job was built by ingest
        self.stages: dict = {}  # seconds per stage of a Dask open (storage.dask_gather)

    # -- opening ------------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, source: str | Path | Sequence[str | Path] | None = None, *, write: bool = False,
             lock_timeout_s: float = 60.0, jobs: int | None = None,
             on_file: Callable | None = None, progress: Callable | None = None,
             scheduler=None, dask_local: int | None = None, keep_going: bool = False) -> Job:
        """Open a job database, or ingest trace files / directories / globs into an in-memory one.

        ``source`` is a ``.duckdb`` path, a Parquet job directory, or one or more trace paths. ``write=False``
        (default) opens a database read-only, so several readers can share it while nothing can change it.
        For a Parquet job directory, ``scheduler`` (a Dask scheduler address or ``distributed.Client``) or
        ``dask_local=N`` (a local cluster of N worker processes) runs the per-rank stage on Dask
        (:mod:`nsys2comm.storage.dask_stage`); ``job.stages`` then holds the seconds per stage.
        ``keep_going`` (trace sources only) skips traces that cannot be read: ``job.failed`` lists them.
        """
        sources = [source] if isinstance(source, (str, Path)) else list(source or [])
        if not sources:
            raise UsageError("no database or trace files given", hint="give a .duckdb file or trace files")
        if len(sources) == 1 and is_job_dir(sources[0]):
            return cls._open_dir(str(sources[0]), write=write, scheduler=scheduler, dask_local=dask_local)
        if scheduler is not None or dask_local is not None:
            raise UsageError("Dask runs on a Parquet job directory", path=str(sources[0]),
                             hint="write one with: nsys2comm ingest TRACES --out DIR")
        dbs = [s for s in sources if is_database(s)]
        if dbs:
            if len(sources) > 1:
                raise UsageError("give either one database or trace files, not both",
                                 path=str(dbs[0]), hint="ingest the traces into the database first")
            path = str(dbs[0])
            con = connect(path, write=write, lock_timeout_s=lock_timeout_s)
            return cls(con, path=path, read_only=not write)
        return cls.ingest(sources, db=None, jobs=jobs, on_file=on_file, progress=progress, read_only=not write,
                          keep_going=keep_going)

    @classmethod
    def _open_dir(cls, path: str, *, write: bool, scheduler, dask_local: int | None) -> Job:
        from .storage import jobdir

        stages: dict = {}
        gather = None
        if scheduler is not None or dask_local is not None:
            from .storage import dask_client, dask_gather

            def gather(con, snap):
                with dask_client(scheduler, dask_local) as c:
                    stages.update(dask_gather(con, snap, c))

        job = cls(jobdir.connect(path, write=write, gather=gather), path=path, read_only=True)
        job.stages = stages
        return job

    @classmethod
    def ingest(cls, paths: Iterable[str | Path], db: str | Path | None = None, *, rank: int | None = None,
               world_size: int | None = None, keep_going: bool = False, jobs: int | None = None,
               lock_timeout_s: float = 60.0,
               on_file: Callable | None = None, progress: Callable | None = None,
               read_only: bool = False, read_extra: dict | None = None) -> Job:
        """Ingest traces into ``db`` (created if missing; ``None`` = in memory) and return the job.

        Files already in the database (same SHA-256) are skipped. ``job.results`` holds one FileResult per file.
        ``db`` may be a Parquet job directory (an existing one, or a path ending in ``/``): see :func:`ingest_dir`.
        """
        from .ingest import ingest as _ingest
        from .ingest import start_decoders

        if db is not None and (str(db).endswith(("/", "\\")) or Path(db).is_dir()):
            results = ingest_dir(paths, db, rank=rank, world_size=world_size, keep_going=keep_going, jobs=jobs,
                                 on_file=on_file, read_extra=read_extra)
            job = cls.open(db)
            job.results = results
            return job

        paths = [str(p) for p in paths]
        # the decoders' start-up, and a single trace's first parts, run beside opening the database
        discard_read_ahead = start_decoders(paths, jobs=jobs, read_extra=read_extra, rank=rank,
                                            world_size=world_size)
        try:
            # a new database file comes with the catalog (dbtemplate); otherwise ingest installs it while the first
            # trace decodes
            con = (connect(db, write=True, lock_timeout_s=lock_timeout_s, objects=False) if db is not None
                   else connect(None, objects=False))
            try:
                results = _ingest(con, paths, rank=rank, world_size=world_size,
                                  keep_going=keep_going, jobs=jobs,
                                  on_file=on_file, progress=progress, read_extra=read_extra)
                if read_only and db is None:
                    seal_read_only(con)  # a one-off job on traces reads like a database opened read-only
            except BaseException:
                con.close()
                raise
        finally:
            discard_read_ahead()
        return cls(con, path=str(db) if db is not None else None, read_only=read_only, results=results)

    @property
    def failed(self) -> list[dict]:
        """The traces an ingest with ``keep_going`` could not read: [{path, error}] (the summary's failed_files)."""
        return [{"path": r.path, "error": r.message} for r in self.results if r.status == "failed"]

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Job({self.path or ':memory:'!r})"

    # -- asking -------------------------------------------------------------------------------------------------
    def set_peaks(self, *, link_gbps: float | None = None, nic_gbps: float | None = None,
                  peak_tflops: float | None = None) -> Job:
        """Physical peaks for this session's bandwidth checks (``--link-gbps``, ``--nic-gbps``): ``link_gbps`` is a
        GPU's link bandwidth per direction (GB/s, replaces the device table, docs/device-peaks.md), ``nic_gbps`` a
        host's network bandwidth per direction (GB/s). None clears one. They are DuckDB variables of this
        connection (``nsys2comm_link_gbps`` / ``nsys2comm_nic_gbps``), read by collective_bandwidth and
        comm_group_links only: no stored sweep reads them. ``peak_tflops`` (``--peak-tflops``,
        ``nsys2comm_peak_tflops``) is a GPU's dense compute peak in TFLOP/s for every math type, replacing the GEMM
        peak table (docs/gemm-peaks.md) in gemm_device_peaks and the GEMM efficiency objects."""
        for var, value in (("nsys2comm_link_gbps", link_gbps), ("nsys2comm_nic_gbps", nic_gbps),
                           ("nsys2comm_peak_tflops", peak_tflops)):
            if value is None:
                self.con.execute(f"RESET VARIABLE {var}")
            elif not float(value) > 0:
                unit = "TFLOP/s" if var.endswith("tflops") else "GB/s"
                raise UsageError(f"{var.removeprefix('nsys2comm_').replace('_', '-')} must be a positive number of "
                                 f"{unit}, not {value!r}")
            else:
                self.con.execute(f"SET VARIABLE {var} = ?::DOUBLE", [float(value)])
        return self

    def query(self, name: str, **params: Any) -> pl.DataFrame:
        """Rows of a catalog query (``nsys2comm queries list``), with its documented parameters."""
        return run_query(self.con, name, params)

    def sql(self, text: str, *, write: bool | None = None) -> pl.DataFrame:
        """Run one or more SQL statements; returns the last statement's rows (empty frame if it has none).

        Read-only unless ``write=True`` (defaults to how the job was opened); temporary objects are always allowed.
        All catalog objects (views, macros) can be used. Integral HUGEINT and DECIMAL(p, 0) columns (``sum`` of
        BIGINT) come back as Int64 where every value fits.
        """
        import duckdb

        from .output import exact_integers

        write = (not self.read_only) if write is None else write
        if not text or not text.strip():
            raise UsageError("no SQL given", hint="give one or more SQL statements, e.g. SELECT * FROM ranks")
        try:
            statements = self.con.extract_statements(text)
        except duckdb.Error as e:
            raise InputError(f"SQL error: {_duckdb_message(e)}") from None
        if not statements:
            raise UsageError("no SQL statement given", hint="e.g. \"SELECT * FROM ranks\"")
        if not write:
            for st in statements:
                kind = st.type.name
                if kind not in _READ_ONLY_TYPES and not (kind == "CREATE" and _TEMP_CREATE.match(st.query)):
                    raise InputError(f"refusing a {kind} statement: the database is opened read-only",
                                     hint="open it for writing to change it "
                                          "(or use CREATE TEMP ... for scratch objects)")
        settle(self.con)
        for i, st in enumerate(statements):
            last = i == len(statements) - 1
            try:
                if last and st.type.name in _ROW_TYPES:
                    rel = self.con.sql(st.query)
                    # integer sums stay integers: sum(BIGINT) is HUGEINT/DECIMAL(38,0) in DuckDB
                    return exact_integers(rel.pl()) if rel is not None else _no_rows()
                self.con.execute(st.query)
                settle(self.con)
            except duckdb.Error as e:
                msg = _duckdb_message(e)
                if "read-only" in msg.lower():
                    raise InputError(f"refused: {msg}", hint="open the database for writing to change it") from None
                raise InputError(f"SQL error: {msg}") from None
        return _no_rows()

    def summary(self, *, model: str | Path | dict | None = None, layout: str | dict | None = None) -> dict:
        """The job summary (see :func:`nsys2comm.summary.build_summary`). ``model`` and ``layout`` are what
        ``--model`` and ``--layout`` take (:mod:`nsys2comm.model`): with a model the summary has ``volume_check``."""
        from .model import volume_params
        from .summary import build_summary

        volume = volume_params(model, layout)  # usage errors before any work
        return build_summary(self.con, self.failed, **({"volume": volume} if volume else {}))

    def chart(self, name: str, *, step: int | None = None, baseline: Job | pl.DataFrame | None = None,
              **params: Any):
        """An Altair chart of the report, drawn from its entry in the one chart registry
        (:data:`nsys2comm.report.sections.CHARTS`): the same queries, parameters, not-available rules and draw
        function as the page. ``name``: a chart id (``"overlap-rank"``, ``"chart-overlap-rank"``), the catalog query
        it draws (``"overlap_by_rank"``) or its draw function's name. ``params`` override the report's parameters
        of the chart's queries; ``step`` picks the timeline's step as :meth:`report` does; the "What changed"
        charts (``changes-rank``, ``changes-coll``) need ``baseline``: the earlier run's job, or the rows of
        ``baseline.diff(job)`` already computed. A chart the report would show as "not available" raises InputError
        with the page's one-line reason."""
        from .report import html, sections

        spec = sections.find_chart(name)
        if spec.id in sections.CHANGES_CHARTS:
            if baseline is None:
                raise UsageError(f"chart {spec.id.removeprefix('chart-')} compares two runs",
                                 hint="give baseline=<the earlier run's Job>")
            if params or step is not None:
                raise UsageError(f"chart {spec.id.removeprefix('chart-')} takes no parameters or step",
                                 hint="it draws the rows of baseline.diff(job)")
            rows = baseline.diff(self) if isinstance(baseline, Job) else baseline
            block = html.chart_block(self.con, spec, [], changes=rows)
        else:
            block = html.chart_block(self.con, spec, sections.chart_queries(spec, params), step)
        if block.chart is None:
            raise InputError(f"chart {spec.id.removeprefix('chart-')} is not available: {block.missing}")
        return block.chart

    def report(self, out_path: str | Path, *, png_dir: str | Path | None = None,
               svg_dir: str | Path | None = None, baseline: Job | None = None,
               model: str | Path | dict | None = None, layout: str | dict | None = None,
               step: int | None = None) -> Path:
        """Write the self-contained HTML report (and PNG/SVG copies of the charts when asked). With ``baseline``
        (the job of an earlier run) the report adds a "What changed" section: :meth:`diff` of baseline → this job.
        ``model`` and ``layout`` (as for :meth:`summary`) feed the "Parallel layout and expected volume" section.
        ``step``: the timeline's step (the N of a step marker, or a detected iteration's index from ``iterations``;
        default the median-length one); a step the trace does not have is a UsageError."""
        from .model import session_inputs, volume_params
        from .report import build_report

        volume = volume_params(model, layout)  # usage errors before any work
        out = Path(out_path)
        changes = baseline.diff(self) if baseline is not None else None
        with session_inputs(self.con, volume):  # the report's parallel_layout / volume_check read them
            build_report(self.con, out, png_dir=png_dir, svg_dir=svg_dir, changes=changes, step=step)
        return out

    # -- comparing runs -----------------------------------------------------------------------------------------
    def compare(self, other: Job, *, sources: tuple[str, str] | None = None):
        """This job as the base, ``other`` as the new run: a :class:`nsys2comm.compare.Comparison` (rows, both
        sides' steps and ranks, headline changes, what was missing). ``sources`` names the two runs in the
        document (default: the database paths)."""
        from .compare import compare

        base_source, new_source = sources or (self.path or ":memory:", other.path or ":memory:")
        return compare(self.con, other.con, base_source=str(base_source), new_source=str(new_source))

    def diff(self, other: Job) -> pl.DataFrame:
        """What changed from this job (base) to ``other`` (new), per step: one row per section, metric and key with
        ``base``, ``new``, ``delta``, ``delta_pct`` and ``impact_ns``, sorted by impact on step time (rules in
        :mod:`nsys2comm.compare`)."""
        return self.compare(other).rows

    def diff_summary(self, other: Job, *, sources: tuple[str, str] | None = None, **limits: float | None) -> dict:
        """The ``nsys2comm diff --json`` document of this job (base) against ``other`` (new), with thresholds
        (``max_exposed_regression_pct=5``, ``max_busbw_drop_pct``, ``max_wait_regression_pct``) checked."""
        from .compare import document

        return document(self.compare(other, sources=sources), **limits)


def ingest_dir(paths: Iterable[str | Path], out: str | Path, *, rank: int | None = None,
               world_size: int | None = None, keep_going: bool = False, jobs: int | None = None,
               on_file: Callable | None = None, read_extra: dict | None = None) -> list:
    """Ingest traces into a Parquet job directory (``nsys2comm ingest --out DIR``; several processes may write
    into one directory at once). Returns one FileResult per file; open the job with ``Job.open(out)``."""
    from .ingest.jobwrite import write

    return write(paths, out, rank=rank, world_size=world_size, keep_going=keep_going, jobs=jobs, on_file=on_file,
                 read_extra=read_extra)


def doctor(out: str | Path, *, fix: bool = False) -> pl.DataFrame:
    """What is wrong with a Parquet job directory (``nsys2comm doctor DIR``): rank conflicts (kept), a dead writer's
    temp files and orphan parts (removed with ``fix``). One row per finding: kind, path, detail, action."""
    import polars as pl

    from .ingest.jobwrite import doctor as check

    return pl.DataFrame(check(out, fix=fix), schema={"kind": pl.String, "path": pl.String, "detail": pl.String,
                                                     "action": pl.String})


def diff(base: Job, new: Job) -> pl.DataFrame:
    """``base.diff(new)``: what changed from the base run to the new one (see :meth:`Job.diff`)."""
    return base.diff(new)


def _duckdb_message(e: BaseException) -> str:
    """All that DuckDB said (candidate bindings, LINE and caret lines included)."""
    return str(e).strip() or type(e).__name__
