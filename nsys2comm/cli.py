"""The ``nsys2comm`` command line: thin commands over :mod:`nsys2comm.api`; all rows go through :mod:`.output`.

Conventions: rows (and the summary) on stdout, messages on stderr; exit 0 ok, 1 input error, 2 usage error,
3 threshold violated, 4 some trace files could not be read (--keep-going: the others were
analysed). ``--debug`` shows tracebacks instead of one-line errors.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from . import __version__, catalog
from . import output as out_
from .analysis import check_query, job_start_ns
from .api import Job, ingest_dir, is_database, is_job_dir, parse_params, settle
from .api import doctor as api_doctor
from .errors import HelperNotRunnable, InputError, Nsys2CommError, UnknownQuery, UsageError, as_user_error, printable
from .limits import GZIP_CEILING_BYTES, GZIP_FLOOR_BYTES, GZIP_RATIO, MAX_EVENT_BYTES
from .output import Format, TimeUnit

if TYPE_CHECKING:
    import polars as pl

EXIT_OK, EXIT_INPUT, EXIT_USAGE, EXIT_THRESHOLD, EXIT_PARTIAL = 0, 1, 2, 3, 4


def _without_type_names(params: list) -> list:
    """Typer labels every parameter with its Python type (<bool>, <list[str]>); our metavars and help say it."""
    for p in params:
        if isinstance(p, TyperArgument):
            p.display_type_rich = lambda ctx: None  # the argument's metavar names it
        elif getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""  # a flag takes no value
    return params


class _Command(TyperCommand):
    def get_params(self, ctx):
        return _without_type_names(super().get_params(ctx))


def _click_exceptions():
    """click's exception classes: typer >= 0.2x carries its own copy of click, older ones use click itself."""
    try:
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - older typer
        from click import exceptions
    return exceptions


class _Group(TyperGroup):
    def get_params(self, ctx):
        return _without_type_names(super().get_params(ctx))

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        """A bad option value is one line like every other error, not a usage box (help for no arguments stays)."""
        click = _click_exceptions()
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.NoArgsIsHelpError:
            if not standalone_mode:
                raise
            return super().main(*args, standalone_mode=True, **kwargs)
        except click.ClickException as e:
            if not standalone_mode:
                raise
            where = e.ctx.command_path if isinstance(e, click.UsageError) and e.ctx else "nsys2comm"
            out_.message(f"Error: {printable(e.format_message())} (see {where} --help)")
            sys.exit(e.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            out_.message("Interrupted.")
            sys.exit(130)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


app = typer.Typer(
    name="nsys2comm",
    help="Communication analysis of multi-GPU training traces (Nsight Systems SQLite exports, PyTorch profiler "
         "JSON) with documented DuckDB SQL and self-contained HTML reports.\n\n"
         "Wherever a DB is expected you may give trace files, directories or globs instead: they are ingested into "
         "a temporary in-memory database.\n\n"
         "\b\nExample:\n  nsys2comm report fixtures/example -o report.html\n\n"
         "Exit codes: 0 ok, 1 input error, 2 usage error, 3 threshold violated (summary, diff), 4 some trace files "
         "could not be read and the others were analysed (--keep-going).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=_Group,
)


def _sub_app(help_text: str) -> typer.Typer:
    """A group of sub-commands (``nsys2comm queries …``, ``nsys2comm export …``), styled as the main app."""
    return typer.Typer(help=help_text, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]},
                       cls=_Group)


queries_app = _sub_app("The catalog of documented SQL analyses.\n\n\b\nExample:\n  nsys2comm queries list\n"
                       "  nsys2comm queries show step_timeline")
app.add_typer(queries_app, name="queries")

_state = {"debug": os.environ.get("NSYS2COMM_DEBUG", "") not in ("", "0")}


# ---------------------------------------------------------------------------------------------------------------
# shared options and plumbing

SourcesArg = Annotated[list[str], typer.Argument(
    metavar="DB_OR_TRACES", help="A job database (.duckdb) or Parquet job directory (ingest --out), or trace files, "
                                 "directories or globs (ingested in memory).",
    show_default=False)]
SchedulerOpt = Annotated[str | None, typer.Option(
    "--scheduler", metavar="ADDRESS", show_default=False,
    help="Parquet job directory: run the per-rank stage on this Dask scheduler (tcp://host:8786); needs "
         "pip install 'nsys2comm[dask]'.")]
DaskLocalOpt = Annotated[int | None, typer.Option(
    "--dask-local", metavar="N", min=1, show_default=False,
    help="Parquet job directory: run the per-rank stage on a local Dask cluster of N worker processes.")]
FormatOpt = Annotated[Format | None, typer.Option(
    "--format", "-f", metavar="FORMAT", case_sensitive=False, show_default=False,
    help="Output format: " + ", ".join(out_.FORMATS) + " (default: from -o's extension, else table; a table fits "
         "the terminal, truncating text with … and leaving out columns that do not fit, as stderr says).")]
OutOpt = Annotated[Path | None, typer.Option(
    "--output", "-o", metavar="FILE", help="Write rows to this file; the format follows its extension (.csv .tsv "
                                           ".json .jsonl .parquet .md).", show_default=False, dir_okay=False)]
TimeUnitOpt = Annotated[TimeUnit | None, typer.Option(
    "--timeunit", metavar="UNIT", case_sensitive=False, show_default=False,
    help="Show times in ns, us, ms or s: columns named *_ns are converted, rounded to whole ns and renamed *_us, "
         "*_ms or *_s; timestamps (columns named start_ns, end_ns, first_ns, last_ns, ts_ns or ending _start_ns, "
         "_end_ns ...) then count from the job's first event, as the table's first line (or stderr) says "
         "(default: integer ns as stored, timestamps on the absolute timeline).")]
RelativeOpt = Annotated[bool, typer.Option(
    "--relative", help="Show timestamps (columns named start_ns, end_ns, first_ns, last_ns, ts_ns or ending "
                       "_start_ns, _end_ns ...) as time since the job's first event instead of on the absolute "
                       "timeline, also in ns; durations are unchanged.")]
ColumnsOpt = Annotated[str | None, typer.Option(
    "--columns", "-c", metavar="A,B,...", show_default=False,
    help="Show exactly these columns, in this order (a time column may be named in any unit). Without it, a "
         "table too narrow for every column shows the query's key columns first ('nsys2comm queries show NAME' "
         "marks them), or one record per row when even those do not fit.")]
KeepGoingOpt = Annotated[bool, typer.Option(
    "--keep-going", help="Trace files: analyse the ones that can be read, list the others on stderr (and in the "
                         "summary's failed_files and missing), and exit 4 if any could not be read (3 wins when "
                         "a threshold is violated; 1 when none could be read).")]
LockOpt = Annotated[float, typer.Option("--lock-timeout", metavar="S",
                                        help="Seconds to wait for another process holding the database.")]
