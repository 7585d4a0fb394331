"""Load order comes from declared includes (issue 15 item 10): a file that reads another file's objects says so
with ``-- @include area/file.sql``; DuckDB binds view and macro bodies at creation, so the order matters."""

from __future__ import annotations

import re

import duckdb
import pytest

from nsys2comm import catalog

ROOT = catalog.queries_dir()
FILES = sorted(ROOT.glob("*/*.sql"))


def _key(p) -> str:
    return f"{p.parent.name}/{p.name}"


def _closure(key: str, by_key: dict) -> set[str]:
    seen: set[str] = set()
    todo = list(catalog.includes(by_key[key]))
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            todo.extend(catalog.includes(by_key[k]))
    return seen


def _identifiers(sql: str) -> set[str]:
    """Names used in code (DuckDB's own tokenizer: not in strings or comments)."""
    toks = duckdb.tokenize(sql)
    ends = [p for p, _ in toks[1:]] + [len(sql)]
    return {re.match(r"[A-Za-z_][A-Za-z0-9_]*", sql[p:e]).group(0) for (p, t), e in zip(toks, ends, strict=False)
            if t == duckdb.token_type.identifier and re.match(r"[A-Za-z_]", sql[p:e])}


def test_every_cross_file_reference_is_declared():
    by_key = {_key(p): p for p in FILES}
    defined = {o.name: _key(o.path) for o in catalog.load_catalog()}
    for p in FILES:
        if p.parent.name == "prelude":
            continue  # the prelude loads first and reads nothing else
        needs = {defined[n] for n in _identifiers(p.read_text()) & set(defined)
                 if not defined[n].startswith("prelude/")} - {_key(p)}
        missing = needs - _closure(_key(p), by_key)
        assert not missing, f"{_key(p)} reads objects of {sorted(missing)} without '-- @include' for them"


def test_order_follows_includes():
    order = [_key(p) for p in catalog._sql_files(ROOT)]
    assert order[:2] == ["prelude/schema.sql", "prelude/classify.sql"]
    for p in FILES:
        for dep in catalog.includes(p):
            assert order.index(dep) < order.index(_key(p)), (dep, _key(p))


def test_cycles_and_unknown_files_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.sql").write_text("-- @include a/y.sql\nSELECT 1;\n")
    (tmp_path / "a" / "y.sql").write_text("-- @include a/x.sql\nSELECT 1;\n")
    with pytest.raises(ValueError, match="circular"):
        catalog._sql_files(tmp_path)
    (tmp_path / "a" / "y.sql").write_text("-- @include a/nope.sql\nSELECT 1;\n")
    with pytest.raises(FileNotFoundError, match="nope"):
        catalog._sql_files(tmp_path)
