"""The bad-input corpus: every case ends in a one-line error that names the file and shows no exception class name,
or is stored with an ingest note; and the rows already in the database are unchanged.

Tier 3: inputs built here by code from a good synthetic trace, run through the CLI in this process.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import write_nsys
from fixtures.synthetic import make_run
from nsys2comm.cli import app
from nsys2comm.storage import db as dbmod

CLASS_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception|Exc)\b|\bNeeds\w+|Traceback")


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("good")
    kin = write_kineto(make_run(world_size=2, steps=1), d / "kineto")
    (d / "nsys").mkdir()
    nsys = write_nsys(make_run(world_size=2, steps=1, seed=3), d / "nsys" / "job.sqlite", "3.25.0")
    base = d / "base.duckdb"
    res = CliRunner().invoke(app, ["ingest", str(kin[1]), "--db", str(base), "-q", "--rank", "7"])
    assert res.exit_code == 0, res.output
    return {"kineto": kin[0], "nsys": nsys, "base": base}


def _doc(good) -> dict:
    return json.loads(Path(good["kineto"]).read_text())


def _write(path: Path, doc_or_bytes) -> Path:
    path.write_bytes(doc_or_bytes if isinstance(doc_or_bytes, bytes) else json.dumps(doc_or_bytes).encode())
    return path


def _kernel(doc: dict) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")


def numeric_string_ts(good, tmp: Path) -> Path:
    doc = _doc(good)
    for e in doc["traceEvents"]:
        if "ts" in e and isinstance(e["ts"], (int, float)):
            e["ts"] = str(e["ts"])
    return _write(tmp / "strts.json", doc)


def bad_utf8_start(good, tmp: Path) -> Path:
    return _write(tmp / "badutf8.json", b"\xff\xfe\xfa" + Path(good["kineto"]).read_bytes())


def huge_device_property(good, tmp: Path) -> Path:
    doc = _doc(good)
    doc.setdefault("deviceProperties", [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    for p in doc["deviceProperties"]:
        p["totalGlobalMem"] = 1 << 70
        p["numSms"] = 1099511627776
    return _write(tmp / "bigprop.json", doc)


def ts_abc(good, tmp: Path) -> Path:
    doc = _doc(good)
    _kernel(doc)["ts"] = "abc"
    return _write(tmp / "tsabc.json", doc)


def utf8_bom(good, tmp: Path) -> Path:
    return _write(tmp / "bom.json", b"\xef\xbb\xbf" + Path(good["kineto"]).read_bytes())


def duplicate_trace_events(good, tmp: Path) -> Path:
    text = Path(good["kineto"]).read_text()
    return _write(tmp / "dupkey.json", ('{"traceEvents": [], ' + text.lstrip()[1:]).encode())


def nested_trace_events(good, tmp: Path) -> Path:
    doc = _doc(good)
    return _write(tmp / "nested.json", {"header": {"traceEvents": doc["traceEvents"]}, "schemaVersion": 1})


def control_chars_in_name(good, tmp: Path) -> Path:
    return _write(tmp / "evil\n\r\x1b[31mname.json", b"{not json")


def nsys_without_runtime(good, tmp: Path) -> Path:
    out = tmp / "noruntime.sqlite"
    out.write_bytes(Path(good["nsys"]).read_bytes())
    con = sqlite3.connect(out)
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    con.commit()
    con.close()
    return out


def _nsys_session_start(good, path: Path, utc_ns: int) -> Path:
    """A copy of the good nsys export whose session started at utc_ns (TARGET_INFO_SESSION_START_TIME.utcEpochNs)."""
    path.write_bytes(Path(good["nsys"]).read_bytes())
    con = sqlite3.connect(path)
    assert con.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = ?", [utc_ns]).rowcount == 1
    con.commit()
    con.close()
    return path


def nsys_clock_1991(good, tmp: Path) -> Path:
    return _nsys_session_start(good, tmp / "clock1991.sqlite", 662_688_000 * 10**9)


def truncated_gzip(good, tmp: Path) -> Path:
    data = gzip.compress(Path(good["kineto"]).read_bytes())
    return _write(tmp / "cut.json.gz", data[: len(data) // 2])


def empty_file(good, tmp: Path) -> Path:
    return _write(tmp / "empty.json", b"")


# (builder, "refused" | "noted:<code>" (stored, with a warning of that code) | "stored")
CASES: list[tuple[Callable, str]] = [
    (numeric_string_ts, "stored"),
    (bad_utf8_start, "refused"),
    (huge_device_property, "stored"),
    (ts_abc, "noted:unreadable_ts"),
    (utf8_bom, "stored"),
    (duplicate_trace_events, "refused"),
    (nested_trace_events, "refused"),
    (control_chars_in_name, "refused"),
    (nsys_without_runtime, "noted:no_cuda_runtime"),
    (nsys_clock_1991, "refused"),
    (truncated_gzip, "refused"),
    (empty_file, "refused"),
]


def _counts(path: Path) -> dict[str, int]:
    con = dbmod.connect(str(path))
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("files", "kernels", "comm_ops")}
    finally:
        con.close()


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize(("build", "expect"), CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_input(good, tmp_path, build, expect):
    path = build(good, tmp_path)
    target = tmp_path / "job.duckdb"
    target.write_bytes(good["base"].read_bytes())
    before = _counts(target)
    res = CliRunner().invoke(app, ["ingest", str(path), "--db", str(target), "-q"])
    err = res.output
    assert not CLASS_NAME.search(err), err
    assert "\x1b" not in err and "\r" not in err
    after = _counts(target)
    if expect == "refused":
        assert res.exit_code != 0, err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("Error:") or ln.startswith("  ")]
        assert errors, err
        assert any(path.name.encode("unicode_escape").decode() in ln or path.name in ln for ln in lines), err
        assert after == before
        return
    assert res.exit_code == 0, err
    assert after["files"] == before["files"] + 1
    assert after["kernels"] > before["kernels"]
    if expect.startswith("noted:"):
        con = dbmod.connect(str(target))
        try:
            notes = con.execute("SELECT count(*) FROM ingest_notes n JOIN files f USING (file_id) "
                                "WHERE f.path LIKE ? AND n.severity = 'warning' AND n.code = ?",
                                [f"%{path.name}", expect.split(":")[1]]).fetchone()[0]
        finally:
            con.close()
        assert notes >= 1


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--max-event-mb", "-1"]])
def test_bad_option_values_give_one_line(good, tmp_path, args):
    res = CliRunner().invoke(app, ["ingest", str(good["kineto"]), "--db", str(tmp_path / "x.duckdb"), *args])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert "╭" not in res.output


@pytest.mark.parametrize("value", ["99999999999999999999999", "1e308"])
def test_out_of_range_parameters_give_the_usual_parameter_error(good, value):
    res = CliRunner().invoke(app, ["query", str(good["base"]), "step_timeline", "-p", f"max_segments={value}"])
    assert res.exit_code == 2, res.output
    assert "Conversion Error" not in res.output and not CLASS_NAME.search(res.output), res.output


def test_numeric_string_timestamps_are_stored_exactly(good, tmp_path):
    from nsys2comm.ingest import ingest

    def spans(path):
        con = dbmod.connect(None)
        ingest(con, [path], jobs=1)
        return con.execute("SELECT start_ns, end_ns, name FROM kernels ORDER BY ALL").fetchall()

    want = spans(good["kineto"])
    assert want and spans(numeric_string_ts(good, tmp_path)) == want


@pytest.mark.parametrize("base", [-5_000_000_000_000_000_000 // 10, 662_688_000 * 10**9, 4_102_444_800 * 10**9])
def test_impossible_clocks_are_refused(good, tmp_path, base):
    """A negative base, 1991 and 2100: no profiler's clock; the rank would sit decades off the others."""
    doc = _doc(good)
    doc["baseTimeNanoseconds"] = base
    path = _write(tmp_path / "clock.json", doc)
    res = CliRunner().invoke(app, ["ingest", str(path), "--db", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 1
    assert "impossible clock" in res.output and "clock.json" in res.output


@pytest.mark.parametrize("utc", [-5 * 10**9, 662_688_000 * 10**9, 4_102_444_800 * 10**9])
def test_impossible_nsys_clocks_are_refused(good, tmp_path, utc):
    """The Kineto rule on an nsys export's session start: negative, 1991 and 2100 are refused with the same words;
    the export's own 2023 start (the good file, ingested by the corpus cases) is not."""
    path = _nsys_session_start(good, tmp_path / "clock.sqlite", utc)
    res = CliRunner().invoke(app, ["ingest", str(path), "--db", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 1
    assert "impossible clock" in res.output and "clock.sqlite" in res.output and "utcEpochNs" in res.output


def test_a_copy_of_a_file_that_failed_fails_too(good, tmp_path):
    bad = _write(tmp_path / "bad.json", b'{"traceEvents": [{"ph": "X"')
    copy = _write(tmp_path / "copy.json", bad.read_bytes())
    res = CliRunner().invoke(app, ["ingest", str(bad), str(copy), "--db", str(tmp_path / "x.duckdb"), "--keep-going"])
    assert res.exit_code == 1
    assert "already ingested" not in res.output
    assert f"failed    {copy}: a copy of {bad}, which could not be ingested" in res.output


def test_nsys_string_over_the_event_limit_is_refused_in_bounded_memory(good, tmp_path):
    """A 3 MB kernel name under a 1 MB --max-event-mb: the same one-line refusal as a Kineto event, and the name is
    never read into Python (the limit is checked in SQLite)."""
    out = tmp_path / "bigname.sqlite"
    out.write_bytes(Path(good["nsys"]).read_bytes())
    con = sqlite3.connect(out)
    kid = con.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
    con.execute("UPDATE StringIds SET value = ? WHERE id = ?", ["k" * (3 << 20), kid])
    con.commit()
    con.close()
    res = CliRunner().invoke(app, ["ingest", str(out), "--db", str(tmp_path / "x.duckdb"), "--max-event-mb", "1"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "bigname.sqlite" in lines[0] and "event-size limit" in lines[0], res.output


# tier 2: the one clock rule of both importers (ingest/base.impossible_clock)
def test_clock_rule_ignores_file_dates_reset_before_2000(tmp_path):
    from nsys2comm.ingest.base import impossible_clock
    f = tmp_path / "rank0.json"
    f.write_text("{}")
    y2023 = 1_700_000_000 * 10**9
    os.utime(f, ns=(315_532_800 * 10**9, 315_532_800 * 10**9))  # 1980-01-01: an archive tool's reset date
    assert impossible_clock(y2023, f) is None
    os.utime(f, ns=(y2023, y2023))
    assert impossible_clock(y2023, f) is None
    assert "impossible clock" in impossible_clock(y2023 + 2 * 366 * 86_400 * 10**9, f)
    assert "impossible clock" in impossible_clock(662_688_000 * 10**9, f)  # 1991
    assert "impossible clock" in impossible_clock(-1, f)
    assert impossible_clock(3_600 * 10**9, f) is None  # under a day: an offset, not a date
