"""The package's layers: no module imports from a layer above its own, and no import cycles.

Every ``prorag`` import of every module counts, including imports inside functions and under
``TYPE_CHECKING``: a lazy import from a higher layer is still a dependency on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "prorag"

#: Lowest first. A module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("prorag", "prorag.core"),  # the package root (version, env setup) and foundations
    ("prorag.data",),
    ("prorag.retrieval",),
    ("prorag.agent",),
    ("prorag.models",),
    ("prorag.method",),
    ("prorag.supervision",),
    ("prorag.evaluation",),
    ("prorag.stages",),
    ("prorag.experiments",),
    ("prorag.cli",),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, rank = len(name), i
    return rank


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "prorag")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "prorag":
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # `from prorag.x import submodule`
    return out


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = {m for m in imports_of(path) if m in modules and m != name}
    return edges


def test_every_module_has_a_layer():
    assert [m for m in graph() if layer_of(m) < 0] == []


def test_no_import_from_a_higher_layer():
    upward = [
        f"{mod} (layer {layer_of(mod)}) imports {dep} (layer {layer_of(dep)})"
        for mod, deps in sorted(graph().items())
        for dep in sorted(deps)
        if layer_of(dep) > layer_of(mod)
    ]
    assert upward == []


def test_no_import_cycles():
    edges = graph()
    # Package __init__ modules are where their submodules are imported from, not a dependency on
    # the submodules' content: leave the edge module -> its own package out of the cycle check.
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges[node]):
            if node.startswith(dep + "."):
                continue
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert cycles == []


@pytest.mark.parametrize("module,expected", [("prorag.core.config", 0), ("prorag.stages.rl", 8), ("prorag.cli", 10)])
def test_layer_of(module, expected):
    assert layer_of(module) == expected
