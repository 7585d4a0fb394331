-- @include gemm/gemm.sql
-- @include devices/gemm_peaks.sql
-- @include overlap/overlap.sql
-- @include lateness/iterations.sql
-- @include model/layout.sql
-- @include model/formulas.sql
-- GEMM efficiency (issue 39): how fast each GEMM ran against its device's peak (docs/gemm-peaks.md), and the shape
-- rules that explain a low figure (alignment, tile and wave quantization), per kernel, per shape group and for the
-- job, with the MFU of the capture when a model is given.
--
-- Definitions:
--   achieved TFLOP/s  flops / duration: 2·M·N·K·batch of gemm_problems (the bias add excluded) over the main
--                     kernel's duration (per kernel), or over all the GEMM kernels of the op, split-K reductions
--                     included (op_achieved_tflops, shape groups, the job). A figure above the physical peak
--                     cannot be real (a wrong shape, device or clock): it is never shown as achieved (NULL,
--                     efficiency_check 'above_peak', physically_possible false).
--   math              what the peak is for: the operand dtype (recorded, else stated in the kernel name), with
--                     float32 split into 'tf32' (tensor cores: the name says tf32 / xf32 / s1688) and 'fp32'
--                     (CUDA cores); an fp32 kernel whose name says neither and that runs faster than the FP32 peak
--                     can only have used TF32 tensor cores: it is judged against the TF32 peak (math_source
--                     'achieved_rate').
--   roofline          attainable = min(peak, arithmetic intensity × memory bandwidth); the ridge point is
--                     peak / bandwidth (FLOP/byte); below it a GEMM is 'memory' bound, at or above 'compute'.
--                     Bytes moved are gemm_problems.moved_bytes (each input and the output once: a lower bound
--                     on traffic, so the intensity is an upper bound).
--   tile              the CTA tile stated in the kernel name (tilesize128x256x64, MT128x128x32, GemmShape<128,
--                     128, 32>, cutlass/nvjet '_128x256_64x3' as in nvjet_sm90_tst_256x128_64x4, sgemm_32x128). Names give it in the BLAS's
--                     column-major terms, where PyTorch's row-major C[M,N] is computed as Cᵀ = Bᵀ·Aᵀ: the first
--                     figure runs along PyTorch's N. The orientation is confirmed when the launch grid holds a
--                     whole multiple of the output tiles (the multiple is the split-K factor); otherwise the
--                     BLAS orientation is assumed and the kernel is taken to be persistent (its grid is not its
--                     tile count: waves come from the tiles).
--   waves             CTAs ÷ (SMs × resident CTAs per SM); one resident CTA per SM is assumed (the large tiles of
--                     tensor-core GEMMs fill an SM's shared memory; two would halve the waves), said in
--                     resident_blocks_assumed. Wave efficiency = CTAs / (whole waves × SMs).
--   alignment         the dtype's tensor-core granularity: 16 bytes (8 fp16/bf16 elements, 16 fp8/int8, 4
--                     tf32/fp32) at the minimum, 128 bytes (64 fp16/bf16, 128 fp8, 32 fp32) preferred.

-- @macro _gemm_name_dtype
-- The operand dtype a GEMM kernel's name states (cuBLAS/CUTLASS/xmma/nvjet/Tensile spellings), NULL when it
-- states none.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO _gemm_name_dtype(name) AS
  CASE WHEN name IS NULL THEN NULL
       WHEN regexp_matches(name, '(?i)e4m3|e5m2|fp8|f8f8') THEN 'float8_e4m3'
       WHEN regexp_matches(name, '(?i)bf16|bfloat16') OR regexp_matches(name, '_(BBS|BSS|BBH)_') THEN 'bfloat16'
       WHEN regexp_matches(name, '(?i)fp16|f16f16|h16816|h1688|hgemm|_half') OR regexp_matches(name, '_(HHS|HSS|HHH)_')
         THEN 'float16'
       WHEN regexp_matches(name, '(?i)dgemm|f64|d884|dmma') THEN 'float64'
       WHEN regexp_matches(name, '(?i)tf32|xf32|s1688|sgemm|ffma|f32f32|gemmSN') OR regexp_matches(name, '_(SB|SS)_')
         THEN 'float32'
  END;

-- @macro _gemm_math
-- The math type of a GEMM from its operand dtype and kernel name: 'fp64', 'fp32', 'tf32', 'fp16', 'bf16', 'fp8',
-- 'int8'; NULL for an unknown dtype.
-- @param dtype: Canonical operand dtype.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO _gemm_math(dtype, name) AS
  CASE dtype WHEN 'float16' THEN 'fp16' WHEN 'bfloat16' THEN 'bf16' WHEN 'float8_e4m3' THEN 'fp8'
             WHEN 'float8_e5m2' THEN 'fp8' WHEN 'int8' THEN 'int8' WHEN 'float64' THEN 'fp64'
             WHEN 'float32' THEN CASE WHEN regexp_matches(coalesce(name, ''), '(?i)tf32|xf32|s1688') THEN 'tf32'
                                      ELSE 'fp32' END END;

-- @macro _gemm_tile
-- The CTA tile a kernel name states, as a struct {a, b, k} in the name's order (a along the BLAS's M = PyTorch's
-- N); k NULL when the name gives no K tile; NULL when the name states no tile.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO _gemm_tile(name) AS (
  WITH x AS (SELECT coalesce(name, '') AS s),
  r AS (SELECT s,
    regexp_extract(s, 'tilesize(\d+)x(\d+)x(\d+)', ['a', 'b', 'k']) AS r1,
    regexp_extract(s, 'MT(\d+)x(\d+)x(\d+)', ['a', 'b', 'k']) AS r2,
    regexp_extract(s, 'GemmShape<\s*(\d+),\s*(\d+),\s*(\d+)\s*>', ['a', 'b', 'k']) AS r3,
    regexp_extract(s, '(?:gemm|nvjet)_(?:[a-z0-9]+_)*?(\d+)x(\d+)_(\d+)x\d+', ['a', 'b', 'k']) AS r4,
    regexp_extract(s, 'gemm_(?:[a-z0-9]+_)?(\d+)x(\d+)', ['a', 'b']) AS r5,
    regexp_extract(s, 'stages_(\d+)x\d+', 1) AS r5k FROM x)
  SELECT CASE WHEN r1.a <> '' THEN {'a': r1.a::INTEGER, 'b': r1.b::INTEGER, 'k': r1.k::INTEGER}
              WHEN r2.a <> '' THEN {'a': r2.a::INTEGER, 'b': r2.b::INTEGER, 'k': r2.k::INTEGER}
              WHEN r3.a <> '' THEN {'a': r3.a::INTEGER, 'b': r3.b::INTEGER, 'k': r3.k::INTEGER}
              WHEN r4.a <> '' THEN {'a': r4.a::INTEGER, 'b': r4.b::INTEGER, 'k': r4.k::INTEGER}
              WHEN r5.a <> '' THEN {'a': r5.a::INTEGER, 'b': r5.b::INTEGER, 'k': TRY_CAST(nullif(r5k, '') AS INTEGER)}
         END
  FROM r);

