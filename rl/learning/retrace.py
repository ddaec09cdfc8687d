"""Retrace targets (Munos et al. 2016) over stored sequences that may cross episode ends.

One sequence of T steps in step format (rl/learning/agent.py): at step t the behaviour policy mu took action a_t in
state s_t and got reward r_t, `terminated_t` / `truncated_t`; `valid_t` is False past the newest stored
step. Given q_t = q(s_t, a_t) and v_t = E_pi q(s_t, .) under the target policy pi, the Retrace estimate of
q_pi(s_t, a_t) is

    G_t = r_t + gamma_t * (v_{t+1} - c_{t+1} q_{t+1} + c_{t+1} G_{t+1}),   c_t = lambda min(1, pi/mu)(a_t|s_t)

(`rlax.general_off_policy_returns_from_q_and_v`), and the matching state-value estimate is
V_t = v_t + c_t (G_t - q_t), so that G_t = r_t + gamma_t V_{t+1}.

Episode ends: gamma_t = discount * (1 - terminated_t), so a terminal step's target is its reward. A
truncated step has no usable successor in the row (the next step starts a new episode), so its own target
is masked. A step whose successor is not valid (end of the sequence or of the stored data) has no target
unless it terminated. The trace is cut at every step without a target: the step before it bootstraps
from v there. Targets at masked steps are finite but meaningless.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import rlax
from flax import struct


@struct.dataclass
class RetraceTargets:
    """Per-step targets `[T]`: `q` estimates q_pi(s_t, a_t), `v` estimates v_pi(s_t); `mask` marks the steps
    that have a target."""

    q: jax.Array
    v: jax.Array
    mask: jax.Array


def retrace_coefficients(log_pi: jax.Array, log_mu: jax.Array, lambda_: float) -> jax.Array:
    """Trace coefficients c = lambda * min(1, pi/mu) from log-probabilities of the taken actions `[...]`."""
    return lambda_ * jnp.exp(jnp.minimum(0.0, log_pi - log_mu))


def retrace_targets(q: jax.Array, v: jax.Array, reward: jax.Array, terminated: jax.Array,
                    truncated: jax.Array, valid: jax.Array, c: jax.Array, discount: float) -> RetraceTargets:
    """Retrace targets for one sequence; all inputs are `[T]` (bools for terminated/truncated/valid).

    `q`: q(s_t, a_t) of the taken actions; `v`: E_pi q(s_t, .); `c`: trace coefficients (see
    `retrace_coefficients`). Gradients are stopped. Use `jax.vmap` for a batch of sequences.
    """
    if not (q.ndim == v.ndim == reward.ndim == terminated.ndim == truncated.ndim == valid.ndim == c.ndim == 1):
        raise ValueError("retrace_targets takes one sequence: all inputs must be rank 1 [T]; got shapes "
                         f"q{q.shape} v{v.shape} reward{reward.shape} terminated{terminated.shape} "
                         f"truncated{truncated.shape} valid{valid.shape} c{c.shape}")
    if len({q.shape, v.shape, reward.shape, terminated.shape, truncated.shape, valid.shape, c.shape}) != 1:
        raise ValueError("retrace_targets inputs must share one shape [T]; got shapes "
                         f"q{q.shape} v{v.shape} reward{reward.shape} terminated{terminated.shape} "
                         f"truncated{truncated.shape} valid{valid.shape} c{c.shape}")
    q, v, reward, c = (jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)) for x in (q, v, reward, c))
    terminated, truncated, valid = (jnp.asarray(x, bool) for x in (terminated, truncated, valid))
    valid_next = jnp.append(valid[1:], False)
    mask = valid & ~truncated & (terminated | valid_next)
    # The trace stops at steps without a target (invalid, truncated, or without a valid successor): the
    # step before such a step bootstraps from its v, and nothing computed at or after it flows back (c = 0).
    c = jnp.where(mask, c, 0.0)
    gamma = discount * (1.0 - terminated.astype(jnp.float32))
    # Successor quantities at t+1, with zeros past the end of the sequence (masked or multiplied by 0).
    v_next = jnp.append(v[1:], 0.0)
    q_next = jnp.append(q[1:], 0.0)
    c_next = jnp.append(c[1:], 0.0)
    g = rlax.general_off_policy_returns_from_q_and_v(
        q_t=q_next[:-1], v_t=v_next, r_t=reward, discount_t=gamma, c_t=c_next[:-1])
    v_target = v + c * (g - q)
    return RetraceTargets(q=g, v=v_target, mask=mask)
