"""The module graph: no import cycle among tpbench's modules, and the commands that only read
suites or results (validate, report, compare, gate) run without importing torch (seconds each)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tpbench.algorithms import ALGORITHMS

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "tpbench"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The tpbench modules a module imports, lazily or not, for its annotations too (``if
    TYPE_CHECKING``): a circle that only the type checker walks is still two modules that cannot be
    understood one without the other."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        stack.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    graph = {}
    for p in paths:
        name = _module_name(p)
        # A package's own __init__ importing its submodules is how a package is built, not a cycle.
        graph[name] = {
            m for m in _imports(ast.parse(p.read_text()), modules) if m != name and not m.startswith(name + ".")
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_tpbench_modules():
    assert cycles(import_graph()) == []


def _closure(graph: dict[str, set[str]], module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_dependency_rules():
    """analysis/ is pure functions over tables (no store, no links, no processes); hooks/ imports
    nothing of tpbench; only the worker builds trainings; report reaches no process machinery."""
    graph = import_graph()
    for module, deps in graph.items():
        if module.startswith("tpbench.analysis"):
            assert {d for d in deps if not d.startswith("tpbench.analysis")} <= {"tpbench", "tpbench.algorithms"}, (
                module
            )
        if module.startswith("tpbench.hooks"):
            assert all(d.startswith("tpbench.hooks") for d in deps), module
    assert [m for m, deps in graph.items() if "tpbench.training" in deps] == ["tpbench.worker"]
    machinery = (
        "tpbench.worker",
        "tpbench.launch",
        "tpbench.worlds",
        "tpbench.planted",
        "tpbench.guards",
        "tpbench.capture",
        "tpbench.training",
        "tpbench.sweep",
    )
    assert not {d for d in _closure(graph, "tpbench.report") if d.startswith(machinery)}


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_annotation_only_imports_count():
    """An import for annotations alone (``if TYPE_CHECKING``) is an edge of the graph too."""
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tpbench.suite import Case\n"
    assert _imports(ast.parse(code), {"tpbench.suite"}) == {"tpbench.suite"}


def _torch_imported(code: str) -> bool:
    """Whether running ``code`` in a fresh interpreter imported torch (``code`` must run to its end)."""
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print('torch imported:', 'torch' in sys.modules)"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("torch imported: ")]
    return line == "torch imported: True"


def _cli(argv: str) -> str:
    """Code that runs ``tpbench`` with ``argv`` (a Python expression) and goes on (``cli.main`` exits)."""
    return f"""
try:
    cli.main({argv})
except SystemExit as e:
    assert e.code in (0, None), e.code
"""


@pytest.mark.parametrize(
    "module", ["tpbench.report", "tpbench.gate", "tpbench.suite", "tpbench.sweep", "tpbench.algorithms", "tpbench.cli"]
)
def test_module_imports_without_torch(module):
    assert not _torch_imported(f"import {module}")


def test_torch_is_seen_when_imported():
    assert _torch_imported("import tpbench.training")


def test_a_rank_imports_zeros_optimizer_only_for_a_zero_case():
    """``torch.distributed.optim`` takes over a second to import, paid by every rank process at start:
    the worker and the reference hooks import it only where a ZeRO case builds one."""
    code = "import sys, tpbench.worker, tpbench.hooks; assert 'torch.distributed.optim' not in sys.modules"
    assert _torch_imported(code)


def test_validate_does_not_import_torch():
    assert not _torch_imported("from tpbench import cli" + _cli("['validate', 'suites/zero.toml']"))


def test_every_algorithm_has_a_builder_and_every_builtin_workload_its_params():
    from tpbench.training import BUILDERS
    from tpbench.workload_params import PARAMS
    from tpbench.workloads import WORKLOADS

    assert BUILDERS.keys() == ALGORITHMS.keys()
    assert WORKLOADS.keys() == PARAMS.keys()


def test_report_and_compare_of_finished_runs_do_not_import_torch(tmp_path):
    code = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(REPO / "tests")!r})
from synthetic_runs import make_run
from tpbench import cli
root = Path({str(tmp_path)!r})
a = make_run(root / "a", {{"ddp": [10.0, 10.1], "zero_no_overlap": [12.0, 12.2]}})
b = make_run(root / "b", {{"ddp": [10.0, 10.2], "zero_no_overlap": [12.1, 12.0]}}, seed=1)
from tpbench import store, sweep
sweep.finalize(store.Run.open(a))  # the summary a report reads
"""
    code += _cli(f"['report', str(a), '-o', {str(tmp_path / 'r.html')!r}]") + _cli("['compare', str(a), str(b)]")
    assert not _torch_imported(code)
    assert (tmp_path / "r.html").exists()