-- @macro _gemm_ceil_div
-- ⌈x / y⌉ for positive integers (NULL when either is NULL or y <= 0).
-- @param x: Dividend.
-- @param y: Divisor.
CREATE OR REPLACE MACRO _gemm_ceil_div(x, y) AS
  CASE WHEN y > 0 THEN (x::HUGEINT + y - 1) // y END;

-- @macro _gemm_quant
-- Tile and wave quantization of one GEMM as a struct: orientation of the named tile against the grid, output
-- tiles, split-K factor, CTAs, waves, last-wave fill and the two efficiencies (see the file header).
-- @param m: M.
-- @param n: N.
-- @param k: K.
-- @param batch: Batch.
-- @param ta: Tile figure along the BLAS's M (PyTorch N) as named.
-- @param tb: Tile figure along the BLAS's N (PyTorch M) as named.
-- @param tk: K tile, NULL when unknown.
-- @param grid_ctas: CTAs of the launch grid (grid_x·grid_y·grid_z), NULL when unknown.
-- @param sms: SMs of the device, NULL when unknown.
CREATE OR REPLACE MACRO _gemm_quant(m, n, k, batch, ta, tb, tk, grid_ctas, sms) AS (
  WITH o AS (
    SELECT _gemm_ceil_div(n, ta) * _gemm_ceil_div(m, tb) * batch AS t_blas,
           _gemm_ceil_div(m, ta) * _gemm_ceil_div(n, tb) * batch AS t_swap
  ), c AS (
    SELECT CASE WHEN ta IS NULL OR tb IS NULL THEN NULL
                WHEN grid_ctas > 0 AND grid_ctas % t_blas = 0 THEN 'blas_grid'
                WHEN grid_ctas > 0 AND grid_ctas % t_swap = 0 THEN 'swapped_grid'
                ELSE 'blas_assumed' END AS orient, t_blas, t_swap FROM o
  ), t AS (
    SELECT orient,
           CASE WHEN orient = 'swapped_grid' THEN ta ELSE tb END AS tile_m,
           CASE WHEN orient = 'swapped_grid' THEN tb ELSE ta END AS tile_n,
           CASE WHEN orient = 'swapped_grid' THEN t_swap WHEN orient IS NOT NULL THEN t_blas END AS tiles
    FROM c
  ), w AS (
    SELECT *, CASE WHEN orient IN ('blas_grid', 'swapped_grid') THEN grid_ctas // tiles END AS split_k,
           CASE WHEN orient IN ('blas_grid', 'swapped_grid') OR orient IS NULL THEN grid_ctas ELSE tiles END AS ctas,
           CASE WHEN orient IN ('blas_grid', 'swapped_grid') OR (orient IS NULL AND grid_ctas IS NOT NULL) THEN 'grid'
                WHEN orient IS NOT NULL THEN 'tiles' END AS wave_basis
    FROM t
  )
  SELECT {'orient': orient, 'tile_m': tile_m, 'tile_n': tile_n, 'tiles': tiles::BIGINT, 'split_k': split_k::BIGINT,
          'ctas': ctas::BIGINT, 'wave_basis': wave_basis,
          'waves': CASE WHEN sms > 0 THEN ctas::DOUBLE / sms END,
          'full_waves': CASE WHEN sms > 0 THEN _gemm_ceil_div(ctas, sms)::BIGINT END,
          'last_wave_fill_pct': CASE WHEN sms > 0 AND ctas > 0
                                     THEN 100.0 * (ctas - (_gemm_ceil_div(ctas, sms) - 1) * sms) / sms END,
          'wave_efficiency_pct': CASE WHEN sms > 0 AND ctas > 0
                                      THEN 100.0 * ctas / (_gemm_ceil_div(ctas, sms) * sms) END,
          'tile_efficiency_pct': CASE WHEN tile_m > 0 AND tile_n > 0 THEN
            100.0 * m * n * k / (_gemm_ceil_div(m, tile_m) * tile_m * _gemm_ceil_div(n, tile_n) * tile_n
                                 * CASE WHEN tk > 0 THEN _gemm_ceil_div(k, tk) * tk ELSE k END) END}
  FROM w);

-- @macro _gemm_model_time
-- Modelled time units of a GEMM under the tile and wave model: whole waves × K steps per tile
-- (⌈tiles / SMs⌉ × ⌈K / tk⌉; K itself when the K tile is unknown); NULL when the tile or SM count is unknown.
-- @param m: M.
-- @param n: N.
-- @param k: K.
-- @param batch: Batch.
-- @param tile_m: Tile along M.
-- @param tile_n: Tile along N.
-- @param tk: K tile, NULL when unknown.
-- @param sms: SMs.
CREATE OR REPLACE MACRO _gemm_model_time(m, n, k, batch, tile_m, tile_n, tk, sms) AS
  (_gemm_ceil_div(_gemm_ceil_div(m, tile_m) * _gemm_ceil_div(n, tile_n) * batch, sms)
   * CASE WHEN tk > 0 THEN _gemm_ceil_div(k, tk) ELSE k END)::DOUBLE;

