"""Values an nsys export should not hold: each kind is refused with one line naming the file, or stored correctly
with an ingest note. The exports are written by the fixture writer, then damaged with SQLite."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from fixtures.nsys_writer import write_nsys
from fixtures.synthetic import make_run
from nsys2comm.errors import InputError
from nsys2comm.ingest import ingest
from nsys2comm.storage import db

K = "CUPTI_ACTIVITY_KIND_KERNEL"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return write_nsys(make_run(world_size=2, steps=1), tmp_path_factory.mktemp("bad") / "good.sqlite", "3.25.0")


def _damaged(good: Path, tmp_path: Path, *sql: str, loosen: str | None = None) -> Path:
    """A copy of the good export with `sql` applied; `loosen` drops the NOT NULL constraints of one table first
    (damaged or hand-made files do not keep them)."""
    path = tmp_path / "bad.sqlite"
    path.write_bytes(good.read_bytes())
    c = sqlite3.connect(path)
    if loosen:
        c.executescript(f"CREATE TABLE _t AS SELECT * FROM {loosen}; DROP TABLE {loosen}; "
                        f"ALTER TABLE _t RENAME TO {loosen};")
    for q in sql:
        c.execute(q)
    c.commit()
    c.close()
    return path


@pytest.fixture(autouse=True, params=[0, 2], ids=["one-process", "decoder-processes"])
def readers(request, monkeypatch):
    """Every case read in one process, and by rowid ranges in two decoder processes (the default for large
    exports): both refuse or store the same way."""
    monkeypatch.setattr(sys.modules[__name__], "_EXTRA", {"nsys_workers": request.param, "nsys_range_rows": 4})


_EXTRA: dict = {}


def _refused(path: Path, *fragments: str) -> str:
    con = db.connect(None)
    with pytest.raises(InputError) as ei:
        ingest(con, [path], jobs=1, read_extra=_EXTRA)
    msg = str(ei.value)
    assert msg.startswith(str(path) + ": ") and "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 0
    return msg


def _stored(path: Path):
    con = db.connect(None)
    res = ingest(con, [path], jobs=1, read_extra=_EXTRA)
    assert [r.status for r in res] == ["ingested"], res
    return con


def _first_kernel(good: Path) -> int:
    c = sqlite3.connect(good)
    rowid = c.execute(f"SELECT min(rowid) FROM {K}").fetchone()[0]
    c.close()
    return rowid


@pytest.mark.parametrize("table,col", [(K, "start"), (K, "end"), (K, "globalPid"),
                                       ("CUPTI_ACTIVITY_KIND_RUNTIME", "start"),
                                       ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
                                       ("CUPTI_ACTIVITY_KIND_MEMCPY", "end"), ("NVTX_EVENTS", "start")])
def test_null_required_value_is_refused(good, tmp_path, table, col):
    bad = _damaged(good, tmp_path, f'UPDATE {table} SET "{col}" = NULL WHERE rowid = (SELECT max(rowid) FROM {table})',
                   loosen=table)
    _refused(bad, f"{table} has 1 rows with a NULL {col}")


def test_end_before_start_is_dropped_with_a_note(good, tmp_path):
    n = _stored(good).execute("SELECT count(*) FROM kernels").fetchone()[0]
    bad = _damaged(good, tmp_path, f'UPDATE {K} SET "end" = start - 5 WHERE rowid = {_first_kernel(good)}')
    con = _stored(bad)
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == n - 1
    assert con.execute("SELECT count(*) FROM kernels WHERE end_ns < start_ns").fetchone()[0] == 0
    msg = con.execute("SELECT message FROM ingest_notes WHERE code = 'negative_durations'").fetchone()[0]
    assert msg.startswith("1 kernels with end < start were not stored")


def test_text_in_start_is_refused(good, tmp_path):
    bad = _damaged(good, tmp_path, f"UPDATE {K} SET start = 'soon' WHERE rowid = {_first_kernel(good)}")
    _refused(bad, f"{K}.start holds 1 values that are not integers", "'soon'")


def test_text_in_session_start_time_is_refused(good, tmp_path):
    bad = _damaged(good, tmp_path, "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = '2023-11-14T22:13:18Z'")
    _refused(bad, "TARGET_INFO_SESSION_START_TIME.utcEpochNs holds str", "not integer nanoseconds")


def test_timestamps_overflowing_after_the_clock_offset_are_refused(good, tmp_path):
    # a real session start (an impossible one is refused first), the target clock as far back as int64 allows
    bad = _damaged(good, tmp_path,
                   f"UPDATE TARGET_INFO_SESSION_START_TIME SET systemClockNs = utcEpochNs - {2**63 - 1}")
    _refused(bad, "timestamps overflow 64-bit integers after adding the clock offset")


def test_clock_offset_outside_int64_is_refused(good, tmp_path):
    bad = _damaged(good, tmp_path, f"UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = {-(2**63)}, "
                                   f"systemClockNs = {2**62}")
    _refused(bad, "gives a clock offset", "outside 64-bit integers")


@pytest.mark.parametrize("device", [2**32, -1, 70000])
def test_device_id_out_of_range_is_refused(good, tmp_path, device):
    bad = _damaged(good, tmp_path, f"UPDATE {K} SET deviceId = {device} WHERE rowid = {_first_kernel(good)}")
    _refused(bad, f"{K}.deviceId holds {device}, not a CUDA device index")


def test_kernel_without_demangled_name_keeps_its_short_name(good, tmp_path):
    rid = _first_kernel(good)
    c = sqlite3.connect(good)
    short = c.execute(f"SELECT s.value FROM {K} k JOIN StringIds s ON s.id = k.shortName WHERE k.rowid = {rid}"
                      ).fetchone()[0]
    c.close()
    bad = _damaged(good, tmp_path, f"UPDATE {K} SET demangledName = NULL WHERE rowid = {rid}", loosen=K)
    con = _stored(bad)
    assert con.execute("SELECT count(*) FROM kernels WHERE name = ?", [short]).fetchone()[0] >= 1
    assert con.execute("SELECT code FROM ingest_notes WHERE code LIKE '%name%'").fetchall() == [("kernel_short_names",)]


def test_kernel_without_any_name_is_stored_as_unknown_with_a_note(good, tmp_path):
    bad = _damaged(good, tmp_path, f"UPDATE {K} SET demangledName = NULL, shortName = NULL "
                                   f"WHERE rowid = {_first_kernel(good)}", loosen=K)
    con = _stored(bad)
    assert con.execute("SELECT count(*), any_value(kernel_class) FROM kernels WHERE name = 'unknown'").fetchone() == \
        (1, "compute")
    msg = con.execute("SELECT message FROM ingest_notes WHERE code = 'unnamed_kernels'").fetchone()[0]
    assert msg.startswith("1 kernels have neither demangledName nor shortName")
