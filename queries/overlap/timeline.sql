-- Per-rank GPU timeline as a +1/-1 event sweep (the shared engine of overlap_by_rank, time_breakdown_by_rank
-- and overlap_by_step). One sort of every rank's events, one streaming window pass, then a small aggregation: O(n log n).
--
-- Classes (default mode): communication = kernels.kernel_class 'communication'; gemm = 'gemm'; compute = the
-- other compute classes ('convolution', 'attention', 'compute'); memory = 'memory'-class kernels and every mem_ops row
-- (copies and memsets are not compute). "Computation" in the public objects is gemm ∪ compute.
--
-- Algorithm: every interval gives a start event (+d) and an end event (-d), where d packs one counter per class
-- into a BIGINT (12 bits each: communication, gemm, compute, memory; 15 bits for "inside a step"). The running
-- sum (ORDER BY ts, ord) gives the class counts after each event; the state before it is cum - delta. Time spent
-- in a state S is  Σ ts·[state_before = S] − Σ ts·[state_after = S]  (the sum telescopes, so the order of events
-- that share a timestamp does not matter). Steps are extra events: step ends sort first, step starts last at equal
-- ts, and each event belongs to the last step started (running max of the step ordinal, same window).

-- @view _overlap_step_ranges
-- @sweep per_rank
-- Iteration ranges per rank: Kineto ProfilerStep#N user annotations (cpu_ranges kind 'user_annotation'), else
-- NVTX ranges named like an iteration ('ProfilerStep#N', 'step N', 'iteration N', 'iter N', 'train_step N').
-- Steps are assumed sequential on a rank; unfinished ranges are ignored. Unordered; read it through
-- _overlap_steps. A view, so that ingest stores it with the other shared sweeps (nsys2comm.cache): the name match
-- over every CPU range cost 0.1 s per use at 2M ranges, and most analyses use it several times.
-- @column rank: Rank.
-- @column step_ord: 1, 2, ... in start order on that rank.
-- @column step_name: Range name.
-- @column step_no: The number in the name (N), when present.
-- @column step_start_ns: Range start (ns, CPU timeline).
-- @column step_end_ns: Range end (ns, CPU timeline).
-- @column step_source: 'profiler_step' or 'nvtx'.
CREATE OR REPLACE VIEW _overlap_step_ranges AS
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
FROM s;

-- @macro _overlap_steps
-- Iteration ranges per rank (_overlap_step_ranges), in rank and step order.
-- @column rank: Rank.
-- @column step_ord: 1, 2, ... in start order on that rank.
-- @column step_name: Range name.
-- @column step_no: The number in the name (N), when present.
-- @column step_start_ns: Range start (ns, CPU timeline).
-- @column step_end_ns: Range end (ns, CPU timeline).
-- @column step_source: 'profiler_step' or 'nvtx'.
CREATE OR REPLACE MACRO _overlap_steps() AS TABLE
SELECT rank, step_ord, step_name, step_no, step_start_ns, step_end_ns, step_source FROM _overlap_step_ranges
ORDER BY rank, step_ord;

-- @macro _overlap_step_window
-- The one rule for a job without steps: its whole timeline is one window, numbered ``no_steps``; in a job with
-- steps, ``rank_step_ord`` as given (NULL outside every step, or on a rank without steps).
-- @param rank_step_ord: Ordinal of the step of the row's rank that holds it, NULL when none.
-- @param no_steps: The window number when the job has no steps at all (readers number windows from 0 or 1).
CREATE OR REPLACE MACRO _overlap_step_window(rank_step_ord, no_steps) AS
  CASE WHEN NOT (SELECT count(*) > 0 FROM _overlap_steps()) THEN no_steps ELSE rank_step_ord END;