-- @macro _gemm_align
-- Alignment granularities of a dtype as a struct {min, preferred} in elements: 16 and 128 bytes over the element
-- size; NULL for an unknown dtype.
-- @param dtype: Canonical dtype.
CREATE OR REPLACE MACRO _gemm_align(dtype) AS
  CASE WHEN dtype_bytes(dtype) > 0 THEN {'min': 16 // dtype_bytes(dtype), 'preferred': 128 // dtype_bytes(dtype)} END;

-- @macro _gemm_efficiency
-- gemm_efficiency's rows, unordered, for the queries that aggregate them (sorting millions of rows is most of
-- what an ordered copy would add).
-- @columns_of gemm_efficiency
CREATE OR REPLACE MACRO _gemm_efficiency() AS TABLE
WITH g AS (SELECT * FROM _gemm_kernel_problems
), nm AS (  -- what a kernel name states, once per distinct (recorded dtype, name): a job has millions of GEMM kernels
  -- and a few hundred names, and these regular expressions cost more than the rest of the query
  SELECT dtype, kernel_name, eff_dtype, dtype_source, _gemm_math(eff_dtype, kernel_name) AS math0,
         _gemm_tile(kernel_name) AS tile,
         regexp_matches(coalesce(kernel_name, ''), '(?i)sgemm|ffma|gemmSN') AS cuda_core_name,
         regexp_matches(coalesce(kernel_name, ''), '(?i)tf32|xf32|s1688|sgemm|ffma|gemmSN') AS fp32_math_name,
         TRY_CAST(nullif(regexp_extract(coalesce(kernel_name, ''), '_aligna?(\d+)', 1), '') AS INTEGER) AS kernel_align
  FROM (SELECT dtype, kernel_name, coalesce(dtype, _gemm_name_dtype(kernel_name)) AS eff_dtype,
               CASE WHEN dtype IS NOT NULL THEN 'recorded' WHEN _gemm_name_dtype(kernel_name) IS NOT NULL
                    THEN 'kernel_name' END AS dtype_source
        FROM (SELECT DISTINCT dtype, kernel_name FROM g))
), p AS (
  SELECT g.*, nm.eff_dtype, nm.dtype_source, nm.math0, nm.tile, nm.cuda_core_name, nm.fp32_math_name,
         nm.kernel_align
  FROM g JOIN nm ON nm.dtype IS NOT DISTINCT FROM g.dtype AND nm.kernel_name IS NOT DISTINCT FROM g.kernel_name
), d AS (
  SELECT p.*, dp.model AS device_model, dp.sm_count, dp.mem_bandwidth_gbps, dp.peak_source, dp.peak_reason,
         {'fp64': dp.fp64_tflops, 'fp32': dp.fp32_tflops, 'tf32': dp.tf32_tflops, 'fp16': dp.fp16_tflops,
          'bf16': dp.bf16_tflops, 'fp8': dp.fp8_tflops, 'int8': dp.int8_tops} AS pk
  FROM p LEFT JOIN gemm_device_peaks() dp ON dp.rank = p.rank AND dp.device_id = p.device_id
), e AS (
  SELECT d.*,
         CASE WHEN status = 'main' AND duration_ns > 0 THEN flops / duration_ns / 1000.0 END AS raw_tflops,
         CASE WHEN status = 'main' AND op_duration_ns > 0 THEN flops / op_duration_ns / 1000.0 END AS raw_op_tflops
  FROM d
), f AS (
  SELECT e.*,
         CASE WHEN math0 = 'fp32' AND NOT cuda_core_name
                   AND raw_tflops > pk.fp32 AND pk.tf32 IS NOT NULL AND coalesce(peak_source, '') <> 'peak_tflops'
              THEN 'tf32' ELSE math0 END AS math
  FROM e
),
x AS (
SELECT f.*,
       CASE WHEN math IS NULL THEN NULL WHEN math <> math0 THEN 'achieved_rate'
            WHEN math IN ('tf32', 'fp32') AND fp32_math_name THEN 'kernel_name'
            ELSE 'dtype' END AS math_source,
       _devices_gemm_peak_of(pk, math) AS peak_tflops,
       CASE WHEN m IS NOT NULL AND status = 'main' THEN
         _gemm_quant(m, n, k, batch, tile.a, tile.b, tile.k, grid_ctas, sm_count) END AS q
FROM f
), c AS (
  SELECT *,
         CASE WHEN status <> 'main' OR flops IS NULL THEN 'no_flops'
              WHEN duration_ns <= 0 THEN 'no_duration'
              WHEN peak_tflops IS NULL THEN 'no_peak'
              WHEN raw_tflops > peak_tflops * (1 + 1e-9) THEN 'above_peak'
              ELSE 'ok' END AS efficiency_check,
         CASE WHEN moved_bytes > 0 AND flops IS NOT NULL THEN flops::DOUBLE / moved_bytes END AS ai
  FROM x
), r AS (
  SELECT *, CASE WHEN mem_bandwidth_gbps > 0 THEN peak_tflops * 1000.0 / mem_bandwidth_gbps END AS ridge,
         least(peak_tflops, ai * mem_bandwidth_gbps / 1000.0) AS roof
  FROM c
)
SELECT kernel_id, rank, short_name, start_ns, duration_ns, op_range_id, op_name, status, m, n, k, batch,
       eff_dtype AS dtype, dtype_source, flops, moved_bytes,
       CASE WHEN status = 'main' THEN op_duration_ns END::BIGINT AS op_duration_ns, device_model, math, math_source,
       peak_tflops, CASE WHEN peak_tflops IS NOT NULL THEN peak_source END AS peak_source, mem_bandwidth_gbps,
       ai AS arithmetic_intensity, ridge AS ridge_flops_per_byte, roof AS roofline_tflops,
       CASE WHEN ai IS NULL OR ridge IS NULL THEN NULL WHEN ai >= ridge THEN 'compute' ELSE 'memory' END AS bound,
       CASE WHEN efficiency_check = 'ok' THEN raw_tflops END AS achieved_tflops,
       CASE WHEN efficiency_check = 'ok' THEN raw_op_tflops END AS op_achieved_tflops,
       CASE WHEN efficiency_check = 'ok' THEN 100.0 * raw_op_tflops / peak_tflops END AS pct_of_peak,
       CASE WHEN efficiency_check = 'ok' AND roof > 0 THEN 100.0 * raw_op_tflops / roof END AS pct_of_roofline,
       CASE efficiency_check WHEN 'ok' THEN true WHEN 'above_peak' THEN false END AS physically_possible,
       efficiency_check,
       CASE WHEN peak_tflops IS NOT NULL THEN NULL
            WHEN peak_reason IS NOT NULL THEN peak_reason
            WHEN device_model IS NULL THEN 'the device is not in the trace''s device list: give --peak-tflops'
            WHEN math IS NULL THEN 'operand dtype unknown (no recorded type, none in the kernel name)'
            ELSE 'the ' || device_model || ' has no ' || math || ' tensor-core peak' END AS peak_reason,
       q.tile_m::INTEGER AS tile_m, q.tile_n::INTEGER AS tile_n,
       CASE WHEN q.tile_m IS NOT NULL THEN tile.k END::INTEGER AS tile_k,
       CASE WHEN q.orient IN ('blas_grid', 'swapped_grid') THEN 'grid' WHEN q.orient = 'blas_assumed' THEN 'assumed'
       END AS tile_orientation,
       grid_ctas, q.tiles AS output_tiles, q.split_k, q.ctas, q.wave_basis, sm_count, q.waves,
       q.last_wave_fill_pct, q.wave_efficiency_pct, q.tile_efficiency_pct,
       kernel_align, op_gemm_kernels
FROM r;

