"""Expected against measured communication volume (issue 14, part 2): the formulas of queries/model/formulas.sql
against the worked examples of ../shared/reference/comm-models.md, volume_check on synthetic jobs whose measured
volume equals the analytical one (and on perturbed ones), the --model / --layout inputs, the summary keys and the
report section."""

from __future__ import annotations

import json

import polars as pl
import pytest
import test_catalog_lint as lint
from synth_db import catalog_db, save
from typer.testing import CliRunner

from fixtures.synthetic_layouts import Layout, Model, build, expected_bytes
from nsys2comm import UsageError, catalog
from nsys2comm.analysis import run_query
from nsys2comm.cli import app
from nsys2comm.model import clear_session, parse_layout, parse_model, set_session, volume_params
from nsys2comm.summary import build_summary, format_summary

MODEL = Model()  # L=4, h=256, s=128, b=2, V=1024, bf16: P = 3,678,720 (divisible by every t·p used here)
MODEL_OBJECTS = [o for o in catalog.load_catalog() if o.area == "model"]

# docs/comm-models.md worked example: GPT-NeoX 1.3B ("1-3B" config)
L, H, S, B, V = 24, 2048, 2048, 4, 50304
P_13B = 1_414_402_048



def q(con, expr: str):
    return con.execute(f"SELECT {expr}").fetchone()[0]


# ---------------------------------------------------------------------------------------------------------------
# Formulas against comm-models.md


def test_param_count_worked_example(con):
    """§2.3: P (cookbook calc_transformer_params: 2Vh + 4Lh² + 8Lh² + 8Lh + 2h) = 1,414,402,048."""
    assert q(con, f"_model_param_count({L}, {H}, NULL, 16, NULL, {V}, false, false)") == P_13B
    # ffn = 4h is the cookbook's MLP; grouped-query attention with kv_heads = heads changes nothing
    assert q(con, f"_model_param_count({L}, {H}, {4 * H}, 16, 16, {V}, NULL, NULL)") == P_13B
    assert MODEL.params == q(con, f"_model_param_count({MODEL.layers}, {MODEL.hidden}, NULL, NULL, NULL, "
                                  f"{MODEL.vocab}, false, false)")


def test_ddp_and_zero12_worked_example(con):
    """§2.3: DDP/ZeRO-1/2, d=8: 2·(7/8)·P·2 B = 4.950 GB per rank per iteration (§2.2 dp_like_bytes_per_rank)."""
    ddp = q(con, f"_model_wire_bytes('all_reduce', _model_dp_bytes('all_reduce', 0, {P_13B}, 2, 2, 1, false), 8)")
    zero1 = q(con, f"_model_wire_bytes('reduce_scatter', _model_dp_bytes('reduce_scatter', 1, {P_13B}, 2, 2, 1, false),"
                   f" 8) + _model_wire_bytes('all_gather', _model_dp_bytes('all_gather', 1, {P_13B}, 2, 2, 1, false),"
                   " 8)")
    assert ddp == pytest.approx(2 * 7 / 8 * P_13B * 2) and round(ddp / 1e9, 3) == 4.950
    assert zero1 == pytest.approx(ddp)
    assert q(con, f"_model_dp_bytes('all_reduce', 1, {P_13B}, 2, 2, 1, false)") is None  # ZeRO-1 uses no all_reduce


def test_zero3_worked_example(con):
    """§2.3: ZeRO-3, d=8: 3·(7/8)·P·2 B = 7.426 GB per rank; §2.2/§2.4: ZeRO-3 ≈ 1.5× DP/ZeRO-1/2 (the extra
    all_gather); comm-models.md §2.2 caveat: recomputation adds another parameter all_gather pass."""
    z3 = q(con, f"_model_wire_bytes('all_gather', _model_dp_bytes('all_gather', 3, {P_13B}, 2, 2, 1, false), 8) "
                f"+ _model_wire_bytes('reduce_scatter', _model_dp_bytes('reduce_scatter', 3, {P_13B}, 2, 2, 1, false),"
                " 8)")
    assert round(z3 / 1e9, 3) == 7.426
    assert z3 / (2 * 7 / 8 * P_13B * 2) == pytest.approx(1.5)
    assert q(con, f"_model_dp_bytes('all_gather', 3, {P_13B}, 2, 2, 1, true)") == 3 * P_13B * 2
    assert q(con, f"_model_dp_bytes('all_gather', 3, {P_13B}, 2, 2, 4, false)") == 4 * 2 * P_13B * 2  # per micro-batch
    assert q(con, f"_model_dp_bytes('reduce_scatter', 3, {P_13B}, 2, 4, 1, false)") == P_13B * 4  # fp32 reduction


