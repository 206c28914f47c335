"""The same-job gate (``tpbench gate``): sweep baseline and candidate in this job, rounds interleaved.

``run_gate`` runs baseline and candidate in the same job, rounds interleaved, each side through
its own ``tpbench`` command in a subprocess (a Python environment, a source tree, or any command
prefix): that is how two versions of the code under test are measured side by side, and why this
module never imports the worker or the launcher.

The runs it leaves are judged by ``tpbench.compare`` (paired rounds) and written by ``tpbench.render``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from tpbench import store
from tpbench.compare import GateError


class SideError(RuntimeError):
    """A side's sweep failed or left no run behind, so there is nothing to compare: exit 3."""


@dataclass(frozen=True)
class Side:
    """How to run one side's ``tpbench``: a command prefix, extra environment, a working directory."""

    name: str
    spec: str
    kind: str  # "python", "venv", "source" or "command"
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


def resolve_side(name: str, spec: str, work_dir: Path) -> Side:
    """Interpret ``--baseline``/``--candidate``.

    A python executable or a venv directory runs ``python -m tpbench`` of that environment; a
    source tree (a directory with pyproject.toml) runs this interpreter with the tree first on
    PYTHONPATH. Both run in ``work_dir``, never in the caller's directory: ``python -m`` puts the
    working directory first on sys.path, and a checkout there would shadow the side's own code
    (a source tree runs in its own root for the same reason). Anything else is a command prefix
    such as ``"uv run tpbench"``.
    """
    path = Path(spec).expanduser()
    if path.is_file() and os.access(path, os.X_OK):
        return Side(name, spec, "python", (str(path.absolute()), "-m", "tpbench"), cwd=work_dir)
    if path.is_dir() and (path / "pyvenv.cfg").exists():
        python = path / "bin" / "python"
        if not python.exists():
            raise GateError(f"--{name} {spec}: a virtual environment without bin/python")
        return Side(name, spec, "venv", (str(python.absolute()), "-m", "tpbench"), cwd=work_dir)
    if path.is_dir() and (path / "pyproject.toml").exists():
        if not (path / "tpbench" / "__init__.py").exists():
            raise GateError(f"--{name} {spec}: a source tree without a tpbench package")
        tree = str(path.resolve())
        pythonpath = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH", "")) if p)
        return Side(name, spec, "source", (sys.executable, "-m", "tpbench"), {"PYTHONPATH": pythonpath}, cwd=Path(tree))
    if path.exists():
        raise GateError(
            f"--{name} {spec}: expected a python executable, a venv, a source tree with pyproject.toml, or a command"
        )
    argv = tuple(shlex.split(spec))
    if not argv or shutil.which(argv[0]) is None:
        raise GateError(f"--{name} {spec}: no such file, directory or command")
    return Side(name, spec, "command", argv)


@dataclass(frozen=True)
class GateRun:
    """The run directories a gate produced, per side, in round order."""

    out: Path
    baseline: list[Path]
    candidate: list[Path]


def sweep_command(side: Side, suite: Path, out: Path, overrides: Sequence[str], filters: Sequence[str]) -> list[str]:
    return [
        *side.argv,
        "sweep",
        str(suite),
        "--no-report",
        "--out",
        str(out),
        *(a for o in overrides for a in ("--set", o)),
        *(a for f in filters for a in ("--filter", f)),
    ]


def run_gate(
    suite: str | Path,
    baseline: Side,
    candidate: Side,
    out: Path,
    *,
    rounds: int = 3,
    overrides: Sequence[str] = (),
    filters: Sequence[str] = (),
    candidate_overrides: Sequence[str] = (),
    announce: Callable[[str], None] = lambda line: None,
) -> GateRun:
    """Sweep the suite with both sides in this job, alternating, ``rounds`` times each.

    The order alternates between rounds (AB BA AB …): machine drift that is linear in time then
    falls on both sides equally instead of always on the one that goes second. Each sweep's
    output goes to stderr so that stdout stays clean for the table. ``candidate_overrides`` are
    ``--set`` values for the candidate only (e.g. ``slowdown_pct=10`` to check the gate itself).
    ``announce`` is given a line before each sweep (the CLI writes it to stderr).
    """
    if rounds < 1:
        raise GateError(f"--rounds {rounds}: expected at least 1")
    suite = Path(suite).absolute()
    if not suite.is_file():
        raise GateError(f"{suite}: no such suite file")
    out = Path(out).absolute()
    runs: dict[str, list[Path]] = {"baseline": [], "candidate": []}
    for r in range(rounds):
        for side in (baseline, candidate) if r % 2 == 0 else (candidate, baseline):
            root = out / side.name / f"round{r + 1:02d}"
            root.mkdir(parents=True, exist_ok=True)
            extra = list(candidate_overrides) if side is candidate else []
            cmd = sweep_command(side, suite, root, [*overrides, *extra], filters)
            announce(f"tpbench gate: round {r + 1}/{rounds}, {side.name}: {shlex.join(cmd)}")
            proc = subprocess.run(
                cmd, env=os.environ | side.env, cwd=side.cwd, stdout=sys.stderr.fileno(), stdin=subprocess.DEVNULL
            )
            found = list(store.iter_runs(root))
            # Exit 1 means some case failed: the run still exists and the comparison reports the case.
            if proc.returncode not in (0, 1) or len(found) != 1:
                raise SideError(
                    f"{side.name} ({side.spec}), round {r + 1}: `{shlex.join(cmd)}` exited with {proc.returncode}"
                    f" and left {len(found)} run(s) in {root}; its output is above"
                )
            runs[side.name].append(found[0])
    return GateRun(out, runs["baseline"], runs["candidate"])
