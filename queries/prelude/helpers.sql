-- Small SQL helpers that analyses of several areas share.

-- @macro _prelude_most_common
-- The most frequent value of a histogram() map, ties broken by the smaller value; NULL for an empty or NULL map.
-- DuckDB's mode() keeps whichever tied value it met first, which can change with the order its threads deliver
-- rows: results built on it would not be deterministic.
-- @param hist: histogram(x) of the values (NULLs are not counted).
CREATE OR REPLACE MACRO _prelude_most_common(hist) AS
  (list_sort(list_transform(map_entries(hist), lambda e: {'n': -CAST(e.value AS BIGINT), 'k': e.key}))[1]).k;
