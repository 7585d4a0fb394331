"""Ingest stores the shared sweeps; later sessions use them only while they match the ingested files."""

from __future__ import annotations

from pathlib import Path

from fixtures.kineto_writer import write_kineto
from fixtures.synthetic import make_run
from nsys2comm import analysis, db
from nsys2comm.ingest import ingest


def _frames(con):
    return {n: analysis.run_query(con, n).sort(analysis.run_query(con, n).columns)
            for n in ("overlap_by_rank", "time_breakdown_by_rank", "comm_kernels")}


def test_cache_matches_live_and_follows_ingests(tmp_path: Path):
    files = write_kineto(make_run(world_size=4, steps=2), tmp_path / "t", style="new")
    path = tmp_path / "job.duckdb"
    con = db.connect(path, write=True)
    ingest(con, files[:2], jobs=1)
    con.close()

    ro = db.connect(path)
    cached = _frames(ro)
    assert ro.execute("SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = '_gpu_timeline' "
                      "AND sql LIKE '%_cache_gpu_timeline%'").fetchall()[0][0] == 1
    analysis.unmaterialize(ro)  # drops snapshots, falls back to the stored cache
    ro.execute("DROP VIEW temp._gpu_timeline")
    ro.execute("DROP VIEW temp._comm_kernel_overlap")
    for obj in ("_gpu_timeline", "_comm_kernel_overlap"):  # recreate the live helpers
        from nsys2comm import catalog

        ro.execute(catalog.find(obj).sql.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1))
    live = _frames(ro)
    for name in cached:
        assert cached[name].equals(live[name]), name
    ro.close()

    # a later ingest refreshes the cache; a stale cache is never used
    con = db.connect(path, write=True)
    ingest(con, files[2:], jobs=1)
    ranks = analysis.run_query(con, "overlap_by_rank")["rank"].to_list()
    assert ranks == [0, 1, 2, 3]
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source) VALUES (99, 'x', 'y', 0, 'kineto')")
    assert analysis.use_cache(con) is False  # files changed behind its back: the live views stay
    con.close()
