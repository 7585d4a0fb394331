"""The per-user cache directory: files nsys2comm can rebuild at any time (the report's Vega bundle, the job
database template). ``$NSYS2COMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/nsys2comm``, else ``~/.cache/nsys2comm``."""

from __future__ import annotations

import os
from pathlib import Path


def directory() -> Path:
    given = os.environ.get("NSYS2COMM_CACHE_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nsys2comm"
