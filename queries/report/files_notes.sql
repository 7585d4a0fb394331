-- The report's view of the ingest: which files the job holds and what the importers noted about them.

-- @macro report_files
-- One row per ingested trace file, for the report's overview (sources, format versions, producers).
-- @column file_id [key]: Job-wide file id (files.file_id).
-- @column path [key]: Path of the file when it was ingested (untrusted trace text).
-- @column source [key]: 'nsys' or 'kineto'.
-- @column format_version: Format version of the file (files.format_version).
-- @column producer [key]: Producer / version markers of the file (files.producer), or NULL.
-- @column comm_library_version: Communication library and version the trace states, or NULL.
CREATE OR REPLACE MACRO report_files() AS TABLE
SELECT file_id, path, source, format_version, producer, comm_library_version
FROM files
ORDER BY file_id;

-- @macro report_notes
-- The importers' notes (ingest_notes) with the file they are about, warnings first; the report shows them when
-- the diagnostics analysis cannot run.
-- @column severity [key]: 'info' or 'warning'.
-- @column code [key]: Stable machine-readable code (ingest_notes.code).
-- @column rank [key]: Rank concerned, or NULL for the whole file.
-- @column file_path: Path of the file the note is about.
-- @column message [key]: One line for people, with what to do about it.
CREATE OR REPLACE MACRO report_notes() AS TABLE
SELECT n.severity, n.code, n.rank, f.path AS file_path, n.message
FROM ingest_notes n LEFT JOIN files f USING (file_id)
ORDER BY n.severity = 'warning' DESC, n.file_id, n.rank NULLS FIRST, n.code, n.message;