def test_tp_worked_example(con):
    """§2.3: TP all-reduce msg b·s·h·2 = 33,554,432 B (32 MiB); 4L = 96 per micro-batch, 144 with recompute; TP
    wire per rank, t=2, 96 ARs: 96·2·(1/2)·32 MiB = 3.221 GB; vocab-parallel CE all-reduces 3 × (b·s·4 B) =
    3 × 32,768 B per micro-batch."""
    msg = q(con, f"_model_tp_msg_bytes({B}, {S}, {H}, 2)")
    assert msg == 33_554_432
    assert q(con, f"_model_tp_layer_collectives({L}, false)") == 96
    assert q(con, f"_model_tp_layer_collectives({L}, true)") == 144
    assert round(q(con, f"96 * _model_wire_bytes('all_reduce', {msg}, 2)") / 1e9, 3) == 3.221
    # with sequence parallelism the only all_reduces left are the 3 cross-entropy ones
    assert q(con, f"_model_tp_bytes('all_reduce', true, {L}, {msg}, {B}, {S}, 1, 1, false)") == 3 * 32_768
    # one micro-batch, one stage: the layers' 96 + embedding forward + output layer backward, plus CE
    assert q(con, f"_model_tp_bytes('all_reduce', false, {L}, {msg}, {B}, {S}, 1, 1, false)") == 98 * msg + 3 * 32_768
    # sequence parallel: each all_reduce becomes all_gather + reduce_scatter of the same S (§2.2), same wire bytes
    ag = q(con, f"_model_tp_bytes('all_gather', true, {L}, {msg}, {B}, {S}, 1, 1, false)")
    rs = q(con, f"_model_tp_bytes('reduce_scatter', true, {L}, {msg}, {B}, {S}, 1, 1, false)")
    assert (ag, rs) == (97 * msg, 98 * msg)
    layers_wire_ar = q(con, f"96 * _model_wire_bytes('all_reduce', {msg}, 8)")
    layers_wire_sp = q(con, f"96 * (_model_wire_bytes('all_gather', {msg}, 8) + _model_wire_bytes('reduce_scatter', "
                            f"{msg}, 8))")
    assert layers_wire_sp == pytest.approx(layers_wire_ar)
    # a rank on one of p stages holds L/p layers: the per-rank mean is 1/p of the model's
    assert q(con, f"_model_tp_bytes('all_reduce', false, {L}, {msg}, {B}, {S}, 4, 8, false)") == pytest.approx(
        8 / 4 * (98 * msg + 3 * 32_768))


def test_pp_worked_example(con):
    """§2.3: PP p2p msg 32 MiB (16 MiB with scatter-gather at t=2); §2.2: per stage boundary one activation send
    forward and one gradient send backward per micro-batch (2·microbatches per boundary)."""
    assert q(con, f"_model_pp_msg_bytes({B}, {S}, {H}, 2, 2, false)") == 32 * 2**20
    assert q(con, f"_model_pp_msg_bytes({B}, {S}, {H}, 2, 2, true)") == 16 * 2**20
    # p = 4 stages, 8 micro-batches: 3 boundaries × 2 × 8 sends, spread over 4 ranks of a pipeline
    per_rank = q(con, f"_model_pp_bytes('send', 4, 8, {16 * 2**20})")
    assert per_rank == pytest.approx(3 * 2 * 8 * 16 * 2**20 / 4)
    assert q(con, f"_model_pp_bytes('recv', 4, 8, {16 * 2**20})") == per_rank
    assert q(con, f"_model_pp_bytes('all_reduce', 4, 8, {16 * 2**20})") is None


