"""nsys2comm diff / Job.diff: runs that differ in known ways give exactly those deltas (issue 14, part 3).

The synthetic runs here are built so that every number is known: per step, each rank computes on stream 7, then
joins one all_reduce and one all_gather on stream 20 (rank r arrives 10·r µs after the first at the all_reduce,
and 5·(3 − r) µs late at the all_gather; every rank of a collective ends when the last arrival's transfer is done).
A step ends 100 µs after its last kernel and the next begins 100 µs later. Expected values come from
:func:`reference`, plain interval arithmetic on the Run objects (no SQL), and the headline changes are also
written out as literal numbers.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest
from synth_db import build, save
from test_report import assert_rendered, browser, dump_dom  # noqa: F401  (browser: the fixture)
from typer.testing import CliRunner

from fixtures import synthetic as syn
from nsys2comm import Job, catalog, compare
from nsys2comm import diff as diff_fn
from nsys2comm import output as out_
from nsys2comm.cli import app

US = syn.US
MIB = 1 << 20
AR_TRANSFER_US = {1 * MIB: 100, 4 * MIB: 300}  # all_reduce transfer time by message size
AG_BYTES, AG_TRANSFER_US = 512 * 1024, 80
GEMM = syn.COMPUTE_KERNELS[0][0]
FV = "nsys/fastvideo-torchrun-2xH100-train-nccl-sendrecv-before_nsys2026.2.sqlite"


# ---------------------------------------------------------------------------------------------------------------
# synthetic runs


def make_diff_run(*, steps: int = 2, ar_bytes: int = MIB, straggler: int | None = None, delay_us: int = 0,
                  compute_us: int = 500, world_size: int = 4) -> syn.Run:
    """A run per the module docstring; ``straggler`` arrives ``delay_us`` later at every all_reduce, compute
    kernels last ``compute_us`` (beyond 600 µs they hide part of the all_reduce)."""
    ranks = [syn.RankRun(rank=r, pid=3000 + r, tid=3000 + r, device=r) for r in range(world_size)]
    corr = [1] * world_size
    seq = 0
    t = syn.T0_NS

    def kernel(r, start, end, name, stream):
        k = syn.Kernel(r, r, stream, start, end, name, corr[r], launch_start_ns=start - 30 * US,
                       launch_end_ns=start - 25 * US, launch_tid=ranks[r].tid)
        corr[r] += 1
        ranks[r].kernels.append(k)
        return k

    def collective(coll, tname, arrive, transfer_us, msg_bytes):
        nonlocal seq
        seq += 1
        end = max(arrive) + transfer_us * US
        n = msg_bytes // 2  # bf16 elements
        in_n, out_n = (n // world_size, n) if coll == "all_gather" else (n, n)
        for r in range(world_size):
            k = kernel(r, arrive[r], end, syn.comm_kernel_name(coll, "BFloat16", "new"), syn.COMM_STREAM)
            ranks[r].comm.append(syn.CommOp(k, coll, tname, "BFloat16", in_n, out_n, world_size, "0", "default_pg",
                                            list(range(world_size)), seq, cpu_start_ns=arrive[r] - 40 * US,
                                            cpu_end_ns=arrive[r] - 20 * US))
        return end

    for step in range(steps):
        s = t
        for r in range(world_size):
            kernel(r, s, s + compute_us * US, GEMM, syn.COMPUTE_STREAM)
        arrive = [s + (600 + 10 * r + (delay_us if r == straggler else 0)) * US for r in range(world_size)]
        ar_end = collective("all_reduce", "allreduce", arrive, AR_TRANSFER_US[ar_bytes], ar_bytes)
        ag_arrive = [ar_end + (100 + 5 * (world_size - 1 - r)) * US for r in range(world_size)]
        ag_end = collective("all_gather", "_allgather_base", ag_arrive, AG_TRANSFER_US, AG_BYTES)
        end = ag_end + 100 * US
        for rr in ranks:
            rr.steps.append(syn.Step(100 + step, s, end))
        t = end + 100 * US
    for rr in ranks:
        rr.kernels.sort(key=lambda k: (k.start_ns, k.correlation))
    return syn.Run(world_size, "new", ranks)


def _db(path: Path, run: syn.Run) -> Path:
    return save(build(run), path)  # built in memory (a template copy), then written whole


# ---------------------------------------------------------------------------------------------------------------
# the independent reference: interval arithmetic on the Run


def _union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(iv) -> int:
    return sum(b - a for a, b in iv)


def _intersect(u, v) -> int:
    """|u ∩ v| of two unions."""
    total, i, j = 0, 0, 0
    while i < len(u) and j < len(v):
        total += max(0, min(u[i][1], v[j][1]) - max(u[i][0], v[j][0]))
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return total


def _clip(iv, lo, hi):
    return [(max(a, lo), min(b, hi)) for a, b in iv if min(b, hi) > max(a, lo)]


def rank_times(intervals, windows) -> dict:
    """busy, idle, comm, overlapped, exposed ns summed over ``windows`` ((start, end), ...); ``intervals`` are
    (start, end, kind) with kind 'comm', 'compute' or 'other' (memory)."""
    out = dict.fromkeys(("busy", "idle", "comm", "overlapped", "exposed"), 0)
    for lo, hi in windows:
        every = _union(_clip([(a, b) for a, b, _ in intervals], lo, hi))
        comm = _union(_clip([(a, b) for a, b, k in intervals if k == "comm"], lo, hi))
        comp = _union(_clip([(a, b) for a, b, k in intervals if k == "compute"], lo, hi))
        ov = _intersect(comm, comp)
        out["busy"] += _length(every)
        out["idle"] += (hi - lo) - _length(every)
        out["comm"] += _length(comm)
        out["overlapped"] += ov
        out["exposed"] += _length(comm) - ov
    return out


def _bucket(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def reference(run: syn.Run) -> dict:
    """Per-step values of the diff's job, rank and collective rows, from the Run alone."""
    steps = max(len(r.steps) for r in run.ranks)
    ranks, waits, buckets, skews = {}, {r.rank: 0 for r in run.ranks}, {}, {}
    starts: dict[int, dict[int, int]] = {}
    for rr in run.ranks:
        comm_ids = {id(c.kernel) for c in rr.comm}
        iv = [(k.start_ns, k.end_ns, "comm" if id(k) in comm_ids else "compute") for k in rr.kernels]
        t = rank_times(iv, [(s.start_ns, s.end_ns) for s in rr.steps])
        ranks[rr.rank] = {k: v / len(rr.steps) for k, v in t.items()}
        comp = _union([(a, b) for a, b, k in iv if k == "compute"])
        for c in rr.comm:
            key = (c.collective, _bucket(c.msg_bytes))
            b = buckets.setdefault(key, dict(ops=0, bytes=0, time=0, exposed=0))
            dur = c.kernel.end_ns - c.kernel.start_ns
            b["ops"] += 1
            b["bytes"] += c.msg_bytes
            b["time"] += dur
            b["exposed"] += dur - _intersect([[c.kernel.start_ns, c.kernel.end_ns]], comp)
            starts.setdefault(c.seq, {})[rr.rank] = c.kernel.start_ns
    colls = {c.seq: c.collective for c in run.ranks[0].comm}
    for seq, by_rank in starts.items():
        last = max(by_rank.values())
        for r, st in by_rank.items():
            waits[r] += last - st
        skews.setdefault(colls[seq], []).append(last - min(by_rank.values()))
    return {
        "steps": steps,
        "rank": ranks,
        "wait": {r: w / steps for r, w in waits.items()},
        "bucket": {k: {m: v / steps for m, v in b.items()} for k, b in buckets.items()},
        "skew": {c: (sum(v) / len(v), max(v)) for c, v in skews.items()},
    }


