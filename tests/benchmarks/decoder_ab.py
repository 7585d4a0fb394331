"""A/B of Kineto decoders on the same byte ranges, interleaved in one process: the ratio, not MB/s, is the figure
(the machine is shared; absolute speeds drift by 2-3x within minutes, a ratio of adjacent runs much less).

    python -m tests.benchmarks.decoder_ab [--mb 40] [--reps 7] [--sources a,b] [--style kineto|compact]

Each source (bench_sources.sources()) is tiled to ``--mb`` and cut into the ranges the importer's workers get
(kineto._plan_ranges, RANGE_BYTES). Per range and repetition, in turn:

- ``today``: kineto._decode_process, the whole worker stage (msgspec decode, canonical rows, Arrow tables);
- ``msgspec_parse``: its msgspec decode alone (the floor of today's decoder: no rows built);
- ``duckdb_parse``: DuckDB's read_json on the same range (written to a file first, not timed), ``format='array'``,
  the event fields as text and ``args`` as raw JSON, counting the complete events: the parse alone;
- ``duckdb_kept``: the same, returning the events the importer keeps (their cat and phase) as an Arrow table:
  a lower bound on a DuckDB decoder (no canonical rows built from them yet);
- ``arrow_parse``: pyarrow's JSON reader (``pyarrow.json.read_json``, one thread), the other column builder within
  the design card's packages. It reads whitespace-separated objects, so the commas between events are removed
  first (timed: a decoder would have to do it), and only ``ph``, ``cat`` and ``name`` become columns (every other
  field is parsed and skipped): the parse alone, a lower bound on an Arrow decoder.

Printed: the median seconds per range of each, and the median over ranges and repetitions of today / each.
A decoder whose lower bound is not well below ``today`` cannot beat it on this machine.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

_COLUMNS = ("{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'JSON', tid: 'JSON', ts: 'VARCHAR', "
            "dur: 'VARCHAR', args: 'JSON'}")
_KEPT_CATS = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_runtime", "Runtime",
              "cuda_driver", "user_annotation", "gpu_user_annotation", "cpu_op", "Operator")


def _ranges(path: Path) -> list[tuple[int, int]]:
    from nsys2comm.ingest import kineto
    from nsys2comm.ingest.kineto_stream import Limits, array_start

    _, start = array_start(path)
    bounds = kineto._plan_ranges(path, start, kineto.RANGE_BYTES, Limits())
    return list(zip(bounds, bounds[1:], strict=False))


# Kineto's writer ends an event with "}," and the next one starts on a line of its own (compact tiles: "},{" or
# "},\n{"); a JSON string holds no raw newline, so a "}," before a line break is always between events
_EVENT_COMMA = re.compile(rb"\}\s*,\s*\n\s*\{|\},\{")


def _arrow_schema():
    import pyarrow as pa

    # the string fields only: a number field must be typed as a number (the reader refuses text), which would lose
    # ts's exact digits; the others are parsed and skipped, so this is the floor of any schema
    return pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string())])


def measure_source(path: Path, reps: int, tmp: Path) -> dict:
    import duckdb
    import pyarrow.json as pj

    from nsys2comm.ingest import kineto
    from nsys2comm.ingest.kineto_decode import decode_events

    con = duckdb.connect(config={"autoload_known_extensions": False, "autoinstall_known_extensions": False,
                                 "threads": 1})
    cats = ", ".join(f"'{c}'" for c in _KEPT_CATS)
    pieces = []
    for i, (lo, hi) in enumerate(_ranges(path)):
        with open(path, "rb") as f:
            f.seek(lo)
            data = b"[" + f.read(hi - lo) + kineto.CLOSE_PIECE
        file = tmp / f"range{i}.json"
        file.write_bytes(data)
        read = f"read_json('{file}', format='array', columns={_COLUMNS}, maximum_object_size=1073741824)"
        pieces.append((data, read))

    def today(data, _):
        kineto._decode_process(data, 0)

    def msgspec_parse(data, _):
        gc.disable()
        try:
            return len(decode_events(data))
        finally:
            gc.enable()

    def duckdb_parse(_, read):
        con.sql(f"SELECT count(*) FROM {read} WHERE ph = 'X'").fetchall()

    def duckdb_kept(_, read):
        con.sql(f"SELECT * FROM {read} WHERE ph = 'X' AND cat IN ({cats})").to_arrow_table()

    arrow_options = pj.ParseOptions(explicit_schema=_arrow_schema(), unexpected_field_behavior="ignore",
                                    newlines_in_values=True)

    def arrow_parse(data, _):
        objects = _EVENT_COMMA.sub(rb"}\n{", data[1:-1])  # without the array's brackets
        return pj.read_json(io.BytesIO(objects), read_options=pj.ReadOptions(use_threads=False,
                                                                                block_size=len(objects) + 1),
                            parse_options=arrow_options).num_rows

    fns = (today, msgspec_parse, duckdb_parse, duckdb_kept, arrow_parse)
    secs: dict[str, list[float]] = {f.__name__: [] for f in fns}
    events: dict[str, int] = {}  # events parsed, over the ranges of the first repetition: the parses agree
    for rep in range(reps):
        for data, read in pieces:
            for fn in fns:  # interleaved: all of them on one range, back to back
                t = time.perf_counter()
                n = fn(data, read)
                secs[fn.__name__].append(time.perf_counter() - t)
                if rep == 0 and n is not None:
                    events[fn.__name__] = events.get(fn.__name__, 0) + n
    con.close()
    out = {"ranges": len(pieces), "mb": round(sum(len(d) for d, _ in pieces) / 1e6, 1),
           "median_seconds_per_range": {k: round(statistics.median(v), 4) for k, v in secs.items()},
           "events_parsed": events}
    out["today_over"] = {k: round(statistics.median(a / b for a, b in zip(secs["today"], v, strict=True)), 2)
                         for k, v in secs.items() if k != "today"}
    return out


def main() -> None:
    from tests.benchmarks.bench import _speed_probe
    from tests.benchmarks.bench_sources import sources
    from tests.benchmarks.tile import tile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=40)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sources", help="comma-separated source names (default: every source)")
    ap.add_argument("--style", choices=("kineto", "compact"), default="kineto")
    a = ap.parse_args()
    names = a.sources.split(",") if a.sources else None
    print(f"machine speed probe: {_speed_probe()} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="nsys2comm-decoder-ab-") as d:
        tmp = Path(d)
        for name, src in sources():
            if names and name not in names:
                continue
            path = tmp / f"{name}.json"
            tile(src, path, a.mb, a.style)
            res = measure_source(path, a.reps, tmp)
            path.unlink()
            for f in tmp.glob("range*.json"):
                os.unlink(f)
            print(f"{name} ({a.style}, {res['mb']} MB in {res['ranges']} ranges, {a.reps} reps): "
                  f"median s/range {res['median_seconds_per_range']}; today / x: {res['today_over']}", flush=True)
    print(f"machine speed probe: {_speed_probe()} s")


if __name__ == "__main__":
    main()
