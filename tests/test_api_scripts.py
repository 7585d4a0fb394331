"""The Python API from a plain script without a main guard, and from stdin (issue 15 item 3): parallel ingest
must not re-run the caller's script in its workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = f"""
import nsys2comm
job = nsys2comm.Job.ingest([{str(ROOT / 'fixtures' / 'example')!r}], jobs=2)
print("ranks", job.query("overlap_by_rank").height)
"""

# tier: subprocess (every test here starts nsys2comm or Python processes)
pytestmark = pytest.mark.subprocess


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_api_without_main_guard(tmp_path, how):
    if how == "file":
        script = tmp_path / "analyse.py"
        script.write_text(SCRIPT)
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    else:
        r = subprocess.run([sys.executable, "-"], input=SCRIPT, capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["ranks 8"]  # printed once: the workers did not run the script again
