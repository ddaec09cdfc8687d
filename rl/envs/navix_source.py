"""navix's MiniGrid ports as an Anakin source (`env.source=navix`, `pip install -e ".[navix]"`).

Observations are the navix observation function `env.observation` names (`symbolic`, the tasks' default: the
whole grid `[H, W, 3]` uint8; `symbolic_first_person` the agent's 7x7 view; `categorical*` and `rgb*` too),
dtype kept. navix's `Timestep` is the env state and its `step_type` says how an episode ended (2:
termination, 1: truncation at `env.max_steps`). navix's `step` auto-resets one step late (on the step after
the last); the source steps with its `_step` (no reset) and resets the same step, as every source does.
Steps draw no randomness (the state carries navix's own key). Videos: navix's `rgb` drawing of the whole grid,
whatever the agent observes, 4x: `[32 H, 32 W, 3]` uint8. The rest of the contract: rl/envs/jax_envs.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from rl.envs.jax_envs import JaxEnvSource, SingleEnv, check_id, discrete_actions, require

RUNNER = "anakin"  # steps these envs inside its jitted loop (rl/runners/anakin.py)
OBSERVATIONS = ("symbolic", "symbolic_first_person", "categorical", "categorical_first_person", "rgb",
                "rgb_first_person")
TERMINATION, TRUNCATION = 2, 1  # navix.environments.environment.StepType
RENDER_SCALE = 4  # video frames: navix's 8 px tiles drawn at 32 px


@dataclasses.dataclass
class EnvConfig:
    """`configs/env/navix/*.yaml`."""

    source: str = "navix"
    id: str = "Navix-Empty-5x5-v0"  # any id of navix.registry()
    family: str | None = "minatar"  # the agents' preset it takes (rl.config.ENV_FAMILIES)
    max_steps: int = 100  # steps before an episode is truncated (navix.make's default)
    observation: str | None = None  # one of OBSERVATIONS; None: the task's own (symbolic)

    def __post_init__(self):
        if self.source != "navix":
            raise ValueError(f"env.source must be 'navix' for a navix env config, got {self.source!r}")
        check_id("navix", self.id, list(require("navix", "navix").registry()))
        if self.max_steps < 1:
            raise ValueError(f"env.max_steps must be >= 1, got {self.max_steps}")
        if self.observation is not None and self.observation not in OBSERVATIONS:
            raise ValueError(f"env.observation={self.observation!r}: one of {', '.join(OBSERVATIONS)} (or null)")


def single_env(cfg: EnvConfig) -> SingleEnv:
    """One navix env of `cfg` without auto-reset (the `SingleEnv` contract)."""
    nx = require("navix", "navix")
    kwargs = {} if cfg.observation is None else {"observation_fn": getattr(nx.observations, cfg.observation)}
    env = nx.make(cfg.id, max_steps=cfg.max_steps, **kwargs)

    def reset(key):
        ts = env.reset(key)
        return ts, ts.observation

    def step(key, ts, action):
        ts = env._step(ts, action)  # navix's step without its one-step-late reset
        return ts, ts.observation, ts.reward, ts.step_type == TERMINATION, ts.step_type == TRUNCATION

    rgb = jax.jit(lambda ts: nx.observations.rgb(ts.state))

    def render(ts):
        """navix's `rgb` drawing of the whole grid (8 px a tile), enlarged 4x: `[32 H, 32 W, 3]` uint8."""
        return np.repeat(np.repeat(np.asarray(rgb(ts)), RENDER_SCALE, 0), RENDER_SCALE, 1)

    return SingleEnv(name=cfg.id, num_actions=discrete_actions(cfg.id, env.action_space), reset=reset,
                     step=step, max_episode_steps=cfg.max_steps, render=render)


def make_source(env_cfg: Any, num_envs: int, seed: int = 0, envs_per_recv: int | None = None) -> JaxEnvSource:
    """The source of an `EnvConfig` (or its yaml section); the registry's contract (rl/envs/__init__.py).
    `seed` and `envs_per_recv` are unused: the envs draw from the keys `reset` takes."""
    from rl.config import to_dataclass

    return JaxEnvSource(single_env(to_dataclass(EnvConfig, env_cfg, "env")), num_envs)
