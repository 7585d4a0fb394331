-- Compute peaks of GPUs for the GEMM efficiency analyses (queries/gemm/efficiency.sql): dense (no 2:4 sparsity)
-- tensor-core / matrix-core TFLOP/s per math type, the memory bandwidth and the SM (CU) count, per GPU model.
-- Sources and what each figure means: docs/gemm-peaks.md. A device is matched on devices.name as the link peaks
-- are (device_link_peaks): RE2 patterns, case-insensitive, the first matching row in ord order wins, so the PCIe,
-- NVL and 80GB variants come before the part of the same name. Override: --peak-tflops (DuckDB variable
-- nsys2comm_peak_tflops) replaces the table's figure for every math type. It is read by macros only: no stored sweep
-- may use it.

-- @macro gemm_device_table
-- The GEMM peak table: per GPU model, dense tensor-core (matrix-core) peaks per math type in TFLOP/s (int8: TOP/s),
-- memory bandwidth and SM/CU count, as the vendors' datasheets and whitepapers state them (docs/gemm-peaks.md).
-- Figures are at boost clock, without structured sparsity (half the "with sparsity" figures vendors headline).
-- NULL where the device has no such math (V100: no bf16, tf32, fp8). fp32 is the plain FP32 rate (CUDA cores; on
-- AMD Instinct the FP32 matrix rate); tf32 the TF32 tensor-core rate (AMD: XF32 on MI300-series). MI250X / MI250
-- figures are per GCD: each of the package's two dies is a device of its own to PyTorch and the profilers.
-- @column ord: Match order (lower first).
-- @column model [key]: Model ('H100 SXM', 'A100 SXM 80GB', ...).
-- @column name_pattern: RE2 pattern matched against devices.name.
-- @column vendor: 'NVIDIA' or 'AMD'.
-- @column sm_count [key]: SMs (NVIDIA) or compute units (AMD) of one device.
-- @column mem_bandwidth_gbps [key]: Peak memory bandwidth of one device (GB/s = 1e9 B/s).
-- @column fp64_tflops: Highest dense FP64 rate (tensor / matrix cores where present), TFLOP/s.
-- @column fp32_tflops [key]: Dense FP32 rate without TF32 (CUDA cores; AMD: FP32 matrix), TFLOP/s.
-- @column tf32_tflops [key]: Dense TF32 tensor-core rate (AMD: XF32), TFLOP/s; NULL when the device has none.
-- @column fp16_tflops: Dense FP16 tensor-core rate (FP32 accumulate), TFLOP/s.
-- @column bf16_tflops [key]: Dense BF16 tensor-core rate, TFLOP/s; NULL when the device has none.
-- @column fp8_tflops [key]: Dense FP8 tensor-core rate, TFLOP/s; NULL when the device has none.
-- @column int8_tops: Dense INT8 tensor-core rate, TOP/s; NULL when the datasheet gives none.
-- @column source: The datasheet or whitepaper the figures come from (docs/gemm-peaks.md lists them).
CREATE OR REPLACE MACRO gemm_device_table() AS TABLE
SELECT ord::INTEGER AS ord, model, name_pattern, vendor, sm_count::INTEGER AS sm_count,
       mem_bandwidth_gbps::DOUBLE AS mem_bandwidth_gbps, fp64_tflops::DOUBLE AS fp64_tflops,
       fp32_tflops::DOUBLE AS fp32_tflops, tf32_tflops::DOUBLE AS tf32_tflops, fp16_tflops::DOUBLE AS fp16_tflops,
       bf16_tflops::DOUBLE AS bf16_tflops, fp8_tflops::DOUBLE AS fp8_tflops, int8_tops::DOUBLE AS int8_tops, source
