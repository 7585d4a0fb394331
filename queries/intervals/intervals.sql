-- Generic interval helpers. Inputs are passed by table (or CTE) name and read with query_table(), so the same
-- helpers work on canonical tables, on CTEs inside other macros and on inline VALUES in tests.
-- Every helper sorts once per group and sweeps (running max / prefix sums / ASOF lookups): O(n log n), never an
-- N x M range join. Intervals are half-open [start_ns, end_ns); intervals with end_ns <= start_ns are empty
-- (they are dropped: zero length, or negative after rounding).

-- @macro intervals_union
-- Union of intervals per group as disjoint islands, sorted by start. Overlapping or touching intervals
-- (next start <= running max of previous ends) merge into one island. Algorithm: sort by (start, end), keep the
-- running max of previous ends (window max, ROWS UNBOUNDED PRECEDING .. 1 PRECEDING); a row whose start exceeds
-- it opens an island; the island ends at the running max seen just before the next island opens.
-- @param tbl: Name of a table or CTE with columns grp, start_ns, end_ns (grp may be any type).
-- @column grp [key]: Group key, as given.
-- @column start_ns: Island start (ns).
-- @column end_ns: Island end (ns).
CREATE OR REPLACE MACRO intervals_union(tbl) AS TABLE
WITH o AS (
  SELECT grp, start_ns, end_ns,
         max(end_ns) OVER (PARTITION BY grp ORDER BY start_ns, end_ns
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max_end,
         max(end_ns) OVER (PARTITION BY grp) AS grp_max_end
  FROM query_table(tbl)
  WHERE end_ns > start_ns
), starts AS (
  SELECT grp, start_ns, prev_max_end, grp_max_end FROM o
  WHERE prev_max_end IS NULL OR start_ns > prev_max_end
)
SELECT grp, start_ns,
       coalesce(lead(prev_max_end) OVER (PARTITION BY grp ORDER BY start_ns), grp_max_end) AS end_ns
FROM starts
ORDER BY grp, start_ns;

-- @macro intervals_union_length
-- Total length of the union of intervals per group (ns).
-- @param tbl: Name of a table or CTE with columns grp, start_ns, end_ns.
-- @column grp [key]: Group key.
-- @column union_ns [key]: Length of the union (ns).
CREATE OR REPLACE MACRO intervals_union_length(tbl) AS TABLE
SELECT grp, CAST(sum(end_ns - start_ns) AS BIGINT) AS union_ns
FROM intervals_union(tbl)
GROUP BY grp
ORDER BY grp;

-- @macro intervals_covered_ns
-- For each probe interval, how much of it is covered by the union of the intervals of the same group.
-- Algorithm: union islands with a prefix sum of island lengths; covered(t) (union length before t) comes from an
-- ASOF lookup of the last island starting at or before t; covered = covered(end) - covered(start).
-- @param intervals: Name of a table or CTE with columns grp, start_ns, end_ns (the covering intervals).
-- @param probes: Name of a table or CTE with columns grp, probe_id, start_ns, end_ns.
-- @column grp [key]: Group key of the probe.
-- @column probe_id [key]: Probe id, as given.
-- @column start_ns: Probe start (ns).
-- @column end_ns: Probe end (ns).
-- @column covered_ns [key]: Length of the probe covered by the union of the group's intervals (ns); 0 for empty probes.
CREATE OR REPLACE MACRO intervals_covered_ns(intervals, probes) AS TABLE
WITH isl AS (
  SELECT grp, start_ns, end_ns,
         coalesce(sum(end_ns - start_ns) OVER (PARTITION BY grp ORDER BY start_ns
                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before_ns
  FROM intervals_union(intervals)
), p AS (
  SELECT grp, probe_id, start_ns, end_ns FROM query_table(probes)
), ps AS (
  SELECT p.*, CASE WHEN i.start_ns IS NULL THEN 0
                   ELSE i.before_ns + least(greatest(p.start_ns - i.start_ns, 0), i.end_ns - i.start_ns) END AS cov_s
  FROM p ASOF LEFT JOIN isl i ON p.grp = i.grp AND p.start_ns >= i.start_ns
), pe AS (
  SELECT ps.*, CASE WHEN i.start_ns IS NULL THEN 0
                    ELSE i.before_ns + least(greatest(ps.end_ns - i.start_ns, 0), i.end_ns - i.start_ns) END AS cov_e
  FROM ps ASOF LEFT JOIN isl i ON ps.grp = i.grp AND ps.end_ns >= i.start_ns
)
SELECT grp, probe_id, start_ns, end_ns,
       CAST(CASE WHEN end_ns > start_ns THEN greatest(cov_e - cov_s, 0) ELSE 0 END AS BIGINT) AS covered_ns
FROM pe
ORDER BY grp, probe_id;

-- @macro intervals_intersect_length
-- Length of the intersection of two unions per group: |union(A) ∩ union(B)|. Computed as the coverage of A's
-- islands by B (A's islands are disjoint, so their covered lengths add up).
-- @param a_tbl: Name of a table or CTE with columns grp, start_ns, end_ns (set A).
-- @param b_tbl: Name of a table or CTE with columns grp, start_ns, end_ns (set B).
-- @column grp [key]: Group key (groups present in A).
-- @column a_ns: Length of union(A) (ns).
-- @column intersect_ns [key]: Length of union(A) ∩ union(B) (ns).
-- @column exposed_ns [key]: Length of union(A) minus union(B) (ns).
CREATE OR REPLACE MACRO intervals_intersect_length(a_tbl, b_tbl) AS TABLE
WITH _a_islands AS (
  SELECT grp, row_number() OVER (ORDER BY grp, start_ns) AS probe_id, start_ns, end_ns FROM intervals_union(a_tbl)
)
SELECT grp, CAST(sum(end_ns - start_ns) AS BIGINT) AS a_ns, CAST(sum(covered_ns) AS BIGINT) AS intersect_ns,
       CAST(sum(end_ns - start_ns) - sum(covered_ns) AS BIGINT) AS exposed_ns
FROM intervals_covered_ns(b_tbl, '_a_islands')
GROUP BY grp
ORDER BY grp;
