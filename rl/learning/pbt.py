"""Population-based training (Jaderberg et al. 2017) inside the compiled program: at each event the worst members
take the agent state and hyperparameters of good ones and perturb the hyperparameters.

Config (`population.pbt`, `PBTConfig`; off unless `interval` > 0): `interval` env steps per seed between events,
`quantile` the share of members replaced at each event, `perturb` the factors a copied hyperparameter is
multiplied by. It needs a population (rl/learning/population.py) of at least 2 members; the hyperparameters
are the population's keys (those `population.agent` names), each kept in its agent's bounds (`POPULATION_BOUNDS`
in the agent's module: [lo, hi] per key; unbounded otherwise).

Contract (the Anakin runner calls these inside its chunk; rows are members x seeds, member-major):
* `PBTState`, per row: the sum and count of episode returns finished since the last event (`add`), `recent`
  (the window mean used at the last event, where the row finished an episode in it; else the one before;
  NaN before any) and `source` (the member whose agent state the row took at the last event; its own else).
* `next_event(count, steps_per_iter, interval, first)`: events fall after the first iteration (from
  iteration `first` on) whose env steps reach a multiple of `interval`.
* `choose(returns [M], key, quantile, perturb, num_keys) -> (source [M], factor [M, K])`: members ranked by
  return (`argsort`, stable, ascending); k = max(1, floor(quantile * M)); bottom = the first k, top = the last
  k. With `k_choice, k_factor = jax.random.split(key)`, member m of the bottom copies
  `top[jax.random.randint(k_choice, (M,), 0, k)[m]]` and multiplies hyperparameter i by
  `perturb[jax.random.randint(k_factor, (M, K), 0, len(perturb))[m, i]]` (keys in sorted order); other
  members keep their own (source m, factor 1). Nobody copies a member whose return is not strictly higher
  (ties: the first event often ranks members that have not learned yet, all alike), nor where a member has
  no return yet (NaN).
* `event(agent [S], pbt [S], key, ...)`: the rows of member m take the agent state (params, optimiser state,
  target params, counters: all of `MemberState.agent`) of the same seed of `source[m]` (a gather over the
  member axis: bit for bit) and hyperparameters `clip(hparams[source] * factor, lo, hi)`; the window restarts.
  Buffers, envs and keys are the runner's and stay each row's own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rl.learning.population import MemberState

KEY_OFFSET = 3 * 10**6  # the events' keys: fold_in(PRNGKey(seed + KEY_OFFSET), iteration)


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    """`population.pbt`."""

    interval: int = 0  # env steps per seed between events; 0: off
    quantile: float = 0.25  # share of members replaced at each event (at least one)
    perturb: tuple[float, ...] = (0.8, 1.25)  # a copied hyperparameter is multiplied by one of these


def pbt_config(section: Mapping | None, members: int) -> PBTConfig | None:
    """The typed `population.pbt` section for a population of `members` members; None when off. Bad values
    raise a one-line `ValueError` naming the key."""
    section = dict(section or {})
    fields = [f.name for f in dataclasses.fields(PBTConfig)]
    for key in section:
        if key not in fields:
            raise ValueError(f"population.pbt.{key}: not a PBT key; PBT keys: {', '.join(fields)}")
    cfg = PBTConfig(**section)
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
    if not (isinstance(cfg.interval, int) and not isinstance(cfg.interval, bool)) or cfg.interval < 0:
        raise ValueError(f"population.pbt.interval must be an integer >= 0 (env steps per seed between PBT events; "
                         f"0: off), got {cfg.interval!r}")
    if not number(cfg.quantile) or not 0 < cfg.quantile <= 0.5:
        raise ValueError(f"population.pbt.quantile must be in (0, 0.5] (the share of members replaced at each "
                         f"event), got {cfg.quantile!r}")
    perturb = cfg.perturb
    if (not isinstance(perturb, (list, tuple)) or not perturb
            or not all(number(f) and math.isfinite(f) and f > 0 for f in perturb)):
        raise ValueError(f"population.pbt.perturb must be a non-empty list of factors > 0, e.g. [0.8,1.25], "
                         f"got {perturb!r}")
    if cfg.interval == 0:
        return None
    if members < 2:
        raise ValueError(f"population.pbt needs a population of at least 2 members (population.agent.<key>=[v1,v2,"
                         f"...]), got {members}")
    return dataclasses.replace(cfg, quantile=float(cfg.quantile), perturb=tuple(float(f) for f in perturb))


@struct.dataclass
class PBTState:
    """A row's PBT bookkeeping (leading axis S over rows in the runner state)."""

    score: jax.Array  # f32: sum of the returns of episodes finished since the last event
    count: jax.Array  # f32: their number
    recent: jax.Array  # f32: the return the last event ranked (NaN before any)
    source: jax.Array  # i32: the member whose agent state the row took at the last event

    @classmethod
    def zeros(cls, member: int | jax.Array = 0) -> PBTState:
        return cls(score=jnp.zeros((), jnp.float32), count=jnp.zeros((), jnp.float32),
                   recent=jnp.full((), jnp.nan, jnp.float32), source=jnp.asarray(member, jnp.int32))

    def add(self, count: jax.Array, score: jax.Array) -> PBTState:
        """`count` episodes ended with returns summing to `score`."""
        return self.replace(count=self.count + count, score=self.score + score)


