-- Point-to-point (send, recv, send_recv) latency versus message size, and the α-β (Hockney) model
-- duration = α + bytes / β fitted by least squares on per-kernel durations (which include waiting for the peer).

-- @macro p2p_latency_by_size
-- Per p2p collective (send, recv, send_recv) and power-of-two size bucket, all ranks: count and duration
-- distribution, and the effective bandwidth Σ bytes / Σ duration (GB/s = 1e9 B/s). Unknown sizes are left out.
-- @column collective: 'send', 'recv' or 'send_recv'.
-- @column bucket_lo_bytes: Bucket lower bound, inclusive (bytes).
-- @column bucket_hi_bytes: Bucket upper bound, exclusive (bytes).
-- @column ops: Operations in the bucket.
-- @column total_bytes: Sum of msg_bytes (bytes).
-- @column min_ns: Minimum duration (ns).
-- @column p50_ns: Median duration (ns, nearest rank).
-- @column p90_ns: 90th percentile duration (ns, nearest rank).
-- @column p99_ns: 99th percentile duration (ns, nearest rank).
-- @column max_ns: Maximum duration (ns).
-- @column effective_gbps: total_bytes / Σ duration (GB/s).
CREATE OR REPLACE MACRO p2p_latency_by_size() AS TABLE
SELECT collective, bucket_lo_bytes, CASE WHEN bucket_lo_bytes = 0 THEN 1 ELSE bucket_lo_bytes * 2 END AS bucket_hi_bytes,
       count(*) AS ops, CAST(sum(msg_bytes) AS BIGINT) AS total_bytes,
       min(duration_ns) AS min_ns, quantile_disc(duration_ns, 0.5) AS p50_ns,
       quantile_disc(duration_ns, 0.9) AS p90_ns, quantile_disc(duration_ns, 0.99) AS p99_ns, max(duration_ns) AS max_ns,
       (sum(msg_bytes) / nullif(sum(duration_ns), 0))::DOUBLE AS effective_gbps
FROM _comm_sized()
WHERE collective IN ('send', 'recv', 'send_recv') AND msg_bytes IS NOT NULL
GROUP BY collective, bucket_lo_bytes
ORDER BY collective, bucket_lo_bytes;

-- @macro p2p_latency_model
-- Least-squares α-β fit of p2p kernel durations: duration_ns = α + msg_bytes / β (regr_intercept / regr_slope),
-- over all p2p operations of known size (scope 'all') and per (rank, peer_rank) pair where the peer is known
-- (scope 'pair'). Also the share of p2p time spent in small messages (msg_bytes <= small_bytes, i.e. at or
-- below the threshold) and how much of that time the fit attributes to α (count × α, at most the time itself).
-- A fit needs at least two distinct sizes; otherwise alpha_us, beta_gbps and r2 are NULL.
-- @param small_bytes: Largest message size counted as small (bytes, default 65536 = 64 KiB).
-- @column scope: 'all' (every rank) or 'pair' (one rank → peer_rank direction).
-- @column rank: Rank ('pair' scope), else NULL.
-- @column peer_rank: Peer rank ('pair' scope), else NULL.
-- @column n: Operations in the fit.
-- @column sizes: Distinct message sizes in the fit.
-- @column alpha_us: Fitted latency α (µs).
-- @column beta_gbps: Fitted bandwidth β (GB/s = 1e9 B/s).
-- @column r2: Coefficient of determination of the fit.
-- @column total_ns: Total p2p kernel time (ns).
-- @column small_ops: Operations with msg_bytes <= small_bytes.
-- @column small_ns: Kernel time of those operations (ns).
-- @column small_time_pct: 100 × small_ns / total_ns.
-- @column small_alpha_ns: Part of small_ns the fit attributes to α: min(small_ops × α, small_ns) (ns).
-- @column small_alpha_pct: 100 × small_alpha_ns / small_ns.
CREATE OR REPLACE MACRO p2p_latency_model(small_bytes := 65536) AS TABLE
WITH p AS (
  SELECT rank, peer_rank, msg_bytes, duration_ns FROM _comm_sized()
  WHERE collective IN ('send', 'recv', 'send_recv') AND msg_bytes IS NOT NULL
), g AS (
  SELECT 'all' AS scope, NULL::INTEGER AS rank, NULL::INTEGER AS peer_rank, * FROM (
    SELECT count(*) AS n, count(DISTINCT msg_bytes) AS sizes,
           regr_intercept(duration_ns, msg_bytes) AS a_ns, regr_slope(duration_ns, msg_bytes) AS b,
           regr_r2(duration_ns, msg_bytes) AS r2, sum(duration_ns) AS total_ns,
           count(*) FILTER (WHERE msg_bytes <= small_bytes) AS small_ops,
           coalesce(sum(duration_ns) FILTER (WHERE msg_bytes <= small_bytes), 0) AS small_ns
    FROM p HAVING count(*) > 0)
  UNION ALL
  SELECT 'pair', rank, peer_rank, count(*), count(DISTINCT msg_bytes),
         regr_intercept(duration_ns, msg_bytes), regr_slope(duration_ns, msg_bytes), regr_r2(duration_ns, msg_bytes),
         sum(duration_ns), count(*) FILTER (WHERE msg_bytes <= small_bytes),
         coalesce(sum(duration_ns) FILTER (WHERE msg_bytes <= small_bytes), 0)
  FROM p WHERE peer_rank IS NOT NULL GROUP BY rank, peer_rank
), f AS (
  SELECT *, CASE WHEN sizes >= 2 THEN a_ns END AS alpha_ns FROM g
)
SELECT scope, rank, peer_rank, n, sizes,
       (alpha_ns / 1000.0)::DOUBLE AS alpha_us,
       (CASE WHEN sizes >= 2 AND b > 0 THEN 1.0 / b END)::DOUBLE AS beta_gbps,
       (CASE WHEN sizes >= 2 THEN r2 END)::DOUBLE AS r2,
       CAST(total_ns AS BIGINT) AS total_ns, small_ops, CAST(small_ns AS BIGINT) AS small_ns,
       (100.0 * small_ns / nullif(total_ns, 0))::DOUBLE AS small_time_pct,
       CAST(round(least(greatest(small_ops * alpha_ns, 0), small_ns)) AS BIGINT) AS small_alpha_ns,
       (100.0 * least(greatest(small_ops * alpha_ns, 0), small_ns) / nullif(small_ns, 0))::DOUBLE AS small_alpha_pct
FROM f
ORDER BY scope, rank NULLS FIRST, peer_rank NULLS FIRST;
