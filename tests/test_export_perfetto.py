"""Tiers 3 and 4: ``nsys2comm export perfetto`` on the bundled 8-rank example (fixtures/example), on synthetic
jobs built by code (two hosts; kernels overlapping on one stream) and on a real 2-rank nsys export in
../shared/traces (issue 41, deliverable 6).

The file is checked against the Trace Event Format as Perfetto's JSON importer and Catapult read it (object form
with traceEvents and displayTimeUnit; 'X' needs ts and dur; 'M' process_name / thread_name carry args.name; a flow
is one 's' and one 'f' with the same id, cat and name, each at the ts of the slice it binds to on its pid/tid, the
'f' with bp 'e' binding the enclosing slice). Expected values come from the raw Kineto files and from catalog rows
read in the test, never from the exporter.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nsys2comm import Job
from nsys2comm.cli import app
from nsys2comm.export_perfetto import export_perfetto

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_FILES = sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))
NUM = (int, float)
TS_TEXT = re.compile(rb'"(ts|dur)":(-?\d+(?:\.\d+)?)')


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    d = tmp_path_factory.mktemp("perfetto")
    db = d / "ex.duckdb"
    Job.ingest(EXAMPLE_FILES, db=db, jobs=1).close()
    out = d / "job.json"
    r = CliRunner().invoke(app, ["export", "perfetto", str(db), "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    job = Job.open(db)
    yield job, out, json.loads(out.read_bytes())
    job.close()


def _us_to_ns(v) -> int:
    return round(v * 1000)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_trace_event_format(example):
    _, path, doc = example
    assert isinstance(doc, dict) and doc["displayTimeUnit"] == "ns" and isinstance(doc["traceEvents"], list)
    phases = Counter()
    for e in doc["traceEvents"]:
        ph = e["ph"]
        phases[ph] += 1
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str), e
        if ph == "X":
            assert isinstance(e["ts"], NUM) and isinstance(e["dur"], NUM) and e["ts"] >= 0 and e["dur"] >= 0, e
            assert isinstance(e["cat"], str) and isinstance(e["args"], dict), e
        elif ph == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name"), e
            key = "sort_index" if e["name"] == "process_sort_index" else "name"
            assert isinstance(e["args"][key], int if key == "sort_index" else str), e
        elif ph in ("s", "f"):
            assert isinstance(e["id"], int) and isinstance(e["cat"], str) and isinstance(e["ts"], NUM), e
            assert (e.get("bp") == "e") == (ph == "f"), e
        else:
            pytest.fail(f"unexpected phase {ph!r}")
    assert phases["X"] and phases["M"] and phases["s"] == phases["f"]
    # µs with at most three decimals: ns precision, no float noise, no exponent form
    for key, text in TS_TEXT.findall(path.read_bytes()):
        assert len(text.partition(b".")[2]) <= 3, (key, text)


def test_one_process_per_rank(example):
    job, _, doc = example
    ranks = dict(job.con.execute("SELECT rank, host FROM ranks").fetchall())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" + (f" ({h})" if h else "") for r, h in ranks.items()}
    assert {e["pid"] for e in doc["traceEvents"]} == set(ranks)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in doc["traceEvents"]:
        if e["ph"] != "M":
            assert (e["pid"], e["tid"]) in threads, e  # every event is on a named track
    streams = job.con.execute("SELECT rank, count(DISTINCT stream_id) FROM kernels GROUP BY rank").fetchall()
    for rank, n in streams:
        assert sum(1 for (p, _), name in threads.items() if p == rank and name.startswith("stream ")
                   and not name.endswith("overlapping kernels")) == n


def test_flows_link_matched_instances(example):
    job, _, doc = example
    expected = job.con.execute("SELECT sum(ranks_seen - 1), count(*) FROM comm_transfer() "
                               "WHERE transfer_source = 'matched'").fetchone()
    assert expected[1] > 0  # the example has matched instances: the test can fail
    ev = doc["traceEvents"]
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert len(starts) == len(ends) == expected[0]
    slices = {(e["pid"], e["tid"], e["ts"]) for e in ev if e["ph"] == "X"}
    for fid, s in starts.items():
        f = ends[fid]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"])  # Perfetto keys a v1 flow by id, cat and name
        assert (s["pid"], s["tid"], s["ts"]) in slices and (f["pid"], f["tid"], f["ts"]) in slices
        assert s["pid"] != f["pid"] and s["ts"] <= f["ts"]  # from the earliest-arriving rank to a later one


def test_comm_kernels_round_trip_the_raw_traces(example):
    """The exported communication kernels are the raw traces' NCCL kernels: names, count and durations in ns,
    and each rank's kernels keep their spacing (the alignment shifts a rank as a whole)."""
    _, _, doc = example
    raw: Counter = Counter()
    raw_ts: dict[int, list] = {}
    for p in EXAMPLE_FILES:
        d = json.loads(gzip.decompress(p.read_bytes()))
        rank = d["distributedInfo"]["rank"]
        for e in d["traceEvents"]:
            if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
                raw[(rank, e["name"], _us_to_ns(e["dur"]))] += 1
                raw_ts.setdefault(rank, []).append((_us_to_ns(e["ts"]), e["name"]))
    assert raw
    got = Counter((e["pid"], e["name"], _us_to_ns(e["dur"])) for e in doc["traceEvents"]
                  if e["ph"] == "X" and e["cat"] == "communication")
    assert got == raw
    for rank, seq in raw_ts.items():
        mine = sorted((_us_to_ns(e["ts"]), e["name"]) for e in doc["traceEvents"]
                      if e["ph"] == "X" and e["cat"] == "communication" and e["pid"] == rank)
        seq.sort()
        assert [n for _, n in mine] == [n for _, n in seq]
        assert len({a - b for (a, _), (b, _) in zip(mine, seq, strict=True)}) == 1


