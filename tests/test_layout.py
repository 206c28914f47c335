"""The shape of the code, so that it cannot slide back: the command line writes no file (the
library does, ``cli/`` parses, calls and prints) and few functions run past a screen."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "tpbench"

# Calls that write a file: the builtin and os-level open/write, a Path's writers, a DataFrame's,
# json/pickle dumps to a file, the store's writers (``atomic_write_*``, ``write_*``) and copies.
WRITING_NAMES = {"open", "write_text", "write_bytes", "to_parquet", "to_csv", "dump", "copyfile", "copy2", "copytree"}
WRITING_PREFIXES = ("atomic_write", "write_in_place")
# The store's module-level writers, called as ``store.write_...``.
STORE_WRITERS_PREFIX = "write_"

MAX_LINES = 80
MAX_LONG_FUNCTIONS = 2
# Argparse declarations: a list of options, long by nature and read as a table.
DECLARATIONS = {("cli/options.py", "build_parser")}


def file_writes(source: str) -> list[str]:
    """The calls in ``source`` that write a file, as ``line: name``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        if name == "open" and isinstance(func, ast.Attribute) and _is_class(func.value):
            continue  # ``store.Run.open(run_dir)``: a class's constructor, reading a run
        if (
            name in WRITING_NAMES
            or name.startswith(WRITING_PREFIXES)
            or (owner == "store" and name.startswith(STORE_WRITERS_PREFIX))
            or (owner == "os" and name == "write")
        ):
            found.append(f"{node.lineno}: {owner + '.' if owner else ''}{name}")
    return found


def _is_class(node: ast.expr) -> bool:
    """``Run`` or ``store.Run``: a name that is capitalised, as classes are here."""
    last = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return last[:1].isupper()


def long_functions(root: Path) -> list[tuple[int, str]]:
    """Functions (methods and nested ones included) longer than ``MAX_LINES`` lines, declarations aside."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES and (str(path.relative_to(root)), node.name) not in DECLARATIONS:
                    found.append((lines, f"{path.relative_to(root)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def test_the_cli_writes_no_file():
    """``cli/`` parses arguments, calls the library and prints; every file is the library's to write."""
    modules = sorted((PACKAGE / "cli").glob("*.py"))
    assert len(modules) > 1 and {m.name: file_writes(m.read_text()) for m in modules} == {m.name: [] for m in modules}


def test_the_write_finder_finds_writes():
    source = (
        "open(p, 'w')\nPath(p).write_text('x')\nstore.write_output(p, b'')\nstore.atomic_write_parquet(p, df)\n"
        "df.to_parquet(p)\nsys.stdout.write('fine')\nreport.write_report([d], p)\nos.write(fd, b'')\n"
        "store.Run.open(d)\nPath(p).open('w')\n"
    )
    assert [w.split(": ")[1] for w in file_writes(source)] == [
        "open",
        "write_text",
        "store.write_output",
        "store.atomic_write_parquet",
        "df.to_parquet",
        "os.write",
        "open",
    ]


def test_at_most_two_functions_run_past_80_lines():
    long = long_functions(PACKAGE)
    assert len(long) <= MAX_LONG_FUNCTIONS, "\n".join(f"{n} lines: {where}" for n, where in long)


def test_the_length_finder_counts_nested_functions(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def outer():\n    def inner():\n{body}\n    return inner\n")
    assert [name.rsplit(" ", 1)[1] for _, name in long_functions(tmp_path)] == ["outer", "inner"]
