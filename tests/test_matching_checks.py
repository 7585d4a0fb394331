"""The cross-rank matching's self-checks and the straggler rule (queries/skew/skew.sql).

Tier 2/3: jobs written by code straight into the canonical tables (times in µs, stored as ns): subsets of a group
(group_complete), per-rank orders that differ under rank_order and other disagreements (consistent), and
last-arrival counts against the binomial test of rank_wait, whose p-values are recomputed here exactly with
math.comb (a hypothesis property test against brute force). The summary, the report's finding and chart, and diff
must all follow rank_wait.is_straggler.
"""

from __future__ import annotations

import math
import random

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth_db import catalog_db, classify
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

from nsys2comm import analysis

US = 1000
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
MIB = 1 << 20


class Job:
    """Ranks, communication kernels and their comm_ops rows; nothing else."""

    def __init__(self, ranks: int = 2, world_size: int | None = None):
        self.con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
        self.con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source, clock_offset_ns) "
                         "VALUES (1, '/synthetic', 'x', 0, 'kineto', 0)")
        for r in range(ranks):
            self.con.execute("INSERT INTO ranks VALUES (?, 1, ?, 'host', ?, 'cli')",
                             [r, 100 + r, world_size if world_size is not None else ranks])
        self.kid = 0

    def op(self, rank: int, start_us: float, end_us: float, collective: str | None = "all_reduce", *,
           pg: str | None = "0", seq: int | None = None, msg_bytes: int = MIB, group_size: int | None = None,
           pg_ranks: list[int] | None = None) -> int:
        self.kid += 1
        short_name, kernel_class = classify(self.con, NCCL)  # the catalog's macros, bound once per name
        self.con.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, stream_id, start_ns, end_ns, name, "
                         "short_name, correlation_id, kernel_class) VALUES (?, 1, ?, 0, 20, ?, ?, ?, ?, ?, ?)",
                         [self.kid, rank, int(start_us * US), int(end_us * US), NCCL, short_name, self.kid,
                          kernel_class])
        if collective is not None:
            self.con.execute("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, group_size, "
                             "pg_name, pg_ranks, seq, n_ops, collective_source) VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, 1, "
                             "'test')", [self.kid, rank, collective, msg_bytes, group_size, pg, pg_ranks, seq])
        return self.kid

    def rows(self, sql: str) -> list[dict]:
        cur = self.con.execute(sql)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def instances(self) -> list[dict]:
        return self.rows("SELECT * FROM _skew_comm_instances ORDER BY first_start_ns, instance_key")


def _two_of(world_size: int, **op) -> Job:
    """Ranks 0 and 1 of a larger job: 3 all_reduces, rank 1 20 µs late, 30 µs transfer."""
    j = Job(ranks=2, world_size=world_size)
    for i in range(3):
        for r in range(2):
            j.op(r, 1000 * i + 20 * r, 1000 * i + 50, seq=i, **op)
    return j


# ---------------------------------------------------------------------------------------------------------------
# group_complete: a subset of the group is never matched


@pytest.mark.parametrize("world_size,op", [
    (128, {}),  # ranks.world_size says 128, no group recorded
    (2, {"group_size": 128}),  # the recorded group is 128
    (2, {"group_size": None, "pg_ranks": list(range(128))}),  # the group's ranks are listed
    (128, {"collective": None}),  # no comm_ops: rank_order against the job's 128 ranks
], ids=["world_size", "group_size", "pg_ranks", "rank_order"])
def test_two_of_n_ranks_are_not_matched(world_size, op):
    j = _two_of(world_size, **op)
    inst = j.instances()
    assert len(inst) == 3
    for i in inst:
        assert (i["ranks_seen"], i["group_size"], i["group_complete"], i["consistent"]) == (2, 128, False, True)
        assert i["transfer_source"] == "partial_group" and i["transfer_ns"] is None
    tr = analysis.run_query(j.con, "comm_transfer")
    assert tr["transfer_ns"].is_null().all()
    # the waits among the ranks seen are real: rank 0 waited 20 µs each time
    rw = {r["rank"]: r for r in analysis.run_query(j.con, "rank_wait").iter_rows(named=True)}
    assert rw[0]["total_wait_ns"] == 3 * 20 * US and rw[1]["times_arrived_last"] == 3


