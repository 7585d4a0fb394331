-- @include overlap/timeline.sql
-- @include overlap/overlap.sql
-- @include intervals/intervals.sql
-- @include messages/messages.sql
-- @include gemm/gemm.sql
-- Contention: what running computation and communication at the same time costs each of them (T3, Pati et al.
-- 2024: overlapped GEMMs and collectives share SMs and memory bandwidth, so both slow down).
--
-- A kernel is a sample 'alone' when nothing of the other side runs on its rank at any moment of it, 'overlapped'
-- when the other side covers at least overlapped_min_pct of its duration, and 'partial' (in neither sample)
-- otherwise. Kernels of zero duration are no samples. Alone and overlapped kernels of one group are compared
-- within the same step windows (the k-th step of every rank is window k, see _overlap_steps; kernels are placed by their
-- start; kernels outside every step are left out): only windows holding both an alone and an overlapped sample
-- of the group count, so a group whose alone kernels all ran in another iteration (warm-up, another phase) is
-- not compared. A job without steps is one window. A group needs min_samples kernels on each side to be
-- 'measured'; otherwise its slowdown and lost time are NULL (never 0).
-- Per group: slowdown_pct = 100 × (median_overlapped / median_alone − 1) and
-- lost_ns = Σ over the overlapped samples of (duration − median_alone).

