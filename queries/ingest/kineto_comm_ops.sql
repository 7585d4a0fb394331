-- How the Kineto importer derives comm_ops from one file's canonical rows (private; run by ingest.kineto.finalize).
--
-- Every communication kernel gets its collective, sizes, group and peer from candidate records, in this order
-- (kineto.md §1.8), each field from the first candidate that carries it:
--   1. the kernel's own args (PyTorch >= 2.2; staged as cpu_ranges kind '_kernel_args');
--   2. the record_param_comms op its 'External id' points at (when that id is not the correlation id);
--   3. the ranges enclosing the kernel's launch on the launching thread, innermost first (up to four levels:
--      nccl:*/gloo:* annotations, record_param_comms, c10d::* ops).
-- A candidate carries a size when it has 'In/Out msg nelems' (PyTorch >= 2.2) or, failing that, an 'Input Dims'
-- shape whose 'Input type' is a known dtype (record_shapes=True). What a shape means depends on who recorded it
-- (see _ingest_kineto_input_elems). The group size comes, first match wins, from:
--   1. the candidates' 'Group size', else the length of a complete 'Process Group Ranks' list (PyTorch < 2.7
--      truncates lists over 30 ranks to '[r0, ..., r28, ..., rN]', which counts as no list), else a functional
--      collective's group_size argument ('Concrete Inputs'); group_source = the candidate's source;
--   2. distributedInfo.pg_config (process_groups) for the group the operation names: 'pg_config';
--   3. the output/input element ratio of an enclosing op that records both tensors (c10d::_allgather_base_,
--      c10d::_reduce_scatter_base_, ..., see _ingest_kineto_io_group): 'io_ratio';
--   4. the template argument k_world_size of a SymmetricMemory one-/two-shot kernel (kernel_name_group_size):
--      'kernel_name';
--   5. only when the file shows no group other than the default one (no group named but '0', and no size found
--      above other than the world size), the world size: 'assumed_world_size', an assumption, never a recorded
--      value. Otherwise NULL.
-- Sizes follow comm_ops' nccl-tests convention; an all_gather size from a shape is its input times the group size.

-- @macro _ingest_kineto_tensor_elems
-- Per argument of an 'Input Dims'/'Input type' pair: the tensor's element count when the argument is a tensor of
-- a known dtype with a fully known shape (a 0-d tensor counts 1), else NULL.
-- @param dims: 'Input Dims' as BIGINT[][].
-- @param types: 'Input type' as VARCHAR[].
CREATE OR REPLACE MACRO _ingest_kineto_tensor_elems(dims, types) AS
  list_transform(range(1, least(len(dims), len(types)) + 1),
    lambda i: CASE WHEN canonical_dtype((types::VARCHAR[])[i]) IS NOT NULL AND dims[i] IS NOT NULL
                        AND len(list_filter(dims[i], lambda d: d IS NULL OR d < 0)) = 0
                   THEN coalesce(list_aggregate(dims[i], 'product'), 1) END);

-- @macro _ingest_kineto_input_elems
-- Elements of the input tensor(s) that an 'Input Dims'/'Input type' pair records, or NULL when it records no
-- tensor with a known dtype. nccl:*/gloo:* ranges list the collective's input tensors (ProcessGroupNCCL's
-- record function takes `inputs`): their elements are summed. record_param_comms (PyTorch < 2.2) lists the
-- input tensor first. c10d::_allgather_base_, _reduce_scatter_base_ and alltoall_base_ take (output, input)
-- (c10d/Ops.cpp): the input is argument 2; other c10d ops take a TensorList first, which records no shape.
-- Functional collectives (_c10d_functional::*) and SymmetricMemory ops (symm_mem::*) take the input first.
-- @param name: Range name.
-- @param dims: 'Input Dims' as BIGINT[][] (NULL when absent or nested deeper).
-- @param types: 'Input type' as VARCHAR[].
CREATE OR REPLACE MACRO _ingest_kineto_input_elems(name, dims, types) AS
  CASE
    WHEN name LIKE 'nccl:%' OR name LIKE 'gloo:%' THEN list_aggregate(_ingest_kineto_tensor_elems(dims, types), 'sum')
    WHEN name IN ('c10d::_allgather_base_', 'c10d::_reduce_scatter_base_', 'c10d::alltoall_base_')
      THEN _ingest_kineto_tensor_elems(dims, types)[2]
    ELSE _ingest_kineto_tensor_elems(dims, types)[1] END;

