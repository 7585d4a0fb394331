-- Per-rank GPU timeline as a +1/-1 event sweep (the shared engine of overlap_by_rank, time_breakdown_by_rank
-- and overlap_by_step). One sort per rank, one window pass, then a small aggregation: O(n log n).
--
-- Classes (default mode): communication = kernels.kernel_class 'communication'; gemm = 'gemm'; compute = the
-- other compute classes ('attention', 'compute'); memory = 'memory'-class kernels and every mem_ops row
-- (copies and memsets are not compute). "Computation" in the public objects is gemm ∪ compute.
--
-- Algorithm: every interval gives a start event (+d) and an end event (-d), where d packs one counter per class
-- into a BIGINT (12 bits each: communication, gemm, compute, memory; 15 bits for "inside a step"). The running
-- sum (ORDER BY ts, ord) gives the class counts after each event; the state before it is cum - delta. Time spent
-- in a state S is  Σ ts·[state_before = S] − Σ ts·[state_after = S]  (the sum telescopes, so the order of events
-- that share a timestamp does not matter). Steps are extra events: step ends sort first, step starts last at equal
-- ts, and each event belongs to the last step started (running max of the step ordinal, same window).

-- @macro _steps
-- Iteration ranges per rank: Kineto ProfilerStep#N user annotations (cpu_ranges kind 'user_annotation'), else
-- NVTX ranges named like an iteration ('ProfilerStep#N', 'step N', 'iteration N', 'iter N', 'train_step N').
-- Steps are assumed sequential on a rank; unfinished ranges are ignored.
-- @column rank: Rank.
-- @column step_ord: 1, 2, ... in start order on that rank.
-- @column step_name: Range name.
-- @column step_no: The number in the name (N), when present.
-- @column step_start_ns: Range start (ns, CPU timeline).
-- @column step_end_ns: Range end (ns, CPU timeline).
-- @column step_source: 'profiler_step' or 'nvtx'.
CREATE OR REPLACE MACRO _steps() AS TABLE
WITH ps AS (
  SELECT rank, name, start_ns, end_ns, 'profiler_step' AS src FROM cpu_ranges
  WHERE kind = 'user_annotation' AND name LIKE 'ProfilerStep#%' AND end_ns IS NOT NULL
), nv AS (
  SELECT rank, name, start_ns, end_ns, 'nvtx' AS src FROM cpu_ranges
  WHERE kind = 'nvtx' AND end_ns IS NOT NULL
    AND regexp_matches(name, '^(ProfilerStep#|step[ _#:]*|iteration[ _#:]*|iter[ _#:]*|train_step[ _#:]*)[0-9]+$', 'i')
    AND rank NOT IN (SELECT rank FROM ps)
), s AS (SELECT * FROM ps UNION ALL SELECT * FROM nv)
SELECT rank, row_number() OVER (PARTITION BY rank ORDER BY start_ns, end_ns, name) AS step_ord, name AS step_name,
       TRY_CAST(regexp_extract(name, '([0-9]+)$', 1) AS BIGINT) AS step_no,
       start_ns AS step_start_ns, end_ns AS step_end_ns, src AS step_source
FROM s
ORDER BY rank, step_ord;

