"""POPGym Arcade as an Anakin source (`env.source=popgym_arcade`, `pip install -e ".[popgym_arcade]"`).

Tasks: `popgym_arcade.make`'s ids (`CountRecallEasy`, `BreakoutMedium`, `MineSweeperHard`, ...). Observations
are the library's frames `[S, S, 3]` uint8 (S = 128), dtype kept; `env.partial_obs=true` draws the partially
observable version of a game (what an agent must remember is hidden from the frame). The envs are stepped
with gymnax's `reset_env`/`step_env` (rl/envs/jax_envs.py resets); each game reports `info["terminated"]`
and `info["truncated"]` (its step limit), which the source keeps apart: an episode that ends without its
step limit, or ends by the game's own end, is terminated. Videos: the game's `render` of the state, the
frame the agent observes (`[128, 128, 3]` uint8; partial where `env.partial_obs`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rl.envs.jax_envs import JaxEnvSource, SingleEnv, check_id, gymnax_style, require

RUNNER = "anakin"  # steps these envs inside its jitted loop (rl/runners/anakin.py)
GAMES = ("AutoEncode", "BattleShip", "Breakout", "CartPole", "CountRecall", "MineSweeper", "Navigator",
         "NoisyCartPole", "Skittles", "Tetris")
TASKS = tuple(f"{g}{level}" for g in GAMES for level in ("Easy", "Medium", "Hard"))


@dataclasses.dataclass
class EnvConfig:
    """`configs/env/popgym_arcade/*.yaml`."""

    source: str = "popgym_arcade"
    id: str = "CountRecallEasy"  # one of TASKS
    family: str | None = "minatar"  # the agents' preset it takes (rl.config.ENV_FAMILIES)
    partial_obs: bool = False  # the partially observable version of the game

    def __post_init__(self):
        if self.source != "popgym_arcade":
            raise ValueError(f"env.source must be 'popgym_arcade' for a POPGym Arcade config, got {self.source!r}")
        check_id("popgym_arcade", self.id, TASKS)


def ends(done, info) -> tuple:
    """(terminated, truncated) of a step from its `done` and the game's `info` flags: terminated where the game
    ended (`info["terminated"]`) or where it is done without its step limit (MineSweeper's mines report
    `terminated: False`); truncated where only the step limit ended it."""
    terminated = done & (info["terminated"] | ~info["truncated"])
    return terminated, done & ~terminated


def _max_steps(env, params) -> int | None:
    """The game's step limit, wherever the game keeps it (the env's own attribute first: some games'
    `EnvParams.max_steps_in_episode` is a placeholder 1)."""
    for where, name in ((env, "max_steps_in_episode"), (env, "max_episode_length"), (env, "max_steps"),
                        (params, "max_steps_in_episode")):
        value = getattr(where, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def single_env(cfg: EnvConfig) -> SingleEnv:
    """One POPGym Arcade env of `cfg` without auto-reset (the `SingleEnv` contract)."""
    env, params = require("popgym_arcade", "popgym_arcade").make(cfg.id, partial_obs=cfg.partial_obs)
    from gymnax.environments.environment import Environment

    if type(env).is_terminated is Environment.is_terminated:
        # Breakout, CartPole, Skittles and Tetris put `self.discount(...)` in their info; they were written for
        # stable-gymnax, whose `discount` reads `is_terminal`, and gymnax 1.0's reads `is_terminated`, which
        # they lack. Only that info entry reads it (the source splits the ends itself, `ends`).
        env.is_terminated = env.is_terminal
    single = gymnax_style(env, params, cfg.id, lambda state, done, info: ends(done, info), _max_steps(env, params))
    return dataclasses.replace(single, render=lambda state: np.asarray(env.render(state)))  # the game's own frame


def make_source(env_cfg: Any, num_envs: int, seed: int = 0, envs_per_recv: int | None = None) -> JaxEnvSource:
    """The source of an `EnvConfig` (or its yaml section); the registry's contract (rl/envs/__init__.py).
    `seed` and `envs_per_recv` are unused: the envs draw from the keys `reset`/`step` take."""
    from rl.config import to_dataclass

    return JaxEnvSource(single_env(to_dataclass(EnvConfig, env_cfg, "env")), num_envs)
