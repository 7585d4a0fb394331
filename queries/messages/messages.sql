-- @include overlap/overlap.sql
-- @include skew/skew.sql
-- @include devices/peaks.sql
-- Message sizes and bandwidth of communication operations. Sizes are comm_ops.msg_bytes, nccl-tests' size S
-- (all_reduce/broadcast/reduce: the buffer; all_gather: the gathered output; reduce_scatter: the full input;
-- all_to_all: the whole per-rank send buffer; send/recv: the bytes sent/received).
-- Bandwidth comes from the transfer time of an instance matched on its complete group (_skew_comm_instances with
-- transfer_source 'matched': end of the last-arriving rank − latest start), so it excludes waiting for late peers;
-- each instance counts once. The kernel-duration figure (*_incl_wait_gbps) includes that waiting: it is a lower
-- bound of the bandwidth, the only one available where no instance was matched on its whole group.
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
-- @column algorithm: Algorithm the kernel name says ran (comm_kernels.algorithm), NULL where it does not say.
-- @column protocol: Protocol the kernel name says ran (comm_kernels.protocol), NULL where it does not say.
-- @column channels: Channels (grid x) of an NCCL/RCCL kernel (comm_kernels.channels), NULL otherwise.
CREATE OR REPLACE MACRO _messages_comm_sized() AS TABLE
SELECT o.kernel_id, o.rank, o.collective, o.msg_bytes, o.group_size,
       coalesce(o.group_source = 'assumed_world_size', false) AS group_size_assumed, o.peer_rank, k.start_ns,
       greatest(k.duration_ns, 0) AS duration_ns,
       _messages_bucket_lo(o.msg_bytes) AS bucket_lo_bytes, k.algorithm, k.protocol, k.channels
FROM comm_ops o JOIN _overlap_comm_kernels k USING (kernel_id);

-- @macro msg_size_histogram
-- Per collective and power-of-two size bucket, over all ranks: operation count, bytes, kernel time and the
-- bucket's share of that collective's kernel time. Operations of unknown size form one row with NULL bucket
-- bounds, so shares add up to 100 per collective.
-- @column collective [key]: Canonical collective.
-- @column bucket_lo_bytes [key]: Bucket lower bound, inclusive (bytes); NULL for unknown sizes.
-- @column bucket_hi_bytes: Bucket upper bound, exclusive (bytes); NULL for unknown sizes.
-- @column ops [key]: Operations (kernels) in the bucket, all ranks.
-- @column ranks: Distinct ranks with operations in the bucket.
-- @column total_bytes: Sum of msg_bytes (bytes); NULL for unknown sizes.
-- @column total_ns [key]: Sum of kernel durations (ns).
-- @column mean_ns: Mean kernel duration (ns, rounded).
-- @column time_share_pct [key]: 100 × total_ns / the collective's total kernel time.
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

-- @macro msg_size_exposure
-- Per collective and power-of-two size bucket (the buckets of msg_size_histogram), over all ranks: the
-- communication kernels' time and the part of it with no computation running on the rank (comm_kernels.exposed_ns).
-- Operations of unknown size form one row with NULL bucket bounds. nsys2comm diff reads it for the exposed time of
-- each size bucket.
-- @column collective [key]: Canonical collective.
-- @column bucket_lo_bytes [key]: Bucket lower bound, inclusive (bytes); NULL for unknown sizes.
-- @column bucket_hi_bytes: Bucket upper bound, exclusive (bytes); NULL for unknown sizes.
-- @column ops [key]: Operations (kernels) in the bucket, all ranks.
-- @column total_ns: Sum of kernel durations (ns), as msg_size_histogram.total_ns.
-- @column exposed_ns [key]: Sum of comm_kernels.exposed_ns over the bucket's kernels (ns).
-- @column exposed_pct [key]: 100 × exposed_ns / total_ns; NULL when total_ns is 0.
CREATE OR REPLACE MACRO msg_size_exposure() AS TABLE
WITH b AS (
  SELECT o.collective, _messages_bucket_lo(o.msg_bytes) AS bucket_lo_bytes, count(*) AS ops,
         sum(greatest(k.duration_ns, 0)) AS total_ns, sum(k.exposed_ns) AS exposed_ns
  FROM comm_ops o JOIN _overlap_comm_kernels k USING (kernel_id)
  GROUP BY ALL
)
SELECT collective, bucket_lo_bytes, CASE WHEN bucket_lo_bytes = 0 THEN 1 ELSE bucket_lo_bytes * 2 END AS bucket_hi_bytes,
       ops, CAST(total_ns AS BIGINT) AS total_ns, CAST(exposed_ns AS BIGINT) AS exposed_ns,
       CASE WHEN total_ns > 0 THEN 100.0 * exposed_ns / total_ns END::DOUBLE AS exposed_pct