FROM (VALUES
  (10, 'GB200', '(?i)\bGB200\b', 'NVIDIA', 148, 8000.0, 40.0, 80.0, 1250.0, 2500.0, 2500.0, 5000.0, 5000.0,
   'NVIDIA GB200 NVL72 datasheet (per GPU: the rack totals / 72)'),
  (11, 'B200', '(?i)\bB200\b', 'NVIDIA', 148, 8000.0, 37.0, 75.0, 1100.0, 2250.0, 2250.0, 4500.0, 4500.0,
   'NVIDIA HGX B200 datasheet'),
  (19, 'GH200', '(?i)GH200', 'NVIDIA', 132, 4900.0, 67.0, 67.0, 494.5, 989.5, 989.5, 1979.0, 1979.0,
   'NVIDIA GH200 Grace Hopper Superchip datasheet (the GPU; HBM3e version, the higher bandwidth)'),
  (20, 'H200 NVL', '(?i)H200 NVL', 'NVIDIA', 132, 4800.0, 60.0, 60.0, 417.5, 835.5, 835.5, 1670.5, 1670.5,
   'NVIDIA H200 datasheet (H200 NVL column)'),
  (21, 'H200 SXM', '(?i)H200', 'NVIDIA', 132, 4800.0, 67.0, 67.0, 494.5, 989.5, 989.5, 1979.0, 1979.0,
   'NVIDIA H200 datasheet (H200 SXM column)'),
  (22, 'H100 NVL', '(?i)H100 NVL', 'NVIDIA', 132, 3900.0, 60.0, 60.0, 417.5, 835.5, 835.5, 1670.5, 1670.5,
   'NVIDIA H100 datasheet (H100 NVL column)'),
  (23, 'H100 PCIe', '(?i)H100.*PCIe', 'NVIDIA', 114, 2000.0, 51.0, 51.0, 378.0, 756.5, 756.5, 1513.0, 1513.0,
   'NVIDIA H100 datasheet (H100 PCIe column)'),
  (24, 'H100 SXM', '(?i)H100', 'NVIDIA', 132, 3350.0, 67.0, 67.0, 494.5, 989.5, 989.5, 1979.0, 1979.0,
   'NVIDIA H100 datasheet (H100 SXM column)'),
  (30, 'A100 PCIe 80GB', '(?i)A100.*(?:80GB.*PCIe|PCIe.*80GB)', 'NVIDIA', 108, 1935.0, 19.5, 19.5, 156.0, 312.0,
   312.0, NULL::DOUBLE, 624.0, 'NVIDIA A100 datasheet (80GB PCIe column)'),
  (31, 'A100 PCIe 40GB', '(?i)A100.*PCIe', 'NVIDIA', 108, 1555.0, 19.5, 19.5, 156.0, 312.0, 312.0, NULL, 624.0,
   'NVIDIA A100 datasheet (40GB PCIe column)'),
  (32, 'A100 SXM 80GB', '(?i)A100.*80GB', 'NVIDIA', 108, 2039.0, 19.5, 19.5, 156.0, 312.0, 312.0, NULL, 624.0,
   'NVIDIA A100 datasheet (80GB SXM column)'),
  (33, 'A100 SXM 40GB', '(?i)A100', 'NVIDIA', 108, 1555.0, 19.5, 19.5, 156.0, 312.0, 312.0, NULL, 624.0,
   'NVIDIA A100 datasheet (40GB SXM column); A100-PG509-200 is a 40 GB SXM4 board'),
  (40, 'V100S PCIe', '(?i)V100S', 'NVIDIA', 80, 1134.0, 8.2, 16.4, NULL, 130.0, NULL, NULL, NULL,
   'NVIDIA V100 datasheet (V100S PCIe column)'),
  (41, 'V100 PCIe', '(?i)V100.*PCIe', 'NVIDIA', 80, 900.0, 7.0, 14.0, NULL, 112.0, NULL, NULL, NULL,
   'NVIDIA V100 datasheet (V100 PCIe column)'),
  (42, 'V100 SXM2', '(?i)V100', 'NVIDIA', 80, 900.0, 7.8, 15.7, NULL, 125.0, NULL, NULL, NULL,
   'NVIDIA V100 datasheet (V100 SXM2 column)'),
  (50, 'MI325X', '(?i)MI325X', 'AMD', 304, 6000.0, 163.4, 163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9,
   'AMD Instinct MI325X data sheet'),
  (51, 'MI300X', '(?i)MI300X', 'AMD', 304, 5300.0, 163.4, 163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9,
   'AMD Instinct MI300X data sheet'),
  (52, 'MI250X (per GCD)', '(?i)MI250X', 'AMD', 110, 1638.4, 47.85, 47.85, NULL, 191.5, 191.5, NULL, 191.5,
   'AMD Instinct MI250X data sheet (package figures / 2 GCDs); also "MI250X / MI250": the higher figures'),
  (53, 'MI250 (per GCD)', '(?i)MI250', 'AMD', 104, 1638.4, 45.25, 45.25, NULL, 181.05, 181.05, NULL, 181.05,
   'AMD Instinct MI250 data sheet (package figures / 2 GCDs)')
) t(ord, model, name_pattern, vendor, sm_count, mem_bandwidth_gbps, fp64_tflops, fp32_tflops, tf32_tflops,
    fp16_tflops, bf16_tflops, fp8_tflops, int8_tops, source)
ORDER BY ord;

