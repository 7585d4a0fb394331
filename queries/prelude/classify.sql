-- @include prelude/schema.sql
-- Classification helpers shared by the importers and the analyses. Scalar macros, no data.

-- @macro _prelude_kernel_name_spellings
-- Step 1 of kernel_short_name: one spelling for what nsys and c++filt print differently, and placeholders for
-- brackets that belong to a name rather than open a group: '<unnamed>' and '(anonymous namespace)' -> '@ANON@',
-- nsys '[lambda(int) (instance 1)]' -> '[lambda(int)#1]', 'operator()' and 'operator ()' -> 'operator@CALL@',
-- '->' -> '@ARROW@'.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO _prelude_kernel_name_spellings(name) AS
  -- plain replace() where the text is literal: names can be kilobytes long, and this runs on every distinct name
  replace(replace(replace(replace(
    CASE WHEN contains(name, '(instance ') THEN regexp_replace(name, ' \(instance (\d+)\)\]', '#\1]', 'g')
         ELSE name END,
    '(anonymous namespace)', '@ANON@'), '<unnamed>', '@ANON@'),
    'operator ()', 'operator@CALL@'), 'operator()', 'operator@CALL@').replace('->', '@ARROW@');

-- @macro _prelude_kernel_name_top_level
-- Step 2 of kernel_short_name: what is left outside every bracket. Parenthesised groups go first, innermost
-- first (c++filt and nsys write comparisons in template arguments inside parentheses, '(((8)>(0)))', so once
-- they are gone every '<' and '>' is a template bracket), then template argument lists the same way. 16 passes
-- each exceed any real nesting depth; an unbalanced (truncated) name is cut at its first remaining '<' or '('.
-- @param s: Output of _prelude_kernel_name_spellings.
CREATE OR REPLACE MACRO _prelude_kernel_name_top_level(s) AS
  regexp_replace(regexp_replace(
    list_reduce(range(16), lambda acc, i: CASE WHEN contains(acc, '<') THEN regexp_replace(acc, '<[^<>]*>', '', 'g') ELSE acc END,
      list_reduce(range(16), lambda acc, i: CASE WHEN contains(acc, '(') THEN regexp_replace(acc, '\([^()]*\)', '', 'g') ELSE acc END, s)),
    '[<(].*$', ''), '[>)]', '', 'g');

-- @macro _prelude_kernel_name_last_word
-- Step 3 of kernel_short_name: the qualified name is the last top-level word; the words before it are the
-- return type ('void', or 'std::enable_if::type' once its arguments are gone). Lambdas become '{lambda#N}' and
-- the cv-qualifier of a member call ('operator()() const') is dropped first, so neither splits the name.
-- @param s: Output of _prelude_kernel_name_top_level.
CREATE OR REPLACE MACRO _prelude_kernel_name_last_word(s) AS
  regexp_extract(regexp_replace(regexp_replace(s,
    '[\[{]lambda\s*#(\d+)[\]}]', '{lambda#\1}', 'g'),
    '\s+(const|volatile)\b', '', 'g'),
    '(\S+)\s*$', 1);

-- @macro _prelude_kernel_name_mangled
-- Base name of an Itanium-mangled name (Kineto keeps a name mangled when demangling fails, e.g. very long
-- CUTLASS names): the length-prefixed components of its nested name joined by '::', up to the template
-- arguments or parameters ('_ZN19cutlass_cudnn_train6KernelINS_...' -> 'cutlass_cudnn_train::Kernel').
-- 'St' is 'std::', '_GLOBAL__N_1' the anonymous namespace. Empty when no component can be read.
-- @param name: Full kernel name starting with '_Z'.
CREATE OR REPLACE MACRO _prelude_kernel_name_mangled(name) AS
  replace(regexp_replace(split_part(list_reduce(range(16), lambda acc, i:
      CASE WHEN regexp_matches(split_part(acc, '|', 2), '^[0-9]+') THEN
        split_part(acc, '|', 1) || '::'
          || substr(split_part(acc, '|', 2), length(regexp_extract(split_part(acc, '|', 2), '^[0-9]+')) + 1,
                    CAST(regexp_extract(split_part(acc, '|', 2), '^[0-9]+') AS INTEGER))
          || '|' || substr(split_part(acc, '|', 2), length(regexp_extract(split_part(acc, '|', 2), '^[0-9]+')) + 1
                    + CAST(regexp_extract(split_part(acc, '|', 2), '^[0-9]+') AS INTEGER))
        ELSE acc END,
    CASE WHEN regexp_matches(name, '^_ZN?[rVKRO]*St') THEN '::std' ELSE '' END || '|'
      || regexp_replace(name, '^_Z(L)?(N[rVKRO]*)?(St)?', '')), '|', 1), '^::', ''),
    '_GLOBAL__N_1', '(anonymous namespace)');

