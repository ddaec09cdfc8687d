"""Observation wrappers for gymnax envs.

`ObservationFeatureWrapper` keeps only some features of a gymnax env's vector observations (reset, step
and `info["final_observation"]`) and narrows the observation space to match (`env.obs_features`).

The memory task of R2D2's proof hides CartPole's velocity components: CartPole observations are
`[x, x_dot, theta, theta_dot]`, so `env.obs_features=[0,2]` keeps the positions and the agent has to infer
velocities from its history.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces
from gymnax.wrappers.purerl import GymnaxWrapper


def _check_indices(indices: Sequence[int], obs_dim: int | None) -> tuple[int, ...]:
    indices = tuple(int(i) for i in indices)
    if not indices:
        raise ValueError("obs_features: `indices` is empty; keep at least one feature")
    if len(set(indices)) != len(indices):
        raise ValueError(f"obs_features: `indices` {indices} has duplicates")
    if obs_dim is not None and any(not 0 <= i < obs_dim for i in indices):
        raise ValueError(
            f"obs_features: `indices` {indices} out of range for observations with {obs_dim} features"
        )
    return indices


class ObservationFeatureWrapper(GymnaxWrapper):
    """A gymnax env whose vector observations keep only the features `indices` (last axis).

    Applies to `reset`, `step` and the pre-reset `info["final_observation"]`; `observation_space` is the
    original Box restricted to `indices`. Usable under jit and vmap like the wrapped env.
    """

    def __init__(self, env, indices: Sequence[int], params=None):
        super().__init__(env)
        space = env.observation_space(env.default_params if params is None else params)
        if not isinstance(space, spaces.Box) or len(space.shape) != 1:
            raise ValueError(
                f"ObservationFeatureWrapper needs a 1-D Box observation space, got {space!r}"
            )
        self._indices = _check_indices(indices, space.shape[0])

    def _select(self, obs: jax.Array) -> jax.Array:
        return obs[..., jnp.asarray(self._indices)]

    def observation_space(self, params) -> spaces.Box:
        space = self._env.observation_space(params)
        take = np.asarray(self._indices)

        def restrict(bound):
            bound = jnp.asarray(bound)
            return bound[take] if bound.ndim else bound

        return spaces.Box(restrict(space.low), restrict(space.high), (len(self._indices),), space.dtype)

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key: jax.Array, params=None):
        obs, state = self._env.reset(key, params)
        return self._select(obs), state

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key: jax.Array, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        info = dict(info)
        if "final_observation" in info:
            info["final_observation"] = self._select(info["final_observation"])
        return self._select(obs), state, reward, terminated, truncated, info
