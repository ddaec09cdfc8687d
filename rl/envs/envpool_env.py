"""The envpool env of a Sebulba run: its config section, the source built from it, and the XLA probe.

* `EnvConfig`: `configs/env/envpool/*.yaml` (`source: envpool`); the number of envs is the top-level
  `num_envs`. Checked when built (`rl.envs.env_config`).
* `build_source(env_cfg, num_envs, seed, batch_size=None)`: the `EnvpoolSource` (rl/envs/envpool_source.py).
* `use_xla(env_cfg)`: whether the actor runs envpool's XLA handle inside jit (`env.xla`: auto probes a
  2-env copy of the task with one jitted recv + send; on requires it; off never uses it).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl.config import ConfigError
from rl.envs.envpool_source import EnvpoolSource, make_source


@dataclasses.dataclass
class EnvConfig:
    """`configs/env/envpool/*.yaml` (`source: envpool`). The number of envs is the top-level `num_envs`."""

    source: str = "envpool"
    id: str = "CartPole-v1"  # any envpool task id with discrete actions, e.g. Pong-v5, Breakout-v5
    batch_size: int | None = None  # envs per recv; null: num_envs // 2 (async); = num_envs: sync mode
    num_threads: int = 0  # envpool worker threads (0: envpool's default)
    max_episode_steps: int | None = None  # null: the task's own limit
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # further envpool.make options
    recvs_per_chunk: int = 16  # K: recvs per actor chunk (one jitted rollout, one learner update)
    queue_size: int = 2  # Q: chunks the actor may run ahead of the learner
    sync_interval: int = 1  # chunks between two copies of the agent state to the actor
    xla: str = "auto"  # envpool's XLA handle inside jit: auto (probe, else host loop) | on | off
    eval_max_steps: int | None = None  # recv cap of the final evaluation (null: 2 x the episode limit)
    # Several actor threads and devices (rl/runners/sebulba.py): each thread owns num_envs / actor_threads envs
    # (batch_size / actor_threads per recv) and acts on actor device (thread index % actor devices).
    actor_threads: int = 1
    actor_devices: int | None = None  # null: act on device 0 (with the learner); N: the first N devices act
    learner_devices: int | None = None  # null: device 0, or all devices after the actors'; M: M devices learn

    def __post_init__(self):
        import envpool

        if self.source != "envpool":
            raise ValueError(f"env.source must be 'envpool' for an envpool env config, got {self.source!r}")
        if self.id not in envpool.list_all_envs():
            raise ValueError(f"env.id={self.id!r} is not an envpool task id; see envpool.list_all_envs()")
        for key in ("recvs_per_chunk", "queue_size", "sync_interval", "actor_threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"env.{key} must be >= 1, got {getattr(self, key)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"env.batch_size must be >= 1 or null, got {self.batch_size}")
        for key in ("actor_devices", "learner_devices"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"env.{key} must be >= 1 or null, got {getattr(self, key)}")
        if self.xla not in ("auto", "on", "off"):
            raise ValueError(f"env.xla must be auto, on or off, got {self.xla!r}")


def build_source(env_cfg: EnvConfig, num_envs: int, seed: int, batch_size: int | None = None) -> EnvpoolSource:
    batch = batch_size or env_cfg.batch_size or max(num_envs // 2, 1)
    if batch > num_envs:
        raise ConfigError(f"env.batch_size={batch} exceeds num_envs={num_envs}")
    return make_source(env_cfg.id, num_envs, batch, seed=seed, num_threads=env_cfg.num_threads,
                       max_episode_steps=env_cfg.max_episode_steps, **dict(env_cfg.kwargs))


def xla_handle_works(env_cfg: EnvConfig) -> bool:
    """Probe envpool's XLA handle on a small env of the same task: one jitted recv + send."""
    try:
        probe = build_source(env_cfg, 2, seed=0, batch_size=1)
        handle, recv, send = probe.xla()

        @jax.jit
        def once(h):
            h, r = recv(h)
            return send(h, jnp.zeros_like(r.env_id), r.env_id), r.env_id

        probe.reset()
        _, ids = once(handle)
        ok = np.asarray(ids).shape == (1,) and int(np.asarray(ids)[0]) in (0, 1)
        probe.close()
        return ok
    except Exception as e:  # noqa: BLE001 - any failure means: use the host loop
        warnings.warn(f"envpool XLA handle unusable ({type(e).__name__}: {e}); using the host loop", stacklevel=2)
        return False


def use_xla(env_cfg: EnvConfig) -> bool:
    if env_cfg.xla == "off":
        return False
    works = xla_handle_works(env_cfg)
    if env_cfg.xla == "on" and not works:
        raise RuntimeError(f"env.xla=on but envpool's XLA handle does not work for {env_cfg.id}")
    return works
