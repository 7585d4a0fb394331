-- @include lateness/breakdown.sql
-- A critical path per iteration (tests: tests/test_critical_path.py, tier 2 synthetic jobs with a known late rank,
-- tier 4 the bundled example recomputed from its JSON; docs/lateness.md says the same in words).
-- Iteration k is the k-th iteration (iterations.iteration) of every rank; times here are on the reference clock
-- (each rank's times minus its host_clock_offsets offset, as _skew_ops).
-- Algorithm, per iteration k:
--   1. The bound rank: the rank whose last kernel of iteration k (kernels starting in its window) ends latest; the
--      path ends there, at t0 (lowest rank on ties).
--   2. Walk backwards from (rank r, time t). Waits: a rank w waited at a matched collective instance (consistent,
--      seen on >= 2 ranks: _skew_comm_instances) when it arrived before the instance's latest start T; its last
--      rank L (last_arriving_rank) bounds it. The next hop is r's latest wait with T < t (an ASOF lookup; one wait
--      per rank and T, the lowest instance key on ties), taken while T >= r's iteration-k start: the path holds r's
--      timeline on [T, t) (the collective's transfer after T included) and jumps to L at T, since r could not
--      leave the collective before L arrived. Without such a wait the path holds r's timeline back to its
--      iteration start.
--   3. Each segment (a rank and a span) is split like rank_iteration_breakdown: compute, communication transfer
--      (matched collectives after their last arrival), communication wait (inside collective kernels before the
--      last arrival, or not matched), host-bound idle, queued idle (launched work waiting on a stream, an event or
--      a copy) and other idle. path "waiting" = queued idle + communication wait.
-- Each hop's successor is found once for every wait (one ASOF join); the walk is a recursive CTE that follows those
-- pointers, one row per iteration per hop: cost grows with the hops on the longest path times the number of waits.

-- @macro critical_path_segments
-- The critical path of every iteration as segments, newest first: which rank the path runs on over which span, how
-- it got there (the rank it bounds arrived last at a matched collective where another rank waited) and what the
-- span holds (algorithm in the description of queries/lateness/critical_path.sql). Reference clock.
-- @param epsilon_ns: As rank_iteration_breakdown (ns, default 10000).
-- @param marker: As iterations ('' default).
-- @param min_score: As iterations (default 0.9).
-- @column iteration_index [key]: Iteration (iterations.iteration).
-- @column segment [key]: 0 = the last segment (ending at the iteration's last kernel end), 1 the one before, ...
-- @column rank [key]: Rank the path runs on.
-- @column start_ns: Segment start (ns, reference clock).
-- @column end_ns: Segment end (ns, reference clock).
-- @column segment_ns [key]: end_ns − start_ns (ns).
-- @column reached_by [key]: 'iteration_end' (segment 0: the bound rank's last kernel) or 'last_arrival' (this rank
-- arrived last at via_instance_key, where waiting_rank waited for it).
-- @column via_instance_key: The collective instance at this segment's end where the path jumped (NULL for segment 0).
-- @column waiting_rank [key]: The rank the path jumped from, which waited at that instance (NULL for segment 0).
-- @column waiting_rank_wait_ns: How long waiting_rank waited there: the instance's latest start − its arrival (ns).
-- @column gpu_compute_ns: Non-communication kernels running (ns).
-- @column comm_transfer_ns: Communication in matched collectives after their last rank arrived, no computation (ns).
-- @column comm_wait_ns: Other communication kernel time with no computation: waiting inside collective kernels,
-- or collectives not matched across ranks (ns).
-- @column host_bound_idle_ns: GPU idle with nothing launched (ns).
-- @column queued_idle_ns: GPU idle although work was launched (ns).
-- @column other_idle_ns: GPU idle with no kernel after it on the rank (ns).
-- @column iteration_start_ns: Earliest start of the iteration on any rank (ns, reference clock).
-- @column iteration_source: The ranks' iteration_source for this iteration ('marker', 'detected', 'whole_capture';
-- several, comma-separated, when ranks differ).
CREATE OR REPLACE MACRO critical_path_segments(epsilon_ns := _lateness_epsilon_ns(), marker := '',
    min_score := _lateness_min_score()) AS TABLE
WITH RECURSIVE off AS MATERIALIZED (
  SELECT r.rank, coalesce(max(o.clock_offset_ns), 0) AS off FROM ranks r LEFT JOIN _skew_ops o USING (rank)
  GROUP BY r.rank
), it AS MATERIALIZED (
  SELECT i.rank, i.iteration AS k, i.start_ns, i.end_ns, i.start_ns - off.off AS start_ref, i.iteration_source
  FROM iterations(min_score := min_score, marker := marker) i JOIN off USING (rank)
), itk AS (
  SELECT k, min(start_ref) AS start_ref,
         string_agg(DISTINCT iteration_source, ',' ORDER BY iteration_source) AS src
  FROM it GROUP BY k
), kend AS (  -- each rank's last kernel end in each iteration (kernels starting in its window)
  SELECT it.rank, it.k, max(k.end_ns) - any_value(off.off) AS end_ref
  FROM kernels k ASOF JOIN it ON it.rank = k.rank AND k.start_ns >= it.start_ns
  JOIN off ON off.rank = k.rank
  WHERE it.end_ns > k.start_ns GROUP BY it.rank, it.k
), bound AS (SELECT k, arg_min(rank, (-end_ref, rank)) AS rank, max(end_ref) AS t0 FROM kend GROUP BY k
), inst AS (
  SELECT instance_key, last_start_ns, last_arriving_rank FROM _skew_comm_instances
  WHERE kind = 'collective' AND consistent AND ranks_seen >= 2
), wt AS (  -- a rank that arrived before the last one: it waited for last_arriving_rank until last_start_ns
  SELECT o.instance_key, o.rank, min(o.start_ns) AS arr_ref, any_value(i.last_start_ns) AS t_ref,
         any_value(i.last_arriving_rank) AS to_rank
  FROM _skew_ops o JOIN inst i USING (instance_key)
  WHERE o.rank <> i.last_arriving_rank
  GROUP BY o.instance_key, o.rank HAVING min(o.start_ns) < any_value(i.last_start_ns)
), wid AS MATERIALIZED (
  SELECT *, row_number() OVER (ORDER BY rank, t_ref, instance_key) AS id FROM wt
  QUALIFY row_number() OVER (PARTITION BY rank, t_ref ORDER BY instance_key) = 1
), nxt AS MATERIALIZED (  -- after jumping to to_rank at t_ref: to_rank's latest wait before t_ref
  SELECT a.id, b.id AS next_id FROM wid a ASOF JOIN wid b ON b.rank = a.to_rank AND b.t_ref < a.t_ref
), hops(k, hop, id) AS (
  SELECT b.k, 1, w.id
  FROM bound b ASOF JOIN wid w ON w.rank = b.rank AND w.t_ref < b.t0
  JOIN it ON it.k = b.k AND it.rank = w.rank
  WHERE w.t_ref >= it.start_ref
  UNION ALL
  SELECT h.k, h.hop + 1, n.next_id
  FROM hops h JOIN nxt n ON n.id = h.id JOIN wid w ON w.id = n.next_id
  JOIN it ON it.k = h.k AND it.rank = w.rank
  WHERE w.t_ref >= it.start_ref
), seg AS (
  SELECT k, 0 AS segment, rank, t0 AS end_ref, NULL::VARCHAR AS via, NULL::INTEGER AS waiting_rank,
         NULL::BIGINT AS wait_ns
  FROM bound
  UNION ALL
  SELECT h.k, h.hop, w.to_rank, w.t_ref, w.instance_key, w.rank, w.t_ref - w.arr_ref FROM hops h JOIN wid w USING (id)
), span AS (
  SELECT s.*, least(s.end_ref, coalesce(lead(s.end_ref) OVER (PARTITION BY s.k ORDER BY s.segment), it.start_ref,
                                        s.end_ref)) AS start_ref,
         row_number() OVER (ORDER BY s.k, s.segment) AS probe_id, off.off
  FROM seg s JOIN off USING (rank) LEFT JOIN it ON it.k = s.k AND it.rank = s.rank
), tp AS (SELECT grp, start_ns, end_ns FROM _lateness_timeline_pieces(epsilon_ns)
), probes AS (
  SELECT CAST(s.rank AS BIGINT) * 8 + p.piece AS grp, s.probe_id, s.start_ref + s.off AS start_ns,
         s.end_ref + s.off AS end_ns
  FROM span s, (SELECT unnest(range(7)) AS piece) p
), parts AS (  -- coverages c0..c6 by the pieces of _lateness_timeline_pieces (rank_iteration_breakdown's split)
  SELECT probe_id,
         sum(covered_ns) FILTER (WHERE grp % 8 = 0) AS c0, sum(covered_ns) FILTER (WHERE grp % 8 = 1) AS c1,
         sum(covered_ns) FILTER (WHERE grp % 8 = 2) AS c2, sum(covered_ns) FILTER (WHERE grp % 8 = 3) AS c3,
         sum(covered_ns) FILTER (WHERE grp % 8 = 5) AS c5
  FROM intervals_covered_ns('tp', 'probes') GROUP BY probe_id
)
SELECT s.k AS iteration_index, CAST(s.segment AS BIGINT) AS segment, s.rank, s.start_ref AS start_ns,
       s.end_ref AS end_ns, s.end_ref - s.start_ref AS segment_ns,
       CASE WHEN s.segment = 0 THEN 'iteration_end' ELSE 'last_arrival' END AS reached_by,
       s.via AS via_instance_key, s.waiting_rank, s.wait_ns AS waiting_rank_wait_ns,
       CAST(p.c1 AS BIGINT) AS gpu_compute_ns, CAST(p.c5 - p.c1 AS BIGINT) AS comm_transfer_ns,
       CAST(p.c0 - p.c5 AS BIGINT) AS comm_wait_ns, CAST(p.c2 AS BIGINT) AS host_bound_idle_ns,
       CAST(p.c3 - p.c2 AS BIGINT) AS queued_idle_ns,
       CAST(s.end_ref - s.start_ref - p.c0 - p.c3 AS BIGINT) AS other_idle_ns,
       itk.start_ref AS iteration_start_ns, itk.src AS iteration_source
FROM span s JOIN parts p USING (probe_id) JOIN itk ON itk.k = s.k
ORDER BY iteration_index, segment;

-- @macro iteration_critical_path
-- Per iteration, the rank and the chain of kernels and collective waits that bound its end-to-end time
-- (critical_path_segments summed; algorithm in the description of queries/lateness/critical_path.sql), and the
-- share of the path that is compute, communication transfer, host-bound idle and waiting. Reference clock.
-- @param epsilon_ns: As rank_iteration_breakdown (ns, default 10000).
-- @param marker: As iterations ('' default).
-- @param min_score: As iterations (default 0.9).
-- @column iteration_index [key]: Iteration (iterations.iteration).
-- @column iteration_source: The ranks' iteration_source ('marker', 'detected', 'whole_capture'; several, comma-
-- separated, when ranks differ).
-- @column iteration_start_ns: Earliest start of the iteration on any rank (ns, reference clock).
-- @column iteration_end_ns: Latest end of its kernels on any rank: the path's end (ns).
-- @column iteration_ns [key]: iteration_end_ns − iteration_start_ns (ns).
-- @column bound_rank [key]: The rank whose last kernel of the iteration ends last (where the path ends).
-- @column origin_rank: The rank the path starts on (it reaches back to that rank's iteration start).
-- @column path_ranks: The ranks along the path in time order (a rank may recur).
-- @column hops: Jumps at collectives (segments − 1).
-- @column path_start_ns: The path's start (ns).
-- @column path_ns: Length of the path: the sum of its segments (ns).
-- @column compute_ns: GPU compute on the path (ns).
-- @column comm_transfer_ns: Communication transfer on the path (ns).
-- @column host_bound_idle_ns: GPU idle with nothing launched on the path (ns).
-- @column waiting_ns: Waiting on the path: queued idle (launched work waiting on a stream, an event or a copy) +
-- communication wait (inside collective kernels before the last arrival, or collectives not matched) (ns).
-- @column other_idle_ns: GPU idle with no kernel after it (ns).
-- @column compute_pct [key]: 100 × compute_ns / path_ns; NULL when path_ns = 0.
-- @column comm_transfer_pct: 100 × comm_transfer_ns / path_ns; NULL when path_ns = 0.
-- @column host_bound_idle_pct: 100 × host_bound_idle_ns / path_ns; NULL when path_ns = 0.
-- @column waiting_pct [key]: 100 × waiting_ns / path_ns; NULL when path_ns = 0.
-- @column other_idle_pct: 100 × other_idle_ns / path_ns; NULL when path_ns = 0.
CREATE OR REPLACE MACRO iteration_critical_path(epsilon_ns := _lateness_epsilon_ns(), marker := '',
    min_score := _lateness_min_score()) AS TABLE
WITH s AS (SELECT * FROM critical_path_segments(epsilon_ns := epsilon_ns, marker := marker, min_score := min_score)
), a AS (
  SELECT iteration_index, any_value(iteration_start_ns) AS start_ref, any_value(iteration_source) AS src,
         arg_min(rank, segment) AS bound_rank, arg_max(rank, segment) AS origin_rank,
         list(rank ORDER BY segment DESC) AS path_ranks, count(*) - 1 AS hops, max(end_ns) AS end_ns,
         min(start_ns) AS path_start_ns, sum(segment_ns) AS path_ns, sum(gpu_compute_ns) AS compute_ns,
         sum(comm_transfer_ns) AS comm_transfer_ns, sum(host_bound_idle_ns) AS host_bound_idle_ns,
         sum(queued_idle_ns + comm_wait_ns) AS waiting_ns, sum(other_idle_ns) AS other_idle_ns
  FROM s GROUP BY iteration_index
)
SELECT a.iteration_index, a.src AS iteration_source, a.start_ref AS iteration_start_ns,
       a.end_ns AS iteration_end_ns, a.end_ns - a.start_ref AS iteration_ns, a.bound_rank, a.origin_rank,
       a.path_ranks, CAST(a.hops AS BIGINT) AS hops, a.path_start_ns, CAST(a.path_ns AS BIGINT) AS path_ns,
       CAST(a.compute_ns AS BIGINT) AS compute_ns, CAST(a.comm_transfer_ns AS BIGINT) AS comm_transfer_ns,
       CAST(a.host_bound_idle_ns AS BIGINT) AS host_bound_idle_ns, CAST(a.waiting_ns AS BIGINT) AS waiting_ns,
       CAST(a.other_idle_ns AS BIGINT) AS other_idle_ns,
       CASE WHEN a.path_ns > 0 THEN 100.0 * a.compute_ns / a.path_ns END AS compute_pct,
       CASE WHEN a.path_ns > 0 THEN 100.0 * a.comm_transfer_ns / a.path_ns END AS comm_transfer_pct,
       CASE WHEN a.path_ns > 0 THEN 100.0 * a.host_bound_idle_ns / a.path_ns END AS host_bound_idle_pct,
       CASE WHEN a.path_ns > 0 THEN 100.0 * a.waiting_ns / a.path_ns END AS waiting_pct,
       CASE WHEN a.path_ns > 0 THEN 100.0 * a.other_idle_ns / a.path_ns END AS other_idle_pct
FROM a
ORDER BY iteration_index;
