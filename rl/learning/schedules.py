"""Step-indexed schedules (pure functions of an integer count, usable under jit)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def linear(start: float, end: float, steps: int, begin: int = 0) -> optax.Schedule:
    """`start` until `begin`, then linear to `end` over `steps` counts, then `end`. `start`, `end` and
    `steps` may be traced (a population member's, rl/learning/population.py)."""
    if isinstance(steps, jax.Array):
        def schedule(count):  # optax.linear_schedule's arithmetic for a traced step count (<= 0: `end` at once)
            n = jnp.maximum(steps, 1)
            frac = 1 - jnp.clip(count - begin, 0, n) / n
            return jnp.where(steps > 0, (start - end) * frac + end, jnp.where(count < begin, start, end))
        return schedule
    if steps <= 0:
        return lambda count: jnp.where(jnp.asarray(count) < begin, start, end)
    return optax.linear_schedule(start, end, steps, transition_begin=begin)
