"""rl/learning/schedules.py: `linear` with a traced step count (a population member's) equals the static one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.learning.schedules import linear


@pytest.mark.parametrize("steps", [0, 1, 5, 40])
@pytest.mark.parametrize("begin", [0, 10])
def test_traced_steps_give_the_static_schedule(steps, begin):
    counts = jnp.arange(-2, 60)
    static = np.asarray(jax.vmap(linear(1.0, 0.1, steps, begin))(counts))
    traced = np.asarray(jax.jit(lambda n: jax.vmap(linear(1.0, 0.1, n, begin))(counts))(jnp.int32(steps)))
    np.testing.assert_allclose(traced, static, rtol=1e-6)
    # start until `begin`, `end` once `steps` counts past it
    assert static[counts < begin].tolist() == pytest.approx([1.0] * int((counts < begin).sum()))
    assert static[counts >= begin + steps].tolist() == pytest.approx([0.1] * int((counts >= begin + steps).sum()))