ModelOpt = Annotated[str | None, typer.Option(
    "--model", metavar="SPEC", show_default=False,
    help="The model, for the expected communication volume (volume_check): key=value pairs "
         "(layers=24,hidden=2048,seq=2048,micro_batch=4,vocab=50304,dtype=bf16; also ffn, heads, kv_heads, "
         "params, tied, gated, grad_dtype), or a Hugging Face config.json or Megatron-LM arguments file, "
         "optionally followed by ,key=value overrides.")]
LayoutOpt = Annotated[str | None, typer.Option(
    "--layout", metavar="SPEC", show_default=False,
    help="The parallel layout where the trace cannot tell it: tp=8,pp=4,dp=16,zero=1 (also cp, ep, "
         "sequence_parallel, micro_batches, recompute, pp_split). Process groups the trace names win.")]
LinkGbpsOpt = Annotated[float | None, typer.Option(
    "--link-gbps", metavar="GBPS", show_default=False,
    help="Physical peak of a GPU's links per direction, GB/s (e.g. 450 for NVLink4): replaces the device table "
         "(docs/device-peaks.md) in the bandwidth checks of groups on one host.")]
PeakTflopsOpt = Annotated[float | None, typer.Option(
    "--peak-tflops", metavar="TFLOPS", show_default=False,
    help="Dense compute peak of one GPU, TFLOP/s, for every dtype (e.g. 989 for an H100 SXM in bf16): replaces "
         "the GEMM peak table (docs/gemm-peaks.md) in the GEMM efficiency and MFU figures.")]
NicGbpsOpt = Annotated[float | None, typer.Option(
    "--nic-gbps", metavar="GBPS", show_default=False,
    help="Network bandwidth of one host per direction, all its NICs, GB/s (e.g. 400 for 8 x 400 Gb/s): the peak "
         "of groups that span hosts (traces do not record NIC speeds).")]


def _stderr_tty() -> bool:
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """One-line errors with a hint; --debug re-raises for the traceback."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except Nsys2CommError as e:
        if _state["debug"]:
            raise
        out_.message(f"Error: {e.line()}" + _duckdb_detail(e))
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        out_.message("Interrupted.")
        raise typer.Exit(130) from None
    except Exception as e:
        if _state["debug"] or type(e).__module__.startswith(("typer", "click")):
            raise
        refusal = as_user_error(e)
        if refusal is not None:  # a full disk, a read-only file system, permissions: the user's kind of error
            out_.message(f"Error: {refusal.line()}")
            raise typer.Exit(refusal.exit_code) from None
        import duckdb

        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, duckdb.Error):
            out_.message(f"Error: {first} (check the SQL or the database; rerun with --debug for details)"
                         + _duckdb_detail(e))
        else:
            out_.message(f"Error: {type(e).__name__}: {printable(first)} (rerun with --debug for the traceback, and "
                         "report it)")
        raise typer.Exit(EXIT_INPUT) from None


def _duckdb_detail(e: BaseException) -> str:
    """What DuckDB said after its first line (candidate bindings, LINE n with the caret), as lines to append,
    for a DuckDB error or one of ours raised while handling it."""
    import duckdb

    src = e if isinstance(e, duckdb.Error) else (e.__cause__ or e.__context__)
    said = str(src).strip() if isinstance(src, duckdb.Error) else ""
    if not said or (src is not e and said in str(getattr(e, "what", ""))):
        return ""  # nothing from DuckDB, or our message quotes it whole already
    return "".join("\n" + line.rstrip() for line in said.splitlines()[1:] if line.strip())


def _open(sources: list[str], *, write: bool = False, lock_timeout: float = 60.0, scheduler: str | None = None,
          dask_local: int | None = None, keep_going: bool = False) -> Job:
    """DB path or Parquet job directory → open it; anything else → ingest the traces into memory (one-off use);
    with ``keep_going`` the traces that cannot be read are said on stderr and left out (job.failed)."""
    if not sources:
        raise UsageError("no database or trace files given", hint="e.g. nsys2comm summary run.duckdb")
    dask = {"scheduler": scheduler, "dask_local": dask_local}
    if len(sources) == 1 and (is_database(sources[0]) or is_job_dir(sources[0])):
        return Job.open(sources[0], write=write, lock_timeout_s=lock_timeout, **dask)
    if any(is_database(s) or is_job_dir(s) for s in sources):
        raise UsageError("give either one database or trace files, not both",
                         hint="ingest the traces into the database first")
    if scheduler is not None or dask_local is not None:
        Job.open(sources, **dask)  # says why: Dask runs on a Parquet job directory
    status = None
    if _stderr_tty():
        from rich.console import Console

        status = Console(stderr=True).status("ingesting traces into memory…")
        status.start()
    try:
        job = Job.open(sources, write=write, keep_going=keep_going)
    except InputError as e:
        if not keep_going and e.hint and "--keep-going" not in e.hint:
            e.hint += "; --keep-going analyses the other files"
        raise
    finally:
        if status:
            status.stop()
    if job.failed:
        read = sum(r.status != "failed" for r in job.results)
        out_.message(f"{len(job.failed)} of {len(job.results)} trace file(s) could not be read"
                     + (", left out (--keep-going):" if read else ":"))
        for f in job.failed:
            out_.message(f"  {f['error']}")
        if not read:
            job.close()
            e = InputError(f"none of the {len(job.results)} trace file(s) could be read")
            e.failed = job.failed  # summary --json lists them in its document
            raise e
    return job


def _exit_partial(*jobs: Job | None) -> None:
    """--keep-going: exit 4 when a trace file was left out (after the command's output)."""
    if any(j is not None and j.failed for j in jobs):
        raise typer.Exit(EXIT_PARTIAL)


def _version_cb(value: bool) -> None:
    if value:
        typer.echo(f"nsys2comm {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version_cb, is_eager=True,
                                          help="Show the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")] = False,
) -> None:
    # set on every invocation (in-process runners call the app many times)
    _state["debug"] = debug or os.environ.get("NSYS2COMM_DEBUG", "") not in ("", "0")


# ---------------------------------------------------------------------------------------------------------------
# ingest


