"""Tables that fit (issue 41): every public catalog object rendered at 60, 80 and 120 columns through the CLI
(in-process, typer's CliRunner, with the terminal width set), ``--columns``, and the one time rule in every format.

Uses the bundled example (fixtures/example: the 8-rank DLRM Kineto traces), ingested once per module.
"""

# tier 3: golden properties of the CLI's rendering on the bundled example job (a fixture built by code is not
# needed: the example is in the repository)

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nsys2comm import Job, catalog
from nsys2comm import output as out_
from nsys2comm.cli import _open as cli_open
from nsys2comm.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_FILES = sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))
WIDTHS = [60, 80, 120]
# what `nsys2comm query` runs: public objects with no required parameter
RUNNABLE = [o for o in catalog.public_queries() if o.is_table_macro and not o.required_params]
EXPONENT = re.compile(r"\d[eE][+-]?\d")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("widths") / "run.duckdb"
    Job.ingest(EXAMPLE_FILES, db=path, jobs=1).close()
    return path


_ROWS: dict[tuple, object] = {}
_query = Job.query
_close = Job.close
_OPEN: dict[str, Job] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_shared_jobs():
    yield
    for job in _OPEN.values():
        _close(job)
    _OPEN.clear()


def _open_once(sources, **kw):
    """The CLI's ``_open`` for one database: one open job per module (opening is not under test here)."""
    if len(sources) != 1 or not str(sources[0]).endswith(".duckdb"):
        return cli_open(sources, **kw)
    if sources[0] not in _OPEN:
        _OPEN[sources[0]] = Job.open(sources[0])
    return _OPEN[sources[0]]


def _cached_query(self, name, **params):
    """Each catalog query runs once per module (the rendering, not the analysis, is under test here)."""
    key = (self.path, name, tuple(sorted(params.items())))
    if key not in _ROWS:
        _ROWS[key] = _query(self, name, **params)
    return _ROWS[key]


def run(*args, width: int | None = None, monkeypatch=None, shared: bool = True):
    """The CLI in-process; with ``width``, stdout is a terminal that wide (``output._terminal_width``). With a
    ``monkeypatch``, each query runs once and (``shared``) the database is opened once per module."""
    from nsys2comm import cli

    if width is not None:
        monkeypatch.setattr(out_, "_terminal_width", lambda stream: width)
    if monkeypatch is not None:
        monkeypatch.setattr(Job, "query", _cached_query)
        if shared:
            monkeypatch.setattr(cli, "_open", _open_once)
            monkeypatch.setattr(Job, "close", lambda self: None)
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def _header_and_records(text: str) -> tuple[str, list[dict[str, str]]]:
    """('grid', []) or ('records', [{name: value}]) of a table's text (the time note lines dropped)."""
    lines = [ln for ln in text.splitlines() if not ln.startswith("# ")]
    if lines and lines[0].startswith("-[ no rows ]"):
        return "records", [dict.fromkeys(lines[1:], "")]
    if not lines or not lines[0].startswith("-[ row "):
        return "grid", []
    recs: list[dict[str, str]] = []
    last = None
    for ln in lines:
        if ln.startswith("-[ row "):
            recs.append({})
            continue
        m = re.match(r"^(\S+)(?:\s{2,}(.*))?$", ln)
        if m and not ln.startswith(" "):
            last = m.group(1)
            recs[-1][last] = m.group(2) or ""
        elif last is not None:  # a wrapped text value, or a number below its name
            recs[-1][last] = (recs[-1][last] + " " + ln.strip()).strip()
    return "records", recs


