"""rl/envs/popgym_arcade_source.py: POPGym Arcade as an Anakin source. The contract on the library's own games
(frames uint8 as the game draws them, the game's end terminates, its step limit truncates, `partial_obs`
hides), its config keys, and a short DQN run."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agents.setup import compose
from rl.config import ConfigError
from rl.envs import env_config, make_source
from rl.envs.popgym_arcade_source import ends
from tests.rl.envs.jax_env_runs import rollout, smoke, step_ends

popgym_arcade = pytest.importorskip("popgym_arcade")

COVERS = {  # read with ast by tests/test_option_coverage.py: literals only
    "env.popgym_arcade.source": "test_count_recall_ends_by_its_cards_or_its_step_limit",
    "env.popgym_arcade.id": ["test_count_recall_ends_by_its_cards_or_its_step_limit",
                             "test_bad_values_are_refused_in_one_line"],
    "env.popgym_arcade.family": "test_the_yaml_family_picks_the_minatar_presets",
    "env.popgym_arcade.partial_obs": "test_partial_obs_hides_what_the_full_frame_shows",
}
FIRE = 4  # CountRecall: 0 up, 1 down, 2 left, 3 right, 4 fire (confirm the count, show the next card)


def test_ends_tells_termination_from_truncation():
    """NumPy table of (done, info) -> (terminated, truncated), MineSweeper's mine (`terminated: False`, not the
    step limit) and an end on the limit's step included."""
    done = np.array([False, True, True, True, True])
    info = {"terminated": np.array([False, True, False, False, True]),
            "truncated": np.array([False, False, True, False, True])}
    terminated, truncated = ends(done, info)
    np.testing.assert_array_equal(terminated, [False, True, False, True, True])
    np.testing.assert_array_equal(truncated, [False, False, True, False, False])


def test_count_recall_ends_by_its_cards_or_its_step_limit():
    """CountRecallEasy (26 cards, 126 steps): firing at every step plays the last card at step 26
    (terminated); never firing is truncated at step 126. Frames are the game's own (a reset == `reset_env` on
    the same key), uint8 `[128, 128, 3]`."""
    source = make_source({"source": "popgym_arcade", "id": "CountRecallEasy"}, 2)
    assert (source.obs_shape, source.obs_dtype, source.num_actions, source.max_episode_steps) == (
        (128, 128, 3), np.uint8, 5, 126)
    key = jax.random.PRNGKey(0)
    first, terminated, truncated = step_ends(source, np.tile([FIRE, 2], (126, 1)), key)
    env, params = popgym_arcade.make("CountRecallEasy")
    env1_key = jax.random.split(jax.random.split(key)[0], 2)[1]  # env 1's key of the reset
    np.testing.assert_array_equal(first[1], jax.jit(env.reset_env)(env1_key, params)[0])
    assert np.flatnonzero(terminated[:, 0]).tolist() == [25, 51, 77, 103] and not truncated[:, 0].any()
    assert np.flatnonzero(truncated[:, 1]).tolist() == [125] and not terminated[:, 1].any()


def test_partial_obs_hides_what_the_full_frame_shows():
    """`env.partial_obs=true`: the first frame is the full one; after a step the frames differ (same keys)."""
    key, actions = jax.random.PRNGKey(0), np.ones((1, 1))
    full = rollout(make_source({"source": "popgym_arcade", "id": "CartPoleEasy"}, 1), actions, key)
    part = rollout(make_source({"source": "popgym_arcade", "id": "CartPoleEasy", "partial_obs": True}, 1),
                   actions, key)
    np.testing.assert_array_equal(full[0], part[0])
    assert (full[1][0].next_obs != part[1][0].next_obs).any()


def test_bad_values_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"env.id='Pong' is not a popgym_arcade task; known ids: AutoEncodeEasy"):
        env_config({"source": "popgym_arcade", "id": "Pong"})


def test_the_yaml_family_picks_the_minatar_presets():
    cfg = compose(["agent=dqn", "env=popgym_arcade/count_recall_easy"])
    assert cfg.env.family == "minatar" and cfg.agent.buffer_size == 100_000  # DQN's minatar preset
    assert compose(["env=popgym_arcade/count_recall_easy", "env.id=BreakoutEasy"]).env.id == "BreakoutEasy"


@pytest.mark.optimized  # the game draws each frame pixel by pixel: unoptimised, its steps take most of a minute
def test_dqn_trains_and_evaluates(tmp_path):
    smoke(tmp_path / "run", ["env=popgym_arcade/count_recall_easy"])