def test_wire_bytes_per_rank_factors(con):
    """§2.2 wire_bytes_per_rank: all_reduce 2(n−1)/n·m, all_gather / reduce_scatter / all_to_all (n−1)/n·m,
    broadcast / reduce / send / recv m; 2m and m as n grows (the paper's Allreduce_volume = 2m, Allgather = m)."""
    m = 1_000_000
    assert q(con, f"_model_wire_bytes('all_reduce', {m}, 4)") == pytest.approx(1.5 * m)
    assert q(con, f"_model_wire_bytes('all_gather', {m}, 4)") == pytest.approx(0.75 * m)
    assert q(con, f"_model_wire_bytes('send', {m}, 2)") == m
    assert q(con, f"_model_wire_bytes('all_reduce', {m}, 1024)") == pytest.approx(2 * m, rel=1e-2)


# ---------------------------------------------------------------------------------------------------------------
# volume_check on synthetic layouts: measured = predicted, verdict 'match'

LAYOUTS = {
    "dp": Layout(dp=8, naming="torch"),
    "tp_dp": Layout(tp=2, dp=4),
    "tp_pp_dp": Layout(tp=2, pp=2, dp=2, micro_batches=4),
    "zero3": Layout(dp=8, zero=3, naming="torch"),
    "zero3_tp": Layout(tp=2, dp=4, zero=3, naming="torchtitan"),
    "tp_pp_dp_sp_zero1": Layout(tp=2, pp=2, dp=2, zero=1, sequence_parallel=True, micro_batches=2, naming="none"),
}
EXPECTED_ROWS = {
    "dp": {("dp", "all_reduce")},
    "tp_dp": {("tp", "all_reduce"), ("dp", "all_reduce")},
    "tp_pp_dp": {("tp", "all_reduce"), ("dp", "all_reduce"), ("pp", "send"), ("pp", "recv")},
    "zero3": {("dp", "all_gather"), ("dp", "reduce_scatter")},
    "zero3_tp": {("tp", "all_reduce"), ("dp", "all_gather"), ("dp", "reduce_scatter")},
    "tp_pp_dp_sp_zero1": {("tp", "all_gather"), ("tp", "reduce_scatter"), ("tp", "all_reduce"), ("dp", "all_gather"),
                          ("dp", "reduce_scatter"), ("pp", "send"), ("pp", "recv")},
}


def _params(lay: Layout, **extra) -> dict:
    return MODEL.macro_params() | {"micro_batches": lay.micro_batches, "sequence_parallel": lay.sequence_parallel,
                                   "zero": lay.zero} | extra


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_synthetic_layouts_match(name):
    lay = LAYOUTS[name]
    con = build(MODEL, lay, steps=2)
    df = run_query(con, "volume_check", _params(lay))
    assert set(df["step_ord"]) == {1, 2}
    for step in (1, 2):
        rows = df.filter(pl.col("step_ord") == step)
        assert {(r["kind"], r["collective"]) for r in rows.iter_rows(named=True)} == EXPECTED_ROWS[name]
        for r in rows.iter_rows(named=True):
            kind = "world" if name in ("dp", "zero3") else r["kind"]  # plain DP runs on the default group
            assert r["measured_bytes"] == pytest.approx(expected_bytes(MODEL, lay, kind, r["collective"])), r
            assert r["predicted_bytes"] == pytest.approx(r["measured_bytes"]), r
            assert r["verdict"] == "match" and r["ratio"] == pytest.approx(1.0), r
            assert "1.00× expected" in r["reason"] and r["formula"], r
            assert r["unsized_ops"] == 0 and r["ranks"] == lay.world


def test_the_zero_stage_is_inferred_from_the_traffic_and_said():
    lay = LAYOUTS["zero3"]
    df = run_query(build(MODEL, lay), "volume_check", MODEL.macro_params())
    assert set(df["scheme"]) == {"ZeRO-3"} and set(df["verdict"]) == {"match"}
    assert all("ZeRO stage 3 inferred from the DP traffic" in r for r in df["reason"])
    df = run_query(build(MODEL, LAYOUTS["dp"]), "volume_check", MODEL.macro_params() | {"zero": 0})
    assert not any("inferred" in r for r in df["reason"])


