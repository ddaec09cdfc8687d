"""Agent registry: `agent_config(section)` types an `agent:` config section, `make_agent(cfg, ...)` builds the
agent it names.

Every agent is a module or package `agents/<name>` exposing its `Config` dataclass (every key, its default and
its checks) and `make_agent(cfg: Config, *, obs_shape, obs_dtype, num_actions, num_envs) -> Agent` (see
rl/learning/agent.py), optionally `POPULATION_KEYS` (`population_keys`) and `POPULATION_BOUNDS`
(`population_bounds`), and optionally its presets in `agents/<name>.yaml` (`families: {env family: preset}`,
`presets: {name: the keys that differ from Config's defaults}`). `register()` (run by agents.setup.setup,
not on import) imports every agent and stores its hydra options (`agent=<name>`, sized by the env's family,
and `agent=<name>_<preset>`; rl.presets.register_agent), so `agent=<name>` works on every env with nothing
else to edit.

The application layer lives beside the agents, above them (`APPLICATION`: agents/setup.py, the set-up step and
config composition; agents/experiment.py, the wiring and the Python API): these are not agents, the registry
never lists or loads them, and no agent imports them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl.config import ConfigError, to_dataclass
from rl.presets import env_families, fold_lr, register_agent

APPLICATION = ("experiment", "setup")  # modules of this package that are the application layer, not agents


def available_agents() -> list[str]:
    """Names of the agents (the modules and packages of this package but `APPLICATION`)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if not m.name.startswith("_") and m.name not in APPLICATION)


def presets_file(module: Any) -> Path:
    """An agent module's presets: `<name>.yaml` beside its module `<name>.py` or its package `<name>/`."""
    path = Path(module.__file__).resolve()
    return (path.parent if path.name == "__init__.py" else path.with_suffix("")).with_suffix(".yaml")


def register() -> dict[str, str]:
    """Store every agent's hydra options (rl.presets.register_agent); returns option -> agent. Two agents
    claiming one option name (agent `a` with a preset `b`, and an agent `a_b`) are refused naming both.
    Idempotent: a second call stores the same nodes again."""
    families, owner = env_families(), {}
    for name in available_agents():
        module = importlib.import_module(f"agents.{name}")
        for option in register_agent(name, module.Config, presets_file(module), families):
            if owner.setdefault(option, name) != name:
                raise ConfigError(f"agent={option} is claimed by agents {owner[option]!r} and {name!r}: rename a "
                                  f"preset")
    return owner


def _name(section: Any) -> Any:
    return section.get("name") if isinstance(section, (dict, DictConfig)) else getattr(section, "name", None)


def agent_config(section: Any):
    """The agent section (DictConfig, dict or the dataclass itself) as its agent's `Config` dataclass.

    Unknown keys, wrong types and bad values (the dataclass's `__post_init__`) raise a `ConfigError` naming
    the section. `lr`, the learning-rate key every composed agent section has (so `agent.lr=...` sweeps any
    agent; rl.presets.register_agent adds it), is the default of `optim.lr` (the section interpolates it; a dict
    without `optim.lr` gets it here).
    """
    name = _name(section)
    if name not in available_agents():
        raise ConfigError(f"agent.name={name!r} is not an agent; available: {available_agents()}")
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    if isinstance(section, dict):
        section = fold_lr(section)
    return to_dataclass(importlib.import_module(f"agents.{name}").Config, section, "agent")


def population_keys(name: str) -> tuple[str, ...]:
    """The config keys agent `name` can vary within one program (its module's `POPULATION_KEYS`; none if it
    lists none): rl/learning/population.py."""
    return tuple(getattr(importlib.import_module(f"agents.{name}"), "POPULATION_KEYS", ()))


def population_bounds(name: str) -> dict[str, tuple[float, float]]:
    """The [lo, hi] of agent `name`'s population keys that have bounds (its module's `POPULATION_BOUNDS`),
    which population-based training keeps perturbed values in (rl/learning/pbt.py)."""
    return dict(getattr(importlib.import_module(f"agents.{name}"), "POPULATION_BOUNDS", {}))


def make_agent(cfg: Any, *, obs_shape: Sequence[int], obs_dtype: Any, num_actions: int, num_envs: int,
               total_steps: int | None = None):
    """Build the agent `cfg.name` for envs with `obs_shape`/`obs_dtype` observations (no batch dim),
    `num_actions` discrete actions and `num_envs` parallel envs (one buffer row each). `cfg` is the agent's
    `Config` or a section `agent_config` turns into it. `total_steps`: the run's env steps per seed, the
    length of `optim.lr_schedule=linear` with `optim.lr_decay_updates=0` (the agent's `run_updates`)."""
    cfg = agent_config(cfg)
    module = importlib.import_module(f"agents.{cfg.name}")
    return module.make_agent(cfg, obs_shape=tuple(obs_shape), obs_dtype=obs_dtype, num_actions=int(num_actions),
                             num_envs=int(num_envs), total_steps=total_steps)
