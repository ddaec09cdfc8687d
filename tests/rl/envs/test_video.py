"""`python -m scripts.evaluate <run dir> --video <path>`: a trained Catch agent's greedy episodes as a GIF whose
frames are the episodes' observations; the frame drawers (MinAtar colours, CartPole's pole, Atari's newest
frame); one-line errors for a bad suffix, a missing ffmpeg and an env without frames (rl/envs/video.py)."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest

from agents import experiment
from rl.config import ConfigError
from rl.envs import env_config, video
from scripts import evaluate
from tests.conftest import TINY_DQN

CATCH = [o for o in TINY_DQN if not o.startswith("env=")] + ["env=catch"]


def test_gif_of_a_trained_catch_agent_shows_its_episodes(tmp_path, capsys):
    """Two greedy Catch episodes: 2 x (first observation + 9 steps) = 20 frames of 10 x 5 cells at 16 px,
    each holding the ball and the paddle (one cell where they meet); an episode ends with the ball in the
    bottom row, and its printed return is +1 exactly where that last frame shows the ball on the paddle."""
    experiment.train(*CATCH, "total_steps=400", "eval_episodes=0", run_dir=tmp_path / "run")
    capsys.readouterr()
    gif = tmp_path / "out" / "catch.gif"
    returns = evaluate.main([str(tmp_path / "run"), "--video", str(gif), "--episodes", "2", "--seed", "3"])
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"video: {gif} (20 frames at 10 fps; returns ") and len(line.splitlines()) == 1

    frames = iio.imread(gif, index=None)
    assert frames.shape == (20, 160, 80, 3) and frames.dtype == np.uint8
    assert len({f.tobytes() for f in frames}) == 20  # every step changes the picture
    cells = frames[:, ::16, ::16, 0] > 127  # [20, 10 rows, 5 columns]: white cells
    blocks = np.repeat(np.repeat(cells, 16, 1), 16, 2)
    assert np.all(frames == np.where(blocks, 255, 0)[..., None])  # whole cells, white on black
    assert set(cells.sum((1, 2)).tolist()) <= {1, 2} and cells[:, -1].any(1).all()  # paddle in the bottom row
    assert sorted(returns.tolist()) == sorted(float(r) for r in line.split("returns ")[1].rstrip(")").split())
    for episode, r in enumerate(returns):
        first, last = cells[10 * episode], cells[10 * episode + 9]
        assert first[0].sum() == 1 and last[:-1].sum() == 0  # the ball starts at the top, ends at the bottom
        assert r in (-1.0, 1.0) and (r == 1.0) == (last.sum() == 1)


def test_minatar_cells_take_the_colour_of_their_highest_channel():
    obs = np.zeros((10, 10, 2), bool)
    obs[1, 2, 0] = obs[5, 7, 1] = True
    obs[3, 3] = True  # both channels: the higher one shows
    frame = video.minatar_frame(obs)
    assert frame.shape == (160, 160, 3) and frame.dtype == np.uint8
    want = np.zeros((10, 10, 3), np.uint8)
    want[1, 2], want[5, 7], want[3, 3] = video.MINATAR_PALETTE[0], video.MINATAR_PALETTE[1], video.MINATAR_PALETTE[1]
    assert np.array_equal(frame, np.kron(want, np.ones((16, 16, 1), np.uint8)))


def test_cartpole_pole_and_cart_follow_the_state():
    """The pole leans the way theta says (theta > 0: right) and the cart sits at x (66.7 px per metre)."""
    draw = video.renderer(env_config({"source": "gymnax", "id": "CartPole-v1"})).frame

    def centre(obs, colour, rows=slice(None)):
        frame = draw(np.asarray(obs, np.float32))
        assert frame.shape == (240, 320, 3)
        return np.nonzero(np.all(frame[rows] == colour, -1))[1].mean()

    pole, cart, above_track = (202, 152, 101), (0, 0, 0), slice(166, 178)
    assert centre([0, 0, 0.2, 0], pole) > 165 and centre([0, 0, -0.2, 0], pole) < 155
    assert abs(centre([0, 0, 0, 0], pole) - 160) < 2 and abs(centre([0, 0, 0, 0], cart, above_track) - 160) < 2
    assert abs(centre([1.2, 0, 0, 0], cart, above_track) - 240) < 2
    frame = draw(np.zeros(4, np.float32))
    black_rows = np.nonzero(np.all(frame[:, :40] == 0, axis=(1, 2)))[0]  # left of the cart: only the track
    assert black_rows.tolist() == [180]
    pole_rows = np.nonzero(np.all(frame == pole, -1))[0]  # upright: from the axle, 12 px above the track, up
    assert pole_rows.max() <= 180 - 12 + 3 and pole_rows.min() < 180 - 12 - 40
    # The axle: a 7 x 7 px dot centred where the pole meets the cart (x 160, 12 px above the track).
    rows, cols = np.nonzero(np.all(frame == (129, 132, 203), -1))
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (165, 171, 157, 163)


def test_mountaincar_car_sits_at_its_position_on_the_hill():
    """The car is drawn at x = (position - min_position) * 320 / (max - min) px, resting on the hill (its lowest
    row at y = 240 - 10 - (0.45 sin(3 position) + 0.55) * that scale): the black pixels one frame has and the
    other lacks are each frame's car."""
    draw = video.renderer(env_config({"source": "gymnax", "id": "MountainCar-v0"})).frame
    scale = 320 / 1.8

    def car(pos, other):
        a, b = (np.all(draw(np.asarray([x, 0.0], np.float32)) == 0, -1) for x in (pos, other))
        rows, cols = np.nonzero(a & ~b)
        return cols.mean(), rows.max(), rows.min(), cols.max() - cols.min() + 1

    for pos in (-0.5, 0.3):
        column, bottom, top, width = car(pos, -pos - 0.2)
        hill = 230 - (0.45 * np.sin(3 * pos) + 0.55) * scale
        assert abs(column - (pos + 1.2) * scale) < 2
        assert abs(bottom - hill) < 3
        assert top == int(hill - 16) and width == 17  # a 16 x 16 px ellipse standing on the hill


