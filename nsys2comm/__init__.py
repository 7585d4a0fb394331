"""nsys2comm: NCCL/RCCL communication analysis of Nsight Systems and PyTorch profiler traces."""

__version__ = "0.1.0"

from .api import Job, diff, is_database, run_query  # noqa: E402  (public API; __version__ first: submodules read it)
from .errors import InputError, Nsys2CommError, UsageError  # noqa: E402

__all__ = ["Job", "diff", "is_database", "run_query", "InputError", "Nsys2CommError", "UsageError", "__version__"]
