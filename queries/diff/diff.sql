-- Comparing two runs (nsys2comm diff BASE NEW; tests: tests/test_diff.py, tier 3 synthetic jobs and a real export).
-- The diff does not read canonical tables: each run ("side") contributes the rows of catalog objects, narrowed to
-- their documented columns (nsys2comm.compare.COLUMNS), as tables named <side>_<object>:
--   <side>_overlap_by_step, <side>_overlap_by_rank, <side>_msg_size_histogram, <side>_msg_size_exposure,
--   <side>_collective_bandwidth, <side>_rank_wait, <side>_collective_skew, <side>_latency_model,
--   <side>_latency_bound_total, <side>_iterations.
-- The macros take the side prefixes as parameters and read those tables with query_table(), as the intervals
-- macros take table names, so the same SQL runs on frames of two databases, on a run against itself, and on the
-- empty tables of the catalog lint.
--
-- Basis. Each side has iterations (the iterations object: step markers, else the repeating kernel sequence, else the
-- whole capture). When both sides have iterations (iteration_source 'marker' or 'detected' on some rank), totals
-- are per step: GPU time per rank from overlap_by_step summed over a marker rank's steps ÷ their number; a rank
-- whose iterations were detected (it has no markers) counts its whole capture, overlap_by_rank, ÷ its detected
-- iterations (detected iterations tile the rank's capture from its first kernel to its last kernel end, so their
-- sum is the capture's GPU time); a rank with neither counts its capture as one step. Other totals (operations,
-- bytes and kernel time per collective and size bucket, waits, coalescing saving) are whole-capture totals ÷ steps,
-- the most iterations any rank has. Otherwise ('window') every total is the capture window's, divisor 1, GPU time
-- from overlap_by_rank, and the *_per_step metrics are named *_per_window. Rates and shares (*_pct, busbw_gbps,
-- alpha, beta, skew) are not divided.
--
-- Impact. impact_ns of a row is the change, new − base, in the time the row's own metric measures when that time is
-- exposed communication or idle GPU time: the job's and a rank's exposed_comm_ns_per_step and idle_ns_per_step, a
-- size bucket's exposed_ns_per_step. Without steps it is the change in exposed communication over the work both
-- runs hold (diff_matched_work): a size bucket's exposed_ns_per_op row min(base ops, new ops) × (new − base exposed
-- ns per operation), the job's exposed_comm_ns_per_window the sum over the matched buckets. Every other row (the
-- causes: operations, sizes, kernel time, bandwidth, overlap, waits, skew, the latency model) has no impact of its
-- own: NULL. A value missing on one side counts as 0 there (the run had no such time) unless that side's overlap
-- or exposure analysis failed; impact_ns is NULL when neither side has the value.

-- @macro _diff_busbw
-- The bus bandwidth a diff compares: collective_bandwidth.busbw_gbps (matched transfer time, the same basis on both
-- runs; NULL when nothing matched) unless it is above the device peak (bandwidth_check 'above_peak': physically
-- impossible, so not a figure to compare).
-- @param busbw: collective_bandwidth.busbw_gbps.
-- @param verdict: collective_bandwidth.bandwidth_check.
CREATE OR REPLACE MACRO _diff_busbw(busbw, verdict) AS CASE WHEN verdict = 'above_peak' THEN NULL ELSE busbw END;

-- @macro _diff_side_basis
-- One side's iterations: how many per rank, where they come from, and whether the side has iterations at all.
-- @param side: Prefix of a run's tables (<side>_iterations, <side>_overlap_by_step; see this file's header).
-- @column steps: The most iterations any rank has (marker or detected); 1 when no rank has any.
-- @column has_steps: True when some rank has marker or detected iterations.
-- @column iteration_source: 'marker' when some rank has step markers, else 'detected' when some rank's iterations
-- were detected, else 'whole_capture'.
-- @column ranks_agree: Detected iterations: every detected rank found the same number; NULL otherwise.
CREATE OR REPLACE MACRO _diff_side_basis(side) AS TABLE
WITH it AS (
  SELECT rank, any_value(iteration_source) AS iteration_source, max(rank_iterations) AS n,
         bool_and(ranks_agree) AS ranks_agree
  FROM query_table(side || '_iterations') GROUP BY rank
), st AS (SELECT rank, count(*) AS n FROM query_table(side || '_overlap_by_step') GROUP BY rank)
SELECT coalesce(greatest((SELECT max(n) FROM st), (SELECT max(n) FROM it WHERE iteration_source = 'detected')),
                1)::BIGINT AS steps,
       (SELECT count(*) FROM st) > 0 OR (SELECT count(*) FROM it WHERE iteration_source = 'detected') > 0
         AS has_steps,
       CASE WHEN (SELECT count(*) FROM st) > 0 THEN 'marker'
            WHEN (SELECT count(*) FROM it WHERE iteration_source = 'detected') > 0 THEN 'detected'
            ELSE 'whole_capture' END AS iteration_source,
       (SELECT bool_and(ranks_agree) FROM it WHERE iteration_source = 'detected') AS ranks_agree
