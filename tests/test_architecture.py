"""The layers of the package (README "Architecture"): a module imports only from its own layer or lower ones."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "nsys2comm"

# layer of each top-level module or subpackage; lower numbers are lower layers
LAYERS = {
    "errors": 0, "catalog": 0, "units": 0, "limits": 0,
    "storage": 1,
    "ingest": 2, "analysis": 2, "results": 2, "model": 2,
    "summary": 3, "report": 3, "output": 3, "compare": 3, "export_perfetto": 3,
    "api": 4,
    "cli": 5, "__main__": 5, "__init__": 5,
}


def _unit(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """Top-level nsys2comm units this file imports (module-level and inside functions)."""
    tree = ast.parse(path.read_text())
    unit_pkg = len(path.relative_to(PKG).parts) > 1
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "nsys2comm" and len(parts) > 1:
                    out.add(parts[1])
                elif parts[0] == "nsys2comm":
                    out.update(a.name for a in node.names)
                continue
            up = node.level - (1 if unit_pkg else 0)  # levels above the package root
            mod = (node.module or "").split(".")[0] if node.module else ""
            if up == 0 and unit_pkg:
                continue  # inside its own subpackage
            if up <= 1:
                out.update([mod] if mod else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "nsys2comm" and len(parts) > 1:
                    out.add(parts[1])
    return {u for u in out if u in LAYERS}


def test_every_unit_has_a_layer():
    units = {_unit(p) for p in PKG.rglob("*.py")}
    assert units <= set(LAYERS), units - set(LAYERS)


def test_imports_go_down_only():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        unit = _unit(path)
        for dep in _imports(path) - {unit}:
            if LAYERS[dep] > LAYERS[unit] or (LAYERS[dep] == LAYERS[unit] and dep != unit
                                                and (unit, dep) not in SAME_LAYER_OK):
                bad.append(f"{path.relative_to(PKG)} imports {dep} (layer {LAYERS[dep]} > {unit}'s {LAYERS[unit]})")
    assert not bad, "\n".join(bad)


# imports within one layer that are part of the design
SAME_LAYER_OK = {("catalog", "errors"), ("__main__", "cli"), ("results", "analysis")}


def _storage_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import of the storage package or its submodules in a file outside it."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(PKG).parts) - 1  # 0 for a top-level module
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                mod = node.module or ""
            else:
                if node.level - 1 != depth:
                    continue  # relative to a subpackage: not the package root
                mod = "nsys2comm." + (node.module or "")
            if mod == "nsys2comm":
                mod = "nsys2comm." + ".".join(a.name for a in node.names if a.name == "storage")
            if mod.startswith("nsys2comm.storage"):
                out.append((mod, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("nsys2comm.storage")]
    return out


def test_storage_internals_stay_inside_storage():
    """Above the storage layer only the package's exported names are used: no submodule, no private name."""
    import nsys2comm.storage as storage

    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if path.relative_to(PKG).parts[0] == "storage":
            continue
        for mod, names in _storage_imports(path):
            if mod != "nsys2comm.storage" or not set(names) <= set(storage.__all__):
                bad.append(f"{path.relative_to(PKG)}: from {mod} import {', '.join(names)}")
    assert not bad, "\n".join(bad)


def test_the_storage_check_sees_a_submodule_import(tmp_path):
    # tier 1: the check above can fail
    pkg = tmp_path / "nsys2comm"
    (pkg / "report").mkdir(parents=True)
    (pkg / "report" / "x.py").write_text("from ..storage.db import connect\nfrom ..storage import settle\n")
    assert _storage_imports_at(pkg, pkg / "report" / "x.py") == [("nsys2comm.storage.db", ["connect"]),
                                                               ("nsys2comm.storage", ["settle"])]


def _storage_imports_at(root: Path, path: Path) -> list[tuple[str, list[str]]]:
    global PKG
    saved, PKG = PKG, root
    try:
        return _storage_imports(path)
    finally:
        PKG = saved
