-- @include overlap/overlap.sql
-- @include exposure/contention.sql
-- @include exposure/causes.sql
-- Producer → consumer links: for each collective, the GEMM that produced its input, the serialised pairs
-- (producer GEMM, then the exposed collective right after it) and the headroom that a fine-grained, tile-by-tile
-- overlap of the two (T3, Pati et al. 2024) could reach once the measured contention is paid.
-- Launches are read from api_calls: the call with the kernel's rank and correlation_id (the earliest one when
-- several share it, e.g. a runtime call and the driver call inside it). All look-ups are ASOF joins.

-- @view _exposure_producer_pick
-- @sweep per_rank order=rank,comm_start_ns,kernel_id
-- The producer GEMM of every communication kernel, by the rules of producer_links, with the communication
-- kernel's columns that producer_links shows (from comm_kernels). A view, so that ingest stores it with the other
-- shared sweeps (nsys2comm.cache): its two windows and two ASOF joins over every GEMM, and then the join back to
-- the communication kernels, dominated producer_links and serialised_pairs.
-- @column kernel_id: Communication kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective ('unknown' without a comm_ops row).
-- @column msg_bytes: Size S (bytes), when known.
-- @column comm_start_ns: Communication kernel start (ns).
-- @column comm_duration_ns: Communication kernel duration (ns).
-- @column comm_exposed_ns: Part of the communication kernel with no computation running (comm_kernels.exposed_ns, ns).
-- @column tid: CPU thread that launched it, NULL when unknown.
-- @column gemm_kernel_id: Producer GEMM kernel id, NULL when none.
-- @column link_source: 'same_thread_launch', 'nearest_gemm_on_gpu' or 'none'.
-- @column gemm_short_name: Producer GEMM base name.
-- @column gemm_grid_x: Producer GEMM grid size, x.
-- @column gemm_grid_y: Producer GEMM grid size, y.
-- @column gemm_grid_z: Producer GEMM grid size, z.
-- @column gemm_block_x: Producer GEMM block size, x.
-- @column gemm_block_y: Producer GEMM block size, y.
-- @column gemm_block_z: Producer GEMM block size, z.
-- @column gemm_start_ns: Producer GEMM start (ns).
-- @column gemm_end_ns: Producer GEMM end (ns).
CREATE OR REPLACE VIEW _exposure_producer_pick AS
WITH _exposure_ck AS (
  -- built on the kernels table itself (not on comm_kernels()) so that the planner's row estimate stays a table's:
  -- an ASOF join whose probe side is estimated tiny is rewritten into a nested loop
  SELECT k.kernel_id, k.rank, k.start_ns, l.pid, l.tid,
         CASE WHEN l.tid IS NOT NULL THEN l.launch_start_ns END AS launch_start_ns  -- no thread: launch unknown
  FROM kernels k
  LEFT JOIN _exposure_launches l ON l.rank = k.rank AND l.correlation_id = k.correlation_id
  WHERE k.kernel_class = 'communication'
), _exposure_gk AS (
  SELECT k.kernel_id, k.rank, k.start_ns, k.end_ns, l.pid, l.tid,
         CASE WHEN l.tid IS NOT NULL THEN l.launch_start_ns END AS launch_start_ns
  FROM kernels k
  LEFT JOIN _exposure_launches l ON l.rank = k.rank AND l.correlation_id = k.correlation_id
  WHERE k.kernel_class = 'gemm'
), _exposure_by_launch AS (  -- the GEMM that runs last among those of one launch call
  SELECT rank, pid, tid, launch_start_ns, kernel_id FROM _exposure_gk
  WHERE launch_start_ns IS NOT NULL
  QUALIFY row_number() OVER (PARTITION BY rank, pid, tid, launch_start_ns
                             ORDER BY start_ns DESC, end_ns DESC, kernel_id DESC) = 1
), _exposure_by_end AS (  -- one GEMM per (rank, end): the later start, then the higher id
  SELECT rank, end_ns, kernel_id, launch_start_ns IS NOT NULL AS launch_known FROM _exposure_gk
  QUALIFY row_number() OVER (PARTITION BY rank, end_ns ORDER BY start_ns DESC, kernel_id DESC) = 1
), _exposure_link AS (
  SELECT c.kernel_id, c.tid, t.kernel_id AS thread_gemm_id, g.kernel_id AS gpu_gemm_id,
         c.launch_start_ns IS NULL OR NOT g.launch_known AS launch_missing
  FROM _exposure_ck c
  ASOF LEFT JOIN _exposure_by_launch t
    ON c.rank = t.rank AND c.pid = t.pid AND c.tid = t.tid AND c.launch_start_ns > t.launch_start_ns
  ASOF LEFT JOIN _exposure_by_end g ON c.rank = g.rank AND c.start_ns >= g.end_ns
), _exposure_pick AS (
  SELECT kernel_id, tid,
         CASE WHEN thread_gemm_id IS NOT NULL THEN thread_gemm_id WHEN launch_missing THEN gpu_gemm_id END
           AS gemm_kernel_id,
         CASE WHEN thread_gemm_id IS NOT NULL THEN 'same_thread_launch'
              WHEN launch_missing AND gpu_gemm_id IS NOT NULL THEN 'nearest_gemm_on_gpu'
              ELSE 'none' END AS link_source
  FROM _exposure_link
)
SELECT p.kernel_id, c.rank, c.collective, c.msg_bytes, c.start_ns AS comm_start_ns, c.duration_ns AS comm_duration_ns,
       c.exposed_ns AS comm_exposed_ns, p.tid, p.gemm_kernel_id, p.link_source, g.short_name AS gemm_short_name,
       g.grid_x AS gemm_grid_x, g.grid_y AS gemm_grid_y, g.grid_z AS gemm_grid_z, g.block_x AS gemm_block_x,
       g.block_y AS gemm_block_y, g.block_z AS gemm_block_z, g.start_ns AS gemm_start_ns, g.end_ns AS gemm_end_ns
