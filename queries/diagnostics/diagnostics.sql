-- @include skew/skew.sql
-- @include overlap/timeline.sql
-- What the analyses cannot see, and why: importer notes plus checks on the canonical tables.

-- @macro diagnostics
-- One row per problem or notable absence: the importers' ingest_notes, then checks — no trace ingested, no
-- kernels, no communication kernels (job or rank), one rank only (no cross-rank skew), missing ranks of the world,
-- communication without message sizes (per rank; 'no_sized_comm' once when no operation of the job has one:
-- no histogram / bandwidth / p2p rows for them), without group size (no
-- busbw), no steps (overlap_by_step empty), no p2p, p2p fit impossible (fewer than two sizes), instances whose
-- ranks disagree (inconsistent_instances: "k of n instances disagree across ranks", n = instances seen on >= 2
-- ranks), and the collective matching rule in use. Every analysis still runs; this says which rows will be missing or NULL.
-- @column severity [key]: 'info' or 'warning'.
-- @column code [key]: Stable machine-readable code.
-- @column rank [key]: Rank concerned, or NULL for the whole job.
-- @column affects: Objects whose output is reduced (comma-separated), or NULL.
-- @column message [key]: What is missing and what to do about it.
CREATE OR REPLACE MACRO diagnostics() AS TABLE
WITH co AS (SELECT * FROM comm_ops),
nk AS (SELECT count(*) AS n FROM kernels),
nc AS (SELECT count(*) AS n FROM kernels WHERE kernel_class = 'communication'),
nr AS (SELECT count(*) AS n, max(world_size) AS ws FROM ranks),
d AS (
  SELECT severity, code, rank, NULL AS affects, message FROM ingest_notes
  UNION ALL
  SELECT 'warning', 'no_traces', NULL, 'all', 'no trace ingested: run nsys2comm ingest TRACES --db PATH'
  WHERE (SELECT count(*) FROM files) = 0
  UNION ALL
  SELECT 'warning', 'no_kernels', NULL, 'all', 'no GPU kernels in the job: was CUDA activity tracing enabled?'
  WHERE (SELECT count(*) FROM files) > 0 AND (SELECT n FROM nk) = 0
  UNION ALL
  SELECT 'warning', 'no_kernels', r.rank, 'overlap_by_rank, time_breakdown_by_rank', 'rank has no GPU kernels'
  FROM ranks r WHERE (SELECT n FROM nk) > 0 AND r.rank NOT IN (SELECT DISTINCT rank FROM kernels)
  UNION ALL
  SELECT 'warning', 'no_comm_kernels', NULL, 'comm_kernels, overlap_by_rank, msg_size_histogram, collective_bandwidth, collective_skew',
         'no communication kernels (NCCL/RCCL/...) in the job: overlap percentages are NULL and comm tables empty'
  WHERE (SELECT n FROM nk) > 0 AND (SELECT n FROM nc) = 0
  UNION ALL
  SELECT 'info', 'no_comm_kernels', r.rank, 'comm_kernels, overlap_by_rank', 'rank ran no communication kernels'
  FROM ranks r WHERE (SELECT n FROM nc) > 0
    AND r.rank NOT IN (SELECT DISTINCT rank FROM kernels WHERE kernel_class = 'communication')
  UNION ALL
  SELECT 'info', 'single_rank', NULL, 'collective_skew, rank_wait',
         'only one rank ingested: no cross-rank skew or straggler analysis; ingest every rank''s trace'
  WHERE (SELECT n FROM nr) = 1
  UNION ALL
  SELECT 'warning', 'missing_ranks', NULL, 'collective_skew, rank_wait',
         printf('%d of %d ranks ingested: skew and wait cover only those', (SELECT n FROM nr), (SELECT ws FROM nr))
  WHERE (SELECT ws FROM nr) > (SELECT n FROM nr) AND (SELECT n FROM nr) > 1
  UNION ALL
  SELECT 'warning', 'no_msg_sizes', rank, 'msg_size_histogram, collective_bandwidth, p2p_latency_by_size, latency_model',
         printf('%d of %d communication operations have no message size', count(*) FILTER (WHERE msg_bytes IS NULL), count(*))
  FROM co GROUP BY rank HAVING count(*) FILTER (WHERE msg_bytes IS NULL) > 0
  UNION ALL
  SELECT 'info', 'no_sized_comm', NULL, 'msg_size_histogram, collective_bandwidth, latency_model',
         'no communication operation has a known message size: no bandwidth, size histogram or latency fit'
  WHERE EXISTS (SELECT 1 FROM co) AND NOT EXISTS (SELECT 1 FROM co WHERE msg_bytes IS NOT NULL)
  UNION ALL
  SELECT 'info', 'no_group_size', rank, 'collective_bandwidth',
         printf('%d sized operations have no group size: busbw is NULL for them', count(*))
  FROM co WHERE msg_bytes IS NOT NULL AND group_size IS NULL GROUP BY rank
  UNION ALL
  SELECT 'info', 'no_steps', NULL, 'overlap_by_step',
         'no ProfilerStep#N or NVTX iteration ranges: overlap_by_step has no rows'
  WHERE (SELECT count(*) FROM files) > 0 AND NOT EXISTS (SELECT 1 FROM _overlap_steps())
  UNION ALL
  SELECT 'info', 'no_p2p', NULL, 'p2p_latency_by_size, latency_model', 'no sized send/recv operations'
  WHERE (SELECT n FROM nc) > 0
    AND NOT EXISTS (SELECT 1 FROM co WHERE collective IN ('send', 'recv', 'send_recv') AND msg_bytes IS NOT NULL)
  UNION ALL
  SELECT 'info', 'p2p_fit_impossible', NULL, 'latency_model', 'fewer than two distinct p2p message sizes: no alpha-beta fit for p2p'
  WHERE (SELECT count(DISTINCT msg_bytes) FROM co WHERE collective IN ('send', 'recv', 'send_recv')) = 1
  UNION ALL
  -- the matching's self-checks (skew/skew.sql): instances whose ranks disagree are left out of skew, waits,
  -- stragglers and transfer times
  SELECT 'warning', 'inconsistent_instances', NULL,
         'collective_skew, rank_wait, comm_transfer, latency_model, exposed_comm_causes',
         printf('%d of %d instances disagree across ranks (collective, size, group or end skew): left out of skew, '
                'straggler and transfer statistics%s', count(*) FILTER (WHERE NOT consistent), count(*),
                coalesce(', e.g. ' || arg_min(instance_key || ': ' || inconsistency, first_start_ns)
                                      FILTER (WHERE NOT consistent), ''))
  FROM _skew_comm_instances WHERE ranks_seen >= 2
  HAVING count(*) FILTER (WHERE NOT consistent) > 0
  UNION ALL
  -- the rule _skew_comm_keys chose (one definition, in skew/skew.sql), in words
  SELECT 'info', 'skew_match_rule', NULL, 'collective_skew, rank_wait',
         'collectives matched across ranks by ' || array_to_string(list_sort(list(DISTINCT CASE match_rule  -- per group
           WHEN 'pg_seq' THEN 'process group and sequence number (rule pg_seq)'
           WHEN 'group_order' THEN 'order within each process group and collective (rule group_order)'
           ELSE 'per-rank order of the communication kernels without group metadata (rule rank_order, TraceLens simplified mode)'
           END)), '; ')
  FROM _skew_comm_keys WHERE match_rule <> 'p2p_pair'
  HAVING count(*) > 0 AND (SELECT n FROM nr) > 1
)
SELECT severity, code, rank, affects, message FROM d
ORDER BY CASE severity WHEN 'warning' THEN 0 ELSE 1 END, code, rank NULLS FIRST, message;
