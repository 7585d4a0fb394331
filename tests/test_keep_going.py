"""Tier 3: ``--keep-going`` on the commands that take traces (issue 41, deliverable 4): the good files are
analysed, the bad one is listed (summary's failed_files and missing, stderr), and the exit code is 4
(3 when a threshold is violated, 1 when no file could be read). Fixtures: synthetic Kineto traces built by code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm.cli import EXIT_INPUT, EXIT_PARTIAL, EXIT_THRESHOLD, app

WORLD = 3


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("kg")
    write_kineto(make_run(world_size=WORLD, steps=1), d)
    (d / "broken.json").write_text('{"traceEvents": [ {"ph": "X", "name": ')
    return d


def test_exit_codes_are_distinct():
    assert len({EXIT_INPUT, EXIT_PARTIAL, EXIT_THRESHOLD, 0, 2}) == 5 and EXIT_PARTIAL == 4


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_summary_json_keep_going_analyses_the_good_ranks(traces):
    r = run("summary", traces, "--json", "--keep-going")
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    doc = json.loads(r.stdout)  # one valid document on stdout, messages on stderr
    assert doc["ranks"] == WORLD and doc["files"] == WORLD
    bad = str(traces / "broken.json")
    assert [f["path"] for f in doc["failed_files"]] == [bad]
    assert any(bad in m for m in doc["missing"])
    assert "broken.json" in r.stderr and "1 of 4 trace file(s) could not be read" in r.stderr


def test_summary_without_keep_going_fails_and_points_to_it(traces):
    r = run("summary", traces, "--json")
    assert r.exit_code == EXIT_INPUT
    assert "--keep-going" in r.stderr


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_threshold_violation_wins_over_partial(traces):
    r = run("summary", traces, "--json", "--keep-going", "--max-exposed-comm-pct", "0")
    doc = json.loads(r.stdout)
    assert doc["ok"] is False  # the synthetic run has exposed communication
    assert r.exit_code == EXIT_THRESHOLD


def test_no_readable_file_is_an_input_error_with_a_document(traces):
    r = run("summary", traces / "broken.json", "--json", "--keep-going")
    assert r.exit_code == EXIT_INPUT
    doc = json.loads(r.stdout)
    assert doc["files"] == 0 and [f["path"] for f in doc["failed_files"]] == [str(traces / "broken.json")]


@pytest.mark.parametrize("cmd", [["query", "{t}", "run_overview", "-f", "csv"],
                                 ["sql", "{t}", "SELECT count(DISTINCT rank) AS n FROM kernels", "-f", "csv"]])
def test_rows_commands_keep_going(traces, cmd):
    r = run(*[c.format(t=traces) for c in cmd], "--keep-going")
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    assert "broken.json" in r.stderr and r.stdout.strip()
    if cmd[0] == "sql":
        assert r.stdout.split() == ["n", str(WORLD)]


def test_export_keep_going(traces, tmp_path):
    out = tmp_path / "job.json"
    r = run("export", "perfetto", traces, "-o", out, "--keep-going")
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    assert {e["pid"] for e in json.loads(out.read_bytes())["traceEvents"]} == set(range(WORLD))


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_diff_and_report_keep_going(traces, tmp_path):
    r = run("diff", traces, traces, "--json", "--keep-going")
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    json.loads(r.stdout)
    out = tmp_path / "r.html"
    r = run("report", traces, "-o", out, "--keep-going")
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    assert out.stat().st_size > 0
