-- @include overlap/timeline.sql
-- @include model/layout.sql
-- @include model/formulas.sql
-- @include exposure/causes.sql
-- Expected against measured communication volume per step (Anthony et al. 2024; formulas: model/formulas.sql).
--
-- Measured bytes follow the formulas' convention: nccl-tests' size S (comm_ops.msg_bytes; for a fused send_recv
-- kernel its in_bytes count as sent and its out_bytes as received), summed per rank over the operations of one
-- step on the groups of one kind (parallel_layout), then averaged over the job's traced ranks (in a layout of
-- complete dimensions every rank is in one group of each kind; a rank without such traffic counts as 0).
-- Point-to-point operations count as pipeline traffic when the pipeline degree is above 1, unless their group is a
-- TP, DP, EP or CP group. An operation belongs to the step whose window (_overlap_steps: the k-th iteration range of every
-- rank is step k) holds its launch (the CUDA API call, else the kernel start); a job without steps is one step;
-- operations outside every step of a job with steps are left out.

-- @view _model_op_rank_steps
-- @sweep per_rank
-- Step of its rank of every communication operation: the ordinal of the step (_overlap_steps) of its rank whose CPU
-- range holds the operation's launch call (_exposure_launches: same rank and correlation id), or its kernel start
-- when no launch call is known; NULL when no step of the rank holds it. A view, so that ingest stores it with the
-- other shared sweeps (nsys2comm.cache): the launch look-up over every API call was a third of volume_check. Each
-- row depends on its rank's rows only (the job-wide "no steps at all" rule, _overlap_step_window, is applied by
-- _model_op_steps).
-- @column kernel_id: Communication kernel (comm_ops.kernel_id).
-- @column rank_step_ord: Ordinal of the rank's step holding the launch, NULL when none.
CREATE OR REPLACE VIEW _model_op_rank_steps AS
WITH st AS (SELECT rank, step_ord, step_start_ns, step_end_ns FROM _overlap_steps()),
launch AS (SELECT rank, correlation_id, launch_start_ns AS l_ns FROM _exposure_launches
), k AS (
  SELECT o.kernel_id, o.rank, coalesce(l.l_ns, k.start_ns) AS t
  FROM comm_ops o JOIN kernels k USING (kernel_id)
  LEFT JOIN launch l ON l.rank = k.rank AND l.correlation_id = k.correlation_id
)
SELECT k.kernel_id, CASE WHEN k.t < s.step_end_ns THEN s.step_ord END AS rank_step_ord
FROM k ASOF LEFT JOIN st s ON k.rank = s.rank AND k.t >= s.step_start_ns;

-- @macro _model_op_steps
-- Step window of every communication operation: its rank's step (_model_op_rank_steps), the k-th step of every
-- rank being window k; 1 for every operation when the job has no steps; NULL outside every step of a job with
-- steps.
-- @column kernel_id: Communication kernel (comm_ops.kernel_id).
-- @column step_ord: Step ordinal, 1 without steps, NULL outside steps.
CREATE OR REPLACE MACRO _model_op_steps() AS TABLE
SELECT kernel_id,
       _overlap_step_window(rank_step_ord, 1) AS step_ord
FROM _model_op_rank_steps;