ORDER BY steps;

-- @macro diff_basis
-- What each side of a diff is, and the basis the two are compared on: per step when both sides have iterations
-- (step markers or detected), else per capture window (this file's header).
-- @param base_side: Prefix of the base run's tables (see this file's header).
-- @param new_side: Prefix of the new run's tables.
-- @column side [key]: 'base' or 'new'.
-- @column steps [key]: Iterations per rank the side's totals are divided by on the step basis: the most any rank has
-- (1 when it has none).
-- @column has_steps: True when the side has iterations (marker or detected on some rank).
-- @column iteration_source [key]: 'marker', 'detected' or 'whole_capture' (_diff_side_basis).
-- @column ranks_agree: Detected iterations: every detected rank found the same number; NULL otherwise.
-- @column per [key]: 'step' when both sides have iterations, else 'window'.
CREATE OR REPLACE MACRO diff_basis(base_side, new_side) AS TABLE
WITH s AS (
  SELECT 'base' AS side, * FROM _diff_side_basis(base_side)
  UNION ALL
  SELECT 'new', * FROM _diff_side_basis(new_side)
)
SELECT side, steps, has_steps, iteration_source, ranks_agree,
       CASE WHEN bool_and(has_steps) OVER () THEN 'step' ELSE 'window' END AS per
FROM s
ORDER BY side = 'new', side;

-- @macro _diff_side_rank_time
-- GPU time per rank of one side, summed over the windows it is divided by, and that number: the rank's marker
-- steps (overlap_by_step), else its whole capture (overlap_by_rank) and its detected iterations, else its capture as
-- one window. by_step false: every rank's capture as one window.
-- @param side: Prefix of a run's tables (see this file's header).
-- @param by_step: True on the step basis (diff_basis.per = 'step').
-- @column rank: Rank.
-- @column busy_ns: Time any GPU work ran (ns).
-- @column idle_ns: Span − busy (ns).
-- @column comm_ns: Union of communication-kernel time (ns).
-- @column comm_overlapped_ns: Communication time during which computation ran (ns).
-- @column exposed_comm_ns: comm_ns − comm_overlapped_ns (ns).
-- @column steps: Windows the times cover (DOUBLE): marker steps, detected iterations, or 1.
CREATE OR REPLACE MACRO _diff_side_rank_time(side, by_step) AS TABLE
WITH st AS (SELECT * FROM query_table(side || '_overlap_by_step') WHERE by_step),
it AS (
  SELECT rank, max(rank_iterations) AS n FROM query_table(side || '_iterations')
  WHERE by_step AND iteration_source = 'detected' GROUP BY rank
)
SELECT rank, sum(busy_ns)::DOUBLE AS busy_ns, sum(idle_ns)::DOUBLE AS idle_ns, sum(comm_ns)::DOUBLE AS comm_ns,
       sum(comm_overlapped_ns)::DOUBLE AS comm_overlapped_ns, sum(exposed_comm_ns)::DOUBLE AS exposed_comm_ns,
       count(*)::DOUBLE AS steps
FROM st GROUP BY rank
UNION ALL
SELECT o.rank, o.busy_ns, o.idle_ns, o.comm_ns, o.comm_overlapped_ns, o.exposed_comm_ns, coalesce(it.n, 1)::DOUBLE
FROM query_table(side || '_overlap_by_rank') o LEFT JOIN it USING (rank)
WHERE o.rank NOT IN (SELECT rank FROM st)
ORDER BY rank;

-- @macro _diff_side_work
-- The work of each (collective, size bucket) of one side: its operations (all ranks) and their exposed time.
-- @param side: Prefix of a run's tables (see this file's header).
-- @column collective: Canonical collective.
-- @column bucket_lo_bytes: Size bucket lower bound (bytes); NULL for unknown sizes.
-- @column ops: Operations in the bucket, all ranks.
-- @column exposed_ns: Exposed time of those operations (ns; msg_size_exposure.exposed_ns).
CREATE OR REPLACE MACRO _diff_side_work(side) AS TABLE
SELECT h.collective, h.bucket_lo_bytes, h.ops::DOUBLE AS ops, e.exposed_ns::DOUBLE AS exposed_ns
FROM query_table(side || '_msg_size_histogram') h
LEFT JOIN query_table(side || '_msg_size_exposure') e
  ON e.collective = h.collective AND e.bucket_lo_bytes IS NOT DISTINCT FROM h.bucket_lo_bytes
