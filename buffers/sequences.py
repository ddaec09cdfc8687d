"""Sequences of length L sampled from per-env rows, with episode awareness, priorities and an online queue.

Storage and writes are those of `buffers/rows.py`: `data [E, T, ...]`, step `a` of env `e` at `[e, a % T]`.
A *start slot* is `(env, pos)`, flat index `slot = env * T + pos`; it stands for the newest absolute step
`a` of that row with `a % T == pos`.

* `remaining(slot)`: valid steps of the sequence starting there, capped at L, at the row's newest step and,
  unless `cross_episodes`, just after the first step whose `done_fn(step)` is True.
* Eligible starts: `a % period == 0`; with `start="episode"` only where the previous step had done (or
  `a == 0`); with `complete_only` only where `remaining == L` or its last valid step has done.
* Weight of a slot: `eligible * remaining ** length_power * priority ** alpha` (the priority factor only
  when `priority_exponent` is not None; new slots get the largest priority set so far, 1 at first; a
  priority that is not a finite positive number, NaN and +-inf included, counts as 0).

The weights are held by one of two strategies behind one interface (`buffers/starts.py`), chosen
statically: *counted* (`buffers/counted.py`: no priorities, `start="any"`, not `complete_only`, and
`cross_episodes` or `length_power == 0`; no per-slot state, `state.weights` is None) or *sum tree*
(`buffers/tree_weights.py`, otherwise; `state.weights` a `TreeState`, a `PrioritisedTreeState` with
priorities). Either way: no capacity-sized work per add or sample, no while loop; the gather is
O(B * L * leaf size). Their module docstrings give the costs.

Online queue (`online_window = W > 0`, `buffers/online.py`): per env the last
`min(written - online_start, W)` steps are not yet consumed. `sample_online` draws starts inside the
queue with the replay's eligibility and `remaining ** length_power` (no priority factor);
`consume_online` empties the queue; `sample_mixed` stacks `round(B * online_fraction)` online sequences
(first) on replay ones.

Sampling results: `data [B, L, ...]` holds the stored steps at the L positions after the start; positions
where `mask` is False are whatever the row holds there (later/older data or zeros), never to be used.
Empty buffer (no eligible start): `slots` 0, `probabilities` 0, `mask` all False, and `can_sample` False.

Storage layout (`layout`): "windows" (the default) lays the rows out for reading whole windows (every leaf
apart, the first L-1 positions of each row repeated after it: `buffers/rows.py`); "packed" packs the small
leaves of a step into one row, for callers that read single steps (the n-step buffer).

Requires `capacity_per_env > sequence_length` (a start's previous step must still be stored while its
weight can change). env_ids follow the write rule of `buffers/rows.py` (ids outside `[0, E)` write nothing,
of a repeated id the last entry is stored and its row advances once); `debug=True` instead rejects them
with `checkify`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from buffers import checks, rows, sumtree
from buffers.counted import CountedWeights
from buffers.online import OnlineQueue
from buffers.rows import RowState
from buffers.starts import SequenceRules, SequenceSample, Starts, WeightStrategy
from buffers.tree_weights import PrioritisedTreeWeights, TreeWeights, tree_stride


@struct.dataclass
class SequenceState:
    rows: RowState  # data [E, T, ...], written [E], online_start [E]
    weights: Any  # the weight strategy's state: None (counted), TreeState or PrioritisedTreeState


def _default_done(step):
    return step["done"]


@dataclasses.dataclass(frozen=True)
class SequenceBuffer:
    num_envs: int
    capacity_per_env: int
    sequence_length: int
    period: int = 1
    start: str = "any"
    cross_episodes: bool = True
    complete_only: bool = False
    length_power: float = 0.0
    priority_exponent: float | None = None
    online_window: int = 0
    done_fn: Callable = _default_done
    min_size: int = 1
    fanout: int = sumtree.DEFAULT_FANOUT
    debug: bool = False
    layout: str = "windows"

    # ---- configuration ----------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return self.num_envs * self.capacity_per_env

    @property
    def stride(self) -> int:
        """Positions of a row per sum-tree leaf (see `buffers/tree_weights.py`)."""
        return tree_stride(self.period, self.capacity_per_env)

    @property
    def prioritised(self) -> bool:
        return self.priority_exponent is not None

    @property
    def counted(self) -> bool:
        """True when weights follow from `written` alone (no sum tree kept; see `buffers/counted.py`)."""
        return (not self.prioritised and self.start == "any" and not self.complete_only
                and (self.cross_episodes or self.length_power == 0))

    @property
    def _rules(self) -> SequenceRules:
        return SequenceRules(
            num_envs=self.num_envs, capacity_per_env=self.capacity_per_env, sequence_length=self.sequence_length,
            period=self.period, start=self.start, cross_episodes=self.cross_episodes,
            complete_only=self.complete_only, length_power=self.length_power, done_fn=self.done_fn)

    @property
    def _weights(self) -> WeightStrategy:
        if self.counted:
            return CountedWeights(self._rules)
        if self.prioritised:
            return PrioritisedTreeWeights(self._rules, self.fanout, self.priority_exponent)
        return TreeWeights(self._rules, self.fanout)

    @property
    def _online(self) -> OnlineQueue:
        if self.online_window == 0:
            raise checks.BufferInputError("the online queue needs a buffer made with online_window > 0")
        return OnlineQueue(self._rules, self._weights, self.online_window)

    def _prioritised_weights(self, what: str) -> PrioritisedTreeWeights:
        if not self.prioritised:
            raise checks.BufferInputError(f"{what} needs a buffer made with priority_exponent")
        return self._weights

    def weights(self, state: SequenceState) -> jax.Array:
        """Current sampling weight of every slot `[E*T]` (O(E*T): for inspection and tests, not the hot path)."""
        return self._weights.slot_weights(state.rows, state.weights)

    # ---- replay -----------------------------------------------------------------------------------------
    def init(self, prototype) -> SequenceState:
        """Empty state for steps shaped like `prototype` (a pytree of scalars / arrays, no batch dim)."""
        proto = checks.as_prototype(prototype)
        try:
            self._rules.done_of(jax.tree_util.tree_map(lambda s: jnp.zeros((1,) + s.shape, s.dtype), proto))
        except (KeyError, AttributeError, TypeError, IndexError) as e:
            raise checks.BufferInputError(f"done_fn cannot read the done flag from the prototype: {e!r}") from e
        window = self.sequence_length if self.layout == "windows" else 1
        return SequenceState(rows=rows.init_rows(proto, self.num_envs, self.capacity_per_env, window),
                             weights=self._weights.init())

    def add(self, state: SequenceState, steps, env_ids, mask=None) -> SequenceState:
        """Write `steps [N, ...]` to rows `env_ids [N]` where `mask [N]` (default all True); see `rows.py` for
        repeated and out-of-range ids."""
        steps, env_ids, mask = rows.prepare_add(state.rows.packing.prototype, steps, env_ids, mask)
        if self.debug:
            rows.check_env_ids(env_ids, mask, self.num_envs)
        done_new = self._rules.done_of(steps)
        r, abs_new, row = rows.write(state.rows, steps, env_ids, mask)
        return SequenceState(rows=r, weights=self._weights.after_write(r, state.weights, done_new, abs_new, row))

    def peek(self, state: SequenceState, env_ids) -> Any:
        """Latest step of each env `env_ids [N]` -> tree of `[N, ...]` (zeros for a row never written)."""
        checks.check_index_array("env_ids", env_ids)
        env_ids = jnp.asarray(env_ids, jnp.int32)
        if self.debug:
            rows.check_env_ids(env_ids, jnp.ones(env_ids.shape, bool), self.num_envs, distinct=False)
        return rows.peek(state.rows, env_ids)

    def sample_starts(self, state: SequenceState, key, batch_size: int) -> Starts:
        """Draw `batch_size` starts with probability weight / total weight (replay distribution)."""
        return self._weights.sample_starts(state.rows, state.weights, key, batch_size)

    def sample(self, state: SequenceState, key, batch_size: int) -> SequenceSample:
        """`batch_size` sequences from the replay distribution (see the module docstring)."""
        return self._rules.gather(state.rows, self.sample_starts(state, key, batch_size))

    def priorities(self, state: SequenceState, slots) -> jax.Array:
        """Stored priority**alpha of `slots [B]` (slots as a sample returns them)."""
        return self._prioritised_weights("priorities").priorities(state.weights, slots)

    def set_priorities(self, state: SequenceState, slots, priorities) -> SequenceState:
        """Set raw priorities (>= 0) of `slots [B]`; stores priority**alpha and tracks the max priority.

        `slots` are those a sample returned. A slot overwritten since it was sampled gets the priority meant
        for its old content; a slot outside `[0, E*T)`, or off the period grid (never a start) when the tree
        is strided, is ignored (nor does it raise the max). NaN, infinite or negative priorities count as 0.
        """
        strategy = self._prioritised_weights("set_priorities")
        return state.replace(weights=strategy.set_priorities(state.weights, slots, priorities))

    def size(self, state: SequenceState) -> jax.Array:
        """Steps held over all rows."""
        return rows.stored_steps(state.rows, self.capacity_per_env)

    def can_sample(self, state: SequenceState) -> jax.Array:
        total = self._weights.total(state.rows, state.weights)
        return (total > 0) & (self.size(state) >= self.min_size)

    # ---- online queue -----------------------------------------------------------------------------------
    def sample_online(self, state: SequenceState, key, batch_size: int) -> SequenceSample:
        """`batch_size` sequences starting inside the online queue, weighted like the replay minus priority."""
        return self._online.sample(state.rows, state.weights, key, batch_size)

    def can_sample_online(self, state: SequenceState) -> jax.Array:
        return self._online.can_sample(state.rows, state.weights)

    def consume_online(self, state: SequenceState) -> SequenceState:
        """Mark every stored step consumed: the online queue becomes empty."""
        return state.replace(rows=OnlineQueue.consume(state.rows))

    def sample_mixed(self, state: SequenceState, key, batch_size: int, online_fraction: float) -> SequenceSample:
        """`round(batch_size * online_fraction)` online sequences (first rows), then replay ones."""
        n_on = round(batch_size * float(online_fraction))
        if not 0 <= n_on <= batch_size:
            raise checks.BufferInputError(f"online_fraction must be in [0, 1], received {online_fraction}")
        k_on, k_rb = jax.random.split(key)
        if n_on == 0:
            return self.sample(state, k_rb, batch_size)
        if n_on == batch_size:
            return self.sample_online(state, k_on, batch_size)
        on = self.sample_online(state, k_on, n_on)
        rb = self.sample(state, k_rb, batch_size - n_on)
        return jax.tree_util.tree_map(lambda x, y: jnp.concatenate([x, y], axis=0), on, rb)


def make_sequence_buffer(
    num_envs: int,
    capacity_per_env: int,
    sequence_length: int,
    period: int = 1,
    start: str = "any",
    cross_episodes: bool = True,
    complete_only: bool = False,
    length_power: float = 0.0,
    priority_exponent: float | None = None,
    online_window: int = 0,
    done_fn: Callable = _default_done,
    min_size: int = 1,
    fanout: int = sumtree.DEFAULT_FANOUT,
    debug: bool = False,
    layout: str = "windows",
) -> SequenceBuffer:
    """Sequence buffer over per-env rows (see the module docstring for every option's meaning).

    R2D2: `sequence_length=80, period=40, priority_exponent=0.9`. Muesli: `online_window > 0` with
    `sample_mixed`. DQN n-step: `buffers.nstep.make_nstep_buffer`.
    """
    if num_envs < 1 or sequence_length < 1:
        raise ValueError(f"need num_envs >= 1 and sequence_length >= 1, got {num_envs=} {sequence_length=}")
    if capacity_per_env <= sequence_length:
        raise ValueError(
            f"capacity_per_env ({capacity_per_env}) must exceed sequence_length ({sequence_length})")
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    if start not in ("any", "episode"):
        raise ValueError(f"start must be 'any' or 'episode', got {start!r}")
    if not 0 <= online_window <= capacity_per_env:
        raise ValueError(f"online_window must be in [0, capacity_per_env={capacity_per_env}], got {online_window}")
    if priority_exponent is not None and priority_exponent < 0:
        raise ValueError(f"priority_exponent must be >= 0 or None, got {priority_exponent}")
    if length_power < 0:
        raise ValueError(f"length_power must be >= 0, got {length_power}")
    if layout not in ("windows", "packed"):
        raise ValueError(f"layout must be 'windows' or 'packed', got {layout!r}")
    return SequenceBuffer(
        num_envs=num_envs, capacity_per_env=capacity_per_env, sequence_length=sequence_length, period=period,
        start=start, cross_episodes=cross_episodes, complete_only=complete_only,
        length_power=float(length_power),
        priority_exponent=None if priority_exponent is None else float(priority_exponent),
        online_window=online_window, done_fn=done_fn, min_size=min_size, fanout=fanout, debug=debug,
        layout=layout,
    )
