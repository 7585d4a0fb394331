-- How the Nsight Systems importer derives comm_ops from one file's canonical rows (private; run by
-- ingest.nsys.finalize as INSERT INTO comm_ops BY NAME SELECT * FROM _ingest_nsys_comm_ops(file_id)).
--
-- A communication kernel is tied to the CPU thread that launched it (api_calls, same rank and correlation id).
-- On that thread, ranges that contain the launch call (start <= launch start, end >= launch end; ASOF joins on
-- start, innermost = latest start) describe it:
--   * PyTorch's emit_nvtx range 'nccl:<op>' (default NVTX domain): the operation the user called. Its collective
--     wins over NCCL's API names (a grouped ncclSend/ncclRecv inside 'nccl:all_to_all' is an all_to_all);
--   * NCCL's own NVTX API range (domain 'NCCL'): a collective launched inside its own range, or, for grouped
--     operations, the outermost ncclGroupEnd; the group's members are the NCCL operation ranges between the
--     outermost ncclGroupStart and that ncclGroupEnd (nested groups: only the outermost End launches).
-- Sizes, first route that gives bytes: PyTorch 'sizes' (record_shapes=True) times the element size, when the
-- dtype is known (the kernel name's reduction dtype: PyTorch's NVTX text carries shapes, no dtype); else the
-- NCCL payloads ('Message size [bytes]', needs nsys export --include-blobs=true). Group size, communicator and
-- peer come from the NCCL payloads only. PyTorch's 'seq = N' is the autograd sequence number, not the process
-- group's collective counter, so comm_ops.seq stays NULL.

