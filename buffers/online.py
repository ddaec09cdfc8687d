"""The online queue of the sequence buffer: the freshest not-yet-consumed steps of every row (Muesli).

A second pointer over the same rows, `rows.online_start [E]`: per env the last
`min(written - online_start, W)` steps (W = `online_window`) are queued. `sample` draws starts inside the
queue with the replay's eligibility and `remaining ** length_power` (no priority factor), read through the
replay's weight strategy, by a two-level inverse CDF (env, then start within its queue):
O(E*W + B*(E+W)), no loop. `consume` empties the queue.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from buffers.rows import RowState
from buffers.starts import SequenceRules, SequenceSample, WeightStrategy, pick


@dataclasses.dataclass(frozen=True)
class OnlineQueue:
    rules: SequenceRules
    weights: WeightStrategy  # the replay's strategy: eligibility and base weight of a start
    window: int  # W >= 1

    def start_weights(self, rows_state: RowState, w):
        """Slots `[E, W]` of the queued starts and their weights `[E, W]` (0 past each env's queue)."""
        W, T = self.window, self.rules.capacity_per_env
        written = rows_state.written
        queued = jnp.minimum(written - rows_state.online_start, W)
        k = jnp.arange(W)
        a = written[:, None] - queued[:, None] + k[None, :]
        env = jnp.broadcast_to(jnp.arange(self.rules.num_envs)[:, None], a.shape)
        weight = jnp.where(k[None, :] < queued[:, None], self.weights.base_of(rows_state, w, env, a), 0.0)
        return env * T + a % T, weight

    def sample(self, rows_state: RowState, w, key, batch_size: int) -> SequenceSample:
        """`batch_size` sequences starting inside the queue (empty queue: slots 0, probabilities 0, no mask)."""
        slots, weight = self.start_weights(rows_state, w)
        row_tot = jnp.sum(weight, axis=1)  # [E]
        u = jax.random.uniform(key, (batch_size,)) * jnp.sum(row_tot)
        env, u = pick(row_tot[None, :], u)
        k, _ = pick(weight[env], u)
        tot = jnp.sum(row_tot)
        ok = tot > 0
        chosen = jnp.where(ok, slots[env, k], 0)
        probs = jnp.where(ok, weight[env, k] / jnp.where(ok, tot, 1.0), 0.0)
        rem = jnp.where(ok, self.weights.remaining_of(rows_state, w, chosen), 0)
        return self.rules.gather(rows_state, self.rules.make_starts(chosen, rem, probs))

    def can_sample(self, rows_state: RowState, w) -> jax.Array:
        return jnp.sum(self.start_weights(rows_state, w)[1]) > 0

    @staticmethod
    def consume(rows_state: RowState) -> RowState:
        """Mark every stored step consumed: the queue becomes empty."""
        return rows_state.replace(online_start=rows_state.written)
