-- @include exposure/causes.sql
-- GEMM problems: the matrix multiply each GEMM kernel (kernel_class 'gemm') computes, from the shapes the trace
-- records for the PyTorch op that launched it.
--
-- Where the shapes come from:
--   * Kineto (record_shapes=True): the cpu_op's 'Input Dims' / 'Input type' (the importer keeps the matrix-multiply
--     ops listed in nsys2comm.ingest.kineto_rows.GEMM_CPU_OPS);
--   * Nsight Systems: PyTorch's emit_nvtx(record_shapes=True) range 'aten::mm, seq = N, op_id = M, sizes = [[..],
--     [..]]' (default NVTX domain, getNvtxStr in torch/csrc/profiler/util.cpp): shapes without dtypes.
-- A kernel belongs to the op whose range, on the thread that launched it (api_calls, same rank and correlation id,
-- as _exposure_launches), starts last at or before the launch call's start and has not ended by then: the
-- innermost matrix-multiply op around the launch (aten::linear → aten::addmm: the addmm). Ranges starting at the
-- same ns (integer-µs Kineto traces) are ordered innermost first: the earlier end, then mm/addmm/bmm/... before the
-- composite aten::linear / aten::matmul.
--
-- Argument order, as PyTorch records it (one 'Input Dims' entry per schema argument, aten/src/ATen/native/
-- native_functions.yaml; a Scalar or a missing optional tensor is []):
--   mm(self [M,K], mat2 [K,N]); _scaled_mm(self [M,K], mat2 [K,N], ...); mv(self [M,K], vec [K]): N = 1;
--   addmm(self = bias, mat1 [M,K], mat2 [K,N], beta, alpha), addmm_ likewise (self is the accumulator);
--   bmm(self [B,M,K], mat2 [B,K,N]); baddbmm(self, batch1 [B,M,K], batch2 [B,K,N], beta, alpha);
--   linear(input [..., K], weight [N,K], bias [N] or []): M = product of input's leading dims;
--   matmul(self, other) by torch.matmul's rules: 1-D·1-D a dot (M = N = 1); 1-D self is [1,K]; 1-D other gives
--   N = 1 with M = product of self's leading dims; N-D·2-D is folded into one mm (M = product of self's leading
--   dims, as PyTorch folds it); otherwise batch = product of the broadcast batch dims, M = self[-2], N = other[-1].
-- The inner dimensions must agree (K of both operands), else the shapes do not fit the op: 'unknown_layout'.

-- @macro _gemm_prod
-- Product of a list of dimensions as HUGEINT (1 for an empty list).
-- @param l: Dimensions.
CREATE OR REPLACE MACRO _gemm_prod(l) AS list_reduce(l::HUGEINT[], lambda a, b: a * b, 1::HUGEINT);

-- @macro _gemm_bcast_prod
-- Product of the broadcast of two batch shapes (torch broadcasting: right-aligned, a missing dim is 1, each dim
-- the larger of the two).
-- @param x: Batch dims of one operand.
-- @param y: Batch dims of the other.
CREATE OR REPLACE MACRO _gemm_bcast_prod(x, y) AS
  _gemm_prod(list_transform(range(1, greatest(len(x), len(y)) + 1), lambda i: greatest(
    CASE WHEN i > greatest(len(x), len(y)) - len(x) THEN x[i - greatest(len(x), len(y)) + len(x)] ELSE 1 END,
    CASE WHEN i > greatest(len(x), len(y)) - len(y) THEN y[i - greatest(len(x), len(y)) + len(y)] ELSE 1 END)));

-- @macro _gemm_mk
-- A GEMM problem as one struct (the type every branch of _gemm_problem returns).
-- @param m: Rows of the output.
-- @param n: Columns of the output.
-- @param k: Inner dimension.
-- @param batch: Independent problems (1 for a plain GEMM).
-- @param bias: True when the op adds a bias / accumulator to the product, false when not, NULL when unknown.
CREATE OR REPLACE MACRO _gemm_mk(m, n, k, batch, bias) AS
  {'m': TRY_CAST(m AS BIGINT), 'n': TRY_CAST(n AS BIGINT), 'k': TRY_CAST(k AS BIGINT),
   'batch': TRY_CAST(batch AS BIGINT), 'bias': bias::BOOLEAN};