WHERE h.ops > 0
ORDER BY h.collective, h.bucket_lo_bytes NULLS FIRST;

-- @macro diff_side_values
-- One side's values as long rows, one per (section, metric, key): the diff's rows before they are joined (the
-- metrics and their meanings: diff_metrics). by_step false: totals per capture window (divisor 1, GPU time from
-- overlap_by_rank); the metric names still end in _per_step here (diff_rows names them).
-- @param side: Prefix of a run's tables (see this file's header).
-- @param by_step: True on the step basis (diff_basis.per = 'step').
-- @column section [key]: 'job', 'collective', 'rank', 'skew' or 'latency'.
-- @column metric [key]: Metric name (diff_metrics).
-- @column collective [key]: Collective, where the row is about one; else NULL.
-- @column group_size: Group size (busbw_gbps and latency rows); else NULL.
-- @column bucket_lo_bytes: Size bucket lower bound (bytes; collective rows), NULL for unknown sizes or other rows.
-- @column bucket_hi_bytes: Size bucket upper bound, exclusive (bytes; collective rows); else NULL.
-- @column rank [key]: Rank, where the row is about one; else NULL.
-- @column value [key]: The value, in the unit its metric name says; NULL when it cannot be computed.
CREATE OR REPLACE MACRO diff_side_values(side, by_step) AS TABLE
WITH b AS (SELECT * FROM _diff_side_basis(side)),
n AS (SELECT CASE WHEN by_step THEN steps ELSE 1 END::DOUBLE AS steps FROM b),
rt AS (SELECT * FROM _diff_side_rank_time(side, by_step)),
wk AS (SELECT * FROM _diff_side_work(side)),
hist AS (SELECT * FROM query_table(side || '_msg_size_histogram')),
expo AS (SELECT * FROM query_table(side || '_msg_size_exposure')),
rw AS (SELECT * FROM query_table(side || '_rank_wait')),
sk AS (SELECT * FROM query_table(side || '_collective_skew')),
lbt AS (SELECT * FROM query_table(side || '_latency_bound_total')),
bw AS (
  SELECT * REPLACE (_diff_busbw(busbw_gbps, bandwidth_check) AS busbw_gbps)
  FROM query_table(side || '_collective_bandwidth')
  QUALIFY row_number() OVER (PARTITION BY collective, group_size, bucket_lo_bytes ORDER BY group_size_assumed) = 1
),
job AS (
  SELECT (SELECT steps FROM b)::DOUBLE AS steps,
         (SELECT sum(exposed_comm_ns / steps) FROM rt) AS exposed_comm_ns_per_step,
         (SELECT sum(idle_ns / steps) FROM rt) AS idle_ns_per_step,
         (SELECT sum(comm_ns / steps) FROM rt) AS comm_ns_per_step,
         (SELECT sum(busy_ns / steps) FROM rt) AS busy_ns_per_step,
         (SELECT 100.0 * sum(comm_overlapped_ns) / nullif(sum(comm_ns), 0) FROM rt) AS overlap_pct,
         (SELECT sum(total_wait_ns) FROM rw) / n.steps AS wait_ns_per_step,
         (SELECT max(start_skew_ns) FROM sk)::DOUBLE AS max_start_skew_ns,
         (SELECT avg(start_skew_ns) FROM sk)::DOUBLE AS mean_start_skew_ns,
         (SELECT max(latency_bound_pct) FROM lbt)::DOUBLE AS latency_bound_pct,
         (SELECT max(coalescing_saving_ns) FROM lbt) / n.steps AS coalescing_saving_ns_per_step,
         (SELECT sum(total_wait_ns) FROM rw) / (SELECT nullif(sum(ops), 0) FROM wk) AS wait_ns_per_op
  FROM n
),
coll AS (
  SELECT h.collective, NULL::BIGINT AS group_size, h.bucket_lo_bytes, h.bucket_hi_bytes,
         h.ops / n.steps AS ops_per_step, h.total_bytes / n.steps AS bytes_per_step,
         h.total_ns / n.steps AS time_ns_per_step, e.exposed_ns / n.steps AS exposed_ns_per_step,
         h.total_bytes / nullif(h.ops, 0) AS bytes_per_op, h.total_ns / nullif(h.ops, 0) AS time_ns_per_op,
         e.exposed_ns / nullif(h.ops, 0) AS exposed_ns_per_op
  FROM hist h CROSS JOIN n
  LEFT JOIN expo e ON e.collective = h.collective AND e.bucket_lo_bytes IS NOT DISTINCT FROM h.bucket_lo_bytes
),
rk AS (
  SELECT coalesce(o.rank, w.rank) AS rank, o.exposed_comm_ns / o.steps AS exposed_comm_ns_per_step,
         o.idle_ns / o.steps AS idle_ns_per_step, o.comm_ns / o.steps AS comm_ns_per_step,
         100.0 * o.comm_overlapped_ns / nullif(o.comm_ns, 0) AS overlap_pct,
         w.total_wait_ns / n.steps AS wait_ns_per_step
  FROM rt o FULL JOIN rw w ON o.rank = w.rank CROSS JOIN n
),
skew_c AS (
  SELECT collective, avg(start_skew_ns)::DOUBLE AS mean_start_skew_ns,
         max(start_skew_ns)::DOUBLE AS max_start_skew_ns
  FROM sk WHERE start_skew_ns IS NOT NULL GROUP BY collective
),
skew_r AS (
  SELECT rank, arrived_last_pct::DOUBLE AS arrived_last_pct, is_straggler::INT::DOUBLE AS is_straggler,
         straggler_rank_order::DOUBLE AS straggler_rank_order
  FROM rw
),
lat AS (
  SELECT collective, group_size, latency_floor_ns::DOUBLE AS latency_floor_ns,
         transfer_p50_ns::DOUBLE AS transfer_p50_ns, alpha_us::DOUBLE AS alpha_us, beta_gbps::DOUBLE AS beta_gbps,
         n_half_bytes::DOUBLE AS n_half_bytes, latency_bound_pct::DOUBLE AS latency_bound_pct
  FROM query_table(side || '_latency_model')
),
rows AS (
  SELECT 'job' AS section, metric, NULL::VARCHAR AS collective, NULL::BIGINT AS group_size,
         NULL::BIGINT AS bucket_lo_bytes, NULL::BIGINT AS bucket_hi_bytes, NULL::BIGINT AS rank,
         value::DOUBLE AS value
  FROM job UNPIVOT INCLUDE NULLS (value FOR metric IN (steps, exposed_comm_ns_per_step, idle_ns_per_step,
    comm_ns_per_step, busy_ns_per_step, overlap_pct, wait_ns_per_step, wait_ns_per_op, max_start_skew_ns,
    mean_start_skew_ns, latency_bound_pct, coalescing_saving_ns_per_step))
  UNION ALL
  SELECT 'collective', metric, collective, group_size, bucket_lo_bytes, bucket_hi_bytes, NULL, value::DOUBLE
  FROM coll UNPIVOT INCLUDE NULLS (value FOR metric IN (ops_per_step, bytes_per_step, time_ns_per_step,
    exposed_ns_per_step, bytes_per_op, time_ns_per_op, exposed_ns_per_op))
  UNION ALL
  SELECT 'collective', 'busbw_gbps', collective, group_size, bucket_lo_bytes, bucket_hi_bytes, NULL,
         busbw_gbps::DOUBLE
  FROM bw
  UNION ALL
  SELECT 'rank', metric, NULL, NULL, NULL, NULL, rank, value::DOUBLE
  FROM rk UNPIVOT INCLUDE NULLS (value FOR metric IN (exposed_comm_ns_per_step, idle_ns_per_step,
    comm_ns_per_step, overlap_pct, wait_ns_per_step))
  UNION ALL
  SELECT 'skew', metric, collective, NULL, NULL, NULL, NULL, value::DOUBLE
  FROM skew_c UNPIVOT INCLUDE NULLS (value FOR metric IN (mean_start_skew_ns, max_start_skew_ns))
  UNION ALL
  SELECT 'skew', metric, NULL, NULL, NULL, NULL, rank, value::DOUBLE
  FROM skew_r UNPIVOT INCLUDE NULLS (value FOR metric IN (arrived_last_pct, is_straggler, straggler_rank_order))
  UNION ALL
  SELECT 'latency', metric, collective, group_size, NULL, NULL, NULL, value::DOUBLE
  FROM lat UNPIVOT INCLUDE NULLS (value FOR metric IN (latency_floor_ns, transfer_p50_ns, alpha_us, beta_gbps,
    n_half_bytes, latency_bound_pct))
)
SELECT section, metric, collective, group_size, bucket_lo_bytes, bucket_hi_bytes, rank, value FROM rows
ORDER BY section, metric, collective NULLS FIRST, group_size NULLS FIRST, bucket_lo_bytes NULLS FIRST, rank NULLS FIRST;

