"""The summary as text (issue 41): wrapped to the terminal (at most 100 columns), one reason where there is no
communication, point-to-point with its reason, "N ops" rather than "× N", no layout line when nothing is known."""

# tier 3: the text rendering of summaries built from jobs made by code (tests/synth_db.py) and of the bundled
# example's summary

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nsys2comm import Job
from nsys2comm.summary import build_summary, format_summary, wrap_lines

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_FILES = sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))
NUMBER = re.compile(r"\d[\d.,]*")


@pytest.fixture(scope="module")
def example_summary() -> dict:
    with Job.ingest(EXAMPLE_FILES, jobs=1) as job:
        return job.summary()


@pytest.fixture(scope="module")
def compute_only_summary() -> dict:
    """Two ranks, GEMM and elementwise kernels only (1 ms each), no communication."""
    from tests import synth_db

    con = synth_db.empty_job(2)
    k = 1
    for rank in range(2):
        for i in range(3):
            synth_db.add_kernel(con, k, rank, "ampere_sgemm_128x64_tn" if i % 2 else "elementwise_kernel",
                                1_000_000_000 + i * 2_000_000, 1_000_000_000 + i * 2_000_000 + 1_000_000, 7)
            k += 1
    return build_summary(con)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("width", [60, 80, 100])
def test_lines_are_wrapped_at_spaces_without_splitting_numbers(example_summary, width):
    flat = format_summary(example_summary, width=None)
    text = format_summary(example_summary, width=width)
    assert max(len(line) for line in flat.splitlines()) > width  # the example has long lines to wrap
    for line in text.splitlines():
        assert len(line) <= width or " " not in line.strip(), line  # only a single over-long word may stick out
    assert NUMBER.findall(text) == NUMBER.findall(flat)  # every number whole, in order
    assert not re.search(r"\d\n +(ns|µs|ms|s|GB/s|B|KiB|MiB|GiB|ops?)\b", text)  # and beside its unit
    assert text.split() == flat.split()  # nothing lost or cut: only line breaks changed
    assert all(line.startswith("  ") for line in text.splitlines()
               if not re.match(r"^[A-Za-z-]+[ A-Za-z-→]*:", line))  # continuation lines are indented


def test_default_width_is_100_off_a_terminal(example_summary):
    from nsys2comm import output as out_

    assert out_.text_width() == 100  # pytest's stdout is no terminal
    assert max(map(len, format_summary(example_summary, width=out_.text_width()).splitlines())) <= 100
    assert format_summary(example_summary) == format_summary(example_summary, width=None)  # the API: one line each


def test_wrap_lines_keeps_a_long_word_whole():
    assert wrap_lines(["a " + "x" * 30 + " b"], 10) == "a\n  " + "x" * 30 + "\n  b"


def test_worst_collective_counts_operations_not_ranks(example_summary):
    w = example_summary["worst_collective"]
    line = next(x for x in format_summary(example_summary, width=None).splitlines() if x.startswith("worst"))
    assert f", {w['count']} ops = " in line and "×" not in line.split("=")[0]


def test_compute_only_job_says_no_communication_once_per_line(compute_only_summary):
    s = compute_only_summary
    assert s["comm_ns"] == 0 and s["gpu_busy_ns"] == 6_000_000
    text = format_summary(s, width=None)
    assert "0.00 ns" not in text and "0.0%" not in text.split("point-to-point")[0]
    lines = {line.split(":")[0]: line for line in text.splitlines()}
    assert lines["communication"] == ("communication: no communication kernels (6.00 ms GPU-busy time, summed "
                                      "over ranks)")
    assert lines["overlap with compute"].endswith("n/a (no communication kernels)")
    assert lines["exposed communication"] == "exposed communication: none (no communication kernels)"
    assert lines["worst collective"] == "worst collective: n/a (no communication kernels)"
    assert lines["point-to-point"] == "point-to-point: n/a (no communication kernels)"
    assert "parallel layout" not in text  # nothing known: no layout line


def test_point_to_point_na_has_its_reason(example_summary):
    s = dict(example_summary, p2p=None, missing=list(example_summary["missing"]))
    line = next(x for x in format_summary(s, width=None).splitlines() if x.startswith("point-to-point"))
    assert line == "point-to-point: n/a (no send/recv matched across ranks)"
    s["ranks"] = 1
    line = next(x for x in format_summary(s, width=None).splitlines() if x.startswith("point-to-point"))
    assert "single-rank job" in line
    s["missing"].append("p2p: not available (a reason)")
    line = next(x for x in format_summary(s, width=None).splitlines() if x.startswith("point-to-point"))
    assert line == "point-to-point: not available (see missing: p2p)"


def test_cli_summary_wraps_to_the_terminal(example_summary, monkeypatch):
    from typer.testing import CliRunner

    from nsys2comm import output as out_
    from nsys2comm.cli import app

    monkeypatch.setattr("nsys2comm.api.Job.summary", lambda self, **kw: example_summary)
    monkeypatch.setattr(out_, "_terminal_width", lambda stream: 72)
    r = CliRunner().invoke(app, ["summary", *map(str, EXAMPLE_FILES[:1])])
    assert r.exit_code == 0, r.output
    assert max(map(len, r.stdout.splitlines())) <= 72 and r.stdout.split() == \
        format_summary(example_summary, width=None).split()
    monkeypatch.setattr(out_, "_terminal_width", lambda stream: 200)  # a wide terminal: still at most 100
    r = CliRunner().invoke(app, ["summary", *map(str, EXAMPLE_FILES[:1])])
    assert max(map(len, r.stdout.splitlines())) <= 100
