"""Every headline of `summary --json` on the real traces in ../shared, against a computation straight from the raw
files and against the physics of the devices the traces list.

Tier 4. The raw side reads the Kineto JSON (gzip + json) and the nsys SQLite (sqlite3) here, without the importer:
communication-kernel time is the union, per rank, of the intervals of kernels whose name starts with 'nccl' (every
communication kernel of these traces does), summed over ranks. Peaks are the per-direction link bandwidths the
vendors publish for the GPUs these traces list (V100 SXM2: NVLink2, 6 links × 25 GB/s; A100 SXM: NVLink3,
12 × 25 GB/s; H100 SXM: NVLink4, 18 × 25 GB/s), written here on purpose, not read from the product's table.
"""

from __future__ import annotations

import gzip
import json
import math
import sqlite3
from pathlib import Path

import pytest

from nsys2comm import Job

KINETO = ["hta_trace_filter_2rank", "hta_nccl_parser_config", "hta_df_index_resolver", "param_dlrm_8rank"]
NSYS = ["fastvideo-2xH100-sp2-inference-compute-only_nsys2026.2.sqlite",
        "fastvideo-torchrun-2xH100-train-nccl-sendrecv-before_nsys2026.2.sqlite",
        "pipit-cloverleaf-cuda-1xA100-compute-only_nsys2024.5.sqlite",
        "pipit-saxpy-mpi-cuda-rank0-compute-only_nsys2022.2.sqlite"]
LINK_GBPS = {"V100-SXM2": 150.0, "A100-SXM": 300.0, "H100": 450.0}


def _union_ns(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _kineto_raw(folder: Path) -> dict:
    comm: dict[int, list[tuple[int, int]]] = {}
    devices = set()
    for i, f in enumerate(sorted(folder.glob("*.json*"))):
        doc = json.loads(gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes())
        rank = (doc.get("distributedInfo") or {}).get("rank", i)
        for p in doc.get("deviceProperties") or []:
            devices.add(p.get("name"))
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and e.get("ph") == "X" and str(e.get("name", "")).startswith("nccl"):
                ts = float(e["ts"])
                start = round(ts * 1000)
                comm.setdefault(rank, []).append((start, start + round(float(e.get("dur", 0)) * 1000)))
    return {"comm_ns": sum(_union_ns(v) for v in comm.values()) if comm else None, "devices": devices,
            "comm_kernels": sum(len(v) for v in comm.values())}


def _nsys_raw(path: Path) -> dict:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    rows = con.execute("SELECT k.globalPid, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                       "JOIN StringIds s ON s.id = coalesce(k.demangledName, k.shortName) "
                       "WHERE s.value LIKE 'nccl%'").fetchall()
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    devices = set()
    if "TARGET_INFO_GPU" in tables:
        devices = {r[0] for r in con.execute("SELECT name FROM TARGET_INFO_GPU")}
    con.close()
    comm: dict[int, list[tuple[int, int]]] = {}
    for pid, s, e in rows:
        comm.setdefault(pid, []).append((s, e))
    return {"comm_ns": sum(_union_ns(v) for v in comm.values()) if comm else None, "devices": devices,
            "comm_kernels": len(rows)}


def _peak(devices: set) -> float | None:
    found = [gbps for key, gbps in LINK_GBPS.items() for d in devices if d and key in d]
    return max(found) if found else None


@pytest.fixture(scope="module", params=[("kineto", d) for d in KINETO] + [("nsys", f) for f in NSYS],
                ids=lambda p: p[1].split("_nsys")[0])
def case(request, shared_traces):
    kind, name = request.param
    path = shared_traces / kind / name
    raw = _kineto_raw(path) if kind == "kineto" else _nsys_raw(path)
    with Job.open([path]) as job:
        summary = job.summary()
        rank_wait = job.query("rank_wait")
    return {"raw": raw, "summary": summary, "rank_wait": rank_wait, "name": name}


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_communication_time_equals_the_raw_files(case):
    s, raw = case["summary"], case["raw"]
    if raw["comm_ns"] is None:  # compute-only traces: unknown, never 0
        assert s["comm_ns"] in (None, 0) and s["comm_share_pct"] in (None, 0.0)
        return
    # Kineto µs with a fraction: at most 1 ns of rounding per kernel edge
    assert abs(s["comm_ns"] - raw["comm_ns"]) <= 2 * raw["comm_kernels"], (s["comm_ns"], raw["comm_ns"])


def test_no_bandwidth_above_the_physical_peak(case):
    s, raw = case["summary"], case["raw"]
    w = s.get("worst_collective") or {}
    peak = _peak(raw["devices"])
    if w.get("busbw_gbps") is not None:
        assert w["bandwidth_check"] == "ok"
        assert w["busbw_gbps"] <= w["peak_busbw_gbps"] + 1e-9
        if peak is not None:  # the product's peak is the device's link (all_reduce may use in-network reduction)
            bound = peak * (2 if w["collective"] == "all_reduce" else 1)
            assert w["busbw_gbps"] <= bound and w["peak_busbw_gbps"] <= bound
    for m in s.get("latency_models") or []:
        if m.get("fit_quality") == "ok":
            assert m["beta_busbw_gbps"] is not None and m["beta_busbw_gbps"] <= m["peak_busbw_gbps"]
            assert 0 <= m["alpha_us"] <= 1000


def test_latency_share_only_from_ok_fits(case):
    s = case["summary"]
    ok = [m for m in s.get("latency_models") or [] if m.get("fit_quality") == "ok"]
    if not ok:
        assert s["latency_bound_pct"] is None and s["coalescing_saving_ms"] is None
        assert any(m.startswith("latency_bound_pct") for m in s["missing"])


def test_stragglers_beat_chance(case):
    """A named straggler arrives last more often than chance, with a binomial tail recomputed here."""
    s, rw = case["summary"], case["rank_wait"]
    n_ranks = s["ranks"]
    for st in s["stragglers"]:
        k, n = st["times_last"], st["collectives"]
        tail = sum(math.comb(n, j) * (1 / n_ranks) ** j * (1 - 1 / n_ranks) ** (n - j) for j in range(k, n + 1))
        assert k / n > 1 / n_ranks
        assert min(1.0, tail * n_ranks) < 0.01
        assert st["p_value"] == pytest.approx(min(1.0, tail * n_ranks), rel=1e-3)
    named = {st["rank"] for st in s["stragglers"]}
    assert named == set(rw.filter(rw["is_straggler"])["rank"].to_list())
    if s["late_rank_cause"] is not None:
        assert s["late_rank_cause"]["rank"] in named


def test_single_rank_jobs_have_no_waits_and_say_why(case):
    s = case["summary"]
    if s["ranks"] != 1:
        return
    assert s["max_skew_ms"] is None and s["stragglers"] == []
    for m in s.get("latency_models") or []:
        assert m.get("alpha_us") is None or m["fit_quality"] != "ok"
