-- @include skew/skew.sql
-- @include devices/peaks.sql
-- Latency-bound communication: transfer time apart from waiting (from the matching in skew.sql) and the
-- latency-bandwidth (Hockney α-β) model transfer_ns ≈ α + msg_bytes / β per (collective, group size) and for p2p.
-- Clean data only: the fit uses instances whose transfer time was matched on the complete group, ranks agreeing
-- (_skew_comm_instances.transfer_source = 'matched'). Kernel durations (single-rank jobs, partial groups, unmatched or
-- inconsistent instances) include waiting for peers: they get a duration distribution, labelled so, never a fit.
-- Fit (Theil–Sen): instances are reduced to one point per size bucket (1/8 octave: median size, median transfer);
-- only points of >= 2 instances are used. The slope 1/β is the median of the slopes between every two used points
-- (never pairs of raw operations), α the median over used points of (median transfer − slope × size). n½ = α·β, the
-- size whose transfer time is half latency; an operation smaller than n½ is latency-bound.
-- Intervals: a deterministic bootstrap. Each of _skew_latency_replicates() replicates resamples every used point's
-- instances with replacement (draw j of replicate b picks the instance of rank 1 + hash(model, bucket, b, j) mod n),
-- takes the point's median and refits; the 95 % intervals are the 2.5th and 97.5th percentiles of the replicates'
-- slope and α. A point of more than 32 instances draws its resampled median's rank instead (the median of n draws
-- lies at rank (n+1)/2 + z·√n/2, z standard normal from two hashes by Box–Muller, interpolated like the median), so
-- the cost is replicates × (points + instances of points up to 32), never instances × instances.
-- fit_quality 'ok' is the only fit any threshold, share, saving or gate uses: >= 3 used size points spanning >= 8×, a
-- positive slope, 0 <= α <= 1 ms, β as bus bandwidth within _skew_latency_busbw_bound_gbps, and intervals that are
-- bounded (α_lo > 0, slope_lo > 0: β_hi finite) and not degenerate (lo < hi: replicates that never vary mean too
-- little data, not a perfect fit). The 64 KiB rule of thumb is kept as separate, labelled columns only.

-- @macro _skew_small_fallback_bytes
-- The 64 KiB rule of thumb for "small" (latency_model's small_64kib_* columns only: never a latency-bound share).
CREATE OR REPLACE MACRO _skew_small_fallback_bytes() AS 65536;

-- @macro _skew_latency_replicates
-- Bootstrap replicates per α-β fit (queries/skew/latency.sql header): 200 puts the 2.5th and 97.5th percentiles
-- 5 replicates from each end.
CREATE OR REPLACE MACRO _skew_latency_replicates() AS 200;

-- @macro _skew_latency_min_coverage_pct
-- Smallest share of communication kernel time (%) that the 'ok' fits must cover for latency_bound_total to give a
-- job-wide latency_bound_pct: below it the share would describe a sliver of the job (NULL, 'coverage_below_10pct').
CREATE OR REPLACE MACRO _skew_latency_min_coverage_pct() AS 10.0;

-- @macro _skew_latency_busbw_bound_gbps
-- Highest bus bandwidth a fitted β may reach (GB/s): the job's peak (_devices_peak_busbw_gbps: the devices' links or
-- --link-gbps / --nic-gbps, in-network reduction allowances included), else a bound no device exceeds: 900 GB/s, the
-- fastest link that exists (NVLink 5, B200: 1.8 TB/s bidirectional, 900 GB/s each way), twice that for all_reduce:
-- NVLink SHARP (NVLS) reduces in the switch, letting all_reduce busbw pass wire speed (482 GB/s on 8×H200 over
-- 450 GB/s NVLink 4, docs/comm-models.md, docs/device-peaks.md), never twice over (each rank still sends and receives S).
-- @param collective: Canonical collective ('p2p' for matched send/recv).
-- @param peak_gbps: _devices_peak_busbw_gbps(), NULL when unknown.
CREATE OR REPLACE MACRO _skew_latency_busbw_bound_gbps(collective, peak_gbps) AS
  coalesce(peak_gbps, CASE WHEN collective = 'all_reduce' THEN 1800.0 ELSE 900.0 END);