def test_exposure_tracks(example):
    job, _, doc = example
    exposed = {r[0] for r in job.con.execute(
        "SELECT DISTINCT kernel_id FROM exposed_comm_by_kernel() WHERE exposed_ns > 0").fetchall()}
    waits = dict(job.con.execute("SELECT kernel_id, wait_ns FROM _skew_kernel_waits WHERE wait_ns > 0").fetchall())
    ev = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    exp = [e for e in ev if e["cat"] == "exposed_communication"]
    assert exposed and {e["args"]["kernel_id"] for e in exp} == exposed and len(exp) == len(exposed)
    for e in exp:
        assert e["args"]["kernel_exposed_ns"] == sum(e["args"]["exposed_ns_by_cause"].values())
        assert e["name"] == " + ".join(sorted(e["args"]["exposed_ns_by_cause"], key=lambda c: (c != "arrival_skew", c)))
    wait = [e for e in ev if e["cat"] == "arrival_wait"]
    assert {e["args"]["kernel_id"]: e["args"]["wait_ns"] for e in wait} == waits
    _assert_nested(doc)


def _assert_nested(doc: dict) -> None:
    """Slices on one track never overlap unless one holds the other (Perfetto and Catapult misplace improperly
    nested slices)."""
    by_track: dict = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append((_us_to_ns(e["ts"]), _us_to_ns(e["ts"] + e["dur"])))
    for spans in by_track.values():
        spans.sort(key=lambda x: (x[0], -x[1]))
        for (s0, e0), (s1, e1) in zip(spans, spans[1:], strict=False):
            assert s1 >= e0 or e1 <= e0, (s0, e0, s1, e1)


def test_gzip_is_the_same_document(example, tmp_path):
    job, _, doc = example
    out = tmp_path / "job.json.gz"
    export_perfetto(job.con, out)
    assert json.loads(gzip.decompress(out.read_bytes())) == doc
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temp file, renamed into place


def test_output_name_is_checked(tmp_path):
    r = CliRunner().invoke(app, ["export", "perfetto", str(EXAMPLE_FILES[0]), "-o", str(tmp_path / "job.txt")])
    assert r.exit_code == 2 and ".json" in r.stderr