-- @macro volume_check
-- Per step and per (group kind, collective): the bytes the formulas of model/formulas.sql predict for the model
-- and layout given, the bytes measured in the trace, their ratio and a verdict with its reason. Bytes are per rank
-- per step in nccl-tests' size S (this file's description; the *_wire_bytes columns multiply by the bus-bandwidth
-- factor). Verdicts: 'match' when match_lo <= ratio <= match_hi, 'over' above, 'under' below (ratio 0: nothing
-- measured); 'unexpected' for measured traffic no formula predicts (a collective the scheme does not use on that
-- kind of group, or traffic on the group of all ranks); 'not_evaluated' with the reason when the model, the layout
-- (a degree, the group's kind) or the message sizes are unknown, or for expert/context parallelism (no formula).
-- Operations of unknown size never pass: with some unsized, the ratio of the sized ones is a lower bound and only
-- 'over' is said. 'assumed' replaces match / over / under for an all_gather or reduce_scatter row with operations
-- whose group size is the world size the importer assumed (comm_ops.group_source 'assumed_world_size'): their size S
-- is the per-rank buffer times the group size, so the ratio rests on the assumption (the all_gather and the
-- reduce_scatter of one buffer would otherwise contradict each other); every other row with such operations keeps
-- its verdict and its reason says 'group size assumed = world size'. Layout: the degrees of parallel_degrees (the trace's groups, else the parameters), ZeRO stage:
-- the parameter, else inferred from the DP groups' traffic (all_reduce only: 0; all_gather at least 1.5× the
-- reduce_scatter bytes: 3; else 1), said in the reason. Every model and layout parameter is NULL when unknown
-- and falls back to the session's --model / --layout (_model_param).
-- @param layers: Transformer layers L.
-- @param hidden: Hidden size h.
-- @param ffn: MLP inner size; NULL: 4h.
-- @param heads: Attention heads (used with kv_heads).
-- @param kv_heads: Key/value heads for grouped-query attention; NULL: as many as heads.
-- @param seq: Sequence length s (tokens per sample).
-- @param micro_batch: Micro-batch size b (samples per micro-batch per DP rank).
-- @param vocab: Vocabulary size V (padded).
-- @param dtype: Element type of parameters and activations as communicated ('bf16', 'fp16', 'fp32', ...).
-- @param grad_dtype: Element type gradients are reduced in; NULL: dtype.
-- @param params: Parameter count P, when known (overrides the count from layers, hidden, ffn, vocab).
-- @param tied: True when input and output embeddings are tied; NULL: false.
-- @param gated: True for a gated (SwiGLU) MLP with 3 matrices; NULL: false.
-- @param tp: Tensor-parallel degree; NULL: from the trace (parallel_degrees).
-- @param pp: Pipeline-parallel degree; NULL: from the trace.
-- @param dp: Data-parallel degree; NULL: from the trace.
-- @param cp: Context-parallel degree; NULL: from the trace (activations per rank hold s/cp tokens).
-- @param ep: Expert-parallel degree; NULL: from the trace (labelled only: no formula).
-- @param zero: ZeRO stage 0 (DDP), 1, 2 or 3; NULL: inferred from the DP groups' traffic.
-- @param sequence_parallel: True with Megatron sequence parallelism (TP all_gather/reduce_scatter); NULL: false.
-- @param micro_batches: Micro-batches per step (gradient accumulation / pipeline micro-batches); NULL: 1, said in the reason.
-- @param recompute: True with full activation recomputation; NULL: false.
-- @param pp_split: True when pipeline sends are split across the TP ranks (Megatron-LM default); NULL: true.
-- @param match_lo: Lowest ratio measured / predicted that is a 'match'.
-- @param match_hi: Highest ratio measured / predicted that is a 'match'.
-- @column step_ord: Step (the k-th iteration range of every rank, _overlap_steps); 1 when the job has no steps.
-- @column step_no: N of the step's name ('ProfilerStep#N'), the smallest over ranks; NULL without steps.
-- @column kind [key]: Group kind ('tp', 'dp', 'pp', 'ep', 'cp', 'world', 'unknown'; parallel_layout).
-- @column collective [key]: Canonical collective ('send' and 'recv' for pipeline traffic).
-- @column scheme: What the prediction models: 'DDP', 'ZeRO-1', 'ZeRO-2', 'ZeRO-3', 'DP (ZeRO stage unknown)', 'TP', 'TP+SP', 'PP'; NULL when nothing predicts this row.
-- @column degree: Degree of the kind (parallel_degrees), NULL when unknown.
-- @column ranks: Traced ranks the measured bytes are averaged over.
-- @column ops: Measured operations in the step (all ranks).
-- @column unsized_ops: Of those, operations of unknown size.
-- @column assumed_ops: Of those, operations whose group size is the world size the importer assumed (no group recorded).
-- @column predicted_bytes [key]: Predicted S bytes per rank in the step; NULL when not predicted or inputs are unknown.
-- @column measured_bytes [key]: Measured S bytes per rank in the step (mean over ranks, sized operations only); 0 when nothing was measured, NULL when no operation has a size.
-- @column measured_min_bytes: Smallest per-rank measured bytes (NULL when no operation has a size).
-- @column measured_max_bytes: Largest per-rank measured bytes (NULL when no operation has a size).
-- @column ratio [key]: measured_bytes / predicted_bytes; NULL when not predicted.
-- @column predicted_wire_bytes: predicted_bytes × busbw_factor(collective, degree): bytes on the wire per rank.
-- @column measured_wire_bytes: measured_bytes × busbw_factor(collective, degree).
-- @column verdict [key]: 'match', 'over', 'under', 'assumed' (a ratio resting on an assumed group size, see description), 'unexpected' or 'not_evaluated'.
-- @column reason: One sentence: the scheme, the ratio and what explains it, or why it was not evaluated.
-- @column formula: The prediction with its numbers (NULL when not predicted).
CREATE OR REPLACE MACRO volume_check(layers := NULL, hidden := NULL, ffn := NULL, heads := NULL, kv_heads := NULL,
                                     seq := NULL, micro_batch := NULL, vocab := NULL, dtype := NULL,
                                     grad_dtype := NULL, params := NULL, tied := NULL, gated := NULL, tp := NULL,
                                     pp := NULL, dp := NULL, cp := NULL, ep := NULL, zero := NULL,
                                     sequence_parallel := NULL, micro_batches := NULL, recompute := NULL,
                                     pp_split := NULL, match_lo := 0.8, match_hi := 1.25) AS TABLE
WITH inp AS (
  SELECT CAST(_model_param(layers, 'layers') AS DOUBLE) AS m_l, CAST(_model_param(hidden, 'hidden') AS DOUBLE) AS m_h,
         CAST(_model_param(ffn, 'ffn') AS DOUBLE) AS m_ffn, CAST(_model_param(heads, 'heads') AS DOUBLE) AS m_heads,
         CAST(_model_param(kv_heads, 'kv_heads') AS DOUBLE) AS m_kv, CAST(_model_param(seq, 'seq') AS DOUBLE) AS m_s,
         CAST(_model_param(micro_batch, 'micro_batch') AS DOUBLE) AS m_b,
         CAST(_model_param(vocab, 'vocab') AS DOUBLE) AS m_v,
         CAST(_model_param(dtype, 'dtype') AS VARCHAR) AS m_dtype,
         _model_dtype_bytes(CAST(_model_param(dtype, 'dtype') AS VARCHAR)) AS m_bp,
         _model_dtype_bytes(CAST(coalesce(_model_param(grad_dtype, 'grad_dtype'), _model_param(dtype, 'dtype'))
                                 AS VARCHAR)) AS m_bg,
         CAST(_model_param(params, 'params') AS DOUBLE) AS m_p_given,
         CAST(_model_param(tied, 'tied') AS BOOLEAN) AS m_tied, CAST(_model_param(gated, 'gated') AS BOOLEAN) AS m_gated,
         CAST(_model_param(zero, 'zero') AS INTEGER) AS zero_given,
         coalesce(CAST(_model_param(sequence_parallel, 'sequence_parallel') AS BOOLEAN), false) AS m_sp,
         CAST(_model_param(micro_batches, 'micro_batches') AS DOUBLE) AS mb_given,
         coalesce(CAST(_model_param(recompute, 'recompute') AS BOOLEAN), false) AS m_rc,
         coalesce(CAST(_model_param(pp_split, 'pp_split') AS BOOLEAN), true) AS m_split,
         CAST(match_lo AS DOUBLE) AS lo, CAST(match_hi AS DOUBLE) AS hi
), deg AS (
  SELECT max(degree) FILTER (WHERE kind = 'tp') AS d_tp, max(degree) FILTER (WHERE kind = 'pp') AS d_pp,
         max(degree) FILTER (WHERE kind = 'dp') AS d_dp, max(degree) FILTER (WHERE kind = 'cp') AS d_cp,
         max(degree) FILTER (WHERE kind = 'ep') AS d_ep
  FROM parallel_degrees(tp := tp, pp := pp, dp := dp, cp := cp, ep := ep)
), gk AS (SELECT group_key, kind FROM _model_group_kinds(tp := tp, pp := pp, dp := dp, cp := cp)),
ops AS (  -- every operation with its step and kind, send_recv split into what it sent and what it received
  SELECT s.step_ord, r.rank, r.kernel_id, r.dtype AS op_dtype, x.coll AS collective, r.size_assumed,
         CASE WHEN r.collective IN ('send', 'recv', 'send_recv') AND (SELECT d_pp FROM deg) > 1
                   AND coalesce(g.kind, 'unknown') NOT IN ('tp', 'dp', 'ep', 'cp') THEN 'pp'
              ELSE coalesce(g.kind, 'unknown') END AS kind,
         CASE WHEN r.collective = 'send_recv' AND x.coll = 'send' THEN r.in_bytes
              WHEN r.collective = 'send_recv' THEN r.out_bytes ELSE r.msg_bytes END AS op_bytes
  FROM _model_group_records r  -- carries the operation's comm_ops sizes and type
  JOIN _model_op_steps() s ON s.kernel_id = r.kernel_id
  LEFT JOIN gk g ON g.group_key = r.group_key
  CROSS JOIN LATERAL (SELECT unnest(CASE WHEN r.collective = 'send_recv' THEN ['send', 'recv']
                                         ELSE [r.collective] END) AS coll) x
  WHERE r.kernel_id IS NOT NULL AND s.step_ord IS NOT NULL
), traced AS (SELECT rank FROM ranks),
n_traced AS (SELECT count(*) AS n FROM traced),
steps AS (
  SELECT DISTINCT s.step_ord, (SELECT min(step_no) FROM _overlap_steps() t WHERE t.step_ord = s.step_ord) AS step_no
  FROM (SELECT step_ord FROM _overlap_steps() UNION SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM _overlap_steps())) s
), zero_inf AS (  -- ZeRO stage from the DP groups' traffic over the whole trace
  SELECT CASE WHEN sum(op_bytes) FILTER (WHERE collective IN ('all_gather', 'reduce_scatter')) IS NULL
                   AND count(*) FILTER (WHERE collective = 'all_reduce') > 0 THEN 0
              WHEN sum(op_bytes) FILTER (WHERE collective = 'all_gather')
                   >= 1.5 * sum(op_bytes) FILTER (WHERE collective = 'reduce_scatter') THEN 3
              WHEN sum(op_bytes) FILTER (WHERE collective = 'reduce_scatter') > 0 THEN 1 END AS z,
         coalesce(bool_or(size_assumed) FILTER (WHERE collective IN ('all_gather', 'reduce_scatter')), false)
           AS z_assumed  -- the all_gather / reduce_scatter ratio rests on an assumed group size
  FROM ops WHERE kind = 'dp'
), cfg AS (
  SELECT inp.*, deg.*,
         coalesce(inp.zero_given, (SELECT z FROM zero_inf)) AS m_zero,
         inp.zero_given IS NULL AND (SELECT z FROM zero_inf) IS NOT NULL AS zero_inferred,
         (SELECT z_assumed FROM zero_inf) AS zero_on_assumed,
         coalesce(inp.mb_given, 1) AS m_mb,
         coalesce(inp.m_p_given, _model_param_count(inp.m_l, inp.m_h, inp.m_ffn, inp.m_heads, inp.m_kv, inp.m_v,
                                                    inp.m_tied, inp.m_gated)) AS m_p,
         inp.m_s / coalesce(deg.d_cp, 1) AS m_s_rank
  FROM inp CROSS JOIN deg
), expected AS (  -- (kind, collective) pairs the layout's schemes predict
  SELECT 'dp' AS kind, c AS collective,
         CASE m_zero WHEN 0 THEN 'DDP' ELSE 'ZeRO-' || m_zero END AS scheme
  FROM cfg CROSS JOIN unnest(CASE WHEN m_zero = 0 THEN ['all_reduce']
                                  WHEN m_zero IN (1, 2, 3) THEN ['reduce_scatter', 'all_gather'] END) AS t(c)
  WHERE d_dp > 1
  UNION ALL
  SELECT 'dp', 'all_reduce', 'DP (ZeRO stage unknown)' FROM cfg WHERE d_dp > 1 AND m_zero IS NULL
  UNION ALL
  SELECT 'tp', c, CASE WHEN m_sp THEN 'TP+SP' ELSE 'TP' END
  FROM cfg CROSS JOIN unnest(CASE WHEN m_sp THEN ['all_gather', 'reduce_scatter', 'all_reduce']
                                  ELSE ['all_reduce'] END) AS t(c)
  WHERE d_tp > 1
  UNION ALL
  SELECT 'pp', c, 'PP' FROM cfg CROSS JOIN unnest(['send', 'recv']) AS t(c) WHERE d_pp > 1
), pred AS (
  SELECT e.kind, e.collective, e.scheme,
    CASE e.kind
      WHEN 'dp' THEN _model_dp_bytes(e.collective, c.m_zero, c.m_p / (c.d_tp * c.d_pp), c.m_bp, c.m_bg,
                                     c.m_mb, c.m_rc)
      WHEN 'tp' THEN _model_tp_bytes(e.collective, c.m_sp, c.m_l, _model_tp_msg_bytes(c.m_b, c.m_s_rank, c.m_h, c.m_bp),
                                     c.m_b, c.m_s_rank, c.d_pp, c.m_mb, c.m_rc)
      WHEN 'pp' THEN _model_pp_bytes(e.collective, c.d_pp, c.m_mb,
                                     _model_pp_msg_bytes(c.m_b, c.m_s_rank, c.m_h, c.m_bp, c.d_tp, c.m_split))
    END AS predicted_bytes,
    list_filter([CASE WHEN c.m_p IS NULL AND e.kind = 'dp' THEN 'the parameter count (layers, hidden, vocab or params)' END,
                 CASE WHEN c.m_l IS NULL AND e.kind = 'tp' THEN 'layers' END,
                 CASE WHEN c.m_h IS NULL AND e.kind IN ('tp', 'pp') THEN 'hidden' END,
                 CASE WHEN c.m_s IS NULL AND e.kind IN ('tp', 'pp') THEN 'seq' END,
                 CASE WHEN c.m_b IS NULL AND e.kind IN ('tp', 'pp') THEN 'micro_batch' END,
                 CASE WHEN c.m_bp IS NULL THEN 'dtype' END,
                 CASE WHEN c.d_tp IS NULL AND e.kind IN ('dp', 'pp') THEN 'the tp degree' END,
                 CASE WHEN c.d_pp IS NULL AND e.kind IN ('dp', 'tp') THEN 'the pp degree' END,
                 CASE WHEN c.m_zero IS NULL AND e.kind = 'dp'
                      THEN format('the ZeRO stage (zero=N; {})',
                                  CASE WHEN (SELECT count(*) FROM ops WHERE kind = 'dp') = 0 THEN 'no DP traffic seen'
                                       ELSE 'the DP traffic does not tell' END) END],
                lambda x: x IS NOT NULL) AS unknowns,
    CASE e.kind
      WHEN 'dp' THEN format('{} {}: {}P/(t·p)·B = {}{}/({}·{})·{} B', e.scheme, e.collective,
                            CASE WHEN c.m_zero = 3 AND e.collective = 'all_gather'
                                 THEN format('{}·mb·', 2 + CASE WHEN c.m_rc THEN 1 ELSE 0 END)
                                 WHEN c.m_zero = 3 THEN 'mb·' ELSE '' END,
                            CASE WHEN c.m_zero = 3 AND e.collective = 'all_gather'
                                 THEN format('{}·{}·', 2 + CASE WHEN c.m_rc THEN 1 ELSE 0 END, _model_num(c.m_mb))
                                 WHEN c.m_zero = 3 THEN _model_num(c.m_mb) || '·' ELSE '' END,
                            _model_num(c.m_p), _model_num(c.d_tp), _model_num(c.d_pp),
                            _model_num(CASE WHEN e.collective = 'all_gather' THEN c.m_bp ELSE c.m_bg END))
      WHEN 'tp' THEN CASE
        WHEN e.collective = 'all_reduce' AND c.m_sp
          THEN format('{} all_reduce: mb/p·3·4·b·s (cross-entropy) = {}/{}·3·4·{}·{} B', e.scheme, _model_num(c.m_mb),
                      _model_num(c.d_pp), _model_num(c.m_b), _model_num(c.m_s_rank))
        ELSE format('{} {}: mb/p·({})·b·s·h·B{} = {}/{}·({}·{}·{}·{}·{}{}) B', e.scheme, e.collective,
                    CASE WHEN e.collective = 'all_gather' THEN format('{}L+1', 4 + 2 * c.m_rc::INT)
                         ELSE format('{}L+2', 4 + 2 * c.m_rc::INT) END,
                    CASE WHEN e.collective = 'all_reduce' THEN ' + mb/p·3·4·b·s (cross-entropy)' ELSE '' END,
                    _model_num(c.m_mb), _model_num(c.d_pp),
                    _model_num(_model_tp_layer_collectives(c.m_l, c.m_rc)
                               + CASE WHEN e.collective = 'all_gather' THEN 1 ELSE 2 END),
                    _model_num(c.m_b), _model_num(c.m_s_rank), _model_num(c.m_h), _model_num(c.m_bp),
                    CASE WHEN e.collective = 'all_reduce'
                         THEN format(' + 3·4·{}·{}', _model_num(c.m_b), _model_num(c.m_s_rank)) ELSE '' END) END
      WHEN 'pp' THEN format('PP {}: 2·mb·(p−1)/p·b·s·h·B{} = 2·{}·{}/{}·{}·{}·{}·{}{} B', e.collective,
                            CASE WHEN c.m_split THEN '/t' ELSE '' END, _model_num(c.m_mb), _model_num(c.d_pp - 1),
                            _model_num(c.d_pp), _model_num(c.m_b), _model_num(c.m_s_rank), _model_num(c.m_h),
                            _model_num(c.m_bp), CASE WHEN c.m_split THEN '/' || _model_num(c.d_tp) ELSE '' END)
    END AS formula
  FROM expected e CROSS JOIN cfg c
), per_rank AS (
  SELECT step_ord, kind, collective, rank, sum(op_bytes) AS b, count(*) AS n, count(*) - count(op_bytes) AS n_unsized,
         count(*) FILTER (WHERE size_assumed) AS n_assumed, _prelude_most_common(histogram(op_dtype)) AS op_dtype
  FROM ops GROUP BY ALL
), meas AS (
  SELECT p.step_ord, p.kind, p.collective, sum(p.n) AS ops, sum(p.n_unsized) AS unsized_ops,
         sum(p.n_assumed) AS assumed_ops,
         sum(p.b) / (SELECT n FROM n_traced) AS measured_bytes,  -- NULL when no operation has a size
         CASE WHEN sum(p.b) IS NULL THEN NULL
              WHEN count(DISTINCT p.rank) < (SELECT n FROM n_traced) THEN 0 ELSE min(coalesce(p.b, 0)) END
           AS measured_min_bytes,
         max(p.b) AS measured_max_bytes, _prelude_most_common(histogram(p.op_dtype)) AS op_dtype
  FROM per_rank p WHERE p.rank IN (SELECT rank FROM traced) GROUP BY ALL
), keys AS (
  SELECT st.step_ord, st.step_no, e.kind, e.collective FROM steps st CROSS JOIN pred e
  UNION
  SELECT m.step_ord, st.step_no, m.kind, m.collective FROM meas m JOIN steps st USING (step_ord)
), j AS (
  SELECT k.step_ord, k.step_no, k.kind, k.collective, p.scheme, p.predicted_bytes, p.unknowns, p.formula,
         p.kind IS NOT NULL AS is_predicted,
         coalesce(m.ops, 0) AS ops, coalesce(m.unsized_ops, 0) AS unsized_ops,
         coalesce(m.assumed_ops, 0) AS assumed_ops,
         CASE WHEN m.ops IS NULL THEN 0 ELSE m.measured_bytes END AS measured_bytes,  -- nothing measured: 0
         CASE WHEN m.ops IS NULL THEN 0 ELSE m.measured_min_bytes END AS measured_min_bytes,
         CASE WHEN m.ops IS NULL THEN 0 ELSE m.measured_max_bytes END AS measured_max_bytes, m.op_dtype,
         CASE k.kind WHEN 'tp' THEN c.d_tp WHEN 'dp' THEN c.d_dp WHEN 'pp' THEN c.d_pp WHEN 'cp' THEN c.d_cp
                     WHEN 'ep' THEN c.d_ep WHEN 'world' THEN (SELECT coalesce(max(world_size), count(*)) FROM ranks)
                     END AS degree,
         c.m_zero, c.zero_inferred, c.zero_on_assumed, c.mb_given, c.m_mb, c.d_tp, c.m_split, c.m_bp, c.m_dtype, c.lo, c.hi
  FROM keys k LEFT JOIN pred p ON p.kind = k.kind AND p.collective = k.collective
  LEFT JOIN meas m ON m.step_ord = k.step_ord AND m.kind = k.kind AND m.collective = k.collective
  CROSS JOIN cfg c
), v AS (
  SELECT *,
    CASE WHEN predicted_bytes > 0 THEN measured_bytes / predicted_bytes END AS ratio,
    CASE
      WHEN kind IN ('ep', 'cp') THEN 'not_evaluated'
      WHEN is_predicted AND predicted_bytes IS NOT NULL AND assumed_ops > 0 AND unsized_ops < ops
           AND collective IN ('all_gather', 'reduce_scatter') THEN 'assumed'  -- S = buffer × the assumed size
      WHEN kind = 'unknown' THEN 'not_evaluated'
      WHEN NOT is_predicted AND kind = 'dp' AND m_zero IS NULL AND collective IN ('all_gather', 'reduce_scatter')
        THEN 'not_evaluated'  -- a ZeRO stage would predict it
      WHEN NOT is_predicted THEN 'unexpected'
      WHEN predicted_bytes IS NULL THEN 'not_evaluated'
      WHEN ops > 0 AND unsized_ops = ops THEN 'not_evaluated'
      WHEN unsized_ops > 0 AND measured_bytes / predicted_bytes > hi THEN 'over'
      WHEN unsized_ops > 0 THEN 'not_evaluated'
      WHEN measured_bytes / predicted_bytes > hi THEN 'over'
      WHEN measured_bytes / predicted_bytes < lo THEN 'under'
      ELSE 'match' END AS verdict
  FROM j
), why AS (  -- what explains an over / under ratio, from the trace and the inputs
  SELECT *,
    CASE
      WHEN ratio = 0 THEN format('no {} measured on {} groups in this step', collective, kind)
      WHEN op_dtype IS NOT NULL AND dtype_bytes(op_dtype) IS NOT NULL AND m_bp IS NOT NULL
           AND dtype_bytes(op_dtype) <> m_bp AND _model_near(ratio, dtype_bytes(op_dtype) / m_bp)
        THEN format('the trace reduces in {} ({} B per element), the model says {} ({} B): set grad_dtype or dtype',
                    op_dtype, dtype_bytes(op_dtype), m_dtype, m_bp)
      WHEN scheme = 'ZeRO-3' AND collective = 'all_gather' AND _model_near(ratio, 2)
        THEN 'parameters gathered twice per step as often as predicted: 4 gathers per micro-batch instead of 2 '
             || '(forward and backward)'
      WHEN scheme = 'ZeRO-3' AND collective = 'all_gather' AND _model_near(ratio, 1.5)
        THEN 'a third parameter gather per micro-batch: activation recomputation re-gathers the parameters '
             || '(recompute=1)'
      WHEN scheme = 'ZeRO-3' AND collective = 'all_gather' AND _model_near(ratio, 0.5)
        THEN 'parameters gathered once per micro-batch instead of twice: kept after forward '
             || '(FSDP reshard_after_forward=False)'
      WHEN mb_given IS NULL AND ratio >= 1.8 AND _model_near(ratio, round(ratio))
           AND (kind IN ('tp', 'pp') OR scheme = 'ZeRO-3')
        THEN format('{} micro-batches per step? (micro_batches was not given: 1 assumed; give --layout '
                    || 'micro_batches={})', CAST(round(ratio) AS BIGINT), CAST(round(ratio) AS BIGINT))
      WHEN scheme IN ('DDP', 'ZeRO-1', 'ZeRO-2') AND m_mb > 1 AND _model_near(ratio, m_mb)
        THEN format('gradients reduced in every one of the {} micro-batches instead of once per step '
                    || '(no no_sync / accumulation fusion)', CAST(m_mb AS BIGINT))
      WHEN kind = 'pp' AND m_split AND d_tp > 1 AND _model_near(ratio, d_tp)
        THEN format('activations sent whole, not split across the {} TP ranks (pp_split=0, e.g. DeepSpeed)',
                    d_tp)
      WHEN kind = 'pp' AND NOT m_split AND d_tp > 1 AND _model_near(ratio, 1.0 / d_tp)
        THEN format('activations split across the {} TP ranks (Megatron scatter-gather: pp_split=1)', d_tp)
      WHEN verdict = 'over' THEN 'more traffic than the model predicts: a larger model or more micro-batches than '
                                 || 'given, or collectives repeated'
      WHEN verdict = 'under' THEN 'less traffic than the model predicts: a smaller model or fewer micro-batches than '
                                  || 'given, frozen parameters, or operations outside the step windows'
    END AS explain_
  FROM v
)
SELECT step_ord, step_no, kind, collective, scheme, CAST(degree AS BIGINT) AS degree,
       CAST((SELECT n FROM n_traced) AS BIGINT) AS ranks, CAST(ops AS BIGINT) AS ops,
       CAST(unsized_ops AS BIGINT) AS unsized_ops, CAST(assumed_ops AS BIGINT) AS assumed_ops,
       predicted_bytes::DOUBLE AS predicted_bytes, measured_bytes::DOUBLE AS measured_bytes,
       measured_min_bytes::DOUBLE AS measured_min_bytes, measured_max_bytes::DOUBLE AS measured_max_bytes,
       ratio::DOUBLE AS ratio,
       _model_wire_bytes(collective, predicted_bytes, degree)::DOUBLE AS predicted_wire_bytes,
       _model_wire_bytes(collective, measured_bytes, degree)::DOUBLE AS measured_wire_bytes,
       verdict,
       CASE
         WHEN kind IN ('ep', 'cp') THEN format('{} on {} groups: no volume formula for {} parallelism '
                                               || '(comm-models.md covers DP, ZeRO, TP and PP)', collective, kind,
                                               CASE kind WHEN 'ep' THEN 'expert' ELSE 'context' END)
         WHEN kind = 'unknown' THEN format('{} ×{} on groups of unknown kind (see parallel_layout): give --layout',
                                           collective, ops)
         WHEN NOT is_predicted AND verdict = 'not_evaluated'
           THEN format('{} on the dp group(s) ({} ops): not evaluated, the ZeRO stage is unknown (give --layout '
                       || 'zero=N)', collective, ops)
         WHEN verdict = 'unexpected' AND collective = 'barrier'
           THEN format('unexpected barrier on the {} group(s) ×{}: synchronisation, no model data', kind, ops)
         WHEN verdict = 'unexpected' AND kind = 'world'
           THEN format('unexpected {} on the group of all ranks ({} ops, {} per rank): no formula predicts it '
                       || '(barriers, metrics, initial or checkpoint broadcasts)', collective, ops,
                       _model_size(measured_bytes))
         WHEN verdict = 'unexpected'
           THEN format('unexpected {} on the {} group(s) ({} ops, {} per rank): {}', collective, kind, ops,
                       _model_size(measured_bytes),
                       CASE WHEN collective = 'all_to_all'
                            THEN 'all_to_all exchanges tokens or embedding rows (expert parallelism, DLRM-style '
                                 || 'embedding tables), which no formula here covers'
                            WHEN kind = 'dp' AND m_zero IS NOT NULL
                            THEN format('{} uses {}', CASE m_zero WHEN 0 THEN 'DDP' ELSE 'ZeRO-' || m_zero END,
                                        CASE WHEN m_zero = 0 THEN 'all_reduce' ELSE 'reduce_scatter and all_gather' END)
                                 || CASE WHEN collective = 'all_reduce' AND measured_bytes < 1048576
                                         THEN ' (this small: loss, norm or metric reductions?)' ELSE '' END
                            WHEN kind = 'dp' THEN 'the ZeRO stage is unknown'
                            WHEN kind = 'tp' THEN 'Megatron TP uses all_reduce (all_gather/reduce_scatter with '
                                                  || 'sequence_parallel=1)'
                            ELSE 'no formula predicts it' END)
         WHEN predicted_bytes IS NULL
           THEN format('{} {}: not evaluated, unknown: {}', scheme, collective, array_to_string(unknowns, ', '))
         WHEN ops > 0 AND unsized_ops = ops
           THEN format('{} {}: not evaluated, the trace has no message size for its {} operation(s)', scheme,
                       collective, ops)
         WHEN verdict = 'assumed'
           THEN format('{} {} volume {}× expected ({} per rank, predicted {}): not judged, group size assumed = '
                       || 'world size ({} of {} ops; the trace records no group, and the size S of {} is the '
                       || 'per-rank buffer times the group size)', scheme, collective, format('{:.2f}', ratio),
                       _model_size(measured_bytes), _model_size(predicted_bytes), assumed_ops, ops, collective)
         WHEN unsized_ops > 0 AND verdict = 'over'
           THEN format('{} {} volume at least {}× expected ({} of {} ops have no size): {}', scheme, collective,
                       format('{:.2f}', ratio), unsized_ops, ops, explain_)
         WHEN unsized_ops > 0
           THEN format('{} {}: not evaluated, {} of {} ops have no size (the sized ones give {}× expected, a lower '
                       || 'bound)', scheme, collective, unsized_ops, ops, format('{:.2f}', ratio))
         WHEN verdict = 'match'
           THEN format('{} {} volume {}× expected ({} ops; {} per rank, predicted {})', scheme, collective,
                       format('{:.2f}', ratio), ops, _model_size(measured_bytes), _model_size(predicted_bytes))
         ELSE format('{} {} volume {}× expected ({} per rank, predicted {}): {}', scheme, collective,
                     format('{:.2f}', ratio), _model_size(measured_bytes), _model_size(predicted_bytes),
                     explain_)
       END
       || CASE WHEN kind = 'dp' AND zero_inferred AND is_predicted
               THEN format(' [ZeRO stage {} inferred from the DP traffic{}; give --layout zero=N to set it]', m_zero,
                           CASE WHEN zero_on_assumed AND m_zero > 0
                                THEN ', whose all_gather and reduce_scatter sizes rest on the assumed group size'
                                ELSE '' END)
               ELSE '' END
       || CASE WHEN mb_given IS NULL AND is_predicted AND (kind IN ('tp', 'pp') OR scheme = 'ZeRO-3')
                    AND predicted_bytes IS NOT NULL AND coalesce(explain_, '') NOT LIKE '%micro_batches was not given%'
               THEN ' [1 micro-batch per step assumed]' ELSE '' END
       || CASE WHEN assumed_ops > 0 AND verdict <> 'assumed'
               THEN format(' [group size assumed = world size for {} of {} ops]', assumed_ops, ops)
               ELSE '' END AS reason,
       formula
FROM why
ORDER BY step_ord, list_position(['tp', 'cp', 'ep', 'dp', 'pp', 'world', 'unknown'], kind), collective;
