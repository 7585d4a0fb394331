"""Read-only sessions read their own database and nothing else: no file written, no extension loaded or fetched.

Each escape runs with the network blocked (any socket connect fails the test) and an empty extension directory;
afterwards the working directory holds no new file and the extension directory stays empty.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm.api import Job
from nsys2comm.errors import InputError
from nsys2comm.ingest import ingest
from nsys2comm.storage import db

ESCAPES = {
    "prepared_copy": ["PREPARE p AS COPY (SELECT 42 AS x) TO 'victim.txt'", "EXECUTE p"],
    "copy": ["COPY (SELECT 42 AS x) TO 'victim.txt'"],
    "copy_table": ["COPY kernels TO 'victim.parquet' (FORMAT parquet)"],
    "export": ["EXPORT DATABASE 'victim_dir'"],
    "profiling_pragma": ["PRAGMA enable_profiling='json'", "PRAGMA profiling_output='victim.txt'", "SELECT 1"],
    "profiling_set": ["SET profiling_output = 'victim.txt'", "SET enable_profiling = 'json'", "SELECT 1"],
    "query_log": ["SET log_query_path = 'victim.txt'", "SELECT 1"],
    "file_logging": ["CALL enable_logging(storage := 'file', storage_path := 'victim_logs')", "SELECT 1"],
    "read_url": ["SELECT * FROM read_csv('https://example.com/victim.csv')"],
    "read_local": ["SELECT * FROM read_csv('{text}')"],
    "sqlite_scan": ["SELECT * FROM sqlite_scan('victim.sqlite', 't')"],
    "temp_secret": ["CREATE TEMP SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')"],
    "persistent_secret": ["CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')"],
    "attach": ["ATTACH 'victim.duckdb' AS v", "CREATE TABLE v.t AS SELECT 1"],
    "attach_other": ["ATTACH '{other}' AS o (READ_ONLY)", "SELECT * FROM o.secret_table"],
    "install": ["INSTALL httpfs"],
    "load": ["LOAD httpfs"],
    "unlock": ["SET lock_configuration = false", "SET enable_external_access = true",
               "COPY (SELECT 1) TO 'victim.txt'"],
    "temp_directory": ["SET temp_directory = 'victim_tmp'"],
}
# escapes that only read (a file, a URL, an extension): beyond writing nothing, their last statement must fail
MUST_FAIL = {"read_url", "read_local", "sqlite_scan", "temp_secret", "attach_other", "load", "install"}

# tier: subprocess (every test here starts nsys2comm or Python processes)
pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def job_db(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ro")
    path = d / "job.duckdb"
    con = db.connect(path, write=True)
    ingest(con, write_kineto(make_run(world_size=2, steps=1), d / "t"), jobs=1)
    con.close()
    return path


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd = an empty folder, HOME's extension and secret folders redirected there, and no network."""
    work = tmp_path / "cwd"
    work.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    # nsys2comm's own user cache (job template, recorded content keys) is not DuckDB escaping: kept out of HOME
    monkeypatch.setenv("NSYS2COMM_CACHE_DIR", str(tmp_path / "usercache"))
    dials = []
    local_connect = socket.socket.connect

    def no_network(sock, address):  # Unix sockets (multiprocessing) stay allowed
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            dials.append(address)
            raise OSError("network blocked by the test")
        return local_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", no_network)
    yield work, home, dials
    assert not dials, f"tried to reach the network: {dials}"


def _files_under(p: Path) -> list[str]:
    return sorted(str(f.relative_to(p)) for f in p.rglob("*"))


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_read_only_session_cannot_escape(name, job_db, sandbox, tmp_path):
    work, home, _ = sandbox
    other = tmp_path / "other.duckdb"
    c = duckdb.connect(str(other))
    c.execute("CREATE TABLE secret_table AS SELECT 42 AS x")
    c.close()
    text = tmp_path / "other.csv"
    text.write_text("a,b\n1,2\n")
    con = db.connect(job_db)
    failed = False
    for st in ESCAPES[name]:
        try:
            con.execute(st.format(other=other, text=text)).fetchall()
            failed = False
        except duckdb.Error:
            failed = True
    con.close()
    if name in MUST_FAIL:
        assert failed, f"{name}: {ESCAPES[name][-1]} succeeded"
    assert _files_under(work) == [], f"{name} wrote files"
    assert _files_under(home) == [], f"{name} wrote under HOME (extensions or secrets)"
    assert not list(job_db.parent.glob("victim*"))