def _number_cells(db: Path, name: str, columns: list[str], limit: int = 25) -> list[str]:
    """The table's text of the numbers in ``columns`` (first rows), as the output layer writes them."""
    with Job.open(db) as job:
        df = _cached_query(job, name).head(limit)
    df = out_.round_percentages(df)
    cells = []
    for c in columns:
        if c in df.columns and df.schema[c].is_numeric():
            places = out_._unit_places(c) if df.schema[c].is_float() else None
            cells += [out_._cell_text(v, for_table=True, places=places) for v in df[c].to_list()
                      if v is not None and not (isinstance(v, float) and v != v)]
    return cells


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("obj", RUNNABLE, ids=lambda o: o.name)
def test_every_object_fits_and_shows_its_key_columns(db, obj, width, monkeypatch):
    r = run("query", db, obj.name, width=width, monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    text = r.stdout
    assert all(len(line) <= width for line in text.splitlines()), f"{obj.name}: wider than {width}"
    mode, recs = _header_and_records(text)
    keys = obj.key_columns
    if mode == "grid":
        header = text.splitlines()[0].split()
        assert header[:len(keys)] == keys or header == list(obj.columns), (obj.name, header)
        for k in keys:
            assert k in header
        numbers = _number_cells(db, obj.name, keys)
        for cell in numbers:  # each number whole on one line, never cut or folded
            assert re.search(r"(?<![\w.-])" + re.escape(cell) + r"(?![\w.])", text), (obj.name, cell)
        assert "…" not in " ".join(numbers)
    else:
        assert "one record per row" in r.stderr
        assert recs and all(list(rec)[:len(keys)] == keys for rec in recs), obj.name
        numbers = _number_cells(db, obj.name, keys)
        values = {v for rec in recs for v in rec.values()}
        assert set(numbers) <= values, (obj.name, set(numbers) - values)
    if "not shown" in r.stderr:  # what was left out is said, and never a key column
        left = r.stderr.split("wide): ")[1].split(";")[0].split(", ")
        assert not set(left) & set(keys)


@pytest.mark.parametrize("width", WIDTHS)
def test_columns_selects_exactly_what_was_asked(db, width, monkeypatch):
    obj = catalog.find("collective_bandwidth")
    asked = ["busbw_gbps", "collective", "peak_source", "total_ns"]  # any order, key or not
    r = run("query", db, obj.name, "-c", ",".join(asked), width=width, monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    mode, recs = _header_and_records(r.stdout)
    if mode == "grid":
        assert r.stdout.splitlines()[0].split() == asked
    else:
        assert all(list(rec) == asked for rec in recs)
    assert "not shown" not in r.stderr
    rows = json.loads(run("query", db, obj.name, "--columns", ",".join(asked), "-f", "json").stdout)
    assert rows and all(list(row) == asked for row in rows)


def test_columns_a_narrow_terminal_cannot_hold_become_records(db, monkeypatch):
    asked = ["collective", "bandwidth_basis", "peak_assumes_one_host", "busbw_incl_wait_gbps", "headline_busbw_gbps"]
    r = run("query", db, "collective_bandwidth", "-c", ",".join(asked), width=60, monkeypatch=monkeypatch)
    mode, recs = _header_and_records(r.stdout)
    assert mode == "records" and all(list(rec) == asked for rec in recs)
    assert max(map(len, r.stdout.splitlines())) <= 60


def test_columns_unknown_name_is_a_one_line_error_listing_the_valid_ones(db):
    r = run("query", db, "rank_wait", "--columns", "rank,busbw")
    assert r.exit_code == 2
    err = r.stderr.strip()
    assert "busbw" in err and "rank,collectives,total_wait_ns" in err and len(err.splitlines()) <= 2
    r = run("query", db, "rank_wait", "-c", "rank,rank")
    assert r.exit_code == 2 and "twice" in r.stderr


def test_columns_name_a_time_column_in_any_unit(db):
    a = json.loads(run("query", db, "rank_wait", "-c", "rank,total_wait_ns", "--timeunit", "ms", "-f", "json").stdout)
    b = json.loads(run("query", db, "rank_wait", "-c", "rank,total_wait_ms", "--timeunit", "ms", "-f", "json").stdout)
    assert a == b and list(a[0]) == ["rank", "total_wait_ms"]


@pytest.mark.parametrize("cmd", [["sql", "{db}", "SELECT * FROM rank_wait"], ["schema", "{db}"], ["schema"],
                                 ["queries", "list"]])
def test_other_commands_take_columns(db, cmd):
    args = [a.format(db=db) for a in cmd]
    first = json.loads(run(*args, "-f", "json").stdout)[0]
    pick = [list(first)[-1], list(first)[0]]
    rows = json.loads(run(*args, "-c", ",".join(pick), "-f", "json").stdout)
    assert all(list(row) == pick for row in rows)


def test_sql_of_a_catalog_view_uses_its_key_columns(db, monkeypatch):
    r = run("sql", db, "SELECT * FROM latency_model", width=80, monkeypatch=monkeypatch)
    assert r.stdout.splitlines()[0].split()[:len(catalog.find("latency_model").key_columns)] == \
        catalog.find("latency_model").key_columns


@pytest.mark.parametrize("width", WIDTHS)
def test_schema_keeps_doc_and_queries_list_wraps_descriptions(db, width, monkeypatch):
    r = run("schema", db, width=width, monkeypatch=monkeypatch)
    assert r.exit_code == 0 and all(len(line) <= width for line in r.stdout.splitlines())
    mode, recs = _header_and_records(r.stdout)
    assert ("doc" in r.stdout.splitlines()[0].split()) if mode == "grid" else all("doc" in rec for rec in recs)
    r = run("queries", "list", width=width, monkeypatch=monkeypatch)
    assert all(len(line) <= width for line in r.stdout.splitlines()) and "…" not in r.stdout
    mode, recs = _header_and_records(r.stdout)
    wanted = json.loads(run("queries", "list", "-f", "json").stdout)
    if mode == "records":
        shown = ["".join(rec["description"].split()) for rec in recs]
    else:  # the description column, its wrapped lines joined (a word longer than the column folds)
        lines = r.stdout.splitlines()
        at = lines[0].index("description")
        shown = ["".join("".join(ln[at:] for ln in lines[1:]).split())]
    for row in wanted:  # every description whole (wrapped, never cut)
        assert any("".join(row["description"].split()) in text for text in shown), row["name"]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("width", WIDTHS)
def test_diff_shows_delta_delta_pct_and_impact_first(db, width, monkeypatch):
    r = run("diff", db, db, width=width, monkeypatch=monkeypatch, shared=False)
    assert r.exit_code == 0, r.output
    mode, recs = _header_and_records(r.stdout)
    lead = ["metric", "key", "delta", "delta_pct", "impact_ns"]
    if mode == "grid":
        assert r.stdout.splitlines()[0].split()[:5] == lead
    else:
        assert all(list(rec)[:5] == lead for rec in recs)
    assert all(len(line) <= width for line in r.stdout.splitlines())


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_diff_timeunit_converts_time_rows_only(db):
    ns = json.loads(run("diff", db, db, "-f", "json").stdout)
    ms = json.loads(run("diff", db, db, "-f", "json", "--timeunit", "ms").stdout)
    assert [r["metric"] for r in ms] == [re.sub(r"_ns(_per_\w+)?$", r"_ms\1", r["metric"]) for r in ns]
    for a, b in zip(ns, ms, strict=True):
        assert "impact_ms" in b and "impact_ns" not in b
        if a["metric"] != b["metric"] and a["base"] is not None:  # a time row: in ms, to the ns
            assert b["base"] == round(a["base"] / 1e6, 6)
        elif a["metric"] == b["metric"]:  # busbw_gbps, *_pct, ops ...: unchanged
            assert b["base"] == a["base"] and b["delta_pct"] == a["delta_pct"]
    assert all(r["delta_pct"] is None or r["delta_pct"] == round(r["delta_pct"], 1) for r in ns)  # as the summary
    r = run("diff", db, db, "--json", "--timeunit", "ms")
    assert r.exit_code == 2


# ------------------------------------------------------------------------------------------------- time units


@pytest.mark.parametrize("unit", ["us", "ms", "s"])
@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_timeunit_in_every_format_no_exponent_no_float_noise(db, unit, fmt, monkeypatch):
    r = run("query", db, "comm_kernels", "--timeunit", unit, "-f", fmt, width=120 if fmt == "table" else None,
            monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    assert not EXPONENT.search(r.stdout), f"exponent form in {fmt}"
    places = out_.unit_decimals(unit)
    if fmt == "table":
        assert r.stdout.startswith(f"# timestamps in {unit} from the job start")
        return
    assert f"timestamps in {unit} from the job start" in r.stderr
    rows = (list(csv.DictReader(io.StringIO(r.stdout))) if fmt == "csv" else json.loads(r.stdout))
    texts = ({k: v for k, v in row.items()} for row in rows) if fmt == "csv" else \
        ({k: json.dumps(v) for k, v in row.items()} for row in rows)
    for row in texts:
        for k, v in row.items():
            if k.endswith("_" + unit) and v not in ("", "null"):
                assert len(v.split(".")[1]) <= places if "." in v else True, (k, v)  # to the ns, no more
            if k.endswith("_pct") and v not in ("", "null"):
                assert len(v.split(".")[1]) <= 1 if "." in v else True, (k, v)
    first = rows[0]
    start = float(first["start_" + unit])
    assert 0 <= start < 60 * out_.NS_PER_UNIT["s"] / out_.NS_PER_UNIT[unit]  # from the job start, not the epoch


def test_default_and_ns_keep_integer_epoch_ns(db):
    rows = json.loads(run("query", db, "comm_kernels", "-f", "json").stdout)
    assert isinstance(rows[0]["start_ns"], int) and rows[0]["start_ns"] > 10**18
    ns = json.loads(run("query", db, "comm_kernels", "-f", "json", "--timeunit", "ns").stdout)
    assert ns[0]["start_ns"] == rows[0]["start_ns"]


def test_floats_are_never_written_in_exponent_form():
    import polars as pl

    df = pl.DataFrame({"tiny_s": [5e-9, None], "big": [1e16, 2.5], "p": [1e-300, 0.5]})
    for fmt in ("csv", "json", "jsonl", "tsv"):
        text = out_.render(df, fmt).decode()
        assert "0.000000005" in text and "10000000000000000" in text
        assert "1e-300" in text or "1e-300" in text.replace("E", "e")  # 300 zeros would be no clearer
    assert json.loads(out_.render(df, "json"))[0]["tiny_s"] == 5e-9  # still a JSON number
    text, _ = out_.render_table(df)
    assert "0.000000005" in text and "10000000000000000" in text


def test_api_sql_integer_sums_are_int64(db):
    with Job.open(db) as job:
        df = job.sql("SELECT sum(end_ns - start_ns) AS busy_ns, sum(1.5) AS x FROM kernels")
        total = job.con.sql("SELECT sum(end_ns - start_ns)::BIGINT FROM kernels").fetchall()[0][0]
    assert str(df.schema["busy_ns"]) == "Int64" and df["busy_ns"][0] == total
    assert str(df.schema["x"]).startswith("Decimal")  # not integral: left as DuckDB gave it
