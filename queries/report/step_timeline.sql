-- @include overlap/timeline.sql
-- Data for the report's step timeline: GPU activity of one training step, per rank and lane, downsampled.

-- @macro step_timeline
-- GPU activity of one training step as at most `max_segments` segments per rank and lane, for drawing a
-- timeline whose size does not grow with the trace. The step is an iteration range as _overlap_steps defines it
-- ('ProfilerStep#N' in Kineto, else NVTX 'step N', 'iteration N', ...); its window runs from the earliest start to
-- the latest end of that step's ranges over all ranks. Without step ranges the window is the whole trace ('whole trace').
-- Lanes: 'communication' (communication kernels), 'compute' (gemm, convolution, attention and compute kernels) and
-- 'memory' (memory kernels, memcpy and memset). The window is cut into `max_segments` equal bins; the
-- kernels and memory operations of one rank and lane that start in one bin (clipped to the window) merge
-- into one segment from the earliest start to the latest end, labelled with the class that took the most
-- time. Only the `max_ranks` lowest ranks are returned.
-- @param pick_step: Step number to show (N of 'ProfilerStep#N'); NULL picks the middle step of those traced (the later one of two).
-- @param window_start_ns: With window_end_ns, the window to show instead of a step (ns on the job timeline; the report
-- passes a detected iteration's bounds from iterations); NULL: the step.
-- @param window_end_ns: End of that window (ns).
-- @param window_label: step_label of that window (default 'window').
-- @param max_segments: Most segments per rank and lane (default 200).
-- @param max_ranks: Most ranks returned, lowest rank numbers first (default 16).
-- @column step_label: 'step N', window_label for a given window, or 'whole trace' when the trace has no step ranges.
-- @column window_start_ns: Start of the window on the job timeline (ns).
-- @column window_duration_ns: Length of the window (ns).
-- @column rank [key]: Rank.
-- @column lane [key]: 'communication', 'compute' or 'memory'.
-- @column segment [key]: Bin index of the segment, 0 .. max_segments - 1.
-- @column op_class [key]: Class that took the most time in the segment: kernels.kernel_class, or 'memory' for memcpy/memset
-- (ties: the first in name order).
-- @column start_offset_ns [key]: Segment start, ns after window_start_ns.
-- @column end_offset_ns: Segment end, ns after window_start_ns.
-- @column busy_ns [key]: Summed duration of the segment's operations (ns); can exceed end_offset_ns - start_offset_ns when streams run concurrently.
-- @column busy_pct [key]: 100 × busy_ns / (end_offset_ns - start_offset_ns), capped at 100.
-- @column n_ops: Number of kernels and memory operations merged into the segment.
-- @column longest_op_name: Base name of the longest operation in the segment (ties: the earliest start, then kernels
-- before memory operations, then the lower id; untrusted trace text).
-- @column longest_op_full_name: Full name of that operation, as the trace wrote it (untrusted trace text).
CREATE OR REPLACE MACRO step_timeline(pick_step := NULL, max_segments := 200, max_ranks := 16, window_start_ns := NULL,
                                      window_end_ns := NULL, window_label := NULL) AS TABLE
WITH step_ranges AS (  -- the one definition of an iteration range: _overlap_steps (overlap/timeline.sql)
  SELECT rank, step_start_ns AS start_ns, step_end_ns AS end_ns, step_no FROM _overlap_steps() WHERE step_no IS NOT NULL
),
step_list AS (
  SELECT step_no, row_number() OVER (ORDER BY step_no) AS rn, count(*) OVER () AS n_steps
  FROM (SELECT DISTINCT step_no FROM step_ranges)
),
chosen AS (
  SELECT coalesce(CAST(pick_step AS BIGINT), (SELECT step_no FROM step_list WHERE rn = n_steps // 2 + 1)) AS step_no
),
step_window AS (
  SELECT min(s.start_ns) AS w0, max(s.end_ns) AS w1, 'step ' || CAST(any_value(s.step_no) AS VARCHAR) AS step_label
  FROM step_ranges s JOIN chosen c ON s.step_no = c.step_no
),
given AS (  -- a window passed by the caller (a detected iteration) replaces the step
  SELECT CAST(window_start_ns AS BIGINT) AS w0, CAST(window_end_ns AS BIGINT) AS w1,
         coalesce(CAST(window_label AS VARCHAR), 'window') AS step_label
  WHERE window_start_ns IS NOT NULL AND window_end_ns IS NOT NULL
),
win AS (
  SELECT w0, w1, step_label FROM given
  UNION ALL
  SELECT w0, w1, step_label FROM step_window WHERE w0 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM given)
  UNION ALL
  SELECT min(start_ns), max(end_ns), 'whole trace' FROM kernels
  WHERE NOT EXISTS (SELECT 1 FROM step_window WHERE w0 IS NOT NULL) AND NOT EXISTS (SELECT 1 FROM given)
),
kept_ranks AS (
  SELECT rank FROM (SELECT DISTINCT rank FROM kernels UNION SELECT DISTINCT rank FROM mem_ops)
  ORDER BY rank LIMIT max_ranks
),
ops AS (  -- the kept ranks are the lowest ones: a bound, which the scans can apply
  SELECT k.rank, k.kernel_class AS op_class, k.start_ns, k.end_ns, false AS is_mem_op, k.kernel_id AS op_id
  FROM kernels k WHERE k.rank <= (SELECT max(rank) FROM kept_ranks)
  UNION ALL
  SELECT m.rank, 'memory', m.start_ns, m.end_ns, true, m.memop_id
  FROM mem_ops m WHERE m.rank <= (SELECT max(rank) FROM kept_ranks)
),
binned AS (  -- read once: one aggregation per (rank, lane, bin, class), whose few rows give the segments
  SELECT o.rank, o.op_class, o.is_mem_op, o.op_id, greatest(o.start_ns, w.w0) AS s_ns,
         least(o.end_ns, w.w1) AS e_ns,
         least(CAST(floor((greatest(o.start_ns, w.w0) - w.w0) * CAST(max_segments AS DOUBLE) / greatest(w.w1 - w.w0, 1))
                    AS BIGINT), max_segments - 1) AS seg
  FROM ops o, win w
  WHERE o.end_ns >= w.w0 AND o.start_ns <= w.w1 AND w.w0 IS NOT NULL
),
per_class AS (
  SELECT rank, seg, op_class,
         CASE op_class WHEN 'communication' THEN 'communication' WHEN 'memory' THEN 'memory' ELSE 'compute' END AS lane,
         sum(e_ns - s_ns) AS class_ns, min(s_ns) AS s_ns, max(e_ns) AS e_ns,
         count(*) AS n_ops,
         -- the longest; ties: the earliest, then kernels before memory operations, then the lower id (names are
         -- looked up for the winners only)
         max({'ns': e_ns - s_ns, 'start': -s_ns, 'kernel': NOT is_mem_op, 'neg_id': -op_id}) AS longest_op
  FROM binned GROUP BY ALL
),
segments AS (
  SELECT rank, lane, seg, first(op_class ORDER BY class_ns DESC, op_class) AS op_class, min(s_ns) AS seg_start_ns,
         max(e_ns) AS seg_end_ns, sum(class_ns) AS busy_ns, sum(n_ops) AS n_ops, max(longest_op) AS longest_op
  FROM per_class GROUP BY ALL
)
SELECT w.step_label,
       w.w0 AS window_start_ns,
       CAST(w.w1 - w.w0 AS BIGINT) AS window_duration_ns,
       s.rank, s.lane, s.seg AS segment, s.op_class,
       CAST(s.seg_start_ns - w.w0 AS BIGINT) AS start_offset_ns,
       CAST(s.seg_end_ns - w.w0 AS BIGINT) AS end_offset_ns,
       CAST(s.busy_ns AS BIGINT) AS busy_ns,
       CASE WHEN s.seg_end_ns > s.seg_start_ns
            THEN least(100.0, 100.0 * s.busy_ns / (s.seg_end_ns - s.seg_start_ns)) ELSE 100.0 END AS busy_pct,
       CAST(s.n_ops AS BIGINT) AS n_ops, CASE WHEN s.longest_op.kernel THEN lk.short_name ELSE lm.name END AS longest_op_name,
       CASE WHEN s.longest_op.kernel THEN lk.name ELSE lm.name END AS longest_op_full_name
FROM segments s CROSS JOIN win w
LEFT JOIN kernels lk ON s.longest_op.kernel AND lk.kernel_id = -s.longest_op.neg_id
LEFT JOIN mem_ops lm ON NOT s.longest_op.kernel AND lm.memop_id = -s.longest_op.neg_id
WHERE w.w0 IS NOT NULL
ORDER BY rank, lane, segment;
