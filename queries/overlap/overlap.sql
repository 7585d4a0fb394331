-- @include overlap/timeline.sql
-- Communication/computation overlap per kernel, per rank, per step, and the exact time breakdown.
-- Definitions (default mode): computation = kernels of class gemm, convolution, attention or compute on the rank's GPU(s)
-- (all streams); communication = kernels of class communication; memory = memory-class kernels and mem_ops
-- (copies and memsets are neither computation nor communication). Unions merge a class's intervals first, so
-- concurrent kernels are never double counted.

-- @macro _overlap_gemm_one
-- _overlap_comm_kernel_overlap's packed delta for one gemm interval: the gemm counter sits in the high 32 bits, the
-- computation counter (every computation class, gemm included) in the low 32 bits.
CREATE OR REPLACE MACRO _overlap_gemm_one() AS (CAST(1 AS BIGINT) << 32);

-- @macro _overlap_computation_open
-- True when the packed counters c of _overlap_comm_kernel_overlap have an open computation interval (low 32 bits).
-- @param c: Packed counters (BIGINT).
CREATE OR REPLACE MACRO _overlap_computation_open(c) AS (c & (_overlap_gemm_one() - 1)) > 0;

-- @macro _overlap_gemm_open
-- True when the packed counters c of _overlap_comm_kernel_overlap have an open gemm interval (high bits).
-- @param c: Packed counters (BIGINT).
CREATE OR REPLACE MACRO _overlap_gemm_open(c) AS (c >> 32) > 0;

