"""Start-up of a fresh ``nsys2comm query`` process, by phase, with the machine-speed probe before and after.

    python -m tests.benchmarks.startup JOB.duckdb [--query run_overview] [--samples 5]

Each sample is a fresh ``python -c`` that times, in turn: ``import nsys2comm.cli``; opening the job and its catalog
check (``db.connect``); ``import polars``; the query and its frame (``analysis.run_query``). Then the whole command
``nsys2comm query JOB QUERY --format csv`` and a bare interpreter (``python -c pass``), fresh processes each.
Medians are printed; compare runs only through the probe (bench.py ``_speed_probe``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

_PHASES = r'''
import time; t0 = time.perf_counter()
import nsys2comm.cli
t1 = time.perf_counter()
from nsys2comm import analysis
from nsys2comm.storage import db
con = db.connect({db!r})
t2 = time.perf_counter()
import polars
t3 = time.perf_counter()
analysis.run_query(con, {query!r}, {{}})
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
'''
PHASES = ("import nsys2comm.cli", "open + catalog check", "import polars", "query + frame")


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    return time.perf_counter() - t


def measure(db: str, query: str = "run_overview", samples: int = 5) -> dict:
    from tests.benchmarks.bench import _speed_probe

    probe = [_speed_probe()]
    code = _PHASES.format(db=db, query=query)
    rows = [[float(x) for x in subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                              check=True).stdout.split()] for _ in range(samples)]
    out = {name: round(statistics.median(col), 3) for name, col in zip(PHASES, zip(*rows, strict=True), strict=True)}
    out["whole command"] = round(statistics.median(
        _wall([sys.executable, "-m", "nsys2comm", "query", db, query, "--format", "csv"]) for _ in range(samples)), 3)
    out["bare interpreter"] = round(statistics.median(_wall([sys.executable, "-c", "pass"]) for _ in range(samples)), 3)
    probe.append(_speed_probe())
    return {"seconds": out, "speed_probe_s": probe}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("--query", default="run_overview")
    ap.add_argument("--samples", type=int, default=5)
    a = ap.parse_args()
    res = measure(a.db, a.query, a.samples)
    for k, v in res["seconds"].items():
        print(f"{k:24} {v:7.3f} s")
    print(f"machine speed probe (before, after): {res['speed_probe_s']} s")


if __name__ == "__main__":
    main()
