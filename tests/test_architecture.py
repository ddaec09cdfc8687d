"""The README's architecture map holds: each folder imports only what its row allows (imports inside
functions included), nothing under rl/ imports `agents`, no two packages import each other, and no module
imports itself back through others (no cycle). The layers: buffers <- rl <- agents <- the application layer
(agents/setup.py, agents/experiment.py). Imports by name count too: a project module's dotted name in a
string (a registry's `{"gymnax": "rl.envs.gymnax_source"}`) and an f-string prefix (`f"agents.{name}"`:
every module under `agents` but the application modules the registry never lists, `agents.APPLICATION`), as
`importlib.import_module` loads them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import agents

ROOT = Path(__file__).resolve().parents[1]
# package prefix -> the project packages its modules may import (besides themselves)
ALLOWED = {
    "buffers": set(),
    "rl.nets": set(),
    "rl.learning": set(),
    "rl.config": set(),
    "rl.envs": {"rl.config"},
    "rl.infra": {"rl.config"},
    "rl.presets": {"rl.config"},
    "rl.runners": {"rl.envs", "rl.learning", "rl.infra", "rl.config"},
    "rl": set(),  # rl/__init__.py: its docstring only
    "agents": {"buffers", "rl.learning", "rl.nets", "rl.infra", "rl.config", "rl.presets"},
    "agents.setup": {"agents", "rl.config", "rl.envs", "rl.infra"},
    "agents.experiment": {"agents", "agents.setup", "buffers", "rl.config", "rl.envs", "rl.infra", "rl.learning",
                          "rl.runners"},
}
APPLICATION = {f"agents.{name}" for name in agents.APPLICATION}
PROJECT = ("rl", "agents", "buffers", "scripts", "configs", "tests")


def _package(module: str) -> str:
    """The ALLOWED key a module belongs to (longest prefix)."""
    return max((k for k in ALLOWED if module == k or module.startswith(k + ".")), key=len)


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = {_module(p): p for folder in ("buffers", "rl", "agents") for p in sorted((ROOT / folder).rglob("*.py"))}
NAME = re.compile(r"(rl|agents|buffers)(\.\w+)+")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from buffers import checks` loads the submodule (its package's __init__ runs for any import)
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            out |= subs if len(subs) == len(node.names) else {node.module} | subs
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
            out |= {node.value} if node.value in MODULES else set()  # a registry entry
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            prefix = str(node.values[0].value)  # f"agents.{name}": any module under agents
            if prefix.endswith(".") and prefix.split(".")[0] in ("rl", "agents", "buffers"):
                out |= {m for m in MODULES if m.startswith(prefix) and _package(m) not in APPLICATION}
    return {m for m in out if m.split(".")[0] in PROJECT}


def _edges(module: str) -> set[str]:
    """The project modules `module` loads by its own statements (the longest known module of each name)."""
    out = set()
    for name in _imports(MODULES[module]):
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def test_imports_follow_the_architecture_map():
    """Each import is judged by the package (ALLOWED key) of the module it loads."""
    wrong = []
    for module, path in MODULES.items():
        own = _package(module)
        for imported in _imports(path):
            if imported.split(".")[0] in ("scripts", "configs", "tests") or _package(imported) not in ALLOWED[own] | {own}:
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_nothing_under_rl_imports_agents():
    importers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "rl").rglob("*.py")
                       if any(m.split(".")[0] == "agents" for m in _imports(p)))
    assert importers == [], importers


def _package_edges() -> set[tuple[str, str]]:
    """`(a, b)` for every package `a` (an ALLOWED key) one of whose modules loads a module of package `b`."""
    return {(_package(m), _package(n)) for m in MODULES for n in _edges(m) if _package(m) != _package(n)}


def test_no_two_packages_import_each_other():
    """The map and the code both: no pair of packages allows or makes imports both ways."""
    allowed = {(a, b) for a, targets in ALLOWED.items() for b in targets}
    for name, edges in (("ALLOWED", allowed), ("the imports", _package_edges())):
        both = sorted({tuple(sorted(e)) for e in edges if e[::-1] in edges})
        assert not both, f"{name}: two-way pairs {both}"


def test_the_application_layer_is_above_the_agents():
    """Nothing but the application layer loads it, and the agents registry never lists it."""
    importers = {a for a, b in _package_edges() if b in APPLICATION}
    assert importers <= APPLICATION, importers
    assert not APPLICATION & {f"agents.{n}" for n in agents.available_agents()}


def test_no_module_imports_itself_back():
    """No import cycle between project modules (a registry whose entries import the registry back, ...)."""
    graph = {m: _edges(m) for m in MODULES}
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(" -> ".join([*path[path.index(n):], n]))
            elif n not in state:
                visit(n, [*path, n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_the_cycle_check_sees_imports_by_name():
    """The check is not blind to importlib: the agents registry loads every agent by an f-string, the env
    registry its sources by their dotted names."""
    assert {"agents.dqn", "agents.r2d2", "agents.muesli"} <= _edges("agents")
    assert {"rl.envs.gymnax_source", "rl.envs.envpool_source"} <= _edges("rl.envs")
