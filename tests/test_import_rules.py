"""The layering docs/architecture.md describes, checked two ways: import-linter's
contracts in pyproject.toml (router and workers never import each other, radix imports
no torch, aiohttp or asyncio, product code never imports the harness or the
benchmarks, the router's layers, the worker's layers), and here, over the whole import
graph, that no module and no package imports another in a loop."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import grimp
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("radix", "router", "workers", "harness", "bench")


def test_import_contracts_are_kept():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports)], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 kept, 0 broken" in result.stdout


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_loop_and_no_loop_in_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_no_module_imports_another_in_a_loop(graph):
    edges = {module: graph.find_modules_directly_imported_by(module)
             for module in graph.modules}
    assert cycles(edges) == []


def child_of(package: str, module: str) -> str | None:
    """The direct child of ``package`` that ``module`` is or lies in (None outside it)."""
    if not module.startswith(package + "."):
        return None
    return package + "." + module[len(package) + 1:].split(".")[0]


def test_no_package_imports_a_sibling_in_a_loop(graph):
    packages = sorted({m for m in graph.modules if graph.find_children(m)})
    loops = {}
    for package in packages:
        edges: dict[str, set[str]] = defaultdict(set)
        for module in graph.find_descendants(package):
            source = child_of(package, module)
            for imported in graph.find_modules_directly_imported_by(module):
                target = child_of(package, imported)
                if target is not None and target != source:
                    edges[source].add(target)
        if found := cycles(edges):
            loops[package] = found
    assert loops == {}