-- @macro _gemm_problem
-- M, N, K, batch and bias of one op from its recorded input shapes (see the file header for each op's argument
-- order); NULL when the shapes do not fit the op (wrong ranks, inner dimensions that disagree, negative dims).
-- @param op: Op name ('aten::mm', ...).
-- @param d: Input shapes, one list per schema argument (BIGINT[][]).
CREATE OR REPLACE MACRO _gemm_problem(op, d) AS (
  CASE WHEN d IS NULL OR len(list_filter(flatten(d), lambda x: x IS NULL OR x < 0)) > 0 THEN NULL
    WHEN op IN ('aten::mm', 'aten::_scaled_mm') THEN
      CASE WHEN len(d) >= 2 AND len(d[1]) = 2 AND len(d[2]) = 2 AND d[1][2] = d[2][1]
           THEN _gemm_mk(d[1][1], d[2][2], d[1][2], 1, CASE WHEN op = 'aten::mm' THEN false END) END
    WHEN op = 'aten::mv' THEN
      CASE WHEN len(d) >= 2 AND len(d[1]) = 2 AND len(d[2]) = 1 AND d[1][2] = d[2][1]
           THEN _gemm_mk(d[1][1], 1, d[1][2], 1, false) END
    WHEN op IN ('aten::addmm', 'aten::addmm_') THEN
      CASE WHEN len(d) >= 3 AND len(d[2]) = 2 AND len(d[3]) = 2 AND d[2][2] = d[3][1]
           THEN _gemm_mk(d[2][1], d[3][2], d[2][2], 1, true) END
    WHEN op = 'aten::bmm' THEN
      CASE WHEN len(d) >= 2 AND len(d[1]) = 3 AND len(d[2]) = 3 AND d[1][1] = d[2][1] AND d[1][3] = d[2][2]
           THEN _gemm_mk(d[1][2], d[2][3], d[1][3], d[1][1], false) END
    WHEN op = 'aten::baddbmm' THEN
      CASE WHEN len(d) >= 3 AND len(d[2]) = 3 AND len(d[3]) = 3 AND d[2][1] = d[3][1] AND d[2][3] = d[3][2]
           THEN _gemm_mk(d[2][2], d[3][3], d[2][3], d[2][1], true) END
    WHEN op = 'aten::linear' THEN
      CASE WHEN len(d) >= 2 AND len(d[1]) >= 1 AND len(d[2]) = 2 AND d[1][-1] = d[2][2]
           THEN _gemm_mk(_gemm_prod(d[1][1:len(d[1]) - 1]), d[2][1], d[2][2], 1, len(d) >= 3 AND len(d[3]) > 0) END
    WHEN op = 'aten::matmul' THEN
      CASE WHEN len(d) < 2 OR len(d[1]) = 0 OR len(d[2]) = 0 THEN NULL
        WHEN len(d[1]) = 1 AND len(d[2]) = 1 THEN
          CASE WHEN d[1][1] = d[2][1] THEN _gemm_mk(1, 1, d[1][1], 1, false) END
        WHEN len(d[1]) = 1 THEN
          CASE WHEN d[1][1] = d[2][-2]
               THEN _gemm_mk(1, d[2][-1], d[1][1], _gemm_prod(d[2][1:len(d[2]) - 2]), false) END
        WHEN len(d[2]) = 1 THEN
          CASE WHEN d[1][-1] = d[2][1] THEN _gemm_mk(_gemm_prod(d[1][1:len(d[1]) - 1]), 1, d[1][-1], 1, false) END
        WHEN len(d[2]) = 2 THEN  -- 2-D·2-D, or N-D·2-D folded into one mm
          CASE WHEN d[1][-1] = d[2][1]
               THEN _gemm_mk(_gemm_prod(d[1][1:len(d[1]) - 1]), d[2][2], d[1][-1], 1, false) END
        ELSE
          CASE WHEN d[1][-1] = d[2][-2]
               THEN _gemm_mk(d[1][-2], d[2][-1], d[1][-1],
                             _gemm_bcast_prod(d[1][1:len(d[1]) - 2], d[2][1:len(d[2]) - 2]), false) END
      END
  END);