FROM b
ORDER BY collective, bucket_lo_bytes NULLS LAST;

-- @macro _messages_bandwidth_check
-- A bus bandwidth against its physical peak: 'ok', 'above_peak' (physically impossible), 'no_peak' (peak
-- unknown), NULL without a figure. A relative 1e-9 absorbs floating-point rounding.
-- @param busbw_gbps: Bus bandwidth (GB/s).
-- @param peak_gbps: Peak bus bandwidth (GB/s).
CREATE OR REPLACE MACRO _messages_bandwidth_check(busbw_gbps, peak_gbps) AS
  CASE WHEN busbw_gbps IS NULL THEN NULL WHEN peak_gbps IS NULL THEN 'no_peak'
       WHEN busbw_gbps > peak_gbps * (1 + 1e-9) THEN 'above_peak' ELSE 'ok' END;

-- @macro _messages_bandwidth_by_op
-- collective_bandwidth_by_op's rows, unordered, for the analyses that aggregate them (a macro's ORDER BY is kept
-- inside the queries that read it: a sort of every operation of known size).
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective.
-- @column msg_bytes: Size S (bytes).
-- @column group_size: Ranks in the communicator, when known.
-- @column group_size_assumed: True when group_size (and so busbw) rests on an assumed world size (see _messages_comm_sized).
-- @column spans_hosts: True when the operation's group spans hosts, false on one host, NULL when unknown (comm_group_links).
-- @column start_ns: Kernel start (ns).
-- @column duration_ns: Kernel duration (ns), waiting for late peers included.
-- @column instance_key: Matched instance (_skew_ops), NULL when the operation's instance was not matched on its complete group.
-- @column transfer_ns: Transfer time of the matched instance (ns, waiting excluded), NULL when not matched.
-- @column algbw_gbps: msg_bytes / transfer_ns (GB/s, 1e9 B/s); NULL when not matched.
-- @column busbw_factor: nccl-tests factor (2(n−1)/n all_reduce, (n−1)/n all_gather/reduce_scatter/all_to_all, 1 others).
-- @column busbw_gbps: algbw_gbps × busbw_factor (GB/s); NULL when not matched or the factor is unknown.
-- @column algbw_incl_wait_gbps: msg_bytes / duration_ns (GB/s): includes waiting, a lower bound; NULL for zero duration.
-- @column busbw_incl_wait_gbps: algbw_incl_wait_gbps × busbw_factor (GB/s): includes waiting, a lower bound.
-- @column algorithm: Algorithm the kernel name says ran, NULL where it does not say.
-- @column protocol: Protocol the kernel name says ran, NULL where it does not say.
-- @column channels: Channels (grid x) of an NCCL/RCCL kernel, NULL otherwise.
-- @column peak_busbw_gbps: Physical peak busbw of the operation's group for its collective (comm_group_links, GB/s), NULL when unknown.
-- @column peak_source: Where the peak came from: 'device_table', 'link_gbps', 'nic_gbps' (comm_group_links), NULL when unknown.
-- @column peak_assumes_one_host: True when the peak is a link's although some members' hosts are unknown.
-- @column bandwidth_check: busbw_gbps (busbw_incl_wait_gbps when not matched) against the peak: 'ok', 'above_peak' (physically impossible: a wrong size, group or clock), 'no_peak' (peak unknown); NULL without a figure.
CREATE OR REPLACE MACRO _messages_bandwidth_by_op() AS TABLE
WITH t AS (  -- instances matched on their complete group, with a transfer time
  SELECT s.kernel_id, s.instance_key, i.transfer_ns
  FROM _skew_ops s JOIN _skew_comm_instances i USING (instance_key)
  WHERE i.transfer_source = 'matched' AND i.transfer_ns > 0
), c AS (
  SELECT c.*, t.instance_key, t.transfer_ns, busbw_factor(c.collective, c.group_size)::DOUBLE AS busbw_factor,
         p.spans_hosts, p.peak_busbw_gbps, p.peak_source, coalesce(p.peak_assumes_one_host, false) AS peak_assumes_one_host
  FROM _messages_comm_sized() c LEFT JOIN t USING (kernel_id) LEFT JOIN _devices_op_peaks() p USING (kernel_id)
  WHERE c.msg_bytes IS NOT NULL
), b AS (
  SELECT *, (msg_bytes / transfer_ns)::DOUBLE AS algbw_gbps, (msg_bytes / transfer_ns * busbw_factor)::DOUBLE AS busbw_gbps,
         (CASE WHEN duration_ns > 0 THEN msg_bytes / duration_ns END)::DOUBLE AS algbw_incl_wait_gbps,
         _messages_busbw_gbps(collective, msg_bytes, group_size, duration_ns) AS busbw_incl_wait_gbps
  FROM c
)
SELECT kernel_id, rank, collective, msg_bytes, group_size, group_size_assumed, spans_hosts, start_ns, duration_ns,
       instance_key, transfer_ns, algbw_gbps, busbw_factor, busbw_gbps, algbw_incl_wait_gbps, busbw_incl_wait_gbps,
       algorithm, protocol, channels, peak_busbw_gbps, peak_source, peak_assumes_one_host,
       _messages_bandwidth_check(CASE WHEN instance_key IS NOT NULL THEN busbw_gbps ELSE busbw_incl_wait_gbps END,
                                 peak_busbw_gbps) AS bandwidth_check
