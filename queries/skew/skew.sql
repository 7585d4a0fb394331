-- Cross-rank matching of communication operations: the one definition of "the same operation on every rank",
-- used by collective_skew, rank_wait, comm_transfer, the latency model and anything that compares ranks.
-- Collectives: matching rule chosen once per job from the data (the first that every collective supports):
--   'pg_seq'      every comm op has pg_name and seq: instance = (pg_name, seq);
--   'group_order' every comm op has pg_name or comm_id: instance = (group, collective, k-th occurrence of that
--                 collective in that group on the rank, by start time);
--   'rank_order'  otherwise (TraceLens simplified mode): instance = k-th communication kernel of the rank by start
--                 time, over all communication kernels not matched as point-to-point.
-- Point-to-point ('p2p_pair'): a send or recv with a known peer, whatever the rule above: the k-th send from rank s
-- to rank d in a group matches the k-th recv on d from s in that group (NCCL delivers in order per pair).
-- send/recv without a known peer are matched only under 'rank_order'.
-- Times are aligned across hosts first (host_clock_offsets). Transfer time = end of the rank that arrived last −
-- latest start (for p2p: recv end − latest start), never below 0; a rank's wait = latest start − its start.
-- Why not "earliest end − latest start": ring collectives end up to 7 µs apart on one host (fixtures/example), so
-- the earliest end understates the transfer that the last arriver, which waited for nobody, measured in full.

