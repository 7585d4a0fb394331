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


@pytest.fixture(scope="module")
def con():
    """An in-memory database with the catalog installed and empty canonical tables (tier-2 SQL tests)."""
    import duckdb

    from nsys2comm import catalog

    c = duckdb.connect()
    catalog.install(c)
    return c


@pytest.fixture(scope="session")
def reference_values(shared_traces: Path) -> dict:
    import orjson

    return orjson.loads((shared_traces / "kineto" / "reference-values.json").read_bytes())


# Test tiers (pytest markers, registered in pyproject.toml). CI runs every tier; the inner loop runs
#   python -m pytest -m "not slow and not subprocess and not browser"     (a few minutes on 2 cores)
# A test is 'browser' when it drives headless Chromium, 'subprocess' when it starts nsys2comm or Python processes,
# 'slow' when it is a property test or a benchmark of more than ~10 s; everything else is 'fast'.
_SLOW = {"test_cache_property.py", "test_benchmark_smoke.py",
         "test_nsys_pytorch_nvtx.py::test_group_depth_matches_brute_force",
         "test_analyses.py::test_sweep_property", "test_latency.py::test_theil_sen_vs_brute_force",
         "test_kernel_names.py::test_sql_matches_oracle_on_generated_signatures"}
_SUBPROCESS = {"test_api_scripts.py", "test_signals.py", "test_readonly.py", "test_cache.py",
               "test_benchmark_smoke.py", "test_jobdir.py", "test_dask.py"}
_BROWSER = {"test_report.py::test_report_renders_in_chromium", "test_report.py::test_hostile_names_show_as_text",
            "test_report.py::test_nav_fits_the_window", "test_diff.py::test_report_with_baseline_renders_in_chromium"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        file = Path(str(item.fspath)).name
        keys = {file, f"{file}::{item.originalname}"}
        tiers = [name for name, group in (("slow", _SLOW), ("subprocess", _SUBPROCESS), ("browser", _BROWSER))
                 if keys & group]
        if "subprocess" not in tiers and "subprocess.run" in _source(item):
            tiers.append("subprocess")
        for t in tiers or ["fast"]:
            item.add_marker(getattr(pytest.mark, t))


def _source(item) -> str:
    import inspect

    try:
        return inspect.getsource(item.function)
    except (OSError, TypeError):
        return ""
