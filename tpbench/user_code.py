"""Importing the user's own code named in a suite (``MODULE:NAME``): a workload factory, a
communication hook. Validation imports it here the way the ranks will, so a path that works in
one place works in the other."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

# Where else the user's code lives: ``tpbench gate`` runs each side in a folder of its own and
# names the caller's folder here (the ranks inherit it). Appended, never first: the side's own
# tpbench must not be shadowed by a checkout in the caller's folder.
USER_PATH_ENV = "TPBENCH_USER_PATH"


def import_module(module_name: str) -> ModuleType:
    """``module_name`` imported with the current directory on the path, as the ranks (``python -m
    tpbench.worker``, started here) see it, then ``TPBENCH_USER_PATH``'s folders; any failure
    becomes one ``ImportError`` line naming it."""
    cwd = os.getcwd()
    for folder in [cwd, *filter(None, os.environ.get(USER_PATH_ENV, "").split(os.pathsep))]:
        if folder not in sys.path:
            sys.path.append(folder)
    try:
        return importlib.import_module(module_name)
    except Exception as e:  # any import failure is the user's to see, named
        where = f"from {cwd} or PYTHONPATH"
        raise ImportError(f"cannot import {module_name!r} ({where}): {type(e).__name__}: {e}") from None