-- @macro diff_metrics
-- The metrics of a diff, in their order within one subject, with what each is. On the window basis the metrics
-- named *_per_step here are named *_per_window in diff_rows.
-- @column section [key]: 'job', 'collective', 'rank', 'skew' or 'latency'.
-- @column metric [key]: Metric name (the step basis' name).
-- @column meaning [key]: What the value is, from which catalog column.
-- @column has_impact: True when the metric is itself exposed communication or idle time per step, so its rows carry
-- an impact_ns on the step basis (on the window basis only the job's exposed communication and each size bucket's
-- exposed_ns_per_op do: this file's header).
-- @column section_ord: Order of the section (0 = job).
-- @column metric_ord: Order of the metric (over all sections).
CREATE OR REPLACE MACRO diff_metrics() AS TABLE
WITH m(metric_ord, section, metric, meaning, has_impact) AS (VALUES
  (0, 'job', 'steps', 'iterations per rank (diff_basis.steps: the most any rank has; 1 without iterations)', false),
  (1, 'job', 'exposed_comm_ns_per_step', 'Σ ranks of rank exposed_comm_ns_per_step', true),
  (2, 'job', 'idle_ns_per_step', 'Σ ranks of rank idle_ns_per_step', true),
  (3, 'job', 'comm_ns_per_step', 'Σ ranks of rank comm_ns_per_step', false),
  (4, 'job', 'busy_ns_per_step', 'Σ ranks of the rank''s busy_ns per step (as the rank rows)', false),
  (5, 'job', 'overlap_pct', '100 × Σ comm_overlapped_ns / Σ comm_ns over ranks'' steps', false),
  (6, 'job', 'wait_ns_per_step', 'Σ ranks rank_wait.total_wait_ns / steps', false),
  (7, 'job', 'wait_ns_per_op', 'Σ ranks rank_wait.total_wait_ns / Σ msg_size_histogram.ops (per operation)', false),
  (8, 'job', 'max_start_skew_ns', 'largest collective_skew.start_skew_ns', false),
  (9, 'job', 'mean_start_skew_ns', 'mean collective_skew.start_skew_ns over instances seen on >= 2 ranks', false),
  (10, 'job', 'latency_bound_pct', 'latency_bound_total.latency_bound_pct', false),
  (11, 'job', 'coalescing_saving_ns_per_step', 'latency_bound_total.coalescing_saving_ns / steps', false),
  (12, 'collective', 'ops_per_step', 'msg_size_histogram.ops / steps (all ranks)', false),
  (13, 'collective', 'bytes_per_step', 'msg_size_histogram.total_bytes / steps (all ranks)', false),
  (14, 'collective', 'time_ns_per_step', 'msg_size_histogram.total_ns / steps (kernel time, all ranks)', false),
  (15, 'collective', 'exposed_ns_per_step', 'msg_size_exposure.exposed_ns / steps (all ranks)', true),
  (16, 'collective', 'bytes_per_op', 'msg_size_histogram.total_bytes / ops: mean size S of an operation', false),
  (17, 'collective', 'time_ns_per_op', 'msg_size_histogram.total_ns / ops: kernel time per operation', false),
  (18, 'collective', 'exposed_ns_per_op', 'msg_size_exposure.exposed_ns / ops: exposed time per operation', false),
  (19, 'collective', 'busbw_gbps', 'collective_bandwidth.busbw_gbps, per group size (a recorded group size before an '
                               'assumed one)', false),
  (20, 'rank', 'exposed_comm_ns_per_step', 'overlap_by_step.exposed_comm_ns summed over the rank''s steps / its steps '
                                       '(detected iterations: overlap_by_rank / iterations; neither: one step)', true),
  (21, 'rank', 'idle_ns_per_step', 'the rank''s idle_ns per step, as exposed_comm_ns_per_step', true),
  (22, 'rank', 'comm_ns_per_step', 'the rank''s comm_ns per step, as exposed_comm_ns_per_step', false),
  (23, 'rank', 'overlap_pct', '100 × comm_overlapped_ns / comm_ns over the rank''s steps (comm_overlap_pct)', false),
  (24, 'rank', 'wait_ns_per_step', 'rank_wait.total_wait_ns / steps', false),
  (25, 'skew', 'mean_start_skew_ns', 'per collective: mean collective_skew.start_skew_ns', false),
  (26, 'skew', 'max_start_skew_ns', 'per collective: largest collective_skew.start_skew_ns', false),
  (27, 'skew', 'arrived_last_pct', 'per rank: rank_wait.arrived_last_pct', false),
  (28, 'skew', 'is_straggler', 'per rank: 1 when rank_wait.is_straggler (arrives last more often than chance, the '
                           'summary''s and report''s rule), else 0', false),
  (29, 'skew', 'straggler_rank_order', 'per rank: rank_wait.straggler_rank_order (TraceLens'' ranking by total wait, '
                                   '1 = least wait; no verdict: see is_straggler)', false),
  (30, 'latency', 'latency_floor_ns', 'latency_model.latency_floor_ns', false),
  (31, 'latency', 'transfer_p50_ns', 'latency_model.transfer_p50_ns', false),
  (32, 'latency', 'alpha_us', 'latency_model.alpha_us', false),
  (33, 'latency', 'beta_gbps', 'latency_model.beta_gbps', false),
  (34, 'latency', 'n_half_bytes', 'latency_model.n_half_bytes', false),
  (35, 'latency', 'latency_bound_pct', 'latency_model.latency_bound_pct', false)
)
SELECT section, metric, meaning, has_impact,
       (CASE section WHEN 'job' THEN 0 WHEN 'collective' THEN 1 WHEN 'rank' THEN 2 WHEN 'skew' THEN 3 ELSE 4 END)
         ::BIGINT AS section_ord,
       metric_ord::BIGINT AS metric_ord
FROM m
ORDER BY metric_ord;

-- @macro diff_matched_work
-- The work both runs hold, per (collective, size bucket): the operations of each side (all ranks), the matched
-- ones (the fewer of the two) and the change in exposed time over them. The impact on the window basis.
-- @param base_side: Prefix of the base run's tables (see this file's header).
-- @param new_side: Prefix of the new run's tables.
-- @column collective [key]: Canonical collective.
-- @column bucket_lo_bytes [key]: Size bucket lower bound (bytes); NULL for unknown sizes.
-- @column base_ops [key]: Operations in the base run; NULL when the bucket is not in it.
-- @column new_ops [key]: Operations in the new run; NULL when the bucket is not in it.
-- @column matched_ops: least(base_ops, new_ops); NULL when the bucket is in one run only.
-- @column base_exposed_ns: The base's exposed time over the matched operations: matched_ops × its exposed ns per
-- operation (ns).
-- @column impact_ns [key]: matched_ops × (new − base exposed ns per operation) (ns); NULL without matched operations or
-- exposed time.
CREATE OR REPLACE MACRO diff_matched_work(base_side, new_side) AS TABLE
SELECT coalesce(b.collective, n.collective) AS collective, coalesce(b.bucket_lo_bytes, n.bucket_lo_bytes)
         AS bucket_lo_bytes, b.ops AS base_ops, n.ops AS new_ops, least(b.ops, n.ops) AS matched_ops,
       least(b.ops, n.ops) * b.exposed_ns / b.ops AS base_exposed_ns,
       least(b.ops, n.ops) * (n.exposed_ns / n.ops - b.exposed_ns / b.ops) AS impact_ns
FROM _diff_side_work(base_side) b FULL JOIN _diff_side_work(new_side) n
  ON b.collective = n.collective AND b.bucket_lo_bytes IS NOT DISTINCT FROM n.bucket_lo_bytes
ORDER BY collective, bucket_lo_bytes NULLS FIRST;

-- @macro diff_rows
-- The rows of nsys2comm diff: per (section, metric, key) both runs' values, the change and its impact (this file's
-- header), sorted by |impact_ns| descending (NULL last), then impact_ns descending (a regression before an
-- improvement of the same size), section, collective, bucket_lo_bytes, group_size, rank (NULLs first) and the metric
-- order of diff_metrics. A row present on one side only has the other side NULL.
-- @param base_side: Prefix of the base run's tables (see this file's header).
-- @param new_side: Prefix of the new run's tables.
-- @param base_complete: False when the base's overlap or exposure analysis failed: a time missing on that side is
-- then unknown rather than 0.
-- @param new_complete: The same for the new run.
-- @column section [key]: 'job', 'collective', 'rank', 'skew' or 'latency'.
-- @column metric [key]: Metric name (diff_metrics), *_per_step named *_per_window on the window basis.
-- @column base [key]: Value in the base run; NULL when not available.
-- @column new [key]: Value in the new run; NULL when not available.
-- @column delta [key]: new − base; NULL when either is.
-- @column delta_pct [key]: 100 × delta / base; NULL when base is 0 or either is NULL.
-- @column impact_ns [key]: Change in exposed communication or idle ns that the row's metric measures (ns per step on the
-- step basis; over the matched work on the window basis); NULL for the other metrics.
-- @column collective: Collective the row is about, else NULL.
-- @column group_size: Group size (busbw_gbps and latency rows), else NULL.
-- @column bucket_lo_bytes: Size bucket lower bound (bytes; collective rows), else NULL.
-- @column bucket_hi_bytes: Size bucket upper bound, exclusive (bytes; collective rows), else NULL.
-- @column rank: Rank the row is about, else NULL.
CREATE OR REPLACE MACRO diff_rows(base_side, new_side, base_complete := true, new_complete := true) AS TABLE
WITH basis AS (SELECT any_value(per) AS per, any_value(per) = 'step' AS by_step FROM diff_basis(base_side, new_side)),
bv AS (SELECT * FROM diff_side_values(base_side, (SELECT by_step FROM basis))),
nv AS (SELECT * FROM diff_side_values(new_side, (SELECT by_step FROM basis))),
mw AS (SELECT * FROM diff_matched_work(base_side, new_side)),
d AS (
  SELECT coalesce(b.section, n.section) AS section, coalesce(b.metric, n.metric) AS metric,
         coalesce(b.collective, n.collective) AS collective, coalesce(b.group_size, n.group_size) AS group_size,
         coalesce(b.bucket_lo_bytes, n.bucket_lo_bytes) AS bucket_lo_bytes,
         coalesce(b.bucket_hi_bytes, n.bucket_hi_bytes) AS bucket_hi_bytes, coalesce(b.rank, n.rank) AS rank,
         b.value AS base, n.value AS new
  FROM bv b FULL JOIN nv n
    ON b.section = n.section AND b.metric = n.metric AND b.collective IS NOT DISTINCT FROM n.collective
   AND b.group_size IS NOT DISTINCT FROM n.group_size AND b.bucket_lo_bytes IS NOT DISTINCT FROM n.bucket_lo_bytes
   AND b.rank IS NOT DISTINCT FROM n.rank
),
i AS (
  SELECT d.*, o.section_ord, o.metric_ord,
         CASE WHEN (SELECT by_step FROM basis) THEN
                CASE WHEN o.has_impact AND (d.base IS NOT NULL OR d.new IS NOT NULL)
                     THEN coalesce(d.new, CASE WHEN new_complete THEN 0 END)
                          - coalesce(d.base, CASE WHEN base_complete THEN 0 END) END
              WHEN d.section = 'job' AND d.metric = 'exposed_comm_ns_per_step'
                THEN (SELECT sum(impact_ns) FROM mw WHERE matched_ops > 0 HAVING count(*) > 0)
              WHEN d.section = 'collective' AND d.metric = 'exposed_ns_per_op'
                THEN (SELECT w.impact_ns FROM mw w WHERE w.matched_ops > 0 AND w.collective = d.collective
                      AND w.bucket_lo_bytes IS NOT DISTINCT FROM d.bucket_lo_bytes) END AS impact_ns
  FROM d JOIN diff_metrics() o ON o.section = d.section AND o.metric = d.metric
)
SELECT section, replace(metric, '_per_step', '_per_' || (SELECT per FROM basis)) AS metric, base, new,
       new - base AS delta, CASE WHEN base <> 0 THEN 100.0 * (new - base) / base END AS delta_pct, impact_ns,
       collective, group_size, bucket_lo_bytes, bucket_hi_bytes, rank
