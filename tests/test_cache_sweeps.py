"""The shared sweeps are declared where they are defined (``-- @sweep per_rank|cross_rank [order=...]`` on the helper
view in queries/): cache stores and snapshots every tagged view under a regular name, distributed runs the per-rank
ones per rank, and no list elsewhere can drift from the tags."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nsys2comm import catalog
from nsys2comm.storage import dask_stage as distributed
from nsys2comm.storage import db
from nsys2comm.storage import sweeps as cache

PKG = Path(catalog.__file__).resolve().parent


def _tagged(kind: str | None = None) -> tuple[str, ...]:
    return tuple(o.name for o in catalog.load_catalog() if o.sweep is not None and kind in (None, o.sweep))


# tier 1: catalog facts
def test_the_sweep_lists_are_the_tags():
    tagged = _tagged()
    # the sweeps the cache was built around stay tagged (a dropped tag would silently compute them live)
    assert {"_overlap_gpu_timeline", "_overlap_comm_kernels", "_skew_ops", "_exposure_kernel_evidence"} <= set(tagged)
    for name in tagged:
        obj = catalog.find(name)
        assert obj is not None and obj.kind == "view" and not obj.public, name
    assert tagged == cache.SWEEPS
    assert distributed.PER_RANK == cache.PER_RANK_SWEEPS == _tagged("per_rank")
    assert _tagged("cross_rank") == distributed.CROSS_RANK
    assert set(distributed.PER_RANK) | set(distributed.CROSS_RANK) == set(tagged)
    assert {o.name: ", ".join(o.sweep_order) for o in catalog.sweeps() if o.sweep_order} == cache._STORED_ORDER
    assert cache._STORED_ORDER["_overlap_comm_kernels"] == "rank, start_ns, kernel_id"
    assert ["_cache_key"] + [f"_cache{v}" for v in tagged] == cache._CACHE_TABLES
    assert {cache.snapshot_table(v) for v in tagged} == {f"{v}_snapshot" for v in tagged}


# tier 1: catalog facts
def test_a_sweep_comes_after_the_sweeps_it_reads():
    """SWEEPS is in catalog order, which materialize and distributed's cross-rank stage rely on."""
    deps = cache.sweep_dependencies()
    order = {v: i for i, v in enumerate(cache.SWEEPS)}
    for view, reads in deps.items():
        assert all(order[r] < order[view] for r in reads), (view, reads)


# tier 1: catalog parser
@pytest.mark.parametrize("lines, error", [
    (["-- @view _v", "-- @sweep per_rank order=rank,start_ns", "-- A view.", "CREATE VIEW _v AS SELECT 1;"], None),
    (["-- @macro _m", "-- @sweep per_rank", "-- A macro.", "CREATE MACRO _m() AS 1;"], "on a view only"),
    (["-- @view _v", "-- @sweep sometimes", "-- A view.", "CREATE VIEW _v AS SELECT 1;"], "on a view only"),
    (["-- @view _v", "-- @sweep cross_rank", "-- @sweep per_rank", "CREATE VIEW _v AS SELECT 1;"], "one '-- @sweep"),
])
def test_the_sweep_tag_is_parsed_or_refused(tmp_path, lines, error):
    path = tmp_path / "x.sql"
    path.write_text("\n".join(lines) + "\n")
    if error:
        with pytest.raises(ValueError, match=error):
            catalog.parse_file(path, "x")
        return
    (obj,) = catalog.parse_file(path, "x")[1]
    assert (obj.sweep, obj.sweep_order, obj.description) == ("per_rank", ("rank", "start_ns"), "A view.")


# tier 1: layering
def test_distributed_reads_no_private_name_of_cache():
    tree = ast.parse((PKG / "storage" / "dask_stage.py").read_text())
    private = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == "cache" and n.attr.startswith("_")]
    assert private == []


# tier 2: SQL on an empty job
def test_every_sweep_is_stored_and_snapshotted(tmp_path):
    con = db.connect(tmp_path / "job.duckdb", write=True)
    try:
        assert cache.refresh_cache(con)
        stored = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary "
                                            "AND table_name LIKE '\\_cache\\_%' ESCAPE '\\'").fetchall()}
        assert stored == {f"_cache{v}" for v in cache.SWEEPS} | {"_cache_key", cache.PARTS_TABLE}
        cache.materialize(con)
        snaps = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
        assert {cache.snapshot_table(v) for v in cache.SWEEPS} <= snaps
        views = dict(con.execute("SELECT view_name, sql FROM duckdb_views() WHERE temporary").fetchall())
        assert all(cache.snapshot_table(v) in views[v] for v in cache.SWEEPS)
        cache.unmaterialize(con)
        assert not {cache.snapshot_table(v) for v in cache.SWEEPS} & {
            r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    finally:
        con.close()


# tier 2: SQL on an empty rank
def test_a_rank_task_computes_every_per_rank_sweep():
    assert set(distributed.rank_task({})) == set(_tagged("per_rank"))
