"""rl/envs/navix_source.py: navix's MiniGrid ports as an Anakin source. The contract on the library's own envs
(observations as navix draws them, the goal terminates, `max_steps` truncates, reset on the ending step rather
than navix's step after), its config keys, a short DQN run, and (slow) DQN learning Empty-5x5."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agents.setup import compose
from rl.config import ConfigError
from rl.envs import env_config, make_source
from tests.rl.envs.jax_env_runs import learns, rollout, smoke, unoptimised

nx = pytest.importorskip("navix")

COVERS = {  # read with ast by tests/test_option_coverage.py: literals only
    "env.navix.source": "test_the_source_steps_navix_envs",
    "env.navix.id": ["test_the_source_steps_navix_envs", "test_bad_values_are_refused_in_one_line"],
    "env.navix.family": "test_the_yaml_family_picks_the_minatar_presets",
    "env.navix.max_steps": "test_max_steps_truncates",
    "env.navix.observation": ["test_observation_picks_navix_observation_function",
                              "test_bad_values_are_refused_in_one_line"],
}
CCW, CW, FORWARD = 0, 1, 2  # navix's MiniGrid action set: rotate_ccw, rotate_cw, forward, pickup, ...


def test_the_source_steps_navix_envs():
    """Observations are navix's own (a reset == `env.reset` on the same key): the whole 5x5 grid, uint8
    `[5, 5, 3]`; walking to the goal terminates with reward 1, the next episode starting on that same step."""
    source = make_source({"source": "navix", "id": "Navix-Empty-5x5-v0"}, 2)
    assert (source.obs_shape, source.obs_dtype, source.num_actions, source.max_episode_steps) == (
        (5, 5, 3), np.uint8, 7, 100)
    key = jax.random.PRNGKey(3)
    _, obs = jax.jit(source.reset)(key)
    env = nx.make("Navix-Empty-5x5-v0")
    np.testing.assert_array_equal(obs[1], jax.jit(env.reset)(jax.random.split(key, 2)[1]).observation)
    # The player starts at (1, 1) facing east, the goal is at (3, 3): forward x2, rotate clockwise, forward x2.
    obs0, steps = rollout(source, [[a, a] for a in (FORWARD, FORWARD, CW, FORWARD, FORWARD)], jax.random.PRNGKey(0))
    ends = [(bool(s.terminated[0]), bool(s.truncated[0])) for s in steps]
    assert ends == [(False, False)] * 4 + [(True, False)], ends
    np.testing.assert_array_equal(steps[-1].reward, [1.0, 1.0])
    np.testing.assert_array_equal(steps[-1].obs, obs0)  # Empty-5x5 always starts the same way


def test_max_steps_truncates():
    """`env.max_steps=3`: rotating in place is truncated (not terminated) at every 3rd step."""
    source = make_source({"source": "navix", "id": "Navix-Empty-5x5-v0", "max_steps": 3}, 2)
    assert source.max_episode_steps == 3
    _, steps = rollout(source, np.full((7, 2), CCW), jax.random.PRNGKey(1))
    assert [bool(s.truncated.all()) for s in steps] == [False, False, True, False, False, True, False]
    assert not any(s.terminated.any() for s in steps)


def test_observation_picks_navix_observation_function():
    """`env.observation=symbolic_first_person`: the agent's 7x7 view; `rgb`: the rendered grid, uint8 both."""
    view = make_source({"source": "navix", "id": "Navix-Empty-5x5-v0", "observation": "symbolic_first_person"}, 1)
    assert (view.obs_shape, view.obs_dtype) == ((7, 7, 3), np.uint8)
    rgb = make_source({"source": "navix", "id": "Navix-Empty-5x5-v0", "observation": "rgb"}, 1)
    env = nx.make("Navix-Empty-5x5-v0", observation_fn=nx.observations.rgb)
    key = jax.random.PRNGKey(0)
    np.testing.assert_array_equal(jax.jit(rgb.reset)(key)[1][0],
                                  jax.jit(env.reset)(jax.random.split(key, 1)[0]).observation)
    assert rgb.obs_dtype == np.uint8 and rgb.obs_shape[-1] == 3 and rgb.obs_shape[0] > 5


def test_bad_values_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"env.id='Navix-Nope-v0' is not a navix task; known ids: Navix-Empty"):
        env_config({"source": "navix", "id": "Navix-Nope-v0"})
    with pytest.raises(ConfigError, match=r"env.observation='pixels': one of symbolic, symbolic_first_person"):
        env_config({"source": "navix", "observation": "pixels"})
    with pytest.raises(ConfigError, match=r"env.max_steps must be >= 1, got 0"):
        env_config({"source": "navix", "max_steps": 0})


def test_the_yaml_family_picks_the_minatar_presets():
    cfg = compose(["agent=dqn", "env=navix/empty_5x5"])
    assert cfg.env.family == "minatar" and cfg.agent.buffer_size == 100_000  # DQN's minatar preset
    assert compose(["agent=dqn", "env=navix/empty_5x5", "env.id=Navix-FourRooms-v0"]).env.id == "Navix-FourRooms-v0"


def test_dqn_trains_and_evaluates(tmp_path):
    smoke(tmp_path / "run", ["env=navix/empty_5x5", "env.max_steps=20"])


@pytest.mark.slow
def test_dqn_learns_empty_5x5(tmp_path):
    """Navix-Empty-5x5 seen through the agent's 7x7 view (`symbolic_first_person`, as MiniGrid's agents see
    it): the reward is 1 on reaching the goal and 0 otherwise (no time penalty), so the optimal return is 1,
    the goal 5 steps away. After 100k env steps every greedy episode of both seeds returns 1, and each seed's
    greedy policy walks the 5-step shortest path (the start is fixed and the env draws no randomness: one walk
    per seed stands for all its episodes). A uniformly random policy returns 0.41 (it reaches the goal within
    the 100-step limit in 41% of 4000 episodes), so the return alone would not tell learning apart: the walk
    does. (On the whole-grid default observation DQN's preset did not learn in 50k steps: greedy 0.)"""
    from agents.experiment import load_policy

    with unoptimised():  # navix's reset compiles in seconds so, in over 15 minutes with the slow tier's options
        env = ["env=navix/empty_5x5", "env.observation=symbolic_first_person"]
        returns = learns(tmp_path / "run", env, 100_000)
        np.testing.assert_array_equal(returns, 1.0)
        source = make_source({"source": "navix", "id": "Navix-Empty-5x5-v0", "observation": "symbolic_first_person"}, 1)
        step = jax.jit(source.step)
        for seed in (0, 1):
            policy = load_policy(tmp_path / "run", seed)
            state, obs = source.reset(jax.random.PRNGKey(seed))
            for t in range(1, 101):
                state, ts = step(state, policy.act(obs)[0], jax.random.PRNGKey(t))
                obs = ts.obs
                if ts.terminated[0] or ts.truncated[0]:
                    break
            assert (t, float(ts.reward[0]), bool(ts.terminated[0])) == (5, 1.0, True), f"seed {seed}: {t} steps"
