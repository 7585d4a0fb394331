"""Many small traces: N one-kernel Kineto traces (one rank each), as the per-rank files of a large job.

    python -m tests.benchmarks.many_files [--files 10000] [--workdir DIR] [--keep]
        [--targets db,dir] [--out bench-results/many_files.json]

Writes the traces by code (``write_one_kernel_traces``), then ingests the directory with ``nsys2comm ingest DIR
--db X`` and ``--out DIR`` in fresh processes (start-up included) and reports files/s. Also used, at a small N, by
the count test in tests/test_ingest_many.py. Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.benchmarks.workdir import run_in_workdir

ROOT = Path(__file__).resolve().parents[2]
BASE_NS = 1_764_000_000_000_000_000  # 2025-11-24, a plausible profiler base time
KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)"


def one_kernel_doc(rank: int, world_size: int) -> dict:
    """A Kineto trace of one rank holding one kernel and its launch (the launch's correlation links them)."""
    t = 1_000 + rank  # µs after baseTimeNanoseconds
    corr = 1
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,
                              "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
        "baseTimeNanoseconds": BASE_NS,
        "displayTimeUnit": "ms",
        "traceEvents": [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100 + rank, "tid": 100 + rank,
             "ts": t, "dur": 4, "args": {"External id": corr, "cbid": 211, "correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": KERNEL, "pid": 0, "tid": 7, "ts": t + 10, "dur": 3,
             "args": {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": 7,
                      "correlation": corr, "registers per thread": 32, "shared memory": 0,
                      "grid": [1, 1, 1], "block": [128, 1, 1]}},
        ],
    }


def write_one_kernel_traces(out_dir: str | Path, n: int, *, start_rank: int = 0, world_size: int | None = None
                            ) -> list[Path]:
    """``n`` one-kernel traces ``rank{r:05d}.pt.trace.json`` for ranks start_rank … start_rank + n − 1."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ws = world_size or start_rank + n
    paths = []
    for r in range(start_rank, start_rank + n):
        p = out / f"rank{r:05d}.pt.trace.json"
        p.write_text(json.dumps(one_kernel_doc(r, ws)))
        paths.append(p)
    return paths


def _ingest(traces: Path, target: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nsys2comm", "ingest", str(traces), *target, "--quiet"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return {"seconds": round(seconds, 2)}


def run(n: int, workdir: Path, targets: tuple[str, ...]) -> dict:
    traces = workdir / f"one_kernel_{n}"
    if not traces.is_dir() or len(list(traces.iterdir())) != n:
        shutil.rmtree(traces, ignore_errors=True)
        write_one_kernel_traces(traces, n)
    res: dict = {"files": n, "cores": os.cpu_count(), "steps": []}
    for target in targets:
        dest = workdir / ("many.duckdb" if target == "db" else "many_dir")
        if dest.is_dir():
            shutil.rmtree(dest)
        for p in (dest, Path(f"{dest}.wal")):
            if p.is_file():
                p.unlink()
        r = _ingest(traces, ["--db", str(dest)] if target == "db" else ["--out", str(dest)])
        r.update(step=f"ingest_{n}_files_{target}", files_per_s=round(n / r["seconds"], 1))
        print(f"  {r['step']}: {r['seconds']} s, {r['files_per_s']} files/s", flush=True)
        res["steps"].append(r)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--targets", default="db,dir")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "many_files.json"))
    a = ap.parse_args()
    targets = tuple(t for t in a.targets.split(",") if t)
    run_in_workdir(a.workdir, a.keep, "nsys2comm-many-", a.out, lambda work: run(a.files, work, targets))


if __name__ == "__main__":
    main()
