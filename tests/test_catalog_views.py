"""Analyses are visible to SQL users (issue 15 item 2): every analysis that needs no argument is also a view under
its own name, in the database file itself, so a plain DuckDB client lists it (SHOW TABLES) and reads it with
``FROM name``; parameterised calls still use the macro."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from nsys2comm import Job, catalog

ROOT = Path(__file__).resolve().parents[1]
VIEWS = sorted(o.name for o in catalog.load_catalog() if o.has_view)


@pytest.fixture(scope="module")
def job_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("views") / "job.duckdb"
    Job.ingest(sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))[:2], db=path, jobs=1).close()
    return path


def test_views_cover_the_argument_free_analyses():
    assert {"overlap_by_rank", "collective_skew", "latency_model", "diagnostics"} <= set(VIEWS)
    for o in catalog.load_catalog():
        if o.has_view:
            assert not o.required_params and o.public


@pytest.mark.slow  # tier: slow (every view on a plain client, no stored sweeps: ~15 CPU-s; CI runs it)
def test_plain_duckdb_client_lists_and_reads_them(job_db):
    """Each view is its macro called with the defaults (its stored definition says so), and reads on a plain client:
    running each macro a second time to compare would only repeat the same statement."""
    con = duckdb.connect(str(job_db), read_only=True)
    try:
        listed = {r[0] for r in con.sql("SHOW TABLES").fetchall()}
        assert set(VIEWS) <= listed
        sql = dict(con.sql("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall())
        for name in VIEWS:
            assert re.search(rf"\bFROM\s+{name}\s*\(\s*\)\s*;?\s*$", sql[name], re.IGNORECASE), sql[name]
            con.sql(f"SELECT * FROM {name}").fetchall()
        comment = con.sql("SELECT comment FROM duckdb_views() WHERE view_name = 'overlap_by_rank'").fetchall()[0][0]
        assert comment == catalog.find("overlap_by_rank").description
    finally:
        con.close()


def test_views_in_read_only_sessions_equal_the_macros(job_db):
    with Job.open(str(job_db)) as job:
        for name in ("overlap_by_rank", "rank_wait"):
            assert job.sql(f"SELECT * FROM {name}").equals(job.sql(f"SELECT * FROM {name}()"))
        hta = job.sql("SELECT * FROM overlap_by_rank(compat := 'hta')")
        assert hta.height == 2


def test_schema_objects_lists_tables_and_analysis_views_with_docs(job_db):
    """What 'nsys2comm schema DB' prints is the catalog object schema_objects (no SQL of its own in the CLI)."""
    with Job.open(str(job_db)) as job:
        rows = job.query("schema_objects")
    own = rows.filter(rows["column"].is_null())
    kinds = dict(zip(own["object"], own["kind"], strict=True))
    assert kinds["kernels"] == "table" and kinds["overlap_by_rank"] == "view"
    assert not any(name.startswith("_") for name in kinds)
    doc = rows.filter((rows["object"] == "overlap_by_rank") & (rows["column"] == "busy_ns"))["doc"][0]
    assert doc == catalog.find("overlap_by_rank").columns["busy_ns"]