def expected_rows(run: syn.Run) -> dict[tuple, float]:
    """(section, metric, collective, bucket_lo_bytes, rank) -> value, for the rows the reference knows."""
    ref = reference(run)
    out: dict[tuple, float] = {("job", "steps", None, None, None): ref["steps"]}
    names = {"exposed": "exposed_comm_ns_per_step", "idle": "idle_ns_per_step", "comm": "comm_ns_per_step"}
    for r, t in ref["rank"].items():
        for k, m in names.items():
            out[("rank", m, None, None, r)] = t[k]
        out[("rank", "overlap_pct", None, None, r)] = 100 * t["overlapped"] / t["comm"]
        out[("rank", "wait_ns_per_step", None, None, r)] = ref["wait"][r]
    for k, m in {**names, "busy": "busy_ns_per_step"}.items():
        out[("job", m, None, None, None)] = sum(t[k] for t in ref["rank"].values())
    out[("job", "overlap_pct", None, None, None)] = (100 * sum(t["overlapped"] for t in ref["rank"].values())
                                                     / sum(t["comm"] for t in ref["rank"].values()))
    out[("job", "wait_ns_per_step", None, None, None)] = sum(ref["wait"].values())
    for (coll, lo), b in ref["bucket"].items():
        for k, m in (("ops", "ops_per_step"), ("bytes", "bytes_per_step"), ("time", "time_ns_per_step"),
                     ("exposed", "exposed_ns_per_step")):
            out[("collective", m, coll, lo, None)] = b[k]
        for k, m in (("bytes", "bytes_per_op"), ("time", "time_ns_per_op"), ("exposed", "exposed_ns_per_op")):
            out[("collective", m, coll, lo, None)] = b[k] / b["ops"]  # per operation: the steps cancel
    for coll, (mean, mx) in ref["skew"].items():
        out[("skew", "mean_start_skew_ns", coll, None, None)] = mean
        out[("skew", "max_start_skew_ns", coll, None, None)] = mx
    return out


def _values(df: pl.DataFrame, side: str) -> dict[tuple, float | None]:
    return {(r["section"], r["metric"], r["collective"], r["bucket_lo_bytes"], r["rank"]): r[side]
            for r in df.iter_rows(named=True) if r["group_size"] is None}


def _row(df: pl.DataFrame, section: str, metric: str, **keys) -> dict:
    d = df.filter((pl.col("section") == section) & (pl.col("metric") == metric))
    for k, v in keys.items():
        d = d.filter(pl.col(k).is_null() if v is None else pl.col(k) == v)
    assert d.height == 1, (section, metric, keys, d)
    return d.row(0, named=True)


def _assert_matches_reference(df: pl.DataFrame, base_run: syn.Run, new_run: syn.Run) -> None:
    for side, run in (("base", base_run), ("new", new_run)):
        got, want = _values(df, side), expected_rows(run)
        for key, value in want.items():
            assert got.get(key) == pytest.approx(value, rel=1e-12, abs=1e-9), (side, key, got.get(key), value)
        for key, value in got.items():  # a row the reference does not know is absent on that side
            if key[0] == "collective" and value is not None:
                assert key in want, (side, key, value)


# ---------------------------------------------------------------------------------------------------------------
# fixtures

