"""Sum-tree sampling weights of the sequence buffer (every configuration the counted weights do not cover).

The weights live in a sum tree over the `E*T` slots plus one always-zero dummy leaf that absorbs
masked-out writes. When the period divides T only every period-th slot can be eligible, so the tree keeps
one leaf per aligned slot (`stride`, a period-times smaller tree: choose T a multiple of the period).
Adding one step changes the weight of at most the L slots whose window ends at it (the newest of which is
the slot it overwrites), so `after_write` refreshes only those (only the period-aligned ones and the
overwritten one when `period > 1`): O(N * L) plus O(N * ceil(L/period) * F * log_F(E*T)) per add.
`sample_starts` costs O(B * F * log_F(E*T)) plus the gather. No while loop, no capacity-sized work.

`PrioritisedTreeWeights` multiplies each leaf by `priority**alpha` (new slots get the largest priority set
so far, 1 at first); a priority that is not a finite positive number counts as 0
(`priorities.clean_priorities`), and slots outside `[0, E*T)` or off the stride grid are ignored.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from buffers import checks, sumtree
from buffers.priority_math import clean_priorities
from buffers.rows import RowState
from buffers.starts import SequenceRules, Starts


def tree_stride(period: int, capacity_per_env: int) -> int:
    """Positions of a row per tree leaf: the period when it divides T (then only every period-th position
    can hold an eligible start), else 1."""
    return period if capacity_per_env % period == 0 else 1


@struct.dataclass
class TreeState:
    done: jax.Array  # [E*T] bool: done_fn of the step stored at each slot
    remaining: jax.Array  # [E*T/stride] int32: remaining of period-aligned slots (others stale), 0 if unwritten
    tree: sumtree.SumTree  # E*T/stride + 1 leaves: slot weights, then a dummy leaf that stays 0


@struct.dataclass
class PrioritisedTreeState(TreeState):
    base: jax.Array  # [E*T/stride] float32 eligible * remaining**power
    priority: jax.Array  # [E*T/stride] float32 priority**alpha
    max_priority: jax.Array  # float32 []: largest raw priority set so far (1 initially)


@dataclasses.dataclass(frozen=True)
class TreeWeights:
    """The sum-tree `WeightStrategy` (see `buffers/starts.py`); leaf weight eligible * remaining**power."""

    rules: SequenceRules
    fanout: int

    @property
    def stride(self) -> int:
        return tree_stride(self.rules.period, self.rules.capacity_per_env)

    @property
    def num_leaves(self) -> int:
        return self.rules.num_slots // self.stride

    def leaf(self, slots):
        """Tree leaf of each slot `env*T + pos` (only meaningful where `pos % stride == 0`)."""
        if self.stride == 1:
            return slots
        T = self.rules.capacity_per_env
        return (slots // T) * (T // self.stride) + (slots % T) // self.stride

    def slot(self, leaves):
        if self.stride == 1:
            return leaves
        T = self.rules.capacity_per_env
        per_row = T // self.stride
        return (leaves // per_row) * T + (leaves % per_row) * self.stride

    def init(self) -> TreeState:
        return TreeState(done=jnp.zeros((self.rules.num_slots,), bool),
                         remaining=jnp.zeros((self.num_leaves,), jnp.int32),
                         tree=sumtree.init(self.num_leaves + 1, self.fanout))

    def after_write(self, rows_state: RowState, w, done_new, abs_new, row):
        r, n = self.rules, self.num_leaves
        T = r.capacity_per_env
        valid_row = row < r.num_envs  # [N] entries that wrote
        env = jnp.minimum(row, r.num_envs - 1)
        newest_slot = env * T + abs_new % T
        done = w.done.at[jnp.where(valid_row, newest_slot, r.num_slots)].set(done_new, mode="drop")
        s_abs, s_rem, weights, in_window = self._refreshed(done, env, abs_new)
        keep = in_window & valid_row[:, None] & (s_abs >= 0)
        leaves = jnp.where(keep, self.leaf(env[:, None] * T + s_abs % T), n).reshape(-1)  # n: dropped / dummy
        remaining = w.remaining.at[leaves].set(s_rem.reshape(-1), mode="drop")
        weights = jnp.where(keep, weights, 0.0).reshape(-1)
        newest = jnp.where(valid_row & (abs_new % self.stride == 0), self.leaf(newest_slot), n)
        return self._set_leaves(w.replace(done=done, remaining=remaining), leaves, weights, newest)

    def _refreshed(self, done, env, abs_new):
        """The starts whose weight a write of steps `abs_new [N]` in rows `env [N]` may change (window
        offsets `j` of `_offsets`): `(abs [N, K], remaining [N, K], weight [N, K], in_window [N, K])`."""
        r = self.rules
        T, L = r.capacity_per_env, r.sequence_length
        # Done flags of steps a-L .. a (window index 0 .. L) of each written row.
        wabs = abs_new[:, None] + jnp.arange(-L, 1)[None, :]  # [N, L+1]
        wdone = done[env[:, None] * T + wabs % T] & (wabs >= 0)
        # remaining of the start at window index k+1 (abs a-L+1+k), k = 0..L-1, capped at the newest step a.
        k = jnp.arange(L)
        rem = L - k  # [L]
        if not r.cross_episodes:
            first_done = jax.lax.cummin(jnp.where(wdone[:, 1:], k, L - 1), axis=1, reverse=True)  # [N, L]
            rem = jnp.minimum(rem, first_done - k + 1)
        rem = jnp.broadcast_to(rem, (abs_new.shape[0], L))
        j = self._offsets(abs_new, k)
        in_window = j < L
        j = jnp.minimum(j, L - 1)
        s_abs = abs_new[:, None] - L + 1 + j
        s_rem = jnp.where(s_abs >= 0, jnp.take_along_axis(rem, j, axis=1), 0)
        prev_done = jnp.take_along_axis(wdone, j, axis=1)
        last_done = jnp.take_along_axis(wdone, j + jnp.maximum(s_rem, 1), axis=1)
        return s_abs, s_rem, r.weight(s_rem, prev_done, last_done, s_abs), in_window

    def _offsets(self, abs_new, k):
        """Window offsets `[N, K]` of the starts to refresh: every one, or the period-aligned ones, plus the
        newest when the slot it overwrites may have been aligned while it is not (stride 1: T not a multiple
        of the period). Offsets >= L are padding."""
        P, L = self.rules.period, self.rules.sequence_length
        if P == 1:
            return jnp.broadcast_to(k, (abs_new.shape[0], L))
        j0 = (-(abs_new - L + 1)) % P  # first aligned window offset
        j = j0[:, None] + P * jnp.arange(-(-L // P))[None, :]
        if self.stride == 1:
            j = jnp.concatenate([j, jnp.full((j.shape[0], 1), L - 1)], axis=1)
        return j

    def _set_leaves(self, w, leaves, weights, newest):
        """Store `weights [M]` at tree `leaves [M]` (out of range: dropped); `newest [N]` are the leaves of
        the newly written slots (used by the prioritised variant)."""
        return w.replace(tree=sumtree.set(w.tree, leaves, weights))

    def _base_at(self, w, leaves):
        return sumtree.get(w.tree, leaves)

    def base_of(self, rows_state: RowState, w, env, abs_start):
        leaves = self.leaf(env * self.rules.capacity_per_env + abs_start % self.rules.capacity_per_env)
        return jnp.where((abs_start >= 0) & (abs_start % self.stride == 0), self._base_at(w, leaves), 0.0)

    def remaining_of(self, rows_state: RowState, w, slots):
        return w.remaining[self.leaf(slots)]

    def slot_weights(self, rows_state: RowState, w):
        slots = jnp.arange(self.rules.num_slots)
        return jnp.where(slots % self.stride == 0, sumtree.get(w.tree, self.leaf(slots)), 0.0)

    def sample_starts(self, rows_state: RowState, w, key, batch_size: int) -> Starts:
        leaves, probs = sumtree.sample(w.tree, key, batch_size)
        leaves = jnp.minimum(leaves, self.num_leaves - 1)
        rem = jnp.where(sumtree.total(w.tree) > 0, w.remaining[leaves], 0)
        return self.rules.make_starts(self.slot(leaves), rem, probs)

    def total(self, rows_state: RowState, w):
        return sumtree.total(w.tree)


@dataclasses.dataclass(frozen=True)
class PrioritisedTreeWeights(TreeWeights):
    """Tree weights times `priority**priority_exponent`, with `priorities` and `set_priorities`."""

    priority_exponent: float

    def init(self) -> PrioritisedTreeState:
        plain = super().init()
        k = self.num_leaves
        return PrioritisedTreeState(done=plain.done, remaining=plain.remaining, tree=plain.tree,
                                    base=jnp.zeros((k,), jnp.float32), priority=jnp.zeros((k,), jnp.float32),
                                    max_priority=jnp.ones((), jnp.float32))

    def _set_leaves(self, w, leaves, weights, newest):
        new_p = jnp.power(w.max_priority, jnp.float32(self.priority_exponent))
        priority = w.priority.at[newest].set(new_p, mode="drop")
        base = w.base.at[leaves].set(weights, mode="drop")
        values = weights * priority.at[leaves].get(mode="fill", fill_value=0.0)
        return w.replace(base=base, priority=priority, tree=sumtree.set(w.tree, leaves, values))

    def _base_at(self, w, leaves):
        return w.base[leaves]

    def on_grid(self, slots):
        """Slots in `[0, E*T)` that have a tree leaf (every slot, or the period-aligned ones when strided)."""
        return (slots >= 0) & (slots < self.rules.num_slots) & (slots % self.stride == 0)  # the stride divides T

    def priorities(self, w, slots) -> jax.Array:
        """Stored priority**alpha of `slots [B]` (0 for slots without a leaf)."""
        slots = jnp.asarray(slots, jnp.int32)
        on_grid = self.on_grid(slots)
        return jnp.where(on_grid, w.priority[jnp.where(on_grid, self.leaf(slots), 0)], 0.0)

    def set_priorities(self, w, slots, priorities):
        """Set raw priorities of `slots [B]`: store priority**alpha, refresh the tree, raise the max."""
        checks.check_index_array("slots", slots)
        priorities = clean_priorities(priorities)
        if priorities.shape != slots.shape:
            raise checks.BufferInputError(
                f"priorities: expected shape {tuple(slots.shape)} (like slots), received {priorities.shape}")
        slots = jnp.asarray(slots, jnp.int32)
        on_grid = self.on_grid(slots)
        leaves = jnp.where(on_grid, self.leaf(slots), self.num_leaves)  # off the grid: the dummy leaf
        powered = jnp.power(priorities, jnp.float32(self.priority_exponent))
        priority = w.priority.at[leaves].set(powered, mode="drop")
        # Read back so duplicated slots write the same (winning) value to the tree; the dummy leaf stays 0.
        tree = sumtree.set(w.tree, leaves, jnp.where(on_grid, w.base[leaves] * priority[leaves], 0.0))
        max_p = jnp.maximum(w.max_priority, jnp.max(jnp.where(on_grid, priorities, 0.0), initial=0.0))
        return w.replace(priority=priority, tree=tree, max_priority=max_p)
