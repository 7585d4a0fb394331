"""Shared by test_jobdir.py and test_dask.py: synthetic and real jobs as trace files, the same job as a DuckDB file
(ingested in rank order, so file ids coincide) and as a Parquet directory written by 3 concurrent processes, and
the check that every public catalog query gives the same rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl

from fixtures import synthetic as syn
from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import write_nsys
from nsys2comm import analysis, catalog
from nsys2comm.ingest import ingest
from nsys2comm.storage import db as dbmod
from nsys2comm.storage import snapshotted

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "fixtures" / "example"
JOBS = ("kineto6", "multihost8", "example8")


def traces(name: str, d: Path) -> list[Path]:
    """The job's trace files in rank order (one rank per file)."""
    d.mkdir(parents=True, exist_ok=True)
    if name == "kineto6":  # 6 ranks, steps, collectives and a p2p ring, one Kineto file per rank
        return write_kineto(syn.make_run(world_size=6, steps=2), d)
    if name == "multihost8":  # 8 nsys exports, one rank each, two hosts whose clocks are 3 ms apart
        run = syn.make_latency_run(world_size=8, ranks_per_host=4, host_offsets_ns=(0, 3_000_000), reps=2)
        return [write_nsys(syn.Run(run.world_size, run.nccl_era, [rr], host=rr.host), d / f"rank-{rr.rank}.sqlite")
                for rr in run.ranks]
    if name == "example8":
        return sorted(EXAMPLE.glob("*.json.gz"))  # worker0 … worker7: rank order
    raise KeyError(name)


def duckdb_file(paths: list[Path], path: Path) -> Path:
    con = dbmod.connect(path, write=True)
    for p in paths:  # one at a time, in rank order: file_id = rank + 1 as in the Parquet job
        ingest(con, [p], jobs=1)
    con.close()
    return path


def cli(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "nsys2comm", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def concurrent_ingest(paths: list[Path], out: Path, k: int = 3) -> Path:
    """``k`` independent writer processes at once, each with every k-th file (as k nodes' epilogues would)."""
    procs = [cli("ingest", *map(str, paths[i::k]), "--out", str(out), "-q", "-j", "1") for i in range(k)
             if paths[i::k]]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    return out


def public_queries() -> list[str]:
    """Every public catalog query that runs on its own (as tests/benchmarks/_measure.py queries())."""
    return [o.name for o in catalog.public_queries() if o.is_table_macro and not o.required_params]


def frames(con) -> dict[str, pl.DataFrame]:
    """Every public query's rows, in one batch with the sweeps snapshotted, as the results layer runs them (a
    Parquet job computes its sweeps at read time: once here, not once per query)."""
    with snapshotted(con):
        return {name: analysis.run_query(con, name, {}) for name in public_queries()}


def assert_same(want: dict[str, pl.DataFrame], got: dict[str, pl.DataFrame]) -> None:
    """Row for row; schema_objects lists the canonical tables of a Parquet job as views (kind 'view'), so its kind
    column is left out there."""
    bad = []
    for name, w in want.items():
        g = got[name]
        if name == "schema_objects":
            w, g = (f.drop("kind").sort(["object", "column"], nulls_last=False) for f in (w, g))
        if w.schema != g.schema or not w.equals(g):
            bad.append(name)
    assert not bad, f"differ: {bad}"


_BUILT: dict[str, dict] = {}


def build(name: str, base: Path) -> dict:
    """Once per test session: the job's traces, its DuckDB file, its Parquet directory (3 writers at once) and
    the DuckDB file's catalog results."""
    if name not in _BUILT:
        d = base / name
        paths = traces(name, d / "traces")
        db = duckdb_file(paths, d / "job.duckdb")
        job_dir = concurrent_ingest(paths, d / "job")
        con = dbmod.connect(db)
        want = frames(con)
        con.close()
        _BUILT[name] = {"traces": paths, "db": db, "dir": job_dir, "want": want}
    return _BUILT[name]