-- @macro kernel_short_name
-- Base name of a kernel, from its C++ signature: the return type ('void', 'std::enable_if<...>::type'), the
-- template arguments and the parameter lists are dropped; the qualified name is kept, with the anonymous
-- namespace spelled '(anonymous namespace)' whether the trace wrote that (Kineto) or '<unnamed>' (nsys), lambdas
-- as '{lambda#N}' and 'operator()' as is. Examples: 'void at::native::<unnamed>::CatArrayBatchedCopy<...>(...)'
-- -> 'at::native::(anonymous namespace)::CatArrayBatchedCopy'; 'std::enable_if<...>::type
-- vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(...)' -> 'vllm::fused_add_rms_norm_kernel'. Mangled names
-- ('_Z...') give their nested name (_prelude_kernel_name_mangled); CUPTI memory descriptions ('Memcpy HtoD (...)',
-- 'Memset (Device)') are kept whole. Never empty and never ends in '::': the trimmed name is the last resort.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO kernel_short_name(name) AS
  coalesce(nullif(regexp_replace(regexp_replace(
    CASE
      WHEN starts_with(name, '_Z') THEN _prelude_kernel_name_mangled(name)
      WHEN NOT (contains(name, '<') OR contains(name, '(') OR contains(name, ' ')) THEN name
      WHEN regexp_matches(name, '^\s*(Memcpy|Memset)\b') THEN trim(name)
      ELSE replace(replace(replace(
             _prelude_kernel_name_last_word(_prelude_kernel_name_top_level(_prelude_kernel_name_spellings(name))),
             '@ANON@', '(anonymous namespace)'), '@CALL@', '()'), '@ARROW@', '->')
    END, '^:+|:+$', '', 'g'), '\s+', ' ', 'g'), ''),
    nullif(trim(name), ''), 'unknown');

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

-- @macro _prelude_kernel_class_subject
-- The text kernel_class reads: the base name, except for launch wrappers whose base name says nothing
-- ('cutlass::Kernel', 'cutlass::device_kernel', 'ck_tile::kentry', also when mangled): there the wrapped
-- kernel, i.e. the full name, carries the evidence. Reading the base name elsewhere keeps words in template
-- arguments (a GEMM traits type passed to a row-gather kernel) from deciding the class.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO _prelude_kernel_class_subject(name) AS
  -- the one-element list binds the base name once (a macro argument used twice is computed twice)
  list_transform([kernel_short_name(name)], lambda b:
    CASE WHEN regexp_matches(b, '(^|::)(Kernel[0-9]*|device_kernel|kentry)$') THEN name ELSE b END)[1];

-- @macro kernel_class
-- Class of a kernel by name; the first matching rule wins (tested row by row against
-- fixtures/kernel_names/corpus.csv). Rules 2-7 read _prelude_kernel_class_subject (the base name, or the full name of a
-- launch wrapper such as 'cutlass::Kernel<...>'), case-insensitive unless said otherwise:
--   1. 'communication': is_comm_kernel_name;
--   2. 'memory': CUPTI copy/set descriptions ('Memcpy ...', 'Memset ...'), 'memcpy*'/'memset*' kernels (CUDA
--      graph copy nodes), HIP runtime copy/fill kernels ('__amd_rocclr_copy*', '__amd_rocclr_fill*'), case-sensitive;
--   3. 'compute', before the rules below read op words in their names: Inductor pointwise and reduction
--      kernels ('triton_poi_', 'triton_red_', 'triton_per_': 'triton_poi_fused_addmm_0' is a bias add) and
--      KV-cache writes ('reshape_and_cache*', 'concat_and_cache*': 'reshape_and_cache_flash' is not attention);
--   4. 'convolution': cuDNN/CUTLASS/MIOpen/CK/Inductor convolutions, including implicit-GEMM ones: 'conv' (not
--      'convert'), 'convolve', 'fprop', 'dgrad', 'wgrad', 'winograd', 'scudnn', 'implicit_gemm', MIOpen iGEMM
--      'igemm_*' as a word ('igemm_fwd_gtcx', 'igemm_v4r1_dynamic_wrw'), CK's GEMM kernels of a convolution's
--      backward pass ('kernel_batched_gemm_xdlops_bwd_weight': 'gemm', 'xdlops', 'xdl' or 'wmma' followed by
--      '_bwd_weight' or '_bwd_data'). A class of their own, so that "overlap with GEMMs" counts matrix
--      multiplies only; they remain computation;
--   5. 'attention': 'flash' (not 'flashinfer'), 'fmha', 'mha', 'attention', 'attn', 'sdpa', 'softmax_gemm'
--      (CK fused attention), 'paged_decode', FlashInfer '...With{Paged,Ragged}KVCache', 'SinglePrefill',
--      'SingleDecode';
--   6. 'gemm' (matrix multiply, batched and grouped forms, matrix-vector included): 'gemm' (not 'fbgemm', a
--      library name), 'gemv', 'nvjet', 'Cijk_' (Tensile: rocBLAS, hipBLASLt), 'matmul', 'marlin', 'fused_moe'
--      (MoE expert GEMMs), 'splitKreduce' (the split-K reduction that completes a cuBLAS GEMM), and
--      '[add|b|scaled_]mm' as a word (Inductor 'triton_tem_fused_addmm_0', 'cutlass_scaled_mm');
--   7. 'compute': everything else.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO kernel_class(name) AS
  CASE
    WHEN is_comm_kernel_name(name) THEN 'communication'
    ELSE list_transform([_prelude_kernel_class_subject(name)], lambda s: CASE
      WHEN regexp_matches(s, '^\s*(Memcpy|Memset|memcpy|memset)|^(hip|cuda)Mem(cpy|set)|__amd_rocclr_(copy|fill)') THEN 'memory'
      WHEN regexp_matches(s, '^triton_(poi|red|per)_|reshape_and_cache|concat_and_cache', 'i') THEN 'compute'
      WHEN regexp_matches(s, 'conv([^e]|$)|convolve|fprop|dgrad|wgrad|winograd|scudnn|implicit_?gemm|(^|[^a-z0-9])igemm_'
                             '|(gemm|xdlops|xdl|wmma)[a-z0-9_]*_bwd_(weight|data)', 'i') THEN 'convolution'
      WHEN regexp_matches(s, 'flash([^i]|$)|fmha|(^|[^a-z])mha([^a-z]|$)|attention|attn|sdpa|softmax_gemm|paged_decode'
                             '|with(paged|ragged)kvcache|singleprefill|singledecode', 'i') THEN 'attention'
      WHEN regexp_matches(replace(lower(s), 'fbgemm', ''),
                          'gemm|gemv|nvjet|cijk_|matmul|marlin|fused_moe|splitkreduce|(^|_)(add|b|scaled_)?mm(_|$)') THEN 'gemm'
      ELSE 'compute' END)[1]
  END;

