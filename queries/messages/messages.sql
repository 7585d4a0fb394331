-- @include overlap/overlap.sql
-- Message sizes and bandwidth of communication operations. Sizes are comm_ops.msg_bytes, nccl-tests' size S
-- (all_reduce/broadcast/reduce: the buffer; all_gather: the gathered output; reduce_scatter: the full input;
-- all_to_all: the whole per-rank send buffer; send/recv: the bytes sent/received). Durations are kernel
-- durations on each rank, so they include time spent waiting for late peers (see collective_skew for latency).
-- Size buckets are powers of two: [2^k, 2^(k+1)) bytes, bucket_lo_bytes = 0 for empty messages.

-- @macro _messages_bucket_lo
-- Lower bound of the power-of-two size bucket of a message (bytes): 2^floor(log2(bytes)), 0 for empty messages,
-- NULL when the size is unknown.
-- @param msg_bytes: Size S (bytes).
CREATE OR REPLACE MACRO _messages_bucket_lo(msg_bytes) AS
  CASE WHEN msg_bytes IS NULL THEN NULL WHEN msg_bytes <= 0 THEN 0
       ELSE CAST(1 AS BIGINT) << CAST(floor(log2(msg_bytes)) AS INTEGER) END;

-- @macro _messages_busbw_gbps
-- Bus bandwidth of one operation as nccl-tests defines it: msg_bytes / duration × busbw_factor(collective,
-- group_size), in GB/s = 1e9 B/s (1 B/ns); NULL for zero duration, unknown size or unknown factor.
-- @param collective: Canonical collective.
-- @param msg_bytes: Size S (bytes).
-- @param group_size: Ranks in the communicator.
-- @param duration_ns: Kernel duration (ns).
CREATE OR REPLACE MACRO _messages_busbw_gbps(collective, msg_bytes, group_size, duration_ns) AS
  (CASE WHEN duration_ns > 0 THEN msg_bytes / duration_ns * busbw_factor(collective, group_size) END)::DOUBLE;

-- @macro _messages_comm_sized
-- Communication operations with their kernel duration and power-of-two size bucket. The kernel times come from
-- comm_kernels' rows (_overlap_comm_kernels, a stored sweep): comm_ops has one row per communication kernel, and
-- looking them up there reads a tenth of what the kernels table holds.
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective.
-- @column msg_bytes: Size S (bytes), NULL when unknown.
-- @column group_size: Ranks in the communicator, when known.
-- @column group_size_assumed: True when group_size is the world size assumed by the importer (comm_ops.group_source 'assumed_world_size'), not a recorded value.
-- @column peer_rank: Point-to-point peer, when known.
-- @column start_ns: Kernel start (ns).
-- @column duration_ns: Kernel duration (ns).
-- @column bucket_lo_bytes: Lower bound of the size bucket (bytes), NULL when the size is unknown.
CREATE OR REPLACE MACRO _messages_comm_sized() AS TABLE
SELECT o.kernel_id, o.rank, o.collective, o.msg_bytes, o.group_size,
       coalesce(o.group_source = 'assumed_world_size', false) AS group_size_assumed, o.peer_rank, k.start_ns,
       greatest(k.duration_ns, 0) AS duration_ns,
       _messages_bucket_lo(o.msg_bytes) AS bucket_lo_bytes
FROM comm_ops o JOIN _overlap_comm_kernels k USING (kernel_id);

-- @macro msg_size_histogram
-- Per collective and power-of-two size bucket, over all ranks: operation count, bytes, kernel time and the
-- bucket's share of that collective's kernel time. Operations of unknown size form one row with NULL bucket
-- bounds, so shares add up to 100 per collective.
-- @column collective: Canonical collective.
-- @column bucket_lo_bytes: Bucket lower bound, inclusive (bytes); NULL for unknown sizes.
-- @column bucket_hi_bytes: Bucket upper bound, exclusive (bytes); NULL for unknown sizes.
-- @column ops: Operations (kernels) in the bucket, all ranks.
-- @column ranks: Distinct ranks with operations in the bucket.
-- @column total_bytes: Sum of msg_bytes (bytes); NULL for unknown sizes.
-- @column total_ns: Sum of kernel durations (ns).
-- @column mean_ns: Mean kernel duration (ns, rounded).
-- @column time_share_pct: 100 × total_ns / the collective's total kernel time.
CREATE OR REPLACE MACRO msg_size_histogram() AS TABLE
WITH b AS (
  SELECT collective, bucket_lo_bytes, count(*) AS ops, count(DISTINCT rank) AS ranks,
         sum(msg_bytes) AS total_bytes, sum(duration_ns) AS total_ns
  FROM _messages_comm_sized() GROUP BY collective, bucket_lo_bytes
)
SELECT collective, bucket_lo_bytes,
       CASE WHEN bucket_lo_bytes = 0 THEN 1 ELSE bucket_lo_bytes * 2 END AS bucket_hi_bytes,
       ops, ranks, CAST(total_bytes AS BIGINT) AS total_bytes, CAST(total_ns AS BIGINT) AS total_ns,
       CAST(round(total_ns / ops) AS BIGINT) AS mean_ns,
       (100.0 * total_ns / nullif(sum(total_ns) OVER (PARTITION BY collective), 0))::DOUBLE AS time_share_pct
FROM b
ORDER BY collective, bucket_lo_bytes NULLS LAST;

