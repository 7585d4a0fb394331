-- @include skew/skew.sql
-- @include exposure/causes.sql
-- @include overlap/timeline.sql
-- @include intervals/intervals.sql
-- @include lateness/iterations.sql
-- Why a rank arrives late at a collective (tests: tests/test_lateness.py, tier 2 synthetic jobs with one known cause
-- each, tier 4 the bundled example recomputed from its JSON). docs/lateness.md says the same in words.
-- Instances: the consistent collective instances seen on >= 2 ranks (_skew_comm_instances); L = last_arriving_rank,
-- E = first_arriving_rank; a rank's arrival is the start of its kernel in the instance (latest for L, earliest for
-- E), on the reference clock (every time here is shifted by the rank's _skew_ops.clock_offset_ns).
-- Segment of a rank: [segment start, arrival), the segment start being, in this order,
--   'previous_collective' the end of the rank's previous matched collective kernel of the same group
--                         (coalesce(pg_name, ''); p2p pairs excluded), unless an iteration started after it;
--   'iteration_start'     the start of the rank's iteration holding the arrival (the iterations object, with its
--                         marker and min_score: a marker's start, the user's marker when given, else ProfilerStep#N /
--                         NVTX step; on a rank without markers a detected iteration, which starts at the launch call
--                         of its boundary kernel (the host issuing the iteration's first work; the kernel's start
--                         when its launch is unknown) unless that kernel is a communication kernel (an iteration
--                         that starts with a collective: the segment since the previous collective already is its
--                         lead-in, and the collective's own launch would cut its segment short); 'whole_capture' ranks
--                         have none: first_activity);
--   'first_activity'      the rank's first kernel start or launch call, whichever is first.
-- Each segment splits exactly into four parts (ns):
--   gpu_compute_ns   covered by the union of the rank's non-communication kernels (any stream);
--   earlier_comm_ns  covered by communication kernels (other collectives) and not by those;
--   host_bound_ns    GPU idle (no kernel) with nothing launched: a gap [a, b) before the kernel that ends it at b
--                    is host-bound up to that kernel's launch end + epsilon_ns (default 10 µs: launch latency), so
--                    a kernel starting within epsilon of its launch makes the whole gap host-bound. A kernel whose
--                    launch is unknown (no api_calls row) counts as host-bound, and *_launch_unknown_idle_ns says
--                    how much rests on that; when several kernels start at b the earliest launch end counts;
--   queued_idle_ns   the rest of the idle time: work was launched but waited (another stream, an event, a copy).
-- Lateness = L's arrival − E's arrival = (L's segment start − E's segment start) + Σ (L's part − E's part), an exact
-- integer identity; each share is that difference for its part. The segment-start difference (a segment that
-- started later on L carries lateness from before it) goes to host_share_ns when L's segment starts at an iteration
-- start or its first activity (which rank's host issued its first work later: its GPU was idle with nothing
-- launched), else to carried_ns (lateness carried from the previous collective, whose ranks left it at different
-- times). Shares may be negative (E spent longer in that part); they add up to lateness_ns exactly.
-- primary_cause: the largest share ('host', 'gpu_compute', 'queued', 'earlier_comm', 'carried'; ties in that order).

-- @macro _lateness_segments
-- Each consistent instance's last-arriving and earliest ranks, their segments and the four parts (queries/lateness).
-- @param epsilon_ns: Launch latency allowance (ns).
-- @param marker: The user's iteration marker, as iterations ('' none).
-- @param min_score: As iterations.
-- @column instance_key: Matching key.
-- @column role: 'late' or 'early'.
-- @column rank: Rank.
-- @column launch_tid: Thread that launched the rank's collective kernel, when known.
-- @column clock_offset_ns: Offset subtracted from the rank's times (ns).
-- @column segment_from: 'previous_collective', 'iteration_start' or 'first_activity'.
-- @column segment_start_ns: Segment start (ns, reference clock).
-- @column arrival_ns: Arrival (ns, reference clock).
-- @column gpu_compute_ns: Non-communication kernels running (ns).
-- @column earlier_comm_ns: Other communication kernels running, no computation (ns).
-- @column host_bound_ns: Idle, nothing launched (ns).
-- @column queued_idle_ns: Idle although work was launched (ns).
-- @column launch_unknown_idle_ns: Part of host_bound_ns before kernels whose launch is unknown (ns).
CREATE OR REPLACE MACRO _lateness_segments(epsilon_ns, marker, min_score) AS TABLE
WITH off AS (
  SELECT r.rank, coalesce(max(o.clock_offset_ns), 0) AS off FROM ranks r LEFT JOIN _skew_ops o USING (rank)
  GROUP BY r.rank
), inst AS (
  SELECT instance_key, last_arriving_rank, first_arriving_rank FROM _skew_comm_instances
  WHERE kind = 'collective' AND consistent AND ranks_seen >= 2
), ops AS (
  SELECT rank, instance_key, kernel_id, start_ns,
         lag(end_ns) OVER (PARTITION BY rank, coalesce(pg_name, '') ORDER BY start_ns, kernel_id) AS prev_end_ns
  FROM _skew_ops WHERE match_rule <> 'p2p_pair'
), who AS (
  SELECT instance_key, 'late' AS role, last_arriving_rank AS rank FROM inst
  UNION ALL SELECT instance_key, 'early', first_arriving_rank FROM inst
), arr AS (
  SELECT w.instance_key, w.role, w.rank, o.kernel_id, o.start_ns AS arrival_ns, o.prev_end_ns
  FROM who w JOIN ops o USING (instance_key, rank)
  QUALIFY row_number() OVER (PARTITION BY w.instance_key, w.role
                             ORDER BY CASE WHEN w.role = 'late' THEN -o.start_ns ELSE o.start_ns END, o.kernel_id) = 1
), steps AS (  -- iteration starts (marker or detected; a detected one from its boundary kernel's launch call)
  SELECT i.rank, coalesce(CASE WHEN i.iteration_source = 'detected' THEN least(l.launch_start_ns, i.start_ns) END,
                          i.start_ns) - off.off AS t
  FROM iterations(min_score := min_score, marker := marker) i JOIN off USING (rank)
  LEFT JOIN kernels k ON k.kernel_id = i.first_kernel_id
  LEFT JOIN _exposure_launches l ON l.rank = k.rank AND l.correlation_id = k.correlation_id
  WHERE i.iteration_source = 'marker' OR (i.iteration_source = 'detected' AND k.kernel_class <> 'communication')
), first_act AS (
  SELECT k.rank, least(min(k.start_ns), min(l.launch_start_ns)) - any_value(off.off) AS t
  FROM kernels k JOIN off USING (rank)
  LEFT JOIN _exposure_launches l ON l.rank = k.rank AND l.correlation_id = k.correlation_id
  WHERE k.rank IN (SELECT rank FROM who) GROUP BY k.rank
), seg AS (
  SELECT a.*, CASE WHEN a.prev_end_ns IS NOT NULL AND (st.t IS NULL OR a.prev_end_ns >= st.t)
                   THEN 'previous_collective' WHEN st.t IS NOT NULL THEN 'iteration_start'
                   ELSE 'first_activity' END AS segment_from,
         least(a.arrival_ns, CASE WHEN a.prev_end_ns IS NOT NULL AND (st.t IS NULL OR a.prev_end_ns >= st.t)
                                  THEN a.prev_end_ns ELSE coalesce(st.t, fa.t) END) AS segment_start_ns
  FROM arr a ASOF LEFT JOIN steps st ON st.rank = a.rank AND st.t <= a.arrival_ns
  LEFT JOIN first_act fa ON fa.rank = a.rank
), probes AS (
  SELECT rank AS grp, instance_key || '|' || role AS probe_id, segment_start_ns AS start_ns, arrival_ns AS end_ns
  FROM seg
), kk AS (  -- the ranks' kernels on the reference clock, with their launch end
  SELECT k.rank AS grp, k.start_ns - off.off AS start_ns, k.end_ns - off.off AS end_ns, k.kernel_class,
         l.launch_end_ns - off.off AS launch_end_ns
  FROM kernels k JOIN off USING (rank)
  LEFT JOIN _exposure_launches l ON l.rank = k.rank AND l.correlation_id = k.correlation_id
  WHERE k.rank IN (SELECT rank FROM who)
), kall AS (SELECT grp, start_ns, end_ns FROM kk
), kcomp AS (SELECT grp, start_ns, end_ns FROM kk WHERE kernel_class <> 'communication'
), starts AS (  -- the earliest launch end among the kernels starting at each instant (NULL: none known)
  SELECT grp, start_ns, min(launch_end_ns) AS launch_end_ns FROM kk GROUP BY grp, start_ns
), floor AS (SELECT grp, min(start_ns) AS f FROM probes GROUP BY grp
), isl AS (SELECT * FROM intervals_union('kall')
), gaps AS (
  SELECT i.grp, least(coalesce(lag(i.end_ns) OVER (PARTITION BY i.grp ORDER BY i.start_ns), fl.f), i.start_ns) AS a,
         i.start_ns AS b, s.launch_end_ns
  FROM isl i JOIN floor fl USING (grp) JOIN starts s USING (grp, start_ns)
), hostp AS (
  SELECT grp, a AS start_ns,
         CASE WHEN launch_end_ns IS NULL THEN b ELSE least(b, greatest(a, launch_end_ns + epsilon_ns)) END AS end_ns
  FROM gaps
), unkp AS (SELECT grp, a AS start_ns, b AS end_ns FROM gaps WHERE launch_end_ns IS NULL
), cov AS (
  SELECT p.grp, p.probe_id, p.end_ns - p.start_ns AS seg_ns, ca.covered_ns AS all_ns, cc.covered_ns AS comp_ns,
         ch.covered_ns AS host_ns, cu.covered_ns AS unk_ns
  FROM probes p
  JOIN intervals_covered_ns('kall', 'probes') ca USING (grp, probe_id)
  JOIN intervals_covered_ns('kcomp', 'probes') cc USING (grp, probe_id)
  JOIN intervals_covered_ns('hostp', 'probes') ch USING (grp, probe_id)
  JOIN intervals_covered_ns('unkp', 'probes') cu USING (grp, probe_id)
)
SELECT s.instance_key, s.role, s.rank, l.tid AS launch_tid, off.off AS clock_offset_ns, s.segment_from,
       s.segment_start_ns, s.arrival_ns, c.comp_ns AS gpu_compute_ns, c.all_ns - c.comp_ns AS earlier_comm_ns,
       c.host_ns AS host_bound_ns, c.seg_ns - c.all_ns - c.host_ns AS queued_idle_ns,
       c.unk_ns AS launch_unknown_idle_ns
FROM seg s JOIN cov c ON c.grp = s.rank AND c.probe_id = s.instance_key || '|' || s.role
JOIN off ON off.rank = s.rank
JOIN kernels k ON k.kernel_id = s.kernel_id
LEFT JOIN _exposure_launches l ON l.rank = k.rank AND l.correlation_id = k.correlation_id;

-- @macro late_arrival_causes
-- Why the last rank arrived late, per consistent collective instance seen on >= 2 ranks: the last-arriving rank's
-- and the earliest rank's segments since their previous collective of the group, each split into GPU compute,
-- host-bound idle, queued idle and earlier communication, and the lateness split by their differences
-- (algorithm and remainder rule in the description of queries/lateness/lateness.sql). Shares add up to lateness_ns
-- exactly. Times on the reference clock (host_clock_offsets).
-- @param epsilon_ns: Launch latency allowance: idle before a kernel that started within epsilon_ns of its launch
-- end is host-bound (ns, default 10000).
-- @param marker: Name of the user's iteration range, as iterations ('' default: ProfilerStep/NVTX step markers, else
-- detected iterations).
-- @param min_score: As iterations (default 0.9): detected iterations start segments on ranks without markers.
-- @column instance_key: Matching key (collective_skew).
-- @column collective [key]: Collective.
-- @column pg_name: Group, when known.
-- @column group_complete: The instance was seen on every rank of its group.
-- @column first_start_ns: Earliest arrival (ns).
-- @column late_rank [key]: Last-arriving rank L.
-- @column early_rank: Earliest rank E.
-- @column lateness_ns [key]: L's arrival − E's arrival (ns).
-- @column late_segment_from: Where L's segment starts: 'previous_collective', 'iteration_start' or 'first_activity'.
-- @column late_segment_start_ns: L's segment start (ns).
-- @column late_segment_ns: L's segment length (ns).
-- @column late_gpu_compute_ns: L: non-communication kernels running in the segment (ns).
-- @column late_host_bound_ns: L: GPU idle with nothing launched (ns).
-- @column late_queued_idle_ns: L: GPU idle although work was launched (ns).
-- @column late_earlier_comm_ns: L: other communication kernels running, no computation (ns).
-- @column late_launch_unknown_idle_ns: L: part of late_host_bound_ns before kernels whose launch is unknown (ns).
-- @column early_segment_from: E's segment start kind.
-- @column early_segment_start_ns: E's segment start (ns).
-- @column early_segment_ns: E's segment length (ns).
-- @column early_gpu_compute_ns: E: non-communication kernels running (ns).
-- @column early_host_bound_ns: E: GPU idle with nothing launched (ns).
-- @column early_queued_idle_ns: E: GPU idle although work was launched (ns).
-- @column early_earlier_comm_ns: E: other communication kernels running, no computation (ns).
-- @column early_launch_unknown_idle_ns: E: part of early_host_bound_ns before kernels whose launch is unknown (ns).
-- @column host_share_ns: late_host_bound_ns − early_host_bound_ns, plus the segment-start difference when L's segment
-- starts at an iteration start or its first activity (ns).
-- @column gpu_compute_share_ns: late_gpu_compute_ns − early_gpu_compute_ns (ns).
-- @column queued_share_ns: late_queued_idle_ns − early_queued_idle_ns (ns).
-- @column earlier_comm_share_ns: late_earlier_comm_ns − early_earlier_comm_ns (ns).
-- @column carried_ns: Segment-start difference when L's segment starts at its previous collective: lateness
-- carried from before (ns); else 0.
-- @column primary_cause [key]: The largest share: 'host', 'gpu_compute', 'queued', 'earlier_comm' or 'carried' (ties in
-- that order); NULL when lateness_ns = 0.
-- @column primary_share_pct [key]: 100 × that share / lateness_ns; NULL when lateness_ns = 0.
-- @column late_launch_tid: Thread that launched L's collective kernel (late_rank_host_ops looks there), when known.
CREATE OR REPLACE MACRO late_arrival_causes(epsilon_ns := _lateness_epsilon_ns(), marker := '',
    min_score := _lateness_min_score()) AS TABLE
WITH s AS (SELECT * FROM _lateness_segments(epsilon_ns, marker, min_score)),
j AS (
  SELECT i.instance_key, i.collective, i.pg_name, i.group_complete, i.first_start_ns, l.rank AS late_rank,
         e.rank AS early_rank, l.arrival_ns - e.arrival_ns AS lateness_ns,
         l.segment_from AS late_segment_from, l.segment_start_ns AS late_segment_start_ns,
         l.arrival_ns - l.segment_start_ns AS late_segment_ns, l.gpu_compute_ns AS late_gpu_compute_ns,
         l.host_bound_ns AS late_host_bound_ns, l.queued_idle_ns AS late_queued_idle_ns,
         l.earlier_comm_ns AS late_earlier_comm_ns, l.launch_unknown_idle_ns AS late_launch_unknown_idle_ns,
         e.segment_from AS early_segment_from, e.segment_start_ns AS early_segment_start_ns,
         e.arrival_ns - e.segment_start_ns AS early_segment_ns, e.gpu_compute_ns AS early_gpu_compute_ns,
         e.host_bound_ns AS early_host_bound_ns, e.queued_idle_ns AS early_queued_idle_ns,
         e.earlier_comm_ns AS early_earlier_comm_ns, e.launch_unknown_idle_ns AS early_launch_unknown_idle_ns,
         l.segment_start_ns - e.segment_start_ns AS start_diff_ns, l.launch_tid AS late_launch_tid
  FROM _skew_comm_instances i
  JOIN s l ON l.instance_key = i.instance_key AND l.role = 'late'
  JOIN s e ON e.instance_key = i.instance_key AND e.role = 'early'
), sh AS (
  SELECT j.*,
         late_host_bound_ns - early_host_bound_ns
           + CASE WHEN late_segment_from <> 'previous_collective' THEN start_diff_ns ELSE 0 END AS host_share_ns,
         late_gpu_compute_ns - early_gpu_compute_ns AS gpu_compute_share_ns,
         late_queued_idle_ns - early_queued_idle_ns AS queued_share_ns,
         late_earlier_comm_ns - early_earlier_comm_ns AS earlier_comm_share_ns,
         CASE WHEN late_segment_from = 'previous_collective' THEN start_diff_ns ELSE 0 END AS carried_ns
  FROM j
), pc AS (
  SELECT sh.*, greatest(host_share_ns, gpu_compute_share_ns, queued_share_ns, earlier_comm_share_ns, carried_ns) AS top
  FROM sh
)
SELECT instance_key, collective, pg_name, group_complete, first_start_ns, late_rank, early_rank,
       lateness_ns::BIGINT AS lateness_ns, late_segment_from, late_segment_start_ns, late_segment_ns::BIGINT AS late_segment_ns,
       late_gpu_compute_ns::BIGINT AS late_gpu_compute_ns, late_host_bound_ns::BIGINT AS late_host_bound_ns,
       late_queued_idle_ns::BIGINT AS late_queued_idle_ns, late_earlier_comm_ns::BIGINT AS late_earlier_comm_ns,
       late_launch_unknown_idle_ns::BIGINT AS late_launch_unknown_idle_ns,
       early_segment_from, early_segment_start_ns, early_segment_ns::BIGINT AS early_segment_ns,
       early_gpu_compute_ns::BIGINT AS early_gpu_compute_ns, early_host_bound_ns::BIGINT AS early_host_bound_ns,
       early_queued_idle_ns::BIGINT AS early_queued_idle_ns, early_earlier_comm_ns::BIGINT AS early_earlier_comm_ns,
       early_launch_unknown_idle_ns::BIGINT AS early_launch_unknown_idle_ns,
       host_share_ns::BIGINT AS host_share_ns, gpu_compute_share_ns::BIGINT AS gpu_compute_share_ns,
       queued_share_ns::BIGINT AS queued_share_ns, earlier_comm_share_ns::BIGINT AS earlier_comm_share_ns,
       carried_ns::BIGINT AS carried_ns,
       CASE WHEN lateness_ns = 0 THEN NULL WHEN top = host_share_ns THEN 'host'
            WHEN top = gpu_compute_share_ns THEN 'gpu_compute' WHEN top = queued_share_ns THEN 'queued'
            WHEN top = earlier_comm_share_ns THEN 'earlier_comm' ELSE 'carried' END AS primary_cause,
       CASE WHEN lateness_ns <> 0 THEN (100.0 * top / lateness_ns)::DOUBLE END AS primary_share_pct,
       late_launch_tid
FROM pc
ORDER BY first_start_ns, instance_key;

-- @macro late_rank_host_ops
-- What the late rank's host was doing while its GPU waited for launches: for each instance of late_arrival_causes
-- with host_share_ns > 0, the CPU ops on the thread that launched L's collective kernel (late_launch_tid) during L's
-- segment, by self time, the top_n per instance. Ops: cpu_ranges of kind 'cpu_op', 'python_function',
-- 'user_annotation' (Kineto) and 'nvtx', and the thread's CUDA API calls (op_kind 'cuda_api'); what the importer
-- keeps of them (the Kineto importer keeps communication and matrix-multiply cpu_ops, user annotations and every
-- python_function frame of a with_stack trace; a frame's self time therefore includes the cpu_ops it calls that
-- the importer drops, such as aten::add). Self time =
-- duration − the summed durations of the ops directly nested in it (depth + 1 on the thread, starting inside it):
-- nesting depth from a sweep over starts and ends, children's durations from prefix sums per depth (ASOF lookups),
-- so no op is compared with every other. An op is in a window when it starts inside it (an ASOF lookup of the
-- window holding its start); its self time counts pro rata of the part of it inside the window. Times on the rank's
-- own clock.
-- @param epsilon_ns: As late_arrival_causes (ns, default 10000).
-- @param top_n: Ops kept per instance (default 10).
-- @param marker: As late_arrival_causes ('' default).
-- @param min_score: As late_arrival_causes (default 0.9).
-- @column instance_key: Matching key.
-- @column late_rank [key]: Last-arriving rank.
-- @column tid: Its launching thread.
-- @column window_start_ns: L's segment start on the rank's clock (ns).
-- @column window_end_ns: L's arrival on the rank's clock (ns).
-- @column host_share_ns [key]: The instance's host_share_ns (ns).
-- @column op_name [key]: Op name (cpu_ranges.name or the API function).
-- @column op_kind: 'cpu_op', 'python_function', 'user_annotation', 'nvtx' or 'cuda_api'.
-- @column calls [key]: Ops of that name and kind starting in the window.
-- @column self_ns [key]: Their self time inside the window, pro rata (ns, each op's share rounded down: ties and sums exact).
-- @column op_order: 1 = the largest self time in the instance (ties: name).
CREATE OR REPLACE MACRO late_rank_host_ops(epsilon_ns := _lateness_epsilon_ns(), top_n := 10, marker := '',
    min_score := _lateness_min_score()) AS TABLE
WITH off AS (
  SELECT r.rank, coalesce(max(o.clock_offset_ns), 0) AS off FROM ranks r LEFT JOIN _skew_ops o USING (rank)
  GROUP BY r.rank
), win AS (
  SELECT c.instance_key, c.late_rank AS rank, c.late_launch_tid AS tid, c.host_share_ns,
         c.late_segment_start_ns + off.off AS w_start, c.late_segment_start_ns + c.late_segment_ns + off.off AS w_end
  FROM late_arrival_causes(epsilon_ns := epsilon_ns, marker := marker, min_score := min_score) c
  JOIN off ON off.rank = c.late_rank
  WHERE c.host_share_ns > 0 AND c.late_launch_tid IS NOT NULL
), thr AS (SELECT DISTINCT rank, tid FROM win
), ops AS (
  SELECT c.rank, c.tid, c.range_id AS id, c.start_ns, c.end_ns, c.name, c.kind AS op_kind
  FROM cpu_ranges c JOIN thr USING (rank, tid)
  WHERE c.kind IN ('cpu_op', 'python_function', 'user_annotation', 'nvtx') AND c.end_ns IS NOT NULL
    AND c.end_ns >= c.start_ns
  UNION ALL
  SELECT a.rank, a.tid, a.call_id, a.start_ns, a.end_ns, a.name, 'cuda_api'
  FROM api_calls a JOIN thr USING (rank, tid)
), ends AS (  -- ops ended at or before t: running count over ends
  SELECT rank, tid, end_ns, max(n) AS n_ended  -- one row per end time: an ASOF match among equal ends is arbitrary
  FROM (SELECT rank, tid, end_ns, row_number() OVER (PARTITION BY rank, tid ORDER BY end_ns, op_kind, id) AS n FROM ops)
  GROUP BY rank, tid, end_ns
), dep AS (  -- depth = ops started before (enclosing ones first at equal starts) − ops ended by its start
  SELECT o.*, row_number() OVER (PARTITION BY o.rank, o.tid ORDER BY o.start_ns, o.end_ns DESC, o.op_kind, o.id) - 1
              - coalesce(e.n_ended, 0) AS depth
  FROM ops o ASOF LEFT JOIN ends e ON e.rank = o.rank AND e.tid = o.tid AND o.start_ns >= e.end_ns
), cum AS (  -- prefix sums of durations per depth, in start order
  SELECT rank, tid, depth, start_ns, max(c) AS dur_before_incl  -- one row per start time, as for ends
  FROM (SELECT rank, tid, depth, start_ns,
               sum(end_ns - start_ns) OVER (PARTITION BY rank, tid, depth ORDER BY start_ns, op_kind, id) AS c
        FROM dep)
  GROUP BY rank, tid, depth, start_ns
), selfd AS (
  SELECT d.*, greatest((d.end_ns - d.start_ns) - (coalesce(ce.dur_before_incl, 0) - coalesce(cs.dur_before_incl, 0)),
                       0) AS self_ns
  FROM dep d
  ASOF LEFT JOIN cum ce ON ce.rank = d.rank AND ce.tid = d.tid AND ce.depth = d.depth + 1 AND d.end_ns > ce.start_ns
  ASOF LEFT JOIN cum cs ON cs.rank = d.rank AND cs.tid = d.tid AND cs.depth = d.depth + 1
                       AND d.start_ns > cs.start_ns
), inwin AS (
  SELECT w.instance_key, w.rank, w.tid, w.w_start, w.w_end, w.host_share_ns, s.name, s.op_kind,
         CASE WHEN s.end_ns = s.start_ns THEN 0
              ELSE CAST(s.self_ns AS HUGEINT) * (least(s.end_ns, w.w_end) - s.start_ns) // (s.end_ns - s.start_ns)
         END AS self_in
  FROM selfd s ASOF JOIN win w ON w.rank = s.rank AND w.tid = s.tid AND s.start_ns >= w.w_start
  WHERE s.start_ns < w.w_end
), agg AS (
  SELECT instance_key, rank, tid, w_start, w_end, host_share_ns, name, op_kind, count(*) AS calls,
         CAST(sum(self_in) AS BIGINT) AS self_ns
  FROM inwin GROUP BY ALL
)
SELECT instance_key, rank AS late_rank, tid, w_start AS window_start_ns, w_end AS window_end_ns, host_share_ns,
       name AS op_name, op_kind, calls, self_ns, op_order
FROM (SELECT *, row_number() OVER (PARTITION BY instance_key ORDER BY self_ns DESC, name, op_kind) AS op_order FROM agg)
WHERE op_order <= top_n
ORDER BY window_start_ns, instance_key, op_order;
