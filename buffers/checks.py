"""Trace-time validation of what is written into a buffer, shared by every buffer kind.

All checks run on static shapes/dtypes/tree structure, so they cost nothing at run time and fail while
tracing with a message naming the offending leaf (its key path) and the expected vs received value.

Dtype rule: a leaf's dtype is compared after JAX's canonicalisation, i.e. as `jax.jit` would receive it,
so a buffer op accepts the same inputs eagerly and under jit. With `jax_enable_x64` off (the default)
NumPy float64 / int64 / uint64 arrays are taken as float32 / int32 / uint32 (and cast); a strict check
could not reject them under jit, where they arrive already converted. Any other difference is rejected
(float64 for a float16 or int32 leaf, int32 for uint8, ...), except that Python scalars / weak-typed
values of the same kind (int, float or bool) are cast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


class BufferInputError(ValueError):
    """Raised when data given to a buffer does not match its prototype."""


def as_prototype(item):
    """Turn a prototype item (Python scalars, NumPy or JAX arrays) into a tree of `ShapeDtypeStruct`."""
    leaves = jax.tree_util.tree_leaves(item)
    if not leaves:
        raise BufferInputError(
            "the prototype item is an empty pytree: a buffer needs at least one array leaf"
        )

    def spec(x):
        x = jnp.asarray(x) if not hasattr(x, "dtype") else x
        return jax.ShapeDtypeStruct(tuple(x.shape), jnp.dtype(x.dtype))

    return jax.tree_util.tree_map(spec, item)


def zeros_like_storage(prototype, leading: tuple[int, ...]):
    """Storage of zeros shaped `leading + leaf.shape` for every prototype leaf."""
    return jax.tree_util.tree_map(lambda s: jnp.zeros(leading + s.shape, s.dtype), prototype)


def _path(path) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def check_items(prototype, items, batch_dims: tuple[int, ...] | None, what: str = "item") -> int | tuple:
    """Check `items` matches `prototype` with extra leading `batch_dims` on every leaf.

    `batch_dims=None` infers the leading dims from the first leaf (its ndim minus the prototype's) and
    checks every leaf agrees. Returns the leading dims found. Dtypes must match after canonicalisation
    (see the module docstring), except that Python scalars/weak-typed values of the same kind are cast.
    """
    proto_def = jax.tree_util.tree_structure(prototype)
    item_def = jax.tree_util.tree_structure(items)
    if proto_def != item_def:
        raise BufferInputError(
            f"{what} has the wrong tree structure:\n  expected {proto_def}\n  received {item_def}"
        )
    flat_proto = jax.tree_util.tree_leaves_with_path(prototype)
    flat_items = jax.tree_util.tree_leaves(items)
    lead = batch_dims
    lead_from = "" if batch_dims is not None else None
    for (path, spec), x in zip(flat_proto, flat_items):
        shape = tuple(np.shape(x))
        if lead is None:
            nlead = len(shape) - len(spec.shape)
            if nlead < 0:
                raise BufferInputError(
                    f"{what} leaf {_path(path)}: expected shape (..., *{spec.shape}), received {shape}"
                )
            lead = shape[:nlead]
            lead_from = f" as in leaf {_path(path)}"
        expected = tuple(lead) + tuple(spec.shape)
        if shape != expected:
            raise BufferInputError(
                f"{what} leaf {_path(path)}: expected shape {expected}, received {shape}"
                f" (prototype leaf shape {spec.shape}, leading dims {tuple(lead)}{lead_from})"
            )
        dtype = jnp.result_type(x)  # canonical, as jit would see x (x64 off: float64 -> float32)
        weak = not hasattr(x, "dtype") or getattr(x, "weak_type", False)
        same_kind = jnp.issubdtype(dtype, jnp.floating) == jnp.issubdtype(spec.dtype, jnp.floating) and (
            jnp.issubdtype(dtype, jnp.bool_) == jnp.issubdtype(spec.dtype, jnp.bool_)
        )
        if dtype != spec.dtype and not (weak and same_kind):
            raise BufferInputError(
                f"{what} leaf {_path(path)}: expected dtype {spec.dtype}, received {getattr(x, 'dtype', dtype)}"
            )
    return tuple(lead)


def cast_like(prototype, items):
    """Cast (weak-typed) leaves of `items` to the prototype dtypes."""
    return jax.tree_util.tree_map(lambda s, x: jnp.asarray(x, s.dtype), prototype, items)


def check_index_array(name: str, x, length: int | None = None, ndim: int = 1):
    """Static check that an index array is integer-typed with the given rank (and length)."""
    shape = tuple(np.shape(x))
    if len(shape) != ndim or (length is not None and shape[0] != length):
        want = f"({length},)" if length is not None else f"rank {ndim}"
        raise BufferInputError(f"{name}: expected shape {want}, received {shape}")
    if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
        raise BufferInputError(f"{name}: expected an integer array, received dtype {jnp.result_type(x)}")


def check_float_array(name: str, x, shape: tuple[int, ...]):
    """Static check that `x` is a real-valued (float or int) array of exactly `shape`."""
    got = tuple(np.shape(x))
    if got != tuple(shape):
        raise BufferInputError(f"{name}: expected shape {tuple(shape)}, received {got}")
    dtype = jnp.result_type(x)
    if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
        raise BufferInputError(f"{name}: expected a float array, received dtype {dtype}")
