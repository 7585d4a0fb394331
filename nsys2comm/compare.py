"""Comparing two runs of a job (``nsys2comm diff BASE NEW``): what changed in communication, per step or per
capture window.

Every figure of a diff is catalog SQL (``queries/diff/diff.sql``: ``diff_basis``, ``diff_rows``,
``diff_headline``, ``diff_matched_work``, ``diff_busbw_change``, their definitions and the sort rule). This module
only moves data and words: :func:`read_side` runs the catalog objects named in :data:`COLUMNS` on each run (the
documented columns only), :func:`compare_sides` registers both runs' frames as ``<prefix>_<object>`` in a
connection that holds the catalog and runs the diff macros on them, and :func:`document` formats the result.

**Basis** (``diff_basis``). Each run's iterations come from ``iterations``: step markers, else the repeating
communication and GEMM kernel sequence ('detected'), else the whole capture. When both runs have iterations the
diff is per step (a detected iteration counts as a step, and the document says which source each run used);
otherwise it is per capture window: every total is the window's, its metric named ``*_per_window``, and the
``*_per_op`` rows and the impact compare the work both windows hold.

**Rows** (``diff_rows``, in the order of ``diff_metrics`` within a subject). Each row has ``section``, ``metric``,
a readable ``key``, ``base``, ``new``, ``delta`` = new − base, ``delta_pct`` = 100 × delta / base, ``impact_ns``
and the key columns ``collective``, ``group_size``, ``bucket_lo_bytes``, ``bucket_hi_bytes``, ``rank`` (NULL where
they do not apply). A value that cannot be computed is NULL, never 0, and so are ``delta`` and ``delta_pct``;
``delta_pct`` is also NULL when base is 0. A row present on one side only appears with the other side NULL.
``impact_ns`` is the change in the exposed communication or idle time that the row's own metric measures (per step;
on the window basis over the matched work), NULL on rows whose metric is a cause rather than such a time (counts,
sizes, bandwidth, waits, skew, the latency model). Rows are sorted by |impact_ns| descending, NULL last.

The JSON document (``nsys2comm diff --json``, :func:`document`; ``schema_version`` 1, new keys may be added,
existing keys keep their meaning and unit; times in ns: ``--timeunit`` is for the rows,
:func:`nsys2comm.output.convert_diff_times`):

=======================  ======================================================================================
key                      meaning
=======================  ======================================================================================
schema_version           1
nsys2comm_version        package version that wrote it
base, new                {source, ranks, steps, has_steps, iteration_source}: what each side is; has_steps false:
                         no iterations (steps 1), and the diff is per capture window; iteration_source 'marker',
                         'detected' or 'whole_capture' (diff_basis)
step_impact_ns           change in exposed communication + idle ns per step, summed over ranks; null on the window
                         basis
exposed_comm_change_pct  per step, delta_pct of job exposed_comm_ns_per_step; per window, the change in exposed
                         communication over the matched work, % of the base's exposed ns over that work
wait_change_pct          delta_pct of job wait_ns_per_step per step; per window, of job wait_ns_per_op
busbw_change_pct         bus bandwidth change, %: the mean of busbw_gbps delta_pct over the (collective, group size,
                         size bucket) rows known on both sides, weighted by the base's kernel time in the bucket
per                      'step' (both runs have iterations) or 'window' (per capture window, normalised by matched
                         work)
impact_ns                step_impact_ns, or on the window basis the change over the matched work
rows                     [{section, metric, key, base, new, delta, delta_pct, impact_ns, collective, group_size,
                         bucket_lo_bytes, bucket_hi_bytes, rank}]: the rows above, in their order
missing                  [str] what could not be compared and why ("KEY: not available (why)"), and each side's
                         notes ("base: ...", "new: ...")
thresholds               [{name, metric, limit, value, ok, what}] (:func:`check_thresholds`); ok is null when the
                         metric is not available (the threshold was not evaluated)
ok                       false when a threshold is violated, null when none is but one was not evaluated, true
                         when every threshold was evaluated and held
=======================  ======================================================================================

Floats in the document have 6 significant digits, or whole units where that is coarser (ns values of 1e6 and
more keep every integer digit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from . import __version__
from .results import failed_line, run_batch
from .storage import settle
from .units import JSON_DIGITS, round_floats, size

SCHEMA_VERSION = 1
DIGITS = JSON_DIGITS

# the documented catalog columns each side contributes (tests check them against the catalog), registered as
# <prefix>_<object> for the macros of queries/diff/diff.sql
COLUMNS: dict[str, tuple[str, ...]] = {
    "overlap_by_step": ("rank", "step_ord", "busy_ns", "idle_ns", "comm_ns", "comm_overlapped_ns", "exposed_comm_ns"),
    "overlap_by_rank": ("rank", "busy_ns", "idle_ns", "comm_ns", "comm_overlapped_ns", "exposed_comm_ns"),
    "msg_size_histogram": ("collective", "bucket_lo_bytes", "bucket_hi_bytes", "ops", "total_bytes", "total_ns"),
    "msg_size_exposure": ("collective", "bucket_lo_bytes", "exposed_ns"),
    "collective_bandwidth": ("collective", "group_size", "group_size_assumed", "bucket_lo_bytes", "bucket_hi_bytes",
                             "total_ns", "busbw_gbps", "bandwidth_check"),
    "rank_wait": ("rank", "total_wait_ns", "arrived_last_pct", "straggler_rank_order", "is_straggler"),
    "collective_skew": ("collective", "start_skew_ns"),
    "latency_model": ("collective", "group_size", "latency_floor_ns", "transfer_p50_ns", "alpha_us", "beta_gbps",
                      "n_half_bytes", "latency_bound_pct"),
    "latency_bound_total": ("latency_bound_pct", "coalescing_saving_ns"),
    "iterations": ("rank", "iteration", "iteration_source", "rank_iterations", "ranks_agree"),
}
# a side whose GPU time or exposure analysis failed: a time missing there is unknown, not 0 (diff_rows)
_TIME_QUERIES = {"overlap_by_rank", "msg_size_exposure"}
PREFIX = {"base": "_diff_base", "new": "_diff_new"}
_TEXT = {"collective", "iteration_source"}
_BOOL = {"group_size_assumed", "is_straggler", "ranks_agree"}
_FLOAT_SUFFIX = ("_pct", "_gbps", "_us")
ROW_COLUMNS = ["section", "metric", "key", "base", "new", "delta", "delta_pct", "impact_ns", "collective",
               "group_size", "bucket_lo_bytes", "bucket_hi_bytes", "rank"]
HEADLINE = ("step_impact_ns", "exposed_comm_change_pct", "wait_change_pct", "busbw_change_pct", "per", "impact_ns")


@dataclass
class Side:
    """One run's catalog frames, as the diff reads them."""

    source: str
    frames: dict[str, pl.DataFrame]
    failed: dict[str, str] = field(default_factory=dict)  # query -> why it failed (results.Results.why)
    ranks: int = 0


