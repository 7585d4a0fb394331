"""New job databases are copies of a template holding the catalog: the copy must be the catalog a fresh install
gives, a template that does not match is not trusted, and no existing database is ever replaced."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from nsys2comm import Job, catalog
from nsys2comm.storage import db
from nsys2comm.storage import template as dbtemplate


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """An empty user cache directory: the first new database builds the template there (seconds of binding)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("NSYS2COMM_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def _built_template(tmp_path_factory) -> Path:
    """A template built once by the product (db.ensure_template into a cache directory of its own)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSYS2COMM_CACHE_DIR", str(tmp_path_factory.mktemp("built-cache")))
        assert db.ensure_template() is True
        return dbtemplate.template_path()


@pytest.fixture
def built_cache_dir(cache_dir, _built_template) -> Path:
    """``cache_dir`` holding a copy of the template that ensure_template built: for the tests that are not about
    building it (each would otherwise build its own)."""
    cache_dir.mkdir(parents=True)
    shutil.copyfile(_built_template, dbtemplate.template_path())
    return cache_dir


@pytest.fixture(scope="module")
def installed_definitions(tmp_path_factory) -> str:
    """The definitions of a fresh catalog.install into a database file, installed once for the module."""
    path = tmp_path_factory.mktemp("installed") / "installed.duckdb"
    installed = duckdb.connect(str(path))
    catalog.install(installed)
    installed.close()
    return _definitions(path)


def _definitions(path: Path) -> str:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(catalog._DEFINITIONS_SQL).fetchall()[0][0]
    finally:
        con.close()


def _tamper_with_the_template() -> None:
    """Edit the template by hand: a macro that no longer matches the package's catalog."""
    tpl = duckdb.connect(str(dbtemplate.template_path()))
    tpl.execute("CREATE OR REPLACE MACRO canonical_collective(x) AS 'broadcast'")
    tpl.close()


def _assert_the_real_catalog(con) -> None:
    assert con.execute("SELECT canonical_collective('ncclDevKernel_AllReduce_Sum_f32_RING_LL')").fetchall()[0][0] \
        != "broadcast"


def _unwritable_cache(tmp_path, monkeypatch) -> None:
    """Point the cache directory below a file, where nothing can be created."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("NSYS2COMM_CACHE_DIR", str(blocker / "cache"))



@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_a_new_database_is_the_template_copy_and_holds_the_installed_catalog(tmp_path, cache_dir,
                                                                             installed_definitions):
    con = db.connect(tmp_path / "job.duckdb", write=True, objects=False)  # builds the template, copies it
    assert catalog.is_installed(con)  # objects=False would have given the tables alone
    con.close()
    assert dbtemplate.template_path().parent == cache_dir and dbtemplate.template_path().is_file()
    assert _definitions(tmp_path / "job.duckdb") == installed_definitions
    assert not list(cache_dir.glob(".*")) and not list(tmp_path.glob(".*creating"))  # no leftovers


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_ensure_template_builds_it_once_and_new_databases_copy_it(tmp_path, cache_dir):
    assert not dbtemplate.template_path().exists()
    assert db.ensure_template() is True
    built = dbtemplate.template_path().stat()
    assert db.ensure_template() is False  # already there: left as it is
    assert dbtemplate.template_path().stat().st_mtime_ns == built.st_mtime_ns
    con = db.connect(tmp_path / "job.duckdb", write=True, objects=False)
    assert catalog.is_installed(con)
    con.close()
    assert dbtemplate.template_path().stat().st_mtime_ns == built.st_mtime_ns  # copied, not rebuilt


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_ingest_into_a_template_copy_gives_the_same_rows_as_without(tmp_path, built_cache_dir, monkeypatch):
    from fixtures.kineto_writer import write_kineto
    from fixtures.synthetic import make_run

    traces = write_kineto(make_run(world_size=2, steps=2), tmp_path / "t", style="new")
    with Job.ingest(traces, db=tmp_path / "a.duckdb", jobs=1) as job:
        with_template = job.query("comm_kernels").sort("kernel_id")
    monkeypatch.setattr(dbtemplate, "create", lambda path, config: False)
    with Job.ingest(traces, db=tmp_path / "b.duckdb", jobs=1) as job:
        without = job.query("comm_kernels").sort("kernel_id")
    assert with_template.height > 0 and with_template.equals(without)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_a_template_changed_by_hand_is_not_trusted(tmp_path, built_cache_dir):
    db.connect(tmp_path / "first.duckdb", write=True).close()  # a copy of the template, trusted
    _tamper_with_the_template()
    con = db.connect(tmp_path / "job.duckdb", write=True)
    assert catalog.is_installed(con)  # reinstalled over the copy
    _assert_the_real_catalog(con)
    con.close()


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_without_a_writable_cache_the_database_is_installed_in_place(tmp_path, monkeypatch):
    _unwritable_cache(tmp_path, monkeypatch)
    assert not dbtemplate.create(tmp_path / "a.duckdb", {})
    assert not (tmp_path / "a.duckdb").exists()
    con = db.connect(tmp_path / "job.duckdb", write=True)
    assert catalog.is_installed(con)
    con.close()


def test_a_database_that_appears_meanwhile_is_never_replaced(tmp_path, built_cache_dir, monkeypatch):
    target = tmp_path / "job.duckdb"
    real_copy = shutil.copyfile

    def racing_copy(src, dst):  # another writer creates the database between our copy and our link
        real_copy(src, dst)
        target.write_bytes(b"theirs")
        return dst

    monkeypatch.setattr(shutil, "copyfile", racing_copy)
    assert not dbtemplate.create(target, {})
    assert target.read_bytes() == b"theirs"
    assert not list(tmp_path.glob(".*creating"))


def test_an_existing_database_or_wal_is_left_to_duckdb(tmp_path, built_cache_dir):
    wal_only = tmp_path / "job.duckdb"
    Path(f"{wal_only}.wal").write_bytes(b"")
    assert not dbtemplate.create(wal_only, {}) and not wal_only.exists()


@pytest.mark.parametrize("name", ["job.duckdb", "memory.duckdb", "it's \"quoted\".duckdb"])
def test_a_writer_stores_small_row_groups_on_the_file_for_its_cursors_too(tmp_path, built_cache_dir, name):
    """Writers attach the file with db.WRITER_ROW_GROUP_ROWS (a table under one row group goes to the write-ahead
    log and is written again at the checkpoint): the file is the default database of the connection and of its
    cursors (the stored sweeps run on cursors), and DuckDB spills beside it as it would by itself."""
    path = tmp_path / name
    con = db.connect(path, write=True)
    rows = 3 * db.WRITER_ROW_GROUP_ROWS + 5
    with con.cursor() as cur:
        cur.execute(f"CREATE TABLE t AS SELECT range AS i FROM range({rows})")
    groups = con.execute("SELECT count(DISTINCT row_group_id), max(count) FROM pragma_storage_info('t')").fetchall()
    assert groups == [(4, db.WRITER_ROW_GROUP_ROWS)]
    assert con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0] == f"{path}.tmp"
    assert con.execute("SELECT count(*) FROM files").fetchall()[0][0] == 0  # the job's own tables
    con.close()
    reader = db.connect(path)
    assert reader.execute("SELECT count(*), sum(i) FROM t").fetchall() == [(rows, rows * (rows - 1) // 2)]
    reader.close()


def test_a_duckdb_whose_cursors_lose_the_file_gets_a_plain_writer(tmp_path, built_cache_dir, monkeypatch):
    """DuckDB 1.2-1.4 leave a cursor without a default database once the in-memory one is detached: the writer is
    then a plain connection (DuckDB's row groups), never one whose cursors cannot see the job."""
    real = duckdb.connect

    class NoDetach:  # stands in for the older DuckDB: DETACH of the in-memory database fails
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *a):
            if sql == "DETACH memory":
                raise duckdb.BinderException('Catalog "" does not exist!')
            return self.con.execute(sql, *a)

        def __getattr__(self, item):
            return getattr(self.con, item)

    monkeypatch.setattr(duckdb, "connect", lambda path, **kw: NoDetach(real(path, **kw)) if path == ":memory:"
                        else real(path, **kw))
    con = db.connect(tmp_path / "job.duckdb", write=True)
    with con.cursor() as cur:
        assert cur.execute("SELECT count(*) FROM files").fetchall() == [(0,)]
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(40000)")
    assert con.execute("SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('t')").fetchall() == [(1,)]
    con.close()


# In-memory job databases (traces opened directly, synth_db.catalog_db) are template copies too (db.memory_job).

def _refuse_install(monkeypatch) -> None:
    def refuse(*a, **kw):
        raise AssertionError("catalog.install called: the in-memory job was not copied from the template")

    monkeypatch.setattr(catalog, "install", refuse)


# tier 2: the in-memory job's catalog, object for object, against a fresh install
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_an_in_memory_job_is_a_template_copy_with_the_installed_catalog(cache_dir, monkeypatch,
                                                                         installed_definitions):
    assert db.ensure_template() is True
    _refuse_install(monkeypatch)
    con = db.connect(None, objects=False)
    assert catalog.is_installed(con)  # objects=False would have given the tables alone
    assert con.execute("SELECT current_setting('temp_directory'), current_setting('enable_progress_bar'), "
                       "current_setting('autoinstall_known_extensions')").fetchall() == [
        (db._writer_temp_directory(), False, False)]  # the configuration connect(None) gives
    assert con.execute("SELECT count(*) FROM duckdb_databases() WHERE NOT internal").fetchall() == [(1,)]  # detached
    monkeypatch.undo()
    assert con.execute(catalog._DEFINITIONS_SQL).fetchall()[0][0] == installed_definitions
    assert con.execute("SELECT count(*) FROM files").fetchall() == [(0,)]
    con.close()


# tier 2: a template edited by hand, before or after a copy of it was trusted, is not copied
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_an_in_memory_job_does_not_trust_a_template_changed_by_hand(tmp_path, built_cache_dir):
    db.ensure_template()
    assert dbtemplate.memory_copy({}) is not None  # checked once, trusted for this file state
    _tamper_with_the_template()
    assert dbtemplate.memory_copy({}) is None  # a new file state: checked again, and refused
    assert dbtemplate.memory_copy({}) is None  # and remembered
    con = db.connect(None)  # installed instead
    assert catalog.is_installed(con)
    _assert_the_real_catalog(con)
    con.close()


# tier 2: no writable cache directory: the in-memory job installs the catalog
@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_without_a_writable_cache_an_in_memory_job_installs_the_catalog(tmp_path, monkeypatch):
    _unwritable_cache(tmp_path, monkeypatch)
    assert dbtemplate.memory_copy({}) is None
    con = db.memory_job()
    assert catalog.is_installed(con) and not db.take_fresh_copy(con)
    con.close()


# tier 2: a fresh copy spares ingest its catalog check once, and only for that connection
def test_a_fresh_in_memory_copy_is_taken_once(built_cache_dir):
    con = db.memory_job()
    other = duckdb.connect()
    assert db.take_fresh_copy(con) is True
    assert db.take_fresh_copy(con) is False and db.take_fresh_copy(other) is False
    con.close()
    other.close()


# tier 3: traces opened directly (in memory, no catalog install) give the rows a job database file gives
def test_traces_opened_in_memory_give_the_rows_of_a_database_file(tmp_path, built_cache_dir, monkeypatch):
    from fixtures.kineto_writer import write_kineto
    from fixtures.synthetic import make_run

    traces = write_kineto(make_run(world_size=2, steps=2), tmp_path / "t", style="new")
    with Job.ingest(traces, db=tmp_path / "a.duckdb", jobs=1) as job:
        on_file = job.query("comm_kernels").sort("kernel_id")
    _refuse_install(monkeypatch)
    with Job.open(traces, jobs=1) as job:
        in_memory = job.query("comm_kernels").sort("kernel_id")
    assert on_file.height > 0 and on_file.equals(in_memory)
