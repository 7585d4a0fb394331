-- Cross-rank matching of collectives: arrival skew, latency and stragglers (TraceLens NcclAnalyser definitions).
-- Matching rule, chosen once per job from the data (the first that every matched operation supports):
--   'pg_seq'      every comm op has pg_name and seq: instance = (pg_name, seq);
--   'group_order' every comm op has pg_name or comm_id: instance = (group, collective, k-th occurrence of that
--                 collective in that group on the rank, by start time);
--   'rank_order'  otherwise (TraceLens simplified mode): instance = k-th communication kernel of the rank by start
--                 time, over all communication kernels (comm_ops or not).
-- send/recv are point-to-point and never wait for the whole group, so they are matched only under 'rank_order'.
-- latency = minimum kernel duration across ranks (the transfer time without waiting); a rank's wait =
-- latest start − its start; the rank that arrives last (latest start; lowest rank on ties) waits least.

-- @view _skew_ops
-- Communication kernels with the instance key they are matched by (see this file's header).
-- @column match_rule: 'pg_seq', 'group_order' or 'rank_order'.
-- @column instance_key: Key shared by the same collective on every rank.
-- @column kernel_id: Kernel id.
-- @column rank: Rank.
-- @column collective: Canonical collective ('unknown' when no comm_ops row).
-- @column pg_name: Group, when known.
-- @column seq: Sequence number, when known.
-- @column msg_bytes: Size S, when known (bytes).
-- @column start_ns: Kernel start (ns).
-- @column end_ns: Kernel end (ns).
CREATE OR REPLACE VIEW _skew_ops AS
WITH k AS (
  SELECT k.kernel_id, k.rank, k.start_ns, k.end_ns, coalesce(o.collective, 'unknown') AS collective,
         coalesce(o.pg_name, o.comm_id) AS grp, o.seq, o.msg_bytes, o.kernel_id IS NOT NULL AS has_op
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
  SELECT k.*, rule.r AS match_rule,
         CASE rule.r
           WHEN 'pg_seq' THEN grp || '#' || seq
           WHEN 'group_order' THEN grp || '/' || collective || '#'
             || row_number() OVER (PARTITION BY k.rank, grp, collective ORDER BY k.start_ns, k.kernel_id)
           ELSE '#' || row_number() OVER (PARTITION BY k.rank ORDER BY k.start_ns, k.kernel_id) END AS instance_key
  FROM k, rule
)
SELECT match_rule, instance_key, kernel_id, rank, collective, grp AS pg_name, seq, msg_bytes, start_ns, end_ns
FROM keyed
WHERE match_rule = 'rank_order' OR collective NOT IN ('send', 'recv');

-- @macro collective_skew
-- One row per collective instance matched across ranks (matching rule in the description of queries/skew):
-- how many ranks ran it, its latency (minimum duration across ranks), start and end skew, the last-arriving rank,
-- and each rank's wait (latest start − that rank's start). Instances seen on one rank only are kept with zero skew.
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
-- @column start_skew_ns: last_start_ns − first_start_ns (ns).
-- @column end_skew_ns: Latest end − earliest end (ns).
-- @column last_arriving_rank: Rank with the latest start (lowest such rank on ties).
-- @column first_arriving_rank: Rank with the earliest start (lowest such rank on ties).
-- @column rank_wait_ns: Per rank wait, a list of {rank, wait_ns} sorted by rank (ns).
CREATE OR REPLACE MACRO collective_skew() AS TABLE
WITH g AS (
  SELECT instance_key, any_value(match_rule) AS match_rule, mode(collective) AS collective,
         any_value(pg_name) AS pg_name, any_value(seq) AS seq, max(msg_bytes) AS msg_bytes,
         count(DISTINCT rank) AS ranks_seen,
         min(start_ns) AS first_start_ns, max(start_ns) AS last_start_ns,
         min(end_ns - start_ns) AS latency_ns, max(end_ns - start_ns) AS max_duration_ns,
         max(end_ns) - min(end_ns) AS end_skew_ns,
         arg_min(rank, (-start_ns, rank)) AS last_arriving_rank,
         arg_min(rank, (start_ns, rank)) AS first_arriving_rank,
         list((rank, start_ns) ORDER BY rank) AS rs
  FROM _skew_ops GROUP BY instance_key
)
SELECT instance_key, match_rule, collective, pg_name, seq, msg_bytes, ranks_seen, first_start_ns, last_start_ns,
       latency_ns, max_duration_ns, last_start_ns - first_start_ns AS start_skew_ns, end_skew_ns,
       last_arriving_rank, first_arriving_rank,
       list_transform(rs, lambda x: {'rank': x[1], 'wait_ns': last_start_ns - x[2]}) AS rank_wait_ns
FROM g
ORDER BY first_start_ns, instance_key;

-- @macro rank_wait
-- Per rank over all matched instances seen on >= 2 ranks: total and mean wait (latest start − own start), times
-- it arrived last / first, and a straggler ranking (TraceLens: the rank with the lowest total wait is the most
-- likely straggler, straggler_rank_order 1).
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
WITH o AS (SELECT * FROM _skew_ops),
i AS (
  SELECT instance_key, max(start_ns) AS last_start, arg_min(rank, (-start_ns, rank)) AS last_rank,
         arg_min(rank, (start_ns, rank)) AS first_rank
  FROM o GROUP BY instance_key HAVING count(DISTINCT rank) >= 2
), w AS (
  SELECT o.rank, i.last_start - o.start_ns AS wait_ns, o.end_ns - o.start_ns AS dur_ns,
         (o.rank = i.last_rank)::INT AS is_last, (o.rank = i.first_rank)::INT AS is_first
  FROM o JOIN i USING (instance_key)
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