def test_wire_columns_apply_the_bus_factor():
    lay = LAYOUTS["tp_dp"]
    df = run_query(build(MODEL, lay, steps=1), "volume_check", _params(lay))
    dp = df.filter(pl.col("kind") == "dp").row(0, named=True)
    assert dp["degree"] == 4 and dp["predicted_wire_bytes"] == pytest.approx(dp["predicted_bytes"] * 2 * 3 / 4)
    assert dp["measured_wire_bytes"] == pytest.approx(dp["measured_bytes"] * 1.5)


# ---------------------------------------------------------------------------------------------------------------
# Perturbed jobs: the verdict and its reason say what the trace holds


def test_zero3_gathering_twice_is_over_with_the_reason():
    lay = LAYOUTS["zero3"]
    con = build(MODEL, lay, perturb={"zero3_gathers": 2})
    df = run_query(con, "volume_check", _params(lay))
    ag = df.filter((pl.col("collective") == "all_gather") & (pl.col("step_ord") == 1)).row(0, named=True)
    assert ag["verdict"] == "over" and ag["ratio"] == pytest.approx(2.0)
    assert ag["measured_bytes"] == pytest.approx(expected_bytes(MODEL, lay, "world", "all_gather",
                                                                perturb={"zero3_gathers": 2}))
    assert ag["reason"].startswith("ZeRO-3 all_gather volume 2.00× expected")
    assert "parameters gathered twice per step as often as predicted" in ag["reason"]
    rs = df.filter((pl.col("collective") == "reduce_scatter") & (pl.col("step_ord") == 1)).row(0, named=True)
    assert rs["verdict"] == "match"


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_fp32_gradient_reduction_is_over_and_names_the_dtype():
    lay = LAYOUTS["tp_dp"]
    df = run_query(build(MODEL, lay, perturb={"grad_dtype": "fp32"}), "volume_check", _params(lay))
    dp = df.filter((pl.col("kind") == "dp") & (pl.col("step_ord") == 1)).row(0, named=True)
    assert dp["verdict"] == "over" and dp["ratio"] == pytest.approx(2.0)
    assert "the trace reduces in float32 (4 B per element), the model says bf16 (2 B)" in dp["reason"]
    df = run_query(build(MODEL, lay, perturb={"grad_dtype": "fp32"}), "volume_check", _params(lay, grad_dtype="fp32"))
    assert set(df["verdict"]) == {"match"}


def test_micro_batches_not_given_is_named_in_the_reason():
    lay = LAYOUTS["tp_pp_dp"]  # 4 micro-batches per step
    df = run_query(build(MODEL, lay, steps=1), "volume_check", MODEL.macro_params())
    tp = df.filter(pl.col("kind") == "tp").row(0, named=True)
    assert tp["verdict"] == "over" and tp["ratio"] == pytest.approx(4.0)
    assert "4 micro-batches per step? (micro_batches was not given: 1 assumed" in tp["reason"]
    dp = df.filter(pl.col("kind") == "dp").row(0, named=True)
    assert dp["verdict"] == "match"  # DDP reduces once per step whatever the micro-batches


def test_thresholds_are_parameters():
    lay = LAYOUTS["tp_dp"]
    con = build(MODEL, lay, steps=1)
    assert set(run_query(con, "volume_check", _params(lay, match_hi=0.9))["verdict"]) == {"over"}
    assert set(run_query(con, "volume_check", _params(lay, match_lo=1.1))["verdict"]) == {"under"}
    obj = catalog.find("volume_check")
    assert "match_lo := 0.8" in obj.sql and "match_hi := 1.25" in obj.sql


