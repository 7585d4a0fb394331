-- The job's parallel layout: which process group is tensor (tp), data (dp), pipeline (pp), expert (ep) or context
-- (cp) parallel, its degree, and how sure that is.
--
-- A group is a process group (comm_ops / process_groups pg_name) with its member ranks: recorded (pg_ranks, on the
-- record or on another record of the same pg_name listing the rank) or, when no record lists them, the ranks seen
-- using the pg_name (NCCL communicator ids of nsys traces are the same on every member). Operations without any
-- group name are pooled by group size ('unnamed groups of n ranks').
--
-- Kind, in this order (the first rule that decides wins):
-- 1. confidence 'named', source 'pg_desc': the group's description names the dimension (Megatron-LM
--    'TENSOR_MODEL_PARALLEL_GROUP', 'DATA_PARALLEL_GROUP[_WITH_CP]', 'PIPELINE_MODEL_PARALLEL_GROUP',
--    'CONTEXT_PARALLEL_GROUP', 'EXPERT_*'; torch DeviceMesh / torchtitan 'mesh_tp', 'mesh_dp_shard', 'mesh_dp_replicate',
--    'mesh_pp', 'mesh_cp', 'mesh_ep'; words such as tensor, data, fsdp, pipeline, context, expert, moe as tokens).
--    Megatron's composite groups (MODEL_PARALLEL_GROUP = TP×PP, TENSOR_AND_*, EMBEDDING, AMAX) are kind 'unknown'
--    with that evidence: 'model parallel' means TP in GPT-NeoX/DeepSpeed but TP×PP in Megatron-LM.
-- 2. confidence 'assumed', source 'layout': for groups their description does not decide, the explicit layout
--    (parameters tp, cp, dp, pp; --layout) wins: a group whose ranks are the layout's group of a dimension (rank
--    order tp innermost, then cp, dp, pp outermost, as Megatron-LM and torchtitan lay ranks out; a dimension not
--    given counts as 1) gets that kind; a group without known ranks gets the one dimension of its size.
-- 3. confidence 'inferred', source 'structure' or 'p2p': the default group (or any group of all ranks) is 'dp' when it
--    is the only group with collective traffic, else 'world'. Other groups are judged by family (the unnamed groups
--    of one degree and member stride, whose traffic is pooled: a TP group of a pipeline stage without all_reduce is
--    judged with its siblings): only send/recv is 'pp'; consecutive ranks with all_reduce traffic are 'tp' (the
--    innermost dimension); strided ranks, or consecutive ranks with only all_gather/reduce_scatter (FSDP shards),
--    with collective traffic are 'dp'; only all_to_all is 'ep'. When no
--    group is 'pp' but send/recv run on other groups, pipelines are derived from the peers: stages k ranks apart
--    (k = the most common |peer − rank|) give pipelines {i, i+k, ...} of N/k stages (source 'p2p').
-- A dimension the layout gives that no group shows gets a row of its own (source 'layout', no ranks).

-- @macro _model_param
-- A model or layout parameter: the value given to the macro, else the session variable nsys2comm_<name> (what
-- --model / --layout and Job.summary / Job.report(model=..., layout=...) set), else NULL (unknown).
-- @param v: The macro argument (NULL when not given).
-- @param name: Parameter name; the session variable is nsys2comm_<name>.
CREATE OR REPLACE MACRO _model_param(v, name) AS coalesce(v, getvariable('nsys2comm_' || name));

-- @macro _model_desc_tokens
-- A process-group description as '_'-separated lower-case tokens with a '_' at both ends, for token matching.
-- @param d: pg_desc.
CREATE OR REPLACE MACRO _model_desc_tokens(d) AS
  '_' || trim(regexp_replace(lower(coalesce(d, '')), '[^a-z0-9]+', '_', 'g'), '_') || '_';

