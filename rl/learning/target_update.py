"""The target-network update, shared by every agent with a target (or prior) network, and the learner state
of the agents that have nothing else (DQN, R2D2)."""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import struct


@struct.dataclass
class TargetNetState:
    """Online and target parameters, optimiser state and the gradient steps taken (DQN's and R2D2's state)."""

    params: Any
    target_params: Any
    opt_state: Any
    updates: jax.Array  # int32[] gradient steps taken


def update_target(target, online, updates: jax.Array, period: int = 1, rate: float = 1.0):
    """The target params after learner update number `updates` (int32, counting the update just taken).

    Every `period` updates the target moves `rate` of the way to the `online` params: `rate=1` copies them
    (DQN's and R2D2's periodic copy), `rate < 1` averages, `rate * online + (1 - rate) * target` (Polyak
    averaging with DQN's `tau`; with `period=1` an EMA, Muesli's prior network). A traced `rate` (a population
    member's) always averages; at 1 that gives the online params.
    """
    copy = not isinstance(rate, jax.Array) and rate == 1.0
    moved = online if copy else optax.incremental_update(online, target, rate)
    return moved if period == 1 else optax.periodic_update(moved, target, updates, period)
