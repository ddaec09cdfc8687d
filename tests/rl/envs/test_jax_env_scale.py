"""Populations and several devices on each JAX env library's source, through the runner code gymnax runs use:
a DQN population trains its members apart, each on its own envs (the library's env state stacked per row); a
4-device run (envs, buffer rows and batch split over the data devices, in a subprocess with forced CPU devices,
tests/multidevice/train_run.py) ends where the 1-device run does. Slow tier (xminigrid's pair: 51 s cold): the
default suite runs populations and several devices on gymnax (tests/rl/learning/test_population.py,
tests/rl/infra/test_sharding.py) and each library's source in a DQN smoke run (its own test file)."""

from __future__ import annotations

import contextlib

import jax
import numpy as np
import pytest

from agents.experiment import run
from agents.setup import compose
from tests.rl.envs.jax_env_runs import TINY, unoptimised
from tests.rl.infra.test_sharding import TRAIN, _env, _run_all

pytestmark = pytest.mark.slow

# library -> (its module, the env overrides of its smoke run, compiled unoptimised): navix's reset takes over 15
# minutes to compile with XLA's defaults and the suite's classic emitters (tests/rl/envs/test_navix_source.py).
SOURCES = {
    "xminigrid": ("xminigrid", ["env=xminigrid/empty_5x5", "+env.params.max_steps=20"], False),
    "navix": ("navix", ["env=navix/empty_5x5", "env.max_steps=20"], True),
    "craftax": ("craftax", ["env=craftax/classic_symbolic", "+env.params.max_timesteps=20"], False),
    "popgym_arcade": ("popgym_arcade", ["env=popgym_arcade/count_recall_easy"], False),
}


@pytest.fixture(params=list(SOURCES))
def source(request):
    """(name, env overrides) of one library, compiled as SOURCES says (here and in the processes started)."""
    module, env, slow_to_compile = SOURCES[request.param]
    pytest.importorskip(module)
    with unoptimised() if slow_to_compile else contextlib.nullcontext():
        yield request.param, env


def test_a_population_trains_its_members_apart(tmp_path, source):
    """`population.agent.optim.lr=[1e-3,3e-3]` x 2 seeds: 4 rows (member-major), each holding its learning rate,
    its own 4 envs (the env states of the two seeds part; members share a seed's env draws) and trained
    parameters; members' parameters part, and every member evaluates greedily."""
    _, env = source
    pop = run(compose([*TINY["dqn"], *env, "logger=none", "seeds=2", "num_envs=4", "total_steps=256",
                       "log_interval=128", "eval_episodes=2", "checkpoint.enabled=false",
                       "population.agent.optim.lr=[1e-3,3e-3]"]), tmp_path)
    state = pop["state"][0]
    np.testing.assert_array_equal(np.asarray(state.agent.hparams["optim.lr"]), np.float32([1e-3] * 2 + [3e-3] * 2))
    assert np.all(np.asarray(state.agent.agent.updates) > 0)
    rows = [np.asarray(x) for x in jax.tree_util.tree_leaves(state.env)
            if np.ndim(x) >= 2 and np.shape(x)[:2] == (4, 4) and np.issubdtype(np.asarray(x).dtype, np.number)]
    assert rows and any(not np.array_equal(x[0], x[1]) for x in rows)  # [rows, envs, ...]: seeds 0 and 1
    params = jax.tree_util.tree_leaves(state.agent.agent.params)
    assert not all(np.allclose(p[0], p[2]) for p in params)
    assert len(pop["members"]) == 2
    assert all(np.asarray(m["eval_returns"]).shape == (2, 2) and np.isfinite(m["eval_returns"]).all()
               for m in pop["members"])


def test_four_devices_match_one_device(tmp_path, source):
    """DQN, 2 seeds of 4 envs, on 1 device and on 4 data devices, same global batch: same params and greedy
    returns; the env state and the buffer rows are split over the data devices."""
    _, env = source
    common = [*TINY["dqn"], *env, "logger=none", "seeds=2", "num_envs=4", "total_steps=256", "log_interval=128",
              "eval_episodes=2", "agent.epsilon_decay_steps=128"]
    jobs = {name: ([str(tmp_path / f"{name}.json"), str(tmp_path / name), *common], _env(n))
            for name, n in (("one", 1), ("data4", 4))}
    r = _run_all(jobs, tmp_path, script=TRAIN, out_arg=0, timeout=1200)
    one, four = r["one"], r["data4"]
    assert (one["devices"], four["devices"]) == (1, 4)
    assert "P('seed', 'data')" in four["specs"]["env"] and "P('seed', 'data')" in four["specs"]["buffer"]
    assert all("data" not in spec for spec in four["specs"]["agent"])
    for a, b in zip(four["params"], one["params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert four["eval_returns"] == one["eval_returns"]
    header, *rows = [line.split(",") for line in one["metrics_csv"].splitlines()]
    assert any(row[header.index("train/loss")] for row in rows)  # updates happened
