"""The tests own their harness: the fake tinker service and the trainer
runner are tests/support's (bench/ imports them from there), and no test
runs or imports a file under bench/, so editing a benchmark cannot fail the
suite."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BENCH_MODULES = {p.stem for p in (TESTS.parent / "bench").glob("*.py")}
# "bench" as a path component: bench/x.py, ../bench, a Path's / "bench".
BENCH_PATH = re.compile(r"(^|[/\\])bench([/\\]|$)")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def reaches_into_bench(path: Path) -> list[str]:
    """Where the file names bench/ in its code (not its docstrings) or
    imports one of bench's modules by its top-level name."""
    tree = ast.parse(path.read_text(), str(path))
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if BENCH_PATH.search(node.value):
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.relative_to(TESTS)}:{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] in BENCH_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in BENCH_MODULES:
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}: from {node.module} import ...")
    return found


def test_no_test_runs_or_imports_bench():
    assert BENCH_MODULES, "bench/ has no modules: the check would check nothing"
    others = [path for path in sorted(TESTS.rglob("*.py")) if path != Path(__file__).resolve()]  # not this check
    found = [hit for path in others for hit in reaches_into_bench(path)]
    assert not found, "tests reach into bench/ (move what they need to tests/support):\n" + "\n".join(found)


def test_the_readme_reads_in_two_minutes():
    """The README stays short (what, install, the one line, the report, three
    speed rows, where the rest is); details belong in docs/."""
    lines = (TESTS.parent / "README.md").read_text().splitlines()
    assert len(lines) <= 130, f"README.md has {len(lines)} lines"


def test_the_package_names_the_evsys_door_exports():
    # tinker_rl_data lists the evsys names it loads at first use (importing
    # the package imports nothing of the user's stack): the same list as the
    # door's own, each name reaching the door's object.
    import tinker_rl_data
    from tinker_rl_data.evsys import data_processing

    assert sorted(tinker_rl_data._EVSYS) == sorted(data_processing.__all__)
    assert all(getattr(tinker_rl_data, name) is getattr(data_processing, name) for name in data_processing.__all__)
