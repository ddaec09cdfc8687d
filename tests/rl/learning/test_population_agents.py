"""R2D2 and Muesli populations (rl/learning/population.py): with every population key set, the members train
apart holding their values, and (slow tier) a member equals its separate run; shape keys are refused with one
line, and the README lists each agent's keys (DQN's: tests/rl/learning/test_population.py)."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

from agents import population_keys
from agents.experiment import build, run
from agents.setup import compose
from buffers.packing import PackedStorage
from rl.config import ConfigError

COVERS = {"train.population": ["test_a_member_equals_its_separate_run", "test_a_population_trains_its_members_apart",
                               "test_refused_shape_keys"]}

# Small sequence agents on CartPole (tests/rl/infra/test_sharding.py's): 20 iterations, 16 train steps.
TINY = {
    "r2d2": ["agent=r2d2_small", "agent.sequence_length=8", "agent.burn_in=2", "agent.period=4", "agent.batch_size=8",
             "agent.buffer_size=256", "agent.learning_starts=64", "agent.train_interval=4", "agent.lstm_size=16",
             "agent.network.hidden_sizes=[16]", "agent.network.head_hidden=[16]"],
    "muesli": ["agent=muesli_small", "agent.sequence_length=6", "agent.batch_size=8", "agent.buffer_size=256",
               "agent.learning_starts=64", "agent.train_interval=4", "agent.network.hidden_sizes=[16]",
               "agent.network.state_dim=16", "agent.network.model_hidden=[16]", "agent.network.head_hidden=[16]",
               "agent.num_atoms=21"],
}
COMMON = ["env=cartpole", "logger=none", "num_envs=4", "total_steps=320", "log_interval=160", "eval_episodes=2",
          "seeds=2", "checkpoint.enabled=false"]
# A value of every population key but the learning rate, away from the config's.
EVERY_KEY = {
    "r2d2": {"discount": 0.95, "importance_exponent": 0.3, "priority_eta": 0.5, "epsilon_base": 0.3,
             "epsilon_alpha": 3.0},
    "muesli": {"discount": 0.95, "retrace_lambda": 0.8, "target_update_rate": 0.2, "adv_var_decay": 0.9,
               "cmpo_clip": 0.5, "pg_weight": 2.0, "cmpo_weight": 0.5, "model_policy_weight": 0.7,
               "value_weight": 0.5, "reward_weight": 0.8, "dynamics_grad_scale": 0.3, "entropy_weight": 0.02,
               "entropy_end_fraction": 0.5, "prior_uniform_mix": 0.05},
}


def _leaves(tree):
    """Every array leaf (keys as their data; buffer storage unpacked into its items, so that stored floats
    compare as floats, not as the uint32 words that hold them)."""
    unpacked = jax.tree_util.tree_map(lambda x: (x.data, x.replace(storage=())) if isinstance(x, PackedStorage) else x,
                                      tree, is_leaf=lambda x: isinstance(x, PackedStorage))
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(unpacked)]


def _population(agent: str, out):
    """The population of `optim.lr=[1e-3,3e-3]` x every other population key at one value (EVERY_KEY)."""
    keys = EVERY_KEY[agent]
    assert {"optim.lr", *keys} == set(population_keys(agent))
    return run(compose([*TINY[agent], *COMMON, "population.agent.optim.lr=[1e-3,3e-3]",
                        *(f"population.agent.{k}=[{v}]" for k, v in keys.items())]), out)


@pytest.mark.parametrize("agent", ["r2d2", "muesli"])
def test_a_population_trains_its_members_apart(agent, tmp_path):
    """The fast twin of the next test (its population run alone): every row holds its member's values of
    every population key, the members' parameters part (the traced learning rate is not ignored) and every
    member trains and evaluates."""
    pop = _population(agent, tmp_path)
    state = pop["state"][0]  # rows: member-major, 2 seeds each
    np.testing.assert_array_equal(np.asarray(state.agent.hparams["optim.lr"]), np.float32([1e-3] * 2 + [3e-3] * 2))
    for key, value in EVERY_KEY[agent].items():
        np.testing.assert_array_equal(np.asarray(state.agent.hparams[key]), np.float32([value] * 4), err_msg=key)
    assert np.all(np.asarray(state.agent.agent.updates) > 0)
    params = jax.tree_util.tree_leaves(state.agent.agent.params)
    assert not all(np.allclose(p[0], p[2]) for p in params)
    assert all(np.isfinite(m["eval_returns"]).all() for m in pop["members"])


@pytest.mark.slow  # two runs of each sequence agent; the fast twin above runs the population alone
@pytest.mark.parametrize("agent", ["r2d2", "muesli"])
def test_a_member_equals_its_separate_run(agent, tmp_path):
    """Member 1 of `optim.lr=[1e-3,3e-3]` x every other population key at one value == the run with those
    values (seeds 0 and 1: every leaf of its agent and buffer state, its greedy returns); member 0 differs
    from it, so the traced learning rate is not ignored. R2D2 bit for bit; Muesli to float rounding (XLA:CPU
    sums its batched matmuls in another order for 4 rows than for 2, with or without a population)."""
    keys = EVERY_KEY[agent]
    common = [*TINY[agent], *COMMON]
    pop = _population(agent, tmp_path / "population")
    # `++`: muesli_small.yaml leaves most keys to the Config's defaults
    alone = run(compose([*common, "agent.optim.lr=3e-3", *(f"++agent.{k}={v}" for k, v in keys.items())]),
                tmp_path / "alone")
    state, single = pop["state"][0], alone["state"][0]
    member = jax.tree_util.tree_map(lambda x: x[2:4], (state.agent.agent, state.buffer, state.key))
    for x, y in zip(_leaves(member), _leaves((single.agent, single.buffer, single.key)), strict=True):
        if agent == "r2d2" or not np.issubdtype(x.dtype, np.floating):
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    assert pop["members"][1]["eval_returns"] == alone["eval_returns"]
    np.testing.assert_array_equal(np.asarray(state.agent.hparams["discount"]), np.float32([0.95] * 4))
    params = jax.tree_util.tree_leaves(state.agent.agent.params)
    assert not all(np.allclose(p[0], p[2]) for p in params)


@pytest.mark.parametrize("agent, key", [("r2d2", "sequence_length"), ("r2d2", "epsilon_decay"),
                                        ("muesli", "unroll_steps"), ("muesli", "replay_fraction")])
def test_refused_shape_keys(agent, key):
    """A key outside the agent's population keys is refused with one line saying to sweep it with -m."""
    with pytest.raises(ConfigError) as e:
        build(compose([*TINY[agent], *COMMON, f"population.agent.{key}=[1,2]"]))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"population.agent.{key}: ")
    if key != "epsilon_decay":  # a key the agent does not have
        assert "changes shapes or control flow" in message and "sweep it with hydra -m" in message


@pytest.mark.parametrize("agent, name", [("r2d2", "R2D2"), ("muesli", "Muesli")])
def test_the_docs_list_the_population_keys(agent, name):
    readme = (Path(__file__).resolve().parents[3] / "docs" / "scaling.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| {name} | `optim.lr`"))
    keys = population_keys(agent)
    assert re.findall(r"`([\w.]+)`", row.split("|")[2]) == ["optim.lr", "lr", *keys[1:]]
