"""Greedy evaluation, one home for both kinds of source: the agent's evaluation policy
(`act(..., explore=False)`, online parameters) plays one whole episode in each of the K envs of a fresh
source; an env's return stops counting at the end of its first episode; an episode not over within the
step cap is NaN (recv sources) or counted up to the cap (jitted sources, which stop when all are over).

* `evaluate(agent, agent_state, source, key)`: a source with pure `reset`/`step` (gymnax), K =
  `source.num_envs` episodes in parallel inside jit, stepped with `restart=False` (no auto-reset needed);
  returns returns `[K]` and lengths `[K]`.
  `seeds_evaluator(agent, source)`: vmapped over seeds, jitted once (the Anakin runner's).
* `evaluate_recvs(agent, agent_state, source, key)`: a source with `recv`/`send` (envpool in sync mode, K =
  `source.num_envs` = its batch), stepped from the host with a jitted act; returns scores `[K]` (Atari: the
  game's raw score over all lives). The Sebulba runner's, on a pool it opens for the evaluation.

Saved runs of either source are evaluated by `agents.experiment.evaluate_run` (`python -m scripts.evaluate`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rl.infra import xla_cpu
from rl.learning.agent import reset_carry


def evaluate(agent, agent_state, source, key: jax.Array, max_steps: int | None = None):
    """Returns `(returns [K], lengths [K])` of one episode in each of the K envs of `source`.

    Envs whose episode has ended stop accumulating; the loop ends when all have ended or after
    `max_steps` (default: the env's time limit, else 100_000) steps.
    """
    num = source.num_envs
    limit = max_steps or source.max_episode_steps or 100_000
    env_ids = jnp.arange(num)
    k_reset, key = jax.random.split(key)
    env_state, obs = source.reset(k_reset)
    initial = agent.initial_carry(num)

    def cond(c):
        t, done = c[0], c[-1]
        return (t < limit) & ~jnp.all(done)

    def body(c):
        t, env_state, obs, carry, key, returns, lengths, done = c
        key, k_act, k_env = jax.random.split(key, 3)
        action, carry, _ = agent.act(agent_state, obs, carry, k_act, env_ids, explore=False)
        env_state, ts = source.step(env_state, action, k_env, restart=False)  # nothing is read after an end
        live = ~done
        returns = returns + jnp.where(live, ts.reward, 0.0)
        lengths = lengths + live.astype(jnp.int32)
        ended = ts.terminated | ts.truncated
        carry = reset_carry(carry, initial, ended)
        return t + 1, env_state, ts.obs, carry, key, returns, lengths, done | ended

    init = (jnp.zeros((), jnp.int32), env_state, obs, initial, key, jnp.zeros(num, jnp.float32),
            jnp.zeros(num, jnp.int32), jnp.zeros(num, bool))
    out = jax.lax.while_loop(cond, body, init)
    return out[5], out[6]


def seeds_evaluator(agent, source, members: int = 1):
    """`evaluate` vmapped over the leading seed axis and jitted, compiled once per shapes:
    `fn(agent_states, key) -> (returns [S, K], lengths [S, K])`. Keep it to evaluate again without
    recompiling (the evaluations during training). `members`: the rows are members x seeds (a population,
    member-major), and every member's seed j gets the key of seed j."""

    @functools.partial(jax.jit, compiler_options=xla_cpu.loop_options())
    def fn(agent_states, key):
        num_seeds = jax.tree_util.tree_leaves(agent_states)[0].shape[0] // members
        keys = jnp.concatenate([jax.random.split(key, num_seeds)] * members)
        return jax.vmap(lambda s, k: evaluate(agent, s, source, k))(agent_states, keys)

    return fn


def evaluate_recvs(agent, agent_state, source, key: jax.Array, max_recvs: int | None = None) -> np.ndarray:
    """Scores `[K]` of the first episode of each of the K envs of `source` (all in one recv: sync mode),
    acting with `explore=False`; at most `max_recvs` recvs (default: 2 x the task's episode limit + 10).
    Closes `source`."""
    from rl.envs.envpool_tracking import track  # envpool loads only where a recv source is evaluated
    from rl.runners.sebulba_actor import new_tracker

    episodes = source.num_envs
    if source.batch_size != episodes:
        raise ValueError(f"evaluate_recvs needs a sync source (batch_size == num_envs), got "
                         f"batch_size={source.batch_size}, num_envs={episodes}")
    limit = max_recvs or 2 * int(source.env.spec.config.max_episode_steps) + 10
    tracker = new_tracker(agent, agent_state, source, explore=False)

    @jax.jit
    def step(tracker, recv, key):
        def act(o, c):
            return agent.act(agent_state, o, c, key, recv.env_id, explore=False)

        tracker, actions, _, ep = track(tracker, recv, source.observation(recv.obs), act,
                                        agent.initial_carry(episodes))
        return tracker, actions, ep

    scores = np.full(episodes, np.nan)
    source.reset()
    for i in range(limit):
        r = source.recv()
        tracker, actions, ep = step(tracker, r, jax.random.fold_in(key, i))
        source.send(np.asarray(actions), r.env_id)
        ep = jax.device_get(ep)
        for j in np.flatnonzero(ep.ended):
            e = int(ep.env_id[j])
            if np.isnan(scores[e]):
                scores[e] = ep.score[j]
        if not np.isnan(scores).any():
            break
    source.close()
    return scores
