"""The README's architecture map holds: each folder imports only what its row allows (imports inside
functions included), and no module under rl/ but rl/experiment.py imports `agents`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# package prefix -> the project packages its modules may import (besides themselves)
ALLOWED = {
    "buffers": set(),
    "rl.nets": set(),
    "rl.learning": set(),
    "rl.envs": {"rl.config"},
    "rl.infra": {"rl.config"},
    "rl.config": {"rl.infra"},
    "rl.runners": {"rl.envs", "rl.learning", "rl.infra", "rl.config"},
    "rl.experiment": {"rl", "agents", "buffers"},
    "rl": {"rl.experiment"},  # rl/__init__.py: the lazy entry points
    "agents": {"buffers", "rl.learning", "rl.nets", "rl.infra", "rl.config"},
}
PROJECT = ("rl", "agents", "buffers", "scripts", "configs", "tests")


def _package(module: str) -> str:
    """The ALLOWED key a module belongs to (longest prefix)."""
    return max((k for k in ALLOWED if module == k or module.startswith(k + ".")), key=len)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in PROJECT}


def test_imports_follow_the_architecture_map():
    wrong = []
    for folder in ("buffers", "rl", "agents"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            own = _package(module)
            for imported in _imports(path):
                target_ok = any(imported == a or imported.startswith(a + ".") for a in ALLOWED[own] | {own})
                # `from rl import x` names a submodule: judge it by the submodule
                if not target_ok and imported.count(".") >= 1 and imported.rsplit(".", 1)[0] in ("rl",):
                    target_ok = any(imported.startswith(a) for a in ALLOWED[own] | {own})
                if not target_ok:
                    wrong.append(f"{module} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_only_the_wiring_module_imports_agents():
    importers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "rl").rglob("*.py")
                       if any(m.split(".")[0] == "agents" for m in _imports(p)))
    assert importers == ["rl/experiment.py"], importers