FROM b;

-- @macro collective_bandwidth_by_op
-- Per communication operation of known size: algorithm and bus bandwidth as nccl-tests defines them,
-- algbw = S / transfer time, busbw = algbw × busbw_factor(collective, group_size), in GB/s = 1e9 B/s (1 B/ns),
-- where the transfer time is that of the operation's instance matched on its complete group (waiting excluded;
-- NULL otherwise); the kernel-duration figures (*_incl_wait_gbps) include waiting for late peers.
-- @column kernel_id: Kernel id.
-- @column rank [key]: Rank.
-- @column collective [key]: Canonical collective.
-- @column msg_bytes [key]: Size S (bytes).
-- @column group_size: Ranks in the communicator, when known.
-- @column group_size_assumed: True when group_size (and so busbw) rests on an assumed world size (see _messages_comm_sized).
-- @column spans_hosts: True when the operation's group spans hosts, false on one host, NULL when unknown (comm_group_links).
-- @column start_ns: Kernel start (ns).
-- @column duration_ns: Kernel duration (ns), waiting for late peers included.
-- @column instance_key: Matched instance (_skew_ops), NULL when the operation's instance was not matched on its complete group.
-- @column transfer_ns [key]: Transfer time of the matched instance (ns, waiting excluded), NULL when not matched.
-- @column algbw_gbps: msg_bytes / transfer_ns (GB/s, 1e9 B/s); NULL when not matched.
-- @column busbw_factor: nccl-tests factor (2(n−1)/n all_reduce, (n−1)/n all_gather/reduce_scatter/all_to_all, 1 others).
-- @column busbw_gbps [key]: algbw_gbps × busbw_factor (GB/s); NULL when not matched or the factor is unknown.
-- @column algbw_incl_wait_gbps: msg_bytes / duration_ns (GB/s): includes waiting, a lower bound; NULL for zero duration.
-- @column busbw_incl_wait_gbps: algbw_incl_wait_gbps × busbw_factor (GB/s): includes waiting, a lower bound.
-- @column algorithm: Algorithm the kernel name says ran, NULL where it does not say.
-- @column protocol: Protocol the kernel name says ran, NULL where it does not say.
-- @column channels: Channels (grid x) of an NCCL/RCCL kernel, NULL otherwise.
-- @column peak_busbw_gbps: Physical peak busbw of the operation's group for its collective (comm_group_links, GB/s), NULL when unknown.
-- @column peak_source: Where the peak came from: 'device_table', 'link_gbps', 'nic_gbps' (comm_group_links), NULL when unknown.
-- @column peak_assumes_one_host: True when the peak is a link's although some members' hosts are unknown.
-- @column bandwidth_check [key]: busbw_gbps (busbw_incl_wait_gbps when not matched) against the peak: 'ok', 'above_peak' (physically impossible: a wrong size, group or clock), 'no_peak' (peak unknown); NULL without a figure.
CREATE OR REPLACE MACRO collective_bandwidth_by_op() AS TABLE
SELECT * FROM _messages_bandwidth_by_op()
ORDER BY rank, start_ns, kernel_id;

