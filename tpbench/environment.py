"""The environment fingerprint: what makes two runs comparable, or not.

Recorded in every run.json (like pytest-benchmark's machine_info and commit_info). The gate
compares the ``COMPARABLE_KEYS``; the rest is there to explain a difference.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import tpbench

# Keys whose difference makes step times incomparable. ``gpu_count``: a rank takes GPU ``local_rank %
# gpu_count`` (the worker), so a CUDA case's ranks share a GPU on a node with fewer GPUs than ranks,
# and the same case on one GPU and on two of one model measures other things.
COMPARABLE_KEYS = ("torch", "cuda", "nccl", "gpu_model", "gpu_count", "gpu_driver", "cpu_model", "cpu_count")


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _git_commit() -> dict[str, Any]:
    """The commit of the checkout tpbench runs from and whether its tracked files changed; none where
    the folder above the package is no repository, or one that does not track tpbench: installed (not
    editable) into a venv inside a user's own repository, that repository's commit is not tpbench's."""
    init = Path(tpbench.__file__).resolve()

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(init.parent.parent), *args], capture_output=True, text=True, timeout=5)

    try:
        tracked = git("ls-files", "--error-unmatch", str(init))
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if tracked.returncode != 0 or commit.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def _gpus() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"gpu_count": 0, "gpu_model": None, "gpu_driver": None}
    info: dict[str, Any] = {
        "gpu_count": torch.cuda.device_count(),
        "gpu_model": torch.cuda.get_device_name(0),
        "gpu_driver": None,
    }
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        try:
            info["gpu_driver"] = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    return info


def _torch_build() -> tuple[str, str | None] | None:
    """torch's version and the CUDA version it was built for, without importing torch: both are
    literals in ``torch/version.py``, read here as text. Importing torch takes seconds on a small
    machine, and every sweep, gate side and tune command would pay them before its first world
    starts, for two strings. None where the file does not hold them as literals."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    found: dict[str, Any] = {}
    with contextlib.suppress(OSError, SyntaxError, ValueError):
        for node in ast.parse(Path(spec.origin).with_name("version.py").read_text()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant):
                found[target.id] = node.value.value
    version, cuda = found.get("__version__"), found.get("cuda")
    if not isinstance(version, str) or "cuda" not in found or not (cuda is None or isinstance(cuda, str)):
        return None
    return version, cuda


def fingerprint() -> dict[str, Any]:
    build = None if "torch" in sys.modules else _torch_build()
    if build is not None and build[1] is None:  # a CPU build of torch: no GPU, no NCCL to ask about
        torch_version, cuda, nccl = build[0], None, None
        gpus: dict[str, Any] = {"gpu_count": 0, "gpu_model": None, "gpu_driver": None}
    else:
        import torch

        torch_version, cuda, nccl = torch.__version__, torch.version.cuda, None
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                v = torch.cuda.nccl.version()
                nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        gpus = _gpus()
    return {
        "tpbench": tpbench.__version__,
        "git": _git_commit(),
        "torch": torch_version,
        "cuda": cuda,
        "nccl": nccl,
        **gpus,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def commit_text(env: dict[str, Any]) -> str:
    """The code a run measured, as every output shows it: ``0123456789`` (10 hex digits),
    ``+dirty`` when the tree had uncommitted changes, ``unknown`` outside a git checkout that tracks tpbench."""
    git = env.get("git") or {}
    return (git.get("commit") or "unknown")[:10] + ("+dirty" if git.get("dirty") else "")
