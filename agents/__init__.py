"""Agent registry: `make_agent(agent_cfg, ...)` builds the agent named by `agent_cfg.name`.

Every agent lives in `agents/<name>.py` and exposes
`make_agent(agent_cfg, *, obs_shape, obs_dtype, num_actions, num_envs) -> Agent` (see rl/agent.py).
Modules are imported lazily, so an agent's dependencies load only when it is used.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from typing import Any


def available_agents() -> list[str]:
    """Names of the agent modules in this package."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def make_agent(agent_cfg: Any, *, obs_shape: Sequence[int], obs_dtype: Any, num_actions: int,
               num_envs: int):
    """Build the agent `agent_cfg.name` for envs with `obs_shape`/`obs_dtype` observations (no batch dim),
    `num_actions` discrete actions and `num_envs` parallel envs (one buffer row each)."""
    name = agent_cfg["name"] if isinstance(agent_cfg, dict) else getattr(agent_cfg, "name", None)
    if name not in available_agents():
        raise ValueError(f"unknown agent {name!r}: available agents are {available_agents()}")
    module = importlib.import_module(f"agents.{name}")
    return module.make_agent(agent_cfg, obs_shape=tuple(obs_shape), obs_dtype=obs_dtype,
                             num_actions=int(num_actions), num_envs=int(num_envs))
