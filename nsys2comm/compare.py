"""Comparing two runs of a job (``nsys2comm diff BASE NEW``): what changed in communication, per step or per
capture window.

Each side is a job database (or traces ingested in memory). :func:`compare` runs the catalog queries named in
:data:`COLUMNS` on each side (the documented columns only: one definition of every metric), registers both sides'
frames in a scratch DuckDB connection, turns each side into long rows (:data:`SIDE_SQL`) and joins the two sides
in SQL (:data:`COMPARE_SQL`). Nothing is re-derived from the canonical tables: each value is a catalog column, a
sum of one over ranks or buckets, or that divided by the number of steps.

**Per step, only with steps.** When both runs have step markers (``overlap_by_step`` rows), runs of different length
compare per step. GPU time per rank (busy, idle, communication, overlap,
exposed communication) is ``overlap_by_step`` summed over the rank's steps and divided by their number, so idle
time between steps and before the first one does not count; a rank without steps (a trace without steps) counts
its whole trace, ``overlap_by_rank``, as one step. Other totals (operations, bytes and kernel time per collective
and size bucket, waits, coalescing saving) are whole-trace totals divided by ``steps``, the number of steps per
rank: the most steps any rank has in ``overlap_by_step`` (ranks of one job run the same steps), 1 without steps.
Rates and shares (``*_pct``, ``busbw_gbps``, α, β, skew) are not divided.

**Per capture window otherwise.** When either run has no step markers, nothing is per step: every total is the
whole capture window's (GPU time from ``overlap_by_rank``, divisor 1) and its metric is named ``*_per_window``
instead of ``*_per_step``. Two windows may hold different work (64 against 60 all_to_alls), so the diff also
normalises by matched work: the ``*_per_op`` rows (bytes, kernel time and exposed time per operation of each
collective and size bucket, one rank's kernel being one operation) compare like with like, and ``missing`` lists
every (collective, size bucket) whose operations differ. An ``iterations`` object (iterations detected without
markers) would become a third basis, per iteration, where :func:`compare_sides` picks the basis.

**Rows** (:data:`METRICS`, in this order within a subject). Each row has ``section``, ``metric``, the key columns
``collective``, ``group_size``, ``bucket_lo_bytes``, ``bucket_hi_bytes``, ``rank`` (NULL where they do not apply), a
readable ``key``, then ``base``, ``new``, ``delta`` = new − base, ``delta_pct`` = 100 × delta / base and
``impact_ns``. A value that cannot be computed is NULL, never 0, and so are ``delta`` and ``delta_pct``;
``delta_pct`` is also NULL when base is 0 (a run diffed against itself has ``delta`` 0 everywhere a value is known,
``delta_pct`` 0 where base is not 0 and NULL where it is 0). A row present on one side only (a size bucket, a rank,
a collective seen in one run) appears with the other side NULL.

**Sort rule: impact.** With steps, ``impact_ns`` is the change, new − base, in exposed communication + idle ns per
step of the row's *subject*: the whole job (section ``job``: Σ over ranks of exposed_comm_ns + idle_ns per step,
as defined above), a rank (sections ``rank`` and ``skew`` rows with a rank: that rank's exposed + idle per step),
a collective's size bucket (section ``collective``: its exposed ns per step, ``comm_kernels.exposed_ns`` summed over
the bucket; idle time belongs to no collective) or a collective (``skew`` rows with a collective and ``latency``:
its exposed ns per step over all buckets; latency_model's ``p2p`` has none). A subject missing on one side counts as
0 there (it had no such time); ``impact_ns`` is NULL when neither side has it or a side's analysis failed. Without
steps it is the change in exposed communication over the matched work (WORK_SQL): for a size bucket found in both
runs, min(base ops, new ops) × (new − base exposed ns per operation); for a collective, the sum over its matched
buckets; for the job, over all matched buckets (idle time belongs to no work); NULL for ranks and for buckets seen in
one run only. Rows are
sorted by |impact_ns| descending (NULL last), then impact_ns descending (a regression before an improvement of the
same size), then section (job, collective, rank, skew, latency), collective, bucket_lo_bytes, group_size, rank
(NULLs first) and the metric order of :data:`METRICS`, so every run gives the same order.

The JSON document (``nsys2comm diff --json``, :func:`document`; ``schema_version`` 1, new keys may be added,
existing keys keep their meaning and unit):

=======================  ======================================================================================
key                      meaning
=======================  ======================================================================================
schema_version           1
nsys2comm_version        package version that wrote it
base, new                {source, ranks, steps, has_steps}: what each side is; has_steps false: no steps (steps 1),
                         and the diff is per capture window
step_impact_ns           the job's impact_ns with steps: change in exposed communication + idle ns per step, summed
                         over ranks; null unless both runs have steps
exposed_comm_change_pct  with steps, delta_pct of job exposed_comm_ns_per_step; without, the change in exposed
                         communication over the matched work, % of the base's exposed ns over that work
wait_change_pct          delta_pct of job wait_ns_per_step with steps; without, of job wait_ns_per_op (waiting for
                         late ranks at collectives per communication operation)
busbw_change_pct         bus bandwidth change, %: the mean of busbw_gbps delta_pct over the (collective, group size,
                         size bucket) rows known on both sides, weighted by the base's kernel time in the bucket
per                      'step' (both runs have steps) or 'window' (per capture window, normalised by matched work)
impact_ns                the job's impact_ns on that basis (step_impact_ns, or the change over the matched work)
rows                     [{section, metric, key, collective, group_size, bucket_lo_bytes, bucket_hi_bytes, rank,
                         base, new, delta, delta_pct, impact_ns}]: the rows above, in their order
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
from .analysis import run_query
from .cache import materialize, unmaterialize
from .db import memory_connection, settle
from .units import JSON_DIGITS, round_floats, size

SCHEMA_VERSION = 1
DIGITS = JSON_DIGITS

EXPOSED_BY_BUCKET = "comm_kernels × _messages_comm_sized"
# the documented catalog columns each side contributes (tests check them against the catalog)
COLUMNS: dict[str, tuple[str, ...]] = {
    "overlap_by_step": ("rank", "step_ord", "busy_ns", "idle_ns", "comm_ns", "comm_overlapped_ns", "exposed_comm_ns"),
    "overlap_by_rank": ("rank", "busy_ns", "idle_ns", "comm_ns", "comm_overlapped_ns", "exposed_comm_ns"),
    "msg_size_histogram": ("collective", "bucket_lo_bytes", "bucket_hi_bytes", "ops", "total_bytes", "total_ns"),
    "collective_bandwidth": ("collective", "group_size", "group_size_assumed", "bucket_lo_bytes", "bucket_hi_bytes",
                             "total_ns", "busbw_gbps"),
    "rank_wait": ("rank", "total_wait_ns", "arrived_last_pct", "straggler_rank_order", "is_straggler"),
    "collective_skew": ("collective", "start_skew_ns"),
    "latency_model": ("collective", "group_size", "latency_floor_ns", "transfer_p50_ns", "alpha_us", "beta_gbps",
                      "n_half_bytes", "latency_bound_pct"),
    "latency_bound_total": ("latency_bound_pct", "coalescing_saving_ns"),
    # exposed time per collective and size bucket: comm_kernels.exposed_ns by _messages_comm_sized's bucket (BUCKET_SQL)
    "comm_kernels": ("kernel_id", "exposed_ns"),
    "_messages_comm_sized": ("kernel_id", "collective", "bucket_lo_bytes"),
}
BUCKET_SQL = """
SELECT s.collective, s.bucket_lo_bytes, CAST(sum(k.exposed_ns) AS BIGINT) AS exposed_ns
FROM comm_kernels() k JOIN _messages_comm_sized() s USING (kernel_id)
GROUP BY s.collective, s.bucket_lo_bytes
"""
_TEXT = {"collective"}
_BOOL = {"group_size_assumed", "is_straggler"}
_FLOAT_SUFFIX = ("_pct", "_gbps", "_us")

# (section, metric, meaning): the rows of a diff, in their order within one subject
METRICS: list[tuple[str, str, str]] = [
    ("job", "steps", "steps per rank (overlap_by_step; 1 without steps)"),
    ("job", "exposed_comm_ns_per_step", "Σ ranks of rank exposed_comm_ns_per_step"),
    ("job", "idle_ns_per_step", "Σ ranks of rank idle_ns_per_step"),
    ("job", "comm_ns_per_step", "Σ ranks of rank comm_ns_per_step"),
    ("job", "busy_ns_per_step", "Σ ranks of overlap_by_step.busy_ns per step (as the rank rows)"),
    ("job", "overlap_pct", "100 × Σ comm_overlapped_ns / Σ comm_ns over ranks' steps"),
    ("job", "wait_ns_per_step", "Σ ranks rank_wait.total_wait_ns / steps"),
    ("job", "wait_ns_per_op", "Σ ranks rank_wait.total_wait_ns / Σ msg_size_histogram.ops (per operation)"),
    ("job", "max_start_skew_ns", "largest collective_skew.start_skew_ns"),
    ("job", "mean_start_skew_ns", "mean collective_skew.start_skew_ns over instances seen on >= 2 ranks"),
    ("job", "latency_bound_pct", "latency_bound_total.latency_bound_pct"),
    ("job", "coalescing_saving_ns_per_step", "latency_bound_total.coalescing_saving_ns / steps"),
    ("collective", "ops_per_step", "msg_size_histogram.ops / steps (all ranks)"),
    ("collective", "bytes_per_step", "msg_size_histogram.total_bytes / steps (all ranks)"),
    ("collective", "time_ns_per_step", "msg_size_histogram.total_ns / steps (kernel time, all ranks)"),
    ("collective", "exposed_ns_per_step", "Σ comm_kernels.exposed_ns in the bucket / steps (all ranks)"),
    ("collective", "bytes_per_op", "msg_size_histogram.total_bytes / ops: mean size S of an operation"),
    ("collective", "time_ns_per_op", "msg_size_histogram.total_ns / ops: kernel time per operation"),
    ("collective", "exposed_ns_per_op", "Σ comm_kernels.exposed_ns in the bucket / ops: exposed time per operation"),
    ("collective", "busbw_gbps", "collective_bandwidth.busbw_gbps, per group size (a recorded group size "
                                 "before an assumed one)"),
    ("rank", "exposed_comm_ns_per_step", "overlap_by_step.exposed_comm_ns summed over the rank's steps / "
                                                 "its steps (no steps: overlap_by_rank, one step)"),
    ("rank", "idle_ns_per_step", "overlap_by_step.idle_ns per step, as exposed_comm_ns_per_step"),
    ("rank", "comm_ns_per_step", "overlap_by_step.comm_ns per step, as exposed_comm_ns_per_step"),
    ("rank", "overlap_pct", "100 × comm_overlapped_ns / comm_ns over the rank's steps (comm_overlap_pct)"),
    ("rank", "wait_ns_per_step", "rank_wait.total_wait_ns / steps"),
    ("skew", "mean_start_skew_ns", "per collective: mean collective_skew.start_skew_ns"),
    ("skew", "max_start_skew_ns", "per collective: largest collective_skew.start_skew_ns"),
    ("skew", "arrived_last_pct", "per rank: rank_wait.arrived_last_pct"),
    ("skew", "is_straggler", "per rank: 1 when rank_wait.is_straggler (arrives last more often than chance, the "
                             "summary's and report's rule), else 0"),
    ("skew", "straggler_rank_order", "per rank: rank_wait.straggler_rank_order (TraceLens' ranking by total wait, "
                                     "1 = least wait; no verdict: see is_straggler)"),
    ("latency", "latency_floor_ns", "latency_model.latency_floor_ns"),
    ("latency", "transfer_p50_ns", "latency_model.transfer_p50_ns"),
    ("latency", "alpha_us", "latency_model.alpha_us"),
    ("latency", "beta_gbps", "latency_model.beta_gbps"),
    ("latency", "n_half_bytes", "latency_model.n_half_bytes"),
    ("latency", "latency_bound_pct", "latency_model.latency_bound_pct"),
]
SECTIONS = list(dict.fromkeys(s for s, _, _ in METRICS))
ROW_COLUMNS = ["section", "metric", "key", "base", "new", "delta", "delta_pct", "impact_ns", "collective",
               "group_size", "bucket_lo_bytes", "bucket_hi_bytes", "rank"]

# Per side {s}: its steps (the basis of the comparison is decided from both sides' steps).
STEPS_SQL = """
CREATE OR REPLACE TEMP TABLE {s}_steps AS
SELECT coalesce(max(n), 1)::BIGINT AS steps, count(*) > 0 AS has_steps
FROM (SELECT rank, count(*) AS n FROM {s}_overlap_by_step GROUP BY rank)
"""

# Per side {s}: one row per (section, metric, keys) with the side's value. {by_step}: true when both runs have steps
# (totals per step), false otherwise (totals per capture window: the divisor is 1 and GPU time is overlap_by_rank's).
SIDE_SQL = """
CREATE OR REPLACE TEMP TABLE {s}_div AS
SELECT CASE WHEN {by_step} THEN steps ELSE 1 END::BIGINT AS steps FROM {s}_steps;

