"""The catalog stored in a job database: sessions use it only while it is this package's and unchanged since it was
installed; otherwise they install their own (TEMP) objects. A new database is a copy of the template (see
test_dbtemplate); without one, ingest installs the catalog while the first trace decodes.
Decoder processes stay free of DuckDB and polars."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm import Job, analysis, catalog
from nsys2comm.storage import db
from nsys2comm.storage import template as dbtemplate

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("comm_kernels", "collective_skew", "overlap_by_rank")


def _temp_macros(con) -> int:
    return con.execute("SELECT count(*) FROM duckdb_functions() WHERE database_name = 'temp' "
                       "AND function_type LIKE '%macro%'").fetchall()[0][0]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list[Path]:
    return write_kineto(make_run(world_size=2, steps=2), tmp_path_factory.mktemp("t"), style="new")


@pytest.fixture
def job_db(tmp_path, traces) -> Path:
    path = tmp_path / "job.duckdb"
    Job.ingest(traces, db=path, jobs=1).close()
    return path


def test_ingest_installs_the_whole_catalog_and_sessions_use_it(job_db):
    con = db.connect(job_db)
    assert catalog.is_installed(con)
    assert _temp_macros(con) == 0  # nothing installed at open: the stored objects serve
    names = {r[0] for r in con.execute("SELECT function_name FROM duckdb_functions() WHERE database_name = "
                                       "current_database() AND function_type LIKE '%macro%'").fetchall()}
    assert {o.name for o in catalog.load_catalog() if o.kind == "macro"} <= names
    stored = {n: analysis.run_query(con, n) for n in NAMES}
    con.close()
    fresh = db.connect(None)  # the package's definitions, installed now
    fresh.execute("ATTACH ? AS src (READ_ONLY)", [str(job_db)])
    for t in ("files", "ranks", "devices", "kernels", "mem_ops", "cpu_ranges", "api_calls", "comm_ops"):
        fresh.execute(f"INSERT INTO main.{t} SELECT * FROM src.{t}")
    for n in NAMES:
        assert stored[n].equals(analysis.run_query(fresh, n)), n


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_a_definition_changed_by_hand_is_not_trusted(job_db):
    con = db.connect(job_db, write=True)
    con.execute("CREATE OR REPLACE MACRO busbw_factor(collective, n) AS 42.0")  # an outside edit
    assert not catalog.is_installed(con)
    con.close()
    con = db.connect(job_db)
    assert _temp_macros(con) > 0  # the package's own objects shadow the stored ones
    assert con.execute("SELECT busbw_factor('all_reduce', 8)").fetchall()[0][0] == pytest.approx(2 * 7 / 8)
    con.close()
    con = db.connect(job_db, write=True)  # a writer puts the package's catalog back
    assert catalog.is_installed(con)
    con.close()


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_another_package_version_is_not_trusted(job_db, monkeypatch):
    monkeypatch.setattr(catalog, "digest", lambda: "another-version")
    con = db.connect(job_db)
    assert not catalog.is_installed(con)
    assert _temp_macros(con) > 0
    con.close()


def test_ingest_after_a_failed_first_file_still_installs_the_catalog(tmp_path, traces):
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 0}')
    path = tmp_path / "job.duckdb"
    Job.ingest([bad, *traces], db=path, jobs=1, keep_going=True).close()
    con = db.connect(path)
    assert catalog.is_installed(con)
    assert len(analysis.run_query(con, "comm_kernels")) > 0
    con.close()


@pytest.mark.subprocess  # tier: subprocess (a fresh interpreter shows what the decoders import)
def test_decoder_processes_import_neither_duckdb_nor_polars():
    code = ("import sys, nsys2comm.ingest.kineto, nsys2comm.ingest.nsys; "
            "print(sorted(m for m in ('duckdb', 'polars', 'altair') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_a_signal_while_the_catalog_installs_leaves_a_connection_that_closes(tmp_path, traces, monkeypatch):
    """SIGTERM arrives as SystemExit: ingest must not leave the install thread inside DuckDB, or closing the
    connection is refused ("busy") and the process aborts at exit."""
    import nsys2comm.ingest as ingest_mod

    busy = []

    def interrupted(con, todo, options, jobs, record, fail, progress, installing):
        busy.append(installing is not None and installing.busy())
        raise SystemExit(143)

    monkeypatch.setattr(ingest_mod, "_write_all", interrupted)
    monkeypatch.setattr(dbtemplate, "create", lambda path, config: False)  # no template: ingest installs
    con = db.connect(tmp_path / "job.duckdb", write=True, objects=False)
    with pytest.raises(SystemExit):
        ingest_mod.ingest(con, traces, jobs=1)
    assert busy == [True]  # the install was still running when the signal came
    con.close()  # refused while the install thread is inside DuckDB
