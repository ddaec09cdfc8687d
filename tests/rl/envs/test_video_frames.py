"""rl/envs/video.py's frame drawers on hand-made observations: the MinAtar colour of every channel of a
10-channel game, and Acrobot's links drawn from the pivot at the centre of the frame."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from rl.envs import video


def test_each_of_ten_minatar_channels_has_its_own_colour():
    """Seaquest has 10 channels: channel c draws in palette colour c, the tenth one included."""
    obs = np.zeros((10, 10, 10), bool)
    obs[np.arange(10), np.arange(10), np.arange(10)] = True  # channel c alone at cell (c, c)
    frame = video.minatar_frame(obs)
    cells = frame[:: video.CELL, :: video.CELL]  # [10, 10, 3]: one pixel per cell
    np.testing.assert_array_equal(cells[np.arange(10), np.arange(10)], video.MINATAR_PALETTE)


def test_acrobot_links_start_at_the_frame_centre_and_are_8_px_thick():
    """cos a1 = 0, sin a1 = 1 and a2 = 0: both links lie flat to the right of the pivot, which is the centre
    (120, 120) of the 240 px frame; away from the joints each link column is 8 px of link colour around row
    120."""
    draw = video.renderer(SimpleNamespace(source="gymnax", id="Acrobot-v1")).frame
    frame = draw(np.array([0.0, 1.0, 1.0, 0.0, 0.0, 0.0], np.float32))
    assert frame.shape == (240, 240, 3)
    link = np.all(frame == (0, 204, 204), axis=-1)
    assert np.array_equal(frame[120, 120], (204, 204, 0))  # the pivot's dot
    columns = np.nonzero(link.any(axis=0))[0]
    assert 120 <= columns.min() <= 125 and columns.max() >= 225  # from the pivot to the tip (2 of 2.2 radii)
    for x in (140, 150, 190, 200):  # between the joints' dots
        np.testing.assert_array_equal(np.nonzero(link[:, x])[0], np.arange(117, 125))


def test_each_env_plays_back_at_its_own_frame_rate():
    """Videos play at the env's real-time rate: gym's `render_fps` for the classic-control envs (CartPole's
    tau 0.02 s -> 50, Acrobot 15, MountainCar 30), 60 Hz / frame skip 4 for Atari, 10 for MinAtar and Catch."""
    expected = {("gymnax", "CartPole-v1"): 50, ("gymnax", "Acrobot-v1"): 15, ("gymnax", "MountainCar-v0"): 30,
                ("gymnax", "Breakout-MinAtar"): 10, ("gymnax", "Catch-bsuite"): 10, ("envpool", "Pong-v5"): 15}
    assert {k: video.renderer(SimpleNamespace(source=k[0], id=k[1])).fps for k in expected} == expected


def test_cartpole_cart_is_gymnasiums_box_at_its_position_and_the_pole_stands_on_it():
    """x = 1.2 (half of x_threshold 2.4 to the right), upright: the track spans the 320 px width, so the cart's
    centre is at column 160 + 80 = 240; the cart is gymnasium's 50 x 30 box at 600 px scaled to 320 px (28 x 16,
    rows 164-179 above the track at row 180); the pole (length 2 x 0.5 = 66.7 px) rises from the axle, 3/4 of
    the cart's height up."""
    draw = video.renderer(SimpleNamespace(source="gymnax", id="CartPole-v1")).frame
    frame = draw(np.array([1.2, 0.0, 0.0, 0.0], np.float32))
    assert frame.shape == (240, 320, 3)
    black = np.all(frame == 0, axis=-1)
    assert black[180].all()  # the track
    rows, cols = np.nonzero(black[:180])
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (164, 179, 226, 254)
    rows, cols = np.nonzero(np.all(frame == (202, 152, 101), axis=-1))
    assert rows.min() == 101 and 237 <= cols.min() and cols.max() <= 242  # 168 - 66.7 up, 6 px wide around 240


def test_acrobot_joint_dots_are_centred_on_the_joints():
    """Flat links as above: the pivot (120, 120) and the elbow (174, 120) each carry a yellow dot of radius 4,
    i.e. a 9 px box centred on the joint."""
    draw = video.renderer(SimpleNamespace(source="gymnax", id="Acrobot-v1")).frame
    yellow = np.all(draw(np.array([0.0, 1.0, 1.0, 0.0, 0.0, 0.0], np.float32)) == (204, 204, 0), axis=-1)
    for lo, hi, centre in ((0, 147, 120), (147, 240, 174)):
        ys, xs = np.nonzero(yellow[:, lo:hi])
        assert (xs.min() + lo, xs.max() + lo, ys.min(), ys.max()) == (centre - 4, centre + 4, 116, 124)
