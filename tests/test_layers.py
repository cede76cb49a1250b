"""The package's shape: every import in launcher/ (inside functions and TYPE_CHECKING blocks too) points down the
stages, no two files import each other through any path, and modules and functions stay small enough to read.

Stages, lowest first (docs/architecture.md): the small utilities and settings/data < inspection < measure < plan <
config < job < rank, views < cli. A module may import its own stage and those below it, with one exception: the plan
never imports measure/ (it takes measured rates and pass times as plain data; job/measuring.py is the one place that
needs both sides)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE = REPO / "launcher"
# Top-level modules of launcher/ that are small utilities (the bottom stage, with settings and data/); bench.py and
# __main__.py are entry points (the CLI's stage).
UTILITIES = {
    "errors",
    "units",
    "files",
    "textfiles",
    "resources",
    "stops",
    "drills",
    "deepspeed_logging",
    "cpuinfo_once",
    "settings",
    "recipes",
}
ENTRY_POINTS = {"bench", "__main__", "cli"}
STAGES = {"data": 0, "inspection": 1, "measure": 2, "plan": 3, "config": 4, "job": 5, "rank": 6, "views": 6, "cli": 7}
NEVER = {("plan", "measure"), ("config", "measure")}  # allowed by the order, refused by the design
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
LARGER_MODULES = {"launcher.settings"}  # the declaration table: one Settings field per option, and their rules


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def stage(module: str) -> tuple[str, int]:
    """(stage name, rank) of a launcher module."""
    if module == "launcher":  # the package's __init__
        return "utilities", 0
    top = module.split(".")[1]
    if top in STAGES:
        return top, STAGES[top]
    if top in UTILITIES:
        return "utilities", 0
    assert top in ENTRY_POINTS, f"{module}: a new top-level module; add it to a stage in tests/test_layers.py"
    return "cli", STAGES["cli"]


def _target(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str) -> set[str]:
    """The launcher modules `module` imports anywhere in its file (a `from X import name` of a submodule counts as
    that submodule)."""
    found = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _target(module, node)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for name in names:
            while name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in MODULES and name != module and name.startswith("launcher"):
                found.add(name)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def test_every_import_points_down_the_stages():
    climbs = []
    for module, targets in GRAPH.items():
        (here, rank) = stage(module)
        for target in sorted(targets):
            (there, target_rank) = stage(target)
            if target_rank > rank or (here, there) in NEVER:
                climbs.append(f"{module} ({here}) imports {target} ({there})")
    assert climbs == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(set(MODULES) - LARGER_MODULES))
def test_modules_are_small_and_say_what_they_hold(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines"
    docstring = ast.get_docstring(TREES[module])
    assert docstring or MODULES[module].name == "__init__.py", f"{module}: no docstring naming its one concept"


def test_functions_are_short():
    long = [
        f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for module, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []
