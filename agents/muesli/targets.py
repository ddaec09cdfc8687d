"""Muesli's targets and masks, pure functions of arrays (agent.py calls them).

* `cmpo_log_probs`: the CMPO policy pi_cmpo(a|s) proportional to pi_prior(a|s) exp(clip(adv, -c, c)).
* `advantage_scale`: running (EMA) moments of the Retrace advantages and the scale that normalises them.
* `unroll_indices` / `unroll_masks` / `episode_index`: which model-unroll targets exist in a sequence.
* `mixed_prior_log_probs`: the CMPO prior with a uniform floor.
* `entropy_weight_at`: the entropy bonus after some train steps of its decay over the run.
* `diagnostics`: whether CMPO and the model do anything (KL of CMPO to its prior, the spread of the model's
  advantages and rewards over actions, the model advantage's agreement with Retrace's).
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
    """log pi_cmpo `[..., A]`: log softmax of log pi_prior + clip(advantages, -clip, clip) (`prior_logits`:
    any logits of the prior, e.g. `mixed_prior_log_probs`)."""
    log_prior = jax.nn.log_softmax(prior_logits, axis=-1)
    return jax.nn.log_softmax(log_prior + jnp.clip(advantages, -clip, clip), axis=-1)


def mixed_prior_log_probs(prior_logits: jax.Array, uniform_mix) -> jax.Array:
    """log of `(1 - uniform_mix) * softmax(prior_logits) + uniform_mix / A`, `[..., A]`: every action keeps at
    least `uniform_mix / A` of the prior, so CMPO's multiplicative update can bring back an action whose
    probability had reached ~0 (the paper's prior mixes in a small uniform share for this reason)."""
    num_actions = prior_logits.shape[-1]
    log_prior = jax.nn.log_softmax(prior_logits, axis=-1)
    return jnp.logaddexp(jnp.log1p(-uniform_mix) + log_prior, jnp.log(uniform_mix / num_actions))


NEEDS_RUN_LENGTH = ("agent.entropy_end_fraction decays the entropy bonus over the run, which only a run knows: "
                    "build the agent with total_steps (agents.experiment.build does)")


def entropy_weight_at(hp: dict, updates: jax.Array, run_updates: int | None) -> jax.Array:
    """`hp["entropy_weight"]` after `updates` train steps, linear over the run's `run_updates` to
    `hp["entropy_end_fraction"]` of it (hp: the config's values or a population member's)."""
    if not run_updates:
        raise ValueError(NEEDS_RUN_LENGTH)
    progress = jnp.minimum(updates / run_updates, 1.0)
    return hp["entropy_weight"] * (1.0 - (1.0 - hp["entropy_end_fraction"]) * progress)


def masked_correlation(x: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
    """Pearson correlation of `x` and `y` over the entries where `mask` holds; 0 when either is constant there."""
    mask = mask.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    dx = (x - jnp.sum(x * mask) / n) * mask
    dy = (y - jnp.sum(y * mask) / n) * mask
    var = jnp.sum(dx * dx) * jnp.sum(dy * dy)
    return jnp.where(var > 0, jnp.sum(dx * dy) / jnp.sqrt(jnp.where(var > 0, var, 1.0)), 0.0)


def diagnostics(log_prior: jax.Array, log_cmpo: jax.Array, norm_adv: jax.Array, model_reward: jax.Array,
                model_adv_taken: jax.Array, retrace_adv: jax.Array, retrace_mask: jax.Array, reward: jax.Array,
                valid: jax.Array) -> dict:
    """Means over a batch `[B, L]` of sequences, from the target network:

    * `kl_cmpo_prior`: KL(pi_cmpo || pi_prior) per valid step (`log_*` `[B, L, A]`): how far CMPO moves the policy;
    * `model_adv_spread`: max - min over actions of the normalised model advantage `norm_adv` `[B, L, A]`
      (above 2 * cmpo_clip, the clip binds);
    * `model_adv_corr`: the correlation of the model's advantage of the taken action `model_adv_taken` `[B, L]`
      with the Retrace advantage `retrace_adv` `[B, L]` over the steps with a Retrace target;
    * `reward_spread`: max - min over actions of the model's reward `model_reward` `[B, L, A]` on valid steps
      that paid a non-zero `reward` `[B, L]` (0 in a batch without one).
    """
    kl = jnp.sum(jnp.exp(log_cmpo) * (log_cmpo - log_prior), axis=-1)
    spread = lambda x: jnp.max(x, axis=-1) - jnp.min(x, axis=-1)
    return {"kl_cmpo_prior": masked_mean(kl, valid),
            "model_adv_spread": masked_mean(spread(norm_adv), valid),
            "model_adv_corr": masked_correlation(model_adv_taken, retrace_adv, retrace_mask),
            "reward_spread": masked_mean(spread(model_reward), valid & (reward != 0))}


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