-- @macro comm_transfer
-- One row per matched communication instance, collectives and point-to-point: its transfer time apart from waiting
-- and the waits (definitions in queries/skew). Times are on the reference clock (host_clock_offsets).
-- @column instance_key: Matching key ('p2p:<group>:<src>><dst>#k' for the k-th send/recv of a pair).
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column kind: 'collective' or 'p2p'.
-- @column collective [key]: Collective; 'p2p' for a matched send/recv pair.
-- @column group_size: Group size when known, else the ranks that ran it (2 for p2p).
-- @column pg_name: Group, when known.
-- @column seq [key]: Sequence number, when known.
-- @column msg_bytes [key]: Size S (bytes), when known.
-- @column src_rank [key]: p2p: sending rank, else NULL.
-- @column dst_rank [key]: p2p: receiving rank, else NULL.
-- @column ranks_seen: Ranks that ran this instance.
-- @column first_start_ns: Earliest start (ns).
-- @column last_start_ns: Latest start (ns).
-- @column transfer_ns [key]: Collective: end of the last-arriving rank − latest start; p2p: recv end − latest start (ns, >= 0).
-- @column transfer_source: 'matched' (complete group, ranks agree), else why transfer_ns is NULL (_skew_comm_instances).
-- @column max_wait_ns [key]: Longest wait of a rank, last_start_ns − first_start_ns (ns).
-- @column last_arriving_rank: Rank with the latest start (lowest such rank on ties).
-- @column rank_wait_ns: Per rank wait (latest start − own start), a list of {rank, wait_ns} sorted by rank (ns).
CREATE OR REPLACE MACRO comm_transfer() AS TABLE
SELECT instance_key, match_rule, kind, collective, group_size, pg_name, seq, msg_bytes, src_rank, dst_rank,
       ranks_seen, first_start_ns, last_start_ns, transfer_ns, transfer_source, last_start_ns - first_start_ns AS max_wait_ns,
       last_arriving_rank, rank_wait_ns
FROM _skew_comm_instances
ORDER BY first_start_ns, instance_key;

-- @macro transfer_by_pair
-- Point-to-point per ordered pair (sender → receiver), matched send/recv only: transfer-time and wait
-- distributions (wait = how long the earlier side waited for the other), and which side waited. Needs no sizes.
-- @column src_rank [key]: Sending rank.
-- @column dst_rank [key]: Receiving rank.
-- @column instances [key]: Matched send/recv pairs.
-- @column sized_instances: Of those, with a known size.
-- @column total_bytes: Sum of sizes (bytes), NULL when none known.
-- @column transfer_p10_ns: 10th percentile transfer time (ns, nearest rank).
-- @column transfer_p50_ns [key]: Median transfer time (ns, nearest rank).
-- @column transfer_p90_ns: 90th percentile transfer time (ns, nearest rank).
-- @column wait_p50_ns [key]: Median wait of the earlier side (ns, nearest rank).
-- @column wait_p90_ns: 90th percentile wait of the earlier side (ns, nearest rank).
-- @column total_transfer_ns: Sum of transfer times (ns).
-- @column total_wait_ns: Sum of waits (ns).
-- @column receiver_waited_pct [key]: 100 × pairs where the recv started first (the receiver waited) / instances.
CREATE OR REPLACE MACRO transfer_by_pair() AS TABLE
SELECT src_rank, dst_rank, count(*) AS instances, count(msg_bytes) AS sized_instances,
       CAST(sum(msg_bytes) AS BIGINT) AS total_bytes,
       quantile_disc(transfer_ns, 0.1) AS transfer_p10_ns, quantile_disc(transfer_ns, 0.5) AS transfer_p50_ns,
       quantile_disc(transfer_ns, 0.9) AS transfer_p90_ns,
       quantile_disc(last_start_ns - first_start_ns, 0.5) AS wait_p50_ns,
       quantile_disc(last_start_ns - first_start_ns, 0.9) AS wait_p90_ns,
       CAST(sum(transfer_ns) AS BIGINT) AS total_transfer_ns,
       CAST(sum(last_start_ns - first_start_ns) AS BIGINT) AS total_wait_ns,
       (100.0 * count(*) FILTER (WHERE first_arriving_rank = dst_rank AND last_start_ns > first_start_ns)
        / count(*))::DOUBLE AS receiver_waited_pct
FROM _skew_comm_instances
WHERE kind = 'p2p' AND transfer_source = 'matched'
GROUP BY src_rank, dst_rank
ORDER BY src_rank, dst_rank;

-- @view _skew_latency_sized
-- The instances an α-β fit may use: transfer time matched on the complete group (transfer_source 'matched') and a
-- known size, with their size bucket.
-- @column collective: Collective ('p2p' for matched send/recv).
-- @column group_size: Group size (comm_transfer).
-- @column instance_key: Matching key.
-- @column size_bucket: round(8 × log2(msg_bytes)): 1/8-octave bucket.
-- @column msg_bytes: Size S (bytes).
-- @column transfer_ns: Transfer time apart from waiting (ns).
CREATE OR REPLACE VIEW _skew_latency_sized AS
SELECT collective, group_size, instance_key, round(8 * log2(msg_bytes))::INTEGER AS size_bucket, msg_bytes,
       transfer_ns
FROM _skew_comm_instances
WHERE transfer_source = 'matched' AND transfer_ns IS NOT NULL AND msg_bytes > 0;

-- @view _skew_latency_points
-- One point per (collective, group size, size bucket of 1/8 octave) over _skew_latency_sized.
-- @column collective: Collective ('p2p' for matched send/recv).
-- @column group_size: Group size (comm_transfer).
-- @column size_bucket: round(8 × log2(msg_bytes)).
-- @column msg_bytes: Median size in the bucket (bytes).
-- @column instances: Instances in the bucket (the fit uses buckets of >= 2).
-- @column transfer_p10_ns: 10th percentile transfer time (ns).
-- @column transfer_p50_ns: Median transfer time (ns).
-- @column transfer_p90_ns: 90th percentile transfer time (ns).
CREATE OR REPLACE VIEW _skew_latency_points AS
SELECT collective, group_size, size_bucket, quantile_cont(msg_bytes, 0.5) AS msg_bytes, count(*) AS instances,
       quantile_cont(transfer_ns, 0.1) AS transfer_p10_ns, quantile_cont(transfer_ns, 0.5) AS transfer_p50_ns,
       quantile_cont(transfer_ns, 0.9) AS transfer_p90_ns