-- @macro collective_bandwidth
-- Per (collective, group size, kind of group, power-of-two size bucket), over all ranks: bandwidth from the
-- transfer time of the instances matched on their complete group, each instance once, algbw = Σ S / Σ transfer
-- time and busbw = algbw × busbw_factor; and the kernel-duration figures over every operation (*_incl_wait_gbps,
-- waiting included: a lower bound). bandwidth_basis says which figure the headline uses: 'transfer' when at least
-- one instance was matched (matched_ops / ops is the coverage), else 'incl_wait' (say "includes waiting, a lower
-- bound"). The headline is compared with the physical peak of the groups (comm_group_links): a figure above it is
-- impossible, flagged 'above_peak' and left out of headline_busbw_gbps. GB/s = 1e9 B/s. Sizes are nccl-tests S
-- (comm_ops.msg_bytes); unknown sizes are left out (see diagnostics). Depends on --link-gbps / --nic-gbps.
-- @column collective [key]: Canonical collective.
-- @column group_size [key]: Ranks in the communicator, when known.
-- @column group_size_assumed: True when the group size (and so busbw) is the assumed world size of a trace that records no group, not a recorded value.
-- @column spans_hosts: True when the groups span hosts (network), false on one host (NVLink/PCIe/xGMI), NULL when unknown.
-- @column bucket_lo_bytes [key]: Bucket lower bound, inclusive (bytes).
-- @column bucket_hi_bytes: Bucket upper bound, exclusive (bytes).
-- @column ops: Operations in the bucket (all ranks).
-- @column matched_ops: Operations whose instance was matched on its complete group (transfer-based figures cover these).
-- @column matched_instances: Distinct matched instances.
-- @column total_bytes: Sum of msg_bytes over all operations (bytes).
-- @column total_ns [key]: Sum of kernel durations over all operations (ns).
-- @column transfer_ns: Sum of the matched instances' transfer times, each instance once (ns); NULL when none.
-- @column algbw_gbps: Σ S / Σ transfer time over matched instances (GB/s); NULL when none was matched.
-- @column busbw_gbps [key]: algbw_gbps × busbw_factor (GB/s); NULL when none was matched or the factor is unknown.
-- @column median_busbw_gbps: Median per-instance transfer busbw (GB/s); NULL when none was matched.
-- @column algbw_incl_wait_gbps: total_bytes / total_ns (GB/s): includes waiting, a lower bound.
-- @column busbw_incl_wait_gbps: algbw_incl_wait_gbps × busbw_factor (GB/s): includes waiting, a lower bound.
-- @column bandwidth_basis: 'transfer' (matched instances) or 'incl_wait' (none matched: kernel durations, a lower bound).
-- @column algorithm: Most common algorithm the kernel names say ran, NULL where none says.
-- @column protocol: Most common protocol the kernel names say ran, NULL where none says.
-- @column channels: Most common channel count (grid x) of the NCCL/RCCL kernels, NULL when unknown.
-- @column peak_busbw_gbps: Physical peak busbw of the groups for this collective (largest over the bucket's operations, GB/s); NULL when any is unknown.
-- @column peak_source: 'device_table', 'link_gbps', 'nic_gbps' (see comm_group_links), 'mixed', or NULL when unknown.
-- @column peak_assumes_one_host: True when the peak is a link's although some members' hosts are unknown.
-- @column busbw_pct_of_peak: 100 × the basis busbw / peak_busbw_gbps; NULL when either is unknown.
-- @column bandwidth_check [key]: The basis busbw against the peak: 'ok', 'above_peak' (physically impossible), 'no_peak'; NULL without a figure.
-- @column headline_busbw_gbps: The figure to show: busbw_gbps ('transfer') or busbw_incl_wait_gbps ('incl_wait'), NULL when above the peak.
-- @column headline_algbw_gbps: algbw of the same basis, NULL when the busbw is above the peak.
CREATE OR REPLACE MACRO collective_bandwidth() AS TABLE
WITH c AS (
  SELECT *, _messages_bucket_lo(msg_bytes) AS bucket_lo_bytes,
         instance_key IS NOT NULL
           AND row_number() OVER (PARTITION BY instance_key, collective ORDER BY rank, kernel_id) = 1 AS first_of_instance
  FROM _messages_bandwidth_by_op()
), a AS (
  SELECT collective, group_size, group_size_assumed, spans_hosts, bucket_lo_bytes,
         count(*) AS ops, count(instance_key) AS matched_ops, count(DISTINCT instance_key) AS matched_instances,
         sum(msg_bytes) AS total_bytes, sum(duration_ns) AS total_ns,
         sum(transfer_ns) FILTER (WHERE first_of_instance) AS transfer_ns,
         sum(msg_bytes) FILTER (WHERE first_of_instance) AS transfer_bytes,
         median(busbw_gbps) FILTER (WHERE first_of_instance) AS median_busbw_gbps,
         any_value(busbw_factor) AS factor,
         _prelude_most_common(histogram(algorithm)) AS algorithm, _prelude_most_common(histogram(protocol)) AS protocol,
         _prelude_most_common(histogram(channels)) AS channels,
         CASE WHEN count(peak_busbw_gbps) = count(*) THEN max(peak_busbw_gbps) END AS peak_busbw_gbps,
         CASE WHEN count(DISTINCT peak_source) > 1 THEN 'mixed' ELSE min(peak_source) END AS peak_source,
         bool_or(peak_assumes_one_host) AS peak_assumes_one_host
  FROM c GROUP BY collective, group_size, group_size_assumed, spans_hosts, bucket_lo_bytes
), b AS (
  SELECT a.*,
         (transfer_bytes / nullif(transfer_ns, 0))::DOUBLE AS algbw_gbps,
         (transfer_bytes / nullif(transfer_ns, 0) * factor)::DOUBLE AS busbw_gbps,
         (total_bytes / nullif(total_ns, 0))::DOUBLE AS algbw_incl_wait_gbps,
         (total_bytes / nullif(total_ns, 0) * factor)::DOUBLE AS busbw_incl_wait_gbps,
         CASE WHEN matched_instances > 0 THEN 'transfer' ELSE 'incl_wait' END AS bandwidth_basis
  FROM a
), h AS (
  SELECT *, CASE WHEN bandwidth_basis = 'transfer' THEN busbw_gbps ELSE busbw_incl_wait_gbps END AS basis_busbw,
         CASE WHEN bandwidth_basis = 'transfer' THEN algbw_gbps ELSE algbw_incl_wait_gbps END AS basis_algbw
  FROM b
)
SELECT collective, group_size, group_size_assumed, spans_hosts, bucket_lo_bytes,
       CASE WHEN bucket_lo_bytes = 0 THEN 1 ELSE bucket_lo_bytes * 2 END AS bucket_hi_bytes,
       ops, matched_ops, matched_instances, CAST(total_bytes AS BIGINT) AS total_bytes, CAST(total_ns AS BIGINT) AS total_ns,
       CAST(transfer_ns AS BIGINT) AS transfer_ns, algbw_gbps, busbw_gbps, median_busbw_gbps::DOUBLE AS median_busbw_gbps,
       algbw_incl_wait_gbps, busbw_incl_wait_gbps, bandwidth_basis, algorithm, protocol, channels::INTEGER AS channels,
       peak_busbw_gbps::DOUBLE AS peak_busbw_gbps, peak_source, peak_assumes_one_host,
       (100.0 * basis_busbw / nullif(peak_busbw_gbps, 0))::DOUBLE AS busbw_pct_of_peak,
       _messages_bandwidth_check(basis_busbw, peak_busbw_gbps) AS bandwidth_check,
       CASE WHEN _messages_bandwidth_check(basis_busbw, peak_busbw_gbps) <> 'above_peak' THEN basis_busbw END::DOUBLE
         AS headline_busbw_gbps,
       CASE WHEN _messages_bandwidth_check(basis_busbw, peak_busbw_gbps) <> 'above_peak' THEN basis_algbw END::DOUBLE
         AS headline_algbw_gbps
FROM h
ORDER BY collective, group_size NULLS LAST, group_size_assumed, spans_hosts NULLS LAST, bucket_lo_bytes;
