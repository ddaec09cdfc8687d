"""Populations and several devices on a JAX env library's source (xminigrid's MiniGrid-Empty-5x5), through the
runner code gymnax runs use: a DQN population trains its members apart, each on its own envs (the xminigrid
TimeStep state stacked per row); a 4-device run (envs, buffer rows and batch split over the data devices, in
a subprocess with forced CPU devices, tests/multidevice/train_run.py) ends where the 1-device run does."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agents.experiment import run
from agents.setup import compose
from tests.rl.envs.jax_env_runs import TINY
from tests.rl.infra.test_sharding import TRAIN, _env, _run_all

pytest.importorskip("xminigrid")

ENV = ["env=xminigrid/empty_5x5", "+env.params.max_steps=20"]


def test_a_population_trains_on_xminigrid(tmp_path):
    """`population.agent.optim.lr=[1e-3,3e-3]` x 2 seeds: 4 rows (member-major), each holding its learning rate,
    its own 4 envs (the agents of different rows walk apart) and trained parameters; members' parameters part,
    and every member evaluates greedily."""
    pop = run(compose([*TINY["dqn"], *ENV, "logger=none", "seeds=2", "num_envs=4", "total_steps=256",
                       "log_interval=128", "eval_episodes=2", "checkpoint.enabled=false",
                       "population.agent.optim.lr=[1e-3,3e-3]"]), tmp_path)
    state = pop["state"][0]
    np.testing.assert_array_equal(np.asarray(state.agent.hparams["optim.lr"]), np.float32([1e-3] * 2 + [3e-3] * 2))
    assert np.all(np.asarray(state.agent.agent.updates) > 0)
    positions = np.asarray(state.env.state.agent.position)  # xminigrid's TimeStep: [rows, envs, 2]
    assert positions.shape == (4, 4, 2) and len({p.tobytes() for p in positions}) > 1
    params = jax.tree_util.tree_leaves(state.agent.agent.params)
    assert not all(np.allclose(p[0], p[2]) for p in params)
    assert len(pop["members"]) == 2
    assert all(np.asarray(m["eval_returns"]).shape == (2, 2) and np.isfinite(m["eval_returns"]).all()
               for m in pop["members"])


def test_four_devices_match_one_device_on_xminigrid(tmp_path):
    """DQN on Empty-5x5, 2 seeds of 4 envs, on 1 device and on 4 data devices, same global batch: same params
    and greedy returns; the xminigrid env state and the buffer rows are split over the data devices."""
    common = [*TINY["dqn"], *ENV, "logger=none", "seeds=2", "num_envs=4", "total_steps=256", "log_interval=128",
              "eval_episodes=2", "agent.epsilon_decay_steps=128"]
    jobs = {name: ([str(tmp_path / f"{name}.json"), str(tmp_path / name), *common], _env(n))
            for name, n in (("one", 1), ("data4", 4))}
    r = _run_all(jobs, tmp_path, script=TRAIN, out_arg=0)
    one, four = r["one"], r["data4"]
    assert (one["devices"], four["devices"]) == (1, 4)
    assert "P('seed', 'data')" in four["specs"]["env"] and "P('seed', 'data')" in four["specs"]["buffer"]
    assert all("data" not in spec for spec in four["specs"]["agent"])
    for a, b in zip(four["params"], one["params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert four["eval_returns"] == one["eval_returns"]
    header, *rows = [line.split(",") for line in one["metrics_csv"].splitlines()]
    assert any(row[header.index("train/loss")] for row in rows)  # updates happened