-- @macro _ingest_kineto_io_group
-- Group size from the output/input element ratio of an op that records both tensors, where the schema fixes it:
-- all_gather output = input x group, reduce_scatter input = output x group. Argument positions, from the op
-- schemas (c10d/Ops.cpp, c10d/Functional.cpp, symm_mem/SymmetricMemory.cpp): c10d::_allgather_base_(output,
-- input, ...), c10d::_reduce_scatter_base_(output, input, ...), _c10d_functional::all_gather_into_tensor_out(input,
-- group_size, group_name, out), symm_mem::multimem_all_gather_out(input, group_name, out),
-- symm_mem::reduce_scatter_out(input, group_name, split_last_dim, output). NULL for other ops, unknown shapes, an
-- empty tensor or a ratio that is not a whole number.
-- @param name: Range name.
-- @param dims: 'Input Dims' as BIGINT[][].
-- @param types: 'Input type' as VARCHAR[].
CREATE OR REPLACE MACRO _ingest_kineto_io_group(name, dims, types) AS
  list_transform([CASE name WHEN 'c10d::_allgather_base_' THEN [1, 2] WHEN 'c10d::_reduce_scatter_base_' THEN [2, 1]
                            WHEN '_c10d_functional::all_gather_into_tensor_out' THEN [4, 1]
                            WHEN 'symm_mem::multimem_all_gather_out' THEN [3, 1]
                            WHEN 'symm_mem::reduce_scatter_out' THEN [1, 4] END],
    -- [bigger, smaller] argument positions; e = the tensors' element counts
    lambda pos: list_transform([_ingest_kineto_tensor_elems(dims, types)], lambda e:
      CASE WHEN pos IS NOT NULL AND e[pos[2]] > 0 AND e[pos[1]] % e[pos[2]] = 0
           THEN (e[pos[1]] // e[pos[2]])::INTEGER END)[1])[1];

-- @macro _ingest_kineto_arg_group
-- A functional collective's group_size argument, from 'Concrete Inputs' (scalar arguments as text, '' for the
-- others). Positions from the op schemas: _c10d_functional::all_gather_into_tensor[_out|_coalesced](input(s),
-- group_size, group_name) -> 2; _c10d_functional::reduce_scatter_tensor[_coalesced](input(s), reduce_op,
-- group_size, group_name) -> 3; the legacy c10d_functional::all_gather_into_tensor[_coalesced](shard, tag, ranks,
-- group_size) -> 4 and all_reduce[_coalesced]/reduce_scatter_tensor[_coalesced](input, reduceOp, tag, ranks,
-- group_size) -> 5. NULL otherwise or when not a positive integer.
-- @param name: Range name.
-- @param concrete: 'Concrete Inputs' as VARCHAR[].
CREATE OR REPLACE MACRO _ingest_kineto_arg_group(name, concrete) AS
  nullif(greatest(TRY_CAST(concrete[CASE
    WHEN name LIKE '\_c10d\_functional::all\_gather\_into\_tensor%' ESCAPE '\' THEN 2
    WHEN name LIKE '\_c10d\_functional::reduce\_scatter\_tensor%' ESCAPE '\' THEN 3
    WHEN name LIKE 'c10d\_functional::all\_gather\_into\_tensor%' ESCAPE '\' THEN 4
    WHEN name LIKE 'c10d\_functional::all\_reduce%' ESCAPE '\'
      OR name LIKE 'c10d\_functional::reduce\_scatter\_tensor%' ESCAPE '\' THEN 5 END] AS INTEGER), 0), 0);

-- @macro _ingest_kineto_input_dtype
-- Canonical dtype of the tensor(s) _ingest_kineto_input_elems counted: the first recorded tensor type for nccl:*/gloo:*
-- ranges, argument 2 for the c10d (output, input) ops, else argument 1. NULL when unknown.
-- @param name: Range name.
-- @param types: 'Input type' as VARCHAR[].
CREATE OR REPLACE MACRO _ingest_kineto_input_dtype(name, types) AS
  canonical_dtype(CASE
    WHEN name LIKE 'nccl:%' OR name LIKE 'gloo:%'
      THEN list_filter(types::VARCHAR[], lambda x: canonical_dtype(x) IS NOT NULL)[1]
    WHEN name IN ('c10d::_allgather_base_', 'c10d::_reduce_scatter_base_', 'c10d::alltoall_base_')
      THEN (types::VARCHAR[])[2]
    ELSE (types::VARCHAR[])[1] END);

-- @macro _ingest_kineto_comm_records
-- One file's communication records with their args in canonical units: staged kernel args
-- (kind '_kernel_args', tid = the kernel's index in the file) and the CPU ranges that may describe a collective.
-- @param fid: File id.
-- @column range_id: cpu_ranges.range_id.
-- @column kind: cpu_ranges.kind.
-- @column name: Range name.
-- @column pid: Process id.
-- @column tid: Thread id (kernel index in the file for staged kernel args).
-- @column start_ns: Start (ns).
-- @column end_ns: End (ns).
-- @column coll: Canonical collective from 'Collective name' or from the range name; NULL when neither names one.
-- @column is_wait: True for record_param_comms 'wait' records (not an operation).
-- @column in_n: 'In msg nelems' (element count; the importer renames the older 'In msg size').
-- @column out_n: 'Out msg nelems' (likewise).
-- @column nelems_dtype: Canonical 'dtype'.
-- @column shape_n: Input elements from 'Input Dims' (_ingest_kineto_input_elems).
-- @column shape_dtype: Their dtype (_ingest_kineto_input_dtype).
-- @column group_size: 'Group size', else a functional collective's group_size argument (_ingest_kineto_arg_group).
-- @column io_group: Group size from the op's output/input ratio (_ingest_kineto_io_group).
-- @column pg_name: 'Process Group Name' (the importer renames PyTorch 2.2's 'Process Group ID').
-- @column pg_desc: 'Process Group Description'.
-- @column pg_ranks: 'Process Group Ranks' (a JSON string or array); NULL when truncated ('...').
-- @column src_rank: 'Src Rank'.
-- @column dst_rank: 'Dst Rank'.
-- @column seq: 'Seq'.
-- @column comm_id: 'Comms Id'.
-- @column ext_id: 'External id'.
-- @column corr: 'correlation' (staged kernel args only).
CREATE OR REPLACE MACRO _ingest_kineto_comm_records(fid) AS TABLE
WITH r AS (  -- args parsed once per row into the fields read below (each a->>'key' on JSON text parses it again)
  SELECT range_id, kind, name, pid, tid, start_ns, end_ns,
         json_transform(args, '{"Collective name": "JSON", "In msg nelems": "JSON", "Out msg nelems": "JSON", "dtype": "JSON",
           "Input Dims": "JSON", "Input type": "JSON", "Group size": "JSON", "Process Group Name": "JSON",
           "Process Group Description": "JSON", "Process Group Ranks": "JSON", "Src Rank": "JSON",
           "Dst Rank": "JSON", "Seq": "JSON", "Comms Id": "JSON", "External id": "JSON", "correlation": "JSON",
           "Concrete Inputs": "JSON"}') AS a
  FROM cpu_ranges
  WHERE file_id = fid AND kind IN ('_kernel_args', 'cpu_op', 'user_annotation')
    AND (kind = '_kernel_args' OR name = 'record_param_comms' OR name LIKE 'nccl:%' OR name LIKE 'gloo:%'
         OR name LIKE 'c10d::%' OR name LIKE '_c10d_functional::%' OR name LIKE 'c10d_functional::%'
         OR name LIKE 'symm_mem::%')
)
SELECT range_id, kind, name, pid, tid, start_ns, end_ns,
  coalesce(canonical_collective(a."Collective name"->>'$'),
           CASE WHEN kind <> '_kernel_args' AND name <> 'record_param_comms' THEN canonical_collective(name) END) AS coll,
  coalesce(lower(a."Collective name"->>'$') = 'wait', false) AS is_wait,
  TRY_CAST(a."In msg nelems"->>'$' AS BIGINT) AS in_n,
  TRY_CAST(a."Out msg nelems"->>'$' AS BIGINT) AS out_n,
  canonical_dtype(a.dtype->>'$') AS nelems_dtype,
  _ingest_kineto_input_elems(name, TRY_CAST(a."Input Dims" AS BIGINT[][]), TRY_CAST(a."Input type" AS VARCHAR[]))
    AS shape_n,
  _ingest_kineto_input_dtype(name, TRY_CAST(a."Input type" AS VARCHAR[])) AS shape_dtype,
  coalesce(TRY_CAST(a."Group size"->>'$' AS INTEGER),
           _ingest_kineto_arg_group(name, TRY_CAST(a."Concrete Inputs" AS VARCHAR[]))) AS group_size,
  _ingest_kineto_io_group(name, TRY_CAST(a."Input Dims" AS BIGINT[][]), TRY_CAST(a."Input type" AS VARCHAR[]))
    AS io_group,
  a."Process Group Name"->>'$' AS pg_name,
  a."Process Group Description"->>'$' AS pg_desc,
  list_transform([CASE WHEN json_type(a."Process Group Ranks") = 'VARCHAR'
                        THEN TRY_CAST(a."Process Group Ranks"->>'$' AS INTEGER[])
                        ELSE TRY_CAST(a."Process Group Ranks" AS INTEGER[]) END],
    -- '[0, 1, ..., 127]' casts to [0, 1, NULL, 127]: a truncated list is no list
    lambda l: CASE WHEN len(l) > 0 AND list_count(l) = len(l) THEN l END)[1] AS pg_ranks,
  TRY_CAST(a."Src Rank"->>'$' AS INTEGER) AS src_rank,
  TRY_CAST(a."Dst Rank"->>'$' AS INTEGER) AS dst_rank,
  TRY_CAST(a.Seq->>'$' AS BIGINT) AS seq,
  a."Comms Id"->>'$' AS comm_id,
  TRY_CAST(a."External id"->>'$' AS BIGINT) AS ext_id,
  TRY_CAST(a.correlation->>'$' AS BIGINT) AS corr
FROM r;

-- @macro _ingest_kineto_launch_chain
-- For each communication kernel of one file: its launch (correlation -> runtime/driver call) and the ranges that
-- enclose the launch on the launching thread, innermost first. Nesting is found with one sweep per thread
-- (depth = open ranges at each start; a probe's innermost enclosing range is the latest-started range one level
-- up) and ASOF joins, never a range join. Only communication records count as ranges.
-- @param fid: File id.
-- @param records: Name of the table holding the file's _ingest_kineto_comm_records rows (finalize stages them once
-- for the resolution and its notes: parsing every record's args took most of a file's finalize).
-- @column kernel_id: Communication kernel.
-- @column e1: Innermost enclosing range (range_id), or NULL.
-- @column e2: Its parent, or NULL.
-- @column e3: The next level up, or NULL.
-- @column e4: The next level up, or NULL.
CREATE OR REPLACE MACRO _ingest_kineto_launch_chain(fid, records) AS TABLE
WITH ck AS (
  SELECT kernel_id, correlation_id FROM kernels WHERE file_id = fid AND kernel_class = 'communication'
), launch AS (  -- the first runtime/driver call of each correlation (a graph replay launches many kernels)
  SELECT correlation_id, arg_min(pid, start_ns) AS pid, arg_min(tid, start_ns) AS tid, min(start_ns) AS start_ns,
         arg_min(end_ns, start_ns) AS end_ns
  FROM api_calls WHERE file_id = fid AND correlation_id IN (SELECT correlation_id FROM ck) GROUP BY correlation_id
), rng AS (
  SELECT range_id, pid, tid, start_ns, end_ns FROM query_table(records)
  WHERE kind <> '_kernel_args' AND NOT is_wait AND pid IS NOT NULL AND tid IS NOT NULL
), ev AS (  -- at one instant: ranges ending, then ranges starting (outer first), then launches
  SELECT pid, tid, start_ns AS t, 1 AS cls, start_ns - end_ns AS tie, range_id AS id, 1 AS delta, false AS probe FROM rng
  UNION ALL
  SELECT pid, tid, end_ns, CASE WHEN end_ns > start_ns THEN 0 ELSE 3 END, 0, range_id, -1, false FROM rng
  UNION ALL
  SELECT pid, tid, start_ns, 2, 0, correlation_id, 0, true FROM launch WHERE pid IS NOT NULL AND tid IS NOT NULL
), swept AS (
  SELECT *, row_number() OVER w AS pos, sum(delta) OVER (w ROWS UNBOUNDED PRECEDING) AS open_n
  FROM ev WINDOW w AS (PARTITION BY pid, tid ORDER BY t, cls, tie, id)
), starts AS (
  SELECT pid, tid, pos, open_n - 1 AS depth, id AS range_id FROM swept WHERE delta = 1
), parent AS (
  SELECT c.range_id, p.range_id AS parent_id
  FROM starts c ASOF JOIN starts p ON c.pid = p.pid AND c.tid = p.tid AND c.depth - 1 = p.depth AND c.pos >= p.pos
), probe AS (
  SELECT p.id AS correlation_id, s.range_id AS e1
  FROM (SELECT * FROM swept WHERE probe AND open_n > 0) p
  ASOF JOIN starts s ON p.pid = s.pid AND p.tid = s.tid AND p.open_n - 1 = s.depth AND p.pos >= s.pos
)
SELECT ck.kernel_id, pr.e1, p2.parent_id AS e2, p3.parent_id AS e3, p4.parent_id AS e4
FROM ck
LEFT JOIN probe pr USING (correlation_id)
LEFT JOIN parent p2 ON p2.range_id = pr.e1
LEFT JOIN parent p3 ON p3.range_id = p2.parent_id
LEFT JOIN parent p4 ON p4.range_id = p3.parent_id;

-- @macro _ingest_kineto_comm_ops
-- comm_ops rows of one Kineto file (see this file's header for the resolution order).
-- @param fid: File id.
-- @param records: Name of the table holding the file's _ingest_kineto_comm_records rows.
-- @param chain: Name of the table holding the file's _ingest_kineto_launch_chain rows.
-- @column kernel_id: comm_ops.kernel_id.
-- @column file_id: comm_ops.file_id.
-- @column rank: comm_ops.rank.
-- @column collective: comm_ops.collective.
-- @column element_count: comm_ops.element_count.
-- @column dtype: comm_ops.dtype.
-- @column in_bytes: comm_ops.in_bytes.
-- @column out_bytes: comm_ops.out_bytes.
-- @column msg_bytes: comm_ops.msg_bytes.
-- @column group_size: comm_ops.group_size.
-- @column pg_name: comm_ops.pg_name.
-- @column pg_desc: comm_ops.pg_desc.
-- @column pg_ranks: comm_ops.pg_ranks.
-- @column peer_rank: comm_ops.peer_rank.
-- @column seq: comm_ops.seq.
-- @column comm_id: comm_ops.comm_id.
-- @column n_ops: comm_ops.n_ops.
-- @column collective_source: comm_ops.collective_source.
-- @column size_source: comm_ops.size_source.
-- @column group_source: comm_ops.group_source.
-- @column peer_source: comm_ops.peer_source.
CREATE OR REPLACE MACRO _ingest_kineto_comm_ops(fid, records, chain) AS TABLE
WITH rec AS (
  SELECT * FROM query_table(records)
), ck AS (
  SELECT kernel_id, rank, name, (kernel_id & ((1::BIGINT << 40) - 1)) AS kidx
  FROM kernels WHERE file_id = fid AND kernel_class = 'communication'
), xrpc AS (  -- record_param_comms by External id (the latest one when an id repeats)
  SELECT * FROM rec WHERE name = 'record_param_comms' AND NOT is_wait AND ext_id IS NOT NULL
  QUALIFY row_number() OVER (PARTITION BY ext_id ORDER BY start_ns DESC, range_id DESC) = 1
), cand AS (  -- candidate records per kernel, ord = priority (1 first)
  SELECT ck.kernel_id, 1 AS ord, 'kernel_args' AS src, ka.*
  FROM ck JOIN (SELECT * FROM rec WHERE kind = '_kernel_args') ka ON ka.tid = ck.kidx
  UNION ALL
  SELECT ck.kernel_id, 2, 'record_param_comms', x.*
  FROM ck JOIN (SELECT * FROM rec WHERE kind = '_kernel_args') ka ON ka.tid = ck.kidx
  JOIN xrpc x ON x.ext_id = ka.ext_id AND ka.ext_id IS DISTINCT FROM ka.corr
  UNION ALL
  SELECT c.kernel_id, 2 + lvl, CASE WHEN r.name = 'record_param_comms' THEN 'record_param_comms' ELSE 'launch_annotation' END, r.*
  FROM (SELECT kernel_id, unnest([e1, e2, e3, e4]) AS range_id, unnest([1, 2, 3, 4]) AS lvl
        FROM query_table(chain)) c
  JOIN rec r USING (range_id)
), sized AS (
  SELECT *, CASE WHEN (in_n IS NOT NULL OR out_n IS NOT NULL) AND nelems_dtype IS NOT NULL THEN 'nelems'
                 WHEN shape_n IS NOT NULL AND shape_dtype IS NOT NULL THEN 'shape' END AS size_kind
  FROM cand
), pick AS (  -- first candidate carrying each field
  SELECT kernel_id,
    arg_min(coll, ord) FILTER (WHERE coll IS NOT NULL) AS coll,
    arg_min(src, ord) FILTER (WHERE coll IS NOT NULL) AS coll_src,
    arg_min(size_kind, ord) FILTER (WHERE size_kind IS NOT NULL) AS size_kind,
    arg_min(src, ord) FILTER (WHERE size_kind IS NOT NULL) AS size_src,
    arg_min(CASE size_kind WHEN 'nelems' THEN nelems_dtype ELSE shape_dtype END, ord) FILTER (WHERE size_kind IS NOT NULL) AS dtype,
    arg_min(in_n, ord) FILTER (WHERE size_kind = 'nelems') AS in_n0,
    arg_min(out_n, ord) FILTER (WHERE size_kind = 'nelems') AS out_n0,
    arg_min(shape_n, ord) FILTER (WHERE size_kind IS NOT NULL) AS shape_n0,
    arg_min(src, ord) FILTER (WHERE group_size IS NOT NULL OR pg_ranks IS NOT NULL) AS gsrc,
    arg_min(coalesce(group_size, len(pg_ranks)), ord) FILTER (WHERE group_size IS NOT NULL OR pg_ranks IS NOT NULL) AS gs0,
    arg_min(io_group, ord) FILTER (WHERE io_group IS NOT NULL) AS gs_io,
    arg_min(pg_name, ord) FILTER (WHERE pg_name IS NOT NULL) AS pg_name,
    arg_min(pg_desc, ord) FILTER (WHERE pg_desc IS NOT NULL) AS pg_desc,
    arg_min(pg_ranks, ord) FILTER (WHERE pg_ranks IS NOT NULL) AS pgr0,
    arg_min(src, ord) FILTER (WHERE src_rank IS NOT NULL OR dst_rank IS NOT NULL) AS psrc,
    arg_min(src_rank, ord) FILTER (WHERE src_rank IS NOT NULL OR dst_rank IS NOT NULL) AS src_rank,
    arg_min(dst_rank, ord) FILTER (WHERE src_rank IS NOT NULL OR dst_rank IS NOT NULL) AS dst_rank,
    arg_min(seq, ord) FILTER (WHERE seq IS NOT NULL) AS seq,
    arg_min(comm_id, ord) FILTER (WHERE comm_id IS NOT NULL) AS comm_id
  FROM sized GROUP BY kernel_id
), nk AS (  -- what the kernel's name says about its group (SymmetricMemory one-/two-shot kernels)
  SELECT kernel_id, kernel_name_group_size(name) AS gs_name FROM kernels WHERE file_id = fid AND kernel_class = 'communication'
), pg AS (
  SELECT pg_name, any_value(group_size) AS group_size, any_value(pg_desc) AS pg_desc, any_value(pg_ranks) AS pg_ranks
  FROM process_groups WHERE file_id = fid GROUP BY pg_name
), w AS (
  SELECT (SELECT world_size FROM ranks WHERE file_id = fid LIMIT 1) AS world_size,
         (SELECT group_size FROM process_groups WHERE file_id = fid AND pg_name = '0' LIMIT 1) AS default_size
), job AS (  -- does the file show any group but the default one (by name, or by a size other than the world's)?
  SELECT w.*,
         (SELECT count(*) FROM (SELECT pg_name FROM pick WHERE pg_name IS NOT NULL AND pg_name <> '0'
                                UNION ALL SELECT pg_name FROM process_groups WHERE file_id = fid AND pg_name <> '0'
                                UNION ALL SELECT 'size' FROM pick p LEFT JOIN nk USING (kernel_id)
                                  WHERE coalesce(p.gs0, p.gs_io, nk.gs_name) <> coalesce(w.default_size, w.world_size)))
           = 0 AS only_default
  FROM w
), b AS (
  SELECT ck.kernel_id, ck.rank, p.*,
    coalesce(p.coll, kernel_name_collective(ck.name), 'unknown') AS collective,
    CASE WHEN p.coll IS NOT NULL THEN p.coll_src ELSE 'kernel_name' END AS collective_source,
    coalesce(p.gs0, pg.group_size, p.gs_io, nk.gs_name,
             CASE WHEN job.only_default AND coalesce(p.pg_name, '0') = '0'
                  THEN coalesce(job.default_size, job.world_size) END) AS group_size,
    CASE WHEN p.gs0 IS NOT NULL THEN p.gsrc WHEN pg.group_size IS NOT NULL THEN 'pg_config'
         WHEN p.gs_io IS NOT NULL THEN 'io_ratio' WHEN nk.gs_name IS NOT NULL THEN 'kernel_name'
         WHEN job.only_default AND coalesce(p.pg_name, '0') = '0' AND coalesce(job.default_size, job.world_size) IS NOT NULL
           THEN 'assumed_world_size' END AS group_source,
    coalesce(p.pg_desc, pg.pg_desc) AS pg_desc2,
    coalesce(p.pgr0, pg.pg_ranks) AS pg_ranks,
    dtype_bytes(p.dtype) AS db
  FROM ck LEFT JOIN pick p USING (kernel_id) LEFT JOIN nk USING (kernel_id) LEFT JOIN pg ON pg.pg_name = p.pg_name
  CROSS JOIN job
), z AS (  -- bytes per collective: a shape is the op's input tensor(s)
  SELECT *,
    CASE WHEN size_kind = 'nelems' THEN in_n0 * db
         WHEN size_kind = 'shape' AND collective <> 'recv' THEN shape_n0 * db END AS in_b,
    CASE WHEN size_kind = 'nelems' THEN out_n0 * db
         WHEN size_kind = 'shape' THEN (CASE
           WHEN collective IN ('all_reduce', 'broadcast', 'reduce', 'recv') THEN shape_n0 * db
           WHEN collective = 'all_gather' THEN shape_n0 * db * group_size
           WHEN collective = 'reduce_scatter' AND shape_n0 % group_size = 0 THEN shape_n0 * db // group_size END)
         END AS out_b
  FROM b
), p AS (  -- point-to-point: a send has no output buffer, a recv no input buffer (as NCCL's payloads say)
  SELECT *,
    CASE WHEN collective = 'recv' THEN NULL ELSE in_b END AS in_bytes,
    CASE WHEN collective = 'send' THEN NULL ELSE out_b END AS out_bytes
  FROM z
), m AS (
  SELECT *,
    CASE WHEN collective IN ('all_gather', 'recv') THEN out_bytes
         WHEN collective = 'unknown' THEN coalesce(in_bytes, out_bytes)
         ELSE in_bytes END AS msg_bytes,
    CASE WHEN collective = 'recv' THEN src_rank WHEN collective = 'send' THEN dst_rank END AS peer0
  FROM p
)
SELECT kernel_id, fid AS file_id, rank, collective,
  CASE WHEN db > 0 THEN msg_bytes // db END AS element_count,
  dtype, in_bytes, out_bytes, msg_bytes, group_size, pg_name, pg_desc2 AS pg_desc, pg_ranks,
  peer0 AS peer_rank, seq, comm_id, 1 AS n_ops, collective_source,
  CASE WHEN msg_bytes IS NOT NULL OR in_bytes IS NOT NULL OR out_bytes IS NOT NULL THEN
    (CASE WHEN size_kind = 'shape' THEN 'input_dims' ELSE size_src END) END AS size_source,
  group_source,
  CASE WHEN peer0 IS NOT NULL THEN psrc END AS peer_source
FROM m
ORDER BY kernel_id;
