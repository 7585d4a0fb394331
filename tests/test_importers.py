"""The importer interface (ingest/base.Importer): every importer module satisfies it, the directory search's suffixes
and the format hints are built from the importers' declarations, and the ingest package has no import circle."""

# tier 1: structure of the package (no SQL, no traces); everything here runs in-process in seconds

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from nsys2comm.errors import InputError
from nsys2comm.ingest import _importers, detect, expand_paths, formats_hint, trace_suffixes
from nsys2comm.ingest.base import Importer

PKG = Path(__file__).resolve().parents[1] / "nsys2comm"
IMPORTERS = _importers()


@pytest.mark.parametrize("source", sorted(IMPORTERS))
def test_every_importer_satisfies_the_protocol(source):
    mod = IMPORTERS[source]
    assert isinstance(mod, Importer)
    assert source == mod.SOURCE
    assert mod.SUFFIXES and all(s.startswith(".") for s in mod.SUFFIXES)
    assert mod.FORMAT_HINT.strip()
    for name in ("sniff", "read", "finalize", "decoder_processes"):  # callable with the Protocol's arguments
        want = [p for p in inspect.signature(getattr(Importer, name)).parameters if p != "self"]
        sig = inspect.signature(getattr(mod, name))
        sig.bind(*want)  # raises TypeError where the module's function takes other positional arguments


def test_a_module_without_a_member_is_not_an_importer():
    from nsys2comm.ingest import ranks

    assert not isinstance(ranks, Importer)


def test_mypy_accepts_every_importer_module_and_refuses_another(tmp_path):
    api = pytest.importorskip("mypy.api")
    lines = ["from nsys2comm.ingest import ranks", "from nsys2comm.ingest.base import Importer"]
    lines += [f"from nsys2comm.ingest import {m.__name__.rsplit('.', 1)[1]}" for m in IMPORTERS.values()]
    lines += [f"ok_{i}: Importer = {m.__name__.rsplit('.', 1)[1]}" for i, m in enumerate(IMPORTERS.values())]
    lines.append("bad: Importer = ranks")
    check = tmp_path / "importer_check.py"
    check.write_text("\n".join(lines) + "\n")
    out, err, _rc = api.run(["--config-file", str(PKG.parent / "pyproject.toml"), "--no-incremental",
                             "--no-error-summary", str(check)])
    errors = [ln for ln in out.splitlines() if ": error:" in ln]
    assert len(errors) == 1 and f"{check.name}:{len(lines)}:" in errors[0], out + err


def test_the_suffix_list_is_the_union_of_the_importers_declarations():
    union = {s for m in IMPORTERS.values() for s in m.SUFFIXES}
    assert set(trace_suffixes()) == union and len(trace_suffixes()) == len(union)


def test_a_directory_search_finds_every_declared_suffix_and_nothing_else(tmp_path):
    for i, suffix in enumerate(trace_suffixes()):
        (tmp_path / f"t{i}{suffix}").write_bytes(b"x")
    (tmp_path / "notes.txt").write_bytes(b"x")
    found = {p.name for p in expand_paths([tmp_path])}
    assert found == {f"t{i}{s}" for i, s in enumerate(trace_suffixes())}


def test_the_hints_name_every_format_and_suffix(tmp_path):
    hint = formats_hint()
    assert all(m.FORMAT_HINT in hint and all(f"*{s}" in hint for s in m.SUFFIXES) for m in IMPORTERS.values())
    (tmp_path / "empty.json").write_bytes(b"")
    (tmp_path / "other.bin").write_bytes(b"\x01\x02 not a trace")
    empty = tmp_path / "none"
    empty.mkdir()
    for what, call in (("empty", lambda: detect(tmp_path / "empty.json")),
                       ("unknown", lambda: detect(tmp_path / "other.bin")),
                       ("no traces", lambda: expand_paths([empty]))):
        with pytest.raises(InputError) as e:
            call()
        assert hint in (e.value.hint or ""), what


# ------------------------------------------------------------------------------- import circles inside a package


def _module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> modules of its own package it imports (relative imports, at module level and inside functions),
    for every subpackage under ``root``: e.g. ingest.nsys -> {ingest.base, ingest.nsys_ranges, ...}."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if len(rel.parts) < 2:
            continue
        pkg = ".".join(rel.parts[:-1])
        mods = {".".join((*rel.parts[:-1], p.stem)) for p in path.parent.glob("*.py")}
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                deps.update(f"{pkg}.{n}" if f"{pkg}.{n}" in mods else f"{pkg}.__init__" for n in names)
        graph[".".join((*rel.parts[:-1], path.stem))] = deps - {".".join((*rel.parts[:-1], path.stem))}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that lies on one (depth-first search)."""
    found, done = [], set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            found.append(stack[stack.index(node):] + [node])
            return
        if node in done:
            return
        for dep in sorted(graph.get(node, ())):
            visit(dep, stack + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_no_import_circle_inside_a_subpackage():
    # package __init__ modules import their submodules; a submodule importing its package back is not counted
    graph = {m: {d for d in deps if not d.endswith(".__init__")} for m, deps in _module_graph(PKG).items()}
    assert not _cycles(graph), _cycles(graph)


def test_the_circle_check_finds_a_function_level_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text(textwrap.dedent("""
        def f():
            from .a import g
            return g
    """))
    assert _cycles(_module_graph(tmp_path)) == [["pkg.a", "pkg.b", "pkg.a"]]
