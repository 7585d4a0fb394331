"""Shared test fixtures.

Tests that read the real traces in ../shared must run in CI (CI=true); they skip only outside CI when the
folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NSYS2COMM_SHARED", ROOT.parent / "shared"))
TRACES = SHARED / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not TRACES.is_dir():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{TRACES} is missing: CI must provide ../shared beside the checkout")
        pytest.skip("../shared/traces not present (outside CI)")
    return TRACES


@pytest.fixture(scope="session")
def reference_values(shared_traces: Path) -> dict:
    import orjson

    return orjson.loads((shared_traces / "kineto" / "reference-values.json").read_bytes())
