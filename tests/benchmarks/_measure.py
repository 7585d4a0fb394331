"""Runs one measured step in a fresh process and prints JSON: seconds, peak RSS (self and children), extras.

Used by bench.py so that each step's peak RSS is its own (ru_maxrss is a high-water mark per process).
"""

from __future__ import annotations

import json
import resource
import sqlite3
import sys
import time


def _rss_mb() -> dict:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"peak_rss_mb": round(max(self_kb, kids_kb) / 1024, 1),
            "peak_rss_all_mb": round(_TREE.peak_kb / 1024, 1)}


class _TreeRss:
    """Peak of the summed RSS of this process and all its descendants (pool workers are grandchildren through
    the forkserver), sampled every 10 ms from /proc: the 'all processes' figure of the performance table.

    Cheap on purpose: it runs beside the measured work, on the same cores and (as a thread) under the same GIL.
    Each process's parent is read once (a pid's parent does not change while it lives), and only the tree's
    resident sizes are read at each sample; reading stat and status of every process every 10 ms took 38 % of a
    core here and slowed the measured ingest."""

    def __init__(self):
        import os
        import threading

        self.peak_kb = 0
        self.me = os.getpid()
        self.parent: dict[int, int] = {}
        self.page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
        if os.path.isdir("/proc"):
            threading.Thread(target=self._run, daemon=True).start()

    def _parent_of(self, pid: int) -> int | None:
        if pid not in self.parent:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    self.parent[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return None
        return self.parent[pid]

    def _sample(self) -> int:
        import os

        live = {int(d) for d in os.listdir("/proc") if d.isdigit()}
        for gone in self.parent.keys() - live:  # a pid may be reused by another process later
            del self.parent[gone]
        children: dict[int, list[int]] = {}
        for pid in live:
            children.setdefault(self._parent_of(pid), []).append(pid)
        tree, frontier = [self.me], [self.me]
        while frontier:
            kids = children.get(frontier.pop(), [])
            tree += kids
            frontier += kids
        total = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * self.page_kb
            except (OSError, ValueError, IndexError):
                continue
        return total

    def _run(self) -> None:
        while True:
            self.peak_kb = max(self.peak_kb, self._sample())
            time.sleep(0.01)


_TREE = _TreeRss() if __name__ == "__main__" else None


def catalog_template() -> dict:
    """The catalog template new job databases copy, built where this machine has none for this catalog and DuckDB
    version (once per machine: otherwise the first timed ingest of a run on a fresh machine pays it)."""
    from nsys2comm.storage import db as dbmod

    t = time.perf_counter()
    built = dbmod.ensure_template()
    return {"seconds": time.perf_counter() - t, "built": built}


def ingest(db: str, paths: list[str], jobs: int) -> dict:
    """The product path (``Job.ingest``, as the CLI runs it), timed from opening the database: a new database's
    catalog install counts."""
    from nsys2comm import Job

    t = time.perf_counter()
    job = Job.ingest(paths, db=db, jobs=jobs)
    secs = time.perf_counter() - t
    counts = {t: job.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
              for t in ("kernels", "api_calls", "cpu_ranges", "mem_ops", "comm_ops")}
    job.close()
    bad = [r.message for r in job.results if r.status == "failed"]
    return {"seconds": secs, "rows": counts, "failed": bad}


def cli_ingest(path: str, db: str) -> dict:
    """The whole CLI command as a user runs it, ``nsys2comm ingest FILE --db X`` in a fresh process: interpreter
    start-up, imports, the catalog and the ingest all count (timed from the spawn to the exit)."""
    import subprocess

    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nsys2comm", "ingest", path, "--db", db],
                          capture_output=True, text=True)
    secs = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"nsys2comm ingest failed:\n{proc.stderr[-2000:]}")
    return {"seconds": secs}


def sqlite_scan(path: str) -> dict:
    """Baseline: a plain sqlite3 scan of the rows the nsys importer reads (kernels, runtime, NVTX)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    t = time.perf_counter()
    rows = 0
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
        if table not in have:
            continue
        cur = con.execute(f"SELECT * FROM {table}")
        while chunk := cur.fetchmany(100_000):
            rows += len(chunk)
    return {"seconds": time.perf_counter() - t, "rows": rows}


def query_names() -> list[str]:
    """Every public table macro a user can run without arguments (helpers that take a table name are left out)."""
    from nsys2comm import catalog

    return [o.name for o in catalog.public_queries() if o.is_table_macro and not o.required_params]


def refresh_cache(db: str) -> dict:
    """The stored sweeps as an ingest by this nsys2comm leaves them (a no-op when they match; after a catalog change
    they do not, and queries would compute live)."""
    from nsys2comm.storage import db as dbmod
    from nsys2comm.storage import sweeps as cache

    t = time.perf_counter()
    con = dbmod.connect(db, write=True)
    refreshed = cache.refresh_cache(con)
    con.close()
    return {"seconds": time.perf_counter() - t, "refreshed": refreshed}


def queries(db: str, names: list[str] | None = None) -> dict:
    """Public table macros through the product path (analysis.run_query on a read-only session, which reads the
    sweeps ingest stored), timed from opening the database; without ``names`` all of them in this one process,
    after the shared sweeps are materialized once (as the report and summary do; the materialization counts in the
    total)."""
    from nsys2comm import analysis
    from nsys2comm.storage import db as dbmod
    from nsys2comm.storage import sweeps as cache

    t = time.perf_counter()
    con = dbmod.connect(db)
    times = {"(open the database)": time.perf_counter() - t}  # a CLI call pays it each time
    if names is None:
        t = time.perf_counter()
        cache.materialize(con)
        times["(materialize timeline)"] = time.perf_counter() - t
    for name in names or query_names():
        t = time.perf_counter()
        analysis.run_query(con, name, {})
        times[name] = time.perf_counter() - t
    return {"seconds": sum(times.values()), "per_query": times}


def report(db: str, out: str) -> dict:
    import os

    from nsys2comm.report import build_report
    from nsys2comm.storage import db as dbmod

    con = dbmod.connect(db)
    t = time.perf_counter()
    build_report(con, out)
    return {"seconds": time.perf_counter() - t, "html_bytes": os.path.getsize(out)}


def hta(trace_dir: str) -> dict:
    """HolisticTraceAnalysis load time (run with the separate HTA venv's python)."""
    from hta.trace_analysis import TraceAnalysis

    t = time.perf_counter()
    TraceAnalysis(trace_dir=trace_dir)
    return {"seconds": time.perf_counter() - t}


if __name__ == "__main__":
    step, args = sys.argv[1], json.loads(sys.argv[2])
    out = globals()[step](**args)
    out.update(_rss_mb())
    print("BENCH-JSON " + json.dumps(out))
