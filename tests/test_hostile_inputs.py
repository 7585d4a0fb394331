"""Hostile Kineto inputs (issue 10 item 5): compressed bombs and huge events are refused early with a one-line
error, in bounded time and memory; the block splitter is linear in its input; the JSON array format works.

Bombs are built here as multi-member gzip files: one member compressed once and repeated, so a file of a few MB
on disk expands to GiBs without the test compressing GiBs."""

from __future__ import annotations

import collections
import gzip
import json
import re
import time
import tracemalloc
from pathlib import Path

import pytest
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm.errors import InputError
from nsys2comm.ingest import kineto, kineto_stream
from nsys2comm.ingest.base import ReadOptions
from nsys2comm.ingest.kineto_stream import Limits, iter_raw

MB = 1 << 20
HEAD = b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 1, ' \
       b'"ts": 1, "dur": 1, "args": {"correlation": 1}}, '
TAIL = b'{"ph": "i", "name": "end", "pid": 0, "tid": 1, "ts": 9, "s": "t"}], "baseTimeNanoseconds": 0}'


def _bomb(path: Path, head: bytes, filler: bytes, repeats: int, tail: bytes) -> Path:
    member = gzip.compress(filler, compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(head))
        for _ in range(repeats):
            f.write(member)
        f.write(gzip.compress(tail))
    return path


def _read_all(path: Path, **extra) -> dict[str, int]:
    rows = collections.Counter()
    for b in kineto.read(path, ReadOptions(extra={"kineto_workers": 0, **extra})):
        rows[b.table] += b.data.num_rows
    return rows


