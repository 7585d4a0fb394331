-- @include overlap/overlap.sql
-- @include skew/skew.sql
-- @include intervals/intervals.sql
-- Why communication is exposed: every ns of comm_kernels.exposed_ns (communication with no computation running on
-- the rank) gets exactly one cause. Causes, taken in this order (the first that applies wins):
--   'arrival_skew'             the exposed part of the kernel's first wait_ns, the time it waited for the rank that
--                              arrived last (_skew_kernel_waits, the cross-rank matching's one definition of wait:
--                              consistent instances seen on >= 2 ranks);
--   'serialised_stream'        the rest, when the kernel's stream also runs computation kernels (same rank and
--                              device), so the two cannot overlap;
--   'serialised_communicators' the rest, when the kernel was queued behind another communication kernel of the
--                              rank on the same stream or the same communicator (pg_name): it started within
--                              right_after_ns of that kernel's end and, when its launch is known, its launch call
--                              started before that end;
--   'dependency_wait'          the rest, when the rank's next computation kernel (the first to start at or after
--                              the collective's end) starts within right_after_ns of the end of a communication
--                              kernel of the rank (this one, or a later one that ended last before it started) and,
--                              when its launch is known, its launch call had returned before that end: it was queued
--                              and waited for communication;
--   'nothing_to_overlap'       the rest, when no computation was queued: the next computation kernel was launched
--                              after the collective's end (host-bound or a launch gap), or, its launch unknown,
--                              starts later than right_after_ns after the end, or there is none;
--   'unattributed'             the rest otherwise (the next computation kernel was launched in time but started
--                              later than right_after_ns after any communication ended: it waited for something
--                              else, e.g. a copy or an event of another stream).
-- Why arrival skew comes first, before the serialised stream: a rank waiting for a late peer is the larger and
-- the more specific signal. On a serialised stream the whole exposed time would otherwise be 'serialised_stream'
-- (NCCL on the compute stream is common), hiding that most of it can be one rank waiting for another; moving the
-- collective to its own stream would not remove that wait, only let computation hide it, while making the late rank
-- arrive on time removes it. The stream evidence stays on every row (stream_compute_kernels).
-- The rest after 'arrival_skew' goes to one cause, decided at the kernel's end (a stretch where computation paused
-- inside a long collective and resumed before its end counts with the rest). Per rank the causes add up to
-- comm_kernels.exposed_ns exactly. Computation = kernels whose class is_computation_class. Launches are the
-- api_calls rows with the kernel's rank and correlation id (_exposure_launches).
-- A single-rank job shows no other rank's start: arrival skew cannot be seen there, and time spent waiting for
-- other ranks lands in the other causes (exposed_comm_causes.late_ranks_visible = false says so).