-- @macro _devices_gemm_match
-- The first gemm_device_table row whose pattern matches a device name, as a struct (the table's columns but ord,
-- name_pattern and source); NULL for an unknown or NULL name.
-- @param name: Device name (devices.name).
CREATE OR REPLACE MACRO _devices_gemm_match(name) AS
  (SELECT arg_min({'model': p.model, 'vendor': p.vendor, 'sm_count': p.sm_count,
                   'mem_bandwidth_gbps': p.mem_bandwidth_gbps, 'fp64': p.fp64_tflops, 'fp32': p.fp32_tflops,
                   'tf32': p.tf32_tflops, 'fp16': p.fp16_tflops, 'bf16': p.bf16_tflops, 'fp8': p.fp8_tflops,
                   'int8': p.int8_tops}, p.ord)
   FROM gemm_device_table() p WHERE regexp_matches(name, p.name_pattern));

-- @macro _devices_gemm_peak_of
-- One math type's peak from a _devices_gemm_match struct (TFLOP/s), NULL when the device has none.
-- @param p: The struct.
-- @param math: 'fp64', 'fp32', 'tf32', 'fp16', 'bf16', 'fp8' or 'int8'.
CREATE OR REPLACE MACRO _devices_gemm_peak_of(p, math) AS
  (CASE math WHEN 'fp64' THEN p.fp64 WHEN 'fp32' THEN p.fp32 WHEN 'tf32' THEN p.tf32 WHEN 'fp16' THEN p.fp16
             WHEN 'bf16' THEN p.bf16 WHEN 'fp8' THEN p.fp8 WHEN 'int8' THEN p.int8 END)::DOUBLE;

-- @macro gemm_device_peaks
-- Per device of the job (devices table): the matched gemm_device_table row, the SM count in force (the trace's,
-- else the table's) and the --peak-tflops override (nsys2comm_peak_tflops) when set. Unknown models get NULL
-- figures and peak_reason says why.
-- @column rank [key]: Rank.
-- @column device_id [key]: Device.
-- @column name: Device name as the trace lists it, NULL when unlisted.
-- @column model [key]: Matched model (gemm_device_table.model), NULL when none matches.
-- @column sm_count [key]: SMs / CUs: devices.sm_count when the trace records it, else the table's; NULL when unknown.
-- @column sm_source: 'trace', 'device_table' or NULL.
-- @column mem_bandwidth_gbps: Peak memory bandwidth (GB/s) from the table; NULL when unknown.
-- @column fp64_tflops: FP64 peak in force (TFLOP/s).
-- @column fp32_tflops: FP32 peak in force (TFLOP/s).
-- @column tf32_tflops: TF32 peak in force (TFLOP/s).
-- @column fp16_tflops: FP16 peak in force (TFLOP/s).
-- @column bf16_tflops [key]: BF16 peak in force (TFLOP/s).
-- @column fp8_tflops: FP8 peak in force (TFLOP/s).
-- @column int8_tops: INT8 peak in force (TOP/s).
-- @column peak_source [key]: 'peak_tflops' (the --peak-tflops option, every math type), 'device_table' or NULL.
-- @column peak_reason: Why the figures are NULL ('device not listed in the trace', 'no peak table entry for
-- <name>: give --peak-tflops'); NULL when known.
CREATE OR REPLACE MACRO gemm_device_peaks() AS TABLE
WITH d AS (SELECT rank, device_id, name, sm_count, _devices_gemm_match(name) AS p FROM devices),
o AS (SELECT getvariable('nsys2comm_peak_tflops')::DOUBLE AS ov)
SELECT rank, device_id, name, p.model AS model,
       coalesce(d.sm_count, p.sm_count)::INTEGER AS sm_count,
       CASE WHEN d.sm_count IS NOT NULL THEN 'trace' WHEN p.sm_count IS NOT NULL THEN 'device_table' END AS sm_source,
       p.mem_bandwidth_gbps::DOUBLE AS mem_bandwidth_gbps,
       coalesce(o.ov, p.fp64)::DOUBLE AS fp64_tflops, coalesce(o.ov, p.fp32)::DOUBLE AS fp32_tflops,
       coalesce(o.ov, p.tf32)::DOUBLE AS tf32_tflops, coalesce(o.ov, p.fp16)::DOUBLE AS fp16_tflops,
       coalesce(o.ov, p.bf16)::DOUBLE AS bf16_tflops, coalesce(o.ov, p.fp8)::DOUBLE AS fp8_tflops,
       coalesce(o.ov, p.int8)::DOUBLE AS int8_tops,
       CASE WHEN o.ov IS NOT NULL THEN 'peak_tflops' WHEN p.model IS NOT NULL THEN 'device_table' END AS peak_source,
       CASE WHEN o.ov IS NOT NULL OR p.model IS NOT NULL THEN NULL
            WHEN name IS NULL THEN 'the trace lists no device name: give --peak-tflops'
            ELSE 'no peak table entry for ''' || name || ''': give --peak-tflops' END AS peak_reason
FROM d, o
ORDER BY rank, device_id;
