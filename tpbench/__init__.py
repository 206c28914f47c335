"""tpbench: profile and benchmark PyTorch DDP communication hooks."""

__version__ = "0.1.0"