@app.command(cls=_Command)
def ingest(
    paths: Annotated[list[str], typer.Argument(
        metavar="PATH", show_default=False, help="Trace files, directories (searched recursively) or quoted globs.")],
    db: Annotated[str | None, typer.Option("--db", metavar="FILE", show_default=False,
                                           help="Job database to create or add to (a path ending in / or an "
                                                "existing directory: a Parquet job directory, as --out).")] = None,
    out: Annotated[str | None, typer.Option("--out", metavar="DIR", show_default=False,
                                            help="Parquet job directory to create or add to, one part per trace "
                                                 "and rank; several processes may write into it at once.")] = None,
    rank: Annotated[int | None, typer.Option("--rank", metavar="N", show_default=False,
                                             help="Rank of a single trace file whose rank the trace does not "
                                                  "record.")] = None,
    world_size: Annotated[int | None, typer.Option(
        "--world-size", metavar="N", show_default=False,
        help="Number of ranks in the job, for traces that do not record it (used for group sizes only where the "
             "trace shows no other process group; noted in ingest_notes).")] = None,
    keep_going: Annotated[bool, typer.Option("--keep-going", help="Ingest the good files, list the bad ones, "
                                                                  "exit 1 if any failed.")] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", metavar="N", min=1, show_default=False,
                                             help="Parallel parsers (default: all cores).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar and no per-file lines "
                                                              "(failures are still reported).")] = False,
    lock_timeout: LockOpt = 60.0,
    max_decompressed_gb: Annotated[float | None, typer.Option(
        "--max-decompressed-gb", metavar="G", min=0.0, show_default=False,
        help=f"Refuse a gzip trace that expands beyond G GiB (default: once it expands beyond "
             f"{GZIP_FLOOR_BYTES >> 20} MiB and {GZIP_RATIO} × the compressed bytes read so far, or beyond "
             f"{GZIP_CEILING_BYTES >> 30} GiB).")] = None,
    max_event_mb: Annotated[float, typer.Option(
        "--max-event-mb", metavar="M", min=0.0,
        help="Refuse a Kineto trace holding one event (or a gap between events) larger than M MiB.")]
    = MAX_EVENT_BYTES >> 20,
) -> None:
    """Ingest traces into a job database (one transaction per file; files already ingested are skipped).

    Prints one line per file on stderr: ingested, skipped (already ingested) or failed with its reason.

    \b
    Example:
      nsys2comm ingest traces/ --db run.duckdb --keep-going
      nsys2comm ingest 'out/rank*.sqlite' --db run.duckdb --jobs 4
      nsys2comm ingest node3/traces/ --out /shared/job42/   # one directory, written by every node at once
    """
    from .ingest import expand_paths

    with _errors():
        if (db is None) == (out is None):
            raise UsageError("give --db FILE or --out DIR" if db is None else "give --db or --out, not both",
                             hint="--db run.duckdb (one DuckDB file) or --out DIR (a Parquet job directory)")
        files = expand_paths(paths)
        limits = {"max_event_bytes": int(max_event_mb * (1 << 20))}
        if max_decompressed_gb is not None:
            limits["max_decompressed_bytes"] = int(max_decompressed_gb * (1 << 30))
        if out is not None or db.endswith(("/", os.sep)) or Path(db).is_dir():
            _ingest_dir(files, Path(out or db), rank=rank, world_size=world_size, keep_going=keep_going, jobs=jobs,
                        quiet=quiet, limits=limits)
            return
        db = Path(db)
        created = not db.exists()
        report = _IngestReport(len(files), quiet=quiet)
        try:
            job = Job.ingest(files, db=db, rank=rank, world_size=world_size, keep_going=keep_going, jobs=jobs,
                             lock_timeout_s=lock_timeout, on_file=report.on_file, read_extra=limits)
            job.close()
        except BaseException as e:
            if created:
                _remove_db(db)  # a failed or interrupted ingest leaves no new file behind
            if isinstance(e, InputError) and not keep_going and e.hint and "--keep-going" not in e.hint:
                e.hint += "; --keep-going ingests the other files"
            raise
        finally:
            report.stop()
        if created and not report.counts["ingested"]:
            _remove_db(db)
        report.finish(db, len(files))


def _ingest_dir(files: list[Path], out: Path, *, rank, world_size, keep_going, jobs, quiet, limits) -> None:
    """ingest --out DIR: each file's parts appear atomically, so a failure or a signal leaves nothing to undo."""
    report = _IngestReport(len(files), quiet=quiet)
    try:
        ingest_dir(files, out, rank=rank, world_size=world_size, keep_going=keep_going, jobs=jobs,
                   on_file=report.on_file, read_extra=limits)
    except InputError as e:
        if not keep_going and e.hint and "--keep-going" not in e.hint:
            e.hint += "; --keep-going ingests the other files"
        raise
    finally:
        report.stop()
    report.finish(out, len(files))


class _IngestReport:
    """Per-file lines on stderr (above a progress bar on a terminal) and the closing count."""

    def __init__(self, n_files: int, *, quiet: bool):
        self.quiet, self.failed = quiet, []
        self.counts = {"ingested": 0, "skipped": 0, "failed": 0}
        self.progress = self.task = None
        if _stderr_tty() and not quiet:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                     TextColumn("ETA"), TimeRemainingColumn(),
                                     TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
            self.task = self.progress.add_task("", total=n_files)
            self.progress.start()

    def say(self, line: str) -> None:
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
        else:
            out_.message(line)

    def on_file(self, res) -> None:
        self.counts[res.status] = self.counts.get(res.status, 0) + 1
        path = printable(res.path)
        if res.status == "failed":
            self.failed.append(printable(res.message) if res.message else path)
            self.say(f"failed    {self.failed[-1]}")
        elif self.quiet:
            pass
        elif res.status == "ingested":
            ranks = ", ".join(map(str, res.ranks)) if res.ranks else "?"
            self.say(f"ingested  {path} (rank{'s' if len(res.ranks) != 1 else ''} {ranks})")
        else:
            self.say(f"skipped   {path}: {res.message or 'already ingested'}")
        if self.progress is not None:
            speed = self.progress.tasks[0].speed  # files per second over rich's recent samples
            rate = f"{speed:.0f} files/s  " if speed else ""
            self.progress.update(self.task, advance=1, description=rate + printable(Path(res.path).name))

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()

    def finish(self, db: Path, n_files: int) -> None:
        c = self.counts
        if not self.quiet:
            out_.message(f"{c['ingested']} ingested, {c['skipped']} skipped, {c['failed']} failed → "
                         + (f"{db}" if db.exists() else "no database written"))
        if self.failed:
            out_.message(f"Error: {len(self.failed)} of {n_files} file(s) could not be ingested:")
            for line in self.failed:
                out_.message(f"  {line}")
            raise typer.Exit(EXIT_INPUT)


