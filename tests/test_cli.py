"""The command line: every command and format, in-process (typer's CliRunner) and as a real subprocess.

Uses the bundled example (fixtures/example: the 8-rank DLRM Kineto traces), ingested once per session.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from nsys2comm import Job, __version__
from nsys2comm.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "fixtures" / "example"
EXAMPLE_FILES = sorted(EXAMPLE.glob("*.json.gz"))
FORMATS = ["table", "csv", "tsv", "json", "jsonl", "markdown"]
COMMANDS = ["ingest", "summary", "diff", "report", "query", "sql", "schema", "queries list", "queries show",
            "export perfetto"]


def run(*args: str, input: str | None = None):
    """In-process run: returns the Result (stdout and stderr kept apart)."""
    return CliRunner().invoke(app, [str(a) for a in args], input=input, catch_exceptions=True)


@pytest.fixture
def proc(cli_process):
    """Real process: ``python -m nsys2comm`` (what the console script runs), without NSYS2COMM_DEBUG; a test that
    uses it is in the subprocess tier (conftest's cli_process)."""
    env = {k: v for k, v in os.environ.items() if k != "NSYS2COMM_DEBUG"}

    def run(*args, input: str | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
        return cli_process(*args, input=input, cwd=cwd, env=env)
    return run


@pytest.fixture(scope="session")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("db") / "run.duckdb"
    Job.ingest(EXAMPLE_FILES, db=path, jobs=1).close()
    return path


@pytest.fixture()
def fresh_traces(tmp_path) -> Path:
    """Two good traces and one bad file in a folder of their own."""
    d = tmp_path / "traces"
    d.mkdir()
    for f in EXAMPLE_FILES[:2]:
        shutil.copy(f, d / f.name)
    (d / "broken.json").write_text('{"traceEvents": [ {"ph": "X", "name": ')
    return d


# ----------------------------------------------------------------------------------------------- global options


def test_version_and_help():
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"nsys2comm {__version__}"
    r = run("--help")
    assert r.exit_code == 0
    for cmd in ("ingest", "summary", "report", "query", "sql", "queries", "schema"):
        assert cmd in r.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help_with_an_example(cmd):
    r = run(*cmd.split(), "--help")
    assert r.exit_code == 0, r.output
    assert "Example" in r.stdout and f"nsys2comm {cmd.split()[0]}" in r.stdout


def test_usage_errors_exit_2():
    assert run("nosuchcommand").exit_code == 2
    assert run("query").exit_code == 2  # missing arguments
    assert run("ingest", "x.json").exit_code == 2  # --db is required
    assert run("queries", "list", "--format", "xml").exit_code == 2


# ----------------------------------------------------------------------------------------------- ingest


def test_ingest_prints_per_file_lines_and_skips_reingest(tmp_path):
    dbp = tmp_path / "j.duckdb"
    r = run("ingest", EXAMPLE_FILES[0], EXAMPLE_FILES[1], "--db", dbp, "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert r.stdout == ""  # messages go to stderr
    assert r.stderr.count("ingested  ") == 2 and "2 ingested, 0 skipped, 0 failed" in r.stderr
    r = run("ingest", EXAMPLE_FILES[0], "--db", dbp)
    assert r.exit_code == 0 and "skipped" in r.stderr and "already ingested" in r.stderr
    r = run("ingest", EXAMPLE_FILES[0], "--db", dbp, "--quiet")
    assert r.exit_code == 0 and r.stderr == ""


def test_ingest_keep_going_ingests_good_files_and_lists_bad_ones(tmp_path, fresh_traces):
    dbp = tmp_path / "j.duckdb"
    r = run("ingest", fresh_traces, "--db", dbp, "--keep-going", "--jobs", "1")
    assert r.exit_code == 1
    assert "broken.json" in r.stderr and "could not be ingested" in r.stderr
    with Job.open(dbp) as job:
        assert job.sql("SELECT count(*) AS n FROM files")["n"][0] == 2


def test_ingest_without_keep_going_stops_with_exit_1(tmp_path, fresh_traces):
    r = run("ingest", fresh_traces / "broken.json", "--db", tmp_path / "j.duckdb")
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: ") and "broken.json" in r.stderr and "--keep-going" in r.stderr
    assert "Traceback" not in r.stderr


def test_ingest_missing_path_is_input_error(tmp_path):
    r = run("ingest", tmp_path / "nope.json", "--db", tmp_path / "j.duckdb")
    assert r.exit_code == 1 and "no such file" in r.stderr


def test_ingest_subprocess_parallel(tmp_path, proc):
    p = proc("ingest", EXAMPLE_FILES[0], EXAMPLE_FILES[1], "--db", tmp_path / "j.duckdb", "--jobs", "2")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and "2 ingested" in p.stderr and "\x1b[" not in p.stderr  # no bar off a terminal


# ----------------------------------------------------------------------------------------------- query + formats


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("fmt", FORMATS)
def test_query_every_format(db, fmt):
    r = run("query", db, "run_overview", "--format", fmt)
    assert r.exit_code == 0, r.output
    out = r.stdout
    if fmt == "json":
        rows = json.loads(out)
        assert len(rows) == 8 and isinstance(rows[0]["first_ns"], int)  # times stay integer ns
    elif fmt == "jsonl":
        assert len(out.splitlines()) == 8 and json.loads(out.splitlines()[0])["rank"] == 0
    elif fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        assert out.splitlines()[0].split(sep)[0] == "rank" and len(out.splitlines()) == 9
    elif fmt == "markdown":
        assert out.startswith("| rank |") and len(out.splitlines()) == 10
    else:
        assert out.splitlines()[0].split()[0] == "rank" and len(out.splitlines()) == 9


@pytest.mark.parametrize("ext,fmt", [("csv", "csv"), ("tsv", "tsv"), ("json", "json"), ("jsonl", "jsonl"),
                                     ("parquet", "parquet"), ("md", "markdown")])
def test_output_format_from_extension(db, tmp_path, ext, fmt):
    out = tmp_path / f"rows.{ext}"
    r = run("query", db, "run_overview", "-o", out)
    assert r.exit_code == 0, r.output
    assert r.stdout == "" and f"({fmt})" in r.stderr
    if fmt == "parquet":
        df = pl.read_parquet(out)
        assert df.height == 8 and df.schema["first_ns"] == pl.Int64
    elif fmt == "csv":
        assert pl.read_csv(out).height == 8


def test_parquet_needs_a_file_and_unknown_extension_is_usage_error(db, tmp_path):
    r = run("query", db, "run_overview", "--format", "parquet")
    assert r.exit_code == 2 and "needs a file" in r.stderr
    r = run("query", db, "run_overview", "-o", tmp_path / "rows.xyz")
    assert r.exit_code == 2 and "--format" in r.stderr


def test_query_params_and_errors(db):
    r = run("query", db, "step_timeline", "-p", "max_segments=3", "-p", "max_ranks=2", "-f", "json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert {row["rank"] for row in rows} <= {0, 1} and max(row["segment"] for row in rows) < 3
    r = run("query", db, "step_timeline", "-p", "nonsense=1")
    assert r.exit_code == 2
    r = run("query", db, "step_timeline", "-p", "no_equals_sign")
    assert r.exit_code == 2
    r = run("query", db, "no_such_query")
    assert r.exit_code == 2 and "queries list" in r.stderr


def test_nan_becomes_null():
    from nsys2comm.output import render

    df = pl.DataFrame({"x_ns": [1, 2], "pct": [float("nan"), 1.5]})
    assert json.loads(render(df, "json")) == [{"x_ns": 1, "pct": None}, {"x_ns": 2, "pct": 1.5}]
    assert render(df, "csv").decode().splitlines()[1] == "1,"


def test_one_off_traces_instead_of_db(proc):
    # real processes: ingest forks parser workers, which is not safe from inside a threaded pytest process
    p = proc("query", "fixtures/example", "run_overview", "-f", "csv")  # a directory
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 9
    p = proc("query", "fixtures/example/worker[01]_*.json.gz", "run_overview", "-f", "jsonl")  # a glob
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 2
    r = run("query", EXAMPLE_FILES[0], "run_overview", "-f", "json")  # one file, in-process
    assert r.exit_code == 0 and len(json.loads(r.stdout)) == 1


def test_missing_db_is_input_error(tmp_path):
    r = run("summary", tmp_path / "nope.duckdb")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "no such database" in r.stderr


def test_debug_shows_the_traceback(tmp_path, proc):
    r = run("--debug", "summary", tmp_path / "nope.duckdb")
    assert r.exit_code == 1 and r.exception is not None and type(r.exception).__name__ == "InputError"
    p = proc("--debug", "summary", tmp_path / "nope.duckdb")
    assert p.returncode == 1 and "Traceback" in p.stderr
    p = proc("summary", tmp_path / "nope.duckdb")
    assert p.returncode == 1 and "Traceback" not in p.stderr


# ----------------------------------------------------------------------------------------------- sql


def test_sql_select_and_several_statements(db):
    r = run("sql", db, "SELECT count(*) AS n FROM ranks", "-f", "csv")
    assert r.exit_code == 0 and r.stdout == "n\n8\n"
    r = run("sql", db, "CREATE TEMP TABLE t AS SELECT rank FROM ranks WHERE rank < 3; SELECT count(*) AS n FROM t",
            "-f", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == [{"n": 3}]


def test_sql_from_stdin(db):
    r = run("sql", db, "-", "-f", "jsonl", input="SELECT 1 AS a;\nSELECT 2 AS b\n")
    assert r.exit_code == 0 and json.loads(r.stdout) == {"b": 2}


def test_sql_catalog_objects_usable(db):
    r = run("sql", db, "SELECT kernel_short_name('void at::foo<float>(int)') AS s, count(*) AS n "
                       "FROM step_timeline(max_segments := 4)", "-f", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)[0]["s"] == "at::foo"


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_sql_is_read_only_unless_write(db, tmp_path):
    for stmt in ("DELETE FROM kernels", "CREATE TABLE x AS SELECT 1", "DROP TABLE ranks",
                 "SELECT 1; INSERT INTO ranks VALUES (99, 1, NULL, NULL, NULL, 'cli')"):
        r = run("sql", db, stmt)
        assert r.exit_code == 1, stmt
        assert "read-only" in r.stderr and "--write" in r.stderr
    assert json.loads(run("sql", db, "SELECT count(*) AS n FROM kernels", "-f", "json").stdout)[0]["n"] > 0
    copy = tmp_path / "copy.duckdb"
    shutil.copy(db, copy)
    r = run("sql", copy, "DELETE FROM ranks WHERE rank = 7", "--write")
    assert r.exit_code == 0, r.output
    assert run("sql", copy, "SELECT count(*) AS n FROM ranks", "-f", "csv").stdout == "n\n7\n"
    # one-off traces are read-only too
    r = run("sql", EXAMPLE_FILES[0], "DELETE FROM kernels")
    assert r.exit_code == 1 and "--write" in r.stderr


def test_sql_error_keeps_what_duckdb_said(db):
    r = run("sql", db, "SELECT rnk FROM ranks")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "Traceback" not in r.stderr
    assert 'Referenced column "rnk" not found' in r.stderr and 'Candidate bindings: "rank"' in r.stderr
    r = run("sql", db, "SELEC rank FROM ranks")
    lines = r.stderr.splitlines()
    assert r.exit_code == 1 and "syntax error" in lines[0]
    line = next(i for i, s in enumerate(lines) if s.startswith("LINE 1: SELEC rank FROM ranks"))
    assert lines[line + 1].strip() == "^^^^^" and lines[line + 1].index("^") == lines[line].index("SELEC")


# ----------------------------------------------------------------------------------------------- catalog, schema


@pytest.mark.parametrize("fmt", FORMATS)
def test_queries_list_formats(fmt):
    r = run("queries", "list", "--format", fmt)
    assert r.exit_code == 0, r.output
    assert "step_timeline" in r.stdout


def test_queries_show():
    r = run("queries", "show", "step_timeline")
    assert r.exit_code == 0
    for part in ("Parameters:", "max_segments", "Columns:", "window_start_ns", "SQL:", "CREATE OR REPLACE MACRO"):
        assert part in r.stdout
    doc = json.loads(run("queries", "show", "step_timeline", "--json").stdout)
    assert doc["name"] == "step_timeline" and "max_segments" in doc["params"]
    r = run("queries", "show", "step_time")
    assert r.exit_code == 2 and "step_timeline" in r.stderr


def test_schema_from_sql_files_and_from_db(db):
    r = run("schema", "-f", "json")
    assert r.exit_code == 0
    rows = json.loads(r.stdout)
    assert {"object": "kernels", "kind": "table", "column": "start_ns",
            "doc": "Start on the job timeline (ns)."} in rows
    r = run("schema", db, "-f", "json")
    assert r.exit_code == 0
    rows = json.loads(r.stdout)
    k = next(x for x in rows if x["object"] == "kernels" and x["column"] == "start_ns")
    assert k["data_type"] == "BIGINT" and k["doc"] == "Start on the job timeline (ns)."


# ----------------------------------------------------------------------------------------------- summary


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_summary_text_and_json(db):
    r = run("summary", db)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("job: 8 rank(s) from 8 file(s) (kineto)")
    for line in ("communication:", "overlap with compute:", "exposed communication:", "worst collective:",
                 "point-to-point:", "stragglers:"):
        assert line in r.stdout
    r = run("summary", db, "--json")
    s = json.loads(r.stdout)
    from nsys2comm.summary import SUMMARY_KEYS

    assert list(s) == SUMMARY_KEYS and s["schema_version"] == 1 and s["ranks"] == 8 and s["ok"] is True


def _fake_summary(con, failed_files=None):
    from nsys2comm.summary import SCHEMA_VERSION, SUMMARY_KEYS

    s = {k: None for k in SUMMARY_KEYS}
    s.update(schema_version=SCHEMA_VERSION, nsys2comm_version=__version__, ranks=8, files=8, sources=["kineto"],
             gpu_busy_ns=10_000_000, comm_ns=4_000_000, comm_share_pct=40.0, overlap_pct=25.0,
             exposed_comm_ns=3_000_000, exposed_comm_pct=30.0, max_skew_ms=2.5,
             p2p={"small_msg_share_pct": 60.0, "small_msg_bytes": 65536, "alpha_us": 12.0, "beta_gbps": 20.0,
                  "n_ops": 10},
             stragglers=[{"rank": 3, "times_last": 5, "wait_ns": 100}], missing=[], thresholds=[], ok=True)
    return s


@pytest.mark.parametrize("opt,limit,code", [
    ("--max-exposed-comm-pct", "20", 3), ("--max-exposed-comm-pct", "35", 0),
    ("--min-overlap-pct", "50", 3), ("--min-overlap-pct", "10", 0),
    ("--max-small-p2p-pct", "50", 3), ("--max-small-p2p-pct", "70", 0),
    ("--max-skew-ms", "1", 3), ("--max-skew-ms", "5", 0),
])
def test_summary_thresholds_exit_3(db, monkeypatch, opt, limit, code):
    monkeypatch.setattr("nsys2comm.summary.build_summary", _fake_summary)
    r = run("summary", db, "--json", opt, limit)
    assert r.exit_code == code, r.output
    s = json.loads(r.stdout)  # the summary is printed either way
    assert s["ok"] is (code == 0) and s["thresholds"][0]["limit"] == float(limit)
    if code == 3:
        assert "threshold violated" in r.stderr


def test_summary_threshold_on_missing_metric_is_not_a_violation(db, monkeypatch):
    def no_data(con, failed_files=None):
        s = _fake_summary(con)
        s["max_skew_ms"] = None
        return s

    monkeypatch.setattr("nsys2comm.summary.build_summary", no_data)
    r = run("summary", db, "--max-skew-ms", "1")
    assert r.exit_code == 0 and "not evaluated" in r.stdout


def test_summary_subprocess_one_off_traces(proc):
    p = proc("summary", "fixtures/example", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ranks"] == 8


# ----------------------------------------------------------------------------------------------- report


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_report(db, tmp_path):
    out = tmp_path / "r.html"
    r = run("report", db, "-o", out)
    if r.exit_code == 1 and "report module is not available" in r.stderr:
        pytest.skip("report module not in this build yet")
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "cdn.jsdelivr" not in html
    assert run("report", db).exit_code == 2  # -o is required


def test_quickstart_command_as_subprocess(tmp_path, proc):
    """The README's first command, minus the set-up: one-off traces straight to a report."""
    p = proc("report", "fixtures/example", "-o", tmp_path / "report.html")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "report.html").stat().st_size > 10_000


# ----------------------------------------------------------------------------------------------- subprocess matrix


@pytest.mark.parametrize("args,code", [
    (["--version"], 0),
    (["queries", "list", "--format", "csv"], 0),
    (["queries", "show", "run_overview"], 0),
    (["schema", "--format", "tsv"], 0),
    (["query", "{db}", "run_overview", "--format", "jsonl"], 0),
    (["sql", "{db}", "SELECT count(*) AS n FROM ranks", "--format", "markdown"], 0),
    (["sql", "{db}", "DELETE FROM ranks"], 1),
    (["summary", "{db}"], 0),
    (["query", "{db}", "run_overview", "--format", "parquet"], 2),
    (["frobnicate"], 2),
])
def test_subprocess(db, args, code, proc):
    p = proc(*[a.replace("{db}", str(db)) for a in args])
    assert p.returncode == code, p.stderr
    if code == 0 and args[0] != "--version":
        assert p.stdout.strip()
    if code == 1:
        assert p.stderr.startswith("Error: ")


def test_sql_stdin_subprocess(db, proc):
    p = proc("sql", db, "-", "--format", "csv", input="SELECT count(*) AS n FROM files")
    assert p.returncode == 0 and p.stdout == "n\n8\n"


@pytest.mark.subprocess  # tier: subprocess (runs the installed console script)
def test_console_script_entry_point():
    from importlib.metadata import PackageNotFoundError, entry_points

    try:
        eps = [e for e in entry_points(group="console_scripts") if e.name == "nsys2comm"]
    except PackageNotFoundError:  # pragma: no cover
        eps = []
    if not eps:
        import tomllib

        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        assert scripts["nsys2comm"] == "nsys2comm.cli:main"
    else:
        assert eps[0].value == "nsys2comm.cli:main"
    exe = shutil.which("nsys2comm")
    if exe:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stdout.strip() == f"nsys2comm {__version__}"


def test_bundled_example_is_intact():
    assert len(EXAMPLE_FILES) == 8 and (EXAMPLE / "README.md").is_file()
    for f in EXAMPLE_FILES:
        with gzip.open(f) as g:
            assert g.read(64).lstrip().startswith(b"{")


# ----------------------------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize("value", ["abc", "nan", "-3", "2.5", "true", "inf"])
def test_bad_count_parameter_is_a_one_line_usage_error(db, value):
    r = run("query", db, "step_timeline", "-p", f"max_segments={value}")
    assert r.exit_code == 2, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and "max_segments" in r.stderr
    assert "Binder Error" not in r.stderr and "Conversion Error" not in r.stderr


def test_bad_parameter_values_name_the_parameter(db):
    r = run("query", db, "overlap_by_rank", "-p", "compat=bogus")
    assert r.exit_code == 2 and "compat" in r.stderr and "'hta'" in r.stderr
    r = run("query", db, "step_timeline", "-p", "pick_step=abc")  # caught from DuckDB's cast, still named
    assert r.exit_code == 2 and "pick_step" in r.stderr and "Conversion Error" not in r.stderr
    r = run("query", db, "step_timeline", "-p", "max_segments=3.0", "-f", "json")  # a whole float is a count
    assert r.exit_code == 0, r.output


def test_interval_helpers_are_refused_up_front_with_how_to_use_them(db):
    for name in [o.name for o in __import__("nsys2comm").catalog.public_queries() if o.required_params]:
        r = run("query", db, name)
        assert r.exit_code == 2, name
        assert f"nsys2comm queries show {name}" in r.stderr and "Binder" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_misspelled_names_get_did_you_mean(db):
    r = run("query", db, "overlap_by_rnk")
    assert r.exit_code == 2 and "did you mean overlap_by_rank" in r.stderr and "queries list" in r.stderr
    r = run("queries", "show", "step_timelin")
    assert r.exit_code == 2 and "did you mean step_timeline" in r.stderr


def test_format_contradicting_the_output_extension_is_a_usage_error(db, tmp_path):
    out = tmp_path / "x.json"
    r = run("query", db, "run_overview", "-f", "csv", "-o", out)
    assert r.exit_code == 2 and "contradicts" in r.stderr and not out.exists()
    r = run("sql", db, "SELECT 1 AS a", "-f", "json", "-o", tmp_path / "x.csv")
    assert r.exit_code == 2


def test_api_query_errors_do_not_mention_cli_flags(db):
    from nsys2comm.errors import UsageError

    with Job.open(db) as job:
        for name, params in [("overlap_by_rnk", {}), ("intervals_union", {}), ("step_timeline", {"max_segments": -1}),
                             ("step_timeline", {"max_segments": "abc"}), ("step_timeline", {"bogus": 1}),
                             ("run_overview", {"x": 1})]:
            with pytest.raises(UsageError) as e:
                job.query(name, **params)
            line = e.value.line()
            assert "nsys2comm" not in line and " -p" not in line and "--" not in line, line


# ----------------------------------------------------------------------------------------------- time units


def test_timeunit_converts_and_renames_ns_columns(db):
    plain = json.loads(run("query", db, "overlap_by_rank", "-f", "json").stdout)
    r = run("query", db, "overlap_by_rank", "-f", "json", "--timeunit", "ms")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert not any(k.endswith("_ns") for k in rows[0]) and "span_ms" in rows[0]
    assert rows[0]["span_ms"] == plain[0]["span_ns"] / 1e6
    # a unit other than ns: timestamps count from the job start (an epoch in ms would be float noise)
    assert rows[0]["span_start_ms"] == round((plain[0]["span_start_ns"] - start_ns(db)) / 1e6, 6)
    assert "timestamps in ms from the job start" in r.stderr


def start_ns(db) -> int:
    """The job start, recomputed: the earliest start in the canonical tables."""
    first = " UNION ALL ".join(f"SELECT min(start_ns) AS t FROM {t}" for t in ("kernels", "mem_ops", "api_calls",
                                                                               "cpu_ranges"))
    return json.loads(run("sql", db, f"SELECT min(t) AS t FROM ({first})", "-f", "json").stdout)[0]["t"]


def test_relative_counts_timestamps_from_the_job_start(db):
    first = " UNION ALL ".join(f"SELECT min(start_ns) AS t FROM {t}" for t in ("kernels", "mem_ops", "api_calls",
                                                                               "cpu_ranges"))
    start = start_ns(db)
    plain = json.loads(run("query", db, "overlap_by_rank", "-f", "json").stdout)
    r = run("query", db, "overlap_by_rank", "-f", "json", "--relative")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert rows[0]["span_start_ns"] == plain[0]["span_start_ns"] - start  # integer ns, shifted
    assert rows[0]["span_ns"] == plain[0]["span_ns"]  # a duration: unchanged
    assert min(row["span_start_ns"] for row in rows) >= 0
    r = run("sql", db, f"SELECT min(t) AS start_ns FROM ({first})", "-f", "csv", "--relative", "--timeunit", "us")
    assert r.stdout == "start_us\n0.0\n"


def test_default_output_keeps_integer_ns(db):
    rows = json.loads(run("query", db, "overlap_by_rank", "-f", "json").stdout)
    assert isinstance(rows[0]["span_start_ns"], int) and rows[0]["span_start_ns"] > 10**18


# ----------------------------------------------------------------------------------------------- help, completion


def _help_pages() -> list[list[str]]:
    return [[]] + [c.split() for c in COMMANDS] + [["queries"]]


@pytest.mark.parametrize("cmd", _help_pages(), ids=lambda c: " ".join(c) or "nsys2comm")
def test_help_shows_no_python_type_names(cmd):
    import re

    r = CliRunner().invoke(app, [*cmd, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert not re.search(r"<(bool|int|float|str|list\[|file|path|dir|int range|float range)", r.stdout), r.stdout


def test_shell_completion_is_available(monkeypatch):
    r = run("--help")
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout
    # with shellingham, typer detects the shell from the process tree (none under a background or CI runner);
    # with detection off, the shell is the option's value
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    r = run("--show-completion", "bash")
    assert r.exit_code == 0 and "_nsys2comm_completion" in r.stdout, (r.exit_code, r.output, repr(r.exception))
    env = {"_NSYS2COMM_COMPLETE": "complete_bash", "COMP_WORDS": "nsys2comm que", "COMP_CWORD": "1"}
    r = CliRunner().invoke(app, [], prog_name="nsys2comm", env=env)
    assert r.stdout.split() == ["query", "queries"]
