"""rl/infra/xla_cpu.py: the unrolled threefry lowering on CPU is in effect after agents.setup.setup(), has no
while loop left in the compiled program, and gives exactly the bits of jax's default (rolled) lowering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agents.setup import setup
from rl.infra import xla_cpu
from tests.conftest import SHIPPED


def _draws(key):
    k1, k2 = jax.random.split(key)
    return (jax.random.key_data(jax.random.split(k1, 7)), jax.random.uniform(k2, (5, 3)),
            jax.random.randint(k1, (64,), 0, 10_000))


def _compiled(fn, key):
    return jax.jit(fn).lower(key).compile(SHIPPED)


def test_unrolled_threefry_same_bits_no_loop():
    setup.__wrapped__()  # what every entry point runs first (the suite's tests default to the rolled lowering)
    key = jax.random.PRNGKey(3)
    unrolled = _compiled(_draws, key)
    assert "while" not in unrolled.as_text()
    assert xla_cpu.unroll_threefry(False)
    try:
        rolled = _compiled(lambda k: _draws(k), key)  # a new function: traced and lowered again
        assert "while" in rolled.as_text()
        expected = rolled(key)
    finally:
        assert xla_cpu.unroll_threefry()
    for a, b in zip(unrolled(key), expected):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jnp.asarray(expected[0]).shape == (7, 2)
