"""Bandwidth from the matched transfer time, the physical peak of devices and networks, and what the kernel name
says (algorithm, protocol, channels).

Tier 2: kernel-name parsing and peak matching on inline VALUES, with the spellings of NCCL's and RCCL's sources
(src/device/generate.py best_kernel, src/collectives/device/common.h IMPL_COLL4, symmetric/generate.py; RCCL's
ncclDevKernel_Generic_{1,2,4}); a hypothesis property test against a peak computed here. Tier 3: a synthetic job
(fixtures.synthetic.make_latency_run) whose transfer times are known. Tier 4: the real 8-rank example, transfer
times recomputed from the JSON. Expected values are computed here, never read from the product.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_db import catalog_db, classify
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

from fixtures import synthetic as syn
from nsys2comm import analysis
from nsys2comm.summary import build_summary

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

EXAMPLE = Path(__file__).parent.parent / "fixtures" / "example"

# (short name, algorithm, protocol, channels for grid x 16): what each spelling says about the run
NAMES = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "RING", None, 16),  # 2.8-2.18: one LL entry kernel per algorithm
    ("ncclKernel_AllReduce_TREE_LL_Sum_half", "TREE", None, 16),
    ("ncclKernel_AllReduce_COLLNET_DIRECT_LL_Sum_float", "COLLNET_DIRECT", None, 16),
    ("ncclKernel_AllReduce_NVLS_TREE_LL_Sum_float", "NVLS_TREE", None, 16),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", "RING", None, 16),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", None, None, 16),  # p2p, and the generic kernel of 2.13-2.18
    ("ncclAllReduceRingLLKernel_sum_f32", "RING", None, 16),  # <= 2.7
    ("ncclAllReduceTreeLLKernel_sum_f32", "TREE", None, 16),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", None, None, 16),  # >= 2.19: RING stands for every non-TREE algorithm
    ("ncclDevKernel_AllReduce_Sum_f32_TREE_LL", "TREE", None, 16),
    ("ncclDevKernel_AllGather_RING_LL", None, None, 16),
    ("ncclDevKernel_SendRecv", None, None, 16),
    ("ncclDevKernel_Generic", None, None, 16),  # RCCL
    ("ncclDevKernel_Generic_4", None, None, 16),  # RCCL, unroll variant
    ("ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16", "AGxLL_R", "LL", None),  # symmetric: one kernel per algorithm
    ("ncclSymkDevKernel_AllReduce_RSxLDMC_AGxSTMC_sum_f32", "RSxLDMC_AGxSTMC", None, None),
    ("ncclSymkDevKernel_ReduceScatter_RailA2A_LsaLD_sum_bf16", "RailA2A_LsaLD", None, None),
    ("ncclSymDevKernel_AllGather_LLMC", "LLMC", "LL", None),
    ("multimem_all_reduce_kernel", None, None, None),
]

# devices.name spellings (nsys TARGET_INFO_GPU, Kineto deviceProperties) -> (link GB/s per direction, bridge, NVLS)
PEAKS = {
    "NVIDIA H100 80GB HBM3": (450.0, None, True), "NVIDIA H100 PCIe": (63.0, 300.0, False),
    "NVIDIA H100 NVL": (63.0, 300.0, False), "NVIDIA H200": (450.0, None, True), "NVIDIA H800": (200.0, None, True),
    "NVIDIA H20": (450.0, None, True), "NVIDIA A100-SXM4-80GB": (300.0, None, False),
    "A100-PG509-200": (300.0, None, False), "NVIDIA A100-PCIE-40GB": (31.5, 300.0, False),
    "NVIDIA A800-SXM4-80GB": (200.0, None, False), "Tesla V100-SXM2-32GB": (150.0, None, False),
    "Tesla V100-PCIE-16GB": (15.75, None, False), "NVIDIA B200": (900.0, None, True),
    "NVIDIA GB200": (900.0, None, True), "AMD Instinct MI300X": (448.0, None, False),
    "AMD Instinct MI250X / MI250": (400.0, None, False), "AMD Instinct MI325X": (448.0, None, False),
    "NVIDIA L40S": (31.5, None, False),
}


@pytest.fixture(scope="module")
def cat():
    c = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    return c


@pytest.mark.parametrize(("name", "algo", "proto", "channels"), NAMES)
def test_kernel_name_says(cat, name, algo, proto, channels):
    got = cat.execute("SELECT _overlap_comm_algorithm(n), _overlap_comm_protocol(n), _overlap_comm_channels(n, 16) "
                      "FROM (VALUES (?)) v(n)", [name]).fetchone()
    assert got == (algo, proto, channels)


def test_peak_table_matching(cat):
    rows = cat.execute("SELECT n, p.link_gbps, p.bridge_gbps, p.in_network_reduction FROM "
                       "(SELECT n, _devices_model_peak(n) AS p FROM (SELECT unnest(?) AS n))", [list(PEAKS)]).fetchall()
    assert {r[0]: r[1:] for r in rows} == PEAKS
    assert cat.execute("SELECT _devices_model_peak('Some Future GPU'), _devices_model_peak(NULL)").fetchone() == \
        (None, None)


# ---------------------------------------------------------------------------------------------------------------
# synthetic job: transfer times known


def _instances(run: syn.Run) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """Collective instances of a make_latency_run job: (pg, seq) -> [(bytes, transfer ns)], transfer = end of the
    rank that started last − the latest start."""
    by: dict[tuple[str, int], list] = {}
    for rr in run.ranks:
        for op in rr.comm:
            if op.peer is None:
                by.setdefault((op.pg_name, op.seq), []).append(op)
    out = {}
    for key, ops in by.items():
        last = max(ops, key=lambda o: (o.kernel.start_ns, -o.kernel.rank))
        out[key] = (ops[0].collective, ops[0].msg_bytes, last.kernel.end_ns - last.kernel.start_ns)
    return out


def _job(run: syn.Run, hosts: bool, device: str = "NVIDIA H100 80GB HBM3") -> duckdb.DuckDBPyConnection:
    con = synth_db.build(run)
    for rr in run.ranks:
        con.execute("UPDATE ranks SET host = ? WHERE rank = ?", [rr.host if hosts else "one-node", rr.rank])
        con.execute("INSERT INTO devices VALUES (1, ?, ?, ?, 132, NULL)", [rr.rank, rr.device, device])
    return con


@pytest.fixture(scope="module")
def latency_run():
    return syn.make_latency_run(world_size=8, ranks_per_host=4, reps=3)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_transfer_busbw_of_a_synthetic_job(latency_run):
    con = _job(latency_run, hosts=False)
    inst = _instances(latency_run)
    bw = analysis.run_query(con, "collective_bandwidth")
    n = latency_run.world_size
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n}
    checked = 0
    for r in bw.filter(bw["collective"].is_in(["all_reduce", "all_gather"])).iter_rows(named=True):
        mine = [v for v in inst.values()
                if v[0] == r["collective"] and r["bucket_lo_bytes"] <= v[1] < r["bucket_hi_bytes"]]
        b, t = sum(v[1] for v in mine), sum(v[2] for v in mine)
        assert r["matched_instances"] == len(mine) and r["matched_ops"] == r["ops"] == len(mine) * n
        assert r["transfer_ns"] == t
        assert r["busbw_gbps"] == pytest.approx(b / t * factor[r["collective"]], rel=1e-12)
        assert r["bandwidth_basis"] == "transfer" and r["headline_busbw_gbps"] == r["busbw_gbps"]
        # kernel durations include the waiting of early ranks: lower
        durations = sum(op.kernel.end_ns - op.kernel.start_ns for rr in latency_run.ranks for op in rr.comm
                        if op.peer is None and op.collective == r["collective"]
                        and r["bucket_lo_bytes"] <= op.msg_bytes < r["bucket_hi_bytes"])
        assert r["busbw_incl_wait_gbps"] == pytest.approx(b * n / durations * factor[r["collective"]], rel=1e-12)
        assert r["busbw_incl_wait_gbps"] < r["busbw_gbps"]
        # one host of H100s (NVLink4 450 GB/s, NVLS): all_reduce may reach 2(n-1)/n x 450
        peak = 450.0 * (2 * (n - 1) / n if r["collective"] == "all_reduce" else 1.0)
        assert r["spans_hosts"] is False and r["peak_busbw_gbps"] == pytest.approx(peak)
        assert r["busbw_pct_of_peak"] == pytest.approx(100 * r["busbw_gbps"] / peak)
        assert r["bandwidth_check"] == "ok"
        checked += 1
    assert checked == len(syn.LATENCY_SIZES["all_reduce"]) + len(syn.LATENCY_SIZES["all_gather"])
    assert con.execute("SELECT _devices_peak_busbw_gbps()").fetchone()[0] == pytest.approx(450.0 * 2 * 7 / 8)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_groups_across_hosts_take_the_network_peak(latency_run):
    con = _job(latency_run, hosts=True)
    links = analysis.run_query(con, "comm_group_links")
    coll = links.filter(links["collective"] == "all_reduce").row(0, named=True)
    assert coll["spans_hosts"] is True and coll["hosts"] == 2 and coll["peak_busbw_gbps"] is None  # no --nic-gbps
    bw = analysis.run_query(con, "collective_bandwidth")
    assert set(bw.filter(bw["collective"] == "all_reduce")["bandwidth_check"]) == {"no_peak"}
    con.execute("SET VARIABLE nsys2comm_nic_gbps = 100.0")
    links = analysis.run_query(con, "comm_group_links")
    n, g = 8, 4  # two hosts of four ranks
    want = {"all_reduce": 100 * 2 * (n - 1) / n, "all_gather": 100 * (n - 1) / (n - g)}
    for c, peak in want.items():
        row = links.filter(links["collective"] == c).row(0, named=True)
        assert (row["peak_busbw_gbps"], row["peak_source"]) == (pytest.approx(peak), "nic_gbps")
    # pipeline hand-offs: 3 -> 4 crosses hosts (network), 0 -> 1 stays on one (NVLink)
    sends = links.filter(links["collective"] == "send")
    cross = sends.filter(sends["members"].list.first() == 3).row(0, named=True)
    local = sends.filter(sends["members"].list.first() == 0).row(0, named=True)
    assert (cross["spans_hosts"], cross["peak_busbw_gbps"]) == (True, pytest.approx(100.0))
    assert (local["spans_hosts"], local["peak_busbw_gbps"]) == (False, pytest.approx(450.0))
    # the variables never reach a stored sweep: the materialised views give the same rows either way
    from nsys2comm.storage.sweeps import SWEEPS

    for view in SWEEPS:
        with_vars = con.execute(f"SELECT count(*), sum(hash(t)) FROM {view} t").fetchone()
        con.execute("RESET VARIABLE nsys2comm_nic_gbps")
        con.execute("SET VARIABLE nsys2comm_link_gbps = 1.0")
        without = con.execute(f"SELECT count(*), sum(hash(t)) FROM {view} t").fetchone()
        con.execute("RESET VARIABLE nsys2comm_link_gbps")
        con.execute("SET VARIABLE nsys2comm_nic_gbps = 100.0")
        assert with_vars == without, view


def test_no_match_falls_back_to_a_labelled_lower_bound():
    """A single-rank job: nothing matched on its whole group, so the headline is the kernel-duration figure,
    labelled 'incl_wait', and the summary says so."""
    run = syn.make_latency_run(world_size=8, ranks_per_host=8, reps=1)
    run.ranks = run.ranks[:1]
    con = _job(run, hosts=False)
    bw = analysis.run_query(con, "collective_bandwidth")
    assert set(bw["bandwidth_basis"]) == {"incl_wait"} and bw["busbw_gbps"].null_count() == bw.height
    assert bw["headline_busbw_gbps"].to_list() == bw["busbw_incl_wait_gbps"].to_list()
    s = build_summary(con)
    assert s["worst_collective"]["bandwidth_basis"] == "incl_wait"
    from nsys2comm.summary import format_summary

    assert "includes waiting, a lower bound" in format_summary(s)


# ---------------------------------------------------------------------------------------------------------------
# property: a headline never exceeds the physical peak


def _my_peak(coll: str, n: int, device: str, host_of: list[int], nic: float | None, link: float | None):
    """The peak computed here from the vendors' figures (PEAKS) and the rule of docs/device-peaks.md."""
    hosts = sorted(set(host_of))
    if len(hosts) > 1:
        if nic is None:
            return None
        per = [host_of.count(h) for h in hosts]
        allow = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / (n - min(per)),
                 "all_to_all": (n - 1) / max(g * (n - g) for g in per)}.get(coll, 1.0)
        return nic * allow
    base, bridge, nvls = PEAKS.get(device, (None, None, False))
    if link is not None:
        base, bridge = link, None
    if base is None:
        return None
    if bridge is not None and n <= 2:
        base = max(base, bridge)
    return base * (2 * (n - 1) / n if coll == "all_reduce" and nvls else 1.0)


