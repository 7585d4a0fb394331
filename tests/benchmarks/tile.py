"""Tile a real Kineto trace to a target size: the benchmark input that looks like a real trace, only longer.

    python -m tests.benchmarks.tile SRC OUT --mb 400 [--style kineto|compact]

The events are repeated back to back: copy k has its ts shifted by k x (span + 1 ms) and its correlation and
External id args offset by k x (largest id + 1), so every copy is a distinct, well-formed stretch of the same
workload (no correlation id is shared by two launches). The header and trailer are the source's. ``--style
kineto`` writes events the way Kineto's writer does (one key group per line, 2-space indent); ``compact`` writes
one event per line without spaces (more events per MB: the harder case for MB/s). ``with_epoch_fractions``
rewrites a tiled trace's integer ts the way early-2024 Kineto printed them; ``with_stream_pointers`` gives every CUDA
runtime call a stream as pointer text, as ROCm traces give every HIP launch.
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
from pathlib import Path

import orjson

_ID_KEYS = ("correlation", "External id", "external id")


_LOADED: dict[Path, dict] = {}  # the last source read: its tiles (kineto, compact, ...) parse it once


def _load(src: Path) -> dict:
    """A shallow copy of the parsed source (tiling replaces events, it never changes one)."""
    if src not in _LOADED:
        opener = gzip.open if src.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(src, "rb") as f:
            _LOADED.clear()
            _LOADED[src] = orjson.loads(f.read())
    return dict(_LOADED[src])


# The line groups of Kineto's writer (libkineto/src/output_json.cpp, ChromeTraceLogger): a complete event's
# ph/cat/name/pid/tid on one line, ts/dur on the next (handleActivity); a flow's ph/id/pid/tid/ts, then cat/name/bp
# (handleLink); metadata and instants on one line (handleDeviceInfo, addIterationMarker). Then the "args" block:
# ``"args": {`` on its own line, the values 6 spaces in, ``}`` 4 spaces in.
_LINES = {"X": (("ph", "cat", "name", "pid", "tid"), ("ts", "dur")),
          "s": (("ph", "id", "pid", "tid", "ts"), ("cat", "name", "bp")),
          "f": (("ph", "id", "pid", "tid", "ts"), ("cat", "name", "bp")),
          "t": (("ph", "id", "pid", "tid", "ts"), ("cat", "name", "bp"))}
_ARGS_PER_LINE = 3  # CUPTI kernels' metadata (CuptiActivity.cpp metadataJson) puts 1-3 keys on a line


def _num(v) -> bytes:
    """A ts or dur as Kineto prints it: ``{}.{:03}`` (µs with 3 digits of ns) for a fraction, an integer as is."""
    if type(v) is float and v == v and abs(v) < 1e15:
        return b"%.3f" % v
    return orjson.dumps(v)


def _pairs(e: dict, keys) -> bytes:
    return b", ".join(orjson.dumps(k) + b": " + (_num(e[k]) if k in ("ts", "dur") else orjson.dumps(e[k]))
                      for k in keys)


def _kineto_event(e: dict) -> bytes:
    """One event as Kineto's writer lays it out (see _LINES): 2-space indent for the braces, 4 for the key lines, the
    args 6 spaces in with "External id" on a line of its own and the others a few to a line."""
    lines = _LINES.get(e.get("ph"), ())
    placed = {k for line in lines for k in line}
    rest = [k for k in e if k != "args" and k not in placed]
    groups = [[k for k in line if k in e] for line in lines]
    if groups:
        groups[-1] += rest
    else:
        groups = [rest]
    out = b"  {\n" + b",\n".join(b"    " + _pairs(e, g) for g in groups if g)
    args = e.get("args")
    if isinstance(args, dict) and args:
        keys = list(args)
        first = [k for k in keys if k == "External id"]
        others = [k for k in keys if k != "External id"]
        arg_lines = [first] if first else []
        arg_lines += [others[i:i + _ARGS_PER_LINE] for i in range(0, len(others), _ARGS_PER_LINE)]
        out += b',\n    "args": {\n' + b",\n".join(b"      " + _pairs(args, g) for g in arg_lines) + b"\n    }"
    return out + b"\n  }"


def tile(src: Path, out: Path, mb: float, style: str = "kineto") -> int:
    """Write ``out`` of about ``mb`` MB from ``src``'s events; returns the number of copies."""
    return tile_counted(src, out, mb, style)[0]


