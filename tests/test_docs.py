"""The docs stay true: quickstart = CI, every command in the README, docs/cli.md = --help, docs/catalog.md = queries
list, the README a manual of at most 400 lines, and every document it or the code cites inside the repository.

Tier 1. Regenerate the generated blocks after changing a command's help or the catalog:

    python tests/test_docs.py --update
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"
CATALOG_DOC = ROOT / "docs" / "catalog.md"
COMMANDS = ["ingest", "summary", "diff", "report", "query", "sql", "queries list", "queries show", "schema", "doctor",
            "export perfetto"]


def _help(args: list[str]) -> str:
    """Plain (non-rich) --help at a fixed width: stable across terminals."""
    env = {**os.environ, "TYPER_USE_RICH": "0", "COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "nsys2comm", *args, "--help"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    return "\n".join(line.rstrip() for line in p.stdout.strip().splitlines())


def command_reference() -> str:
    parts = [f"### `nsys2comm`\n\n```text\n{_help([])}\n```"]
    for cmd in COMMANDS:
        parts.append(f"### `nsys2comm {cmd}`\n\n```text\n{_help(cmd.split())}\n```")
    return "\n\n".join(parts)


def catalog_table() -> str:
    sys.path.insert(0, str(ROOT))
    from nsys2comm.cli import catalog_rows
    from nsys2comm.output import render

    return render(catalog_rows(), "markdown").decode().strip()


BLOCKS = {"COMMANDS": (CLI_DOC, command_reference), "CATALOG": (CATALOG_DOC, catalog_table)}


def _block(text: str, name: str) -> str:
    m = re.search(rf"<!-- BEGIN {name}[^\n]*-->\n(.*?)<!-- END {name} -->", text, re.S)
    assert m, f"the generated {name} block is missing"
    return m.group(1).strip()


def update() -> None:
    for name, (path, fn) in BLOCKS.items():
        new = fn()
        text = re.sub(rf"(<!-- BEGIN {name}[^\n]*-->\n).*?(<!-- END {name} -->)",
                      lambda m, new=new: m.group(1) + new + "\n" + m.group(2), path.read_text(), flags=re.S)
        path.write_text(text)


# ---------------------------------------------------------------------------------------------------------------


def test_quickstart_test_command_is_the_ci_command():
    readme_lines = README.read_text().splitlines()
    ci_last = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()][-1]
    quick = readme_lines[readme_lines.index("## Quickstart"):]
    code = [line for line in quick if line.startswith(("python3 -m venv", "pip install"))][:2]
    assert code[0] == ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
                       "nsys2comm report fixtures/example -o report.html")
    assert code[1] == ci_last


def test_readme_starts_with_the_quickstart():
    heads = [line for line in README.read_text().splitlines() if line.startswith("## ")]
    assert heads[0] == "## Quickstart"
    for section in ("## Commands", "## Query catalog", "## Job epilogue", "## Python API", "## Exit codes",
                    "## Schema", "## Performance"):
        assert section in heads, section


def test_every_command_is_in_the_readme():
    text = README.read_text()
    for cmd in COMMANDS + ["--version"]:
        assert f"nsys2comm {cmd}" in text, cmd


@pytest.mark.subprocess  # tier: subprocess (every command's --help from a fresh process)
def test_command_reference_matches_help():
    assert _block(CLI_DOC.read_text(), "COMMANDS") == command_reference(), \
        "docs/cli.md is stale: run python tests/test_docs.py --update"


def test_catalog_matches_queries_list():
    assert _block(CATALOG_DOC.read_text(), "CATALOG") == catalog_table(), \
        "docs/catalog.md is stale: run python tests/test_docs.py --update"


def test_readme_is_a_manual():
    assert len(README.read_text().splitlines()) <= 400


def test_everything_cited_is_in_the_repository():
    """Links in the README and docs resolve inside the repository, and nothing cites ../shared (not shipped)."""
    docs = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for doc in docs:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"
    code = [*ROOT.glob("nsys2comm/**/*.py"), *ROOT.glob("queries/**/*.sql"), *docs]
    assert [p.name for p in code if "shared/reference" in p.read_text()] == []


def test_readme_catalog_names_are_the_cli_list():
    from typer.testing import CliRunner

    from nsys2comm.cli import app

    r = CliRunner().invoke(app, ["queries", "list", "--format", "csv"])
    names = [line.split(",")[0] for line in r.stdout.splitlines()[1:]]
    block = _block(CATALOG_DOC.read_text(), "CATALOG")
    assert [line.split("|")[1].strip() for line in block.splitlines()[2:]] == names


if __name__ == "__main__":
    if "--update" in sys.argv:
        update()
        print("docs/cli.md and docs/catalog.md updated")