def _remove_db(db: Path) -> None:
    for p in (db, db.with_name(db.name + ".wal")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


# ---------------------------------------------------------------------------------------------------------------
# summary


@app.command(cls=_Command)
def summary(
    sources: SourcesArg,
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as JSON (stable keys, 'schema_version').")]
    = False,
    max_exposed_comm_pct: Annotated[float | None, typer.Option(
        metavar="X", help="Exit 3 if exposed communication exceeds X % of GPU-busy time.", show_default=False)] = None,
    min_overlap_pct: Annotated[float | None, typer.Option(
        metavar="X", show_default=False,
        help="Exit 3 if less than X % of communication time overlaps compute.")] = None,
    max_small_p2p_pct: Annotated[float | None, typer.Option(
        metavar="X", help="Exit 3 if p2p messages below n½ (64 KiB without a fit) take more than X % of "
        "p2p transfer time.", show_default=False)] = None,
    max_latency_bound_pct: Annotated[float | None, typer.Option(
        metavar="X", help="Exit 3 if latency-bound operations (below n½ of their α-β fit) take more than X % of "
        "communication transfer time.", show_default=False)] = None,
    max_skew_ms: Annotated[float | None, typer.Option(
        metavar="X", help="Exit 3 if ranks start one collective more than X ms apart.", show_default=False)] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 also when a threshold could not be evaluated "
                                                          "(its metric is not available).")] = False,
    model: ModelOpt = None,
    layout: LayoutOpt = None,
    link_gbps: LinkGbpsOpt = None,
    nic_gbps: NicGbpsOpt = None,
    peak_tflops: PeakTflopsOpt = None,
    scheduler: SchedulerOpt = None,
    dask_local: DaskLocalOpt = None,
    keep_going: KeepGoingOpt = False,
) -> None:
    """The few lines to read after a job, or --json for scripts.

    Communication share of GPU time, overlap with compute, exposed communication, worst collective,
    small-message p2p share and latency, stragglers, and what data was missing.

    With a threshold option the command exits 3 when the job violates it (after printing the summary). A metric
    that could not be computed (one rank: no skew; no communication: no overlap; no sizes: no bandwidth) is
    reported as not available and its threshold as not evaluated, which --strict also turns into exit 3.
    Without traces, --json still writes a summary document, saying "no traces", and the exit code is 1.
    With --keep-going, trace files that cannot be read are left out, listed in failed_files and missing, and the
    exit code is 4 (3 if a threshold is violated).

    \b
    Example:
      nsys2comm summary run.duckdb
      nsys2comm summary run.duckdb --json --max-exposed-comm-pct 25 > summary.json
      nsys2comm summary run.duckdb --model config.json,seq=4096,micro_batch=1 --layout tp=8,zero=1
    """
    from .model import volume_params
    from .summary import check_thresholds, empty_summary, format_summary

    limits = dict(max_exposed_comm_pct=max_exposed_comm_pct, min_overlap_pct=min_overlap_pct,
                  max_small_p2p_pct=max_small_p2p_pct, max_latency_bound_pct=max_latency_bound_pct,
                  max_skew_ms=max_skew_ms)
    with _errors():
        volume_params(model, layout)  # usage errors before any work
        try:
            job = _open(sources, scheduler=scheduler, dask_local=dask_local, keep_going=keep_going)
            job.set_peaks(link_gbps=link_gbps, nic_gbps=nic_gbps, peak_tflops=peak_tflops)
        except InputError as e:
            if json_:  # scripts get a valid document either way (never an empty file); the error still exits 1
                doc = empty_summary(e.line())
                doc["failed_files"] = getattr(e, "failed", [])
                out_.write_document(check_thresholds(doc, **limits))
            raise
        s = job.summary(model=model, layout=layout)
        check_thresholds(s, **limits)
        if json_:
            out_.write_document(s)
        else:
            out_.text(format_summary(s, width=out_.text_width()))  # wrapped to the terminal, at most 100
        job.close()
        _gate(s, strict)
        _exit_partial(job)


# ---------------------------------------------------------------------------------------------------------------
# diff

RunArg = "a job database (.duckdb), or a trace file, directory or quoted glob (ingested in memory)"


@app.command("diff", cls=_Command)
def diff_(
    base: Annotated[str, typer.Argument(metavar="BASE", show_default=False, help=f"The baseline run: {RunArg}.")],
    new: Annotated[str, typer.Argument(metavar="NEW", show_default=False, help=f"The changed run: {RunArg}.")],
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON document (stable keys, 'schema_version'): "
                                                       "headline changes, rows, missing, thresholds.")] = False,
    fmt: FormatOpt = None,
    output: OutOpt = None,
    columns: ColumnsOpt = None,
    timeunit: Annotated[TimeUnit | None, typer.Option(
        "--timeunit", metavar="UNIT", case_sensitive=False, show_default=False,
        help="Show the time rows (metrics named *_ns…) and impact_ns in ns, us, ms or s, rounded to whole ns; "
             "the metric and column names say the unit (default: ns).")] = None,
    max_exposed_regression_pct: Annotated[float | None, typer.Option(
        metavar="X", show_default=False,
        help="Exit 3 if exposed communication per step grew by more than X % over BASE.")] = None,
    max_busbw_drop_pct: Annotated[float | None, typer.Option(
        metavar="X", show_default=False,
        help="Exit 3 if bus bandwidth dropped by more than X % (mean over size buckets known in both runs, "
             "weighted by BASE's kernel time).")] = None,
    max_wait_regression_pct: Annotated[float | None, typer.Option(
        metavar="X", show_default=False,
        help="Exit 3 if the time ranks wait for each other at collectives, per step, grew by more than X %.")]
    = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 also when a threshold could not be evaluated "
                                                          "(its metric is not available).")] = False,
    keep_going: KeepGoingOpt = False,
) -> None:
    """Compare two runs per step: what changed in collectives, sizes, bandwidth, overlap, exposure, idle time,
    waits, skew and the latency model, sorted by impact on step time.

    Each row gives base, new, delta and delta_pct (empty where not available or base is 0), and impact_ns: on the
    rows that are exposed communication or idle time, their change in ns per step (empty on the rows that explain
    it). Totals are divided by the steps of each run, so runs of different length compare; a run without step
    markers counts the iterations detected from its repeating kernel pattern as steps. When a run has neither,
    the diff is per capture window (*_per_window rows, no step-time impact): impact_ns is then the change in
    exposed communication over the work both runs hold (per collective and size bucket, see the *_per_op rows).
    The catalog's diff_* queries hold every definition. With a threshold option
    the command exits 3 when NEW violates it; a metric that is not available leaves its threshold not evaluated,
    which --strict also turns into exit 3.

    \b
    Example:
      nsys2comm diff before.duckdb after.duckdb
      nsys2comm diff before/ after/ --json --max-exposed-regression-pct 5 > diff.json
      nsys2comm diff before.duckdb after.duckdb --timeunit ms -c metric,key,delta,delta_pct
    """
    from .compare import document

    limits = dict(max_exposed_regression_pct=max_exposed_regression_pct, max_busbw_drop_pct=max_busbw_drop_pct,
                  max_wait_regression_pct=max_wait_regression_pct)
    with _errors():
        if not json_:
            fmt_used = out_.infer_format(fmt, output)  # usage errors before any work
        elif fmt is not None or columns is not None or timeunit is not None:
            raise UsageError("--json prints one document (times in ns); --format, --columns and --timeunit are "
                             "for the rows", hint="drop one of them")
        wanted = out_.parse_columns(columns)
        base_job = _open([base], keep_going=keep_going)
        try:
            new_job = _open([new], keep_going=keep_going)
        except BaseException:
            base_job.close()
            raise
        try:
            comparison = base_job.compare(new_job, sources=(base, new))
        finally:
            base_job.close()
            new_job.close()
        d = document(comparison, **limits)
        if json_:
            out_.write_document(d, out=output)
        else:
            _write_diff_rows(comparison.rows, fmt=fmt_used, output=output, timeunit=timeunit, columns=wanted)
            _say_diff(d)
        _gate(d, strict)
        _exit_partial(base_job, new_job)


