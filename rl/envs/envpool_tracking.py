"""Per-env bookkeeping of envpool's asynchronous recvs (pure, jittable): recv -> transitions.

`track` is the per-recv bookkeeping (pure, jittable): for each env it keeps the observation and action of
its last act, so a recv for env `e` yields the transition `(obs[e], action[e], reward, terminated,
truncated, next_obs)`, valid unless the recv is a reset step. It also keeps per-env episode statistics
(score and length), which end at game over or truncation and never carry across either.

Why a second transition type beside gymnax's `Timestep`: a gymnax step returns every env's outcome at once,
and the Anakin runner adds the action and carry it just used; an envpool recv returns `M` envs in any
order, and each transition is assembled from two recvs of its env (the action and carry stored at the
first, the outcome of the second), so it carries them and a `valid` flag for reset steps.

Shapes: E = num_envs, M = batch_size (envs per recv).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rl.envs.envpool_source import Recv
from rl.envs.episodes import Episodes, EpisodeStats

PyTree = Any


@struct.dataclass
class Tracker:
    """What the actor remembers per env between two recvs of that env. Leading dim E.

    obs / action: the observation the env's last action was taken in, and that action. carry: the recurrent
    state to act with next (after the last act); carry_before: the one the last act started from (stored
    with the step); extras: what the last act returned besides actions (e.g. behaviour logits).
    new_episode: the env's next recv is a reset step (initially all True). stats: running statistics of
    the current (reported) episode, in raw reward and transitions.
    """

    obs: jax.Array
    action: jax.Array
    carry: PyTree
    carry_before: PyTree
    extras: PyTree
    new_episode: jax.Array
    stats: EpisodeStats


@struct.dataclass
class Transition:
    """Step-format data of one recv (leading dim M); entries where `valid` is False are reset steps."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array
    carry: PyTree  # carry the action was chosen with
    extras: PyTree
    valid: jax.Array


def init_tracker(num_envs: int, obs_example, carry: PyTree, extras_example: PyTree) -> Tracker:
    """`carry`: the initial carry for `num_envs` envs (leading dim E); `extras_example`: one env's extras
    (unbatched; shapes and dtypes only)."""
    obs_example = jnp.asarray(obs_example)
    zeros = lambda x: jnp.zeros((num_envs,) + tuple(jnp.shape(x)), jnp.result_type(x))
    return Tracker(obs=zeros(obs_example), action=jnp.zeros((num_envs,), jnp.int32), carry=carry,
                   carry_before=jax.tree_util.tree_map(jnp.copy, carry), extras=jax.tree_util.tree_map(zeros, extras_example),
                   new_episode=jnp.ones((num_envs,), bool), stats=EpisodeStats.zeros(num_envs))


def track(tracker: Tracker, recv: Recv, obs: jax.Array, act: Callable, initial_carry: PyTree
          ) -> tuple[Tracker, jax.Array, Transition, Episodes]:
    """Bookkeeping for one recv. Pure; call inside jit.

    obs: `[M, *obs_shape]` the recv's observations in the agent's layout. act: `act(obs, carry) -> (actions
    [M], carry, extras)` with carry/extras leading dim M. initial_carry: carry of M fresh episodes.
    Returns the updated tracker, the actions to send for `recv.env_id`, the transitions (valid except on
    reset steps) and the episodes this recv ended. The carry of an env is reset to `initial_carry` on its
    reset step, before acting on the new episode's first observation.
    """
    ids = recv.env_id
    take = lambda x: x[ids]
    fresh = tracker.new_episode[ids]
    valid = ~fresh
    transition = Transition(obs=tracker.obs[ids], action=tracker.action[ids], reward=recv.reward,
                            terminated=recv.terminated, truncated=recv.truncated, next_obs=obs,
                            carry=jax.tree_util.tree_map(take, tracker.carry_before),
                            extras=jax.tree_util.tree_map(take, tracker.extras), valid=valid)

    carry_in = jax.tree_util.tree_map(take, tracker.carry)
    carry_in = jax.tree_util.tree_map(
        lambda c, c0: jnp.where(fresh.reshape(fresh.shape + (1,) * (c.ndim - 1)), c0, c), carry_in, initial_carry)
    actions, carry_out, extras = act(obs, carry_in)
    actions = actions.astype(jnp.int32)

    stats, episodes = tracker.stats.update(recv.score, recv.episode_over, env_ids=ids, counted=valid)

    put = lambda dst, src: dst.at[ids].set(src)
    tracker = Tracker(
        obs=put(tracker.obs, obs), action=put(tracker.action, actions),
        carry=jax.tree_util.tree_map(put, tracker.carry, carry_out),
        carry_before=jax.tree_util.tree_map(put, tracker.carry_before, carry_in),
        extras=jax.tree_util.tree_map(put, tracker.extras, extras),
        new_episode=put(tracker.new_episode, recv.terminated | recv.truncated), stats=stats)
    return tracker, actions, transition, episodes
