"""Flat transition buffer: a circular storage of `capacity` items sampled uniformly.

Storage is a short tuple of arrays with leading dim C, item i in row i of each: the small item leaves packed
into one `uint32 [C, W]` array, each large leaf (a frame) in its own `[C, *S]` (`buffers/packing.py`;
`state.data` unpacks the whole storage as a pytree of `[C, *item_leaf_shape]` for inspection). `head` is the next slot written and
`size` the number of stored items (slots `[0, size)` hold data, since writes start at slot 0 and wrap at C).
Every write is a scatter into the storage, so under `jax.jit(..., donate_argnums=...)` the storage is
updated in place; a sample is one gather of B rows per storage array.

Sampling an empty buffer is defined: indices are all 0 and the items are storage row 0 (zeros until the
first write); `can_sample` is False then, and callers gate on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from buffers import checks
from buffers.packing import PackedStorage, Packing, computed_once, packing_of

PyTree = Any


@struct.dataclass
class FlatState(PackedStorage):
    storage: tuple  # arrays [C, ...]: item i in row i (buffers/packing.py)
    head: jax.Array  # int32[]: next slot to write
    size: jax.Array  # int32[]: number of stored items, <= C
    packing: Packing = struct.field(pytree_node=False)


@struct.dataclass
class FlatSample:
    items: PyTree  # leaves [B, ...]
    indices: jax.Array  # [B] int32 storage slots


def _mul_wide(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Full 64-bit product of uint32 arrays as (high, low) uint32 words, from 16-bit limbs."""
    mask = jnp.uint32(0xFFFF)
    a1, a0, b1, b0 = a >> 16, a & mask, b >> 16, b & mask
    a0b0, a1b0, a0b1 = a0 * b0, a1 * b0, a0 * b1
    mid = (a0b0 >> 16) + (a1b0 & mask) + (a0b1 & mask)
    high = a1 * b1 + (a1b0 >> 16) + (a0b1 >> 16) + (mid >> 16)
    return high, a * b


def randint_below(key: jax.Array, shape: tuple[int, ...], n: jax.Array) -> jax.Array:
    """Uniform int32 in `[0, n)` (`n` >= 1, int, may be traced and broadcast against `shape`).

    floor(n * X / 2**64) for a 64-bit uniform X drawn in one call of the key's generator: the bias is at
    most n / 2**64. `jax.random.randint` draws as many bits in two calls plus a key split, which on CPU
    costs about twice as much; in a small add+sample step that was most of the time.
    """
    bits = jax.random.bits(key, (2,) + tuple(shape), jnp.uint32)
    n = jnp.broadcast_to(jnp.asarray(n).astype(jnp.uint32), shape)
    high_hi, high_lo = _mul_wide(n, bits[0])
    low_hi, _ = _mul_wide(n, bits[1])
    carry = (high_lo + low_hi) < high_lo
    return computed_once((high_hi + carry.astype(jnp.uint32)).astype(jnp.int32))  # it feeds gathers


def storage_prototype(data: PyTree, lead: int = 1) -> PyTree:
    """The item prototype (`ShapeDtypeStruct` tree) of a storage with `lead` leading storage dims."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[lead:], x.dtype), data)


def gather_items(state, indices: jax.Array) -> PyTree:
    """Items at slots `indices [B]` (in range) of a packed state -> leaves `[B, ...]`."""
    return state.packing.take(state.storage, indices, in_bounds=True)


def checked_update_fn(prototype: PyTree, fn: Callable) -> None:
    """Trace-time check that `fn(item)` returns an item of the prototype's structure, shapes and dtypes."""
    out = jax.eval_shape(fn, prototype)
    checks.check_items(prototype, out, batch_dims=(), what="update fn output")


