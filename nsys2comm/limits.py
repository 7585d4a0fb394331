"""Limits that stop hostile or broken Kineto traces (README "Limits"): one definition, read by the importer
(``ingest.kineto_stream.Limits``) and by the CLI's option defaults, without importing the ingest package.

Real Kineto traces expand 13-17x when decompressed; a gzip bomb expands 1000x. The ratio is checked against the
compressed bytes read so far, so a bomb is refused after GZIP_FLOOR_BYTES, not at its end.
"""

GZIP_RATIO = 100
GZIP_FLOOR_BYTES = 64 << 20
GZIP_CEILING_BYTES = 64 << 30
MAX_EVENT_BYTES = 64 << 20
