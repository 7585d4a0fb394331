-- Data for the report's run overview.

-- @macro run_overview
-- One row per rank: where its events came from, its GPUs and how much was traced, for the report's overview table.
-- @column rank [key]: Rank.
-- @column host [key]: Host name (ranks.host, else the file's host), when known.
-- @column file_path: Trace file the rank came from.
-- @column source: 'nsys' or 'kineto'.
-- @column format_version: Format version of the file (files.format_version).
-- @column producer: Producer / version markers of the file (files.producer).
-- @column gpus: Device names (and ids) used by the rank, comma-separated; 'model not recorded (N)' when the
-- trace does not name device N.
-- @column n_gpus [key]: Devices the rank used.
-- @column gpu_models: Distinct device names of the rank, comma-separated; NULL when the trace names none.
-- @column n_kernels [key]: Kernels the rank ran.
-- @column n_comm_kernels [key]: Communication kernels among them.
-- @column n_mem_ops: Memory copies and memsets.
-- @column first_ns: Earliest kernel or memory operation start on the job timeline (ns).
-- @column last_ns: Latest kernel or memory operation end on the job timeline (ns).
-- @column span_ns [key]: last_ns - first_ns (ns).
CREATE OR REPLACE MACRO run_overview() AS TABLE
WITH gpu AS (
  SELECT rank, string_agg(coalesce(name, 'model not recorded') || ' (' || CAST(device_id AS VARCHAR) || ')', ', '
                          ORDER BY device_id) AS gpus,
         count(DISTINCT device_id) AS n_gpus, string_agg(DISTINCT name, ', ' ORDER BY name) AS gpu_models
  FROM (SELECT DISTINCT rank, device_id, name FROM devices) GROUP BY rank
),
k AS (
  SELECT rank, count(*) AS n_kernels, count(*) FILTER (WHERE kernel_class = 'communication') AS n_comm_kernels,
         min(start_ns) AS first_ns, max(end_ns) AS last_ns
  FROM kernels GROUP BY rank
),
m AS (SELECT rank, count(*) AS n_mem_ops, min(start_ns) AS first_ns, max(end_ns) AS last_ns FROM mem_ops GROUP BY rank)
SELECT r.rank, coalesce(r.host, f.host) AS host, f.path AS file_path, f.source, f.format_version, f.producer,
       gpu.gpus, coalesce(gpu.n_gpus, 0) AS n_gpus, gpu.gpu_models, coalesce(k.n_kernels, 0) AS n_kernels, coalesce(k.n_comm_kernels, 0) AS n_comm_kernels,
       coalesce(m.n_mem_ops, 0) AS n_mem_ops,
       least(k.first_ns, m.first_ns) AS first_ns, greatest(k.last_ns, m.last_ns) AS last_ns,
       CAST(greatest(k.last_ns, m.last_ns) - least(k.first_ns, m.first_ns) AS BIGINT) AS span_ns
FROM ranks r LEFT JOIN files f USING (file_id) LEFT JOIN gpu USING (rank) LEFT JOIN k USING (rank)
     LEFT JOIN m USING (rank)
ORDER BY r.rank;
