-- @include skew/skew.sql
-- Latency-bound communication: transfer time apart from waiting (from the matching in skew.sql) and the
-- latency-bandwidth (Hockney α-β) model transfer_ns ≈ α + msg_bytes / β per (collective, group size) and for p2p.
-- Robust fit (Theil–Sen): instances are first reduced to one point per size bucket (1/8 octave: median size,
-- median transfer), the slope 1/β is the median of the slopes between every two points (never pairs of raw
-- operations), α the median over instances of transfer − slope × size. n½ = α·β, the size whose transfer time is
-- half latency. An operation smaller than n½ is latency-bound. Where no fit is possible the rule for "small" is the
-- fixed fallback _skew_small_fallback_bytes(), and the columns say so.

-- @macro _skew_small_fallback_bytes
-- Largest-but-one size counted as latency-bound when no α-β fit exists: 64 KiB (a common rule of thumb, labelled
-- 'fallback_64KiB' wherever used).
CREATE OR REPLACE MACRO _skew_small_fallback_bytes() AS 65536;

-- @macro comm_transfer
-- One row per matched communication instance, collectives and point-to-point: its transfer time apart from waiting
-- and the waits (definitions in queries/skew). Times are on the reference clock (host_clock_offsets).
-- @column instance_key: Matching key ('p2p:<group>:<src>><dst>#k' for the k-th send/recv of a pair).
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column kind: 'collective' or 'p2p'.
-- @column collective: Collective; 'p2p' for a matched send/recv pair.
-- @column group_size: Group size when known, else the ranks that ran it (2 for p2p).
-- @column pg_name: Group, when known.
-- @column seq: Sequence number, when known.
-- @column msg_bytes: Size S (bytes), when known.
-- @column src_rank: p2p: sending rank, else NULL.
-- @column dst_rank: p2p: receiving rank, else NULL.
-- @column ranks_seen: Ranks that ran this instance.
-- @column first_start_ns: Earliest start (ns).
-- @column last_start_ns: Latest start (ns).
-- @column transfer_ns: Collective: end of the last-arriving rank − latest start; p2p: recv end − latest start (ns, >= 0).
-- @column transfer_source: 'matched', 'kernel_duration' (single-rank job) or 'unmatched' (transfer_ns NULL).
-- @column max_wait_ns: Longest wait of a rank, last_start_ns − first_start_ns (ns).
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
-- @column src_rank: Sending rank.
-- @column dst_rank: Receiving rank.
-- @column instances: Matched send/recv pairs.
-- @column sized_instances: Of those, with a known size.
-- @column total_bytes: Sum of sizes (bytes), NULL when none known.
-- @column transfer_p10_ns: 10th percentile transfer time (ns, nearest rank).
-- @column transfer_p50_ns: Median transfer time (ns, nearest rank).
-- @column transfer_p90_ns: 90th percentile transfer time (ns, nearest rank).
-- @column wait_p50_ns: Median wait of the earlier side (ns, nearest rank).
-- @column wait_p90_ns: 90th percentile wait of the earlier side (ns, nearest rank).
-- @column total_transfer_ns: Sum of transfer times (ns).
-- @column total_wait_ns: Sum of waits (ns).
-- @column receiver_waited_pct: 100 × pairs where the recv started first (the receiver waited) / instances.
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

-- @view _skew_latency_points
-- One point per (collective, group size, size bucket of 1/8 octave) over instances with a transfer time and a size.
-- @column collective: Collective ('p2p' for matched send/recv).
-- @column group_size: Group size (comm_transfer).
-- @column size_bucket: round(8 × log2(msg_bytes)).
-- @column msg_bytes: Median size in the bucket (bytes).
-- @column instances: Instances in the bucket.
-- @column transfer_p10_ns: 10th percentile transfer time (ns).
-- @column transfer_p50_ns: Median transfer time (ns).
-- @column transfer_p90_ns: 90th percentile transfer time (ns).
CREATE OR REPLACE VIEW _skew_latency_points AS
SELECT collective, group_size, round(8 * log2(msg_bytes))::INTEGER AS size_bucket,
       quantile_cont(msg_bytes, 0.5) AS msg_bytes, count(*) AS instances,
       quantile_cont(transfer_ns, 0.1) AS transfer_p10_ns, quantile_cont(transfer_ns, 0.5) AS transfer_p50_ns,
       quantile_cont(transfer_ns, 0.9) AS transfer_p90_ns