def _refused(path: Path, flag: str, **extra) -> tuple[str, float, int]:
    """Read the file; it must be refused with a one-line error naming it and the flag (one of ``flag.split("|")``).
    Returns (message, seconds, peak traced bytes)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(InputError) as ei:
            _read_all(path, **extra)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    line = ei.value.line()
    assert str(path) in line and any(f in line for f in flag.split("|")) and "\n" not in line
    return line, took, peak


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_whitespace_bomb_inside_trace_events(tmp_path):
    # 4 GiB of whitespace between two events, 4 MB on disk: refused at the event limit, not after 4 GiB
    p = _bomb(tmp_path / "ws.json.gz", HEAD, b" " * (8 * MB), 512, TAIL)
    assert p.stat().st_size < 8 * MB
    line, took, peak = _refused(p, "--max-event-mb|--max-decompressed-gb")  # the default limits
    assert took < 30 and peak < 400 * MB, (took, peak)
    # the event limit alone (decompression allowed): memory bounded by the limit, not by the gap
    big = {"max_decompressed_bytes": 1 << 40}
    line, took, peak = _refused(p, "--max-event-mb", **big)
    assert "64 MB" in line and took < 30 and peak < 400 * MB, (took, peak)
    line, took, peak = _refused(p, "--max-event-mb", max_event_bytes=2 * MB, **big)
    assert "2 MB" in line and peak < 120 * MB, peak


def test_huge_single_name(tmp_path):
    head = b'{"traceEvents": [{"ph": "X", "cat": "kernel", "pid": 0, "tid": 1, "ts": 1, "dur": 1, "name": "'
    plain = _bomb(tmp_path / "name.json.gz", head, b"a" * (8 * MB), 128, b'"}]}')  # a 1 GiB name
    _, took, _ = _refused(plain, "--max-event-mb", max_event_bytes=4 * MB)
    assert took < 30
    # event separators inside the string: every unvalidated cut fails, the validated fallback must stop too
    tricky = _bomb(tmp_path / "name2.json.gz", head, b"x}, {" * (2 * MB), 128, b'"}]}')
    _, took, _ = _refused(tricky, "--max-event-mb", max_event_bytes=4 * MB)
    assert took < 60


def test_decompressed_size_limit(tmp_path):
    event = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 1, "ts": 1, "dur": 1}, '
    p = _bomb(tmp_path / "many.json.gz", b'{"traceEvents": [', event * 5000, 40, TAIL)
    expanded = len(event) * 5000 * 40
    line, took, _ = _refused(p, "--max-decompressed-gb", max_decompressed_bytes=expanded // 4)
    assert "decompressed" in line
    # under the limit it is read completely: every event becomes a kernel row
    rows = _read_all(p, max_decompressed_bytes=2 * expanded)
    assert rows["kernels"] == 5000 * 40


def test_default_limit_refuses_a_bomb_early(tmp_path):
    # 2 GiB from 2 MB, events every 8 MiB (under the event limit): refused by the default ratio rule soon after
    # GZIP_FLOOR_BYTES, long before its end
    gap = b" " * (8 * MB) + b", " + HEAD[HEAD.index(b"[") + 1:].rstrip(b", ")
    p = _bomb(tmp_path / "ratio.json.gz", HEAD.rstrip(b", "), gap, 256, b"]}")
    assert p.stat().st_size < 4 * MB
    line, took, peak = _refused(p, "--max-decompressed-gb")
    assert "compressed bytes read" in line
    assert took < 30 and peak < 400 * MB, (took, peak)


def test_default_decompression_rule():
    # the documented default: ratio × compressed size, never below the floor nor above the ceiling
    lim = Limits()
    assert lim.decompressed_cap(1000) == kineto_stream.GZIP_FLOOR_BYTES
    big = kineto_stream.GZIP_FLOOR_BYTES  # compressed size whose ratio bound lies between floor and ceiling
    assert lim.decompressed_cap(big // 10) == kineto_stream.GZIP_RATIO * (big // 10)
    assert lim.decompressed_cap(1 << 40) == kineto_stream.GZIP_CEILING_BYTES
    assert Limits(max_decompressed_bytes=5).decompressed_cap(1 << 40) == 5
    # real traces are far below the ratio
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "kineto"
    for f in sorted(shared.glob("*/*.json.gz"))[:3]:
        with gzip.open(f, "rb") as g:
            n = sum(len(b) for b in iter(lambda: g.read(1 << 22), b""))
        assert n < kineto_stream.GZIP_RATIO * f.stat().st_size / 3


def _scan_time(path: Path) -> float:
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        for _ in iter_raw(path, 1 * MB, Limits(max_event_bytes=1 << 40)):
            pass
        best = min(best, time.perf_counter() - t0)
    return best


def test_splitter_linear_on_a_big_gap(tmp_path):
    # a whitespace gap inside the event array read in 1 MB blocks: 4x the gap must cost about 4x, not 16x
    times = {}
    for n in (16, 64):
        p = tmp_path / f"gap{n}.json"
        with open(p, "wb") as f:
            f.write(HEAD.rstrip(b", ") + b"\n")
            for _ in range(n):
                f.write(b" " * MB)
            f.write(b",\n" + TAIL)
        times[n] = _scan_time(p)
    assert times[64] < 9 * times[16] + 0.2, times


def test_splitter_pieces_property(tmp_path):
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies
    cand = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")

    @hyp.settings(max_examples=examples(150), deadline=None)
    @hyp.given(st.text(alphabet=st.sampled_from(list("{},  \n\ta")), max_size=80), st.integers(1, 30),
               st.integers(1, 9))
    def check(body, block, read):
        data = body.encode()
        p = tmp_path / "p.json"
        p.write_bytes(b'{"traceEvents": [' + data)
        with pytest.MonkeyPatch.context() as m:  # reads smaller than pieces: a cut can lie in any block held
            m.setattr(kineto_stream, "READ_BYTES", read)
            pieces = list(iter_raw(p, block))
        raws = [x for k, x in pieces if k == "raw"]
        (tail,) = [x for k, x in pieces if k == "tail"]
        assert b"".join(raws) + tail == data
        for i, r in enumerate(raws):  # each piece ends at a boundary whose '{' starts the next piece
            nxt = (raws[i + 1:] + [tail])[0]
            assert cand.search(r[-200:] + nxt[:1]) and nxt[:1] == b"{"
            assert re.search(rb"\}[ \t\r\n]*,[ \t\r\n]*$", r)
        assert cand.search(tail) is None  # no boundary left uncut at the end

    check()


def _kernel_rows(path: Path, **kw) -> list:
    rows = []
    for b in kineto.read(path, ReadOptions(rank=0, extra={"kineto_workers": 0}), **kw):
        if b.table == "kernels":
            rows += [(r["start_ns"], r["end_ns"], r["name"]) for r in b.data.to_pylist()]
    return sorted(rows)


@pytest.mark.parametrize("closing", ["]", "", ",\n"])
@pytest.mark.parametrize("block", [7, 1 << 20])
def test_json_array_format(tmp_path, closing, block):
    # Trace Event Format's JSON array format: a bare list of events; the closing ']' is optional there
    obj = write_kineto(make_run(world_size=1, steps=1), tmp_path / "obj", "old", pretty=True)[0]
    events = json.loads(obj.read_text())["traceEvents"]
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps(events, indent=1)[:-1].rstrip() + closing)
    want = _kernel_rows(obj)
    assert want and _kernel_rows(arr, block=block) == want
    assert kineto.sniff(arr, arr.read_bytes()[:4096])


def test_json_array_format_bad(tmp_path):
    p = tmp_path / "nums.json"
    p.write_text("[1, 2, 3]")
    with pytest.raises(InputError, match="not a PyTorch profiler trace"):
        _read_all(p)
    p.write_text('[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 1, "ts": 1, "dur": 1}, {"ph": "X", "na')
    with pytest.raises(InputError, match="truncated"):
        _read_all(p)
