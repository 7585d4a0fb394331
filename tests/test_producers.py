"""Producer → consumer links and serialised pairs (issue 16 part 3).

- Synthetic tensor-parallel layers (fixtures/synthetic_tp.py: GEMM → all_reduce, a side GEMM from another thread,
  collectives whose launch call is missing) written as Kineto JSON and as an nsys export, ingested through the real
  importers: every collective's link equals the producer the builder placed.
- The real example (fixtures/example, 8 ranks): every link is recomputed here from the raw JSON (gzip + json, not
  the importer) with the same rule, and a few are written out by hand.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_db

from fixtures import synthetic_tp as tpm
from nsys2comm import Job

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))


@pytest.fixture(scope="module")
def tp():
    return tpm.make_tp_run()


@pytest.fixture(scope="module", params=[("kineto", "new"), ("nsys", "3.25.0"), ("kineto", "old"), ("nsys", "2.9.1")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def tp_job(request, tp, tmp_path_factory):
    source, style = request.param
    d = tmp_path_factory.mktemp(f"tp-{source}-{style}")
    paths = (tpm.write_tp_kineto(tp, d, style=style) if source == "kineto"
             else [tpm.write_tp_nsys(tp, d / "run.sqlite", schema=style)])
    job = Job.ingest(paths, db=None, jobs=1)
    assert all(r.status == "ingested" for r in job.results), [r.message for r in job.results]
    yield job
    job.close()


def _expected(tp) -> dict:
    return {(lk.comm.rank, lk.comm.start_ns): (lk.collective, lk.gemm.start_ns if lk.gemm else None,
                                                lk.gemm.name if lk.gemm else None, lk.source) for lk in tp.links}


def test_tp_links_equal_the_known_producers(tp, tp_job):
    df = tp_job.sql("SELECT p.rank, p.comm_start_ns, p.collective, p.gemm_start_ns, g.name, p.link_source, p.gap_ns, "
                    "p.gemm_end_ns FROM producer_links() p LEFT JOIN kernels g ON g.kernel_id = p.gemm_kernel_id")
    got = {(r["rank"], r["comm_start_ns"]): (r["collective"], r["gemm_start_ns"], r["name"], r["link_source"])
           for r in df.to_dicts()}
    assert got == _expected(tp)
    assert {s for *_, s in got.values()} == {"same_thread_launch", "nearest_gemm_on_gpu", "none"}
    # gap = collective start − producer end
    for r in df.filter(df["gemm_start_ns"].is_not_null()).to_dicts():
        assert r["gap_ns"] == r["comm_start_ns"] - r["gemm_end_ns"]
    # send/recv are not collectives: left out
    assert not {(k.rank, k.start_ns) for k in tp.p2p} & set(got)


def test_tp_serialised_pairs_and_headroom(tp, tp_job):
    """Every all_reduce follows its producer GEMM by 5 µs and is fully exposed; the producer's shape group is
    measured (alone 100 µs, under the background all_gather 125 µs: 25 %), so the headroom of each pair is
    min(GEMM, all_reduce) − 25 % of it = 60 µs − 15 µs."""
    rows = tp_job.query("serialised_pairs").to_dicts()
    ars = {(lk.comm.rank, lk.comm.start_ns) for lk in tp.links if lk.collective == "all_reduce"}
    assert {(r["rank"], r["comm_start_ns"]) for r in rows} == ars
    for r in rows:
        assert r["collective"] == "all_reduce" and r["gap_ns"] == 5 * tpm.US
        assert r["comm_exposed_ns"] == r["comm_duration_ns"] == 60 * tpm.US
        assert r["overlap_bound_ns"] == 60 * tpm.US
        assert (r["slowdown_pct"], r["slowdown_source"]) == (tpm.SLOWDOWN_PCT, "shape_group")
        assert (r["contention_ns"], r["headroom_ns"]) == (15 * tpm.US, 45 * tpm.US)
    assert tp_job.query("serialised_pairs", back_to_back_ns=4 * tpm.US).height == 0
    g = tp_job.query("gemm_contention").to_dicts()[0]
    assert (g["grid_x"], g["block_x"], g["slowdown_pct"], g["alone_samples"], g["overlapped_samples"]) == (
        132, 256, tpm.SLOWDOWN_PCT, 16, 8)


def _tp_tables(tp):
    """The TP run as canonical tables written directly (synth_db, plus the grid and block sizes it leaves out),
    without the launch calls the run leaves out."""
    con = synth_db.build(tp.run)
    con.executemany("UPDATE kernels SET grid_x = ?, grid_y = ?, grid_z = ?, block_x = ?, block_y = ?, block_z = ? "
                    "WHERE rank = ? AND correlation_id = ?",
                    [(*k.grid, *k.block, k.rank, k.correlation) for k in tp.run.all_kernels()])
    for rank, corr in tp.unlaunched:
        con.execute("DELETE FROM api_calls WHERE rank = ? AND correlation_id = ?", [rank, corr])
    return con


def _pairs(con) -> list[dict]:
    return con.sql("SELECT * FROM serialised_pairs() ORDER BY rank, comm_start_ns").pl().to_dicts()


def test_slowdown_falls_back_to_the_job_then_to_null(tp):
    con = _tp_tables(tp)
    first = next(lk for lk in tp.links if lk.collective == "all_reduce" and lk.comm.rank == 0)
    # its producer alone in a shape group of its own: too few samples, the job's pooled slowdown stands in
    con.execute("UPDATE kernels SET grid_x = 99 WHERE rank = ? AND start_ns = ? AND kernel_class = 'gemm'",
                [first.gemm.rank, first.gemm.start_ns])
    by = {(r["rank"], r["comm_start_ns"]): r for r in _pairs(con)}
    row = by[(first.comm.rank, first.comm.start_ns)]
    assert (row["slowdown_source"], row["slowdown_pct"], row["headroom_ns"]) == ("job", 25.0, 45 * tpm.US)
    assert sum(r["slowdown_source"] == "shape_group" for r in by.values()) == len(by) - 1
    # no overlapped GEMM of that shape left: nothing is measured, the headroom is absent, not assumed
    con.execute("UPDATE kernels SET grid_x = 98 WHERE kernel_class = 'gemm' AND end_ns - start_ns = ?",
                [tpm.A_OVERLAPPED_US * tpm.US])
    rows = _pairs(con)
    assert rows and all(r["slowdown_pct"] is None and r["slowdown_source"] is None and r["contention_ns"] is None
                        and r["headroom_ns"] is None for r in rows)
    assert all(r["overlap_bound_ns"] == 60 * tpm.US for r in rows)


def test_unknown_launch_of_the_nearest_gemm_allows_the_gpu_fallback(tp):
    """Rank 0's first all_gather has no producer: its thread launched no GEMM before it and the nearest GEMM on the
    GPU (layer 0's B) is known to come from the main thread. Without B's launch call the trace can no longer tell,
    and B becomes its producer by 'nearest_gemm_on_gpu'."""
    ag = next(lk.comm for lk in tp.links if lk.collective == "all_gather" and lk.comm.rank == 0)
    rr = tp.run.ranks[0]
    b = max((k for k in rr.kernels if k.name in (tpm.GEMM_A, tpm.GEMM_D) and k.end_ns <= ag.start_ns),
            key=lambda k: k.end_ns)
    con = _tp_tables(tp)
    sql = ("SELECT g.correlation_id, p.link_source FROM producer_links() p JOIN kernels c ON c.kernel_id = "
           "p.comm_kernel_id LEFT JOIN kernels g ON g.kernel_id = p.gemm_kernel_id WHERE c.rank = 0 AND "
           "c.correlation_id = ?")
    assert con.execute(sql, [ag.correlation]).fetchall() == [(None, "none")]
    con.execute("DELETE FROM api_calls WHERE rank = 0 AND correlation_id = ?", [b.correlation])
    assert con.execute(sql, [ag.correlation]).fetchall() == [(b.correlation, "nearest_gemm_on_gpu")]


# ---------------------------------------------------------------------------------------------------------------
# the real example: links recomputed from the raw JSON


def _base_name(name: str) -> str:
    bare = name[5:] if name.startswith("void ") else name
    return re.split(r"[<(]", bare, maxsplit=1)[0].rsplit("::", 1)[-1].strip()


def _is_gemm(name: str) -> bool:
    """The GEMM words of kernel_class (rule 6) on the base name; the example has no convolution or attention."""
    return bool(re.search(r"gemm|gemv|splitkreduce|nvjet|cijk_|matmul", _base_name(name).lower().replace("fbgemm", "")))


def _raw_links(path: Path) -> tuple[int, dict, int]:
    """(rank, {comm correlation: (GEMM correlation or None, link_source)}, GEMM count) from one raw trace, by the
    rule of producer_links, in the file's own µs."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = doc["traceEvents"]
    launch: dict[int, dict] = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            c = e["args"]["correlation"]
            if c not in launch or e["ts"] < launch[c]["ts"]:
                launch[c] = e
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    gemms = [k for k in kernels if _is_gemm(k["name"])]
    out = {}
    for k in kernels:
        if not k["name"].startswith("nccl"):
            continue
        c = k["args"]["correlation"]
        lc = launch.get(c)
        same = [g for g in gemms if lc is not None and (gl := launch.get(g["args"]["correlation"])) is not None
                and (gl["pid"], gl["tid"]) == (lc["pid"], lc["tid"]) and gl["ts"] < lc["ts"]]
        if same:
            best = max(same, key=lambda g: (launch[g["args"]["correlation"]]["ts"], g["ts"]))
            out[c] = (best["args"]["correlation"], "same_thread_launch")
            continue
        before = [g for g in gemms if g["ts"] + g["dur"] <= k["ts"]]
        near = max(before, key=lambda g: (g["ts"] + g["dur"], g["ts"]), default=None)
        if near is not None and (lc is None or near["args"]["correlation"] not in launch):
            out[c] = (near["args"]["correlation"], "nearest_gemm_on_gpu")
        else:
            out[c] = (None, "none")
    return doc["distributedInfo"]["rank"], out, len(gemms)


@pytest.fixture(scope="module")
def example_job():
    job = Job.ingest(EXAMPLE, db=None, jobs=1)
    yield job
    job.close()


def _sql_links(job) -> dict:
    df = job.sql("SELECT p.rank, c.correlation_id AS comm_corr, g.correlation_id AS gemm_corr, p.link_source, "
                 "p.collective FROM producer_links() p JOIN kernels c ON c.kernel_id = p.comm_kernel_id "
                 "LEFT JOIN kernels g ON g.kernel_id = p.gemm_kernel_id")
    assert set(df["collective"]) <= {"all_reduce", "all_to_all"}  # no point-to-point in the example
    return {(r["rank"], r["comm_corr"]): (r["gemm_corr"], r["link_source"]) for r in df.to_dicts()}


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_example_links_match_the_raw_json(example_job):
    got = _sql_links(example_job)
    expected = {}
    for path in EXAMPLE:
        rank, links, n_gemm = _raw_links(path)
        assert n_gemm == example_job.sql(f"SELECT count(*) AS n FROM kernels WHERE rank = {rank} "
                                         "AND kernel_class = 'gemm'")["n"][0]
        expected.update({(rank, c): v for c, v in links.items()})
    assert len(expected) == 64
    assert got == expected


def test_example_links_by_hand(example_job):
    """Rank 0 (worker0), read off the JSON: the forward runs on thread 59811, the backward on 59976.
    - all_to_all kernel, correlation 41246, launched on 59811 at ...429782 µs: the last GEMM launched on 59811
      before it is gemmSN_TN_kernel (correlation 40931, launched at ...428630 µs);
    - all_to_all 41982 (59811, ...433676 µs): splitKreduce_kernel 41585 (the split-K reduction that ends a cuBLAS
      GEMM, launched at ...432357 µs); reduce_1Block_kernel 41613, launched later (...432449 µs), is not a GEMM
      (its base name has no GEMM word; only its template arguments mention cublasGemv);
    - all_reduce 42386, launched on 59976 at ...436294 µs: volta_sgemm_128x32_nt 42341 (launched ...436110 µs);
      the GEMMs of thread 59811 launched later in the forward do not count;
    - all_reduce 43640 (59976, ...439376 µs): volta_sgemm_128x32_nt 43595 (...439231 µs)."""
    got = _sql_links(example_job)
    assert got[(0, 41246)] == (40931, "same_thread_launch")
    assert got[(0, 41982)] == (41585, "same_thread_launch")
    assert got[(0, 42386)] == (42341, "same_thread_launch")
    assert got[(0, 43640)] == (43595, "same_thread_launch")
    names = dict(example_job.sql("SELECT correlation_id, short_name FROM kernels WHERE rank = 0 AND "
                                 "correlation_id IN (40931, 41585, 42341, 43595)").rows())
    assert names == {40931: "gemmSN_TN_kernel", 41585: "splitKreduce_kernel", 42341: "volta_sgemm_128x32_nt",
                     43595: "volta_sgemm_128x32_nt"}
