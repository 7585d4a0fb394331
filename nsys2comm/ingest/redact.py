"""Credentials never reach a table: every free text a trace carries (NVTX messages, Kineto annotations and op names,
their args, process-group descriptions) is scanned anywhere in the text, not only at its start, before any writer
sees it.

What is redacted is the secret value, so that the range keeps its meaning (``run.sh --token=[redacted]``):
- assignments and headers whose key names a credential (``--token=X``, ``password: X``, ``AWS_SECRET_ACCESS_KEY=X``,
  ``"api_key": "X"``, ``--password X``);
- HTTP authorisation schemes (``Authorization: Bearer X``, ``Basic X``, ``Token X``);
- passwords in URLs (``https://user:X@host``);
- token shapes that are secret whatever surrounds them (GitHub, GitLab, Slack, AWS access keys, OpenAI/Anthropic,
  Hugging Face, Google API keys, JWTs, PEM private keys).

The shapes follow the public formats of those issuers (gitleaks' and GitHub secret scanning's rule sets document
the same prefixes). Over-redaction of a harmless ``key=value`` in a range name is the accepted cost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .base import Batch

REDACTED = "[redacted]"

# Words that make a key a credential's name (matched inside the key: AWS_SECRET_ACCESS_KEY, api-key, passwd, ...).
_KEY_WORDS = r"(?:key|token|secret|passw|pwd|credential|auth|cookie|session|signature|private|apikey|access)"
_KEY = rf"[\w.-]*{_KEY_WORDS}[\w.-]*"
_RULES: tuple[tuple[re.Pattern[str], Any], ...] = (
    # PEM private keys, whole block (or its unterminated start)
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:.*?-----END [A-Z ]*PRIVATE KEY-----|.*)", re.S),
     REDACTED),
    # Authorization: Bearer/Basic/Token X (the header value, or the scheme alone anywhere)
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{6,}"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)\b(basic\s+)[A-Za-z0-9+/]{12,}={0,2}"), rf"\1{REDACTED}"),
    # scheme://user:password@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]+:)[^\s@/]+@"), rf"\1{REDACTED}@"),
    # key=value, key: value, "key": "value", --key value (quoted values whole)
    # (a quoted value stays quoted, so JSON args stay JSON; an auth scheme is the rule above's)
    (re.compile(rf"""(?i)(["']?{_KEY}["']?\s*[=:]\s*)(?!(?:bearer|basic)\s)("[^"]*"|'[^']*'|[^\s,;&"'}}\]]+)"""),
     lambda m: m[1] + (m[2][0] + REDACTED + m[2][0] if m[2][0] in "\"'" else REDACTED)),
    (re.compile(rf"(?i)(--?{_KEY}\s+)(?!-)([^\s,;&]+)"), rf"\1{REDACTED}"),
    # issuer-specific token shapes, anywhere
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_-]{20,}"
                r"|xox[abposr]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}|sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"
                r"|hf_[A-Za-z0-9]{30,}|AIza[0-9A-Za-z_-]{35}"
                r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"), REDACTED),
)
# A cheap first pass (RE2, in Arrow): only texts that could match any rule go through Python.
_MAYBE = (r"(?i)(key|token|secret|passw|pwd|credential|auth|cookie|session|signature|private|access|bearer|basic"
          r"|://[^\s/@]*@|gh[pousr]_|github_pat_|glpat-|xox[abposr]-|akia|asia|sk-|hf_|aiza|eyj)")

# The free-text columns of each table; the rest are numbers, ids or names the importer builds itself.
TEXT_COLUMNS = {"cpu_ranges": ("name", "args"), "process_groups": ("pg_desc",), "ingest_notes": ("message",)}


def redact_text(text: str) -> str:
    """``text`` with every credential value replaced by ``[redacted]``."""
    for rule, repl in _RULES:
        text = rule.sub(repl, text)
    return text


def redact_array(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A string column with credentials redacted; returned unchanged (the same object) when none can match."""
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return arr
    maybe = pc.fill_null(pc.match_substring_regex(arr, _MAYBE), False)
    at = pc.indices_nonzero(maybe)
    if len(at) == 0:
        return arr
    old = pc.take(arr, at).to_pylist()
    new = [redact_text(t) for t in old]
    if new == old:
        return arr
    if isinstance(arr, pa.ChunkedArray):  # replace_with_mask takes plain arrays
        arr, maybe = arr.combine_chunks(), maybe.combine_chunks()
    return pc.replace_with_mask(arr, maybe, pa.array(new, arr.type))


def redact_batch(batch: Batch) -> Batch:
    cols = TEXT_COLUMNS.get(batch.table)
    if not cols:
        return batch
    data = batch.data
    for c in cols:
        if c in data.column_names:
            i = data.column_names.index(c)
            col = data.column(i)
            new = redact_array(col)
            if new is not col:
                data = data.set_column(i, c, new)
    return batch if data is batch.data else Batch(batch.table, data)


def redacted(batches: Iterable[Batch]) -> Iterator[Batch]:
    """The importer's batches with credentials redacted (every writer reads batches through this)."""
    for b in batches:
        yield redact_batch(b)
