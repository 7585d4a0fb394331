"""The output layer: terminal tables that fit 80 columns, time units, and format/extension agreement."""

from __future__ import annotations

import io
import re

import polars as pl
import pytest

from nsys2comm.errors import UsageError
from nsys2comm.output import convert_times, infer_format, render_table, write_rows

KERNEL = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def _wide_frame() -> pl.DataFrame:
    return pl.DataFrame({
        "rank": [0, 1],
        "span_ns": [1_300_900_000_000, 5],  # 13 digits
        "kernel": [KERNEL, "x"],
        "rank_wait": [153_400, 1],
        "start_ns": [1_694_128_201_421_205_000, 1_694_128_201_421_205_100],
        "pct": [0.5, 12.3456],
        "notes": ["abc", "def"],
        "last_col": [1, 2],
    })


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_table_at_80_columns_keeps_numbers_whole_and_truncates_text():
    text, dropped = render_table(_wide_frame(), width=80)
    lines = text.splitlines()
    assert len(lines) == 3  # header + 2 rows: nothing folded onto a second line
    assert all(len(line) <= 80 for line in lines)
    assert "1300900000000" in lines[1] and "153400" in lines[1] and "1694128201421205000" in lines[1]
    assert "…" in lines[1] and KERNEL not in text  # long text is cut, visibly
    cols = _wide_frame().columns
    assert dropped and dropped == cols[len(cols) - len(dropped):]  # the columns that did not fit, in order
    assert "last_col" in dropped and not any(name in lines[0].split() for name in dropped)


def test_table_drops_columns_in_order_and_never_cuts_numbers_even_when_narrow():
    text, dropped = render_table(_wide_frame(), width=30)
    assert text.splitlines()[1].split()[:2] == ["0", "1300900000000"]
    assert "1694128201421205000" not in text and "start_ns" in dropped
    assert all(len(line) <= 30 for line in text.splitlines())


def test_table_off_a_terminal_is_complete():
    text, dropped = render_table(_wide_frame())
    assert dropped == [] and KERNEL in text and len(text.splitlines()) == 3