@dataclass
class Comparison:
    """The rows of a diff and what the document says beside them."""

    rows: pl.DataFrame
    base: dict[str, Any]
    new: dict[str, Any]
    headline: dict[str, Any]
    missing: list[str]


def _dtype(col: str) -> pl.DataType:
    if col in _TEXT:
        return pl.String()
    if col in _BOOL:
        return pl.Boolean()
    return pl.Float64() if col.endswith(_FLOAT_SUFFIX) else pl.Int64()


def _empty(cols: tuple[str, ...]) -> pl.DataFrame:
    return pl.DataFrame(schema={c: _dtype(c) for c in cols})


def read_side(con, source: str) -> Side:
    """Run the catalog queries the diff needs on one job, one batch of the results layer narrowed to
    :data:`COLUMNS`; a failed query leaves an empty frame and its reason (results' one format)."""
    side = Side(source, {})
    side.ranks = settle(con).execute("SELECT count(*) FROM ranks").fetchone()[0]
    got = run_batch(con, list(COLUMNS), COLUMNS)
    for name, cols in COLUMNS.items():
        side.frames[name] = got.frames.get(name, _empty(cols))
    side.failed = {name: got.why(name) or "" for name in got.errors}
    return side


def _key(r: dict) -> str:
    """A readable key: 'job', 'rank 3', 'all_reduce 1 MiB–2 MiB (8 ranks)', 'all_reduce size unknown'."""
    if r["section"] == "job":
        return "job"
    if r["rank"] is not None:
        return f"rank {r['rank']}"
    parts = [r["collective"] or "?"]
    if r["section"] == "collective":
        lo, hi = r["bucket_lo_bytes"], r["bucket_hi_bytes"]
        parts.append("size unknown" if lo is None else f"{size(lo)}–{size(hi)}")
    if r["group_size"] is not None:
        parts.append(f"({r['group_size']} ranks)")
    return " ".join(parts)


