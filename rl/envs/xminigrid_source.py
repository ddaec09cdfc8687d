"""XLand-MiniGrid's MiniGrid tasks as an Anakin source (`env.source=xminigrid`, `pip install -e ".[xminigrid]"`).

Observations are the library's symbolic first-person view `[V, V, 2]` uint8 (tile id, colour; V =
`params.view_size`, 3 for the Memory tasks), or with `env.observation=one_hot` the same view one-hot encoded,
`[V, V, NUM_TILES + NUM_COLORS]` bool (13 + 12): the torsos scale uint8 inputs by 1/255 as pixels, which
leaves a ball and a key (ids 3 and 7) 0.016 apart, while one-hot cells differ by whole units. xminigrid's `TimeStep` is the env state; an episode ends at
`step_type == LAST`, terminated where the library's `discount` is 0 (the goal), truncated at `max_steps`
otherwise. Steps draw no randomness (the state carries the library's own key). Videos: xminigrid's own RGB
drawing of the whole grid (`env.render`, 32 px a tile, `[32 H, 32 W, 3]` uint8). The rest of the contract:
rl/envs/jax_envs.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from rl.envs.jax_envs import JaxEnvSource, SingleEnv, check_id, override_params, require

RUNNER = "anakin"  # steps these envs inside its jitted loop (rl/runners/anakin.py)
OBSERVATIONS = ("symbolic", "one_hot")


def _minigrid_ids() -> list[str]:
    """The registered ids that run without a benchmark ruleset (XLand-* tasks need one: not wired here)."""
    return [i for i in require("xminigrid", "xminigrid").registered_environments() if not i.startswith("XLand")]


@dataclasses.dataclass
class EnvConfig:
    """`configs/env/xminigrid/*.yaml`."""

    source: str = "xminigrid"
    id: str = "MiniGrid-MemoryS8"  # any MiniGrid-* id of xminigrid.registered_environments()
    family: str | None = "minatar"  # the agents' preset it takes (rl.config.ENV_FAMILIES)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # EnvParams overrides, e.g. {max_steps: 100}
    observation: str = "symbolic"  # symbolic: [V, V, 2] uint8 ids | one_hot: [V, V, 25] bool

    def __post_init__(self):
        if self.source != "xminigrid":
            raise ValueError(f"env.source must be 'xminigrid' for an xminigrid env config, got {self.source!r}")
        check_id("xminigrid", self.id, _minigrid_ids())
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"env.observation={self.observation!r}: one of {', '.join(OBSERVATIONS)}")


def single_env(cfg: EnvConfig) -> SingleEnv:
    """One xminigrid env of `cfg` without auto-reset (the `SingleEnv` contract)."""
    xminigrid = require("xminigrid", "xminigrid")
    from xminigrid.types import StepType

    env, params = xminigrid.make(cfg.id)
    params = override_params(params, cfg.params, cfg.id)
    encode = _one_hot if cfg.observation == "one_hot" else (lambda obs: obs)

    def reset(key):
        ts = env.reset(params, key)
        return ts, encode(ts.observation)

    def step(key, ts, action):
        ts = env.step(params, ts, action)
        last = ts.step_type == StepType.LAST
        terminated = last & (ts.discount == 0)
        return ts, encode(ts.observation), ts.reward, terminated, last & ~terminated

    def render(ts):
        """xminigrid's RGB drawing of the whole grid (32 px a tile, the agent's view highlighted), numpy."""
        return env.render(params.replace(render_mode="rgb_array"), jax.device_get(ts))

    return SingleEnv(name=cfg.id, num_actions=env.num_actions(params), reset=reset,
                     step=step, max_episode_steps=int(params.max_steps) or None, render=render)


def _one_hot(obs):
    """`[..., 2]` uint8 (tile id, colour) -> `[..., NUM_TILES + NUM_COLORS]` bool."""
    from xminigrid.core.constants import NUM_COLORS, NUM_TILES

    return jax.numpy.concatenate([jax.nn.one_hot(obs[..., 0], NUM_TILES, dtype=bool),
                                  jax.nn.one_hot(obs[..., 1], NUM_COLORS, dtype=bool)], axis=-1)


def make_source(env_cfg: Any, num_envs: int, seed: int = 0, envs_per_recv: int | None = None) -> JaxEnvSource:
    """The source of an `EnvConfig` (or its yaml section); the registry's contract (rl/envs/__init__.py).
    `seed` and `envs_per_recv` are unused: the envs draw from the keys `reset`/`step` take."""
    from rl.config import to_dataclass

    return JaxEnvSource(single_env(to_dataclass(EnvConfig, env_cfg, "env")), num_envs)