# what a diff table shows first: the row's metric and subject, then what changed and what it costs
DIFF_KEYS = ["metric", "key", "delta", "delta_pct", "impact_ns"]


def _write_diff_rows(rows, *, fmt: str, output, timeunit: TimeUnit | None, columns: list[str] | None) -> None:
    """The diff's rows in ``--timeunit``, percentages to the summary's precision; a table leads with
    :data:`DIFF_KEYS` (other formats keep the documented column order)."""
    df = out_.round_percentages(out_.convert_diff_times(rows, timeunit or TimeUnit.ns))
    keys = [r for r in (out_.resolve_column(k, df.columns) for k in DIFF_KEYS) if r is not None]
    if fmt == "table" and columns is None:
        df = df.select(keys + [c for c in df.columns if c not in keys])
    df = out_.select_columns(df, columns)
    out_.write_rows(df, fmt=fmt, out=output, keys=keys, exact=columns is not None)


def _say_diff(d: dict) -> None:
    """The headline and what was missing, on stderr (the rows are on stdout)."""
    from .units import duration

    def change(key: str, what: str) -> str | None:
        v = d.get(key)
        return None if v is None else f"{what} {v:+.1f}%"

    impact = d.get("step_impact_ns")
    parts = [p for p in (change("exposed_comm_change_pct", "exposed communication"),
                         change("wait_change_pct", "wait"), change("busbw_change_pct", "bus bandwidth")) if p]
    head = ("impact on step time: n/a" if impact is None else "impact on step time: none" if impact == 0 else
            f"impact on step time: {'+' if impact > 0 else '-'}{duration(abs(impact))} exposed communication + "
            "idle per step, summed over ranks")
    if d.get("per") == "window":  # not both runs have iterations: nothing is a step-time impact
        impact = d.get("impact_ns")
        head = ("per capture window (not both runs have steps or detected iterations), impact over the matched "
                "work: " +
                ("n/a" if impact is None else "none" if impact == 0 else
                 f"{'+' if impact > 0 else '-'}{duration(abs(impact))} exposed communication, summed over ranks"))
    out_.message(head + (f" ({', '.join(parts)})" if parts else ""))
    for m in d["missing"]:
        out_.message(f"missing: {m}")


def _gate(doc: dict, strict: bool) -> None:
    """The end of a gated command (summary, diff): say each violated or unevaluated threshold on stderr, then
    exit 3 when one is violated, or, with --strict, when one could not be evaluated."""
    for t in doc["thresholds"]:
        if t["ok"] is False:
            out_.message(f"threshold violated: {t['what']} = {t['value']:g}, limit "
                         f"--{t['name'].replace('_', '-')} {t['limit']:g}")
        elif t["ok"] is None:
            out_.message(f"threshold not evaluated: {t['what']} is not available"
                         + (" (--strict: exit 3)" if strict else ""))
    if doc["ok"] is False or (strict and doc["ok"] is None):
        raise typer.Exit(EXIT_THRESHOLD)


# ---------------------------------------------------------------------------------------------------------------
# report


@app.command(cls=_Command)
def report(
    sources: SourcesArg,
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", dir_okay=False, show_default=False,
                                         help="HTML file to write (self-contained, works offline).")],
    png_dir: Annotated[Path | None, typer.Option("--png-dir", metavar="DIR", help="Also write each chart as PNG here.",
                                                    file_okay=False, show_default=False)] = None,
    svg_dir: Annotated[Path | None, typer.Option("--svg-dir", metavar="DIR", help="Also write each chart as SVG here.",
                                                    file_okay=False, show_default=False)] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", metavar="BASE", show_default=False,
        help="An earlier run (job database, or a trace file, directory or quoted glob): adds a 'What changed' "
             "section comparing this job with it (as 'nsys2comm diff BASE ...').")] = None,
    model: ModelOpt = None,
    layout: LayoutOpt = None,
    step: Annotated[int | None, typer.Option(
        "--step", metavar="N", show_default=False,
        help="The step the timeline shows: N of a step marker (ProfilerStep#N, NVTX 'step N'), or the index of a "
             "detected iteration when the trace has no markers (query 'iterations'). Default: the median-length "
             "step.")] = None,
    link_gbps: LinkGbpsOpt = None,
    nic_gbps: NicGbpsOpt = None,
    peak_tflops: PeakTflopsOpt = None,
    scheduler: SchedulerOpt = None,
    dask_local: DaskLocalOpt = None,
    keep_going: KeepGoingOpt = False,
) -> None:
    """Write the self-contained HTML report of a job (charts and tables of the catalog analyses).

    \b
    Example:
      nsys2comm report fixtures/example -o report.html
      nsys2comm report run.duckdb -o report.html --png-dir charts/
      nsys2comm report after.duckdb --baseline before.duckdb -o report.html
      nsys2comm report run.duckdb -o report.html --model layers=24,hidden=2048,seq=2048,micro_batch=4,vocab=50304
    """
    from .model import volume_params

    with _errors():
        volume_params(model, layout)  # usage errors before any work
        base_job = _open([baseline], keep_going=keep_going) if baseline is not None else None
        try:
            job = _open(sources, scheduler=scheduler, dask_local=dask_local, keep_going=keep_going)
            job.set_peaks(link_gbps=link_gbps, nic_gbps=nic_gbps, peak_tflops=peak_tflops)
            path = job.report(output, png_dir=png_dir, svg_dir=svg_dir, baseline=base_job, model=model,
                              layout=layout, step=step)
            job.close()
        finally:
            if base_job is not None:
                base_job.close()
        out_.message(f"wrote {path}")
        _exit_partial(job, base_job)


# ---------------------------------------------------------------------------------------------------------------
# query and sql


