"""The Sebulba learner: one jitted, donated update per actor chunk, and the totals it logs.

`Learner(agent, num_envs, on_nonfinite).update(agent_state, buffer_state, key, totals, chunk, write,
num_updates, env_steps)` writes the chunk's K recvs by env_id (`buffer.add(steps, env_ids, mask)`: reset
steps write nothing; `write=False`: nothing is written nor counted, the call only trains), then runs up to
`num_updates` guarded train steps (rl/runners/guard.py; each only if the buffer can sample). Agent state,
buffer, key and totals are donated: only the learner thread touches them.

A chunk whose train steps take long (R2D2 on Atari on a CPU: ~20 s each) is trained in several calls of at
most `cap()` steps (about `SUBCHUNK_S` seconds at the measured seconds per step, `record`), so the host loop
can answer a signal between them; the runner carries the steps still owed (rl/runners/sebulba.py).

Replay ratio as in Anakin (rl/learning/replay_ratio.py): one train step per `agent.train_interval * num_envs`
env steps received, from the first multiple of it that reaches `agent.learning_starts` (`updates_due`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl.infra import xla_cpu
from rl.learning.replay_ratio import ReplayRatio
from rl.runners import guard
from rl.runners.sebulba_actor import Chunk
from rl.runners.totals import Totals


class Learner:
    def __init__(self, agent, num_envs: int, on_nonfinite: str = "stop"):
        self.agent = agent
        # Jitted so its trace is shared by `zero_totals` (the metric names) and `update` (JAX caches a jitted
        # function's trace by input types).
        self.train_step = jax.jit(guard.guard(agent.train_step, on_nonfinite))
        self.ratio = ReplayRatio.of(agent, num_envs)
        self.update = jax.jit(self._update, donate_argnums=(0, 1, 2, 3), compiler_options=xla_cpu.loop_options())
        self.step_s: float | None = None  # measured seconds per train step (None: not yet)

    def zero_totals(self, agent_state, buffer_state) -> Totals:
        # The metric names, from an abstract train step traced once (asked for at every sub-chunk).
        if getattr(self, "_names", None) is None:
            metrics, bad = jax.eval_shape(self.train_step, agent_state, buffer_state, jax.random.PRNGKey(0))[2:]
            self._names = (tuple(metrics), tuple(bad))
        return Totals.zeros(1, *self._names)

    def _update(self, agent_state, buffer_state, key, totals: Totals, chunk: Chunk, write, num_updates, env_steps):
        agent = self.agent
        if not jax.sharding.get_abstract_mesh().empty:
            # Several processes hand in the chunk split by process: gathered once here, every recv's write
            # runs on the learner devices without the ~14 collectives per recv that writing the split chunk
            # took (each device keeps the rows it holds).
            chunk = jax.lax.with_sharding_constraint(chunk, jax.sharding.PartitionSpec())

        def add(b, row):
            steps, ids, mask = row
            return agent.buffer.add(b, steps, ids, mask & write), None

        buffer_state, _ = jax.lax.scan(add, buffer_state, (chunk.steps, chunk.env_ids, chunk.mask))

        def train(c):
            s, b, k, t = c
            k, sub = jax.random.split(k)
            s, b, m, bad = self.train_step(s, b, sub)
            return s, b, k, t.add_update(m, bad, True, env_steps)

        def body(_, c):
            return jax.lax.cond(agent.buffer.can_sample(c[1]), train, lambda c: c, c)

        agent_state, buffer_state, key, totals = jax.lax.fori_loop(
            0, num_updates, body, (agent_state, buffer_state, key, totals))
        ep = chunk.episodes
        ended = (ep.ended & write).astype(jnp.float32)
        totals = totals.add_episodes(ended.sum(), (ep.score * ended).sum(), (ep.length * ended).sum())
        return agent_state, buffer_state, key, guard.check_state(totals, agent_state, env_steps)

    @property
    def train_from(self) -> int:
        """The env step at which the first train step is owed."""
        return self.ratio.first_update

    def cap(self, budget_s: float) -> int:
        """Train steps per call: about `budget_s` seconds of them (1 until measured)."""
        return 1 if self.step_s is None else max(int(budget_s / self.step_s), 1)

    def record(self, num_updates: int, seconds: float) -> None:
        """A call ran `num_updates` train steps (and wrote a chunk) in `seconds`, waited for."""
        if num_updates > 0:
            self.step_s = seconds / num_updates

    def updates_due(self, env_steps: int) -> int:
        """Train steps owed after `env_steps` env steps (cumulative)."""
        return self.ratio.updates_due(env_steps)
