"""Scaling figures of Parquet job directories (README "Large jobs"); not part of the test run.

    python -m tests.benchmarks.bench_scale [--ranks 8 --mb 25] [--nsys-kernels 1000000] [--dask-ranks 256]
        [--workers 2] [--workdir DIR] [--keep] [--out bench-results/bench_scale.json]

1. ingest: N Kineto ranks of M MB each written into one directory by K = 1, 2 independent processes at once
   (``nsys2comm ingest FILES --out DIR``, every K-th file each, as K nodes' epilogues would); efficiency
   T(1) / (K × T(K)).
2. catalog: the nsys job of ``--nsys-kernels`` kernels × 8 ranks as a DuckDB file and as a Parquet directory:
   open, shared sweeps (cache.materialize) and every public catalog query, each in a fresh process; the directory
   also with the per-rank stage on a local Dask cluster.
3. dask: a synthetic job of ``--dask-ranks`` small ranks: the catalog through a local Dask cluster of
   ``--workers`` processes equals the DuckDB file's (every public query) and the time of each stage.
4. a projection for 1,024 ranks × 1 GB on N nodes from the measured per-process rates (printed).
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
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _nsys2comm(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nsys2comm", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _out, err = p.communicate()
        if p.returncode:
            raise RuntimeError(err[-2000:])


def step(name: str, **kwargs) -> dict:
    """Run one measured step of this module in a fresh process (its own imports, caches and memory)."""
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.bench_scale", "--step", name, json.dumps(kwargs)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-JSON "):
            return json.loads(line[len("BENCH-JSON "):])
    raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")


# ------------------------------------------------------------------------------------------------ steps (child)

def catalog_step(source: str, dask_workers: int | None = None) -> dict:
    """Open, the shared sweeps and every public catalog query, as the report and _measure.queries run them."""
    import resource

    from nsys2comm import Job, analysis, catalog
    from nsys2comm.storage import sweeps as cache

    t0 = time.perf_counter()
    job = Job.open(source, dask_local=dask_workers) if dask_workers else Job.open(source)
    t1 = time.perf_counter()
    cache.materialize(job.con)
    t2 = time.perf_counter()
    per = {}
    for obj in catalog.public_queries():
        if obj.is_table_macro and not obj.required_params:
            t = time.perf_counter()
            analysis.run_query(job.con, obj.name, {})
            per[obj.name] = time.perf_counter() - t
    t3 = time.perf_counter()
    return {"open_s": t1 - t0, "sweeps_s": t2 - t1, "queries_s": t3 - t2, "total_s": t3 - t0, "stages": job.stages,
            "slowest": sorted(per.items(), key=lambda kv: -kv[1])[:3],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def equal_step(db: str, job_dir: str, workers: int) -> dict:
    """Every public query on the DuckDB file, the directory, and the directory through a local Dask cluster."""
    sys.path.insert(0, str(ROOT / "tests"))
    import jobs_util as ju

    from nsys2comm import Job
    from nsys2comm.storage import dask_stage as distributed
    from nsys2comm.storage import sweeps as cache

    t = time.perf_counter()
    with Job.open(db) as j:
        cache.materialize(j.con)
        want = ju.frames(j.con)
    t_db = time.perf_counter() - t
    t = time.perf_counter()
    with Job.open(job_dir) as j:
        cache.materialize(j.con)  # the sweeps once, as the report does
        ju.assert_same(want, ju.frames(j.con))
    t_dir = time.perf_counter() - t
    t = time.perf_counter()
    with distributed.client(local_workers=workers) as c:
        t_cluster = time.perf_counter() - t
        t = time.perf_counter()
        with Job.open(job_dir, scheduler=c) as j:
            t_open = time.perf_counter() - t
            stages = j.stages
            t = time.perf_counter()
            ju.assert_same(want, ju.frames(j.con))
            t_q = time.perf_counter() - t
    return {"equal": True, "queries": len(want), "duckdb_file_s": t_db, "dir_local_s": t_dir,
            "dask_cluster_start_s": t_cluster, "dask_open_s": t_open, "dask_stages": stages, "dask_queries_s": t_q}


# ------------------------------------------------------------------------------------------------ driver

def bench_ingest(work: Path, ranks: int, mb: int) -> dict:
    from fixtures.kineto_writer import write_large_kineto

    src = work / f"kineto_{ranks}x{mb}"
    src.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        p = src / f"rank{r}.json"
        if not p.exists():
            write_large_kineto(p, mb * 1_000_000, rank=r, world_size=ranks)
        paths.append(p)
    total_mb = sum(p.stat().st_size for p in paths) / 1e6
    out = {"ranks": ranks, "mb_per_rank": mb, "total_mb": round(total_mb)}
    for k in (1, 2):
        d = work / f"ingest_k{k}"
        shutil.rmtree(d, ignore_errors=True)
        t = time.perf_counter()
        _wait([_nsys2comm("ingest", *map(str, paths[i::k]), "--out", str(d), "-q", "-j", "1") for i in range(k)])
        out[f"k{k}_s"] = time.perf_counter() - t
    out["efficiency_k2"] = out["k1_s"] / (2 * out["k2_s"])
    out["mb_per_s_per_process"] = total_mb / out["k1_s"]
    db = work / "ingest_db.duckdb"
    db.unlink(missing_ok=True)
    t = time.perf_counter()
    _wait([_nsys2comm("ingest", *map(str, paths), "--db", str(db), "-q")])
    out["duckdb_file_s"] = time.perf_counter() - t
    return out


def bench_catalog(work: Path, n_kernels: int, workers: int) -> dict:
    from fixtures.nsys_writer import write_large_nsys

    path = work / f"nsys_{n_kernels}.sqlite"
    if not path.exists():
        write_large_nsys(path, n_kernels=n_kernels, n_ranks=8)
    db, d = work / f"nsys_{n_kernels}.duckdb", work / f"nsys_{n_kernels}_dir"
    db.unlink(missing_ok=True)
    shutil.rmtree(d, ignore_errors=True)
    out = {"kernels": n_kernels, "ranks": 8, "workers": workers}
    for key, args in (("ingest_db_s", ["--db", str(db)]), ("ingest_dir_s", ["--out", str(d)])):
        t = time.perf_counter()
        _wait([_nsys2comm("ingest", str(path), *args, "-q")])
        out[key] = time.perf_counter() - t
    out["duckdb_file"] = step("catalog_step", source=str(db))
    out["parquet_dir"] = step("catalog_step", source=str(d))
    out["parquet_dir_dask"] = step("catalog_step", source=str(d), dask_workers=workers)
    out["ratio_dir_vs_db"] = out["parquet_dir"]["total_s"] / out["duckdb_file"]["total_s"]
    return out


def bench_dask(work: Path, ranks: int, workers: int) -> dict:
    from fixtures import synthetic as syn
    from fixtures.kineto_writer import write_kineto
    from nsys2comm.ingest import ingest
    from nsys2comm.storage import db as dbmod

    paths = write_kineto(syn.make_run(world_size=ranks, steps=2), work / f"synth_{ranks}")
    db, d = work / f"synth_{ranks}.duckdb", work / f"synth_{ranks}_dir"
    db.unlink(missing_ok=True)
    shutil.rmtree(d, ignore_errors=True)
    out = {"ranks": ranks, "workers": workers, "mb": round(sum(p.stat().st_size for p in paths) / 1e6, 1)}
    t = time.perf_counter()
    _wait([_nsys2comm("ingest", *map(str, paths[i::2]), "--out", str(d), "-q", "-j", "1") for i in range(2)])
    out["ingest_dir_k2_s"] = time.perf_counter() - t
    t = time.perf_counter()
    con = dbmod.connect(db, write=True)
    ingest(con, paths, jobs=1)  # write_kineto returns rank order: file ids coincide
    con.close()
    out["ingest_db_s"] = time.perf_counter() - t
    out.update(step("equal_step", db=str(db), job_dir=str(d), workers=workers))
    return out


def projection(ing: dict, cat: dict) -> list[str]:
    """1,024 ranks × 1 GB on N nodes, from the measured per-process rates (assumptions in the lines)."""
    rate = ing["mb_per_s_per_process"]  # MB/s of one writer process (Kineto)
    # one worker's seconds per rank of the nsys job (its workers ran 8 ranks side by side; includes their start-up)
    per_rank_s = cat["parquet_dir_dask"]["stages"].get("per_rank_s", 0) * cat["workers"] / 8
    per_rank_s_gb = per_rank_s * (700_000 / (cat["kernels"] / 8))  # a 1 GB Kineto rank holds ~0.7M kernels
    lines = [f"measured: {rate:.0f} MB/s per writer process; per-rank stage {per_rank_s:.2f} s per rank of "
             f"{cat['kernels'] // 8:,} kernels -> ~{per_rank_s_gb:.1f} s per 1 GB rank"]
    for nodes in (1, 16, 64, 128):
        writers = 4  # ingest processes per node (memory: ~1.2 GB peak RSS each for a 1 GB trace)
        files_per_proc = -(-1024 // (nodes * writers))
        ingest_min = files_per_proc * 1000 / rate / 60
        workers = nodes * writers
        stage_min = -(-1024 // workers) * per_rank_s_gb / 60
        lines.append(f"{nodes:>4} nodes x {writers} writers: ingest {ingest_min:6.1f} min, per-rank stage on "
                     f"{workers} Dask workers {stage_min:5.1f} min")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step")
    ap.add_argument("args", nargs="?")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb", type=int, default=25)
    ap.add_argument("--nsys-kernels", type=int, default=1_000_000)
    ap.add_argument("--dask-ranks", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--parts", default="ingest,catalog,dask", help="which measurements to run")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "bench_scale.json"))
    a = ap.parse_args()
    if a.step:
        res = {"catalog_step": catalog_step, "equal_step": equal_step}[a.step](**json.loads(a.args))
        print("BENCH-JSON " + json.dumps(res))
        return
    work = Path(a.workdir or tempfile.mkdtemp(prefix="nsys2comm-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = {"cpu_count": os.cpu_count(), "load_average_before": os.getloadavg()}
        parts = {"ingest": lambda: bench_ingest(work, a.ranks, a.mb),
                 "catalog": lambda: bench_catalog(work, a.nsys_kernels, a.workers),
                 "dask": lambda: bench_dask(work, a.dask_ranks, a.workers)}
        for name in a.parts.split(","):
            res[name] = parts[name]()
            print(json.dumps(res[name], indent=1), flush=True)
        if {"ingest", "catalog"} <= set(res):
            res["projection"] = projection(res["ingest"], res["catalog"])
            print("\n".join(res["projection"]))
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
    finally:
        if not a.keep and not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
