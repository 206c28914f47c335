"""Importing the user's own code named in a suite (``MODULE:NAME``): a workload factory, a
communication hook. Validation imports it here the way the ranks will, so a path that works in
one place works in the other."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType


def import_module(module_name: str) -> ModuleType:
    """``module_name`` imported with the current directory on the path, as the ranks (``python -m
    tpbench.worker``, started here) see it; any failure becomes one ``ImportError`` line naming it."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except Exception as e:  # any import failure is the user's to see, named
        where = f"from {cwd} or PYTHONPATH"
        raise ImportError(f"cannot import {module_name!r} ({where}): {type(e).__name__}: {e}") from None