def next_event(count, steps_per_iter: int, interval: int, first: int):
    """The iteration count after which the next event falls, for `count` iterations done: the first c > count,
    c >= `first`, with (c - 1) * steps_per_iter < m * interval <= c * steps_per_iter for some integer m. Python
    ints give an int; a traced count an int32 array."""
    traced = isinstance(count, jax.Array)
    c = jnp.maximum(count, first - 1) if traced else max(int(count), first - 1)
    m = c * steps_per_iter // interval + 1
    return (m * interval + steps_per_iter - 1) // steps_per_iter


def choose(returns: jax.Array, key: jax.Array, quantile: float, perturb: Sequence[float], num_keys: int):
    """Who copies whom and by what each copied hyperparameter is multiplied: returns `[M]` (a member's
    recent return; NaN: none yet) -> `(source [M] int32, factor [M, num_keys] float32)` (module docstring)."""
    members = returns.shape[0]
    k = max(1, int(quantile * members))
    k_choice, k_factor = jax.random.split(key)
    order = jnp.argsort(returns, stable=True)
    bottom, top = order[:k], order[members - k:]
    source = jnp.arange(members, dtype=jnp.int32)
    source = source.at[bottom].set(top[jax.random.randint(k_choice, (members,), 0, k)[bottom]].astype(jnp.int32))
    factor = jnp.asarray(perturb, jnp.float32)[jax.random.randint(k_factor, (members, num_keys), 0, len(perturb))]
    copied = (source != jnp.arange(members)) & (returns[source] > returns) & jnp.all(jnp.isfinite(returns))
    source = jnp.where(copied, source, jnp.arange(members, dtype=jnp.int32))
    return source, jnp.where(copied[:, None], factor, 1.0)


def member_returns(pbt: PBTState, seeds: int) -> tuple[PBTState, jax.Array]:
    """Close the window: each row's `recent` return (its window mean where it finished an episode) and the
    members' means over their seeds `[M]`; the window restarts."""
    recent = jnp.where(pbt.count > 0, pbt.score / jnp.maximum(pbt.count, 1.0), pbt.recent)
    pbt = pbt.replace(score=jnp.zeros_like(pbt.score), count=jnp.zeros_like(pbt.count), recent=recent)
    return pbt, recent.reshape(-1, seeds).mean(axis=1)


def event(agent: MemberState, pbt: PBTState, key: jax.Array, seeds: int, quantile: float,
          perturb: Sequence[float], bounds: Mapping[str, tuple[float, float]]) -> tuple[MemberState, PBTState]:
    """One exploit/explore step on every row's `agent` and `pbt` (leading axis S = members x seeds); `bounds`:
    key -> (lo, hi) for the keys that have them (module docstring)."""
    pbt, returns = member_returns(pbt, seeds)
    keys = sorted(agent.hparams)  # factor column i is key i in sorted order (the hparams dict's pytree order)
    source, factor = choose(returns, key, quantile, perturb, len(keys))
    rows = (source[:, None] * seeds + jnp.arange(seeds)).reshape(-1)  # [S]: the row each row takes
    first = jnp.arange(returns.shape[0]) * seeds  # a member's values: those of its first row
    hparams = {}
    for i, k in enumerate(keys):
        value = agent.hparams[k][first][source] * factor[:, i]
        lo, hi = bounds.get(k, (-jnp.inf, jnp.inf))
        value = jnp.where(source != jnp.arange(returns.shape[0]), jnp.clip(value, lo, hi), agent.hparams[k][first])
        hparams[k] = jnp.repeat(value, seeds)
    agent = MemberState(hparams=hparams, agent=jax.tree_util.tree_map(lambda x: x[rows], agent.agent))
    return agent, pbt.replace(source=jnp.repeat(source, seeds))


def event_key(seed: int, count: Any) -> jax.Array:
    """The key of the event after iteration `count` of a run with `seed` (independent of the rows' keys)."""
    return jax.random.fold_in(jax.random.PRNGKey(seed + KEY_OFFSET), count)