BASE = dict()
RUNS = {
    "base": BASE,
    "base3": dict(steps=3),  # the same run, one step longer
    "bucket": dict(ar_bytes=4 * MIB),  # bigger gradient bucket: 1 MiB → 4 MiB all_reduce
    "straggler": dict(straggler=1, delay_us=100),  # rank 1 arrives 100 µs late at every all_reduce
    "overlap": dict(compute_us=700),  # compute runs on under the all_reduce
}


@pytest.fixture(scope="module")
def dbs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("diff")
    return {name: _db(d / f"{name}.duckdb", make_diff_run(**kw)) for name, kw in RUNS.items()}


@pytest.fixture(scope="module")
def diffs(dbs) -> dict[str, pl.DataFrame]:
    out = {}
    with Job.open(dbs["base"]) as base:
        for name in RUNS:
            with Job.open(dbs[name]) as new:
                out[name] = base.diff(new)
    return out


def runner(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)


# ---------------------------------------------------------------------------------------------------------------
# the reference itself is right where it can be checked by hand


def test_reference_by_hand():
    ref = reference(make_diff_run())
    # rank 0, µs into the step: compute 0–500, all_reduce 600–730 (rank 3 arrives last at 630, +100), all_gather
    # 845–925 (rank 0 arrives last, 15 µs after rank 3 at 830), step end 1025
    r0 = ref["rank"][0]
    assert r0["comm"] == (130 + 80) * US and r0["exposed"] == r0["comm"] and r0["busy"] == (500 + 210) * US
    assert r0["idle"] == (100 + 115 + 100) * US
    assert ref["wait"] == {0: 30 * US, 1: 25 * US, 2: 20 * US, 3: 15 * US}  # all_reduce + all_gather waits
    # every rank's step is 500 compute + its all_reduce + its all_gather + idle, summing to the window
    for rr in make_diff_run().ranks:
        t = ref["rank"][rr.rank]
        assert t["busy"] + t["idle"] == rr.steps[0].end_ns - rr.steps[0].start_ns


# ---------------------------------------------------------------------------------------------------------------
# runs that differ in known ways


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_self_diff_is_all_zero(diffs):
    df = diffs["base"]
    known = df.filter(pl.col("base").is_not_null())
    assert known.height == df.height - df.filter(pl.col("base").is_null() & pl.col("new").is_null()).height
    assert (known["delta"] == 0).all() and (known["base"] == known["new"]).all()
    # delta_pct: 0 where base is not 0, NULL where it is 0 (overlap_pct of a run with no overlap, waits of rank 3)
    assert (known.filter(pl.col("base") != 0)["delta_pct"] == 0).all()
    assert known.filter(pl.col("base") == 0)["delta_pct"].null_count() == known.filter(pl.col("base") == 0).height
    assert known.filter(pl.col("base") == 0).height > 0
    assert (df["impact_ns"].drop_nulls() == 0).all()
    _assert_matches_reference(df, make_diff_run(), make_diff_run())


def test_runs_of_different_length_compare_per_step(diffs):
    df = diffs["base3"]
    assert _row(df, "job", "steps")["delta"] == 1
    assert (df.filter(pl.col("metric") != "steps")["delta"].drop_nulls() == 0).all()
    _assert_matches_reference(df, make_diff_run(), make_diff_run(steps=3))


def test_bigger_bucket(diffs):
    df = diffs["bucket"]
    _assert_matches_reference(df, make_diff_run(), make_diff_run(ar_bytes=4 * MIB))
    old = dict(collective="all_reduce", bucket_lo_bytes=MIB)
    new = dict(collective="all_reduce", bucket_lo_bytes=4 * MIB)
    # the 1 MiB bucket is gone, the 4 MiB one is new: each present on one side only, the other side NULL
    r = _row(df, "collective", "ops_per_step", **old)
    assert (r["base"], r["new"], r["delta"], r["delta_pct"]) == (4, None, None, None)
    r = _row(df, "collective", "bytes_per_step", **new)
    assert (r["base"], r["new"]) == (None, 4 * 4 * MIB)
    # all_reduce kernels per step: 130, 120, 110, 100 µs (ranks wait for rank 3) → 330, 320, 310, 300 µs
    r = _row(df, "collective", "exposed_ns_per_step", **new)
    assert r["new"] == 1260 * US and r["impact_ns"] == 1260 * US
    assert _row(df, "collective", "exposed_ns_per_step", **old)["impact_ns"] == -460 * US
    # busbw of each all_reduce bucket, 2(n−1)/n × S / transfer time (latest start → earliest end of an instance:
    # the last arrival's transfer, AR_TRANSFER_US), on one side only; the all_gather's is unchanged
    assert _row(df, "collective", "busbw_gbps", group_size=4, **old)["base"] == pytest.approx(
        1.5 * MIB / (AR_TRANSFER_US[MIB] * US))
    assert _row(df, "collective", "busbw_gbps", group_size=4, **new)["new"] == pytest.approx(
        1.5 * 4 * MIB / (AR_TRANSFER_US[4 * MIB] * US))
    ag = _row(df, "collective", "busbw_gbps", group_size=4, collective="all_gather", bucket_lo_bytes=AG_BYTES)
    assert ag["delta"] == 0
    # every rank's all_reduce takes 200 µs more, all exposed; the job's exposed communication per step +800 µs
    for r in range(4):
        assert _row(df, "rank", "exposed_comm_ns_per_step", rank=r)["delta"] == 200 * US
    job = _row(df, "job", "exposed_comm_ns_per_step")
    assert job["delta"] == 4 * 200 * US and job["impact_ns"] == 4 * 200 * US
    # the latency model's floor is the all_reduce transfer time
    lat = _row(df, "latency", "latency_floor_ns", collective="all_reduce", group_size=4)
    assert (lat["base"], lat["new"]) == (100 * US, 300 * US)


