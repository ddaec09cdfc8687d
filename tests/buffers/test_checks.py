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


def test_64_bit_numpy_leaves_are_taken_as_jit_takes_them():
    """The dtype rule (checks.py): NumPy float64 / int64 count as float32 / int32 (x64 off), eagerly exactly as
    under jit, which converts them before any check could see them; other mismatches name the leaf and the
    dtype received (a float64 array is reported as float64, not as the float32 jit would make it)."""
    from buffers.rows import make_row_buffer

    buf = make_row_buffer(2, 4)
    state = buf.init({"obs": np.zeros(3, np.float32), "action": np.int32(0), "small": np.float16(0)})
    steps = {"obs": np.full((2, 3), 0.1, np.float64), "action": np.array([7, 8], np.int64),
             "small": np.ones(2, np.float16)}
    ids = np.array([0, 1], np.int32)
    eager, jitted = buf.add(state, steps, ids), jax.jit(buf.add)(state, steps, ids)
    jax.tree.map(np.testing.assert_array_equal, eager, jitted)
    assert eager.data["obs"].dtype == jnp.float32 and eager.data["action"].dtype == jnp.int32
    np.testing.assert_array_equal(eager.data["obs"][:, 0], np.full((2, 3), 0.1, np.float32))
    for leaf, bad, want in [("small", np.ones(2, np.float64), "float16"), ("action", np.ones(2), "int32"),
                            ("obs", np.ones((2, 3), np.float16), "float32")]:
        msg = rf"\['{leaf}'\]: expected dtype {want}, received {bad.dtype}"
        with pytest.raises(BufferInputError, match=msg):
            buf.add(state, {**steps, leaf: bad}, ids)
        if bad.dtype != np.float64:  # jit hands float64 over as float32: the message names that dtype
            with pytest.raises(BufferInputError, match=msg):
                jax.jit(buf.add)(state, {**steps, leaf: bad}, ids)


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