-- @view _exposure_launches
-- @sweep per_rank
-- One launch call per (rank, correlation_id) of a kernel: the api_calls row with the earliest start (then the lowest
-- call_id), e.g. the runtime call rather than the driver call it makes. Calls that launched no kernel (copies,
-- synchronisations, event records: half of a Kineto trace's runtime calls) are left out: every reader looks up
-- kernels' launches. A view, so that ingest stores it with the other shared sweeps (nsys2comm.cache): four analyses
-- read it, and its window over every API call dominated them.
-- @column rank: Rank.
-- @column correlation_id: Correlation id.
-- @column pid: Process id of the launching thread (-1 when unknown).
-- @column tid: Launching thread (NULL when unknown).
-- @column launch_start_ns: Start of the launch call (ns).
-- @column launch_end_ns: End of the launch call (ns): from then on the kernel is queued on its stream.
CREATE OR REPLACE VIEW _exposure_launches AS
SELECT rank, correlation_id, coalesce(pid, -1) AS pid, tid, start_ns AS launch_start_ns, end_ns AS launch_end_ns
FROM api_calls
WHERE correlation_id IS NOT NULL
  AND (rank, correlation_id) IN (SELECT rank, correlation_id FROM kernels WHERE correlation_id IS NOT NULL)
QUALIFY row_number() OVER (PARTITION BY rank, correlation_id ORDER BY start_ns, call_id) = 1;

-- @view _exposure_kernel_evidence
-- @sweep cross_rank
-- The evidence behind the attribution, one row per communication kernel with exposed time: everything
-- exposed_comm_by_kernel decides on that does not depend on its right_after_ns. A view, so that ingest stores it
-- with the other shared sweeps (nsys2comm.cache): its lookups over every kernel of the job (the computation union
-- under the skew windows, the next computation kernel, the last communication end) cost seconds per million kernels.
-- @column kernel_id: Communication kernel (comm_kernels.kernel_id).
-- @column rank: Rank.
-- @column step_ord: Step (_overlap_steps) whose window contains the kernel's start; NULL outside steps.
-- @column collective: Canonical collective ('unknown' when no comm_ops row).
-- @column stream_id: Stream of the kernel.
-- @column start_ns: Kernel start (ns).
-- @column end_ns: Kernel end (ns).
-- @column exposed_ns: comm_kernels.exposed_ns of the kernel (ns).
-- @column skew_exposed_ns: Exposed part of the kernel's wait window [start, start + min(wait_ns, duration)) (ns).
-- @column stream_compute_kernels: Computation kernels on the kernel's stream.
-- @column wait_ns: Time the rank waited for the last-arriving rank (ns); NULL when not matched on >= 2 ranks.
-- @column last_arriving_rank: Rank that arrived last in the kernel's matched instance, when matched.
-- @column queued_behind_kernel_id: Communication kernel on the same stream or communicator that ended last before
-- this one started, when any.
-- @column queued_behind_collective: Its collective.
-- @column queued_gap_ns: This kernel's start − that kernel's end (ns).
-- @column launch_start_ns: Start of this kernel's launch call (ns), when known.
-- @column launch_end_ns: End of this kernel's launch call (ns), when known.
-- @column next_compute_kernel_id: First computation kernel of the rank starting at or after this kernel's end.
-- @column next_compute_start_ns: Its start (ns).
-- @column next_compute_launch_end_ns: End of its launch call (ns), when known.
-- @column waited_for_kernel_id: The communication kernel of the rank that ended last at or before the next
-- computation kernel's start (this kernel or a later one).
-- @column waited_for_end_ns: Its end (ns).
CREATE OR REPLACE VIEW _exposure_kernel_evidence AS
WITH ck AS (
  SELECT c.kernel_id, c.rank, c.device_id, c.stream_id, c.start_ns, c.end_ns, c.duration_ns, c.collective,
         c.pg_name, c.exposed_ns, c.overlapped_by_compute_ns, k.correlation_id
  FROM _overlap_comm_kernels c JOIN kernels k USING (kernel_id)
), comp_k AS (
  SELECT rank, start_ns, kernel_id, correlation_id FROM kernels WHERE is_computation_class(kernel_class)
), stream_comp AS (
  SELECT rank, device_id, stream_id, count(*) AS n FROM kernels WHERE is_computation_class(kernel_class)
  GROUP BY ALL
), w AS (
  SELECT kernel_id, wait_ns, last_arriving_rank FROM _skew_kernel_waits
), probes AS (
  -- the kernel's wait window [start, start + min(wait, duration)), looked up only where the answer is not known
  -- already: a kernel with no computation under it has none under its window, and a window as long as the kernel
  -- has the kernel's own exposed time (skew_exposed_ns below)
  SELECT ck.rank AS grp, ck.kernel_id AS probe_id, ck.start_ns, ck.start_ns + w.wait_ns AS end_ns
  FROM ck JOIN w USING (kernel_id)
  WHERE ck.exposed_ns > 0 AND w.wait_ns > 0 AND ck.overlapped_by_compute_ns > 0 AND w.wait_ns < ck.duration_ns
), probe_span AS (
  SELECT grp, min(start_ns) AS lo, max(end_ns) AS hi FROM probes GROUP BY grp
), comp AS (  -- the computation that can cover a probe: the union of the rest never reaches one
  SELECT k.rank AS grp, k.start_ns, k.end_ns
  FROM kernels k JOIN probe_span p ON p.grp = k.rank AND k.end_ns > p.lo AND k.start_ns < p.hi
  WHERE is_computation_class(k.kernel_class)
), skew AS (
  SELECT probe_id AS kernel_id, (end_ns - start_ns) - covered_ns AS skew_exposed_ns
  FROM intervals_covered_ns('comp', 'probes')
), prev_stream AS (  -- communication kernels of the rank on the same stream, latest end first
  SELECT rank, device_id, stream_id, end_ns, kernel_id, collective FROM ck
), prev_pg AS (
  SELECT rank, pg_name, end_ns, kernel_id, collective FROM ck WHERE pg_name IS NOT NULL
), comm_ends AS (SELECT rank, end_ns, kernel_id FROM kernels WHERE kernel_class = 'communication'
), launches AS (SELECT * FROM _exposure_launches
), steps AS (SELECT rank, step_ord, step_start_ns, step_end_ns FROM _overlap_steps()
), e AS (
  SELECT ck.*, coalesce(sc.n, 0) AS stream_compute_kernels, w.wait_ns, w.last_arriving_rank,
         CASE WHEN s.kernel_id IS NOT NULL THEN s.skew_exposed_ns
              WHEN ck.exposed_ns > 0 AND w.wait_ns > 0 AND ck.overlapped_by_compute_ns = 0
                THEN least(w.wait_ns, ck.duration_ns)
              WHEN ck.exposed_ns > 0 AND w.wait_ns > 0 THEN ck.exposed_ns  -- the window is the whole kernel
              ELSE 0 END AS skew_exposed_ns,
         CASE WHEN ps.end_ns IS NULL OR (pp.end_ns IS NOT NULL AND pp.end_ns > ps.end_ns) THEN pp.kernel_id
              ELSE ps.kernel_id END AS queued_behind_kernel_id,
         CASE WHEN ps.end_ns IS NULL OR (pp.end_ns IS NOT NULL AND pp.end_ns > ps.end_ns) THEN pp.collective
              ELSE ps.collective END AS queued_behind_collective,
         ck.start_ns - greatest(ps.end_ns, pp.end_ns) AS queued_gap_ns,
         l.launch_start_ns, l.launch_end_ns
  FROM ck
  LEFT JOIN stream_comp sc USING (rank, device_id, stream_id)
  LEFT JOIN w USING (kernel_id)
  LEFT JOIN skew s USING (kernel_id)
  LEFT JOIN launches l ON l.rank = ck.rank AND l.correlation_id = ck.correlation_id
  ASOF LEFT JOIN prev_stream ps
    ON ps.rank = ck.rank AND ps.device_id = ck.device_id AND ps.stream_id IS NOT DISTINCT FROM ck.stream_id
       AND ps.end_ns <= ck.start_ns
  ASOF LEFT JOIN prev_pg pp ON pp.rank = ck.rank AND pp.pg_name = ck.pg_name AND pp.end_ns <= ck.start_ns
  WHERE ck.exposed_ns > 0
), n AS (
  SELECT e.*, nc.kernel_id AS next_compute_kernel_id, nc.start_ns AS nc_start,
         nl.launch_end_ns AS next_compute_launch_end_ns, st.step_ord AS st_ord, st.step_end_ns AS st_end,
         ce.kernel_id AS waited_for_kernel_id, ce.end_ns AS waited_for_end_ns
  FROM e
  ASOF LEFT JOIN comp_k nc ON nc.rank = e.rank AND nc.start_ns >= e.end_ns
  LEFT JOIN launches nl ON nl.rank = nc.rank AND nl.correlation_id = nc.correlation_id
  ASOF LEFT JOIN comm_ends ce ON ce.rank = nc.rank AND ce.end_ns <= nc.start_ns
  ASOF LEFT JOIN steps st ON st.rank = e.rank AND st.step_start_ns <= e.start_ns
)
SELECT kernel_id, rank, CASE WHEN start_ns < st_end THEN st_ord END AS step_ord, collective, stream_id, start_ns,
       end_ns, exposed_ns, CAST(skew_exposed_ns AS BIGINT) AS skew_exposed_ns,
       CAST(stream_compute_kernels AS BIGINT) AS stream_compute_kernels, wait_ns, last_arriving_rank,
       queued_behind_kernel_id, queued_behind_collective, queued_gap_ns, launch_start_ns, launch_end_ns,
       next_compute_kernel_id, nc_start AS next_compute_start_ns, next_compute_launch_end_ns, waited_for_kernel_id,
       waited_for_end_ns
FROM n;

-- @macro _exposure_right_after_ns
-- Default of right_after_ns (ns), the one tolerance for "starts right after" of the cause attribution: 10 µs.
-- GPU-side gaps between queued kernels are 1–5 µs, while a kernel launched only after the end waits a launch call
-- plus its GPU latency.
CREATE OR REPLACE MACRO _exposure_right_after_ns() AS 10000;

-- @macro _exposure_by_kernel_rows
-- exposed_comm_by_kernel's rows, unordered, for exposed_comm_causes (a macro's ORDER BY is kept inside the
-- queries that read it: a sort of every exposed kernel's rows before aggregating them).
-- @param right_after_ns: Tolerance for "starts right after" (ns): a kernel queued behind another, or waiting on
-- this collective, starts within this time of the end it waited for. Default 10 µs: GPU-side gaps between queued
-- kernels are 1–5 µs, while a kernel launched only after the end waits a launch call plus its GPU latency.
-- @column kernel_id: Communication kernel (comm_kernels.kernel_id).
-- @column rank: Rank.
-- @column step_ord: Step (_overlap_steps) whose window contains the kernel's start; NULL outside steps.
-- @column collective: Canonical collective ('unknown' when no comm_ops row).
-- @column stream_id: Stream of the kernel.
-- @column start_ns: Kernel start (ns).
-- @column end_ns: Kernel end (ns).
-- @column kernel_exposed_ns: comm_kernels.exposed_ns of the kernel (ns).
-- @column cause: 'serialised_stream', 'arrival_skew', 'serialised_communicators', 'dependency_wait',
-- 'nothing_to_overlap' or 'unattributed'.
-- @column exposed_ns: Exposed time attributed to this cause (ns).
-- @column stream_compute_kernels: Computation kernels on the kernel's stream (evidence for 'serialised_stream';
-- an 'arrival_skew' row with computation on its stream is on a serialised stream too).
-- @column wait_ns: Time the rank waited for the last-arriving rank (ns); NULL when not matched on >= 2 ranks.
-- @column last_arriving_rank: Rank that arrived last in the kernel's matched instance, when matched.
-- @column queued_behind_kernel_id: Communication kernel on the same stream or communicator that ended last before
-- this one started, when any.
-- @column queued_behind_collective: Its collective.
-- @column queued_gap_ns: This kernel's start − that kernel's end (ns).
-- @column launch_end_ns: End of this kernel's launch call (ns), when known.
-- @column next_compute_kernel_id: First computation kernel of the rank starting at or after this kernel's end.
-- @column next_compute_gap_ns: Its start − this kernel's end (ns).
-- @column next_compute_launch_end_ns: End of its launch call (ns), when known.
-- @column waited_for_kernel_id: The communication kernel of the rank that ended last at or before the next
-- computation kernel's start (this kernel or a later one): what a 'dependency_wait' waited for.
CREATE OR REPLACE MACRO _exposure_by_kernel_rows(right_after_ns := _exposure_right_after_ns()) AS TABLE
WITH c AS (
  SELECT e.*,
    CASE WHEN stream_compute_kernels > 0 THEN 'serialised_stream'
         WHEN queued_gap_ns <= right_after_ns
              AND (launch_start_ns IS NULL OR launch_start_ns < start_ns - queued_gap_ns) THEN 'serialised_communicators'
         WHEN next_compute_kernel_id IS NULL THEN 'nothing_to_overlap'
         WHEN next_compute_launch_end_ns IS NOT NULL AND next_compute_launch_end_ns > end_ns THEN 'nothing_to_overlap'
         WHEN next_compute_start_ns - waited_for_end_ns <= right_after_ns
              AND (next_compute_launch_end_ns IS NULL OR next_compute_launch_end_ns <= waited_for_end_ns)
           THEN 'dependency_wait'
         WHEN next_compute_launch_end_ns IS NULL THEN 'nothing_to_overlap'
         ELSE 'unattributed' END AS rest_cause,
    skew_exposed_ns AS skew_ns  -- arrival skew first, even on a serialised stream (header)
  FROM _exposure_kernel_evidence e
), rows_ AS (  -- one read of the kernels, each giving its skew part then its other part (a UNION ALL read them twice)
  SELECT c.*, p.cause, p.part_ns
  FROM c, unnest([{'cause': 'arrival_skew', 'part_ns': skew_ns},
                  {'cause': rest_cause, 'part_ns': exposed_ns - skew_ns}]) AS t(p)
  WHERE p.part_ns > 0
)
SELECT kernel_id, rank, step_ord, collective, stream_id, start_ns, end_ns, exposed_ns AS kernel_exposed_ns, cause,
       CAST(part_ns AS BIGINT) AS exposed_ns, stream_compute_kernels, wait_ns, last_arriving_rank,
       queued_behind_kernel_id, queued_behind_collective, queued_gap_ns, launch_end_ns, next_compute_kernel_id,
       next_compute_start_ns - end_ns AS next_compute_gap_ns, next_compute_launch_end_ns, waited_for_kernel_id
