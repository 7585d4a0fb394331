-- Canonical schema of an nsys2comm job database.
--
-- Every importer (Nsight Systems SQLite, Kineto JSON) fills these tables and nothing else; every
-- analysis reads only these tables. Times are integer nanoseconds on one job-wide timeline
-- (Unix epoch ns; how each source gets there is documented on `files.clock_rule`).
-- Ids (`kernel_id`, `memop_id`, `range_id`, `call_id`) are job-unique: `file_id << 40 | row index`, and
-- comm_ops holds at most one row per kernel_id. They are unique by construction and checked by the tests, not
-- declared as keys: DuckDB keeps a key's index in memory, unevictable, during the ingest transaction (≈ 80 MB and
-- ≈ 3 s per 10M rows, enough to run a 10M-kernel nsys export out of the writer's memory limit).

-- @table files
-- One row per ingested trace file. Re-ingesting a file with the same sha256 is a no-op.
-- @column file_id: Job-wide file id, 1, 2, ... in ingest order.
-- @column path: Absolute path of the file when it was ingested.
-- @column sha256: SHA-256 of the file's bytes (the identity used to skip re-ingests).
-- @column size_bytes: File size in bytes as stored (compressed size for .gz).
-- @column source: 'nsys' (Nsight Systems SQLite export) or 'kineto' (PyTorch profiler JSON).
-- @column format_version: nsys: export schema version (e.g. '3.25.0'); kineto: 'schemaVersion N'.
-- @column producer: nsys: product version (e.g. '2026.2.1.210'); kineto: PyTorch-era markers found (e.g. 'baseTimeNanoseconds, collective args on kernels').
-- @column host: Host name when the trace records it, else NULL.
-- @column clock_rule: How this file's timestamps were mapped onto the job timeline, in words.
-- @column clock_offset_ns: Nanoseconds added to the file's raw timestamps to reach the job timeline.
-- @column ingested_at: Wall-clock time of the ingest (UTC).
-- @column comm_library_version: Communication library and version the trace states (e.g. 'NCCL 2.17.1'), else NULL.
CREATE TABLE IF NOT EXISTS files (
  file_id INTEGER PRIMARY KEY,
  path VARCHAR NOT NULL,
  sha256 VARCHAR NOT NULL UNIQUE,
  size_bytes BIGINT NOT NULL,
  source VARCHAR NOT NULL,
  format_version VARCHAR,
  producer VARCHAR,
  host VARCHAR,
  clock_rule VARCHAR,
  clock_offset_ns BIGINT,
  ingested_at TIMESTAMP,
  comm_library_version VARCHAR
);
-- job databases written before the column existed
ALTER TABLE files ADD COLUMN IF NOT EXISTS comm_library_version VARCHAR;

-- @table ranks
-- One row per rank (one profiled training process) in the job. Ranks are distinct job-wide.
-- @column rank: Global rank (0-based).
-- @column file_id: File the rank's events came from.
-- @column pid: OS process id of the rank's process, when known.
-- @column host: Host name, when known.
-- @column world_size: World size the trace reports for this rank, else NULL.
-- @column rank_source: Where the rank number came from: 'distributedInfo', 'nccl_comm_init', 'file_name', 'cli', 'process_order'.
CREATE TABLE IF NOT EXISTS ranks (
  rank INTEGER PRIMARY KEY,
  file_id INTEGER NOT NULL,
  pid BIGINT,
  host VARCHAR,
  world_size INTEGER,
  rank_source VARCHAR NOT NULL
);

-- @table devices
-- GPUs used by each rank (devices that ran at least one kernel or memory operation).
-- @column file_id: File the device was seen in.
-- @column rank: Rank that used the device.
-- @column device_id: Device index as the trace reports it (CUDA device ordinal / Kineto GPU pid).
-- @column name: Device name (e.g. 'NVIDIA H100 80GB HBM3'), NULL when the trace does not list it.
-- @column sm_count: Number of streaming multiprocessors (compute units), when known.
-- @column total_memory_bytes: Device memory in bytes, when known.
CREATE TABLE IF NOT EXISTS devices (
  file_id INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  device_id INTEGER NOT NULL,
  name VARCHAR,
  sm_count INTEGER,
  total_memory_bytes BIGINT
);

