"""Features declare themselves: the docs' tables, the switches and the
package's imports are derived from (or checked against) the declarations;
``tinker-rl-data check``; a report keyed by piece; probes that keep what
was raised.

The tables: ``features.piece_table()`` / ``features.switch_table()`` print
them (``python -c "import tinker_rl_data.cookbook; from tinker_rl_data
import features; print(features.piece_table())"``: the cookbook package
imports every feature's module); :data:`DOCS` are the files checked."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import functools
import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import cookbook_unavailable

try:
    import tinker_cookbook  # noqa: F401
    import torch  # noqa: F401
except ImportError as exc:
    cookbook_unavailable(exc)

import tinker_rl_data
from tinker_rl_data import switches
from tinker_rl_data import features
from tinker_rl_data.cookbook import kl
from tinker_rl_data.patch import transaction
from tinker_rl_data.patch.feature import Feature
from tinker_rl_data.patch.piece import Piece, check, outcome, same_outcome
from tinker_rl_data.patch.report import IN

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "tinker_rl_data"
#: Where the tables are (the README's may move: every file here is checked).
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def tables(text: str, header: str) -> list[list[str]]:
    """The rows of every markdown table of ``text`` under ``header``."""
    found, rows = [], None
    for line in text.splitlines():
        if line.strip() == header:
            rows = []
            found.append(rows)
        elif rows is not None and line.startswith("|"):
            if not line.startswith("| ---"):
                rows.append(line)
        else:
            rows = None
    return found


def piece_rows(rows: list[str]) -> set[tuple[str, ...]]:
    """(module, name, feature, on/off) of each row."""
    cells = [[c.strip().strip("`") for c in row.strip("|").split("|")] for row in rows]
    return {(module, name, feature, default.split()[0]) for module, name, feature, default in cells}


def switch_names(rows: list[str]) -> set[str]:
    """Each switch a row names: ``install(x)``, ``--flag``, ``VARIABLE``."""
    names = set()
    for row in rows:
        for token in re.findall(r"`([^`]+)`", row.strip("|").split("|")[0]):
            name = token.partition("=")[0]
            names.add(f"{name})" if name.startswith("install(") else name)
    return names


def test_the_docs_tables_are_the_declarations():
    pieces = piece_rows(features.piece_table().splitlines()[2:])
    switch_set = switch_names(features.switch_table().splitlines()[2:])
    assert len(pieces) == sum(len(f.pieces) for f in features.declared())
    usage = (ROOT / "docs" / "usage.md").read_text()
    assert features.piece_table() in usage and features.switch_table() in usage
    for path in DOCS:
        text = path.read_text()
        for rows in tables(text, "| module | name | feature | default |"):
            assert piece_rows(rows) == pieces, path
        for rows in tables(text, "| switch | default | what it does |"):
            assert switch_names(rows) == switch_set, path


def test_the_switches_table_names_every_option_flag_and_variable():
    names = switch_names(features.switch_table().splitlines()[2:])
    assert {f"install({name})" for name in features.options()} | {"install(strict)"} <= names
    assert {f.flag for f in features.declared() if f.switch} | {"--strict"} <= names
    assert {v.name for v in switches.VARIABLES} <= names
    assert {"--no-wire", "--no-kl", "--no-gc", "--coalesce", "--strict"} <= names


def _environ_reads(tree: ast.AST) -> list[int]:
    """Lines reading ``os.environ`` (get, items, keys, values, a subscript) or calling ``os.getenv``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "getenv":
            lines.append(node.lineno)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "environ":
            if node.attr in ("get", "items", "keys", "values", "copy"):
                lines.append(node.lineno)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "environ":
            if isinstance(node.ctx, ast.Load):
                lines.append(node.lineno)
    return lines


def test_every_environment_variable_is_in_switches_and_read_there():
    named = set()
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "rust").rglob("*.rs")]:
        named |= set(re.findall(r"TINKER_RL_DATA_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert named == {v.name for v in switches.VARIABLES}
    for variable in switches.VARIABLES:
        if variable.read_by.startswith("the core"):  # documented where the core reads it
            assert any(variable.name in p.read_text() for p in (ROOT / "rust").rglob("*.rs")), variable
    readers = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := _environ_reads(ast.parse(path.read_text())))
    }
    assert list(readers) == ["switches.py"], readers


# --------------------------------------------------------------------------
# The imports


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports,
    anywhere in it (functions included). ``from a import b``: the module
    ``a.b`` where it is one, else ``a`` (the native ``_core`` is one, a leaf)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = {*paths, "tinker_rl_data._core"}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in known}
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    edges.add(target if target in known else source)
        edges &= set(paths)
        edges.discard(name)
    return graph


