"""The Sebulba learner: one jitted, donated update per actor chunk, and the totals it logs.

`Learner(agent, num_envs, on_nonfinite).update(agent_state, buffer_state, key, totals, chunk, num_updates,
env_steps)` writes the chunk's K recvs by env_id (`buffer.add(steps, env_ids, mask)`: reset steps write
nothing), then runs up to `num_updates` guarded train steps (rl/runners/guard.py; each only if the buffer can
sample). Agent state, buffer, key and totals are donated: only the learner thread touches them.

Replay ratio as in Anakin: one train step per `agent.train_interval * num_envs` env steps received, from
the first multiple of it that reaches `agent.learning_starts` (`updates_due`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rl.runners import guard
from rl.runners.sebulba_actor import Chunk


@struct.dataclass
class Totals:
    """Sums since the last log: episodes ended, their scores and lengths, train steps and metric sums, and
    per metric (and "params") the first env step where it was non-finite (`guard.NOT_SEEN` if none)."""

    episodes: jax.Array
    score: jax.Array
    length: jax.Array
    updates: jax.Array
    metrics: dict
    nonfinite: dict


class Learner:
    def __init__(self, agent, num_envs: int, on_nonfinite: str = "stop"):
        self.agent = agent
        self.train_step = guard.guard(agent.train_step, on_nonfinite)
        self.steps_per_update = num_envs * int(agent.train_interval)
        self.update = jax.jit(self._update, donate_argnums=(0, 1, 2, 3))

    def zero_totals(self, agent_state, buffer_state) -> Totals:
        # The metric names, from an abstract train step traced once (tracing it costs milliseconds: the host
        # loop asks for fresh totals at every log interval, a benchmark at every chunk).
        if getattr(self, "_names", None) is None:
            metrics, bad = jax.eval_shape(self.train_step, agent_state, buffer_state, jax.random.PRNGKey(0))[2:]
            self._names = (tuple(metrics), tuple(bad))
        metrics, bad = self._names

        def zf():  # a distinct buffer per leaf: the totals are donated
            return jnp.zeros((), jnp.float32)

        return Totals(episodes=zf(), score=zf(), length=zf(), updates=jnp.zeros((), jnp.int32),
                      metrics={k: zf() for k in metrics},
                      nonfinite={k: jnp.full((), guard.NOT_SEEN, jnp.int32) for k in bad})

    def _update(self, agent_state, buffer_state, key, totals: Totals, chunk: Chunk, num_updates, env_steps):
        agent = self.agent

        def add(b, row):
            steps, ids, mask = row
            return agent.buffer.add(b, steps, ids, mask), None

        buffer_state, _ = jax.lax.scan(add, buffer_state, (chunk.steps, chunk.env_ids, chunk.mask))

        def train(c):
            s, b, k, t = c
            k, sub = jax.random.split(k)
            s, b, m, bad = self.train_step(s, b, sub)
            metrics = {n: t.metrics[n] + jnp.asarray(m[n], jnp.float32) for n in t.metrics}
            nonfinite = {n: jnp.where((v == guard.NOT_SEEN) & bad[n], env_steps, v) for n, v in t.nonfinite.items()}
            return s, b, k, t.replace(updates=t.updates + 1, metrics=metrics, nonfinite=nonfinite)

        def body(_, c):
            return jax.lax.cond(agent.buffer.can_sample(c[1]), train, lambda c: c, c)

        agent_state, buffer_state, key, totals = jax.lax.fori_loop(
            0, num_updates, body, (agent_state, buffer_state, key, totals))
        ep = chunk.episodes
        ended = ep.ended.astype(jnp.float32)
        totals = totals.replace(episodes=totals.episodes + ended.sum(), score=totals.score + (ep.score * ended).sum(),
                                length=totals.length + (ep.length * ended).sum())
        return agent_state, buffer_state, key, totals

    def updates_due(self, env_steps: int) -> int:
        """Train steps owed after `env_steps` env steps (cumulative)."""
        first = max(math.ceil(self.agent.learning_starts / self.steps_per_update), 1)
        return max(env_steps // self.steps_per_update - first + 1, 0)


def summarise(totals: Totals) -> dict:
    """Host-side log values (per-seed arrays `[1]`) and `nonfinite` from the totals of one log interval."""
    t = jax.device_get(totals)
    n, u = float(t.episodes), int(t.updates)
    out = {"episode_return": np.array([t.score / n if n else np.nan]),
           "episode_length": np.array([t.length / n if n else np.nan]),
           "episodes": np.array([n])}
    for k, v in t.metrics.items():
        out[f"train/{k}"] = np.array([v / u if u else np.nan])
    out["nonfinite"] = {k: int(v) for k, v in t.nonfinite.items()}
    return out