@pytest.mark.parametrize("name", ["prepared_copy", "profiling_pragma", "query_log", "read_url", "sqlite_scan",
                                  "temp_secret", "attach", "install", "load", "unlock"])
def test_read_only_cli_sql_cannot_escape(name, job_db, tmp_path):
    """The real command in a fresh process (its own DuckDB instance, no test monkeypatching of DuckDB)."""
    work = tmp_path / "cwd"
    work.mkdir()
    env = dict(os.environ, HOME=str(tmp_path), http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    sql = "; ".join(ESCAPES[name])
    proc = subprocess.run([sys.executable, "-m", "nsys2comm", "sql", str(job_db), sql], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 or name == "profiling_pragma", proc.stderr
    assert _files_under(work) == [] and _files_under(tmp_path / "cwd") == []
    assert not (tmp_path / ".duckdb").exists(), "an extension or secret folder was created"


def test_read_paths_still_read_the_job(job_db, sandbox):
    con = db.connect(job_db)
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM overlap_by_rank()").fetchone()[0] == 2
    con.execute("CREATE TEMP TABLE scratch AS SELECT * FROM kernels")  # scratch objects stay allowed
    con.close()


def test_one_off_job_on_traces_is_sealed(job_db, sandbox, tmp_path):
    traces = write_kineto(make_run(world_size=2, steps=1), tmp_path / "t2")
    job = Job.open([str(p) for p in traces])
    with pytest.raises(duckdb.Error):
        job.con.execute("COPY (SELECT 1) TO 'victim.txt'")
    assert job.query("overlap_by_rank").height == 2
    job.close()
    assert _files_under(sandbox[0]) == []


def test_write_mode_still_writes_files(job_db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    con = db.connect(job_db, write=True)
    con.execute("COPY (SELECT 42 AS x) TO 'allowed.csv'")
    con.close()
    assert (tmp_path / "allowed.csv").read_text().split() == ["x", "42"]


# --db: a DuckDB database file or a new path; anything else is refused before DuckDB touches it

@pytest.mark.parametrize("content, says", [
    (b'{"traceEvents": []}\n', "JSON"),
    (b"rank,busy_ns\n0,1\n", "not a DuckDB database"),
    (b"SQLite format 3\x00" + bytes(100), "SQLite"),
    (b"", "empty"),
])
@pytest.mark.parametrize("write", [True, False])
def test_db_refuses_other_files(tmp_path, content, says, write):
    path = tmp_path / "notes.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as e:
        db.connect(path, write=write)
    assert str(path) in e.value.line() and says in e.value.line() and "\n" not in e.value.line()
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]


def test_cli_ingest_db_notes_json(tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}\n')
    trace = write_kineto(make_run(world_size=1, steps=1), tmp_path / "t")[0]
    proc = subprocess.run([sys.executable, "-m", "nsys2comm", "ingest", str(trace), "--db", str(notes)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(notes) in lines[0] and "not a DuckDB database" in lines[0], proc.stderr
    assert notes.read_text() == '{"mine": true}\n'


def test_db_refuses_a_directory(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        db.connect(tmp_path, write=True)


def _writer_locked_out(path) -> bool:
    """Whether another process is refused a writable DuckDB connection to ``path`` right now."""
    code = ("import duckdb, sys\n"
            "try:\n    duckdb.connect(sys.argv[1]).close()\nexcept duckdb.IOException:\n    sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True).returncode == 3


def test_open_sessions_keep_their_lock_on_the_file(tmp_path):
    """DuckDB locks with POSIX record locks, which a process loses on closing any descriptor of the file: reading
    the file's state for the content-key record, or its head when the same process opens it again, must not let a
    writer in beside a session that is reading."""
    path = tmp_path / "job.duckdb"
    db.connect(path, write=True).close()
    first = db.connect(path)  # reads the file's state (content-key and catalog records)
    assert _writer_locked_out(path)
    second = db.connect(path)  # reads the head again (check_db_path) while the first holds the file
    assert _writer_locked_out(path)
    second.close()
    first.close()
    assert not _writer_locked_out(path)
