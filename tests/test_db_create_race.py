"""Two writers creating one job database: the second may see the file before DuckDB wrote its header (empty) and
must wait for the first writer's lock, not refuse the file as 'not a DuckDB database'."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from nsys2comm.storage import db

CREATOR = """
import fcntl, shutil, sys, time
import duckdb
path, scratch = sys.argv[1], sys.argv[2]
f = open(path, "w+b")
fcntl.lockf(f, fcntl.LOCK_EX)          # what DuckDB holds while it creates the file
print("locked", flush=True)
time.sleep(1.5)
con = duckdb.connect(scratch); con.execute("CHECKPOINT"); con.close()  # a new, empty database
f.write(open(scratch, "rb").read()); f.flush()
f.close()                               # releases the lock
"""

# tier: subprocess (every test here starts nsys2comm or Python processes)
pytestmark = pytest.mark.subprocess


def test_second_writer_waits_for_a_database_being_created(tmp_path):
    path, scratch = tmp_path / "job.duckdb", tmp_path / "scratch.duckdb"
    p = subprocess.Popen([sys.executable, "-c", CREATOR, str(path), str(scratch)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    assert path.stat().st_size == 0
    t0 = time.monotonic()
    con = db.connect(path, write=True, lock_timeout_s=30)  # must not refuse the empty file
    try:
        assert time.monotonic() - t0 >= 1.0  # it waited for the creator
        assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'files'").fetchall()[0][0] == 1
    finally:
        con.close()
        p.wait(timeout=30)


def test_an_empty_file_nobody_writes_is_still_refused(tmp_path):
    path = tmp_path / "empty.duckdb"
    path.touch()
    try:
        db.check_db_path(path, write=True)
    except Exception as e:  # noqa: BLE001
        assert "is empty" in str(e)
    else:
        raise AssertionError("an empty file was taken for a database")
