"""Env sources: gymnax (vmapped, inside jit) and envpool (async recv/send), their configs, wrappers,
the per-env bookkeeping of envpool recvs, episode statistics, and videos of greedy episodes (video.py).
Imports: buffers-free; rl.config only.

The registry of sources, one contract for every kind: `env.source=<name>` names the module
`rl/envs/<name>_source.py` (`sources()` lists them), which holds
* `EnvConfig`, the dataclass of its `env:` section (`env_config(section)` types a section with it);
* `make_source(env_cfg, num_envs, seed=0, envs_per_recv=None)`, the source: `num_envs`, `num_actions`,
  `obs_shape`, `obs_dtype` and the stepping surface of its runner (gymnax: pure
  `reset`/`step` for Anakin, `step(env_state, action, key, restart=True)`, where `restart=False` allows it to
  skip the auto-reset; envpool: `recv`/`send` and an XLA handle for Sebulba);
* `RUNNER`, the runner that steps it (`anakin` or `sebulba`; `runner_of(env_cfg)`).
Every `EnvConfig` also has `family` (rl.config.ENV_FAMILIES: vector | minatar | atari, or None), the size of
agent presets the env takes (configs/env/*.yaml declare it; rl.presets.register_agent reads it there);
`env_config` checks its value.
Modules are imported lazily (gymnax or envpool loads only when used) and do not import this registry back.
gymnax imports seaborn and matplotlib.pyplot for its envs' `render` helpers alone (slow imports every process
start would pay); `defer_plotting_imports()` (run by agents.setup.setup, never on import) puts stand-ins for them
in `sys.modules` that import them on first use (`OnFirstUse`).
A new source is its module (`<name>_source.py` with these three names), a yaml in configs/env/ and a test.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types
from typing import Any

from omegaconf import DictConfig

from rl.config import ENV_FAMILIES, ConfigError, to_dataclass


class OnFirstUse(types.ModuleType):
    """Stand-in for module `name` in `sys.modules`: the first attribute read imports it, and the stand-in then
    reads as it."""

    def __getattr__(self, attr: str):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def defer_plotting_imports() -> None:
    """Put an `OnFirstUse` stand-in for seaborn and matplotlib.pyplot in `sys.modules`, unless they are there
    (idempotent)."""
    for name in ("seaborn", "matplotlib.pyplot"):
        if name not in sys.modules:
            sys.modules[name] = stand_in = OnFirstUse(name)
            parent, _, child = name.rpartition(".")
            if parent:  # `import matplotlib.pyplot; matplotlib.pyplot.plot(...)` reads it on the package
                setattr(importlib.import_module(parent), child, stand_in)


def sources() -> dict[str, str]:
    """`env.source` name -> its module: every `rl/envs/<name>_source.py`."""
    return {m.name.removesuffix("_source"): f"rl.envs.{m.name}" for m in pkgutil.iter_modules(__path__)
            if m.name.endswith("_source")}


def _module(section: Any):
    """The module of the source `section` names (`env.source`)."""
    source = section.get("source") if isinstance(section, (dict, DictConfig)) else getattr(section, "source", None)
    known = sources()
    if source not in known:
        raise ConfigError(f"env.source={source!r} is not an env source; available: {sorted(known)}")
    return importlib.import_module(known[source])


def env_config(section: Any):
    """The env section (DictConfig, dict or the dataclass) as its source's `EnvConfig` (chosen by `env.source`)."""
    module = _module(section)
    family = section.get("family") if isinstance(section, (dict, DictConfig)) else getattr(section, "family", None)
    if family is not None and family not in ENV_FAMILIES:
        raise ConfigError(f"env.family={family!r} is not an env family; env families: {', '.join(ENV_FAMILIES)}")
    return to_dataclass(module.EnvConfig, section, "env")


def make_source(env_cfg: Any, num_envs: int, seed: int = 0, envs_per_recv: int | None = None):
    """The source of the env section `env_cfg` (typed or not): `num_envs` envs seeded from `seed`,
    `envs_per_recv` envs per recv where the kind has recvs."""
    env_cfg = env_config(env_cfg)
    return _module(env_cfg).make_source(env_cfg, num_envs, seed=seed, envs_per_recv=envs_per_recv)


def runner_of(env_cfg: Any) -> str:
    """The runner that steps the source of `env_cfg`: its module's `RUNNER` (`anakin` | `sebulba`)."""
    return _module(env_config(env_cfg)).RUNNER
