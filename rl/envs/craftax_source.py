"""Craftax (Classic and full) as an Anakin source (`env.source=craftax`, `pip install -e ".[craftax]"`).

Tasks: `Craftax-Classic-Symbolic-v1` (observations `[1345]` float32, 17 actions, 10k-step episodes),
`Craftax-Symbolic-v1` (`[8268]` float32, 43 actions, 100k steps) and their `-Pixels-` versions (images
`[H, W, 3]` float32 in [0, 1]), dtype kept. The envs are the library's no-auto-reset ones (gymnax's
`reset_env`/`step_env`; rl/envs/jax_envs.py resets). Generating a world costs more than many steps, so
`env.reset_ratio=r` generates ceil(num_envs / r) fresh worlds per step, shared by the envs that end
(rl/envs/jax_envs.py: envs share a start only when more end at once; Craftax's optimistic reset). Craftax's `done` joins death (and, in full Craftax,
beating the final boss) with the time limit; the source splits them: terminated where the game is over
without the time limit, truncated where only `max_timesteps` ended it. Videos (any task, symbolic too): the
library's pixel renderer of the state at 16 px a block, uint8 (Classic `[144, 144, 3]`, full `[208, 176, 3]`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from rl.envs.jax_envs import JaxEnvSource, SingleEnv, check_id, gymnax_style, override_params, require

RUNNER = "anakin"  # steps these envs inside its jitted loop (rl/runners/anakin.py)
TASKS = ("Craftax-Classic-Symbolic-v1", "Craftax-Symbolic-v1", "Craftax-Classic-Pixels-v1",
         "Craftax-Pixels-v1")


@dataclasses.dataclass
class EnvConfig:
    """`configs/env/craftax/*.yaml`."""

    source: str = "craftax"
    id: str = "Craftax-Classic-Symbolic-v1"  # one of TASKS
    family: str | None = "vector"  # the agents' preset it takes (rl.config.ENV_FAMILIES)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # overrides of EnvParams
    reset_ratio: int = 1  # envs per fresh world generated each step (Craftax's optimistic reset); 1: one per env

    def __post_init__(self):
        if self.source != "craftax":
            raise ValueError(f"env.source must be 'craftax' for a Craftax env config, got {self.source!r}")
        check_id("craftax", self.id, TASKS)
        if int(self.reset_ratio) < 1:
            raise ValueError(f"env.reset_ratio must be >= 1 (envs per fresh world per step), got {self.reset_ratio}")


def single_env(cfg: EnvConfig) -> SingleEnv:
    """One Craftax env of `cfg` without auto-reset (the `SingleEnv` contract)."""
    import jax.numpy as jnp

    make = require("craftax.craftax_env", "craftax").make_craftax_env_from_name
    env = make(cfg.id, auto_reset=False)
    params = env.default_params
    params = override_params(params, cfg.params, cfg.id)

    def split(state, done, info):
        over = env.is_terminal(state.replace(timestep=jnp.zeros_like(state.timestep)), params)
        return done & over, done & ~over

    classic = "Classic" in cfg.id

    def render(state):
        """Craftax's pixel renderer (16 px a block, the game's view and inventory) of one state, as uint8."""
        return np.asarray(_pixel_renderer(classic)(state)).clip(0, 255).astype(np.uint8)

    return dataclasses.replace(gymnax_style(env, params, cfg.id, split, int(params.max_timesteps)), render=render)


@functools.cache
def _pixel_renderer(classic: bool):
    """Craftax's (Classic's) `make_craftax_pixel_renderer` at `BLOCK_PIXEL_SIZE_IMG`, jitted: state -> float
    `[H, W, 3]` in 0..255. Built on first use: building loads the textures (the first time full Craftax's are
    processed, about 2 minutes on 2 cores, then read from the library's cache)."""
    import jax

    lib = "craftax.craftax_classic" if classic else "craftax.craftax"
    renderer = require(f"{lib}.renderer", "craftax")
    size = require(f"{lib}.constants", "craftax").BLOCK_PIXEL_SIZE_IMG
    return jax.jit(renderer.make_craftax_pixel_renderer(size))


def make_source(env_cfg: Any, num_envs: int, seed: int = 0, envs_per_recv: int | None = None) -> JaxEnvSource:
    """The source of an `EnvConfig` (or its yaml section); the registry's contract (rl/envs/__init__.py).
    `seed` and `envs_per_recv` are unused: the envs draw from the keys `reset`/`step` take."""
    from rl.config import to_dataclass

    cfg = to_dataclass(EnvConfig, env_cfg, "env")
    return JaxEnvSource(single_env(cfg), num_envs, resets=-(-int(num_envs) // int(cfg.reset_ratio)))
