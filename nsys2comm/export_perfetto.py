"""``nsys2comm export perfetto``: the whole job as one Chrome Trace Event Format file (ui.perfetto.dev,
chrome://tracing). A consumer: it lays out documented catalog objects and adds no figure of its own.

Layout (Trace Event Format, JSON object form, ``displayTimeUnit`` "ns"):

* one process per rank (``pid`` = rank, ``process_name`` "rank N (host)"), on the aligned job timeline:
  each rank's times minus its host's offset (``host_clock_offsets``, as ``_skew_ops``), relative to the earliest
  aligned kernel start (``otherData.origin_ns``); ``ts``/``dur`` in µs with three decimals (ns precision);
* a thread per stream ("stream S") holding its kernels as complete events (``ph`` 'X'), ``cat`` = kernel_class
  (a kernel that starts before an earlier kernel of its stream ended goes to "stream S, overlapping kernels");
  args: kernel_id, and for communication kernels collective, msg_bytes, pg_name, seq (comm_ops) and instance_key
  (_skew_ops);
* flow events (``ph`` 's' / 'f', ``bp`` 'e') link each matched instance (comm_transfer, transfer_source 'matched')
  from the earliest-arriving rank's kernel to every other rank's: ranks_seen − 1 arrows per instance;
* "exposed communication (stream S)": one slice per communication kernel with exposed time, named by its causes
  (exposed_comm_by_kernel), args exposed ns per cause; "arrival wait (stream S)": from a kernel's start, the time it
  waited for the last-arriving rank (_skew_kernel_waits.wait_ns, the slice clipped to the kernel). Their own thread
  per stream: kernels of different streams overlap in time, and slices on one thread must nest.

Events are written in chunks straight from DuckDB (each row is one event's JSON text), so the size of the job does
not bound memory; a name ending ``.gz`` is gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from .storage import settle

CHUNK_ROWS = 50_000
LANE_TID, EXPOSED_TID, WAIT_TID = 10_000, 100_000, 200_000  # added to a stream's thread number

# computed once per export (temporary tables: a read-only job allows them): off: each rank's offset against the
# reference host (as _skew_ops); origin: the job's first aligned kernel start; kt: each kernel's thread, its
# stream's, or the stream's overlap lane for a kernel that starts before an earlier kernel of its stream ended
# (programmatic dependent launch lets kernels of one stream overlap; slices on one thread must nest); t / d: aligned
# start relative to the origin, and duration (ns)
_SETUP = f"""
CREATE OR REPLACE TEMP TABLE _perfetto_off AS
  SELECT r.rank, r.host, coalesce(o.offset_ns, 0) AS off
  FROM ranks r LEFT JOIN host_clock_offsets() o ON coalesce(o.host, '') = coalesce(r.host, '');
CREATE OR REPLACE TEMP TABLE _perfetto_origin AS
  SELECT coalesce(min(k.start_ns - coalesce(o.off, 0)), 0) AS t0 FROM kernels k LEFT JOIN _perfetto_off o USING (rank);