-- the work of each (collective, size bucket): operations (all ranks) and their exposed time
CREATE OR REPLACE TEMP TABLE {s}_work AS
SELECT h.collective, h.bucket_lo_bytes, h.ops::DOUBLE AS ops, e.exposed_ns::DOUBLE AS exposed_ns
FROM {s}_msg_size_histogram h
LEFT JOIN {s}_exposed_by_bucket e
  ON e.collective = h.collective AND e.bucket_lo_bytes IS NOT DISTINCT FROM h.bucket_lo_bytes
WHERE h.ops > 0;

CREATE OR REPLACE TEMP TABLE {s}_bw AS
SELECT * FROM {s}_collective_bandwidth
QUALIFY row_number() OVER (PARTITION BY collective, group_size, bucket_lo_bytes ORDER BY group_size_assumed) = 1;

-- GPU time per rank and step: overlap_by_step summed over the rank's steps ÷ its steps; a rank without steps
-- counts its whole trace (overlap_by_rank) as one step
CREATE OR REPLACE TEMP TABLE {s}_rank_time AS
SELECT rank, sum(busy_ns)::DOUBLE AS busy_ns, sum(idle_ns)::DOUBLE AS idle_ns, sum(comm_ns)::DOUBLE AS comm_ns,
       sum(comm_overlapped_ns)::DOUBLE AS comm_overlapped_ns, sum(exposed_comm_ns)::DOUBLE AS exposed_comm_ns,
       count(*)::DOUBLE AS steps
