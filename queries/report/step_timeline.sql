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
-- @param max_segments: Most segments per rank and lane (default 200).
-- @param max_ranks: Most ranks returned, lowest rank numbers first (default 16).
-- @column step_label: 'step N', or 'whole trace' when the trace has no step ranges.
-- @column window_start_ns: Start of the window on the job timeline (ns).
-- @column window_duration_ns: Length of the window (ns).
-- @column rank: Rank.
-- @column lane: 'communication', 'compute' or 'memory'.
-- @column segment: Bin index of the segment, 0 .. max_segments - 1.
-- @column op_class: Class that took the most time in the segment: kernels.kernel_class, or 'memory' for memcpy/memset.
-- @column start_offset_ns: Segment start, ns after window_start_ns.
-- @column end_offset_ns: Segment end, ns after window_start_ns.
-- @column busy_ns: Summed duration of the segment's operations (ns); can exceed end_offset_ns - start_offset_ns when streams run concurrently.
-- @column busy_pct: 100 × busy_ns / (end_offset_ns - start_offset_ns), capped at 100.
-- @column n_ops: Number of kernels and memory operations merged into the segment.
-- @column longest_op_name: Base name of the longest operation in the segment (untrusted trace text).
-- @column longest_op_full_name: Full name of that operation, as the trace wrote it (untrusted trace text).
CREATE OR REPLACE MACRO step_timeline(pick_step := NULL, max_segments := 200, max_ranks := 16) AS TABLE
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
win AS (
  SELECT w0, w1, step_label FROM step_window WHERE w0 IS NOT NULL
  UNION ALL
  SELECT min(start_ns), max(end_ns), 'whole trace' FROM kernels
  WHERE NOT EXISTS (SELECT 1 FROM step_window WHERE w0 IS NOT NULL)
),
kept_ranks AS (
  SELECT rank FROM (SELECT DISTINCT rank FROM kernels UNION SELECT DISTINCT rank FROM mem_ops)
  ORDER BY rank LIMIT max_ranks
),
ops AS (
  SELECT k.rank,
         CASE k.kernel_class WHEN 'communication' THEN 'communication' WHEN 'memory' THEN 'memory' ELSE 'compute' END AS lane,
         k.kernel_class AS op_class, k.start_ns, k.end_ns, k.short_name AS op_name, k.name AS op_full_name
  FROM kernels k SEMI JOIN kept_ranks USING (rank)
  UNION ALL
  SELECT m.rank, 'memory', 'memory', m.start_ns, m.end_ns, m.name, m.name
  FROM mem_ops m SEMI JOIN kept_ranks USING (rank)
),
clipped AS (
  SELECT o.rank, o.lane, o.op_class, o.op_name, o.op_full_name, w.w0, w.w1, w.step_label,
         greatest(o.start_ns, w.w0) AS s_ns, least(o.end_ns, w.w1) AS e_ns
  FROM ops o, win w
  WHERE o.end_ns >= w.w0 AND o.start_ns <= w.w1 AND w.w0 IS NOT NULL
),
binned AS (
  SELECT *, least(CAST(floor((s_ns - w0) * CAST(max_segments AS DOUBLE) / greatest(w1 - w0, 1)) AS BIGINT),
                  max_segments - 1) AS seg
  FROM clipped
),
per_class AS (
  SELECT rank, lane, seg, op_class, sum(e_ns - s_ns) AS class_ns FROM binned GROUP BY ALL
),
dominant AS (
  SELECT rank, lane, seg, arg_max(op_class, class_ns) AS op_class FROM per_class GROUP BY ALL
),
segments AS (
  SELECT rank, lane, seg, any_value(step_label) AS step_label, any_value(w0) AS w0, any_value(w1) AS w1,
         min(s_ns) AS seg_start_ns, max(e_ns) AS seg_end_ns, sum(e_ns - s_ns) AS busy_ns, count(*) AS n_ops,
         arg_max({'b': op_name, 'f': op_full_name}, e_ns - s_ns) AS longest_op
  FROM binned GROUP BY ALL
)
SELECT s.step_label,
       s.w0 AS window_start_ns,
       CAST(s.w1 - s.w0 AS BIGINT) AS window_duration_ns,
       s.rank, s.lane, s.seg AS segment, d.op_class,
       CAST(s.seg_start_ns - s.w0 AS BIGINT) AS start_offset_ns,
       CAST(s.seg_end_ns - s.w0 AS BIGINT) AS end_offset_ns,
       CAST(s.busy_ns AS BIGINT) AS busy_ns,
       CASE WHEN s.seg_end_ns > s.seg_start_ns
            THEN least(100.0, 100.0 * s.busy_ns / (s.seg_end_ns - s.seg_start_ns)) ELSE 100.0 END AS busy_pct,
       s.n_ops, s.longest_op.b AS longest_op_name, s.longest_op.f AS longest_op_full_name
FROM segments s JOIN dominant d USING (rank, lane, seg)
ORDER BY rank, lane, segment;
