"""Nothing happens at import: importing any module of buffers/, rl/ or agents/ changes no process-wide state
beyond loading the modules it imports. What a process needs set happens in one explicit step,
agents.setup.setup, which the entry points call (and which this test sees take effect).

One fresh Python imports every module in turn (PROBE) and, around each import, compares: `sys.modules`
(what it gains must be modules, none of a project class, none without a spec standing in for a module the
import system would load: no stand-ins), the warnings filters project code adds (`warnings.filterwarnings`
and `simplefilter` called from a project module; third-party libraries add their own on import, jax and scipy
among them), every logger's level and filters, jax's config values and its CPU lowering of threefry, the
garbage collector's thresholds, and hydra's ConfigStore (its nodes and the class's `__deepcopy__`); jax and
hydra are loaded first, so that their own import is the baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for folder in ("buffers", "rl", "agents") for p in (ROOT / folder).rglob("*.py"))

PROBE = r'''
import gc, importlib, json, logging, sys, types, warnings
from importlib.machinery import PathFinder

PROJECT = ("rl", "agents", "buffers")
project_filters = []

def recording(add):
    def add_filter(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.split(".")[0] in PROJECT:
            project_filters.append(f"{caller}: warnings.{add.__name__}{args}{kwargs}")
        return add(*args, **kwargs)
    return add_filter

warnings.filterwarnings, warnings.simplefilter = recording(warnings.filterwarnings), recording(warnings.simplefilter)

def state():
    out = {"filters": list(project_filters)}
    loggers = {"": logging.getLogger()} | {n: l for n, l in logging.root.manager.loggerDict.items()
                                          if isinstance(l, logging.Logger)}
    out["loggers"] = {n: [l.level, [type(f).__name__ for f in l.filters], l.disabled]
                      for n, l in loggers.items() if l.level or l.filters or l.disabled}
    out["jax"] = {k: repr(v) for k, v in jax.config.values.items()}
    out["gc"] = list(gc.get_threshold())
    out["threefry"] = repr(jax._src.interpreters.mlir._platform_specific_lowerings["cpu"].get(
        jax._src.random.threefry2x32.threefry2x32_p))
    store = hydra.core.config_store.ConfigStore
    def names(d, prefix=""):
        return sorted(x for k, v in d.items() for x in (names(v, prefix + k + "/") if isinstance(v, dict)
                                                        else [prefix + k]))
    out["config_store"] = names(store.instance().repo)
    out["deepcopy"] = "__deepcopy__" in vars(store)
    return out

def odd(name, module):
    """Why `module`, new in sys.modules as `name`, is a stand-in (None if it is not)."""
    if not isinstance(module, types.ModuleType):
        return f"a {type(module).__name__}, not a module"
    if type(module).__module__.split(".")[0] in PROJECT:
        return f"a {type(module).__name__}"
    if getattr(module, "__spec__", None) is None:  # C extensions register submodules so; those have no file
        parent = name.rpartition(".")[0]
        path = getattr(sys.modules.get(parent), "__path__", None) if parent else None
        if (path is not None or not parent) and PathFinder.find_spec(name, path) is not None:
            return "no __spec__, in the place of a module the import system would load"
    return None

# The libraries whose state is compared, loaded first: their own import is the baseline.
import hydra.conf, hydra.core.config_store, jax, jax._src.interpreters.mlir, jax._src.random.threefry2x32  # noqa

report = {}
for name in sys.argv[1:]:
    before, known = state(), set(sys.modules)
    importlib.import_module(name)
    after = state()
    changed = {k: [before.get(k), after.get(k)] for k in after if before.get(k) != after[k]}
    gained = {n: odd(n, m) for n, m in list(sys.modules.items()) if n not in known}
    bad = {n: why for n, why in gained.items() if why}
    if bad:
        changed["sys.modules"] = bad
    report[name] = changed
print(json.dumps(report))
'''


def _probe(modules: list[str], code: str = PROBE) -> dict:
    # A user's process: under the suite's JAX_DISABLE_MOST_OPTIMIZATIONS=1 set-up keeps jax's threefry lowering.
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="0")
    proc = subprocess.run([sys.executable, "-c", code, *modules], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_a_module_changes_no_process_state():
    report = _probe(MODULES)
    assert set(report) == set(MODULES)
    changed = {name: sorted(diff) for name, diff in report.items() if diff}
    assert not changed, json.dumps({n: report[n] for n in changed}, indent=1)[:4000]


def test_compose_sets_the_process_up_with_no_import_first():
    """In a fresh process agents.setup.compose composes an `agent=` option with nothing imported first (its
    set-up step stores the agents' options), and the same probe sees each set-up action (so the test above
    is not blind)."""
    code = PROBE.replace("importlib.import_module(name)",
                         "assert importlib.import_module(name).compose(['agent=r2d2']).agent.name == 'r2d2'")
    diff = _probe(["agents.setup"], code)["agents.setup"]
    assert {"filters", "loggers", "threefry", "gc", "config_store", "deepcopy", "sys.modules"} <= set(diff), sorted(diff)
    assert {"seaborn", "matplotlib.pyplot"} <= set(diff["sys.modules"])
    assert "base_config.yaml" in diff["config_store"][1] and "agent/dqn.yaml" in diff["config_store"][1]
