"""Benchmark harness: synthetic jobs at scale, ingest MB/s and rows/s, peak RSS, query and report times.

    python -m tests.benchmarks.bench --size smoke|medium|full [--out bench-results/bench.json]
        [--hta-python /path/to/venv/bin/python] [--no-hta] [--workdir DIR] [--keep]
        [--only tiled,kineto,multi,nsys,queries] [--trace REAL_TRACE]

Sizes: smoke (CI: seconds), medium (Kineto 100 MB, nsys 1M kernels), full (Kineto 100 MB / 1 GB / 2 GB per rank,
8 ranks x 1 GB, nsys 1M and 10M kernels). Every step runs in its own process so its peak RSS is its own.
HolisticTraceAnalysis, when a python with it installed is given (or found in ../hta-venv), loads the same
files (the tiled real trace, the 100 MB synthetic one) in the same run and the ratio is printed. Generated traces
in --workdir are reused by later runs. Not part of the default test run (tests/test_benchmark_smoke.py runs smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SIZES = {
    "smoke": {"tiled_mb": [3], "kineto_mb": [2], "multi": (2, 2), "nsys_kernels": [20_000], "query_job": "nsys_20000"},
    "medium": {"tiled_mb": [400], "kineto_mb": [100], "multi": (8, 25), "nsys_kernels": [1_000_000],
               "query_job": "nsys_1000000"},
    "full": {"tiled_mb": [400, 2000], "kineto_mb": [100, 1000, 2000], "multi": (8, 1000),
             "nsys_kernels": [1_000_000, 10_000_000], "query_job": "nsys_10000000"},
}
# the real trace tiled for the side-by-side ingest run (HTA on the same file); fixtures/example when ../shared is absent
REAL_TRACE = ROOT.parent / "shared" / "traces" / "kineto" / "hta_df_index_resolver" / "df_index_resolver.json.gz"
FALLBACK_TRACE = ROOT / "fixtures" / "example"


def measure(step: str, python: str = sys.executable, **kwargs) -> dict:
    # written files (a freshly tiled 400 MB trace, the last step's database) reach the disk now, not inside the
    # measured step (with 390 MB dirty the ingest measured within the drift, but a slower disk would show it)
    if hasattr(os, "sync"):
        os.sync()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([python, "-m", "tests.benchmarks._measure", step, json.dumps(kwargs)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-JSON "):
            return json.loads(line[len("BENCH-JSON "):])
    raise RuntimeError(f"{step} failed:\n{proc.stderr[-3000:]}")


def _gen_kineto(path: Path, mb: int, rank: int, world: int) -> None:
    from fixtures.kineto_writer import write_large_kineto

    if not path.exists():
        write_large_kineto(path, mb * 1_000_000, rank=rank, world_size=world)


def _gen_nsys(path: Path, n: int, ranks: int) -> None:
    from fixtures.nsys_writer import write_large_nsys

    if not path.exists():
        write_large_nsys(path, n_kernels=n, n_ranks=ranks)


def find_hta_python(given: str | None) -> str | None:
    for cand in [given, os.environ.get("NSYS2COMM_HTA_PYTHON"), str(ROOT.parent / "hta-venv" / "bin" / "python")]:
        if cand and Path(cand).exists():
            ok = subprocess.run([cand, "-c", "import hta"], capture_output=True).returncode == 0
            if ok:
                return cand
    return None


def _tiled(sizes: list[int], workdir: Path, hta_python: str | None, source: Path, add) -> None:
    """A real trace tiled to each size: our ingest, plain and gzip (MB/s of decompressed JSON), and HTA loading
    the same plain file in the same run."""
    import gzip

    from tests.benchmarks.tile import tile, with_epoch_fractions, with_stream_pointers

    for mb in sizes:
        d = workdir / f"tiled_{mb}mb"
        d.mkdir(exist_ok=True)
        f = d / "rank0.pt.trace.json"
        if not f.exists():
            tile(source, f, mb)
        gz = workdir / f"tiled_{mb}mb.pt.trace.json.gz"
        if not gz.exists():
            with open(f, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        size_mb = f.stat().st_size / 1e6
        runs = [(f"tiled_ingest_{mb}mb", f), (f"tiled_ingest_{mb}mb_gz", gz)]
        # the same events as real format variants write them, where the source lends itself: early-2024 epoch ts
        # (us.nnn, read from their digits) where its ts are integers; ROCm's pointer text for a launch's stream
        # where it has CUDA runtime calls
        for variant, rewrite in (("epoch_fraction", with_epoch_fractions), ("stream_pointers", with_stream_pointers)):
            v = workdir / f"tiled_{mb}mb_{variant}" / "rank0.pt.trace.json"
            if not v.exists():
                v.parent.mkdir(exist_ok=True)
                if not rewrite(f, v):
                    v.unlink()
            runs += [(f"tiled_ingest_{mb}mb_{variant}", v)] if v.exists() else []
        # our ingests one after the other, then HTA: the gzip ratio compares runs next to each other (after HTA's
        # 2 GB and 35 s the gzip run read 0.62-0.79x the plain one, alone 0.86-0.87x)
        ours = {}
        for name, path in runs:
            db = workdir / f"{name}.duckdb"
            db.unlink(missing_ok=True)
            r = measure("ingest", db=str(db), paths=[str(path)], jobs=1)
            path_mb = size_mb if path is gz else path.stat().st_size / 1e6  # gzip: MB/s of the JSON
            ours[path] = add(name, r, input_mb=round(path_mb, 1), mb_per_s=round(path_mb / r["seconds"], 1),
                             source=source.name)
        if hta_python:
            h = measure("hta", python=hta_python, trace_dir=str(d))
            add(f"hta_load_tiled_{mb}mb", h, input_mb=round(size_mb, 1), mb_per_s=round(size_mb / h["seconds"], 1),
                ratio_vs_nsys2comm=round(h["seconds"] / ours[f]["seconds"], 1))


def _real_trace(given: str | None) -> Path:
    if given:
        return Path(given)
    if REAL_TRACE.exists():
        return REAL_TRACE
    return sorted(FALLBACK_TRACE.glob("*.json*"))[0]


GROUPS = ("tiled", "kineto", "multi", "nsys", "queries")  # --only: the steps of a run, in order


def run(size: str, workdir: Path, hta_python: str | None, source: Path | None = None,
        only: tuple[str, ...] = GROUPS) -> dict:
    source = source or _real_trace(None)
    cfg = SIZES[size]
    results: dict = {"size": size, "machine": {"cores": os.cpu_count(), "speed_probe_s": [_speed_probe()]},
                     "steps": []}
    rows = results["steps"]

    def add(name: str, res: dict, **extra) -> dict:
        res = {"step": name, **extra, **res}
        rows.append(res)
        shown = ", ".join(f"{k}={v}" for k, v in res.items() if k not in ("step", "per_query"))
        print(f"  {name}: " + shown, flush=True)
        return res

    if set(only) & {"tiled", "kineto", "multi", "nsys"}:
        # once per machine, catalog and DuckDB version, and apart from the ingest figures: on a fresh machine the
        # first new job database would build it inside the first timed ingest (+1.3-1.9 s)
        add("catalog_template", measure("catalog_template"))
    if "tiled" in only:
        _tiled(cfg["tiled_mb"], workdir, hta_python, source, add)
    if "kineto" in only:
        _kineto(cfg, workdir, hta_python, add)
    if "multi" in only:
        _multi(cfg, workdir, add)
    if "nsys" in only:
        _nsys(cfg, workdir, add)
    if "queries" in only:
        _queries(size, cfg, workdir, add, results)
    results["machine"]["speed_probe_s"].append(_speed_probe())
    print(f"  machine speed probe (before, after): {results['machine']['speed_probe_s']} s", flush=True)
    return results


def _speed_probe() -> float:
    """Seconds for ``sum(range(30_000_000))`` in a fresh process: this machine's speed drifts by 20-30 % within an
    hour, and figures of runs taken at different speeds do not compare (0.44-0.54 s here in a normal phase)."""
    code = "import time; t = time.perf_counter(); sum(range(30_000_000)); print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return round(float(out), 3)


def _kineto(cfg: dict, workdir: Path, hta_python: str | None, add) -> None:
    """One synthetic file per size, end-to-end parse -> DuckDB."""
    for mb in cfg["kineto_mb"]:
        f = workdir / f"kineto_{mb}mb" / "rank0.pt.trace.json"
        f.parent.mkdir(exist_ok=True)
        _gen_kineto(f, mb, 0, 8)
        size_mb = f.stat().st_size / 1e6
        db = workdir / f"kineto_{mb}.duckdb"
        db.unlink(missing_ok=True)
        r = measure("ingest", db=str(db), paths=[str(f)], jobs=1)
        add(f"kineto_ingest_{mb}mb", r, input_mb=round(size_mb, 1), mb_per_s=round(size_mb / r["seconds"], 1),
            rows_per_s=round(sum(r["rows"].values()) / r["seconds"]))
        if hta_python and mb == cfg["kineto_mb"][0]:
            h = measure("hta", python=hta_python, trace_dir=str(f.parent))
            add(f"hta_load_{mb}mb", h, input_mb=round(size_mb, 1), mb_per_s=round(size_mb / h["seconds"], 1),
                ratio_vs_nsys2comm=round(h["seconds"] / r["seconds"], 1))


def _multi(cfg: dict, workdir: Path, add) -> None:
    """Many files, one job: all cores; then the report on that job."""
    n, mb = cfg["multi"]
    d = workdir / f"kineto_{n}x{mb}mb"
    d.mkdir(exist_ok=True)
    for rank in range(n):
        _gen_kineto(d / f"rank{rank}.pt.trace.json", mb, rank, n)
    total_mb = sum(p.stat().st_size for p in d.iterdir()) / 1e6
    multi_db = workdir / f"multi_{n}x{mb}.duckdb"
    multi_db.unlink(missing_ok=True)
    r = measure("ingest", db=str(multi_db), paths=[str(d)], jobs=os.cpu_count() or 1)
    add(f"kineto_ingest_{n}ranks_x_{mb}mb", r, input_mb=round(total_mb, 1), mb_per_s=round(total_mb / r["seconds"], 1),
        jobs=os.cpu_count())
    rep = workdir / "report.html"
    add(f"report_{n}ranks_x_{mb}mb", measure("report", db=str(multi_db), out=str(rep)))


def _nsys(cfg: dict, workdir: Path, add) -> None:
    """nsys: importer vs a plain sqlite3 scan of the same rows."""
    for k in cfg["nsys_kernels"]:
        f = workdir / f"nsys_{k}.sqlite"
        _gen_nsys(f, k, 8)
        base = measure("sqlite_scan", path=str(f))
        add(f"sqlite_scan_{k}", base)
        db = workdir / f"nsys_{k}.duckdb"
        db.unlink(missing_ok=True)
        r = measure("ingest", db=str(db), paths=[str(f)], jobs=1)
        add(f"nsys_ingest_{k}_kernels", r, rows_per_s=round(sum(r["rows"].values()) / r["seconds"]),
            speed_vs_sqlite_scan=round(base["seconds"] / r["seconds"], 2))


def _queries(size: str, cfg: dict, workdir: Path, add, results: dict) -> None:
    """Every public catalog query on the largest nsys job: all in one process, then a fresh process each."""
    qdb = str(workdir / f"{cfg['query_job']}.duckdb")
    measure("refresh_cache", db=qdb)  # a job ingested by an older catalog (--only queries): as ingest leaves it
    q = measure("queries", db=qdb)
    add(f"all_queries_{cfg['query_job']}", q)
    results["per_query_seconds"] = q["per_query"]
    if size != "smoke":  # the target's setting: a fresh process per query (as one CLI call each)
        from tests.benchmarks._measure import query_names

        fresh = {n: measure("queries", db=qdb, names=[n])["seconds"] for n in query_names()}
        add(f"each_query_fresh_process_{cfg['query_job']}", {"seconds": sum(fresh.values()), "peak_rss_mb": 0},
            slowest=max(fresh, key=fresh.get), slowest_seconds=round(max(fresh.values()), 2))
        results["per_query_fresh_seconds"] = fresh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=SIZES, default="smoke")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "bench.json"))
    ap.add_argument("--workdir")
    ap.add_argument("--hta-python", help="python of a venv with HolisticTraceAnalysis "
                                         "(default: $NSYS2COMM_HTA_PYTHON or ../hta-venv)")
    ap.add_argument("--no-hta", action="store_true", help="skip the HolisticTraceAnalysis comparison")
    ap.add_argument("--keep", action="store_true", help="keep generated traces and databases")
    ap.add_argument("--trace", help="real Kineto trace to tile for the side-by-side ingest run "
                                    "(default: ../shared/traces/kineto/hta_df_index_resolver)")
    ap.add_argument("--only", default=",".join(GROUPS),
                    help=f"comma-separated step groups to run, of {','.join(GROUPS)} (queries needs the nsys job "
                         "of the same size in --workdir)")
    a = ap.parse_args()
    only = tuple(g.strip() for g in a.only.split(",") if g.strip())
    if not set(only) <= set(GROUPS):
        ap.error(f"--only: unknown group(s) {sorted(set(only) - set(GROUPS))}; choose among {', '.join(GROUPS)}")
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="nsys2comm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    hta_py = None if a.no_hta else find_hta_python(a.hta_python)
    print(f"nsys2comm benchmark, size={a.size}, workdir={work}, HTA={'yes' if hta_py else 'not installed'}", flush=True)
    t = time.perf_counter()
    try:
        res = run(a.size, work, hta_py, _real_trace(a.trace), only)
    finally:
        if not a.keep and not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    res["total_seconds"] = round(time.perf_counter() - t, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    print(f"\n{'step':42} {'seconds':>9} {'MB/s':>8} {'peak RSS MB':>12}  notes (RSS: all processes)")
    for s in res["steps"]:
        notes = {k: v for k, v in s.items()
                 if k in ("ratio_vs_nsys2comm", "speed_vs_sqlite_scan", "html_bytes", "rows_per_s", "built")}
        rss = s.get("peak_rss_all_mb", s["peak_rss_mb"])
        print(f"{s['step']:42} {s['seconds']:9.2f} {s.get('mb_per_s', ''):>8} {rss:>12}  {notes}")
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
