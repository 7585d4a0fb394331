-- What a job database holds, for people: its tables and views with their columns and docs.

-- @macro schema_objects
-- The job database's own tables and views (the argument-free analyses included) with their columns, DuckDB types
-- and COMMENT ON docs: one row per object (column NULL) followed by one row per column. Internal objects (names
-- starting with '_') and DuckDB's own catalog are left out; a read-only session's own views of the analyses count
-- for databases written before the analyses were views.
-- @column object [key]: Table or view name.
-- @column kind: 'table' or 'view'.
-- @column column [key]: Column name; NULL on the object's own row.
-- @column data_type: DuckDB type of the column; NULL on the object's own row.
-- @column doc [key]: The object's or the column's documentation (COMMENT ON), as the database stores it.
CREATE OR REPLACE MACRO schema_objects() AS TABLE
WITH all_objs AS (
  SELECT database_name, schema_name, table_name AS object, 'table' AS kind, comment, temporary FROM duckdb_tables()
  WHERE NOT internal AND NOT starts_with(table_name, '_')
  UNION ALL
  SELECT database_name, schema_name, view_name, 'view', comment, temporary FROM duckdb_views()
  WHERE NOT internal AND NOT starts_with(view_name, '_')
), objs AS (  -- one object per name: the database's own, else the session's (read-only sessions add analyses)
  SELECT * FROM all_objs QUALIFY row_number() OVER (PARTITION BY object ORDER BY temporary, database_name) = 1
), rows AS (
  SELECT object, kind, NULL::VARCHAR AS "column", NULL::VARCHAR AS data_type, comment AS doc, -1 AS column_index
  FROM objs
  UNION ALL
  SELECT o.object, o.kind, c.column_name, c.data_type, c.comment, c.column_index
  FROM duckdb_columns() c
  JOIN objs o ON o.database_name = c.database_name AND o.schema_name = c.schema_name AND o.object = c.table_name
  WHERE NOT c.internal
)
SELECT object, kind, "column", data_type, doc FROM rows
ORDER BY kind, object, column_index;