@st.composite
def jobs(draw):
    n = draw(st.integers(2, 4))
    device = draw(st.sampled_from([*PEAKS, "Unknown GPU"]))
    host_of = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    ops = draw(st.lists(st.tuples(st.sampled_from(["all_reduce", "all_gather", "all_to_all", "broadcast"]),
                                  st.integers(1, 1 << 32), st.integers(1, 2_000_000),
                                  st.lists(st.integers(0, 500_000), min_size=n, max_size=n)), min_size=1, max_size=6))
    nic = draw(st.one_of(st.none(), st.floats(1, 1000)))
    link = draw(st.one_of(st.none(), st.floats(1, 2000)))
    return n, device, host_of, ops, nic, link


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_headline_never_above_the_peak(cat, job):
    n, device, host_of, ops, nic, link = job
    con = cat.cursor()
    for t in ("files", "ranks", "devices", "kernels", "comm_ops"):
        con.execute(f"DELETE FROM {t}")
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source) VALUES (1, '/p', 'p', 0, 'nsys')")
    for r in range(n):
        con.execute("INSERT INTO ranks VALUES (?, 1, ?, ?, ?, 'cli')", [r, 100 + r, f"h{host_of[r]}", n])
        con.execute("INSERT INTO devices VALUES (1, ?, ?, ?, NULL, NULL)", [r, r, device])
    t0, kid = 1_000_000_000, 0
    for seq, (coll, nbytes, transfer, arrive) in enumerate(ops):
        end = t0 + max(arrive) + transfer
        for r in range(n):
            kid += 1
            name = syn.comm_kernel_name(coll if coll != "all_to_all" else "send", "Float", "new")
            con.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, start_ns, end_ns, name, short_name, "
                        "grid_x, kernel_class) VALUES (?, 1, ?, ?, ?, ?, ?, ?, 8, 'communication')",
                        [kid, r, r, t0 + arrive[r], end, name, classify(con, name)[0]])  # macros bound once per name
            con.execute("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, group_size, pg_name, "
                        "pg_ranks, seq, n_ops, collective_source) VALUES (?, 1, ?, ?, ?, ?, '0', ?, ?, 1, "
                        "'kernel_args')", [kid, r, coll, nbytes, n, list(range(n)), seq])
        t0 = end + 1000
    for var, v in (("nsys2comm_nic_gbps", nic), ("nsys2comm_link_gbps", link)):
        con.execute(f"SET VARIABLE {var} = ?::DOUBLE" if v is not None else f"RESET VARIABLE {var}",
                    [v] if v is not None else [])
    bw = analysis.run_query(con, "collective_bandwidth")
    for r in bw.iter_rows(named=True):
        peak = _my_peak(r["collective"], n, device, host_of, nic, link)
        assert r["peak_busbw_gbps"] == (None if peak is None else pytest.approx(peak, rel=1e-9))
        if peak is not None and r["headline_busbw_gbps"] is not None:
            assert r["headline_busbw_gbps"] <= peak * (1 + 1e-9)
        basis = r["busbw_gbps"] if r["bandwidth_basis"] == "transfer" else r["busbw_incl_wait_gbps"]
        if peak is not None and basis > peak * (1 + 1e-9):
            assert r["bandwidth_check"] == "above_peak" and r["headline_busbw_gbps"] is None


