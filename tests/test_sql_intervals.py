"""Interval helpers (queries/intervals): inline-VALUES edge cases and property tests against brute force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)


def _load(con, name, rows, probe=False):
    cols = "grp, probe_id, start_ns, end_ns" if probe else "grp, start_ns, end_ns"
    types = "INTEGER, BIGINT, BIGINT, BIGINT" if probe else "INTEGER, BIGINT, BIGINT"
    col_defs = ", ".join(f"{c} {t}" for c, t in zip(cols.split(", "), types.split(", "), strict=False))
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({col_defs})")
    if rows:
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(cols.split(', ')))})", rows)


def _covered_points(rows):
    pts = {}
    for g, s, e in rows:
        for t in range(s, e):
            pts.setdefault(g, set()).add(t)
    return pts


def test_union_edge_cases(con):
    # zero length, identical timestamps, nesting, touching, negative length (after rounding)
    out = con.execute("""
        WITH t(grp, start_ns, end_ns) AS (VALUES (1, 10, 10), (1, 0, 5), (1, 0, 5), (1, 1, 3), (1, 5, 8),
                                                  (1, 20, 15), (1, 30, 40), (2, 7, 7))
        SELECT * FROM intervals_union('t')""").fetchall()
    assert out == [(1, 0, 8), (1, 30, 40)]


def test_union_length_and_intersection_values(con):
    out = con.execute("""
        WITH a(grp, start_ns, end_ns) AS (VALUES (1, 0, 10), (1, 5, 20), (1, 20, 25), (1, 30, 30), (1, 40, 35),
                (2, 0, 5)),
             b(grp, start_ns, end_ns) AS (VALUES (1, 3, 8), (1, 22, 50), (1, 22, 50), (2, 10, 20))
        SELECT * FROM intervals_intersect_length('a', 'b')""").fetchall()
    assert out == [(1, 25, 8, 17), (2, 5, 0, 5)]
    assert con.execute("WITH a(grp, start_ns, end_ns) AS (VALUES (1, 0, 10), (1, 2, 4)) "
                       "SELECT * FROM intervals_union_length('a')").fetchall() == [(1, 10)]


def test_covered_edge_cases(con):
    out = con.execute("""
        WITH c(grp, start_ns, end_ns) AS (VALUES (1, 10, 20), (1, 30, 40)),
             p(grp, probe_id, start_ns, end_ns) AS (VALUES (1, 1, 0, 100), (1, 2, 15, 15), (1, 3, 15, 35),
                (1, 4, 20, 30), (1, 5, 50, 40), (1, 6, 0, 5), (2, 7, 0, 100))
        SELECT probe_id, covered_ns FROM intervals_covered_ns('c', 'p')""").fetchall()
    assert out == [(1, 20), (2, 0), (3, 10), (4, 0), (5, 0), (6, 0), (7, 0)]


def test_empty_inputs(con):
    _load(con, "ea", [])
    _load(con, "ep", [], probe=True)
    assert con.execute("SELECT * FROM intervals_union('ea')").fetchall() == []
    assert con.execute("SELECT * FROM intervals_covered_ns('ea', 'ep')").fetchall() == []


ivl = st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(-5, 25)).map(lambda t: (t[0], t[1], t[1] + t[2]))


@settings(max_examples=examples(60), deadline=None)
@given(a=st.lists(ivl, max_size=25), b=st.lists(ivl, max_size=25))
def test_properties_against_brute_force(con, a, b):
    _load(con, "pa", a)
    _load(con, "pb", b)
    pa, pb = _covered_points(a), _covered_points(b)
    got_union = dict(con.execute("SELECT grp, union_ns FROM intervals_union_length('pa')").fetchall())
    assert got_union == {g: len(p) for g, p in pa.items() if p}
    got = {g: (a_ns, i_ns, x_ns) for g, a_ns, i_ns, x_ns in
           con.execute("SELECT * FROM intervals_intersect_length('pa', 'pb')").fetchall()}
    want = {g: (len(p), len(p & pb.get(g, set())), len(p - pb.get(g, set()))) for g, p in pa.items() if p}
    assert got == want
    probes = [(g, i, s, e) for i, (g, s, e) in enumerate(b)]
    _load(con, "pp", probes, probe=True)
    cov = dict(con.execute("SELECT probe_id, covered_ns FROM intervals_covered_ns('pa', 'pp')").fetchall())
    for g, i, s, e in probes:
        assert cov[i] == len(set(range(s, e)) & pa.get(g, set()))
    # islands are disjoint, sorted and non-touching
    isl = con.execute("SELECT grp, start_ns, end_ns FROM intervals_union('pa')").fetchall()
    for (g1, _, e1), (g2, s2, _) in zip(isl, isl[1:], strict=False):
        assert g1 < g2 or s2 > e1
