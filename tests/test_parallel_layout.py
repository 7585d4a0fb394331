"""The job's parallel layout inferred from its process groups (issue 14, part 1): parallel_layout and
parallel_degrees on synthetic jobs built by code (fixtures/synthetic_layouts.py) for DP, TP×DP, TP×PP×DP and
ZeRO-3, with named, unnamed and hidden groups, an explicit --layout, and the real 8-rank example."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest

from fixtures.synthetic_layouts import Layout, Model, build
from nsys2comm import Job, catalog
from nsys2comm.analysis import run_query

ROOT = Path(__file__).resolve().parents[1]
MODEL = Model()


@pytest.fixture(scope="module")
def catalog_con():
    con = duckdb.connect()
    catalog.install(con)
    return con


def layout(con, **params) -> pl.DataFrame:
    return run_query(con, "parallel_layout", params)


def degrees(con, **params) -> dict[str, tuple]:
    df = run_query(con, "parallel_degrees", params)
    return {r["kind"]: (r["degree"], r["confidence"], r["source"]) for r in df.iter_rows(named=True)}


def groups(df: pl.DataFrame, kind: str) -> list[list[int]]:
    return sorted(df.filter(pl.col("kind") == kind)["group_ranks"].to_list())


def test_dp_on_the_default_group_is_inferred():
    df = layout(build(MODEL, Layout(dp=8, naming="torch"), steps=1))
    assert df.height == 1
    r = df.row(0, named=True)
    assert (r["kind"], r["degree"], r["confidence"], r["source"], r["pg_desc"]) == (
        "dp", 8, "inferred", "structure", "default_pg")
    assert r["evidence"] == "spans all 8 ranks and is the only group with collective traffic: data parallel"
    assert r["collectives"] == "all_reduce ×8" and r["ops"] == 8


def test_tp_dp_megatron_names():
    con = build(MODEL, Layout(tp=2, dp=4), steps=1)
    df = layout(con)
    assert groups(df, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(df, "dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    named = df.filter(pl.col("kind").is_in(["tp", "dp"]))
    assert set(named["confidence"]) == {"named"} and set(named["source"]) == {"pg_desc"}
    assert "description TENSOR_MODEL_PARALLEL_GROUP names tp" in named["evidence"].to_list()
    world = df.filter(pl.col("kind") == "world").row(0, named=True)
    assert world["pg_desc"] == "default_pg" and world["ops"] == 0  # declared, no traffic
    assert degrees(con) == {"tp": (2, "named", "pg_desc"), "cp": (1, "inferred", "absence"),
                            "ep": (1, "inferred", "absence"), "dp": (4, "named", "pg_desc"),
                            "pp": (1, "inferred", "absence")}


def test_tp_pp_dp_megatron_names():
    con = build(MODEL, Layout(tp=2, pp=2, dp=2, micro_batches=2), steps=1)
    df = layout(con)
    assert groups(df, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(df, "dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups(df, "pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert set(df.filter(pl.col("kind") == "pp")["collectives"]) == {"recv ×4, send ×4"}
    assert {k: v[0] for k, v in degrees(con).items()} == {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2}


def test_zero3_names():
    con = build(MODEL, Layout(tp=2, dp=4, zero=3, naming="torchtitan"), steps=1)
    df = layout(con)
    dp = df.filter(pl.col("kind") == "dp")
    assert set(dp["pg_desc"]) == {"mesh_dp_shard"} and set(dp["confidence"]) == {"named"}
    assert set(dp["collectives"]) == {"all_gather ×40, reduce_scatter ×20"}  # 4 ranks × (2 × 5 units, 5)
    assert set(df.filter(pl.col("kind") == "tp")["pg_desc"]) == {"mesh_tp"}
    plain = layout(build(MODEL, Layout(dp=8, zero=3, naming="torch"), steps=1))
    assert plain["kind"].to_list() == ["dp"] and plain["confidence"].to_list() == ["inferred"]


def test_unnamed_groups_by_structure():
    """pg_desc 'undefined' (DeepSpeed-style new_group): consecutive ranks with all_reduce in their family are TP
    (the first stage's TP groups carry no all_reduce with sequence parallelism, their siblings do), strided ranks
    with collectives DP, send/recv-only groups PP."""
    con = build(MODEL, Layout(tp=2, pp=2, dp=2, zero=1, sequence_parallel=True, micro_batches=2, naming="none"),
                steps=1)
    df = layout(con)
    assert groups(df, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(df, "dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups(df, "pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    inferred = df.filter(pl.col("kind") != "world")
    assert set(inferred["confidence"]) == {"inferred"} and set(inferred["source"]) == {"structure"}
    first_stage_tp = df.filter(pl.col("group_ranks") == [0, 1]).row(0, named=True)
    assert "all_reduce" not in first_stage_tp["collectives"] and first_stage_tp["kind"] == "tp"


def test_layout_wins_where_the_trace_cannot_tell():
    # hidden: no group names, descriptions or member ranks, only sizes
    con = build(MODEL, Layout(tp=2, dp=4, naming="hidden"), steps=1)
    df = layout(con)
    assert set(df["kind"]) == {"unknown"}
    assert set(df["evidence"]) == {"neither its description nor its ranks and traffic tell: give --layout"}
    assert degrees(con)["tp"][0] is None and degrees(con)["dp"][0] is None
    df = layout(con, tp=2, dp=4)
    assert set(zip(df["kind"], df["degree"], df["confidence"], df["source"], strict=True)) == {
        ("tp", 2, "assumed", "layout"), ("dp", 4, "assumed", "layout")}
    assert "2 ranks, the tp degree of --layout (member ranks not recorded)" in df["evidence"].to_list()
    # unnamed groups with ranks: --layout matches them by their ranks and wins over the structure
    con = build(MODEL, Layout(tp=2, dp=4, naming="none"), steps=1)
    df = layout(con, tp=2, dp=4)
    assert groups(df, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]] and groups(df, "dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert set(df.filter(pl.col("kind") != "world")["source"]) == {"layout"}
    assert "its ranks are a tp group of --layout" in df["evidence"].to_list()


def test_named_groups_win_over_a_conflicting_layout():
    con = build(MODEL, Layout(tp=2, dp=4), steps=1)
    df = layout(con, tp=4, dp=2)
    assert groups(df, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]] and set(df["source"]) == {"pg_desc"}
    d = run_query(con, "parallel_degrees", {"tp": 4, "dp": 2})
    tp = d.filter(pl.col("kind") == "tp").row(0, named=True)
    assert tp["degree"] == 2 and "--layout says tp=4; the trace's groups win" in tp["evidence"]


def test_layout_only_dimensions_get_a_row():
    con = build(MODEL, Layout(dp=8, naming="torch"), steps=1)
    df = layout(con, pp=4)
    pp = df.filter(pl.col("kind") == "pp").row(0, named=True)
    assert (pp["degree"], pp["confidence"], pp["source"], pp["group_ranks"]) == (4, "assumed", "layout", None)
    assert pp["evidence"] == "--layout pp=4; no group of the trace shows it"


def test_pipelines_from_point_to_point_peers():
    """send/recv on the default group (global ranks, no PP group): stages k ranks apart give the pipelines."""
    con = build(MODEL, Layout(tp=2, pp=2, dp=2, micro_batches=2), steps=1, perturb={"p2p_on_default": True})
    df = layout(con)
    pp = df.filter(pl.col("kind") == "pp")
    assert pp["group_ranks"].to_list() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert set(pp["source"]) == {"p2p"} and set(pp["confidence"]) == {"inferred"}
    assert pp["evidence"][0].startswith("send/recv peers are most often 4 ranks apart (32 operations")
    assert degrees(con)["pp"] == (2, "inferred", "p2p")
    vol = run_query(con, "volume_check", MODEL.macro_params() | {"micro_batches": 2})
    assert set(vol.filter(pl.col("kind") == "pp")["verdict"]) == {"match"}


@pytest.mark.parametrize("desc,kind", [
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("DATA_PARALLEL_GROUP", "dp"), ("DATA_PARALLEL_GROUP_WITH_CP", "dp"),
    ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"), ("CONTEXT_PARALLEL_GROUP", "cp"), ("EXPERT_MODEL_PARALLEL_GROUP", "ep"),
    ("EXPERT_DATA_PARALLEL_GROUP", "ep"), ("MODEL_PARALLEL_GROUP", "composite"),
    ("TENSOR_AND_DATA_PARALLEL_GROUP", "composite"), ("EMBEDDING_GROUP", "composite"), ("mesh_tp", "tp"),
    ("mesh_dp_shard", "dp"), ("mesh_dp_replicate", "dp"), ("mesh_dp_shard_cp", "dp"), ("mesh_pp", "pp"),
    ("mesh_cp", "cp"), ("mesh_ep", "ep"), ("default_pg", "world"), ("undefined", None), ("140235", None),
    (None, None),
])
def test_descriptions(catalog_con, desc, kind):
    assert catalog_con.execute("SELECT _model_kind_from_desc(?)", [desc]).fetchone()[0] == kind


def test_the_real_example():
    """fixtures/example (8-rank DLRM, Kineto, no process group recorded): one group of all ranks, its size the
    assumed world size, carrying all_reduce and all_to_all: data parallel, inferred."""
    with Job.open(sorted((ROOT / "fixtures" / "example").glob("*.json.gz"))) as job:
        df = job.query("parallel_layout")
        vol = job.query("volume_check", params=621_313, dtype="fp32")
    r = df.row(0, named=True)
    assert df.height == 1 and (r["kind"], r["degree"], r["confidence"]) == ("dp", 8, "inferred")
    assert "group size assumed from the world size (no group recorded)" in r["evidence"]
    assert r["collectives"] == "all_to_all ×40, all_reduce ×24"
    # DDP all_reduce: 2,485,252 B per rank per step = 621,313 fp32 gradients
    ar = vol.filter(pl.col("collective") == "all_reduce").row(0, named=True)
    assert ar["measured_bytes"] == 2_485_252 and ar["verdict"] == "match"
    assert vol.filter(pl.col("collective") == "all_to_all")["verdict"].to_list() == ["unexpected"]
