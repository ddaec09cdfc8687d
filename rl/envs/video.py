"""Greedy episodes -> frames -> a video file (`python -m scripts.evaluate <run dir> --video out.gif`).

* `check_path(path)`: the file a video may be written to: `.gif` (imageio + pillow) or `.mp4` (ffmpeg, from
  the imageio-ffmpeg wheel); anything else, or `.mp4` without ffmpeg, is a `ConfigError` saying what to use.
* `check_env(env_cfg)`: the env has a frame drawer (below), else a `ConfigError` naming the envs that do.
* `renderer(env_cfg, params=None) -> Renderer`: `frame(obs) -> [H, W, 3]` uint8 and the frame rate. Frames
  are drawn from the env's full observation (before `env.obs_features` narrows what the agent sees); the
  geometry of the classic-control drawings comes from the gymnax `params` (None: the envs' defaults):
  - MinAtar (`[10, 10, C]` channel maps): each cell the colour of its highest set channel
    (`MINATAR_PALETTE[c]`, black where none), 16x nearest-neighbour -> `[160, 160, 3]`;
  - Catch-bsuite (`[10, 5]` grid of ball and paddle): white cells on black, 16x -> `[160, 80, 3]`;
  - CartPole-v1, gymnax or envpool (`[x, x_dot, theta, theta_dot]`): track, cart at x, pole at theta
    -> `[240, 320, 3]`;
  - Acrobot-v1 (`[cos a1, sin a1, cos a2, sin a2, ...]`): both links from the pivot, the goal height
    -> `[240, 240, 3]`;
  - MountainCar-v0 (`[position, velocity]`): the hill, the car, the goal flag -> `[240, 320, 3]`;
  - envpool Atari (`[stack, 84, 84]` uint8 grey): the newest frame of the stack, 2x -> `[168, 168, 3]`.
  Every size divides by 8, so an MP4 is written unscaled. The JAX env libraries' sources (xminigrid, navix,
  craftax, popgym_arcade) are drawn from their env state by the library's own renderer instead
  (rl/envs/jax_video.py); `renderer` is not theirs.
* `record(env_cfg, policy, episodes, seed, max_frames) -> Video`: one env stepped on the host, one step at a
  time, acting with `policy` (`agents.experiment.load_policy`: `act(obs [1, ...], carry, key) -> (actions [1], carry)`,
  `initial_carry(1)`), for `episodes` whole episodes or until `max_frames` frames. A gymnax env contributes
  each episode's first observation and the observation each action led to (the terminal one included); an
  envpool env each recv's observation (Atari: a new life continues the game, the carry restarts as in
  training); a JAX library's env (rl/envs/jax_video.py) each episode's first state and the state each action
  led to. Returns are the env's raw rewards summed per finished episode (Atari: per game).
* `write(path, video)`: the frames as a looping GIF or an MP4 at the video's frame rate. A GIF keeps a run
  of identical frames as one longer frame (pillow), so it may hold fewer frames than written, same duration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from PIL import Image, ImageDraw

from rl.config import ConfigError

SUFFIXES = (".gif", ".mp4")
MINATAR = ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar", "SpaceInvaders-MinAtar")
_GYMNAX = {"CartPole-v1": "cartpole", "Acrobot-v1": "acrobot", "MountainCar-v0": "mountaincar",
           "Catch-bsuite": "catch", **dict.fromkeys(MINATAR, "minatar")}
HAS_VIDEO = ("gymnax: CartPole-v1, Acrobot-v1, MountainCar-v0, Catch-bsuite and the MinAtar games; "
             "envpool: CartPole-v1 and the Atari tasks; the xminigrid, navix, craftax and popgym_arcade tasks")
OBS_SOURCES = ("gymnax", "envpool")  # drawn from their observations here; every other source by jax_video
# Colour of MinAtar channel c (cycled past 10 channels; Seaquest has 10): matplotlib's tab10.
MINATAR_PALETTE = np.array([[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
                            [140, 86, 75], [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]],
                           np.uint8)
CELL = 16  # pixels per MinAtar / Catch cell


@dataclasses.dataclass(frozen=True)
class Renderer:
    frame: Callable[[np.ndarray], np.ndarray]  # one observation -> [H, W, 3] uint8
    fps: int


@dataclasses.dataclass(frozen=True)
class Video:
    frames: np.ndarray  # [T, H, W, 3] uint8
    returns: list[float]  # one per finished episode (fewer than asked where max_frames cut the recording)
    fps: int


def check_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"--video {path}: unknown suffix {path.suffix or '(none)'!r}; write a .gif or an .mp4")
    if path.suffix.lower() == ".mp4":
        try:
            import imageio_ffmpeg

            imageio_ffmpeg.get_ffmpeg_exe()
        except (ImportError, RuntimeError):
            raise ConfigError(f"--video {path}: an .mp4 needs ffmpeg, which was not found "
                              f"(pip install imageio-ffmpeg); write a .gif instead") from None
    return path


def _is_atari(task_id: str) -> bool:
    import envpool

    fields = envpool.make_spec(task_id).config._fields  # as rl.envs.envpool_source.open_envpool tells Atari
    return "frame_skip" in fields and "episodic_life" in fields


def _kind(env_cfg) -> str:
    if env_cfg.source not in OBS_SOURCES:
        raise ConfigError(f"{env_cfg.source} envs are drawn from their state (rl/envs/jax_video.py), "
                          f"not by an observation renderer")
    if env_cfg.source == "envpool":
        kind = "cartpole" if env_cfg.id == "CartPole-v1" else "atari" if _is_atari(env_cfg.id) else None
    else:
        kind = _GYMNAX.get(env_cfg.id)
    if kind is None:
        raise ConfigError(f"no video for {env_cfg.source} env {env_cfg.id}: videos are drawn for {HAS_VIDEO}")
    return kind


def check_env(env_cfg) -> None:
    if env_cfg.source in OBS_SOURCES:
        _kind(env_cfg)
    else:
        from rl.envs import jax_video

        jax_video.check(env_cfg)


def minatar_frame(obs: np.ndarray) -> np.ndarray:
    """`[10, 10, C]` channel maps -> `[160, 160, 3]`: the palette colour of each cell's highest set channel."""
    obs = np.asarray(obs) > 0
    channels = obs.shape[-1]
    top = channels - np.argmax(obs[..., ::-1], axis=-1)  # [10, 10]: highest set channel + 1
    colours = np.concatenate([np.zeros((1, 3), np.uint8), MINATAR_PALETTE[np.arange(channels) % 10]])
    return _upscale(colours[np.where(obs.any(-1), top, 0)], CELL)


