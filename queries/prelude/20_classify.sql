-- Classification helpers shared by the importers and the analyses. Scalar macros, no data.

-- @macro kernel_short_name
-- Base name of a kernel: drops a leading return type ('void '), namespaces are kept, and the parameter
-- list and template arguments are cut, e.g. 'void at::native::foo<float>(int)' -> 'at::native::foo'.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO kernel_short_name(name) AS
  regexp_replace(regexp_replace(regexp_replace(name, '^void ', ''), '[<(].*$', ''), '\s+$', '');

-- @macro is_comm_kernel_name
-- True for communication kernels. Rules, first match wins, on the name without a leading 'void ':
--   1. NCCL/RCCL: starts with 'nccl' or 'rccl' (ncclKernel_*, ncclDevKernel_*, ncclSymkDevKernel_*,
--      ncclAllReduceRingLLKernel_* of NCCL <= 2.7, RCCL's ncclDevKernel_Generic);
--   2. PyTorch SymmetricMemory and one-/two-shot all-reduce: 'multimem_', 'one_shot_all_reduce',
--      'two_shot_all_reduce', 'symm_mem';
--   3. vLLM / SGLang custom all-reduce: 'cross_device_reduce', 'custom_all_reduce', 'allreduce_fusion';
--   4. DeepEP: 'deep_ep::'; NVSHMEM kernels: 'nvshmem'.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO is_comm_kernel_name(name) AS
  regexp_matches(regexp_replace(name, '^void ', ''),
    '^(nccl|rccl)|multimem_|one_shot_all_reduce|two_shot_all_reduce|symm_mem|cross_device_reduce|custom_all_reduce|allreduce_fusion|deep_ep::|nvshmem',
    'i');

-- @macro kernel_class
-- Class of a kernel by name: 'communication' (is_comm_kernel_name), then 'memory' (memcpy/memset-like
-- kernels), 'attention' (flash/fused multi-head attention), 'gemm' (cuBLAS/cuBLASLt/CUTLASS/rocBLAS/
-- hipBLASLt/Triton matmul kernels), else 'compute'. Rules are ordered; the first match wins.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO kernel_class(name) AS
  CASE
    WHEN is_comm_kernel_name(name) THEN 'communication'
    WHEN regexp_matches(name, '^(void )?(Memcpy|Memset|memcpy|memset)|^(hip|cuda)Mem(cpy|set)|__amd_rocclr_(copy|fill)', '') THEN 'memory'
    WHEN regexp_matches(name, 'flash|fmha|attention|attn_fwd|attn_bwd|_attn|sdpa|mha_fwd|mha_bwd', 'i') THEN 'attention'
    WHEN regexp_matches(name, 'gemm|nvjet|xmma|cutlass|cublas|Cijk_|matmul|_mm_|bmm_|wgmma|hgemm|sgemm', 'i') THEN 'gemm'
    ELSE 'compute'
  END;

-- @macro canonical_collective
-- Maps a collective name as traces spell it (PyTorch 'Collective name', c10d op, 'nccl:' annotation,
-- NCCL API or kernel token) to the canonical name used in comm_ops.collective, or NULL when unknown.
-- @param s: Collective name in any known spelling.
CREATE OR REPLACE MACRO canonical_collective(s) AS
  CASE regexp_replace(regexp_replace(lower(coalesce(s, '')), '^(nccl:|gloo:|c10d::|nccl|rccl)', ''), '[^a-z]', '', 'g')
    WHEN 'allreduce' THEN 'all_reduce' WHEN 'allreducecoalesced' THEN 'all_reduce'
    WHEN 'allreducesparse' THEN 'all_reduce'
    WHEN 'allgather' THEN 'all_gather' WHEN 'allgatherbase' THEN 'all_gather'
    WHEN 'allgatherintotensorcoalesced' THEN 'all_gather' WHEN 'allgathercoalesced' THEN 'all_gather'
    WHEN 'allgathertensorcoalesced' THEN 'all_gather' WHEN 'allgatherv' THEN 'all_gather'
    WHEN 'allgatherintotensor' THEN 'all_gather'
    WHEN 'reducescatter' THEN 'reduce_scatter' WHEN 'reducescatterbase' THEN 'reduce_scatter'
    WHEN 'reducescattertensorcoalesced' THEN 'reduce_scatter' WHEN 'reducescattertensor' THEN 'reduce_scatter'
    WHEN 'broadcast' THEN 'broadcast' WHEN 'broadcastcoalesced' THEN 'broadcast'
    WHEN 'reduce' THEN 'reduce'
    WHEN 'alltoall' THEN 'all_to_all' WHEN 'alltoallbase' THEN 'all_to_all' WHEN 'alltoallv' THEN 'all_to_all'
    WHEN 'gather' THEN 'gather' WHEN 'scatter' THEN 'scatter'
    WHEN 'send' THEN 'send' WHEN 'recv' THEN 'recv' WHEN 'recvanysource' THEN 'recv'
    WHEN 'sendrecv' THEN 'send_recv' WHEN 'batchisendirecv' THEN 'send_recv' WHEN 'coalesced' THEN 'send_recv'
    WHEN 'barrier' THEN 'barrier'
    ELSE NULL
  END;

-- @macro kernel_name_collective
-- The collective a communication kernel's name suggests (last resort: NCCL may run any operation in any
-- kernel). NULL for 'Generic' (RCCL) and names without a collective token.
-- @param short_name: Kernel short name.
CREATE OR REPLACE MACRO kernel_name_collective(short_name) AS
  canonical_collective(regexp_extract(short_name,
    '^(?:nccl|rccl)(?:Dev|Sym|Symk)?(?:Kernel_|DevKernel_)?(AllReduce|AllGatherV|AllGather|ReduceScatter|Reduce|Broadcast|SendRecv|AllToAll)', 1));

