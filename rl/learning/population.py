"""A hyperparameter population trained as one program: members x seeds rows on the runner's seed axis.

`population.agent.<key>=[v1,v2,...]` (configs/config.yaml) names values of an agent's *population keys*:
hyperparameters that change neither shapes nor control flow (each agent lists its own in
`POPULATION_KEYS`, e.g. agents/dqn.py). The members are every combination of the values (`grid`, the first
key varying slowest, as hydra's `-m`); `members` checks a config's section and refuses, in one line, any key
that cannot vary inside one program. `Population(agent, members, seeds)` wraps the agent so that each row of
the runner's seed axis carries its member's values as traced scalars (`MemberState.hparams`) and the agent
reads them in place of its config's (its `act`/`train_step`/... take `hparams=`).

Rows: member m, seed j is row `m * seeds + j` (member-major) and uses the keys of seed j of a plain run
(PRNGKey(cfg.seed + j) for training; seed j's evaluation key), so it equals the run
`agent.<key>=<value of member m> seed=<cfg.seed + j>` (rl/runners/anakin.py, rl/runners/evaluate.py).

`population.pbt` (rl/learning/pbt.py) makes it population-based training: `Population.pbt` holds its config
and `Population.bounds` the agent's bounds on the keys (`POPULATION_BOUNDS`), which the runner applies.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

ALIASES = {"lr": "optim.lr"}  # the learning-rate key every agent shares is the default of optim.lr


@struct.dataclass
class MemberState:
    """One row's agent state: its member's hyperparameters and the agent's own state."""

    hparams: dict[str, jax.Array]  # population key -> float32[] (float32[S] over rows)
    agent: Any

    @property
    def params(self):
        """The agent's online parameters (agents.experiment.Policy)."""
        return self.agent.params