-- @macro _gpu_intervals
-- GPU intervals per rank with their class bit, in the requested compatibility mode.
-- compat 'none': exact ns, classes as described in this file's header.
-- compat 'hta': HolisticTraceAnalysis 0.5.0 semantics — classes by kernel/mem_ops name regex (COMM '^nccl.*Kernel';
-- OTHER '^((nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync))', counted as memory; everything else COMP, split into
-- gemm / compute by kernel_class), times rounded on the file's own clock (start up to the next µs, end down to
-- the previous µs), and when a rank has >= 2 distinct ProfilerStep# names only GPU work whose correlation id
-- matches a runtime/driver call starting before the last ProfilerStep start is kept.
-- Unordered (a private feed of the sweep; sorting it here would cost a full extra sort).
-- @param compat: 'none' or 'hta'.
-- @column rank: Rank.
-- @column start_ns: Interval start (ns).
-- @column end_ns: Interval end (ns); may be < start_ns in 'hta' mode (rounding of sub-µs events).
-- @column cls: Class bit: 0 communication, 1 gemm, 2 compute, 3 memory.
CREATE OR REPLACE MACRO _gpu_intervals(compat := 'none') AS TABLE
WITH raw AS (
  SELECT rank, file_id, start_ns, end_ns, name, kernel_class, correlation_id FROM kernels
  UNION ALL
  SELECT rank, file_id, start_ns, end_ns, name, 'memory', correlation_id FROM mem_ops
), last_step AS (
  SELECT rank, max(start_ns) AS last_start FROM cpu_ranges
  WHERE kind = 'user_annotation' AND name LIKE 'ProfilerStep#%'
  GROUP BY rank HAVING count(DISTINCT name) >= 2
), kept_corr AS (
  SELECT DISTINCT a.rank, a.correlation_id FROM api_calls a JOIN last_step l USING (rank)
  WHERE a.start_ns < l.last_start AND a.correlation_id IS NOT NULL
), hta AS (
  SELECT r.rank,
         r.start_ns - coalesce(f.clock_offset_ns, 0) AS s_raw, r.end_ns - coalesce(f.clock_offset_ns, 0) AS e_raw,
         coalesce(f.clock_offset_ns, 0) AS off,
         CASE WHEN regexp_matches(r.name, '^nccl.*Kernel') THEN 0
              WHEN regexp_matches(r.name, '^((nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync))') THEN 3
              WHEN r.kernel_class = 'gemm' THEN 1 ELSE 2 END AS cls
  FROM raw r LEFT JOIN files f USING (file_id)
  WHERE r.rank NOT IN (SELECT rank FROM last_step)
     OR (r.rank, r.correlation_id) IN (SELECT (rank, correlation_id) FROM kept_corr)
)
SELECT rank, start_ns, end_ns,
       CASE kernel_class WHEN 'communication' THEN 0 WHEN 'gemm' THEN 1 WHEN 'memory' THEN 3 ELSE 2 END AS cls
FROM raw WHERE compat = 'none'
UNION ALL
SELECT rank,
       off + (s_raw - (s_raw % 1000 + 1000) % 1000) + CASE WHEN s_raw % 1000 <> 0 THEN 1000 ELSE 0 END,
       off + (e_raw - (e_raw % 1000 + 1000) % 1000),
       cls
FROM hta WHERE compat = 'hta';

-- @macro _state_bits
-- Decodes a packed class-counter sum into the state bit set: 1 communication, 2 gemm, 4 compute, 8 memory,
-- 16 inside a step (a bit is set when its 12-bit counter, or the step counter, is > 0).
-- @param c: Packed counters (BIGINT).
CREATE OR REPLACE MACRO _state_bits(c) AS
  (CASE WHEN (c & 4095) > 0 THEN 1 ELSE 0 END)
  + (CASE WHEN ((c >> 12) & 4095) > 0 THEN 2 ELSE 0 END)
  + (CASE WHEN ((c >> 24) & 4095) > 0 THEN 4 ELSE 0 END)
  + (CASE WHEN ((c >> 36) & 4095) > 0 THEN 8 ELSE 0 END)
  + (CASE WHEN (c >> 48) > 0 THEN 16 ELSE 0 END);

