"""Epsilon-greedy action selection, shared by the Q-learning agents (DQN, R2D2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def epsilon_greedy(key: jax.Array, q: jax.Array, epsilon) -> jax.Array:
    """Actions `[E]` int32 from Q-values `[E, A]`: the argmax, replaced by a uniformly random action with
    probability `epsilon` (a scalar, or `[E]` for per-env epsilons; 0 is greedy)."""
    greedy = jnp.argmax(q, axis=-1).astype(jnp.int32)
    k_explore, k_action = jax.random.split(key)
    random_actions = jax.random.randint(k_action, greedy.shape, 0, q.shape[-1], jnp.int32)
    return jnp.where(jax.random.uniform(k_explore, greedy.shape) < epsilon, random_actions, greedy)
