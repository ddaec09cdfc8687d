"""envpool as an asynchronous env source (the Sebulba runner's envs): its config section, the source, the
XLA handle and its probe. The per-env bookkeeping of its recvs is rl/envs/envpool_tracking.py.

* `EnvConfig`: `configs/env/envpool/*.yaml` (`source: envpool`); the number of envs is the top-level
  `num_envs`. Checked when built (`rl.envs.env_config`).
* `make_source(env_cfg, num_envs, seed=0, envs_per_recv=None)`: the `EnvpoolSource` (the registry's contract,
  rl/envs/__init__.py); `open_envpool(task_id, ...)` the same from a task id and envpool options.
* `use_xla(env_cfg)`: whether the actor runs envpool's XLA handle inside jit (`env.xla`: auto probes a
  2-env copy of the task with one jitted recv + send; on requires it; off never uses it).

envpool facts this module relies on (envpool 1.2.5, gymnasium API, probed):

* `recv()` returns `(obs, reward, terminated, truncated, info)` for `batch_size` envs; `info["env_id"]`
  says which. `num_envs > batch_size` is async mode (order varies from call to call); equal is sync mode.
* Auto-reset happens one step late: the recv that reports `terminated | truncated` carries the terminal
  observation; the next recv of that env (after the ignored action sent for it) carries the first
  observation of the new episode with reward 0 and no done. The first recv after `async_reset` is also
  such a "reset step". A reset step is no transition.
* At the step limit envpool reports `truncated` and not `terminated`, even where the state is terminal.
* Atari (`*-v5`) with `episodic_life=True` reports `terminated` at every life loss and then a reset step
  that continues the same game; `info["terminated"]` is the real game over and `info["reward"]` the
  unclipped reward. Images are `[stack, 84, 84]` uint8, channels first.

Shapes: E = num_envs, M = envs per recv (`env.envs_per_recv`; envpool's own name, kept by
`open_envpool` and `EnvpoolSource`, is batch_size).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import envpool
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rl.config import ConfigError

RUNNER = "sebulba"  # actor threads recv/send on the host or through the XLA handle (rl/runners/sebulba.py)

# envpool's own Atari preprocessing, as in the DQN paper (defaults of envpool differ: episodic_life and
# reward_clip are off there).
ATARI_DEFAULTS = {"episodic_life": True, "reward_clip": True, "stack_num": 4, "img_height": 84, "img_width": 84,
                  "gray_scale": True, "frame_skip": 4, "noop_max": 30, "repeat_action_probability": 0.0}


@struct.dataclass
class Recv:
    """One recv, with the fields the runner uses. Leading dim M.

    obs: `[M, *envpool_obs_shape]` as envpool gives it (use `EnvpoolSource.observation` for the agent's
    layout); reward: `[M]` float32, what the agent learns from (clipped for Atari when configured);
    terminated / truncated: `[M]` bool; env_id: `[M]` int32; score: `[M]` float32 raw reward for statistics;
    episode_over: `[M]` bool, end of the episode that statistics report (Atari: game over or truncation,
    not a life loss; otherwise terminated or truncated).
    """

    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    env_id: jax.Array
    score: jax.Array
    episode_over: jax.Array


def _to_recv(obs, reward, terminated, truncated, info, atari: bool, xp) -> Recv:
    terminated = terminated.astype(bool)
    truncated = truncated.astype(bool)
    if atari:
        score = info["reward"].astype(xp.float32)
        over = info["terminated"].astype(bool) | truncated
    else:
        score = reward.astype(xp.float32)
        over = terminated | truncated
    return Recv(obs=obs, reward=reward.astype(xp.float32), terminated=terminated, truncated=truncated,
                env_id=info["env_id"].astype(xp.int32), score=score, episode_over=over)


@dataclasses.dataclass(frozen=True)
class EnvpoolSource:
    """An envpool env in gymnasium mode plus what the runner needs to know about it.

    `obs_shape` is the agent's observation shape: channels-last `[84, 84, stack]` for image observations
    (envpool gives `[stack, 84, 84]`; `observation` transposes inside jit).
    """

    env: Any
    task_id: str
    num_envs: int
    batch_size: int
    obs_shape: tuple[int, ...]
    obs_dtype: Any
    num_actions: int
    atari: bool

    @property
    def image(self) -> bool:
        return len(self.obs_shape) == 3

    def observation(self, obs: jax.Array) -> jax.Array:
        """envpool layout `[M, C, H, W]` -> agent layout `[M, H, W, C]` (identity for flat observations)."""
        return jnp.moveaxis(obs, -3, -1) if self.image else obs

    def obs_example(self) -> np.ndarray:
        """One observation in the agent's layout (zeros), for `agent.init` and buffer prototypes."""
        return np.zeros(self.obs_shape, self.obs_dtype)

    def reset(self) -> None:
        """Start all envs (async). Their first recv is a reset step."""
        self.env.async_reset()

    def recv(self) -> Recv:
        """Host recv: NumPy arrays (blocks until `batch_size` envs are ready)."""
        obs, reward, terminated, truncated, info = self.env.recv()
        return _to_recv(obs, reward, terminated, truncated, info, self.atari, np)

    def send(self, actions, env_ids) -> None:
        self.env.send(np.asarray(actions), np.asarray(env_ids))

    def xla(self) -> tuple[jax.Array, Callable, Callable]:
        """envpool's XLA handle: `(handle, recv, send)` usable inside jit.

        `recv(handle) -> (handle, Recv)`; `send(handle, actions [M], env_ids [M]) -> handle`. The handle must be
        threaded through the computation (it orders the calls). Call `reset()` before the first recv.
        """
        handle, recv_fn, send_fn, _ = self.env.xla()
        atari = self.atari

        def recv(h):
            h, (obs, reward, terminated, truncated, info) = recv_fn(h)
            return h, _to_recv(obs, reward, terminated, truncated, info, atari, jnp)

        def send(h, actions, env_ids):
            return send_fn(h, actions.astype(jnp.int32), env_ids.astype(jnp.int32))

        return handle, recv, send

    def close(self) -> None:
        self.env.close()


