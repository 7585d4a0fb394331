"""nsys2comm: NCCL/RCCL communication analysis of Nsight Systems and PyTorch profiler traces."""

__version__ = "0.1.0"