def _fetch(con, sql: str, params: list) -> pl.DataFrame:
    return settle(con).sql(sql, params=params).pl()


def compare_sides(base: Side, new: Side, con) -> Comparison:
    """Register two sides' frames in ``con`` (a connection holding the catalog, e.g. the base job's) as
    ``<prefix>_<object>`` and run the diff macros of ``queries/diff/diff.sql`` on them."""
    sides = (("base", base), ("new", new))
    registered = []
    # a side whose GPU time or exposure analysis failed: a time missing there is unknown, not 0
    complete = [not (_TIME_QUERIES & set(side.failed)) for _, side in sides]
    args = [PREFIX["base"], PREFIX["new"], *complete]
    try:
        for tag, side in sides:
            for name, df in side.frames.items():
                con.register(f"{PREFIX[tag]}_{name}", df)
                registered.append(f"{PREFIX[tag]}_{name}")
        basis = {r["side"]: r for r in _fetch(con, "FROM diff_basis(?, ?)", args[:2]).iter_rows(named=True)}
        rows = _fetch(con, "FROM diff_rows(?, ?, base_complete := ?, new_complete := ?)", args)
        head = _fetch(con, "FROM diff_headline(?, ?, base_complete := ?, new_complete := ?)", args).row(0, named=True)
        work = _fetch(con, "FROM diff_matched_work(?, ?) WHERE base_ops IS DISTINCT FROM new_ops", args[:2])
    finally:
        for name in registered:
            settle(con).unregister(name)
    keys = [_key(r) for r in rows.select("section", "rank", "collective", "bucket_lo_bytes", "bucket_hi_bytes",
                                         "group_size").iter_rows(named=True)]
    rows = rows.with_columns(pl.Series("key", keys, dtype=pl.String)).select(ROW_COLUMNS)
    info = {tag: {"source": side.source, "ranks": side.ranks, "steps": basis[tag]["steps"],
                  "has_steps": basis[tag]["has_steps"], "iteration_source": basis[tag]["iteration_source"]}
            for tag, side in sides}
    headline = {k: head[k] for k in HEADLINE}
    missing = _missing(base, new, basis, rows, head, work)
    return Comparison(rows, info["base"], info["new"], headline, missing)


def _iteration_note(tag: str, b: dict) -> str | None:
    """What a side's steps are, when they are not its step markers."""
    if b["iteration_source"] == "detected":
        note = (f"{tag}: no step markers; a step is an iteration detected from the repeating kernel sequence or, "
                f"where that order varies, the repeating set of collectives (iterations: {b['steps']} on the rank "
                "with the most)")
        return note + ("; the ranks found different numbers of iterations" if b["ranks_agree"] is False else "")
    if b["iteration_source"] == "whole_capture":
        return f"{tag}: no steps (no step markers, and no repeating kernel sequence or set of collectives was detected)"
    return None


