"""Start-up of a fresh ``nsys2comm query`` process, by phase, with the machine-speed probe before and after.

    python -m tests.benchmarks.startup JOB.duckdb [--query run_overview] [--samples 5]
    python -m tests.benchmarks.startup JOB.duckdb --each [--limit 20]   # every public query, whole command each

Each sample is a fresh ``python -c`` that times, in turn: ``import nsys2comm.cli``; opening the job and its catalog
check (``storage.connect``); the query's rows as the CLI writes them without polars (``cli._plain_rows``); and, for
reference, ``import polars`` (what a format or option that needs polars adds). Then, fresh processes each: the
whole command ``nsys2comm query JOB QUERY --format csv``, ``python -c "import duckdb"`` (the floor: DuckDB's own
import) and a bare interpreter (``python -c pass``). Medians are printed; compare runs only through the probe
(bench.py ``_speed_probe``). ``--each`` runs every public query (``_measure.query_names``) as the whole command,
a fresh process each, and prints each time (``--limit``: a query stopped after that many seconds counts them),
the total and the slowest.
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
from nsys2comm import cli
from nsys2comm.api import Job
from nsys2comm.storage import db
con = db.connect({db!r})
t2 = time.perf_counter()
rows = cli._plain_rows(Job(con, path={db!r}), {query!r}, {{}}, fmt="csv", output=None, timeunit=None, relative=False)
t3 = time.perf_counter()
import polars
t4 = time.perf_counter()
assert rows is not None, "this query's rows go through polars"
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
'''
PHASES = ("import nsys2comm.cli", "open + catalog check", "query rows (no polars)", "(import polars)")


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
    out["import duckdb alone"] = round(statistics.median(
        _wall([sys.executable, "-c", "import duckdb"]) for _ in range(samples)), 3)
    out["bare interpreter"] = round(statistics.median(_wall([sys.executable, "-c", "pass"]) for _ in range(samples)), 3)
    probe.append(_speed_probe())
    return {"seconds": out, "speed_probe_s": probe}


def each_query(db: str, limit_s: float | None = None) -> dict:
    """Every public query as the whole command ``nsys2comm query JOB NAME --format csv``, a fresh process each
    (printed as it ends); one still running after ``limit_s`` is stopped and counted at ``limit_s``."""
    from tests.benchmarks._measure import query_names
    from tests.benchmarks.bench import _speed_probe

    probe = [_speed_probe()]
    times = {}
    for n in query_names():
        t = time.perf_counter()
        try:
            subprocess.run([sys.executable, "-m", "nsys2comm", "query", db, n, "--format", "csv"],
                           capture_output=True, check=True, timeout=limit_s)
        except subprocess.TimeoutExpired:
            print(f"{n:32} stopped after {limit_s} s", flush=True)
        times[n] = round(time.perf_counter() - t, 3)
        print(f"{n:32} {times[n]:7.3f} s", flush=True)
    probe.append(_speed_probe())
    slowest = max(times, key=times.__getitem__)
    return {"seconds": times, "total_s": round(sum(times.values()), 2), "slowest": slowest,
            "slowest_s": times[slowest], "speed_probe_s": probe}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("--query", default="run_overview")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--each", action="store_true", help="every public query as the whole command, once each")
    ap.add_argument("--limit", type=float, help="--each: stop a query after this many seconds")
    a = ap.parse_args()
    if a.each:
        res = each_query(a.db, a.limit)
        print(f"total {res['total_s']} s over {len(res['seconds'])} queries; slowest {res['slowest']} "
              f"{res['slowest_s']} s; machine speed probe (before, after): {res['speed_probe_s']} s")
        return
    res = measure(a.db, a.query, a.samples)
    for k, v in res["seconds"].items():
        print(f"{k:24} {v:7.3f} s")
    print(f"machine speed probe (before, after): {res['speed_probe_s']} s")


if __name__ == "__main__":
    main()