FROM {s}_overlap_by_step WHERE {by_step} GROUP BY rank
UNION ALL
SELECT rank, busy_ns, idle_ns, comm_ns, comm_overlapped_ns, exposed_comm_ns, 1
FROM {s}_overlap_by_rank WHERE NOT {by_step} OR rank NOT IN (SELECT rank FROM {s}_overlap_by_step);

CREATE OR REPLACE TEMP TABLE {s}_m AS
WITH n AS (SELECT steps::DOUBLE AS steps FROM {s}_div),
job AS (
  SELECT (SELECT steps FROM {s}_steps)::DOUBLE AS steps,
         (SELECT sum(exposed_comm_ns / steps) FROM {s}_rank_time) AS exposed_comm_ns_per_step,
         (SELECT sum(idle_ns / steps) FROM {s}_rank_time) AS idle_ns_per_step,
         (SELECT sum(comm_ns / steps) FROM {s}_rank_time) AS comm_ns_per_step,
         (SELECT sum(busy_ns / steps) FROM {s}_rank_time) AS busy_ns_per_step,
         (SELECT 100.0 * sum(comm_overlapped_ns) / nullif(sum(comm_ns), 0) FROM {s}_rank_time) AS overlap_pct,
         (SELECT sum(total_wait_ns) FROM {s}_rank_wait) / n.steps AS wait_ns_per_step,
         (SELECT max(start_skew_ns) FROM {s}_collective_skew)::DOUBLE AS max_start_skew_ns,
         (SELECT avg(start_skew_ns) FROM {s}_collective_skew)::DOUBLE AS mean_start_skew_ns,
         (SELECT max(latency_bound_pct) FROM {s}_latency_bound_total)::DOUBLE AS latency_bound_pct,
         (SELECT max(coalescing_saving_ns) FROM {s}_latency_bound_total) / n.steps AS coalescing_saving_ns_per_step,
         (SELECT sum(total_wait_ns) FROM {s}_rank_wait) / (SELECT nullif(sum(ops), 0) FROM {s}_work) AS wait_ns_per_op
  FROM n
),
coll AS (
  SELECT h.collective, NULL::BIGINT AS group_size, h.bucket_lo_bytes, h.bucket_hi_bytes,
         h.ops / n.steps AS ops_per_step, h.total_bytes / n.steps AS bytes_per_step,
         h.total_ns / n.steps AS time_ns_per_step, e.exposed_ns / n.steps AS exposed_ns_per_step,
         h.total_bytes / nullif(h.ops, 0) AS bytes_per_op, h.total_ns / nullif(h.ops, 0) AS time_ns_per_op,
         e.exposed_ns / nullif(h.ops, 0) AS exposed_ns_per_op
  FROM {s}_msg_size_histogram h CROSS JOIN n
  LEFT JOIN {s}_exposed_by_bucket e
    ON e.collective = h.collective AND e.bucket_lo_bytes IS NOT DISTINCT FROM h.bucket_lo_bytes
),
rk AS (
  SELECT coalesce(o.rank, w.rank) AS rank, o.exposed_comm_ns / o.steps AS exposed_comm_ns_per_step,
         o.idle_ns / o.steps AS idle_ns_per_step, o.comm_ns / o.steps AS comm_ns_per_step,
         100.0 * o.comm_overlapped_ns / nullif(o.comm_ns, 0) AS overlap_pct,
         w.total_wait_ns / n.steps AS wait_ns_per_step
  FROM {s}_rank_time o FULL JOIN {s}_rank_wait w ON o.rank = w.rank CROSS JOIN n
),
skew_c AS (
  SELECT collective, avg(start_skew_ns)::DOUBLE AS mean_start_skew_ns,
         max(start_skew_ns)::DOUBLE AS max_start_skew_ns
  FROM {s}_collective_skew WHERE start_skew_ns IS NOT NULL GROUP BY collective
),
skew_r AS (
  SELECT rank, arrived_last_pct::DOUBLE AS arrived_last_pct, is_straggler::INT::DOUBLE AS is_straggler,
         straggler_rank_order::DOUBLE AS straggler_rank_order
  FROM {s}_rank_wait
),
lat AS (
  SELECT collective, group_size, latency_floor_ns::DOUBLE AS latency_floor_ns,
         transfer_p50_ns::DOUBLE AS transfer_p50_ns, alpha_us::DOUBLE AS alpha_us, beta_gbps::DOUBLE AS beta_gbps,
         n_half_bytes::DOUBLE AS n_half_bytes, latency_bound_pct::DOUBLE AS latency_bound_pct
  FROM {s}_latency_model
)
SELECT 'job' AS section, metric, NULL::VARCHAR AS collective, NULL::BIGINT AS group_size,
       NULL::BIGINT AS bucket_lo_bytes, NULL::BIGINT AS bucket_hi_bytes, NULL::BIGINT AS rank, value::DOUBLE AS value