FROM i
ORDER BY abs(impact_ns) DESC NULLS LAST, impact_ns DESC NULLS LAST, section_ord, collective NULLS FIRST,
         bucket_lo_bytes NULLS FIRST, group_size NULLS FIRST, rank NULLS FIRST, metric_ord;

-- @macro diff_busbw_change
-- Bus bandwidth change between two runs: the mean of busbw_gbps' relative change over the (collective, group size,
-- size bucket) rows known on both sides, weighted by the base's kernel time in the bucket.
-- @param base_side: Prefix of the base run's tables (see this file's header).
-- @param new_side: Prefix of the new run's tables.
-- @column busbw_change_pct [key]: Σ base total_ns × 100 × (new − base busbw) / base busbw ÷ Σ base total_ns; NULL when no
-- bucket has a bus bandwidth on both sides.
-- @column buckets [key]: Buckets with a bus bandwidth on both sides.
CREATE OR REPLACE MACRO diff_busbw_change(base_side, new_side) AS TABLE
WITH bb AS (
  SELECT * REPLACE (_diff_busbw(busbw_gbps, bandwidth_check) AS busbw_gbps)
  FROM query_table(base_side || '_collective_bandwidth')
  QUALIFY row_number() OVER (PARTITION BY collective, group_size, bucket_lo_bytes ORDER BY group_size_assumed) = 1
), nb AS (
  SELECT * REPLACE (_diff_busbw(busbw_gbps, bandwidth_check) AS busbw_gbps)
  FROM query_table(new_side || '_collective_bandwidth')
  QUALIFY row_number() OVER (PARTITION BY collective, group_size, bucket_lo_bytes ORDER BY group_size_assumed) = 1
)
SELECT (sum(b.total_ns * 100.0 * (n.busbw_gbps - b.busbw_gbps) / b.busbw_gbps) / sum(b.total_ns))::DOUBLE
         AS busbw_change_pct,
       count(*) AS buckets
