"""One results layer for every consumer (summary, diff, report, Job): run a batch of catalog queries, each once, with
the shared sweeps snapshotted for the batch; narrow each frame to the documented columns the consumer declares;
keep what failed or is not available as data, in one format.

A consumer declares ``{catalog object: columns it reads}`` (``summary.COLUMNS``, ``compare.COLUMNS``,
``report.data.CONSUMERS``); a frame never carries a column it did not declare, so reading an undeclared one fails
where it is written. A failing query never raises: ``Results.errors[name]`` holds one line,
``"analysis 'NAME' failed: FIRST LINE OF THE ERROR"`` (:func:`failure`) or ``"not available: WHY"`` (``drop``).
Why a number is not available comes from the catalog's ``diagnostics`` and ``run_overview`` columns, never from
counts taken here. ``Job.query`` is a batch of one (:func:`run_one`, no snapshot to pay for) that raises what the
query raised (``Results.raised``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import polars as pl

from .analysis import run_query
from .storage import settle, snapshotted

NOT_AVAILABLE = "not available: "


def failed_line(name: str, why: str) -> str:
    """The one text of a failed analysis: ``analysis 'NAME' failed: WHY``."""
    return f"analysis '{name}' failed: {why}"


def failure(name: str, e: BaseException) -> str:
    """:func:`failed_line` for an exception: its first line (its type's name when it says nothing)."""
    text = str(e).strip()
    return failed_line(name, text.splitlines()[0] if text else type(e).__name__)


@dataclass(frozen=True)
class Request:
    """One catalog query of a batch: its name and parameters."""

    name: str
    params: dict = field(default_factory=dict)


@dataclass
class Results:
    """Query results by catalog name, and why the ones that failed or are not available are missing."""

    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    # what holds for the whole job (no communication, no message sizes, one rank): (diagnostics code, sentence),
    # said once in the report's banner; the sections then give their own one-line reason
    banner: list[tuple[str, str]] = field(default_factory=list)
    # the exception behind each failure line, for a caller that raises rather than reports (Job.query)
    raised: dict[str, BaseException] = field(default_factory=dict, repr=False)

    def get(self, name: str) -> pl.DataFrame | None:
        """The frame when it has rows, else None."""
        df = self.frames.get(name)
        return df if df is not None and df.height else None

    def frame(self, name: str) -> pl.DataFrame | None:
        """The frame, empty or not; None when the query failed or was not run."""
        return self.frames.get(name)

    def why(self, name: str) -> str | None:
        """Why ``name`` is missing, without the "analysis 'NAME' failed: " or "not available: " prefix."""
        text = self.errors.get(name)
        return None if text is None else text.removeprefix(failed_line(name, "")).removeprefix(NOT_AVAILABLE)

    def raise_failure(self, name: str) -> None:
        """Raise the exception behind ``name``'s failure line (its own type and message), if it failed."""
        if name in self.raised:
            raise self.raised[name]

    def drop(self, name: str, why: str) -> None:
        """Record that ``name``'s result is not available, and why."""
        self.frames.pop(name, None)
        self.errors.setdefault(name, NOT_AVAILABLE + why)


# what a whole job lacks (a fact a number needs), read from the catalog's diagnostics: the job-wide codes (rank
# NULL) that deny it, and the one sentence every consumer says for it
GAPS: dict[str, tuple[tuple[str, ...], str]] = {
    "comm": (("no_traces", "no_kernels", "no_comm_kernels"), "the job has no communication kernels"),
    "two_ranks": (("no_traces", "single_rank"), "cross-rank skew needs at least two ranks; the job has fewer"),
    "sizes": (("no_sized_comm",), "no collective has a known message size"),
}
GAP_COLUMNS = ("code", "rank")  # the diagnostics columns gap() reads


def gap(res: Results, fact: str) -> str | None:
    """Why the job lacks ``fact`` (a key of :data:`GAPS`), from the batch's ``diagnostics`` frame; None when the
    fact holds, or when diagnostics did not run (its own failure is said where it is read)."""
    diag = res.frame("diagnostics")
    codes, why = GAPS[fact]
    if diag is None:
        return None
    job = diag.filter(pl.col("rank").is_null() & pl.col("code").is_in(list(codes)))
    return why if job.height else None


def _request(q) -> Request:
    if isinstance(q, str):
        return Request(q)
    return Request(q.name, dict(getattr(q, "params", {}) or {}))


def run_one(con, q, out: Results, columns: Mapping[str, Iterable[str]] | None = None) -> None:
    """Run one query into ``out`` (narrowed to ``columns[name]`` when declared); a failure is recorded."""
    r = _request(q)
    try:
        df = run_query(settle(con), r.name, r.params)
        if columns is not None and r.name in columns:
            df = df.select(list(dict.fromkeys(columns[r.name])))
        out.frames[r.name] = df
    except Exception as e:  # noqa: BLE001 - one failing analysis must not sink the others
        out.errors[r.name] = failure(r.name, e)
        out.raised[r.name] = e
    finally:
        settle(con)


def run_batch(con, queries: Iterable, columns: Mapping[str, Iterable[str]] | None = None,
              more: Callable[[Results], Iterable] | None = None) -> Results:
    """Run ``queries`` (names, :class:`Request` or anything with ``name`` and ``params``) once each, the shared
    sweeps snapshotted for the batch; ``columns``: the declared columns per object (others are dropped);
    ``more(results)``, given the results so far, names further queries of the same batch."""
    out = Results()
    with snapshotted(con):
        for q in queries:
            run_one(con, q, out, columns)
        for q in more(out) if more is not None else []:
            run_one(con, q, out, columns)
    return out


def declared(consumers: Mapping[str, Mapping[str, Iterable[str]]]) -> dict[str, tuple[str, ...]]:
    """The union of the columns several consumers declare, per catalog object (in first-declared order)."""
    out: dict[str, dict[str, None]] = {}
    for objects in consumers.values():
        for name, cols in objects.items():
            out.setdefault(name, {}).update(dict.fromkeys(cols))
    return {name: tuple(cols) for name, cols in out.items()}