FROM job UNPIVOT INCLUDE NULLS (value FOR metric IN (steps, exposed_comm_ns_per_step, idle_ns_per_step,
  comm_ns_per_step, busy_ns_per_step, overlap_pct, wait_ns_per_step, wait_ns_per_op, max_start_skew_ns,
  mean_start_skew_ns, latency_bound_pct, coalescing_saving_ns_per_step))
UNION ALL
SELECT 'collective', metric, collective, group_size, bucket_lo_bytes, bucket_hi_bytes, NULL, value::DOUBLE
FROM coll UNPIVOT INCLUDE NULLS (value FOR metric IN (ops_per_step, bytes_per_step, time_ns_per_step,
  exposed_ns_per_step, bytes_per_op, time_ns_per_op, exposed_ns_per_op))
UNION ALL
SELECT 'collective', 'busbw_gbps', collective, group_size, bucket_lo_bytes, bucket_hi_bytes, NULL, busbw_gbps::DOUBLE
FROM {s}_bw
UNION ALL
SELECT 'rank', metric, NULL, NULL, NULL, NULL, rank, value::DOUBLE
FROM rk UNPIVOT INCLUDE NULLS (value FOR metric IN (exposed_comm_ns_per_step, idle_ns_per_step, comm_ns_per_step,
  overlap_pct, wait_ns_per_step))
