"""Step-indexed schedules (pure functions of an integer count, usable under jit)."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def linear(start: float, end: float, steps: int, begin: int = 0) -> optax.Schedule:
    """`start` until `begin`, then linear to `end` over `steps` counts, then `end`."""
    if steps <= 0:
        return lambda count: jnp.where(jnp.asarray(count) < begin, start, end)
    return optax.linear_schedule(start, end, steps, transition_begin=begin)
