"""Counted sampling weights of the sequence buffer: the weights follow from each row's `written` count.

Used when there are no priorities, `start="any"`, not `complete_only`, and `cross_episodes` or
`length_power == 0`: then a start's weight depends only on its row's `written` count (its remaining length
is `min(written - a, L)`, before any episode cap, which does not change the weight when `length_power`
is 0). No per-slot state is kept (`init` returns None) and `add` is the row write alone.

`sample_starts` picks an env by an inverse CDF over per-env totals, then either one of its full-length
aligned starts (uniformly) or one of its last `ceil(L/period)` (shorter) starts: O(B * (E + L/period))
plus the gather. Without `cross_episodes` the sampled `remaining` is capped just after the first done of
the window, read from the gathered steps (the gather the sample makes anyway).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from buffers import checks, rows
from buffers.rows import RowState
from buffers.starts import SequenceRules, Starts, pick


@dataclasses.dataclass(frozen=True)
class CountedWeights:
    """The `WeightStrategy` (see `buffers/starts.py`) that keeps no state."""

    rules: SequenceRules

    def init(self) -> None:
        return None

    def after_write(self, rows_state: RowState, w, done_new, abs_new, row) -> None:
        return None

    def weight_of(self, written, abs_start):
        """Weight of starts `abs_start` given their rows' `written` (any common shape)."""
        r = self.rules
        present = (abs_start >= jnp.maximum(written - r.capacity_per_env, 0)) & (abs_start < written)
        rem = jnp.where(present, jnp.minimum(written - abs_start, r.sequence_length), 0)
        return r.weight(rem, None, None, abs_start)

    def base_of(self, rows_state: RowState, w, env, abs_start):
        return self.weight_of(rows_state.written[env], abs_start)

    def _abs_of_slots(self, rows_state: RowState, slots):
        """Row and absolute step held at each slot (negative where the row never reached that position)."""
        T = self.rules.capacity_per_env
        env, pos = slots // T, slots % T
        newest = rows_state.written[env] - 1
        return env, newest - (newest - pos) % T

    def slot_weights(self, rows_state: RowState, w):
        env, a = self._abs_of_slots(rows_state, jnp.arange(self.rules.num_slots))
        return self.base_of(rows_state, w, env, a)

    def remaining_of(self, rows_state: RowState, w, slots):
        env, a = self._abs_of_slots(rows_state, slots)
        rem = jnp.minimum(rows_state.written[env] - a, self.rules.sequence_length)
        return self._episode_cap(rows_state, env, slots % self.rules.capacity_per_env, rem)

    def _per_row(self, written):
        """Per env: first aligned stored start a0, count of full-length aligned starts, the last
        ceil(L/period) aligned starts `tail [E, K]` with their weights (0 unless stored and shorter than L),
        and each env's total weight."""
        P, L, T = self.rules.period, self.rules.sequence_length, self.rules.capacity_per_env
        lo = jnp.maximum(written - T, 0)
        a0 = -(-lo // P) * P
        n = jnp.maximum(-(-(written - a0) // P), 0)
        tail = ((written - 1) // P * P)[:, None] - P * jnp.arange(-(-L // P))[None, :]
        in_tail = (tail >= a0[:, None]) & (written[:, None] - tail < L)
        tail_w = jnp.where(in_tail, self.weight_of(written[:, None], tail), 0.0)
        n_full = n - jnp.sum(in_tail, axis=1)
        full_w = float(L) ** self.rules.length_power
        totals = n_full.astype(jnp.float32) * full_w + jnp.sum(tail_w, axis=1)
        return a0, n_full, tail, tail_w, full_w, totals

    def total(self, rows_state: RowState, w):
        return jnp.sum(self._per_row(rows_state.written)[-1])

    def sample_starts(self, rows_state: RowState, w, key, batch_size: int) -> Starts:
        r = self.rules
        written = rows_state.written
        a0, n_full, tail, tail_w, full_w, totals = self._per_row(written)
        k_env, k_in = jax.random.split(key)
        total = jnp.sum(totals)
        env, _ = pick(totals[None, :], jax.random.uniform(k_env, (batch_size,)) * total)
        u = jax.random.uniform(k_in, (batch_size,)) * totals[env]
        full_mass = n_full[env].astype(jnp.float32) * full_w
        in_full = (u < full_mass) | (jnp.sum(tail_w[env], axis=1) <= 0)
        k_full = jnp.clip(jnp.floor(u / full_w).astype(jnp.int32), 0, jnp.maximum(n_full[env] - 1, 0))
        j, _ = pick(tail_w[env], u - full_mass)
        a = jnp.where(in_full, a0[env] + k_full * r.period, tail[env, j])
        weight = jnp.where(in_full, full_w, tail_w[env, j])
        ok = total > 0
        probs = jnp.where(ok, weight / jnp.where(ok, total, 1.0), 0.0)
        rem = jnp.where(ok, jnp.minimum(written[env] - a, r.sequence_length), 0)
        a = jnp.where(ok, a, 0)
        env = jnp.where(ok, env, 0)
        T = r.capacity_per_env
        return r.make_starts(env * T + a % T, self._episode_cap(rows_state, env, a % T, rem), probs)

    def _episode_cap(self, rows_state: RowState, env, pos, rem):
        """Cap `rem [B]` just after the first done in each window (unless `cross_episodes`). Reads done_fn
        of the `[B, L]` windows, the same gather the sample makes anyway."""
        L = self.rules.sequence_length
        if self.rules.cross_episodes or L == 1:  # one step: rem <= 1 already, whatever its done flag
            return rem
        window = rows.gather(rows_state, env, pos, length=L)
        done = jnp.asarray(self.rules.done_fn(window)).astype(bool)
        if done.shape != rem.shape + (L,):
            raise checks.BufferInputError(f"done_fn of [B, L] steps must have shape {rem.shape + (L,)}, "
                                          f"received {done.shape}")
        first = jnp.min(jnp.where(done, jnp.arange(L)[None, :], L - 1), axis=1)
        return jnp.minimum(rem, first + 1)
