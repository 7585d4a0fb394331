"""Rows without polars (``nsys2comm.output.Rows``, what ``nsys2comm query`` writes from in a fresh process) give
the same bytes as the polars frame of the same rows, in every text format, with the same percentage rounding and
``--columns`` choice."""

from __future__ import annotations

import math

import duckdb
import polars as pl
import pytest
import synth_db
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiers import examples

from fixtures import synthetic as syn
from nsys2comm import analysis, catalog, output
from nsys2comm.storage import snapshotted

TEXT_FORMATS = ("csv", "tsv", "json", "jsonl", "markdown", "table")


def _both(rel_sql: str, con: duckdb.DuckDBPyConnection, max_rows: int = 10**9) -> tuple[output.Rows, pl.DataFrame]:
    rows = output.fetch_rows(con.sql(rel_sql), max_rows=max_rows)
    assert rows is not None, rel_sql
    return rows, analysis.rows_frame(con.sql(rel_sql))


def _assert_same_bytes(rows: output.Rows, df: pl.DataFrame, what: str, keys: list[str] | None = None) -> None:
    rows, df = rows.round_percentages(), output.round_percentages(output.exact_integers(df))
    assert rows.columns == df.columns and rows.height == df.height, what
    for fmt in TEXT_FORMATS:
        assert output.render(rows, fmt) == output.render(df, fmt), (what, fmt)
    for width in (40, 80, 200):  # a terminal: the key columns first, records when they do not fit
        for exact in (False, True):
            assert (output.render_table(rows, width=width, keys=keys, exact=exact)
                    == output.render_table(df, width=width, keys=keys, exact=exact)), (what, width, exact)
    if rows.columns:
        pick = list(reversed(rows.columns))[:3]
        assert (output.render(output.select_columns(rows, pick), "csv")
                == output.render(output.select_columns(df, pick), "csv")), what


# tier 2: values at the edges of every writer (exponent-prone floats, NaN/inf/-0.0, text that must be quoted,
# empty text beside NULL, nested values), through DuckDB as a query's rows reach the CLI, against the polars frame
_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e6, max_value=1e6).map(lambda v: round(v, 3)),
    st.sampled_from([0.0, -0.0, 1e-5, 9.99e-5, 1e-4, 0.125, 2.5, 0.05, 99.95, 1e15, 9.99e14, 1e16, 5e-324]),
    st.none(),
)
_TEXT = st.one_of(st.none(), st.text(max_size=12),
                  st.sampled_from(["", " ", "a,b", 'a"b', "a\nb", "a\rb", "a\tb", "x|y", "é", "ncclKernel_…"]))
_ROW = st.tuples(
    st.one_of(st.none(), st.integers(min_value=-2**63, max_value=2**63 - 1)),
    _FLOATS, _FLOATS, _FLOATS, _TEXT, st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.lists(st.integers(min_value=-2**31, max_value=2**31 - 1), max_size=3)),
    st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 7), st.integers(-10**12, 10**12)), max_size=2)),
)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ROW, max_size=6))
def test_rows_and_frames_write_the_same_bytes(data):
    con = duckdb.connect()
    con.execute('CREATE TABLE t (rank BIGINT, busbw_pct DOUBLE, span_us DOUBLE, "v,a""l" DOUBLE, kernel VARCHAR, '
                'ok BOOLEAN, members INTEGER[], rank_wait_ns STRUCT(rank INTEGER, wait_ns BIGINT)[])')
    for r in data:
        waits = None if r[7] is None else [{"rank": a, "wait_ns": b} for a, b in r[7]]
        con.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [*r[:7], waits])
    rows, df = _both("SELECT * FROM t", con)
    _assert_same_bytes(rows, df, "values", keys=["kernel", "rank"])


# tier 2: the percentage rounding is polars' (half to even on v * 10**d), not Python's round
@pytest.mark.parametrize("v", [0.05, 0.15, 0.25, 2.675, 1.005, 7852.505, -72.8895, -0.04, 1e300, 5e-324, math.inf])
def test_round_like_polars(v):
    for d in (0, 1, 2, 3):
        want = pl.Series([v]).round(d).item()
        got = output.round_like_polars(v, d)
        assert got == want and math.copysign(1, got) == math.copysign(1, want), (v, d)


# tier 2: what the plain writers do not cover goes through polars (fetch_rows says None)
@pytest.mark.parametrize("sql", ["SELECT 1::HUGEINT AS n", "SELECT 1.5::DECIMAL(5,2) AS d",
                                 "SELECT DATE '2024-01-01' d", "SELECT 1 AS a, 2 AS a",
                                 "SELECT [1.5::DECIMAL(5,2)] AS l", "SELECT * FROM range(11) t(n)"])
def test_fetch_rows_declines_what_only_polars_writes(sql):
    assert output.fetch_rows(duckdb.connect().sql(sql), max_rows=10) is None


# tier 2: a result past max_rows runs once and comes back as the frame the polars path gives (nested kinds included)
@pytest.mark.parametrize("n", [10, 11, 25])
def test_a_large_result_runs_once_and_gives_the_polars_frame(n):
    con = duckdb.connect()
    sql = ("SELECT i, i / 3 AS f, 'x' || i AS s, [i, NULL] AS l, {'a': i, 'b': NULL::VARCHAR} AS st, i % 2 = 0 AS b, "
           "i::UTINYINT AS u FROM range($n) t(i) ORDER BY i DESC")
    runs = []

    def run():
        runs.append(1)
        return con.execute(sql, {"n": n})

    got = output.fetch_rows(con.sql(sql, params={"n": n}), max_rows=10, run=run)
    want = analysis.rows_frame(con.sql(sql, params={"n": n}))
    assert runs == [1]
    if n <= 10:
        assert isinstance(got, output.Rows) and got.height == n
    else:
        assert isinstance(got, pl.DataFrame) and got.schema == want.schema and got.equals(want)


# tier 3: every public catalog query on the synthetic job (and on an empty one), as `nsys2comm query` writes it
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("job", ["synthetic", "empty"])
def test_every_catalog_query_writes_the_same_bytes_without_polars(job):
    con = synth_db.build(syn.make_run()) if job == "synthetic" else synth_db.catalog_db()
    covered = 0
    with snapshotted(con):  # each sweep computed once, not once per query (the writers are under test)
        for obj in catalog.public_queries():
            if obj.area == "intervals" or obj.required_params or obj.kind not in ("view", "macro"):
                continue
            sql = f"SELECT * FROM {obj.name}" + ("()" if obj.kind == "macro" else "")
            rows = output.fetch_rows(con.sql(sql), max_rows=10**9)
            if rows is None:
                continue  # a type only polars writes (DECIMAL): the CLI takes the polars path
            _assert_same_bytes(rows, analysis.rows_frame(con.sql(sql)), obj.name, keys=obj.key_columns)
            covered += 1
    assert covered >= 30