-- @view _overlap_comm_kernel_overlap
-- @sweep per_rank
-- Per communication kernel: the union length of computation (gemm, convolution, attention, compute) and of gemm kernels on the
-- same rank within [start_ns, end_ns) (ns, may be negative for empty kernels: comm_kernels clips). One sorted sweep
-- per rank, no range join: computation kernels give +/- events, each communication kernel's start and end are
-- probes; running class counters and a running telescoped sum give the union length before any time t, and a
-- kernel's overlap is covered(end) - covered(start). comm_kernels reads it, so a caller running several of its
-- consumers can materialize it once (nsys2comm.analysis.materialize).
-- @column kernel_id: Communication kernel id.
-- @column comp_ns: Part of the kernel covered by computation (ns).
-- @column gemm_ns: Part of the kernel covered by gemm kernels (ns).
CREATE OR REPLACE VIEW _overlap_comm_kernel_overlap AS
WITH ev AS (
  -- computation kernels as +/- events; delta packs two counters: computation (low 32 bits), gemm (high bits)
  SELECT rank, start_ns AS ts, CASE WHEN kernel_class = 'gemm' THEN _overlap_gemm_one() + 1 ELSE 1 END AS delta,
         NULL::BIGINT AS probe_id, 0 AS side
  FROM kernels WHERE is_computation_class(kernel_class) AND end_ns > start_ns
  UNION ALL
  SELECT rank, end_ns, CASE WHEN kernel_class = 'gemm' THEN -(_overlap_gemm_one() + 1) ELSE -1 END, NULL, 0
  FROM kernels WHERE is_computation_class(kernel_class) AND end_ns > start_ns
  UNION ALL  -- probes: start (side -1) and end (side +1) of every communication kernel, delta 0
  SELECT rank, start_ns, 0, kernel_id, -1 FROM kernels WHERE kernel_class = 'communication'
  UNION ALL
  SELECT rank, end_ns, 0, kernel_id, 1 FROM kernels WHERE kernel_class = 'communication'
), sorted_ev AS (
  SELECT * FROM ev ORDER BY rank, ts
), cnt AS (
  -- running counters (streaming window over the sorted events; each rank's deltas sum to 0, so no PARTITION BY)
  SELECT rank, ts, delta, probe_id, side, CAST(sum(delta) OVER (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS BIGINT) AS c
  FROM sorted_ev
), chg AS (
  SELECT rank, ts, probe_id, side,
         _overlap_computation_open(c)::BIGINT AS comp_on, _overlap_gemm_open(c)::BIGINT AS gemm_on,
         ts * (_overlap_computation_open(c - delta)::BIGINT - _overlap_computation_open(c)::BIGINT) AS comp_x,
         ts * (_overlap_gemm_open(c - delta)::BIGINT - _overlap_gemm_open(c)::BIGINT) AS gemm_x
  FROM cnt
), cov AS (
  -- covered(t) = union length before t = sum over earlier events of ts * (on before - on after) + t * (on now);
  -- the per-rank sums telescope to 0 at the end of a rank, so one running sum serves all ranks
  SELECT probe_id, side,
         CAST(sum(comp_x) OVER w AS BIGINT) + ts * comp_on AS comp_cov,
         CAST(sum(gemm_x) OVER w AS BIGINT) + ts * gemm_on AS gemm_cov
  FROM chg
  WINDOW w AS (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT probe_id AS kernel_id, CAST(sum(side * comp_cov) AS BIGINT) AS comp_ns,
       CAST(sum(side * gemm_cov) AS BIGINT) AS gemm_ns
FROM cov WHERE probe_id IS NOT NULL GROUP BY probe_id;

-- @macro _overlap_comm_algorithm
-- The NCCL/RCCL algorithm that a communication kernel's name says ran, NULL where the name does not say it. Checked
-- in NCCL's and RCCL's sources (see docs/device-peaks.md): NCCL 2.8-2.18 `ncclKernel_<Coll>_<ALGO>_LL_...` and
-- NCCL <= 2.7 `nccl<Coll><Algo>LLKernel_...` carry the algorithm of the kernel's first operation (TREE, RING,
-- COLLNET, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE; a kernel exists per algorithm, LL protocol only);
-- NCCL >= 2.19 `ncclDevKernel_..._<ALGO>_LL` names only TREE truthfully (generate.py's best_kernel maps every
-- other algorithm, NVLS and PAT included, to the RING kernel), so RING there gives NULL; symmetric-memory kernels
-- (`ncclSymDevKernel_` 2.27, `ncclSymkDevKernel_` >= 2.28, also RCCL) are one kernel per algorithm and give their
-- algorithm token (e.g. 'AGxLL_R', 'RSxLDMC_AGxSTMC'); SendRecv kernels (which also run grouped collectives) and
-- RCCL's `ncclDevKernel_Generic[_N]` give NULL.
-- @param short_name: Kernel base name (kernels.short_name).
CREATE OR REPLACE MACRO _overlap_comm_algorithm(short_name) AS
  CASE
    WHEN regexp_matches(short_name, '^nccl(?:Sym|Symk)DevKernel_')
      THEN nullif(regexp_extract(short_name,
             '^nccl(?:Sym|Symk)DevKernel_(?:AllGather|AllReduce|ReduceScatter)_(.+?)(?:_(?:sum|avg)_[a-z0-9]+)?(?:_profile)?$', 1), '')
    WHEN regexp_matches(short_name, '^(?:nccl|rccl)DevKernel_')
      THEN CASE WHEN regexp_matches(short_name, '_TREE_(?:LL|LL128|SIMPLE)$') THEN 'TREE' END
    WHEN regexp_matches(short_name, '^(?:nccl|rccl)Kernel_(?:AllReduce|AllGather|ReduceScatter|Reduce|Broadcast)_')
      THEN nullif(regexp_extract(short_name,
             '^(?:nccl|rccl)Kernel_(?:AllReduce|AllGather|ReduceScatter|Reduce|Broadcast)_((?:COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|TREE|RING))_(?:LL128|LL|SIMPLE)_', 1), '')
    WHEN regexp_matches(short_name, '^nccl(?:AllReduce|AllGather|ReduceScatter|Reduce|Broadcast)(?:Ring|Tree|CollNet)(?:LL128|LL)?Kernel_')
      THEN upper(regexp_extract(short_name, '^nccl(?:AllReduce|AllGather|ReduceScatter|Reduce|Broadcast)(Ring|Tree|CollNet)', 1))
  END;

-- @macro _overlap_comm_protocol
-- The NCCL protocol that a communication kernel's name says ran, NULL where it does not say it. Every NCCL kernel
-- that names a protocol before the symmetric-memory kernels is the LL entry point of its algorithm (LL128 and SIMPLE
-- work runs inside it: common.h "Only generate inline kernels for LL", generate.py best_kernel), so those names give
-- NULL; a symmetric-memory kernel whose algorithm is a low-latency one (its token holds 'LL': 'LL', 'LLMC',
-- 'AGxLL_R', 'AGxLLMC_R') gives 'LL'.
-- @param short_name: Kernel base name (kernels.short_name).
CREATE OR REPLACE MACRO _overlap_comm_protocol(short_name) AS
  CASE WHEN regexp_matches(coalesce(_overlap_comm_algorithm(short_name), ''), '(?:^|x)LL(?:MC)?(?:_|$)')
        AND regexp_matches(short_name, '^nccl(?:Sym|Symk)DevKernel_') THEN 'LL' END;

-- @macro _overlap_comm_channels
-- Channels an NCCL/RCCL collective or p2p kernel ran on: its grid x (one block per channel, ncclKernel's
-- blockIdx -> channelMask bit), NULL for other communication kernels (symmetric-memory and custom all-reduce
-- kernels size their grid otherwise) and when the grid is unknown.
-- @param short_name: Kernel base name (kernels.short_name).
-- @param grid_x: Grid size x (kernels.grid_x).
CREATE OR REPLACE MACRO _overlap_comm_channels(short_name, grid_x) AS
  CASE WHEN regexp_matches(short_name, '^(?:nccl|rccl)(?:DevKernel_|Kernel_|(?:AllReduce|AllGather|ReduceScatter|Reduce|Broadcast|SendRecv)\w*Kernel_)')
            AND grid_x > 0 THEN grid_x END::INTEGER;

-- @view _overlap_comm_kernels
-- @sweep per_rank order=rank,start_ns,kernel_id
-- comm_kernels' rows, unordered, for the analyses that join or aggregate them: a macro's ORDER BY is kept
-- inside the queries that read it (a sort of every communication kernel). A view, so that ingest stores it with
-- the other shared sweeps (nsys2comm.cache): joining every communication kernel with its overlap and its comm_ops
-- row was most of comm_kernels and of the analyses built on it.
-- @column kernel_id: Kernel id (kernels.kernel_id).
-- @column rank: Rank.
-- @column device_id: Device.
-- @column stream_id: Stream.
-- @column start_ns: Kernel start (ns).
-- @column end_ns: Kernel end (ns).
-- @column duration_ns: end_ns − start_ns (ns).
-- @column short_name: Kernel base name.
-- @column collective: Canonical collective (comm_ops.collective), 'unknown' when no comm_ops row.
-- @column msg_bytes: Message size in nccl-tests' convention S (bytes), when known.
-- @column in_bytes: Input buffer bytes, when known.
-- @column out_bytes: Output buffer bytes, when known.
-- @column dtype: Canonical element type, when known.
-- @column group_size: Ranks in the communicator, when known.
-- @column pg_name: Process-group name or communicator id, when known.
-- @column peer_rank: Point-to-point peer, when known.
-- @column seq: Collective sequence number in its process group, when known.
-- @column n_ops: API-level operations fused into the kernel.
-- @column overlapped_by_compute_ns: Part of the kernel during which any computation kernel ran on the rank (ns).
-- @column overlapped_by_gemm_ns: Part of the kernel during which a gemm kernel ran on the rank (ns).
-- @column exposed_ns: Part of the kernel with no computation running (ns).
-- @column algorithm: NCCL/RCCL algorithm the kernel name says ran (_overlap_comm_algorithm), NULL where it does not say.
-- @column protocol: NCCL protocol the kernel name says ran (_overlap_comm_protocol), NULL where it does not say.
-- @column channels: Channels (grid x) of an NCCL/RCCL kernel (_overlap_comm_channels), NULL otherwise.
CREATE OR REPLACE VIEW _overlap_comm_kernels AS
WITH p AS (SELECT * FROM _overlap_comm_kernel_overlap)
SELECT k.kernel_id, k.rank, k.device_id, k.stream_id, k.start_ns, k.end_ns, k.end_ns - k.start_ns AS duration_ns,
       k.short_name, coalesce(o.collective, 'unknown') AS collective, o.msg_bytes, o.in_bytes, o.out_bytes, o.dtype,
       o.group_size, o.pg_name, o.peer_rank, o.seq, coalesce(o.n_ops, 1) AS n_ops,
       CAST(CASE WHEN k.end_ns > k.start_ns THEN greatest(p.comp_ns, 0) ELSE 0 END AS BIGINT) AS overlapped_by_compute_ns,
       CAST(CASE WHEN k.end_ns > k.start_ns THEN greatest(p.gemm_ns, 0) ELSE 0 END AS BIGINT) AS overlapped_by_gemm_ns,
       greatest(k.end_ns - k.start_ns, 0)
         - CAST(CASE WHEN k.end_ns > k.start_ns THEN greatest(p.comp_ns, 0) ELSE 0 END AS BIGINT) AS exposed_ns,
       _overlap_comm_algorithm(k.short_name) AS algorithm, _overlap_comm_protocol(k.short_name) AS protocol,
       _overlap_comm_channels(k.short_name, k.grid_x) AS channels
FROM kernels k
JOIN p ON p.kernel_id = k.kernel_id
LEFT JOIN comm_ops o ON o.kernel_id = k.kernel_id;

-- @macro comm_kernels
-- One row per communication kernel with its comm_ops fields and how much of it ran under computation on the
-- same rank: overlapped_by_compute_ns = |kernel ∩ union(computation kernels)|, overlapped_by_gemm_ns the same for
-- gemm kernels only, exposed_ns = duration_ns − overlapped_by_compute_ns (time with no computation running).
-- Kernels without a comm_ops row appear with collective 'unknown'. Computed in one sorted sweep per rank (no
-- range join): computation kernels give +/- events, each communication kernel's start and end are probes; the
-- running class counters and a running telescoped sum give the union length before any time t, and a kernel's
-- overlap is covered(end) - covered(start) (the same quantity as intervals_covered_ns).
-- @column kernel_id: Kernel id (kernels.kernel_id).
-- @column rank [key]: Rank.
-- @column device_id: Device.
-- @column stream_id: Stream.
-- @column start_ns: Kernel start (ns).
-- @column end_ns: Kernel end (ns).
-- @column duration_ns: end_ns − start_ns (ns).
-- @column short_name: Kernel base name.
-- @column collective [key]: Canonical collective (comm_ops.collective), 'unknown' when no comm_ops row.
-- @column msg_bytes [key]: Message size in nccl-tests' convention S (bytes), when known.
-- @column in_bytes: Input buffer bytes, when known.
-- @column out_bytes: Output buffer bytes, when known.
-- @column dtype: Canonical element type, when known.
-- @column group_size: Ranks in the communicator, when known.
-- @column pg_name: Process-group name or communicator id, when known.
-- @column peer_rank: Point-to-point peer, when known.
-- @column seq: Collective sequence number in its process group, when known.
-- @column n_ops: API-level operations fused into the kernel.
-- @column overlapped_by_compute_ns: Part of the kernel during which any computation kernel ran on the rank (ns).
-- @column overlapped_by_gemm_ns: Part of the kernel during which a gemm kernel ran on the rank (ns).
-- @column exposed_ns [key]: Part of the kernel with no computation running (ns).
-- @column algorithm: NCCL/RCCL algorithm the kernel name says ran (_overlap_comm_algorithm), NULL where it does not say.
-- @column protocol: NCCL protocol the kernel name says ran (_overlap_comm_protocol), NULL where it does not say.
-- @column channels: Channels (grid x) of an NCCL/RCCL kernel (_overlap_comm_channels), NULL otherwise.
CREATE OR REPLACE MACRO comm_kernels() AS TABLE
SELECT * FROM _overlap_comm_kernels ORDER BY rank, start_ns, kernel_id;

-- @macro overlap_by_rank
-- Per rank: union of communication-kernel time and how much of it is hidden under computation.
-- compat 'none' (default): exact ns, classes from kernels.kernel_class, memory work excluded from computation.
-- compat 'hta': HolisticTraceAnalysis 0.5.0 get_comm_comp_overlap — kernel and mem_ops names classified by HTA's
-- regexes, times as HTA reads them (float64 µs of the file's clock, start ceiled, end = floor(start + dur), so a
-- sub-µs event can get a negative length, handled as HTA's interval merge does), the last ProfilerStep dropped when
-- the job has >= 2 step names (see _overlap_gpu_intervals), comm_overlap_pct = round(100 × overlap / comm, 2) half to even.
-- In this mode comm_ns is HTA's merged communication total (negative lone intervals included; it can be <= 0),
-- comm_overlap_pct is NULL where HTA divides by 0 (NaN/inf), and a rank that HTA empties (no ProfilerStep while
-- others have them) has NULL. HTA's own result is not unique where a sub-µs communication interval and another
-- start in the same µs (pandas' unstable sort, > ~256 intervals); ties are taken in file order here.
-- The two modes differ because HTA drops a whole step, rounds to µs, and misses communication kernels whose names
-- do not match '^nccl.*Kernel' (custom all-reduce, hccl, lower-case names).
-- @param compat: 'none' (exact) or 'hta' (HolisticTraceAnalysis 0.5.0 numbers).
-- @column rank [key]: Rank.
-- @column span_start_ns: First GPU interval start on the rank (ns).
-- @column span_end_ns: Last GPU interval end on the rank (ns).
-- @column span_ns [key]: span_end_ns − span_start_ns (ns).
-- @column busy_ns [key]: Time any GPU work (any class) ran (ns).
-- @column idle_ns: span_ns − busy_ns (ns).
-- @column compute_ns: Union of computation-kernel time (ns).
-- @column gemm_ns: Union of gemm-kernel time (ns).
-- @column memory_ns: Union of memory work time (ns).
-- @column comm_ns [key]: Union of communication-kernel time (ns).
-- @column comm_overlapped_ns: Communication time during which computation ran (ns).
-- @column comm_overlap_pct [key]: 100 × comm_overlapped_ns / comm_ns (NULL without communication).
-- @column gemm_overlapped_ns: Communication time during which a gemm kernel ran (ns).
-- @column gemm_overlap_pct: 100 × gemm_overlapped_ns / comm_ns (NULL without communication).
-- @column exposed_comm_ns [key]: Communication time with no computation running: comm_ns − comm_overlapped_ns (ns).
CREATE OR REPLACE MACRO overlap_by_rank(compat := 'none') AS TABLE
WITH t AS (
  SELECT * FROM _overlap_gpu_timeline WHERE compat = 'none'
  UNION ALL
  SELECT * FROM _overlap_gpu_state_ns(compat := 'hta') WHERE compat = 'hta'
), s AS (
  SELECT rank,
    max(first_ns) FILTER (WHERE state = -1) AS span_start_ns,
    max(last_ns) FILTER (WHERE state = -1) AS span_end_ns,
    coalesce(sum(dur_ns) FILTER (WHERE state > 0), 0) AS busy_ns,
    coalesce(sum(dur_ns) FILTER (WHERE (state & 6) <> 0), 0) AS compute_ns,
    coalesce(sum(dur_ns) FILTER (WHERE (state & 2) <> 0), 0) AS gemm_ns,
    coalesce(sum(dur_ns) FILTER (WHERE (state & 8) <> 0), 0) AS memory_ns,
    coalesce(sum(dur_ns) FILTER (WHERE state > 0 AND (state & 1) <> 0), 0)
      + coalesce(sum(dur_ns) FILTER (WHERE state = -1), 0) AS comm_ns,
    coalesce(sum(dur_ns) FILTER (WHERE state > 0 AND (state & 1) <> 0 AND (state & 6) <> 0), 0) AS comm_overlapped_ns,
    coalesce(sum(dur_ns) FILTER (WHERE state > 0 AND (state & 1) <> 0 AND (state & 2) <> 0), 0) AS gemm_overlapped_ns
  FROM t WHERE step_ord IS NULL GROUP BY rank
), r AS (SELECT rank FROM ranks UNION SELECT rank FROM s)
SELECT r.rank, s.span_start_ns, s.span_end_ns, s.span_end_ns - s.span_start_ns AS span_ns,
       CAST(coalesce(s.busy_ns, 0) AS BIGINT) AS busy_ns,
       CAST(s.span_end_ns - s.span_start_ns - s.busy_ns AS BIGINT) AS idle_ns,
       CAST(coalesce(s.compute_ns, 0) AS BIGINT) AS compute_ns, CAST(coalesce(s.gemm_ns, 0) AS BIGINT) AS gemm_ns,
       CAST(coalesce(s.memory_ns, 0) AS BIGINT) AS memory_ns, CAST(coalesce(s.comm_ns, 0) AS BIGINT) AS comm_ns,
       CAST(coalesce(s.comm_overlapped_ns, 0) AS BIGINT) AS comm_overlapped_ns,
       CASE WHEN compat = 'hta' THEN  -- HTA: round(100 * (overlap / comm), 2) with numpy (half to even)
              CASE WHEN s.comm_ns <> 0 THEN roundbankers(100 * (s.comm_overlapped_ns::DOUBLE / s.comm_ns::DOUBLE)
                                                         * 100, 0) / 100 END
            WHEN s.comm_ns > 0 THEN 100.0 * s.comm_overlapped_ns / s.comm_ns END::DOUBLE AS comm_overlap_pct,
       CAST(coalesce(s.gemm_overlapped_ns, 0) AS BIGINT) AS gemm_overlapped_ns,
       CASE WHEN s.comm_ns > 0 THEN 100.0 * s.gemm_overlapped_ns / s.comm_ns END::DOUBLE AS gemm_overlap_pct,
       CAST(coalesce(s.comm_ns - s.comm_overlapped_ns, 0) AS BIGINT) AS exposed_comm_ns
FROM r LEFT JOIN s USING (rank)
ORDER BY r.rank;

-- @macro time_breakdown_by_rank
-- Exact GPU time per rank in every combination of running classes — like HTA's kernel-type breakdown
-- ("COMPUTATION overlapping COMMUNICATION", ...) but from exact unions, without µs rounding or step dropping.
-- Categories: 'computation', 'communication', 'memory', 'computation overlapping communication',
-- 'computation overlapping memory', 'communication overlapping memory',
-- 'computation overlapping communication overlapping memory', and 'idle' (span minus busy). Categories are
-- exclusive, so time_ns adds up to the span. computation = gemm ∪ convolution ∪ attention ∪ compute kernels.
-- @column rank [key]: Rank.
-- @column category [key]: Class combination running (see description), or 'idle'.
-- @column computation: True when computation runs in this category.
-- @column communication: True when communication runs in this category.
-- @column memory: True when memory work runs in this category.
-- @column time_ns [key]: Time in the category (ns).
-- @column span_pct [key]: 100 × time_ns / the rank's GPU span.
CREATE OR REPLACE MACRO time_breakdown_by_rank() AS TABLE
WITH t AS (SELECT * FROM _overlap_gpu_timeline WHERE step_ord IS NULL),
c AS (
  SELECT rank, ((state & 6) <> 0) AS computation, ((state & 1) <> 0) AS communication, ((state & 8) <> 0) AS memory,
         sum(dur_ns) AS time_ns
  FROM t WHERE state > 0 GROUP BY ALL
), span AS (SELECT rank, max(last_ns) - max(first_ns) AS span_ns FROM t WHERE state = -1 GROUP BY rank),
allc AS (
  SELECT rank, computation, communication, memory, time_ns FROM c
  UNION ALL
  SELECT s.rank, false, false, false, s.span_ns - coalesce((SELECT sum(time_ns) FROM c WHERE c.rank = s.rank), 0)
  FROM span s
)
SELECT a.rank,
       CASE WHEN NOT (computation OR communication OR memory) THEN 'idle'
            ELSE concat_ws(' overlapping ', CASE WHEN computation THEN 'computation' END,
                           CASE WHEN communication THEN 'communication' END, CASE WHEN memory THEN 'memory' END) END
         AS category,
       computation, communication, memory, CAST(time_ns AS BIGINT) AS time_ns,
       CASE WHEN s.span_ns > 0 THEN 100.0 * time_ns / s.span_ns END::DOUBLE AS span_pct
FROM allc a JOIN span s USING (rank)
ORDER BY a.rank, (computation OR communication OR memory) DESC,
         computation::INT + communication::INT + memory::INT, computation DESC, communication DESC;

-- @macro overlap_by_step
-- overlap_by_rank per iteration: one row per rank and ProfilerStep#N (Kineto) or NVTX iteration range
-- (see _overlap_steps); no rows when the trace has no steps. The step window is the range on the CPU timeline; GPU work
-- is clipped to it (work launched in a step that runs after its end counts in the next step or none).
-- @column rank [key]: Rank.
-- @column step_ord: 1, 2, ... in start order on that rank.
-- @column step_name: Range name (e.g. 'ProfilerStep#12').
-- @column step_no [key]: N from the name, when present.
-- @column step_start_ns: Step start (ns).
-- @column step_end_ns: Step end (ns).
-- @column step_ns [key]: Step length (ns).
-- @column busy_ns: Time any GPU work ran inside the step (ns).
-- @column idle_ns: step_ns − busy_ns (ns).
-- @column compute_ns: Union of computation-kernel time inside the step (ns).
-- @column comm_ns [key]: Union of communication-kernel time inside the step (ns).
-- @column comm_overlapped_ns: Communication time during which computation ran (ns).
-- @column comm_overlap_pct [key]: 100 × comm_overlapped_ns / comm_ns (NULL without communication).
-- @column gemm_overlapped_ns: Communication time during which a gemm kernel ran (ns).
-- @column exposed_comm_ns [key]: comm_ns − comm_overlapped_ns (ns).
CREATE OR REPLACE MACRO overlap_by_step() AS TABLE
WITH s AS (
  SELECT rank, step_ord,
    coalesce(sum(dur_ns) FILTER (WHERE state > 0), 0) AS busy_ns,
    coalesce(sum(dur_ns) FILTER (WHERE (state & 6) <> 0), 0) AS compute_ns,
    coalesce(sum(dur_ns) FILTER (WHERE (state & 1) <> 0), 0) AS comm_ns,
    coalesce(sum(dur_ns) FILTER (WHERE (state & 1) <> 0 AND (state & 6) <> 0), 0) AS comm_overlapped_ns,
    coalesce(sum(dur_ns) FILTER (WHERE (state & 1) <> 0 AND (state & 2) <> 0), 0) AS gemm_overlapped_ns
  FROM _overlap_gpu_timeline WHERE step_ord IS NOT NULL AND state > 0 GROUP BY rank, step_ord
)
SELECT st.rank, st.step_ord, st.step_name, st.step_no, st.step_start_ns, st.step_end_ns,
       st.step_end_ns - st.step_start_ns AS step_ns,
       CAST(coalesce(s.busy_ns, 0) AS BIGINT) AS busy_ns,
       CAST(st.step_end_ns - st.step_start_ns - coalesce(s.busy_ns, 0) AS BIGINT) AS idle_ns,
       CAST(coalesce(s.compute_ns, 0) AS BIGINT) AS compute_ns, CAST(coalesce(s.comm_ns, 0) AS BIGINT) AS comm_ns,
       CAST(coalesce(s.comm_overlapped_ns, 0) AS BIGINT) AS comm_overlapped_ns,
       CASE WHEN s.comm_ns > 0 THEN 100.0 * s.comm_overlapped_ns / s.comm_ns END::DOUBLE AS comm_overlap_pct,
       CAST(coalesce(s.gemm_overlapped_ns, 0) AS BIGINT) AS gemm_overlapped_ns,
       CAST(coalesce(s.comm_ns - s.comm_overlapped_ns, 0) AS BIGINT) AS exposed_comm_ns
FROM _overlap_steps() st LEFT JOIN s USING (rank, step_ord)
ORDER BY st.rank, st.step_ord;

-- @macro overlap_worst_rank
-- The rank whose exposed communication is the largest share of its own GPU-busy time (overlap_by_rank, exact
-- mode): the one worst-rank rule of the summary (worst_rank) and the report's overlap finding. Ties go to the
-- lowest rank. No row when the job has no communication time or no rank was busy on the GPU.
-- @column rank [key]: The worst rank.
-- @column busy_ns: Its GPU-busy time (overlap_by_rank.busy_ns, ns).
-- @column exposed_comm_ns: Its exposed communication time (overlap_by_rank.exposed_comm_ns, ns).
-- @column exposed_busy_pct [key]: 100 × exposed_comm_ns / busy_ns.
-- @column ranks_compared: Ranks with GPU-busy time that were compared (1: the worst rank is the only one).
CREATE OR REPLACE MACRO overlap_worst_rank() AS TABLE
WITH o AS (SELECT rank, busy_ns, comm_ns, exposed_comm_ns FROM overlap_by_rank()),
b AS (
  SELECT rank, busy_ns, exposed_comm_ns, 100.0 * exposed_comm_ns / busy_ns AS exposed_busy_pct,
         count(*) OVER () AS ranks_compared
  FROM o WHERE busy_ns > 0
)
SELECT rank, busy_ns, exposed_comm_ns, exposed_busy_pct::DOUBLE AS exposed_busy_pct, ranks_compared
FROM b WHERE (SELECT sum(comm_ns) FROM o) > 0
ORDER BY exposed_busy_pct DESC, rank
LIMIT 1;
