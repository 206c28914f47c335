"""tpbench: profile and benchmark PyTorch DDP communication hooks."""

__version__ = "0.1.0"


def load(run_dir):
    """A run read back (``tpbench.store.Loaded``): ``record`` (run.json, typed), ``table`` (one row
    per case: parameters, label, status, summary numbers), ``steps`` and ``summary``."""
    from tpbench.store import load as _load

    return _load(run_dir)
