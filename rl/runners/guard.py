"""Non-finite guard: NaN/Inf in a train step's metrics or in the updated agent state, found inside jit.

`guard(train_step, mode)` wraps an agent's `train_step(state, buffer_state, key)` and returns
`(state, buffer_state, metrics, bad)` where `bad` maps every metric name and `"params"` to a bool scalar: True
when that value is not finite after this update. No host round-trip: both runners fold `bad` into their
interval totals (`Totals.add_update` in rl/runners/totals.py: the first env step each name was non-finite) and
the host loop reads it with the other metrics (rl/runners/loop.py).
* `mode="stop"` (default of `on_nonfinite`): the update is applied as computed; the host loop raises a
  `NonFiniteError` at the end of the chunk, naming the metric and the env step, without checkpointing the
  state (the last checkpoint on disk is the last finite one). `"params"` checks the online parameters
  (`state.params`) after every update, and the whole agent state (optimiser moments, target network, ...) once
  per compiled call (`check_state`, at the call's last env step): a non-finite optimiser state that leaves the
  parameters finite (an overflowing Adam second moment freezes its weights) is still found before any
  checkpoint, at the cost of a coarser step. Reducing the whole state after every update would cost a large
  share of a small agent's iteration on XLA:CPU, where reductions are slow; the parameters alone cost ~0.
* `mode="skip"`: a non-finite update (any float leaf of the updated agent state) is dropped (the agent state
  before it is kept; the buffer's writes, e.g. priorities, are kept: a non-finite priority counts as 0, see
  buffers/priority_math.py); the share of dropped updates per chunk is logged as `train/skipped`, and `bad`
  reports nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

MODES = ("stop", "skip")
NOT_SEEN = -1  # first non-finite env step of a metric that stayed finite (rl/runners/totals.py)


class NonFiniteError(FloatingPointError):
    """A train metric or the agent's parameters became NaN/Inf; the message names which and when."""


def all_finite(tree) -> jax.Array:
    """True iff every floating-point leaf of `tree` is finite (bool scalar).

    As a sum of `x * 0` per leaf (0 where finite, NaN for a NaN or an Inf, and never an overflow), added up: a
    reduction kernel per leaf on XLA:CPU, which does not merge sibling reductions. Concatenating the leaves
    into one sum takes fewer kernels but copies every parameter each step, which made a one-seed DQN CartPole
    iteration on a CPU ~15% slower (docs/kernels.md).
    """
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    if not leaves:
        return jnp.bool_(True)
    return jnp.isfinite(sum(jnp.sum(x * 0, dtype=jnp.float32) for x in leaves))


def guard(train_step: Callable, mode: str = "stop") -> Callable:
    """`train_step` with non-finite detection (and, for `skip`, rejection) of its update."""
    if mode not in MODES:
        raise ValueError(f"on_nonfinite must be one of {MODES}, got {mode!r}")

    def step(state, buffer_state, key):
        new_state, buffer_state, metrics = train_step(state, buffer_state, key)
        bad = {k: ~jnp.all(jnp.isfinite(jnp.asarray(v))) for k, v in metrics.items()}
        bad["params"] = ~all_finite(new_state if mode == "skip" else getattr(new_state, "params", new_state))
        if mode == "skip":
            reject = jnp.any(jnp.stack(list(bad.values())))
            new_state = jax.tree_util.tree_map(lambda old, new: jnp.where(reject, old, new), state, new_state)
            metrics = {**metrics, "skipped": reject.astype(jnp.float32)}
            bad = {k: jnp.bool_(False) for k in bad}  # handled here: nothing for the host loop to stop on
        return new_state, buffer_state, metrics, bad

    return step


def check_state(totals, agent_state, env_step):
    """`totals` with `"params"` flagged at `env_step` (unless flagged earlier) when any float leaf of
    `agent_state` is non-finite: the whole-state check of `stop` mode, once per compiled call."""
    return totals.flag("params", ~all_finite(agent_state), env_step)


def check(first_bad: dict[str, int]) -> None:
    """Raise `NonFiniteError` for the earliest non-finite value of an interval's totals (`{name: first env step}`)."""
    seen = {k: int(v) for k, v in first_bad.items() if int(v) != NOT_SEEN}
    if not seen:
        return
    name, step = min(seen.items(), key=lambda kv: (kv[1], kv[0] != "loss"))
    what = "the agent's parameters" if name == "params" else f"train metric `{name}`"
    others = sorted(k for k in seen if k != name)
    raise NonFiniteError(
        f"{what} became non-finite (NaN/Inf) at env step {step}" + (f" (also: {', '.join(others)})" if others else "")
        + ". Training stopped; the last checkpoint on disk holds the last finite state. Lower the learning rate or "
        "set on_nonfinite=skip to drop such updates.")
