"""tpbench: profile and benchmark PyTorch DDP communication hooks."""

__version__ = "0.1.0"


def load(run_dir):
    """A run's metadata and DataFrames (see ``tpbench.store.load``)."""
    from tpbench.store import load as _load

    return _load(run_dir)
