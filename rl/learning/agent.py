"""The surface every agent exposes, so one Anakin runner and one Sebulba runner serve all of them.

Conventions (E = number of envs, B = batch, L = sequence length):

* Observations arrive batched `[E, *obs_shape]`. Actions are `[E]` int32 (discrete action spaces).
* A *step* is what one env contributes to the replay buffer per env step. The runner calls
  `agent.make_step(...)` and writes the result with `buffer.add(buffer_state, steps, env_ids)`, so each
  env's steps land in its own row in time order (buffers/sequences.py). The step is stored in "step
  format": `obs` is the observation the action was taken in; `reward`, `terminated`, `truncated` are what
  that action produced; `next_obs` (stored only by agents that need it) is the observation after the
  action, *before* any auto-reset (gymnax `info["final_observation"]`, envpool's terminal observation).
  `done = terminated | truncated` (`episode_done`) ends the episode: the next step in the row starts a
  new one. Agents declare what they store once, as a `step_spec` (field -> (source, dtype)); the
  `StepFormat` mixin derives `make_step` and `step_prototype` from it.
* Only `terminated` stops bootstrapping; a truncated episode bootstraps from `next_obs` when stored
  (agents that do not store it treat truncation as the end of the usable return).
* `carry` is the actor's recurrent state, `()` for feed-forward agents. The runner resets it to
  `initial_carry` for envs whose episode ended (`reset_carry`), and passes the carry the actor had *before*
  acting to `make_step`, which is how R2D2 stores the recurrent state at each sequence start.
* `train_step(state, buffer_state, key) -> (state, buffer_state, metrics)` is pure; runners jit it with
  `donate_argnums=(0, 1)` (or run it inside their own jitted scan) so the buffer is updated in place.
  `metrics` is a flat dict of scalars.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp

PyTree = Any


class Agent(Protocol):
    buffer: Any  # a buffers.* object: init(prototype), add(state, steps, env_ids, mask=None), can_sample(state)
    train_interval: int  # vector env steps between two train steps
    learning_starts: int  # env steps (summed over envs) before the first train step

    def init(self, key: jax.Array, obs_example: jax.Array) -> PyTree:
        """Network params, target params, optimiser state, counters. `obs_example` is one obs (no batch)."""

    def initial_carry(self, num_envs: int) -> PyTree:
        """Recurrent state for `num_envs` fresh episodes; `()` for feed-forward agents."""

    def act(self, state: PyTree, obs: jax.Array, carry: PyTree, key: jax.Array, env_ids: jax.Array,
            explore: bool = True) -> tuple[jax.Array, PyTree, dict]:
        """Actions `[E]`, the next carry and extras (e.g. Muesli's behaviour log-probabilities) for the batch
        of `env_ids`; `explore=False`: the evaluation policy."""

    def make_step(self, obs, action, reward, terminated, truncated, next_obs, carry, extras) -> PyTree:
        """The per-env step pytree (leading dim E) written to the buffer (`StepFormat` derives it)."""

    def step_prototype(self, obs_example: jax.Array) -> PyTree:
        """One unbatched step, used for `buffer.init` (`StepFormat` derives it)."""

    def train_step(self, state: PyTree, buffer_state: PyTree, key: jax.Array) -> tuple[PyTree, PyTree, dict]:
        """One learner update from the buffer (which it may also update, e.g. priorities)."""


def episode_done(step) -> jax.Array:
    """`terminated | truncated` of a step (or of stacked steps): the episode ended at it."""
    return step["terminated"] | step["truncated"]


def reset_carry(carry: PyTree, initial: PyTree, done: jax.Array) -> PyTree:
    """Replace the carry of envs where `done` ([E] bool) with the initial carry."""

    def pick(c, c0):
        mask = done.reshape(done.shape + (1,) * (c.ndim - 1))
        return jnp.where(mask, c0, c)

    return jax.tree_util.tree_map(pick, carry, initial)


STEP_SOURCES = ("obs", "action", "reward", "terminated", "truncated", "next_obs", "carry")


def standard_step_spec(obs_dtype: Any, **more: tuple[str, Any]) -> dict[str, tuple[str, Any]]:
    """The `step_spec` fields every agent stores (obs, action, reward, terminated, truncated), plus `more`."""
    return {"obs": ("obs", obs_dtype), "action": ("action", jnp.int32), "reward": ("reward", jnp.float32),
            "terminated": ("terminated", bool), "truncated": ("truncated", bool), **more}


class StepFormat:
    """Mixin: `make_step` and `step_prototype` derived from the agent's `step_spec`.

    `step_spec` maps each stored field to `(source, dtype)`: `source` is one of `make_step`'s arguments
    (`STEP_SOURCES`) or `"extras.<key>"` (an entry of the extras `act` returned); the field is stored as
    `dtype` (None: as given, for the carry). Prototype shapes: the observation's for `obs`/`next_obs`, one
    env's `initial_carry` for `carry` (whose structure the stored carry takes), scalars otherwise.
    """

    step_spec: Mapping[str, tuple[str, Any]]

    def initial_carry(self, num_envs: int) -> PyTree:
        return ()

    def make_step(self, obs, action, reward, terminated, truncated, next_obs, carry, extras) -> dict:
        given = dict(zip(STEP_SOURCES, (obs, action, reward, terminated, truncated, next_obs, carry)))
        step = {}
        for field, (source, dtype) in self.step_spec.items():
            if source == "carry":
                value = jax.tree_util.tree_unflatten(self._carry_structure(), jax.tree_util.tree_leaves(carry))
            else:
                value = extras[source[len("extras."):]] if source.startswith("extras.") else given[source]
            step[field] = value if dtype is None else jnp.asarray(value).astype(dtype)
        return step

    def step_prototype(self, obs_example: jax.Array) -> dict:
        obs_shape = jnp.shape(obs_example)
        step = {}
        for field, (source, dtype) in self.step_spec.items():
            if source == "carry":
                step[field] = jax.tree_util.tree_map(lambda c, d=dtype: jnp.zeros(c.shape[1:], d or c.dtype),
                                                     self.initial_carry(1))
            else:
                shape = obs_shape if source in ("obs", "next_obs") else ()
                step[field] = jnp.zeros(shape, dtype or jnp.result_type(obs_example))
        return step

    def _carry_structure(self):
        return jax.tree_util.tree_structure(jax.eval_shape(lambda: self.initial_carry(1)))
