-- @include overlap/overlap.sql
-- Communication summaries for the report, built on comm_kernels (overlap area).

-- @macro comm_overlap_by_collective
-- Per collective, over all ranks: summed communication-kernel time and how much of it ran beside computation,
-- beside GEMMs, or exposed (comm_kernels' per-kernel split, summed; kernels of one rank that run at the same
-- time count twice, unlike overlap_by_rank's unions).
-- @column collective [key]: Canonical collective ('unknown' when the kernel has no comm_ops row).
-- @column calls [key]: Communication kernels.
-- @column comm_ns [key]: Summed kernel duration (ns).
-- @column comm_overlapped_ns: Summed part of the kernels during which computation ran (ns).
-- @column gemm_overlapped_ns: Summed part during which a GEMM kernel ran (ns).
-- @column exposed_comm_ns [key]: Summed part with no computation running (ns).
-- @column exposed_pct [key]: 100 × exposed_comm_ns / comm_ns (NULL when comm_ns is 0).
CREATE OR REPLACE MACRO comm_overlap_by_collective() AS TABLE
SELECT collective, count(*) AS calls, CAST(sum(duration_ns) AS BIGINT) AS comm_ns,
       CAST(sum(overlapped_by_compute_ns) AS BIGINT) AS comm_overlapped_ns,
       CAST(sum(overlapped_by_gemm_ns) AS BIGINT) AS gemm_overlapped_ns,
       CAST(sum(exposed_ns) AS BIGINT) AS exposed_comm_ns,
       100.0 * sum(exposed_ns) / nullif(sum(duration_ns), 0) AS exposed_pct
FROM _overlap_comm_kernels
GROUP BY collective
ORDER BY comm_ns DESC, collective;

-- @view _report_comm_kernel_groups
-- @sweep cross_rank
-- top_comm_kernels' groups, all of them and unordered: every communication kernel grouped by base name and
-- collective. A view, so that ingest stores it with the other shared sweeps (nsys2comm.cache): looking up every
-- communication kernel's full name among all kernels was most of top_comm_kernels.
-- @column short_name: Kernel base name (untrusted trace text).
-- @column collective: Canonical collective.
-- @column calls: Kernel executions.
-- @column ranks: Ranks that ran it.
-- @column total_ns: Summed duration (ns).
-- @column mean_ns: Mean duration (ns, rounded).
-- @column max_ns: Longest execution (ns).
-- @column exposed_pct: 100 × summed exposed time / summed duration.
-- @column median_msg_bytes: Median message size (bytes, nccl-tests convention), when known.
-- @column n_names: Distinct full kernel names in the group.
-- @column top_name: Full name with the most total time in the group (ties: first in name order; untrusted trace text).
CREATE OR REPLACE VIEW _report_comm_kernel_groups AS
WITH x AS MATERIALIZED (  -- comm_kernels once for both aggregations
  SELECT c.short_name, c.collective, c.rank, c.duration_ns, c.exposed_ns, c.msg_bytes, k.name
  FROM _overlap_comm_kernels c JOIN kernels k USING (kernel_id)
), per_name AS (
  SELECT short_name, collective, name, sum(duration_ns) AS name_ns FROM x GROUP BY ALL
), names AS (
  SELECT short_name, collective, count(*) AS n_names, first(name ORDER BY name_ns DESC, name) AS top_name
  FROM per_name GROUP BY ALL
), g AS (
  SELECT short_name, collective, count(*) AS calls, count(DISTINCT rank) AS ranks, sum(duration_ns) AS total_ns,
         avg(duration_ns) AS mean_ns, max(duration_ns) AS max_ns, sum(exposed_ns) AS exposed_ns,
         median(msg_bytes) AS median_msg_bytes
  FROM x GROUP BY short_name, collective
)
SELECT short_name, collective, calls, ranks, CAST(total_ns AS BIGINT) AS total_ns,
       CAST(round(mean_ns) AS BIGINT) AS mean_ns, CAST(max_ns AS BIGINT) AS max_ns,
       100.0 * exposed_ns / nullif(total_ns, 0) AS exposed_pct,
       CAST(median_msg_bytes AS BIGINT) AS median_msg_bytes, n_names, top_name
FROM g JOIN names USING (short_name, collective);

-- @macro top_comm_kernels
-- The communication kernels with the most total time, grouped by kernel base name and collective, over all ranks.
-- The base name is kernels.short_name (rule kernel_short_name); top_name gives the full name of the group's
-- biggest variant and n_names how many full names (template instances) the group holds (kernel_name_variants
-- lists them).
-- @param n: Rows returned (default 25).
-- @column short_name [key]: Kernel base name (untrusted trace text).
-- @column collective [key]: Canonical collective.
-- @column calls [key]: Kernel executions.
-- @column ranks: Ranks that ran it.
-- @column total_ns [key]: Summed duration (ns).
-- @column mean_ns: Mean duration (ns, rounded).
-- @column max_ns: Longest execution (ns).
-- @column exposed_pct [key]: 100 × summed exposed time / summed duration.
-- @column median_msg_bytes: Median message size (bytes, nccl-tests convention), when known.
-- @column time_share_pct [key]: 100 × total time / all communication-kernel time.
-- @column n_names: Distinct full kernel names in the group.
-- @column top_name: Full name with the most total time in the group (ties: first in name order; untrusted trace text).
CREATE OR REPLACE MACRO top_comm_kernels(n := 25) AS TABLE
SELECT short_name, collective, calls, ranks, total_ns, mean_ns, max_ns, exposed_pct, median_msg_bytes,
       100.0 * total_ns / nullif(sum(total_ns) OVER (), 0) AS time_share_pct, n_names, top_name
FROM _report_comm_kernel_groups
ORDER BY total_ns DESC, short_name, collective
LIMIT n;