def entered(graph: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """The imports that ``graph`` leaves implicit: importing a module runs
    the ``__init__`` of each package it is in first, so a module importing
    ``a.b.c`` from outside the package ``a.b`` imports ``a.b`` too. Each
    such (importer, package) -> the module whose import runs it (the first
    by name). A package's own modules, and its ``__init__`` importing them,
    enter it from inside (it runs already): no edge. So the top package
    ``tinker_rl_data`` gets none (every module is inside it): its
    ``__init__`` importing its descendants (``install()`` the cookbook's
    modules, for every feature's line) is no loop."""
    found: dict[tuple[str, str], str] = {}
    for importer, targets in graph.items():
        for target in sorted(targets):
            parts = target.split(".")
            for n in range(2, len(parts)):
                package = ".".join(parts[:n])
                if package in graph and importer != package and not importer.startswith(package + "."):
                    found.setdefault((importer, package), target)
    return found


def assert_acyclic(graph: dict[str, set[str]], via: dict[tuple[str, str], str] | None = None) -> None:
    """Fails naming the first loop found (depth first, in name order);
    an edge of ``via`` (:func:`entered`) is shown as the import that makes it."""
    state: dict[str, int] = {}
    via = via or {}

    def shown(path: list[str]) -> str:
        steps = [path[0]]
        for a, b in zip(path, path[1:]):
            steps.append(f"{via[a, b]} (whose package {b} runs first)" if (a, b) in via and b not in graph[a] else b)
        return " -> ".join(steps)

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node] | {p for (a, p) in via if a == node}):
            assert state.get(target) != 1, shown([*path[path.index(target) :], target])
            if target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_no_import_cycle_among_the_package_modules():
    """No loop of imports, lazy ones (inside a function) included, and
    counting the package ``__init__`` each import runs first
    (:func:`entered`): a feature module imports the list of features
    (:mod:`tinker_rl_data.features`, registering its declaration there),
    never the other way, and the cookbook package imports every feature's
    module. The top package's ``__init__`` may import its descendants (the
    one exception: no import enters it from outside)."""
    graph = import_graph()
    via = entered(graph)
    assert "tinker_rl_data.features" in graph["tinker_rl_data.cookbook"]  # (the graph was read)
    assert ("tinker_rl_data.evsys.data_processing", "tinker_rl_data.rows") not in via  # (a top-level module: no package)
    assert ("tinker_rl_data", "tinker_rl_data.cookbook") not in via
    assert_acyclic(graph, via)


