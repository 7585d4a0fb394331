-- Analytical communication volume of the parallelism schemes, the one definition volume_check uses. Sources:
-- docs/comm-models.md ("Expected volume per parallelism scheme", with the worked example GPT-NeoX 1.3B), each formula
-- tested against it in tests/test_volume_check.py.
--
-- Convention (every macro here): bytes in nccl-tests' size S, which is comm_ops.msg_bytes (the all_reduce buffer,
-- the gathered all_gather output, the full reduce_scatter input, the bytes sent or received by one send / recv),
-- summed over ONE rank's operations in ONE training step (one optimizer step = micro_batches forward and backward
-- passes), never summed over ranks. Where ranks differ (pipeline stages: only the first holds the embedding, the
-- first and last stage send once per micro-batch, the middle ones twice) the value is the mean over ranks. Bytes
-- on the wire per rank (what docs/comm-models.md states, e.g. DDP 2·(d−1)/d·P·B) are S × busbw_factor(collective,
-- group degree): _model_wire_bytes. The ratio measured / predicted is the same in both conventions.
--
-- Notation as in docs/comm-models.md: P parameters, B bytes per element (dtype), L layers, h hidden size, s sequence
-- length, b micro-batch size, V vocabulary, t TP degree, p PP degree, d DP degree, mb micro-batches per step.

-- @macro _model_dtype_bytes
-- Bytes per element of a dtype name: 'bf16', 'fp16', 'fp32', 'fp8' and every spelling canonical_dtype knows;
-- NULL when unknown.
-- @param dtype: Element type name.
CREATE OR REPLACE MACRO _model_dtype_bytes(dtype) AS
  coalesce(dtype_bytes(canonical_dtype(dtype)),
           CASE lower(CAST(dtype AS VARCHAR)) WHEN 'fp16' THEN 2 WHEN 'fp32' THEN 4 WHEN 'fp64' THEN 8
                                              WHEN 'fp8' THEN 1 WHEN 'float8' THEN 1 END);

-- @macro _model_param_count
-- Parameters of a decoder-only transformer (EleutherAI/cookbook calc_transformer_params, docs/comm-models.md:
-- 2Vh + 4Lh² + 8Lh² + 8Lh + 2h), generalised: V·h embedding (twice when untied), per layer attention
-- 2h² + 2h·(h/heads·kv_heads) (4h² without grouped-query attention), MLP (2 or 3 when gated) × h·ffn, 8h of norms
-- and biases, and 2h for the final norm. Linear biases beyond that are ignored (as the cookbook does).
-- @param layers: L.
-- @param hidden: h.
-- @param ffn: MLP inner size; NULL: 4h.
-- @param heads: Attention heads; only used with kv_heads.
-- @param kv_heads: Key/value heads (grouped-query attention); NULL: as many as heads.
-- @param vocab: V (padded).
-- @param tied: True when input and output embeddings share one matrix; NULL: false (untied).
-- @param gated: True for a gated MLP (SwiGLU: 3 matrices); NULL: false (2 matrices).
CREATE OR REPLACE MACRO _model_param_count(layers, hidden, ffn, heads, kv_heads, vocab, tied, gated) AS
  CAST(vocab AS DOUBLE) * hidden * CASE WHEN coalesce(CAST(tied AS BOOLEAN), false) THEN 1 ELSE 2 END
  + CAST(layers AS DOUBLE) * (
      2.0 * hidden * hidden
      + 2.0 * hidden * CASE WHEN kv_heads IS NULL OR heads IS NULL OR heads = 0 THEN hidden
                            ELSE CAST(hidden AS DOUBLE) / heads * kv_heads END
      + CASE WHEN coalesce(CAST(gated AS BOOLEAN), false) THEN 3.0 ELSE 2.0 END * hidden
        * coalesce(CAST(ffn AS DOUBLE), 4.0 * hidden)
      + 8.0 * hidden)
  + 2.0 * hidden;

