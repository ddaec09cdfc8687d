"""Env sources: gymnax (vmapped, inside jit) and envpool (async recv/send), their configs, wrappers,
the per-env bookkeeping of envpool recvs, episode statistics, and videos of greedy episodes (video.py).
Imports: buffers-free; rl.config only.

The registry of sources, one contract for every kind: `env.source` names a module of `SOURCES` that holds
* `EnvConfig`, the dataclass of its `env:` section (`env_config(section)` types a section with it);
* `make_source(env_cfg, num_envs, seed=0, batch_size=None)`, the source: `num_envs`, `num_actions`,
  `obs_shape`, `obs_dtype` and the stepping surface of its runner (gymnax: pure
  `reset`/`step` for Anakin; envpool: `recv`/`send` and an XLA handle for Sebulba).
Modules are imported lazily (gymnax or envpool loads only when used) and do not import this registry back.
A new source is its module (these two names), one line in `SOURCES`, a yaml in configs/env/ and a test.
"""

from __future__ import annotations

import importlib
from typing import Any

from omegaconf import DictConfig

from rl.config import ConfigError, to_dataclass

SOURCES = {"gymnax": "rl.envs.gymnax_source", "envpool": "rl.envs.envpool_source"}  # env.source -> its module


def env_config(section: Any):
    """The env section (DictConfig, dict or the dataclass) as its source's `EnvConfig` (chosen by `env.source`)."""
    source = section.get("source") if isinstance(section, (dict, DictConfig)) else getattr(section, "source", None)
    if source not in SOURCES:
        raise ConfigError(f"env.source={source!r} is not an env source; available: {sorted(SOURCES)}")
    return to_dataclass(importlib.import_module(SOURCES[source]).EnvConfig, section, "env")


def make_source(env_cfg: Any, num_envs: int, seed: int = 0, batch_size: int | None = None):
    """The source of the env section `env_cfg` (typed or not): `num_envs` envs seeded from `seed`,
    `batch_size` envs per recv where the kind has recvs."""
    env_cfg = env_config(env_cfg)
    module = importlib.import_module(SOURCES[env_cfg.source])
    return module.make_source(env_cfg, num_envs, seed=seed, batch_size=batch_size)