@app.command(cls=_Command)
def query(
    sources: SourcesArg,
    name: Annotated[str, typer.Argument(metavar="NAME", show_default=False,
                                        help="Catalog query name (see 'nsys2comm queries list').")],
    param: Annotated[list[str] | None, typer.Option("--param", "-p", metavar="KEY=VALUE",
                                                       help="Parameter of the query (repeatable).",
                                                       show_default=False)] = None,
    step_marker: Annotated[str | None, typer.Option(
        "--step-marker", metavar="NAME", show_default=False,
        help="Name of the NVTX or annotation range that marks one iteration (e.g. train_step; also 'train_step 12'): "
             "the 'marker' parameter of the queries that take one (iterations, rank_iteration_breakdown, "
             "iteration_trend, iteration_critical_path, critical_path_segments, late_arrival_causes, "
             "late_rank_host_ops).")] = None,
    fmt: FormatOpt = None,
    output: OutOpt = None,
    columns: ColumnsOpt = None,
    timeunit: TimeUnitOpt = None,
    relative: RelativeOpt = False,
    link_gbps: LinkGbpsOpt = None,
    nic_gbps: NicGbpsOpt = None,
    peak_tflops: PeakTflopsOpt = None,
    scheduler: SchedulerOpt = None,
    dask_local: DaskLocalOpt = None,
    keep_going: KeepGoingOpt = False,
) -> None:
    """Run a documented catalog query and print its rows.

    \b
    Example:
      nsys2comm query run.duckdb step_timeline -p max_segments=50 --format csv
      nsys2comm query fixtures/example run_overview -o overview.parquet
      nsys2comm query run.duckdb comm_kernels --timeunit us
      nsys2comm query run.duckdb collective_bandwidth -c collective,bucket_lo_bytes,busbw_gbps
      nsys2comm query /shared/job42/ overlap_by_rank --dask-local 4
      nsys2comm query run.nsys-rep iteration_trend --step-marker train_step
    """
    with _errors():
        params = _with_step_marker(name, parse_params(param), step_marker)
        out_.infer_format(fmt, output)  # usage errors before any work
        wanted = out_.parse_columns(columns)
        _check_query(name, params)
        job = _open(sources, scheduler=scheduler, dask_local=dask_local, keep_going=keep_going)
        job.set_peaks(link_gbps=link_gbps, nic_gbps=nic_gbps, peak_tflops=peak_tflops)
        obj = catalog.find(name)
        keys = obj.key_columns if obj else None
        rows = _plain_rows(job, name, params, fmt=fmt, output=output, timeunit=timeunit, relative=relative)
        if not (isinstance(rows, out_.Rows)
                and _write_plain_rows(rows, fmt=fmt, output=output, columns=wanted, keys=keys)):
            df = rows if rows is not None and not isinstance(rows, out_.Rows) else job.query(name, **params)
            _write_rows(job, df, fmt=fmt, output=output, timeunit=timeunit, relative=relative, columns=wanted,
                        keys=keys)
        job.close()
        _exit_partial(job)


def _plain_rows(job: Job, name: str, params: dict, *, fmt, output, timeunit: TimeUnit | None,
                relative: bool) -> out_.Rows | pl.DataFrame | None:
    """The query's rows without polars (``output.Rows``: a fresh process saves its import, 0.15 s idle) where the
    output needs none: no time conversion, a text format, column types the plain writers cover, and at most
    ``output.FAST_ROWS_MAX`` rows; past that, the polars frame of the same execution. None otherwise, and on any
    DuckDB error: ``job.query`` then runs it and says what is wrong, as always."""
    if timeunit is not None or relative or out_.infer_format(fmt, output) == "parquet":
        return None
    import duckdb

    obj, checked = check_query(name, params)  # as analysis.run_query builds the query
    con = settle(job.con)
    try:
        if obj.kind == "view":
            sql = f"SELECT * FROM {obj.name}"
        else:
            sql = f"SELECT * FROM {obj.name}({', '.join(f'{k} := ${k}' for k in checked)})"
        rel = con.sql(sql, params=checked or None)
        return out_.fetch_rows(rel, run=lambda: con.execute(sql, checked or None))
    except duckdb.InterruptException:
        raise
    except duckdb.Error:
        return None


def _write_plain_rows(rows: out_.Rows, *, fmt, output, columns: list[str] | None, keys: list[str] | None) -> bool:
    """``_write_rows`` for :class:`output.Rows` (no time conversion: ``_plain_rows`` takes none); False, having
    written nothing, where ``--columns`` names a column twice (the polars path says how)."""
    rows = rows.round_percentages()
    if keys is None:  # as _write_rows
        obj = next((o for o in catalog.public_queries() if list(o.columns) == rows.columns), None)
        keys = obj.key_columns if obj else None
    shown = [r for r in (out_.resolve_column(k, rows.columns) for k in keys or []) if r is not None]
    if columns is not None:
        picked = [r for r in (out_.resolve_column(c, rows.columns) for c in columns) if r is not None]
        if len(set(picked)) != len(picked):
            return False
    rows = out_.select_columns(rows, columns)
    out_.write_rows(rows, fmt=fmt, out=output, keys=shown or None, exact=columns is not None, note=None)
    return True


def _with_step_marker(name: str, params: dict, marker: str | None) -> dict:
    """``params`` with ``--step-marker`` as the query's 'marker' parameter; a usage error where it takes none."""
    if marker is None:
        return params
    obj = catalog.find(name)
    if obj is None:
        return params  # _check_query names the unknown query
    if "marker" not in obj.params:
        takers = ", ".join(o.name for o in catalog.load_catalog() if o.public and "marker" in o.params)
        raise UsageError(f"{name} takes no step marker", hint=f"queries that do: {takers}")
    if "marker" in params and params["marker"] != marker:
        raise UsageError("--step-marker and -p marker= disagree", hint="give one of them")
    return {**params, "marker": marker}


def _check_query(name: str, params: dict) -> None:
    """The API's usage errors, with the commands that help."""
    try:
        check_query(name, params)
    except UnknownQuery as e:
        e.hint = (e.hint + " " if e.hint else "") + "see 'nsys2comm queries list'"
        raise
    except HelperNotRunnable as e:
        e.hint += f" with 'nsys2comm sql'; see 'nsys2comm queries show {e.name}'"
        raise


def _write_rows(job: Job, df, *, fmt, output, timeunit: TimeUnit | None, relative: bool,
                columns: list[str] | None = None, keys: list[str] | None = None) -> None:
    """Rows through the one time rule (``nsys2comm.output``: units, timestamps from the job start, percentages to
    the summary's precision), then ``--columns`` or the key columns for a narrow table."""
    names = list(df.columns)
    origin = None
    if timeunit is not None or relative:
        origin = job_start_ns(job.con) if out_.shifts_timestamps(timeunit, relative) else None
        df = out_.convert_times(df, timeunit or TimeUnit.ns, relative=relative, origin_ns=origin)
    df = out_.round_percentages(out_.exact_integers(df))
    if keys is None:  # SELECT * FROM a catalog view through 'sql': that object's key columns
        obj = next((o for o in catalog.public_queries() if list(o.columns) == names), None)
        keys = obj.key_columns if obj else None
    shown = [r for r in (out_.resolve_column(k, df.columns) for k in keys or []) if r is not None]
    df = out_.select_columns(df, columns)
    note = out_.time_note(list(df.columns), timeunit, relative, origin)
    out_.write_rows(df, fmt=fmt, out=output, keys=shown or None, exact=columns is not None, note=note)


