"""JAX env libraries (XLand-MiniGrid, navix, Craftax, POPGym Arcade) as batched, auto-resetting, jittable
sources for the Anakin runner: the one contract their adapters (`rl/envs/<lib>_source.py`) fill in.

An adapter describes ONE env of its library, without auto-reset, as a `SingleEnv`:

    reset(key) -> (state, obs [*obs_shape])
    step(key, state, action [] int32) -> (state, obs [*obs_shape], reward [], terminated [] bool, truncated [] bool)

`JaxEnvSource(single, num_envs)` is then the source the registry expects (rl/envs/__init__.py), with the
surface of `rl.envs.gymnax_source.GymnaxSource`: `reset`/`step` vmapped over `E = num_envs` envs and pure
(usable inside jit / scan / vmap over seeds):

    reset(key) -> (env_state, obs [E, *obs_shape])
    step(env_state, action [E], key, restart=True) -> (env_state, Timestep)

Where an episode ends (`terminated | truncated`) the env restarts from a fresh `reset` drawn from the step's
key: `Timestep.obs` is the new episode's first observation and `Timestep.next_obs` the observation the action
led to, so a truncated step bootstraps from it and only `terminated` stops bootstrapping. By default every env
draws its own reset at every step (the where-selected one is used). `JaxEnvSource(single, E, resets=n)` with
n < E draws only n fresh resets per step, shared by the envs that end: the j-th env to end (in env order) takes
fresh reset `j mod n`, so envs share a start only when more than n end at once (Craftax's optimistic reset,
for libraries whose reset costs more than a step: Craftax generates a world). `restart=False` skips the
auto-reset, for a caller that reads no env after its episode ends (greedy evaluation: on Craftax-Classic 3.5x
faster, no world generated per env per step). Termination and
truncation stay apart (each adapter reads them from its library), observations keep the library's dtype
(uint8 grids and pixels stay uint8), rewards are float32. Episode returns and lengths are the runner's
(`rl.envs.episodes.EpisodeStats`).

Helpers for adapters: `require` imports a library or fails with one line naming its extra, `check_id` refuses
an unknown task id with one line, `discrete_actions` refuses a non-discrete action space with one line,
`gymnax_style` builds a `SingleEnv` from a library with gymnax's `reset_env`/`step_env` API (Craftax, POPGym
Arcade).

A `SingleEnv` may carry `render(state) -> [H, W, 3]` uint8, its library's drawing of one env's state, which
`--video` films (rl/envs/jax_video.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl.config import ConfigError
from rl.envs.gymnax_source import Timestep


@dataclasses.dataclass(frozen=True)
class SingleEnv:
    """One env of a library, unbatched and without auto-reset (the adapter's part of the contract)."""

    name: str  # the task id, for messages
    num_actions: int
    reset: Callable[[jax.Array], tuple[Any, jax.Array]]
    step: Callable[[jax.Array, Any, jax.Array], tuple[Any, jax.Array, jax.Array, jax.Array, jax.Array]]
    max_episode_steps: int | None  # the library's time limit (greedy evaluation stops there), None: unknown
    # The library's own drawing of one env's state (as `reset`/`step` return it, unbatched) -> [H, W, 3] uint8,
    # called on the host by the videos (rl/envs/jax_video.py); None: the library draws none.
    render: Callable[[Any], np.ndarray] | None = None


class JaxEnvSource:
    """`num_envs` copies of one `SingleEnv`, vmapped, with auto-reset (the module docstring's contract)."""

    def __init__(self, env: SingleEnv, num_envs: int, resets: int | None = None):
        self.env, self.num_envs = env, int(num_envs)
        if resets is not None and not 1 <= resets <= self.num_envs:
            raise ValueError(f"{env.name}: fresh resets per step must be in 1..{self.num_envs} (num_envs), "
                             f"got {resets}")
        self.resets = None if resets in (None, self.num_envs) else int(resets)  # None: one per env
        self.num_actions = int(env.num_actions)
        self.max_episode_steps = env.max_episode_steps
        obs = jax.eval_shape(lambda k: env.reset(k)[1], jax.random.PRNGKey(0))
        self.obs_shape, self.obs_dtype = tuple(obs.shape), obs.dtype

    def reset(self, key: jax.Array):
        state, obs = jax.vmap(self.env.reset)(jax.random.split(key, self.num_envs))
        return _strong(state), obs

    def _step_one(self, key: jax.Array, state, action: jax.Array, restart: bool = True):
        k_step, k_reset = jax.random.split(key)
        fresh = self.env.reset(k_reset) if restart else None
        return self._restarted(self.env.step(k_step, state, action), fresh)

    def _restarted(self, stepped, fresh):
        """`(state, Timestep)` of a step's outputs `stepped` = (state, next_obs, reward, terminated, truncated)
        with the state and obs of `fresh` = (state, obs) (same leading dims) where the episode ended; `fresh`
        None: no restart (the step's own state, `obs` = `next_obs`)."""
        state, next_obs, reward, terminated, truncated = stepped
        next_obs = obs = next_obs.astype(self.obs_dtype)
        terminated, truncated = jnp.asarray(terminated, bool), jnp.asarray(truncated, bool)
        if fresh is not None:
            done = terminated | truncated

            def pick(new, current):
                return jnp.where(done.reshape(done.shape + (1,) * (current.ndim - done.ndim)), new, current)

            state = jax.tree_util.tree_map(pick, fresh[0], state)
            obs = pick(fresh[1].astype(self.obs_dtype), next_obs)
        ts = Timestep(obs=obs, reward=jnp.asarray(reward, jnp.float32), terminated=terminated,
                      truncated=truncated & ~terminated, next_obs=next_obs)
        return state, ts

    def step(self, env_state, action: jax.Array, key: jax.Array, restart: bool = True):
        """`restart=False`: no auto-reset (for a caller that reads no env after its episode ends, as greedy
        evaluation does: an ended env keeps stepping from its last state, `Timestep.obs` is `next_obs`); the
        steps up to each env's end are those of `restart=True` without shared resets (the same keys)."""
        if restart and self.resets is not None:
            return self._step_shared_resets(env_state, action, key)
        keys = jax.random.split(key, self.num_envs)
        step_one = functools.partial(self._step_one, restart=restart)
        state, ts = jax.vmap(step_one)(keys, env_state, action.astype(jnp.int32))
        return _strong(state), ts

    def _step_shared_resets(self, env_state, action: jax.Array, key: jax.Array):
        """`step` with `resets` fresh resets shared by the envs that end (the module docstring): env e steps with
        key `split(split(key)[0], E)[e]`, fresh reset j is drawn from `split(split(key)[1], resets)[j]`."""
        k_step, k_reset = jax.random.split(key)
        stepped = jax.vmap(self.env.step)(jax.random.split(k_step, self.num_envs), env_state,
                                          action.astype(jnp.int32))
        done = jnp.asarray(stepped[3], bool) | jnp.asarray(stepped[4], bool)
        fresh_state, fresh_obs = jax.vmap(self.env.reset)(jax.random.split(k_reset, self.resets))
        slot = (jnp.cumsum(done) - 1) % self.resets  # [E]: the j-th env to end takes fresh reset j mod n
        fresh = (jax.tree_util.tree_map(lambda x: x[slot], fresh_state), fresh_obs[slot])
        state, ts = self._restarted(stepped, fresh)
        return _strong(state), ts


def _strong(tree):
    """`tree` without weak types (a library's `jnp.asarray(1.0)` in its state, e.g. xminigrid's `discount`): the
    state a step returns has the types of the one it took, so a compiled loop over it is compiled once (the
    runner's first chunk returns the state the next chunk takes, and a restored checkpoint has no weak types)."""
    return jax.tree_util.tree_map(lambda x: x.astype(x.dtype), tree)


def require(module: str, source: str):
    """Import the library `module` of the source `source`, or fail with one line naming its extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"env.source={source}: the {module} library is not installed ({e}); "
                          f'pip install -e ".[{source}]"') from None


def override_params(params, overrides: dict | None, env_id: str):
    """The library's env params (a dataclass with `replace`) with `env.params` `overrides`; an unknown name is
    refused in one line listing the known ones."""
    if not overrides:
        return params
    known = sorted(params.__dataclass_fields__)
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"env.params: {unknown} are not parameters of {env_id}; known: {known}")
    return params.replace(**overrides)


def check_id(source: str, env_id: str, known: Sequence[str]) -> None:
    """Refuse a task id the library does not register, with one line listing the ones it does."""
    if env_id not in known:
        raise ValueError(f"env.id={env_id!r} is not a {source} task; known ids: {', '.join(known)}")


def discrete_actions(env_id: str, space: Any) -> int:
    """The number of actions of a discrete action space (gymnax's `Discrete(n)`, navix's `Discrete` of
    shape ()); anything else is refused with one line."""
    n = getattr(space, "n", None)
    if type(space).__name__ == "Discrete" and n is None and tuple(getattr(space, "shape", (1,))) == ():
        n = int(space.maximum) + 1  # navix: Discrete.create(n) spans 0..n-1
    if type(space).__name__ != "Discrete" or n is None:
        raise ValueError(f"{env_id}: only discrete action spaces are supported, got {type(space).__name__}")
    return int(n)


def gymnax_style(env, params, name: str, split: Callable, max_episode_steps: int | None) -> SingleEnv:
    """A `SingleEnv` of a gymnax-API env (`reset_env(key, params)`, `step_env(key, state, action, params)
    -> (obs, state, reward, done, info)`, the steps without gymnax's own auto-reset);
    `split(state, done, info) -> (terminated, truncated)` tells the two apart for its library."""

    def reset(key):
        obs, state = env.reset_env(key, params)
        return state, obs

    def step(key, state, action):
        obs, state, reward, done, info = env.step_env(key, state, action, params)
        terminated, truncated = split(state, jnp.asarray(done, bool), info)
        return state, obs, reward, terminated, truncated

    return SingleEnv(name=name, num_actions=discrete_actions(name, env.action_space(params)),
                     reset=reset, step=step,
                     max_episode_steps=max_episode_steps)
