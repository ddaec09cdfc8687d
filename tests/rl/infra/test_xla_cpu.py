"""rl/infra/xla_cpu.py: the unrolled threefry lowering on CPU is in effect after agents.setup.setup() (unless
the process asked jax for unoptimised programs), has no while loop left in the compiled program, and gives
exactly the bits of jax's default (rolled) lowering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.setup import setup
from rl.infra import xla_cpu
from tests.conftest import SHIPPED


def _draws(key):
    k1, k2 = jax.random.split(key)
    return (jax.random.key_data(jax.random.split(k1, 7)), jax.random.uniform(k2, (5, 3)),
            jax.random.randint(k1, (64,), 0, 10_000))


def _compiled(fn, key):
    return jax.jit(fn).lower(key).compile(SHIPPED)


def _set_up_as(unoptimised: bool) -> None:
    """agents.setup.setup() as a process started with JAX_DISABLE_MOST_OPTIMIZATIONS=<unoptimised> runs it."""
    jax.config.update("jax_disable_most_optimizations", unoptimised)
    setup.__wrapped__()


@pytest.mark.optimized  # a user's process: XLA's default options
def test_unrolled_threefry_same_bits_no_loop():
    _set_up_as(unoptimised=False)  # what every entry point runs first
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


def test_a_process_asking_for_unoptimised_programs_keeps_the_rolled_loop():
    _set_up_as(unoptimised=True)
    assert "while" in _compiled(lambda k: _draws(k), jax.random.PRNGKey(3)).as_text()
    _set_up_as(unoptimised=False)
    assert "while" not in _compiled(lambda k: _draws(k), jax.random.PRNGKey(3)).as_text()
