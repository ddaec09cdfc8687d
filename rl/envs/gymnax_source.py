"""gymnax envs as a batched, auto-resetting, jittable source (the Anakin runner's envs).

`make_source(env_cfg, num_envs, seed=0)` returns a `GymnaxSource` whose `reset`/`step` are vmapped over `E =
num_envs` envs and pure (usable inside jit / scan / vmap over seeds):

    reset(key) -> (env_state, obs [E, *obs_shape])
    step(env_state, action [E], key) -> (env_state, Timestep)

gymnax 1.0's `step` returns `(obs, state, reward, terminated, truncated, info)` and auto-resets: `obs` is
already the first observation of the next episode where `terminated | truncated`, and
`info["final_observation"]` is the observation the action led to. `Timestep.next_obs` is that final
observation, so a truncated step can bootstrap from it; only `terminated` stops bootstrapping.

`env.sticky_actions=p` is MinAtar's own protocol (Young & Tian 2019: p = 0.1): gymnax's
`StickyActionWrapper` executes the previous executed action instead of the chosen one with probability p at
every step (the draw comes from the step's key; the first "previous" action of a run is 0, and it carries
across episode ends, as in the wrapper).

Episode statistics: `rl.envs.episodes.EpisodeStats`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnax
import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import spaces
from gymnax.wrappers import StickyActionWrapper

from rl.envs.wrappers import ObservationFeatureWrapper

RUNNER = "anakin"  # steps these envs inside its jitted loop (rl/runners/anakin.py)


@dataclasses.dataclass
class EnvConfig:
    """`configs/env/*.yaml` for `source: gymnax`."""

    source: str = "gymnax"
    id: str = "CartPole-v1"  # any gymnax id, e.g. Acrobot-v1, Breakout-MinAtar
    family: str | None = None  # vector | minatar | atari: the agents' preset it takes (rl.config.ENV_FAMILIES)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # EnvParams overrides
    obs_features: list[int] | None = None  # keep only these observation features (last axis)
    sticky_actions: float = 0.0  # probability of repeating the previous action (MinAtar's protocol: 0.1)

    def __post_init__(self):
        if self.source != "gymnax":
            raise ValueError(f"env.source must be 'gymnax' for a gymnax env config, got {self.source!r}")
        if self.id not in gymnax.registered_envs:
            raise ValueError(f"env.id={self.id!r} is not a gymnax environment; known ids: {gymnax.registered_envs}")
        if not 0.0 <= self.sticky_actions <= 1.0:
            raise ValueError(f"env.sticky_actions must be a probability in [0, 1], got {self.sticky_actions}")


@struct.dataclass
class Timestep:
    """What one batched env step produced (leading dim E)."""

    obs: jax.Array  # [E, *obs_shape] observation to act on next (after auto-reset)
    reward: jax.Array  # [E] float32
    terminated: jax.Array  # [E] bool: the episode reached a terminal state (no bootstrap)
    truncated: jax.Array  # [E] bool: the episode was cut by a time limit (bootstrap from next_obs)
    next_obs: jax.Array  # [E, *obs_shape] observation the action led to, before any reset


class GymnaxSource:
    """`num_envs` copies of one gymnax env, vmapped, with auto-reset."""

    def __init__(self, env, params, num_envs: int):
        action_space = env.action_space(params)
        if not isinstance(action_space, spaces.Discrete):
            msg = f"{env.name}: only discrete action spaces are supported, got {action_space}"
            raise ValueError(msg)  # noqa: TRY004 - a config value, reported like the other env config errors
        self.env, self.params, self.num_envs = env, params, int(num_envs)
        self.num_actions = int(action_space.n)
        obs, _ = env.reset(jax.random.PRNGKey(0), params)
        self.obs_shape = tuple(obs.shape)
        self.obs_dtype = obs.dtype
        self.max_episode_steps = int(getattr(params, "max_steps_in_episode", 0)) or None

    def reset(self, key: jax.Array):
        keys = jax.random.split(key, self.num_envs)
        obs, state = jax.vmap(self.env.reset, in_axes=(0, None))(keys, self.params)
        return state, obs

    def step(self, env_state, action: jax.Array, key: jax.Array, restart: bool = True):
        """gymnax's step always auto-resets (its resets are cheap); `restart=False` (the caller reads no env
        after its episode ends) changes nothing."""
        keys = jax.random.split(key, self.num_envs)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(
            self.env.step, in_axes=(0, 0, 0, None)
        )(keys, env_state, action, self.params)
        ts = Timestep(obs=obs, reward=reward.astype(jnp.float32), terminated=terminated.astype(bool),
                      truncated=truncated.astype(bool), next_obs=info["final_observation"])
        return env_state, ts


def make_source(env_cfg: Any, num_envs: int, seed: int = 0, envs_per_recv: int | None = None) -> GymnaxSource:
    """Build the source from an `EnvConfig` (or its yaml section); the registry's contract
    (rl/envs/__init__.py). `seed` and `envs_per_recv` are unused: gymnax draws from the keys `reset`/`step`
    take, and every step returns all envs."""
    from rl.config import to_dataclass

    cfg = to_dataclass(EnvConfig, env_cfg, "env")
    env, params = gymnax.make(cfg.id)
    if cfg.params:
        known = {f.name for f in dataclasses.fields(params)}
        unknown = sorted(set(cfg.params) - known)
        if unknown:
            raise ValueError(f"env.params: {unknown} are not parameters of {cfg.id}; known: {sorted(known)}")
        params = params.replace(**cfg.params)
    if cfg.sticky_actions > 0:
        env = StickyActionWrapper(env, cfg.sticky_actions)
    if cfg.obs_features is not None:
        env = ObservationFeatureWrapper(env, cfg.obs_features, params)
    return GymnaxSource(env, params, num_envs)