-- @macro _overlap_hta_us
-- A time on a file's own clock (ns) as the float64 µs that Python's json gives for the file's number, as
-- HolisticTraceAnalysis reads it: the correctly rounded double nearest to ns / 1000 (below 2^53 ns one division
-- does it; above, whole µs are exact and the three decimals are added once, which rounds the same way).
-- @param ns: Time on the file's clock (ns).
CREATE OR REPLACE MACRO _overlap_hta_us(ns) AS
  CASE WHEN abs(ns) < 9007199254740992 THEN CAST(ns AS DOUBLE) / 1000.0
       ELSE CAST(ns // 1000 AS DOUBLE) + CAST(ns % 1000 AS DOUBLE) / 1000.0 END;

-- @macro _overlap_gpu_intervals
-- GPU intervals per rank with their class bit, in the requested compatibility mode.
-- compat 'none': exact ns, classes as described in this file's header.
-- compat 'hta': HolisticTraceAnalysis 0.5.0 semantics (hta/common/trace_parser.py round_down_time_stamps,
-- hta/common/trace.py _filter_irrelevant_gpu_kernels, hta/utils/utils.py get_kernel_type):
--   classes by kernel/mem_ops name (re.match): COMM '^nccl.*Kernel'; MEMORY '^(Memcpy|Memset|dma)' and OTHER
--   '(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)' both counted as memory here; everything else COMP, split into
--   gemm / compute by kernel_class;
--   times in float64 µs on the file's own clock (_overlap_hta_us): start = ceil(ts), end = floor(ts + dur), so a sub-µs
--   event can end before it starts;
--   when the job has >= 2 distinct names containing 'ProfilerStep' (all ranks together), GPU work is kept only
--   when its correlation id matches a runtime/driver call of its rank starting (ceil µs) before the rank's last
--   ProfilerStep start (ceil µs, over every range whose name contains 'ProfilerStep', GPU annotations included),
--   once per matching call (mult), or, without a correlation id, when it starts (ceil µs) before that cut itself;
--   a rank with no such range keeps nothing.
-- Unordered (a private feed of the sweep; sorting it here would cost a full extra sort).
-- @param compat: 'none' or 'hta'.
-- @column rank: Rank.
-- @column start_ns: Interval start (ns).
-- @column end_ns: Interval end (ns); may be < start_ns in 'hta' mode (rounding of sub-µs events).
-- @column cls: Class bit: 0 communication, 1 gemm, 2 compute, 3 memory.
-- @column tie_id: 'hta' mode: kernel_id (memop_id for mem_ops), the file order that breaks ties in start order;
-- NULL in 'none' mode.
-- @column mult: 'hta' mode: copies HTA keeps (matching runtime calls when steps are filtered, else 1); 1 in 'none' mode.
CREATE OR REPLACE MACRO _overlap_gpu_intervals(compat := 'none') AS TABLE
WITH raw AS (
  SELECT rank, file_id, start_ns, end_ns, name, kernel_class, correlation_id, kernel_id AS tie_id FROM kernels
  UNION ALL
  SELECT rank, file_id, start_ns, end_ns, name, 'memory', correlation_id, memop_id FROM mem_ops
), step_ranges AS (
  SELECT c.rank, c.name, ceil(_overlap_hta_us(c.start_ns - coalesce(f.clock_offset_ns, 0))) AS start_us
  FROM cpu_ranges c LEFT JOIN files f USING (file_id)
  WHERE c.name LIKE '%ProfilerStep%' AND c.end_ns IS NOT NULL AND compat = 'hta'
), filtering AS (
  SELECT count(DISTINCT name) >= 2 AS on_ FROM step_ranges
), last_step AS (
  SELECT rank, max(start_us) AS last_us FROM step_ranges GROUP BY rank
), kept_corr AS (
  SELECT a.rank, a.correlation_id, count(*) AS mult
  FROM api_calls a JOIN last_step l USING (rank) LEFT JOIN files f ON f.file_id = a.file_id
  WHERE a.correlation_id IS NOT NULL AND ceil(_overlap_hta_us(a.start_ns - coalesce(f.clock_offset_ns, 0))) < l.last_us
  GROUP BY a.rank, a.correlation_id
), hta AS (
  SELECT r.rank, r.tie_id, coalesce(f.clock_offset_ns, 0) AS off,
         _overlap_hta_us(r.start_ns - coalesce(f.clock_offset_ns, 0)) AS ts_us,
         _overlap_hta_us(r.end_ns - r.start_ns) AS dur_us,
         CASE WHEN regexp_matches(r.name, '^nccl.*Kernel') THEN 0
              WHEN regexp_matches(r.name, '^(Memcpy|Memset|dma)')
                OR regexp_matches(r.name, '^((nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync))') THEN 3
              WHEN r.kernel_class = 'gemm' THEN 1 ELSE 2 END AS cls,
         CASE WHEN (SELECT on_ FROM filtering) THEN coalesce(k.mult, 1) ELSE 1 END AS mult
  FROM raw r LEFT JOIN files f USING (file_id)
  LEFT JOIN kept_corr k ON k.rank = r.rank AND k.correlation_id = r.correlation_id
  LEFT JOIN last_step l ON l.rank = r.rank AND r.correlation_id IS NULL
  WHERE compat = 'hta' AND (NOT (SELECT on_ FROM filtering) OR k.mult IS NOT NULL
        -- without a correlation id HTA files GPU work among the CPU events: kept when it starts before the cut
        OR ceil(_overlap_hta_us(r.start_ns - coalesce(f.clock_offset_ns, 0))) < l.last_us)
)
SELECT rank, start_ns, end_ns,
       CASE kernel_class WHEN 'communication' THEN 0 WHEN 'gemm' THEN 1 WHEN 'memory' THEN 3 ELSE 2 END AS cls,
       NULL::BIGINT AS tie_id, 1::BIGINT AS mult
FROM raw WHERE compat = 'none'
UNION ALL
SELECT rank, off + CAST(ceil(ts_us) AS BIGINT) * 1000, off + CAST(floor(ts_us + dur_us) AS BIGINT) * 1000, cls,
       tie_id, mult
FROM hta;

-- @macro _overlap_class_counter_bits
-- Width of one class's open-interval counter in the packed sweep sum: 12 bits, so up to 4095 concurrently open
-- intervals of one class per rank; four classes (cls 0..3) fill bits 0-47 and the step counter sits above them.
CREATE OR REPLACE MACRO _overlap_class_counter_bits() AS 12;

-- @macro _overlap_class_one
-- The packed delta that opens one interval of class cls (0 communication, 1 gemm, 2 compute, 3 memory).
-- @param cls: Class index.
CREATE OR REPLACE MACRO _overlap_class_one(cls) AS (CAST(1 AS BIGINT) << (_overlap_class_counter_bits() * cls));

-- @macro _overlap_step_one
-- The packed delta that opens a step window (the counter above the four class counters).
CREATE OR REPLACE MACRO _overlap_step_one() AS (CAST(1 AS BIGINT) << (4 * _overlap_class_counter_bits()));

-- @macro _overlap_class_open
-- True when class cls has an open interval in the packed counter sum c.
-- @param c: Packed counters (BIGINT).
-- @param cls: Class index.
CREATE OR REPLACE MACRO _overlap_class_open(c, cls) AS
  ((c >> (_overlap_class_counter_bits() * cls)) & ((CAST(1 AS BIGINT) << _overlap_class_counter_bits()) - 1)) > 0;

-- @macro _overlap_state_bits
-- Decodes a packed class-counter sum into the state bit set: 1 communication, 2 gemm, 4 compute, 8 memory,
-- 16 inside a step (a bit is set when its counter is > 0).
-- @param c: Packed counters (BIGINT).
CREATE OR REPLACE MACRO _overlap_state_bits(c) AS
  (CASE WHEN _overlap_class_open(c, 0) THEN 1 ELSE 0 END)
  + (CASE WHEN _overlap_class_open(c, 1) THEN 2 ELSE 0 END)
  + (CASE WHEN _overlap_class_open(c, 2) THEN 4 ELSE 0 END)
  + (CASE WHEN _overlap_class_open(c, 3) THEN 8 ELSE 0 END)
  + (CASE WHEN c >= _overlap_step_one() THEN 16 ELSE 0 END);

-- @macro _overlap_gpu_state_ns
-- The sweep itself: time per rank (and per step) in each combination of running classes.
-- state bits: 1 communication, 2 gemm, 4 compute, 8 memory. Rows with step_ord NULL cover the whole rank;
-- rows with step_ord cover that step's window. One extra row per rank (state -1) carries the GPU span
-- (first start, last end over all classes) and, in 'hta' mode, the negative lengths HTA adds to its merged
-- communication time.
-- Why only that: HTA's merge_kernel_intervals (sort by start; a new group when start > the running max of all
-- earlier ends) keeps a negative interval as its own group exactly when no earlier interval of its class ends at
-- or after its start; otherwise it is absorbed without effect. Such a lone group lies where its class has no
-- positive group, so in HTA's +1/+2 status sweep it never touches time where both classes run: it changes only the
-- merged communication total (by its negative length), and a lone negative computation group changes nothing.
-- Earlier = smaller start, ties in tie_id (file) order, as a stable sort gives; pandas' sort is not stable, so
-- for ties HTA itself may take either order once a class has more than ~256 intervals.
-- @param compat: 'none' or 'hta' (see _overlap_gpu_intervals).
-- @column compat: Mode used.
-- @column rank: Rank.
-- @column step_ord: Step ordinal (_overlap_steps), or NULL for the whole rank.
-- @column state: Bit set of running classes (1 comm, 2 gemm, 4 compute, 8 memory), or -1 for the span row.
-- @column dur_ns: Time in that state (ns); for the span row, HTA's negative communication adjustment (ns, <= 0).
-- @column first_ns: Span row: first interval start (ns); else NULL.
-- @column last_ns: Span row: last interval end (ns); else NULL.
CREATE OR REPLACE MACRO _overlap_gpu_state_ns(compat := 'none') AS TABLE
WITH iv AS (
  SELECT rank, start_ns, end_ns, cls, tie_id, mult FROM _overlap_gpu_intervals(compat := compat)
), ev AS (
  SELECT rank, start_ns AS ts, 2 AS ord, _overlap_class_one(cls) AS delta, NULL::BIGINT AS step_ord
  FROM iv WHERE end_ns >= start_ns
  UNION ALL
  SELECT rank, end_ns, 2, -_overlap_class_one(cls), NULL FROM iv WHERE end_ns >= start_ns
  UNION ALL
  SELECT rank, step_start_ns, 3, _overlap_step_one(), step_ord FROM _overlap_steps() WHERE compat = 'none'
  UNION ALL
  SELECT rank, step_end_ns, 0, -_overlap_step_one(), NULL FROM _overlap_steps() WHERE compat = 'none'
), sorted_ev AS (
  -- step_key: the step ordinal above the rank, so that a running max over all ranks is the rank's latest step
  SELECT rank, ts, ord, delta,
         (CAST(rank AS HUGEINT) << 64) + (CAST(step_ord AS HUGEINT) + (CAST(1 AS HUGEINT) << 63)) AS step_key
  FROM ev ORDER BY rank, ts, ord
), sw AS (
  -- streaming windows over the sorted events (a partitioned window sorted again and took 3/4 of the sweep): each
  -- rank's deltas sum to 0, so one running sum serves all ranks; a running max from an earlier rank is told apart
  -- by its key's rank part
  SELECT rank, ts, ord, delta, cum,
         CASE WHEN key >= CAST(rank AS HUGEINT) << 64
              THEN CAST(key - (CAST(rank AS HUGEINT) << 64) - (CAST(1 AS HUGEINT) << 63) AS BIGINT) END AS cur_step
  FROM (SELECT rank, ts, ord, delta, sum(delta) OVER w AS cum, max(step_key) OVER w AS key
        FROM sorted_ev WINDOW w AS (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
), bits AS (
  SELECT rank, ts, ord, cur_step,
         _overlap_state_bits(cum - delta) AS sb,
         _overlap_state_bits(cum) AS sa
  FROM sw
), agg AS (
  SELECT rank, cur_step, sb, sa, sum(ts) AS ts_sum,
         min(ts) FILTER (WHERE ord = 2) AS first_ts, max(ts) FILTER (WHERE ord = 2) AS last_ts
  FROM bits GROUP BY rank, cur_step, sb, sa
), signed AS (
  SELECT rank, cur_step, (sb & 15) AS st, ((sb >> 4) & 1) AS in_step, ts_sum AS v FROM agg WHERE sb <> sa
  UNION ALL
  SELECT rank, cur_step, (sa & 15), ((sa >> 4) & 1), -ts_sum FROM agg WHERE sb <> sa
), comm_runmax AS (  -- 'hta' only: running max of earlier communication ends, in HTA's merge order
  SELECT rank, start_ns, end_ns, mult,
         max(end_ns) OVER (PARTITION BY rank ORDER BY start_ns, tie_id
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM iv WHERE cls = 0 AND compat = 'hta'
), neg AS (
  SELECT rank, sum((end_ns - start_ns) * mult) AS neg_ns FROM comm_runmax
  WHERE end_ns < start_ns AND (prev_end IS NULL OR start_ns > prev_end) GROUP BY rank
), span AS (
  SELECT rank, min(first_ts) AS first_ts, max(last_ts) AS last_ts FROM agg GROUP BY rank
)
SELECT compat AS compat, rank, NULL::BIGINT AS step_ord, st AS state, CAST(sum(v) AS BIGINT) AS dur_ns,
       NULL::BIGINT AS first_ns, NULL::BIGINT AS last_ns
FROM signed WHERE st <> 0 GROUP BY rank, st HAVING sum(v) <> 0
UNION ALL
SELECT compat, rank, cur_step, st, CAST(sum(v) AS BIGINT), NULL, NULL
FROM signed WHERE st <> 0 AND in_step = 1 GROUP BY rank, cur_step, st HAVING sum(v) <> 0
UNION ALL
SELECT compat, coalesce(span.rank, neg.rank), NULL, -1, CAST(coalesce(neg.neg_ns, 0) AS BIGINT), span.first_ts,
       span.last_ts
FROM span FULL JOIN neg ON neg.rank = span.rank
ORDER BY rank, step_ord NULLS FIRST, state;

-- @view _overlap_gpu_timeline
-- @sweep per_rank
-- _overlap_gpu_state_ns in default mode. The public overlap objects read it, so a caller that runs several of them can
-- materialize it once (nsys2comm.analysis.materialize replaces it by a TEMP view over a snapshot table).
-- @column compat: 'none'.
-- @column rank: Rank.
-- @column step_ord: Step ordinal or NULL for the whole rank.
-- @column state: Running-class bit set, or -1 for the span row.
-- @column dur_ns: Time in that state (ns).
-- @column first_ns: Span row: first start (ns).
-- @column last_ns: Span row: last end (ns).
CREATE OR REPLACE VIEW _overlap_gpu_timeline AS SELECT * FROM _overlap_gpu_state_ns(compat := 'none');