FROM _skew_latency_sized
GROUP BY collective, group_size, size_bucket;

-- @view _skew_latency_fit
-- Theil–Sen fit per (collective, group size) over the used points of _skew_latency_points (>= 2 instances), with
-- bootstrap 95 % intervals (queries/skew/latency.sql header). Slope and α only where >= 3 points are used.
-- @column collective: Collective.
-- @column group_size: Group size.
-- @column sizes: Size points (distinct size buckets).
-- @column sizes_used: Size points of >= 2 instances: those the fit uses.
-- @column min_bytes: Smallest used point size (bytes).
-- @column max_bytes: Largest used point size (bytes).
-- @column slope_ns_per_byte: Median pairwise slope = 1/β (ns per byte).
-- @column slope_lo_ns_per_byte: 2.5th percentile of the replicates' slope.
-- @column slope_hi_ns_per_byte: 97.5th percentile of the replicates' slope.
-- @column alpha_ns: Median over used points of (median transfer − slope × size) (ns).
-- @column alpha_lo_ns: 2.5th percentile of the replicates' α (ns).
-- @column alpha_hi_ns: 97.5th percentile of the replicates' α (ns).
CREATE OR REPLACE VIEW _skew_latency_fit AS
WITH p AS (SELECT * FROM _skew_latency_points),
pts AS (
  SELECT collective, group_size, count(*) AS sizes, count(*) FILTER (WHERE instances >= 2) AS sizes_used,
         min(msg_bytes) FILTER (WHERE instances >= 2) AS min_bytes,
         max(msg_bytes) FILTER (WHERE instances >= 2) AS max_bytes
  FROM p GROUP BY collective, group_size
), u AS (  -- the used points of the models that get a fit, numbered: model mid, point pid (integer join keys)
  SELECT p.*, dense_rank() OVER (ORDER BY p.collective, p.group_size) AS mid,
         row_number() OVER (ORDER BY p.collective, p.group_size, p.size_bucket) AS pid
  FROM p JOIN pts USING (collective, group_size) WHERE p.instances >= 2 AND pts.sizes_used >= 3
), sl AS (  -- point estimate: pairs of used points (a few hundred points at most: 8 buckets per octave)
  SELECT a.mid, quantile_cont((b.transfer_p50_ns - a.transfer_p50_ns) / (b.msg_bytes - a.msg_bytes), 0.5) AS slope
  FROM u a JOIN u b ON a.mid = b.mid AND a.size_bucket < b.size_bucket
  GROUP BY a.mid
), al AS (
  SELECT u.mid, any_value(u.collective) AS collective, any_value(u.group_size) AS group_size,
         any_value(sl.slope) AS slope, quantile_cont(u.transfer_p50_ns - sl.slope * u.msg_bytes, 0.5) AS alpha
  FROM u JOIN sl USING (mid) GROUP BY u.mid
), r AS (  -- the used points' instances, ranked by transfer time within their point
  SELECT u.pid, s.transfer_ns, row_number() OVER (PARTITION BY u.pid ORDER BY s.transfer_ns, s.instance_key) AS rn
  FROM _skew_latency_sized s JOIN u USING (collective, group_size, size_bucket)
), reps AS (SELECT range AS b FROM range(_skew_latency_replicates())
), draw AS (  -- points of <= 32 instances: n draws with replacement per replicate
  SELECT u.pid, reps.b, CAST(1 + hash(u.collective, u.group_size, u.size_bucket, reps.b, d.j) % u.instances AS BIGINT) AS rn
  FROM u CROSS JOIN reps CROSS JOIN range(u.instances) d(j)
  WHERE u.instances <= 32
), small AS (
  SELECT d.pid, d.b, quantile_cont(r.transfer_ns, 0.5) AS med FROM draw d JOIN r USING (pid, rn) GROUP BY d.pid, d.b
), z AS (  -- larger points: the resampled median's rank (header), two uniforms in (0, 1) from hashes
  SELECT u.pid, reps.b, u.instances AS n,
         (hash(u.collective, u.group_size, u.size_bucket, reps.b, 'u1') % 4294967296 + 0.5) / 4294967296.0 AS u1,
         (hash(u.collective, u.group_size, u.size_bucket, reps.b, 'u2') % 4294967296 + 0.5) / 4294967296.0 AS u2
  FROM u CROSS JOIN reps
  WHERE u.instances > 32
), zp AS (
  SELECT *, greatest(1.0, least(n, (n + 1) / 2.0 + sqrt(n) / 2.0 * sqrt(-2.0 * ln(u1)) * cos(2.0 * pi() * u2))) AS pos
  FROM z
), large AS (
  SELECT zp.pid, zp.b, lo.transfer_ns + (zp.pos - floor(zp.pos)) * (hi.transfer_ns - lo.transfer_ns) AS med
  FROM zp JOIN r lo ON lo.pid = zp.pid AND lo.rn = floor(zp.pos)
          JOIN r hi ON hi.pid = zp.pid AND hi.rn = least(floor(zp.pos) + 1, zp.n)
), bp AS (  -- replicate points: resampled median at the point's size
  SELECT u.mid, u.size_bucket, m.b, m.med, u.msg_bytes
  FROM (SELECT * FROM small UNION ALL SELECT * FROM large) m JOIN u USING (pid)
), bsl AS (
  SELECT a.mid, a.b, quantile_cont((b.med - a.med) / (b.msg_bytes - a.msg_bytes), 0.5) AS slope
  FROM bp a JOIN bp b ON a.mid = b.mid AND a.b = b.b AND a.size_bucket < b.size_bucket
  GROUP BY a.mid, a.b
), bal AS (
  SELECT bp.mid, bp.b, any_value(bsl.slope) AS slope, quantile_cont(bp.med - bsl.slope * bp.msg_bytes, 0.5) AS alpha
  FROM bp JOIN bsl USING (mid, b) GROUP BY bp.mid, bp.b
), ci AS (
  SELECT mid, quantile_cont(slope, 0.025) AS slope_lo, quantile_cont(slope, 0.975) AS slope_hi,
         quantile_cont(alpha, 0.025) AS alpha_lo, quantile_cont(alpha, 0.975) AS alpha_hi
  FROM bal GROUP BY mid
), est AS (SELECT al.*, ci.slope_lo, ci.slope_hi, ci.alpha_lo, ci.alpha_hi FROM al LEFT JOIN ci USING (mid))
SELECT pts.collective, pts.group_size, pts.sizes, pts.sizes_used, pts.min_bytes, pts.max_bytes,
       est.slope AS slope_ns_per_byte, est.slope_lo AS slope_lo_ns_per_byte, est.slope_hi AS slope_hi_ns_per_byte,
       est.alpha AS alpha_ns, est.alpha_lo AS alpha_lo_ns, est.alpha_hi AS alpha_hi_ns
