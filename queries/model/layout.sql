-- @include exposure/causes.sql
-- @include model/formulas.sql
-- The job's parallel layout: which process group is tensor (tp), data (dp), pipeline (pp), expert (ep) or context
-- (cp) parallel, its degree, and how sure that is.
--
-- A group is a process group (comm_ops / process_groups pg_name) with its member ranks: recorded (pg_ranks, on the
-- record or on another record of the same pg_name listing the rank) or, when no record lists them, the ranks seen
-- using the pg_name (NCCL communicator ids of nsys traces are the same on every member). Operations without any
-- group name are pooled by group size ('unnamed groups of n ranks').
--
-- Phase of an operation (_model_op_phases): forward, backward or optimizer, from the innermost CPU range of its rank
-- that encloses its launch call and whose name marks a phase (_model_phase_of: autograd's
-- 'autograd::engine::evaluate_function: ...Backward', 'Optimizer.step#...', 'nn.Module: ...', and names with the
-- words forward / backward / fwd / bwd / optimizer, as NVTX and record_function ranges have them). Kineto traces keep
-- only user annotations among CPU ranges (the importer drops other CPU ops), so there the phases come from
-- record_function ranges ('Optimizer.step#...', 'DistributedDataParallel.forward', '## backward ##').
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
-- 3. confidence 'inferred', source 'phase': the phases and sizes of the traffic of the group's family (below; a group
--    of all ranks only when it is the only group with collective traffic): a reduction (all_reduce or reduce_scatter)
--    in forward whose size is also communicated in backward is 'tp' (activations, the same size in both passes:
--    Megatron TP all_reduce, or sequence-parallel reduce_scatter / all_gather); reductions only in backward or the
--    optimizer (forward reductions at most 1 % of their bytes: loss or metric averaging) are 'dp' (gradients, DDP or
--    ZeRO; with all_gather in forward and backward, FSDP / ZeRO-3).
-- 4. confidence 'inferred', source 'structure' or 'p2p', where no phase decides: the default group (description
--    'default_pg', where torch DDP and FSDP run) is 'dp' when it is the only group with collective traffic; any
--    other group of all ranks is then undecided ('dp or tp': a 2-rank Megatron TP job's groups are all 'undefined');
--    a group of all ranks beside other groups with collective traffic is 'world'. Other groups are judged by family
--    (the unnamed groups of one degree and member stride, whose traffic is pooled: a TP group of a pipeline stage
--    without all_reduce is judged with its siblings): only send/recv is 'pp'; consecutive ranks with all_reduce
--    traffic are 'tp' when strided groups carry collectives too (the innermost dimension, where Megatron-LM and
--    torchtitan put TP), else undecided; consecutive ranks with only all_gather/reduce_scatter are undecided (FSDP
--    shards or sequence-parallel TP); strided ranks with collective traffic are 'dp'; only all_to_all is 'ep'. When
--    no group is 'pp' but send/recv run on other groups, pipelines are derived from the peers: stages k ranks apart
--    (k = the most common |peer − rank|) give pipelines {i, i+k, ...} of N/k stages (source 'p2p').
-- Undecided groups are kind 'unknown' with confidence 'undecided' and the kinds left open in candidates ('dp or
-- tp'): no rule reports a kind the trace cannot support. A group whose size is the world size the importer assumed
-- (comm_ops.group_source 'assumed_world_size') has confidence 'assumed' whatever rule gave its kind, and its
-- evidence says so. A dimension the layout gives that no group shows gets a row of its own (source 'layout', no
-- ranks).

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

-- @macro _model_phase_of
-- The training phase a CPU range's name marks: 'backward' (autograd's 'autograd::engine::evaluate_function: ...',
-- names with the word backward or bwd such as 'FSDP::pre_backward' or '## backward ##'), 'optimizer'
-- ('Optimizer.step#...', names with the word optimizer), 'forward' ('nn.Module: ...', names with the word forward or
-- fwd such as 'DistributedDataParallel.forward'); a name with both forward and backward ('forward_backward_step')
-- marks none; NULL when it marks none.
-- @param n: Range name (cpu_ranges.name).
CREATE OR REPLACE MACRO _model_phase_of(n) AS
  CASE
    WHEN starts_with(n, 'ProfilerStep#') THEN NULL
    WHEN starts_with(n, 'autograd::engine::evaluate_function:') THEN 'backward'
    WHEN starts_with(n, 'Optimizer.step#') THEN 'optimizer'
    WHEN starts_with(n, 'nn.Module: ') THEN 'forward'
    WHEN regexp_matches(lower(n), 'backward|(^|[^a-z])bwd([^a-z]|$)')
      AND NOT regexp_matches(lower(n), 'forward|(^|[^a-z])fwd([^a-z]|$)') THEN 'backward'
    WHEN regexp_matches(lower(n), '(^|[^a-z])optimi[sz]er') THEN 'optimizer'
    WHEN regexp_matches(lower(n), 'forward|(^|[^a-z])fwd([^a-z]|$)')
      AND NOT regexp_matches(lower(n), 'backward|(^|[^a-z])bwd([^a-z]|$)') THEN 'forward'
  END;

-- @view _model_op_phases
-- Phase of every communication operation whose launch call is known: the phase (_model_phase_of) of the innermost
-- CPU range of its rank (latest start, then earliest end) that encloses the start of its launch call
-- (_exposure_launches) and marks a phase. Python frames (kind 'python_function') are not phase ranges: their
-- names are source locations whose function names ('forward' of a module recomputed under backward) do not say the
-- phase, and autograd's and the profiler's own ranges already do. Ranges of any thread count: CUDA backward runs on
-- autograd's device threads while the main thread sits in the range around loss.backward(). Operations without a launch call or an
-- enclosing phase range have no row.
-- @column kernel_id: Communication kernel (comm_ops.kernel_id).
-- @column phase: 'forward', 'backward' or 'optimizer'.
CREATE OR REPLACE VIEW _model_op_phases AS
WITH pr AS (
  SELECT rank, start_ns, end_ns, _model_phase_of(name) AS phase
  FROM cpu_ranges
  WHERE kind NOT IN ('gpu_user_annotation', 'python_function') AND end_ns IS NOT NULL
    AND _model_phase_of(name) IS NOT NULL
), l AS (
  SELECT o.kernel_id, o.rank, la.launch_start_ns AS t
  FROM comm_ops o JOIN kernels k USING (kernel_id)
  JOIN _exposure_launches la ON la.rank = k.rank AND la.correlation_id = k.correlation_id
)
SELECT l.kernel_id, pr.phase
FROM l JOIN pr ON pr.rank = l.rank AND l.t >= pr.start_ns AND l.t < pr.end_ns
QUALIFY row_number() OVER (PARTITION BY l.kernel_id ORDER BY pr.start_ns DESC, pr.end_ns, pr.phase) = 1;

-- @view _model_group_records
-- @sweep cross_rank
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
-- @column phase: The operation's phase (_model_op_phases: 'forward', 'backward', 'optimizer'), NULL when unknown.
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
                 || coalesce(array_to_string(coalesce(r.rec_members, k.rec_members), ','), '?') END AS group_key,
       ph.phase
FROM recs r
LEFT JOIN known k ON r.rec_members IS NULL AND k.pg_name = r.pg_name AND list_contains(k.rec_members, r.rank)
LEFT JOIN _model_op_phases ph ON ph.kernel_id = r.kernel_id
QUALIFY row_number() OVER (PARTITION BY r.rec_id ORDER BY len(k.rec_members), array_to_string(k.rec_members, ',')) = 1;

-- @view _model_groups
-- @sweep cross_rank
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
-- @column phased_ops: Collective (not point-to-point) operations whose phase is known (_model_op_phases).
-- @column fwd_reduce_ops: all_reduce and reduce_scatter operations in forward.
-- @column fwd_reduce_bytes: Their bytes (msg_bytes; NULL when none has a size).
-- @column fwd_gather_ops: all_gather operations in forward.
-- @column late_reduce_ops: all_reduce and reduce_scatter operations in backward or the optimizer step.
-- @column late_reduce_bytes: Their bytes (msg_bytes; NULL when none has a size).
-- @column both_pass_bytes: Largest size of a forward reduction (all_reduce, reduce_scatter) that is also communicated (all_reduce, reduce_scatter, all_gather) in backward: an activation size; NULL when none.
-- @column both_pass_fwd_ops: Forward reductions of that size.
-- @column both_pass_bwd_ops: Backward operations of that size.
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
), ph AS (  -- the phases of its collectives (layout.sql rule 3)
  SELECT group_key,
         count(*) FILTER (WHERE phase IS NOT NULL) AS phased_ops,
         count(*) FILTER (WHERE phase = 'forward' AND collective IN ('all_reduce', 'reduce_scatter')) AS fwd_reduce_ops,
         sum(msg_bytes) FILTER (WHERE phase = 'forward' AND collective IN ('all_reduce', 'reduce_scatter'))
           AS fwd_reduce_bytes,
         count(*) FILTER (WHERE phase = 'forward' AND collective = 'all_gather') AS fwd_gather_ops,
         count(*) FILTER (WHERE phase IN ('backward', 'optimizer') AND collective IN ('all_reduce', 'reduce_scatter'))
           AS late_reduce_ops,
         sum(msg_bytes) FILTER (WHERE phase IN ('backward', 'optimizer')
                                  AND collective IN ('all_reduce', 'reduce_scatter')) AS late_reduce_bytes
  FROM rec WHERE kernel_id IS NOT NULL AND collective NOT IN ('send', 'recv', 'send_recv') GROUP BY group_key
), both_pass AS (  -- sizes reduced in forward and communicated again in backward: activations
  SELECT group_key, max(msg_bytes) AS both_pass_bytes, arg_max(f, msg_bytes) AS both_pass_fwd_ops,
         arg_max(b, msg_bytes) AS both_pass_bwd_ops
  FROM (SELECT group_key, msg_bytes,
               count(*) FILTER (WHERE phase = 'forward' AND collective IN ('all_reduce', 'reduce_scatter')) AS f,
               count(*) FILTER (WHERE phase = 'backward'
                                  AND collective IN ('all_reduce', 'reduce_scatter', 'all_gather')) AS b
        FROM rec WHERE kernel_id IS NOT NULL AND msg_bytes IS NOT NULL AND phase IN ('forward', 'backward')
        GROUP BY ALL)
  WHERE f > 0 AND b > 0 GROUP BY group_key
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
       collectives, _model_kind_from_desc(pg_desc) AS name_kind,
       coalesce(ph.phased_ops, 0) AS phased_ops, coalesce(ph.fwd_reduce_ops, 0) AS fwd_reduce_ops,
       ph.fwd_reduce_bytes, coalesce(ph.fwd_gather_ops, 0) AS fwd_gather_ops,
       coalesce(ph.late_reduce_ops, 0) AS late_reduce_ops, ph.late_reduce_bytes,
       bp.both_pass_bytes, bp.both_pass_fwd_ops, bp.both_pass_bwd_ops
FROM r LEFT JOIN ph USING (group_key) LEFT JOIN both_pass bp USING (group_key);

-- @macro _model_group_kinds
-- Every group of _model_groups with its kind, confidence, source and evidence (rules 1–4 of this file's
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
-- @column confidence: 'named', 'assumed', 'inferred' or 'undecided' (as parallel_layout); NULL when nothing is known.
-- @column source: 'pg_desc', 'layout', 'phase' or 'structure'; NULL for kind 'unknown'.
-- @column evidence: Why, in words.
-- @column collectives: Operations per collective on the group.
-- @column ops: Communication operations on the group (all ranks).
-- @column stride: Distance between consecutive members when constant.
-- @column candidates: Kinds the evidence leaves open for an undecided group ('dp or tp'), else NULL.
-- @column size_assumed: True when the group's size is the world size the importer assumed.
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
  SELECT count(*) AS n, count(*) FILTER (WHERE stride > 1) AS strided FROM g WHERE NOT is_world AND ops > p2p_ops
), fam AS (  -- a family: the unnamed groups of one degree and stride (they partition the ranks of one dimension);
  -- its pooled traffic decides, so a TP group on a pipeline stage without all_reduce is judged with its siblings
  SELECT *, sum(ops) OVER w AS f_ops, sum(p2p_ops) OVER w AS f_p2p, sum(all_reduce_ops) OVER w AS f_ar,
         sum(gather_scatter_ops) OVER w AS f_gs, sum(all_to_all_ops) OVER w AS f_a2a,
         sum(phased_ops) OVER w AS f_phased, sum(fwd_reduce_ops) OVER w AS f_fwd_red,
         sum(fwd_reduce_bytes) OVER w AS f_fwd_red_bytes, sum(fwd_gather_ops) OVER w AS f_fwd_ag,
         sum(late_reduce_ops) OVER w AS f_late_red, sum(late_reduce_bytes) OVER w AS f_late_red_bytes,
         max(both_pass_bytes) OVER w AS f_both_bytes,
         sum(both_pass_fwd_ops) OVER w AS f_both_fwd, sum(both_pass_bwd_ops) OVER w AS f_both_bwd
  FROM g WINDOW w AS (PARTITION BY degree, stride, is_world, name_kind IS NULL)
), k AS (
  SELECT g.*, coalesce(f.by_ranks, f.by_size) AS lay_kind, f.by_ranks IS NOT NULL AS lay_by_ranks,
    CASE  -- rule 3: the phases and sizes of its traffic (a group of all ranks only when no other carries collectives)
      WHEN g.f_phased = 0 OR (g.is_world AND (SELECT n FROM coll_groups) > 0) THEN NULL
      WHEN g.f_both_bytes IS NOT NULL THEN 'tp'
      WHEN g.f_late_red > 0 AND (g.f_fwd_red = 0 OR g.f_fwd_red_bytes * 100 <= g.f_late_red_bytes) THEN 'dp'
    END AS phase_kind,
    CASE  -- rule 4: its ranks and traffic; 'dp or tp' where they do not decide
      WHEN g.f_ops = 0 THEN NULL
      WHEN g.is_world AND g.ops > g.p2p_ops AND (SELECT n FROM coll_groups) = 0
           AND g.all_reduce_ops + g.gather_scatter_ops > 0
        THEN CASE WHEN g.name_kind = 'world' THEN 'dp' ELSE 'dp or tp' END
      WHEN g.is_world THEN 'world'
      WHEN g.f_p2p = g.f_ops THEN 'pp'
      WHEN g.stride = 1 AND g.f_ar > 0 THEN CASE WHEN (SELECT strided FROM coll_groups) > 0 THEN 'tp'
                                                  ELSE 'dp or tp' END
      WHEN g.stride = 1 AND g.f_gs > 0 THEN 'dp or tp'
      WHEN g.stride > 1 AND g.f_ar + g.f_gs > 0 THEN 'dp'
      WHEN g.f_a2a = g.f_ops THEN 'ep'
    END AS struct_kind
  FROM fam g LEFT JOIN fit f USING (group_key)
), decided AS (
  SELECT *,
    CASE WHEN name_kind IN ('tp', 'dp', 'pp', 'ep', 'cp') THEN name_kind
         WHEN lay_kind IS NOT NULL THEN lay_kind
         WHEN name_kind = 'composite' THEN 'unknown'
         WHEN phase_kind IS NOT NULL THEN phase_kind
         WHEN struct_kind NOT LIKE '% or %' THEN struct_kind
         WHEN name_kind = 'world' THEN 'world'
         ELSE 'unknown' END AS kind,
    CASE WHEN name_kind IN ('tp', 'dp', 'pp', 'ep', 'cp') THEN 'pg_desc'
         WHEN lay_kind IS NOT NULL THEN 'layout'
         WHEN name_kind = 'composite' THEN NULL
         WHEN phase_kind IS NOT NULL THEN 'phase'
         WHEN struct_kind NOT LIKE '% or %' THEN 'structure'
         WHEN name_kind = 'world' THEN 'pg_desc' END AS source,
    CASE WHEN name_kind IS NULL AND lay_kind IS NULL AND phase_kind IS NULL AND struct_kind LIKE '% or %'
         THEN struct_kind END AS candidates
  FROM k
)
SELECT group_key, pg_name, pg_desc, group_ranks, degree, kind,
       CASE WHEN candidates IS NOT NULL THEN 'undecided'
            WHEN source IS NULL THEN NULL
            WHEN size_assumed THEN 'assumed'
            WHEN source = 'pg_desc' THEN 'named' WHEN source = 'layout' THEN 'assumed' ELSE 'inferred' END
         AS confidence,
       source,
       concat_ws('; ',
         CASE source
           WHEN 'pg_desc' THEN format('description {} names {}', pg_desc,
                                      CASE kind WHEN 'world' THEN 'the default group' ELSE kind END)
           WHEN 'layout' THEN CASE WHEN lay_by_ranks THEN format('its ranks are a {} group of --layout', kind)
                                   ELSE format('{} ranks, the {} degree of --layout (member ranks not recorded)',
                                               degree, kind) END
           WHEN 'phase' THEN CASE
             WHEN kind = 'tp' THEN format('reductions of {} in forward (×{}) and the same size again in backward '
                                          || '(×{}): activations, tensor parallel', _model_size(f_both_bytes),
                                          f_both_fwd, f_both_bwd)
             WHEN f_fwd_ag > 0 THEN format('parameters gathered in forward (all_gather ×{}), gradients reduced only in '
                                           || 'backward or the optimizer step (×{}, {}): FSDP / ZeRO-3, data parallel',
                                           f_fwd_ag, f_late_red, _model_size(f_late_red_bytes))
             ELSE format('reductions only in backward or the optimizer step (×{}, {}{}): gradients, data parallel',
                         f_late_red, _model_size(f_late_red_bytes),
                         CASE WHEN f_fwd_red > 0 THEN format('; forward ×{} of {}: loss or metrics', f_fwd_red,
                                                             _model_size(f_fwd_red_bytes)) ELSE '' END) END
           WHEN 'structure' THEN CASE
             WHEN kind = 'dp' AND is_world THEN format('the default group, spanning all {} ranks, is the only group '
                                                       || 'with collective traffic: data parallel (torch DDP and FSDP '
                                                       || 'run on it)', degree)
             WHEN kind = 'world' THEN format('spans all {} ranks; other groups carry the parallel dimensions', degree)
             WHEN kind = 'pp' THEN 'only point-to-point (send/recv) traffic in its family: pipeline stages'
             WHEN kind = 'tp' THEN 'consecutive ranks, all_reduce traffic in its family, strided groups carry '
                                   || 'collectives too: the innermost dimension, where Megatron-LM and torchtitan '
                                   || 'put tensor parallelism'
             WHEN kind = 'dp' THEN format('ranks {} apart with collective traffic: an outer dimension, data parallel',
                                          stride)
             WHEN kind = 'ep' THEN 'only all_to_all traffic in its family: expert-parallel token exchange' END
         END,
         CASE WHEN candidates IS NOT NULL THEN format('{}: {}{}', candidates,
           CASE WHEN is_world THEN format('a group of all {} ranks, not the default group, with collective traffic',
                                          degree)
                WHEN f_ar > 0 THEN 'consecutive ranks with all_reduce traffic, no strided group with collectives'
                ELSE 'consecutive ranks with only all_gather/reduce_scatter traffic (FSDP shards or '
                     || 'sequence-parallel TP)' END,
           CASE WHEN f_phased > 0 THEN '; the phases and sizes of its traffic do not tell: give --layout'
                ELSE '; no forward/backward range encloses its launches: give --layout' END) END,
         CASE WHEN name_kind = 'composite' THEN format('description {} names a group spanning two dimensions (or '
                                                       || '''model parallel'', TP in GPT-NeoX but TP×PP in '
                                                       || 'Megatron-LM): give --layout', pg_desc) END,
         CASE WHEN kind = 'unknown' AND candidates IS NULL AND name_kind IS DISTINCT FROM 'composite' THEN
           CASE WHEN ops = 0 THEN 'declared, no traffic in the trace'
                WHEN degree IS NULL THEN 'unnamed communicators of unknown size: give --layout'
                ELSE 'neither its description nor its ranks and traffic tell: give --layout' END END,
         CASE WHEN source = 'pg_desc' AND lay_kind IS NOT NULL AND lay_kind <> kind
              THEN format('--layout would make it {}; the description wins', lay_kind) END,
         CASE WHEN source = 'layout' AND coalesce(phase_kind, struct_kind) NOT LIKE '% or %'
                   AND coalesce(phase_kind, struct_kind) <> kind
              THEN format('its traffic suggests {}; --layout wins', coalesce(phase_kind, struct_kind)) END,
         CASE WHEN source = 'phase' AND struct_kind NOT LIKE '% or %' AND struct_kind NOT IN (kind, 'world')
              THEN format('its ranks alone would suggest {}; the phases win', struct_kind) END,
         CASE WHEN size_assumed THEN 'group size assumed from the world size (no group recorded)' END) AS evidence,
       collectives, ops, stride, candidates, size_assumed
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
-- @column kind [key]: 'tp', 'dp', 'pp', 'ep', 'cp', 'world' (the group of all ranks beside the parallel dimensions) or 'unknown'.
-- @column degree [key]: Ranks in the group (the dimension's degree), NULL when unknown.
-- @column pg_name [key]: Process-group name or NCCL communicator id; NULL for unnamed, p2p-derived and layout-only rows.
-- @column pg_desc: Process-group description, when recorded.
-- @column group_ranks: Member ranks (recorded, or seen using the group), NULL when unknown.
-- @column confidence [key]: 'named' (its description says so), 'assumed' (--layout says so, or its size is the world size the importer assumed: the evidence says which), 'inferred' (the phases and sizes of its traffic, or its ranks and traffic, show it), 'undecided' (kind 'unknown': the evidence leaves the kinds in candidates open); NULL when nothing is known.
-- @column source [key]: 'pg_desc', 'layout', 'phase' (forward/backward/optimizer phases and sizes of its traffic), 'structure' or 'p2p' (pipelines derived from send/recv peers); NULL when unknown.
-- @column evidence: Why, in words.
-- @column collectives: Operations per collective on the group, most first; NULL without traffic.
-- @column ops: Communication operations on the group, all ranks.
-- @column candidates: The kinds an undecided group may be ('dp or tp'), NULL when decided or nothing is known.
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
         NULL::VARCHAR AS collectives, NULL::BIGINT AS ops, NULL::VARCHAR AS candidates
  FROM p2p CROSS JOIN world CROSS JOIN lay CROSS JOIN generate_series(0, p2p.k - 1) AS t(i)
  WHERE p2p.k > 0 AND world.n % p2p.k = 0 AND world.n // p2p.k > 1 AND lay.l_pp IS NULL
    AND NOT EXISTS (SELECT 1 FROM gk WHERE kind = 'pp')
), rows_ AS (
  SELECT kind, degree, pg_name, pg_desc, group_ranks, confidence, source, evidence, collectives, ops, candidates
  FROM gk
  UNION ALL SELECT * FROM p2p_pipes
), given AS (
  SELECT 'tp' AS kind, l_tp AS n FROM lay UNION ALL SELECT 'pp', l_pp FROM lay UNION ALL SELECT 'dp', l_dp FROM lay
  UNION ALL SELECT 'cp', l_cp FROM lay UNION ALL SELECT 'ep', l_ep FROM lay
), layout_only AS (
  SELECT g.kind, g.n AS degree, NULL::VARCHAR, NULL::VARCHAR, NULL::INTEGER[], 'assumed', 'layout',
         format('--layout {}={}; no group of the trace shows it', g.kind, g.n), NULL::VARCHAR, NULL::BIGINT,
         NULL::VARCHAR
  FROM given g WHERE g.n > 1 AND NOT EXISTS (SELECT 1 FROM rows_ r WHERE r.kind = g.kind)
)
SELECT kind, degree, pg_name, pg_desc, group_ranks, confidence, source, evidence, collectives, ops, candidates
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
-- @column kind [key]: 'tp', 'cp', 'ep', 'dp' or 'pp'.
-- @column degree [key]: Degree of the dimension, NULL when unknown.
-- @column groups [key]: Groups of this kind in parallel_layout.
-- @column confidence [key]: 'named', 'assumed' or 'inferred' (the weakest among its groups); NULL when unknown.
-- @column source [key]: 'pg_desc', 'layout', 'phase', 'structure', 'p2p', or 'absence' (no group of this kind while every group with traffic has a known kind); NULL when unknown.
-- @column evidence: Why, in words.
CREATE OR REPLACE MACRO parallel_degrees(tp := NULL, pp := NULL, dp := NULL, cp := NULL, ep := NULL) AS TABLE
WITH pl AS (SELECT * FROM parallel_layout(tp := tp, pp := pp, dp := dp, cp := cp, ep := ep)),
lay AS (
  SELECT 'tp' AS kind, CAST(_model_param(tp, 'tp') AS BIGINT) AS n, 1 AS o
  UNION ALL SELECT 'cp', CAST(_model_param(cp, 'cp') AS BIGINT), 2
  UNION ALL SELECT 'ep', CAST(_model_param(ep, 'ep') AS BIGINT), 3
  UNION ALL SELECT 'dp', CAST(_model_param(dp, 'dp') AS BIGINT), 4
  UNION ALL SELECT 'pp', CAST(_model_param(pp, 'pp') AS BIGINT), 5
), hidden AS (
  SELECT count(*) AS n, list_sort(list(DISTINCT candidates) FILTER (WHERE candidates IS NOT NULL)) AS open_
  FROM pl WHERE kind = 'unknown' AND ops > 0
),
agg AS (
  SELECT kind, max(degree) AS degree, count(*) AS groups,
         list_sort(list(DISTINCT degree) FILTER (WHERE degree IS NOT NULL)) AS degrees,
         max(list_position(['named', 'inferred', 'assumed'], confidence)) AS weakest,  -- 'undecided': kind unknown
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
              ELSE format('unknown: {} group(s) of unknown kind carry traffic{}; give --layout {}=N',
                          (SELECT n FROM hidden),
                          CASE WHEN len((SELECT open_ FROM hidden)) > 0
                               THEN format(' (undecided: {})', array_to_string((SELECT open_ FROM hidden), '; '))
                               ELSE '' END, l.kind) END,
         CASE WHEN a.kind IS NOT NULL AND l.n IS NOT NULL AND l.n <> a.degree
              THEN format('--layout says {}={}; the trace''s groups win', l.kind, l.n) END) AS evidence
FROM lay l LEFT JOIN agg a USING (kind)
WHERE EXISTS (SELECT 1 FROM ranks)  -- a job without ranks has no layout to describe
ORDER BY l.o;
