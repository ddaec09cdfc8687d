"""rl/learning/target_update.py: the target parameters after each update, against the formula by hand."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rl.learning.target_update import update_target


@pytest.mark.parametrize("period", [1, 2, 3])
@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_the_target_moves_every_period_updates_by_rate(period, rate):
    """Updates 1..6 with online params equal to the update number: the target moves `rate` of the way to them
    exactly at the updates that are multiples of `period`, and stays put at the others."""
    target, want = {"w": jnp.zeros(3)}, 0.0
    for n in range(1, 7):
        online = {"w": jnp.full(3, float(n))}
        target = update_target(target, online, jnp.int32(n), period=period, rate=rate)
        if n % period == 0:
            want = rate * n + (1 - rate) * want
        np.testing.assert_allclose(np.asarray(target["w"]), want, rtol=1e-6, err_msg=f"update {n}")