-- @macro is_computation_class
-- True for the kernel classes that count as computation in every overlap analysis: gemm, convolution, attention
-- and compute (communication and memory work are not computation).
-- @param kernel_class: kernels.kernel_class.
CREATE OR REPLACE MACRO is_computation_class(kernel_class) AS kernel_class IN ('gemm', 'convolution', 'attention', 'compute');

-- @macro canonical_collective
-- Maps a collective name as traces spell it (PyTorch 'Collective name', c10d op, 'nccl:' annotation,
-- NCCL API or kernel token, functional collective '_c10d_functional::all_gather_into_tensor_out',
-- SymmetricMemory op 'symm_mem::two_shot_all_reduce_') to the canonical name used in comm_ops.collective, or NULL
-- when unknown. SymmetricMemory's algorithm words ('multimem_', 'one_shot_', 'two_shot_') and the '_copy'/'_out'
-- variants name no other operation and are dropped.
-- @param s: Collective name in any known spelling.
CREATE OR REPLACE MACRO canonical_collective(s) AS
  CASE regexp_replace(regexp_replace(regexp_replace(lower(coalesce(s, '')),
         '^(nccl:|gloo:|c10d::|_?c10d_functional::|symm_mem::|nccl|rccl)', ''),
         '^(multimem_)?(one_shot_|two_shot_)?|(_copy)?(_out)?_*$', '', 'g'), '[^a-z]', '', 'g')
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
    WHEN 'alltoallsingle' THEN 'all_to_all'
    WHEN 'gather' THEN 'gather' WHEN 'scatter' THEN 'scatter'
    WHEN 'send' THEN 'send' WHEN 'recv' THEN 'recv' WHEN 'recvanysource' THEN 'recv'
    WHEN 'sendrecv' THEN 'send_recv' WHEN 'batchisendirecv' THEN 'send_recv' WHEN 'coalesced' THEN 'send_recv'
    WHEN 'barrier' THEN 'barrier'
    ELSE NULL
  END;