def test_complete_group_is_matched():
    j = _two_of(2, group_size=2)
    for i in j.instances():
        assert i["group_complete"] and i["consistent"] and i["inconsistency"] is None
        assert i["transfer_source"] == "matched" and i["transfer_ns"] == 30 * US  # end 50 − latest start 20


def test_one_rank_of_several_and_single_rank_job():
    j = Job(ranks=2)
    j.op(0, 0, 50, seq=0)  # rank 1 never ran it
    j.op(0, 100, 150, seq=1)
    j.op(1, 100, 150, seq=1)
    src = [i["transfer_source"] for i in j.instances()]
    assert src == ["unmatched", "matched"]
    one = Job(ranks=1, world_size=1)
    one.op(0, 0, 50, seq=0, group_size=1)
    (i,) = one.instances()
    # a single-rank trace cannot show whether other processes existed: never a transfer time
    assert (i["transfer_source"], i["transfer_ns"], i["max_duration_ns"]) == ("single_rank", None, 50 * US)


def test_p2p_pair_needs_both_sides():
    j = Job(ranks=2)
    j.con.execute("UPDATE ranks SET world_size = 2")
    for r, coll, peer in ((0, "send", 1), (1, "recv", 0)):
        k = j.op(r, 10 * r, 60, coll, seq=None)
        j.con.execute("UPDATE comm_ops SET peer_rank = ? WHERE kernel_id = ?", [peer, k])
    k = j.op(0, 100, 150, "send")  # a send whose recv is missing
    j.con.execute("UPDATE comm_ops SET peer_rank = 1 WHERE kernel_id = ?", [k])
    got = [(i["kind"], i["group_complete"], i["transfer_source"], i["transfer_ns"]) for i in j.instances()]
    assert got == [("p2p", True, "matched", 50 * US), ("p2p", False, "unmatched", None)]


# ---------------------------------------------------------------------------------------------------------------
# consistent: ranks that disagree are flagged and left out


def _differing_orders() -> Job:
    """rank_order (no group recorded): rank 0 runs all_reduce then all_to_all, rank 1 the other way round, 5 ms
    late; then one all_reduce on both, rank 1 40 µs late."""
    j = Job(ranks=2)
    j.op(0, 0, 100, "all_reduce", pg=None)
    j.op(0, 200, 300, "all_to_all", pg=None)
    j.op(1, 5000, 5100, "all_to_all", pg=None)
    j.op(1, 5200, 5300, "all_reduce", pg=None)
    j.op(0, 10_000, 10_100, "all_reduce", pg=None)
    j.op(1, 10_040, 10_100, "all_reduce", pg=None)
    return j


def test_differing_orders_are_flagged_and_excluded():
    j = _differing_orders()
    inst = j.instances()
    assert [i["match_rule"] for i in inst] == ["rank_order"] * 3
    assert [i["consistent"] for i in inst] == [False, False, True]
    assert all(i["inconsistency"].startswith("collective all_reduce/all_to_all") for i in inst[:2])
    assert [i["transfer_source"] for i in inst] == ["inconsistent", "inconsistent", "matched"]
    assert [i["transfer_ns"] for i in inst] == [None, None, 60 * US]
    sk = analysis.run_query(j.con, "collective_skew")
    assert sk["start_skew_ns"].to_list() == [None, None, 40 * US]  # 5 ms skews of paired different operations: out
    assert sk["last_arriving_rank"].to_list() == [None, None, 1]
    rw = {r["rank"]: r for r in analysis.run_query(j.con, "rank_wait").iter_rows(named=True)}
    assert rw[0]["collectives"] == 1 and rw[0]["total_wait_ns"] == 40 * US and rw[1]["times_arrived_last"] == 1
    waits = j.con.execute("SELECT count(*) FROM _skew_kernel_waits").fetchall()[0][0]
    assert waits == 2  # the consistent instance's two kernels only
    d = analysis.run_query(j.con, "diagnostics").filter(pl.col("code") == "inconsistent_instances")
    assert d.height == 1 and d["message"][0].startswith("2 of 3 instances disagree across ranks")


