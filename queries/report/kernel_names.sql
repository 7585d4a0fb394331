-- Kernel base names and the full names behind them, for the report and for users who ask.

-- @macro kernel_name_variants
-- Every full kernel name under its base name, with its class and time.
-- Base names are kernels.short_name (rule kernel_short_name); this lists the template instances a grouped row of
-- the report merges.
-- @param base: Only this base name (default NULL: all).
-- @column short_name [key]: Kernel base name (untrusted trace text).
-- @column kernel_class [key]: Class of the kernel (rule kernel_class).
-- @column name: Full kernel name as the trace wrote it (untrusted trace text).
-- @column calls [key]: Kernel executions, all ranks.
-- @column ranks: Ranks that ran it.
-- @column total_ns [key]: Summed duration (ns).
-- @column share_of_base_pct [key]: 100 × total_ns / the base name's total (NULL when that is 0).
CREATE OR REPLACE MACRO kernel_name_variants(base := NULL) AS TABLE
WITH v AS (
  SELECT short_name, kernel_class, name, count(*) AS calls, count(DISTINCT rank) AS ranks,
         CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns
  FROM kernels WHERE base IS NULL OR short_name = base
  GROUP BY ALL
)
SELECT short_name, kernel_class, name, calls, ranks, total_ns,
       100.0 * total_ns / nullif(sum(total_ns) OVER (PARTITION BY short_name), 0) AS share_of_base_pct
FROM v
ORDER BY sum(total_ns) OVER (PARTITION BY short_name) DESC, short_name, total_ns DESC, name;
