"""Sequences of length L sampled from per-env rows, with episode awareness, priorities and an online queue.

Storage and writes are those of `buffers/rows.py`: `data [E, T, ...]`, step `a` of env `e` at `[e, a % T]`.
A *start slot* is `(env, pos)`, flat index `slot = env * T + pos`; it stands for the newest absolute step
`a` of that row with `a % T == pos`.

* `remaining(slot)`: valid steps of the sequence starting there, capped at L, at the row's newest step and,
  unless `cross_episodes`, just after the first step whose `done_fn(step)` is True.
* Eligible starts: `a % period == 0`; with `start="episode"` only where the previous step had done (or
  `a == 0`); with `complete_only` only where `remaining == L` or its last valid step has done.
* Weight of a slot: `eligible * remaining ** length_power * priority ** alpha` (the priority factor only
  when `priority_exponent` is not None; new slots get the largest priority set so far, 1 at first; a
  priority that is not a finite positive number, NaN and +-inf included, counts as 0).

Two ways to hold the weights, chosen statically:

* *Counted* (no priorities, `start="any"`, not `complete_only`, and `cross_episodes` or
  `length_power == 0`): a weight depends only on the row's `written` count, so no per-slot state is kept.
  `add` is the row write alone; `sample` picks an env by an inverse CDF over per-env totals, then either
  one of its full-length aligned starts (uniformly) or one of its last `ceil(L/period)` (shorter) starts:
  O(B * (E + L/period)) plus the gather; episode ends cap the mask from the gathered done flags.
* *Tree* (otherwise): weights live in a sum tree over the `E*T` slots (plus one always-zero dummy leaf
  that absorbs masked-out writes); when the period divides T only every period-th slot can be eligible,
  so the tree keeps one leaf per aligned slot (`stride`, a period-times smaller tree: choose T a multiple
  of the period). Adding one step changes the weight of at most the L slots whose window ends
  at it (the newest of which is the slot it overwrites), so `add` refreshes only those (only the
  period-aligned ones and the overwritten one when `period > 1`): O(N * L) plus
  O(N * ceil(L/period) * F * log_F(E*T)) per add. `sample` costs O(B * F * log_F(E*T)) plus the gather.

Either way: no capacity-sized work per add or sample, no while loop; the gather is O(B * L * leaf size).

Online queue (`online_window = W > 0`): per env the last `min(written - online_start, W)` steps are not yet
consumed. `sample_online` draws starts inside the queue with the replay's eligibility and
`remaining ** length_power` (no priority factor) by an O(E * W) cumulative sum; `consume_online` empties
the queue; `sample_mixed` stacks `round(B * online_fraction)` online sequences (first) on replay ones.

Sampling results: `data [B, L, ...]` holds the stored steps at the L positions after the start; positions
where `mask` is False are whatever the row holds there (later/older data or zeros), never to be used.
Empty buffer (no eligible start): `slots` 0, `probabilities` 0, `mask` all False, and `can_sample` False.

Requires `capacity_per_env > sequence_length` (a start's previous step must still be stored while its
weight can change). env_ids follow the write rule of `buffers/rows.py` (ids outside `[0, E)` write nothing,
of a repeated id the last entry is stored and its row advances once); `debug=True` instead rejects them
with `checkify`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from buffers import checks, rows, sumtree
from buffers.priorities import clean_priorities
from buffers.rows import RowState


@struct.dataclass
class SequenceState:
    rows: RowState  # data [E, T, ...], written [E], online_start [E]
    # Tree mode only (shape [0] / None when the weights are counted, see the module docstring):
    done: jax.Array  # [E*T] bool: done_fn of the step stored at each slot
    remaining: jax.Array  # [E*T/stride] int32: remaining of period-aligned slots (others stale), 0 if unwritten
    tree: sumtree.SumTree | None  # E*T/stride + 1 leaves: slot weights, then a dummy leaf that stays 0
    # With priorities only (else shape [0]):
    base: jax.Array  # [E*T/stride] float32 eligible * remaining**power
    priority: jax.Array  # [E*T/stride] float32 priority**alpha
    max_priority: jax.Array  # float32 []: largest raw priority set so far (1 initially)


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


def _pick(weights, u):
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


def _default_done(step):
    return step["done"]


@dataclasses.dataclass(frozen=True)
class SequenceBuffer:
    num_envs: int
    capacity_per_env: int
    sequence_length: int
    period: int = 1
    start: str = "any"
    cross_episodes: bool = True
    complete_only: bool = False
    length_power: float = 0.0
    priority_exponent: float | None = None
    online_window: int = 0
    done_fn: Callable = _default_done
    min_size: int = 1
    fanout: int = sumtree.DEFAULT_FANOUT
    debug: bool = False

    # ---- static helpers -------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return self.num_envs * self.capacity_per_env

    @property
    def stride(self) -> int:
        """Tree mode keeps one leaf per `stride` positions of a row: the period when it divides T (then only
        every period-th position can hold an eligible start), else 1."""
        return self.period if self.capacity_per_env % self.period == 0 else 1

    @property
    def num_leaves(self) -> int:
        return self.num_slots // self.stride

    def _leaf(self, slots):
        """Tree leaf of each slot `env*T + pos` (only meaningful where `pos % stride == 0`)."""
        if self.stride == 1:
            return slots
        T = self.capacity_per_env
        return (slots // T) * (T // self.stride) + (slots % T) // self.stride

    def _slot(self, leaves):
        if self.stride == 1:
            return leaves
        per_row = self.capacity_per_env // self.stride
        return (leaves // per_row) * self.capacity_per_env + (leaves % per_row) * self.stride

    def _on_grid(self, slots):
        """Slots in `[0, E*T)` that have a tree leaf (every slot, or the period-aligned ones when strided)."""
        return (slots >= 0) & (slots < self.num_slots) & (slots % self.capacity_per_env % self.stride == 0)

    @property
    def prioritised(self) -> bool:
        return self.priority_exponent is not None

    @property
    def counted(self) -> bool:
        """True when weights follow from `written` alone (no sum tree kept; see the module docstring)."""
        return (not self.prioritised and self.start == "any" and not self.complete_only
                and (self.cross_episodes or self.length_power == 0))

    def _prototype(self, state: SequenceState):
        return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape[2:], s.dtype), state.rows.data)

    def _done_of(self, steps) -> jax.Array:
        d = jnp.asarray(self.done_fn(steps))
        n = jax.tree_util.tree_leaves(steps)[0].shape[0]
        if d.shape != (n,):
            raise checks.BufferInputError(f"done_fn(steps) must have shape ({n},), received {d.shape}")
        return d.astype(bool)

    def _weight(self, rem, prev_done, last_done, abs_start):
        """eligible * rem**power for arrays of starts (any common shape)."""
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

    def _base_of(self, state: SequenceState, env, abs_start):
        """eligible * remaining**power of starts `abs_start` in rows `env` (both of one shape), which must be
        stored steps (or negative: weight 0)."""
        if self.counted:
            return self._counted_weight(state.rows.written[env], abs_start)
        leaves = self._leaf(env * self.capacity_per_env + abs_start % self.capacity_per_env)
        w = state.base[leaves] if self.prioritised else sumtree.get(state.tree, leaves)
        return jnp.where((abs_start >= 0) & (abs_start % self.stride == 0), w, 0.0)

    def _counted_weight(self, written, abs_start):
        """Counted mode: weight of starts `abs_start` given their rows' `written` (any common shape)."""
        present = (abs_start >= jnp.maximum(written - self.capacity_per_env, 0)) & (abs_start < written)
        rem = jnp.where(present, jnp.minimum(written - abs_start, self.sequence_length), 0)
        return self._weight(rem, None, None, abs_start)

    def _abs_of_slots(self, state: SequenceState, slots):
        """Absolute step held at each slot (negative where the row never reached that position)."""
        T = self.capacity_per_env
        env, pos = slots // T, slots % T
        newest = state.rows.written[env] - 1
        return env, newest - (newest - pos) % T

    def weights(self, state: SequenceState) -> jax.Array:
        """Current sampling weight of every slot `[E*T]` (O(E*T): for inspection and tests, not the hot path)."""
        slots = jnp.arange(self.num_slots)
        if not self.counted:
            w = sumtree.get(state.tree, self._leaf(slots))
            return jnp.where(slots % self.stride == 0, w, 0.0)
        env, a = self._abs_of_slots(state, slots)
        return self._base_of(state, env, a)

    # ---- API ------------------------------------------------------------------------------------------
    def init(self, prototype) -> SequenceState:
        """Empty state for steps shaped like `prototype` (a pytree of scalars / arrays, no batch dim)."""
        proto = checks.as_prototype(prototype)
        try:
            self._done_of(jax.tree_util.tree_map(lambda s: jnp.zeros((1,) + s.shape, s.dtype), proto))
        except (KeyError, AttributeError, TypeError, IndexError) as e:
            raise checks.BufferInputError(f"done_fn cannot read the done flag from the prototype: {e!r}") from e
        n = 0 if self.counted else self.num_leaves
        k = self.num_leaves if self.prioritised else 0
        return SequenceState(
            rows=rows.init_rows(proto, self.num_envs, self.capacity_per_env),
            done=jnp.zeros((0 if self.counted else self.num_slots,), bool),
            remaining=jnp.zeros((n,), jnp.int32),
            tree=None if self.counted else sumtree.init(n + 1, self.fanout),
            base=jnp.zeros((k,), jnp.float32),
            priority=jnp.zeros((k,), jnp.float32),
            max_priority=jnp.ones((), jnp.float32),
        )

    def add(self, state: SequenceState, steps, env_ids, mask=None) -> SequenceState:
        """Write `steps [N, ...]` to rows `env_ids [N]` where `mask [N]` (default all True); see `rows.py` for
        repeated and out-of-range ids."""
        steps, env_ids, mask = rows.prepare_add(self._prototype(state), steps, env_ids, mask)
        if self.debug:
            rows.check_env_ids(env_ids, mask, self.num_envs)
        done_new = self._done_of(steps)
        r, abs_new, row = rows.write(state.rows, steps, env_ids, mask)
        if self.counted:
            return state.replace(rows=r)
        T, L, n = self.capacity_per_env, self.sequence_length, self.num_leaves
        valid_row = row < self.num_envs  # [N] written entries
        env = jnp.clip(env_ids, 0, self.num_envs - 1)
        newest_slot = env * T + abs_new % T
        done = state.done.at[jnp.where(valid_row, newest_slot, self.num_slots)].set(done_new, mode="drop")

        # Done flags of steps a-L .. a (window index 0 .. L) of each written row.
        wabs = abs_new[:, None] + jnp.arange(-L, 1)[None, :]  # [N, L+1]
        wdone = done[env[:, None] * T + wabs % T] & (wabs >= 0)
        # remaining of the start at window index k+1 (abs a-L+1+k), k = 0..L-1, capped at the newest step a.
        k = jnp.arange(L)
        rem = L - k  # [L]
        if not self.cross_episodes:
            first_done = jax.lax.cummin(jnp.where(wdone[:, 1:], k, L - 1), axis=1, reverse=True)  # [N, L]
            rem = jnp.minimum(rem, first_done - k + 1)
        rem = jnp.broadcast_to(rem, (abs_new.shape[0], L))
        # Slots to refresh: every one, or the period-aligned ones, plus the newest when the slot it
        # overwrites may have been aligned while it is not (stride 1: T not a multiple of the period).
        if self.period == 1:
            j = jnp.broadcast_to(k, rem.shape)
        else:
            n_aligned = -(-L // self.period)
            j0 = (-(abs_new - L + 1)) % self.period  # first aligned window offset
            j = j0[:, None] + self.period * jnp.arange(n_aligned)[None, :]
            if self.stride == 1:
                j = jnp.concatenate([j, jnp.full((j.shape[0], 1), L - 1)], axis=1)
        in_window = j < L
        j = jnp.minimum(j, L - 1)
        s_abs = abs_new[:, None] - L + 1 + j
        s_rem = jnp.where(s_abs >= 0, jnp.take_along_axis(rem, j, axis=1), 0)
        prev_done = jnp.take_along_axis(wdone, j, axis=1)
        last_done = jnp.take_along_axis(wdone, j + jnp.maximum(s_rem, 1), axis=1)
        w = self._weight(s_rem, prev_done, last_done, s_abs)
        keep = in_window & valid_row[:, None] & (s_abs >= 0)
        slots = jnp.where(keep, self._leaf(env[:, None] * T + s_abs % T), n).reshape(-1)  # n: dropped / dummy
        remaining = state.remaining.at[slots].set(s_rem.reshape(-1), mode="drop")
        w = jnp.where(keep, w, 0.0).reshape(-1)
        base, priority = state.base, state.priority
        if self.prioritised:
            newest = jnp.where(valid_row & (abs_new % self.stride == 0), self._leaf(newest_slot), n)
            new_p = jnp.power(state.max_priority, jnp.float32(self.priority_exponent))
            priority = priority.at[newest].set(new_p, mode="drop")
            base = base.at[slots].set(w, mode="drop")
            w = w * priority.at[slots].get(mode="fill", fill_value=0.0)
        tree = sumtree.set(state.tree, slots, w)
        return state.replace(rows=r, done=done, remaining=remaining, base=base, priority=priority, tree=tree)

    def peek(self, state: SequenceState, env_ids) -> Any:
        """Latest step of each env `env_ids [N]` -> tree of `[N, ...]` (zeros for a row never written)."""
        checks.check_index_array("env_ids", env_ids)
        env_ids = jnp.asarray(env_ids, jnp.int32)
        if self.debug:
            rows.check_env_ids(env_ids, jnp.ones(env_ids.shape, bool), self.num_envs, distinct=False)
        return rows.peek(state.rows, env_ids)

    def sample_starts(self, state: SequenceState, key, batch_size: int) -> Starts:
        """Draw `batch_size` starts with probability weight / total weight (replay distribution)."""
        if self.counted:
            return self._sample_counted(state, key, batch_size)
        leaves, probs = sumtree.sample(state.tree, key, batch_size)
        leaves = jnp.minimum(leaves, self.num_leaves - 1)
        rem = jnp.where(sumtree.total(state.tree) > 0, state.remaining[leaves], 0)
        return self._starts(self._slot(leaves), rem, probs)

    def _counted_rows(self, written):
        """Per env: first aligned stored start a0, count of full-length aligned starts, the last
        ceil(L/period) aligned starts `tail [E, K]` with their weights (0 unless stored and shorter than L),
        and each env's total weight."""
        P, L, T = self.period, self.sequence_length, self.capacity_per_env
        lo = jnp.maximum(written - T, 0)
        a0 = -(-lo // P) * P
        n = jnp.maximum(-(-(written - a0) // P), 0)
        tail = ((written - 1) // P * P)[:, None] - P * jnp.arange(-(-L // P))[None, :]
        in_tail = (tail >= a0[:, None]) & (written[:, None] - tail < L)
        tail_w = jnp.where(in_tail, self._counted_weight(written[:, None], tail), 0.0)
        n_full = n - jnp.sum(in_tail, axis=1)
        full_w = float(L) ** self.length_power
        totals = n_full.astype(jnp.float32) * full_w + jnp.sum(tail_w, axis=1)
        return a0, n_full, tail, tail_w, full_w, totals

    def _sample_counted(self, state: SequenceState, key, batch_size: int) -> Starts:
        written = state.rows.written
        a0, n_full, tail, tail_w, full_w, totals = self._counted_rows(written)
        k_env, k_in = jax.random.split(key)
        total = jnp.sum(totals)
        env, _ = _pick(totals[None, :], jax.random.uniform(k_env, (batch_size,)) * total)
        u = jax.random.uniform(k_in, (batch_size,)) * totals[env]
        full_mass = n_full[env].astype(jnp.float32) * full_w
        in_full = (u < full_mass) | (jnp.sum(tail_w[env], axis=1) <= 0)
        k_full = jnp.clip(jnp.floor(u / full_w).astype(jnp.int32), 0, jnp.maximum(n_full[env] - 1, 0))
        j, _ = _pick(tail_w[env], u - full_mass)
        a = jnp.where(in_full, a0[env] + k_full * self.period, tail[env, j])
        w = jnp.where(in_full, full_w, tail_w[env, j])
        ok = total > 0
        probs = jnp.where(ok, w / jnp.where(ok, total, 1.0), 0.0)
        rem = jnp.where(ok, jnp.minimum(written[env] - a, self.sequence_length), 0)
        a = jnp.where(ok, a, 0)
        env = jnp.where(ok, env, 0)
        return self._starts(env * self.capacity_per_env + a % self.capacity_per_env,
                            self._episode_cap(state, env, a % self.capacity_per_env, rem), probs)

    def _episode_cap(self, state: SequenceState, env, pos, rem):
        """Counted mode: cap `rem [B]` just after the first done in each window (unless `cross_episodes`).
        Reads done_fn of the `[B, L]` windows, the same gather the sample makes anyway."""
        if self.cross_episodes:
            return rem
        L, T = self.sequence_length, self.capacity_per_env
        window = rows.gather(state.rows, env, (pos[:, None] + jnp.arange(L)[None, :]) % T)
        done = jnp.asarray(self.done_fn(window)).astype(bool)
        if done.shape != rem.shape + (L,):
            raise checks.BufferInputError(f"done_fn of [B, L] steps must have shape {rem.shape + (L,)}, "
                                          f"received {done.shape}")
        first = jnp.min(jnp.where(done, jnp.arange(L)[None, :], L - 1), axis=1)
        return jnp.minimum(rem, first + 1)

    def _starts(self, slots, rem, probs) -> Starts:
        T = self.capacity_per_env
        return Starts(env_ids=(slots // T).astype(jnp.int32), positions=(slots % T).astype(jnp.int32),
                      remaining=rem, slots=slots.astype(jnp.int32), probabilities=probs)

    def _sequences(self, state: SequenceState, st: Starts) -> SequenceSample:
        L, T = self.sequence_length, self.capacity_per_env
        ar = jnp.arange(L)
        data = rows.gather(state.rows, st.env_ids, (st.positions[:, None] + ar[None, :]) % T)
        mask = ar[None, :] < st.remaining[:, None]
        return SequenceSample(data=data, mask=mask, env_ids=st.env_ids, slots=st.slots,
                              probabilities=st.probabilities)

    def sample(self, state: SequenceState, key, batch_size: int) -> SequenceSample:
        """`batch_size` sequences from the replay distribution (see the module docstring)."""
        return self._sequences(state, self.sample_starts(state, key, batch_size))

    def priorities(self, state: SequenceState, slots) -> jax.Array:
        """Stored priority**alpha of `slots [B]` (slots as a sample returns them)."""
        if not self.prioritised:
            raise checks.BufferInputError("priorities needs a buffer made with priority_exponent")
        slots = jnp.asarray(slots, jnp.int32)
        on_grid = self._on_grid(slots)
        return jnp.where(on_grid, state.priority[jnp.where(on_grid, self._leaf(slots), 0)], 0.0)

    def set_priorities(self, state: SequenceState, slots, priorities) -> SequenceState:
        """Set raw priorities (>= 0) of `slots [B]`; stores priority**alpha and tracks the max priority.

        `slots` are those a sample returned. A slot overwritten since it was sampled gets the priority meant
        for its old content; a slot outside `[0, E*T)`, or off the period grid (never a start) when the tree
        is strided, is ignored (nor does it raise the max). NaN, infinite or negative priorities count as 0.
        """
        if not self.prioritised:
            raise checks.BufferInputError("set_priorities needs a buffer made with priority_exponent")
        checks.check_index_array("slots", slots)
        priorities = clean_priorities(priorities)
        if priorities.shape != slots.shape:
            raise checks.BufferInputError(
                f"priorities: expected shape {tuple(slots.shape)} (like slots), received {priorities.shape}")
        slots = jnp.asarray(slots, jnp.int32)
        on_grid = self._on_grid(slots)
        leaves = jnp.where(on_grid, self._leaf(slots), self.num_leaves)  # off the grid: the dummy leaf
        powered = jnp.power(priorities, jnp.float32(self.priority_exponent))
        priority = state.priority.at[leaves].set(powered, mode="drop")
        # Read back so duplicated slots write the same (winning) value to the tree; the dummy leaf stays 0.
        tree = sumtree.set(state.tree, leaves, jnp.where(on_grid, state.base[leaves] * priority[leaves], 0.0))
        max_p = jnp.maximum(state.max_priority, jnp.max(jnp.where(on_grid, priorities, 0.0), initial=0.0))
        return state.replace(priority=priority, tree=tree, max_priority=max_p)

    def size(self, state: SequenceState) -> jax.Array:
        """Steps held over all rows."""
        return rows.stored_steps(state.rows, self.capacity_per_env)

    def can_sample(self, state: SequenceState) -> jax.Array:
        total = (jnp.sum(self._counted_rows(state.rows.written)[-1]) if self.counted
                 else sumtree.total(state.tree))
        return (total > 0) & (self.size(state) >= self.min_size)

    # ---- online queue -----------------------------------------------------------------------------------
    def _online_weights(self, state: SequenceState):
        """Slots [E, W] of the queue starts and their weights [E, W]."""
        W, T = self.online_window, self.capacity_per_env
        if W == 0:
            raise checks.BufferInputError("the online queue needs a buffer made with online_window > 0")
        written = state.rows.written
        queued = jnp.minimum(written - state.rows.online_start, W)
        k = jnp.arange(W)
        a = written[:, None] - queued[:, None] + k[None, :]
        env = jnp.broadcast_to(jnp.arange(self.num_envs)[:, None], a.shape)
        w = jnp.where(k[None, :] < queued[:, None], self._base_of(state, env, a), 0.0)
        return env * T + a % T, w

    def sample_online(self, state: SequenceState, key, batch_size: int) -> SequenceSample:
        """`batch_size` sequences starting inside the online queue, weighted like the replay minus priority.

        Two-level inverse-CDF draw (env, then start within its queue): O(E*W + B*(E+W)), no loop.
        """
        slots, w = self._online_weights(state)
        row_tot = jnp.sum(w, axis=1)  # [E]
        u = jax.random.uniform(key, (batch_size,)) * jnp.sum(row_tot)
        env, u = _pick(row_tot[None, :], u)
        k, _ = _pick(w[env], u)
        tot = jnp.sum(row_tot)
        ok = tot > 0
        chosen = jnp.where(ok, slots[env, k], 0)
        probs = jnp.where(ok, w[env, k] / jnp.where(ok, tot, 1.0), 0.0)
        if self.counted:
            cenv, ca = self._abs_of_slots(state, chosen)
            rem = jnp.minimum(state.rows.written[cenv] - ca, self.sequence_length)
            rem = self._episode_cap(state, cenv, chosen % self.capacity_per_env, rem)
        else:
            rem = state.remaining[self._leaf(chosen)]
        rem = jnp.where(ok, rem, 0)
        return self._sequences(state, self._starts(chosen, rem, probs))

    def can_sample_online(self, state: SequenceState) -> jax.Array:
        return jnp.sum(self._online_weights(state)[1]) > 0

    def consume_online(self, state: SequenceState) -> SequenceState:
        """Mark every stored step consumed: the online queue becomes empty."""
        return state.replace(rows=state.rows.replace(online_start=state.rows.written))

    def sample_mixed(self, state: SequenceState, key, batch_size: int, online_fraction: float) -> SequenceSample:
        """`round(batch_size * online_fraction)` online sequences (first rows), then replay ones."""
        n_on = round(batch_size * float(online_fraction))
        if not 0 <= n_on <= batch_size:
            raise checks.BufferInputError(f"online_fraction must be in [0, 1], received {online_fraction}")
        k_on, k_rb = jax.random.split(key)
        if n_on == 0:
            return self.sample(state, k_rb, batch_size)
        if n_on == batch_size:
            return self.sample_online(state, k_on, batch_size)
        on = self.sample_online(state, k_on, n_on)
        rb = self.sample(state, k_rb, batch_size - n_on)
        return jax.tree_util.tree_map(lambda x, y: jnp.concatenate([x, y], axis=0), on, rb)


def make_sequence_buffer(
    num_envs: int,
    capacity_per_env: int,
    sequence_length: int,
    period: int = 1,
    start: str = "any",
    cross_episodes: bool = True,
    complete_only: bool = False,
    length_power: float = 0.0,
    priority_exponent: float | None = None,
    online_window: int = 0,
    done_fn: Callable = _default_done,
    min_size: int = 1,
    fanout: int = sumtree.DEFAULT_FANOUT,
    debug: bool = False,
) -> SequenceBuffer:
    """Sequence buffer over per-env rows (see the module docstring for every option's meaning).

    R2D2: `sequence_length=80, period=40, priority_exponent=0.9`. Muesli: `online_window > 0` with
    `sample_mixed`. DQN n-step: `buffers.nstep.make_nstep_buffer`.
    """
    if num_envs < 1 or sequence_length < 1:
        raise ValueError(f"need num_envs >= 1 and sequence_length >= 1, got {num_envs=} {sequence_length=}")
    if capacity_per_env <= sequence_length:
        raise ValueError(
            f"capacity_per_env ({capacity_per_env}) must exceed sequence_length ({sequence_length})")
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    if start not in ("any", "episode"):
        raise ValueError(f"start must be 'any' or 'episode', got {start!r}")
    if not 0 <= online_window <= capacity_per_env:
        raise ValueError(f"online_window must be in [0, capacity_per_env={capacity_per_env}], got {online_window}")
    if priority_exponent is not None and priority_exponent < 0:
        raise ValueError(f"priority_exponent must be >= 0 or None, got {priority_exponent}")
    if length_power < 0:
        raise ValueError(f"length_power must be >= 0, got {length_power}")
    return SequenceBuffer(
        num_envs=num_envs, capacity_per_env=capacity_per_env, sequence_length=sequence_length, period=period,
        start=start, cross_episodes=cross_episodes, complete_only=complete_only,
        length_power=float(length_power),
        priority_exponent=None if priority_exponent is None else float(priority_exponent),
        online_window=online_window, done_fn=done_fn, min_size=min_size, fanout=fanout, debug=debug,
    )