FROM _exposure_pick p  -- stored with the pick: one look-up of each side at ingest, not per query
JOIN _overlap_comm_kernels c ON c.kernel_id = p.kernel_id
LEFT JOIN kernels g ON g.kernel_id = p.gemm_kernel_id;

-- @macro _exposure_producer_rows
-- producer_links' rows, unordered, with the producer GEMM's grid and block sizes (its shape group in
-- gemm_contention): serialised_pairs reads them without a sort and without a second look-up of the GEMM.
-- @column rank: Rank.
-- @column comm_kernel_id: Communication kernel id.
-- @column collective: Canonical collective ('unknown' without a comm_ops row).
-- @column msg_bytes: Size S (bytes), when known.
-- @column comm_start_ns: Collective kernel start (ns).
-- @column comm_duration_ns: Collective kernel duration (ns).
-- @column comm_exposed_ns: Part of the collective with no computation running (comm_kernels.exposed_ns, ns).
-- @column launch_tid: CPU thread that launched the collective, NULL when unknown.
-- @column gemm_kernel_id: Producer GEMM kernel id, NULL when none.
-- @column gemm_short_name: Producer GEMM base name.
-- @column gemm_grid_x: Producer GEMM grid size, x.
-- @column gemm_grid_y: Producer GEMM grid size, y.
-- @column gemm_grid_z: Producer GEMM grid size, z.
-- @column gemm_block_x: Producer GEMM block size, x.
-- @column gemm_block_y: Producer GEMM block size, y.
-- @column gemm_block_z: Producer GEMM block size, z.
-- @column gemm_start_ns: Producer GEMM start (ns).
-- @column gemm_end_ns: Producer GEMM end (ns).
-- @column gemm_duration_ns: Producer GEMM duration (ns).
-- @column gap_ns: comm_start_ns − gemm_end_ns (ns); NULL without a producer.
-- @column link_source: 'same_thread_launch', 'nearest_gemm_on_gpu' or 'none'.
CREATE OR REPLACE MACRO _exposure_producer_rows() AS TABLE
SELECT rank, kernel_id AS comm_kernel_id, collective, msg_bytes, comm_start_ns, comm_duration_ns, comm_exposed_ns,
       tid AS launch_tid, gemm_kernel_id, gemm_short_name, gemm_grid_x, gemm_grid_y, gemm_grid_z, gemm_block_x,
       gemm_block_y, gemm_block_z, gemm_start_ns, gemm_end_ns, gemm_end_ns - gemm_start_ns AS gemm_duration_ns,
       comm_start_ns - gemm_end_ns AS gap_ns, link_source
FROM _exposure_producer_pick
WHERE collective NOT IN ('send', 'recv', 'send_recv');

