"""Trace-time input checks: each bad input raises BufferInputError naming the leaf and expected vs received."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from buffers import checks
from buffers.checks import BufferInputError

PROTO = checks.as_prototype({"obs": np.zeros((3,), np.float32), "action": 0, "done": False})


def test_as_prototype_reads_python_scalars_and_arrays():
    p = checks.as_prototype({"a": 1.5, "b": 2, "c": True, "d": np.zeros((2, 3), np.uint8), "e": jnp.ones(4)})
    got = {k: (v.shape, v.dtype) for k, v in p.items()}
    assert got == {
        "a": ((), jnp.float32),
        "b": ((), jnp.int32),
        "c": ((), jnp.bool_),
        "d": ((2, 3), jnp.uint8),
        "e": ((4,), jnp.float32),
    }


def test_as_prototype_rejects_empty_tree():
    with pytest.raises(BufferInputError, match="empty pytree"):
        checks.as_prototype({})


def test_check_items_accepts_batches_and_returns_leading_dims():
    items = {"obs": jnp.zeros((7, 3)), "action": jnp.zeros(7, jnp.int32), "done": jnp.zeros(7, bool)}
    assert checks.check_items(PROTO, items, batch_dims=None) == (7,)
    assert checks.check_items(PROTO, items, batch_dims=(7,)) == (7,)


def test_check_items_accepts_weak_python_scalars_of_the_same_kind():
    assert checks.check_items(PROTO, {"obs": np.zeros(3, np.float32), "action": 3, "done": True}, ()) == ()
    cast = checks.cast_like(PROTO, {"obs": [1, 2, 3], "action": 3, "done": True})
    assert (
        cast["obs"].dtype == jnp.float32 and cast["action"].dtype == jnp.int32 and cast["done"].dtype == bool
    )


def test_structure_mismatch_names_both_structures():
    with pytest.raises(BufferInputError, match=r"wrong tree structure:\n  expected .*'action'.*\n  received"):
        checks.check_items(PROTO, {"obs": jnp.zeros(3), "done": False}, ())


def test_shape_mismatch_names_leaf_and_shapes():
    bad = {"obs": jnp.zeros((5, 4)), "action": jnp.zeros(5, jnp.int32), "done": jnp.zeros(5, bool)}
    with pytest.raises(
        BufferInputError, match=r"items leaf \['obs'\]: expected shape \(5, 3\), received \(5, 4\)"
    ):
        checks.check_items(PROTO, bad, batch_dims=None, what="items")


def test_inconsistent_batch_dims_name_the_leaf():
    bad = {"obs": jnp.zeros((5, 3)), "action": jnp.zeros(6, jnp.int32), "done": jnp.zeros(5, bool)}
    # Leaves are visited in key order, so 'action' fixes the batch dims and 'done' is the one reported.
    msg = r"leaf \['done'\]: expected shape \(6,\), received \(5,\) .*leading dims \(6,\) as in leaf \['action'\]"
    with pytest.raises(BufferInputError, match=msg):
        checks.check_items(PROTO, bad, batch_dims=None)


def test_missing_batch_dim_is_reported():
    with pytest.raises(
        BufferInputError, match=r"leaf \['obs'\]: expected shape \(\.\.\., \*\(3,\)\), received \(\)"
    ):
        checks.check_items({"obs": PROTO["obs"]}, {"obs": jnp.zeros(())}, batch_dims=None)


def test_dtype_mismatch_names_leaf_and_dtypes():
    bad = {"obs": jnp.zeros(3, jnp.int32), "action": 0, "done": False}
    with pytest.raises(BufferInputError, match=r"leaf \['obs'\]: expected dtype float32, received int32"):
        checks.check_items(PROTO, bad, ())
    with pytest.raises(BufferInputError, match=r"leaf \['action'\]: expected dtype int32, received float32"):
        checks.check_items(PROTO, {"obs": jnp.zeros(3), "action": 1.5, "done": False}, ())


def test_checks_run_at_trace_time_under_jit():
    f = jax.jit(lambda x: checks.check_items(PROTO, x, ()) and 0)
    with pytest.raises(BufferInputError, match=r"\['obs'\]"):
        f({"obs": jnp.zeros(2), "action": 0, "done": False})


def test_check_index_array():
    checks.check_index_array("ids", jnp.arange(4), length=4)
    with pytest.raises(BufferInputError, match=r"ids: expected shape \(4,\), received \(3,\)"):
        checks.check_index_array("ids", jnp.arange(3), length=4)
    with pytest.raises(BufferInputError, match=r"ids: expected shape rank 1, received \(2, 2\)"):
        checks.check_index_array("ids", jnp.zeros((2, 2), jnp.int32))
    with pytest.raises(BufferInputError, match="ids: expected an integer array, received dtype float32"):
        checks.check_index_array("ids", jnp.zeros(4), length=4)


def test_check_float_array():
    checks.check_float_array("p", jnp.zeros(4), (4,))
    with pytest.raises(BufferInputError, match=r"p: expected shape \(4,\), received \(4, 1\)"):
        checks.check_float_array("p", jnp.zeros((4, 1)), (4,))
    with pytest.raises(BufferInputError, match="p: expected a float array, received dtype bool"):
        checks.check_float_array("p", jnp.zeros(4, bool), (4,))
