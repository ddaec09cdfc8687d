"""Videos of the JAX env libraries' sources (rl/envs/jax_video.py through rl/envs/video.py): each library's own
renderer draws the env state, one frame per reset and per step, uint8 `[H, W, 3]`, written and read back; the
frames follow the state (the MiniGrid agent walks, a Craftax reset draws a new world, POPGym Arcade's frames are
what the agent saw); a library without a renderer is refused in one line; `scripts.evaluate --video` films a
trained xminigrid run. Craftax and POPGym Arcade are filmed in the slow tier (their renderers take 15-20 s to
compile), the grid libraries in the default suite."""

from __future__ import annotations

import dataclasses

import imageio.v3 as iio
import jax.numpy as jnp
import numpy as np
import pytest

from agents.experiment import run
from agents.setup import compose
from rl.config import ConfigError
from rl.envs import env_config, make_source, video
from scripts import evaluate
from tests.rl.envs.jax_env_runs import TINY

TILE = 32  # px per grid cell in the xminigrid and navix frames


class Constant:
    """A policy that always takes `action` and keeps every observation it is given (checking its shape and
    dtype are the source's, batched by 1); its carry counts the episode's steps."""

    def __init__(self, action: int, source):
        self.action, self.seen = action, []
        self.obs_shape, self.obs_dtype = (1, *source.obs_shape), source.obs_dtype

    def initial_carry(self, n):
        return np.zeros(n, np.int32)

    def act(self, obs, carry, key):
        obs = np.asarray(obs)
        assert obs.shape == self.obs_shape and obs.dtype == self.obs_dtype, (obs.shape, obs.dtype)
        self.seen.append(obs[0])
        return jnp.full(1, self.action, jnp.int32), carry + 1


def _film(section: dict, action: int, episodes: int, max_frames: int, tmp_path):
    """Record `episodes` episodes of the constant policy on `section`, write them as an MP4 and read it back:
    (the clip, the policy, the frames read back)."""
    cfg = env_config(section)
    policy = Constant(action, make_source(cfg, 1))
    clip = video.record(cfg, policy, episodes=episodes, seed=0, max_frames=max_frames)
    assert clip.frames.dtype == np.uint8 and clip.frames.ndim == 4 and clip.frames.shape[-1] == 3
    back = iio.imread(video.write(tmp_path / "clip.mp4", clip), plugin="FFMPEG", index=None)
    assert back.shape == clip.frames.shape and back.dtype == np.uint8
    return clip, policy, back


def _cell(frame: np.ndarray, colour: str) -> tuple[int, int]:
    """(row, column) of the grid cell holding the red agent or the green goal."""
    r, g, b = (frame[..., i].astype(int) for i in range(3))
    mask = (r > 150) & (g < 100) & (b < 100) if colour == "red" else (g > 150) & (r < 100) & (b < 100)
    rows, cols = np.nonzero(mask)
    assert len(rows) > 20, f"no {colour} in the frame"
    return int(rows.mean()) // TILE, int(cols.mean()) // TILE


def _walks_east(clip):
    """Empty-5x5, 3-step episodes of walking forward from (1, 1) facing east: the agent's cell goes 1, 2, 3
    (the 3rd step bumps the wall) per episode, the goal stays at (3, 3); each episode 1 + 3 frames."""
    assert clip.frames.shape == (8, 5 * TILE, 5 * TILE, 3) and clip.returns == [0.0, 0.0]
    assert [_cell(f, "red") for f in clip.frames] == [(1, 1), (1, 2), (1, 3), (1, 3)] * 2
    assert {_cell(f, "green") for f in clip.frames} == {(3, 3)}


def test_xminigrid_video_follows_the_agent_through_two_episodes(tmp_path):
    pytest.importorskip("xminigrid")
    clip, policy, _ = _film({"source": "xminigrid", "id": "MiniGrid-Empty-5x5", "params": {"max_steps": 3}},
                            0, 2, 100, tmp_path)  # 0: forward
    _walks_east(clip)
    assert len(policy.seen) == 6  # one act per step


def test_navix_video_follows_the_agent_through_two_episodes(tmp_path):
    pytest.importorskip("navix")
    clip, _, _ = _film({"source": "navix", "id": "Navix-Empty-5x5-v0", "max_steps": 3}, 2, 2, 100,
                       tmp_path)  # 2: forward
    _walks_east(clip)