-- @macro _gpu_state_ns
-- The sweep itself: time per rank (and per step) in each combination of running classes.
-- state bits: 1 communication, 2 gemm, 4 compute, 8 memory. Rows with step_ord NULL cover the whole rank;
-- rows with step_ord cover that step's window. One extra row per rank (state -1) carries the GPU span
-- (first start, last end over all classes) and, in 'hta' mode, the negative lengths HTA adds to its merged
-- communication time for isolated communication intervals that rounding made negative.
-- @param compat: 'none' or 'hta' (see _gpu_intervals).
-- @column compat: Mode used.
-- @column rank: Rank.
-- @column step_ord: Step ordinal (_steps), or NULL for the whole rank.
-- @column state: Bit set of running classes (1 comm, 2 gemm, 4 compute, 8 memory), or -1 for the span row.
-- @column dur_ns: Time in that state (ns); for the span row, HTA's negative communication adjustment (ns, <= 0).
-- @column first_ns: Span row: first interval start (ns); else NULL.
-- @column last_ns: Span row: last interval end (ns); else NULL.
CREATE OR REPLACE MACRO _gpu_state_ns(compat := 'none') AS TABLE
WITH iv AS (
  SELECT rank, start_ns, end_ns, cls FROM _gpu_intervals(compat := compat)
), ev AS (
  SELECT rank, start_ns AS ts, 2 AS ord, CAST(1 AS BIGINT) << (12 * cls) AS delta, NULL::BIGINT AS step_ord,
         0::BIGINT AS neg_ns
  FROM iv WHERE end_ns >= start_ns
  UNION ALL
  SELECT rank, end_ns, 2, -(CAST(1 AS BIGINT) << (12 * cls)), NULL, 0 FROM iv WHERE end_ns >= start_ns
  UNION ALL  -- HTA: a communication interval made negative by rounding counts (negatively) when nothing covers it
  SELECT rank, start_ns, 1, 0, NULL, end_ns - start_ns FROM iv WHERE end_ns < start_ns AND cls = 0
  UNION ALL
  SELECT rank, step_start_ns, 3, CAST(1 AS BIGINT) << 48, step_ord, 0 FROM _steps() WHERE compat = 'none'
  UNION ALL
  SELECT rank, step_end_ns, 0, -(CAST(1 AS BIGINT) << 48), NULL, 0 FROM _steps() WHERE compat = 'none'
), sw AS (
  SELECT rank, ts, ord, delta, neg_ns,
         sum(delta) OVER w AS cum,
         max(step_ord) OVER w AS cur_step
  FROM ev
  WINDOW w AS (PARTITION BY rank ORDER BY ts, ord ROWS UNBOUNDED PRECEDING)
), bits AS (
  SELECT rank, ts, ord, neg_ns, cur_step,
         _state_bits(cum - delta) AS sb,
         _state_bits(cum) AS sa
  FROM sw
), agg AS (
  SELECT rank, cur_step, sb, sa, sum(ts) AS ts_sum,
         sum(neg_ns) FILTER (WHERE ord = 1 AND (sb & 1) = 0) AS neg_sum,
         min(ts) FILTER (WHERE ord = 2) AS first_ts, max(ts) FILTER (WHERE ord = 2) AS last_ts
  FROM bits GROUP BY rank, cur_step, sb, sa
), signed AS (
  SELECT rank, cur_step, (sb & 15) AS st, ((sb >> 4) & 1) AS in_step, ts_sum AS v FROM agg WHERE sb <> sa
  UNION ALL
  SELECT rank, cur_step, (sa & 15), ((sa >> 4) & 1), -ts_sum FROM agg WHERE sb <> sa
)
SELECT compat AS compat, rank, NULL::BIGINT AS step_ord, st AS state, CAST(sum(v) AS BIGINT) AS dur_ns,
       NULL::BIGINT AS first_ns, NULL::BIGINT AS last_ns
FROM signed WHERE st <> 0 GROUP BY rank, st HAVING sum(v) <> 0
UNION ALL
SELECT compat, rank, cur_step, st, CAST(sum(v) AS BIGINT), NULL, NULL
FROM signed WHERE st <> 0 AND in_step = 1 GROUP BY rank, cur_step, st HAVING sum(v) <> 0
UNION ALL
SELECT compat, rank, NULL, -1, CAST(coalesce(sum(neg_sum), 0) AS BIGINT), min(first_ts), max(last_ts)
FROM agg GROUP BY rank
ORDER BY rank, step_ord NULLS FIRST, state;

-- @view _gpu_timeline
-- _gpu_state_ns in default mode. The public overlap objects read it, so a caller that runs several of them can
-- materialize it once (nsys2comm.analysis.materialize replaces it by a TEMP view over a snapshot table).
-- @column compat: 'none'.
-- @column rank: Rank.
-- @column step_ord: Step ordinal or NULL for the whole rank.
-- @column state: Running-class bit set, or -1 for the span row.
-- @column dur_ns: Time in that state (ns).
-- @column first_ns: Span row: first start (ns).
-- @column last_ns: Span row: last end (ns).
CREATE OR REPLACE VIEW _gpu_timeline AS SELECT * FROM _gpu_state_ns(compat := 'none');
