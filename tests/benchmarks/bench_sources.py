"""Kineto ingest speed on the traces users have: every real Kineto trace in ../shared/traces, tiled.

    python -m tests.benchmarks.bench_sources [--mb 400] [--size smoke] [--reps 3] [--sources a,b]
        [--workdir DIR] [--out bench-results/sources.json] [--hta-python PY] [--no-hta]

Each source (one trace per directory of ../shared/traces: its first file by name, the ranks of a job sharing one
workload) is tiled to ``--mb`` three ways: in the layout Kineto's writer uses (tile.py ``_kineto_event``), as
compact JSON (one event per line, no spaces: more events per MB) and as gzip of the Kineto layout. Each file is
ingested twice per repetition, in a fresh process each (tests/benchmarks/_measure.py):

- ``cli``: the whole command ``nsys2comm ingest FILE --db X`` as a subprocess, interpreter start-up included;
- ``in_process``: ``Job.ingest`` timed from opening the database (what the ingest itself costs).

Reported per source and variant: MB/s (of the JSON; gzip: of the decompressed JSON), events/s (every event of the
file, kept or not), the median over repetitions, and the peak RSS of all processes (the CLI run's). The headline is
the **minimum over sources** of the CLI figure, per variant; HolisticTraceAnalysis loads the Kineto-layout tile of
each source in the same run where a python with it is given (ratio = HTA seconds / CLI seconds). A machine-speed
probe (bench.py ``_speed_probe``) is taken before and after. Not part of the test run (test_bench_sources_smoke.py
tiles each source small and checks its rows; no timing is asserted anywhere).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tests.benchmarks.bench import ROOT, _speed_probe, find_hta_python, measure
from tests.benchmarks.tile import tile_counted

SHARED_TRACES = ROOT.parent / "shared" / "traces"
VARIANTS = ("kineto", "compact", "kineto_gz")
SIZES = {"smoke": 2, "medium": 100, "full": 400}


def is_kineto_json(path: Path) -> bool:
    """A Chrome-trace JSON with a traceEvents array (plain or gzip), judged from its first MB."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            head = f.read(1 << 20)
    except (OSError, EOFError):
        return False
    return head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{" and b'"traceEvents"' in head


def sources(root: Path = SHARED_TRACES) -> list[tuple[str, Path]]:
    """(name, file) of each Kineto trace under ``root``: one per directory, named after it."""
    out = []
    for d in sorted({p.parent for p in root.rglob("*.json*")}):
        files = sorted(p for p in d.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))
                       and is_kineto_json(p))
        if files:
            out.append((d.name, files[0]))
    return out


def prepare(name: str, src: Path, mb: float, workdir: Path, sample: int | None = None) -> dict[str, tuple[Path, int]]:
    """The three tiles of one source (of about ``sample`` of its events, where given): variant -> (file, events in it).
    Reused when they exist (their event counts are kept beside them)."""
    d = workdir / name / (f"{mb}mb" + (f"_sample{sample}" if sample else ""))
    d.mkdir(parents=True, exist_ok=True)
    meta = d / "events.json"
    files = {"kineto": d / "kineto" / "rank0.pt.trace.json", "compact": d / "compact" / "rank0.pt.trace.json",
             "kineto_gz": d / "kineto_gz" / "rank0.pt.trace.json.gz"}
    if meta.exists() and all(f.exists() for f in files.values()):
        events = json.loads(meta.read_text())
        return {v: (files[v], events[v]) for v in VARIANTS}
    for f in files.values():
        f.parent.mkdir(exist_ok=True)
    events = {"kineto": tile_counted(src, files["kineto"], mb, "kineto", sample)[1],
              "compact": tile_counted(src, files["compact"], mb, "compact", sample)[1]}
    with open(files["kineto"], "rb") as s, gzip.open(files["kineto_gz"], "wb", compresslevel=6) as g:
        shutil.copyfileobj(s, g, 1 << 22)
    events["kineto_gz"] = events["kineto"]
    meta.write_text(json.dumps(events))
    return {v: (files[v], events[v]) for v in VARIANTS}


def _json_mb(path: Path, tiles: dict) -> float:
    """MB of JSON a file holds (a gzip tile: the plain Kineto tile it was compressed from)."""
    return (tiles["kineto"][0] if path.name.endswith(".gz") else path).stat().st_size / 1e6