UNION ALL
SELECT 'skew', metric, collective, NULL, NULL, NULL, NULL, value::DOUBLE
FROM skew_c UNPIVOT INCLUDE NULLS (value FOR metric IN (mean_start_skew_ns, max_start_skew_ns))
UNION ALL
SELECT 'skew', metric, NULL, NULL, NULL, NULL, rank, value::DOUBLE
FROM skew_r UNPIVOT INCLUDE NULLS (value FOR metric IN (arrived_last_pct, is_straggler, straggler_rank_order))
UNION ALL
SELECT 'latency', metric, collective, group_size, NULL, NULL, NULL, value::DOUBLE
FROM lat UNPIVOT INCLUDE NULLS (value FOR metric IN (latency_floor_ns, transfer_p50_ns, alpha_us, beta_gbps,
  n_half_bytes, latency_bound_pct));

-- impact subjects: exposed communication (+ idle for the job and ranks) ns per step
CREATE OR REPLACE TEMP TABLE {s}_subj AS
WITH n AS (SELECT steps::DOUBLE AS steps FROM {s}_div)
SELECT 'job' AS kind, NULL::VARCHAR AS collective, NULL::BIGINT AS bucket_lo_bytes, NULL::BIGINT AS rank,
       sum((exposed_comm_ns + idle_ns) / steps) AS step_ns
FROM {s}_rank_time HAVING count(*) > 0
UNION ALL
SELECT 'rank', NULL, NULL, rank, (exposed_comm_ns + idle_ns) / steps FROM {s}_rank_time
UNION ALL
SELECT 'bucket', collective, bucket_lo_bytes, NULL, exposed_ns / n.steps FROM {s}_exposed_by_bucket CROSS JOIN n
UNION ALL
SELECT 'collective', collective, NULL, NULL, sum(exposed_ns) / any_value(n.steps)
FROM {s}_exposed_by_bucket CROSS JOIN n GROUP BY collective;
"""

# The work both runs hold: per (collective, size bucket) the operations of each side, the matched ones (the fewer of
# the two), and the change in exposed ns per operation over them: the impact without steps (module docstring).
WORK_SQL = """
CREATE OR REPLACE TEMP TABLE matched_work AS
SELECT coalesce(b.collective, n.collective) AS collective, coalesce(b.bucket_lo_bytes, n.bucket_lo_bytes)
         AS bucket_lo_bytes, b.ops AS base_ops, n.ops AS new_ops, least(b.ops, n.ops) AS matched_ops,
       least(b.ops, n.ops) * b.exposed_ns / b.ops AS base_exposed_ns,
       least(b.ops, n.ops) * (n.exposed_ns / n.ops - b.exposed_ns / b.ops) AS impact_ns