-- @table kernels
-- One row per GPU kernel execution.
-- @column kernel_id: Job-unique kernel id.
-- @column file_id: Source file.
-- @column rank: Rank whose process launched the kernel.
-- @column device_id: Device the kernel ran on.
-- @column stream_id: CUDA/HIP stream id.
-- @column start_ns: Start on the job timeline (ns).
-- @column end_ns: End on the job timeline (ns); end_ns >= start_ns.
-- @column name: Full kernel name (demangled, with parameters when the source has them).
-- @column short_name: Base name: no return type, template arguments or parameter list.
-- @column correlation_id: CUDA correlation id linking the kernel to its launch in api_calls (unique per process).
-- @column grid_x: Grid size, x.
-- @column grid_y: Grid size, y.
-- @column grid_z: Grid size, z.
-- @column block_x: Block size, x.
-- @column block_y: Block size, y.
-- @column block_z: Block size, z.
-- @column graph_id: CUDA graph id when launched from a graph, else NULL.
-- @column kernel_class: 'communication', 'gemm', 'convolution', 'attention', 'memory' or 'compute' (rules: macro kernel_class in classify.sql).
CREATE TABLE IF NOT EXISTS kernels (
  kernel_id BIGINT NOT NULL,
  file_id INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  device_id INTEGER NOT NULL,
  stream_id BIGINT,
  start_ns BIGINT NOT NULL,
  end_ns BIGINT NOT NULL,
  name VARCHAR NOT NULL,
  short_name VARCHAR NOT NULL,
  correlation_id BIGINT,
  grid_x INTEGER,
  grid_y INTEGER,
  grid_z INTEGER,
  block_x INTEGER,
  block_y INTEGER,
  block_z INTEGER,
  graph_id BIGINT,
  kernel_class VARCHAR NOT NULL
);

-- @table mem_ops
-- One row per GPU memory copy or memset.
-- @column memop_id: Job-unique id.
-- @column file_id: Source file.
-- @column rank: Rank whose process issued it.
-- @column device_id: Device it ran on.
-- @column stream_id: Stream id.
-- @column start_ns: Start on the job timeline (ns).
-- @column end_ns: End on the job timeline (ns).
-- @column kind: 'memcpy' or 'memset'.
-- @column copy_kind: 'HtoD', 'DtoH', 'DtoD', 'HtoH', 'PtoP' or 'other' for memcpy; NULL for memset.
-- @column bytes: Bytes copied or set.
-- @column name: Event name as the source shows it (e.g. 'Memcpy DtoD (Device -> Device)').
-- @column correlation_id: Correlation id linking it to its API call.
CREATE TABLE IF NOT EXISTS mem_ops (
  memop_id BIGINT NOT NULL,
  file_id INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  device_id INTEGER NOT NULL,
  stream_id BIGINT,
  start_ns BIGINT NOT NULL,
  end_ns BIGINT NOT NULL,
  kind VARCHAR NOT NULL,
  copy_kind VARCHAR,
  bytes BIGINT,
  name VARCHAR NOT NULL,
  correlation_id BIGINT
);