# ---------------------------------------------------------------------------------------------------------------
# real trace: the bundled 8-rank example (8 x V100-SXM2)


def _json_instances() -> tuple[str, list[list[tuple[int, int]]]]:
    """Per rank, its NCCL kernels in start order as (start ns, end ns), straight from the JSON; the device name."""
    per, device = [], None
    for f in sorted(EXAMPLE.glob("worker*.json.gz"), key=lambda p: int(p.name[6:].split("_")[0])):
        with gzip.open(f) as fh:
            d = json.loads(fh.read())
        device = d["deviceProperties"][0]["name"]
        ks = sorted((e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in d["traceEvents"]
                    if e.get("cat") == "kernel" and e["name"].startswith("nccl"))
        per.append(ks)
    return device, per


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="fixtures/example absent")
def test_example_bandwidth_from_the_json():
    from nsys2comm.api import Job

    device, per = _json_instances()
    assert device == "Tesla V100-SXM2-32GB"
    # k-th NCCL kernel of every rank = one instance (the trace records no group or sequence: rank order)
    transfer = []
    for k in range(len(per[0])):
        latest = max(per[r][k][0] for r in range(len(per)))
        last = min(r for r in range(len(per)) if per[r][k][0] == latest)  # ties: the lowest rank
        transfer.append(max(per[last][k][1] - latest, 0))
    with Job.open(str(EXAMPLE)) as job:
        ops = job.query("collective_bandwidth_by_op")
        ops = ops.filter(ops["rank"] == 0).sort("start_ns")
        assert ops["transfer_ns"].to_list() == transfer
        bw = job.query("collective_bandwidth")
        s = job.summary()
    w = s["worst_collective"]
    row = bw.filter((bw["collective"] == w["collective"]) & (bw["bucket_lo_bytes"] == w["msg_bytes"]))
    row = row.row(0, named=True)
    mine = [(b, t) for b, t, c in zip(ops["msg_bytes"], transfer, ops["collective"], strict=True)
            if c == w["collective"] and w["msg_bytes"] <= b < w["msg_bytes_hi"]]
    expect = sum(b for b, _ in mine) / sum(t for _, t in mine) * 7 / 8
    assert w["busbw_gbps"] == pytest.approx(expect, rel=1e-6) and w["bandwidth_basis"] == "transfer"
    assert row["busbw_incl_wait_gbps"] < 0.1 < w["busbw_gbps"]  # the old 0.01 GB/s measured waiting
    assert (bw["peak_busbw_gbps"] == 150.0).all()  # V100 NVLink2, no in-network reduction
    assert (bw["headline_busbw_gbps"].drop_nulls() <= 150.0).all()
