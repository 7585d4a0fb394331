"""Values the fast decoder cannot take as they are.

Epoch timestamps with a fraction (Kineto of early 2024 prints ``us.nnn`` since the Unix epoch): float64 cannot
hold them to the ns, so their digits are read. A block whose first ts is of that kind is decoded with its ts kept as
digits at once (decode_events_exact); a block where one turns up later is decoded again that way; the tolerant
decoder (odd value types) reads the same digits as Decimals. All three give the same ns. Args whose values have odd
types are converted event by event."""

from __future__ import annotations

import json
from decimal import Decimal

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsys2comm.ingest import kineto, kineto_rows
from nsys2comm.ingest.kineto_decode import (
    CompleteEventArgs,
    NeedsSlowDecode,
    decode_events,
    decode_events_exact,
    decode_events_slow,
    exact_ns,
    has_epoch_fraction_ts,
)
from nsys2comm.ingest.kineto_stream import CLOSE_PIECE

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _raw(text: str) -> msgspec.Raw:
    return msgspec.Raw(text.encode())


@pytest.mark.parametrize(("digits", "ns"), [
    ("1700000000123456.789", 1700000000123456789),
    ("1700000000123456.000", 1700000000123456000),
    ("1700000000123456", 1700000000123456000),
    ("-0.500", -500),
    ("12.5", 12500),
    ("1.5e3", 1500000),
    ("1700000000123456.7895", 1700000000123456790),  # a 4th digit: half to even, as round(Decimal) does
    ("1700000000123456.7885", 1700000000123456788),
])
def test_exact_ns_reads_the_digits(digits, ns):
    assert exact_ns(_raw(digits)) == ns
    assert exact_ns(Decimal(digits)) == ns


def test_exact_ns_null_and_values_that_are_not_numbers():
    assert exact_ns(_raw("null")) is None
    for bad in ('"12.345"', '"1700000000123456.789"', "[1]", "{}", "true"):
        with pytest.raises(NeedsSlowDecode):
            exact_ns(_raw(bad))


@given(st.integers(min_value=-(10**17), max_value=10**17), st.integers(min_value=0, max_value=6))
def test_exact_ns_equals_rounding_the_decimal(units, places):
    """Any JSON decimal: the digits route equals round(Decimal * 1000) (what the tolerant decoder computes)."""
    d = Decimal(units).scaleb(-places)
    text = format(d, "f")
    assert exact_ns(_raw(text)) == round(d * 1000)


def test_the_sniff_is_for_epoch_fractions_only():
    assert has_epoch_fraction_ts(b'[{"ph": "X", "ts": 1712195495519689.047, "dur": 1}')
    assert has_epoch_fraction_ts(bytearray(b'[{"name": "x", "ts":1712195495519689.5}'))
    assert not has_epoch_fraction_ts(b'[{"ph": "X", "ts": 4458676388068.751}')  # relative to baseTimeNanoseconds
    assert not has_epoch_fraction_ts(b'[{"ph": "X", "ts": 1694128201435418}')  # integer epoch µs
    # only the first ts counts: a later fraction is found by the row loop (NeedsExactTs)
    assert not has_epoch_fraction_ts(b'[{"ts": 1694128201435418}, {"ts": 1712195495519689.047}')


def _kernel(ts: str, i: int) -> str:
    e = {"ph": "X", "cat": "kernel", "name": NCCL if i % 2 else "gemm_kernel", "pid": 0, "tid": 7, "ts": 0,
         "dur": 10.5, "args": {"device": 0, "stream": 7, "correlation": i}}
    return json.dumps(e).replace('"ts": 0', f'"ts": {ts}')


def _block(ts_values: list[str]) -> bytes:
    body = ", ".join(_kernel(ts, i) for i, ts in enumerate(ts_values))
    return ("[" + body + ", ").encode() + CLOSE_PIECE


# .000 and .062 are integers as float64 (ulp 0.25 at 1.7e15): a float route would not even see a fraction
FRACTIONS = ["1712195495519689.047", "1712195495519689.000", "1712195495519690.062", "1712195495519691.999"]


@pytest.mark.parametrize("first", ["1712195495519688.500", "1712195495519688"],
                         ids=["sniffed", "found_by_the_row_loop"])
def test_a_block_of_epoch_fractions_is_exact_on_every_route(first):
    data = _block([first, *FRACTIONS])
    tables, _ = kineto._decode_process(bytearray(data), 0)
    got = tables["kernels"].select(["start_ns", "end_ns"]).to_pylist()
    want = [round(Decimal(t) * 1000) for t in [first, *FRACTIONS]]
    assert [r["start_ns"] for r in got] == want
    assert [r["end_ns"] for r in got] == [w + 10500 for w in want]
    assert any(round(float(t) * 1000) != round(Decimal(t) * 1000) for t in FRACTIONS)  # the float route is wrong
    # the same rows as the tolerant decoder's Decimals
    slow, _ = kineto._process(decode_events_slow(data), 0)
    assert slow["kernels"].equals(tables["kernels"])


