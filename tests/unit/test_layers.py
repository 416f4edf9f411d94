"""Every import between top-level packages points down (ARCHITECTURE.md):

    schemas <- base <- model <- router, workers <- planner <- infra

``router`` and ``workers`` sit side by side and never import each other; no package imports one
above it, so none imports the command line (``infra``). Function-level imports count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# what each package may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "base": {"schemas"},
    "model": {"schemas", "base"},
    "router": {"schemas", "base", "model"},
    "workers": {"schemas", "base", "model"},
    "planner": {"schemas", "base", "model", "router", "workers"},
    "infra": {"schemas", "base", "model", "router", "workers", "planner"},
}


def imported_packages(path: Path) -> set[tuple[int, str]]:
    """(line, top-level package) of every first-party import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in ALLOWED:
                found.add((node.lineno, top))
    return found


def violations(package: str) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, top in sorted(imported_packages(path)):
            if top != package and top not in ALLOWED[package]:
                out.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_down(package: str) -> None:
    assert violations(package) == []


def test_the_rule_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from infra.cli import main\n    import router.client\n")
    assert imported_packages(bad) == {(2, "infra"), (3, "router")}


def test_every_top_level_package_is_placed() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - {"tests"} == set(ALLOWED)


def module_imports(package: Path, prefix: str) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of the same package it imports (any import,
    ``TYPE_CHECKING`` ones too: a circle hidden behind one is still a circle to a reader)."""
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith(prefix + "."):
                    deps.add(node.module.removeprefix(prefix + "."))
                elif node.module == prefix:
                    deps |= {a.name for a in node.names}
        graph[path.stem] = deps - {path.stem}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (one path around each strongly connected group)."""
    found: list[list[str]] = []
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        for dep in sorted(graph.get(node, ())):
            if dep in path:
                found.append([*path[path.index(dep) :], dep])
            elif dep not in done:
                walk(dep, [*path, dep])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            walk(start, [start])
    return found


def test_no_import_circle_inside_the_frontend() -> None:
    graph = module_imports(ROOT / "router" / "frontend", "router.frontend")
    assert len(graph) > 20
    assert circles(graph) == []


def test_the_circle_rule_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
