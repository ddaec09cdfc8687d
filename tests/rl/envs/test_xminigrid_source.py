"""rl/envs/xminigrid_source.py: XLand-MiniGrid's MiniGrid tasks as an Anakin source. The contract on the
library's own envs (observations uint8 as xminigrid draws them, the goal terminates, `max_steps` truncates),
its config keys, and short runs of all three agents (DQN's resumed bit for bit)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agents.experiment import run
from agents.setup import compose
from rl.config import ConfigError
from rl.envs import env_config, make_source
from tests.rl.envs.jax_env_runs import TINY, learns, rollout, smoke

xminigrid = pytest.importorskip("xminigrid")

COVERS = {  # read with ast by tests/test_option_coverage.py: literals only
    "env.xminigrid.source": "test_the_source_steps_xminigrid_envs",
    "env.xminigrid.id": ["test_the_source_steps_xminigrid_envs", "test_unknown_ids_and_params_are_refused"],
    "env.xminigrid.family": "test_the_yaml_family_picks_the_minatar_presets",
    "env.xminigrid.params": ["test_params_max_steps_truncates", "test_unknown_ids_and_params_are_refused"],
    "env.xminigrid.observation": "test_one_hot_observations_encode_the_symbolic_view",
}
FORWARD, CLOCKWISE, ANTICLOCKWISE = 0, 1, 2  # xminigrid's first actions (then pick up, put down, toggle)


def test_the_source_steps_xminigrid_envs():
    """Observations are xminigrid's own (first reset == `env.reset` on the same key), uint8 `[3, 3, 2]` on the
    Memory tasks; Empty-5x5 ends at the goal (terminated, reward 1 - 0.9 t / max_steps) with the fresh episode's
    observation in `obs` and the goal view in `next_obs`."""
    source = make_source({"source": "xminigrid", "id": "MiniGrid-MemoryS8"}, 2)
    assert (source.obs_shape, source.obs_dtype, source.num_actions) == ((3, 3, 2), np.uint8, 6)
    env, params = xminigrid.make("MiniGrid-MemoryS8")
    key = jax.random.PRNGKey(3)
    _, obs = jax.jit(source.reset)(key)
    np.testing.assert_array_equal(obs[1], jax.jit(env.reset)(params, jax.random.split(key, 2)[1]).observation)

    source = make_source({"source": "xminigrid", "id": "MiniGrid-Empty-5x5"}, 1)
    assert source.obs_shape == (7, 7, 2) and source.max_episode_steps == 100
    # The agent starts at (1, 1) facing east, the goal is at (3, 3): forward x2, turn clockwise, forward x2.
    _, steps = rollout(source, [[FORWARD], [FORWARD], [CLOCKWISE], [FORWARD], [FORWARD]], jax.random.PRNGKey(0))
    ends = [(bool(s.terminated[0]), bool(s.truncated[0])) for s in steps]
    assert ends == [(False, False)] * 4 + [(True, False)], ends
    np.testing.assert_allclose(steps[-1].reward, [1.0 - 0.9 * 5 / 100], rtol=1e-6)
    assert not np.array_equal(steps[-1].obs, steps[-1].next_obs)


def test_one_hot_observations_encode_the_symbolic_view():
    """`env.observation=one_hot`: each cell's tile id and colour one-hot, `[3, 3, 13 + 12]` bool, equal to NumPy's
    encoding of the symbolic view of the same reset and steps; an unknown encoding is refused in one line."""
    cfg = {"source": "xminigrid", "id": "MiniGrid-MemoryS8"}
    symbolic, one_hot = make_source(cfg, 2), make_source({**cfg, "observation": "one_hot"}, 2)
    assert (one_hot.obs_shape, one_hot.obs_dtype) == ((3, 3, 25), np.bool_)
    actions = [[ANTICLOCKWISE, FORWARD], [ANTICLOCKWISE, FORWARD], [FORWARD, CLOCKWISE]]
    first, plain = rollout(symbolic, actions, jax.random.PRNGKey(5))
    first_coded, coded = rollout(one_hot, actions, jax.random.PRNGKey(5))
    eye_tiles, eye_colours = np.eye(13, dtype=bool), np.eye(12, dtype=bool)

    def encoded(ids):
        ids = np.asarray(ids)
        return np.concatenate([eye_tiles[ids[..., 0]], eye_colours[ids[..., 1]]], axis=-1)

    np.testing.assert_array_equal(first_coded, encoded(first))
    for p, c in zip(plain, coded):
        np.testing.assert_array_equal(c.obs, encoded(p.obs))
        np.testing.assert_array_equal(c.next_obs, encoded(p.next_obs))
        np.testing.assert_array_equal(c.reward, p.reward)
    with pytest.raises(ConfigError, match=r"env.observation='rgb': one of symbolic, one_hot"):
        env_config({**cfg, "observation": "rgb"})


def test_params_max_steps_truncates():
    """`env.params.max_steps=3`: turning in place is truncated (not terminated) at the 3rd step, every time."""
    source = make_source({"source": "xminigrid", "id": "MiniGrid-Empty-5x5", "params": {"max_steps": 3}}, 2)
    assert source.max_episode_steps == 3
    _, steps = rollout(source, np.full((7, 2), ANTICLOCKWISE), jax.random.PRNGKey(1))
    assert [bool(s.truncated.all()) for s in steps] == [False, False, True, False, False, True, False]
    assert not any(s.terminated.any() for s in steps)


def test_unknown_ids_and_params_are_refused():
    with pytest.raises(ConfigError, match=r"env.id='MiniGrid-Nope' is not a xminigrid task; known ids: MiniGrid-"):
        env_config({"source": "xminigrid", "id": "MiniGrid-Nope"})
    with pytest.raises(ConfigError, match="XLand-MiniGrid-R1-9x9"):  # needs a benchmark ruleset: not offered
        env_config({"source": "xminigrid", "id": "XLand-MiniGrid-R1-9x9"})
    with pytest.raises(ValueError, match=r"env.params: \['speed'\] are not parameters of MiniGrid-Empty-5x5"):
        make_source({"source": "xminigrid", "id": "MiniGrid-Empty-5x5", "params": {"speed": 2}}, 1)


def test_the_yaml_family_picks_the_minatar_presets():
    cfg = compose(["agent=dqn", "env=xminigrid/memory_s8"])
    assert cfg.env.family == "minatar" and cfg.agent.buffer_size == 100_000  # DQN's minatar preset
    assert compose(["agent=dqn", "env=xminigrid/memory_s8", "env.id=MiniGrid-DoorKey-5x5"]).env.id == "MiniGrid-DoorKey-5x5"


def test_dqn_trains_evaluates_and_resumes_bit_for_bit(tmp_path):
    """DQN on MemoryS8: 2 seeds train and evaluate greedily; 128 steps + a resume to 256 == 256 straight, every
    leaf of the runner state (the env state is xminigrid's TimeStep, uint8 grids included)."""
    env = ["env=xminigrid/memory_s8"]
    straight = smoke(tmp_path / "straight", env)
    common = [*TINY["dqn"], *env, "logger=none", "seeds=2", "num_envs=4", "log_interval=128", "eval_interval=128",
              "eval_episodes=2"]
    run(compose([*common, "total_steps=128"]), tmp_path / "first")
    resumed = run(compose([*common, "total_steps=256", f"resume={tmp_path / 'first'}"]), tmp_path / "unused")
    a, b = jax.tree_util.tree_leaves(straight["state"]), jax.tree_util.tree_leaves(resumed["state"])
    assert len(a) == len(b) and resumed["env_steps"] == 256
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert straight["eval_returns"] == resumed["eval_returns"]


@pytest.mark.parametrize("agent", ["r2d2", "muesli"])
def test_recurrent_and_model_based_agents_train(agent, tmp_path):
    smoke(tmp_path / agent, ["env=xminigrid/memory_s8"], agent, 256)


@pytest.mark.slow
def test_dqn_learns_empty_5x5(tmp_path):
    """MiniGrid-Empty-5x5 (the goal 5 steps away, return 1 - 0.9 t / 100): every greedy episode of both seeds
    reaches it on the shortest path (0.955) after 50k env steps."""
    returns = learns(tmp_path / "run", ["env=xminigrid/empty_5x5"], 50_000)
    np.testing.assert_allclose(returns, 0.955, atol=1e-4)