def test_added_straggler(diffs):
    df = diffs["straggler"]
    _assert_matches_reference(df, make_diff_run(), make_diff_run(straggler=1, delay_us=100))
    # all_reduce arrivals 600, 610, 620, 630 µs → 600, 710, 620, 630; all_gather waits 0, 5, 10, 15 µs stay
    want = {0: (30, 110), 1: (25, 5), 2: (20, 100), 3: (15, 95)}
    for r, (b, n) in want.items():
        row = _row(df, "rank", "wait_ns_per_step", rank=r)
        assert (row["base"], row["new"]) == (b * US, n * US)
    assert _row(df, "job", "wait_ns_per_step")["delta_pct"] == pytest.approx(100 * (310 - 90) / 90)
    # rank 1 is now the likeliest straggler (least wait) and the last to arrive at every all_reduce
    order = _row(df, "skew", "straggler_rank_order", rank=1)
    assert (order["base"], order["new"]) == (3, 1)
    last = _row(df, "skew", "arrived_last_pct", rank=1)
    assert (last["base"], last["new"]) == (0, 50)
    assert _row(df, "skew", "arrived_last_pct", rank=3)["delta"] == -50
    skew = _row(df, "skew", "max_start_skew_ns", collective="all_reduce")
    assert (skew["base"], skew["new"]) == (30 * US, 110 * US)
    assert _row(df, "skew", "max_start_skew_ns", collective="all_gather")["delta"] == 0
    # the all_reduce ends 80 µs later: ranks 0, 2, 3 spend 80 µs more in it (exposed), rank 1 20 µs less
    for r, d in {0: 80, 1: -20, 2: 80, 3: 80}.items():
        assert _row(df, "rank", "exposed_comm_ns_per_step", rank=r)["delta"] == d * US
    assert _row(df, "job", "exposed_comm_ns_per_step")["delta"] == 220 * US


def test_better_overlap(diffs):
    df = diffs["overlap"]
    _assert_matches_reference(df, make_diff_run(), make_diff_run(compute_us=700))
    # compute now runs to 700 µs: rank r's all_reduce (from 600 + 10r) is hidden for 100 − 10r µs
    for r in range(4):
        row = _row(df, "rank", "exposed_comm_ns_per_step", rank=r)
        assert row["delta"] == -(100 - 10 * r) * US
        assert _row(df, "rank", "overlap_pct", rank=r)["base"] == 0
    assert _row(df, "job", "overlap_pct")["delta_pct"] is None  # base 0: relative change undefined
    assert _row(df, "collective", "exposed_ns_per_step", collective="all_reduce", bucket_lo_bytes=MIB)["delta"] \
        == -(100 + 90 + 80 + 70) * US
    assert _row(df, "collective", "time_ns_per_step", collective="all_reduce", bucket_lo_bytes=MIB)["delta"] == 0


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_rows_sorted_by_impact_deterministically(diffs, dbs):
    for df in diffs.values():
        imp = df["impact_ns"].to_list()
        known = [abs(v) for v in imp if v is not None]
        assert known == sorted(known, reverse=True)
        assert all(v is None for v in imp[len(known):])  # NULL impact last
    df = diffs["bucket"]
    assert df.row(0, named=True)["bucket_lo_bytes"] == 4 * MIB  # the new bucket moved most exposed time
    # per-metric impact: the job's exposed communication grew by 800 µs per step, its idle time did not move, and
    # the other job rows (causes, not exposed or idle time) have none
    job = {r["metric"]: r["impact_ns"] for r in df.filter(pl.col("section") == "job").iter_rows(named=True)}
    assert {m: v for m, v in job.items() if v is not None} == {"exposed_comm_ns_per_step": 4 * 200 * US,
                                                               "idle_ns_per_step": 0}
    with Job.open(dbs["base"]) as base, Job.open(dbs["bucket"]) as new:
        assert base.diff(new).equals(df)  # same order every time
        assert diff_fn(base, new).equals(df)


# ---------------------------------------------------------------------------------------------------------------
# CLI: output layer, JSON keys, thresholds

DOC_KEYS = ["schema_version", "nsys2comm_version", "base", "new", "step_impact_ns", "exposed_comm_change_pct",
            "wait_change_pct", "busbw_change_pct", "per", "impact_ns", "rows", "missing", "thresholds", "ok"]