@app.command(cls=_Command)
def sql(
    source: Annotated[str, typer.Argument(metavar="DB_OR_TRACES", show_default=False,
                                          help="A job database, or a trace file, directory or quoted glob.")],
    text: Annotated[str | None, typer.Argument(metavar="SQL", show_default=False,
                                                  help="SQL statements; '-' or nothing reads them from stdin.")] = None,
    write: Annotated[bool, typer.Option("--write", help="Allow statements that change the database.")] = False,
    fmt: FormatOpt = None,
    output: OutOpt = None,
    columns: ColumnsOpt = None,
    timeunit: TimeUnitOpt = None,
    relative: RelativeOpt = False,
    lock_timeout: LockOpt = 60.0,
    link_gbps: LinkGbpsOpt = None,
    nic_gbps: NicGbpsOpt = None,
    peak_tflops: PeakTflopsOpt = None,
    keep_going: KeepGoingOpt = False,
) -> None:
    """Run SQL on a job database; prints the rows of the last statement. Read-only unless --write.

    Every catalog view and macro can be used; 'nsys2comm schema' lists tables and columns.

    \b
    Example:
      nsys2comm sql run.duckdb "SELECT collective, count(*) AS n FROM comm_ops GROUP BY ALL"
      echo "SELECT * FROM ranks" | nsys2comm sql run.duckdb - --format json
    """
    with _errors():
        out_.infer_format(fmt, output)
        wanted = out_.parse_columns(columns)
        if text is None or text == "-":
            if text is None and hasattr(sys.stdin, "isatty") and sys.stdin.isatty():
                raise UsageError("no SQL given", hint='pass it as an argument, or "-" to read it from stdin')
            text = sys.stdin.read()
        job = _open([source], write=write, lock_timeout=lock_timeout, keep_going=keep_going)
        job.set_peaks(link_gbps=link_gbps, nic_gbps=nic_gbps, peak_tflops=peak_tflops)
        try:
            df = job.sql(text, write=write)
        except InputError as e:
            if "read-only" in e.what:  # the API says how to open for writing; here that is --write
                e.hint = "add --write to change it" + (", or use CREATE TEMP for scratch objects"
                                                       if "CREATE TEMP" in (e.hint or "") else "")
            raise
        if write:
            _refresh_after_write(job)
        if df.width:
            _write_rows(job, df, fmt=fmt, output=output, timeunit=timeunit, relative=relative, columns=wanted)
        job.close()
        _exit_partial(job)


def _refresh_after_write(job: Job) -> None:
    """Recompute the stored sweeps after --write edits (a no-op when the data did not change). A cache that
    cannot be refreshed is dropped; either way no later session reads sweeps of the old data."""
    import duckdb

    from .storage import drop_cache, refresh_cache

    try:
        refresh_cache(settle(job.con))
    except duckdb.Error:
        with contextlib.suppress(duckdb.Error):  # the content key still keeps readers off it
            drop_cache(job.con)


# ---------------------------------------------------------------------------------------------------------------
# catalog and schema


def _first_line(s: str) -> str:
    """First sentence of a description (the one-line description of 'queries list')."""
    para = (s or "").strip().split("\n\n")[0].replace("\n", " ").strip()
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return m.group(1) if m else para


def catalog_rows():
    """Rows of 'queries list' (also used by the README generator)."""
    import polars as pl

    objs = catalog.public_queries()
    return pl.DataFrame({"name": [o.name for o in objs], "area": [o.area for o in objs],
                         "description": [_first_line(o.description) for o in objs]},
                        schema={"name": pl.String, "area": pl.String, "description": pl.String})


@queries_app.command("list", cls=_Command)
def queries_list(fmt: FormatOpt = None, output: OutOpt = None, columns: ColumnsOpt = None) -> None:
    """List the catalog's queries: name, area, one-line description (wrapped to the terminal).

    \b
    Example:
      nsys2comm queries list
      nsys2comm queries list --format markdown
      nsys2comm queries list -c name,description
    """
    with _errors():
        wanted = out_.parse_columns(columns)
        out_.write_rows(out_.select_columns(catalog_rows(), wanted), fmt=fmt, out=output,
                        keys=["name", "area", "description"], exact=wanted is not None)


@queries_app.command("show", cls=_Command)
def queries_show(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Catalog name (see 'nsys2comm queries list').",
                                        show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help="As a JSON document.")] = False,
) -> None:
    """Show one catalog object: description, parameters, columns with their docs, and its SQL.

    \b
    Example:
      nsys2comm queries show step_timeline
    """
    with _errors():
        obj = catalog.find(name)
        if obj is None:
            names = [o.name for o in catalog.load_catalog() if o.public]
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
            raise UsageError(f"no catalog object named {name!r}",
                             hint=(f"did you mean {' or '.join(close)}? " if close else "")
                             + "see 'nsys2comm queries list'")
        if json_:
            out_.write_document({"name": obj.name, "kind": obj.kind, "area": obj.area,
                                 "file": f"{obj.path.parent.name}/{obj.path.name}", "description": obj.description,
                                 "params": obj.params, "columns": obj.columns, "key_columns": obj.key_columns,
                                 "sql": obj.sql})
            return
        lines = [f"{obj.name} ({obj.kind}{', table macro' if obj.is_table_macro else ''}; "
                 f"queries/{obj.path.parent.name}/{obj.path.name})", "", obj.description, ""]
        if obj.params:
            lines.append("Parameters:")
            lines += [f"  {k}: {v}" for k, v in obj.params.items()]
            lines.append("")
        if obj.columns:
            lines.append("Columns:")
            lines += [f"  {k}{' [key]' if k in obj.key_columns else ''}: {v}" for k, v in obj.columns.items()]
            lines.append("")
        lines += ["SQL:", obj.sql]
        out_.text("\n".join(lines))


@app.command(cls=_Command)
def doctor(
    directory: Annotated[str, typer.Argument(metavar="DIR", help="A Parquet job directory (ingest --out).")],
    fix: Annotated[bool, typer.Option("--fix", help="Remove what no reader sees: dead writers' temp files, orphan "
                                                    "parts and claims. Rank conflicts are only listed.")] = False,
    fmt: FormatOpt = None,
    output: OutOpt = None,
) -> None:
    """Check a Parquet job directory: ranks claimed by two traces, dead writers' temp files and orphan parts.

    Exit code 0 when nothing is left to do, 1 when a finding remains (a rank conflict, or anything without --fix).

    \b
    Example:
      nsys2comm doctor job/ --fix
    """
    with _errors():
        df = api_doctor(directory, fix=fix)
        if df.height:
            out_.write_rows(df, fmt=fmt, out=output)
        else:
            out_.message(f"{printable(directory)}: no problems found")
        if df.filter(df["action"] != "removed").height:
            raise typer.Exit(EXIT_INPUT)


