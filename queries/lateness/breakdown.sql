-- @include skew/skew.sql
-- @include exposure/causes.sql
-- @include intervals/intervals.sql
-- @include lateness/iterations.sql
-- Where each iteration's time goes, per rank, and how iterations trend (tests: tests/test_iterations_breakdown.py,
-- tier 2 synthetic jobs with hand-computed parts, tier 4 the bundled example recomputed from its JSON;
-- docs/lateness.md says the same in words).
-- Every figure is a coverage of the iteration's window [start_ns, end_ns) (iterations, the rank's own clock) by one
-- of the rank's timeline pieces (_lateness_timeline_pieces), measured with intervals_covered_ns: sweeps and ASOF
-- lookups, no N×M join. The window is split exactly:
--   iteration_ns = gpu_compute_ns + comm_exposed_ns + host_bound_idle_ns + queued_idle_ns + other_idle_ns
-- with the idle rule of late_arrival_causes: a GPU-idle gap [a, b) that ends when a kernel starts at b is host-bound
-- up to that kernel's launch end + epsilon_ns and queued for the rest; idle with no kernel after it on the rank (the
-- end of the capture) is other_idle_ns.

-- @macro _lateness_timeline_pieces
-- Each rank's GPU timeline as numbered interval sets on the rank's own clock, for coverage by intervals_covered_ns
-- (grp = rank * 8 + piece): 0 every kernel; 1 non-communication kernels (compute); 2 host-bound idle (the part of
-- each gap before a kernel up to its launch end + epsilon_ns; the whole gap when the launch is unknown); 3 every
-- gap that a kernel ends (idle with a kernel after it); 4 gaps before kernels whose launch is unknown; 5 compute and
-- the transfer part of matched collectives (a consistent instance's kernels from its latest arrival to their end);
-- 6 communication kernels. The first gap of a rank starts at its first recorded activity (kernel, API call or CPU
-- range other than a Python frame: with_stack records the frames open when the profiler started as starting then).
-- @param epsilon_ns: Launch latency allowance (ns).
-- @column grp: rank * 8 + piece.
-- @column rank: Rank.
-- @column piece: 0..6 as above.
-- @column start_ns: Interval start (ns, the rank's own clock).
-- @column end_ns: Interval end (ns).
CREATE OR REPLACE MACRO _lateness_timeline_pieces(epsilon_ns) AS TABLE
WITH kk AS (
  SELECT k.rank, k.start_ns, k.end_ns, k.kernel_class, l.launch_end_ns
  FROM kernels k LEFT JOIN _exposure_launches l ON l.rank = k.rank AND l.correlation_id = k.correlation_id
), kall AS (SELECT rank AS grp, start_ns, end_ns FROM kk
), starts AS (SELECT rank, start_ns, min(launch_end_ns) AS launch_end_ns FROM kk GROUP BY rank, start_ns
), fl AS (
  SELECT rank, min(t) AS f FROM (
    SELECT rank, min(start_ns) AS t FROM kernels GROUP BY rank
    UNION ALL SELECT rank, min(start_ns) FROM api_calls GROUP BY rank
    UNION ALL SELECT rank, min(start_ns) FROM cpu_ranges WHERE kind <> 'python_function' GROUP BY rank)
  GROUP BY rank
), isl AS (SELECT * FROM intervals_union('kall')
), gaps AS (
  SELECT i.grp AS rank, least(coalesce(lag(i.end_ns) OVER (PARTITION BY i.grp ORDER BY i.start_ns), fl.f), i.start_ns)
           AS a, i.start_ns AS b, s.launch_end_ns
  FROM isl i JOIN fl ON fl.rank = i.grp JOIN starts s ON s.rank = i.grp AND s.start_ns = i.start_ns
), xfer AS (
  SELECT o.rank, greatest(o.start_ns, i.last_start_ns) + o.clock_offset_ns AS start_ns,
         o.end_ns + o.clock_offset_ns AS end_ns
  FROM _skew_ops o JOIN _skew_comm_instances i USING (instance_key)
  WHERE i.kind = 'collective' AND i.consistent AND i.ranks_seen >= 2
), pieces AS (
  SELECT rank, 0 AS piece, start_ns, end_ns FROM kk
  UNION ALL SELECT rank, 1, start_ns, end_ns FROM kk WHERE kernel_class <> 'communication'
  UNION ALL SELECT rank, 2, a, CASE WHEN launch_end_ns IS NULL THEN b
                                    ELSE least(b, greatest(a, launch_end_ns + epsilon_ns)) END FROM gaps
  UNION ALL SELECT rank, 3, a, b FROM gaps
  UNION ALL SELECT rank, 4, a, b FROM gaps WHERE launch_end_ns IS NULL
  UNION ALL SELECT rank, 5, start_ns, end_ns FROM kk WHERE kernel_class <> 'communication'
  UNION ALL SELECT rank, 5, start_ns, end_ns FROM xfer
  UNION ALL SELECT rank, 6, start_ns, end_ns FROM kk WHERE kernel_class = 'communication'
)
SELECT CAST(rank AS BIGINT) * 8 + piece AS grp, rank, piece, start_ns, end_ns FROM pieces
WHERE end_ns > start_ns;

-- @macro rank_iteration_breakdown
-- Where each rank's iterations (iterations) go: GPU compute, communication exposed and hidden, host-bound idle
-- (nothing launched), queued idle (launched but waiting: another stream, an event, a copy) and other idle (no
-- kernel after it: the end of the capture), which add up to iteration_ns exactly; and the rank's arrival order at
-- the iteration's matched collectives. Times on the rank's own clock; kernels count where they run inside the
-- window (a marker is a CPU range: GPU work that runs past its end counts in the next window).
-- @param epsilon_ns: Launch latency allowance: idle before a kernel that started within epsilon_ns of its launch
-- end is host-bound (ns, default 10000).
-- @param marker: As iterations: the user's iteration range name ('' default: ProfilerStep/NVTX step markers).
-- @param min_score: As iterations (default 0.9).
-- @column rank [key]: Rank.
-- @column iteration_index [key]: The rank's iteration (iterations.iteration: 0, 1, ...).
-- @column step_no: The marker's number, when there is one.
-- @column iteration_source: 'marker', 'detected' or 'whole_capture' (iterations).
-- @column start_ns: Iteration start (ns, the rank's own clock).
-- @column end_ns: Iteration end (ns).
-- @column iteration_ns [key]: end_ns − start_ns (ns).
-- @column gpu_compute_ns: Non-communication kernels running on any stream (ns).
-- @column comm_exposed_ns [key]: Communication kernels running with no computation (ns).
-- @column comm_hidden_ns: Communication kernels running under computation (ns; not part of the split).
-- @column comm_transfer_ns: Part of comm_exposed_ns inside matched collectives after their last rank arrived (ns).
-- @column comm_wait_ns: comm_exposed_ns − comm_transfer_ns: waiting for peers inside collective kernels, or
-- communication not matched across ranks (ns).
-- @column host_bound_idle_ns [key]: GPU idle with nothing launched (ns).
-- @column queued_idle_ns: GPU idle although work was launched (ns).
-- @column other_idle_ns: GPU idle with no kernel after it on the rank (ns).
-- @column launch_unknown_idle_ns: Part of host_bound_idle_ns before kernels whose launch is unknown (ns): that much
-- of it assumes the host was late.
-- @column collectives: Matched collective instances (consistent, on >= 2 ranks) whose kernel on this rank starts in
-- the iteration.
-- @column mean_arrival_pos: Mean arrival position at them (0 = first; ties share the earlier position); NULL when
-- collectives = 0.
-- @column mean_arrival_pct: Mean of 100 × position / (ranks in the instance − 1): 0 always first, 100 always last;
-- NULL when collectives = 0.
-- @column times_last: Instances where this rank arrived last (collective_skew.last_arriving_rank).
-- @column times_first: Instances where this rank arrived first (first_arriving_rank).
CREATE OR REPLACE MACRO rank_iteration_breakdown(epsilon_ns := _lateness_epsilon_ns(), marker := '',
    min_score := _lateness_min_score()) AS TABLE
WITH it AS (
  SELECT rank, iteration, step_no, iteration_source, start_ns, end_ns
  FROM iterations(min_score := min_score, marker := marker)
), tp AS (SELECT grp, start_ns, end_ns FROM _lateness_timeline_pieces(epsilon_ns)
), probes AS (
  SELECT CAST(it.rank AS BIGINT) * 8 + p.piece AS grp, it.iteration AS probe_id, it.start_ns, it.end_ns
  FROM it, (SELECT unnest(range(7)) AS piece) p
), parts AS (  -- the exact split from the coverages c0..c6 (pieces of _lateness_timeline_pieces)
  SELECT grp // 8 AS rank, probe_id,
         sum(covered_ns) FILTER (WHERE grp % 8 = 0) AS c0, sum(covered_ns) FILTER (WHERE grp % 8 = 1) AS c1,
         sum(covered_ns) FILTER (WHERE grp % 8 = 2) AS c2, sum(covered_ns) FILTER (WHERE grp % 8 = 3) AS c3,
         sum(covered_ns) FILTER (WHERE grp % 8 = 4) AS c4, sum(covered_ns) FILTER (WHERE grp % 8 = 5) AS c5,
         sum(covered_ns) FILTER (WHERE grp % 8 = 6) AS c6
  FROM intervals_covered_ns('tp', 'probes') GROUP BY grp // 8, probe_id
), inst AS (
  SELECT instance_key, last_arriving_rank, first_arriving_rank FROM _skew_comm_instances
  WHERE kind = 'collective' AND consistent AND ranks_seen >= 2
), ao AS (
  SELECT o.instance_key, o.rank, min(o.start_ns) AS arr_ns, min(o.start_ns + o.clock_offset_ns) AS own_ns
  FROM _skew_ops o JOIN inst USING (instance_key) GROUP BY o.instance_key, o.rank
), pos AS (
  SELECT ao.instance_key, ao.rank, ao.own_ns, rank() OVER (PARTITION BY ao.instance_key ORDER BY ao.arr_ns) - 1 AS pos,
         count(*) OVER (PARTITION BY ao.instance_key) AS n,
         ao.rank = inst.last_arriving_rank AS is_last, ao.rank = inst.first_arriving_rank AS is_first
  FROM ao JOIN inst USING (instance_key)
), pit AS (
  SELECT p.*, i.iteration, i.end_ns FROM pos p ASOF JOIN it i ON i.rank = p.rank AND p.own_ns >= i.start_ns
), arr AS (  -- the percentages summed in one fixed order (a float sum depends on its order; avg of integers is exact)
  SELECT rank, iteration, count(*) AS collectives, avg(pos) AS mean_pos,
         list_sum(list(100.0 * pos / greatest(n - 1, 1) ORDER BY own_ns, instance_key)) / count(*) AS mean_pct,
         count(*) FILTER (WHERE is_last) AS times_last,
         count(*) FILTER (WHERE is_first) AS times_first
  FROM pit WHERE own_ns < end_ns GROUP BY rank, iteration
)
SELECT it.rank, it.iteration AS iteration_index, it.step_no, it.iteration_source, it.start_ns, it.end_ns,
       it.end_ns - it.start_ns AS iteration_ns, CAST(p.c1 AS BIGINT) AS gpu_compute_ns,
       CAST(p.c0 - p.c1 AS BIGINT) AS comm_exposed_ns, CAST(p.c6 - (p.c0 - p.c1) AS BIGINT) AS comm_hidden_ns,
       CAST(p.c5 - p.c1 AS BIGINT) AS comm_transfer_ns, CAST(p.c0 - p.c5 AS BIGINT) AS comm_wait_ns,
       CAST(p.c2 AS BIGINT) AS host_bound_idle_ns, CAST(p.c3 - p.c2 AS BIGINT) AS queued_idle_ns,
       CAST(it.end_ns - it.start_ns - p.c0 - p.c3 AS BIGINT) AS other_idle_ns,
       CAST(p.c4 AS BIGINT) AS launch_unknown_idle_ns,
       CAST(coalesce(a.collectives, 0) AS BIGINT) AS collectives, CAST(a.mean_pos AS DOUBLE) AS mean_arrival_pos,
       CAST(a.mean_pct AS DOUBLE) AS mean_arrival_pct, CAST(coalesce(a.times_last, 0) AS BIGINT) AS times_last,
       CAST(coalesce(a.times_first, 0) AS BIGINT) AS times_first
FROM it JOIN parts p ON p.rank = it.rank AND p.probe_id = it.iteration
LEFT JOIN arr a ON a.rank = it.rank AND a.iteration = it.iteration
ORDER BY it.rank, it.iteration;

-- @macro iteration_trend
-- Iteration time and exposed communication per iteration and rank against the rank's median, with a robust
-- outlier rule, so that a chart shows warm-up, drift and outliers. Rule (per rank, over its iterations, needs >= 3
-- of them): MAD = median(|x − median|); an iteration is an outlier when |iteration_ns − median| > max(3 × 1.4826 ×
-- MAD, 5 % of the median) (1.4826 × MAD estimates the standard deviation of normal data; the 5 % floor keeps
-- near-identical iterations, MAD ≈ 0, from flagging noise). Warm-up: the outliers slower than the median in an
-- unbroken run from the rank's first iteration. Drift: the least-squares slope of iteration_ns over the iterations
-- that are not outliers.
-- @param epsilon_ns: As rank_iteration_breakdown (ns, default 10000).
-- @param marker: As iterations ('' default).
-- @param min_score: As iterations (default 0.9).
-- @column iteration_index [key]: The rank's iteration (0, 1, ...).
-- @column rank [key]: Rank.
-- @column iteration_source: 'marker', 'detected' or 'whole_capture'.
-- @column step_no: The marker's number, when there is one.
-- @column iteration_ns [key]: Iteration time (ns, rank_iteration_breakdown).
-- @column comm_exposed_ns [key]: Exposed communication in it (ns).
-- @column iteration_median_ns: The rank's median iteration_ns (ns).
-- @column iteration_deviation_ns: iteration_ns − iteration_median_ns (ns).
-- @column iteration_mad_ns: The rank's median absolute deviation of iteration_ns (ns).
-- @column outlier_threshold_ns: max(3 × 1.4826 × iteration_mad_ns, 0.05 × iteration_median_ns) (ns); NULL with
-- fewer than 3 iterations.
-- @column comm_exposed_median_ns: The rank's median comm_exposed_ns (ns).
-- @column comm_exposed_deviation_ns: comm_exposed_ns − comm_exposed_median_ns (ns).
-- @column is_outlier [key]: |iteration_deviation_ns| > outlier_threshold_ns; NULL with fewer than 3 iterations.
-- @column comm_is_outlier: The same rule on comm_exposed_ns (its own median and MAD); NULL with fewer than 3.
-- @column trend_flag [key]: 'warmup', 'outlier' or 'normal' (is_outlier and the warm-up run); NULL with fewer than 3.
-- @column drift_ns_per_iteration: The rank's slope of iteration_ns per iteration over its non-outliers (ns); NULL
-- with fewer than 3 iterations or fewer than 2 non-outliers.
-- @column trend_note: Why the flags are NULL, else NULL.
CREATE OR REPLACE MACRO iteration_trend(epsilon_ns := _lateness_epsilon_ns(), marker := '',
    min_score := _lateness_min_score()) AS TABLE
WITH b AS (
  SELECT rank, iteration_index, iteration_source, step_no, iteration_ns, comm_exposed_ns
  FROM rank_iteration_breakdown(epsilon_ns := epsilon_ns, marker := marker, min_score := min_score)
), m AS (
  SELECT rank, count(*) AS n, median(iteration_ns) AS med, median(comm_exposed_ns) AS cmed FROM b GROUP BY rank
), d AS (
  SELECT b.*, m.n, m.med, m.cmed, b.iteration_ns - m.med AS dev, b.comm_exposed_ns - m.cmed AS cdev FROM b JOIN m USING (rank)
), mad AS (SELECT rank, median(abs(dev)) AS mad, median(abs(cdev)) AS cmad FROM d GROUP BY rank
), f AS (
  SELECT d.*, mad.mad, mad.cmad,
         CASE WHEN d.n >= 3 THEN greatest(3 * 1.4826 * mad.mad, 0.05 * d.med) END AS thr,
         CASE WHEN d.n >= 3 THEN greatest(3 * 1.4826 * mad.cmad, 0.05 * d.cmed) END AS cthr
  FROM d JOIN mad USING (rank)
), o AS (
  SELECT f.*, abs(dev) > thr AS is_outlier, abs(cdev) > cthr AS comm_is_outlier FROM f
), w AS (
  SELECT o.*, bool_and(is_outlier AND dev > 0) OVER (PARTITION BY rank ORDER BY iteration_index
                                                    ROWS UNBOUNDED PRECEDING) AS in_warmup,
         -- a sum, not count(*) FILTER: beside the ordered window above, DuckDB evaluated the filtered count over
         -- the whole partition once per row (O(n²): 90 s at 187k iterations per rank)
         coalesce(sum(CASE WHEN NOT is_outlier THEN 1 ELSE 0 END) OVER (PARTITION BY rank), 0) AS n_ok
  FROM o
), sl AS (  -- least-squares slope from exact integer sums (regr_slope's float updates depend on row order)
  SELECT rank, CAST(count(*) * sum(x * y) - sum(x) * sum(y) AS DOUBLE)
               / nullif(CAST(count(*) * sum(x * x) - sum(x) * sum(x) AS DOUBLE), 0) AS slope
  FROM (SELECT rank, CAST(iteration_index AS HUGEINT) AS x, CAST(iteration_ns AS HUGEINT) AS y FROM o
        WHERE NOT is_outlier)
  GROUP BY rank
)
SELECT iteration_index, rank, iteration_source, step_no, iteration_ns, comm_exposed_ns,
       CAST(med AS DOUBLE) AS iteration_median_ns, CAST(dev AS DOUBLE) AS iteration_deviation_ns,
       CAST(mad AS DOUBLE) AS iteration_mad_ns, CAST(thr AS DOUBLE) AS outlier_threshold_ns,
       CAST(cmed AS DOUBLE) AS comm_exposed_median_ns, CAST(cdev AS DOUBLE) AS comm_exposed_deviation_ns,
       is_outlier, comm_is_outlier,
       CASE WHEN n < 3 THEN NULL WHEN in_warmup THEN 'warmup' WHEN is_outlier THEN 'outlier' ELSE 'normal' END
         AS trend_flag,
       CASE WHEN n >= 3 AND n_ok >= 2 THEN CAST(slope AS DOUBLE) END AS drift_ns_per_iteration,
       CASE WHEN n < 3 THEN 'fewer than 3 iterations on the rank' END AS trend_note
FROM w LEFT JOIN sl USING (rank)
ORDER BY rank, iteration_index;