-- @macro gemm_efficiency
-- Per GEMM kernel: its problem (gemm_problems), the achieved TFLOP/s, the device's peak for its math type
-- (gemm_device_peaks, docs/gemm-peaks.md), the roofline position and the tile and wave quantization of its
-- launch (definitions: this file's header). Auxiliary kernels of an op (split-K reductions, epilogues) carry the
-- op's shape but no FLOPs: their time counts in op_achieved_tflops of the main kernel. A rate above the physical
-- peak is not shown as achieved (NULL) and physically_possible is false.
-- @column kernel_id [key]: GEMM kernel id.
-- @column rank [key]: Rank.
-- @column short_name [key]: Kernel base name.
-- @column start_ns: Kernel start (ns).
-- @column duration_ns: Kernel duration (ns).
-- @column op_range_id: The op's cpu_ranges.range_id, NULL when none.
-- @column op_name: The op ('aten::mm', ...), NULL when none.
-- @column status: gemm_problems.status ('main', 'auxiliary', 'no_launch', 'no_op', 'no_shapes', 'unknown_layout').
-- @column m [key]: M (NULL without a shape).
-- @column n [key]: N.
-- @column k [key]: K.
-- @column batch: Batch.
-- @column dtype [key]: Operand dtype: recorded (Kineto 'Input type'), else stated by the kernel name; NULL when neither.
-- @column dtype_source: 'recorded', 'kernel_name' or NULL.
-- @column flops: 2·M·N·K·batch on the main kernel (gemm_problems.flops), else NULL.
-- @column moved_bytes: Inputs + output bytes on the main kernel (gemm_problems.moved_bytes); NULL without dtypes.
-- @column op_duration_ns: Summed duration of every GEMM kernel of the op (split-K reductions included), on the main kernel.
-- @column device_model: The device's model in the peak table (gemm_device_peaks.model), NULL when unknown.
-- @column math: Math type the peak is for: 'fp64', 'fp32' (CUDA cores), 'tf32', 'fp16', 'bf16', 'fp8', 'int8'; NULL when the dtype is unknown.
-- @column math_source: 'dtype', 'kernel_name' (the name says tf32 or CUDA-core fp32) or 'achieved_rate' (an fp32 kernel faster than the FP32 peak: TF32).
-- @column peak_tflops: The device's dense peak for this math type (TFLOP/s; --peak-tflops when given); NULL when unknown.
-- @column peak_source: 'device_table', 'peak_tflops' (option) or NULL.
-- @column mem_bandwidth_gbps: The device's peak memory bandwidth (GB/s), NULL when unknown.
-- @column arithmetic_intensity: flops / moved_bytes (FLOP/byte; an upper bound: each operand moved once); NULL without bytes.
-- @column ridge_flops_per_byte: peak_tflops × 1000 / mem_bandwidth_gbps: the intensity where the roofline turns (FLOP/byte).
-- @column roofline_tflops: Attainable rate min(peak, intensity × bandwidth) (TFLOP/s); NULL when unknown.
-- @column bound: 'compute' (intensity at or above the ridge) or 'memory' (below); NULL when unknown.
-- @column achieved_tflops [key]: flops / duration_ns (TFLOP/s) on the main kernel; NULL when not physically possible, without FLOPs or a duration.
-- @column op_achieved_tflops: flops / op_duration_ns (TFLOP/s): the op's rate with its split-K / epilogue kernels; NULL as achieved_tflops.
-- @column pct_of_peak [key]: 100 × op_achieved_tflops / peak_tflops; NULL when either is unknown.
-- @column pct_of_roofline: 100 × op_achieved_tflops / roofline_tflops; NULL when either is unknown.
-- @column physically_possible [key]: False when flops / duration exceeds the peak (a wrong shape, device or clock: the rate is withheld); true when within; NULL without a peak or FLOPs.
-- @column efficiency_check: 'ok', 'above_peak', 'no_peak' (peak_reason says why), 'no_flops' (auxiliary or shapeless kernel), 'no_duration' (zero-length kernel).
-- @column peak_reason: Why peak_tflops is NULL ('the trace lists no device name: give --peak-tflops', an unknown model, an unknown dtype, no such math on the device); NULL when known.
-- @column tile_m: CTA tile along M from the kernel name (NULL when the name states none).
-- @column tile_n: CTA tile along N.
-- @column tile_k: CTA tile along K, NULL when the name gives none.
-- @column tile_orientation: 'grid' (the launch grid holds a whole multiple of the output tiles), 'assumed' (BLAS orientation, grid does not count tiles: a persistent kernel) or NULL.
-- @column grid_ctas: CTAs of the launch grid (grid_x·grid_y·grid_z).
-- @column output_tiles: Output tiles ⌈M/tile_m⌉·⌈N/tile_n⌉·batch; NULL without a tile.
-- @column split_k: grid_ctas / output_tiles when the grid holds a whole multiple of the tiles (1: no split-K); NULL otherwise.
-- @column ctas: CTAs the waves count: the grid's, or the output tiles when the grid does not count them (see wave_basis).
-- @column wave_basis: 'grid' or 'tiles' (persistent kernel: the grid is not its work); NULL when unknown.
-- @column sm_count: SMs (CUs) of the device (trace, else the peak table); NULL when unknown.
-- @column waves: ctas / (sm_count × 1 resident CTA per SM, assumed).
-- @column last_wave_fill_pct: Share of the SMs busy in the last wave (%).
-- @column wave_efficiency_pct: ctas / (⌈waves⌉ × sm_count) × 100.
-- @column tile_efficiency_pct: Useful share of the tiles' work, M·N·K / (M, N and K rounded up to the tile) × 100 (K unrounded when the K tile is unknown).
-- @column kernel_align: Operand alignment in elements the kernel name states (CUTLASS '_align1', xmma '_aligna4'), NULL when none: below the dtype's 16-byte minimum it is the slow path a misaligned shape forces.
-- @column op_gemm_kernels: GEMM kernels of the op (gemm_problems.op_gemm_kernels), NULL without an op.
CREATE OR REPLACE MACRO gemm_efficiency() AS TABLE
SELECT * FROM _gemm_efficiency() ORDER BY rank, start_ns, kernel_id;

-- @macro gemm_shape_groups
-- Per GEMM shape (M, N, K, batch, dtype, device model), over the main kernels with a shape and the auxiliary
-- kernels of their ops: the time it costs, its time-weighted efficiency against the peak, and the shape rules with
-- their numbers (this file's header): alignment of M, N, K to the dtype's granularity, tile and wave quantization of
-- its main kernel (the name and grid with the most time in the group), the first rule broken, the nearest aligned
-- shape and the gain it would bring under the tile-and-wave model, as an estimate with its basis. Largest total
-- time first.
-- @param min_efficiency_pct: A tile or wave efficiency below this breaks the quantization rule (%).
-- @column m [key]: M.
-- @column n [key]: N.
-- @column k [key]: K.
-- @column batch [key]: Batch.
-- @column dtype [key]: Operand dtype (gemm_efficiency.dtype), NULL when unknown.
-- @column device_model: Device model (gemm_efficiency.device_model), NULL when unknown.
-- @column math: Math type of the peak ('bf16', 'tf32', ...; the one with the most time), NULL when unknown.
-- @column ops: Ops (main kernels) of this shape.
-- @column kernels: GEMM kernels of these ops, auxiliary ones included.
-- @column total_ns [key]: Summed duration of those kernels (ns).
-- @column gemm_time_pct: total_ns / the job's summed GEMM kernel time × 100.
-- @column flops: Summed 2·M·N·K·batch (DOUBLE: a long capture's sum can exceed BIGINT).
-- @column achieved_tflops: flops / total_ns (TFLOP/s); NULL when any op of the group is above the peak.
-- @column peak_tflops: The device's peak for the math type (TFLOP/s), NULL when unknown.
-- @column efficiency_pct [key]: 100 × achieved_tflops / peak_tflops: the time-weighted mean of the ops' pct_of_peak.
-- @column arithmetic_intensity: flops / moved bytes of one op (FLOP/byte), NULL without dtypes.
-- @column bound: 'compute' or 'memory' against the ridge point (gemm_efficiency.bound), NULL when unknown.
-- @column above_peak_ops: Ops whose rate exceeds the peak (physically impossible: their figures are withheld).
-- @column main_kernel: Short name of the main kernel with the most time.
-- @column tile_m: Its CTA tile along M (kernel name), NULL when the name states none.
-- @column tile_n: Its CTA tile along N.
-- @column tile_k: Its CTA tile along K, NULL when unknown.
-- @column tile_orientation: 'grid' or 'assumed' (gemm_efficiency.tile_orientation).
-- @column ctas: CTAs of its launch (or output tiles for a persistent kernel, see wave_basis).
-- @column wave_basis: 'grid' or 'tiles'.
-- @column split_k: Split-K factor of the grid (1: none), NULL when unknown.
-- @column sm_count: SMs of the device.
-- @column resident_blocks_assumed: CTAs per SM assumed resident at once (1: a large tensor-core tile fills an SM).
-- @column waves: ctas / (sm_count × resident_blocks_assumed).
-- @column last_wave_fill_pct: Share of SMs busy in the last wave (%).
-- @column wave_efficiency_pct: ctas / (⌈waves⌉ × SMs) × 100.
-- @column tile_efficiency_pct: M·N·K over M, N, K rounded up to the tile × 100.
-- @column align_min: The dtype's minimum granularity in elements (16 bytes: 8 for fp16/bf16, 16 fp8, 4 fp32/tf32).
-- @column align_preferred: The preferred granularity in elements (128 bytes: 64 for fp16/bf16, 128 fp8, 32 fp32).
-- @column misaligned_dims: The dimensions not a multiple of align_min ('K', 'N,K', ...); '' when none; NULL without a dtype.
-- @column unpreferred_dims: The dimensions of at least align_preferred that are not a multiple of it (a smaller one cannot be); '' when none; NULL without a dtype.
-- @column rule_broken [key]: The first rule broken: 'alignment' (a dim not a multiple of align_min), 'preferred_alignment', 'tile_quantization', 'wave_quantization' (efficiency below min_efficiency_pct), 'none'; NULL when nothing could be checked.
-- @column rule_detail: Every rule broken, with its numbers ('K=1365 not a multiple of 8 (bfloat16, 16 bytes)'; ...).
-- @column suggested_m: M rounded up to align_preferred (align_min below it) when a dimension breaks an alignment rule, else NULL.
-- @column suggested_n: N likewise.
-- @column suggested_k: K likewise.
-- @column expected_gain_pct: Estimated throughput gain (useful FLOP/s) of the suggested shape under the tile-and-wave model, %; NULL without a suggestion, tile or SM count.
-- @column gain_basis: What the estimate assumes, in words.
CREATE OR REPLACE MACRO gemm_shape_groups(min_efficiency_pct := 90.0) AS TABLE
WITH e AS (SELECT *, op_gemm_kernels AS op_kernels FROM _gemm_efficiency()),
ops AS (SELECT * FROM e WHERE status = 'main' AND m IS NOT NULL),  -- per op: its main kernel's row
tot AS (SELECT nullif(sum(end_ns - start_ns), 0) AS all_ns FROM kernels WHERE kernel_class = 'gemm'),
g AS (
  SELECT m, n, k, batch, dtype, device_model,
         arg_max(math, op_duration_ns) AS math, count(*) AS ops, sum(op_kernels) AS kernels,
         sum(op_duration_ns) AS total_ns, sum(flops) AS flops, max(peak_tflops) AS peak_tflops,
         count(*) FILTER (WHERE efficiency_check = 'above_peak') AS above_peak_ops,
         max(arithmetic_intensity) AS arithmetic_intensity, arg_max(bound, op_duration_ns) AS bound
  FROM ops GROUP BY ALL
), rep AS (  -- the main kernel (name, grid) with the most time in the group
  SELECT m, n, k, batch, dtype, device_model,
         arg_max({'short_name': short_name, 'tile_m': tile_m, 'tile_n': tile_n, 'tile_k': tile_k,
                  'orient': tile_orientation, 'ctas': ctas, 'wave_basis': wave_basis, 'split_k': split_k,
                  'sm_count': sm_count, 'waves': waves, 'fill': last_wave_fill_pct, 'wave_eff': wave_efficiency_pct,
                  'tile_eff': tile_efficiency_pct, 'align': kernel_align}, t) AS r
  FROM (SELECT m, n, k, batch, dtype, device_model, short_name, tile_m, tile_n, tile_k, tile_orientation, ctas,
               wave_basis, split_k, sm_count, waves, last_wave_fill_pct, wave_efficiency_pct, tile_efficiency_pct,
               kernel_align, sum(duration_ns) AS t
        FROM ops GROUP BY ALL)
  GROUP BY ALL
), j AS (
  SELECT g.*, rep.r, _gemm_align(g.dtype) AS al
  FROM g JOIN rep ON rep.m = g.m AND rep.n = g.n AND rep.k = g.k AND rep.batch = g.batch
                 AND rep.dtype IS NOT DISTINCT FROM g.dtype AND rep.device_model IS NOT DISTINCT FROM g.device_model
), a AS (
  SELECT j.*,
         concat_ws(',', CASE WHEN m % al.min <> 0 THEN 'M' END, CASE WHEN n % al.min <> 0 THEN 'N' END,
                   CASE WHEN k % al.min <> 0 THEN 'K' END) AS mis,
         concat_ws(',', CASE WHEN m >= al.preferred AND m % al.preferred <> 0 THEN 'M' END,
                   CASE WHEN n >= al.preferred AND n % al.preferred <> 0 THEN 'N' END,
                   CASE WHEN k >= al.preferred AND k % al.preferred <> 0 THEN 'K' END) AS unpref,
         list_filter([CASE WHEN m % al.min <> 0 THEN 'M=' || m END, CASE WHEN n % al.min <> 0 THEN 'N=' || n END,
                      CASE WHEN k % al.min <> 0 THEN 'K=' || k END], lambda x: x IS NOT NULL) AS mis_l,
         list_filter([CASE WHEN m >= al.preferred AND m % al.preferred <> 0 AND m % al.min = 0 THEN 'M=' || m END,
                      CASE WHEN n >= al.preferred AND n % al.preferred <> 0 AND n % al.min = 0 THEN 'N=' || n END,
                      CASE WHEN k >= al.preferred AND k % al.preferred <> 0 AND k % al.min = 0 THEN 'K=' || k END],
                     lambda x: x IS NOT NULL) AS unpref_l
  FROM j
), s AS (
  SELECT a.*,
         CASE WHEN al IS NOT NULL AND (unpref <> '' OR mis <> '') THEN 1 END AS suggest,
         CASE WHEN m >= al.preferred THEN _gemm_ceil_div(m, al.preferred) * al.preferred
              ELSE _gemm_ceil_div(m, al.min) * al.min END::BIGINT AS sm_,
         CASE WHEN n >= al.preferred THEN _gemm_ceil_div(n, al.preferred) * al.preferred
              ELSE _gemm_ceil_div(n, al.min) * al.min END::BIGINT AS sn_,
         CASE WHEN k >= al.preferred THEN _gemm_ceil_div(k, al.preferred) * al.preferred
              ELSE _gemm_ceil_div(k, al.min) * al.min END::BIGINT AS sk_
  FROM a
), f AS (
  SELECT s.*,
         CASE WHEN suggest = 1 AND (sm_ <> m OR sn_ <> n OR sk_ <> k) THEN true ELSE false END AS has_suggestion,
         _gemm_model_time(m, n, k, batch, r.tile_m, r.tile_n, r.tile_k, r.sm_count) AS t0,
         _gemm_model_time(sm_, sn_, sk_, batch, r.tile_m, r.tile_n, r.tile_k, r.sm_count) AS t1
  FROM s
)
SELECT m, n, k, batch, dtype, device_model, math, ops, kernels::BIGINT AS kernels, total_ns::BIGINT AS total_ns,
       100.0 * total_ns / (SELECT all_ns FROM tot) AS gemm_time_pct, flops::DOUBLE AS flops,
       CASE WHEN above_peak_ops = 0 AND total_ns > 0 THEN flops / total_ns / 1000.0 END::DOUBLE AS achieved_tflops,
       peak_tflops,
       CASE WHEN above_peak_ops = 0 AND total_ns > 0 THEN 100.0 * flops / total_ns / 1000.0 / peak_tflops
       END::DOUBLE AS efficiency_pct,
       arithmetic_intensity, bound, above_peak_ops, r.short_name AS main_kernel,
       r.tile_m::INTEGER AS tile_m, r.tile_n::INTEGER AS tile_n, r.tile_k::INTEGER AS tile_k,
       r.orient AS tile_orientation, r.ctas::BIGINT AS ctas, r.wave_basis AS wave_basis, r.split_k::BIGINT AS split_k,
       r.sm_count::INTEGER AS sm_count, 1 AS resident_blocks_assumed, r.waves::DOUBLE AS waves,
       r.fill::DOUBLE AS last_wave_fill_pct, r.wave_eff::DOUBLE AS wave_efficiency_pct,
       r.tile_eff::DOUBLE AS tile_efficiency_pct,
       al.min::INTEGER AS align_min, al.preferred::INTEGER AS align_preferred,
       CASE WHEN al IS NOT NULL THEN mis END AS misaligned_dims,
       CASE WHEN al IS NOT NULL THEN unpref END AS unpreferred_dims,
       CASE WHEN al IS NOT NULL AND mis <> '' THEN 'alignment'
            WHEN al IS NOT NULL AND unpref <> '' THEN 'preferred_alignment'
            WHEN r.tile_eff < min_efficiency_pct THEN 'tile_quantization'
            WHEN r.wave_eff < min_efficiency_pct THEN 'wave_quantization'
            WHEN al IS NOT NULL OR r.tile_eff IS NOT NULL OR r.wave_eff IS NOT NULL THEN 'none' END AS rule_broken,
       nullif(concat_ws('; ',
         CASE WHEN len(mis_l) > 0 THEN array_to_string(mis_l, ', ') || ' not a multiple of ' || al.min || ' ('
                                       || dtype || ': 16 bytes, the minimum)'
                                       || CASE WHEN r.align < al.min THEN ': its kernel reads ' || r.align
                                               || '-element pieces (align' || r.align || ' in its name)' ELSE '' END
              END,
         CASE WHEN len(unpref_l) > 0 THEN array_to_string(unpref_l, ', ') || ' not a multiple of ' || al.preferred
                                          || ' (' || dtype || ': 128 bytes, preferred)' END,
         CASE WHEN r.tile_eff < min_efficiency_pct THEN
           printf('tile quantization: %.1f %% of the %dx%d%s tiles'' work is useful', r.tile_eff, r.tile_m, r.tile_n,
                  CASE WHEN r.tile_k IS NOT NULL THEN 'x' || r.tile_k ELSE '' END) END,
         CASE WHEN r.wave_eff < min_efficiency_pct THEN
           printf('wave quantization: %d CTAs on %d SMs = %.2f waves, the last %.1f %% full', r.ctas, r.sm_count,
                  r.waves, r.fill) END), '') AS rule_detail,
       CASE WHEN has_suggestion THEN sm_ END AS suggested_m,
       CASE WHEN has_suggestion THEN sn_ END AS suggested_n,
       CASE WHEN has_suggestion THEN sk_ END AS suggested_k,
       CASE WHEN has_suggestion AND t0 > 0 AND t1 > 0
            THEN 100.0 * ((sm_::DOUBLE * sn_ * sk_ / t1) / (m::DOUBLE * n * k / t0) - 1) END AS expected_gain_pct,
       CASE WHEN NOT has_suggestion THEN NULL
            WHEN t0 IS NULL THEN 'no estimate: ' || CASE WHEN r.tile_m IS NULL THEN 'the kernel name states no tile'
                                                         ELSE 'SM count unknown' END
            ELSE printf('estimate: the same %dx%d tile%s, time ∝ ⌈tiles / %d SMs⌉ × K steps, 1 CTA per SM; split-K '
                        'and the cost of breaking the 16-byte minimum (no vector loads) not modelled%s', r.tile_m,
                        r.tile_n, CASE WHEN r.tile_k IS NOT NULL THEN ' (K ' || r.tile_k || ')' ELSE '' END,
                        r.sm_count, CASE WHEN mis <> '' THEN ', so for this shape the gain is a lower bound'
                                         ELSE '' END) END AS gain_basis
FROM f
ORDER BY total_ns DESC, m, n, k, batch, dtype NULLS LAST, device_model NULLS LAST;

-- @macro gemm_overview
-- The job's GEMM figures in one row: the share of GPU-busy time in GEMM kernels, their time-weighted efficiency
-- against the peak (ideal time at peak over the time taken), the share of that time below a low efficiency, and the
-- model FLOPs utilisation (MFU) when a model is given (--model; parameters as volume_check, else the session's).
-- MFU = model FLOPs per iteration per GPU / (iteration time × peak): per token 6·P (forward and backward through P
-- parameters) + 12·L·h·s (attention scores and values, PaLM's appendix B), P the params parameter else the
-- decoder formula of _model_param_count; tokens per iteration per model replica micro_batch × seq × micro_batches,
-- shared by tp × pp × cp GPUs; iteration time the median duration of the iterations object's marker or detected
-- iterations; peak the devices' figure for the model's dtype (else the math type with the most GEMM time).
-- Recomputation is not counted (MFU, not hardware FLOPs utilisation).
-- @param low_pct: The efficiency below which GEMM time counts in low_efficiency_time_pct (%).
-- @param params: Parameter count P.
-- @param layers: Transformer layers L.
-- @param hidden: Hidden size h.
-- @param ffn: MLP inner size; NULL: 4h.
-- @param heads: Attention heads.
-- @param kv_heads: Key/value heads.
-- @param vocab: Vocabulary size V.
-- @param tied: Tied embeddings.
-- @param gated: Gated MLP.
-- @param seq: Sequence length s.
-- @param micro_batch: Micro-batch size b.
-- @param micro_batches: Micro-batches per iteration (gradient accumulation); NULL: 1, said in mfu_basis.
-- @param model_dtype: The model's compute dtype (--model dtype=…) ('bf16', 'fp16', 'fp8', 'fp32', 'tf32'); NULL: the GEMM math with the most time.
-- @param tp: Tensor-parallel degree; NULL: 1, said in mfu_basis.
-- @param pp: Pipeline-parallel degree; NULL: 1.
-- @param cp: Context-parallel degree; NULL: 1.
-- @column gemm_kernels [key]: GEMM kernels (kernel_class 'gemm') of the job.
-- @column gemm_ns: Union of GEMM kernel time per rank, summed over ranks (overlap_by_rank.gemm_ns, ns).
-- @column busy_ns: GPU-busy time (any kernel or memory operation) per rank, summed over ranks (ns).
-- @column gemm_time_pct [key]: 100 × gemm_ns / busy_ns: the share of GPU-busy time in GEMMs; NULL without busy time.
-- @column gemm_kernel_ns: Summed duration of the GEMM kernels (ns; concurrent ones each count).
-- @column covered_ns: Summed duration of the GEMM kernels of ops with FLOPs and a peak, not above it (ns).
-- @column covered_pct: 100 × covered_ns / gemm_kernel_ns: how much GEMM time the efficiency covers.
-- @column ideal_ns: Time those ops would take at their peaks: Σ flops / peak (ns).
-- @column gemm_efficiency_pct [key]: 100 × ideal_ns / covered_ns: the time-weighted efficiency against the peak; NULL when nothing is covered.
-- @column low_efficiency_time_pct: Share of covered_ns in ops below low_pct of their peak (%).
-- @column low_pct: The threshold used (%).
-- @column above_peak_ops: Ops whose rate exceeds the peak (withheld: a wrong shape, device or clock).
-- @column device_model: The device model with the most GEMM kernel time, NULL when unknown.
-- @column main_math: The math type with the most covered GEMM time, NULL when none.
-- @column efficiency_reason: Why gemm_efficiency_pct is NULL (no GEMM kernels, no shapes, no peak with its reason); NULL when known.
-- @column model_flops_per_iteration: Model FLOPs of one iteration per model replica (6·P + 12·L·h·s per token × tokens); NULL without a model.
-- @column gpus_per_replica: tp × pp × cp (1 for a dimension not given).
-- @column iteration_ns: Median iteration duration (ns) over the ranks' marker or detected iterations; NULL when none.
-- @column iterations: Iterations that median is over.
-- @column mfu_peak_tflops: The peak MFU divides by (TFLOP/s per GPU), NULL when unknown.
-- @column mfu_pct [key]: 100 × model_flops_per_iteration / gpus_per_replica / (iteration_ns × mfu_peak_tflops); NULL with mfu_reason.
-- @column mfu_basis: What the MFU assumes (defaults taken, the formula's parts), NULL without MFU.
-- @column mfu_reason: Why mfu_pct is NULL; NULL when known.
CREATE OR REPLACE MACRO gemm_overview(low_pct := 40.0, params := NULL, layers := NULL, hidden := NULL, ffn := NULL,
                                      heads := NULL, kv_heads := NULL, vocab := NULL, tied := NULL, gated := NULL,
                                      seq := NULL, micro_batch := NULL, micro_batches := NULL, model_dtype := NULL,
                                      tp := NULL, pp := NULL, cp := NULL) AS TABLE
WITH e AS (SELECT * FROM _gemm_efficiency()),
ob AS (SELECT sum(gemm_ns) AS gemm_ns, sum(busy_ns) AS busy_ns FROM overlap_by_rank()),
ops AS (SELECT * FROM e WHERE status = 'main' AND efficiency_check = 'ok'),
agg AS (
  SELECT (SELECT count(*) FROM e) AS gemm_kernels, (SELECT sum(duration_ns) FROM e) AS gemm_kernel_ns,
         sum(op_duration_ns) AS covered_ns, sum(flops / peak_tflops / 1000.0) AS ideal_ns,
         sum(op_duration_ns) FILTER (WHERE pct_of_peak < low_pct) AS low_ns,
         (SELECT count(*) FROM e WHERE efficiency_check = 'above_peak') AS above_peak_ops,
         arg_max(math, op_duration_ns) AS main_math
  FROM ops
), dev AS (SELECT arg_max(device_model, t) AS device_model FROM
           (SELECT device_model, sum(duration_ns) AS t FROM e WHERE device_model IS NOT NULL GROUP BY ALL)),
why AS (
  SELECT CASE WHEN (SELECT count(*) FROM e) = 0 THEN 'the job has no GEMM kernels'
              WHEN (SELECT count(*) FROM e WHERE status = 'main') = 0 THEN
                'no GEMM kernel has a recorded shape: ' || (SELECT CASE arg_max(status, c)
                  WHEN 'no_shapes' THEN 'their ops record none (profile with record_shapes=True)'
                  WHEN 'no_op' THEN 'no matrix-multiply op encloses their launches (record the ops: PyTorch profiler '
                                    || 'with record_shapes=True, or emit_nvtx(record_shapes=True) under nsys)'
                  WHEN 'no_launch' THEN 'their launch calls are not in the trace (CUDA graph replays, or no runtime '
                                        || 'events)'
                  ELSE 'their recorded shapes do not fit the ops (unknown_layout)' END
                  FROM (SELECT status, count(*) AS c FROM e GROUP BY ALL))
              WHEN (SELECT count(*) FROM ops) = 0 THEN
                coalesce((SELECT any_value(peak_reason) FROM e WHERE status = 'main' AND peak_reason IS NOT NULL),
                         'every op with a shape runs above the peak (a wrong shape, device or clock)')
         END AS efficiency_reason
), mp AS (
  SELECT coalesce(CAST(_model_param(params, 'params') AS DOUBLE),
                  _model_param_count(_model_param(layers, 'layers'), _model_param(hidden, 'hidden'),
                                     _model_param(ffn, 'ffn'), _model_param(heads, 'heads'),
                                     _model_param(kv_heads, 'kv_heads'), _model_param(vocab, 'vocab'),
                                     _model_param(tied, 'tied'), _model_param(gated, 'gated'))) AS p,
         CAST(_model_param(layers, 'layers') AS DOUBLE) AS l, CAST(_model_param(hidden, 'hidden') AS DOUBLE) AS h,
         CAST(_model_param(seq, 'seq') AS DOUBLE) AS s, CAST(_model_param(micro_batch, 'micro_batch') AS DOUBLE) AS b,
         CAST(_model_param(micro_batches, 'micro_batches') AS DOUBLE) AS mb,
         CAST(_model_param(tp, 'tp') AS BIGINT) AS tp_, CAST(_model_param(pp, 'pp') AS BIGINT) AS pp_,
         CAST(_model_param(cp, 'cp') AS BIGINT) AS cp_,
         CASE lower(CAST(_model_param(model_dtype, 'dtype') AS VARCHAR))
           WHEN 'bf16' THEN 'bf16' WHEN 'bfloat16' THEN 'bf16' WHEN 'fp16' THEN 'fp16' WHEN 'float16' THEN 'fp16'
           WHEN 'fp8' THEN 'fp8' WHEN 'fp32' THEN 'fp32' WHEN 'float32' THEN 'fp32' WHEN 'tf32' THEN 'tf32'
         END AS mdtype
), it AS (
  SELECT median(end_ns - start_ns) AS iteration_ns, count(*) AS iterations FROM iterations()
  WHERE iteration_source IN ('marker', 'detected') AND end_ns > start_ns
), pk AS (
  SELECT mp.*, coalesce(mp.mdtype, agg.main_math) AS mfu_math,
         (SELECT max(CASE coalesce(mp.mdtype, agg.main_math) WHEN 'bf16' THEN bf16_tflops WHEN 'fp16' THEN fp16_tflops
                      WHEN 'fp8' THEN fp8_tflops WHEN 'fp32' THEN fp32_tflops WHEN 'tf32' THEN tf32_tflops END)
          FROM gemm_device_peaks()) AS peak,
         coalesce(tp_, 1) * coalesce(pp_, 1) * coalesce(cp_, 1) AS gpus,
         CASE WHEN p IS NOT NULL AND s IS NOT NULL AND b IS NOT NULL THEN
           (6.0 * p + coalesce(12.0 * l * h * s, 0)) * b * s * coalesce(mb, 1) END AS mflops
  FROM mp, agg
), m AS (
  SELECT pk.*, it.iteration_ns, it.iterations,
         CASE WHEN mflops IS NOT NULL AND iteration_ns > 0 AND peak > 0
              THEN 100.0 * mflops / gpus / (iteration_ns * peak * 1000.0) END AS mfu,
         CASE WHEN p IS NULL THEN 'no model given: --model layers=…,hidden=…,seq=…,micro_batch=…,vocab=… or params=…'
              WHEN s IS NULL OR b IS NULL THEN 'the model needs seq and micro_batch'
              WHEN it.iteration_ns IS NULL THEN 'no iterations: no step markers and no repeating kernel sequence '
                                                || '(iterations.iteration_source whole_capture)'
              WHEN peak IS NULL THEN 'no peak for ' || coalesce(mfu_math, 'an unknown dtype') || ' on the devices: give '
                                     || '--peak-tflops or the model dtype'
         END AS mfu_reason
  FROM pk, it
)
SELECT agg.gemm_kernels, ob.gemm_ns::BIGINT AS gemm_ns, ob.busy_ns::BIGINT AS busy_ns,
       CASE WHEN ob.busy_ns > 0 THEN 100.0 * ob.gemm_ns / ob.busy_ns END::DOUBLE AS gemm_time_pct,
       agg.gemm_kernel_ns::BIGINT AS gemm_kernel_ns, agg.covered_ns::BIGINT AS covered_ns,
       CASE WHEN agg.gemm_kernel_ns > 0 THEN 100.0 * coalesce(agg.covered_ns, 0) / agg.gemm_kernel_ns END::DOUBLE
         AS covered_pct,
       agg.ideal_ns::DOUBLE AS ideal_ns,
       CASE WHEN agg.covered_ns > 0 THEN 100.0 * agg.ideal_ns / agg.covered_ns END::DOUBLE AS gemm_efficiency_pct,
       CASE WHEN agg.covered_ns > 0 THEN 100.0 * coalesce(agg.low_ns, 0) / agg.covered_ns END::DOUBLE
         AS low_efficiency_time_pct,
       low_pct::DOUBLE AS low_pct, agg.above_peak_ops, dev.device_model, agg.main_math, why.efficiency_reason,
       m.mflops AS model_flops_per_iteration, m.gpus::BIGINT AS gpus_per_replica, m.iteration_ns::DOUBLE AS iteration_ns,
       m.iterations, m.peak AS mfu_peak_tflops, m.mfu AS mfu_pct,
       CASE WHEN m.mfu IS NOT NULL THEN concat_ws('; ',
         CASE WHEN m.l IS NOT NULL AND m.h IS NOT NULL THEN '6·P + 12·L·h·s FLOPs per token' ELSE '6·P FLOPs per token (no layers/hidden: attention not counted)' END,
         printf('P = %.4g', m.p), printf('%g tokens per replica per iteration', m.b * m.s * coalesce(m.mb, 1)),
         CASE WHEN m.mb IS NULL THEN 'micro_batches = 1 assumed' END,
         CASE WHEN m.tp_ IS NULL OR m.pp_ IS NULL OR m.cp_ IS NULL THEN 'tp, pp, cp not given taken as 1' END,
         printf('%s peak %.1f TFLOP/s', m.mfu_math, m.peak) || CASE WHEN m.mdtype IS NULL THEN ' (the GEMMs'' main math type)' ELSE '' END,
         printf('median of %d iterations', m.iterations)) END AS mfu_basis,
       m.mfu_reason
FROM agg, ob, dev, why, m
ORDER BY gemm_kernels;
