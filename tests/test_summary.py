"""The summary reads only documented columns, states each kind of note once, and has one float precision
(issue 15 items 7 and 9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsys2comm import Job, catalog, summary

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(summary.COLUMNS))
def test_every_column_the_summary_reads_is_documented(name):
    obj = catalog.find(name)
    assert obj is not None, name
    missing = [c for c in summary.COLUMNS[name] if c not in obj.columns]
    assert not missing, f"{name} does not document {missing}"


@pytest.fixture(scope="module")
def example_summary():
    with Job.ingest([ROOT / "fixtures" / "example"], jobs=1) as job:
        return job.summary()


def _floats(v):
    if isinstance(v, float):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from _floats(x)
    elif isinstance(v, list):
        for x in v:
            yield from _floats(x)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_one_precision(example_summary):
    for v in _floats(example_summary):
        assert v == float(f"{v:.6g}"), v
    assert json.loads(json.dumps(example_summary)) == example_summary


def test_numbers_on_the_example(example_summary):
    s = example_summary
    assert s["ranks"] == 8 and s["failed_files"] == []
    assert s["worst_collective"]["collective"] == "all_to_all"
    assert s["worst_collective"]["group_size_assumed"] is True  # the example records no process group
    assert s["stragglers"][0]["rank"] == 7  # TraceLens's straggler on this job
    assert 0 < s["exposed_comm_pct"] <= s["comm_share_pct"] <= 100


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_per_rank_notes_once_per_kind(tmp_path):
    """A note every rank's file carries is one line saying on how many ranks, not one line per rank."""
    from fixtures.kineto_writer import write_kineto
    from fixtures.synthetic import make_run

    paths = write_kineto(make_run(world_size=3, steps=1), tmp_path / "t", "old")
    for p in paths:  # profiled without record_shapes: every rank notes missing sizes
        doc = json.loads(p.read_text())
        for e in doc["traceEvents"]:
            for k in ("Input Dims", "Input type"):
                (e.get("args") or {}).pop(k, None)
        p.write_text(json.dumps(doc))
    with Job.ingest(paths, jobs=1) as job:
        s = job.summary()
    lines = [m for m in s["missing"] if "communication kernels have no message size" in m]
    assert len(lines) == 1 and lines[0].startswith("on 3 ranks (e.g. rank 0:"), s["missing"]


def test_failed_files_listed(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "na')
    paths = sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))[:2] + [bad]
    with Job.ingest(paths, jobs=1, keep_going=True) as job:
        s = job.summary()
    assert [f["path"] for f in s["failed_files"]] == [str(bad)]
    assert str(bad) in s["failed_files"][0]["error"]
