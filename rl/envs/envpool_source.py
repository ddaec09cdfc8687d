"""envpool as an asynchronous data source: recv batches in arbitrary env order -> per-env step-format data.

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

`track` is the per-recv bookkeeping (pure, jittable): for each env it keeps the observation and action of
its last act, so a recv for env `e` yields the transition `(obs[e], action[e], reward, terminated,
truncated, next_obs)`, valid unless the recv is a reset step. It also keeps per-env episode statistics
(score and length), which end at game over or truncation and never carry across either.

Shapes: E = num_envs, M = batch_size (envs per recv).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

# envpool builds gymnasium Boxes from float64 bounds with a float32 dtype at every make: gymnasium warns
# "Box low's/high's precision lowered by casting to float32" each time. Harmless; keep the console clean.
warnings.filterwarnings("ignore", message=r".*Box (low|high)'s precision lowered by casting", category=UserWarning)

import envpool
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rl.envs.episodes import Episodes, EpisodeStats

PyTree = Any

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


def make_source(task_id: str, num_envs: int, batch_size: int, seed: int = 0, num_threads: int = 0,
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


# --------------------------------------------------------------------------------------------------------
# Per-env bookkeeping: recv -> transitions (pure, jittable).


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
