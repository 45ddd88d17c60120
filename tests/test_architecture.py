"""The package's shape holds: no import circle among the fleet's modules (a circle closed by an
import deferred into a function counts; an import only type checkers read does not, since it never
runs); the engine's top level is its packages and its root modules; and the engine imports no Dagster."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("investigations", "assets", "resources", "sensors")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    return modules


def _imports(tree: ast.Module, modules: dict[str, Path]) -> Iterator[str]:
    """Every module `tree` imports when it runs (anywhere in it, deferred or not; first-party
    submodules by their own name)."""
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            yield from (name for name in submodules if name in modules)
            if any(name not in modules for name in submodules):
                yield node.module


def import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {owner(t) for t in _imports(ast.parse(path.read_text()), modules)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
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
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_the_fleet_imports_itself_in_a_circle() -> None:
    graph = import_graph()
    assert "investigations.sources.specs" in graph and "investigations.adapters" in graph["investigations.sources.specs"]
    assert circles(graph) == []


def test_the_engine_s_top_level_holds_its_packages_and_only_its_root_modules() -> None:
    top = sorted(path.stem for path in (ROOT / "investigations").glob("*.py"))
    assert top == ["__init__", "__main__", "cli", "composition", "config"]


def test_the_engine_imports_no_dagster() -> None:
    modules = _modules()
    engine = [name for name in modules if name.split(".")[0] == "investigations"]
    importing = sorted(name for name in engine if any(
        target.split(".")[0] == "dagster" for target in _imports(ast.parse(modules[name].read_text()), modules)))
    assert importing == []
