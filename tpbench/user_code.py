"""Importing the user's own code named in a suite (``MODULE:NAME``): a workload factory, a
communication hook. Validation imports it here the way the ranks will, so a path that works in
one place works in the other, and runs it under a time limit (``limited``), so that a factory that
sleeps, exits or raises ``KeyboardInterrupt`` is reported as that factory's failure."""

from __future__ import annotations

import importlib
import os
import re
import site
import sys
import sysconfig
import threading
import traceback
from pathlib import Path
from types import ModuleType
from typing import Callable, TypeVar

T = TypeVar("T")

# How long importing or calling one piece of the user's code may take at validation, outside any
# world: the meta-device check of a workload factory, the import of a hook or state factory. A
# real factory builds a meta model in well under a second and imports its module in a few.
LIMIT_S = 60.0


class UserCodeFailed(Exception):
    """The user's code, run by ``limited``, did not return: the message says how, naming it."""


# Where else the user's code lives: ``tpbench gate`` runs each side in a folder of its own and
# names the caller's folder here (the ranks inherit it). Appended, never first: the side's own
# tpbench must not be shadowed by a checkout in the caller's folder.
USER_PATH_ENV = "TPBENCH_USER_PATH"


_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
# Where tpbench's, torch's and Python's own code lives (site-packages, the user's included): frames
# there are not the user's.
_NOT_USERS = tuple(
    os.path.join(os.path.realpath(p), "")
    for p in {
        str(Path(__file__).parent),
        *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
        *site.getsitepackages(),
        site.getusersitepackages(),
    }
)


def user_frame(tb: str) -> str:
    """Where in the user's code an exception was raised, from its formatted traceback ``tb``, as
    " (at FILE:LINE, in FUNCTION)", or "".

    A case's error is one line, the exception's first (``exception_line``); a hook or workload
    factory of one's own that raises says only its own words there ("ValueError: my hook is
    broken"), not which of the suite's hooks or factories said them, and the traceback that does is
    in run.json's ``detail``. The innermost frame outside tpbench, the installed packages and the
    standard library is that code's; errors raised in tpbench or torch with none of it on the stack
    get no suffix. A file under the working directory is shown relative to it. Validation says the
    same of the code it runs (``raised_at``), so a factory that raises is found from either."""
    found = ""
    for line in tb.splitlines():
        m = _FRAME.match(line)
        if m is None or m["file"].startswith("<"):
            continue
        path = os.path.realpath(m["file"])
        if path.startswith(_NOT_USERS):
            continue
        shown = os.path.relpath(path)
        found = f" (at {m['file'] if shown.startswith('..') else shown}:{m['line']}, in {m['func']})"
    return found


def raised_at(e: BaseException) -> str:
    """``user_frame`` of an exception caught in this process."""
    return user_frame("".join(traceback.format_exception(e)))


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
        raise ImportError(f"cannot import {module_name!r} ({where}): {type(e).__name__}: {e}{raised_at(e)}") from None


def limited(what: str, fn: Callable[[], T], limit_s: float | None = None) -> T:
    """``fn()`` (the user's code, named ``what``) run in a daemon thread for at most ``limit_s``
    (default ``LIMIT_S``) seconds. Its exceptions pass through; one that would end tpbench
    (``SystemExit``, ``KeyboardInterrupt``) and a time limit that expires raise
    ``UserCodeFailed`` naming ``what``.

    A thread rather than a child process: validation needs the imported factory itself (its
    signature is the workload's parameters) in this process. A factory still running when the
    limit expires is left to the daemon thread, which ends with tpbench's exit 2. Ctrl-C still
    reaches this (main) thread while it waits."""
    limit = LIMIT_S if limit_s is None else limit_s
    outcome: list[tuple[bool, object]] = []

    def target() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as e:  # the user's code: whatever it raises is reported, named
            outcome.append((False, e))

    thread = threading.Thread(target=target, name=f"tpbench user code {what}", daemon=True)
    thread.start()
    thread.join(limit)
    if not outcome:
        raise UserCodeFailed(f"{what}: did not return within {limit:g} s")
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[return-value]
    if isinstance(value, SystemExit):
        raise UserCodeFailed(f"{what}: called sys.exit({value.code!r}) instead of returning") from None
    if isinstance(value, BaseException) and not isinstance(value, Exception):
        raise UserCodeFailed(f"{what}: raised {type(value).__name__} instead of returning") from None
    raise value  # type: ignore[misc]