def _measure_source(name: str, tiles: dict, workdir: Path, hta_python: str | None, reps: int) -> list[dict]:
    """One row per variant of one source's tiles: the medians of ``reps`` interleaved repetitions."""
    times: dict[tuple[str, str], list[float]] = {}
    rss: dict[str, float] = {}  # summed over the command's processes
    rss_one: dict[str, float] = {}  # its largest process
    rows: dict[str, dict] = {}
    for _ in range(reps):  # interleaved: each repetition runs every variant and mode once
        for variant, (path, _) in tiles.items():
            for mode in ("in_process", "cli"):
                db = workdir / f"{name}_{variant}_{mode}.duckdb"
                db.unlink(missing_ok=True)
                if mode == "cli":
                    r = measure("cli_ingest", path=str(path), db=str(db))
                    rss[variant] = max(rss.get(variant, 0.0), r["peak_rss_all_mb"])
                    rss_one[variant] = max(rss_one.get(variant, 0.0), r["peak_rss_mb"])
                else:
                    r = measure("ingest", db=str(db), paths=[str(path)], jobs=1)
                    rows[variant] = r["rows"]
                times.setdefault((variant, mode), []).append(r["seconds"])
                db.unlink(missing_ok=True)
    hta_s = None
    if hta_python:
        hta_s = measure("hta", python=hta_python, trace_dir=str(tiles["kineto"][0].parent))["seconds"]
    out = []
    for variant, (path, events) in tiles.items():
        size = _json_mb(path, tiles)
        cli_s = statistics.median(times[(variant, "cli")])
        in_s = statistics.median(times[(variant, "in_process")])
        row = {"source": name, "variant": variant, "json_mb": round(size, 1), "events": events,
               "cli_seconds": round(cli_s, 3), "cli_mb_per_s": round(size / cli_s, 1),
               "cli_events_per_s": round(events / cli_s), "in_process_seconds": round(in_s, 3),
               "in_process_mb_per_s": round(size / in_s, 1), "in_process_events_per_s": round(events / in_s),
               "peak_rss_all_mb": rss[variant], "peak_rss_mb": rss_one[variant], "rows": rows[variant]}
        if variant == "kineto" and hta_s is not None:
            row["hta_seconds"] = round(hta_s, 3)
            row["hta_ratio"] = round(hta_s / cli_s, 1)
        out.append(row)
    return out


def headline(rows: list[dict]) -> dict:
    """Per variant, the minimum over sources of the whole command's MB/s (and which source), the minimum events/s
    and the largest peak RSS; the smallest gzip / plain ratio of one source."""
    out: dict = {}
    for variant in VARIANTS:
        vrows = [r for r in rows if r["variant"] == variant]
        if vrows:
            slow = min(vrows, key=lambda r: r["cli_mb_per_s"])
            out[variant] = {"min_cli_mb_per_s": slow["cli_mb_per_s"], "source": slow["source"],
                            "min_cli_events_per_s": min(r["cli_events_per_s"] for r in vrows),
                            "max_peak_rss_all_mb": max(r["peak_rss_all_mb"] for r in vrows),
                            "max_peak_rss_mb": max(r["peak_rss_mb"] for r in vrows)}
            ratios = [r["hta_ratio"] for r in vrows if "hta_ratio" in r]
            if ratios:
                out[variant]["min_hta_ratio"] = min(ratios)
    plain = {r["source"]: r["cli_mb_per_s"] for r in rows if r["variant"] == "kineto"}
    gz = {r["source"]: r["cli_mb_per_s"] for r in rows if r["variant"] == "kineto_gz"}
    if plain and gz:
        out["gzip_vs_plain_min"] = round(min(gz[s] / plain[s] for s in gz if s in plain), 2)
    return out


def run(mb: float, workdir: Path, hta_python: str | None = None, names: list[str] | None = None,
        reps: int = 1, print_=print) -> dict:
    results: dict = {"mb": mb, "reps": reps, "machine": {"cores": os.cpu_count(), "speed_probe_s": [_speed_probe()]},
                     "rows": []}
    measure("catalog_template")  # built once per machine and catalog, outside the timed ingests
    for name, src in sources():
        if names and name not in names:
            continue
        for row in _measure_source(name, prepare(name, src, mb, workdir), workdir, hta_python, reps):
            results["rows"].append(row)
            print_(f"  {name:28} {row['variant']:10} {row['cli_mb_per_s']:7.1f} MB/s {row['cli_events_per_s']:>10,} "
                   f"ev/s (in-process {row['in_process_mb_per_s']:.1f} MB/s) RSS {row['peak_rss_all_mb']:.0f} MB "
                   f"(largest process {row['peak_rss_mb']:.0f} MB)"
                   + (f" HTA {row['hta_ratio']}x" if "hta_ratio" in row else ""))
    results["headline"] = headline(results["rows"])
    results["machine"]["speed_probe_s"].append(_speed_probe())
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=SIZES, help="tile size by name: smoke 2 MB, medium 100 MB, full 400 MB")
    ap.add_argument("--mb", type=float, help="tile size in MB (default 400)")
    ap.add_argument("--reps", type=int, default=1, help="repetitions, interleaved; the median is reported")
    ap.add_argument("--sources", help="comma-separated source names (directories of ../shared/traces)")
    ap.add_argument("--workdir", help="where tiles are written and reused (default: a temporary directory)")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "sources.json"))
    ap.add_argument("--hta-python", help="python of a venv with HolisticTraceAnalysis")
    ap.add_argument("--no-hta", action="store_true")
    a = ap.parse_args()
    mb = a.mb if a.mb is not None else SIZES[a.size or "full"]
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="nsys2comm-sources-"))
    work.mkdir(parents=True, exist_ok=True)
    hta_py = None if a.no_hta else find_hta_python(a.hta_python)
    names = [s.strip() for s in a.sources.split(",")] if a.sources else None
    print(f"Kineto ingest per source: {mb} MB tiles, {a.reps} rep(s), workdir={work}, "
          f"HTA={'yes' if hta_py else 'not installed'}", flush=True)
    t = time.perf_counter()
    try:
        res = run(mb, work, hta_py, names, a.reps, print_=lambda s: print(s, flush=True))
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    res["total_seconds"] = round(time.perf_counter() - t, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    for variant, h in res["headline"].items():
        print(f"headline {variant}: {h}")
    print(f"machine speed probe (before, after): {res['machine']['speed_probe_s']} s\nwrote {a.out}")


if __name__ == "__main__":
    main()
