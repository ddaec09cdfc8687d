"""Evaluation: run the agent's evaluation policy (`act(..., explore=False)`) for K whole episodes.

* `evaluate(agent, agent_state, source, key)`: K = `source.num_envs` episodes in parallel, one per env,
  inside jit; returns returns `[K]` and lengths `[K]`. `seeds_evaluator(agent, source)`: vmapped over
  seeds, jitted once.

Saved runs of either source are evaluated by `rl.experiment.evaluate_run` (`python -m scripts.evaluate`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
        env_state, ts = source.step(env_state, action, k_env)
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

    @jax.jit
    def fn(agent_states, key):
        num_seeds = jax.tree_util.tree_leaves(agent_states)[0].shape[0] // members
        keys = jnp.concatenate([jax.random.split(key, num_seeds)] * members)
        return jax.vmap(lambda s, k: evaluate(agent, s, source, k))(agent_states, keys)

    return fn