-- @macro kernel_name_collective
-- The collective a communication kernel's name suggests (last resort: NCCL may run any operation in any
-- kernel). NCCL/RCCL: the operation token after the prefix ('ncclDevKernel_AllGather_RING_LL' -> all_gather).
-- PyTorch SymmetricMemory (torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu):
-- 'multimem_all_reduce_kernel', 'multimem_one_shot_all_reduce_kernel', 'one_shot_all_reduce_kernel',
-- 'two_shot_all_reduce_kernel[_inplace]' -> all_reduce, except a 'two_shot_all_reduce_kernel' whose fourth
-- template argument (reduce_scatter) is true ('true', or '(bool)1' as nsys writes it), which
-- symm_mem::reduce_scatter_out launches -> reduce_scatter; 'multimem_all_gather_kernel' -> all_gather. NULL for
-- 'Generic' (RCCL) and names without a collective token.
-- @param name: Full kernel name (a short name gives the same answer, except that the two-shot reduce-scatter,
-- told apart by its template arguments only, reads as all_reduce).
CREATE OR REPLACE MACRO kernel_name_collective(name) AS
  CASE
    WHEN regexp_matches(name, '^(void )?(nccl|rccl)') THEN canonical_collective(regexp_extract(name,
      '^(?:void )?(?:nccl|rccl)(?:Dev|Sym|Symk)?(?:Kernel_|DevKernel_)?(AllReduce|AllGatherV|AllGather|ReduceScatter|Reduce|Broadcast|SendRecv|AllToAll)', 1))
    WHEN regexp_matches(name, 'two_shot_all_reduce_kernel<[^,<>]+,[^,<>]+,[^,<>]+,\s*(true|\(bool\)1)\s*[,>]')
      THEN 'reduce_scatter'
    WHEN regexp_matches(name, '(^|[^a-z_])(multimem_(one_shot_)?|one_shot_|two_shot_)all_reduce_kernel') THEN 'all_reduce'
    WHEN regexp_matches(name, '(^|[^a-z_])multimem_all_gather_kernel') THEN 'all_gather'
  END;

-- @macro kernel_name_group_size
-- The group size a communication kernel's name records: PyTorch SymmetricMemory's one-shot and two-shot all-reduce
-- kernels are instantiated per world size (template argument k_world_size, the third: 'one_shot_all_reduce_kernel
-- <c10::BFloat16, 16, 8>', nsys '<c10::BFloat16, (int)16, (int)8>'; CUDASymmetricMemoryOps.cu DISPATCH_WORLD_SIZES:
-- 8, 4, 2, or -1 for any other size). NULL for -1, for other kernels and for short names.
-- @param name: Full kernel name.
CREATE OR REPLACE MACRO kernel_name_group_size(name) AS
  nullif(TRY_CAST(regexp_extract(name,
    '(?:one_shot_all_reduce_kernel|two_shot_all_reduce_kernel(?:_inplace)?)<[^,<>]+,\s*(?:\(int\))?\d+,\s*(?:\(int\))?(-?\d+)\s*[,>]', 1)
    AS INTEGER), -1);

-- @macro canonical_dtype
-- Canonical element type name from PyTorch ScalarType names ('Float', 'BFloat16', ...), NCCL tokens
-- ('f32', 'bf16', ...) and C type names ('float', '__nv_bfloat16', ...). NULL when unknown.
-- @param t: Type name in any known spelling.
CREATE OR REPLACE MACRO canonical_dtype(t) AS
  -- a MAP lookup, not a CASE: the comm resolution SQL inlines this macro in many lambdas, and a 50-branch CASE
  -- there made planning it cost 0.4 s per ingested file
  MAP {
    'float': 'float32', 'f32': 'float32', 'float32': 'float32', 'double': 'float64', 'f64': 'float64',
    'float64': 'float64', 'half': 'float16', 'f16': 'float16', 'float16': 'float16', 'c10::half': 'float16',
    'bfloat16': 'bfloat16', 'bf16': 'bfloat16', '__nv_bfloat16': 'bfloat16', 'c10::bfloat16': 'bfloat16',
    'long': 'int64', 'int64': 'int64', 'i64': 'int64', 'int64_t': 'int64', 'long int': 'int64',
    'long long': 'int64', 'long long int': 'int64', 'unsigned long': 'uint64', 'unsigned long long': 'uint64',
    'int': 'int32', 'int32': 'int32', 'i32': 'int32', 'int32_t': 'int32', 'uint64': 'uint64', 'u64': 'uint64',
    'uint64_t': 'uint64', 'uint32': 'uint32', 'u32': 'uint32', 'uint32_t': 'uint32', 'short': 'int16',
    'int16': 'int16', 'char': 'int8', 'signed char': 'int8', 'int8': 'int8', 'i8': 'int8', 'int8_t': 'int8',
    'byte': 'uint8', 'unsigned char': 'uint8', 'uint8': 'uint8', 'u8': 'uint8', 'uint8_t': 'uint8', 'bool': 'bool',
    'float8_e4m3fn': 'float8_e4m3', 'f8e4m3': 'float8_e4m3', 'float8_e4m3fnuz': 'float8_e4m3',
    'float8_e5m2': 'float8_e5m2', 'f8e5m2': 'float8_e5m2', 'float8_e5m2fnuz': 'float8_e5m2',
    'complexfloat': 'complex64', 'complexdouble': 'complex128'
  }[lower(coalesce(t, ''))];

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
