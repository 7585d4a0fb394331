"""A refresh after an ingest computes the per-rank sweeps of the ranks that changed only (issue 37 item 2): which
ranks it picks (``sweeps.changed_scope``), that the key it writes is the readers' ``content_key``, and that after
every added trace, in any order, every stored sweep equals a fresh computation over the same rows."""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiers import examples

from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import write_large_nsys
from fixtures.synthetic import make_run
from nsys2comm.ingest import ingest
from nsys2comm.ingest.base import ID_SHIFT
from nsys2comm.storage import db, sweeps


def _p(n: int, h: int = 1, stray: int = 0) -> tuple[int, int, int]:
    return (n, h, stray)


# tier 2: the scope on hand-made parts, against what each case must give
OLD = {("files", 1, None): _p(1), ("kernels", 1, 0): _p(5), ("ranks", 1, 0): _p(1),
       ("files", 2, None): _p(1), ("kernels", 2, 1): _p(5), ("kernels", 2, 2): _p(7), ("ranks", 2, 1): _p(1),
       ("ranks", 2, 2): _p(1), ("ingest_notes", 2, None): _p(1)}


def test_an_added_file_is_its_ranks_only():
    new = OLD | {("files", 3, None): _p(1), ("kernels", 3, 5): _p(9), ("ranks", 3, 5): _p(1)}
    assert sweeps.changed_scope(OLD, new) == sweeps.Scope((5,), (3,))


def test_a_changed_rank_brings_every_rank_of_its_file():
    new = OLD | {("kernels", 2, 2): _p(6, 4)}  # rank 2 of file 2, which also holds rank 1
    assert sweeps.changed_scope(OLD, new) == sweeps.Scope((1, 2), (2,))
    gone = {k: v for k, v in OLD.items() if k != ("kernels", 2, 1)}  # every kernel of rank 1 deleted
    assert sweeps.changed_scope(OLD, gone) == sweeps.Scope((1, 2), (2,))
    notes = OLD | {("ingest_notes", 2, None): _p(2, 9)}  # a row of no rank: its file's ranks
    assert sweeps.changed_scope(OLD, notes) == sweeps.Scope((1, 2), (2,))


def test_a_rank_moved_to_another_file_brings_both_files():
    new = {k: v for k, v in OLD.items() if k != ("kernels", 1, 0)} | {("kernels", 2, 0): _p(5)}
    assert sweeps.changed_scope(OLD, new) is None  # ranks 0, 1, 2 and files 1, 2: everything, one full refresh
    three = OLD | {("files", 3, None): _p(1), ("kernels", 3, 7): _p(1), ("ranks", 3, 7): _p(1)}
    moved = {k: v for k, v in three.items() if k != ("kernels", 3, 7)} | {("kernels", 1, 7): _p(1)}
    assert sweeps.changed_scope(three, moved) == sweeps.Scope((0, 7), (1, 3))


def test_a_full_refresh_where_the_parts_cannot_tell():
    new = OLD | {("files", 3, None): _p(1), ("kernels", 3, 5): _p(9)}
    assert sweeps.changed_scope(None, new) is None  # no stored parts
    assert sweeps.changed_scope(OLD, OLD) is None  # nothing changed, yet the key differs: another catalog
    assert sweeps.changed_scope(OLD, new | {("kernels", 1, 0): _p(5, 1, 1)}) is None  # a kernel id of another file
    assert sweeps.changed_scope(OLD | {("kernels", 1, 0): _p(5, 1, 1)}, new) is None
    assert sweeps.changed_scope(OLD, new | {("files", None, None): _p(1)}) is None  # a row without a file


def test_id_shift_is_the_writers():
    assert sweeps.ID_SHIFT == ID_SHIFT


def test_per_rank_sweeps_are_refreshed_by_rank():
    assert set(sweeps.rank_scoped_sweeps()) == set(sweeps.PER_RANK_SWEEPS)  # today every one of them


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list[tuple[Path, int | None]]:
    """Three Kineto ranks (0-2, one file each) and an nsys export holding two processes, ingested as ranks 10-11."""
    d = tmp_path_factory.mktemp("incr")
    kineto = [(p, None) for p in write_kineto(make_run(world_size=3, steps=2), d, style="new")]
    return kineto + [(write_large_nsys(d / "two.sqlite", n_kernels=400, n_ranks=2), 10)]


def _differing_sweeps(con) -> list[str]:
    """Stored sweeps that differ (as multisets) from the live helpers (a writable session computes live) on the same
    rows; the stored key matches them."""
    assert sweeps._stored_key(con) == sweeps.content_key(con)
    return [v for v in sweeps.SWEEPS if con.execute(
        f"SELECT count(*) FROM ((SELECT * FROM _cache{v} EXCEPT ALL SELECT * FROM {v}) UNION ALL "
        f"(SELECT * FROM {v} EXCEPT ALL SELECT * FROM _cache{v}))").fetchall()[0][0]]