def test_mountaincar_hill_is_a_2_pixel_line_through_the_valley_floor():
    """At the valley's bottom (position -pi/6, where the hill is flat) the hill is gym's 2 px line at
    y = 240 - 10 - 0.1 * 320 / 1.8, and nothing else is drawn in that column (the car is far away)."""
    frame = video.renderer(env_config({"source": "gymnax", "id": "MountainCar-v0"})).frame(
        np.asarray([0.4, 0.0], np.float32))
    scale = 320 / 1.8
    column = int((-np.pi / 6 + 1.2) * scale)
    rows = np.nonzero(np.all(frame[:, column] == 0, -1))[0]
    assert len(rows) == 2 and abs(rows.mean() - (230 - 0.1 * scale)) <= 1, rows


def test_mountaincar_flag_flies_at_the_top_of_a_40_pixel_pole_at_the_goal():
    """The goal (0.5) is marked by a black pole 40 px tall standing on the hill and a yellow flag over its top
    10 px: the pole's column is black from the hill up to the flag, and nothing pokes out above the flag."""
    frame = video.renderer(env_config({"source": "gymnax", "id": "MountainCar-v0"})).frame(
        np.asarray([-1.0, 0.0], np.float32))
    scale = 320 / 1.8
    fx, fy = int((0.5 + 1.2) * scale), 230 - (0.45 * np.sin(1.5) + 0.55) * scale
    flag_rows, flag_cols = np.nonzero(np.all(frame == (204, 204, 0), -1))
    assert flag_cols.min() == fx and flag_cols.max() <= fx + 20
    assert flag_rows.min() == int(fy - 40) and flag_rows.max() == int(fy - 30)
    pole = np.nonzero(np.all(frame[:, fx] == 0, -1))[0]
    assert pole.min() == flag_rows.max() + 1 and abs(pole.max() - fy) <= 1  # up to the flag, from the hill
    above = np.all(frame[:flag_rows.min(), fx - 1:fx + 2] == 255)
    assert above, "the pole sticks out above the flag"