def test_no_model_is_not_evaluated_never_passed():
    lay = LAYOUTS["tp_dp"]
    df = run_query(build(MODEL, lay, steps=1), "volume_check")
    assert set(df["verdict"]) == {"not_evaluated"} and df["predicted_bytes"].null_count() == df.height
    tp = df.filter(pl.col("kind") == "tp").row(0, named=True)
    assert tp["reason"] == "TP all_reduce: not evaluated, unknown: layers, hidden, seq, micro_batch, dtype"
    assert tp["measured_bytes"] > 0  # what was measured is still shown
    partial = run_query(build(MODEL, lay, steps=1), "volume_check", {"layers": 4, "hidden": 256, "vocab": 1024})
    dp = partial.filter(pl.col("kind") == "dp").row(0, named=True)
    assert dp["verdict"] == "not_evaluated" and dp["reason"].endswith("unknown: dtype [ZeRO stage 0 inferred from the "
                                                                      "DP traffic; give --layout zero=N to set it]")


def test_unknown_sizes_never_pass():
    lay = LAYOUTS["tp_dp"]
    df = run_query(build(MODEL, lay, steps=1, perturb={"drop_sizes": 3}), "volume_check", _params(lay))
    tp = df.filter(pl.col("kind") == "tp").row(0, named=True)
    assert tp["unsized_ops"] > 0 and tp["verdict"] == "not_evaluated"
    assert f"{tp['unsized_ops']} of {tp['ops']} ops have no size" in tp["reason"]
    assert "match" not in set(df["verdict"])


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_unexpected_traffic_and_unknown_kinds():
    lay = LAYOUTS["tp_dp"]
    con = build(MODEL, lay, steps=1)
    # a 4 MiB broadcast on every rank's DP group, which no DDP formula predicts
    first = "(SELECT min(kernel_id) FROM comm_ops WHERE pg_desc = 'DATA_PARALLEL_GROUP' GROUP BY rank)"
    con.execute(f"INSERT INTO kernels SELECT * REPLACE (kernel_id + 100000 AS kernel_id) FROM kernels "
                f"WHERE kernel_id IN {first}")
    con.execute(f"INSERT INTO comm_ops SELECT * REPLACE (kernel_id + 100000 AS kernel_id, 'broadcast' AS collective, "
                f"4 << 20 AS msg_bytes) FROM comm_ops WHERE kernel_id IN {first}")
    df = run_query(con, "volume_check", _params(lay))
    bc = df.filter(pl.col("collective") == "broadcast").row(0, named=True)
    assert bc["verdict"] == "unexpected" and bc["kind"] == "dp" and bc["predicted_bytes"] is None
    assert bc["reason"].startswith("unexpected broadcast on the dp group(s) (8 ops, 4 MiB per rank): DDP uses "
                                   "all_reduce")
    # without names and without --layout, the kind of pooled unnamed groups is unknown: not evaluated
    hidden = build(MODEL, Layout(tp=2, dp=4, naming="hidden"), steps=1)
    df = run_query(hidden, "volume_check", _params(lay))
    assert set(df["verdict"]) == {"not_evaluated"}
    assert any("on groups of unknown kind (see parallel_layout): give --layout" in r for r in df["reason"])
    df = run_query(hidden, "volume_check", _params(lay) | {"tp": 2, "dp": 4})
    assert set(df["verdict"]) == {"match"}


def test_a_trace_without_steps_is_one_step():
    lay = LAYOUTS["tp_dp"]
    df = run_query(build(MODEL, lay, steps=2, with_steps=False), "volume_check", _params(lay))
    assert set(df["step_ord"]) == {1} and df["step_no"].null_count() == df.height
    assert set(df["verdict"]) == {"over"} and set(df["ratio"].round(6)) == {2.0}  # two iterations in one window


def test_launch_calls_place_operations_in_steps():
    """An operation belongs to the step whose CPU range holds its launch, even when its kernel runs after it."""
    lay = LAYOUTS["tp_dp"]
    con = build(MODEL, lay, steps=2)
    # move step 1's kernels past its end, keeping their launch calls inside it
    con.execute("INSERT INTO api_calls SELECT kernel_id, 1, rank, 0, 0, start_ns - 500, start_ns - 400, "
                "'cudaLaunchKernel', correlation_id, 'runtime' FROM kernels")
    con.execute("UPDATE kernels SET start_ns = start_ns + 999000000, end_ns = end_ns + 999000000 "
                "WHERE start_ns < (SELECT min(start_ns) + 900000000 FROM kernels)")
    df = run_query(con, "volume_check", _params(lay))
    assert set(df["verdict"]) == {"match"} and set(df["step_ord"]) == {1, 2}


