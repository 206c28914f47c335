"""The prepared GPU check on a machine without CUDA: it stops at its preflight, says why, exits 2.

(The check itself can only run on an NVIDIA GPU; ``REHEARSE=1`` runs it on CPU by hand.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for real")
def test_without_cuda_the_check_fails_fast_and_says_why(tmp_path: Path) -> None:
    env = os.environ | {"PY": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", "gpu/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "no CUDA device is visible" in done.stderr
    summary = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert summary["passed"] is False
    assert list(summary["parts"]) == ["preflight"]  # nothing else was started
    pre = summary["parts"]["preflight"]["result"]
    assert pre["cuda_available"] is False and "no CUDA device" in pre["error"]
    assert pre["packages"]["orjson"]["version"] and pre["packages"]["plotly"]["version"]