def test_summary_max_skew_and_missing_exclude_inconsistent():
    from nsys2comm.summary import build_summary

    s = build_summary(_differing_orders().con)
    assert s["max_skew_ms"] == pytest.approx(0.040)
    assert any(m.startswith("inconsistent_instances") or "2 of 3 instances disagree across ranks" in m
               for m in s["missing"]), s["missing"]


@pytest.mark.parametrize("case,want", [
    ("size", "msg_bytes 1048576..2097152"),
    ("group", "group"),
    ("end_skew", "end skew 1500.0 us > 1000.0 us"),
    ("too_many_ranks", "ranks_seen 2 > group_size 1"),
])
def test_other_disagreements(case, want):
    j = Job(ranks=2)
    a = {"seq": 0, "group_size": 2}
    b = dict(a)
    end_b = 60
    if case == "size":
        b["msg_bytes"] = 2 * MIB
    elif case == "group":
        b["group_size"] = 4
    elif case == "end_skew":
        end_b = 1560  # the ranks end 1.5 ms apart: more than max(1 ms, the 40 µs latency)
    else:
        a["group_size"] = b["group_size"] = 1
    j.op(0, 0, 60, **a)
    j.op(1, 20, end_b, **b)
    (i,) = j.instances()
    assert (i["consistent"], i["inconsistency"], i["transfer_source"]) == (False, want, "inconsistent")


def test_all_to_all_sizes_may_differ_and_ends_within_one_transfer():
    j = Job(ranks=2)
    j.op(0, 0, 60, "all_to_all", seq=0, msg_bytes=MIB)
    j.op(1, 20, 60, "all_to_all", seq=0, msg_bytes=3 * MIB)  # uneven splits: S differs per rank
    j.op(0, 100, 2100, "all_reduce", seq=1)
    j.op(1, 100, 3500, "all_reduce", seq=1)  # ends 1.4 ms apart, within the 2 ms latency
    assert [i["consistent"] for i in j.instances()] == [True, True]


def test_rule_per_group():
    """Group 'a' records every seq, group 'b' not: 'a' by (group, seq), 'b' by order; peerless grouped send out."""
    j = Job(ranks=2)
    for r in range(2):
        j.op(r, 0 + r, 50, pg="a", seq=7)
        j.op(r, 100 + r, 150, pg="b", seq=None)
        j.op(r, 200 + r, 250, pg="b", seq=3)
        j.op(r, 300, 350, "send", pg="b")
    keys = [(i["instance_key"], i["match_rule"]) for i in j.instances()]
    assert keys == [("a#7", "pg_seq"), ("b/all_reduce#1", "group_order"), ("b/all_reduce#2", "group_order")]


# ---------------------------------------------------------------------------------------------------------------
# the straggler rule


def _binom_tail(n: int, k: int, p: float) -> float:
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


