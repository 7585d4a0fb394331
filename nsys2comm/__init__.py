"""nsys2comm: NCCL/RCCL communication analysis of Nsight Systems and PyTorch profiler traces."""

__version__ = "0.1.0"

from .errors import InputError, Nsys2CommError, UsageError

_API = ("Job", "diff", "is_database", "run_query")


def __getattr__(name: str):
    # the API (DuckDB, polars) loads on first use: trace decoder processes import nsys2comm.ingest and stay light
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'nsys2comm' has no attribute {name!r}")

__all__ = ["Job", "diff", "is_database", "run_query", "InputError", "Nsys2CommError", "UsageError", "__version__"]
