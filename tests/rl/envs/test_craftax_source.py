"""rl/envs/craftax_source.py: Craftax (Classic and full) as an Anakin source. The contract on the library's own
envs (symbolic observations as Craftax draws them, death terminates, `max_timesteps` truncates), its config
keys, a short DQN run, and (slow tier) DQN learning Craftax-Classic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.setup import compose
from rl.config import ConfigError
from rl.envs import env_config, make_source
from tests.rl.envs.jax_env_runs import learns, rollout, smoke

pytest.importorskip("craftax")

COVERS = {  # read with ast by tests/test_option_coverage.py: literals only
    "env.craftax.source": "test_the_source_steps_craftax_classic",
    "env.craftax.id": ["test_every_task_has_its_spaces", "test_bad_values_are_refused_in_one_line"],
    "env.craftax.family": "test_the_yaml_family_picks_the_vector_presets",
    "env.craftax.params": ["test_max_timesteps_truncates_and_death_terminates",
                           "test_bad_values_are_refused_in_one_line"],
    "env.craftax.reset_ratio": ["test_reset_ratio_sets_the_fresh_worlds_per_step",
                                "test_bad_values_are_refused_in_one_line"],
}
NOOP = 0


def test_the_source_steps_craftax_classic():
    """Observations are Craftax's own (a reset == the library's `reset_env` on the same key, to float32's last
    bit), float32."""
    from craftax.craftax_env import make_craftax_env_from_name

    source = make_source({"source": "craftax"}, 2)
    assert (source.obs_shape, source.obs_dtype, source.num_actions, source.max_episode_steps) == (
        (1345,), np.float32, 17, 10_000)
    env = make_craftax_env_from_name("Craftax-Classic-Symbolic-v1", auto_reset=False)
    key = jax.random.PRNGKey(3)
    np.testing.assert_allclose(jax.jit(source.reset)(key)[1][1],  # two programs: a last bit may differ
                               jax.jit(env.reset_env)(jax.random.split(key, 2)[1], env.default_params)[0], rtol=1e-6)


def test_every_task_has_its_spaces():
    shapes = {task: (s.obs_shape, s.obs_dtype, s.num_actions) for task in
              ("Craftax-Symbolic-v1", "Craftax-Classic-Pixels-v1")
              for s in [make_source({"source": "craftax", "id": task}, 1)]}
    assert shapes == {"Craftax-Symbolic-v1": ((8268,), np.float32, 43),
                      "Craftax-Classic-Pixels-v1": ((63, 63, 3), np.float32, 17)}


def test_max_timesteps_truncates_and_death_terminates():
    """`env.params.max_timesteps=3`: standing still is truncated (not terminated) at every 3rd step; a player
    at 0 health dies at the next step: terminated, not truncated, even on the time limit's step."""
    source = make_source({"source": "craftax", "params": {"max_timesteps": 3}}, 2)
    assert source.max_episode_steps == 3
    _, steps = rollout(source, np.full((4, 2), NOOP), jax.random.PRNGKey(1))
    assert [bool(s.truncated.all()) for s in steps] == [False, False, True, False]
    assert not any(s.terminated.any() for s in steps)
    state, _ = jax.jit(source.reset)(jax.random.PRNGKey(2))
    dying = state.replace(player_health=state.player_health.at[0].set(-5),
                          timestep=state.timestep.at[0].set(2))  # env 0 also reaches the limit at this step
    _, ts = jax.jit(source.step)(dying, jnp.zeros(2, jnp.int32), jax.random.PRNGKey(3))
    np.testing.assert_array_equal(ts.terminated, [True, False])
    np.testing.assert_array_equal(ts.truncated, [False, False])


def test_bad_values_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"env.id='Craftax-v0' is not a craftax task; known ids: Craftax-Classic"):
        env_config({"source": "craftax", "id": "Craftax-v0"})
    with pytest.raises(ValueError, match=r"env.params: \['lives'\] are not parameters of Craftax-Classic"):
        make_source({"source": "craftax", "params": {"lives": 2}}, 1)
    with pytest.raises(ConfigError, match=r"env.reset_ratio must be >= 1 \(envs per fresh world per step\), got 0"):
        env_config({"source": "craftax", "reset_ratio": 0})


def test_reset_ratio_sets_the_fresh_worlds_per_step():
    """ceil(num_envs / reset_ratio) fresh worlds per step (rl/envs/jax_envs.py shares them); 1: one per env."""
    assert make_source({"source": "craftax"}, 8).resets is None
    assert make_source({"source": "craftax", "reset_ratio": 4}, 8).resets == 2
    assert make_source({"source": "craftax", "reset_ratio": 3}, 8).resets == 3
    assert make_source({"source": "craftax", "reset_ratio": 16}, 8).resets == 1


def test_the_yaml_family_picks_the_vector_presets():
    cfg = compose(["agent=dqn", "env=craftax/classic_symbolic"])
    assert cfg.env.family == "vector" and list(cfg.agent.network.hidden_sizes) == [120, 84]  # DQN's small preset
    assert compose(["agent=dqn", "env=craftax/symbolic"]).env.id == "Craftax-Symbolic-v1"


def test_dqn_trains_and_evaluates(tmp_path):
    smoke(tmp_path / "run", ["env=craftax/classic_symbolic", "+env.params.max_timesteps=20"])


@pytest.mark.slow
def test_dqn_learns_craftax_classic(tmp_path):
    """Craftax-Classic-Symbolic, DQN's vector preset, one fresh world per step for the 16 envs
    (`env.reset_ratio=16`): after 500k env steps both seeds' training return over the last logged chunk is at
    least 2.4 and the 16 greedy episodes' mean is above the uniformly random policy's 1.33 (64 episodes, seed 0;
    its episodes last 130 steps). Calibration run: training return 1.83-2.01 at 50k, 3.07 / 2.88 at 500k; greedy
    1.98 / 2.48 (8 episodes per seed)."""
    returns = learns(tmp_path / "run", ["env=craftax/classic_symbolic", "env.reset_ratio=16"], 500_000)
    rows = np.genfromtxt(tmp_path / "run" / "metrics.csv", delimiter=",", names=True)
    last = rows[rows["env_steps"] == rows["env_steps"].max()]
    assert len(last) == 2 and (last["episode_return"] >= 2.4).all(), last["episode_return"]
    assert returns.mean() > 1.33, returns
