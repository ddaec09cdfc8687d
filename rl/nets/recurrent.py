"""Recurrent value networks: a torso, an LSTM core unrolled over time with episode resets, a Q head.

Shapes (T = time, B = batch, H = LSTM size, A = actions). Everything recurrent is time-major:
observations `[T, B, *obs_shape]`, reset flags `[T, B]` bool, outputs `[T, B, ...]`. The carry is an
`LSTMCarry(c, h)` with `[B, H]` leaves, so the runners' generic `rl.learning.agent.reset_carry` (which picks along
the leading env axis) applies to it, and it can be stored per step in a replay buffer.

A reset flag at step t replaces the carry with zeros *before* step t is processed: this is what an actor
does at the first step of a new episode, so unrolling a stored sequence that crosses an episode boundary
reproduces the actor's states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from rl.nets.networks import NetworkConfig, QHead, make_torso


class LSTMCarry(NamedTuple):
    """LSTM state: cell `c` and hidden `h`, each `[B, H]`."""

    c: jax.Array
    h: jax.Array


def zero_carry(batch: int, hidden_size: int) -> LSTMCarry:
    """The initial (zero) state for `batch` fresh episodes (two distinct arrays, so both can be donated)."""
    return LSTMCarry(jnp.zeros((batch, hidden_size), jnp.float32), jnp.zeros((batch, hidden_size), jnp.float32))


def reset_flags(done: jax.Array) -> jax.Array:
    """Reset flags `[T, B]` from done flags `[T, B]`: step t starts a new episode iff step t-1 was done.

    Step 0 is never reset: its carry is the one stored with (or given for) the sequence.
    """
    return jnp.concatenate([jnp.zeros_like(done[:1]), done[:-1]], axis=0).astype(bool)


class _ResetLSTMStep(nn.Module):
    """One LSTM step whose carry is zeroed first where `reset` is set."""

    hidden_size: int

    @nn.compact
    def __call__(self, carry: LSTMCarry, inputs: tuple[jax.Array, jax.Array]):
        x, reset = inputs
        keep = (~reset)[:, None].astype(x.dtype)
        carry = (carry.c * keep, carry.h * keep)
        (c, h), out = nn.OptimizedLSTMCell(self.hidden_size, name="cell")(carry, x)
        return LSTMCarry(c, h), out


class ResettingLSTM(nn.Module):
    """LSTM unrolled over `[T, B, F]` inputs with `[T, B]` reset flags -> (final carry, `[T, B, H]`)."""

    hidden_size: int

    @nn.compact
    def __call__(self, carry: LSTMCarry, x: jax.Array, reset: jax.Array):
        scan = nn.scan(
            _ResetLSTMStep,
            variable_broadcast="params",
            split_rngs={"params": False},
            in_axes=0,
            out_axes=0,
        )
        return scan(self.hidden_size, name="lstm")(LSTMCarry(*carry), (x, reset))


class RecurrentQNetwork(nn.Module):
    """Torso -> LSTM -> Q head over time: `(carry, obs [T, B, ...], reset [T, B]) -> (carry, q [T, B, A])`.

    The torso and head run on all T*B steps at once; only the LSTM is scanned over time.
    """

    torso: nn.Module
    head: nn.Module
    hidden_size: int

    @nn.compact
    def __call__(self, carry: LSTMCarry, obs: jax.Array, reset: jax.Array):
        if obs.ndim < 2 or reset.shape != obs.shape[:2]:
            raise ValueError(
                f"RecurrentQNetwork expects time-major obs [T, B, ...] and reset [T, B]; got obs {obs.shape}, "
                f"reset {reset.shape}"
            )
        features = self.torso(obs)
        carry, hidden = ResettingLSTM(self.hidden_size, name="core")(carry, features, reset)
        return carry, self.head(hidden)


def make_recurrent_q_network(
    obs_shape: Sequence[int], num_actions: int, cfg: NetworkConfig, lstm_size: int
) -> RecurrentQNetwork:
    """The R2D2 network: `make_torso` (MLP / Nature CNN) -> LSTM(`lstm_size`) -> (dueling) Q head."""
    if lstm_size <= 0:
        raise ValueError(f"lstm_size must be positive, got {lstm_size}")
    head = QHead(num_actions, tuple(cfg.head_hidden), cfg.dueling, cfg.activation)
    return RecurrentQNetwork(make_torso(obs_shape, cfg), head, int(lstm_size))


UnrollFn = Callable[..., tuple[LSTMCarry, jax.Array]]  # (params, carry, obs [T,B,..], reset [T,B])


def unroll_with_burn_in(
    unroll: UnrollFn, params, carry: LSTMCarry, obs: jax.Array, reset: jax.Array, burn_in: int
) -> tuple[LSTMCarry, jax.Array]:
    """Unroll `burn_in` steps without gradient, then the rest with it.

    `unroll(params, carry, obs, reset) -> (carry, out)` is e.g. `network.apply`. The carry after the
    burn-in is passed through `stop_gradient`, so neither the params nor the burn-in inputs receive any
    gradient through it. Returns the final carry and the outputs of steps `burn_in..T-1` (`[T - burn_in, B,
    ...]`).
    """
    steps = obs.shape[0]
    if not 0 <= burn_in < steps:
        raise ValueError(f"burn_in must be in [0, {steps}) for sequences of {steps} steps, got {burn_in}")
    if burn_in > 0:
        carry, _ = unroll(params, carry, obs[:burn_in], reset[:burn_in])
        carry = jax.lax.stop_gradient(carry)
    return unroll(params, carry, obs[burn_in:], reset[burn_in:])