def test_table_on_a_terminal_says_which_columns_were_left_out(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out, err = _Terminal(), io.StringIO()
    write_rows(_wide_frame(), fmt="table", stdout=out, stderr=err)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # the header is bold on a terminal
    assert "1300900000000" in shown and max(map(len, shown.splitlines())) <= 80
    assert "columns not shown" in err.getvalue() and "notes, last_col" in err.getvalue()
    assert "notes" not in shown and "columns not shown" not in shown


def test_table_cells_with_newlines_stay_on_one_line():
    text, _ = render_table(pl.DataFrame({"sql": ["SELECT 1\nFROM t"]}), width=80)
    assert text.splitlines()[1] == "SELECT 1 FROM t"


def test_convert_times_renames_ns_columns_to_the_unit():
    df = pl.DataFrame({"span_ns": [6_801_000, None], "start_ns": [1_000_000_000, 2_000_000_000], "n": [1, 2],
                       "rank_wait_ns": [[1], [2]]})
    ms = convert_times(df, "ms")
    assert ms.columns == ["span_ms", "start_ms", "n", "rank_wait_ns"]  # nested values keep their ns
    assert ms["span_ms"].to_list() == [6.801, None]  # exact decimals, nulls kept
    # a unit other than ns: timestamps count from the job start (here the frame's earliest), durations do not move
    assert convert_times(df, "s")["start_s"].to_list() == [0.0, 1.0]
    assert convert_times(df, "s", origin_ns=0)["start_s"].to_list() == [1.0, 2.0]
    assert convert_times(df, "ns").equals(df)  # the stored unit: unchanged, absolute


def test_convert_times_relative_shifts_timestamps_only():
    df = pl.DataFrame({"start_ns": [1_000, 3_000], "window_end_ns": [5_000, 9_000], "first_ns": [2_000, 2_000],
                       "span_ns": [4_000, 6_000], "end_skew_ns": [10, 20]})
    rel = convert_times(df, "ns", relative=True, origin_ns=500)
    assert rel["start_ns"].to_list() == [500, 2_500] and rel["window_end_ns"].to_list() == [4_500, 8_500]
    assert rel["first_ns"].to_list() == [1_500, 1_500]
    assert rel["span_ns"].to_list() == [4_000, 6_000] and rel["end_skew_ns"].to_list() == [10, 20]  # durations
    own = convert_times(df, "us", relative=True)  # no job start given: the frame's earliest timestamp
    assert own["start_us"].to_list() == [0.0, 2.0] and own["span_us"].to_list() == [4.0, 6.0]


def test_convert_times_keeps_a_column_whose_new_name_is_taken():
    df = pl.DataFrame({"start_ns": [1_000], "start_us": [7.0]})
    assert convert_times(df, "us").to_dicts() == [{"start_ns": 1_000, "start_us": 7.0}]


def test_convert_times_rejects_unknown_units():
    with pytest.raises(UsageError):
        convert_times(pl.DataFrame({"a_ns": [1]}), "min")


@pytest.mark.parametrize("fmt,out", [("csv", "x.json"), ("json", "x.jsonl"), ("parquet", "x.csv"),
                                     ("markdown", "x.tsv")])
def test_format_contradicting_the_extension_is_a_usage_error(fmt, out):
    with pytest.raises(UsageError, match="contradicts"):
        infer_format(fmt, out)


@pytest.mark.parametrize("fmt,out", [("csv", "x.csv"), ("tsv", "x.tab"), ("csv", "x.txt"), ("csv", "x.dat"),
                                     ("json", None)])
def test_format_agreeing_with_the_extension_or_unknown_extension_is_fine(fmt, out):
    assert infer_format(fmt, out) == fmt


# ----------------------------------------------------------------------------------------------------------------
# tier 2: key columns, records, --columns, the one time rule on frames built here (issue 41)


def test_key_columns_come_first_when_not_everything_fits():
    keys = ["rank", "pct", "notes"]
    text, dropped = render_table(_wide_frame(), width=60, keys=keys)
    header = text.splitlines()[0].split()
    assert header[:3] == keys and set(dropped) == set(_wide_frame().columns) - set(header)
    assert all(len(line) <= 60 for line in text.splitlines())
    full, none_dropped = render_table(_wide_frame(), width=None, keys=keys)
    assert none_dropped == [] and full.splitlines()[0].split() == _wide_frame().columns  # fits: own order


def test_key_columns_that_do_not_fit_become_one_record_per_row():
    keys = ["kernel", "start_ns", "span_ns", "rank_wait"]  # 20 + 19 + 13 + 9 cells and gaps: more than 50
    text, dropped = render_table(_wide_frame(), width=50, keys=keys)
    lines = text.splitlines()
    assert dropped == [] and lines[0].startswith("-[ row 1 ]") and all(len(x) <= 50 for x in lines)
    first = lines[1:lines.index(next(x for x in lines[1:] if x.startswith("-[ row 2 ]")))]
    assert [x.split()[0] for x in first if not x.startswith(" ")][:4] == keys  # keys first, then every column
    assert "1694128201421205000" in text and "1300900000000" in text  # numbers whole
    assert "".join(KERNEL.split()) in "".join(text.split())  # text wrapped, not cut
    assert "…" not in text


def test_columns_asked_for_are_never_left_out():
    df = _wide_frame().select(["kernel", "start_ns", "notes"])
    text, dropped = render_table(df, width=40, exact=True)
    assert dropped == [] and text.startswith("-[ row 1 ]")
    assert render_table(df.head(0), width=30, exact=True)[0] == "kernel  start_ns  notes\n"  # fits: a header
    text, _ = render_table(df.head(0), width=20, exact=True)
    assert text.splitlines() == ["-[ no rows ]--------", "kernel", "start_ns", "notes"]


def test_select_columns_order_aliases_and_errors():
    from nsys2comm.output import parse_columns, select_columns

    df = convert_times(pl.DataFrame({"rank": [0], "span_ns": [1000]}), "us")
    assert select_columns(df, parse_columns("span_ns, rank")).columns == ["span_us", "rank"]
    with pytest.raises(UsageError, match="no column 'busbw'") as e:
        select_columns(df, ["busbw"])
    assert "rank,span_us" in (e.value.hint or "")
    for bad in (",", "rank,rank"):
        with pytest.raises(UsageError):
            parse_columns(bad)


def test_time_note_and_diff_times():
    from nsys2comm.output import convert_diff_times, time_note

    assert time_note(["start_us", "span_us"], "us", False, 5) == \
        "timestamps in us from the job start (5 ns on the job timeline): start_us"
    assert time_note(["start_ns"], None, False, None) is None and time_note(["span_us"], "us", False, 5) is None
    rows = pl.DataFrame({"metric": ["idle_ns_per_step", "busbw_gbps", "max_start_skew_ns"],
                         "base": [1_234_567.891, 2.5, 10.0], "new": [2e6, 3.0, 20.0], "delta": [765_432.109, 0.5, 10.0],
                         "delta_pct": [62.0, 20.0, 100.0], "impact_ns": [765_432.109, None, None]})
    ms = convert_diff_times(rows, "ms")
    assert ms["metric"].to_list() == ["idle_ms_per_step", "busbw_gbps", "max_start_skew_ms"]
    assert ms["base"].to_list() == [1.234568, 2.5, 0.00001] and ms["impact_ms"].to_list() == [0.765432, None, None]
    assert ms["delta_pct"].to_list() == rows["delta_pct"].to_list()


def test_exact_integers_and_percentages():
    from decimal import Decimal

    from nsys2comm.output import exact_integers, round_percentages

    df = pl.DataFrame({"s": [Decimal(12), Decimal(3)], "x_pct": [33.33333333, None]},
                      schema={"s": pl.Decimal(38, 0), "x_pct": pl.Float64})
    out = round_percentages(exact_integers(df))
    assert out.schema["s"] == pl.Int64 and out["s"].to_list() == [12, 3] and out["x_pct"].to_list() == [33.3, None]
    huge = pl.DataFrame({"h": [2**70]}, schema={"h": pl.Int128})
    assert exact_integers(huge).schema["h"] == pl.Int128  # does not fit: left as it is


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_times_in_a_unit_have_no_float_noise_or_exponent(fmt):
    from nsys2comm.output import render

    df = convert_times(pl.DataFrame({"start_ns": [1_694_128_201_425_338_900, 1_694_128_201_425_338_905],
                                     "dur_ns": [5, 1_000_000_007]}), "s", origin_ns=1_694_128_201_425_338_900)
    text = render(df, fmt).decode()
    assert "e-" not in text and "e+" not in text
    assert "0.000000005" in text and "1.000000007" in text and "0.0" in text