FROM base_work b FULL JOIN new_work n
  ON b.collective = n.collective AND b.bucket_lo_bytes IS NOT DISTINCT FROM n.bucket_lo_bytes;

CREATE OR REPLACE TEMP TABLE work_subj AS
SELECT 'bucket' AS kind, collective, bucket_lo_bytes, NULL::BIGINT AS rank, impact_ns
FROM matched_work WHERE matched_ops > 0
UNION ALL
SELECT 'collective', collective, NULL, NULL, sum(impact_ns) FROM matched_work WHERE matched_ops > 0 GROUP BY collective
UNION ALL
SELECT 'job', NULL, NULL, NULL, sum(impact_ns) FROM matched_work WHERE matched_ops > 0 HAVING count(*) > 0;
"""

# Both sides joined: base, new, delta, delta_pct and impact_ns per row, sorted (module docstring).
COMPARE_SQL = """
WITH d AS (
  SELECT coalesce(b.section, n.section) AS section, coalesce(b.metric, n.metric) AS metric,
         coalesce(b.collective, n.collective) AS collective, coalesce(b.group_size, n.group_size) AS group_size,
         coalesce(b.bucket_lo_bytes, n.bucket_lo_bytes) AS bucket_lo_bytes,
         coalesce(b.bucket_hi_bytes, n.bucket_hi_bytes) AS bucket_hi_bytes, coalesce(b.rank, n.rank) AS rank,
         b.value AS base, n.value AS new
  FROM base_m b FULL JOIN new_m n
    ON b.section = n.section AND b.metric = n.metric AND b.collective IS NOT DISTINCT FROM n.collective
   AND b.group_size IS NOT DISTINCT FROM n.group_size AND b.bucket_lo_bytes IS NOT DISTINCT FROM n.bucket_lo_bytes
   AND b.rank IS NOT DISTINCT FROM n.rank
),
s AS (  -- the subject whose exposed (+ idle) time a row's impact is
  SELECT *, CASE section WHEN 'job' THEN 'job' WHEN 'rank' THEN 'rank' WHEN 'collective' THEN 'bucket'
                 WHEN 'skew' THEN CASE WHEN rank IS NOT NULL THEN 'rank' ELSE 'collective' END
                 ELSE 'collective' END AS kind
  FROM d
),
i AS (
  SELECT s.*,
         CASE WHEN NOT {by_step} THEN w.impact_ns  -- without steps: over the matched work
              WHEN s.kind = 'job' THEN ns.step_ns - bs.step_ns
              WHEN bs.step_ns IS NOT NULL OR ns.step_ns IS NOT NULL
              THEN coalesce(ns.step_ns, {new_zero}) - coalesce(bs.step_ns, {base_zero}) END AS impact_ns
  FROM s
  LEFT JOIN work_subj w ON w.kind = s.kind AND w.collective IS NOT DISTINCT FROM s.collective
   AND w.bucket_lo_bytes IS NOT DISTINCT FROM s.bucket_lo_bytes AND w.rank IS NOT DISTINCT FROM s.rank
  LEFT JOIN base_subj bs ON bs.kind = s.kind AND bs.collective IS NOT DISTINCT FROM s.collective
   AND bs.bucket_lo_bytes IS NOT DISTINCT FROM s.bucket_lo_bytes AND bs.rank IS NOT DISTINCT FROM s.rank
  LEFT JOIN new_subj ns ON ns.kind = s.kind AND ns.collective IS NOT DISTINCT FROM s.collective
   AND ns.bucket_lo_bytes IS NOT DISTINCT FROM s.bucket_lo_bytes AND ns.rank IS NOT DISTINCT FROM s.rank
)
SELECT i.section, replace(i.metric, '_per_step', '_per_{per}') AS metric, i.base, i.new, i.new - i.base AS delta,
       CASE WHEN i.base <> 0 THEN 100.0 * (i.new - i.base) / i.base END AS delta_pct, i.impact_ns,
       i.collective, i.group_size, i.bucket_lo_bytes, i.bucket_hi_bytes, i.rank
