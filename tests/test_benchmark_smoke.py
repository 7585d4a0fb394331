"""The benchmark harness runs end to end at its smoke size (figures are checked by people, not by this test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# tier: slow, subprocess (runs the benchmark harness in its own process)
pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.bench", "--size", "smoke", "--out", str(out),
                           "--no-hta"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    steps = {s["step"]: s for s in res["steps"]}
    assert {"kineto_ingest_2mb", "kineto_ingest_2ranks_x_2mb", "report_2ranks_x_2mb", "sqlite_scan_20000",
            "nsys_ingest_20000_kernels", "all_queries_nsys_20000"} <= set(steps)
    assert steps["kineto_ingest_2mb"]["rows"]["kernels"] > 0
    # the catalog template is built (or found) before the first timed ingest, as a step of its own
    assert res["steps"][0]["step"] == "catalog_template" and isinstance(res["steps"][0]["built"], bool)
    # the real trace, tiled, plain and gzip: the same rows either way
    tiled, tiled_gz = steps["tiled_ingest_3mb"], steps["tiled_ingest_3mb_gz"]
    assert tiled["rows"]["kernels"] > 0 and tiled["rows"] == tiled_gz["rows"]
    assert tiled["peak_rss_all_mb"] > 0
    # and with early-2024 epoch ts (us.nnn) read from their digits: the same rows
    assert steps["tiled_ingest_3mb_epoch_fraction"]["rows"] == tiled["rows"]
    # and with ROCm's pointer text for each launch's stream: the same rows
    assert steps["tiled_ingest_3mb_stream_pointers"]["rows"] == tiled["rows"]
    assert steps["nsys_ingest_20000_kernels"]["rows"]["kernels"] == 20_000
    assert steps["report_2ranks_x_2mb"]["html_bytes"] < 2_000_000
    assert all(s["peak_rss_mb"] > 0 for s in res["steps"])
    # every public table macro was timed
    assert len(res["per_query_seconds"]) >= 10
    assert "kernels" in proc.stdout  # the printed table
    probes = res["machine"]["speed_probe_s"]  # the machine's speed before and after, to compare runs by
    assert len(probes) == 2 and all(p > 0 for p in probes)
