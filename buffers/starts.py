"""Start slots of the sequence buffer: the weight rule, sampled starts, and the weight-strategy interface.

A start slot is `slot = env * T + pos` (see `buffers/sequences.py`, which states the sampling rules).
`SequenceRules` is the static configuration every piece shares: eligibility and the length weighting of a
start, the `done_fn` check, and the gather of sampled windows. A `WeightStrategy` holds the replay
distribution over start slots: `buffers/counted.py` (weights follow from each row's `written` count, no
state) or `buffers/tree_weights.py` (a sum tree, optionally times priorities). `buffers/online.py` samples
the online queue through the same interface.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from buffers import checks, rows
from buffers.rows import RowState


@struct.dataclass
class SequenceSample:
    data: Any  # pytree of [B, L, ...]
    mask: jax.Array  # [B, L] bool: valid steps
    env_ids: jax.Array  # [B] int32
    slots: jax.Array  # [B] int32: env * T + start position (pass to set_priorities)
    probabilities: jax.Array  # [B] float32: probability this start had under its sampling distribution


@struct.dataclass
class Starts:
    """Sampled starts before any data is gathered (used by `nstep.py`)."""

    env_ids: jax.Array  # [B] int32
    positions: jax.Array  # [B] int32 start position in the row
    remaining: jax.Array  # [B] int32 valid steps (0 when nothing could be sampled)
    slots: jax.Array  # [B] int32
    probabilities: jax.Array  # [B] float32


def pick(weights, u):
    """Inverse CDF over the last axis: index j with cum[j-1] <= u < cum[j], never a zero weight while the
    row's total is positive; `weights [B or 1, K]`, `u [B]` -> `(j [B], u - cum[j-1])`."""
    cum = jnp.cumsum(weights, axis=-1)
    cum = jnp.broadcast_to(cum, (u.shape[0], cum.shape[-1]))
    w = jnp.broadcast_to(weights, cum.shape)
    j = jnp.sum(cum <= u[:, None], axis=-1)
    last_nonzero = jnp.max(jnp.where(w > 0, jnp.arange(w.shape[-1]), 0), axis=-1)
    j = jnp.minimum(j, last_nonzero)
    below = jnp.take_along_axis(cum - w, j[:, None], axis=-1)[:, 0]
    return j, jnp.maximum(u - below, 0.0)


@dataclasses.dataclass(frozen=True)
class SequenceRules:
    """Which starts are eligible and how they are weighted (the options of `make_sequence_buffer`)."""

    num_envs: int
    capacity_per_env: int
    sequence_length: int
    period: int
    start: str
    cross_episodes: bool
    complete_only: bool
    length_power: float
    done_fn: Callable

    @property
    def num_slots(self) -> int:
        return self.num_envs * self.capacity_per_env

    def done_of(self, steps) -> jax.Array:
        """`done_fn(steps)` of a batch `steps [N, ...]` as `[N]` bool (checked at trace time)."""
        d = jnp.asarray(self.done_fn(steps))
        n = jax.tree_util.tree_leaves(steps)[0].shape[0]
        if d.shape != (n,):
            raise checks.BufferInputError(f"done_fn(steps) must have shape ({n},), received {d.shape}")
        return d.astype(bool)

    def weight(self, rem, prev_done, last_done, abs_start):
        """eligible * rem**power for arrays of starts (any common shape); `prev_done` (the step before the
        start) is read only with `start="episode"`, `last_done` (its last valid step) with `complete_only`."""
        ok = rem > 0
        if self.period > 1:
            ok &= abs_start % self.period == 0
        if self.start == "episode":
            ok &= (abs_start == 0) | prev_done
        if self.complete_only:
            ok &= (rem == self.sequence_length) | last_done
        if self.length_power == 0:
            w = jnp.ones(rem.shape, jnp.float32)
        else:
            w = jnp.power(rem.astype(jnp.float32), jnp.float32(self.length_power))
        return jnp.where(ok, w, 0.0)

    def make_starts(self, slots, rem, probs) -> Starts:
        T = self.capacity_per_env
        return Starts(env_ids=(slots // T).astype(jnp.int32), positions=(slots % T).astype(jnp.int32),
                      remaining=rem, slots=slots.astype(jnp.int32), probabilities=probs)

    def gather(self, rows_state: RowState, st: Starts) -> SequenceSample:
        """The `[B, L]` windows of sampled starts, masked to their `remaining` steps."""
        L = self.sequence_length
        ar = jnp.arange(L)
        data = rows.gather(rows_state, st.env_ids, st.positions, length=L)
        mask = ar[None, :] < st.remaining[:, None]
        return SequenceSample(data=data, mask=mask, env_ids=st.env_ids, slots=st.slots,
                              probabilities=st.probabilities)


class WeightStrategy(Protocol):
    """How the replay weights of the start slots are held. `w` is the strategy's own state (from `init`);
    every method is pure and jittable."""

    def init(self) -> Any: ...

    def after_write(self, rows_state: RowState, w, done_new, abs_new, row) -> Any:
        """Update `w` after `rows.write` stored steps with done flags `done_new [N]` as absolute steps
        `abs_new [N]` of rows `row [N]` (`E` where an entry wrote nothing); `rows_state` is after the write."""

    def base_of(self, rows_state: RowState, w, env, abs_start) -> jax.Array:
        """eligible * remaining**power (no priority) of stored starts `abs_start` in rows `env` (one shape);
        0 where `abs_start` is negative."""

    def remaining_of(self, rows_state: RowState, w, slots) -> jax.Array:
        """Valid steps of the sequences starting at `slots [B]` (stored, eligible starts)."""

    def slot_weights(self, rows_state: RowState, w) -> jax.Array:
        """Replay weight of every slot `[E*T]` (O(E*T), for inspection and tests)."""

    def sample_starts(self, rows_state: RowState, w, key, batch_size: int) -> Starts:
        """`batch_size` starts drawn with probability weight / total (all zeros when the total is 0)."""

    def total(self, rows_state: RowState, w) -> jax.Array:
        """Sum of the replay weights (scalar)."""