-- @macro producer_links
-- One row per collective kernel (comm_kernels, send/recv/send_recv left out) with its producer GEMM:
-- 'same_thread_launch': the last GEMM kernel of the rank launched from the same CPU thread (pid, tid) as the
-- collective, by a launch call that started before the collective's launch call (ASOF on the launch start;
-- several GEMMs of one launch call, e.g. a CUDA graph, give the one that starts last);
-- 'nearest_gemm_on_gpu': when that finds nothing and launch information is missing, either for the collective
-- (no api_calls row, or one without a thread) or for the GEMM found instead, the last GEMM kernel of the rank that ended at or before the
-- collective's start (ASOF on the GEMM end; ties: the later start, then the higher kernel id);
-- 'none' (NULL producer) otherwise, e.g. a collective before any GEMM, or one whose launch thread launched no
-- earlier GEMM while the nearest GEMM on the GPU is known to come from another thread.
-- gap_ns = collective start − GEMM end; it is negative when the collective started while its producer still ran.
-- @column rank [key]: Rank.
-- @column comm_kernel_id: Communication kernel id.
-- @column collective [key]: Canonical collective ('unknown' without a comm_ops row).
-- @column msg_bytes: Size S (bytes), when known.
-- @column comm_start_ns: Collective kernel start (ns).
-- @column comm_duration_ns: Collective kernel duration (ns).
-- @column comm_exposed_ns [key]: Part of the collective with no computation running (comm_kernels.exposed_ns, ns).
-- @column launch_tid: CPU thread that launched the collective, NULL when unknown.
-- @column gemm_kernel_id: Producer GEMM kernel id, NULL when none.
-- @column gemm_short_name [key]: Producer GEMM base name.
-- @column gemm_start_ns: Producer GEMM start (ns).
-- @column gemm_end_ns: Producer GEMM end (ns).
-- @column gemm_duration_ns: Producer GEMM duration (ns).
-- @column gap_ns [key]: comm_start_ns − gemm_end_ns (ns); NULL without a producer.
-- @column link_source: 'same_thread_launch', 'nearest_gemm_on_gpu' or 'none'.
CREATE OR REPLACE MACRO producer_links() AS TABLE
SELECT rank, comm_kernel_id, collective, msg_bytes, comm_start_ns, comm_duration_ns, comm_exposed_ns, launch_tid,
       gemm_kernel_id, gemm_short_name, gemm_start_ns, gemm_end_ns, gemm_duration_ns, gap_ns, link_source
FROM _exposure_producer_rows()
ORDER BY rank, comm_start_ns, comm_kernel_id;

-- @view _exposure_gemm_slowdown
-- @sweep cross_rank
-- The GEMM slowdowns serialised_pairs charges its pairs: gemm_contention() with its default thresholds, the
-- columns it reads. A view, so that ingest stores it with the other shared sweeps (nsys2comm.cache): measuring
-- every GEMM again took a quarter of serialised_pairs.
-- @column scope: 'shape_group' or 'job' (gemm_contention.scope).
-- @column short_name: Kernel base name (NULL on the job row).
-- @column grid_x: Grid size, x.
-- @column grid_y: Grid size, y.
-- @column grid_z: Grid size, z.
-- @column block_x: Block size, x.
-- @column block_y: Block size, y.
-- @column block_z: Block size, z.
-- @column m: GEMM problem M (gemm_contention.m), NULL without a recorded shape.
-- @column n: GEMM problem N, NULL without a recorded shape.
-- @column k: GEMM problem K, NULL without a recorded shape.
-- @column batch: GEMM problem batch, NULL without a recorded shape.
-- @column dtype: GEMM operand dtype, NULL when unknown.
-- @column slowdown_pct: gemm_contention.slowdown_pct (%), NULL unless measured.
-- @column status: 'measured', 'too_few_samples' or 'mixed_shapes'.
CREATE OR REPLACE VIEW _exposure_gemm_slowdown AS
SELECT scope, short_name, grid_x, grid_y, grid_z, block_x, block_y, block_z, m, n, k, batch, dtype, slowdown_pct,
       status
FROM gemm_contention();

