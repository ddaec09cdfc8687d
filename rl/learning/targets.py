"""Standard RL targets and losses, shared by the agents (thin, batched wrappers over rlax where it has them).

Shapes: B = batch, A = actions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import rlax

LOSSES = ("huber", "mse")


def taken(values: jax.Array, action: jax.Array) -> jax.Array:
    """`values[..., action]` per row: `values` `[..., A]`, `action` `[...]` int -> `[...]`. (A squeeze, not an
    index `[..., 0]`: jax clamps a static out-of-range index, so `[..., 1]` would read the same value.)"""
    return jnp.take_along_axis(values, action[..., None], axis=-1).squeeze(-1)


def q_target(reward: jax.Array, discount: jax.Array, q_next_target: jax.Array,
             q_next_online: jax.Array | None = None) -> jax.Array:
    """Bootstrapped Q-learning target `[B]` = reward + discount * Q_target(s', a*), with gradients stopped.

    `reward`, `discount` `[B]` (for an n-step transition: the discounted reward sum and gamma^n times the
    continuation flag); `q_next_*` `[B, A]` at the bootstrap observation. Double Q-learning (van Hasselt et
    al. 2016) when `q_next_online` is given: a* = argmax Q_online(s'); otherwise a* = argmax Q_target(s').
    """
    selector = q_next_target if q_next_online is None else q_next_online
    best = jnp.argmax(selector, axis=-1)
    value = taken(q_next_target, best)
    return jax.lax.stop_gradient(reward + discount * value)


def td_loss(td: jax.Array, kind: str = "huber", huber_delta: float = 1.0) -> jax.Array:
    """Elementwise loss of TD errors: "huber" (quadratic within `huber_delta`) or "mse" (0.5 * td^2)."""
    if kind == "huber":
        return rlax.huber_loss(td, huber_delta)
    if kind == "mse":
        return 0.5 * jnp.square(td)
    raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")