def _catch_frame(obs: np.ndarray) -> np.ndarray:
    grey = np.where(np.asarray(obs) > 0, 255, 0).astype(np.uint8)  # [rows, columns]
    return _upscale(np.repeat(grey[..., None], 3, -1), CELL)


def _atari_frame(obs: np.ndarray) -> np.ndarray:
    newest = np.asarray(obs)[-1]  # [84, 84]: envpool stacks oldest first
    return _upscale(np.repeat(newest[..., None], 3, -1), 2)


def _upscale(image: np.ndarray, k: int) -> np.ndarray:
    return np.repeat(np.repeat(image, k, axis=0), k, axis=1)


def _cartpole(x_threshold: float, length: float) -> Callable[[np.ndarray], np.ndarray]:
    width, height, track = 320, 240, 180
    scale = width / (2 * x_threshold)  # as gymnasium draws it: the track spans -x_threshold..x_threshold
    pole, cart_w, cart_h = 2 * length * scale, 28, 16

    def frame(obs):
        x, theta = float(obs[0]), float(obs[2])
        image = Image.new("RGB", (width, height), "white")
        draw = ImageDraw.Draw(image)
        draw.line([(0, track), (width, track)], fill="black")
        cx = x * scale + width / 2
        draw.rectangle([cx - cart_w / 2, track - cart_h, cx + cart_w / 2, track], fill="black")
        axle = (cx, track - cart_h * 0.75)
        tip = (axle[0] + pole * np.sin(theta), axle[1] - pole * np.cos(theta))  # theta > 0 leans right
        draw.line([axle, tip], fill=(202, 152, 101), width=6)
        draw.ellipse([axle[0] - 3, axle[1] - 3, axle[0] + 3, axle[1] + 3], fill=(129, 132, 203))
        return np.asarray(image)

    return frame


def _acrobot(l1: float, l2: float) -> Callable[[np.ndarray], np.ndarray]:
    size = 240
    scale = size / (2 * (l1 + l2 + 0.2))
    centre = size / 2

    def frame(obs):
        c1, s1, c2, s2 = (float(v) for v in obs[:4])
        c12, s12 = c1 * c2 - s1 * s2, s1 * c2 + c1 * s2  # cos / sin of a1 + a2
        p1 = (centre + scale * l1 * s1, centre + scale * l1 * c1)  # angle 0 hangs straight down
        p2 = (p1[0] + scale * l2 * s12, p1[1] + scale * l2 * c12)
        image = Image.new("RGB", (size, size), "white")
        draw = ImageDraw.Draw(image)
        goal = centre - scale * 1.0  # the tip must rise 1 above the pivot
        draw.line([(0, goal), (size, goal)], fill="black")
        draw.line([(centre, centre), p1, p2], fill=(0, 204, 204), width=8, joint="curve")
        for x, y in ((centre, centre), p1):
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=(204, 204, 0))
        return np.asarray(image)

    return frame


def _mountaincar(low: float, high: float, goal: float) -> Callable[[np.ndarray], np.ndarray]:
    width, height, floor = 320, 240, 10
    scale = width / (high - low)

    def point(x):
        return (x - low) * scale, height - floor - (np.sin(3 * x) * 0.45 + 0.55) * scale

    hill = [point(x) for x in np.linspace(low, high, 100)]

    def frame(obs):
        image = Image.new("RGB", (width, height), "white")
        draw = ImageDraw.Draw(image)
        draw.line(hill, fill="black", width=2)
        fx, fy = point(goal)
        draw.line([(fx, fy), (fx, fy - 40)], fill="black")
        draw.polygon([(fx, fy - 40), (fx, fy - 30), (fx + 20, fy - 35)], fill=(204, 204, 0))
        cx, cy = point(float(obs[0]))
        draw.ellipse([cx - 8, cy - 16, cx + 8, cy], fill="black")  # resting on the hill
        return np.asarray(image)

    return frame