# ---------------------------------------------------------------------------------------------------------------
# Inputs: --model / --layout, session variables


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_session_variables_are_the_default_parameters():
    lay = LAYOUTS["tp_pp_dp"]
    con = build(MODEL, lay, steps=1)
    direct = run_query(con, "volume_check", _params(lay))
    set_session(con, _params(lay))
    try:
        assert run_query(con, "volume_check").equals(direct)
        assert con.sql("SELECT * FROM volume_check").pl().equals(direct)
    finally:
        clear_session(con)
    assert set(run_query(con, "volume_check")["verdict"]) == {"not_evaluated"}


def test_model_key_values_and_errors():
    assert parse_model("layers=24,hidden=2048,seq=2048,micro_batch=4,vocab=50304,dtype=bfloat16") == (
        {"layers": 24, "hidden": 2048, "seq": 2048, "micro_batch": 4, "vocab": 50304, "dtype": "bf16"}, {})
    assert parse_model("num_layers=2,params=1.4e9,tied=yes") == ({"layers": 2, "params": 1.4e9, "tied": True}, {})
    assert parse_layout("tp=8,pp=4,dp=16,zero=1,sp=true,mb=8") == {
        "tp": 8, "pp": 4, "dp": 16, "zero": 1, "sequence_parallel": True, "micro_batches": 8}
    for model, layout, says in [
        ("layers=x", None, "--model layers='x': expected a whole number >= 1"),
        ("heads=8,colour=red", None, "--model: unknown key 'colour'"),
        ("dtype=int7", None, "expected a dtype"),
        ("nope/config.json", None, "no such file"),
        (None, "tp=0", "--layout tp='0': expected a whole number >= 1"),
        (None, "zero=4", "a ZeRO stage 0, 1, 2 or 3"),
        (None, "tp8", "'tp8' is not key=value"),
    ]:
        with pytest.raises(UsageError, match=None) as e:
            volume_params(model, layout)
        assert says in e.value.line() and "\n" not in e.value.line(), e.value.line()


def test_hugging_face_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                               "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
                               "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
                               "tie_word_embeddings": False, "hidden_act": "silu"}))
    model, layout = parse_model(f"{cfg},seq=2048,micro_batch=1")
    assert model == {"layers": 32, "hidden": 4096, "ffn": 11008, "heads": 32, "kv_heads": 32, "vocab": 32000,
                     "seq": 2048, "dtype": "bf16", "tied": False, "gated": True, "micro_batch": 1} and layout == {}
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    p = q(con, "_model_param_count(32, 4096, 11008, 32, 32, 32000, false, true)")
    assert p == pytest.approx(6.74e9, rel=0.01)  # Llama-2-7B: 6.74 B parameters
    gqa = q(con, "_model_param_count(32, 4096, 11008, 32, 8, 32000, false, true)")  # 8 key/value heads
    assert p - gqa == 32 * 2 * 4096 * (4096 - 1024)