def grid(values: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of `values` (key -> its values), the first key varying slowest."""
    keys = list(values)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(values[k] for k in keys))]


def canonical(key: str) -> str:
    """The agent config key a population key sets (`lr` -> `optim.lr`)."""
    return ALIASES.get(key, key)


def config_value(cfg: Any, key: str) -> Any:
    """The value of dotted `key` (`optim.lr`) in a typed agent config."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def hyperparams(cfg: Any, keys: Sequence[str], hparams: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`keys` (an agent's `POPULATION_KEYS`) -> value: a member's traced `hparams` where given, else the
    typed config `cfg`'s (Python numbers, so a run without a population computes as before). The one way an
    agent reads its population keys."""
    return {**{k: config_value(cfg, k) for k in keys}, **(hparams or {})}


def _flat(tree: Mapping, prefix: str = "") -> dict:
    """`{"optim": {"lr": [...]}}` -> `{"optim.lr": [...]}`."""
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, Mapping) else {f"{prefix}{k}": v})
    return out


def members(spec: Mapping, agent_cfg: Any, allowed: Sequence[str], typed: Callable[[dict], Any]
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The members of a `population:` config section `spec` for the typed agent config `agent_cfg`, whose
    population keys are `allowed`: per member, population key (canonical) -> value, and the overrides its
    separate run would set (`{"agent.<key as given>": value}`); `([], [])` for an empty section.
    `typed(member)`: the member's agent config, checked (raises `ValueError`). Anything that cannot vary
    inside one program is refused with a one-line `ValueError` naming the key."""
    if set(spec) - {"agent", "pbt"}:
        key = next(k for k in spec if k not in ("agent", "pbt"))
        raise ValueError(f"population.{key}: only agent hyperparameters form a population "
                         f"(population.agent.<key>=[...]); sweep {key} with hydra -m ({key}=<v1>,<v2>)")
    section = spec.get("agent", {})
    values = _flat(section) if isinstance(section, Mapping) else None
    if values is None:
        raise ValueError(f"population.agent must map agent keys to lists of values (population.agent.<key>=[v1,v2]), "
                         f"got {section!r}")
    if not values:
        return [], []
    name = agent_cfg.name
    for key, vals in values.items():
        where = f"population.agent.{key}"
        if not allowed:
            raise ValueError(f"{where}: agent {name} has no population keys yet; sweep it with hydra -m "
                             f"(agent.{key}=<v1>,<v2>)")
        try:
            config_value(agent_cfg, canonical(key))
        except AttributeError:
            raise ValueError(f"{where}: agent {name} has no key {key!r}; its population keys: "
                             f"{', '.join(allowed)}") from None
        if canonical(key) not in allowed:
            raise ValueError(f"{where}: agent.{key} changes shapes or control flow, so it cannot vary inside one "
                             f"program; sweep it with hydra -m (agent.{key}=<v1>,<v2>); population keys of {name}: "
                             f"{', '.join(allowed)}")
        if not isinstance(vals, list) or not vals:
            raise ValueError(f"{where} must be a non-empty list of values, e.g. {where}=[{vals},...], got {vals!r}")
    out, overrides = [], []
    for member in grid(values):
        try:
            cfg = typed(member)
        except ValueError as e:
            raise ValueError(f"population member {', '.join(f'agent.{k}={v}' for k, v in member.items())}: {e}") from None
        out.append({canonical(k): config_value(cfg, canonical(k)) for k in member})
        overrides.append({f"agent.{k}": v for k, v in member.items()})
    return out, overrides


class Population:
    """`agent` trained as `len(members)` hyperparameter settings x `seeds` seeds in one program.

    `members`: per member, population key (canonical, `optim.lr`) -> value. `overrides`: per member, what a
    separate run would set (`{"agent.optim.lr": 0.001}`), for reporting. `pbt`: population-based training
    (rl/learning/pbt.py `PBTConfig`; None: off) and `bounds` the agent's [lo, hi] per key that has them.
    Everything but `init`, `act` and `train_step` is the agent's (its buffer, step format, replay ratio)."""

    def __init__(self, agent, members: Sequence[Mapping[str, float]], seeds: int,
                 overrides: Sequence[Mapping[str, Any]], pbt=None,
                 bounds: Mapping[str, tuple[float, float]] | None = None):
        self.agent, self.seeds = agent, int(seeds)
        self.pbt, self.bounds = pbt, dict(bounds or {})
        self.keys = tuple(members[0])
        self.values = {k: jnp.asarray([m[k] for m in members], jnp.float32) for k in self.keys}  # [M] each
        self.members = len(members)
        self.overrides = [dict(o) for o in overrides]

    def __getattr__(self, name: str):
        if name == "agent":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.agent, name)

    def init(self, key: jax.Array, obs_example: jax.Array) -> MemberState:
        """One row's state, hyperparameters zero until `assign`."""
        return MemberState(hparams={k: jnp.zeros((), jnp.float32) for k in self.keys},
                           agent=self.agent.init(key, obs_example))

    def assign(self, states: MemberState) -> MemberState:
        """`states` of all rows (leading axis members x seeds, member-major) with their members' values."""
        return states.replace(hparams={k: jnp.repeat(v, self.seeds) for k, v in self.values.items()})

    def act(self, state: MemberState, obs, carry, key, env_ids, explore: bool = True):
        return self.agent.act(state.agent, obs, carry, key, env_ids, explore, hparams=state.hparams)

    def train_step(self, state: MemberState, buffer_state, key: jax.Array):
        agent_state, buffer_state, metrics = self.agent.train_step(state.agent, buffer_state, key,
                                                                   hparams=state.hparams)
        return state.replace(agent=agent_state), buffer_state, metrics

    def row_labels(self) -> list[dict[str, Any]]:
        """Per row: its member, the member's overrides and its seed index (metrics.csv columns)."""
        return [{"member": m, **self.overrides[m], "seed": j} for m in range(self.members) for j in range(self.seeds)]