-- @macro _model_kind_from_desc
-- Parallel dimension a process-group description names: 'world' (default group), 'composite' (a Megatron group
-- spanning two dimensions, or 'model parallel', which is ambiguous), 'ep', 'dp', 'cp', 'pp', 'tp', else NULL.
-- @param d: pg_desc.
CREATE OR REPLACE MACRO _model_kind_from_desc(d) AS
  CASE
    WHEN _model_desc_tokens(d) IN ('_default_pg_', '_default_', '_world_', '_global_') THEN 'world'
    WHEN regexp_matches(_model_desc_tokens(d), '^_(model_parallel|model_parallel_group|mp|mp_group|mpu)_$')
      OR regexp_matches(_model_desc_tokens(d), '_(tensor_and|embedding|embd|amax|tensor_expert)_') THEN 'composite'
    WHEN regexp_matches(_model_desc_tokens(d), '_(expert|experts|expt|ep|moe)_') THEN 'ep'
    WHEN regexp_matches(_model_desc_tokens(d), '_(data|dp|ddp|fsdp|hsdp|zero|shard|replicate)_') THEN 'dp'
    WHEN regexp_matches(_model_desc_tokens(d), '_(context|cp|sequence|ulysses|ring_attn|ringattn)_') THEN 'cp'
    WHEN regexp_matches(_model_desc_tokens(d), '_(pipeline|pipe|pp|stage|stages)_') THEN 'pp'
    WHEN regexp_matches(_model_desc_tokens(d), '_(tensor|tp)_') THEN 'tp'
  END;

-- @macro _model_stride
-- Distance between consecutive members of a sorted rank list when it is the same for all of them, else NULL.
-- @param r: Sorted member ranks.
CREATE OR REPLACE MACRO _model_stride(r) AS
  CASE WHEN len(r) >= 2
            AND len(list_distinct(list_transform(generate_series(1, len(r) - 1), lambda i: r[i + 1] - r[i]))) = 1
       THEN r[2] - r[1] END;

