"""One definition each (issue 40 item 5): the rounding of every JSON output, the macro defaults that forwarding macros
share (constant macros), and the communication-kernel rule (the importer's regex = SQL is_comm_kernel_name) on every
kernel name of the fixtures and of the real traces in ../shared."""

from __future__ import annotations

import gzip
import math
import re
import sqlite3
from pathlib import Path

import orjson
import pytest

from nsys2comm import catalog, compare, summary, units

ROOT = Path(__file__).resolve().parents[1]


# tier 2: the rounding rule on hand-picked values, and summary and diff both use it (no module keeps its own)
@pytest.mark.parametrize(("v", "want"), [
    (1234567.8, 1234568.0),  # never coarser than whole units
    (0.123456789, 0.123457),
    (-98.7654321, -98.7654),
    (1e-9 / 3, 3.33333e-10),
    (0.0, 0.0),
    (12, 12),  # ints as they are
    (True, True),
    ("1.23456789", "1.23456789"),
    (None, None),
])
def test_round_floats(v, want):
    assert units.round_floats(v) == want
    assert type(units.round_floats(v)) is type(want)


def test_round_floats_nested_and_non_finite():
    got = units.round_floats({"a": [1.23456789, {"b": math.inf}], "c": -math.inf, "d": (1.23456789,)})
    assert got["a"] == [1.23457, {"b": math.inf}] and got["c"] == -math.inf
    assert got["d"] == (1.23456789,)  # tuples are not JSON lists: left alone
    assert math.isnan(units.round_floats(math.nan))


def test_summary_and_diff_round_alike():
    assert summary.DIGITS == compare.DIGITS == units.JSON_DIGITS
    for mod in (summary, compare):
        assert mod.round_floats is units.round_floats
        assert not hasattr(mod, "_round"), f"{mod.__name__} keeps its own rounding"


# tier 1: a macro that forwards a parameter to another macro (``p := p``) does not restate a numeric default as a
# literal: both declare the same constant macro (as queries/skew/latency.sql keeps its constants)
def _params(obj: catalog.CatalogObject) -> tuple[dict[str, str | None], str]:
    """The macro's parameters (name -> default, None when required) and its body."""
    m = re.search(r"MACRO\s+" + re.escape(obj.name) + r"\s*\(", obj.sql, re.I)
    assert m, obj.name
    depth, i, start = 1, m.end(), m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(obj.sql[i], 0)
        i += 1
    out: dict[str, str | None] = {}
    for part in re.split(r",(?![^()]*\))", obj.sql[start:i - 1]):
        if part.strip():
            name, _, default = part.partition(":=")
            out[name.strip()] = default.strip() or None
    return out, obj.sql[i:]


def _forwarding_pairs() -> list[tuple[str, str, str]]:
    macros = {o.name: o for o in catalog.load_catalog() if o.kind == "macro"}
    params = {name: _params(o) for name, o in macros.items()}
    pairs = []
    for name, (_, body) in params.items():
        for call in re.finditer(r"\b(\w+)\s*\(", body):
            callee = call.group(1)
            if callee in params and callee != name:
                args = body[call.end():body.find(")", call.end())]
                for p in re.findall(r"\b(\w+)\s*:=\s*\1\b", args):
                    pairs.append((name, callee, p))
    return pairs


def test_forwarded_defaults_are_constant_macros():
    macros = {o.name: _params(o)[0] for o in catalog.load_catalog() if o.kind == "macro"}
    pairs = _forwarding_pairs()
    assert ("exposed_comm_causes", "_exposure_by_kernel_rows", "right_after_ns") in pairs
    assert ("late_rank_host_ops", "late_arrival_causes", "epsilon_ns") in pairs
    bad = []
    for caller, callee, p in pairs:
        mine, theirs = macros[caller].get(p), macros[callee].get(p)
        if mine is None or theirs is None or not re.fullmatch(r"[-+]?[0-9][0-9_.eE+-]*|_\w+\(\)", mine):
            continue  # the callee requires it, or a sentinel (NULL, '', a mode name) rather than a figure
        if mine != theirs or not re.fullmatch(r"_\w+\(\)", mine):
            bad.append(f"{caller}({p} := {mine}) -> {callee}({p} := {theirs})")
    assert not bad, "restated defaults (use one constant macro): " + "; ".join(bad)


def test_constant_defaults_are_the_documented_values(con):
    assert con.execute("SELECT _exposure_right_after_ns(), _lateness_epsilon_ns()").fetchone() == (10_000, 10_000)


# tier 4: the comm-kernel rule, Python = SQL, on every kernel name of the fixtures and of the real traces in ../shared
# (the reviewed corpus fixtures/kernel_names/corpus.csv is checked in tests/test_kernel_names.py)
def _kineto_kernel_names(path: Path) -> set[str]:
    doc = orjson.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return {e["name"] for e in events if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel"}


def _nsys_kernel_names(path: Path) -> set[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {n for (n,) in db.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                         "JOIN StringIds s ON s.id IN (k.demangledName, k.shortName, k.mangledName)")}
    finally:
        db.close()


def _synthetic_kernel_names() -> set[str]:
    from fixtures import synthetic as syn

    return {k.name for rr in syn.make_run(world_size=4, steps=1).ranks for k in rr.kernels}


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_python_comm_rule_is_the_sql_rule_on_every_trace(con, shared_traces):
    from nsys2comm.ingest.kineto_rows import _COMM_KERNEL_RE

    names: set[str] = _synthetic_kernel_names()
    for p in sorted((ROOT / "fixtures" / "example").glob("*.json.gz")) + sorted(shared_traces.rglob("*.json*")):
        if p.name != "reference-values.json":
            names |= _kineto_kernel_names(p)
    for p in sorted(shared_traces.rglob("*.sqlite")):
        names |= _nsys_kernel_names(p)
    names |= {n[5:] for n in names if n.startswith("void ")}
    got = dict(con.execute("SELECT n, is_comm_kernel_name(n) FROM unnest(?) t(n)", [sorted(names)]).fetchall())
    py = {n: bool(_COMM_KERNEL_RE.search(n[5:] if n.startswith("void ") else n)) for n in names}
    assert py == got
    assert len(names) >= 200 and 5 <= sum(got.values()) < len(got)  # both kinds are there
