"""rl/infra/checkpoint.py: exact round trip of runner-like pytrees (typed keys, empty arrays, custom nodes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from rl.infra import checkpoint


@struct.dataclass
class _Node:
    a: jax.Array
    b: dict


def _tree(seed: int):
    k = jax.random.PRNGKey(seed)
    return (_Node(a=jax.random.normal(k, (3, 4)), b={"key": jax.random.key(seed), "empty": jnp.zeros((2, 0)),
                                                      "i": jnp.arange(5, dtype=jnp.int32) * seed}),
            jnp.asarray(seed, jnp.int32), (), jnp.array([True, False]))


def _assert_equal(x, y):
    for a, b in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree_util.tree_structure(x) == jax.tree_util.tree_structure(y)


def test_round_trip_and_keep(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save(tmp_path / "checkpoints", step, _tree(step), {"env_steps": step, "x": [1.5, None]}, keep=2)
    assert checkpoint.latest_step(tmp_path) == 30
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["20", "30"]
    state, meta = checkpoint.restore(tmp_path, jax.eval_shape(lambda: _tree(0)))
    _assert_equal(state, _tree(30))
    assert meta["env_steps"] == 30 and meta["x"] == [1.5, None]
    assert checkpoint.read_meta(tmp_path / "checkpoints")["env_steps"] == 30
    # The restored typed key works as a key.
    jax.random.normal(state[0].b["key"], (2,))


def test_mismatch_and_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.read_meta(tmp_path)
    checkpoint.save(tmp_path, 1, {"a": jnp.zeros(3)}, {})
    with pytest.raises(ValueError, match="does not match"):
        checkpoint.restore(tmp_path, {"b": jnp.zeros(3)})


def test_a_state_saved_as_a_dict_restores_into_the_dataclass_that_replaced_it(tmp_path):
    """Sebulba's state was a dict `{"actor_key", "agent", ...}` and is now `SebulbaState` with the same fields
    in the same (name) order: its older checkpoints restore; other names are still refused."""
    from rl.runners.sebulba import SebulbaState

    old = {"actor_key": jax.random.PRNGKey(1), "agent": {"params": jnp.arange(3.0)}, "buffer": jnp.ones((2, 2)),
           "key": jax.random.PRNGKey(2), "owed": jnp.asarray(3, jnp.int32)}
    checkpoint.save(tmp_path, 5, old, {})
    state, _ = checkpoint.restore(tmp_path, jax.eval_shape(lambda: SebulbaState(**old)))
    assert isinstance(state, SebulbaState) and int(state.owed) == 3
    _assert_equal(state, SebulbaState(**old))
    renamed = {**{k: v for k, v in old.items() if k != "owed"}, "owing": old["owed"]}
    with pytest.raises(ValueError, match="does not match"):
        checkpoint.restore(tmp_path, jax.eval_shape(lambda: renamed))


def test_one_line_keeps_the_first_line_up_to_200_characters():
    """The first non-blank line of the message (an OSError's strerror); 200 characters stay whole, a longer line
    is cut to 197 and `...`; an empty message gives the exception's type."""
    assert checkpoint.one_line(ValueError("\n  first  \nsecond")) == "first"
    assert checkpoint.one_line(ValueError("x" * 200)) == "x" * 200
    assert checkpoint.one_line(ValueError("x" * 201)) == "x" * 197 + "..."
    assert checkpoint.one_line(OSError(28, "No space left on device")) == "No space left on device"
    assert checkpoint.one_line(ValueError("")) == "ValueError"