-- @macro _model_dp_bytes
-- Data parallelism and ZeRO (docs/comm-models.md, DDP and ZeRO), S bytes per rank per step on the
-- DP group, for the parameters one rank holds (p_rank = P/(t·p)): DDP (zero 0) all_reduce of all gradients once
-- per step (bucketed; gradient accumulation reduces at its boundary); ZeRO-1/2 reduce_scatter of the gradients
-- plus all_gather of the updated parameters, once per step; ZeRO-3 all_gather of the parameters before forward
-- and again before backward (a third time with activation recomputation) and reduce_scatter of the gradients, in
-- every micro-batch. NULL for a collective the scheme does not use, or unknown inputs. On the wire per rank this
-- is 2·(d−1)/d·P·B for DDP and ZeRO-1/2 and 3·(d−1)/d·P·B for ZeRO-3 (one micro-batch, no recomputation).
-- @param collective: Canonical collective.
-- @param zero: ZeRO stage 0 (DDP), 1, 2 or 3.
-- @param p_rank: Parameters per rank, P/(t·p).
-- @param b_param: Bytes per parameter element (B).
-- @param b_grad: Bytes per gradient element as reduced (B, or 4 for fp32 reduction).
-- @param micro_batches: Micro-batches per step (mb).
-- @param recompute: True with full activation recomputation.
CREATE OR REPLACE MACRO _model_dp_bytes(collective, zero, p_rank, b_param, b_grad, micro_batches, recompute) AS
  CAST(p_rank AS DOUBLE) * CASE
    WHEN zero = 0 AND collective = 'all_reduce' THEN b_grad
    WHEN zero IN (1, 2) AND collective = 'reduce_scatter' THEN b_grad
    WHEN zero IN (1, 2) AND collective = 'all_gather' THEN b_param
    WHEN zero = 3 AND collective = 'all_gather'
      THEN (2 + CASE WHEN recompute THEN 1 ELSE 0 END) * micro_batches * b_param
    WHEN zero = 3 AND collective = 'reduce_scatter' THEN micro_batches * b_grad
  END;

-- @macro _model_tp_msg_bytes
-- Size S of one Megatron tensor-parallel collective: the full activation b·s·h·B, independent of t
-- (docs/comm-models.md, Megatron tensor parallelism; worked example: 33,554,432 B for b=4, s=2048, h=2048, bf16).
-- @param micro_batch: b.
-- @param seq: s (per context-parallel rank: s/cp).
-- @param hidden: h.
-- @param b: Bytes per element (B).
CREATE OR REPLACE MACRO _model_tp_msg_bytes(micro_batch, seq, hidden, b) AS
  CAST(micro_batch AS DOUBLE) * seq * hidden * b;

-- @macro _model_tp_layer_collectives
-- Activation-sized TP collectives of the transformer layers per micro-batch over the whole model (docs/comm-models.md
-- §2.2): 4L all_reduces (2 forward: attention out-projection and MLP 4h→h; 2 backward: QKV and h→4h input
-- gradients), 6L with full activation recomputation (the forward pair again). With sequence parallelism each
-- all_reduce becomes one all_gather plus one reduce_scatter of the same S, so this is also the count of each.
-- @param layers: L.
-- @param recompute: True with full activation recomputation.
CREATE OR REPLACE MACRO _model_tp_layer_collectives(layers, recompute) AS
  (4 + CASE WHEN recompute THEN 2 ELSE 0 END) * CAST(layers AS DOUBLE);

-- @macro _model_tp_bytes
-- Megatron tensor parallelism (docs/comm-models.md), S bytes per rank per step on the TP group, the mean over the
-- p pipeline stages (a rank holds L/p layers; the embedding sits on the first stage, the output layer on the last).
-- Per micro-batch over the model, A = b·s·h·B: without sequence parallelism all_reduce of (layer count + 2) × A —
-- the layers (_model_tp_layer_collectives), the vocab-parallel embedding's forward reduce, and the column-parallel
-- output layer's backward reduce of its input gradient — plus 3 vocab-parallel cross-entropy all_reduces of b·s
-- fp32 values (4·b·s bytes each: max, predicted logit, sum of exponentials). With sequence parallelism:
-- all_gather (layer count + 1: the output layer's input gather) × A, reduce_scatter (layer count + 2: the
-- embedding's reduce and the output layer's gradient) × A, and the 3 cross-entropy all_reduces. NULL for a
-- collective the scheme does not use.
-- @param collective: Canonical collective.
-- @param sequence_parallel: True with Megatron sequence parallelism.
-- @param layers: L.
-- @param msg: _model_tp_msg_bytes (A).
-- @param micro_batch: b (for the cross-entropy reduces).
-- @param seq: s per rank (for the cross-entropy reduces).
-- @param pp: p.
-- @param micro_batches: mb.
-- @param recompute: True with full activation recomputation.
CREATE OR REPLACE MACRO _model_tp_bytes(collective, sequence_parallel, layers, msg, micro_batch, seq, pp,
                                        micro_batches, recompute) AS
  CAST(micro_batches AS DOUBLE) / pp * CASE
    WHEN NOT sequence_parallel AND collective = 'all_reduce'
      THEN (_model_tp_layer_collectives(layers, recompute) + 2) * msg + 3 * 4.0 * micro_batch * seq
    WHEN sequence_parallel AND collective = 'all_gather' THEN (_model_tp_layer_collectives(layers, recompute) + 1) * msg
    WHEN sequence_parallel AND collective = 'reduce_scatter'
      THEN (_model_tp_layer_collectives(layers, recompute) + 2) * msg
    WHEN sequence_parallel AND collective = 'all_reduce' THEN 3 * 4.0 * micro_batch * seq
  END;