FROM i JOIN metric_order o ON o.section = i.section AND o.metric = i.metric
ORDER BY abs(impact_ns) DESC NULLS LAST, impact_ns DESC NULLS LAST, o.section_ord, i.collective NULLS FIRST,
         i.bucket_lo_bytes NULLS FIRST, i.group_size NULLS FIRST, i.rank NULLS FIRST, o.metric_ord
"""

# bus bandwidth change: busbw delta_pct per (collective, group size, bucket) known on both sides, weighted by the
# base's kernel time in that bucket
BUSBW_SQL = """
SELECT sum(b.total_ns * 100.0 * (n.busbw_gbps - b.busbw_gbps) / b.busbw_gbps) / sum(b.total_ns) AS busbw_change_pct,
       count(*) AS buckets
FROM base_bw b JOIN new_bw n ON b.collective = n.collective AND b.group_size IS NOT DISTINCT FROM n.group_size
 AND b.bucket_lo_bytes = n.bucket_lo_bytes
WHERE b.busbw_gbps > 0 AND n.busbw_gbps IS NOT NULL AND b.total_ns > 0
"""


@dataclass
class Side:
    """One run's catalog frames, as the diff reads them."""

    source: str
    frames: dict[str, pl.DataFrame]
    failed: dict[str, str] = field(default_factory=dict)  # query -> why it failed
    ranks: int = 0


@dataclass
class Comparison:
    """The rows of a diff and what the document says beside them."""

    rows: pl.DataFrame
    base: dict[str, Any]
    new: dict[str, Any]
    headline: dict[str, float | None]
    missing: list[str]


def _dtype(col: str) -> pl.DataType:
    if col in _TEXT:
        return pl.String
    if col in _BOOL:
        return pl.Boolean
    return pl.Float64 if col.endswith(_FLOAT_SUFFIX) else pl.Int64


def _empty(cols: tuple[str, ...]) -> pl.DataFrame:
    return pl.DataFrame(schema={c: _dtype(c) for c in cols})


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_side(con, source: str) -> Side:
    """Run the catalog queries the diff needs on one job (failures are kept as reasons, like the summary's)."""
    side = Side(source, {})
    settle(con)
    side.ranks = con.execute("SELECT count(*) FROM ranks").fetchone()[0]
    try:
        materialize(con)
    except Exception:  # noqa: BLE001 - helpers that cannot be snapshotted compute live
        unmaterialize(con)
    try:
        for name, cols in COLUMNS.items():
            if name.startswith("_") or name == "comm_kernels":
                continue
            try:
                side.frames[name] = run_query(con, name).select(cols)
            except Exception as e:  # noqa: BLE001 - one failing analysis leaves its rows NULL, not the diff
                side.failed[name] = _first_line(e)
                side.frames[name] = _empty(cols)
        try:
            side.frames["exposed_by_bucket"] = settle(con).sql(BUCKET_SQL).pl()
        except Exception as e:  # noqa: BLE001
            side.failed[EXPOSED_BY_BUCKET] = _first_line(e)
            side.frames["exposed_by_bucket"] = _empty(("collective", "bucket_lo_bytes", "exposed_ns"))
    finally:
        unmaterialize(con)
        settle(con)
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