FROM _skew_comm_instances
WHERE transfer_ns IS NOT NULL AND msg_bytes > 0
GROUP BY collective, group_size, size_bucket;

-- @view _skew_latency_fit
-- Theil–Sen fit per (collective, group size) over _skew_latency_points, with Sen's 95 % interval for the slope and the
-- order-statistic 95 % interval of the median for α (α's interval is for the fitted slope).
-- @column collective: Collective.
-- @column group_size: Group size.
-- @column sizes: Size points (distinct size buckets).
-- @column min_bytes: Smallest point size (bytes).
-- @column max_bytes: Largest point size (bytes).
-- @column slope_ns_per_byte: Median pairwise slope = 1/β (ns per byte).
-- @column slope_lo_ns_per_byte: Lower 95 % bound of the slope.
-- @column slope_hi_ns_per_byte: Upper 95 % bound of the slope.
-- @column alpha_ns: Median of transfer − slope × size over instances (ns).
-- @column alpha_lo_ns: Lower 95 % bound of alpha_ns.
-- @column alpha_hi_ns: Upper 95 % bound of alpha_ns.
CREATE OR REPLACE VIEW _skew_latency_fit AS
WITH p AS (SELECT * FROM _skew_latency_points),
pts AS (
  SELECT collective, group_size, count(*) AS sizes, min(msg_bytes) AS min_bytes, max(msg_bytes) AS max_bytes,
         1.96 * sqrt(count(*) * (count(*) - 1) * (2 * count(*) + 5) / 18.0) AS c
  FROM p GROUP BY collective, group_size
), pr AS (  -- pairs of distinct size points (a few hundred points at most: 8 buckets per octave)
  SELECT a.collective, a.group_size, (b.transfer_p50_ns - a.transfer_p50_ns) / (b.msg_bytes - a.msg_bytes) AS slope
  FROM p a JOIN p b ON a.collective = b.collective AND a.group_size = b.group_size AND a.size_bucket < b.size_bucket
), ranked AS (
  SELECT pr.*, pts.c, row_number() OVER (PARTITION BY pr.collective, pr.group_size ORDER BY slope) AS rn,
         count(*) OVER (PARTITION BY pr.collective, pr.group_size) AS n_pairs
  FROM pr JOIN pts USING (collective, group_size)
), sl AS (
  SELECT collective, group_size, quantile_cont(slope, 0.5) AS slope,
         coalesce(min(slope) FILTER (WHERE rn >= (n_pairs - c) / 2), min(slope)) AS slope_lo,
         coalesce(max(slope) FILTER (WHERE rn <= (n_pairs + c) / 2 + 1), max(slope)) AS slope_hi
  FROM ranked GROUP BY collective, group_size
), res AS (
  SELECT i.collective, i.group_size, i.transfer_ns - sl.slope * i.msg_bytes AS r
  FROM _skew_comm_instances i JOIN sl USING (collective, group_size)
  WHERE i.transfer_ns IS NOT NULL AND i.msg_bytes > 0
), rres AS (
  SELECT *, row_number() OVER (PARTITION BY collective, group_size ORDER BY r) AS rn,
         count(*) OVER (PARTITION BY collective, group_size) AS n
  FROM res
), al AS (
  SELECT collective, group_size, quantile_cont(r, 0.5) AS alpha,
         coalesce(min(r) FILTER (WHERE rn >= n / 2.0 - 0.98 * sqrt(n)), min(r)) AS alpha_lo,
         coalesce(max(r) FILTER (WHERE rn <= n / 2.0 + 1 + 0.98 * sqrt(n)), max(r)) AS alpha_hi
  FROM rres GROUP BY collective, group_size
)
SELECT pts.collective, pts.group_size, pts.sizes, pts.min_bytes, pts.max_bytes,
       sl.slope AS slope_ns_per_byte, sl.slope_lo AS slope_lo_ns_per_byte, sl.slope_hi AS slope_hi_ns_per_byte,
       al.alpha AS alpha_ns, al.alpha_lo AS alpha_lo_ns, al.alpha_hi AS alpha_hi_ns
FROM pts LEFT JOIN sl USING (collective, group_size) LEFT JOIN al USING (collective, group_size);

-- @macro latency_model
-- Per (collective, group size), and for matched point-to-point ('p2p'), over instances with a transfer time:
-- the transfer-time and wait distributions (these need no sizes; the latency floor, the 5th percentile of transfer
-- time, estimates α), the robust α-β fit transfer_ns ≈ α + msg_bytes / β with 95 % intervals (queries/skew/latency.sql
-- header), n½ = α·β, the latency-bound time (instances below n½, or below the labelled 64 KiB fallback when no fit
-- exists) and its share of the sized transfer time, and what coalescing would save: measured time of the
-- latency-bound instances minus the model time of their bytes sent in ceil(bytes / n½) operations of size n½.
-- In a single-rank job transfer times are kernel durations (transfer_source 'kernel_duration', waits included).
-- @column collective: Collective ('p2p' for matched send/recv pairs).
-- @column group_size: Group size when known, else the ranks that ran it.
-- @column transfer_source: 'matched' (transfer apart from waiting) or 'kernel_duration' (single-rank job).
-- @column instances: Instances with a transfer time.
-- @column sized_instances: Of those, with a known size.
-- @column sizes: Distinct size points in the fit (1/8-octave buckets), NULL without sizes.
-- @column latency_floor_ns: 5th percentile transfer time (ns, nearest rank): α estimate without sizes.
-- @column transfer_p50_ns: Median transfer time (ns, nearest rank).
-- @column transfer_p90_ns: 90th percentile transfer time (ns, nearest rank).
-- @column wait_p50_ns: Median longest wait per instance (ns, nearest rank).
-- @column wait_p90_ns: 90th percentile longest wait per instance (ns, nearest rank).
-- @column total_transfer_ns: Sum of transfer times (ns).
-- @column sized_transfer_ns: Sum of transfer times of sized instances (ns).
-- @column alpha_us: Fitted latency α (µs); NULL without a usable fit.
-- @column alpha_lo_us: Lower 95 % bound of α (µs).
-- @column alpha_hi_us: Upper 95 % bound of α (µs).
-- @column beta_gbps: Fitted bandwidth β (GB/s = 1e9 B/s); NULL without a usable fit.
-- @column beta_lo_gbps: Lower 95 % bound of β (GB/s).
-- @column beta_hi_gbps: Upper 95 % bound of β (GB/s); NULL when the slope's interval reaches 0.
-- @column n_half_bytes: n½ = α·β (bytes): half of the transfer time is latency at this size.
-- @column fit_quality: 'ok'; 'few_sizes' (2 size points); 'narrow_sizes' (largest < 4 × smallest); 'one_size',
--   'no_sizes' (no fit possible); 'no_fit' (slope or α not positive: no bandwidth term visible).
-- @column small_threshold_bytes: Sizes below this are latency-bound: n_half_bytes, else 65536 (fallback).
-- @column threshold_rule: 'n_half', 'fallback_64KiB', or NULL without sizes.
-- @column below_threshold_ops: Sized instances below small_threshold_bytes.
-- @column latency_bound_ns: Their transfer time (ns).
-- @column latency_bound_pct: 100 × latency_bound_ns / sized_transfer_ns.
-- @column coalesced_model_ns: Model time of the latency-bound bytes sent as operations of size n½ (ns).
-- @column coalescing_saving_ns: max(latency_bound_ns − coalesced_model_ns, 0) (ns); NULL without a usable fit.
-- @column note: What is missing and what re-export would add, or NULL.
CREATE OR REPLACE MACRO latency_model() AS TABLE
WITH i AS (SELECT * FROM _skew_comm_instances WHERE transfer_ns IS NOT NULL),
d AS (
  SELECT collective, group_size, min(transfer_source) AS transfer_source, count(*) AS instances,
         count(*) FILTER (WHERE msg_bytes > 0) AS sized_instances,
         quantile_disc(transfer_ns, 0.05) AS latency_floor_ns, quantile_disc(transfer_ns, 0.5) AS transfer_p50_ns,
         quantile_disc(transfer_ns, 0.9) AS transfer_p90_ns,
         quantile_disc(last_start_ns - first_start_ns, 0.5) AS wait_p50_ns,
         quantile_disc(last_start_ns - first_start_ns, 0.9) AS wait_p90_ns,
         sum(transfer_ns) AS total_transfer_ns, sum(transfer_ns) FILTER (WHERE msg_bytes > 0) AS sized_transfer_ns
  FROM i GROUP BY collective, group_size
), f AS (
  SELECT d.*, fit.sizes, fit.min_bytes, fit.max_bytes, fit.slope_lo_ns_per_byte, fit.slope_hi_ns_per_byte,
         fit.alpha_lo_ns, fit.alpha_hi_ns,
         coalesce(fit.sizes >= 2 AND fit.slope_ns_per_byte > 0 AND fit.alpha_ns > 0, false) AS usable,
         fit.slope_ns_per_byte AS slope, fit.alpha_ns AS alpha
  FROM d LEFT JOIN _skew_latency_fit fit USING (collective, group_size)
), t AS (
  SELECT *, CASE WHEN usable THEN alpha / slope END AS n_half,
         CASE WHEN usable THEN alpha / slope WHEN sized_instances > 0 THEN _skew_small_fallback_bytes() END AS thr
  FROM f
), lb AS (
  SELECT i.collective, i.group_size, count(*) AS ops, sum(i.transfer_ns) AS ns, sum(i.msg_bytes) AS bytes
  FROM i JOIN t USING (collective, group_size)
  WHERE i.msg_bytes > 0 AND i.msg_bytes < t.thr
  GROUP BY i.collective, i.group_size
), m AS (
  SELECT t.*, coalesce(lb.ops, 0) AS lb_ops, coalesce(lb.ns, 0) AS lb_ns, coalesce(lb.bytes, 0) AS lb_bytes,
         CASE WHEN usable THEN CASE WHEN coalesce(lb.ops, 0) = 0 THEN 0
              ELSE greatest(ceil(lb.bytes / n_half), 1) * alpha + lb.bytes * slope END END AS coalesced
  FROM t LEFT JOIN lb USING (collective, group_size)
)
SELECT collective, group_size, transfer_source, instances, sized_instances, sizes, latency_floor_ns, transfer_p50_ns,
       transfer_p90_ns, wait_p50_ns, wait_p90_ns, CAST(total_transfer_ns AS BIGINT) AS total_transfer_ns,
       CAST(sized_transfer_ns AS BIGINT) AS sized_transfer_ns,
       (CASE WHEN usable THEN alpha / 1000.0 END)::DOUBLE AS alpha_us,
       (CASE WHEN usable THEN alpha_lo_ns / 1000.0 END)::DOUBLE AS alpha_lo_us,
       (CASE WHEN usable THEN alpha_hi_ns / 1000.0 END)::DOUBLE AS alpha_hi_us,
       (CASE WHEN usable THEN 1.0 / slope END)::DOUBLE AS beta_gbps,
       (CASE WHEN usable AND slope_hi_ns_per_byte > 0 THEN 1.0 / slope_hi_ns_per_byte END)::DOUBLE AS beta_lo_gbps,
       (CASE WHEN usable AND slope_lo_ns_per_byte > 0 THEN 1.0 / slope_lo_ns_per_byte END)::DOUBLE AS beta_hi_gbps,
       CAST(round(n_half) AS BIGINT) AS n_half_bytes,
       CASE WHEN sizes IS NULL THEN 'no_sizes' WHEN sizes = 1 THEN 'one_size' WHEN NOT usable THEN 'no_fit'
            WHEN sizes = 2 THEN 'few_sizes' WHEN max_bytes < 4 * min_bytes THEN 'narrow_sizes' ELSE 'ok' END AS fit_quality,
       CAST(round(thr) AS BIGINT) AS small_threshold_bytes,
       CASE WHEN usable THEN 'n_half' WHEN sized_instances > 0 THEN 'fallback_64KiB' END AS threshold_rule,
       CASE WHEN sized_instances > 0 THEN lb_ops END AS below_threshold_ops,
       CASE WHEN sized_instances > 0 THEN CAST(lb_ns AS BIGINT) END AS latency_bound_ns,
       (CASE WHEN sized_instances > 0 THEN 100.0 * lb_ns / nullif(sized_transfer_ns, 0) END)::DOUBLE AS latency_bound_pct,
       CAST(round(coalesced) AS BIGINT) AS coalesced_model_ns,
       CAST(round(CASE WHEN usable THEN greatest(lb_ns - coalesced, 0) END) AS BIGINT) AS coalescing_saving_ns,
       CASE WHEN sized_instances = 0 THEN 'no message sizes: re-export with sizes (Kineto: PyTorch >= 2.2 puts '
              || 'Collective name and msg nelems on NCCL kernels; nsys: NCCL >= 2.16 NVTX payloads, --trace=nvtx) '
              || 'to get the α-β fit, n½, the latency-bound share and the coalescing saving'
            WHEN sized_instances < instances THEN (instances - sized_instances) || ' of ' || instances
              || ' instances have no size and are left out of the fit and the shares' END AS note
FROM m
ORDER BY collective, group_size;

-- @macro latency_by_size
-- The fit's points and line for plotting: per (collective, group size) and size bucket, the transfer-time
-- distribution and the model time α + bytes/β (NULL without a usable fit), with n½.
-- @column collective: Collective ('p2p' for matched send/recv).
-- @column group_size: Group size.
-- @column msg_bytes: Median size in the bucket (bytes).
-- @column instances: Instances in the bucket.
-- @column transfer_p10_ns: 10th percentile transfer time (ns).
-- @column transfer_p50_ns: Median transfer time (ns).
-- @column transfer_p90_ns: 90th percentile transfer time (ns).
-- @column model_ns: α + msg_bytes / β (ns), NULL without a usable fit.
-- @column n_half_bytes: n½ of the (collective, group size) model (bytes), NULL without a usable fit.
CREATE OR REPLACE MACRO latency_by_size() AS TABLE
SELECT p.collective, p.group_size, CAST(round(p.msg_bytes) AS BIGINT) AS msg_bytes, p.instances,
       p.transfer_p10_ns::DOUBLE AS transfer_p10_ns, p.transfer_p50_ns::DOUBLE AS transfer_p50_ns,
       p.transfer_p90_ns::DOUBLE AS transfer_p90_ns,
       (m.alpha_us * 1000.0 + p.msg_bytes / m.beta_gbps)::DOUBLE AS model_ns, m.n_half_bytes
FROM _skew_latency_points p LEFT JOIN latency_model() m USING (collective, group_size)
ORDER BY p.collective, p.group_size, msg_bytes;

-- @macro latency_bound_total
-- Job-wide latency-bound share and coalescing saving, summed over latency_model's rows (one row).
-- @column instances: Instances with a transfer time.
-- @column sized_instances: Of those, with a known size.
-- @column total_transfer_ns: Sum of transfer times (ns).
-- @column sized_transfer_ns: Sum of transfer times of sized instances (ns).
-- @column latency_bound_ns: Transfer time of latency-bound instances (ns), NULL without sizes.
-- @column latency_bound_pct: 100 × latency_bound_ns / sized_transfer_ns, NULL without sizes.
-- @column coalescing_saving_ns: Sum of coalescing_saving_ns over models with a usable fit (ns), NULL when none.
-- @column models: (collective, group size) models.
-- @column models_fitted: Models with a usable α-β fit (threshold n½).
-- @column models_fallback: Models using the 64 KiB fallback threshold.
CREATE OR REPLACE MACRO latency_bound_total() AS TABLE
SELECT CAST(coalesce(sum(instances), 0) AS BIGINT) AS instances,
       CAST(coalesce(sum(sized_instances), 0) AS BIGINT) AS sized_instances,
       CAST(sum(total_transfer_ns) AS BIGINT) AS total_transfer_ns,
       CAST(sum(sized_transfer_ns) AS BIGINT) AS sized_transfer_ns,
       CAST(sum(latency_bound_ns) AS BIGINT) AS latency_bound_ns,
       (100.0 * sum(latency_bound_ns) / nullif(sum(sized_transfer_ns), 0))::DOUBLE AS latency_bound_pct,
       CAST(sum(coalescing_saving_ns) AS BIGINT) AS coalescing_saving_ns,
       count(*) AS models, count(*) FILTER (WHERE threshold_rule = 'n_half') AS models_fitted,
       count(*) FILTER (WHERE threshold_rule = 'fallback_64KiB') AS models_fallback
FROM latency_model()
HAVING count(*) > 0
ORDER BY instances;
