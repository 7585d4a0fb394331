"""What the parallelism should communicate: the model and layout inputs of the volume check.

The formulas themselves are SQL (``queries/model/formulas.sql``, used by the catalog queries ``parallel_layout``
and ``volume_check``); this package only turns ``--model`` / ``--layout`` text, Hugging Face ``config.json`` files
and Megatron-LM argument files into those queries' parameters (:func:`volume_params`), and hands them to a
session (:func:`session_inputs`) so that catalog queries run without arguments (the report's) use them.
"""

from .inputs import (
    LAYOUT_KEYS,
    MODEL_KEYS,
    clear_session,
    layout_params,
    parse_layout,
    parse_model,
    session_inputs,
    set_session,
    volume_params,
)

__all__ = ["LAYOUT_KEYS", "MODEL_KEYS", "clear_session", "layout_params", "parse_layout", "parse_model",
           "session_inputs", "set_session", "volume_params"]