FROM pts LEFT JOIN est USING (collective, group_size);

-- @macro latency_model
-- Per (collective, group size), and for matched point-to-point ('p2p'): the kernel-duration distribution of every
-- instance (waiting included), and over instances matched on their complete group (transfer_source 'matched') the
-- transfer-time and wait distributions (these need no sizes; the latency floor, the 5th percentile of transfer time,
-- estimates α), the α-β fit transfer_ns ≈ α + msg_bytes / β with bootstrap 95 % intervals and its fit_quality
-- (queries/skew/latency.sql header), n½ = α·β, and, for 'ok' fits only, the latency-bound time (instances below n½),
-- its share of the sized transfer time and what coalescing would save: measured time of the latency-bound instances
-- minus the model time of their bytes sent in ceil(bytes / n½) operations of size n½. Rows without matched transfers
-- (a single-rank job, partial groups) carry durations only: no transfer, wait, fit, share or saving.
-- @column collective [key]: Collective ('p2p' for matched send/recv pairs).
-- @column group_size [key]: Group size (comm_transfer).
-- @column transfer_source: 'matched' when some instance has a matched transfer time; else why none has (the most
--   common _skew_comm_instances.transfer_source: 'single_rank', 'partial_group', 'unmatched', 'inconsistent').
-- @column instances: Instances (any source).
-- @column matched_instances: Of those, with a matched transfer time (the transfer and wait columns use these only).
-- @column sized_instances: Matched instances with a known size.
-- @column sizes: Distinct size points of sized matched instances (1/8-octave buckets), NULL without any.
-- @column sizes_used: Of those, points of >= 2 instances: the points the fit uses.
-- @column duration_incl_wait_p10_ns: 10th percentile over all instances of the longest kernel duration across its
--   ranks (ns, nearest rank): waiting for peers included, never a transfer time.
-- @column duration_incl_wait_p50_ns: Median of the same (ns, nearest rank).
-- @column duration_incl_wait_p90_ns: 90th percentile of the same (ns, nearest rank).
-- @column latency_floor_ns: 5th percentile matched transfer time (ns, nearest rank): α estimate without sizes.
-- @column transfer_p50_ns: Median matched transfer time (ns, nearest rank).
-- @column transfer_p90_ns: 90th percentile matched transfer time (ns, nearest rank).
-- @column wait_p50_ns: Median longest wait per matched instance (ns, nearest rank); NULL without matched instances
--   (a single-rank job has no peer to wait for that it can see).
-- @column wait_p90_ns: 90th percentile longest wait per matched instance (ns, nearest rank); NULL likewise.
-- @column total_transfer_ns: Sum of matched transfer times (ns).
-- @column sized_transfer_ns: Sum of matched transfer times of sized instances (ns).
-- @column fit_min_bytes: Smallest size point the fit uses (bytes): the fitted range starts here.
-- @column fit_max_bytes: Largest size point the fit uses (bytes).
-- @column alpha_us [key]: Fitted latency α (µs); given for fit_quality 'ok', 'implausible', 'unbounded_interval' and
--   'degenerate_interval' (shown), NULL otherwise. Only 'ok' fits are used anywhere.
-- @column alpha_lo_us: Lower 95 % bootstrap bound of α (µs).
-- @column alpha_hi_us: Upper 95 % bootstrap bound of α (µs).
-- @column beta_gbps [key]: Fitted bandwidth β (GB/s = 1e9 B/s, algorithm bandwidth of msg_bytes); NULL like alpha_us.
-- @column beta_lo_gbps: Lower 95 % bootstrap bound of β (GB/s).
-- @column beta_hi_gbps: Upper 95 % bootstrap bound of β (GB/s); NULL when the slope's interval reaches 0 (unbounded).
-- @column beta_busbw_gbps: β × busbw_factor(collective, group size) (1 for p2p and collectives without a factor):
--   β as nccl-tests bus bandwidth, what is compared with peak_busbw_gbps (GB/s).
-- @column peak_busbw_gbps: Highest bus bandwidth β may reach here (_skew_latency_busbw_bound_gbps, GB/s).
-- @column peak_source: 'job_peak' (_devices_peak_busbw_gbps: the devices' links or --link-gbps) or 'nvlink5_bound'
--   (unknown: the fastest link that exists).
-- @column n_half_bytes [key]: n½ = α·β (bytes), given with alpha_us: half of the transfer time is latency at this size.
-- @column fit_quality [key]: 'ok' (used); 'durations_only' (no matched transfer: no fit on waiting-laden durations);
--   'no_sizes'; 'one_size'; 'few_sizes' (2 size points); 'few_instances' (fewer than 3 points of >= 2 instances);
--   'narrow_sizes' (used points span < 8×); 'no_fit' (slope not positive: no bandwidth term visible);
--   'implausible' (α < 0 or > 1 ms, or beta_busbw_gbps > peak_busbw_gbps: shown, not used); 'unbounded_interval'
--   (α's interval reaches 0 or β's infinity); 'degenerate_interval' (an interval of zero width: too little data).
-- @column small_threshold_bytes: Sizes below this are latency-bound: n_half_bytes of an 'ok' fit, else NULL.
-- @column threshold_rule: 'n_half' with an 'ok' fit, else NULL.
-- @column below_threshold_ops: Sized matched instances below n½ ('ok' fits only, else NULL).
-- @column latency_bound_ns: Their transfer time (ns; 'ok' fits only).
-- @column latency_bound_pct: 100 × latency_bound_ns / sized_transfer_ns ('ok' fits only).
-- @column coalesced_model_ns: Model time of the latency-bound bytes sent as operations of size n½ (ns; 'ok' fits only).
-- @column coalescing_saving_ns: max(latency_bound_ns − coalesced_model_ns, 0) (ns; 'ok' fits only).
-- @column not_evaluated_reason: Why latency_bound_pct and the saving are NULL: 'fit_' || fit_quality; NULL when given.
-- @column covered_comm_pct: 100 × kernel time (all ranks) of the sized matched instances / all communication kernel
--   time of the job (kernels of class 'communication'): the share of communication time a figure of this row covers.
-- @column small_64kib_ops: Sized instances below 64 KiB, a labelled rule of thumb (matched instances when
--   transfer_source = 'matched', else all sized instances); never a latency-bound count; NULL without sizes.
-- @column small_64kib_time_pct: Their share of the same instances' time (%): transfer time when transfer_source =
--   'matched', else kernel duration with waiting included. A rule of thumb, never used as a latency-bound share.
-- @column note: What is missing and what re-export would add, or NULL.
CREATE OR REPLACE MACRO latency_model() AS TABLE
WITH i AS (
  SELECT collective, group_size, instance_key, msg_bytes, transfer_ns, transfer_source, max_duration_ns,
         last_start_ns - first_start_ns AS wait_ns,
         coalesce(transfer_source = 'matched' AND transfer_ns IS NOT NULL, false) AS clean,
         coalesce(msg_bytes > 0, false) AS sized,
         coalesce(msg_bytes > 0 AND msg_bytes < _skew_small_fallback_bytes(), false) AS small
  FROM _skew_comm_instances
), kt AS (SELECT instance_key, sum(end_ns - start_ns) AS kernel_ns FROM _skew_ops GROUP BY instance_key
), job AS (SELECT sum(end_ns - start_ns) AS comm_ns FROM kernels WHERE kernel_class = 'communication'
), d AS (
  SELECT i.collective, i.group_size, count(*) AS instances, count(*) FILTER (WHERE clean) AS matched_instances,
         count(*) FILTER (WHERE clean AND sized) AS sized_instances,
         CASE WHEN bool_or(clean) THEN 'matched' ELSE _prelude_most_common(histogram(transfer_source)) END
           AS transfer_source,
         quantile_disc(max_duration_ns, 0.1) AS dur_p10, quantile_disc(max_duration_ns, 0.5) AS dur_p50,
         quantile_disc(max_duration_ns, 0.9) AS dur_p90,
         quantile_disc(transfer_ns, 0.05) FILTER (WHERE clean) AS latency_floor_ns,
         quantile_disc(transfer_ns, 0.5) FILTER (WHERE clean) AS transfer_p50_ns,
         quantile_disc(transfer_ns, 0.9) FILTER (WHERE clean) AS transfer_p90_ns,
         quantile_disc(wait_ns, 0.5) FILTER (WHERE clean) AS wait_p50_ns,
         quantile_disc(wait_ns, 0.9) FILTER (WHERE clean) AS wait_p90_ns,
         sum(transfer_ns) FILTER (WHERE clean) AS total_transfer_ns,
         sum(transfer_ns) FILTER (WHERE clean AND sized) AS sized_transfer_ns,
         sum(kt.kernel_ns) FILTER (WHERE clean AND sized) AS sized_kernel_ns,
         count(*) FILTER (WHERE clean AND small) AS small_t_ops,
         sum(transfer_ns) FILTER (WHERE clean AND small) AS small_t_ns,
         count(*) FILTER (WHERE small) AS small_d_ops, sum(max_duration_ns) FILTER (WHERE small) AS small_d_ns,
         sum(max_duration_ns) FILTER (WHERE sized) AS sized_d_ns, count(*) FILTER (WHERE sized) AS sized_any
  FROM i LEFT JOIN kt USING (instance_key)
  GROUP BY i.collective, i.group_size
), f AS (
  SELECT d.*, fit.sizes, fit.sizes_used, fit.min_bytes, fit.max_bytes, fit.slope_ns_per_byte AS slope,
         fit.slope_lo_ns_per_byte AS slope_lo, fit.slope_hi_ns_per_byte AS slope_hi, fit.alpha_ns AS alpha,
         fit.alpha_lo_ns AS alpha_lo, fit.alpha_hi_ns AS alpha_hi,
         coalesce(busbw_factor(CASE WHEN d.collective = 'p2p' THEN 'send' ELSE d.collective END, d.group_size), 1.0)
           AS factor,
         _devices_peak_busbw_gbps() AS peak
  FROM d LEFT JOIN _skew_latency_fit fit USING (collective, group_size)
), q AS (
  SELECT *, _skew_latency_busbw_bound_gbps(collective, peak) AS bound,
         CASE WHEN transfer_source <> 'matched' THEN 'durations_only'
              WHEN sized_instances = 0 THEN 'no_sizes'
              WHEN sizes = 1 THEN 'one_size'
              WHEN sizes = 2 THEN 'few_sizes'
              WHEN sizes_used < 3 THEN 'few_instances'
              WHEN max_bytes < 8 * min_bytes THEN 'narrow_sizes'
              WHEN NOT coalesce(slope > 0, false) THEN 'no_fit'
              WHEN alpha < 0 OR alpha > 1e6 OR factor / slope > _skew_latency_busbw_bound_gbps(collective, peak)
                THEN 'implausible'
              WHEN NOT coalesce(slope_lo > 0 AND alpha_lo > 0, false) THEN 'unbounded_interval'
              WHEN NOT coalesce(slope_lo < slope_hi AND alpha_lo < alpha_hi, false) THEN 'degenerate_interval'
              ELSE 'ok' END AS fit_quality
  FROM f
), t AS (
  SELECT *, fit_quality IN ('ok', 'implausible', 'unbounded_interval', 'degenerate_interval') AS shown,
         fit_quality = 'ok' AS ok, CASE WHEN fit_quality = 'ok' THEN alpha / slope END AS n_half
  FROM q
), lb AS (
  SELECT i.collective, i.group_size, count(*) AS ops, sum(i.transfer_ns) AS ns, sum(i.msg_bytes) AS bytes
  FROM i JOIN t USING (collective, group_size)
  WHERE t.ok AND i.clean AND i.sized AND i.msg_bytes < t.n_half
  GROUP BY i.collective, i.group_size
), m AS (
  SELECT t.*, coalesce(lb.ops, 0) AS lb_ops, coalesce(lb.ns, 0) AS lb_ns,
         CASE WHEN coalesce(lb.ops, 0) = 0 THEN 0
              ELSE greatest(ceil(lb.bytes / n_half), 1) * alpha + lb.bytes * slope END AS coalesced
  FROM t LEFT JOIN lb USING (collective, group_size)
)
SELECT collective, group_size, transfer_source, instances, matched_instances, sized_instances, sizes,
       sizes_used, dur_p10 AS duration_incl_wait_p10_ns, dur_p50 AS duration_incl_wait_p50_ns,
       dur_p90 AS duration_incl_wait_p90_ns, latency_floor_ns, transfer_p50_ns, transfer_p90_ns, wait_p50_ns,
       wait_p90_ns, CAST(total_transfer_ns AS BIGINT) AS total_transfer_ns,
       CAST(sized_transfer_ns AS BIGINT) AS sized_transfer_ns,
       CAST(round(min_bytes) AS BIGINT) AS fit_min_bytes, CAST(round(max_bytes) AS BIGINT) AS fit_max_bytes,
       (CASE WHEN shown THEN alpha / 1000.0 END)::DOUBLE AS alpha_us,
       (CASE WHEN shown THEN alpha_lo / 1000.0 END)::DOUBLE AS alpha_lo_us,
       (CASE WHEN shown THEN alpha_hi / 1000.0 END)::DOUBLE AS alpha_hi_us,
       (CASE WHEN shown THEN 1.0 / slope END)::DOUBLE AS beta_gbps,
       (CASE WHEN shown AND slope_hi > 0 THEN 1.0 / slope_hi END)::DOUBLE AS beta_lo_gbps,
       (CASE WHEN shown AND slope_lo > 0 THEN 1.0 / slope_lo END)::DOUBLE AS beta_hi_gbps,
       (CASE WHEN shown THEN factor / slope END)::DOUBLE AS beta_busbw_gbps,
       bound::DOUBLE AS peak_busbw_gbps, CASE WHEN peak IS NULL THEN 'nvlink5_bound' ELSE 'job_peak' END AS peak_source,
       CAST(round(CASE WHEN shown THEN alpha / slope END) AS BIGINT) AS n_half_bytes, fit_quality,
       CAST(round(n_half) AS BIGINT) AS small_threshold_bytes, CASE WHEN ok THEN 'n_half' END AS threshold_rule,
       CASE WHEN ok THEN lb_ops END AS below_threshold_ops,
       CASE WHEN ok THEN CAST(lb_ns AS BIGINT) END AS latency_bound_ns,
       (CASE WHEN ok THEN 100.0 * lb_ns / nullif(sized_transfer_ns, 0) END)::DOUBLE AS latency_bound_pct,
       CASE WHEN ok THEN CAST(round(coalesced) AS BIGINT) END AS coalesced_model_ns,
       CASE WHEN ok THEN CAST(round(greatest(lb_ns - coalesced, 0)) AS BIGINT) END AS coalescing_saving_ns,
       CASE WHEN NOT ok THEN 'fit_' || fit_quality END AS not_evaluated_reason,
       (100.0 * coalesce(sized_kernel_ns, 0) / nullif((SELECT comm_ns FROM job), 0))::DOUBLE AS covered_comm_pct,
       CASE WHEN transfer_source = 'matched' AND sized_instances > 0 THEN small_t_ops
            WHEN transfer_source <> 'matched' AND sized_any > 0 THEN small_d_ops END AS small_64kib_ops,
       (CASE WHEN transfer_source = 'matched' THEN 100.0 * coalesce(small_t_ns, 0) / nullif(sized_transfer_ns, 0)
             ELSE 100.0 * coalesce(small_d_ns, 0) / nullif(sized_d_ns, 0) END)::DOUBLE AS small_64kib_time_pct,
       CASE WHEN transfer_source = 'single_rank' THEN 'one rank in the job: kernel durations include waiting for '
              || 'peers the trace does not hold, so there is no transfer time, wait or α-β fit (durations only)'
            WHEN transfer_source <> 'matched' THEN 'no instance was matched on its complete group (' || transfer_source
              || '): durations include waiting; ingest every rank of the group for transfer times and a fit'
            WHEN sized_instances = 0 THEN 'no message sizes: re-export with sizes (Kineto: PyTorch >= 2.2 puts '
              || 'Collective name and msg nelems on NCCL kernels; nsys: NCCL >= 2.16 NVTX payloads, --trace=nvtx) '
              || 'to get the α-β fit, n½, the latency-bound share and the coalescing saving'
            WHEN matched_instances < instances OR sized_instances < matched_instances THEN
              (instances - sized_instances) || ' of ' || instances || ' instances have no matched transfer time '
              || 'or no size and are left out of the fit and the shares' END AS note
FROM m
ORDER BY collective, group_size;

-- @macro latency_by_size
-- The fit's points for plotting: per (collective, group size) and size bucket, the matched transfer-time
-- distribution and the model time α + bytes/β where latency_model shows a fit, with n½.
-- @column collective [key]: Collective ('p2p' for matched send/recv).
-- @column group_size [key]: Group size.
-- @column msg_bytes [key]: Median size in the bucket (bytes).
-- @column instances: Instances in the bucket (the fit uses buckets of >= 2).
-- @column transfer_p10_ns: 10th percentile transfer time (ns).
-- @column transfer_p50_ns [key]: Median transfer time (ns).
-- @column transfer_p90_ns: 90th percentile transfer time (ns).
-- @column model_ns [key]: α + msg_bytes / β (ns), NULL where latency_model's alpha_us is NULL.
-- @column n_half_bytes: n½ of the (collective, group size) model (bytes), NULL likewise.
-- @column fit_quality: latency_model's fit_quality of the model (only 'ok' is used).
CREATE OR REPLACE MACRO latency_by_size() AS TABLE
SELECT p.collective, p.group_size, CAST(round(p.msg_bytes) AS BIGINT) AS msg_bytes, p.instances,
       p.transfer_p10_ns::DOUBLE AS transfer_p10_ns, p.transfer_p50_ns::DOUBLE AS transfer_p50_ns,
       p.transfer_p90_ns::DOUBLE AS transfer_p90_ns,
       (m.alpha_us * 1000.0 + p.msg_bytes / m.beta_gbps)::DOUBLE AS model_ns, m.n_half_bytes, m.fit_quality
FROM _skew_latency_points p LEFT JOIN latency_model() m USING (collective, group_size)
ORDER BY p.collective, p.group_size, msg_bytes;

-- @macro latency_bound_total
-- Job-wide latency-bound share and coalescing saving over latency_model's 'ok' fits only (one row), with the share
-- of communication time those fits cover. latency_bound_pct is NULL, with not_evaluated_reason, when no fit is 'ok'
-- or the 'ok' fits cover less than _skew_latency_min_coverage_pct() of communication kernel time.
-- @column instances [key]: Instances (any source).
-- @column matched_instances: Instances with a matched transfer time.
-- @column sized_instances: Of those, with a known size.
-- @column total_transfer_ns: Sum of matched transfer times (ns).
-- @column sized_transfer_ns: Sum of matched transfer times of sized instances (ns).
-- @column fitted_instances: Sized matched instances of models with an 'ok' fit.
-- @column fitted_transfer_ns: Their transfer time (ns): latency_bound_pct's base.
-- @column below_threshold_ops: Of them, instances below n½ of their fit; NULL when no fit is 'ok'.
-- @column latency_bound_ns: Transfer time of instances below n½ of their 'ok' fit (ns); NULL when no fit is 'ok'.
-- @column latency_bound_pct [key]: 100 × latency_bound_ns / fitted_transfer_ns; NULL with not_evaluated_reason.
-- @column coalescing_saving_ns [key]: Sum of coalescing_saving_ns over 'ok' fits (ns); NULL when no fit is 'ok'.
-- @column covered_comm_pct: 100 × kernel time of the 'ok' fits' sized matched instances / all communication kernel
--   time of the job (sum of latency_model.covered_comm_pct over 'ok' rows; 0 when none): what the figures cover.
-- @column not_evaluated_reason [key]: NULL when latency_bound_pct is given, else 'no_matched_transfers', 'no_sizes',
--   'no_ok_fit' or 'coverage_below_10pct' (_skew_latency_min_coverage_pct).
-- @column models: (collective, group size) models.
-- @column models_fitted: Models with an 'ok' fit.
CREATE OR REPLACE MACRO latency_bound_total() AS TABLE
WITH m AS (SELECT * FROM latency_model()),
a AS (
  SELECT CAST(coalesce(sum(instances), 0) AS BIGINT) AS instances,
         CAST(coalesce(sum(matched_instances), 0) AS BIGINT) AS matched_instances,
         CAST(coalesce(sum(sized_instances), 0) AS BIGINT) AS sized_instances,
         CAST(sum(total_transfer_ns) AS BIGINT) AS total_transfer_ns,
         CAST(sum(sized_transfer_ns) AS BIGINT) AS sized_transfer_ns,
         CAST(sum(sized_instances) FILTER (WHERE fit_quality = 'ok') AS BIGINT) AS fitted_instances,
         CAST(sum(sized_transfer_ns) FILTER (WHERE fit_quality = 'ok') AS BIGINT) AS fitted_transfer_ns,
         CAST(sum(below_threshold_ops) FILTER (WHERE fit_quality = 'ok') AS BIGINT) AS below_threshold_ops,
         CAST(sum(latency_bound_ns) FILTER (WHERE fit_quality = 'ok') AS BIGINT) AS latency_bound_ns,
         CAST(sum(coalescing_saving_ns) FILTER (WHERE fit_quality = 'ok') AS BIGINT) AS coalescing_saving_ns,
         (coalesce(sum(covered_comm_pct) FILTER (WHERE fit_quality = 'ok'), 0))::DOUBLE AS covered_comm_pct,
         count(*) AS models, count(*) FILTER (WHERE fit_quality = 'ok') AS models_fitted
  FROM m
  HAVING count(*) > 0
), r AS (
  SELECT *, CASE WHEN matched_instances = 0 THEN 'no_matched_transfers' WHEN sized_instances = 0 THEN 'no_sizes'
                 WHEN models_fitted = 0 THEN 'no_ok_fit'
                 WHEN covered_comm_pct < _skew_latency_min_coverage_pct() THEN 'coverage_below_10pct' END AS why
  FROM a
)
SELECT instances, matched_instances, sized_instances, total_transfer_ns, sized_transfer_ns, fitted_instances,
       fitted_transfer_ns, below_threshold_ops, latency_bound_ns,
       (CASE WHEN why IS NULL THEN 100.0 * latency_bound_ns / nullif(fitted_transfer_ns, 0) END)::DOUBLE
         AS latency_bound_pct,
       coalescing_saving_ns, covered_comm_pct, why AS not_evaluated_reason, models, models_fitted
FROM r
ORDER BY instances;