-- @macro _ingest_nsys_pytorch_ranges
-- PyTorch emit_nvtx ranges that name a collective, parsed. PyTorch writes the text with getNvtxStr
-- (torch/csrc/profiler/util.cpp): 'name[, seq = N][, op_id = M][, sizes = [[d0, d1], [], ...]][, input_op_ids =
-- [...]]'; 'sizes' lists one shape per input of the record function ([] for a non-tensor or TensorList input).
-- ProcessGroupNCCL's 'nccl:<op>' record function takes the collective's input tensors, so their elements are
-- summed (the same reading as the Kineto importer's 'Input Dims' of nccl:* ranges).
-- @param fid: File id.
-- @column range_id: cpu_ranges.range_id of the range.
-- @column rank: Rank of the process.
-- @column tid: Thread id.
-- @column start_ns: Start (ns).
-- @column end_ns: End (ns); NULL for an unfinished range.
-- @column collective: Canonical collective named by 'nccl:<op>' (canonical_collective), NULL when unknown.
-- @column input_elems: Elements of the input tensors listed in 'sizes'; NULL without sizes or with only empty shapes.
-- @column autograd_seq: The 'seq = N' field (autograd sequence number), else NULL.
-- @column op_id: The 'op_id = M' field (record-function handle), else NULL.
CREATE OR REPLACE MACRO _ingest_nsys_pytorch_ranges(fid) AS TABLE
WITH named AS (
  SELECT range_id, rank, tid, start_ns, end_ns, name,
         TRY_CAST(regexp_extract(name, ', sizes = (\[(?:\[[-0-9, ]*\](?:, )?)*\])', 1) AS BIGINT[][]) AS shapes
  FROM cpu_ranges
  WHERE file_id = fid AND kind = 'nvtx' AND domain IS NULL AND name LIKE 'nccl:%'
)
SELECT range_id, rank, tid, start_ns, end_ns,
       canonical_collective(regexp_extract(name, '^nccl:([A-Za-z_]+)', 1)) AS collective,
       TRY_CAST(list_sum(list_transform(shapes, lambda s: CASE WHEN len(s) > 0
                  THEN list_reduce(s::HUGEINT[], lambda a, b: a * b) END)) AS BIGINT) AS input_elems,
       TRY_CAST(nullif(regexp_extract(name, ', seq = (-?[0-9]+)', 1), '') AS BIGINT) AS autograd_seq,
       TRY_CAST(nullif(regexp_extract(name, ', op_id = ([0-9]+)', 1), '') AS BIGINT) AS op_id
FROM named
ORDER BY range_id;

-- @macro _ingest_nsys_nccl_ranges
-- One file's NCCL NVTX API ranges with their decoded payload fields and their place in ncclGroupStart/End
-- nesting. Depth is the number of open groups on the thread, clamped at 0 (a window that starts inside a group
-- shows an End without its Start): depth = running sum of +1/-1 minus the lowest running sum so far when negative.
-- @param fid: File id.
-- @column range_id: cpu_ranges.range_id.
-- @column rank: Rank of the process.
-- @column tid: Thread id.
-- @column start_ns: Start (ns).
-- @column end_ns: End (ns); the start for an unfinished range.
-- @column name: NCCL API name ('ncclAllReduce', 'ncclGroupEnd', ...).
-- @column collective: Canonical collective of the API call, NULL for non-operations (groups, comm init, ...).
-- @column raw_bytes: NCCL's 'Message size [bytes]' (count * type size; per-rank chunk for AllGather and ReduceScatter).
-- @column peer: Peer as a global rank (through the comm-init payloads), or NCCL's peer when the communicator is the largest one.
-- @column comm_id: NCCL communicator id (commHash, NCCL >= 2.25).
-- @column nranks: Ranks in the communicator (comm-init payload of the same comm_id).
-- @column depth_before: Open groups on the thread before this range.
-- @column outer_group: Number of outermost ncclGroupStart ranges on the thread up to this one (group key).
CREATE OR REPLACE MACRO _ingest_nsys_nccl_ranges(fid) AS TABLE
WITH ci AS (
  SELECT args->>'comm_id' AS comm_id, max(TRY_CAST(args->>'nranks' AS INTEGER)) AS nranks
  FROM cpu_ranges WHERE file_id = fid AND domain = 'NCCL' AND args->>'nranks' IS NOT NULL
  GROUP BY ALL
), pm AS (  -- NCCL's peer is a rank inside the communicator: its global rank from the comm-init payloads
  SELECT args->>'comm_id' AS comm_id, TRY_CAST(args->>'rank' AS INTEGER) AS local_peer, min(rank) AS global_peer
  FROM cpu_ranges
  WHERE file_id = fid AND domain = 'NCCL' AND args->>'nranks' IS NOT NULL AND args->>'rank' IS NOT NULL
  GROUP BY ALL
), base AS (
  SELECT range_id, rank, tid, start_ns, coalesce(end_ns, start_ns) AS end_ns, name,
         CASE WHEN name = 'ncclBcast' THEN 'broadcast' ELSE canonical_collective(name) END AS collective,
         TRY_CAST(args->>'msg_bytes' AS BIGINT) AS raw_bytes, TRY_CAST(args->>'peer' AS INTEGER) AS local_peer,
         args->>'comm_id' AS comm_id,
         CASE name WHEN 'ncclGroupStart' THEN 1 WHEN 'ncclGroupEnd' THEN -1 ELSE 0 END AS delta
  FROM cpu_ranges WHERE file_id = fid AND kind = 'nvtx' AND domain = 'NCCL'
), walk AS (
  SELECT *, sum(delta) OVER w AS level
  FROM base WINDOW w AS (PARTITION BY rank, tid ORDER BY start_ns, range_id ROWS UNBOUNDED PRECEDING)
), clamped AS (
  SELECT *, level - least(0, min(level) OVER w) AS depth_after
  FROM walk WINDOW w AS (PARTITION BY rank, tid ORDER BY start_ns, range_id ROWS UNBOUNDED PRECEDING)
), depth AS (
  SELECT *, lag(depth_after, 1, 0) OVER w AS depth_before
  FROM clamped WINDOW w AS (PARTITION BY rank, tid ORDER BY start_ns, range_id)
)
SELECT d.range_id, d.rank, d.tid, d.start_ns, d.end_ns, d.name, d.collective, d.raw_bytes,
       CASE WHEN pm.global_peer IS NOT NULL THEN pm.global_peer
            WHEN ci.nranks IS NULL OR ci.nranks >= (SELECT max(nranks) FROM ci) THEN d.local_peer END AS peer,
       d.comm_id, ci.nranks, d.depth_before,
       sum(CASE WHEN d.name = 'ncclGroupStart' AND d.depth_before = 0 THEN 1 ELSE 0 END) OVER (
         PARTITION BY d.rank, d.tid ORDER BY d.start_ns, d.range_id ROWS UNBOUNDED PRECEDING) AS outer_group
FROM depth d LEFT JOIN ci USING (comm_id) LEFT JOIN pm ON pm.comm_id = d.comm_id AND pm.local_peer = d.local_peer
ORDER BY d.range_id;

-- @macro _ingest_nsys_comm_ops
-- comm_ops rows of one nsys file (see the file header for the rules). NCCL payload sizes follow NCCL's
-- convention ('Message size [bytes]' = sendcount * size for AllGather, recvcount * size for ReduceScatter) and
-- are turned into nccl-tests' S with the communicator size; grouped point-to-point operations sum their sends
-- (in_bytes, msg_bytes) and receives (out_bytes).
-- @param fid: File id.
-- @column kernel_id: comm_ops.kernel_id.
-- @column file_id: comm_ops.file_id.
-- @column rank: comm_ops.rank.
-- @column collective: comm_ops.collective.
-- @column element_count: comm_ops.element_count; from PyTorch sizes also when the dtype (hence msg_bytes) is unknown.
-- @column dtype: comm_ops.dtype (reduction kernels' name token).
-- @column in_bytes: comm_ops.in_bytes.
-- @column out_bytes: comm_ops.out_bytes.
-- @column msg_bytes: comm_ops.msg_bytes.
-- @column group_size: comm_ops.group_size: NCCL's payload 'nranks', else the world size a SymmetricMemory kernel's
-- name records (kernel_name_group_size).
-- @column pg_name: comm_ops.pg_name (the NCCL communicator id).
-- @column pg_desc: comm_ops.pg_desc (always NULL in nsys).
-- @column pg_ranks: comm_ops.pg_ranks (always NULL in nsys).
-- @column peer_rank: comm_ops.peer_rank.
-- @column seq: comm_ops.seq (always NULL in nsys, see the file header).
-- @column comm_id: comm_ops.comm_id.
-- @column n_ops: comm_ops.n_ops.
-- @column collective_source: 'pytorch_nvtx', 'nvtx' (NCCL's API ranges) or 'kernel_name'.
-- @column size_source: 'pytorch_nvtx', 'nvtx_payload' or NULL.
-- @column group_source: 'nvtx_payload', 'kernel_name' or NULL.
-- @column peer_source: 'nvtx_payload' or NULL.
CREATE OR REPLACE MACRO _ingest_nsys_comm_ops(fid) AS TABLE
WITH ck AS (  -- communication kernels, with what their names say
  SELECT kernel_id, rank, correlation_id,
         kernel_name_collective(name) AS name_coll, kernel_name_group_size(name) AS name_gs,
         canonical_dtype(regexp_extract(short_name,
           '_(?:Sum|Prod|MinMax|Max|Min|Avg|PreMulSum|SumPostDiv)_([A-Za-z0-9_]+?)(?:_(?:RING|TREE|COLLNET|NVLS|PAT)[A-Za-z0-9_]*)?$', 1)) AS name_dtype
  FROM kernels WHERE file_id = fid AND kernel_class = 'communication'
), launch AS (  -- the launch call: first API call of the process with the kernel's correlation id
  SELECT ck.kernel_id, arg_min(a.tid, a.start_ns) AS tid, min(a.start_ns) AS l_start,
         arg_min(a.end_ns, a.start_ns) AS l_end
  FROM ck JOIN api_calls a ON a.file_id = fid AND a.rank = ck.rank AND a.correlation_id = ck.correlation_id
  GROUP BY ck.kernel_id
), lk AS (
  SELECT ck.*, l.tid, l.l_start, l.l_end FROM ck LEFT JOIN launch l USING (kernel_id)
), nr AS (
  SELECT * FROM _ingest_nsys_nccl_ranges(fid)
), launcher AS (  -- NCCL ranges that can hold a launch: an ungrouped operation, or an outermost ncclGroupEnd
  SELECT * FROM nr
  WHERE (collective IS NOT NULL AND depth_before = 0) OR (name = 'ncclGroupEnd' AND depth_before = 1)
), member AS (  -- grouped operations, each in comm_ops' convention (NCCL's size x communicator size)
  SELECT *,
    CASE collective WHEN 'reduce_scatter' THEN raw_bytes * nranks WHEN 'all_to_all' THEN raw_bytes * nranks
                    WHEN 'recv' THEN 0 ELSE raw_bytes END AS m_in,
    CASE collective WHEN 'all_gather' THEN raw_bytes * nranks WHEN 'all_to_all' THEN raw_bytes * nranks
                    WHEN 'send' THEN 0 ELSE raw_bytes END AS m_out,
    CASE WHEN collective IN ('all_gather', 'reduce_scatter', 'all_to_all') THEN raw_bytes * nranks
         ELSE raw_bytes END AS m_msg
  FROM nr WHERE collective IS NOT NULL AND depth_before >= 1
), grp AS (  -- members of each outermost group
  SELECT rank, tid, outer_group, count(*) AS n_ops, count(DISTINCT collective) AS n_coll,
         any_value(collective) AS coll1,
         bool_and(collective IN ('send', 'recv')) AS all_p2p, bool_or(collective = 'send') AS has_send,
         bool_or(collective = 'recv') AS has_recv, count(raw_bytes) AS n_sized,
         sum(raw_bytes) FILTER (WHERE collective = 'send') AS send_b,
         sum(raw_bytes) FILTER (WHERE collective = 'recv') AS recv_b,
         sum(m_in) AS m_in, sum(m_out) AS m_out, sum(m_msg) AS m_msg,
         count(DISTINCT peer) AS n_peer, any_value(peer) AS peer1, count(peer) AS n_peer_rows,
         count(DISTINCT comm_id) AS n_comm, any_value(comm_id) AS comm1, max(nranks) AS nranks
  FROM member
  GROUP BY rank, tid, outer_group
), hit AS (  -- innermost NCCL launcher range holding the launch
  SELECT lk.kernel_id, r.collective, r.raw_bytes, r.peer, r.comm_id, r.nranks, r.outer_group, r.tid AS r_tid
  FROM lk ASOF JOIN launcher r ON lk.rank = r.rank AND lk.tid = r.tid AND lk.l_start >= r.start_ns
  WHERE lk.l_end <= r.end_ns
), pt AS (  -- innermost PyTorch nccl:<op> range holding the launch
  SELECT lk.kernel_id, r.collective AS pt_coll, r.input_elems AS pt_elems
  FROM lk ASOF JOIN (SELECT * FROM _ingest_nsys_pytorch_ranges(fid) WHERE collective IS NOT NULL) r
    ON lk.rank = r.rank AND lk.tid = r.tid AND lk.l_start >= r.start_ns
  WHERE lk.l_end <= r.end_ns
), nccl_op AS (  -- what NCCL's ranges say: one operation, or the group launched by an outermost ncclGroupEnd
  SELECT lk.kernel_id, lk.rank, lk.name_coll, lk.name_dtype, lk.name_gs,
         CASE WHEN h.collective IS NOT NULL THEN h.collective
              WHEN g.n_ops IS NULL THEN NULL
              WHEN g.all_p2p THEN CASE WHEN g.has_send AND g.has_recv THEN 'send_recv'
                                       WHEN g.has_send THEN 'send' ELSE 'recv' END
              WHEN g.n_coll = 1 THEN g.coll1 END AS coll,
         CASE WHEN h.collective IS NOT NULL THEN 1 ELSE g.n_ops END AS n_ops,
         h.collective IS NULL AND g.n_ops IS NOT NULL AS grouped,
         CASE WHEN h.collective IS NOT NULL THEN h.raw_bytes END AS raw1,
         g.n_sized = g.n_ops AS all_sized, g.all_p2p, g.has_send, g.send_b, g.recv_b, g.m_in, g.m_out, g.m_msg,
         CASE WHEN h.collective IS NOT NULL THEN h.peer WHEN g.n_peer = 1 AND g.n_peer_rows = g.n_ops THEN g.peer1 END AS peer,
         CASE WHEN h.collective IS NOT NULL THEN h.comm_id WHEN g.n_comm = 1 THEN g.comm1 END AS comm_id,
         CASE WHEN h.collective IS NOT NULL THEN h.nranks WHEN g.n_comm = 1 THEN g.nranks END AS nranks
  FROM lk LEFT JOIN hit h USING (kernel_id)
  LEFT JOIN grp g ON h.collective IS NULL AND g.rank = lk.rank AND g.tid = h.r_tid AND g.outer_group = h.outer_group
), payload AS (  -- payload bytes in comm_ops' convention (NULL unless every member is sized)
  SELECT *,
    CASE WHEN NOT grouped THEN (CASE coll WHEN 'all_gather' THEN raw1 WHEN 'reduce_scatter' THEN raw1 * nranks
                                          WHEN 'all_to_all' THEN raw1 * nranks WHEN 'recv' THEN NULL ELSE raw1 END)
         WHEN all_sized AND all_p2p THEN send_b
         WHEN all_sized THEN m_in
         END AS p_in,
    CASE WHEN NOT grouped THEN (CASE coll WHEN 'all_gather' THEN raw1 * nranks WHEN 'reduce_scatter' THEN raw1
                                          WHEN 'all_to_all' THEN raw1 * nranks WHEN 'send' THEN NULL ELSE raw1 END)
         WHEN all_sized AND all_p2p THEN recv_b
         WHEN all_sized THEN m_out
         END AS p_out,
    CASE WHEN NOT grouped THEN (CASE WHEN coll IN ('all_gather', 'reduce_scatter', 'all_to_all') THEN raw1 * nranks
                                     ELSE raw1 END)
         WHEN all_sized AND all_p2p THEN (CASE WHEN has_send THEN send_b ELSE recv_b END)
         WHEN all_sized THEN m_msg
         END AS p_msg
  FROM nccl_op
), op AS (  -- the framework's range names the operation the user called: it wins
  SELECT p.*, pt.pt_coll, pt.pt_elems,
         coalesce(pt.pt_coll, p.coll, p.name_coll, 'unknown') AS collective,
         CASE WHEN pt.pt_coll IS NOT NULL THEN 'pytorch_nvtx' WHEN p.coll IS NOT NULL THEN 'nvtx'
              ELSE 'kernel_name' END AS collective_source
  FROM payload p LEFT JOIN pt USING (kernel_id)
), typed AS (  -- the kernel name's dtype token is trusted for reductions whose kernel agrees on the collective
  SELECT *,
    CASE WHEN collective IN ('all_reduce', 'reduce_scatter', 'reduce') AND name_coll = collective
         THEN name_dtype END AS dtype
  FROM op
), shaped AS (  -- PyTorch sizes: elements of the input tensors -> bytes per comm_ops' convention
  SELECT *, dtype_bytes(dtype) AS db,
    CASE WHEN collective = 'all_gather' THEN pt_elems * nranks ELSE pt_elems END AS s_elems,
    CASE WHEN collective <> 'recv' THEN pt_elems * dtype_bytes(dtype) END AS s_in,
    CASE WHEN collective IN ('all_reduce', 'broadcast', 'reduce', 'recv') THEN pt_elems * dtype_bytes(dtype)
         WHEN collective = 'all_gather' THEN pt_elems * dtype_bytes(dtype) * nranks
         WHEN collective = 'reduce_scatter' AND pt_elems % nranks = 0 THEN pt_elems * dtype_bytes(dtype) // nranks
         END AS s_out
  FROM typed
), sized AS (  -- the first route that gives the message size; a route giving only some fields comes last
  SELECT *,
    CASE WHEN s_msg IS NOT NULL THEN 'pytorch_nvtx'
         WHEN coalesce(p_msg, p_in, p_out) IS NOT NULL THEN 'nvtx_payload'
         WHEN coalesce(s_in, s_out) IS NOT NULL THEN 'pytorch_nvtx' END AS size_source
  FROM (SELECT *, CASE WHEN collective IN ('all_gather', 'recv') THEN s_out ELSE s_in END AS s_msg FROM shaped)
), out_rows AS (
  SELECT *,
    CASE size_source WHEN 'pytorch_nvtx' THEN s_in WHEN 'nvtx_payload' THEN p_in END AS in_bytes,
    CASE size_source WHEN 'pytorch_nvtx' THEN s_out WHEN 'nvtx_payload' THEN p_out END AS out_bytes,
    CASE size_source WHEN 'pytorch_nvtx' THEN s_msg WHEN 'nvtx_payload' THEN p_msg END AS msg_bytes
  FROM sized
)
SELECT kernel_id, fid AS file_id, rank, collective,
       coalesce(CASE WHEN db > 0 THEN msg_bytes // db END, s_elems) AS element_count,
       dtype, in_bytes, out_bytes, msg_bytes,
       coalesce(nranks, name_gs) AS group_size, comm_id AS pg_name, NULL::VARCHAR AS pg_desc, NULL::INTEGER[] AS pg_ranks,
       CASE WHEN collective IN ('send', 'recv', 'send_recv') THEN peer END AS peer_rank, NULL::BIGINT AS seq,
       comm_id, coalesce(n_ops, 1) AS n_ops, collective_source, size_source,
       CASE WHEN nranks IS NOT NULL THEN 'nvtx_payload' WHEN name_gs IS NOT NULL THEN 'kernel_name'
            WHEN comm_id IS NOT NULL THEN 'nvtx_payload' END AS group_source,
       CASE WHEN collective IN ('send', 'recv', 'send_recv') AND peer IS NOT NULL THEN 'nvtx_payload' END AS peer_source
FROM out_rows
ORDER BY kernel_id;