def test_megatron_arguments_file(tmp_path):
    args = tmp_path / "pretrain_gpt.sh"
    args.write_text("# GPT 1.3B\n--num-layers 24 --hidden-size 2048 --num-attention-heads 16 \\\n"
                    "  --seq-length 2048 --micro-batch-size 4 --global-batch-size 64 --bf16 \\\n"
                    "  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --sequence-parallel \\\n"
                    "  --use-distributed-optimizer --recompute-granularity full --lr 1e-4\n")
    model, layout = parse_model(str(args))
    assert model == {"layers": 24, "hidden": 2048, "heads": 16, "seq": 2048, "micro_batch": 4, "dtype": "bf16",
                     "tied": True}
    assert layout == {"tp": 2, "pp": 1, "sequence_parallel": True, "zero": 1, "recompute": True,
                      "_global_batch_size": "64"}
    params = volume_params(f"{args},vocab=50304", "dp=4,tp=4")
    assert params["tp"] == 4 and params["micro_batches"] == 64 // (4 * 4) and params["vocab"] == 50304
    neox = tmp_path / "19M.yml"
    neox.write_text('{\n  "num_layers": 6,\n  "hidden_size": 512,\n  "num_attention_heads": 8,\n'
                    '  "seq_length": 2048,\n  "train_micro_batch_size_per_gpu": 4,\n  "precision": "bfloat16",\n'
                    '  "model_parallel_size": 1,\n  "zero_optimization": {"stage": 1}\n}\n')
    model, layout = parse_model(str(neox))
    assert model["layers"] == 6 and model["micro_batch"] == 4 and model["dtype"] == "bf16"
    assert layout == {"tp": 1, "zero": 1}


# ---------------------------------------------------------------------------------------------------------------
# Summary, CLI, report


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_summary_keys(tmp_path):
    lay = LAYOUTS["tp_dp"]
    con = build(MODEL, lay, steps=1)
    s = build_summary(con)
    assert s["volume_check"] is None
    assert any(m.startswith("volume_check: not available (no model given") for m in s["missing"])
    assert {d["kind"]: d["degree"] for d in s["parallel_layout"]} == {"tp": 2, "cp": 1, "ep": 1, "dp": 4, "pp": 1}
    text = format_summary(s)
    assert "parallel layout: tp 2 (named), dp 4 (named)" in text
    assert "volume check: not available (see missing: volume_check)" in text
    s = build_summary(con, volume=_params(lay))
    assert {r["verdict"] for r in s["volume_check"]} == {"match"}
    assert set(s["volume_check"][0]) == {"step_ord", "step_no", "kind", "collective", "scheme", "degree",
                                         "predicted_bytes", "measured_bytes", "ratio", "verdict", "reason"}
    assert "volume check (rows per step, kind and collective): 2 match, 0 over" in format_summary(s)
    assert not any(m.startswith("volume_check") for m in s["missing"])


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_cli_summary_and_query(tmp_path):
    db = tmp_path / "job.duckdb"
    lay = LAYOUTS["zero3"]
    save(build(MODEL, lay, perturb={"zero3_gathers": 2}), db)  # built in memory, written whole
    model = "layers=4,hidden=256,seq=128,micro_batch=2,vocab=1024,dtype=bf16"
    r = CliRunner().invoke(app, ["summary", str(db), "--json", "--model", model, "--layout", "zero=3"])
    assert r.exit_code == 0, r.output
    vol = json.loads(r.stdout)["volume_check"]
    assert {(v["collective"], v["verdict"]) for v in vol} == {("all_gather", "over"), ("reduce_scatter", "match")}
    r = CliRunner().invoke(app, ["query", str(db), "volume_check", "-p", "layers=4", "-p", "hidden=256", "-p",
                                 "vocab=1024", "-p", "dtype=bf16", "--format", "csv"])
    assert r.exit_code == 0 and "ZeRO-3 all_gather volume 2.00× expected" in r.stdout
    r = CliRunner().invoke(app, ["summary", str(db), "--model", "layers=four"])
    assert r.exit_code == 2 and "Error: --model layers='four': expected a whole number >= 1" in r.output


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_report_section(tmp_path):
    from nsys2comm import Job

    db = tmp_path / "job.duckdb"
    lay = LAYOUTS["tp_pp_dp"]
    save(build(MODEL, lay, steps=1), db)
    with Job.open(str(db)) as job:
        page = job.report(tmp_path / "plain.html").read_text(encoding="utf-8")
        assert 'id="sec-volume"' in page and "Parallel layout and expected volume" in page
        assert "no prediction: no model given" in page
        assert "TENSOR_MODEL_PARALLEL_GROUP" in page
        page = job.report(tmp_path / "model.html", model=MODEL.macro_params(),
                          layout={"micro_batches": 4}).read_text(encoding="utf-8")
        assert "no prediction" not in page and "PP send volume 1.00× expected" in page
        assert "matches the model" in page  # the finding
        # the session's inputs are gone after the report
        assert set(job.query("volume_check")["verdict"]) == {"not_evaluated"}
    sections = page.index('id="sec-volume"')
    assert sections > page.index('id="sec-kernels"')  # appended at the end


