"""Prioritised flat buffer: the flat circular storage plus a sum tree over its slots.

Slot i is drawn with probability p_i**alpha / sum_j p_j**alpha, where p_i is the raw priority last given
to it by `set_priorities` (new items get the largest raw priority seen so far, initially 1). A priority
that is not a finite positive number (NaN, +-inf, negative) counts as 0 (`priorities.clean_priorities`).
The tree stores p**alpha; writes touch O(batch * log capacity) tree entries and never copy the storage.

Sampling an empty buffer (or one whose priorities are all 0) returns indices 0, probabilities 0 and storage
row 0; `can_sample` is False then.

In a jitted step that ends with `set_priorities`, take priorities from the sample (`probabilities`) rather
than reading the old tree with `sumtree.get`: a read that the in-place update does not depend on makes
XLA keep the old leaf level alive, i.e. copy it (capacity-sized) every step. `sample` itself reads the
tree only on the path that produces the indices, so the learner step compiles without copies.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from buffers import checks, sumtree
from buffers.flat import FlatBuffer, gather_items
from buffers.packing import PackedStorage, Packing
from buffers.priority_math import clean_priorities

PyTree = Any


@struct.dataclass
class PrioritisedState(PackedStorage):
    storage: tuple  # arrays [C, ...]: item i in row i (as in FlatState)
    head: jax.Array  # int32[]
    size: jax.Array  # int32[]
    tree: sumtree.SumTree  # leaves hold p**alpha per slot (0 for empty slots)
    max_priority: jax.Array  # float32[]: largest raw priority seen (1 initially)
    packing: Packing = struct.field(pytree_node=False)


@struct.dataclass
class PrioritisedSample:
    items: PyTree  # leaves [B, ...]
    indices: jax.Array  # [B] int32 slots
    probabilities: jax.Array  # [B] float32 sampling probability of each slot


@dataclasses.dataclass(frozen=True)
class PrioritisedBuffer(FlatBuffer):
    """Static configuration and pure functions of a prioritised flat buffer (see `make_prioritised_buffer`)."""

    priority_exponent: float = 0.6
    fanout: int = sumtree.DEFAULT_FANOUT

    def __post_init__(self):
        super().__post_init__()
        if self.priority_exponent < 0:
            raise ValueError(f"priority_exponent must be >= 0, got {self.priority_exponent}")

    def init(self, prototype: PyTree) -> PrioritisedState:
        flat = super().init(prototype)
        return PrioritisedState(
            storage=flat.storage,
            head=flat.head,
            size=flat.size,
            tree=sumtree.init(self.capacity, self.fanout),
            max_priority=jnp.ones((), jnp.float32),
            packing=flat.packing,
        )

    def _with_new_slots(self, state: PrioritisedState, slots: jax.Array) -> PrioritisedState:
        value = jnp.broadcast_to(state.max_priority**self.priority_exponent, slots.shape)
        return state.replace(tree=sumtree.set(state.tree, slots, value))

    def add(self, state: PrioritisedState, item: PyTree) -> PrioritisedState:
        """Write one item at `head` with the maximum priority."""
        return self._with_new_slots(*self._write(state, item, batched=False))

    def add_batch(self, state: PrioritisedState, items: PyTree) -> PrioritisedState:
        """Write a batch (leaves `[B, ...]`, B <= capacity) with circular wrap, each at the maximum priority."""
        return self._with_new_slots(*self._write(state, items, batched=True))

    def sample(self, state: PrioritisedState, key: jax.Array, batch_size: int) -> PrioritisedSample:
        """`batch_size` slots drawn with replacement in proportion to p**alpha."""
        indices, probs = sumtree.sample(state.tree, key, batch_size)
        return PrioritisedSample(items=gather_items(state, indices), indices=indices, probabilities=probs)

    def add_and_sample(self, state: PrioritisedState, items: PyTree, key: jax.Array, batch_size: int):
        """`add_batch` then `sample`. Returns `(state, PrioritisedSample)`."""
        state = self.add_batch(state, items)
        return state, self.sample(state, key, batch_size)

    def can_sample(self, state: PrioritisedState) -> jax.Array:
        """bool[]: at least `min_size` items are stored and the total priority is positive."""
        return (state.size >= self.min_size) & (sumtree.total(state.tree) > 0)

    def set_priorities(self, state: PrioritisedState, indices: jax.Array, priorities: jax.Array):
        """Give slots `indices` ([B] int) the raw priorities `priorities` ([B], >= 0).

        Stores p**alpha in the tree and raises `max_priority`. NaN, infinite or negative priorities count
        as 0; slots outside `[0, size)` are ignored. With a repeated slot one of its priorities is kept.
        """
        checks.check_index_array("set_priorities indices", indices)
        checks.check_float_array("set_priorities priorities", priorities, shape=tuple(jnp.shape(indices)))
        indices, priorities = jnp.asarray(indices), jnp.asarray(priorities)
        valid = (indices >= 0) & (indices < state.size)
        slots = jnp.where(valid, indices, -1)  # -1: ignored by sumtree.set
        p = jnp.where(valid, clean_priorities(priorities), 0.0)
        return state.replace(
            tree=sumtree.set(state.tree, slots, p**self.priority_exponent),
            max_priority=jnp.maximum(state.max_priority, jnp.max(p, initial=0.0)),
        )


def make_prioritised_buffer(
    capacity: int, priority_exponent: float = 0.6, min_size: int = 1, fanout: int = sumtree.DEFAULT_FANOUT
) -> PrioritisedBuffer:
    """A prioritised flat buffer of `capacity` items sampled in proportion to priority**priority_exponent."""
    return PrioritisedBuffer(
        capacity=capacity, min_size=min_size, priority_exponent=priority_exponent, fanout=fanout
    )