FROM bb b JOIN nb n ON b.collective = n.collective AND b.group_size IS NOT DISTINCT FROM n.group_size
 AND b.bucket_lo_bytes = n.bucket_lo_bytes
WHERE b.busbw_gbps > 0 AND n.busbw_gbps IS NOT NULL AND b.total_ns > 0
ORDER BY buckets;

-- @macro diff_headline
-- The headline of a diff (the figures nsys2comm diff --json gives beside its rows and checks thresholds on).
-- @param base_side: Prefix of the base run's tables (see this file's header).
-- @param new_side: Prefix of the new run's tables.
-- @param base_complete: As diff_rows.
-- @param new_complete: As diff_rows.
-- @column per [key]: 'step' or 'window' (diff_basis).
-- @column step_impact_ns [key]: Step basis: change in exposed communication + idle ns per step, summed over ranks (the
-- impacts of the job's exposed_comm_ns_per_step and idle_ns_per_step rows); NULL on the window basis.
-- @column impact_ns [key]: step_impact_ns on the step basis; on the window basis the change in exposed communication over
-- the matched work (Σ diff_matched_work.impact_ns over buckets with matched operations), NULL when there are none.
-- @column exposed_comm_change_pct [key]: Step basis: delta_pct of the job's exposed_comm_ns_per_step; window basis: 100 ×
-- impact_ns / the base's exposed ns over the matched work. NULL when the base has none.
-- @column wait_change_pct [key]: delta_pct of the job's wait_ns_per_step (step basis) or wait_ns_per_op (window basis).
-- @column busbw_change_pct [key]: diff_busbw_change.busbw_change_pct.
-- @column busbw_buckets: diff_busbw_change.buckets.
-- @column matched_buckets: (collective, size bucket) pairs with operations in both runs.
-- @column different_work_buckets: (collective, size bucket) pairs whose operations differ between the runs.
CREATE OR REPLACE MACRO diff_headline(base_side, new_side, base_complete := true, new_complete := true) AS TABLE
WITH basis AS (SELECT any_value(per) AS per FROM diff_basis(base_side, new_side)),
j AS (
  SELECT replace(metric, '_per_window', '_per_step') AS metric, impact_ns, delta_pct
  FROM diff_rows(base_side, new_side, base_complete, new_complete) WHERE section = 'job'
),
mw AS (SELECT * FROM diff_matched_work(base_side, new_side)),
m AS (
  SELECT sum(impact_ns) FILTER (WHERE matched_ops > 0) AS impact_ns,
         sum(base_exposed_ns) FILTER (WHERE matched_ops > 0) AS base_ns,
         count(*) FILTER (WHERE matched_ops > 0) AS matched,
         count(*) FILTER (WHERE base_ops IS DISTINCT FROM new_ops) AS different
  FROM mw
),
bw AS (SELECT * FROM diff_busbw_change(base_side, new_side)),
s AS (
  SELECT CASE WHEN basis.per = 'step' THEN
           (SELECT impact_ns FROM j WHERE metric = 'exposed_comm_ns_per_step')
           + (SELECT impact_ns FROM j WHERE metric = 'idle_ns_per_step') END AS step_impact_ns,
         basis.per
  FROM basis
)
SELECT s.per, s.step_impact_ns::DOUBLE AS step_impact_ns,
       (CASE WHEN s.per = 'step' THEN s.step_impact_ns WHEN m.matched > 0 THEN m.impact_ns END)::DOUBLE AS impact_ns,
       (CASE WHEN s.per = 'step' THEN (SELECT delta_pct FROM j WHERE metric = 'exposed_comm_ns_per_step')
             WHEN m.matched > 0 AND m.base_ns <> 0 THEN 100.0 * m.impact_ns / m.base_ns END)::DOUBLE
         AS exposed_comm_change_pct,
       (SELECT delta_pct FROM j WHERE metric = CASE WHEN s.per = 'step' THEN 'wait_ns_per_step'
                                                    ELSE 'wait_ns_per_op' END)::DOUBLE AS wait_change_pct,
       bw.busbw_change_pct, bw.buckets AS busbw_buckets, m.matched AS matched_buckets,
       m.different AS different_work_buckets
FROM s, m, bw
ORDER BY s.per;