# tier 2: the key the writer builds from its parts is the one readers count
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_the_key_from_the_parts_is_content_key(tmp_path, traces):
    path = tmp_path / "job.duckdb"
    con = db.connect(path, write=True)
    try:
        ingest(con, [p for p, r in traces if r is None], jobs=1)
        ingest(con, [traces[-1][0]], rank=10, jobs=1)
        con.execute(f"CREATE TEMP TABLE parts AS {sweeps._parts_sql()}")
        parts = sweeps._read_parts(con, "temp.parts")
        assert sweeps._key_of(parts) == sweeps.content_key(con)
        assert {r for _t, _f, r in parts if r is not None} == {0, 1, 2, 10, 11}
        assert not any(s for _n, _h, s in parts.values())
        con.execute(f"UPDATE kernels SET kernel_id = kernel_id + (9::BIGINT << {ID_SHIFT}) WHERE rank = 1")
        con.execute("DROP TABLE temp.parts")
        con.execute(f"CREATE TEMP TABLE parts AS {sweeps._parts_sql()}")
        assert sum(s for _n, _h, s in sweeps._read_parts(con, "temp.parts").values()) > 0
    finally:
        con.close()


# tier 3: traces added one by one in any order, a plain edit of one rank of the two-rank file in between; after
# every refresh, every stored sweep equals a fresh computation, and the refresh computed the ranks it had to only
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(4)), edit_after=st.integers(0, 3))
@pytest.mark.slow
def test_stored_sweeps_equal_fresh_after_each_added_trace(traces, monkeypatch, order, edit_after):
    scopes: list[sweeps.Scope | None] = []
    real = sweeps.changed_scope
    monkeypatch.setattr(sweeps, "changed_scope", lambda old, new: scopes.append(real(old, new)) or scopes[-1])
    nsys_rank = traces[-1][1]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "job.duckdb"
        ranks: set[int] = set()
        con = db.connect(path, write=True)
        for step, i in enumerate(order):
            trace, rank = traces[i]
            added = {0: {0}, 1: {1}, 2: {2}, 3: {10, 11}}[i]
            edited: set[int] = set()
            if step == edit_after + 1 and nsys_rank is not None and 11 in ranks:
                con.close()
                plain = duckdb.connect(str(path))  # a client that knows nothing of the stored sweeps
                plain.execute("DELETE FROM kernels WHERE rank = 11 AND kernel_class = 'communication'")
                plain.close()
                edited = {10, 11}  # rank 11's file also holds rank 10
                con = db.connect(path, write=True)
            ingest(con, [trace], rank=rank, jobs=1)
            ranks |= added
            # the first refresh and one where every rank changed compute everything
            want = None if step == 0 or (added | edited) >= ranks else tuple(sorted(added | edited))
            got = scopes[-1]
            assert (got.ranks if got else None) == want, (step, i, got)
            assert _differing_sweeps(con) == [], (step, i)
        con.close()
        ro = db.connect(path)  # readers use what the last refresh stored
        assert sweeps._reading_stored_sweeps(ro) == set(sweeps.SWEEPS)
        ro.close()


def test_the_scoped_cursor_reads_the_scope_only(tmp_path, traces):
    """The canonical tables of the scoped cursor hold the scope's rows: the two-rank file's kernels of rank 11."""
    path = tmp_path / "job.duckdb"
    con = db.connect(path, write=True)
    try:
        ingest(con, [traces[-1][0]], rank=10, jobs=1)
        fid = con.execute("SELECT file_id FROM ranks WHERE rank = 11").fetchall()[0][0]
        run = sweeps._SweepRun(sweeps.sweep_dependencies(), sweeps.Scope((11,), (fid,)), '"job"')
        cur = con.cursor()
        run.scoped(cur)
        assert cur.execute("SELECT DISTINCT rank FROM kernels").fetchall() == [(11,)]
        assert cur.execute("SELECT count(*) FROM files").fetchall() == [(1,)]
        assert con.execute("SELECT count(DISTINCT rank) FROM kernels").fetchall() == [(2,)]
        assert all((k >> ID_SHIFT) == fid for (k,) in cur.execute("SELECT kernel_id FROM kernels").fetchall())
        cur.close()
    finally:
        con.close()


# tier 3 (subprocess): the harness of docs/performance.md "Adding to an existing job" runs end to end at a small size
# and its added-to database holds stored sweeps that readers use and that equal a fresh computation (figures are
# read by people, never asserted)
@pytest.mark.slow
@pytest.mark.subprocess
def test_add_to_job_harness_smoke(tmp_path):
    from tests.benchmarks.add_to_job import run

    res = run([20_000], 1, tmp_path, True, grow=2_000)
    (step,) = res["steps"]
    assert step["kernels"] == 20_000 and step["new_db_s"] > 0 and step["grow_add_s"] > 0
    assert step["check"] == {"stored_sweeps_used": True, "sweeps_differing": []}
