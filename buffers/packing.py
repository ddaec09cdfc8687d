"""Small item leaves packed into rows of uint32 words: one storage array for them all.

A buffer that keeps one array per leaf reads one scattered row of every leaf for each sampled item (five
cache misses for a CartPole transition); packed, the small leaves of an item are one contiguous row of `W`
words, read in one gather, and an add or a sample is one scatter / gather instead of one per leaf (fewer
ops, so also less dispatch per jitted call). A leaf over `SEPARATE_WORDS` words (an Atari frame) is a row
of its own cache lines already: it keeps its own `[*lead, *S]` array, where packing would only add copies.

Encoding of a small leaf of prototype shape `S` (bit-exact both ways, NaN payloads included):
- 4-byte dtypes (float32, int32, uint32): bitcast, one word per element;
- 8-byte dtypes (with x64): bitcast, two words per element;
- 1- and 2-byte dtypes (bool as 0/1 bytes, uint8, float16, ...): the leaf's bytes, zero-padded to a
  multiple of 4 and grouped 4 per word.
Packed leaves sit in tree-flattening order; `offsets[i]:offsets[i] + widths[i]` are leaf i's words.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from buffers import checks

PyTree = Any
WORD = jnp.uint32
SEPARATE_WORDS = 16  # a leaf over 64 bytes (a cache line) keeps its own array: packing would only copy it


def _words(shape: tuple[int, ...], dtype) -> int:
    nbytes = math.prod(shape) * jnp.dtype(dtype).itemsize
    return -(-nbytes // 4)


@dataclasses.dataclass(frozen=True)
class Packing:
    """Static layout of an item pytree in a storage tuple (hashable: a jit-static field of buffer states).

    A storage with leading dims `lead` (e.g. `(C,)` or `(E, T)`) is a tuple of arrays: first `words
    [*lead, width]` holding every small leaf packed (absent if there is none), then one `[*lead, *S]` array
    per large leaf, in its own dtype (tree-flattening order).
    """

    treedef: Any  # PyTreeDef of the item
    shapes: tuple[tuple[int, ...], ...]  # per leaf, prototype shape
    dtypes: tuple[np.dtype, ...]  # per leaf
    pack_small: bool = True  # False: every leaf in its own array (for storage read in windows, buffers/rows.py)

    @property
    def packed(self) -> tuple[bool, ...]:
        """Per leaf: packed into the words (small), or kept in its own array (over `SEPARATE_WORDS` words)."""
        return tuple(self.pack_small and _words(s, d) <= SEPARATE_WORDS for s, d in zip(self.shapes, self.dtypes))

    @property
    def widths(self) -> tuple[int, ...]:
        """Per leaf, words taken in the packed row (0 for a separate leaf)."""
        return tuple(_words(s, d) if p else 0 for s, d, p in zip(self.shapes, self.dtypes, self.packed))

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(np.cumsum((0,) + self.widths[:-1]).tolist())

    @property
    def width(self) -> int:
        """Words per item in the packed row."""
        return sum(self.widths)

    @property
    def has_words(self) -> bool:
        return any(self.packed)

    @property
    def prototype(self) -> PyTree:
        """The item as a tree of `ShapeDtypeStruct`."""
        return jax.tree_util.tree_unflatten(
            self.treedef, [jax.ShapeDtypeStruct(s, d) for s, d in zip(self.shapes, self.dtypes)])

    @property
    def item_ndims(self) -> tuple[int, ...]:
        """Per storage array, its dims after the leading ones (1 for the words, len(S) for a separate leaf)."""
        return ((1,) if self.has_words else ()) + tuple(len(s) for s, p in zip(self.shapes, self.packed) if not p)

    def zeros(self, leading: tuple[int, ...]) -> tuple:
        """Storage of zero items with leading dims `leading`."""
        lead = tuple(leading)
        words = (jnp.zeros(lead + (self.width,), WORD),) if self.has_words else ()
        return words + tuple(jnp.zeros(lead + s, d) for s, d, p in zip(self.shapes, self.dtypes, self.packed)
                             if not p)

    def pack(self, items: PyTree) -> tuple:
        """Items with leaves `[*lead, *S]` (structure and dtypes already checked) -> a storage-shaped tuple."""
        leaves = self.treedef.flatten_up_to(items)
        lead = jnp.shape(leaves[0])[: jnp.ndim(leaves[0]) - len(self.shapes[0])]
        cols = [_encode(jnp.asarray(x, d), lead, w)
                for x, d, w, p in zip(leaves, self.dtypes, self.widths, self.packed) if p and w]
        if not self.has_words:
            words = ()
        elif not cols:
            words = (jnp.zeros(lead + (0,), WORD),)
        else:
            words = (jnp.concatenate(cols, axis=-1),)
        return words + tuple(jnp.asarray(x, d) for x, d, p in zip(leaves, self.dtypes, self.packed) if not p)

    def unpack(self, storage: tuple) -> PyTree:
        """A storage-shaped tuple with leading dims `lead` -> items with leaves `[*lead, *S]`."""
        return jax.tree_util.tree_unflatten(self.treedef, [self.unpack_leaf(storage, i) for i in range(len(self.shapes))])

    def take(self, storage: tuple, indices: jax.Array, in_bounds: bool = False) -> PyTree:
        """Items at rows `indices` (int `[*I]`) of a storage with leading dim N -> leaves `[*I, *S]`.

        One gather of whole rows per storage array (for random rows, 2x faster than one gather per leaf
        reading its words only), then unpacked. Out-of-range indices are clamped, unless `in_bounds`
        promises they are in `[0, N)`.
        """
        mode = "promise_in_bounds" if in_bounds else "clip"
        return self.unpack(tuple(x.at[indices].get(mode=mode) for x in storage))

    def take_leaves(self, storage: tuple, indices: jax.Array) -> PyTree:
        """Like `take` (indices clamped to `[0, N)`), but one gather per leaf reading only its words of each row.

        For windows of consecutive rows (sequences): a window's rows share a few cache lines, which every
        leaf's gather then reads warm, and each leaf is gathered straight into its own dtype, with no
        `[*I, W]` copy to unpack; a leaf nobody reads is never gathered. For scattered rows `take` is faster
        (one cache miss per row instead of one per leaf).
        """
        dn = jax.lax.GatherDimensionNumbers(offset_dims=(indices.ndim,), collapsed_slice_dims=(0,),
                                            start_index_map=(0, 1))
        leaves = []
        for i, (shape, dtype) in enumerate(zip(self.shapes, self.dtypes)):
            if not self.packed[i]:
                leaves.append(self.unpack_leaf(storage, i).at[indices].get(mode="clip"))
                continue
            o, w = self.offsets[i], self.widths[i]
            if w == 0:
                leaves.append(jnp.zeros(indices.shape + shape, dtype))
                continue
            starts = jnp.stack([indices, jnp.full_like(indices, o)], axis=-1)  # (row, first word of the leaf)
            words = jax.lax.gather(storage[0], starts, dn, (1, w), mode=jax.lax.GatherScatterMode.CLIP)
            leaves.append(_decode(words, shape, dtype))
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def unpack_leaf(self, storage: tuple, i: int) -> jax.Array:
        """Leaf i (tree-flattening order) of a storage-shaped tuple -> `[*lead, *S_i]`."""
        if not self.packed[i]:
            return storage[int(self.has_words) + sum(not p for p in self.packed[:i])]
        o, w = self.offsets[i], self.widths[i]
        return _decode(storage[0][..., o : o + w], self.shapes[i], self.dtypes[i])


class PackedStorage:
    """Mixin of buffer states whose items live in `storage` (a tuple of `[*lead, ...]` arrays) laid out by
    their static `packing`."""

    @property
    def data(self) -> PyTree:
        """The storage unpacked: leaves `[*lead, ...]` (a copy of the whole storage; for inspection and tests)."""
        return self.packing.unpack(self.storage)


def computed_once(x: jax.Array) -> jax.Array:
    """`x` (int) materialised before it indexes a gather. XLA:CPU fuses cheap elementwise producers into a
    gather and recomputes them for every element of every gathered row (a whole threefry draw 11 times per
    packed CartPole row: 2.5x the uniform add+sample step); a reduction is never fused into its consumer, so
    `x` summed with a zero row is computed once (tests/buffers/test_packing.py checks the compiled gather)."""
    return jnp.sum(jnp.pad(x[None], ((0, 1),) + ((0, 0),) * x.ndim), axis=0)


def packing_of(prototype: PyTree, pack_small: bool = True) -> Packing:
    """The packing of items shaped like `prototype` (Python scalars, arrays or `ShapeDtypeStruct`s); with
    `pack_small=False` every leaf keeps its own array."""
    proto = checks.as_prototype(prototype)
    leaves, treedef = jax.tree_util.tree_flatten(proto)
    for path, spec in jax.tree_util.tree_flatten_with_path(proto)[0]:
        d = jnp.dtype(spec.dtype)
        if not (d == jnp.bool_ or jnp.issubdtype(d, jnp.integer) or jnp.issubdtype(d, jnp.floating)) or (
            d.itemsize not in (1, 2, 4, 8)
        ):
            raise checks.BufferInputError(
                f"prototype leaf {jax.tree_util.keystr(path)}: dtype {d} cannot be stored; use a bool, int or "
                "float dtype (store complex values as two float leaves)")
    return Packing(treedef, tuple(tuple(x.shape) for x in leaves), tuple(jnp.dtype(x.dtype) for x in leaves),
                   pack_small)


def _encode(x: jax.Array, lead: tuple[int, ...], width: int) -> jax.Array:
    """Leaf `[*lead, *S]` -> words `[*lead, width]`."""
    size = jnp.dtype(x.dtype).itemsize
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if size >= 4:
        return jax.lax.bitcast_convert_type(x, WORD).reshape(lead + (width,))
    b = jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(lead + (-1,))  # 2-byte: [..., 2] bytes, flattened
    pad = width * 4 - b.shape[-1]
    if pad:
        b = jnp.concatenate([b, jnp.zeros(lead + (pad,), jnp.uint8)], axis=-1)
    return jax.lax.bitcast_convert_type(b.reshape(lead + (width, 4)), WORD)


def _decode(words: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """Words `[*lead, w]` of one leaf -> `[*lead, *shape]` of `dtype`."""
    lead = words.shape[:-1]
    size, n = jnp.dtype(dtype).itemsize, math.prod(shape)
    if n == 0:
        return jnp.zeros(lead + shape, dtype)
    if size >= 4:
        words_per_value = words.reshape(lead + (-1, size // 4))  # [.., n, 1] bitcasts to [.., n, 1], [.., n, 2] to [.., n]
        return jax.lax.bitcast_convert_type(words_per_value, dtype).reshape(lead + shape)
    if dtype == jnp.bool_ and n <= 4:  # byte k is bits 8k..8k+7 of word 0: shifts fuse with a gather, a bitcast not
        return ((words[..., :1] >> (8 * jnp.arange(n, dtype=WORD))) & 0xFF != 0).reshape(lead + shape)
    b = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(lead + (-1,))[..., : n * size]
    if dtype == jnp.bool_:
        return (b != 0).reshape(lead + shape)
    if size == 1:
        return jax.lax.bitcast_convert_type(b, dtype).reshape(lead + shape)
    return jax.lax.bitcast_convert_type(b.reshape(lead + (-1, size)), dtype).reshape(lead + shape)