ROW_KEYS = ["section", "metric", "key", "base", "new", "delta", "delta_pct", "impact_ns", "collective", "group_size",
            "bucket_lo_bytes", "bucket_hi_bytes", "rank"]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_json_keys_are_stable(dbs):
    r = runner("diff", dbs["base"], dbs["straggler"], "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert list(d) == DOC_KEYS and d["schema_version"] == 1
    assert list(d["base"]) == ["source", "ranks", "steps", "has_steps", "iteration_source"]
    assert d["base"]["iteration_source"] == d["new"]["iteration_source"] == "marker"
    assert all(list(row) == ROW_KEYS for row in d["rows"])
    assert d["base"]["source"] == str(dbs["base"]) and d["new"]["steps"] == 2 and d["base"]["has_steps"]
    assert d["wait_change_pct"] == pytest.approx(244.444, rel=1e-5)
    assert d["thresholds"] == [] and d["ok"] is True
    assert list(compare.COLUMNS) and compare.ROW_COLUMNS == ROW_KEYS


@pytest.mark.parametrize("name", sorted(compare.COLUMNS))
def test_every_column_the_diff_reads_is_documented(name):
    obj = catalog.find(name)
    assert obj is not None, name
    assert not [c for c in compare.COLUMNS[name] if c not in obj.columns]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_thresholds_exit_3_0_and_not_evaluated(dbs):
    b, s, o = dbs["base"], dbs["straggler"], dbs["bucket"]
    # with the straggler: exposed communication per step 810 → 1030 µs (+27.2 %), waits 90 → 310 µs (+244 %);
    # bus bandwidth comes from the transfer time (latest start → earliest end), which waiting does not change
    r = runner("diff", b, s, "--json", "--max-exposed-regression-pct", "5", "--max-wait-regression-pct", "250")
    assert r.exit_code == 3, r.output
    d = json.loads(r.stdout)
    assert d["exposed_comm_change_pct"] == pytest.approx(100 * 220 / 810, rel=1e-5)
    assert [(t["name"], t["ok"]) for t in d["thresholds"]] == [("max_exposed_regression_pct", False),
                                                               ("max_wait_regression_pct", True)]
    assert d["ok"] is False and "threshold violated" in r.stderr
    assert runner("diff", b, s, "--max-exposed-regression-pct", "30").exit_code == 0
    with Job.open(b) as base, Job.open(s) as new, Job.open(o) as bucket:
        c = base.compare(new)
        for limits, ok in ((dict(max_exposed_regression_pct=27), False), (dict(max_exposed_regression_pct=28), True),
                           (dict(max_wait_regression_pct=200), False), (dict(max_wait_regression_pct=250), True),
                           (dict(max_busbw_drop_pct=0), True)):
            assert compare.document(c, **limits)["ok"] is ok, limits
        d = compare.document(c, max_busbw_drop_pct=0)
        assert d["busbw_change_pct"] == pytest.approx(0, abs=1e-9)
        assert d["thresholds"][0]["value"] == pytest.approx(-d["busbw_change_pct"])  # the drop, in %
        # the bigger bucket: the all_gather bucket is the only one in both runs, and it did not change
        d = base.diff_summary(bucket, max_busbw_drop_pct=0)
        assert d["busbw_change_pct"] == 0 and d["ok"] is True
        # a run against itself: every change 0 %, every threshold holds
        d = base.diff_summary(base, max_wait_regression_pct=0, max_exposed_regression_pct=0, max_busbw_drop_pct=0)
        assert d["ok"] is True and [t["value"] for t in d["thresholds"]] == [0, 0, 0]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_threshold_not_evaluated_when_metric_unavailable(tmp_path):
    one = _db(tmp_path / "one.duckdb", make_diff_run(world_size=1))  # one rank: no waits, no skew
    r = runner("diff", one, one, "--json", "--max-wait-regression-pct", "5")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["wait_change_pct"] is None and d["thresholds"][0]["ok"] is None and d["ok"] is None
    assert any(m.startswith("wait_change_pct: not available") for m in d["missing"])
    assert "not evaluated" in r.stderr
    assert runner("diff", one, one, "--max-wait-regression-pct", "5", "--strict").exit_code == 3


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_rows_through_the_output_layer(dbs, tmp_path):
    r = runner("diff", dbs["base"], dbs["bucket"], "--format", "csv")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == ",".join(ROW_KEYS) and "impact on step time" in r.stderr
    out = tmp_path / "d.parquet"
    assert runner("diff", dbs["base"], dbs["bucket"], "-o", out).exit_code == 0
    with Job.open(dbs["base"]) as base, Job.open(dbs["bucket"]) as new:
        assert pl.read_parquet(out).equals(out_.round_percentages(base.diff(new)))
    assert runner("diff", dbs["base"], dbs["bucket"], "--format", "parquet").exit_code == 2
    assert runner("diff", dbs["base"], tmp_path / "missing.duckdb").exit_code == 1


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_report_with_baseline(dbs, tmp_path):
    out = tmp_path / "r.html"
    r = runner("report", dbs["straggler"], "--baseline", dbs["base"], "-o", out)
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert 'id="sec-changes"' in page and page.index('id="sec-findings"') < page.index('id="sec-changes"') \
        < page.index('id="sec-breakdown"')
    for chart in ("chart-changes-rank", "chart-changes-coll"):
        assert f'id="{chart}"' in page
    assert "wait_ns_per_step" in page
    plain = tmp_path / "plain.html"
    assert runner("report", dbs["straggler"], "-o", plain).exit_code == 0
    assert 'id="sec-changes"' not in plain.read_text()


def test_report_with_baseline_renders_in_chromium(dbs, tmp_path, browser):  # noqa: F811
    with Job.open(dbs["base"]) as base, Job.open(dbs["bucket"]) as new:
        out = new.report(tmp_path / "changes.html", baseline=base)
    dom = dump_dom(browser, out)
    assert assert_rendered(dom) >= 2
    for chart in ("chart-changes-rank", "chart-changes-coll"):
        tag = re.search(rf'<div[^>]*\sid="{chart}"[^>]*>', dom)
        assert tag and 'data-status="rendered"' in tag.group(0), chart


def test_change_charts_draw_from_diff_rows(diffs):
    from nsys2comm.report import charts

    df = diffs["bucket"]
    spec = charts.changes_by_rank_chart(df).to_dict()
    assert spec["encoding"]["yOffset"]["field"] == "run"
    coll = charts.changes_by_collective_chart(df).to_dict()
    values = next(iter(coll["datasets"].values()))
    got = {(v["collective"], v["run"]): v["ms"] for v in values}
    assert got[("all_reduce", "base")] == pytest.approx(0.46) and got[("all_reduce", "new")] == pytest.approx(1.26)


# ---------------------------------------------------------------------------------------------------------------
# the real shared nsys export against a copy with a known change

DELTA_NS = 1000  # every communication kernel of rank 1 ends 1 µs later


def _raw_intervals(con) -> dict[int, list]:
    rows = con.execute("""
        SELECT rank, start_ns, end_ns, CASE WHEN kernel_class = 'communication' THEN 'comm'
               WHEN kernel_class IN ('gemm', 'convolution', 'attention', 'compute') THEN 'compute' ELSE 'other' END
        FROM kernels WHERE end_ns > start_ns
        UNION ALL SELECT rank, start_ns, end_ns, 'other' FROM mem_ops WHERE end_ns > start_ns""").fetchall()
    out: dict[int, list] = {}
    for rank, a, b, kind in rows:
        out.setdefault(rank, []).append((a, b, kind))
    return out


def _kernel_time_by_collective(con) -> dict[str, int]:
    return dict(con.execute("""SELECT o.collective, sum(k.end_ns - k.start_ns)
                               FROM kernels k JOIN comm_ops o USING (kernel_id) GROUP BY 1""").fetchall())


@pytest.fixture(scope="module")
def fastvideo(shared_traces, tmp_path_factory):
    d = tmp_path_factory.mktemp("fv")
    base = d / "base.duckdb"
    Job.ingest([shared_traces / FV], db=base, jobs=1).close()
    new = d / "new.duckdb"
    shutil.copy(base, new)
    with Job.open(new, write=True) as job:
        job.sql(f"UPDATE kernels SET end_ns = end_ns + {DELTA_NS} "
                "WHERE rank = 1 AND kernel_class = 'communication'")
    return base, new


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_real_nsys_export_against_a_known_change(fastvideo):
    base, new = fastvideo
    with Job.open(base) as b, Job.open(new) as n:
        df = b.diff(n)
        raw = {"base": _raw_intervals(b.con), "new": _raw_intervals(n.con)}
        times = {"base": _kernel_time_by_collective(b.con), "new": _kernel_time_by_collective(n.con)}
        n_comm = n.con.execute("SELECT count(*) FROM kernels WHERE rank = 1 AND kernel_class = 'communication'"
                               ).fetchone()[0]
    assert n_comm > 0
    # no step markers in this export, but a repeating kernel sequence: 17 detected iterations on each rank
    # (iterations), so the diff is per step, a step being a detected iteration; a rank's GPU time per step is its
    # capture's (overlap_by_rank: span from the first GPU interval) divided by its iterations
    steps = 17
    assert _row(df, "job", "steps")["base"] == _row(df, "job", "steps")["new"] == steps
    assert not df.filter(pl.col("metric").str.contains("per_window")).height
    for rank in (0, 1):
        want = {}
        for side in ("base", "new"):
            iv = raw[side][rank]
            want[side] = rank_times(iv, [(min(a for a, _, _ in iv), max(b for _, b, _ in iv))])
        for key, metric in (("exposed", "exposed_comm_ns_per_step"), ("idle", "idle_ns_per_step"),
                            ("comm", "comm_ns_per_step")):
            row = _row(df, "rank", metric, rank=rank)
            assert (row["base"] * steps, row["new"] * steps) == (pytest.approx(want["base"][key], abs=1e-6),
                                                                 pytest.approx(want["new"][key], abs=1e-6))
            assert row["delta"] * steps == pytest.approx(want["new"][key] - want["base"][key], abs=1e-6)
            if key != "comm":  # exposed and idle time are their own impact
                assert row["impact_ns"] == row["delta"]
        if rank == 0:
            assert _row(df, "rank", "exposed_comm_ns_per_step", rank=0)["delta"] == 0
    # per collective: every kernel of rank 1 is DELTA_NS longer
    for coll in times["base"]:
        row = _row(df, "collective", "time_ns_per_step", collective=coll, bucket_lo_bytes=None)
        assert row["delta"] * steps == pytest.approx(times["new"][coll] - times["base"][coll])
    assert sum(r["delta"] for r in df.filter((pl.col("section") == "collective")
                                             & (pl.col("metric") == "time_ns_per_step")).iter_rows(named=True)) \
        * steps == pytest.approx(n_comm * DELTA_NS)
    # starts did not move: waits and skew are unchanged
    for metric in ("wait_ns_per_step", "max_start_skew_ns", "mean_start_skew_ns"):
        assert _row(df, "job", metric)["delta"] == 0
    # the job's exposed communication grew by exactly rank 1's growth
    job = _row(df, "job", "exposed_comm_ns_per_step")
    assert job["delta"] == pytest.approx(_row(df, "rank", "exposed_comm_ns_per_step", rank=1)["delta"])
    assert job["delta"] > 0


# ---------------------------------------------------------------------------------------------------------------
# issue 36, deliverable 8: per step only with iterations; windows of different work normalised by matched work.
# Issue 38, deliverable 3: iterations detected from the kernel sequence count as steps (tier 3).


def _window(run: syn.Run) -> syn.Run:
    """The run as a capture without step markers."""
    for rr in run.ranks:
        rr.steps = []
    return run


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_windows_without_steps_compare_matched_work(tmp_path):
    """Two captures without step markers holding different work (one iteration, where no repeating kernel sequence
    can be detected, against 2, the second with rank 1 arriving 100 µs late at every all_reduce): nothing is per
    step, per-window totals are labelled so, and the impact is the change in exposed ns per operation over the
    operations both windows hold."""
    base_run, new_run = _window(make_diff_run(steps=1)), _window(make_diff_run(steps=2, straggler=1, delay_us=100))
    b, n = _db(tmp_path / "b.duckdb", base_run), _db(tmp_path / "n.duckdb", new_run)
    with Job.open(b) as base, Job.open(n) as new:
        c = base.compare(new)
        d = compare.document(c)
        same = base.compare(base)
    df = c.rows
    assert d["per"] == "window" and d["step_impact_ns"] is None
    assert (d["base"]["iteration_source"], d["new"]["iteration_source"]) == ("whole_capture", "detected")
    assert not df.filter(pl.col("metric").str.contains("per_step")).height
    assert _row(df, "job", "exposed_comm_ns_per_window")["impact_ns"] is not None
    # every collective kernel is exposed (compute ends 100 µs before the first arrival), so an operation's exposed
    # time is its kernel's duration: the reference per (collective, side) from the Run objects
    def per_op(run):
        out: dict[str, list[int]] = {}
        for rr in run.ranks:
            for op in rr.comm:
                out.setdefault(op.collective, []).append(op.kernel.end_ns - op.kernel.start_ns)
        return out

    ref = {"base": per_op(base_run), "new": per_op(new_run)}
    lo = {"all_reduce": MIB, "all_gather": AG_BYTES}
    impact = base_exposed = 0.0
    for coll, bucket in lo.items():
        nb, nn = len(ref["base"][coll]), len(ref["new"][coll])
        eb, en = sum(ref["base"][coll]) / nb, sum(ref["new"][coll]) / nn
        row = _row(df, "collective", "exposed_ns_per_op", collective=coll, bucket_lo_bytes=bucket)
        assert (row["base"], row["new"]) == (pytest.approx(eb), pytest.approx(en))
        assert row["impact_ns"] == pytest.approx(min(nb, nn) * (en - eb))
        ops = _row(df, "collective", "ops_per_window", collective=coll, bucket_lo_bytes=bucket)
        assert (ops["base"], ops["new"]) == (nb, nn) == (4 * 1, 4 * 2)
        impact += min(nb, nn) * (en - eb)
        base_exposed += min(nb, nn) * eb
    # all_reduce: 115 → 170 µs per operation (+55 µs × 4 matched), all_gather unchanged
    assert impact == pytest.approx(4 * 55 * US)
    assert d["impact_ns"] == pytest.approx(impact)
    assert d["exposed_comm_change_pct"] == pytest.approx(100 * impact / base_exposed)
    assert _row(df, "job", "exposed_comm_ns_per_window")["impact_ns"] == pytest.approx(impact)
    assert any(m.startswith("per capture window: ") for m in d["missing"])
    work = next(m for m in d["missing"] if m.startswith("the capture windows hold different work"))
    assert "all_reduce 1 MiB+: base 4, new 8" in work and "all_gather 512 KiB+: base 4, new 8" in work
    # a window against itself: every delta 0, every impact 0
    assert (same.rows["delta"].drop_nulls() == 0).all() and (same.rows["impact_ns"].drop_nulls() == 0).all()
    assert same.headline["impact_ns"] == 0 and not any("different work" in m for m in same.missing)
    # the CLI says no step-time impact
    r = runner("diff", b, n)
    assert r.exit_code == 0, r.output
    assert "impact on step time" not in r.stderr and "per capture window" in r.stderr
    assert "_per_step" not in r.stdout and "exposed_comm_ns_per_window" in r.stdout
    # the report's "What changed" says so too
    with Job.open(b) as base, Job.open(n) as new:
        page = new.report(tmp_path / "r.html", baseline=base).read_text(encoding="utf-8")
    assert "per capture window: the runs do not both have step markers or detected iterations" in page
    assert "exposed communication per capture window (ms)" in page and "impact per step" not in page


def _per_detected_iteration(run: syn.Run, iterations: int) -> dict:
    """busy, idle, comm, overlapped, exposed ns per iteration of each rank when its iterations are detected: they tile
    the rank's capture from its first kernel start to its last kernel end, so per iteration is that ÷ iterations."""
    out = {}
    for rr in run.ranks:
        comm_ids = {id(c.kernel) for c in rr.comm}
        iv = [(k.start_ns, k.end_ns, "comm" if id(k) in comm_ids else "compute") for k in rr.kernels]
        t = rank_times(iv, [(min(a for a, _, _ in iv), max(b for _, b, _ in iv))])
        out[rr.rank] = {k: v / iterations for k, v in t.items()}
    return out


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_captures_without_markers_compare_per_detected_iteration(tmp_path):
    """tier 3: two captures without step markers whose kernel sequences repeat (3 iterations against 2, the second
    with rank 1 arriving 100 µs late at every all_reduce). iterations detects them, so the diff is per step, a step
    being a detected iteration, and the document says which source each side used. Expected values from the Run
    objects alone (reference, _per_detected_iteration)."""
    kw = {"base": dict(steps=3), "new": dict(steps=2, straggler=1, delay_us=100)}
    ref = {tag: reference(make_diff_run(**k)) for tag, k in kw.items()}  # totals ÷ the most iterations
    gpu = {"base": _per_detected_iteration(make_diff_run(**kw["base"]), 3),
           "new": _per_detected_iteration(make_diff_run(**kw["new"]), 2)}
    b = _db(tmp_path / "b.duckdb", _window(make_diff_run(**kw["base"])))
    n = _db(tmp_path / "n.duckdb", _window(make_diff_run(**kw["new"])))
    marked = _db(tmp_path / "marked.duckdb", make_diff_run(**kw["base"]))
    with Job.open(b) as base, Job.open(n) as new, Job.open(marked) as mk:
        c = base.compare(new)
        d = compare.document(c)
        same = base.compare(base)
        vs_markers = mk.compare(base)
    df = c.rows
    assert d["per"] == "step"
    assert [(d[t]["iteration_source"], d[t]["steps"], d[t]["has_steps"]) for t in ("base", "new")] == [
        ("detected", 3, True), ("detected", 2, True)]
    assert any(m.startswith("base: no step markers; a step is an iteration detected") for m in d["missing"])
    assert not df.filter(pl.col("metric").str.contains("per_window")).height
    names = {"exposed": "exposed_comm_ns_per_step", "idle": "idle_ns_per_step", "comm": "comm_ns_per_step"}
    for r in range(4):
        for key, metric in names.items():
            row = _row(df, "rank", metric, rank=r)
            assert (row["base"], row["new"]) == (pytest.approx(gpu["base"][r][key]), pytest.approx(gpu["new"][r][key]))
        row = _row(df, "rank", "wait_ns_per_step", rank=r)
        assert (row["base"], row["new"]) == (pytest.approx(ref["base"]["wait"][r]),
                                             pytest.approx(ref["new"]["wait"][r]))
    for tag in ("base", "new"):
        for (coll, lo), bucket in ref[tag]["bucket"].items():
            for key, metric in (("ops", "ops_per_step"), ("bytes", "bytes_per_step"), ("time", "time_ns_per_step"),
                                ("exposed", "exposed_ns_per_step")):
                assert _row(df, "collective", metric, collective=coll, bucket_lo_bytes=lo)[tag] == pytest.approx(
                    bucket[key])
    # the headline: exposed communication + idle per step, summed over ranks, and each row's own impact
    want = sum(gpu["new"][r][k] - gpu["base"][r][k] for r in range(4) for k in ("exposed", "idle"))
    assert d["step_impact_ns"] == pytest.approx(want, rel=1e-5) and d["impact_ns"] == d["step_impact_ns"]
    job = _row(df, "job", "exposed_comm_ns_per_step")
    assert job["impact_ns"] == job["delta"] == pytest.approx(
        sum(gpu["new"][r]["exposed"] - gpu["base"][r]["exposed"] for r in range(4)))
    assert _row(df, "job", "wait_ns_per_step")["impact_ns"] is None  # a cause, not exposed or idle time
    per_op = df.filter(pl.col("metric").str.ends_with("_per_op"))  # per operation, not per step: no step impact
    assert per_op.height and per_op["impact_ns"].null_count() == per_op.height
    # diff X X on detected iterations: every delta and impact 0
    assert (same.rows["delta"].drop_nulls() == 0).all() and (same.rows["impact_ns"].drop_nulls() == 0).all()
    assert same.headline["per"] == "step" and same.headline["step_impact_ns"] == 0
    # the same run with and without its markers: 3 steps either way, so every total per step agrees; only GPU idle
    # time differs (marker steps leave out the gaps between them, detected iterations tile the capture)
    v = vs_markers.rows
    assert (vs_markers.base["iteration_source"], vs_markers.new["iteration_source"]) == ("marker", "detected")
    assert (v.filter(pl.col("section").is_in(["collective", "skew"]))["delta"].drop_nulls() == 0).all()
    for metric in ("steps", "exposed_comm_ns_per_step", "comm_ns_per_step", "wait_ns_per_step"):
        assert _row(v, "job", metric)["delta"] == pytest.approx(0, abs=1e-6), metric
    assert _row(v, "job", "idle_ns_per_step")["delta"] > 0
    r = runner("diff", b, n)
    assert r.exit_code == 0, r.output
    assert "impact on step time" in r.stderr and "exposed_comm_ns_per_step" in r.stdout


def test_failed_analyses_leave_nulls_not_zeros(con):  # tier 2: the diff macros on sides whose analyses failed
    """Two runs whose every analysis returned nothing (the base's overlap and exposure failed): no value is
    invented. The only known row is the job's steps (1: no iterations), every other value, delta and impact is NULL,
    and missing names each failure."""
    empty = {name: compare._empty(cols) for name, cols in compare.COLUMNS.items()}
    base = compare.Side("b", dict(empty), failed={"overlap_by_rank": "boom", "msg_size_exposure": "bust"})
    c = compare.compare_sides(base, compare.Side("n", dict(empty)), con)
    assert c.headline["per"] == "window" and c.headline["impact_ns"] is None and c.headline["step_impact_ns"] is None
    known = c.rows.filter(pl.col("base").is_not_null() | pl.col("new").is_not_null())
    assert known.select("section", "metric", "base", "new", "delta").rows() == [("job", "steps", 1.0, 1.0, 0.0)]
    assert c.rows["impact_ns"].null_count() == c.rows.height > 0
    assert "base: analysis 'overlap_by_rank' failed: boom" in c.missing
    assert "base: analysis 'msg_size_exposure' failed: bust" in c.missing
    assert any(m.startswith("base: no steps (no step markers") for m in c.missing)
    assert c.base["iteration_source"] == "whole_capture" and c.base["has_steps"] is False