def tile_counted(src: Path, out: Path, mb: float, style: str = "kineto", sample: int | None = None) -> tuple[int, int]:
    """:func:`tile`, returning (copies, events written): whole copies of the source's events (about ``sample`` of
    them, evenly spaced, where given: a small tile of a large source with every kind of event), so every row count
    of the tile is the copies times the count of one copy."""
    doc = _load(src)
    events = doc.pop("traceEvents")
    if sample:
        events = events[::max(1, len(events) // sample) | 1]  # odd: writers interleave kinds in even patterns
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - t0 + 1000
    span = math.ceil(span)  # integer ts stay integers (float durations made them 1682725901604911.0)
    max_id = max((v for e in events for k, v in (e.get("args") or {}).items() if k in _ID_KEYS and type(v) is int),
                 default=0) + 1
    max_flow = max((e["id"] for e in events if type(e.get("id")) is int), default=0) + 1
    enc = _kineto_event if style == "kineto" else orjson.dumps
    sep = b",\n"
    target = int(mb * 1_000_000)
    header = orjson.dumps(doc)[:-1] + (b", " if doc else b"") + b'"traceEvents": [\n'
    written, k = len(header), 0
    with open(out, "wb") as f:
        f.write(header)
        first = True
        while written < target or not k:  # one copy at least
            chunk = []
            for e in events:
                if k and isinstance(e.get("ts"), (int, float)):
                    e = dict(e, ts=e["ts"] + k * span)
                    args = e.get("args")
                    if isinstance(args, dict) and any(key in args for key in _ID_KEYS):
                        e["args"] = {key: (v + k * max_id if key in _ID_KEYS and type(v) is int else v)
                                     for key, v in args.items()}
                    if type(e.get("id")) is int:
                        e["id"] = e["id"] + k * max_flow
                chunk.append(enc(e))
            data = (b"" if first else sep) + sep.join(chunk)
            first = False
            f.write(data)
            written += len(data)
            k += 1
        f.write(b"\n]}\n")
    return k, k * len(events)


_INT_TS = re.compile(rb'("ts": ?)(\d{16,})(?=[,}\s])')


def with_epoch_fractions(src: Path, out: Path) -> int:
    """``src`` (a trace with integer epoch µs) with a 3-digit fraction on every ts, as Kineto printed them in early
    2024 (``1712195495519689.047``, kineto dfd563dd; float64 cannot hold them to the ns). Returns the number of
    ts rewritten; the fractions are deterministic."""
    n = 0

    def frac(m: re.Match) -> bytes:
        nonlocal n
        n += 1
        return m.group(1) + m.group(2) + b".%03d" % (n * 37 % 1000)

    with open(src, "rb") as f, open(out, "wb") as w:
        for line in f:
            w.write(_INT_TS.sub(frac, line))
    return n


_CBID = re.compile(rb'"cbid": ?(\d+),')


def with_stream_pointers(src: Path, out: Path) -> int:
    """``src`` with every CUDA runtime call's args in the shape of a HIP launch in a ROCm trace (kineto's roctracer
    writer: ``"cid": N, "stream": "0x7f3a5c0010d0"``, the stream as pointer text). Returns the number of calls
    rewritten (0 for a source without CUDA runtime calls)."""
    n = 0

    def hip(m: re.Match) -> bytes:
        nonlocal n
        n += 1
        return b'"cid": ' + m.group(1) + b', "stream": "0x7f3a5c%06x",' % (n % 4096 * 16)

    with open(src, "rb") as f, open(out, "wb") as w:
        for line in f:
            w.write(_CBID.sub(hip, line))
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--mb", type=float, default=400)
    ap.add_argument("--style", choices=("kineto", "compact"), default="kineto")
    a = ap.parse_args()
    k = tile(a.src, a.out, a.mb, a.style)
    print(f"{a.out}: {a.out.stat().st_size / 1e6:.1f} MB, {k} copies of {a.src.name}")


if __name__ == "__main__":
    main()