-- @view _exposure_gemm_coverage
-- @sweep per_rank
-- Every GEMM kernel (kernel_class 'gemm', positive duration) with its shape, how much of it ran while communication
-- ran on its rank (intervals_covered_ns of the kernel by the union of the rank's communication kernels) and the
-- step of its rank that holds its start. A view, so that ingest stores it with the other shared sweeps
-- (nsys2comm.cache): the sweep over every GEMM, and the join back to the kernels, dominated gemm_contention and
-- serialised_pairs. Each row depends on its rank's rows only (the job-wide "no steps at all" rule is
-- _overlap_step_window's, applied when it is read).
-- @column kernel_id: GEMM kernel id.
-- @column rank: Rank.
-- @column short_name: Kernel base name.
-- @column grid_x: Grid size, x.
-- @column grid_y: Grid size, y.
-- @column grid_z: Grid size, z.
-- @column block_x: Block size, x.
-- @column block_y: Block size, y.
-- @column block_z: Block size, z.
-- @column start_ns: Kernel start (ns).
-- @column end_ns: Kernel end (ns).
-- @column rank_step_ord: Ordinal of the rank's step (_overlap_steps) whose range holds the kernel's start, NULL when none.
-- @column comm_covered_ns: Part of the kernel during which a communication kernel ran on the rank (ns).
-- @column m: GEMM problem M (gemm_problems, also on auxiliary kernels), NULL without a recorded shape.
-- @column n: GEMM problem N, NULL without a recorded shape.
-- @column k: GEMM problem K, NULL without a recorded shape.
-- @column batch: GEMM problem batch, NULL without a recorded shape.
-- @column dtype: GEMM operand dtype, NULL when unknown.
CREATE OR REPLACE VIEW _exposure_gemm_coverage AS
WITH _exposure_comm_iv AS (
  SELECT rank AS grp, start_ns, end_ns FROM kernels WHERE kernel_class = 'communication'
), _exposure_gemm AS (
  SELECT kernel_id, rank, short_name, grid_x, grid_y, grid_z, block_x, block_y, block_z, start_ns, end_ns
  FROM kernels WHERE kernel_class = 'gemm' AND end_ns > start_ns
), _exposure_gemm_probe AS (
  SELECT rank AS grp, kernel_id AS probe_id, start_ns, end_ns FROM _exposure_gemm
), _exposure_cov AS (
  SELECT probe_id AS kernel_id, covered_ns FROM intervals_covered_ns('_exposure_comm_iv', '_exposure_gemm_probe')
), _exposure_gemm_step AS (
  -- the ASOF join sorts its probe side with every column it carries: on the narrow probe, then joined back by id
  -- (10M kernels: 4.5-5.0 -> 3.4-4.1 s for the view, 3 alternating runs)
  SELECT p.probe_id AS kernel_id, CASE WHEN p.start_ns < s.step_end_ns THEN s.step_ord END AS rank_step_ord
  FROM _exposure_gemm_probe p
  ASOF LEFT JOIN _overlap_steps() s ON p.grp = s.rank AND p.start_ns >= s.step_start_ns
)
SELECT g.kernel_id, g.rank, g.short_name, g.grid_x, g.grid_y, g.grid_z, g.block_x, g.block_y, g.block_z,
       g.start_ns, g.end_ns, st.rank_step_ord, c.covered_ns AS comm_covered_ns, p.m, p.n, p.k, p.batch, p.dtype
FROM _exposure_gemm g
JOIN _exposure_cov c USING (kernel_id)
JOIN _exposure_gemm_step st USING (kernel_id)
LEFT JOIN _gemm_kernel_problems p USING (kernel_id);

-- @macro _exposure_gemm_samples
-- Every GEMM kernel (kernel_class 'gemm', positive duration) with how much of it ran while communication ran
-- on its rank (intervals_covered_ns of the kernel by the union of the rank's communication kernels) and its
-- sample: 'alone' when comm_covered_ns = 0, 'overlapped' when 100 × comm_covered_ns >= overlapped_min_pct ×
-- duration_ns, else 'partial'.
-- @param overlapped_min_pct: Share of the kernel (%) that communication must cover for an 'overlapped' sample.
-- @column kernel_id: GEMM kernel id.
-- @column rank: Rank.
-- @column window_ord: Step window of the kernel's start (_overlap_step_window; see the file header).
-- @column short_name: Kernel base name.
-- @column grid_x: Grid size, x.
-- @column grid_y: Grid size, y.
-- @column grid_z: Grid size, z.
-- @column block_x: Block size, x.
-- @column block_y: Block size, y.
-- @column block_z: Block size, z.
-- @column start_ns: Kernel start (ns).
-- @column end_ns: Kernel end (ns).
-- @column duration_ns: end_ns − start_ns (ns).
-- @column comm_covered_ns: Part of the kernel during which a communication kernel ran on the rank (ns).
-- @column sample: 'alone', 'overlapped' or 'partial'.
-- @column m: GEMM problem M, NULL without a recorded shape.
-- @column n: GEMM problem N, NULL without a recorded shape.
-- @column k: GEMM problem K, NULL without a recorded shape.
-- @column batch: GEMM problem batch, NULL without a recorded shape.
-- @column dtype: GEMM operand dtype, NULL when unknown.
CREATE OR REPLACE MACRO _exposure_gemm_samples(overlapped_min_pct) AS TABLE
SELECT kernel_id, rank, _overlap_step_window(rank_step_ord, 0) AS window_ord, short_name, grid_x, grid_y, grid_z,
       block_x, block_y, block_z, start_ns, end_ns, end_ns - start_ns AS duration_ns, comm_covered_ns,
       CASE WHEN comm_covered_ns = 0 THEN 'alone'
            WHEN 100 * comm_covered_ns >= overlapped_min_pct * (end_ns - start_ns) THEN 'overlapped'
            ELSE 'partial' END AS sample,
       m, n, k, batch, dtype
FROM _exposure_gemm_coverage;

-- @macro _exposure_comm_samples
-- Every communication kernel of positive duration (comm_kernels) with its sample: 'alone' when no computation
-- ran on its rank during it (overlapped_by_compute_ns = 0), 'overlapped' when 100 × overlapped_by_compute_ns >=
-- overlapped_min_pct × duration_ns, else 'partial'; and its bus bandwidth (_messages_busbw_gbps).
-- @param overlapped_min_pct: Share of the kernel (%) that computation must cover for an 'overlapped' sample.
-- @column kernel_id: Communication kernel id.
-- @column rank: Rank.
-- @column window_ord: Step window (_overlap_step_window) of the step of its rank whose CPU range [step_start_ns,
-- step_end_ns) holds its start (ASOF lookup of the last step started, no range join); 0 without steps, NULL
-- outside every step of a job that has steps.
-- @column collective: Canonical collective.
-- @column msg_bytes: Size S (bytes), when known.
-- @column group_size: Ranks in the communicator, when known.
-- @column duration_ns: Kernel duration (ns).
-- @column compute_covered_ns: comm_kernels.overlapped_by_compute_ns (ns).
-- @column busbw_gbps: Bus bandwidth of the operation (GB/s, _messages_busbw_gbps), NULL when its size or group is
-- unknown.
-- @column sample: 'alone', 'overlapped' or 'partial'.
CREATE OR REPLACE MACRO _exposure_comm_samples(overlapped_min_pct) AS TABLE
SELECT c.kernel_id, c.rank, c.window_ord, c.collective, c.msg_bytes, c.group_size, c.duration_ns,
       c.overlapped_by_compute_ns AS compute_covered_ns,
       _messages_busbw_gbps(c.collective, c.msg_bytes, c.group_size, c.duration_ns) AS busbw_gbps,
       CASE WHEN c.overlapped_by_compute_ns = 0 THEN 'alone'
            WHEN 100 * c.overlapped_by_compute_ns >= overlapped_min_pct * c.duration_ns THEN 'overlapped'
            ELSE 'partial' END AS sample
FROM (SELECT c.*, _overlap_step_window(CASE WHEN c.start_ns < s.step_end_ns THEN s.step_ord END, 0) AS window_ord
      FROM _overlap_comm_kernels c
      ASOF LEFT JOIN _overlap_steps() s ON c.rank = s.rank AND c.start_ns >= s.step_start_ns) c
WHERE c.duration_ns > 0;

-- @macro _exposure_contention
-- The comparison shared by gemm_contention and comm_contention, for the samples of one kind: 'gemm'
-- (_exposure_gemm_samples, grouped by gemm_shape) or 'comm' (_exposure_comm_samples, grouped by comm_group, with
-- the bus bandwidth as val). The other kind's branch is constant-false and pruned by the optimizer. Windows with
-- both an alone and an overlapped sample of the group are used (window_ord NULL is never used); medians are exact.
-- @param sample_kind: 'gemm' or 'comm'.
-- @param min_samples: Samples needed on each side for a measured group.
-- @param overlapped_min_pct: Share of a kernel (%) the other side must cover for an 'overlapped' sample.
-- @column gemm_shape: GEMM group (short_name, grid_x/y/z, block_x/y/z, and the problem m, n, k, batch, dtype from
-- gemm_problems, NULL where the trace records no shape); NULL for 'comm'.
-- @column comm_group: Communication group (collective, msg_bytes, group_size); NULL for 'gemm'.
-- @column kernels: Kernels of the group (all samples, every window).
-- @column partial_samples: Kernels of the group partly overlapped (in neither sample).
-- @column windows: Windows used (with both an alone and an overlapped sample).
-- @column alone_samples: Alone kernels in the windows used.
-- @column overlapped_samples: Overlapped kernels in the windows used.
-- @column median_alone_ns: Median duration of the alone samples (ns, DOUBLE).
-- @column median_overlapped_ns: Median duration of the overlapped samples (ns, DOUBLE).
-- @column median_alone_val: Median val (bus bandwidth for 'comm', GB/s) of the alone samples.
-- @column median_overlapped_val: Median val of the overlapped samples.
-- @column overlapped_sum_ns: Σ duration of the overlapped samples (ns).
-- @column spread_ratio: The larger, over the two sides, of P90 / P10 of the used samples' durations
-- (quantile_cont), NULL without samples.
-- @column measured: True when both sides have >= min_samples (and >= 1) samples.
-- @column slowdown_pct: 100 × (median_overlapped_ns − median_alone_ns) / median_alone_ns when measured.
-- @column lost_ns: Σ over the overlapped samples of (duration − median_alone_ns) (ns, DOUBLE) when measured.
CREATE OR REPLACE MACRO _exposure_contention(sample_kind, min_samples, overlapped_min_pct) AS TABLE
WITH _exposure_gemm_in AS NOT MATERIALIZED (  -- read again by each use: rescanning the stored GEMM coverage
  -- costs less than materializing these rows with their struct keys (0.8 -> 0.3 s at 4.5M GEMMs)
  SELECT {'short_name': short_name, 'grid_x': grid_x, 'grid_y': grid_y, 'grid_z': grid_z, 'block_x': block_x,
          'block_y': block_y, 'block_z': block_z, 'm': m, 'n': n, 'k': k, 'batch': batch, 'dtype': dtype}
           AS gemm_shape,
         NULL::STRUCT(collective VARCHAR, msg_bytes BIGINT, group_size INTEGER) AS comm_group,
         window_ord, duration_ns, sample, NULL::DOUBLE AS val
  FROM _exposure_gemm_samples(overlapped_min_pct) WHERE sample_kind = 'gemm'
), _exposure_comm_in AS MATERIALIZED (  -- computed once: comm_kernels() and the step look-up cost more than that
  SELECT NULL::STRUCT(short_name VARCHAR, grid_x INTEGER, grid_y INTEGER, grid_z INTEGER, block_x INTEGER,
                      block_y INTEGER, block_z INTEGER, m BIGINT, n BIGINT, k BIGINT, batch BIGINT, dtype VARCHAR),
         {'collective': collective, 'msg_bytes': msg_bytes, 'group_size': group_size},
         window_ord, duration_ns, sample, busbw_gbps
  FROM _exposure_comm_samples(overlapped_min_pct) WHERE sample_kind = 'comm'
), _exposure_in AS NOT MATERIALIZED (
  SELECT * FROM _exposure_gemm_in UNION ALL SELECT * FROM _exposure_comm_in
), _exposure_u AS (  -- the used windows: a group-by, then a join (a window partitioned by struct keys cost 2x)
  SELECT gemm_shape, comm_group, window_ord FROM _exposure_in WHERE window_ord IS NOT NULL
  GROUP BY ALL HAVING bool_or(sample = 'alone') AND bool_or(sample = 'overlapped')
), _exposure_uc AS (  -- used windows per group (a DISTINCT count over every sample cost 0.5 s at 4.5M GEMMs)
  SELECT gemm_shape, comm_group, count(*) AS windows FROM _exposure_u GROUP BY ALL
), _exposure_s AS (
  SELECT i.gemm_shape, i.comm_group, i.window_ord, i.duration_ns, i.sample, i.val, u.window_ord IS NOT NULL AS used
  FROM _exposure_in i LEFT JOIN _exposure_u u
    ON i.gemm_shape IS NOT DISTINCT FROM u.gemm_shape AND i.comm_group IS NOT DISTINCT FROM u.comm_group
       AND i.window_ord = u.window_ord
), _exposure_g0 AS (
  SELECT gemm_shape, comm_group, count(*) AS kernels, count(*) FILTER (WHERE sample = 'partial') AS partial_samples,
         count(*) FILTER (WHERE used AND sample = 'alone') AS alone_samples,
         count(*) FILTER (WHERE used AND sample = 'overlapped') AS overlapped_samples,
         median(duration_ns) FILTER (WHERE used AND sample = 'alone')::DOUBLE AS median_alone_ns,
         median(duration_ns) FILTER (WHERE used AND sample = 'overlapped')::DOUBLE AS median_overlapped_ns,
         median(val) FILTER (WHERE used AND sample = 'alone')::DOUBLE AS median_alone_val,
         median(val) FILTER (WHERE used AND sample = 'overlapped')::DOUBLE AS median_overlapped_val,
         sum(duration_ns) FILTER (WHERE used AND sample = 'overlapped')::DOUBLE AS overlapped_sum_ns,
         greatest(quantile_cont(duration_ns, 0.9) FILTER (WHERE used AND sample = 'alone')
                    / quantile_cont(duration_ns, 0.1) FILTER (WHERE used AND sample = 'alone'),
                  quantile_cont(duration_ns, 0.9) FILTER (WHERE used AND sample = 'overlapped')
                    / quantile_cont(duration_ns, 0.1) FILTER (WHERE used AND sample = 'overlapped'))::DOUBLE
           AS spread_ratio
  FROM _exposure_s GROUP BY gemm_shape, comm_group
), _exposure_g AS (
  SELECT g.*, coalesce(uc.windows, 0) AS windows FROM _exposure_g0 g LEFT JOIN _exposure_uc uc
    ON g.gemm_shape IS NOT DISTINCT FROM uc.gemm_shape AND g.comm_group IS NOT DISTINCT FROM uc.comm_group
), _exposure_m AS (
  SELECT *, alone_samples >= greatest(min_samples, 1) AND overlapped_samples >= greatest(min_samples, 1) AS measured
  FROM _exposure_g
)
SELECT gemm_shape, comm_group, kernels, partial_samples, windows, alone_samples, overlapped_samples,
       median_alone_ns, median_overlapped_ns, median_alone_val, median_overlapped_val, overlapped_sum_ns,
       spread_ratio, measured,
       CASE WHEN measured THEN 100.0 * (median_overlapped_ns - median_alone_ns) / median_alone_ns END::DOUBLE
         AS slowdown_pct,
       CASE WHEN measured THEN overlapped_sum_ns - overlapped_samples * median_alone_ns END::DOUBLE AS lost_ns
FROM _exposure_m;

-- @macro gemm_contention
-- GEMM slowdown while communication runs, per GEMM group, and for the job. A group is one problem run by one
-- kernel: the kernel base name with its grid and block sizes (short_name, grid_x/y/z, block_x/y/z) and the problem
-- the trace records for it (m, n, k, batch, dtype of gemm_problems, auxiliary kernels included: a split-K GEMM and
-- its splitKreduce are two groups). Where the trace records no shape the group is the kernel and launch shape
-- alone (group_by 'kernel'), which can mix problem sizes.
-- A GEMM is 'alone' when no communication kernel on its rank overlaps it at all, 'overlapped' when communication
-- covers >= overlapped_min_pct of its duration (intervals_covered_ns by the union of the rank's communication
-- kernels), partial otherwise (left out); both samples are taken within the same step windows (see the file
-- header). A group is 'measured' with >= min_samples samples on each side; else 'too_few_samples' and its
-- slowdown and lost time are NULL.
-- Bimodality guard, on every group with enough samples: durations that spread more than mixed_ratio× between P10
-- and P90 on either side (spread_ratio), or medians of the two sides more than mixed_ratio× apart in either
-- direction, are work of different sizes, not one problem slowed down by contention: status 'mixed_shapes',
-- slowdown and lost time NULL, left out of the job row. (So a kernel that ran for 50 µs alone and 500 µs beside
-- communication, or the reverse, yields no slowdown.)
-- The last row (scope 'job') summarises the measured groups: slowdown_pct is their time-weighted median (weights
-- overlapped_samples × median_alone_ns, the overlapped GEMM time at the alone speed; the lower weighted median, so
-- always one group's own figure, within their range, and not pulled by a few outliers); lost_ns, kernels and
-- samples are their sums; status 'measured' when at least one group is, else 'mixed_shapes' when a group was
-- excluded as mixed, else 'too_few_samples'. It is absent when the job has no GEMM.
-- @param min_samples: Samples needed on each side (alone and overlapped) before a slowdown is reported; 5 keeps a
-- single outlier from setting a median while still measuring short traces of a few iterations.
-- @param overlapped_min_pct: Share of a GEMM (%) that communication must cover for it to count as overlapped;
-- 50 = at least half of the kernel ran under communication.
-- @param mixed_ratio: The bimodality guard's bound (2: one problem run by one kernel keeps its middle 80 % of
-- durations within 2×, and contention does not halve or double a GEMM's median).
-- @column scope [key]: 'shape_group' (one group) or 'job' (the measured groups).
-- @column group_by: 'shape' (the trace records the problem: m, n, k, batch known) or 'kernel' (name, grid and
-- block only); NULL on the job row.
-- @column short_name [key]: Kernel base name (NULL on the job row).
-- @column grid_x: Grid size, x (NULL on the job row).
-- @column grid_y: Grid size, y (NULL on the job row).
-- @column grid_z: Grid size, z (NULL on the job row).
-- @column block_x: Block size, x (NULL on the job row).
-- @column block_y: Block size, y (NULL on the job row).
-- @column block_z: Block size, z (NULL on the job row).
-- @column m: GEMM problem M (gemm_problems); NULL without a recorded shape and on the job row.
-- @column n: GEMM problem N; NULL without a recorded shape and on the job row.
-- @column k: GEMM problem K; NULL without a recorded shape and on the job row.
-- @column batch: GEMM problem batch; NULL without a recorded shape and on the job row.
-- @column dtype: GEMM operand dtype; NULL when unknown and on the job row.
-- @column kernels: GEMM kernels of the group (all ranks, positive duration); job row: of the measured groups.
-- @column partial_samples: Kernels partly overlapped (< overlapped_min_pct, > 0), in neither sample.
-- @column windows: Step windows with both an alone and an overlapped sample of the group (used windows); NULL on the job row.
-- @column alone_samples: Alone kernels in the used windows.
-- @column overlapped_samples: Overlapped kernels in the used windows.
-- @column median_alone_ns: Median duration of the alone samples (ns, rounded); NULL without samples and on the job row.
-- @column median_overlapped_ns: Median duration of the overlapped samples (ns, rounded); NULL without samples and on the job row.
-- @column spread_ratio: The larger of P90 / P10 of the alone and of the overlapped samples' durations (the
-- bimodality guard's measure); NULL without samples and on the job row.
-- @column slowdown_pct [key]: 100 × (median_overlapped / median_alone − 1) (exact medians) when measured; job row: the time-weighted median over the measured groups; NULL otherwise.
-- @column lost_ns [key]: Σ over the overlapped samples of (duration − median_alone) (ns, rounded) when measured; job row: Σ over the measured groups; NULL otherwise.
-- @column measured_groups: Job row: groups measured (those its figures summarise); NULL on group rows.
-- @column mixed_groups: Job row: groups excluded as 'mixed_shapes'; NULL on group rows.
-- @column status [key]: 'measured', 'too_few_samples' or 'mixed_shapes' (see the bimodality guard).
CREATE OR REPLACE MACRO gemm_contention(min_samples := 5, overlapped_min_pct := 50, mixed_ratio := 2) AS TABLE
WITH _exposure_r0 AS (
  SELECT * FROM _exposure_contention('gemm', min_samples, overlapped_min_pct)
), _exposure_r AS (
  SELECT *, CASE WHEN NOT measured THEN 'too_few_samples'
                 WHEN spread_ratio > mixed_ratio OR median_overlapped_ns > mixed_ratio * median_alone_ns
                   OR median_alone_ns > mixed_ratio * median_overlapped_ns THEN 'mixed_shapes'
                 ELSE 'measured' END AS status
  FROM _exposure_r0
), _exposure_w AS (  -- cumulative weight in slowdown order, for the weighted median (weights doubled: exact)
  SELECT slowdown_pct,
         sum(CAST(2 * overlapped_samples * median_alone_ns AS HUGEINT)) OVER (
           ORDER BY slowdown_pct ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum_w,
         sum(CAST(2 * overlapped_samples * median_alone_ns AS HUGEINT)) OVER () AS tot_w
  FROM _exposure_r WHERE status = 'measured'
), _exposure_rows AS (
  SELECT 'shape_group' AS scope, CASE WHEN gemm_shape.m IS NOT NULL THEN 'shape' ELSE 'kernel' END AS group_by,
         gemm_shape.short_name, gemm_shape.grid_x, gemm_shape.grid_y, gemm_shape.grid_z,
         gemm_shape.block_x, gemm_shape.block_y, gemm_shape.block_z, gemm_shape.m, gemm_shape.n, gemm_shape.k,
         gemm_shape.batch, gemm_shape.dtype, kernels, partial_samples, windows, alone_samples, overlapped_samples,
         CAST(round(median_alone_ns) AS BIGINT) AS median_alone_ns,
         CAST(round(median_overlapped_ns) AS BIGINT) AS median_overlapped_ns, spread_ratio,
         CASE WHEN status = 'measured' THEN slowdown_pct END AS slowdown_pct,
         CASE WHEN status = 'measured' THEN CAST(round(lost_ns) AS BIGINT) END AS lost_ns,
         NULL::BIGINT AS measured_groups, NULL::BIGINT AS mixed_groups, status
  FROM _exposure_r
  UNION ALL
  SELECT 'job', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         coalesce(sum(kernels) FILTER (WHERE status = 'measured'), 0),
         coalesce(sum(partial_samples) FILTER (WHERE status = 'measured'), 0),
         NULL, coalesce(sum(alone_samples) FILTER (WHERE status = 'measured'), 0),
         coalesce(sum(overlapped_samples) FILTER (WHERE status = 'measured'), 0), NULL, NULL, NULL,
         (SELECT min(slowdown_pct) FROM _exposure_w WHERE 2 * cum_w >= tot_w)::DOUBLE,
         CAST(round(sum(lost_ns) FILTER (WHERE status = 'measured')) AS BIGINT),
         count(*) FILTER (WHERE status = 'measured'), count(*) FILTER (WHERE status = 'mixed_shapes'),
         CASE WHEN bool_or(status = 'measured') THEN 'measured'
              WHEN bool_or(status = 'mixed_shapes') THEN 'mixed_shapes' ELSE 'too_few_samples' END
  FROM _exposure_r
  HAVING count(*) > 0
)
SELECT scope, group_by, short_name, grid_x, grid_y, grid_z, block_x, block_y, block_z, m, n, k, batch, dtype,
       CAST(kernels AS BIGINT) AS kernels, CAST(partial_samples AS BIGINT) AS partial_samples,
       CAST(windows AS BIGINT) AS windows, CAST(alone_samples AS BIGINT) AS alone_samples,
       CAST(overlapped_samples AS BIGINT) AS overlapped_samples, median_alone_ns, median_overlapped_ns,
       spread_ratio, slowdown_pct, lost_ns, CAST(measured_groups AS BIGINT) AS measured_groups,
       CAST(mixed_groups AS BIGINT) AS mixed_groups, status
FROM _exposure_rows
ORDER BY scope = 'job', lost_ns DESC NULLS LAST, short_name, grid_x, grid_y, grid_z, block_x, block_y, block_z,
         m NULLS LAST, n NULLS LAST, k NULLS LAST, batch NULLS LAST, dtype NULLS LAST;

-- @macro comm_contention
-- Communication slowdown while computation runs, per (collective, msg_bytes, group_size): communication
-- kernels (comm_kernels, positive duration) 'alone' (overlapped_by_compute_ns = 0: no gemm, convolution,
-- attention or compute kernel ran on the rank during it) against 'overlapped' (computation covers >=
-- overlapped_min_pct of the kernel), partial ones left out, within the same step windows (see the file header).
-- Bus bandwidth is nccl-tests' busbw of each operation (collective_bandwidth_by_op). A kernel's duration
-- includes time spent waiting for late peers (see collective_skew), which this comparison does not separate.
-- A group is 'measured' with >= min_samples samples on each side; else 'too_few_samples' and its slowdown and
-- lost time are NULL.
-- @param min_samples: Samples needed on each side (alone and overlapped) before a slowdown is reported; 5, as
-- for gemm_contention.
-- @param overlapped_min_pct: Share of a communication kernel (%) that computation must cover for it to count as
-- overlapped; 50, as for gemm_contention.
-- @column collective [key]: Canonical collective ('unknown' without a comm_ops row).
-- @column msg_bytes [key]: Size S (bytes), NULL when unknown.
-- @column group_size: Ranks in the communicator, NULL when unknown.
-- @column kernels [key]: Communication kernels of the group (all ranks, positive duration).
-- @column partial_samples: Kernels partly under computation (< overlapped_min_pct, > 0), in neither sample.
-- @column windows: Step windows with both an alone and an overlapped sample of the group (used windows).
-- @column alone_samples: Alone kernels in the used windows.
-- @column overlapped_samples: Overlapped kernels in the used windows.
-- @column median_alone_ns: Median duration of the alone samples (ns, rounded); NULL without samples.
-- @column median_overlapped_ns: Median duration of the overlapped samples (ns, rounded); NULL without samples.
-- @column median_busbw_alone_gbps: Median bus bandwidth of the alone samples (GB/s); NULL when unknown.
-- @column median_busbw_overlapped_gbps: Median bus bandwidth of the overlapped samples (GB/s); NULL when unknown.
-- @column slowdown_pct [key]: 100 × (median_overlapped / median_alone − 1) (exact medians); NULL unless measured.
-- @column lost_ns [key]: Σ over the overlapped samples of (duration − median_alone) (ns, rounded); NULL unless measured.
-- @column status [key]: 'measured' or 'too_few_samples'.
CREATE OR REPLACE MACRO comm_contention(min_samples := 5, overlapped_min_pct := 50) AS TABLE
WITH _exposure_r AS (
  SELECT * FROM _exposure_contention('comm', min_samples, overlapped_min_pct)
), _exposure_out AS (
  SELECT comm_group.collective, comm_group.msg_bytes, comm_group.group_size, CAST(kernels AS BIGINT) AS kernels,
         CAST(partial_samples AS BIGINT) AS partial_samples, CAST(windows AS BIGINT) AS windows,
         CAST(alone_samples AS BIGINT) AS alone_samples, CAST(overlapped_samples AS BIGINT) AS overlapped_samples,
         CAST(round(median_alone_ns) AS BIGINT) AS median_alone_ns,
         CAST(round(median_overlapped_ns) AS BIGINT) AS median_overlapped_ns,
         median_alone_val AS median_busbw_alone_gbps, median_overlapped_val AS median_busbw_overlapped_gbps,
         slowdown_pct, CAST(round(lost_ns) AS BIGINT) AS lost_ns,
         CASE WHEN measured THEN 'measured' ELSE 'too_few_samples' END AS status
  FROM _exposure_r
)
SELECT * FROM _exposure_out
ORDER BY lost_ns DESC NULLS LAST, collective, msg_bytes NULLS LAST, group_size NULLS LAST;