-- @table cpu_ranges
-- CPU-side (and GPU-projected) named ranges: NVTX push/pop and start/end ranges, Kineto user annotations
-- (including ProfilerStep#N), GPU user annotations, the communication CPU ops (record_param_comms,
-- c10d::*, nccl:*) that the communication fallbacks need, matrix-multiply CPU ops, and Python frames.
-- @column range_id: Job-unique id.
-- @column file_id: Source file.
-- @column rank: Rank of the process.
-- @column pid: OS process id.
-- @column tid: OS thread id (NULL when the source has none).
-- @column start_ns: Start on the job timeline (ns).
-- @column end_ns: End on the job timeline (ns); NULL for an unfinished range.
-- @column name: Range name (NVTX message or event name).
-- @column kind: 'nvtx', 'user_annotation', 'gpu_user_annotation', 'cpu_op' or 'python_function' (Kineto with_stack
-- Python frames: name, thread and interval only, args NULL).
-- @column domain: NVTX domain name (e.g. 'NCCL'); NULL for the default domain and for Kineto.
-- @column device_id: Device for GPU-side ranges, else NULL.
-- @column args: Selected arguments as JSON (Kineto collective args under their current names: older spellings such as 'In msg size' or 'external id' are renamed; decoded NCCL payload fields), else NULL.
CREATE TABLE IF NOT EXISTS cpu_ranges (
  range_id BIGINT NOT NULL,
  file_id INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  pid BIGINT,
  tid BIGINT,
  start_ns BIGINT NOT NULL,
  end_ns BIGINT,
  name VARCHAR NOT NULL,
  kind VARCHAR NOT NULL,
  domain VARCHAR,
  device_id INTEGER,
  args JSON
);

-- @table api_calls
-- CUDA/HIP runtime and driver API calls that carry a correlation id (kernel launches, memcpy, sync, ...).
-- They link GPU work to the CPU thread and range that launched it.
-- @column call_id: Job-unique id.
-- @column file_id: Source file.
-- @column rank: Rank of the process.
-- @column pid: OS process id.
-- @column tid: OS thread id.
-- @column start_ns: Start on the job timeline (ns).
-- @column end_ns: End on the job timeline (ns).
-- @column name: API function name (e.g. 'cudaLaunchKernel', 'cuLaunchKernelEx').
-- @column correlation_id: Correlation id shared with the GPU activity it caused.
-- @column api: 'runtime' or 'driver'.
CREATE TABLE IF NOT EXISTS api_calls (
  call_id BIGINT NOT NULL,
  file_id INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  pid BIGINT,
  tid BIGINT,
  start_ns BIGINT NOT NULL,
  end_ns BIGINT NOT NULL,
  name VARCHAR NOT NULL,
  correlation_id BIGINT,
  api VARCHAR NOT NULL
);