-- @macro _gemm_operand_index
-- Position (1-based) of the op's first matrix operand in its recorded inputs: 2 for addmm, addmm_ and baddbmm
-- (after self, the bias / accumulator), else 1.
-- @param op: Op name.
CREATE OR REPLACE MACRO _gemm_operand_index(op) AS
  CASE WHEN op IN ('aten::addmm', 'aten::addmm_', 'aten::baddbmm') THEN 2 ELSE 1 END;

-- @macro _gemm_dtype
-- Canonical dtype of a Kineto 'Input type' entry ('float', 'c10::BFloat16', 'c10::Float8_e4m3fn', ...), NULL when
-- it is not a tensor dtype ('Scalar', '').
-- @param t: The entry.
CREATE OR REPLACE MACRO _gemm_dtype(t) AS canonical_dtype(regexp_replace(coalesce(t, ''), '^c10::', ''));

-- @macro _gemm_layout
-- How one matrix operand is stored, from its recorded shape and strides (Kineto 'Input Strides', PyTorch >= 2.1
-- with record_shapes): 'N' row-major (the last dimension contiguous: the logical matrix), 'T' column-major (a
-- transposed view: the second-to-last dimension contiguous); NULL when unknown or neither (a strided slice).
-- @param d: The operand's dims.
-- @param s: Its strides.
CREATE OR REPLACE MACRO _gemm_layout(d, s) AS
  CASE WHEN d IS NULL OR s IS NULL OR len(d) < 2 OR len(s) <> len(d) THEN NULL
       WHEN s[-1] = 1 AND (d[-2] = 1 OR s[-2] >= d[-1]) THEN 'N'
       WHEN s[-2] = 1 AND (d[-1] = 1 OR s[-1] >= d[-2]) THEN 'T' END;

-- @macro _gemm_transposes
-- The layouts of A (M×K) and B (K×N) as stored, two letters ('NN', 'NT', 'TN', 'TT': 'T' = held transposed), from
-- the op's recorded shapes and strides in its argument order (file header); aten::linear's B is the weight
-- transposed (weight [N,K] row-major gives 'T'). NULL without strides, for 1-D operands and for aten::mv.
-- @param op: Op name.
-- @param d: Input shapes.
-- @param s: Input strides.
CREATE OR REPLACE MACRO _gemm_transposes(op, d, s) AS (
  CASE WHEN d IS NULL OR s IS NULL THEN NULL
    WHEN op IN ('aten::mm', 'aten::_scaled_mm', 'aten::bmm', 'aten::matmul') AND len(d) >= 2 AND len(s) >= 2
      THEN _gemm_layout(d[1], s[1]) || _gemm_layout(d[2], s[2])
    WHEN op IN ('aten::addmm', 'aten::addmm_', 'aten::baddbmm') AND len(d) >= 3 AND len(s) >= 3
      THEN _gemm_layout(d[2], s[2]) || _gemm_layout(d[3], s[3])
    WHEN op = 'aten::linear' AND len(d) >= 2 AND len(s) >= 2
      THEN _gemm_layout(d[1], s[1]) || CASE _gemm_layout(d[2], s[2]) WHEN 'N' THEN 'T' WHEN 'T' THEN 'N' END
  END);

