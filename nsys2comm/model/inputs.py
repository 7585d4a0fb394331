"""Parsing ``--model`` and ``--layout`` in one place, with one-line errors (:class:`~nsys2comm.errors.UsageError`).

``--model`` is ``key=value,...`` (keys in :data:`MODEL_KEYS`, e.g. ``layers=24,hidden=2048,seq=2048,
micro_batch=4,vocab=50304,dtype=bf16``), or a file, optionally followed by ``,key=value`` overrides:

- a Hugging Face ``config.json`` (``num_hidden_layers``, ``hidden_size``, ``intermediate_size``,
  ``num_attention_heads``, ``num_key_value_heads``, ``vocab_size``, ``tie_word_embeddings``, ``torch_dtype``; the
  sequence length is ``max_position_embeddings`` unless ``seq`` is given; a gated MLP for Llama-style models);
- a Megatron-LM arguments file: the command line flags (``--num-layers 24 --hidden-size 2048 ... --bf16``, as in
  a launch script; ``\\`` line continuations and ``#`` comments allowed), or ``key: value`` / ``"key": value``
  lines (GPT-NeoX / YAML-like configs). Besides the model it gives layout keys (tensor / pipeline / context /
  expert parallel sizes, ``--sequence-parallel``, ``--use-distributed-optimizer`` = ZeRO-1,
  ``--recompute-granularity full``), which ``--layout`` overrides.

``--layout`` is ``key=value,...`` with keys in :data:`LAYOUT_KEYS` (``tp=8,pp=4,dp=16,zero=1``).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError

# volume_check parameter -> what it is (the --model keys)
MODEL_KEYS = {
    "layers": "transformer layers", "hidden": "hidden size", "ffn": "MLP inner size (default 4×hidden)",
    "heads": "attention heads", "kv_heads": "key/value heads (grouped-query attention)",
    "seq": "sequence length", "micro_batch": "micro-batch size (samples per micro-batch per DP rank)",
    "vocab": "vocabulary size (padded)", "dtype": "parameter/activation dtype (bf16, fp16, fp32, fp8)",
    "grad_dtype": "dtype gradients are reduced in (default: dtype)", "params": "parameter count",
    "tied": "tied input/output embeddings (true/false)", "gated": "gated (SwiGLU) MLP (true/false)",
}
# volume_check / parallel_layout parameter -> what it is (the --layout keys)
LAYOUT_KEYS = {
    "tp": "tensor-parallel degree", "pp": "pipeline-parallel degree", "dp": "data-parallel degree",
    "cp": "context-parallel degree", "ep": "expert-parallel degree", "zero": "ZeRO stage 0-3 (0 = DDP)",
    "sequence_parallel": "Megatron sequence parallelism (true/false)",
    "micro_batches": "micro-batches per step (gradient accumulation / pipeline)",
    "recompute": "full activation recomputation (true/false)",
    "pp_split": "pipeline sends split across TP ranks (true/false; Megatron default true)",
}
_ALIASES = {  # spellings accepted in key=value text and config files -> parameter
    "num_layers": "layers", "n_layers": "layers", "num_hidden_layers": "layers", "n_layer": "layers",
    "hidden_size": "hidden", "d_model": "hidden", "n_embd": "hidden",
    "ffn_hidden_size": "ffn", "intermediate_size": "ffn", "d_ff": "ffn", "n_inner": "ffn",
    "num_attention_heads": "heads", "n_head": "heads", "n_heads": "heads",
    "num_key_value_heads": "kv_heads", "num_query_groups": "kv_heads", "n_kv_heads": "kv_heads",
    "seq_length": "seq", "seq_len": "seq", "sequence_length": "seq", "max_seq_len": "seq",
    "micro_batch_size": "micro_batch", "mbs": "micro_batch", "train_micro_batch_size_per_gpu": "micro_batch",
    "vocab_size": "vocab", "padded_vocab_size": "vocab", "torch_dtype": "dtype", "precision": "dtype",
    "tie_word_embeddings": "tied", "swiglu": "gated",
    "tensor_model_parallel_size": "tp", "model_parallel_size": "tp", "tensor_parallel": "tp",
    "pipeline_model_parallel_size": "pp", "pipe_parallel_size": "pp",
    "data_parallel_size": "dp", "context_parallel_size": "cp", "expert_model_parallel_size": "ep",
    "zero_stage": "zero", "sp": "sequence_parallel", "gradient_accumulation_steps": "micro_batches",
    "grad_accum": "micro_batches", "num_micro_batches": "micro_batches", "mb": "micro_batches",
}
_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
           "fp32": "fp32", "float32": "fp32", "float": "fp32", "fp8": "fp8", "float8": "fp8", "fp64": "fp64",
           "float64": "fp64"}
_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
_BOOL_KEYS = {"tied", "gated", "sequence_parallel", "recompute", "pp_split"}
_TEXT_KEYS = {"dtype", "grad_dtype"}
_FLOAT_KEYS = {"params"}
_GATED_MODELS = ("llama", "mistral", "mixtral", "qwen", "gemma", "phi3", "olmo", "deepseek", "yi", "internlm")
_EXAMPLE_MODEL = "layers=24,hidden=2048,seq=2048,micro_batch=4,vocab=50304,dtype=bf16"
_EXAMPLE_LAYOUT = "tp=8,pp=4,dp=16,zero=1"


def _canon_key(key: str) -> str:
    k = key.strip().lstrip("-").lower().replace("-", "_")
    return _ALIASES.get(k, k)


def _bad(opt: str, key: str, raw: Any, expected: str) -> UsageError:
    return UsageError(f"{opt} {key}={raw!r}: expected {expected}", hint=f"{key}: {_doc(key)}")


def _word(opt: str, key: str, raw: Any) -> Any:
    """A true/false or dtype value."""
    if key in _BOOL_KEYS:
        b = raw if isinstance(raw, bool) else _BOOLS.get(str(raw).strip().lower())
        if b is None:
            raise _bad(opt, key, raw, "true or false")
        return b
    d = _DTYPES.get(str(raw).strip().lower().removeprefix("torch."))
    if d is None:
        raise _bad(opt, key, raw, "a dtype: " + ", ".join(sorted(set(_DTYPES.values()))))
    return d


def _value(opt: str, key: str, raw: Any) -> Any:
    """A parameter value checked for its key, or a UsageError naming it."""
    def bad(expected: str) -> UsageError:
        return _bad(opt, key, raw, expected)

    if key in _BOOL_KEYS or key in _TEXT_KEYS:
        return _word(opt, key, raw)
    try:
        num = float(raw) if not isinstance(raw, bool) else None
    except (TypeError, ValueError):
        num = None
    if num is not None and not math.isfinite(num):
        num = None
    if key in _FLOAT_KEYS:
        if num is None or num <= 0:
            raise bad("a positive number (e.g. 1.4e9)")
        return num
    if key == "zero" and num not in (0, 1, 2, 3):
        raise bad("a ZeRO stage 0, 1, 2 or 3")
    if num is None or num != int(num) or num < (0 if key == "zero" else 1):
        raise bad("a whole number >= 1")
    return int(num)


def _doc(key: str) -> str:
    return MODEL_KEYS.get(key) or LAYOUT_KEYS.get(key) or "?"


def _pairs(opt: str, text: str) -> list[tuple[str, str]]:
    out = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise UsageError(f"{opt}: {item!r} is not key=value",
                             hint=f"e.g. {opt} {_EXAMPLE_MODEL if opt == '--model' else _EXAMPLE_LAYOUT}")
        k, v = item.split("=", 1)
        out.append((k, v.strip()))
    return out


def _checked(opt: str, items: list[tuple[str, Any]], allowed: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for raw_key, raw in items:
        if raw is None:
            continue  # not given
        key = _canon_key(raw_key)
        if key not in allowed:
            raise UsageError(f"{opt}: unknown key {raw_key!r}", hint="keys: " + ", ".join(allowed))
        out[key] = _value(opt, key, raw)
    return out


def parse_layout(spec: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``--layout tp=8,pp=4,dp=16,zero=1`` (or a dict of the same keys) to checked parameters."""
    if spec is None or spec == "":
        return {}
    items = list(spec.items()) if isinstance(spec, Mapping) else _pairs("--layout", str(spec))
    return _checked("--layout", items, LAYOUT_KEYS)