def _arrivals(last: list[int], ranks: int) -> Job:
    """One all_reduce per entry of ``last``; that rank starts 10 µs after the others."""
    j = Job(ranks=ranks)
    for i, late in enumerate(last):
        for r in range(ranks):
            j.op(r, 1000 * i + (10 if r == late else 0), 1000 * i + 50, seq=i)
    return j


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_coin_flip_names_no_straggler():
    """2 ranks arriving last 15 and 16 times of 31: no straggler anywhere (summary, finding, chart, diff)."""
    from nsys2comm import compare
    from nsys2comm.report import charts, findings
    from nsys2comm.summary import build_summary, format_summary

    last = [0] * 15 + [1] * 16
    random.Random(3).shuffle(last)
    j = _arrivals(last, 2)
    rw = analysis.run_query(j.con, "rank_wait").sort("rank")
    assert rw["times_arrived_last"].to_list() == [15, 16]
    want = [min(1.0, 2 * _binom_tail(31, k, 0.5)) for k in (15, 16)]
    assert rw["arrived_last_p_value"].to_list() == pytest.approx(want, rel=1e-9)
    assert not rw["is_straggler"].any()
    s = build_summary(j.con)
    assert s["stragglers"] == []
    assert "stragglers: no consistent straggler" in format_summary(s)
    (f,) = findings.straggler_findings(rw)
    assert f.text.startswith("No consistent straggler")
    title = charts.straggler_chart(rw).to_dict()["title"]
    assert "no consistent straggler" in str(title)
    rows = compare.compare(j.con, j.con).rows
    flags = rows.filter((rows["section"] == "skew") & (rows["metric"] == "is_straggler"))
    assert flags.height == 2 and (flags["new"] == 0).all()


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_clear_straggler_is_named_everywhere():
    """8 ranks, 40 instances: rank 5 last in 30 of them; the others share the rest."""
    from nsys2comm import compare
    from nsys2comm.report import charts, findings
    from nsys2comm.summary import build_summary, format_summary

    rng = random.Random(11)
    last = [5] * 30 + [rng.choice([0, 1, 2, 3, 4, 6, 7]) for _ in range(10)]
    rng.shuffle(last)
    j = _arrivals(last, 8)
    rw = analysis.run_query(j.con, "rank_wait").sort("rank")
    p5 = min(1.0, 8 * _binom_tail(40, 30, 1 / 8))
    row5 = rw.filter(rw["rank"] == 5).row(0, named=True)
    assert row5["arrived_last_p_value"] == pytest.approx(p5, rel=1e-9) and p5 < 1e-15
    assert row5["chance_last_pct"] == pytest.approx(12.5)
    assert rw.filter(rw["is_straggler"])["rank"].to_list() == [5]
    s = build_summary(j.con)
    assert [r["rank"] for r in s["stragglers"]] == [5]
    assert s["stragglers"][0]["times_last"] == 30 and s["stragglers"][0]["collectives"] == 40
    assert "stragglers: rank 5 (last in 30 of 40" in format_summary(s)
    (f,) = findings.straggler_findings(rw)
    assert f.text.startswith("Rank 5 arrives last in 30 of 40") and f.level == "warning"
    assert "straggler: rank 5" in str(charts.straggler_chart(rw).to_dict()["title"])
    rows = compare.compare(j.con, j.con).rows
    flags = rows.filter((rows["section"] == "skew") & (rows["metric"] == "is_straggler")).sort("rank")
    assert flags["new"].to_list() == [1.0 if r == 5 else 0.0 for r in range(8)]


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@settings(max_examples=examples(15), deadline=None)
@given(st.integers(2, 6), st.lists(st.integers(0, 5), min_size=1, max_size=60))
def test_p_value_vs_brute_force(ranks, last):
    """rank_wait's p-value against the exact binomial tail, Bonferroni over the ranks, for any arrival pattern."""
    last = [x % ranks for x in last]
    j = _arrivals(last, ranks)
    rw = analysis.run_query(j.con, "rank_wait")
    n = len(last)
    for r in rw.iter_rows(named=True):
        k = last.count(r["rank"])
        assert (r["collectives"], r["times_arrived_last"]) == (n, k)
        want = min(1.0, ranks * _binom_tail(n, k, 1 / ranks))
        assert r["arrived_last_p_value"] == pytest.approx(want, rel=1e-6, abs=1e-12)
        assert r["is_straggler"] == (want < 0.01 and k / n > 1 / ranks)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_single_rank_summary_says_arrival_skew_is_not_visible():
    from nsys2comm.summary import SKEW_HIDDEN, build_summary, format_summary

    j = Job(ranks=1)
    j.op(0, 100, 200, seq=0)
    s = build_summary(j.con)
    assert s["exposed_by_cause"] and SKEW_HIDDEN in s["missing"]
    assert "waiting for other ranks is not seen as arrival skew" in format_summary(s)
    assert SKEW_HIDDEN not in build_summary(_two_of(2).con)["missing"]
