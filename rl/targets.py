"""Standard RL targets and losses, shared by the agents (thin, batched wrappers over rlax where it has them).

Shapes: B = batch, A = actions, T = time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import rlax

# Value rescaling h(x) = sign(x)(sqrt(|x|+1)-1)+eps*x and its inverse (Pohlen et al. 2018), from rlax.
signed_hyperbolic = rlax.signed_hyperbolic
signed_parabolic = rlax.signed_parabolic
LOSSES = ("huber", "mse")


def q_target(reward: jax.Array, discount: jax.Array, q_next_target: jax.Array,
             q_next_online: jax.Array | None = None) -> jax.Array:
    """Bootstrapped Q-learning target `[B]` = reward + discount * Q_target(s', a*), with gradients stopped.

    `reward`, `discount` `[B]` (for an n-step transition: the discounted reward sum and gamma^n times the
    continuation flag); `q_next_*` `[B, A]` at the bootstrap observation. Double Q-learning (van Hasselt et
    al. 2016) when `q_next_online` is given: a* = argmax Q_online(s'); otherwise a* = argmax Q_target(s').
    """
    selector = q_next_target if q_next_online is None else q_next_online
    best = jnp.argmax(selector, axis=-1)
    value = jnp.take_along_axis(q_next_target, best[..., None], axis=-1)[..., 0]
    return jax.lax.stop_gradient(reward + discount * value)


def td_loss(td: jax.Array, kind: str = "huber", huber_delta: float = 1.0) -> jax.Array:
    """Elementwise loss of TD errors: "huber" (quadratic within `huber_delta`) or "mse" (0.5 * td^2)."""
    if kind == "huber":
        return rlax.huber_loss(td, huber_delta)
    if kind == "mse":
        return 0.5 * jnp.square(td)
    raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")


def nstep_returns(reward: jax.Array, discount: jax.Array, value: jax.Array, n: int,
                  lambda_: float = 1.0) -> jax.Array:
    """n-step bootstrapped returns for time-major batches: `[T, B]` rewards, discounts and bootstrap
    values (value[t] is v(s_{t+1})) -> `[T, B]` targets (rlax.n_step_bootstrapped_returns per column)."""
    fn = lambda r, d, v: rlax.n_step_bootstrapped_returns(r, d, v, n, lambda_)
    return jax.vmap(fn, in_axes=1, out_axes=1)(reward, discount, value)
