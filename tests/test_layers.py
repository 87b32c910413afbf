"""The package's import graph keeps its layers: nothing imports up a layer, and no modules import each other.

Layers, lowest first (a module may import its own layer and the ones below it):

0. core: ``rl_llm.types``, ``rl_llm.paths``, ``rl_llm.console``, ``rl_llm.checks``, ``rl_llm.export``, ``rl_llm.errors`` (``CORE``): plain helpers everything may use.
1. ``rl_llm.sandboxes``
2. ``rl_llm.envs``, and the package root ``rl_llm`` (its ``__init__`` only registers the environments)
3. ``rl_llm.agents``
4. ``rl_llm.trainers``, and beside it ``rl_llm.integrations`` (envs inside other trainers and hubs); neither imports
   the other, except the deprecated aliases in ``rl_llm.trainers.adapters``
5. tools on top: ``rl_llm.cli``, ``rl_llm.doctor``, ``rl_llm.view`` (``TOOLS``)

Every import counts (module level, in functions, absolute and relative) except those under
``if TYPE_CHECKING:``, which never run. Cycles are looked for among module-level imports only (lazy imports in
functions run after both modules exist). A new ``rl_llm/*.py`` module must be placed in ``CORE`` or ``TOOLS``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: pyproject.toml's package-dir: each top-level folder is installed as a subpackage of rl_llm.
PACKAGE_DIRS = {"rl_llm": "rl_llm", "rl_llm.envs": "envs", "rl_llm.agents": "agents", "rl_llm.trainers": "trainers",
                "rl_llm.sandboxes": "sandboxes", "rl_llm.integrations": "integrations"}  # fmt: skip
CORE = {"rl_llm.types", "rl_llm.paths", "rl_llm.console", "rl_llm.checks", "rl_llm.export", "rl_llm.errors", "rl_llm.urls"}
TOOLS = {"rl_llm.cli", "rl_llm.doctor", "rl_llm.view"}
LAYERS = {"rl_llm.sandboxes": 1, "rl_llm.envs": 2, "rl_llm": 2, "rl_llm.agents": 3, "rl_llm.trainers": 4,
          "rl_llm.integrations": 4}  # fmt: skip
#: The deprecated import paths of the integrations (they moved out of trainers/); the only trainer modules
#: allowed to import ``rl_llm.integrations``.
MOVED_ALIASES = "rl_llm.trainers.adapters"
LAYER_NAMES = {0: "core", 1: "sandboxes", 2: "envs", 3: "agents", 4: "trainers", 5: "tools"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module of this package (the deepest one that exists)
    path: Path
    line: int
    module_level: bool

    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if not any(part.startswith(".") or part == "__pycache__" for part in parts):
                found[".".join((package, *parts)).removesuffix(".__init__")] = path
    return found


def layer(module: str) -> int:
    if module in CORE:
        return 0
    if module in TOOLS:
        return 5
    for package, level in sorted(LAYERS.items(), key=lambda item: -len(item[0])):
        if module == package or module.startswith(package + "."):
            if package == "rl_llm" and module != "rl_llm":
                raise AssertionError(f"{module} is in no layer: place it in CORE or TOOLS (this file)")
            return level
    raise AssertionError(f"{module} is in no layer")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")  # fmt: skip


def imports_of(name: str, path: Path, known: set[str]) -> list[Import]:
    """The package-internal imports of one module, TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def add(target: str | None, node: ast.stmt, module_level: bool) -> None:
        if target is not None and target != name:
            found.append(Import(name, target, path, node.lineno, module_level))

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:  # the else branch runs
                    visit_stmt(stmt, module_level)
                continue
            visit_stmt(child, module_level)

    def visit_stmt(child: ast.AST, module_level: bool) -> None:
        if isinstance(child, ast.Import):
            for alias in child.names:
                if alias.name == "rl_llm" or alias.name.startswith("rl_llm."):
                    add(resolve(alias.name), child, module_level)
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                base = name if is_package else name.rpartition(".")[0]
                for _ in range(child.level - 1):
                    base = base.rpartition(".")[0]
                module = f"{base}.{child.module}" if child.module else base
            else:
                module = child.module or ""
            if module == "rl_llm" or module.startswith("rl_llm."):
                for alias in child.names:  # `from pkg import submodule` imports the submodule
                    add(resolve(f"{module}.{alias.name}"), child, module_level)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            visit(child, False)
        else:
            visit(child, module_level)

    visit(tree, True)
    return found


