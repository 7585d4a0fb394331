-- @include messages/messages.sql
-- Point-to-point (send, recv, send_recv) kernel durations versus message size. Kernel durations include waiting
-- for the peer; the transfer time apart from waiting and the α-β model are in queries/skew (comm_transfer,
-- transfer_by_pair, latency_model).

-- @macro p2p_latency_by_size
-- Per p2p collective (send, recv, send_recv) and power-of-two size bucket, all ranks: count and duration
-- distribution, and the effective bandwidth Σ bytes / Σ duration (GB/s = 1e9 B/s), which includes waiting for the
-- peer: a lower bound, never a link speed (transfer times apart from waiting: transfer_by_pair, latency_model).
-- Unknown sizes are left out.
-- @column collective [key]: 'send', 'recv' or 'send_recv'.
-- @column bucket_lo_bytes [key]: Bucket lower bound, inclusive (bytes).
-- @column bucket_hi_bytes: Bucket upper bound, exclusive (bytes).
-- @column ops [key]: Operations in the bucket.
-- @column total_bytes: Sum of msg_bytes (bytes).
-- @column min_ns: Minimum duration (ns).
-- @column p50_ns [key]: Median duration (ns, nearest rank).
-- @column p90_ns: 90th percentile duration (ns, nearest rank).
-- @column p99_ns: 99th percentile duration (ns, nearest rank).
-- @column max_ns: Maximum duration (ns).
-- @column effective_incl_wait_gbps [key]: total_bytes / Σ duration (GB/s), waiting included: a lower bound.
CREATE OR REPLACE MACRO p2p_latency_by_size() AS TABLE
SELECT collective, bucket_lo_bytes, CASE WHEN bucket_lo_bytes = 0 THEN 1 ELSE bucket_lo_bytes * 2 END AS bucket_hi_bytes,
       count(*) AS ops, CAST(sum(msg_bytes) AS BIGINT) AS total_bytes,
       min(duration_ns) AS min_ns, quantile_disc(duration_ns, 0.5) AS p50_ns,
       quantile_disc(duration_ns, 0.9) AS p90_ns, quantile_disc(duration_ns, 0.99) AS p99_ns, max(duration_ns) AS max_ns,
       (sum(msg_bytes) / nullif(sum(duration_ns), 0))::DOUBLE AS effective_incl_wait_gbps
FROM _messages_comm_sized()
WHERE collective IN ('send', 'recv', 'send_recv') AND msg_bytes IS NOT NULL
GROUP BY collective, bucket_lo_bytes
ORDER BY collective, bucket_lo_bytes;