def open_envpool(task_id: str, num_envs: int, batch_size: int, seed: int = 0, num_threads: int = 0,
                 max_episode_steps: int | None = None, **env_kwargs) -> EnvpoolSource:
    """Build an envpool env (gymnasium API). Atari tasks get `ATARI_DEFAULTS` unless overridden in
    `env_kwargs`; other keyword arguments go to `envpool.make` as they are."""
    if task_id not in envpool.list_all_envs():
        raise ValueError(f"unknown envpool task id {task_id!r}; see envpool.list_all_envs()")
    if not 1 <= batch_size <= num_envs:
        raise ValueError(f"envpool needs 1 <= batch_size <= num_envs, got batch_size={batch_size}, "
                         f"num_envs={num_envs}")
    config_fields = envpool.make_spec(task_id).config._fields
    atari = "frame_skip" in config_fields and "episodic_life" in config_fields
    kwargs = dict(ATARI_DEFAULTS) if atari else {}
    kwargs.update(env_kwargs)
    unknown = sorted(k for k in kwargs if k not in config_fields)
    if unknown:
        raise ValueError(f"envpool task {task_id!r} has no option(s) {unknown}; it takes {sorted(config_fields)}")
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = int(max_episode_steps)
    env = envpool.make(task_id, env_type="gymnasium", num_envs=num_envs, batch_size=batch_size, seed=seed,
                       num_threads=num_threads, **kwargs)
    space = env.observation_space
    if not hasattr(env.action_space, "n"):
        raise ValueError(f"envpool task {task_id!r} has a non-discrete action space {env.action_space}; "
                         "the agents here need discrete actions")
    shape = tuple(space.shape)
    if len(shape) == 3:  # [C, H, W] -> [H, W, C]
        shape = shape[1:] + shape[:1]
    return EnvpoolSource(env=env, task_id=task_id, num_envs=num_envs, batch_size=batch_size, obs_shape=shape,
                         obs_dtype=np.dtype(space.dtype), num_actions=int(env.action_space.n), atari=atari)


@dataclasses.dataclass
class EnvConfig:
    """`configs/env/envpool/*.yaml` (`source: envpool`). The number of envs is the top-level `num_envs`."""

    source: str = "envpool"
    id: str = "CartPole-v1"  # any envpool task id with discrete actions, e.g. Pong-v5, Breakout-v5
    family: str | None = None  # vector | minatar | atari: the agents' preset it takes (rl.config.ENV_FAMILIES)
    envs_per_recv: int | None = None  # envpool's batch_size; null: num_envs // 2 (async); = num_envs: sync mode
    num_threads: int = 0  # envpool worker threads (0: envpool's default)
    max_episode_steps: int | None = None  # null: the task's own limit
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # further envpool.make options
    recvs_per_chunk: int = 16  # K: recvs per actor chunk (one jitted rollout, one learner update)
    queue_size: int = 2  # Q: chunks the actor may run ahead of the learner
    sync_interval: int = 1  # chunks between two copies of the agent state to the actor
    xla: str = "auto"  # envpool's XLA handle inside jit: auto (probe, else host loop) | on | off
    eval_max_steps: int | None = None  # recv cap of the final evaluation (null: 2 x the episode limit)
    # Several actor threads and devices (rl/runners/sebulba.py): each thread owns num_envs / actor_threads envs
    # (envs_per_recv / actor_threads per recv) and acts on actor device (thread index % actor devices).
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
        if self.envs_per_recv is not None and self.envs_per_recv < 1:
            raise ValueError(f"env.envs_per_recv must be >= 1 or null, got {self.envs_per_recv}")
        for key in ("actor_devices", "learner_devices"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"env.{key} must be >= 1 or null, got {getattr(self, key)}")
        if self.xla not in ("auto", "on", "off"):
            raise ValueError(f"env.xla must be auto, on or off, got {self.xla!r}")


def make_source(env_cfg: EnvConfig, num_envs: int, seed: int = 0, envs_per_recv: int | None = None) -> EnvpoolSource:
    """`num_envs` envs of `env_cfg.id` seeded from `seed`, `envs_per_recv` (default: `env.envs_per_recv`, else
    num_envs // 2) envs per recv."""
    batch = envs_per_recv or env_cfg.envs_per_recv or max(num_envs // 2, 1)
    if batch > num_envs:
        raise ConfigError(f"env.envs_per_recv={batch} exceeds num_envs={num_envs}")
    return open_envpool(env_cfg.id, num_envs, batch, seed=seed, num_threads=env_cfg.num_threads,
                        max_episode_steps=env_cfg.max_episode_steps, **dict(env_cfg.kwargs))


def xla_handle_works(env_cfg: EnvConfig) -> bool:
    """Probe envpool's XLA handle on a small env of the same task: one jitted recv + send."""
    try:
        probe = make_source(env_cfg, 2, seed=0, envs_per_recv=1)
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