def test_ranks_of_two_hosts_are_aligned(tmp_path):
    """Two hosts whose clocks differ by 37.1 ms: on the exported timeline every matched instance ends at one
    instant on all its ranks (make_latency_run ends them together in true time), as on the reference clock."""
    from fixtures import synthetic as syn

    offset = 37_123_456
    run = syn.make_latency_run(world_size=4, ranks_per_host=2, host_offsets_ns=(0, offset), reps=1)
    con = _synthetic_db()(run)
    for rr in run.ranks:
        con.execute("UPDATE ranks SET host = ? WHERE rank = ?", [rr.host, rr.rank])
    out = tmp_path / "two_hosts.json"
    export_perfetto(con, out)
    doc = json.loads(out.read_bytes())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r} (synth-node-{r // 2})" for r in range(4)}
    ends: dict = {}
    kernels: dict = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["cat"] == "communication" and e["args"].get("instance_key"):
            ends.setdefault(e["args"]["instance_key"], set()).add(_us_to_ns(e["ts"] + e["dur"]))
            kernels.setdefault(e["args"]["instance_key"], []).append((e["pid"], e["args"]["kernel_id"]))
    assert len(ends) > 4 and max(max(v) - min(v) for v in ends.values()) <= 1_000  # the offset estimate's µs
    raw = dict(con.execute("SELECT kernel_id, end_ns FROM kernels").fetchall())
    raw_spans = [max(raw[k] for _, k in ks) - min(raw[k] for _, k in ks) for ks in kernels.values()
                 if len({pid // 2 for pid, _ in ks}) == 2]  # instances on both hosts
    assert raw_spans and min(raw_spans) > offset - 1_000_000  # on the raw clocks they end 37 ms apart
    con.close()


def _synthetic_db():
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import synth_db

    return synth_db.build


def test_kernels_overlapping_on_one_stream_get_a_lane_of_their_own(tmp_path):
    """Programmatic dependent launch lets a kernel start before the previous one of its stream ends: it goes to
    "stream S, overlapping kernels", and every track still nests."""
    from fixtures import synthetic as syn

    con = _synthetic_db()(syn.make_run(world_size=2, steps=1))
    k = con.execute("SELECT kernel_id, rank, device_id, stream_id, start_ns, end_ns FROM kernels "
                    "WHERE kernel_class <> 'communication' ORDER BY rank, start_ns LIMIT 1").fetchone()
    kid, rank, dev, stream, start, end = k
    con.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, stream_id, start_ns, end_ns, name, "
                "short_name, kernel_class) VALUES (?, 1, ?, ?, ?, ?, ?, 'pdl_kernel', 'pdl_kernel', 'compute')",
                [10**9, rank, dev, stream, (start + end) // 2, end + 5_000])
    out = tmp_path / "pdl.json"
    export_perfetto(con, out)
    doc = json.loads(out.read_bytes())
    _assert_nested(doc)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    pdl = next(e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "pdl_kernel")
    first = next(e for e in doc["traceEvents"] if e["ph"] == "X" and e["args"].get("kernel_id") == kid)
    assert threads[(pdl["pid"], pdl["tid"])] == f"stream {stream}, overlapping kernels"
    assert threads[(first["pid"], first["tid"])] == f"stream {stream}"
    con.close()


def test_real_nsys_two_rank_export(shared_traces, tmp_path):
    """Tier 4: the real 2-rank nsys export with NCCL send/recv: its NCCL kernels (names, count, ns durations, read
    from the SQLite file here) come back, flows match comm_transfer, and every track nests."""
    import sqlite3

    src = shared_traces / "nsys" / "fastvideo-torchrun-2xH100-train-nccl-sendrecv-before_nsys2026.2.sqlite"
    raw = Counter()
    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as db:
        for name, dur in db.execute("SELECT s.value, k.\"end\" - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                    "JOIN StringIds s ON s.id = k.demangledName WHERE s.value LIKE 'nccl%'"):
            raw[(name.split("(")[0], dur)] += 1  # the importer writes "<(unsigned long)4096>" as "<4096ul>"
    assert sum(raw.values()) > 0
    out = tmp_path / "real.json.gz"
    with Job.open([src]) as job:
        export_perfetto(job.con, out)
        flows = job.con.execute("SELECT coalesce(sum(ranks_seen - 1), 0) FROM comm_transfer() "
                                "WHERE transfer_source = 'matched'").fetchone()[0]
    doc = json.loads(gzip.decompress(out.read_bytes()))
    got = Counter((e["name"].split("(")[0], _us_to_ns(e["dur"])) for e in doc["traceEvents"]
                  if e["ph"] == "X" and e["cat"] == "communication")
    assert got == raw
    assert sum(e["ph"] == "s" for e in doc["traceEvents"]) == flows
    _assert_nested(doc)
