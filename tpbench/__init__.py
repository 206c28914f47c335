"""tpbench: profile and benchmark PyTorch DDP communication hooks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store imports pandas: `import tpbench` (the CLI's start, a rank's) stays light
    from tpbench.store import Loaded

__version__ = "0.1.0"


def load(run_dir: str | Path) -> Loaded:
    """A run read back (``tpbench.store.Loaded``): ``record`` (run.json, typed), ``table`` (one row
    per case: parameters, label, status, summary numbers), ``steps`` and ``summary``."""
    from tpbench.store import load as _load

    return _load(run_dir)