-- @view _gemm_ops
-- Matrix-multiply op ranges with their recorded input shapes: Kineto cpu_ops (cpu_ranges kind 'cpu_op', args
-- 'Input Dims'/'Input type') and PyTorch emit_nvtx ranges in Nsight Systems exports (kind 'nvtx', default domain,
-- 'aten::<op>, seq = …, sizes = [[…]]'). Ranges with a NULL thread or end are left out (no launch can be placed
-- in them).
-- @column range_id: cpu_ranges.range_id.
-- @column rank: Rank.
-- @column pid: Process id (-1 when unknown).
-- @column tid: Thread id.
-- @column start_ns: Range start (ns).
-- @column end_ns: Range end (ns).
-- @column op_name: Op name ('aten::mm', ...).
-- @column dims: Recorded input shapes (BIGINT[][]), NULL when the trace records none.
-- @column types: Recorded input types (Kineto 'Input type'), NULL when none (always NULL from NVTX).
-- @column strides: Recorded input strides (Kineto 'Input Strides', PyTorch >= 2.1), NULL when none.
-- @column shape_source: 'kineto_input_dims' or 'nvtx_sizes' when shapes were recorded, else NULL.
-- @column inner_rank: 0 for ops that launch GEMM kernels themselves, 1 for the composites aten::linear and
-- aten::matmul (the order among ranges that start at the same ns).
CREATE OR REPLACE VIEW _gemm_ops AS
WITH _gemm_raw AS (
  SELECT range_id, rank, coalesce(pid, -1) AS pid, tid, start_ns, end_ns, name AS op_name,
         TRY_CAST(json_extract(args, '$."Input Dims"') AS BIGINT[][]) AS dims,
         TRY_CAST(json_extract(args, '$."Input type"') AS VARCHAR[]) AS types,
         TRY_CAST(json_extract(args, '$."Input Strides"') AS BIGINT[][]) AS strides, 'kineto_input_dims' AS src
  FROM cpu_ranges
  WHERE kind = 'cpu_op' AND name IN ('aten::mm', 'aten::addmm', 'aten::addmm_', 'aten::bmm', 'aten::baddbmm',
                                     'aten::matmul', 'aten::linear', 'aten::_scaled_mm', 'aten::mv')
  UNION ALL
  SELECT range_id, rank, coalesce(pid, -1), tid, start_ns, end_ns, regexp_extract(name, '^(aten::[A-Za-z_]+)', 1),
         TRY_CAST(nullif(regexp_extract(name, ', sizes = (\[(?:\[[-0-9, ]*\](?:, )?)*\])', 1), '') AS BIGINT[][]),
         NULL::VARCHAR[], NULL::BIGINT[][], 'nvtx_sizes'
  FROM cpu_ranges
  WHERE kind = 'nvtx' AND domain IS NULL
    AND regexp_matches(name, '^aten::(mm|addmm_?|bmm|baddbmm|matmul|linear|_scaled_mm|mv)(,|$)')
)
SELECT range_id, rank, pid, tid, start_ns, end_ns, op_name, dims, types, strides,
       CASE WHEN dims IS NOT NULL THEN src END AS shape_source,
       CASE WHEN op_name IN ('aten::linear', 'aten::matmul') THEN 1 ELSE 0 END AS inner_rank
FROM _gemm_raw
WHERE tid IS NOT NULL AND end_ns IS NOT NULL;

