"""Env sources: gymnax (vmapped, inside jit) and envpool (async recv/send), their configs, wrappers,
the per-env bookkeeping of envpool recvs, episode statistics, and videos of greedy episodes (video.py).
Imports: buffers-free; rl.config only.

The registry of sources: `env.source` names a module of `SOURCES` holding that source's `EnvConfig`
dataclass; `env_config(section)` types an `env:` section with it (imported lazily: gymnax or envpool loads
only when used). The source modules do not import this registry back.
"""

from __future__ import annotations

import importlib
from typing import Any

from omegaconf import DictConfig

from rl.config import ConfigError, to_dataclass

SOURCES = {"gymnax": "rl.envs.gymnax_source", "envpool": "rl.envs.envpool_env"}  # env.source -> its module


def env_config(section: Any):
    """The env section (DictConfig, dict or the dataclass) as its source's `EnvConfig` (chosen by `env.source`)."""
    source = section.get("source") if isinstance(section, (dict, DictConfig)) else getattr(section, "source", None)
    if source not in SOURCES:
        raise ConfigError(f"env.source={source!r} is not an env source; available: {sorted(SOURCES)}")
    return to_dataclass(importlib.import_module(SOURCES[source]).EnvConfig, section, "env")