CREATE OR REPLACE TEMP TABLE _perfetto_kt AS
WITH streams AS (
  SELECT rank, stream_id, row_number() OVER (PARTITION BY rank ORDER BY stream_id NULLS LAST)::BIGINT AS tid
  FROM (SELECT DISTINCT rank, stream_id FROM kernels)
)
SELECT k.kernel_id, k.rank, k.stream_id, k.kernel_class, k.name,
       k.start_ns - coalesce(off.off, 0) - origin.t0 AS t, k.end_ns - k.start_ns AS d,
       s.tid + {LANE_TID} * coalesce(k.start_ns < max(k.end_ns) OVER (
         PARTITION BY k.rank, k.stream_id ORDER BY k.start_ns, k.kernel_id
         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false)::INTEGER AS tid
FROM kernels k JOIN streams s ON s.rank = k.rank AND s.stream_id IS NOT DISTINCT FROM k.stream_id
LEFT JOIN _perfetto_off off ON off.rank = k.rank CROSS JOIN _perfetto_origin origin;
"""
_ALIGN = "WITH off AS (SELECT * FROM _perfetto_off), kt AS (SELECT * FROM _perfetto_kt)"


def _us(expr: str) -> str:
    """SQL: a non-negative ns expression as µs text with three decimals (exact, no float)."""
    return f"printf('%d.%03d', ({expr}) // 1000, ({expr}) % 1000)"


def _slice(name: str, cat: str, pid: str, tid: str, t: str, d: str, args: str) -> str:
    """SQL: one complete ('X') event's JSON text."""
    return (f"""'{{"ph":"X","name":' || to_json({name}) || ',"cat":' || to_json({cat}) || ',"pid":' || {pid}"""
            f"""|| ',"tid":' || {tid} || ',"ts":' || {_us(t)} || ',"dur":' || {_us(d)} || ',"args":' || {args}"""
            """ || '}'""")


def _metadata_sql() -> str:
    name = "'rank ' || o.rank || coalesce(' (' || o.host || ')', '')"
    thread = ("json_object('name', b.prefix || coalesce('stream ' || th.stream_id, 'stream ?') "
              "|| CASE WHEN th.tid > " + str(LANE_TID) + " THEN ', overlapping kernels' ELSE '' END || b.suffix)")
    meta = "'{{\"ph\":\"M\",\"name\":\"{}\",\"pid\":' || {} || ',\"tid\":' || {} || ',\"args\":' || {} || '}}'"
    return _ALIGN + f"""
, th AS (SELECT rank, stream_id, tid, bool_or(kernel_class = 'communication') AS comm FROM kt GROUP BY ALL)
SELECT ev FROM (
  SELECT o.rank, 0 AS tid, 0 AS k,
         {meta.format('process_name', 'o.rank', '0', f"json_object('name', {name})")} AS ev FROM off o
  UNION ALL
  SELECT o.rank, 0, 1, {meta.format('process_sort_index', 'o.rank', '0', "json_object('sort_index', o.rank)")}
  FROM off o
  UNION ALL
  SELECT th.rank, th.tid + b.base, 2, {meta.format('thread_name', 'th.rank', 'th.tid + b.base', thread)}
  FROM th, (VALUES (0, false, '', ''), ({EXPOSED_TID}, true, 'exposed communication (', ')'),
                   ({WAIT_TID}, true, 'arrival wait (', ')')) b(base, comm_only, prefix, suffix)
  WHERE th.comm OR NOT b.comm_only
)
ORDER BY rank, tid, k"""


def _kernels_sql() -> str:
    comm_args = ("json_object('kernel_id', kt.kernel_id, 'collective', o.collective, 'msg_bytes', o.msg_bytes, "
                 "'pg_name', coalesce(o.pg_name, o.comm_id), 'seq', o.seq, 'instance_key', so.instance_key)")
    args = (f"CASE WHEN kt.kernel_class = 'communication' THEN {comm_args} "
            "ELSE json_object('kernel_id', kt.kernel_id) END")
    return _ALIGN + f"""
SELECT {_slice('kt.name', 'kt.kernel_class', 'kt.rank', 'kt.tid', 'kt.t', 'kt.d', args)}
FROM kt LEFT JOIN comm_ops o ON o.kernel_id = kt.kernel_id LEFT JOIN _skew_ops so ON so.kernel_id = kt.kernel_id
ORDER BY kt.rank, kt.t, kt.kernel_id"""


def _flows_sql() -> str:
    """One 's' (earliest-arriving rank's kernel) and one 'f' (the other rank's kernel) per instance and other rank;
    per rank the instance's first kernel (a rank may run an instance as several kernels)."""
    return _ALIGN + f"""
, m AS (SELECT instance_key, collective FROM comm_transfer() WHERE transfer_source = 'matched'),
per_rank AS (
  SELECT so.instance_key, m.collective, so.rank, kt.tid, kt.t,
         row_number() OVER (PARTITION BY so.instance_key, so.rank ORDER BY kt.t, so.kernel_id) AS nth
  FROM _skew_ops so JOIN m USING (instance_key) JOIN kt USING (kernel_id)
), firsts AS (
  SELECT *, row_number() OVER (PARTITION BY instance_key ORDER BY t, rank) AS arrival FROM per_rank WHERE nth = 1
), pairs AS (
  SELECT src.collective, src.rank AS src_rank, src.tid AS src_tid, src.t AS src_t,
         dst.rank AS dst_rank, dst.tid AS dst_tid, dst.t AS dst_t,
         row_number() OVER (ORDER BY src.instance_key, dst.rank) AS id
  FROM firsts src JOIN firsts dst ON dst.instance_key = src.instance_key AND dst.arrival > 1
  WHERE src.arrival = 1
)
SELECT ev FROM (
  SELECT id, 0 AS k, '{{"ph":"s","id":' || id || ',"cat":"matched_instance","name":' || to_json(collective)
         || ',"pid":' || src_rank || ',"tid":' || src_tid || ',"ts":' || {_us('src_t')} || '}}' AS ev FROM pairs
  UNION ALL
  SELECT id, 1, '{{"ph":"f","bp":"e","id":' || id || ',"cat":"matched_instance","name":' || to_json(collective)
         || ',"pid":' || dst_rank || ',"tid":' || dst_tid || ',"ts":' || {_us('dst_t')} || '}}' FROM pairs
) ORDER BY id, k"""


def _exposure_sql() -> str:
    return _ALIGN + f"""
, c AS (
  SELECT kernel_id, string_agg(cause, ' + ' ORDER BY cause <> 'arrival_skew', cause) AS causes,
         json_group_object(cause, exposed_ns) AS by_cause, any_value(kernel_exposed_ns) AS kernel_exposed_ns
  FROM exposed_comm_by_kernel() WHERE exposed_ns > 0 GROUP BY kernel_id
), ev AS (
  SELECT kt.rank, kt.tid + {EXPOSED_TID} AS tid, kt.t, kt.d, kt.kernel_id, c.causes AS name,
         'exposed_communication' AS cat,
         json_object('kernel_id', kt.kernel_id, 'kernel_exposed_ns', c.kernel_exposed_ns,
                     'exposed_ns_by_cause', c.by_cause) AS a
  FROM c JOIN kt USING (kernel_id)
  UNION ALL
  SELECT kt.rank, kt.tid + {WAIT_TID}, kt.t, least(w.wait_ns, kt.d), kt.kernel_id,
         'waiting for rank ' || w.last_arriving_rank, 'arrival_wait',
         json_object('kernel_id', kt.kernel_id, 'wait_ns', w.wait_ns, 'last_arriving_rank', w.last_arriving_rank,
                     'instance_key', w.instance_key)
  FROM _skew_kernel_waits w JOIN kt USING (kernel_id)
  WHERE w.wait_ns > 0
)
SELECT {_slice('name', 'cat', 'rank', 'tid', 't', 'd', 'a')}
FROM ev ORDER BY rank, tid, t, kernel_id"""


def export_perfetto(con, out: str | Path) -> dict[str, int]:
    """Write the job in ``con`` to ``out`` (gzip when it ends ``.gz``); returns the events written per kind."""
    from . import __version__

    out = Path(out)
    con = settle(con)
    con.execute(_SETUP)
    origin = con.execute("SELECT t0 FROM _perfetto_origin").fetchone()[0]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # a reader never sees half a file
    counts: dict[str, int] = {}
    try:
        with (gzip.open(tmp, "wt", compresslevel=6, encoding="utf-8") if out.name.endswith(".gz")
              else open(tmp, "w", encoding="utf-8")) as f:
            f.write('{"displayTimeUnit":"ns","otherData":' + json.dumps(
                {"producer": f"nsys2comm {__version__}", "origin_ns": origin,
                 "timeline": "ranks aligned on the reference host's clock (host_clock_offsets); ts relative to "
                             "origin_ns, the earliest aligned kernel start"}) + ',"traceEvents":[')
            first = True
            for kind, sql in (("metadata", _metadata_sql()), ("kernels", _kernels_sql()), ("flows", _flows_sql()),
                              ("exposure", _exposure_sql())):
                res = con.execute(sql)
                n = 0
                while rows := res.fetchmany(CHUNK_ROWS):
                    f.write(("\n" if first else ",\n") + ",\n".join(r[0] for r in rows))
                    first, n = False, n + len(rows)
                settle(con)
                counts[kind] = n
            f.write("\n]}\n")
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        settle(con).execute("DROP TABLE IF EXISTS _perfetto_kt; DROP TABLE IF EXISTS _perfetto_origin; "
                            "DROP TABLE IF EXISTS _perfetto_off")
    return counts