@pytest.mark.slow  # 21 s cold, Craftax's renderer compiled: the default suite films xminigrid and navix
def test_craftax_symbolic_game_is_filmed_in_pixels(tmp_path):
    """Craftax-Classic-Symbolic (the agent sees `[1345]` floats) filmed by Craftax's pixel renderer, 16 px a block:
    `[144, 144, 3]`; standing still, an episode's frames show one world (only the daylight dims it by a level or
    two a step), and the next episode a new one."""
    pytest.importorskip("craftax")
    clip, policy, _ = _film({"source": "craftax", "id": "Craftax-Classic-Symbolic-v1",
                             "params": {"max_timesteps": 3}}, 0, 2, 100, tmp_path)  # 0: noop
    assert clip.frames.shape == (8, 144, 144, 3) and len(clip.returns) == 2
    assert policy.seen[0].shape == (1345,)

    def apart(a, b):  # mean absolute difference of two frames, in levels of 255
        return np.abs(clip.frames[a].astype(int) - clip.frames[b]).mean()

    assert max(apart(0, t) for t in (1, 2, 3)) < 3 and max(apart(4, t) for t in (5, 6, 7)) < 3
    assert apart(0, 4) > 10, apart(0, 4)
    assert all(len(np.unique(f.reshape(-1, 3), axis=0)) > 20 for f in clip.frames)  # a scene, not a blank


@pytest.mark.slow  # 15 s cold
def test_popgym_arcade_video_is_the_frames_the_agent_saw(tmp_path):
    """CountRecallEasy, firing at every step (each fire shows the next card): cut at 6 frames, no episode
    finished; the frames are the game's frames, each the observation the policy acted on."""
    pytest.importorskip("popgym_arcade")
    clip, policy, _ = _film({"source": "popgym_arcade", "id": "CountRecallEasy"}, 4, 1, 6, tmp_path)
    assert clip.frames.shape == (6, 128, 128, 3) and clip.returns == []
    np.testing.assert_array_equal(clip.frames[:5], np.stack(policy.seen))
    assert len({f.tobytes() for f in clip.frames}) > 1


def test_a_library_without_a_renderer_is_refused_in_one_line(monkeypatch):
    pytest.importorskip("xminigrid")
    from rl.envs import xminigrid_source

    single_env = xminigrid_source.single_env
    monkeypatch.setattr(xminigrid_source, "single_env", lambda cfg: dataclasses.replace(single_env(cfg), render=None))
    with pytest.raises(ConfigError, match=r"^no video for xminigrid env MiniGrid-Empty-5x5: the library has no "
                                          r"renderer for it$"):
        video.check_env(env_config({"source": "xminigrid", "id": "MiniGrid-Empty-5x5"}))


def test_evaluate_films_a_trained_xminigrid_run(tmp_path, capsys):
    """A tiny DQN run on MemoryS8, then `scripts.evaluate --video`: 2 greedy episodes (each ends within the
    task's time limit) as a GIF of the whole 32 px grid, the printed line naming the frames."""
    pytest.importorskip("xminigrid")
    run(compose([*TINY["dqn"], "env=xminigrid/memory_s8", "logger=none", "seeds=1", "num_envs=4",
                 "total_steps=128", "log_interval=128", "eval_episodes=0", "+env.params.max_steps=6"]),
        tmp_path / "run")
    capsys.readouterr()
    gif = tmp_path / "memory.gif"
    returns = evaluate.main([str(tmp_path / "run"), "--video", str(gif), "--episodes", "2"])
    line = capsys.readouterr().out.strip()
    assert len(returns) == 2 and line.startswith(f"video: {gif} (")
    frames = int(line.split("(")[1].split()[0])
    assert 2 * 2 <= frames <= 2 * (1 + 6)  # each episode: its first state and 1..6 steps
    written = iio.imread(gif, index=None)
    assert written.dtype == np.uint8 and written.shape[1:] == (7 * TILE, 8 * TILE, 3)  # MemoryS8's 7x8 grid
    assert 1 < len(written) <= frames  # a GIF keeps a run of identical frames as one
