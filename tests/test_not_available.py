"""What cannot be computed is not available, never 0 (issue 10 item 7): skew with one rank, overlap without
communication, bandwidth without sizes. NULL in query results, named in the summary's ``missing``, thresholds not
evaluated (exit 3 only with --strict), a "not available" box in the report. Also the epilogue: a failed ingest
leaves no new file, and ``summary --json`` without traces still writes a valid document."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm import Job
from nsys2comm.cli import app


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)


def _strip_comm(path: Path) -> Path:
    """The same trace without its communication (kernels and their launches): a compute-only job."""
    doc = json.loads(path.read_text())
    comm_corr = {e["args"]["correlation"] for e in doc["traceEvents"]
                 if e.get("cat") == "kernel" and re.match(r"(void )?nccl", e["name"], re.I)}
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if (e.get("args") or {}).get("correlation") not in comm_corr
                          and not str(e.get("name", "")).startswith(("nccl:", "record_param_comms", "c10d::"))]
    out = path.with_name("nocomm_" + path.name)
    out.write_text(json.dumps(doc))
    return out


def _strip_shapes(path: Path) -> Path:
    """The same trace profiled without record_shapes: no 'Input Dims'/'Input type', so no message sizes."""
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        for k in ("Input Dims", "Input type"):
            (e.get("args") or {}).pop(k, None)
    doc.pop("record_shapes", None)
    out = path.with_name("noshapes_" + path.name)
    out.write_text(json.dumps(doc))
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    d = tmp_path_factory.mktemp("na")
    one = write_kineto(make_run(world_size=1, steps=1), d / "one", "new")
    two_old = write_kineto(make_run(world_size=2, steps=1), d / "old", "old")
    nocomm = [_strip_comm(p) for p in write_kineto(make_run(world_size=2, steps=1), d / "nc", "new")]
    no_sizes = [_strip_shapes(p) for p in two_old]
    out = {}
    for name, paths in (("one_rank", one), ("no_comm", nocomm), ("old", two_old), ("no_sizes", no_sizes)):
        db = d / f"{name}.duckdb"
        Job.ingest(paths, db=db, jobs=1).close()
        out[name] = db
    return out


def _summary(db, *args):
    r = run("summary", db, "--json", *args)
    return r, json.loads(r.stdout)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_one_rank_skew_is_null_not_zero(jobs, tmp_path):
    db = jobs["one_rank"]
    with Job.open(db) as job:
        skew = job.query("collective_skew")
        assert skew.height and skew["ranks_seen"].max() == 1  # instances exist, seen on one rank
        for c in ("start_skew_ns", "end_skew_ns", "last_arriving_rank", "rank_wait_ns"):
            assert skew[c].null_count() == skew.height, c
        assert job.query("rank_wait").height == 0
    r, s = _summary(db, "--max-skew-ms", "1")
    assert r.exit_code == 0, r.output  # not a violation ...
    assert s["max_skew_ms"] is None and s["ok"] is None  # ... and not a pass either
    assert any(m.startswith("max_skew_ms: not available") and "two ranks" in m for m in s["missing"])
    (t,) = s["thresholds"]
    assert t["ok"] is None and t["value"] is None
    assert "threshold not evaluated" in r.stderr
    r = run("summary", db, "--max-skew-ms", "1", "--strict")
    assert r.exit_code == 3
    assert "not evaluated" in r.stdout and "0.000 ms" not in r.stdout and "none found" not in r.stdout
    # the report: a "not available" box with the reason, no heatmap, no finding about start skew
    out = tmp_path / "one.html"
    assert run("report", db, "-o", out).exit_code == 0
    html = out.read_text()
    sec = html[html.index('id="sec-skew"'):]
    sec = sec[:sec.index("</section>")]
    assert "Not available" in sec and "at least two ranks" in sec
    assert 'id="chart-skew"' not in sec and 'id="chart-straggler"' not in sec  # no chart frames
    findings = html[html.index('id="sec-findings"'):]
    assert "apart" not in findings[:findings.index("</section>")]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_no_communication_overlap_is_null(jobs, tmp_path):
    db = jobs["no_comm"]
    with Job.open(db) as job:
        ov = job.query("overlap_by_rank")
        assert ov.height == 2 and ov["comm_ns"].sum() == 0 and ov["busy_ns"].min() > 0
        assert ov["comm_overlap_pct"].null_count() == 2
    r, s = _summary(db, "--min-overlap-pct", "50")
    assert r.exit_code == 0 and s["overlap_pct"] is None and s["ok"] is None
    assert any(m.startswith("overlap_pct: not available") and "no communication" in m for m in s["missing"])
    assert s["max_skew_ms"] is None and s["comm_share_pct"] == 0  # no communication: a true 0 % share
    assert run("summary", db, "--min-overlap-pct", "50", "--strict").exit_code == 3
    out = tmp_path / "nc.html"
    assert run("report", db, "-o", out).exit_code == 0
    html = out.read_text()
    sec = html[html.index('id="sec-overlap"'):]
    sec = sec[:sec.index("</section>")]
    assert sec.count("Not available") == 1 and "no communication kernels" in sec  # once for both charts
    assert 'id="chart-overlap-rank"' not in sec


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_bandwidth_without_sizes(jobs, tmp_path):
    db = jobs["no_sizes"]
    with Job.open(db) as job:
        n_sized = job.sql("SELECT count(msg_bytes) AS n FROM comm_ops")["n"][0]
        assert n_sized == 0 and job.query("collective_bandwidth").height == 0
    _, s = _summary(db)
    w = s["worst_collective"]
    assert w is None or w["busbw_gbps"] is None
    assert any(m.startswith("worst_collective.busbw_gbps: not available") for m in s["missing"]), (n_sized, s)
    out = tmp_path / "old.html"
    assert run("report", db, "-o", out).exit_code == 0
    html = out.read_text()
    sec = html[html.index('id="sec-busbw"'):]
    sec = sec[:sec.index("</section>")]
    assert "Not available" in sec and 'id="chart-busbw"' not in sec


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_failed_ingest_leaves_no_new_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "na')
    db = tmp_path / "new.duckdb"
    r = run("ingest", bad, "--db", db)
    assert r.exit_code == 1 and str(bad) in r.stderr
    assert not db.exists() and not Path(str(db) + ".wal").exists()
    good = write_kineto(make_run(world_size=1, steps=1), tmp_path / "g", "new")[0]
    bad2 = tmp_path / "bad2.json"
    bad2.write_text("[1, 2]")
    r = run("ingest", bad, bad2, "--db", db, "--keep-going")
    assert r.exit_code == 1 and not db.exists()  # nothing ingested: no new file either
    # an existing database stays, with what it had
    assert run("ingest", good, "--db", db).exit_code == 0 and db.exists()
    r = run("ingest", bad, "--db", db)
    assert r.exit_code == 1 and db.exists()
    with Job.open(db) as job:
        assert job.sql("SELECT count(*) AS n FROM files")["n"][0] == 1


def test_summary_json_without_traces(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run("summary", empty, "--json", "--max-skew-ms", "1")
    assert r.exit_code == 1 and r.stdout.strip()
    s = json.loads(r.stdout)
    assert s["ranks"] == 0 and s["files"] == 0 and s["missing"][0].startswith("no traces")
    assert s["thresholds"][0]["ok"] is None and s["ok"] is None
    assert s["comm_share_pct"] is None and s["max_skew_ms"] is None
    r = run("summary", empty)
    assert r.exit_code == 1 and "directory holds no trace files" in r.stderr


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_busbw_on_an_assumed_group_size_is_flagged(jobs, tmp_path):
    """Old traces record shapes but no process group: busbw rests on the world size, and every consumer says so."""
    db = jobs["old"]
    with Job.open(db) as job:
        assert set(job.sql("SELECT DISTINCT group_source FROM comm_ops")["group_source"]) == {"assumed_world_size"}
        bw = job.query("collective_bandwidth")
    assert bw.height and bw["group_size_assumed"].all() and bw["busbw_gbps"].null_count() < bw.height
    _, s = _summary(db)
    assert s["worst_collective"]["group_size_assumed"] is True
    out = tmp_path / "old.html"
    assert run("report", db, "-o", out).exit_code == 0
    html = out.read_text()
    findings = html[html.index('id="sec-findings"'):]
    assert "the trace records no process group" in findings[:findings.index("</section>")]
    assert "group size 2 assumed" in html  # the chart's series label
