"""Every config key has a test that fails when the key is ignored or misapplied.

The keys are every field of the typed config sections, nested dataclasses walked:
* `agent.<name>.<field>` for each agent's `Config` (`agent.dqn.tau`, `agent.dqn.optim.max_grad_norm`,
  `agent.muesli.network.model`), found through the agent registry;
* `env.<source>.<field>` for each env source's `EnvConfig` (`env.gymnax.obs_features`);
* `train.<field>` for the top level (`rl.config.TrainConfig` without `agent`/`env`: `train.num_envs`,
  `train.checkpoint.interval`, `train.logger.wandb.mode`).

A test module names what it covers in a module-level literal `COVERS = {"<key>": "<test function>" | [...]}`
(read from the source with `ast`, nothing imported). This test fails when a key has no entry (a new option
cannot land untested), when an entry names a test function the module does not define, when an entry names
a key that does not exist (renamed options), and when a key of `BACKLOG` (keys not yet covered, listed so the
list can only shrink) has gained an entry or no longer exists.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from pathlib import Path

from rl.config import TrainConfig
from rl.envs import sources

TESTS = Path(__file__).resolve().parent

# Keys no test names yet: each entry must leave this list when a COVERS entry names it.
BACKLOG: set[str] = set()


def _fields(cls, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            keys += _fields(t, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def config_keys() -> set[str]:
    """Every key of every typed config section, named as in `COVERS`."""
    from agents import available_agents

    keys = set()
    for name in available_agents():
        keys |= set(_fields(importlib.import_module(f"agents.{name}").Config, f"agent.{name}."))
    for source, module in sources().items():
        keys |= set(_fields(importlib.import_module(module).EnvConfig, f"env.{source}."))
    keys |= {k for k in _fields(TrainConfig, "train.") if k not in ("train.agent", "train.env")}
    return keys


def declared_covers() -> dict[str, list[str]]:
    """`key -> ["tests/...py::test_name", ...]` from every test module's `COVERS`; also checks the names."""
    covers: dict[str, list[str]] = {}
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COVERS" for t in node.targets):
                rel = path.relative_to(TESTS.parent)
                for key, tests in ast.literal_eval(node.value).items():
                    for test in [tests] if isinstance(tests, str) else list(tests):
                        if test not in functions:
                            problems.append(f"{rel}: COVERS[{key!r}] names {test!r}, which the module lacks")
                        covers.setdefault(key, []).append(f"{rel}::{test}")
    assert not problems, "\n".join(problems)
    return covers


def test_the_key_list_reads_every_section():
    """The enumeration itself: nested sections are walked and every agent and env source appears."""
    keys = config_keys()
    for key in ("agent.dqn.tau", "agent.dqn.optim.max_grad_norm", "agent.dqn.network.dueling",
                "agent.r2d2.burn_in", "agent.muesli.network.model", "env.gymnax.obs_features",
                "env.envpool.recvs_per_chunk", "train.num_envs", "train.checkpoint.interval",
                "train.logger.wandb.mode", "train.mesh.seed_devices"):
        assert key in keys, key
    assert not any(k.startswith(("train.agent", "train.env")) for k in keys)


def test_every_config_key_names_a_test():
    keys, covers = config_keys(), declared_covers()
    unknown = sorted(set(covers) - keys)
    assert not unknown, f"COVERS entries for keys that do not exist (renamed?): {unknown}"
    missing = sorted(keys - set(covers) - BACKLOG)
    assert not missing, ("config keys without a test that fails when they are ignored; add one and name it in "
                         f"its module's COVERS: {missing}")
    stale = sorted(BACKLOG & (set(covers) | (BACKLOG - keys)))
    assert not stale, f"remove these from BACKLOG (covered now, or gone): {stale}"