-- @macro canonical_dtype
-- Canonical element type name from PyTorch ScalarType names ('Float', 'BFloat16', ...), NCCL tokens
-- ('f32', 'bf16', ...) and C type names ('float', '__nv_bfloat16', ...). NULL when unknown.
-- @param t: Type name in any known spelling.
CREATE OR REPLACE MACRO canonical_dtype(t) AS
  CASE lower(coalesce(t, ''))
    WHEN 'float' THEN 'float32' WHEN 'f32' THEN 'float32' WHEN 'float32' THEN 'float32'
    WHEN 'double' THEN 'float64' WHEN 'f64' THEN 'float64' WHEN 'float64' THEN 'float64'
    WHEN 'half' THEN 'float16' WHEN 'f16' THEN 'float16' WHEN 'float16' THEN 'float16'
    WHEN 'c10::half' THEN 'float16'
    WHEN 'bfloat16' THEN 'bfloat16' WHEN 'bf16' THEN 'bfloat16' WHEN '__nv_bfloat16' THEN 'bfloat16'
    WHEN 'c10::bfloat16' THEN 'bfloat16'
    WHEN 'long' THEN 'int64' WHEN 'int64' THEN 'int64' WHEN 'i64' THEN 'int64' WHEN 'int64_t' THEN 'int64'
    WHEN 'long int' THEN 'int64' WHEN 'long long' THEN 'int64' WHEN 'long long int' THEN 'int64'
    WHEN 'unsigned long' THEN 'uint64' WHEN 'unsigned long long' THEN 'uint64'
    WHEN 'int' THEN 'int32' WHEN 'int32' THEN 'int32' WHEN 'i32' THEN 'int32' WHEN 'int32_t' THEN 'int32'
    WHEN 'uint64' THEN 'uint64' WHEN 'u64' THEN 'uint64' WHEN 'uint64_t' THEN 'uint64'
    WHEN 'uint32' THEN 'uint32' WHEN 'u32' THEN 'uint32' WHEN 'uint32_t' THEN 'uint32'
    WHEN 'short' THEN 'int16' WHEN 'int16' THEN 'int16'
    WHEN 'char' THEN 'int8' WHEN 'signed char' THEN 'int8' WHEN 'int8' THEN 'int8' WHEN 'i8' THEN 'int8' WHEN 'int8_t' THEN 'int8'
    WHEN 'byte' THEN 'uint8' WHEN 'unsigned char' THEN 'uint8' WHEN 'uint8' THEN 'uint8' WHEN 'u8' THEN 'uint8' WHEN 'uint8_t' THEN 'uint8'
    WHEN 'bool' THEN 'bool'
    WHEN 'float8_e4m3fn' THEN 'float8_e4m3' WHEN 'f8e4m3' THEN 'float8_e4m3' WHEN 'float8_e4m3fnuz' THEN 'float8_e4m3'
    WHEN 'float8_e5m2' THEN 'float8_e5m2' WHEN 'f8e5m2' THEN 'float8_e5m2' WHEN 'float8_e5m2fnuz' THEN 'float8_e5m2'
    WHEN 'complexfloat' THEN 'complex64' WHEN 'complexdouble' THEN 'complex128'
    ELSE NULL
  END;

-- @macro dtype_bytes
-- Size in bytes of one element of a canonical dtype (canonical_dtype's output), NULL when unknown.
-- @param dtype: Canonical dtype.
CREATE OR REPLACE MACRO dtype_bytes(dtype) AS
  CASE dtype
    WHEN 'float64' THEN 8 WHEN 'int64' THEN 8 WHEN 'uint64' THEN 8 WHEN 'complex64' THEN 8
    WHEN 'complex128' THEN 16
    WHEN 'float32' THEN 4 WHEN 'int32' THEN 4 WHEN 'uint32' THEN 4
    WHEN 'float16' THEN 2 WHEN 'bfloat16' THEN 2 WHEN 'int16' THEN 2
    WHEN 'int8' THEN 1 WHEN 'uint8' THEN 1 WHEN 'bool' THEN 1
    WHEN 'float8_e4m3' THEN 1 WHEN 'float8_e5m2' THEN 1
    ELSE NULL
  END;

-- @macro busbw_factor
-- nccl-tests bus-bandwidth factor for a collective over n ranks (doc/PERFORMANCE.md):
-- all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all 
-- (n-1)/n; broadcast, reduce, send, recv, send_recv, gather, scatter 1. NULL when unknown.
-- @param collective: Canonical collective.
-- @param n: Group size.
CREATE OR REPLACE MACRO busbw_factor(collective, n) AS
  CASE
    WHEN n IS NULL OR n < 1 THEN NULL
    WHEN collective = 'all_reduce' THEN 2.0 * (n - 1) / n
    WHEN collective IN ('all_gather', 'reduce_scatter', 'all_to_all') THEN 1.0 * (n - 1) / n
    WHEN collective IN ('broadcast', 'reduce', 'send', 'recv', 'send_recv', 'gather', 'scatter') THEN 1.0
    ELSE NULL
  END;
