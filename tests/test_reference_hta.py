"""The analyses against HolisticTraceAnalysis 0.5.0 and TraceLens numbers on the shared Kineto traces."""

from __future__ import annotations

import pytest
from synth_db import catalog_db

from nsys2comm import analysis
from nsys2comm.ingest import ingest

DATASETS = ["hta_trace_filter_2rank", "hta_nccl_parser_config", "hta_df_index_resolver", "param_dlrm_8rank"]


@pytest.fixture(scope="module")
def dbs(shared_traces):
    out = {}

    def get(ds):
        if ds not in out:
            con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
            ingest(con, [shared_traces / "kineto" / ds])
            out[ds] = con
        return out[ds]

    return get


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("ds", DATASETS)
def test_overlap_hta_compat(dbs, reference_values, ds):
    ref = reference_values[ds]
    df = analysis.run_query(dbs(ds), "overlap_by_rank", {"compat": "hta"})
    got = {r: p for r, p in zip(df["rank"], df["comm_overlap_pct"], strict=False)}
    for rank, pct in ref["get_comm_comp_overlap"].items():
        assert got[int(rank)] == pytest.approx(pct, abs=0.01), (ds, rank)
    for rec in ref["independent_recomputation"]:
        if rec["hta_preprocessing"]:
            row = df.filter(df["rank"] == rec["rank"]).row(0, named=True)
            assert row["comm_ns"] == pytest.approx(rec["merged_comm_us"] * 1000, abs=1)
            assert row["comm_overlapped_ns"] == pytest.approx(rec["comm_overlapped_by_compute_us"] * 1000, abs=1)


@pytest.mark.parametrize("ds", DATASETS)
def test_overlap_default_mode(dbs, reference_values, ds):
    df = analysis.run_query(dbs(ds), "overlap_by_rank")
    for rec in reference_values[ds]["independent_recomputation"]:
        if not rec["hta_preprocessing"]:
            row = df.filter(df["rank"] == rec["rank"]).row(0, named=True)
            assert row["comm_overlap_pct"] == pytest.approx(rec["overlap_pct"], abs=0.01), (ds, rec["rank"])
            assert row["comm_ns"] == pytest.approx(rec["merged_comm_us"] * 1000, abs=2)


def test_tracelens_skew_dlrm(dbs, reference_values):
    ref = reference_values["param_dlrm_8rank"]["tracelens_nccl_analyser"]
    con = dbs("param_dlrm_8rank")
    sk = analysis.run_query(con, "collective_skew")
    assert sk.height == len(ref["per_collective"])
    assert set(sk["match_rule"]) == {"rank_order"}
    assert (sk["ranks_seen"] == 8).all()
    for row, want in zip(sk.iter_rows(named=True), ref["per_collective"], strict=False):
        assert row["latency_ns"] == want["comm_latency_us"] * 1000
        assert row["start_skew_ns"] == want["skew_in_start_us"] * 1000
        assert row["end_skew_ns"] == want["skew_in_end_us"] * 1000
        assert row["last_arriving_rank"] == want["last_arriving_rank"]
    rw = analysis.run_query(con, "rank_wait")
    want_wait = {int(r): us * 1000 for r, us in ref["straggler_summary_total_wait_us_by_rank"].items()}
    assert dict(zip(rw["rank"], rw["total_wait_ns"], strict=False)) == want_wait
    want_last = {int(r): n for r, n in ref["times_arrived_last"].items()}
    assert {r: n for r, n in zip(rw["rank"], rw["times_arrived_last"], strict=False) if n} == want_last
    assert rw["rank"][0] == 7 and rw["straggler_rank_order"][0] == 1
