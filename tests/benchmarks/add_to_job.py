"""Adding a big trace to an existing job against ingesting it into a new database (issue 37, item 2).

    python -m tests.benchmarks.add_to_job [--kernels 500000,1000000,2000000,5000000] [--ranks 1]
        [--grow 100000] [--workdir DIR] [--keep] [--check] [--out bench-results/add_to_job.json]

For each N: an nsys export of N kernels (``fixtures.nsys_writer.write_large_nsys``, ``--ranks`` processes, one
runtime launch per kernel, every 10th kernel an NCCL AllReduce), ingested with ``--rank 8`` (after the bundled
8-rank example's ranks 0-7)

- ``new``: into a new database;
- ``add``: into a copy of the bundled example's database (``fixtures/example``, ingested once beforehand);

- ``grow`` (with ``--grow K``): a trace of K kernels added as rank 9 to the database ``add`` made (example + N),
  against the same trace into a new database: the refresh after it recomputes the per-rank sweeps of rank 9 only,
  so its cost follows K, not N (plus the cross-rank sweeps over the whole job);

each with ``nsys2comm ingest … --quiet`` in a fresh process (start-up, decode, write, stored-sweep refresh).
The goal: ``add`` within 1.5x of ``new``. ``--check`` then opens the added-to database read-only and checks that
the stored sweeps are used (their content key matches) and equal a fresh computation, sweep by sweep (slow at
millions of kernels). Not part of the test run.
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
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
EXAMPLE = ROOT / "fixtures" / "example"
ADDED_RANK = 8  # the example holds ranks 0-7


def _nsys2comm(*args: str) -> float:
    if hasattr(os, "sync"):
        os.sync()  # the copied database and the generated trace reach the disk before the measured step
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nsys2comm", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(f"nsys2comm {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return seconds


def _remove_db(path: Path) -> None:
    for p in (path, Path(f"{path}.wal")):
        if p.exists():
            p.unlink()


def _trace(workdir: Path, n: int, ranks: int) -> Path:
    from fixtures.nsys_writer import write_large_nsys

    path = workdir / f"nsys_{n}_{ranks}r.sqlite"
    if not path.exists():
        tmp = path.with_suffix(".partial")
        _remove_db(tmp)
        write_large_nsys(tmp, n_kernels=n, n_ranks=ranks)
        tmp.rename(path)
    return path


def check(db: Path) -> dict:
    """The stored sweeps of ``db`` are used by a read-only session and equal a fresh computation."""
    code = ("import json, sys\n"
            "from nsys2comm.storage import sweeps as cache\n"
            "from nsys2comm.storage import connect\n"
            "con = connect(sys.argv[1])\n"
            "used = cache._reading_stored_sweeps(con) == set(cache.SWEEPS)\n"
            "cache._restore_live(con)\n"
            "bad = [v for v in cache.SWEEPS if con.execute(\n"
            "    f'SELECT count(*) FROM ((SELECT * FROM _cache{v} EXCEPT ALL SELECT * FROM {v}) UNION ALL '\n"
            "    f'(SELECT * FROM {v} EXCEPT ALL SELECT * FROM _cache{v}))').fetchall()[0][0]]\n"
            "print('BENCH-JSON ' + json.dumps({'stored_sweeps_used': used, 'sweeps_differing': bad}))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(db)], cwd=ROOT, env=ENV, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-JSON "):
            return json.loads(line[len("BENCH-JSON "):])
    raise RuntimeError(f"check of {db} failed:\n{proc.stderr[-3000:]}")


def run(kernels: list[int], ranks: int, workdir: Path, do_check: bool, grow: int = 0) -> dict:
    base = workdir / "example.duckdb"
    _remove_db(base)
    base_s = _nsys2comm("ingest", str(EXAMPLE), "--db", str(base), "--quiet")
    res: dict = {"cores": os.cpu_count(), "example_ingest_s": round(base_s, 2), "steps": []}
    print(f"  example into a new database: {base_s:.2f} s", flush=True)
    for n in kernels:
        t = time.perf_counter()
        trace = _trace(workdir, n, ranks)
        print(f"  trace of {n:,} kernels ({ranks} process(es)): {time.perf_counter() - t:.1f} s", flush=True)
        new, add = workdir / "new.duckdb", workdir / "add.duckdb"
        _remove_db(new)
        _remove_db(add)
        new_s = _nsys2comm("ingest", str(trace), "--db", str(new), "--rank", str(ADDED_RANK), "--quiet")
        shutil.copyfile(base, add)
        add_s = _nsys2comm("ingest", str(trace), "--db", str(add), "--rank", str(ADDED_RANK), "--quiet")
        step = {"kernels": n, "processes": ranks, "new_db_s": round(new_s, 2), "add_to_example_s": round(add_s, 2),
                "ratio": round(add_s / new_s, 2), "add_kernels_per_s": round(n / add_s)}
        if grow:
            small = _trace(workdir, grow, 1)
            _remove_db(new)
            small_new_s = _nsys2comm("ingest", str(small), "--db", str(new), "--rank", str(ADDED_RANK + 1), "--quiet")
            grow_s = _nsys2comm("ingest", str(small), "--db", str(add), "--rank", str(ADDED_RANK + 1), "--quiet")
            step.update(grow_kernels=grow, grow_new_db_s=round(small_new_s, 2), grow_add_s=round(grow_s, 2))
            print(f"  {grow:,} kernels: new database {small_new_s:.2f} s, added to example + {n:,} {grow_s:.2f} s",
                  flush=True)
        if do_check:
            step["check"] = check(add)
        print(f"  {n:,} kernels: new database {new_s:.2f} s, added to the example {add_s:.2f} s "
              f"(x{step['ratio']}, {step['add_kernels_per_s']:,} kernels/s)"
              + (f", check {step['check']}" if do_check else ""), flush=True)
        res["steps"].append(step)
        _remove_db(new)
        _remove_db(add)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default="500000,1000000,2000000,5000000")
    ap.add_argument("--ranks", type=int, default=1, help="GPU processes in the added trace (ranks 8, 9, ...)")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--grow", type=int, default=0, help="kernels of a second trace added after each step (rank 9)")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "add_to_job.json"))
    a = ap.parse_args()
    kernels = [int(k) for k in a.kernels.split(",") if k]
    run_in_workdir(a.workdir, a.keep, "nsys2comm-add-", a.out,
                   lambda work: run(kernels, a.ranks, work, a.check, a.grow))


if __name__ == "__main__":
    main()
