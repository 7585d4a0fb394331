"""NSYS2COMM_THREADS sets DuckDB's threads for every connection the package opens, and no figure depends on it.

The test workers run DuckDB on one thread each (tests/conftest.py), so the rows at several threads are checked
here: parallel hash aggregates, joins and sorts must not change any query's output.
"""

from __future__ import annotations

import pytest
import synth_db

from fixtures import synthetic as syn
from nsys2comm import analysis, catalog
from nsys2comm.errors import UsageError
from nsys2comm.storage import connect, snapshotted


def _threads(con) -> int:
    return con.execute("SELECT current_setting('threads')").fetchall()[0][0]


# tier 2: the setting reaches in-memory jobs and job files alike; a bad value is a one-line usage error
def test_the_variable_sets_duckdb_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("NSYS2COMM_THREADS", "3")
    assert _threads(connect(None)) == 3
    con = connect(tmp_path / "job.duckdb", write=True)
    assert _threads(con) == 3
    con.close()
    monkeypatch.setenv("NSYS2COMM_THREADS", "0")
    with pytest.raises(UsageError, match="NSYS2COMM_THREADS='0' is not a positive whole number"):
        connect(None)


def _all_rows(threads: int, monkeypatch) -> dict:
    monkeypatch.setenv("NSYS2COMM_THREADS", str(threads))
    con = synth_db.build(syn.make_run(world_size=3, steps=2))
    assert _threads(con) == threads
    with snapshotted(con):
        return {o.name: analysis.run_query(con, o.name) for o in catalog.public_queries()
                if o.is_table_macro and not o.required_params}


# tier 3: every public query gives the same rows, in the same order, on 1 and 4 threads
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_every_query_gives_the_same_rows_at_any_thread_count(monkeypatch):
    one, four = _all_rows(1, monkeypatch), _all_rows(4, monkeypatch)
    assert one.keys() == four.keys()
    differ = [n for n in one if not one[n].equals(four[n], null_equal=True)]
    assert not differ, f"rows depend on DuckDB's threads: {differ}"