@dataclasses.dataclass(frozen=True)
class FlatBuffer:
    """Static configuration and pure functions of a flat circular buffer (see `make_flat_buffer`)."""

    capacity: int
    min_size: int = 1

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if not 1 <= self.min_size <= self.capacity:
            raise ValueError(f"min_size must be in [1, capacity={self.capacity}], got {self.min_size}")

    def init(self, prototype: PyTree) -> FlatState:
        """Empty state whose storage holds `capacity` zero items shaped like `prototype`."""
        packing = packing_of(prototype)
        return FlatState(
            storage=packing.zeros((self.capacity,)),
            head=jnp.zeros((), jnp.int32),
            size=jnp.zeros((), jnp.int32),
            packing=packing,
        )

    def _write(self, state, items: PyTree, batched: bool):
        """Write one item (or a batch of B items) at `head`; returns the new state and the slots [B]."""
        proto = state.packing.prototype
        if batched:
            (b,) = checks.check_items(proto, items, batch_dims=None, what="items")
            if b > self.capacity:
                raise checks.BufferInputError(
                    f"add_batch: a batch of {b} items exceeds the capacity {self.capacity}"
                )
            slots = (state.head + jnp.arange(b, dtype=jnp.int32)) % self.capacity
            rows = state.packing.pack(checks.cast_like(proto, items))
            storage = jax.tree_util.tree_map(
                lambda x, y: x.at[slots].set(y, mode="promise_in_bounds", unique_indices=True), state.storage, rows)
        else:
            checks.check_items(proto, items, batch_dims=(), what="item")
            b, slots = 1, state.head[None]
            row = state.packing.pack(checks.cast_like(proto, items))
            storage = jax.tree_util.tree_map(
                lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y, state.head, 0), state.storage, row)
        new = state.replace(
            storage=storage,
            head=(state.head + b) % self.capacity,
            size=jnp.minimum(state.size + b, self.capacity),
        )
        return new, slots

    def add(self, state: FlatState, item: PyTree) -> FlatState:
        """Write one item (leaves shaped like the prototype's) at `head`."""
        return self._write(state, item, batched=False)[0]

    def add_batch(self, state: FlatState, items: PyTree) -> FlatState:
        """Write a batch (leaves `[B, ...]`, B <= capacity) at `head, head+1, ...`, wrapping at capacity."""
        return self._write(state, items, batched=True)[0]

    def _uniform_slots(self, state, key: jax.Array, batch_size: int) -> jax.Array:
        return randint_below(key, (batch_size,), jnp.maximum(state.size, 1))

    def sample(self, state: FlatState, key: jax.Array, batch_size: int) -> FlatSample:
        """`batch_size` items drawn uniformly with replacement from the stored ones."""
        indices = self._uniform_slots(state, key, batch_size)
        return FlatSample(items=gather_items(state, indices), indices=indices)

    def add_and_sample(self, state: FlatState, items: PyTree, key: jax.Array, batch_size: int):
        """`add_batch` then `sample` (the new items can be drawn). Returns `(state, FlatSample)`."""
        state = self.add_batch(state, items)
        return state, self.sample(state, key, batch_size)

    def can_sample(self, state) -> jax.Array:
        """bool[]: at least `min_size` items are stored."""
        return state.size >= self.min_size

    def size(self, state) -> jax.Array:
        """int32[]: number of stored items."""
        return state.size

    def update(self, state, fn: Callable[[PyTree], PyTree], indices: jax.Array | None = None):
        """Replace stored items by `fn(item)` (`fn` maps one item to one item; it is vmapped).

        `indices=None` updates every stored item (slots `[0, size)`); otherwise only the slots `indices`
        ([N] int); slots outside `[0, size)` are left alone. Repeated slots receive the same value.
        """
        proto, packing = state.packing.prototype, state.packing
        checked_update_fn(proto, fn)

        def apply(rows):
            return packing.pack(checks.cast_like(proto, jax.vmap(fn)(packing.unpack(rows))))

        if indices is None:
            keep = jnp.arange(self.capacity) < state.size
            storage = jax.tree_util.tree_map(
                lambda n, x: jnp.where(keep.reshape((-1,) + (1,) * (x.ndim - 1)), n, x),
                apply(state.storage), state.storage)
        else:
            checks.check_index_array("update indices", indices)
            indices = jnp.asarray(indices)
            valid = (indices >= 0) & (indices < state.size)
            slots = jnp.where(valid, indices, self.capacity).astype(jnp.int32)
            rows = jax.tree_util.tree_map(lambda x: jnp.take(x, slots, axis=0, mode="fill", fill_value=0),
                                          state.storage)
            storage = jax.tree_util.tree_map(lambda x, y: x.at[slots].set(y, mode="drop"), state.storage, apply(rows))
        return state.replace(storage=storage)


def make_flat_buffer(capacity: int, min_size: int = 1) -> FlatBuffer:
    """A flat circular buffer of `capacity` items; `can_sample` once `min_size` items are stored."""
    return FlatBuffer(capacity=capacity, min_size=min_size)