def _missing(base: Side, new: Side, basis: dict, rows: pl.DataFrame, head: dict, work: pl.DataFrame) -> list[str]:
    out: list[str] = []
    per = head["per"]
    for tag, side in (("base", base), ("new", new)):
        note = _iteration_note(tag, basis[tag])
        out += [note] if note else []
        out += [f"{tag}: {failed_line(q, why)}" for q, why in side.failed.items()]
    if per == "window":
        out.append("per capture window: the runs do not both have iterations (step markers or a detected repeating "
                   "kernel pattern), so no figure is per step or a step-time impact; impact_ns is the change in "
                   "exposed communication over the matched work (per (collective, size bucket): operations found in "
                   "both runs × the change in exposed ns per operation; see the *_per_op rows)")
        if work.height:
            what = "; ".join(f"{c} {'size unknown' if lo is None else size(lo) + '+'}: base "
                             f"{0 if b is None else int(b)}, new {0 if n is None else int(n)}"
                             for c, lo, b, n in work.select("collective", "bucket_lo_bytes", "base_ops", "new_ops"
                                                            ).iter_rows())
            out.append(f"the capture windows hold different work (operations, all ranks: {what}): *_per_window "
                       "totals compare different work")
    if base.ranks != new.ranks:
        out.append(f"the runs have different ranks (base {base.ranks}, new {new.ranks}): per-rank rows of a rank "
                   "seen on one side only have the other side NULL")
    if head["exposed_comm_change_pct"] is None:
        out.append("exposed_comm_change_pct: not available (" + (
            "no collective size bucket is found in both runs with its exposed time" if per == "window" else
            "the base has no exposed communication: a relative change is undefined"
            if head["impact_ns"] is not None else "exposed communication is not known on both runs "
            "(it needs GPU kernels)") + ")")
    wait_metric = "wait_ns_per_step" if per == "step" else "wait_ns_per_op"
    wait = rows.filter((pl.col("section") == "job") & (pl.col("metric") == wait_metric))
    if head["wait_change_pct"] is None:
        w = wait.row(0, named=True) if wait.height else {}
        unknown = [tag for tag in ("base", "new") if w.get(tag) is None]
        out.append("wait_change_pct: not available (" + (
            "the base has no wait at collectives: a relative change is undefined" if not unknown else
            f"wait at collectives is not known on the {' and '.join(unknown)} run (waits need a collective matched "
            "on two or more ranks)") + ")")
    if not head["busbw_buckets"]:
        out.append("busbw_change_pct: not available (no collective size bucket has a bus bandwidth on both sides; "
                   "bus bandwidth needs message and group sizes)")
    return out


def compare(base_con, new_con, *, base_source: str = "base", new_source: str = "new") -> Comparison:
    """Compare the job in ``new_con`` with the one in ``base_con`` (open job databases); the diff's SQL runs in
    ``base_con``, on both sides' frames."""
    return compare_sides(read_side(base_con, base_source), read_side(new_con, new_source), base_con)


# ---------------------------------------------------------------------------------------------------------------
# the JSON document and its thresholds

THRESHOLDS = {
    # option name: (document key, sign, readable name); violated when sign × value > limit
    "max_exposed_regression_pct": ("exposed_comm_change_pct", 1, "exposed communication per step, change (%)"),
    "max_wait_regression_pct": ("wait_change_pct", 1, "wait at collectives per step, change (%)"),
    "max_busbw_drop_pct": ("busbw_change_pct", -1, "bus bandwidth drop (%, time-weighted over size buckets)"),
}


def document(c: Comparison, **limits: float | None) -> dict[str, Any]:
    """The ``diff --json`` document (keys in the module docstring), thresholds checked."""
    d: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "nsys2comm_version": __version__,
                         "base": dict(c.base), "new": dict(c.new), **c.headline,
                         "rows": c.rows.rows(named=True), "missing": list(c.missing), "thresholds": [], "ok": True}
    check_thresholds(d, **limits)
    return round_floats(d, DIGITS)  # the rule of every JSON output (units.round_floats)


def check_thresholds(d: dict, **limits: float | None) -> dict:
    """Fill ``thresholds`` and ``ok`` (as :func:`nsys2comm.summary.check_thresholds`): a metric that is not
    available is not evaluated (ok null), and then ``ok`` is null unless another threshold is violated."""
    results = []
    for opt, limit in limits.items():
        if limit is None:
            continue
        key, sign, what = THRESHOLDS[opt]
        raw = d.get(key)
        value = None if raw is None else sign * raw
        ok = None if value is None else value <= limit
        results.append({"name": opt, "metric": key, "limit": limit, "value": value, "ok": ok, "what": what})
    d["thresholds"] = results
    oks = [r["ok"] for r in results]
    d["ok"] = False if False in oks else (None if None in oks else True)
    return d
