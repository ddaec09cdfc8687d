"""Greedy episodes on the JAX env libraries' sources (xminigrid, navix, Craftax, POPGym Arcade) -> frames, for
`rl.envs.video.record` (`python -m scripts.evaluate <run dir> --video out.gif`).

Frames are the library's own drawing of the env state (`SingleEnv.render`, rl/envs/jax_envs.py: state of one
env -> `[H, W, 3]` uint8), not the observation: the whole grid of a MiniGrid task, Craftax's pixels of a
symbolic game, POPGym Arcade's frame.

* `single_env(env_cfg) -> SingleEnv | None`: the adapter's env of a typed env config (`rl.envs.env_config`:
  its class's module is the source's); None for a source without one (gymnax, envpool: rl/envs/video.py
  draws those from their observations).
* `check(env_cfg)`: a `ConfigError` in one line where the library draws nothing for the task.
* `episodes(env_cfg, policy, episodes, key, max_frames) -> (frames, returns, fps)`: one env stepped on the
  host, one step at a time and without auto-reset, so that an episode's last state is drawn before the next
  episode's reset; acting with `policy` (`act(obs [1, *obs_shape], carry, key) -> (actions [1], carry)`,
  `initial_carry(1)`, the carry restarted with each episode) for `episodes` whole episodes or until
  `max_frames` frames. Frames: each episode's first state and the state each action led to (the last one
  included), `[H, W, 3]` uint8 each; returns: the rewards summed per finished episode; `FPS` frames a second.
"""

from __future__ import annotations

import importlib

import jax
import numpy as np

from rl.config import ConfigError
from rl.envs.jax_envs import SingleEnv

FPS = 10


def single_env(env_cfg) -> SingleEnv | None:
    module = importlib.import_module(type(env_cfg).__module__)  # the source module that defines the EnvConfig
    return module.single_env(env_cfg) if hasattr(module, "single_env") else None


def check(env_cfg) -> SingleEnv:
    """The env of `env_cfg` (a JAX library's source), refused in one line where its library has no renderer."""
    env = single_env(env_cfg)
    if env is None:
        raise ConfigError(f"env.source={env_cfg.source} is not a JAX env library's source")
    if env.render is None:
        raise ConfigError(f"no video for {env_cfg.source} env {env_cfg.id}: the library has no renderer for it")
    return env


def _frame(env: SingleEnv, state) -> np.ndarray:
    frame = np.asarray(env.render(state))
    if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
        raise ValueError(f"{env.name}: the renderer drew {frame.dtype} {frame.shape}, not [H, W, 3] uint8")
    return frame


def episodes(env_cfg, policy, episodes: int, key: jax.Array, max_frames: int):
    """The module docstring's `episodes`: ([T] frames `[H, W, 3]` uint8, finished episodes' returns, FPS)."""
    env = check(env_cfg)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    key, k_reset = jax.random.split(key)
    state, obs = reset(k_reset)
    carry = policy.initial_carry(1)
    frames, returns, score = [_frame(env, state)], [], 0.0
    while len(returns) < episodes and len(frames) < max_frames:
        key, k_act, k_env, k_reset = jax.random.split(key, 4)
        action, carry = policy.act(obs[None], carry, k_act)
        state, obs, reward, terminated, truncated = step(k_env, state, np.int32(np.asarray(action)[0]))
        score += float(reward)
        frames.append(_frame(env, state))
        if bool(terminated | truncated):
            returns.append(score)
            score, carry = 0.0, policy.initial_carry(1)
            if len(returns) < episodes and len(frames) < max_frames:
                state, obs = reset(k_reset)
                frames.append(_frame(env, state))  # the next episode's first state
    return frames, returns, FPS