def parse_model(spec: str | Path | Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--model`` to (model parameters, layout parameters the file gives). ``spec`` is ``key=value,...``, a file
    path (Hugging Face config.json or Megatron arguments) optionally followed by ``,key=value`` overrides, or a
    dict of model keys."""
    if spec is None or spec == "":
        return {}, {}
    if isinstance(spec, Mapping):
        return _checked("--model", list(spec.items()), MODEL_KEYS), {}
    text = str(spec)
    head, _, rest = text.partition(",") if not isinstance(spec, Path) else (text, "", "")
    model: dict[str, Any] = {}
    layout: dict[str, Any] = {}
    if "=" not in head:
        path = Path(head).expanduser()
        if not path.is_file():
            raise UsageError(f"--model {head!r}: no such file",
                             hint=f"give key=value pairs (e.g. {_EXAMPLE_MODEL}), a Hugging Face config.json or "
                                  "a Megatron-LM arguments file")
        model, layout = _read_file(path)
        overrides = _pairs("--model", rest)
    else:
        overrides = _pairs("--model", text)
    model.update(_checked("--model", overrides, MODEL_KEYS))
    return model, layout


def _read_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--model {path}: cannot be read ({e})", hint="give a config.json or arguments file") \
            from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        items = _flatten(data)
        if "num_hidden_layers" in data or "model_type" in data:
            return _from_hf(path, data)
    else:
        items = _megatron_items(text)
    if not items:
        raise UsageError(f"--model {path}: no model settings found",
                         hint="expected a Hugging Face config.json, Megatron-LM flags (--num-layers 24 ...) or "
                              "key: value lines")
    return _from_items(path, items)


def _flatten(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in data.items():
        if isinstance(v, dict):
            out += _flatten(v, f"{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _from_hf(path: Path, cfg: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Hugging Face config.json: the fields that determine communication volume."""
    get = {"layers": "num_hidden_layers", "hidden": "hidden_size", "ffn": "intermediate_size",
           "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "vocab": "vocab_size",
           "seq": "max_position_embeddings", "dtype": "torch_dtype", "tied": "tie_word_embeddings"}
    alt = {"layers": ("n_layer", "num_layers"), "hidden": ("n_embd", "d_model"), "ffn": ("n_inner",),
           "heads": ("n_head",), "seq": ("n_positions", "max_sequence_length")}
    items = []
    for key, name in get.items():
        v = next((cfg[n] for n in (name, *alt.get(key, ())) if cfg.get(n) is not None), None)
        if key == "dtype" and str(v).lower().removeprefix("torch.") not in _DTYPES:
            continue  # 'auto' or absent: give dtype= after the path
        if v is not None:
            items.append((key, v))
    model_type = str(cfg.get("model_type", "")).lower()
    act = str(cfg.get("hidden_act", cfg.get("activation_function", ""))).lower()
    items.append(("gated", any(m in model_type for m in _GATED_MODELS) or act in ("silu", "swiglu", "swish")))
    if "tie_word_embeddings" not in cfg:
        items.append(("tied", False))
    try:
        return _checked("--model", items, MODEL_KEYS), {}
    except UsageError as e:
        e.path = str(path)
        raise


def _megatron_items(text: str) -> list[tuple[str, Any]]:
    """``--flag value`` command-line arguments (flags without a value are true), or ``key: value`` lines."""
    text = re.sub(r"\\\n", " ", text)
    lines = [re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines()]
    if any(re.search(r"(^|\s)--[A-Za-z]", line) for line in lines):
        try:
            tokens = shlex.split(" ".join(lines))
        except ValueError:
            tokens = " ".join(lines).split()
        items, i = [], 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.startswith("--") and len(tok) > 2:
                key, eq, val = tok[2:].partition("=")
                if eq:
                    items.append((key, val))
                elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                    items.append((key, tokens[i + 1]))
                    i += 1
                else:
                    items.append((key, True))
            i += 1
        return items
    items = []
    for line in lines:
        m = re.match(r"""^\s*["']?([A-Za-z_][\w.\-]*)["']?\s*[:=]\s*["']?([^"',{}\[\]]+?)["']?\s*,?\s*$""", line)
        if m:
            items.append((m.group(1), m.group(2)))
    return items


_MEGATRON_FLAGS = {  # flag -> (parameter, value it sets)
    "bf16": ("dtype", "bf16"), "fp16": ("dtype", "fp16"), "swiglu": ("gated", True),
    "sequence_parallel": ("sequence_parallel", True), "use_distributed_optimizer": ("zero", 1),
    "untie_embeddings_and_output_weights": ("tied", False),
    "accumulate_allreduce_grads_in_fp32": ("grad_dtype", "fp32"),
}


def _from_items(path: Path, items: list[tuple[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Megatron-LM / GPT-NeoX settings: the model and layout keys they give; everything else is ignored."""
    model_items, layout_items = [], []
    megatron = any(_canon_key(k.split(".")[-1]) in ("layers", "hidden") for k, _ in items)
    gbs = None
    for raw_key, val in items:
        k = raw_key.split(".")[-1].lower().replace("-", "_")
        if k in _MEGATRON_FLAGS and val is not False and str(val).lower() != "false":
            key, val = _MEGATRON_FLAGS[k]
        elif k == "recompute_granularity":
            key, val = "recompute", str(val).strip().lower() == "full"
        elif k == "global_batch_size":
            gbs = val
            continue
        elif k == "stage" and raw_key.startswith("zero_optimization"):
            key = "zero"
        else:
            key = _canon_key(k)
        if key in MODEL_KEYS:
            model_items.append((key, val))
        elif key in LAYOUT_KEYS:
            layout_items.append((key, val))
    if megatron and not any(k == "tied" for k, _ in model_items):
        model_items.append(("tied", True))  # Megatron-LM ties embeddings unless --untie-embeddings-and-output-weights
    try:
        model = _checked("--model", model_items, MODEL_KEYS)
        layout = _checked("--model", layout_items, LAYOUT_KEYS)
    except UsageError as e:
        e.path = str(path)
        raise
    if gbs is not None:
        layout["_global_batch_size"] = gbs
    return model, layout


def volume_params(model: str | Path | Mapping[str, Any] | None = None,
                  layout: str | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The volume_check parameters for ``--model`` and ``--layout`` (explicit ``--layout`` keys win over layout
    keys a Megatron arguments file gives). Micro-batches per step come from a Megatron file's global batch size
    when the DP degree is given: global / (micro_batch × dp)."""
    m, from_file = parse_model(model)
    lay = parse_layout(layout)
    gbs = from_file.pop("_global_batch_size", None)
    params = {**from_file, **lay}
    if gbs is not None and "micro_batches" not in params and params.get("dp") and m.get("micro_batch"):
        with contextlib.suppress(ValueError, TypeError):
            mb = int(float(gbs)) // (m["micro_batch"] * params["dp"])
            if mb >= 1:
                params["micro_batches"] = mb
    return {**m, **params}


def layout_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parallel_layout / parallel_degrees parameters among volume_check's."""
    return {k: v for k, v in params.items() if k in ("tp", "pp", "dp", "cp", "ep")}


_VAR = "nsys2comm_"


def set_session(con, params: Mapping[str, Any]) -> None:
    """Make ``params`` the session's model and layout: catalog queries called without them (``FROM
    volume_check``, the report) read them from DuckDB variables ``nsys2comm_<key>``."""
    clear_session(con)
    for key, value in params.items():
        if key in MODEL_KEYS or key in LAYOUT_KEYS:
            con.execute(f"SET VARIABLE {_VAR}{key} = ?", [value])


def clear_session(con) -> None:
    for key in (*MODEL_KEYS, *LAYOUT_KEYS):
        con.execute(f"RESET VARIABLE {_VAR}{key}")


@contextlib.contextmanager
def session_inputs(con, params: Mapping[str, Any]) -> Iterator[None]:
    """:func:`set_session` for the duration of a block."""
    set_session(con, params)
    try:
        yield
    finally:
        clear_session(con)