def compare_sides(base: Side, new: Side) -> Comparison:
    """Join two sides' catalog frames in DuckDB (STEPS_SQL and SIDE_SQL per side, WORK_SQL, then COMPARE_SQL)."""
    con = memory_connection()
    sides = (("base", base), ("new", new))
    try:
        for tag, side in sides:
            for name, df in side.frames.items():
                con.register(f"{tag}_{name}", df)
            con.execute(STEPS_SQL.format(s=tag))
        steps = {tag: con.execute(f"SELECT steps, has_steps FROM {tag}_steps").fetchone() for tag, _ in sides}
        # per step only when both runs have step markers; an `iterations` object (iterations detected without
        # markers) would plug in here as a third basis, its overlap per iteration in place of overlap_by_step
        per = "step" if steps["base"][1] and steps["new"][1] else "window"
        by_step = "true" if per == "step" else "false"
        for tag, _ in sides:
            con.execute(SIDE_SQL.format(s=tag, by_step=by_step))
        con.execute(WORK_SQL)
        order = pl.DataFrame({"section": [s for s, _, _ in METRICS], "metric": [m for _, m, _ in METRICS],
                              "section_ord": [SECTIONS.index(s) for s, _, _ in METRICS],
                              "metric_ord": list(range(len(METRICS)))})
        con.register("metric_order", order)
        zero = {tag: "0" if not ({"overlap_by_rank", EXPOSED_BY_BUCKET} & set(side.failed)) else "NULL"
                for tag, side in sides}
        rows = con.sql(COMPARE_SQL.format(base_zero=zero["base"], new_zero=zero["new"], by_step=by_step,
                                          per=per)).pl()
        busbw, buckets = con.execute(BUSBW_SQL).fetchone()
        impact, base_matched = con.execute(
            "SELECT sum(impact_ns), sum(base_exposed_ns) FROM matched_work WHERE matched_ops > 0").fetchone()
        work = con.execute("SELECT collective, bucket_lo_bytes, base_ops, new_ops FROM matched_work "
                           "WHERE base_ops IS DISTINCT FROM new_ops ORDER BY collective, bucket_lo_bytes NULLS FIRST"
                           ).fetchall()
    finally:
        con.close()
    keys = [_key(r) for r in rows.select("section", "rank", "collective", "bucket_lo_bytes", "bucket_hi_bytes",
                                         "group_size").iter_rows(named=True)]
    rows = rows.with_columns(pl.Series("key", keys, dtype=pl.String)).select(ROW_COLUMNS)
    info = {tag: {"source": side.source, "ranks": side.ranks, "steps": steps[tag][0], "has_steps": steps[tag][1]}
            for tag, side in sides}
    job = {r["metric"].replace(f"_per_{per}", "_per_step"): r
           for r in rows.filter(pl.col("section") == "job").iter_rows(named=True)}
    exposed, wait = job.get("exposed_comm_ns_per_step", {}), job.get("wait_ns_per_step", {})
    if per == "step":
        headline = {"step_impact_ns": exposed.get("impact_ns"), "exposed_comm_change_pct": exposed.get("delta_pct"),
                    "wait_change_pct": wait.get("delta_pct")}
    else:  # windows of different length or work: normalise by the work both hold
        wait = job.get("wait_ns_per_op", {})
        headline = {"step_impact_ns": None,
                    "exposed_comm_change_pct": 100.0 * impact / base_matched if impact is not None and base_matched
                    else None, "wait_change_pct": wait.get("delta_pct")}
    headline |= {"busbw_change_pct": busbw, "per": per,
                 "impact_ns": exposed.get("impact_ns") if per == "step" else impact}
    missing = _missing(base, new, info, per, headline, wait, buckets, work)
    return Comparison(rows, info["base"], info["new"], headline, missing)


def _missing(base: Side, new: Side, info: dict, per: str, headline: dict, wait: dict, busbw_buckets: int,
             work: list[tuple]) -> list[str]:
    out: list[str] = []
    for tag, side in (("base", base), ("new", new)):
        if not info[tag]["has_steps"]:
            out.append(f"{tag}: no steps (overlap_by_step is empty)")
        out += [f"{tag}: analysis '{q}' failed: {why}" for q, why in side.failed.items()]
    if per == "window":
        out.append("per capture window: the runs do not both have step markers, so no figure is per step or a "
                   "step-time impact; impact_ns is the change in exposed communication over the matched work "
                   "(per (collective, size bucket): operations found in both runs × the change in exposed ns per "
                   "operation; see the *_per_op rows)")
        if work:
            what = "; ".join(f"{c} {'size unknown' if lo is None else size(lo) + '+'}: base "
                             f"{0 if b is None else int(b)}, new {0 if n is None else int(n)}" for c, lo, b, n in work)
            out.append(f"the capture windows hold different work (operations, all ranks: {what}): *_per_window "
                       "totals compare different work")
    if base.ranks != new.ranks:
        out.append(f"the runs have different ranks (base {base.ranks}, new {new.ranks}): per-rank rows of a rank "
                   "seen on one side only have the other side NULL")
    if headline["exposed_comm_change_pct"] is None:
        out.append("exposed_comm_change_pct: not available (" + (
            "no collective size bucket is found in both runs with its exposed time" if per == "window" else
            "the base has no exposed communication: a relative change is undefined"
            if headline["impact_ns"] is not None else "exposed communication is not known on both runs "
            "(it needs GPU kernels)") + ")")
    if wait.get("delta_pct") is None:
        unknown = [tag for tag in ("base", "new") if wait.get(tag) is None]
        out.append("wait_change_pct: not available (" + (
            "the base has no wait at collectives: a relative change is undefined" if not unknown else
            f"wait at collectives is not known on the {' and '.join(unknown)} run (waits need a collective matched "
            "on two or more ranks)") + ")")
    if not busbw_buckets:
        out.append("busbw_change_pct: not available (no collective size bucket has a bus bandwidth on both sides; "
                   "bus bandwidth needs message and group sizes)")
    return out


def compare(base_con, new_con, *, base_source: str = "base", new_source: str = "new") -> Comparison:
    """Compare the job in ``new_con`` with the one in ``base_con`` (open job databases)."""
    return compare_sides(read_side(base_con, base_source), read_side(new_con, new_source))


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
