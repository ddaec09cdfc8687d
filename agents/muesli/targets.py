"""Muesli's targets and masks, pure functions of arrays (agent.py calls them).

* `cmpo_log_probs`: the CMPO policy pi_cmpo(a|s) proportional to pi_prior(a|s) exp(clip(adv, -c, c)).
* `advantage_scale`: running (EMA) moments of the Retrace advantages and the scale that normalises them.
* `unroll_indices` / `unroll_masks` / `episode_index`: which model-unroll targets exist in a sequence.
* `Targets`: what the loss needs from the target network.

Shapes: B batch, L sequence length, K unroll steps, A actions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import rlax
from flax import struct

from rl.learning.retrace import RetraceTargets


@struct.dataclass
class Targets:
    """Everything the loss needs from the target network, `[B, L, ...]`, no gradient."""

    retrace: RetraceTargets  # q, v, mask: [B, L]
    cmpo_log_probs: jax.Array  # [B, L, A]
    pg_advantage: jax.Array  # [B, L] normalised Retrace advantage


def cmpo_log_probs(prior_logits: jax.Array, advantages: jax.Array, clip: float) -> jax.Array:
    """log pi_cmpo `[..., A]`: log softmax of log pi_prior + clip(advantages, -clip, clip)."""
    log_prior = jax.nn.log_softmax(prior_logits, axis=-1)
    return jax.nn.log_softmax(log_prior + jnp.clip(advantages, -clip, clip), axis=-1)


def episode_index(done: jax.Array) -> jax.Array:
    """`[..., L]` bool done -> int32 number of episode ends strictly before each step."""
    ends = jnp.cumsum(done.astype(jnp.int32), axis=-1)
    return ends - done.astype(jnp.int32)


def unroll_indices(length: int, unroll_steps: int) -> jax.Array:
    """int32 `[L, K+1]`: index t + k of the step that unroll step k from t stands for, clipped to L - 1."""
    idx = jnp.arange(length)[:, None] + jnp.arange(unroll_steps + 1)[None, :]
    return jnp.minimum(idx, length - 1)


def unroll_masks(valid: jax.Array, terminated: jax.Array, truncated: jax.Array, unroll_steps: int):
    """Which unroll targets exist, for sequences `[B, L]`; returns `[B, L, K+1]` bools.

    `same[t, k]`: step t + k exists (inside the sequence and the stored data) and belongs to the episode of
    step t. `policy`/`value` targets at unroll step k need `same[t, k]`; the `reward` target at k >= 1 (for
    the action taken at t + k - 1) needs `same[t, k - 1]`; `absorbing[t, k]` (k >= 1): step t + k - 1 ended
    its episode by termination, so the model state after it has value 0.
    """
    L = valid.shape[1]
    idx = jnp.arange(L)[:, None] + jnp.arange(unroll_steps + 1)[None, :]  # [L, K+1], unclipped
    inside = idx < L
    cidx = jnp.minimum(idx, L - 1)
    episode = episode_index(terminated | truncated)  # [B, L]
    same = inside[None] & valid[:, cidx] & (episode[:, cidx] == episode[:, :, None]) & valid[:, :, None]
    prev_same = jnp.concatenate([jnp.zeros_like(same[..., :1]), same[..., :-1]], axis=-1)
    prev_idx = jnp.maximum(cidx - 1, 0)
    absorbing = prev_same & terminated[:, prev_idx]
    return same, prev_same, absorbing


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    mask = mask.astype(x.dtype)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def advantage_scale(ema: rlax.EmaState, advantage: jax.Array, mask: jax.Array, decay: float, eps: float):
    """Move the running moments of the Retrace advantages `[B, L]` (where `mask`) and return `(ema, scale,
    mean)`: the EMA of masked batch moments (debiased as in Adam; unchanged by a batch without targets), the
    normalising scale sqrt(second moment + eps) and the debiased mean (kept for monitoring).

    The advantages are centred by construction (baseline E_prior q), so their variance is estimated by the
    debiased second moment.
    """
    mask = mask.astype(jnp.float32)
    count = jnp.sum(mask)
    batch_mean = jnp.sum(advantage * mask) / jnp.maximum(count, 1.0)
    batch_m2 = jnp.sum(jnp.square(advantage) * mask) / jnp.maximum(count, 1.0)
    moved = rlax.EmaState(mu=decay * ema.mu + (1 - decay) * batch_mean,
                          nu=decay * ema.nu + (1 - decay) * batch_m2,
                          decay_product=ema.decay_product * decay)
    ema = jax.tree_util.tree_map(lambda new, old: jnp.where(count > 0, new, old), moved, ema)
    moments = ema.debiased_moments()
    second_moment = moments.variance + jnp.square(moments.mean)
    return ema, jnp.sqrt(second_moment + eps), moments.mean
