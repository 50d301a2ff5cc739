"""The package's layers: no module imports from a layer above its own, and no import cycles.

Every ``prorag`` import of every module counts, including imports inside functions and under
``TYPE_CHECKING``: a lazy import from a higher layer is still a dependency on it. So does every
module a registry names in its ``builtins`` (imported by name on its first look-up).
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


# ----------------------------------------------------------------------------- registries' module lists


def registry_builtins(source: str) -> list[str]:
    """The module names written literally in every ``Registry(..., builtins=(...))`` call in
    ``source`` (the second positional argument or the keyword). A list computed at run time (the
    data formats' own sub-modules) is not here: :func:`runtime_upward_builtins` checks those."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Registry"):
            continue
        given = [k.value for k in node.keywords if k.arg == "builtins"] + node.args[1:2]
        for value in given:
            items = value.elts if isinstance(value, ast.Tuple | ast.List) else [value]
            out.extend(item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str))
    return out


def upward_names(module: str, names: list[str]) -> list[str]:
    """Those of ``names`` (a registry's builtins, defined in ``module``) that lie in a higher layer
    than ``module``: an import by name that the import graph does not see."""
    return [
        f"{module} (layer {layer_of(module)}) names {name} (layer {layer_of(name)}) in a registry's builtins"
        for name in names
        if layer_of(name) > layer_of(module)
    ]


def upward_builtins(module: str, source: str) -> list[str]:
    """:func:`upward_names` of the builtins written literally in ``module``'s ``source``."""
    return upward_names(module, registry_builtins(source))


def runtime_upward_builtins(module: str) -> list[str]:
    """Imports ``module`` and checks the builtins of every registry it defines, as the registry
    holds them (literal or computed)."""
    import importlib

    from prorag.core.registry import Registry

    mod = importlib.import_module(module)
    registries = [v for v in vars(mod).values() if isinstance(v, Registry)]
    return [line for r in registries for line in upward_names(module, list(r._builtins))]


def test_no_registry_names_a_module_of_a_higher_layer():
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    found = [(m, registry_builtins(p.read_text(encoding="utf-8"))) for m, p in sorted(modules.items())]
    assert [f"{m}: {name}" for m, names in found for name in names if name not in modules] == []  # no stale name
    assert [line for m, p in sorted(modules.items()) for line in upward_builtins(m, p.read_text(encoding="utf-8"))] == []
    assert any(names for _, names in found), "no registry with builtins found: the check would pass vacuously"
    defining = [
        m for m, p in sorted(modules.items()) if "Registry(" in p.read_text(encoding="utf-8") and m != "prorag.core.registry"
    ]
    assert len(defining) >= 5, defining
    assert [line for m in defining for line in runtime_upward_builtins(m)] == []


def test_the_registry_check_catches_an_upward_module_list():
    bad = (
        "from prorag.core.registry import Registry\n"
        "SOURCES = Registry('step reward source', builtins=('prorag.method.rewards.cpsearch', 'prorag.supervision.step_rewards'))\n"
        "KINDS = registry.Registry('kind', ('prorag.stages.rl',))\n"
    )
    assert registry_builtins(bad) == ["prorag.method.rewards.cpsearch", "prorag.supervision.step_rewards", "prorag.stages.rl"]
    assert upward_builtins("prorag.method.rewards.sources", bad) == [
        "prorag.method.rewards.sources (layer 5) names prorag.supervision.step_rewards (layer 6) in a registry's builtins",
        "prorag.method.rewards.sources (layer 5) names prorag.stages.rl (layer 8) in a registry's builtins",
    ]
    assert upward_builtins("prorag.stages.fake", bad) == []
    assert registry_builtins("R = Registry('x', builtins=MODULES)") == []  # computed: checked at run time


def test_the_runtime_registry_check_catches_a_computed_upward_list(monkeypatch):
    import types

    from prorag.core.registry import Registry

    fake = types.ModuleType("prorag.data.fake_formats")
    fake.FORMATS = Registry("format", builtins=tuple(f"prorag.{m}.x" for m in ("data", "stages")))
    monkeypatch.setitem(__import__("sys").modules, "prorag.data.fake_formats", fake)
    assert runtime_upward_builtins("prorag.data.fake_formats") == [
        "prorag.data.fake_formats (layer 1) names prorag.stages.x (layer 8) in a registry's builtins"
    ]