-- @view _gemm_kernel_problems
-- One row per GEMM kernel (kernel_class 'gemm'): its op and problem, unordered (gemm_problems documents the
-- columns and orders them). Every row depends on its rank's rows only.
-- @column kernel_id: GEMM kernel id.
-- @column rank: Rank.
-- @column short_name: Kernel base name.
-- @column start_ns: Kernel start (ns).
-- @column duration_ns: Kernel duration (ns).
-- @column op_range_id: cpu_ranges.range_id of the op, NULL when none.
-- @column op_name: Op name, NULL when none.
-- @column shape_source: 'kineto_input_dims', 'nvtx_sizes' or NULL.
-- @column m: M.
-- @column n: N.
-- @column k: K.
-- @column batch: Batch.
-- @column dtype: Operand dtype.
-- @column transposes: Layouts of A and B as stored.
-- @column has_bias: Bias / accumulator added.
-- @column op_gemm_kernels: GEMM kernels of the op.
-- @column op_duration_ns: Summed duration of the op's GEMM kernels (ns), NULL without an op.
-- @column kernel_name: Full kernel name.
-- @column device_id: Device id.
-- @column grid_ctas: CTAs of the launch grid (grid_x·grid_y·grid_z).
-- @column flops: 2·M·N·K·batch on the op's main kernel.
-- @column bias_flops: M·N·batch when a bias is added, 0 without, on the main kernel.
-- @column moved_bytes: Inputs + output (bytes) on the main kernel.
-- @column status: 'main', 'auxiliary', 'no_launch', 'no_op', 'no_shapes' or 'unknown_layout'.
CREATE OR REPLACE VIEW _gemm_kernel_problems AS
WITH _gemm_k AS (
  SELECT k.kernel_id, k.rank, k.short_name, k.name AS kernel_name, k.device_id,
         k.grid_x::BIGINT * k.grid_y * k.grid_z AS grid_ctas, k.start_ns, k.end_ns - k.start_ns AS duration_ns,
         l.pid, l.tid, l.launch_start_ns
  FROM kernels k
  LEFT JOIN _exposure_launches l ON l.rank = k.rank AND l.correlation_id = k.correlation_id
  WHERE k.kernel_class = 'gemm'
), _gemm_o AS (  -- one range per start on a thread: the innermost (earlier end, then the op over its composite)
  SELECT * FROM _gemm_ops
  QUALIFY row_number() OVER (PARTITION BY rank, pid, tid, start_ns ORDER BY end_ns, inner_rank, range_id DESC) = 1
), _gemm_link AS (  -- the as-of join and the per-op windows only where the rank has op ranges: a trace without
  -- them (nsys without emit_nvtx) would sort its millions of GEMM kernels for nothing
  SELECT k.*, CASE WHEN k.launch_start_ns <= o.end_ns THEN o.range_id END AS op_range_id
  FROM (SELECT * FROM _gemm_k WHERE rank IN (SELECT rank FROM _gemm_o)) k
  ASOF LEFT JOIN _gemm_o o ON o.rank = k.rank AND o.pid = k.pid AND o.tid = k.tid AND k.launch_start_ns >= o.start_ns
), _gemm_p AS (
  SELECT l.*, o.op_name, o.shape_source, o.dims, o.types, o.strides, _gemm_problem(o.op_name, o.dims) AS p,
         count(*) OVER op AS op_gemm_kernels, sum(l.duration_ns) OVER op AS op_duration_ns,
         row_number() OVER (op ORDER BY l.duration_ns DESC, l.start_ns, l.kernel_id) = 1 AS longest
  FROM _gemm_link l JOIN _gemm_ops o ON o.range_id = l.op_range_id
  WINDOW op AS (PARTITION BY l.op_range_id)
  UNION ALL BY NAME
  SELECT *, NULL::BIGINT AS op_range_id FROM _gemm_k WHERE rank NOT IN (SELECT rank FROM _gemm_o)
  UNION ALL BY NAME
  SELECT * FROM _gemm_link WHERE op_range_id IS NULL
), _gemm_d AS (
  SELECT *, _gemm_dtype(types[_gemm_operand_index(op_name)]) AS dtype,
         CASE WHEN p IS NOT NULL AND longest THEN 'main'
              WHEN p IS NOT NULL THEN 'auxiliary'
              WHEN tid IS NULL OR launch_start_ns IS NULL THEN 'no_launch'
              WHEN op_range_id IS NULL THEN 'no_op'
              WHEN dims IS NULL THEN 'no_shapes'
              ELSE 'unknown_layout' END AS status
  FROM _gemm_p
)
SELECT kernel_id, rank, short_name, start_ns, duration_ns, op_range_id, op_name, shape_source,
       p.m, p.n, p.k, p.batch, dtype,
       CASE WHEN p IS NOT NULL THEN _gemm_transposes(op_name, dims, strides) END AS transposes, p.bias AS has_bias,
       op_gemm_kernels, op_duration_ns, kernel_name, device_id, grid_ctas,
       CASE WHEN status = 'main' THEN TRY_CAST(2::HUGEINT * p.m * p.n * p.k * p.batch AS BIGINT) END AS flops,
       CASE WHEN status = 'main' THEN
         CASE WHEN p.bias THEN TRY_CAST(p.m::HUGEINT * p.n * p.batch AS BIGINT) WHEN NOT p.bias THEN 0 END
       END AS bias_flops,
       -- each tensor input at its own dtype, the output (M·N·batch) at the operand dtype; _scaled_mm's output
       -- dtype is an argument whose position changed across PyTorch versions: unknown
       CASE WHEN status = 'main' AND op_name <> 'aten::_scaled_mm' AND dtype IS NOT NULL THEN
         TRY_CAST(list_sum(list_transform(range(1, least(len(dims), len(types)) + 1), lambda i:
                    CASE WHEN len(dims[i]) > 0 AND _gemm_dtype(types[i]) IS NOT NULL
                         THEN _gemm_prod(dims[i]) * dtype_bytes(_gemm_dtype(types[i])) ELSE 0 END))
                  + p.m::HUGEINT * p.n * p.batch * dtype_bytes(dtype) AS BIGINT)
       END AS moved_bytes,
       status