def test_each_feature_module_registers_its_declaration():
    """Feature module -> features, one way: ``features`` imports no feature
    module; each registers its ``FEATURE`` there, and the list is whole
    once ``tinker_rl_data.cookbook`` (which imports them all) is imported."""
    graph = import_graph()
    holders = {_module_name(p) for p in PACKAGE.rglob("*.py") if re.search(r"^FEATURE = features\.register\(\s*__name__,", p.read_text(), re.M)}
    assert len(holders) == len(features.ORDER) and all("tinker_rl_data.features" in graph[m] for m in holders)
    assert not {t for t in graph["tinker_rl_data.features"] if t.startswith(("tinker_rl_data.tinker", "tinker_rl_data.cookbook"))}
    assert [f.name for f in features.declared()] == list(features.ORDER)
    assert {sys.modules[m].FEATURE.name for m in holders} == set(features.ORDER)
    code = (
        "import tinker_rl_data.features as f, tinker_rl_data.tinker.request_bytes\n"
        "try:\n    f.declared()\nexcept LookupError as e:\n    print(e)\n"
        "import tinker_rl_data.cookbook\n"
        "print(len(f.declared()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    missing, whole = done.stdout.splitlines()
    assert "no declaration of transport, data, step, kl, gc, coalesce, workers" in missing and "import it first" in missing
    assert whole == str(len(features.ORDER))


def test_a_feature_registers_once_and_in_the_order():
    with pytest.raises(ValueError, match="not in tinker_rl_data.features.ORDER"):
        features.register("elsewhere", Feature("unlisted", "a feature of no line", ()))
    with pytest.raises(ValueError, match="declared by both tinker_rl_data.cookbook.kl and elsewhere"):
        features.register("elsewhere", Feature("kl", "a second kl", ()))
    assert features.register(kl.__name__, kl.FEATURE) is kl.FEATURE  # (its own module again: a reload)


def test_no_import_cycle_among_the_subpackages():
    """Importing a module runs its package's ``__init__`` first, so the
    subpackages (tinker/, cookbook/, patch/, evsys/) must not import each
    other in a loop either, lazily or not: the registry of every feature,
    where both tinker's and the cookbook's modules register theirs, is at
    the package's level (``tinker_rl_data.features``), not in one of them."""
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert {"tinker", "cookbook", "patch", "evsys"} <= subpackages

    def subpackage(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in subpackages) else None

    edges: dict[str, set[str]] = {name: set() for name in subpackages}
    for module, targets in import_graph().items():
        for target in targets:
            a, b = subpackage(module), subpackage(target)
            if a and b and a != b:
                edges[a].add(b)
    assert_acyclic(edges)
    assert edges["cookbook"] >= {"patch"} and edges["tinker"] >= {"patch"}  # (the graph was read)


def test_the_patch_layer_imports_no_feature():
    patch = {m: targets for m, targets in import_graph().items() if m.startswith("tinker_rl_data.patch")}
    allowed = ("tinker_rl_data.patch", "tinker_rl_data.errors", "tinker_rl_data.switches", "tinker_rl_data.rows")
    assert {m: sorted(t for t in targets if not t.startswith(allowed)) for m, targets in patch.items()} == {m: [] for m in patch}


# --------------------------------------------------------------------------
# tinker-rl-data check


def namespaces() -> dict[str, dict[str, int]]:
    return {
        name: {k: id(v) for k, v in vars(m).items()}
        for name, m in list(sys.modules.items())
        if m is not None and name.split(".")[0] in ("tinker", "tinker_cookbook", "signal")
    }


def test_check_runs_the_probes_and_installs_nothing():
    done = subprocess.run([sys.executable, "-m", "tinker_rl_data", "check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^  data +on, 4 of 4 ", done.stdout, re.M) and "  in    compute_advantages" in done.stdout
    assert re.search(r"^  coalesce +opt-in, not asked", done.stdout, re.M)
    code = (
        "import sys, tinker_rl_data.__main__ as m, tinker_rl_data\n"
        "from tinker_cookbook.rl import data_processing as d\n"
        "before = d.compute_advantages\n"
        "status = m.main(['check', '--no-kl'])\n"
        "assert d.compute_advantages is before and not tinker_rl_data.status().installed\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^  kl +off \(not asked\)", done.stdout, re.M)


def test_check_exits_1_when_a_default_piece_stays_out(monkeypatch, capsys):
    from tinker_rl_data import __main__ as launcher
    from tinker_rl_data.cookbook import data_processing

    def failing(original, ours):
        check(False, "made to fail")

    feature = data_processing.FEATURE
    monkeypatch.setattr(
        data_processing,
        "FEATURE",
        dataclasses.replace(feature, pieces=tuple(dataclasses.replace(p, probe=failing) for p in feature.pieces[:1]) + feature.pieces[1:]),
    )
    for f in features.declared():  # (as install() would: loaded before the snapshot)
        for piece in f.pieces:
            importlib.import_module(piece.module)
    before = namespaces()
    assert launcher.main(["check"]) == 1
    out = capsys.readouterr().out
    assert "compute_advantages: probe failed: made to fail" in out and re.search(r"^  data +partly on, 3 of 4", out, re.M)
    after = namespaces()  # (modules the probes imported add names; none of those before changes)
    assert {m: {k: after[m][k] for k in names} for m, names in before.items()} == before
    assert not transaction.installed()


# --------------------------------------------------------------------------
# The report, keyed by piece; probes that keep what was raised


def _probe_same(original, ours):
    for args in (([1, "a"],), ({"b": 2},)):
        theirs, mine = outcome(original, *args), outcome(ours, *args)
        if same_outcome(theirs, mine, f"args {args}"):
            check(theirs[1] == mine[1], f"args {args}: other result")


def _wrapped(original):
    return functools.wraps(original)(lambda *args, **kwargs: original(*args, **kwargs))


def test_two_pieces_with_one_label_are_two_entries():
    pieces = tuple(Piece("json", name, "twins", _wrapped, _probe_same, label="json text", spread=False) for name in ("dumps", "loads"))
    twins = Feature("twins", "two pieces, one label", pieces)
    dumps, loads = json.dumps, json.loads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = transaction.install([twins], ["twins"], owner="test")
    try:
        assert [title for title, _ in report.installed] == ["json text", "json text"]
        assert re.search(r"^  twins +on, 2 of 2 ", str(report), re.M), str(report)
        assert json.dumps is not dumps and json.loads is not loads
    finally:
        transaction.uninstall(owner="test")
    assert json.dumps is dumps and json.loads is loads


def test_a_kl_probe_in_a_running_loop_keeps_what_was_raised(monkeypatch):
    def down(self, *args, **kwargs):
        raise ConnectionError("the probe client is down")

    monkeypatch.setattr(kl._ProbeClient, "sample", down)
    monkeypatch.setattr(kl._ProbeClient, "compute_logprobs", down)
    kl_only = [f for f in features.declared() if f.name == "kl"]

    async def from_a_loop():
        return transaction.probe(kl_only, ["kl"])

    report = asyncio.run(from_a_loop())
    left = dict(report.left)
    assert "the probe client is down" in left["incorporate_kl_penalty"], left
    assert "ConnectionError" in left["compute_post_kl"], left
    assert all(e.state != IN for e in report.entries.values() if "kl_penalty" in e.title or e.title == "compute_post_kl")
    assert tinker_rl_data.status().installed == []


def test_a_warning_points_at_the_line_that_called_install(monkeypatch):
    # (transaction.install is split by phase: its warnings still name the caller's line)
    from tinker_rl_data import cookbook
    from tinker_rl_data.cookbook import data_processing

    def failing(original, ours):
        check(False, "made to fail")

    feature = data_processing.FEATURE
    monkeypatch.setattr(data_processing, "FEATURE", dataclasses.replace(feature, pieces=(dataclasses.replace(feature.pieces[0], probe=failing),)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cookbook.install(kl=False, gc=False)
    cookbook.uninstall()
    ours = [w for w in caught if issubclass(w.category, tinker_rl_data.InstallWarning)]
    assert [Path(w.filename).name for w in ours] == [Path(__file__).name], [(w.filename, str(w.message)) for w in ours]