def import_graph() -> list[Import]:
    known = modules()
    return [edge for name, path in known.items() for edge in imports_of(name, path, set(known))]


def test_the_package_dirs_match_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["setuptools"]["package-dir"] == PACKAGE_DIRS


def test_the_graph_sees_the_whole_package() -> None:
    known = modules()
    assert {"rl_llm", "rl_llm.types", "rl_llm.sandboxes.base", "rl_llm.envs.base", "rl_llm.agents.llm",
            "rl_llm.trainers.runner"} <= set(known)  # fmt: skip
    edges = {(e.source, e.target): e for e in import_graph()}
    assert edges["rl_llm.trainers.async_rollouts", "rl_llm.agents.rollout"].module_level
    assert not edges["rl_llm.trainers.generation", "rl_llm.agents.hf"].module_level  # a lazy import counts
    assert ("rl_llm.trainers.sync", "rl_llm.agents.llm") not in edges  # under TYPE_CHECKING: it never runs
    for name in known:  # every module sits in a layer
        layer(name)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{edge.where()}: {edge.source} ({LAYER_NAMES[layer(edge.source)]}) imports {edge.target} "
        f"({LAYER_NAMES[layer(edge.target)]})"
        for edge in import_graph()
        if layer(edge.target) > layer(edge.source)
    ]
    assert not upward, "imports up a layer (sandboxes < envs < agents < trainers):\n" + "\n".join(upward)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_trainer_and_the_integrations_do_not_import_each_other() -> None:
    crossing = [
        f"{edge.where()}: {edge.source} imports {edge.target}"
        for edge in import_graph()
        if not _within(edge.source, MOVED_ALIASES)
        and any(_within(edge.source, a) and _within(edge.target, b)
                for a, b in (("rl_llm.trainers", "rl_llm.integrations"), ("rl_llm.integrations", "rl_llm.trainers")))
    ]  # fmt: skip
    assert not crossing, "the trainer and the integrations are side by side:\n" + "\n".join(crossing)


def cycles(edges: list[Import]) -> list[str]:
    """Each cycle found by a depth-first walk, as ``a (file:line) -> b (file:line) -> a``."""
    graph: dict[str, list[Import]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
    found: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[Import] = []

    def walk(module: str) -> None:
        state[module] = 1
        for edge in graph.get(module, []):
            # Back to a module on the path: a cycle (each module on it is the source of a path edge).
            if state.get(edge.target) == 1:
                start = next(i for i, e in enumerate(path) if e.source == edge.target)
                loop = [*path[start:], edge]
                found.append(" -> ".join(f"{e.source} ({e.where()})" for e in loop) + f" -> {edge.target}")
            elif state.get(edge.target) is None:
                path.append(edge)
                walk(edge.target)
                path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return found


def test_no_import_cycle_at_module_level() -> None:
    found = cycles([edge for edge in import_graph() if edge.module_level])
    assert not found, "module-level import cycles:\n" + "\n".join(found)


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """Relative, lazy and TYPE_CHECKING imports are read as documented, and a cycle is reported."""
    source = tmp_path / "vllm_server.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import llm\n"
        "from ..trainers.sync import WeightSync\n"
        "if TYPE_CHECKING:\n"
        "    from rl_llm.trainers.runner import TrainingRun\n"
        "def start():\n"
        "    from rl_llm.trainers.server_sync import WEIGHT_RECEIVER\n",
        encoding="utf-8",
    )
    known = {"rl_llm.agents", "rl_llm.agents.llm", "rl_llm.trainers.sync", "rl_llm.trainers.runner",
             "rl_llm.trainers.server_sync"}  # fmt: skip
    edges = imports_of("rl_llm.agents.vllm_server", source, known | {"rl_llm.agents.vllm_server"})
    assert [(e.target, e.line, e.module_level) for e in edges] == [
        ("rl_llm.agents.llm", 2, True), ("rl_llm.trainers.sync", 3, True), ("rl_llm.trainers.server_sync", 7, False),
    ]  # fmt: skip
    assert all(layer(e.target) > layer(e.source) for e in edges[1:])
    a_to_b = Import("rl_llm.agents.a", "rl_llm.agents.b", source, 1, True)
    b_to_a = Import("rl_llm.agents.b", "rl_llm.agents.a", source, 2, True)
    (cycle,) = cycles([a_to_b, b_to_a, Import("rl_llm.agents.c", "rl_llm.agents.a", source, 3, True)])
    assert cycle.startswith("rl_llm.agents.a (") and cycle.endswith("-> rl_llm.agents.a")