def renderer(env_cfg, params: Any = None) -> Renderer:
    kind = _kind(env_cfg)

    def p(name, default):
        return float(getattr(params, name, default))

    if kind == "minatar":
        return Renderer(minatar_frame, fps=10)
    if kind == "catch":
        return Renderer(_catch_frame, fps=10)
    if kind == "atari":
        return Renderer(_atari_frame, fps=15)  # 60 Hz / frame_skip 4
    if kind == "cartpole":
        return Renderer(_cartpole(p("x_threshold", 2.4), p("length", 0.5)), fps=50)
    if kind == "acrobot":
        return Renderer(_acrobot(p("link_length_1", 1.0), p("link_length_2", 1.0)), fps=15)
    return Renderer(_mountaincar(p("min_position", -1.2), p("max_position", 0.6), p("goal_position", 0.5)),
                    fps=30)


def _gymnax_episodes(env_cfg, policy, episodes: int, key: jax.Array, max_frames: int):
    from rl.envs.gymnax_source import make_source

    source = make_source(dataclasses.replace(env_cfg, obs_features=None), 1)  # the full observation is drawn
    features = env_cfg.obs_features
    seen = (lambda o: o) if features is None else (lambda o: o[..., np.asarray(features)])  # what the agent sees
    render = renderer(env_cfg, source.params)
    draw = render.frame
    reset, step = jax.jit(source.reset), jax.jit(source.step)
    key, k_reset = jax.random.split(key)
    env_state, obs = reset(k_reset)
    carry = policy.initial_carry(1)
    frames, returns, score = [draw(np.asarray(obs[0]))], [], 0.0
    while len(returns) < episodes and len(frames) < max_frames:
        key, k_act, k_env = jax.random.split(key, 3)
        action, carry = policy.act(seen(obs), carry, k_act)
        env_state, ts = step(env_state, action, k_env)
        score += float(ts.reward[0])
        frames.append(draw(np.asarray(ts.next_obs[0])))
        obs = ts.obs
        if bool(ts.terminated[0] | ts.truncated[0]):
            returns.append(score)
            score, carry = 0.0, policy.initial_carry(1)
            if len(returns) < episodes and len(frames) < max_frames:
                frames.append(draw(np.asarray(obs[0])))  # the next episode's first observation
    return frames, returns, render.fps


def _envpool_episodes(env_cfg, policy, episodes: int, key: jax.Array, seed: int, max_frames: int):
    from rl.envs.envpool_source import make_source as make_envpool

    source = make_envpool(env_cfg, 1, seed=seed, envs_per_recv=1)  # sync: one env, one recv per step
    render = renderer(env_cfg)
    draw = render.frame
    carry, frames, returns, score, fresh = policy.initial_carry(1), [], [], 0.0, False
    source.reset()
    try:
        while len(returns) < episodes and len(frames) < max_frames:
            r = source.recv()
            if fresh:  # a reset step: a new episode, or (Atari) a new life of the same game
                carry = policy.initial_carry(1)
            frames.append(draw(r.obs[0]))
            score += float(r.score[0])
            if r.episode_over[0]:
                returns.append(score)
                score = 0.0
            fresh = bool(r.terminated[0] | r.truncated[0])
            action, carry = policy.act(source.observation(r.obs), carry, jax.random.fold_in(key, len(frames)))
            source.send(np.asarray(action), r.env_id)
    finally:
        source.close()
    return frames, returns, render.fps


def record(env_cfg, policy, episodes: int, seed: int = 0, max_frames: int = 2000) -> Video:
    """`episodes` greedy episodes of `policy` on one env of `env_cfg` (an `rl.envs.env_config` section),
    cut at `max_frames` frames; `seed` seeds the env and the policy's key."""
    check_env(env_cfg)
    key = jax.random.PRNGKey(seed)
    if env_cfg.source == "envpool":
        frames, returns, fps = _envpool_episodes(env_cfg, policy, episodes, key, seed, max_frames)
    elif env_cfg.source == "gymnax":
        frames, returns, fps = _gymnax_episodes(env_cfg, policy, episodes, key, max_frames)
    else:
        from rl.envs import jax_video

        frames, returns, fps = jax_video.episodes(env_cfg, policy, episodes, key, max_frames)
    return Video(np.stack(frames), returns, fps)


def write(path: str | Path, video: Video) -> Path:
    import imageio.v3 as iio

    path = check_path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        iio.imwrite(path, video.frames, plugin="pillow", duration=1000 / video.fps, loop=0)
    else:
        iio.imwrite(path, video.frames, plugin="FFMPEG", fps=video.fps, macro_block_size=8)
    return path