def test_atari_frame_is_the_newest_of_the_stack_in_grey():
    obs = np.random.default_rng(0).integers(0, 256, (4, 84, 84), np.uint8)
    frame = video.renderer(env_config({"source": "envpool", "id": "Pong-v5"})).frame(obs)
    assert frame.shape == (168, 168, 3)
    assert np.array_equal(frame, np.repeat(np.repeat(obs[-1], 2, 0), 2, 1)[..., None].repeat(3, -1))


def test_mp4_writes_unscaled_frames(tmp_path):
    frames = np.zeros((4, 168, 168, 3), np.uint8)
    frames[np.arange(4), :, :, 0] = np.array([0, 80, 160, 240], np.uint8)[:, None, None]
    path = video.write(tmp_path / "a.mp4", video.Video(frames, [1.0], fps=15))
    back = iio.imread(path, plugin="FFMPEG", index=None)
    assert back.shape == (4, 168, 168, 3)
    assert np.all(np.abs(back[..., 0].mean((1, 2)) - [0, 80, 160, 240]) < 8)


def _one_line_exit(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        evaluate.main(argv)
    assert capsys.readouterr().out == ""
    message = str(exc.value.code)
    assert len(message.splitlines()) == 1 and message.startswith("evaluate: ")
    return message


def test_bad_video_input_is_one_line(tmp_path, capsys, monkeypatch):
    """An unknown suffix, an .mp4 without ffmpeg and a dir that is no run: one line each, before any episode;
    an env without a frame drawer is refused naming those that have one."""
    line = _one_line_exit([str(tmp_path), "--video", str(tmp_path / "a.avi")], capsys)
    assert "unknown suffix '.avi'" in line and ".gif" in line
    import imageio_ffmpeg

    def missing():
        raise RuntimeError("No ffmpeg exe could be found")

    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", missing)
    line = _one_line_exit([str(tmp_path), "--video", str(tmp_path / "a.mp4")], capsys)
    assert "needs ffmpeg" in line and "write a .gif instead" in line
    monkeypatch.undo()
    assert "no checkpoint found" in _one_line_exit([str(tmp_path), "--video", str(tmp_path / "a.gif")], capsys)
    assert not (tmp_path / "a.gif").exists()
    with pytest.raises(ConfigError, match="no video for gymnax env MemoryChain-bsuite: .*CartPole-v1"):
        video.check_env(env_config({"source": "gymnax", "id": "MemoryChain-bsuite"}))


def test_envpool_video_records_whole_episodes_and_their_returns():
    """envpool CartPole, a policy that always pushes left: one frame per recv (each episode's frames, then the
    next episode's first), and each return is the episode's length (reward 1 per step), 8-11 steps here. The
    policy's carry (a step counter, as a recurrent state) is one env's and starts afresh with each episode."""
    import jax.numpy as jnp

    seen = []

    class Left:
        def initial_carry(self, n):
            return np.zeros(n, np.int32)

        def act(self, obs, carry, key):
            seen.append(np.asarray(carry).tolist())
            return jnp.zeros(obs.shape[0], jnp.int32), carry + 1

    clip = video.record(env_config({"source": "envpool", "id": "CartPole-v1"}), Left(), episodes=3, seed=0)
    assert len(clip.returns) == 3 and all(8 <= r <= 11 for r in clip.returns), clip.returns
    # frames: every episode's reset observation and its steps, up to the step that ended the third
    assert len(clip.frames) == sum(r + 1 for r in clip.returns)
    # the carry counts each episode's steps from 0 (reset, then one act per step; the last act is the third's)
    assert seen == [[t] for r in clip.returns for t in range(int(r) + 1)][: len(seen)]
    assert len(seen) == len(clip.frames)
    assert clip.frames.ndim == 4 and clip.frames.shape[-1] == 3