-- @view _skew_comm_keys
-- Communication kernels with the instance key they are matched by (this file's header), on raw (per-host) clocks.
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column instance_key: Key shared by the same operation on every rank.
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective ('unknown' when no comm_ops row).
-- @column pg_name: Group, when known.
-- @column seq: Sequence number, when known.
-- @column msg_bytes: Size S, when known (bytes).
-- @column group_size: Group size, when known.
-- @column src_rank: p2p: sending rank, else NULL.
-- @column dst_rank: p2p: receiving rank, else NULL.
-- @column start_ns: Kernel start, raw (ns).
-- @column end_ns: Kernel end, raw (ns).
CREATE OR REPLACE VIEW _skew_comm_keys AS
WITH k AS (
  SELECT k.kernel_id, k.rank, k.start_ns, k.end_ns, coalesce(o.collective, 'unknown') AS collective,
         coalesce(o.pg_name, o.comm_id) AS grp, o.seq, o.msg_bytes, o.group_size, o.peer_rank,
         o.kernel_id IS NOT NULL AS has_op,
         coalesce(o.collective IN ('send', 'recv') AND o.peer_rank IS NOT NULL, false) AS is_pair
  FROM kernels k LEFT JOIN comm_ops o USING (kernel_id)
  WHERE k.kernel_class = 'communication'
), rule AS (
  SELECT CASE WHEN count(*) FILTER (WHERE collective NOT IN ('send', 'recv')) > 0
                   AND bool_and(has_op AND grp IS NOT NULL AND seq IS NOT NULL) FILTER (WHERE collective NOT IN ('send', 'recv'))
                THEN 'pg_seq'
              WHEN count(*) FILTER (WHERE collective NOT IN ('send', 'recv')) > 0
                   AND bool_and(has_op AND grp IS NOT NULL) FILTER (WHERE collective NOT IN ('send', 'recv'))
                THEN 'group_order'
              ELSE 'rank_order' END AS r
  FROM k
), keyed AS (
  SELECT k.*, CASE WHEN is_pair THEN 'p2p_pair' ELSE rule.r END AS match_rule,
         CASE WHEN collective = 'send' AND is_pair THEN k.rank WHEN is_pair THEN peer_rank END AS src_rank,
         CASE WHEN collective = 'recv' AND is_pair THEN k.rank WHEN is_pair THEN peer_rank END AS dst_rank,
         CASE
           WHEN is_pair THEN 'p2p:' || coalesce(grp, '') || ':'
             || CASE WHEN collective = 'send' THEN k.rank || '>' || peer_rank ELSE peer_rank || '>' || k.rank END || '#'
             || row_number() OVER (PARTITION BY k.rank, collective, peer_rank, grp ORDER BY k.start_ns, k.kernel_id)
           WHEN rule.r = 'pg_seq' THEN grp || '#' || seq
           WHEN rule.r = 'group_order' THEN grp || '/' || collective || '#'
             || row_number() OVER (PARTITION BY k.rank, grp, collective ORDER BY k.start_ns, k.kernel_id)
           ELSE '#' || row_number() OVER (PARTITION BY k.rank, is_pair ORDER BY k.start_ns, k.kernel_id) END AS instance_key
  FROM k, rule
)
SELECT match_rule, instance_key, kernel_id, rank, collective, grp AS pg_name, seq, msg_bytes, group_size,
       src_rank, dst_rank, start_ns, end_ns
FROM keyed
WHERE match_rule IN ('rank_order', 'p2p_pair') OR collective NOT IN ('send', 'recv');

-- @macro host_clock_offsets
-- Clock offset of each host against the host of the lowest rank (the reference, offset 0). Ranks on one host
-- share a clock (ranks.host; ranks whose host is unknown are taken to share one clock). Every rank leaves a
-- collective at nearly the same instant (the last data arrives everywhere at once), so for each collective instance
-- run on both hosts, the difference between the hosts' median end times estimates the offset; offset_ns is the
-- median of those differences over instances. Subtracting offset_ns from a host's times puts it on the reference
-- clock (the matched views do this). Uncertainty: spread_ns is the spread of the per-instance estimates (it
-- includes real end-time differences between ranks, a few µs in rings), uncertainty_ns a 95 % bound on the
-- median's error. A host sharing no collective with the reference keeps offset_ns NULL and is not shifted.
-- @column host: Host name (NULL: ranks of unknown host).
-- @column ranks: Ranks on the host.
-- @column is_reference: True for the host of the lowest rank.
-- @column instances: Collective instances shared with the reference host that the estimate uses.
-- @column offset_ns: Host clock − reference clock (ns); 0 for the reference, NULL when no shared instance.
-- @column spread_ns: 90th − 10th percentile of the per-instance estimates (ns).
-- @column uncertainty_ns: 95 % confidence half-width of offset_ns, 1.96 × 1.2533 × 1.4826 × MAD / √instances (ns).
CREATE OR REPLACE MACRO host_clock_offsets() AS TABLE
WITH r AS (SELECT rank, coalesce(host, '') AS h FROM ranks),
ref AS (SELECT arg_min(h, rank) AS h FROM r),
multi AS (SELECT count(DISTINCT h) > 1 AS yes FROM r),
he AS (  -- median end per (instance, host); only when the job spans hosts
  SELECT c.instance_key, r.h, quantile_disc(c.end_ns, 0.5) AS end_ns
  FROM _skew_comm_keys c JOIN r USING (rank)
  WHERE c.match_rule <> 'p2p_pair' AND (SELECT yes FROM multi)
  GROUP BY c.instance_key, r.h
), d AS (
  SELECT he.h, he.end_ns - b.end_ns AS diff_ns
  FROM he JOIN he b ON b.instance_key = he.instance_key AND b.h = (SELECT h FROM ref)
  WHERE he.h <> (SELECT h FROM ref)
), med AS (SELECT h, count(*) AS n, quantile_disc(diff_ns, 0.5) AS off FROM d GROUP BY h),
est AS (
  SELECT d.h, any_value(med.n) AS n, any_value(med.off) AS off,
         quantile_cont(d.diff_ns, 0.9) - quantile_cont(d.diff_ns, 0.1) AS spread,
         quantile_cont(abs(d.diff_ns - med.off), 0.5) AS mad
  FROM d JOIN med USING (h) GROUP BY d.h
), hosts AS (SELECT h, count(*) AS ranks FROM r GROUP BY h)
SELECT nullif(hosts.h, '') AS host, hosts.ranks, hosts.h = (SELECT h FROM ref) AS is_reference,
       coalesce(est.n, 0) AS instances,
       CASE WHEN hosts.h = (SELECT h FROM ref) THEN 0 ELSE est.off END::BIGINT AS offset_ns,
       CASE WHEN hosts.h = (SELECT h FROM ref) THEN 0 ELSE round(est.spread) END::BIGINT AS spread_ns,
       CASE WHEN hosts.h = (SELECT h FROM ref) THEN 0
            ELSE round(1.96 * 1.2533 * 1.4826 * est.mad / sqrt(est.n)) END::BIGINT AS uncertainty_ns
FROM hosts LEFT JOIN est USING (h)
ORDER BY is_reference DESC, host NULLS FIRST;

-- @view _skew_ops
-- Matched communication kernels (_skew_comm_keys) on the reference clock: times minus their host's offset.
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column instance_key: Key shared by the same operation on every rank.
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective ('unknown' when no comm_ops row).
-- @column pg_name: Group, when known.
-- @column seq: Sequence number, when known.
-- @column msg_bytes: Size S, when known (bytes).
-- @column group_size: Group size, when known.
-- @column src_rank: p2p: sending rank, else NULL.
-- @column dst_rank: p2p: receiving rank, else NULL.
-- @column clock_offset_ns: Offset subtracted from this rank's times (host_clock_offsets; 0 when not estimated).
-- @column start_ns: Kernel start on the reference clock (ns).
-- @column end_ns: Kernel end on the reference clock (ns).
CREATE OR REPLACE VIEW _skew_ops AS
WITH off AS (
  SELECT r.rank, coalesce(o.offset_ns, 0) AS off
  FROM ranks r LEFT JOIN host_clock_offsets() o ON coalesce(o.host, '') = coalesce(r.host, '')
)
SELECT c.match_rule, c.instance_key, c.kernel_id, c.rank, c.collective, c.pg_name, c.seq, c.msg_bytes,
       c.group_size, c.src_rank, c.dst_rank, coalesce(off.off, 0) AS clock_offset_ns,
       c.start_ns - coalesce(off.off, 0) AS start_ns, c.end_ns - coalesce(off.off, 0) AS end_ns
FROM _skew_comm_keys c LEFT JOIN off USING (rank);

-- @view _skew_comm_instances
-- One row per matched instance (collective or p2p) with its transfer time and waits (definitions in this file's
-- header). transfer_ns is NULL when the instance was seen on one rank only, except in a single-rank job, where
-- it is the kernel duration (transfer_source says which).
-- @column instance_key: Matching key.
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column kind: 'collective' or 'p2p'.
-- @column collective: Collective (the most common name across ranks, ties: the first in name order); 'p2p' for a matched
-- send/recv pair.
-- @column pg_name: Group, when known.
-- @column seq: Sequence number, when known (the lowest across ranks: a p2p pair's send and recv number apart).
-- @column msg_bytes: Largest size S reported across ranks (bytes), when known.
-- @column group_size: Group size when known, else the ranks that ran it (2 for p2p).
-- @column src_rank: p2p: sending rank.
-- @column dst_rank: p2p: receiving rank.
-- @column ranks_seen: Ranks that ran this instance.
-- @column first_start_ns: Earliest start (ns).
-- @column last_start_ns: Latest start (ns).
-- @column latency_ns: Minimum kernel duration across ranks (TraceLens comm latency, ns).
-- @column max_duration_ns: Maximum kernel duration across ranks (ns).
-- @column end_skew_ns: Latest end − earliest end (ns).
-- @column last_arriving_rank: Rank with the latest start (lowest such rank on ties).
-- @column first_arriving_rank: Rank with the earliest start (lowest such rank on ties).
-- @column transfer_ns: Transfer time without waiting (ns), see transfer_source.
-- @column transfer_source: 'matched' (across ranks), 'kernel_duration' (single-rank job) or 'unmatched' (NULL transfer).
-- @column rank_wait_ns: Per rank wait, a list of {rank, wait_ns} sorted by rank (ns).
CREATE OR REPLACE VIEW _skew_comm_instances AS
WITH g AS (
  SELECT instance_key, any_value(match_rule) AS match_rule, _prelude_most_common(histogram(collective)) AS collective,
         any_value(pg_name) AS pg_name, min(seq) AS seq, max(msg_bytes) AS msg_bytes,
         max(group_size) AS group_size, any_value(src_rank) AS src_rank, any_value(dst_rank) AS dst_rank,
         count(DISTINCT rank) AS ranks_seen, count(*) FILTER (WHERE collective = 'recv') AS recvs,
         count(*) FILTER (WHERE collective = 'send') AS sends,
         min(start_ns) AS first_start_ns, max(start_ns) AS last_start_ns,
         min(end_ns - start_ns) AS latency_ns, max(end_ns - start_ns) AS max_duration_ns,
         max(end_ns) - min(end_ns) AS end_skew_ns,
         arg_min(rank, (-start_ns, rank)) AS last_arriving_rank,
         arg_min(rank, (start_ns, rank)) AS first_arriving_rank,
         arg_min(end_ns, (-start_ns, rank)) AS last_arriver_end_ns,
         max(end_ns) FILTER (WHERE collective = 'recv') AS recv_end_ns,
         list((rank, start_ns) ORDER BY rank) AS rs
  FROM _skew_ops GROUP BY instance_key
), job AS (SELECT count(*) AS n FROM ranks)
SELECT instance_key, match_rule, CASE WHEN match_rule = 'p2p_pair' THEN 'p2p' ELSE 'collective' END AS kind,
       CASE WHEN match_rule = 'p2p_pair' THEN 'p2p' ELSE collective END AS collective, pg_name, seq, msg_bytes,
       CASE WHEN match_rule = 'p2p_pair' THEN 2 ELSE coalesce(group_size, ranks_seen) END::INTEGER AS group_size,
       src_rank, dst_rank, ranks_seen, first_start_ns, last_start_ns, latency_ns, max_duration_ns, end_skew_ns,
       last_arriving_rank, first_arriving_rank,
       CASE WHEN match_rule = 'p2p_pair' AND sends = 1 AND recvs = 1 THEN greatest(recv_end_ns - last_start_ns, 0)
            WHEN match_rule <> 'p2p_pair' AND ranks_seen >= 2 THEN greatest(last_arriver_end_ns - last_start_ns, 0)
            WHEN (SELECT n FROM job) = 1 THEN max_duration_ns END AS transfer_ns,
       CASE WHEN match_rule = 'p2p_pair' AND sends = 1 AND recvs = 1 THEN 'matched'
            WHEN match_rule <> 'p2p_pair' AND ranks_seen >= 2 THEN 'matched'
            WHEN (SELECT n FROM job) = 1 THEN 'kernel_duration' ELSE 'unmatched' END AS transfer_source,
       list_transform(rs, lambda x: {'rank': x[1], 'wait_ns': last_start_ns - x[2]}) AS rank_wait_ns
FROM g, job;

-- @view _skew_kernel_waits
-- Each matched communication kernel's wait: the one definition of "waiting for the last rank", used by rank_wait
-- and the exposure causes. Instances seen on >= 2 ranks only; p2p pairs included (match_rule 'p2p_pair'). The
-- latest start and the arriving ranks are the instance's (_skew_comm_instances, a stored sweep): the wait
-- re-aggregated _skew_ops for them, most of rank_wait's time.
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column instance_key: Matching key.
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column wait_ns: Latest start in the instance − this kernel's start (ns, reference clock).
-- @column dur_ns: Kernel duration (ns).
-- @column last_arriving_rank: Rank with the latest start (lowest such rank on ties).
-- @column first_arriving_rank: Rank with the earliest start (lowest such rank on ties).
CREATE OR REPLACE VIEW _skew_kernel_waits AS
SELECT o.kernel_id, o.rank, o.instance_key, o.match_rule, i.last_start_ns - o.start_ns AS wait_ns,
       o.end_ns - o.start_ns AS dur_ns, i.last_arriving_rank, i.first_arriving_rank
FROM _skew_ops o JOIN _skew_comm_instances i USING (instance_key)
WHERE i.ranks_seen >= 2;

-- @macro collective_skew
-- One row per collective instance matched across ranks (matching rule in the description of queries/skew;
-- point-to-point pairs are in comm_transfer): how many ranks ran it, its latency (minimum duration across ranks,
-- as TraceLens), its transfer time (end of the last-arriving rank − latest start), start and end skew, the
-- last-arriving rank, and each rank's wait (latest start − that rank's start). Times are on the reference clock
-- (host_clock_offsets). Instances seen on one rank only are kept; their skew,
-- arrival ranks and waits are NULL (nothing to compare with).
-- @column instance_key: Matching key (e.g. '0#17' = pg '0' seq 17; '#3' = 3rd comm kernel of every rank).
-- @column match_rule: 'pg_seq', 'group_order' or 'rank_order'.
-- @column collective: Collective (the most common name across ranks).
-- @column pg_name: Group, when known.
-- @column seq: Sequence number, when known.
-- @column msg_bytes: Largest size S reported across ranks (bytes), when known.
-- @column ranks_seen: Ranks that ran this instance.
-- @column first_start_ns: Earliest start (ns).
-- @column last_start_ns: Latest start (ns).
-- @column latency_ns: Minimum kernel duration across ranks (ns).
-- @column max_duration_ns: Maximum kernel duration across ranks (ns).
-- @column transfer_ns: End of the last-arriving rank − latest start (ns); NULL when seen on one rank of several.
-- @column start_skew_ns: last_start_ns − first_start_ns (ns); NULL when ranks_seen < 2.
-- @column end_skew_ns: Latest end − earliest end (ns); NULL when ranks_seen < 2.
-- @column last_arriving_rank: Rank with the latest start (lowest such rank on ties); NULL when ranks_seen < 2.
-- @column first_arriving_rank: Rank with the earliest start (lowest such rank on ties); NULL when ranks_seen < 2.
-- @column rank_wait_ns: Per rank wait, a list of {rank, wait_ns} sorted by rank (ns); NULL when ranks_seen < 2.
CREATE OR REPLACE MACRO collective_skew() AS TABLE
SELECT instance_key, match_rule, collective, pg_name, seq, msg_bytes, ranks_seen, first_start_ns, last_start_ns,
       latency_ns, max_duration_ns, transfer_ns,
       CASE WHEN ranks_seen >= 2 THEN last_start_ns - first_start_ns END AS start_skew_ns,
       CASE WHEN ranks_seen >= 2 THEN end_skew_ns END AS end_skew_ns,
       CASE WHEN ranks_seen >= 2 THEN last_arriving_rank END AS last_arriving_rank,
       CASE WHEN ranks_seen >= 2 THEN first_arriving_rank END AS first_arriving_rank,
       CASE WHEN ranks_seen >= 2 THEN rank_wait_ns END AS rank_wait_ns
FROM _skew_comm_instances
WHERE kind = 'collective'
ORDER BY first_start_ns, instance_key;

-- @macro rank_wait
-- Per rank over all matched collective instances seen on >= 2 ranks: total and mean wait (latest start − own
-- start), times it arrived last / first, and a straggler ranking (TraceLens: the rank with the lowest total wait is
-- the most likely straggler, straggler_rank_order 1). Point-to-point waits are in transfer_by_pair.
-- @column rank: Rank.
-- @column collectives: Matched instances the rank took part in.
-- @column total_wait_ns: Sum of waits (ns).
-- @column mean_wait_ns: Mean wait (ns, rounded).
-- @column max_wait_ns: Largest wait (ns).
-- @column times_arrived_last: Instances where the rank started last.
-- @column times_arrived_first: Instances where the rank started first.
-- @column arrived_last_pct: 100 × times_arrived_last / collectives.
-- @column total_comm_ns: Sum of the rank's kernel durations in those instances (ns).
-- @column straggler_rank_order: 1 = lowest total wait (most likely straggler), 2, ...
CREATE OR REPLACE MACRO rank_wait() AS TABLE
WITH w AS (
  SELECT rank, wait_ns, dur_ns, (rank = last_arriving_rank)::INT AS is_last, (rank = first_arriving_rank)::INT AS is_first
  FROM _skew_kernel_waits WHERE match_rule <> 'p2p_pair'
), r AS (
  SELECT rank, count(*) AS collectives, sum(wait_ns) AS total_wait_ns, avg(wait_ns) AS mean_wait,
         max(wait_ns) AS max_wait_ns, sum(is_last) AS times_arrived_last, sum(is_first) AS times_arrived_first,
         sum(dur_ns) AS total_comm_ns
  FROM w GROUP BY rank
)
SELECT rank, collectives, CAST(total_wait_ns AS BIGINT) AS total_wait_ns, CAST(round(mean_wait) AS BIGINT) AS mean_wait_ns,
       max_wait_ns, CAST(times_arrived_last AS BIGINT) AS times_arrived_last,
       CAST(times_arrived_first AS BIGINT) AS times_arrived_first,
       (100.0 * times_arrived_last / collectives)::DOUBLE AS arrived_last_pct,
       CAST(total_comm_ns AS BIGINT) AS total_comm_ns,
       row_number() OVER (ORDER BY total_wait_ns, rank) AS straggler_rank_order
FROM r
ORDER BY straggler_rank_order;