-- @macro serialised_pairs
-- Producer GEMM, then its exposed collective back to back: producer_links rows with a producer, 0 <= gap_ns <=
-- back_to_back_ns and comm_exposed_ns > 0; with the headroom a fine-grained (T3-style, tile by tile) overlap of
-- the pair could reach: overlap_bound_ns = min(gemm_duration_ns, comm_duration_ns) (the most that overlapping
-- two back-to-back kernels can hide), minus the contention it would cost, contention_ns = overlap_bound_ns ×
-- slowdown_pct / 100, with the GEMM slowdown measured by gemm_contention() (default thresholds): the GEMM's own
-- group (kernel, launch shape and recorded problem) when measured (slowdown_source 'shape_group'), else the job
-- row's time-weighted median slowdown of the measured groups ('job'), else none: slowdown, contention and headroom are then NULL, never assumed 0.
-- A measured speed-up (slowdown_pct < 0) counts as no contention; a slowdown above 100 % gives a negative
-- headroom (overlapping would cost more than it hides).
-- @param back_to_back_ns: Largest gap (ns) between the producer GEMM's end and the collective's start for the pair
-- to count as serialised; 10000 (10 µs) covers the launch latency of the collective and a cross-stream event
-- wait (a few µs each) while leaving out collectives that waited for other work first.
-- @column rank [key]: Rank.
-- @column comm_kernel_id: Communication kernel id.
-- @column collective [key]: Canonical collective.
-- @column msg_bytes: Size S (bytes), when known.
-- @column comm_start_ns: Collective kernel start (ns).
-- @column comm_duration_ns: Collective kernel duration (ns).
-- @column comm_exposed_ns [key]: Exposed part of the collective (ns).
-- @column gemm_kernel_id: Producer GEMM kernel id.
-- @column gemm_short_name [key]: Producer GEMM base name.
-- @column gemm_duration_ns: Producer GEMM duration (ns).
-- @column gap_ns: comm_start_ns − the GEMM's end (ns).
-- @column link_source: How the producer was found (producer_links.link_source).
-- @column overlap_bound_ns: min(gemm_duration_ns, comm_duration_ns) (ns).
-- @column slowdown_pct [key]: GEMM slowdown under communication used for the contention (%), NULL when none measured.
-- @column slowdown_source: 'shape_group', 'job', or NULL when no slowdown could be measured.
-- @column contention_ns: overlap_bound_ns × max(slowdown_pct, 0) / 100 (ns, rounded); NULL without a slowdown.
-- @column headroom_ns [key]: overlap_bound_ns − contention_ns (ns); NULL without a slowdown.
CREATE OR REPLACE MACRO serialised_pairs(back_to_back_ns := 10000) AS TABLE
WITH _exposure_gc AS (
  SELECT * FROM _exposure_gemm_slowdown
), _exposure_job AS (
  SELECT slowdown_pct FROM _exposure_gc WHERE scope = 'job' AND status = 'measured'
), _exposure_p AS (
  SELECT p.*, least(p.gemm_duration_ns, p.comm_duration_ns) AS overlap_bound_ns,
         CASE WHEN s.status = 'measured' THEN s.slowdown_pct ELSE (SELECT slowdown_pct FROM _exposure_job) END
           AS slowdown_pct,
         CASE WHEN s.status = 'measured' THEN 'shape_group'
              WHEN (SELECT count(*) FROM _exposure_job) > 0 THEN 'job' END AS slowdown_source
  FROM _exposure_producer_rows() p
  LEFT JOIN _exposure_gemm_coverage pg ON pg.kernel_id = p.gemm_kernel_id  -- the producer's recorded problem
  LEFT JOIN _exposure_gc s
    ON s.scope = 'shape_group' AND s.short_name = p.gemm_short_name
   AND s.m IS NOT DISTINCT FROM pg.m AND s.n IS NOT DISTINCT FROM pg.n AND s.k IS NOT DISTINCT FROM pg.k
   AND s.batch IS NOT DISTINCT FROM pg.batch AND s.dtype IS NOT DISTINCT FROM pg.dtype
   AND s.grid_x IS NOT DISTINCT FROM p.gemm_grid_x AND s.grid_y IS NOT DISTINCT FROM p.gemm_grid_y
   AND s.grid_z IS NOT DISTINCT FROM p.gemm_grid_z AND s.block_x IS NOT DISTINCT FROM p.gemm_block_x
   AND s.block_y IS NOT DISTINCT FROM p.gemm_block_y AND s.block_z IS NOT DISTINCT FROM p.gemm_block_z
  WHERE p.gap_ns BETWEEN 0 AND back_to_back_ns AND p.comm_exposed_ns > 0
), _exposure_h AS (
  SELECT *, CASE WHEN slowdown_pct IS NOT NULL  -- greatest() would skip a NULL
                 THEN CAST(round(overlap_bound_ns * greatest(slowdown_pct, 0) / 100.0) AS BIGINT) END AS contention_ns
  FROM _exposure_p
)
SELECT rank, comm_kernel_id, collective, msg_bytes, comm_start_ns, comm_duration_ns, comm_exposed_ns,
       gemm_kernel_id, gemm_short_name, gemm_duration_ns, gap_ns, link_source, overlap_bound_ns,
       slowdown_pct::DOUBLE AS slowdown_pct, slowdown_source, contention_ns,
       overlap_bound_ns - contention_ns AS headroom_ns
FROM _exposure_h
ORDER BY headroom_ns DESC NULLS LAST, overlap_bound_ns DESC, rank, comm_start_ns, comm_kernel_id;