# ---------------------------------------------------------------------------------------------------------------
# issue 36, deliverable 3 (consumer side): an assumed group size is said beside the verdict


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_assumed_group_size_flows_into_the_verdict_reason_and_layout():
    """A capture of 4 ranks of an 8-rank ZeRO-1 job whose trace records no group: the importer assumes the world
    size (8) for every operation, so an all_gather's size S (input × group size) is twice the real one. The
    all_gather and the reduce_scatter of the same buffer must not get contradicting verdicts: both are 'assumed',
    with the assumption in the reason; the layout's confidence is 'assumed' too."""
    lay = Layout(dp=4, zero=1, naming="torch")
    perturb = {"assume_world": 8}
    con = build(MODEL, lay, steps=1, phases=True, perturb=perturb)
    df = run_query(con, "volume_check", _params(lay))
    rows = {r["collective"]: r for r in df.iter_rows(named=True)}
    assert set(rows) == {"all_gather", "reduce_scatter"}
    real_ag = expected_bytes(MODEL, lay, "world", "all_gather")  # the builder's op sizes on the real 4-rank group
    assert rows["all_gather"]["measured_bytes"] == pytest.approx(real_ag * 8 / 4)
    assert rows["all_gather"]["ratio"] == pytest.approx(2.0) and rows["reduce_scatter"]["ratio"] == pytest.approx(1.0)
    for r in rows.values():
        assert r["verdict"] == "assumed" and r["assumed_ops"] == r["ops"] == 4, r
        assert "not judged, group size assumed = world size (4 of 4 ops" in r["reason"], r
    # the same job with its groups recorded: both match
    plain = run_query(build(MODEL, lay, steps=1, phases=True), "volume_check", _params(lay))
    assert set(plain["verdict"]) == {"match"} and set(plain["assumed_ops"]) == {0}
    assert not any("assumed" in r for r in plain["reason"])
    # a collective whose size does not depend on the group keeps its verdict, the assumption beside it
    ddp = Layout(dp=4, naming="torch")
    df = run_query(build(MODEL, ddp, steps=1, phases=True, perturb=perturb), "volume_check", _params(ddp))
    ar = df.row(0, named=True)
    assert (ar["collective"], ar["verdict"]) == ("all_reduce", "match")
    assert ar["reason"].endswith(" [group size assumed = world size for 4 of 4 ops]")
    # the layout: kind from the phases, confidence 'assumed'; the ZeRO stage inferred from assumed sizes says so
    pl_ = run_query(con, "parallel_layout").row(0, named=True)
    assert (pl_["kind"], pl_["degree"], pl_["confidence"]) == ("dp", 8, "assumed")
    inferred = run_query(con, "volume_check", MODEL.macro_params())
    assert all("whose all_gather and reduce_scatter sizes rest on the assumed group size" in r
               for r in inferred["reason"])
    s = build_summary(con, volume=_params(lay))
    assert {(r["collective"], r["verdict"]) for r in s["volume_check"]} == {("all_gather", "assumed"),
                                                                            ("reduce_scatter", "assumed")}
    text = format_summary(s)
    assert "parallel layout: dp 8 (assumed)" in text and "2 assumed" in text


# ---------------------------------------------------------------------------------------------------------------
# The model area passes the catalog lint


@pytest.mark.parametrize("obj", MODEL_OBJECTS, ids=lambda o: o.name)
def test_model_objects_pass_the_catalog_lint(con, obj):
    lint.test_documented(obj)
    if obj.is_table_macro:
        lint.test_columns_match_and_units(con, obj)
        if obj.public:
            lint.test_order_by(obj)
    assert obj.public == (obj.name in ("parallel_layout", "parallel_degrees", "volume_check"))