-- @macro _model_grid_group
-- The ranks of the group of one layout dimension holding rank r0: n ranks s apart, starting at the dimension's
-- first rank (rank order tp innermost, then cp, dp, pp: s is the product of the inner degrees).
-- @param r0: A member rank.
-- @param n: Degree of the dimension.
-- @param s: Stride of the dimension (product of the degrees inside it).
CREATE OR REPLACE MACRO _model_grid_group(r0, n, s) AS
  list_transform(generate_series(0, n - 1), lambda j: CAST(r0 - ((r0 // s) % n) * s + j * s AS BIGINT));

-- @view _model_group_records
-- Every communication operation (comm_ops) and every declared process group (process_groups) with the group it
-- belongs to: group_key = pg_name and the group's member ranks when recorded (on the record itself, or on another
-- record of the same pg_name that lists the rank), else pg_name and '?' (members: the ranks seen using it);
-- operations without a group name are keyed by their group size. A view, so that ingest stores it with the other
-- shared sweeps (nsys2comm.cache): parallel_layout, parallel_degrees and volume_check each read it several times.
-- @column kernel_id: Communication kernel (comm_ops.kernel_id); NULL for a declared group.
-- @column rank: Rank of the operation, or that declares the group.
-- @column collective: Canonical collective; NULL for a declared group.
-- @column pg_name: Process-group name or communicator id, NULL when unknown.
-- @column pg_desc: Process-group description, NULL when unknown.
-- @column group_size: Ranks in the group as recorded, NULL when unknown.
-- @column size_assumed: True when the group size is the world size assumed by the importer.
-- @column peer_rank: Point-to-point peer, when known.
-- @column dtype: The operation's element type (comm_ops.dtype); NULL for a declared group.
-- @column msg_bytes: The operation's size S (comm_ops.msg_bytes, bytes); NULL for a declared group.
-- @column in_bytes: The operation's input bytes (comm_ops.in_bytes); NULL for a declared group.
-- @column out_bytes: The operation's output bytes (comm_ops.out_bytes); NULL for a declared group.
-- @column members: Recorded member ranks (sorted), NULL when no record lists them.
-- @column group_key: Identity of the group (see description).
CREATE OR REPLACE VIEW _model_group_records AS
WITH recs AS (
  SELECT row_number() OVER (ORDER BY kernel_id NULLS LAST, rank, pg_name) AS rec_id, * FROM (
    SELECT kernel_id, rank, collective, nullif(pg_name, '') AS pg_name, nullif(pg_desc, '') AS pg_desc, group_size,
           coalesce(group_source = 'assumed_world_size', false) AS size_assumed, peer_rank, dtype, msg_bytes,
           in_bytes, out_bytes, CASE WHEN len(pg_ranks) > 0 THEN list_sort(pg_ranks) END AS rec_members
    FROM comm_ops
    UNION ALL
    SELECT NULL, rank, NULL, nullif(pg_name, ''), nullif(pg_desc, ''), group_size, false, NULL, NULL, NULL, NULL,
           NULL, CASE WHEN len(pg_ranks) > 0 THEN list_sort(pg_ranks) END
    FROM process_groups WHERE rank IS NOT NULL)
), known AS (
  SELECT DISTINCT pg_name, rec_members FROM recs WHERE rec_members IS NOT NULL AND pg_name IS NOT NULL
)
SELECT r.kernel_id, r.rank, r.collective, r.pg_name, r.pg_desc, r.group_size, r.size_assumed, r.peer_rank,
       r.dtype, r.msg_bytes, r.in_bytes, r.out_bytes, coalesce(r.rec_members, k.rec_members) AS members,
       CASE WHEN r.pg_name IS NULL AND r.rec_members IS NULL THEN '?size=' || coalesce(CAST(r.group_size AS VARCHAR), '?')
            ELSE coalesce(r.pg_name, '') || '|'
                 || coalesce(array_to_string(coalesce(r.rec_members, k.rec_members), ','), '?') END AS group_key
FROM recs r
LEFT JOIN known k ON r.rec_members IS NULL AND k.pg_name = r.pg_name AND list_contains(k.rec_members, r.rank)
QUALIFY row_number() OVER (PARTITION BY r.rec_id ORDER BY len(k.rec_members), array_to_string(k.rec_members, ',')) = 1;

-- @view _model_groups
-- One row per group (_model_group_records.group_key) with its members, degree, traffic and name-given kind. A
-- view, so that ingest stores it with the other shared sweeps (nsys2comm.cache): parallel_layout,
-- parallel_degrees and volume_check each aggregated every operation's group record for it, volume_check twice.
-- @column group_key: Identity of the group.
-- @column pg_name: Process-group name or communicator id, NULL for unnamed groups.
-- @column pg_desc: Most common description, NULL when none.
-- @column group_ranks: Member ranks: recorded, or the ranks seen using the group when they are as many as its size; NULL when unknown.
-- @column members_source: 'recorded', 'observed' (ranks seen using it) or NULL (unknown).
-- @column degree: Number of ranks in the group: recorded members, recorded size, else ranks seen; NULL for pooled unnamed groups of unknown size.
-- @column size_assumed: True when the size is the world size the importer assumed (no group recorded).
-- @column world: Ranks in the job (largest recorded world size, else number of ranks).
-- @column is_world: True when the group spans every rank of the job.
-- @column stride: Distance between consecutive members when constant, else NULL.
-- @column ops: Communication operations on the group (all ranks).
-- @column p2p_ops: send / recv / send_recv operations.
-- @column all_reduce_ops: all_reduce operations.
-- @column gather_scatter_ops: all_gather and reduce_scatter operations.
-- @column all_to_all_ops: all_to_all operations.
-- @column collectives: Operations per collective, most first ('all_reduce ×24, all_to_all ×40'), NULL without traffic.
-- @column name_kind: Kind its description names (_model_kind_from_desc), NULL when none.
CREATE OR REPLACE VIEW _model_groups AS
WITH rec AS (SELECT * FROM _model_group_records),
job AS (SELECT coalesce(max(world_size), count(*)) AS world FROM ranks),
g AS (
  SELECT group_key, any_value(pg_name) AS pg_name, _prelude_most_common(histogram(pg_desc)) AS pg_desc, any_value(members) AS members,
         list_sort(list(DISTINCT rank)) AS seen, _prelude_most_common(histogram(group_size)) AS size_rec, bool_or(size_assumed) AS size_assumed,
         count(kernel_id) AS ops,
         count(kernel_id) FILTER (WHERE collective IN ('send', 'recv', 'send_recv')) AS p2p_ops,
         count(kernel_id) FILTER (WHERE collective = 'all_reduce') AS all_reduce_ops,
         count(kernel_id) FILTER (WHERE collective IN ('all_gather', 'reduce_scatter')) AS gather_scatter_ops,
         count(kernel_id) FILTER (WHERE collective = 'all_to_all') AS all_to_all_ops
  FROM rec GROUP BY group_key
), colls AS (
  SELECT group_key, string_agg(collective || ' ×' || n, ', ' ORDER BY n DESC, collective) AS collectives
  FROM (SELECT group_key, collective, count(*) AS n FROM rec WHERE kernel_id IS NOT NULL GROUP BY ALL)
  GROUP BY group_key
), r AS (
  SELECT g.*, c.collectives, job.world,
         CASE WHEN g.members IS NOT NULL THEN g.members
              WHEN g.pg_name IS NOT NULL AND (g.size_rec IS NULL OR g.size_rec = len(g.seen)) THEN g.seen
              WHEN g.pg_name IS NULL AND g.size_rec = job.world AND len(g.seen) = job.world THEN g.seen END
           AS group_ranks
  FROM g LEFT JOIN colls c USING (group_key) CROSS JOIN job
)
SELECT group_key, pg_name, pg_desc, group_ranks,
       CASE WHEN members IS NOT NULL THEN 'recorded' WHEN group_ranks IS NOT NULL THEN 'observed' END AS members_source,
       CAST(coalesce(len(members), size_rec, CASE WHEN pg_name IS NOT NULL THEN len(seen) END) AS BIGINT) AS degree,
       size_assumed, world,
       coalesce(coalesce(len(members), size_rec, CASE WHEN pg_name IS NOT NULL THEN len(seen) END) = world
                AND world > 1, false) AS is_world,
       _model_stride(group_ranks) AS stride, ops, p2p_ops, all_reduce_ops, gather_scatter_ops, all_to_all_ops,
       collectives, _model_kind_from_desc(pg_desc) AS name_kind
FROM r;

-- @macro _model_group_kinds
-- Every group of _model_groups with its kind, confidence, source and evidence (rules 1–3 of this file's
-- description; the p2p-derived pipelines and layout-only rows are added by parallel_layout).
-- @param tp: Tensor-parallel degree given (--layout tp=), NULL when not given.
-- @param pp: Pipeline-parallel degree given, NULL when not given.
-- @param dp: Data-parallel degree given, NULL when not given.
-- @param cp: Context-parallel degree given, NULL when not given.
-- @column group_key: Identity of the group.
-- @column pg_name: Process-group name or communicator id.
-- @column pg_desc: Description.
-- @column group_ranks: Member ranks, when known.
-- @column degree: Ranks in the group.
-- @column kind: 'tp', 'dp', 'pp', 'ep', 'cp', 'world' or 'unknown'.
-- @column confidence: 'named', 'assumed' or 'inferred'; NULL for kind 'unknown'.
-- @column source: 'pg_desc', 'layout' or 'structure'; NULL for kind 'unknown'.
-- @column evidence: Why, in words.
-- @column collectives: Operations per collective on the group.
-- @column ops: Communication operations on the group (all ranks).
-- @column stride: Distance between consecutive members when constant.
CREATE OR REPLACE MACRO _model_group_kinds(tp := NULL, pp := NULL, dp := NULL, cp := NULL) AS TABLE
WITH lay AS (  -- the layout given (NULL: not given); strides: tp innermost, then cp, dp, pp
  SELECT CAST(_model_param(tp, 'tp') AS BIGINT) AS l_tp, CAST(_model_param(cp, 'cp') AS BIGINT) AS l_cp,
         CAST(_model_param(dp, 'dp') AS BIGINT) AS l_dp, CAST(_model_param(pp, 'pp') AS BIGINT) AS l_pp
), dims AS (
  SELECT 'tp' AS dim, l_tp AS n, CAST(1 AS BIGINT) AS s, 1 AS o FROM lay WHERE l_tp > 1
  UNION ALL SELECT 'cp', l_cp, coalesce(l_tp, 1), 2 FROM lay WHERE l_cp > 1
  UNION ALL SELECT 'dp', l_dp, coalesce(l_tp, 1) * coalesce(l_cp, 1), 3 FROM lay WHERE l_dp > 1
  UNION ALL SELECT 'pp', l_pp, coalesce(l_tp, 1) * coalesce(l_cp, 1) * coalesce(l_dp, 1), 4 FROM lay WHERE l_pp > 1
), g AS (SELECT * FROM _model_groups),
fit AS (  -- the layout dimension a group is, by its ranks (or, without ranks, by its size when only one fits)
  SELECT g.group_key,
         min(d.dim) FILTER (WHERE g.group_ranks IS NOT NULL
                                  AND CAST(g.group_ranks AS BIGINT[]) = _model_grid_group(g.group_ranks[1], d.n, d.s))
           AS by_ranks,
         CASE WHEN count(*) FILTER (WHERE g.group_ranks IS NULL) = 1 THEN min(d.dim) END AS by_size
  FROM g JOIN dims d ON d.n = g.degree GROUP BY g.group_key
), coll_groups AS (  -- groups with collective (not point-to-point) traffic that are not the whole job
  SELECT count(*) AS n FROM g WHERE NOT is_world AND ops > p2p_ops
), fam AS (  -- a family: the unnamed groups of one degree and stride (they partition the ranks of one dimension);
  -- its pooled traffic decides, so a TP group on a pipeline stage without all_reduce is judged with its siblings
  SELECT *, sum(ops) OVER w AS f_ops, sum(p2p_ops) OVER w AS f_p2p, sum(all_reduce_ops) OVER w AS f_ar,
         sum(gather_scatter_ops) OVER w AS f_gs, sum(all_to_all_ops) OVER w AS f_a2a
  FROM g WINDOW w AS (PARTITION BY degree, stride, is_world, name_kind IS NULL)
), k AS (
  SELECT g.*, coalesce(f.by_ranks, f.by_size) AS lay_kind, f.by_ranks IS NOT NULL AS lay_by_ranks,
    CASE
      WHEN g.f_ops = 0 THEN NULL
      WHEN g.is_world AND g.ops > g.p2p_ops AND (SELECT n FROM coll_groups) = 0
           AND g.all_reduce_ops + g.gather_scatter_ops > 0 THEN 'dp'
      WHEN g.is_world THEN 'world'
      WHEN g.f_p2p = g.f_ops THEN 'pp'
      WHEN g.stride = 1 AND g.f_ar > 0 THEN 'tp'
      WHEN g.stride = 1 AND g.f_gs > 0 THEN 'dp'
      WHEN g.stride > 1 AND g.f_ar + g.f_gs > 0 THEN 'dp'
      WHEN g.f_a2a = g.f_ops THEN 'ep'
    END AS struct_kind
  FROM fam g LEFT JOIN fit f USING (group_key)
), decided AS (
  SELECT *,
    CASE WHEN name_kind IN ('tp', 'dp', 'pp', 'ep', 'cp') THEN name_kind
         WHEN lay_kind IS NOT NULL THEN lay_kind
         WHEN name_kind = 'composite' THEN 'unknown'
         WHEN struct_kind IS NOT NULL THEN struct_kind
         WHEN name_kind = 'world' THEN 'world'
         ELSE 'unknown' END AS kind,
    CASE WHEN name_kind IN ('tp', 'dp', 'pp', 'ep', 'cp') THEN 'pg_desc'
         WHEN lay_kind IS NOT NULL THEN 'layout'
         WHEN name_kind = 'composite' THEN NULL
         WHEN struct_kind IS NOT NULL THEN 'structure'
         WHEN name_kind = 'world' THEN 'pg_desc' END AS source
  FROM k
)
SELECT group_key, pg_name, pg_desc, group_ranks, degree, kind,
       CASE source WHEN 'pg_desc' THEN 'named' WHEN 'layout' THEN 'assumed' WHEN 'structure' THEN 'inferred' END
         AS confidence,
       source,
       concat_ws('; ',
         CASE source
           WHEN 'pg_desc' THEN format('description {} names {}', pg_desc,
                                      CASE kind WHEN 'world' THEN 'the default group' ELSE kind END)
           WHEN 'layout' THEN CASE WHEN lay_by_ranks THEN format('its ranks are a {} group of --layout', kind)
                                   ELSE format('{} ranks, the {} degree of --layout (member ranks not recorded)',
                                               degree, kind) END
           WHEN 'structure' THEN CASE
             WHEN kind = 'dp' AND is_world THEN format('spans all {} ranks and is the only group with collective '
                                                       || 'traffic: data parallel', degree)
             WHEN kind = 'world' THEN format('spans all {} ranks; other groups carry the parallel dimensions', degree)
             WHEN kind = 'pp' THEN 'only point-to-point (send/recv) traffic in its family: pipeline stages'
             WHEN kind = 'tp' THEN 'consecutive ranks, all_reduce traffic in its family: the innermost dimension, '
                                   || 'where Megatron-LM and torchtitan put tensor parallelism'
             WHEN kind = 'dp' AND stride = 1 THEN 'consecutive ranks, only all_gather/reduce_scatter traffic in its '
                                                  || 'family: FSDP/ZeRO shards'
             WHEN kind = 'dp' THEN format('ranks {} apart with collective traffic: an outer dimension, data parallel',
                                          stride)
             WHEN kind = 'ep' THEN 'only all_to_all traffic in its family: expert-parallel token exchange' END
         END,
         CASE WHEN name_kind = 'composite' THEN format('description {} names a group spanning two dimensions (or '
                                                       || '''model parallel'', TP in GPT-NeoX but TP×PP in '
                                                       || 'Megatron-LM): give --layout', pg_desc) END,
         CASE WHEN kind = 'unknown' AND name_kind IS DISTINCT FROM 'composite' THEN
           CASE WHEN ops = 0 THEN 'declared, no traffic in the trace'
                WHEN degree IS NULL THEN 'unnamed communicators of unknown size: give --layout'
                ELSE 'neither its description nor its ranks and traffic tell: give --layout' END END,
         CASE WHEN source = 'pg_desc' AND lay_kind IS NOT NULL AND lay_kind <> kind
              THEN format('--layout would make it {}; the description wins', lay_kind) END,
         CASE WHEN source = 'layout' AND struct_kind IS NOT NULL AND struct_kind <> kind
              THEN format('its structure suggests {}; --layout wins', struct_kind) END,
         CASE WHEN size_assumed THEN 'group size assumed from the world size (no group recorded)' END) AS evidence,
       collectives, ops, stride
FROM decided;

-- @macro parallel_layout
-- The job's parallel layout, one row per process group: its kind (tp, dp, pp, ep, cp, world, unknown), degree,
-- member ranks, how sure that is, and why. Rules in queries/model/layout.sql: the group's description names the
-- kind, else the explicit --layout, else its ranks and traffic. Pipelines derived from send/recv
-- peers and dimensions only the layout gives have rows of their own. Parameters given here override the session's
-- --layout; NULL means not given.
-- @param tp: Tensor-parallel degree (--layout tp=); NULL: not given.
-- @param pp: Pipeline-parallel degree; NULL: not given.
-- @param dp: Data-parallel degree; NULL: not given.
-- @param cp: Context-parallel degree; NULL: not given.
-- @param ep: Expert-parallel degree; NULL: not given.
-- @column kind: 'tp', 'dp', 'pp', 'ep', 'cp', 'world' (the group of all ranks beside the parallel dimensions) or 'unknown'.
-- @column degree: Ranks in the group (the dimension's degree), NULL when unknown.
-- @column pg_name: Process-group name or NCCL communicator id; NULL for unnamed, p2p-derived and layout-only rows.
-- @column pg_desc: Process-group description, when recorded.
-- @column group_ranks: Member ranks (recorded, or seen using the group), NULL when unknown.
-- @column confidence: 'named' (its description says so), 'assumed' (--layout says so) or 'inferred' (its ranks and traffic suggest it); NULL when the kind is unknown.
-- @column source: 'pg_desc', 'layout', 'structure' or 'p2p' (pipelines derived from send/recv peers); NULL when unknown.
-- @column evidence: Why, in words.
-- @column collectives: Operations per collective on the group, most first; NULL without traffic.
-- @column ops: Communication operations on the group, all ranks.
CREATE OR REPLACE MACRO parallel_layout(tp := NULL, pp := NULL, dp := NULL, cp := NULL, ep := NULL) AS TABLE
WITH gk AS (SELECT * FROM _model_group_kinds(tp := tp, pp := pp, dp := dp, cp := cp)),
lay AS (
  SELECT CAST(_model_param(tp, 'tp') AS BIGINT) AS l_tp, CAST(_model_param(pp, 'pp') AS BIGINT) AS l_pp,
         CAST(_model_param(dp, 'dp') AS BIGINT) AS l_dp, CAST(_model_param(cp, 'cp') AS BIGINT) AS l_cp,
         CAST(_model_param(ep, 'ep') AS BIGINT) AS l_ep
), world AS (SELECT coalesce(max(world_size), count(*)) AS n FROM ranks),
p2p AS (  -- send/recv on groups that are not pipeline groups: the stage distance k is the most common |peer - rank|
  SELECT _prelude_most_common(histogram(abs(r.peer_rank - r.rank))) AS k, count(*) AS n_ops
  FROM _model_group_records r JOIN gk USING (group_key)
  WHERE r.collective IN ('send', 'recv', 'send_recv') AND r.peer_rank IS NOT NULL AND r.peer_rank <> r.rank
    AND gk.kind <> 'pp'
), p2p_pipes AS (
  SELECT 'pp' AS kind, CAST(world.n // p2p.k AS BIGINT) AS degree, NULL::VARCHAR AS pg_name, NULL::VARCHAR AS pg_desc,
         CAST(list_transform(generate_series(0, world.n // p2p.k - 1), lambda j: i + j * p2p.k) AS INTEGER[])
           AS group_ranks,
         'inferred' AS confidence, 'p2p' AS source,
         format('send/recv peers are most often {} ranks apart ({} operations on groups that are not pipeline '
                || 'groups): pipelines of stages {} ranks apart', p2p.k, p2p.n_ops, p2p.k) AS evidence,
         NULL::VARCHAR AS collectives, NULL::BIGINT AS ops
  FROM p2p CROSS JOIN world CROSS JOIN lay CROSS JOIN generate_series(0, p2p.k - 1) AS t(i)
  WHERE p2p.k > 0 AND world.n % p2p.k = 0 AND world.n // p2p.k > 1 AND lay.l_pp IS NULL
    AND NOT EXISTS (SELECT 1 FROM gk WHERE kind = 'pp')
), rows_ AS (
  SELECT kind, degree, pg_name, pg_desc, group_ranks, confidence, source, evidence, collectives, ops FROM gk
  UNION ALL SELECT * FROM p2p_pipes
), given AS (
  SELECT 'tp' AS kind, l_tp AS n FROM lay UNION ALL SELECT 'pp', l_pp FROM lay UNION ALL SELECT 'dp', l_dp FROM lay
  UNION ALL SELECT 'cp', l_cp FROM lay UNION ALL SELECT 'ep', l_ep FROM lay
), layout_only AS (
  SELECT g.kind, g.n AS degree, NULL::VARCHAR, NULL::VARCHAR, NULL::INTEGER[], 'assumed', 'layout',
         format('--layout {}={}; no group of the trace shows it', g.kind, g.n), NULL::VARCHAR, NULL::BIGINT
  FROM given g WHERE g.n > 1 AND NOT EXISTS (SELECT 1 FROM rows_ r WHERE r.kind = g.kind)
)
SELECT kind, degree, pg_name, pg_desc, group_ranks, confidence, source, evidence, collectives, ops
FROM (SELECT * FROM rows_ UNION ALL SELECT * FROM layout_only)
ORDER BY list_position(['tp', 'cp', 'ep', 'dp', 'pp', 'world', 'unknown'], kind), group_ranks[1] NULLS LAST,
         pg_name NULLS LAST, evidence;

-- @macro parallel_degrees
-- The degree of each parallel dimension (tp, cp, ep, dp, pp), one row each, as volume_check uses it: a dimension
-- with groups in parallel_layout has the largest of their degrees (with the weakest confidence among them); one
-- without groups has the degree given (--layout), else 1 when every group with traffic has a known kind (nothing
-- hides it), else NULL (unknown); no rows for a job without ranks. A given degree that differs from the trace's named groups is said in evidence;
-- the trace wins.
-- @param tp: Tensor-parallel degree (--layout tp=); NULL: not given.
-- @param pp: Pipeline-parallel degree; NULL: not given.
-- @param dp: Data-parallel degree; NULL: not given.
-- @param cp: Context-parallel degree; NULL: not given.
-- @param ep: Expert-parallel degree; NULL: not given.
-- @column kind: 'tp', 'cp', 'ep', 'dp' or 'pp'.
-- @column degree: Degree of the dimension, NULL when unknown.
-- @column groups: Groups of this kind in parallel_layout.
-- @column confidence: 'named', 'assumed' or 'inferred' (the weakest among its groups); NULL when unknown.
-- @column source: 'pg_desc', 'layout', 'structure', 'p2p', or 'absence' (no group of this kind while every group with traffic has a known kind); NULL when unknown.
-- @column evidence: Why, in words.
CREATE OR REPLACE MACRO parallel_degrees(tp := NULL, pp := NULL, dp := NULL, cp := NULL, ep := NULL) AS TABLE
WITH pl AS (SELECT * FROM parallel_layout(tp := tp, pp := pp, dp := dp, cp := cp, ep := ep)),
lay AS (
  SELECT 'tp' AS kind, CAST(_model_param(tp, 'tp') AS BIGINT) AS n, 1 AS o
  UNION ALL SELECT 'cp', CAST(_model_param(cp, 'cp') AS BIGINT), 2
  UNION ALL SELECT 'ep', CAST(_model_param(ep, 'ep') AS BIGINT), 3
  UNION ALL SELECT 'dp', CAST(_model_param(dp, 'dp') AS BIGINT), 4
  UNION ALL SELECT 'pp', CAST(_model_param(pp, 'pp') AS BIGINT), 5
), hidden AS (SELECT count(*) AS n FROM pl WHERE kind = 'unknown' AND ops > 0),
agg AS (
  SELECT kind, max(degree) AS degree, count(*) AS groups,
         list_sort(list(DISTINCT degree) FILTER (WHERE degree IS NOT NULL)) AS degrees,
         max(list_position(['named', 'inferred', 'assumed'], confidence)) AS weakest,
         _prelude_most_common(histogram(source)) AS source, bool_or(source = 'pg_desc') AS named
  FROM pl WHERE kind IN ('tp', 'cp', 'ep', 'dp', 'pp') GROUP BY kind
)
SELECT l.kind,
       CAST(CASE WHEN a.kind IS NOT NULL THEN a.degree WHEN l.n IS NOT NULL THEN l.n
                 WHEN (SELECT n FROM hidden) = 0 THEN 1 END AS BIGINT) AS degree,
       coalesce(a.groups, 0) AS groups,
       CASE WHEN a.kind IS NOT NULL THEN ['named', 'inferred', 'assumed'][a.weakest]
            WHEN l.n IS NOT NULL THEN 'assumed' WHEN (SELECT n FROM hidden) = 0 THEN 'inferred' END AS confidence,
       CASE WHEN a.kind IS NOT NULL THEN a.source WHEN l.n IS NOT NULL THEN 'layout'
            WHEN (SELECT n FROM hidden) = 0 THEN 'absence' END AS source,
       concat_ws('; ',
         CASE WHEN a.kind IS NOT NULL THEN format('{} group(s) of {} rank(s) in parallel_layout', a.groups,
                                                 array_to_string(a.degrees, ', '))
              WHEN l.n IS NOT NULL THEN format('--layout {}={}', l.kind, l.n)
              WHEN (SELECT n FROM hidden) = 0 THEN 'no group of this kind, and every group with traffic has a known kind'
              ELSE format('unknown: {} group(s) of unknown kind carry traffic; give --layout {}=N',
                          (SELECT n FROM hidden), l.kind) END,
         CASE WHEN a.kind IS NOT NULL AND l.n IS NOT NULL AND l.n <> a.degree
              THEN format('--layout says {}={}; the trace''s groups win', l.kind, l.n) END) AS evidence
FROM lay l LEFT JOIN agg a USING (kind)
WHERE EXISTS (SELECT 1 FROM ranks)  -- a job without ranks has no layout to describe
ORDER BY l.o;