-- @macro _model_pp_msg_bytes
-- Size S of one pipeline send (activation forward, gradient backward): s·b·h·B, divided by t when the tensor is
-- split across the TP ranks (Megatron-LM scatter_gather_tensors_in_pipeline, default on; DeepSpeed sends it whole)
-- (docs/comm-models.md, pipeline parallelism; worked example: 32 MiB, 16 MiB split at t=2).
-- @param micro_batch: b.
-- @param seq: s (per context-parallel rank).
-- @param hidden: h.
-- @param b: Bytes per element (B).
-- @param tp: t.
-- @param split: True when split across the TP ranks.
CREATE OR REPLACE MACRO _model_pp_msg_bytes(micro_batch, seq, hidden, b, tp, split) AS
  CAST(micro_batch AS DOUBLE) * seq * hidden * b / CASE WHEN split THEN tp ELSE 1 END;

-- @macro _model_pp_bytes
-- Pipeline parallelism (docs/comm-models.md), S bytes per rank per step of 'send' or 'recv': per stage boundary
-- one activation send forward and one gradient send backward per micro-batch; p stages have p−1 boundaries, so a
-- rank sends (and receives) 2·mb·(p−1)/p messages on average (the first and last stage mb, the others 2·mb).
-- Metadata sends (8–32 B, DeepSpeed) are left out. NULL for other collectives.
-- @param collective: 'send' or 'recv'.
-- @param pp: p.
-- @param micro_batches: mb.
-- @param msg: _model_pp_msg_bytes.
CREATE OR REPLACE MACRO _model_pp_bytes(collective, pp, micro_batches, msg) AS
  CASE WHEN collective IN ('send', 'recv') THEN 2.0 * micro_batches * (pp - 1) / pp * CAST(msg AS DOUBLE) END;

-- @macro _model_wire_bytes
-- Bytes one rank moves on the wire for S bytes of a collective over n ranks: S × busbw_factor(collective, n)
-- (nccl-tests' ring accounting; docs/comm-models.md, size S and bus bandwidth).
-- @param collective: Canonical collective.
-- @param s_bytes: Bytes in the nccl-tests size convention S.
-- @param n: Ranks in the group.
CREATE OR REPLACE MACRO _model_wire_bytes(collective, s_bytes, n) AS
  CAST(s_bytes AS DOUBLE) * busbw_factor(collective, n);

-- @macro _model_near
-- True when ratio x is within 10 % of k (a whole-number multiple the reasons name).
-- @param x: Ratio.
-- @param k: Multiple.
CREATE OR REPLACE MACRO _model_near(x, k) AS x IS NOT NULL AND k > 0 AND abs(x - k) <= 0.1 * k;

-- @macro _model_num
-- A number for the formula and reason texts: whole numbers as integers, others with 4 significant digits.
-- @param x: Number.
CREATE OR REPLACE MACRO _model_num(x) AS
  CASE WHEN x IS NULL THEN '?' WHEN x = round(x) AND abs(x) < 1e18 THEN CAST(CAST(x AS BIGINT) AS VARCHAR)
       ELSE format('{:.4g}', CAST(x AS DOUBLE)) END;

-- @macro _model_size
-- Bytes for the reason texts, binary units with 4 significant digits ('7.016 MiB').
-- @param x: Bytes.
CREATE OR REPLACE MACRO _model_size(x) AS
  CASE WHEN x IS NULL THEN '?'
       WHEN abs(x) >= 1073741824 THEN format('{:.4g} GiB', x / 1073741824.0)
       WHEN abs(x) >= 1048576 THEN format('{:.4g} MiB', x / 1048576.0)
       WHEN abs(x) >= 1024 THEN format('{:.4g} KiB', x / 1024.0)
       ELSE format('{:g} B', CAST(x AS DOUBLE)) END;
