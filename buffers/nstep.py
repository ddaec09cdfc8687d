"""n-step transitions sampled from per-env rows (DQN n-step), respecting episode ends.

Steps are stored in the step format of `rl/learning/agent.py`: a mapping (or attribute object) with `obs`, `action`,
`reward`, `terminated`, `truncated` and `next_obs` (the pre-reset observation after the action). The rows
are those of a sequence buffer with `L = n` that never crosses an episode end (`done = terminated |
truncated`), so a sampled window holds `k <= n` valid steps: `n`, or fewer when the episode ended inside it
or the row's newest step is reached. For a window starting at step t with k valid steps:

    reward   = sum_{i<k} gamma^i r_{t+i}
    discount = gamma^k * (1 - terminated_{t+k-1})      # truncation and the row's head bootstrap
    next_obs = next_obs_{t+k-1}

so the target is `reward + discount * Q(next_obs)`. Empty buffer: probabilities 0, reward 0, discount 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from buffers import checks, rows, sumtree
from buffers.sequences import SequenceBuffer, SequenceState, make_sequence_buffer

NSTEP_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")


def _field(step, name):
    return step[name] if isinstance(step, Mapping) else getattr(step, name)


def _done(step):
    return jnp.logical_or(_field(step, "terminated"), _field(step, "truncated"))


@struct.dataclass
class NStepSample:
    obs: Any  # [B, ...] observation of the first step
    action: Any  # [B, ...] action of the first step
    reward: jax.Array  # [B] float32 discounted reward sum over the valid window
    discount: jax.Array  # [B] float32 gamma^k * (1 - terminated of the last valid step)
    next_obs: Any  # [B, ...] next_obs of the last valid step
    env_ids: jax.Array  # [B] int32
    slots: jax.Array  # [B] int32 (for set_priorities)
    probabilities: jax.Array  # [B] float32


@dataclasses.dataclass(frozen=True)
class NStepBuffer:
    sequences: SequenceBuffer
    n: int
    gamma: float

    def init(self, prototype) -> SequenceState:
        """Empty state for steps like `prototype` (must hold the fields of NSTEP_FIELDS)."""
        for name in NSTEP_FIELDS:
            try:
                _field(prototype, name)
            except (KeyError, AttributeError, TypeError) as e:
                raise checks.BufferInputError(
                    f"n-step steps need the fields {NSTEP_FIELDS}; the prototype has no {name!r}") from e
        return self.sequences.init(prototype)

    def add(self, state: SequenceState, steps, env_ids, mask=None) -> SequenceState:
        return self.sequences.add(state, steps, env_ids, mask)

    def peek(self, state: SequenceState, env_ids) -> Any:
        return self.sequences.peek(state, env_ids)

    def set_priorities(self, state: SequenceState, slots, priorities) -> SequenceState:
        return self.sequences.set_priorities(state, slots, priorities)

    def can_sample(self, state: SequenceState) -> jax.Array:
        return self.sequences.can_sample(state)

    def size(self, state: SequenceState) -> jax.Array:
        return self.sequences.size(state)

    def sample(self, state: SequenceState, key, batch_size: int, gamma=None) -> NStepSample:
        """`batch_size` n-step transitions (uniform over stored steps, or by priority); `gamma`: the discount
        in place of the buffer's, possibly traced (a population member's)."""
        gamma = self.gamma if gamma is None else gamma
        st = self.sequences.sample_starts(state, key, batch_size)
        T, n = self.sequences.capacity_per_env, self.n
        k = st.remaining
        last = (st.positions + jnp.maximum(k, 1) - 1) % T
        first = rows.gather(state.rows, st.env_ids, st.positions)
        if n == 1:  # last == positions: one gather serves all three reads
            final, rewards = first, _field(first, "reward")[:, None]
        else:
            final = rows.gather(state.rows, st.env_ids, last)
            rewards = _field(rows.gather(state.rows, st.env_ids, st.positions, length=n), "reward")
        valid = jnp.arange(n)[None, :] < k[:, None]
        g = jnp.asarray(gamma, jnp.float32) ** jnp.arange(n, dtype=jnp.float32)
        reward = jnp.sum(jnp.where(valid, rewards.astype(jnp.float32) * g, 0.0), axis=1)
        term = _field(final, "terminated").astype(jnp.float32)
        discount = jnp.where(k > 0, jnp.asarray(gamma, jnp.float32) ** k.astype(jnp.float32) * (1.0 - term), 0.0)
        return NStepSample(obs=_field(first, "obs"), action=_field(first, "action"), reward=reward,
                           discount=discount, next_obs=_field(final, "next_obs"),
                           env_ids=st.env_ids, slots=st.slots, probabilities=st.probabilities)


def make_nstep_buffer(num_envs: int, capacity_per_env: int, n: int, gamma: float,
                      priority_exponent: float | None = None, min_size: int = 1, fanout: int = sumtree.DEFAULT_FANOUT,
                      debug: bool = False) -> NStepBuffer:
    """n-step transitions over per-env rows; `capacity_per_env > n`. See the module docstring."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    seq = make_sequence_buffer(num_envs, capacity_per_env, n, cross_episodes=False,
                               priority_exponent=priority_exponent, done_fn=_done, min_size=min_size,
                               fanout=fanout, debug=debug, layout="packed")
    return NStepBuffer(sequences=seq, n=n, gamma=float(gamma))