-- @table comm_ops
-- One row per communication kernel (NCCL/RCCL or other communication kernel) with what is known about the
-- operation it ran. `msg_bytes` follows nccl-tests' size convention S: the full buffer for all_reduce,
-- broadcast, reduce; the gathered output for all_gather; the full input for reduce_scatter; the whole
-- per-rank send buffer for all_to_all; the bytes sent (send) or received (recv) for point-to-point.
-- @column kernel_id: The kernel (kernels.kernel_id).
-- @column file_id: Source file.
-- @column rank: Rank that ran the kernel.
-- @column collective: Canonical operation: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, gather, scatter, send, recv, send_recv, barrier, or 'unknown'.
-- @column element_count: Elements in msg_bytes (msg_bytes / dtype size) when known.
-- @column dtype: Canonical element type ('float32', 'bfloat16', 'float16', 'int64', ...) when known.
-- @column in_bytes: Bytes of this rank's input buffer (what it contributes or sends), when known.
-- @column out_bytes: Bytes of this rank's output buffer (what it receives), when known.
-- @column msg_bytes: Message size in nccl-tests' convention S (see table description), when known.
-- @column group_size: Number of ranks in the communicator / process group, when known.
-- @column pg_name: Process-group name ('0', '1', ...) or NCCL communicator id when no PG name exists.
-- @column pg_desc: Process-group description (e.g. 'default_pg'), when known.
-- @column pg_ranks: Global ranks of the process group, when known.
-- @column peer_rank: Peer of a point-to-point operation (destination for send, source for recv).
-- @column seq: Collective sequence number within its process group, when the trace records it.
-- @column comm_id: NCCL communicator id (hash) or Kineto 'Comms Id', when known.
-- @column n_ops: Number of API-level operations fused into this kernel (e.g. grouped send/recv), >= 1.
-- @column collective_source: Where `collective` came from: 'kernel_args', 'record_param_comms', 'launch_annotation' (an nccl:*/c10d::* range enclosing the launch), 'nvtx' (nsys: NCCL's NVTX API ranges), 'pytorch_nvtx' (nsys: a PyTorch emit_nvtx range 'nccl:<op>' enclosing the launch), 'kernel_name'.
-- @column size_source: Where the sizes came from: 'kernel_args', 'record_param_comms', 'input_dims', 'nvtx_payload', 'pytorch_nvtx' (nsys: emit_nvtx 'sizes' times the element size), or NULL (unknown).
-- @column group_source: Where group_size came from. Read from the trace: 'kernel_args', 'record_param_comms' ('Group size', or the length of a complete 'Process Group Ranks' list), 'launch_annotation' (a range enclosing the launch: its 'Group size', or a functional collective's group_size argument), 'pg_config' (distributedInfo, for the group the operation names), 'nvtx_payload'; derived from recorded values: 'io_ratio' (output/input element ratio of an enclosing c10d::_allgather_base_, c10d::_reduce_scatter_base_, all_gather_into_tensor_out or SymmetricMemory all_gather/reduce_scatter op), 'kernel_name' (the world-size template argument of a SymmetricMemory one-/two-shot all-reduce kernel); assumed: 'assumed_world_size' (none of the above, and the file shows no group but the default one: the world size was assumed, never a recorded value; consumers must say so beside any figure that uses it); NULL when unknown.
-- @column peer_source: Where peer_rank came from: 'kernel_args', 'record_param_comms', 'nvtx_payload', or NULL.
CREATE TABLE IF NOT EXISTS comm_ops (
  kernel_id BIGINT NOT NULL,
  file_id INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  collective VARCHAR NOT NULL,
  element_count BIGINT,
  dtype VARCHAR,
  in_bytes BIGINT,
  out_bytes BIGINT,
  msg_bytes BIGINT,
  group_size INTEGER,
  pg_name VARCHAR,
  pg_desc VARCHAR,
  pg_ranks INTEGER[],
  peer_rank INTEGER,
  seq BIGINT,
  comm_id VARCHAR,
  n_ops INTEGER NOT NULL,
  collective_source VARCHAR NOT NULL,
  size_source VARCHAR,
  group_source VARCHAR,
  peer_source VARCHAR
);

-- @table process_groups
-- Process groups a trace declares (Kineto distributedInfo.pg_config), one row per file and group. comm_ops takes
-- a group's size from here when the operation names its group but not the size.
-- @column file_id: File that declares the group.
-- @column rank: Rank of that file.
-- @column pg_name: Process-group name ('0' is the default group).
-- @column pg_desc: Description (e.g. 'default_pg'; older traces give a 'uid'), when known.
-- @column group_size: Number of ranks in the group, when known.
-- @column pg_ranks: Global ranks of the group, when listed.
-- @column backend: Backend configuration (e.g. 'cuda:nccl'), when known.
CREATE TABLE IF NOT EXISTS process_groups (
  file_id INTEGER NOT NULL,
  rank INTEGER,
  pg_name VARCHAR NOT NULL,
  pg_desc VARCHAR,
  group_size INTEGER,
  pg_ranks INTEGER[],
  backend VARCHAR
);

-- @table ingest_notes
-- What an importer noticed but could not fix: missing data and how to get it (shown in summaries and reports).
-- @column file_id: File the note is about.
-- @column rank: Rank concerned, or NULL for the whole file.
-- @column severity: 'info' or 'warning'.
-- @column code: Stable machine-readable code (e.g. 'no_msg_sizes', 'no_collective_args', 'orphan_kernels').
-- @column message: One line for people, with what to do about it.
CREATE TABLE IF NOT EXISTS ingest_notes (
  file_id INTEGER NOT NULL,
  rank INTEGER,
  severity VARCHAR NOT NULL,
  code VARCHAR NOT NULL,
  message VARCHAR NOT NULL
);
