"""Shared test fixtures.

Tests that read the real traces in ../shared must run in CI (CI=true); they skip only outside CI when the
folder is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings
from tiers import FAST_EXAMPLES

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NSYS2COMM_SHARED", ROOT.parent / "shared"))
TRACES = SHARED / "traces"


# pytest-xdist starts one worker per core, which keeps every core busy: each worker's DuckDB runs one thread
# (NSYS2COMM_THREADS) instead of one per core in every worker (8 % less wall time on 2 cores). tests/test_threads.py
# holds the rows to be the same at any thread count.
if os.environ.get("PYTEST_XDIST_WORKER") and "NSYS2COMM_THREADS" not in os.environ:
    os.environ["NSYS2COMM_THREADS"] = "1"


# the inner loop's property tests (make test-fast: --hypothesis-profile=fast; tests/tiers.py scales their examples)
settings.register_profile("fast", max_examples=FAST_EXAMPLES, deadline=None)


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
    from synth_db import catalog_db

    return catalog_db()


@pytest.fixture(scope="session")
def reference_values(shared_traces: Path) -> dict:
    import orjson

    return orjson.loads((shared_traces / "kineto" / "reference-values.json").read_bytes())


# Test tiers (pytest markers, registered in pyproject.toml), set where the test is:
#   subprocess  the test (or a fixture it uses) requests ``cli_process`` (marked here at collection), or carries
#               @pytest.mark.subprocess / a module ``pytestmark``: it starts nsys2comm or Python processes;
#   browser     the test requests the ``browser`` fixture (tests/test_report.py): it drives headless Chromium;
#   slow        @pytest.mark.slow where the test is: more than ~1 s on 2 idle cores under the fast Hypothesis
#               profile (whole-pipeline properties, real traces, every-query checks, benchmarks);
#   fast        everything else (the inner loop: make test-fast, in-process only).
# A test that is not marked subprocess and starts a Python process fails (see _no_python_processes): mark it, or use
# the cli_process fixture.


@pytest.fixture(scope="session")
def cli_process():
    """Run ``python -m nsys2comm ARGS`` in a fresh process: ``cli_process(*args, input=None, cwd=ROOT, env=None,
    timeout=300)`` -> CompletedProcess (text). A test that uses it, directly or through its fixtures, is marked
    'subprocess'."""
    def run(*args, input: str | None = None, cwd: Path = ROOT, env: dict | None = None, timeout: float = 300,
            **kw) -> subprocess.CompletedProcess:
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        return subprocess.run([sys.executable, "-m", "nsys2comm", *map(str, args)], input=input, cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout, **kw)
    return run


_BY_FIXTURE = {"cli_process": "subprocess", "browser": "browser"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, tier in _BY_FIXTURE.items():
            if fixture in item.fixturenames and not item.get_closest_marker(tier):
                item.add_marker(getattr(pytest.mark, tier))
        if not any(item.get_closest_marker(t) for t in ("slow", "subprocess", "browser")):
            item.add_marker(pytest.mark.fast)


class _PythonProcessInUnmarkedTest(subprocess.Popen):
    def __init__(self, args, *a, **kw):
        argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        exe = os.path.basename(os.fsdecode(argv[0]).split()[0]) if argv else ""
        if argv and (os.fsdecode(argv[0]) == sys.executable or exe.startswith("python") or exe == "nsys2comm"):
            pytest.fail("this test starts a Python process but is not marked 'subprocess': use the cli_process "
                        "fixture or mark it @pytest.mark.subprocess (tests/conftest.py)", pytrace=False)
        super().__init__(args, *a, **kw)


@pytest.fixture(autouse=True)
def _no_python_processes(request, monkeypatch):
    """The in-process tiers stay in-process: starting a Python process there fails the test (a helper that spawns
    the CLI would otherwise slip a 10 s test into the inner loop)."""
    if not request.node.get_closest_marker("subprocess"):
        monkeypatch.setattr(subprocess, "Popen", _PythonProcessInUnmarkedTest)


# --cpu-durations=N: the N tests that used the most CPU time (this process's, DuckDB's threads included), setup and
# teardown included. Unlike --durations it does not grow with the machine's load: the measure to tier tests by.
def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="list the N tests that used the most CPU time (0: all)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_START] = time.process_time()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    item.user_properties.append(("cpu_s", time.process_time() - item.stash[_CPU_START]))  # before the report


_CPU_START = pytest.StashKey[float]()


_CPU: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        for key, value in report.user_properties:
            if key == "cpu_s":
                _CPU[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.getoption("--cpu-durations")
    if n is None or not _CPU:
        return
    ranked = sorted(_CPU.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("=", f"CPU time: {sum(_CPU.values()):.1f} s in {len(_CPU)} tests; the most")
    for nodeid, cpu in ranked[:n or None]:
        terminalreporter.write_line(f"{cpu:8.2f}s  {nodeid}")