FROM rows_;

-- @macro exposed_comm_by_kernel
-- The attribution itself (causes and their order in the description of queries/exposure): one row per
-- communication kernel and cause with exposed time, with the evidence for it. A kernel has at most two rows: its
-- 'arrival_skew' part and one cause for the rest.
-- @param right_after_ns: Tolerance for "starts right after" (ns): a kernel queued behind another, or waiting on
-- this collective, starts within this time of the end it waited for. Default 10 µs: GPU-side gaps between queued
-- kernels are 1–5 µs, while a kernel launched only after the end waits a launch call plus its GPU latency.
-- @column kernel_id: Communication kernel (comm_kernels.kernel_id).
-- @column rank [key]: Rank.
-- @column step_ord: Step (_overlap_steps) whose window contains the kernel's start; NULL outside steps.
-- @column collective [key]: Canonical collective ('unknown' when no comm_ops row).
-- @column stream_id: Stream of the kernel.
-- @column start_ns: Kernel start (ns).
-- @column end_ns: Kernel end (ns).
-- @column kernel_exposed_ns: comm_kernels.exposed_ns of the kernel (ns).
-- @column cause [key]: 'serialised_stream', 'arrival_skew', 'serialised_communicators', 'dependency_wait',
-- 'nothing_to_overlap' or 'unattributed'.
-- @column exposed_ns [key]: Exposed time attributed to this cause (ns).
-- @column stream_compute_kernels: Computation kernels on the kernel's stream (evidence for 'serialised_stream';
-- an 'arrival_skew' row with computation on its stream is on a serialised stream too).
-- @column wait_ns [key]: Time the rank waited for the last-arriving rank (ns); NULL when not matched on >= 2 ranks.
-- @column last_arriving_rank: Rank that arrived last in the kernel's matched instance, when matched.
-- @column queued_behind_kernel_id: Communication kernel on the same stream or communicator that ended last before
-- this one started, when any.
-- @column queued_behind_collective: Its collective.
-- @column queued_gap_ns: This kernel's start − that kernel's end (ns).
-- @column launch_end_ns: End of this kernel's launch call (ns), when known.
-- @column next_compute_kernel_id: First computation kernel of the rank starting at or after this kernel's end.
-- @column next_compute_gap_ns: Its start − this kernel's end (ns).
-- @column next_compute_launch_end_ns: End of its launch call (ns), when known.
-- @column waited_for_kernel_id: The communication kernel of the rank that ended last at or before the next
-- computation kernel's start (this kernel or a later one): what a 'dependency_wait' waited for.
CREATE OR REPLACE MACRO exposed_comm_by_kernel(right_after_ns := _exposure_right_after_ns()) AS TABLE
SELECT * FROM _exposure_by_kernel_rows(right_after_ns := right_after_ns)
ORDER BY rank, start_ns, kernel_id, cause = 'arrival_skew' DESC;