@app.command(cls=_Command)
def schema(
    source: Annotated[str | None, typer.Argument(metavar="DB", show_default=False,
                                                    help="A job database: adds column types and the DB's own "
                                                         "COMMENT ON docs.")] = None,
    fmt: FormatOpt = None,
    output: OutOpt = None,
    columns: ColumnsOpt = None,
) -> None:
    """Tables, views and columns of the canonical schema with their docs (from queries/, or from a database).

    \b
    Example:
      nsys2comm schema
      nsys2comm schema run.duckdb --format markdown
      nsys2comm schema -c object,column,doc
    """
    import polars as pl

    with _errors():
        wanted = out_.parse_columns(columns)
        if source is None:
            rows = []
            for o in catalog.load_catalog():
                if not o.public or o.area == "prelude" and o.kind == "macro" or (o.kind == "macro" and not o.has_view):
                    continue  # scalar rules and parameterised macros: see 'nsys2comm queries list'
                kind = "view" if o.has_view else o.kind  # an argument-free analysis is a view in every job DB
                rows.append({"object": o.name, "kind": kind, "column": None, "doc": _first_line(o.description)})
                rows += [{"object": o.name, "kind": kind, "column": c, "doc": d} for c, d in o.columns.items()]
            df = pl.DataFrame(rows, schema={"object": pl.String, "kind": pl.String, "column": pl.String,
                                            "doc": pl.String})
        else:
            job = _open([source])
            df = job.query("schema_objects")
            job.close()
        keys = catalog.find("schema_objects").key_columns  # type: ignore[union-attr]
        out_.write_rows(out_.select_columns(df, wanted), fmt=fmt, out=output, keys=keys, exact=wanted is not None)


# ---------------------------------------------------------------------------------------------------------------
# export

export_app = _sub_app("Write the job in a format other tools open.\n\n\b\nExample:\n"
                      "  nsys2comm export perfetto fixtures/example -o job.json.gz")
app.add_typer(export_app, name="export")


@export_app.command("perfetto", cls=_Command)
def export_perfetto(
    sources: SourcesArg,
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", dir_okay=False, show_default=False,
                                         help="Trace file to write: .json, or .json.gz (gzip).")],
    keep_going: KeepGoingOpt = False,
) -> None:
    """Write the whole job as one Chrome Trace Event Format file for ui.perfetto.dev or chrome://tracing.

    One process per rank ("rank N (host)") on the aligned job timeline (host clock offsets removed, times from
    the earliest kernel); a thread per stream with its kernels (category: kernel class; communication kernels
    carry collective, msg_bytes, group, seq and instance); flow arrows from the earliest-arriving rank's kernel
    of each matched collective instance to the other ranks'; per stream with communication, an "exposed
    communication" track (slices named by their exposure causes) and an "arrival wait" track (time waited for
    the last-arriving rank).

    \b
    Example:
      nsys2comm export perfetto run.duckdb -o job.json.gz
      nsys2comm export perfetto traces/ -o job.json --keep-going
    """
    from .export_perfetto import export_perfetto as write

    with _errors():
        if not output.name.endswith((".json", ".json.gz")):
            raise UsageError(f"{printable(str(output))}: the trace file must end .json or .json.gz",
                             hint="e.g. -o job.json.gz")
        job = _open(sources, keep_going=keep_going)
        counts = write(job.con, output)
        job.close()
        out_.message(f"wrote {output} ({counts['kernels']} kernels, {counts['flows'] // 2} flow arrows, "
                     f"{counts['exposure']} exposure and wait slices)")
        _exit_partial(job)


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (Slurm's time limit) unwinds like Ctrl-C: transactions roll back, worker processes are killed and
    spools removed on the way out. A second SIGTERM kills at once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(128 + signum)


# `nsys2comm query DB NAME [-f FORMAT] [-o FILE] [-p K=V]... [-c COLS] [--step-marker NAME]` is parsed here, without
# typer's parse (its pydantic coercion of every parameter costs a fresh process ~0.12 s idle, more than the query
# itself on most jobs); anything else, or anything this parser is not sure of, goes to typer, whose parse gives the
# same values (tests/test_output_cli_parse.py compares the two).
_PLAIN_QUERY_OPTS = {"-f": "fmt", "--format": "fmt", "-o": "output", "--output": "output", "-p": "param",
                     "--param": "param", "-c": "columns", "--columns": "columns", "--step-marker": "step_marker"}


def plain_query_args(argv: list[str]) -> dict | None:
    """``query``'s arguments from ``argv`` (after the program name) where they are plain, else None (typer)."""
    if len(argv) < 3 or argv[0] != "query" or "_NSYS2COMM_COMPLETE" in os.environ:
        return None
    kw: dict = {"param": []}
    positional: list[str] = []
    tokens = iter(argv[1:])
    for tok in tokens:
        if not tok.startswith("-"):
            positional.append(tok)
            continue
        opt, eq, value = tok.partition("=")
        dest = _PLAIN_QUERY_OPTS.get(opt)
        if dest is None or (eq and not opt.startswith("--")):
            return None
        if not eq:
            value = next(tokens, None)
        if value is None or value.startswith("-") or (dest in kw and dest != "param"):
            return None  # a value that looks like an option, or one given twice: typer's rules
        if dest == "param":
            kw["param"].append(value)
        else:
            kw[dest] = value
    return _plain_query_values(positional, kw)


def _plain_query_values(positional: list[str], kw: dict) -> dict | None:
    """The values typer would give ``query`` (FORMAT as the enum, FILE as a Path), or None where typer would
    refuse them (it says why)."""
    if len(positional) < 2:
        return None
    if "fmt" in kw:
        fmt = kw["fmt"]
        if not fmt.isascii() or fmt.lower() not in out_.FORMATS:
            return None
        kw["fmt"] = Format(fmt.lower())
    if "output" in kw:
        if os.path.exists(kw["output"]) and not (os.path.isfile(kw["output"]) and os.access(kw["output"], os.R_OK)):
            return None
        kw["output"] = Path(kw["output"])
    return {"sources": positional[:-1], "name": positional[-1], "param": kw["param"] or None,
            **{k: v for k, v in kw.items() if k != "param"}}


def main() -> None:
    """Console-script entry point."""
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        signal.signal(signal.SIGTERM, _on_sigterm)
    args = plain_query_args(sys.argv[1:])
    if args is not None:
        _state["debug"] = os.environ.get("NSYS2COMM_DEBUG", "") not in ("", "0")  # as the app's callback
        try:
            query(**args)
        except typer.Exit as e:
            sys.exit(e.exit_code)
        sys.exit(EXIT_OK)
    app(prog_name="nsys2comm")


if __name__ == "__main__":
    main()
