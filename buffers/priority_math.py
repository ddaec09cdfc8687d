"""Importance weights for prioritised samples, R2D2's sequence priority, and the priority-cleaning rule.

Rule shared by every `set_priorities` (flat prioritised, sequences, n-step): a raw priority that is not a
finite positive number (NaN, +-inf, negative, 0) counts as 0: its slot is never drawn until a later
priority or overwrite, and it does not raise the maximum priority given to new items. So one bad TD error
cannot turn the sum tree's total NaN/inf (which would stop `can_sample` and make samples garbage).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def clean_priorities(priorities) -> jax.Array:
    """Raw priorities as float32 with every value that is not finite and positive replaced by 0."""
    p = jnp.asarray(priorities, jnp.float32)
    return jnp.where(jnp.isfinite(p) & (p > 0), p, 0.0)


def importance_weights(probabilities: jax.Array, size, beta) -> jax.Array:
    """w_i = (size * P(i))**-beta / max_j w_j, for a batch of sampling probabilities ([B] -> [B]).

    `size` is the number of items the sample was drawn from (N), `beta` in [0, 1] (may be traced, e.g.
    annealed). beta = 0 gives ones. Entries with P(i) = 0 (not a real sample, e.g. from an empty buffer)
    get weight 0 and are left out of the max.
    """
    p = jnp.asarray(probabilities, jnp.float32)
    real = p > 0
    scaled = jnp.asarray(size, jnp.float32) * jnp.where(real, p, 1.0)
    w = jnp.where(real, scaled ** (-jnp.asarray(beta, jnp.float32)), 0.0)
    return w / jnp.maximum(jnp.max(w), jnp.finfo(jnp.float32).tiny)


def sequence_priority(abs_td: jax.Array, mask: jax.Array | None = None, eta: float = 0.9) -> jax.Array:
    """R2D2 priority of each sequence: eta * max_t |td| + (1 - eta) * mean_t |td| over valid steps.

    `abs_td` [B, L] (absolute TD errors), `mask` [B, L] bool (None: all valid). A sequence without any
    valid step gets priority 0. Returns [B].
    """
    abs_td = jnp.abs(abs_td)
    if mask is None:
        mask = jnp.ones(abs_td.shape, bool)
    if mask.shape != abs_td.shape:
        raise ValueError(
            f"sequence_priority: mask shape {mask.shape} differs from abs_td shape {abs_td.shape}"
        )
    mask = mask.astype(bool)
    count = jnp.sum(mask, axis=-1)
    mx = jnp.max(jnp.where(mask, abs_td, 0.0), axis=-1)
    mean = jnp.sum(jnp.where(mask, abs_td, 0.0), axis=-1) / jnp.maximum(count, 1)
    return eta * mx + (1.0 - eta) * mean  # no valid step: max and mean are both 0