-- @macro exposed_comm_causes
-- Exposed communication time per rank, step and collective, split by cause (exposed_comm_by_kernel; causes and
-- their order in the description of queries/exposure). Per rank, exposed_ns adds up to the sum of
-- comm_kernels.exposed_ns. In a single-rank job arrival skew cannot be seen (late_ranks_visible = false).
-- @param right_after_ns: Tolerance for "starts right after" (ns), see exposed_comm_by_kernel.
-- @column rank [key]: Rank.
-- @column step_ord: Step (_overlap_steps) whose window contains the kernels' starts; NULL outside steps.
-- @column collective [key]: Canonical collective.
-- @column cause [key]: 'serialised_stream', 'arrival_skew', 'serialised_communicators', 'dependency_wait',
-- 'nothing_to_overlap' or 'unattributed'.
-- @column exposed_ns [key]: Exposed time attributed to the cause (ns).
-- @column share_pct [key]: 100 × exposed_ns / the exposed time of this rank, step and collective.
-- @column kernels: Communication kernels with time in this cause.
-- @column late_rank: For 'arrival_skew': the rank that arrived last most often (lowest on ties); else NULL.
-- @column late_ranks_visible: False in a single-rank job: no other rank's start is seen, so waiting for other
-- ranks cannot be told apart and is counted in the other causes (dependency_wait, unattributed, ...); true otherwise.
CREATE OR REPLACE MACRO exposed_comm_causes(right_after_ns := _exposure_right_after_ns()) AS TABLE
WITH a AS (SELECT * FROM _exposure_by_kernel_rows(right_after_ns := right_after_ns)),
g AS (
  SELECT rank, step_ord, collective, cause, sum(exposed_ns) AS exposed_ns, count(*) AS kernels
  FROM a GROUP BY ALL
), late AS (
  SELECT rank, step_ord, collective, last_arriving_rank AS late_rank
  FROM a WHERE cause = 'arrival_skew' AND last_arriving_rank IS NOT NULL
  GROUP BY rank, step_ord, collective, last_arriving_rank
  QUALIFY row_number() OVER (PARTITION BY rank, step_ord, collective ORDER BY count(*) DESC, last_arriving_rank) = 1
)
SELECT g.rank, g.step_ord, g.collective, g.cause, CAST(g.exposed_ns AS BIGINT) AS exposed_ns,
       (100.0 * g.exposed_ns / sum(g.exposed_ns) OVER (PARTITION BY g.rank, g.step_ord, g.collective))::DOUBLE
         AS share_pct,
       g.kernels, CASE WHEN g.cause = 'arrival_skew' THEN late.late_rank END AS late_rank,
       (SELECT count(*) FROM ranks) > 1 AS late_ranks_visible
FROM g LEFT JOIN late ON late.rank = g.rank AND late.step_ord IS NOT DISTINCT FROM g.step_ord
                      AND late.collective = g.collective
ORDER BY g.rank, g.step_ord NULLS LAST, g.collective, g.exposed_ns DESC, g.cause;
