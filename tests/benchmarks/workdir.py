"""The work directory and result file that the add_to_job and many_files harnesses share."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def run_in_workdir(workdir: str | None, keep: bool, prefix: str, out: str, run: Callable[[Path], dict]) -> dict:
    """Run ``run(work)`` in ``workdir`` (else a temp directory, removed afterwards unless ``keep``) and write its
    result to ``out`` as JSON."""
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = run(work)
    finally:
        if not keep and not workdir:
            shutil.rmtree(work, ignore_errors=True)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=2))
    return res