def test_a_block_whose_fractions_are_integers_as_float64_is_exact():
    """The first ts is an integer (no sniff) and every later one reads as an integer float (its fraction is below
    float64's 0.25 µs ulp there): the block is still read from its digits (the float route gave ...688960 for
    ...689.000)."""
    values = ["1712195495519688", "1712195495519689.000", "1712195495519690.062", "1712195495519691.999"]
    tables, _ = kineto._decode_process(_block(values), 0)
    assert tables["kernels"]["start_ns"].to_pylist() == [round(Decimal(t) * 1000) for t in values]


def test_the_exact_decoder_keeps_ts_digits_and_skips_other_phases():
    data = b'[{"ph": "i", "ts": 1712195495519689.047, "name": "x"}, ' + _kernel("1712195495519689.047", 1).encode() \
        + b", " + CLOSE_PIECE
    events = decode_events_exact(data)
    kept = [e for e in events if e.ph == "X"]
    assert len(kept) == 1 and bytes(kept[0].ts) == b"1712195495519689.047"


def test_odd_types_in_one_event_s_args_are_converted_without_decoding_its_block_again(monkeypatch):
    """A kernel whose args hold a stream as text and a grid of floats: its args are converted on their own, the
    block is not decoded again, and the rows equal the tolerant decoder's."""
    odd = _kernel("1694128201435418", 1).replace('"stream": 7', '"stream": "7"').replace(
        '"correlation": 1', '"correlation": 1, "grid": [2.0, 1, 1]')
    data = ("[" + ", ".join([_kernel("1694128201435417", 0), odd]) + ", ").encode() + CLOSE_PIECE
    slow, _ = kineto._process(decode_events_slow(data), 0)

    def no_slow_decode(_):
        raise AssertionError("the block was decoded again")

    monkeypatch.setattr(kineto, "decode_events_slow", no_slow_decode)
    tables, _ = kineto._decode_process(data, 0)
    assert tables["kernels"].equals(slow["kernels"])
    assert tables["kernels"].select(["stream_id", "grid_x"]).to_pylist()[1] == {"stream_id": 7, "grid_x": 2}


def test_the_benchmark_s_epoch_fraction_variant_is_read_to_the_ns(tmp_path):
    """tile.with_epoch_fractions writes us.nnn digits; the ingest stores them exactly."""
    from nsys2comm.ingest import ingest
    from nsys2comm.storage import db
    from tests.benchmarks.tile import with_epoch_fractions

    src = tmp_path / "int.json"
    src.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        json.loads(_kernel("1712195495519688", i)) for i in range(3)]}, indent=1))
    out = tmp_path / "frac.json"
    assert with_epoch_fractions(src, out) == 3
    con = db.connect(None)
    ingest(con, [out], jobs=1)
    digits = [d for d in out.read_text().split('"ts": ')[1:]]
    want = sorted(round(Decimal(d.split(",")[0]) * 1000) for d in digits)
    assert sorted(r[0] for r in con.execute("SELECT start_ns FROM kernels").fetchall()) == want
    assert all(w % 1000 for w in want)  # every ts got a fraction


def test_rocm_launch_streams_given_as_pointers_stay_on_the_fast_path(monkeypatch):
    """ROCm traces (kineto's roctracer writer) print each HIP launch's stream as a pointer in text, on every
    launch: the fast pass takes them (no block decoded again, no event converted on its own), and the rows equal
    the tolerant decoder's, a kernel's stream given as text included."""
    launch = json.dumps({"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 1,
                         "ts": 1694128201435410, "dur": 3,
                         "args": {"cid": 3, "correlation": 1, "stream": "0x7f3a5c0010d0", "grid": [1, 1, 1]}})
    text_stream = _kernel("1694128201435418", 2).replace('"stream": 7', '"stream": "9"')
    data = ("[" + ", ".join([launch, _kernel("1694128201435417", 1), text_stream]) + ", ").encode() + CLOSE_PIECE
    slow, _ = kineto._process(decode_events_slow(data), 0)
    assert [type(e) for e in decode_events(data) if e.ph == "X"] == [CompleteEventArgs] * 3  # the first decoder's

    def refuse(*_):
        raise AssertionError("left the fast path")

    monkeypatch.setattr(kineto, "decode_events_slow", refuse)
    monkeypatch.setattr(kineto_rows, "tolerant_raw_args", refuse)
    tables, _ = kineto._decode_process(data, 0)
    for t in ("kernels", "api_calls", "cpu_ranges"):
        assert tables[t].equals(slow[t]), t
    assert tables["kernels"]["stream_id"].to_pylist() == [7, 9]
    assert tables["api_calls"]["correlation_id"].to_pylist() == [1]
