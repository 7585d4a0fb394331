-- Cross-rank matching of communication operations: the one definition of "the same operation on every rank",
-- used by collective_skew, rank_wait, comm_transfer, the latency model and anything that compares ranks.
-- Collectives: matching rule chosen per process group (pg_name, else comm_id) from the data, the first that every
-- collective of the group, on every rank, supports:
--   'pg_seq'      every collective of the group records its seq: instance = (group, seq);
--   'group_order' the group is known but some seq is not: instance = (group, collective, k-th occurrence of that
--                 collective in that group on the rank, by start time);
--   'rank_order'  operations without a group, and communication kernels without a comm_ops row (TraceLens
--                 simplified mode): instance = k-th such kernel of the rank by start time.
-- Point-to-point ('p2p_pair'): a send or recv with a known peer, whatever the rule above: the k-th send from rank s
-- to rank d in a group matches the k-th recv on d from s in that group (NCCL delivers in order per pair).
-- send/recv without a known peer are matched only when they have no group ('rank_order'); with a group they are
-- left out (their sequence numbers are a separate p2p counter in c10d, and order within a group pairs sends with
-- sends).
-- Times are aligned across hosts first (host_clock_offsets). Transfer time = end of the rank that arrived last −
-- latest start (for p2p: recv end − latest start), never below 0; a rank's wait = latest start − its start.
-- Why not "earliest end − latest start": ring collectives end up to 7 µs apart on one host (fixtures/example), so
-- the earliest end understates the transfer that the last arriver, which waited for nobody, measured in full.
-- Self-checks (_skew_comm_instances): an instance is
--   complete ('group_complete') when seen on every rank of its group: ranks_seen >= the group size (comm_ops
--     group_size, else the length of pg_ranks, else the job's rank count: the larger of the ranks ingested and the
--     world size the traces report); a p2p pair when one send and one recv were seen;
--   consistent when its ranks agree on the collective (send/recv/send_recv count as one), on msg_bytes for the
--     collectives whose nccl-tests S is the same on every rank (all_reduce, all_gather, reduce_scatter, broadcast,
--     reduce), on the group (pg_name, group_size), is seen on no more ranks than its recorded group, and its end
--     skew is at most _skew_end_skew_bound_ns: every rank leaves a collective when the last data has arrived, a few
--     µs apart (7 µs in rings on one host, fixtures/example), so ends further apart than max(1 ms, the instance's
--     latency_ns) mean different operations were paired. 1 ms is 100× the ring spread and absorbs host clock
--     alignment error (host_clock_offsets' uncertainty is µs to tens of µs); the latency_ns term allows ranks of an
--     uneven all_to_all or a p2p pair to finish up to one transfer apart.
-- Only a complete and consistent instance gets a transfer time; inconsistent instances are left out of the skew
-- figures, the waits (so rank_wait and the exposure causes) and the clock alignment (labels only there: the end
-- skew needs the alignment first), and counted by diagnostics.

-- @macro _skew_end_skew_bound_ns
-- Largest end skew of a consistent instance (ns): max(1 ms, the instance's latency_ns); why in queries/skew.
-- @param latency_ns: The instance's minimum kernel duration (ns).
CREATE OR REPLACE MACRO _skew_end_skew_bound_ns(latency_ns) AS greatest(1000000, latency_ns);

-- @macro _skew_collective_family
-- The collective as the self-checks compare it: send, recv and send_recv are one family ('p2p'), since the ranks
-- of one point-to-point exchange name their side.
-- @param collective: Canonical collective.
CREATE OR REPLACE MACRO _skew_collective_family(collective) AS
  CASE WHEN collective IN ('send', 'recv', 'send_recv') THEN 'p2p' ELSE collective END;

-- @macro _skew_same_size_everywhere
-- True for the collectives whose nccl-tests size S is the same on every rank (comm_ops' size convention):
-- all_reduce, all_gather, reduce_scatter, broadcast, reduce. all_to_all, gather, scatter and p2p sizes differ per rank.
-- @param collective: Canonical collective.
CREATE OR REPLACE MACRO _skew_same_size_everywhere(collective) AS
  collective IN ('all_reduce', 'all_gather', 'reduce_scatter', 'broadcast', 'reduce');

-- @view _skew_comm_keys
-- @sweep cross_rank
-- Communication kernels with the instance key they are matched by (this file's header), on raw (per-host) clocks.
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column instance_key: Key shared by the same operation on every rank.
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective ('unknown' when no comm_ops row).
-- @column pg_name: Group (pg_name, else comm_id), when known.
-- @column seq: Sequence number, when known.
-- @column msg_bytes: Size S, when known (bytes).
-- @column group_size: Group size, when known: comm_ops.group_size, else the length of pg_ranks.
-- @column src_rank: p2p: sending rank, else NULL.
-- @column dst_rank: p2p: receiving rank, else NULL.
-- @column start_ns: Kernel start, raw (ns).
-- @column end_ns: Kernel end, raw (ns).
CREATE OR REPLACE VIEW _skew_comm_keys AS
WITH k AS (
  SELECT k.kernel_id, k.rank, k.start_ns, k.end_ns, coalesce(o.collective, 'unknown') AS collective,
         coalesce(o.pg_name, o.comm_id) AS grp, o.seq, o.msg_bytes,
         coalesce(o.group_size, len(o.pg_ranks))::INTEGER AS group_size, o.peer_rank,
         o.kernel_id IS NOT NULL AS has_op,
         coalesce(o.collective IN ('send', 'recv') AND o.peer_rank IS NOT NULL, false) AS is_pair
  FROM kernels k LEFT JOIN comm_ops o USING (kernel_id)
  WHERE k.kernel_class = 'communication'
), grp_rule AS (  -- per group, over every rank: does every collective record its seq?
  SELECT grp AS rule_grp, CASE WHEN bool_and(seq IS NOT NULL) THEN 'pg_seq' ELSE 'group_order' END AS r
  FROM k WHERE has_op AND grp IS NOT NULL AND collective NOT IN ('send', 'recv')
  GROUP BY grp
), ruled AS (
  SELECT k.*, CASE WHEN is_pair THEN 'p2p_pair'
                   WHEN collective IN ('send', 'recv') AND grp IS NOT NULL THEN NULL  -- peerless, grouped: left out
                   ELSE coalesce(g.r, 'rank_order') END AS match_rule
  FROM k LEFT JOIN grp_rule g ON g.rule_grp = k.grp AND k.has_op
), keyed AS (
  SELECT *,
         CASE WHEN collective = 'send' AND is_pair THEN rank WHEN is_pair THEN peer_rank END AS src_rank,
         CASE WHEN collective = 'recv' AND is_pair THEN rank WHEN is_pair THEN peer_rank END AS dst_rank,
         CASE
           WHEN is_pair THEN 'p2p:' || coalesce(grp, '') || ':'
             || CASE WHEN collective = 'send' THEN rank || '>' || peer_rank ELSE peer_rank || '>' || rank END || '#'
             || row_number() OVER (PARTITION BY rank, collective, peer_rank, grp, is_pair ORDER BY start_ns, kernel_id)
           WHEN match_rule = 'pg_seq' THEN grp || '#' || seq
           WHEN match_rule = 'group_order' THEN grp || '/' || collective || '#'
             || row_number() OVER (PARTITION BY rank, grp, collective, match_rule ORDER BY start_ns, kernel_id)
           ELSE '#' || row_number() OVER (PARTITION BY rank, match_rule ORDER BY start_ns, kernel_id) END AS instance_key
  FROM ruled WHERE match_rule IS NOT NULL
)
SELECT match_rule, instance_key, kernel_id, rank, collective, grp AS pg_name, seq, msg_bytes, group_size,
       src_rank, dst_rank, start_ns, end_ns
FROM keyed;

-- @macro host_clock_offsets
-- Clock offset of each host against the host of the lowest rank (the reference, offset 0). Ranks on one host
-- share a clock (ranks.host; ranks whose host is unknown are taken to share one clock). Every rank leaves a
-- collective at nearly the same instant (the last data arrives everywhere at once), so for each collective instance
-- run on both hosts, the difference between the hosts' median end times estimates the offset; offset_ns is the
-- median of those differences over instances (instances whose ranks disagree on collective, size or group are
-- left out, see the self-checks in queries/skew). Subtracting offset_ns from a host's times puts it on the reference
-- clock (the matched views do this). Uncertainty: spread_ns is the spread of the per-instance estimates (it
-- includes real end-time differences between ranks, a few µs in rings), uncertainty_ns a 95 % bound on the
-- median's error. A host sharing no collective with the reference keeps offset_ns NULL and is not shifted.
-- @column host [key]: Host name (NULL: ranks of unknown host).
-- @column ranks: Ranks on the host.
-- @column is_reference: True for the host of the lowest rank.
-- @column instances: Collective instances shared with the reference host that the estimate uses.
-- @column offset_ns [key]: Host clock − reference clock (ns); 0 for the reference, NULL when no shared instance.
-- @column spread_ns: 90th − 10th percentile of the per-instance estimates (ns).
-- @column uncertainty_ns [key]: 95 % confidence half-width of offset_ns, 1.96 × 1.2533 × 1.4826 × MAD / √instances (ns).
CREATE OR REPLACE MACRO host_clock_offsets() AS TABLE
WITH r AS (SELECT rank, coalesce(host, '') AS h FROM ranks),
ref AS (SELECT arg_min(h, rank) AS h FROM r),
multi AS (SELECT count(DISTINCT h) > 1 AS yes FROM r),
bad AS (  -- instances whose ranks disagree on labels (queries/skew header; the end skew needs these offsets)
  SELECT instance_key FROM _skew_comm_keys
  WHERE match_rule <> 'p2p_pair' AND (SELECT yes FROM multi)
  GROUP BY instance_key
  HAVING min(_skew_collective_family(collective)) FILTER (WHERE collective <> 'unknown')
           <> max(_skew_collective_family(collective)) FILTER (WHERE collective <> 'unknown')
      OR min(pg_name) <> max(pg_name) OR min(group_size) <> max(group_size)
      OR (min(msg_bytes) <> max(msg_bytes) AND bool_or(_skew_same_size_everywhere(collective)))
), he AS (  -- median end per (instance, host); only when the job spans hosts
  SELECT c.instance_key, r.h, quantile_disc(c.end_ns, 0.5) AS end_ns
  FROM _skew_comm_keys c JOIN r USING (rank)
  WHERE c.match_rule <> 'p2p_pair' AND (SELECT yes FROM multi) AND c.instance_key NOT IN (SELECT instance_key FROM bad)
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
-- @sweep cross_rank
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
-- @sweep cross_rank
-- One row per matched instance (collective or p2p) with its self-checks, transfer time and waits (definitions in
-- this file's header). transfer_ns is given only for an instance seen on every rank of its group whose ranks agree
-- (transfer_source 'matched'); otherwise it is NULL and transfer_source says why. A single-rank job never matches:
-- its kernel durations include waiting for the ranks it cannot see.
-- @column instance_key: Matching key.
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column kind: 'collective' or 'p2p'.
-- @column collective: Collective (the most common name across ranks, ties: the first in name order); 'p2p' for a matched
-- send/recv pair.
-- @column pg_name: Group, when known.
-- @column seq: Sequence number, when known (the lowest across ranks: a p2p pair's send and recv number apart).
-- @column msg_bytes: Largest size S reported across ranks (bytes), when known.
-- @column group_size: Ranks in the instance's group: the largest group_size recorded (comm_ops.group_size, else the
-- length of pg_ranks), else the job's rank count (max(ranks ingested, ranks.world_size)); 2 for p2p.
-- @column src_rank: p2p: sending rank.
-- @column dst_rank: p2p: receiving rank.
-- @column ranks_seen: Ranks that ran this instance.
-- @column group_complete: Seen on every rank of its group: ranks_seen >= group_size; p2p: one send and one recv.
-- @column consistent: The ranks agree on collective, size (where S is the same on every rank) and group, the
-- instance is seen on no more ranks than its recorded group, and its end skew is within _skew_end_skew_bound_ns
-- (queries/skew header). True when seen on one rank.
-- @column inconsistency: What the ranks disagree on ('; '-separated: 'collective A/B' (the first and last name in
-- name order), 'msg_bytes A..B', 'group', 'ranks_seen N > group_size M', 'end skew X us > Y us'); NULL when consistent.
-- @column first_start_ns: Earliest start (ns).
-- @column last_start_ns: Latest start (ns).
-- @column latency_ns: Minimum kernel duration across ranks (TraceLens comm latency, ns).
-- @column max_duration_ns: Maximum kernel duration across ranks (ns): in a single-rank job the kernel duration,
-- waiting included.
-- @column end_skew_ns: Latest end − earliest end (ns).
-- @column last_arriving_rank: Rank with the latest start (lowest such rank on ties).
-- @column first_arriving_rank: Rank with the earliest start (lowest such rank on ties).
-- @column transfer_ns: Transfer time without waiting (ns): collective: end of the last-arriving rank − latest start;
-- p2p: recv end − latest start; never below 0. NULL unless transfer_source = 'matched'.
-- @column transfer_source: 'matched' (group_complete and consistent), 'inconsistent' (ranks disagree), 'partial_group'
-- (seen on >= 2 ranks, not all of its group), 'unmatched' (one rank of several) or 'single_rank' (the job holds one
-- rank: its kernel durations include waiting and are no transfer time).
-- @column rank_wait_ns: Per rank wait, a list of {rank, wait_ns} sorted by rank (ns).
CREATE OR REPLACE VIEW _skew_comm_instances AS
WITH g AS (
  SELECT instance_key, any_value(match_rule) AS match_rule, _prelude_most_common(histogram(collective)) AS collective,
         any_value(pg_name) AS pg_name, min(seq) AS seq, min(msg_bytes) AS min_bytes, max(msg_bytes) AS msg_bytes,
         max(group_size) AS rec_group_size, any_value(src_rank) AS src_rank, any_value(dst_rank) AS dst_rank,
         count(DISTINCT rank) AS ranks_seen, count(*) FILTER (WHERE collective = 'recv') AS recvs,
         count(*) FILTER (WHERE collective = 'send') AS sends,
         -- disagreement as min <> max: far cheaper than DISTINCT aggregates over every instance
         min(_skew_collective_family(collective)) FILTER (WHERE collective <> 'unknown') AS fam_lo,
         max(_skew_collective_family(collective)) FILTER (WHERE collective <> 'unknown') AS fam_hi,
         min(collective) FILTER (WHERE collective <> 'unknown') AS coll_lo,
         max(collective) FILTER (WHERE collective <> 'unknown') AS coll_hi,
         min(pg_name) <> max(pg_name) OR min(group_size) <> max(group_size) AS group_differs,
         min(start_ns) AS first_start_ns, max(start_ns) AS last_start_ns,
         min(end_ns - start_ns) AS latency_ns, max(end_ns - start_ns) AS max_duration_ns,
         max(end_ns) - min(end_ns) AS end_skew_ns,
         arg_min(rank, (-start_ns, rank)) AS last_arriving_rank,
         arg_min(rank, (start_ns, rank)) AS first_arriving_rank,
         arg_min(end_ns, (-start_ns, rank)) AS last_arriver_end_ns,
         max(end_ns) FILTER (WHERE collective = 'recv') AS recv_end_ns,
         list((rank, start_ns) ORDER BY rank) AS rs
  FROM _skew_ops GROUP BY instance_key
), job AS (SELECT count(*) AS n, greatest(count(*), coalesce(max(world_size), 0)) AS ranks FROM ranks
), c AS (
  SELECT g.*, match_rule = 'p2p_pair' AS is_p2p,
         CASE WHEN match_rule = 'p2p_pair' THEN 2 ELSE coalesce(rec_group_size, job.ranks) END AS req_size,
         nullif(concat_ws('; ',
           CASE WHEN fam_lo <> fam_hi THEN 'collective ' || coll_lo || '/' || coll_hi END,
           CASE WHEN min_bytes <> msg_bytes AND _skew_same_size_everywhere(collective)
                THEN 'msg_bytes ' || min_bytes || '..' || msg_bytes END,
           CASE WHEN group_differs THEN 'group' END,
           CASE WHEN match_rule <> 'p2p_pair' AND ranks_seen > rec_group_size
                THEN 'ranks_seen ' || ranks_seen || ' > group_size ' || rec_group_size END,
           CASE WHEN end_skew_ns > _skew_end_skew_bound_ns(latency_ns)
                THEN printf('end skew %.1f us > %.1f us', end_skew_ns / 1e3, _skew_end_skew_bound_ns(latency_ns) / 1e3)
                END), '') AS inconsistency,
         job.n AS job_ranks
  FROM g, job
), d AS (
  SELECT c.*, CASE WHEN is_p2p THEN sends = 1 AND recvs = 1 ELSE ranks_seen >= req_size END AS group_complete,
         inconsistency IS NULL AS consistent
  FROM c
), e AS (
  SELECT d.*, CASE WHEN job_ranks = 1 THEN 'single_rank'
                   WHEN ranks_seen < 2 THEN 'unmatched'
                   WHEN NOT consistent THEN 'inconsistent'
                   WHEN NOT group_complete THEN 'partial_group'
                   ELSE 'matched' END AS transfer_source
  FROM d
)
SELECT instance_key, match_rule, CASE WHEN is_p2p THEN 'p2p' ELSE 'collective' END AS kind,
       CASE WHEN is_p2p THEN 'p2p' ELSE collective END AS collective, pg_name, seq, msg_bytes,
       req_size::INTEGER AS group_size, src_rank, dst_rank, ranks_seen, group_complete, consistent, inconsistency,
       first_start_ns, last_start_ns, latency_ns, max_duration_ns, end_skew_ns, last_arriving_rank, first_arriving_rank,
       CASE WHEN transfer_source <> 'matched' THEN NULL
            WHEN is_p2p THEN greatest(recv_end_ns - last_start_ns, 0)
            ELSE greatest(last_arriver_end_ns - last_start_ns, 0) END AS transfer_ns,
       transfer_source,
       list_transform(rs, lambda x: {'rank': x[1], 'wait_ns': last_start_ns - x[2]}) AS rank_wait_ns
FROM e;

-- @view _skew_kernel_waits
-- Each matched communication kernel's wait: the one definition of "waiting for the last rank", used by rank_wait
-- and the exposure causes. Consistent instances seen on >= 2 ranks only (partial groups included: their waits are
-- real, among the ranks seen); p2p pairs included (match_rule 'p2p_pair'). The latest start and the arriving ranks
-- are the instance's (_skew_comm_instances, a stored sweep): the wait re-aggregated _skew_ops for them, most of
-- rank_wait's time.
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column instance_key: Matching key.
-- @column match_rule: 'pg_seq', 'group_order', 'rank_order' or 'p2p_pair'.
-- @column ranks_seen: Ranks that ran the instance.
-- @column wait_ns: Latest start in the instance − this kernel's start (ns, reference clock).
-- @column dur_ns: Kernel duration (ns).
-- @column last_arriving_rank: Rank with the latest start (lowest such rank on ties).
-- @column first_arriving_rank: Rank with the earliest start (lowest such rank on ties).
CREATE OR REPLACE VIEW _skew_kernel_waits AS
SELECT o.kernel_id, o.rank, o.instance_key, o.match_rule, i.ranks_seen, i.last_start_ns - o.start_ns AS wait_ns,
       o.end_ns - o.start_ns AS dur_ns, i.last_arriving_rank, i.first_arriving_rank
FROM _skew_ops o JOIN _skew_comm_instances i USING (instance_key)
WHERE i.ranks_seen >= 2 AND i.consistent;

-- @macro collective_skew
-- One row per collective instance matched across ranks (matching rule in the description of queries/skew;
-- point-to-point pairs are in comm_transfer): how many ranks ran it, its self-checks, its latency (minimum duration
-- across ranks, as TraceLens), its transfer time (end of the last-arriving rank − latest start), start and end
-- skew, the last-arriving rank, and each rank's wait (latest start − that rank's start). Times are on the reference
-- clock (host_clock_offsets). Instances seen on one rank only, and instances whose ranks disagree (consistent =
-- false: different operations were paired), are kept; their skew, arrival ranks and waits are NULL.
-- @column instance_key: Matching key (e.g. '0#17' = pg '0' seq 17; '#3' = 3rd comm kernel of every rank).
-- @column match_rule: 'pg_seq', 'group_order' or 'rank_order'.
-- @column collective [key]: Collective (the most common name across ranks).
-- @column pg_name: Group, when known.
-- @column seq [key]: Sequence number, when known.
-- @column msg_bytes [key]: Largest size S reported across ranks (bytes), when known.
-- @column ranks_seen: Ranks that ran this instance.
-- @column group_size: Ranks in the instance's group (_skew_comm_instances).
-- @column group_complete: Seen on every rank of its group.
-- @column consistent: The ranks agree (queries/skew header); false: the row's skew figures are NULL.
-- @column inconsistency: What the ranks disagree on; NULL when consistent.
-- @column first_start_ns: Earliest start (ns).
-- @column last_start_ns: Latest start (ns).
-- @column latency_ns: Minimum kernel duration across ranks (ns).
-- @column max_duration_ns: Maximum kernel duration across ranks (ns).
-- @column transfer_ns [key]: End of the last-arriving rank − latest start (ns); NULL unless transfer_source = 'matched'.
-- @column transfer_source: 'matched', 'inconsistent', 'partial_group', 'unmatched' or 'single_rank' (_skew_comm_instances).
-- @column start_skew_ns [key]: last_start_ns − first_start_ns (ns); NULL when ranks_seen < 2 or not consistent.
-- @column end_skew_ns: Latest end − earliest end (ns); NULL when ranks_seen < 2 or not consistent.
-- @column last_arriving_rank [key]: Rank with the latest start (lowest such rank on ties); NULL when ranks_seen < 2 or
-- not consistent.
-- @column first_arriving_rank: Rank with the earliest start (lowest such rank on ties); NULL when ranks_seen < 2 or
-- not consistent.
-- @column rank_wait_ns: Per rank wait, a list of {rank, wait_ns} sorted by rank (ns); NULL when ranks_seen < 2 or not
-- consistent.
CREATE OR REPLACE MACRO collective_skew() AS TABLE
SELECT instance_key, match_rule, collective, pg_name, seq, msg_bytes, ranks_seen, group_size, group_complete,
       consistent, inconsistency, first_start_ns, last_start_ns, latency_ns, max_duration_ns, transfer_ns,
       transfer_source,
       CASE WHEN ranks_seen >= 2 AND consistent THEN last_start_ns - first_start_ns END AS start_skew_ns,
       CASE WHEN ranks_seen >= 2 AND consistent THEN end_skew_ns END AS end_skew_ns,
       CASE WHEN ranks_seen >= 2 AND consistent THEN last_arriving_rank END AS last_arriving_rank,
       CASE WHEN ranks_seen >= 2 AND consistent THEN first_arriving_rank END AS first_arriving_rank,
       CASE WHEN ranks_seen >= 2 AND consistent THEN rank_wait_ns END AS rank_wait_ns
FROM _skew_comm_instances
WHERE kind = 'collective'
ORDER BY first_start_ns, instance_key;

-- @macro rank_wait
-- Per rank over the consistent collective instances seen on >= 2 ranks (_skew_kernel_waits): total and mean wait
-- (latest start − own start), times it arrived last / first, a straggler ranking (TraceLens: the rank with the
-- lowest total wait is the most likely straggler, straggler_rank_order 1) and the straggler rule, the one used by
-- the summary, the report and diff. A rank is a straggler when it arrives last significantly more often than
-- chance: under "every rank of an instance is equally likely to start last" the number of instances a rank starts
-- last is Poisson-binomial with p_i = 1 / ranks_seen_i; it is tested one-sided against the binomial with the mean p
-- (whose tail is heavier, so the test is conservative), P(X >= times_arrived_last), summed exactly from lgamma
-- terms. All ranks are tested, so the p-value is Bonferroni-adjusted (× the ranks tested, at most 1); a straggler
-- needs an adjusted p-value below 0.01 and a share of last arrivals above the chance share. Ties in start time go
-- to the lowest rank (as last_arriving_rank). Point-to-point waits are in transfer_by_pair.
-- @column rank [key]: Rank.
-- @column collectives: Matched instances the rank took part in.
-- @column total_wait_ns [key]: Sum of waits (ns).
-- @column mean_wait_ns: Mean wait (ns, rounded).
-- @column max_wait_ns: Largest wait (ns).
-- @column times_arrived_last: Instances where the rank started last.
-- @column times_arrived_first: Instances where the rank started first.
-- @column arrived_last_pct [key]: 100 × times_arrived_last / collectives.
-- @column chance_last_pct: 100 × the mean over the rank's instances of 1 / ranks_seen: the share of last arrivals
-- expected by chance.
-- @column arrived_last_p_value: Bonferroni-adjusted one-sided binomial p-value of arriving last times_arrived_last
-- times or more by chance: min(1, ranks tested × P(X >= times_arrived_last)), X ~ Binomial(collectives,
-- chance_last_pct / 100).
-- @column is_straggler [key]: arrived_last_p_value < 0.01 and arrived_last_pct > chance_last_pct.
-- @column total_comm_ns: Sum of the rank's kernel durations in those instances (ns).
-- @column straggler_rank_order: 1 = lowest total wait (most likely straggler, TraceLens' ranking), 2, ...
CREATE OR REPLACE MACRO rank_wait() AS TABLE
WITH w AS (
  SELECT rank, wait_ns, dur_ns, 1.0 / ranks_seen AS p_last, (rank = last_arriving_rank)::INT AS is_last,
         (rank = first_arriving_rank)::INT AS is_first
  FROM _skew_kernel_waits WHERE match_rule <> 'p2p_pair'
), r AS MATERIALIZED (  -- read twice below: aggregate the waits once
  SELECT rank, count(*) AS collectives, sum(wait_ns) AS total_wait_ns, avg(wait_ns) AS mean_wait,
         max(wait_ns) AS max_wait_ns, sum(is_last) AS times_arrived_last, sum(is_first) AS times_arrived_first,
         sum(dur_ns) AS total_comm_ns, avg(p_last) AS p
  FROM w GROUP BY rank
), span AS (  -- sum the smaller tail: its terms beyond 40 sd + 50 of its start are below 1e-300 of the sum
  SELECT rank, collectives::BIGINT AS n, times_arrived_last::BIGINT AS k, p,
         times_arrived_last > collectives * p AS upper, (ceil(40 * sqrt(collectives * p * (1 - p))) + 50)::BIGINT AS width
  FROM r
), terms AS (
  SELECT s.rank, s.upper,
         exp(lgamma(s.n + 1) - lgamma(j + 1) - lgamma(s.n - j + 1) + j * ln(s.p) + (s.n - j) * ln(1 - s.p)) AS t
  FROM span s, LATERAL (SELECT unnest(CASE WHEN s.upper THEN range(s.k, least(s.n, s.k + s.width) + 1)
                                           ELSE range(greatest(0, s.k - s.width), s.k) END) AS j)
), tail AS (
  SELECT rank, CASE WHEN any_value(upper) THEN sum(t) ELSE 1 - sum(t) END AS p_tail FROM terms GROUP BY rank
), pv AS (
  SELECT r.*, least(1.0, greatest(0.0, coalesce(tail.p_tail, 1.0)) * count(*) OVER ()) AS p_value
  FROM r LEFT JOIN tail USING (rank)
)
SELECT rank, collectives, CAST(total_wait_ns AS BIGINT) AS total_wait_ns, CAST(round(mean_wait) AS BIGINT) AS mean_wait_ns,
       max_wait_ns, CAST(times_arrived_last AS BIGINT) AS times_arrived_last,
       CAST(times_arrived_first AS BIGINT) AS times_arrived_first,
       (100.0 * times_arrived_last / collectives)::DOUBLE AS arrived_last_pct,
       (100.0 * p)::DOUBLE AS chance_last_pct, p_value::DOUBLE AS arrived_last_p_value,
       p_value < 0.01 AND times_arrived_last > collectives * p AS is_straggler,
       CAST(total_comm_ns AS BIGINT) AS total_comm_ns,
       row_number() OVER (ORDER BY total_wait_ns, rank) AS straggler_rank_order
FROM pv
ORDER BY straggler_rank_order;