FROM _gemm_d;

-- @macro gemm_problems
-- The matrix multiply of every GEMM kernel (kernel_class 'gemm'), from the shapes the trace records for the op
-- that launched it (see the file header: sources, the launch → op link, each op's argument order). One op may
-- launch several GEMM kernels (split-K and its splitKreduce, cuBLAS epilogues): the longest one (then the
-- earliest, then the lowest id) is the op's 'main' kernel and carries its FLOPs and bytes; the others are
-- 'auxiliary', with the op's shape and NULL FLOPs. Kernels without a shape carry NULL M/N/K/FLOPs and their
-- reason in status.
-- @column kernel_id [key]: GEMM kernel id.
-- @column rank [key]: Rank.
-- @column short_name [key]: Kernel base name.
-- @column start_ns: Kernel start (ns).
-- @column duration_ns [key]: Kernel duration (ns).
-- @column op_range_id: cpu_ranges.range_id of the op whose range encloses the kernel's launch; NULL when none.
-- @column op_name [key]: That op ('aten::mm', 'aten::addmm', ...); NULL when none.
-- @column shape_source: 'kineto_input_dims' (record_shapes=True) or 'nvtx_sizes' (emit_nvtx(record_shapes=True));
-- NULL when the op records no shapes or there is no op.
-- @column m [key]: Rows of the output (for linear and folded matmul: the product of the input's leading dims); NULL
-- without a shape.
-- @column n [key]: Columns of the output; NULL without a shape.
-- @column k [key]: Inner (reduction) dimension; NULL without a shape.
-- @column batch [key]: Independent problems (bmm/baddbmm batch, matmul's broadcast batch; 1 otherwise); NULL without a
-- shape.
-- @column dtype: Canonical dtype of the first matrix operand ('bfloat16', 'float32', 'float8_e4m3', ...); NULL
-- when the trace records no types (NVTX sizes) or the type is not a known dtype.
-- @column transposes: How A (M×K) and B (K×N) are stored, from the recorded strides (Kineto 'Input Strides', PyTorch
-- >= 2.1): 'NN', 'NT', 'TN', 'TT', 'T' for an operand held transposed (a column-major view, e.g. a weight.t());
-- NULL without strides (older traces, NVTX sizes) or for a strided slice.
-- @column has_bias: True when the op adds a bias or accumulator (addmm, addmm_, baddbmm, linear with a bias),
-- false when not; NULL without a shape and for _scaled_mm (its bias argument moved across PyTorch versions).
-- @column op_gemm_kernels: GEMM kernels linked to the same op (1 for a single-kernel GEMM); NULL without an op.
-- @column flops [key]: 2·M·N·K·batch (multiply-adds × 2, the bias excluded) on the op's main kernel; NULL on auxiliary
-- kernels and without a shape.
-- @column bias_flops: M·N·batch (one add per output element) when the op adds a bias, 0 when not, on the main
-- kernel; NULL on auxiliary kernels, without a shape and when has_bias is unknown.
-- @column moved_bytes: Bytes of every tensor input (each at its recorded dtype) plus the output (M·N·batch at the
-- operand dtype), each read or written once, on the main kernel; NULL on auxiliary kernels, without a shape,
-- without dtypes (NVTX sizes) and for _scaled_mm (output dtype not recorded).
-- @column status [key]: 'main' (the op's main kernel: FLOPs given), 'auxiliary' (another GEMM kernel of the op),
-- 'no_launch' (no launch call in api_calls: a CUDA graph replay, or a trace without runtime events),
-- 'no_op' (the launch lies in no recorded matrix-multiply op: record the ops with the PyTorch profiler, or
-- emit_nvtx under nsys), 'no_shapes' (the op records no shapes: profile with record_shapes=True),
-- 'unknown_layout' (recorded shapes that do not fit the op's arguments).
CREATE OR REPLACE MACRO gemm_problems() AS TABLE
SELECT kernel_id, rank, short_name, start_ns, duration_ns, op_range_id, op_name, shape_source, m, n, k, batch, dtype,
       transposes, has_bias, op_gemm_kernels, flops, bias_flops, moved_bytes, status
FROM _gemm_kernel_problems
ORDER BY rank, start_ns, kernel_id;