-- @macro _messages_bandwidth_by_op
-- collective_bandwidth_by_op's rows, unordered, for the analyses that aggregate them (a macro's ORDER BY is kept
-- inside the queries that read it: a sort of every operation of known size).
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective.
-- @column msg_bytes: Size S (bytes).
-- @column group_size: Ranks in the communicator, when known.
-- @column group_size_assumed: True when group_size (and so busbw) rests on an assumed world size (see _messages_comm_sized).
-- @column start_ns: Kernel start (ns).
-- @column duration_ns: Kernel duration (ns).
-- @column algbw_gbps: msg_bytes / duration (GB/s, 1e9 B/s); NULL for zero duration.
-- @column busbw_factor: nccl-tests factor (2(n−1)/n all_reduce, (n−1)/n all_gather/reduce_scatter/all_to_all, 1 others).
-- @column busbw_gbps: algbw_gbps × busbw_factor (GB/s); NULL when the factor is unknown.
CREATE OR REPLACE MACRO _messages_bandwidth_by_op() AS TABLE
SELECT kernel_id, rank, collective, msg_bytes, group_size, group_size_assumed, start_ns, duration_ns,
       (CASE WHEN duration_ns > 0 THEN msg_bytes / duration_ns END)::DOUBLE AS algbw_gbps,
       busbw_factor(collective, group_size)::DOUBLE AS busbw_factor,
       _messages_busbw_gbps(collective, msg_bytes, group_size, duration_ns) AS busbw_gbps
FROM _messages_comm_sized() WHERE msg_bytes IS NOT NULL;

-- @macro collective_bandwidth_by_op
-- Per communication operation of known size: algorithm and bus bandwidth as nccl-tests defines them,
-- algbw = S / duration, busbw = algbw × busbw_factor(collective, group_size), in GB/s = 1e9 B/s (1 B/ns).
-- The duration is this rank's kernel duration (it includes waiting for peers).
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective.
-- @column msg_bytes: Size S (bytes).
-- @column group_size: Ranks in the communicator, when known.
-- @column group_size_assumed: True when group_size (and so busbw) rests on an assumed world size (see _messages_comm_sized).
-- @column start_ns: Kernel start (ns).
-- @column duration_ns: Kernel duration (ns).
-- @column algbw_gbps: msg_bytes / duration (GB/s, 1e9 B/s); NULL for zero duration.
-- @column busbw_factor: nccl-tests factor (2(n−1)/n all_reduce, (n−1)/n all_gather/reduce_scatter/all_to_all, 1 others).
-- @column busbw_gbps: algbw_gbps × busbw_factor (GB/s); NULL when the factor is unknown.
CREATE OR REPLACE MACRO collective_bandwidth_by_op() AS TABLE
SELECT * FROM _messages_bandwidth_by_op()
ORDER BY rank, start_ns, kernel_id;

-- @macro collective_bandwidth
-- Per (collective, group size, power-of-two size bucket), over all ranks: aggregate algorithm bandwidth
-- Σ bytes / Σ kernel time and bus bandwidth (× busbw_factor), plus the median and maximum of the per-operation
-- bus bandwidth. GB/s = 1e9 B/s. Sizes are nccl-tests S (comm_ops.msg_bytes). Unknown sizes are left out
-- (see diagnostics).
-- @column collective: Canonical collective.
-- @column group_size: Ranks in the communicator, when known.
-- @column group_size_assumed: True when the group size (and so busbw) is the assumed world size of a trace that records no group, not a recorded value.
-- @column bucket_lo_bytes: Bucket lower bound, inclusive (bytes).
-- @column bucket_hi_bytes: Bucket upper bound, exclusive (bytes).
-- @column ops: Operations in the bucket.
-- @column total_bytes: Sum of msg_bytes (bytes).
-- @column total_ns: Sum of kernel durations (ns).
-- @column algbw_gbps: total_bytes / total_ns (GB/s).
-- @column busbw_gbps: algbw_gbps × busbw_factor (GB/s).
-- @column median_busbw_gbps: Median per-operation bus bandwidth (GB/s).
-- @column max_busbw_gbps: Maximum per-operation bus bandwidth (GB/s).
CREATE OR REPLACE MACRO collective_bandwidth() AS TABLE
WITH c AS (SELECT *, _messages_bucket_lo(msg_bytes) AS bucket_lo_bytes FROM _messages_bandwidth_by_op())
SELECT c.collective, c.group_size, c.group_size_assumed, c.bucket_lo_bytes,
       CASE WHEN c.bucket_lo_bytes = 0 THEN 1 ELSE c.bucket_lo_bytes * 2 END AS bucket_hi_bytes,
       count(*) AS ops, CAST(sum(c.msg_bytes) AS BIGINT) AS total_bytes, CAST(sum(c.duration_ns) AS BIGINT) AS total_ns,
       (sum(c.msg_bytes) / nullif(sum(c.duration_ns), 0))::DOUBLE AS algbw_gbps,
       (sum(c.msg_bytes) / nullif(sum(c.duration_ns), 0) * any_value(c.busbw_factor))::DOUBLE AS busbw_gbps,
       median(c.busbw_gbps)::DOUBLE AS median_busbw_gbps, max(c.busbw_gbps)::DOUBLE AS max_busbw_gbps
FROM c
GROUP BY c.collective, c.group_size, c.group_size_assumed, c.bucket_lo_bytes
ORDER BY c.collective, c.group_size NULLS LAST, c.group_size_assumed, c.bucket_lo_bytes;
