"""rl/learning/population.py through agents/experiment.py: a DQN population in one program equals its separate runs,
refuses what it cannot vary with one line, reports per member and resumes bit for bit."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from agents import agent_config
from agents.dqn import POPULATION_KEYS
from agents.experiment import build, load_policy, run
from agents.setup import compose
from rl.config import ConfigError
from rl.learning.population import MemberState, grid, members
from scripts import plot
from tests.conftest import TINY_DQN

COVERS = {"train.population": ["test_a_member_equals_its_separate_run", "test_refused_population_keys",
                               "test_reports_like_a_multirun"]}

GRID = ("population.agent.optim.lr=[1e-3,3e-3]", "population.agent.discount=[0.9,0.99]")
COMMON = ("seeds=2", "total_steps=800")


def _leaves(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def _rows(path, **match):
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if all(r[k] == v for k, v in match.items())]


def test_grid_order_is_hydras():
    assert grid({"a": [1, 2], "b": [3, 4]}) == [{"a": 1, "b": 3}, {"a": 1, "b": 4}, {"a": 2, "b": 3},
                                                {"a": 2, "b": 4}]


@pytest.fixture(scope="module")
def population(tmp_path_factory):
    out = tmp_path_factory.mktemp("population")
    return run(compose([*TINY_DQN, *COMMON, *GRID]), out), out


@pytest.mark.optimized  # traced and constant hyperparameters compared bit for bit
def test_a_member_equals_its_separate_run(population, tmp_path):
    """Member 3 (lr 3e-3, discount 0.99), seeds 0 and 1 == the run `agent.optim.lr=3e-3 agent.discount=0.99
    seeds=2`: every leaf of its agent and buffer state, its metrics and greedy returns. Member 2 differs from
    it only by the discount, so the traced discount is not ignored."""
    result, out = population
    alone = run(compose([*TINY_DQN, *COMMON, "agent.optim.lr=3e-3", "agent.discount=0.99"]), tmp_path)
    state, single = result["state"][0], alone["state"][0]
    assert isinstance(state.agent, MemberState)
    member = jax.tree_util.tree_map(lambda x: x[6:8], (state.agent.agent, state.buffer, state.key))
    for x, y in zip(_leaves(member), _leaves((single.agent, single.buffer, single.key)), strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(np.asarray(state.agent.hparams["discount"]), np.float32([.9, .9, .99, .99] * 2))
    assert result["members"][3]["eval_returns"] == alone["eval_returns"]
    drop = ("member", "agent.optim.lr", "agent.discount")
    ours = [{k: v for k, v in r.items() if k not in drop} for r in _rows(out / "metrics.csv", member="3")]
    assert ours == _rows(tmp_path / "metrics.csv")
    other = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x: x[4:6], state.agent.agent.params))
    assert not all(np.array_equal(a, b) for a, b in zip(other, jax.tree_util.tree_leaves(single.agent.params)))


def test_reports_like_a_multirun(population):
    """metrics.csv: a row per log, member and seed with the member's overrides; summary.csv: one row per
    member with its overrides and final/greedy returns over its seeds; `result["members"]` the same."""
    result, out = population
    rows = _rows(out / "metrics.csv")
    assert list(rows[0])[:5] == ["env_steps", "member", "agent.optim.lr", "agent.discount", "seed"]
    assert {(r["member"], r["agent.optim.lr"], r["agent.discount"], r["seed"]) for r in rows} == {
        (str(m), lr, d, str(s)) for m, (lr, d) in enumerate([("0.001", "0.9"), ("0.001", "0.99"), ("0.003", "0.9"),
                                                              ("0.003", "0.99")]) for s in (0, 1)}
    summary = _rows(out / "summary.csv")
    assert [(r["member"], r["agent.optim.lr"], r["agent.discount"]) for r in summary] == [
        ("0", "0.001", "0.9"), ("1", "0.001", "0.99"), ("2", "0.003", "0.9"), ("3", "0.003", "0.99")]
    evals = np.asarray(result["eval_returns"]).reshape(4, 2, -1)
    for m, row in enumerate(summary):
        assert float(row["eval_return"]) == pytest.approx(evals[m].mean(axis=1).mean())
        last = [float(r["episode_return"]) for r in rows if r["member"] == str(m) and r["env_steps"] == "800"]
        assert float(row["final_return"]) == pytest.approx(np.mean(last))
        assert result["members"][m]["overrides"] == {"agent.optim.lr": [1e-3, 1e-3, 3e-3, 3e-3][m],
                                                     "agent.discount": [0.9, 0.99, 0.9, 0.99][m]}
        assert result["members"][m]["eval_return"] == pytest.approx(float(row["eval_return"]))
        assert result["members"][m]["eval_returns"] == evals[m].tolist()
        assert result["members"][m]["episode_return"] == pytest.approx(last)  # its seeds' final rows, in order
    groups = plot.collect_curves(out, "episode_return")  # scripts.plot: one curve per member, over its seeds
    assert sorted(groups) == [f"agent.optim.lr={lr} agent.discount={d}" for lr in ("0.001", "0.003")
                              for d in ("0.9", "0.99")] and all(len(c) == 2 for c in groups.values())
    policy = load_policy(out, seed=7)  # a row: member 3, seed 1
    for x, y in zip(_leaves(policy.params), _leaves(jax.tree_util.tree_map(lambda x: x[7],
                                                                          result["state"][0].agent.params))):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow  # three population runs; the fast tier resumes a PBT population bit for bit (test_pbt.py)
def test_resume_is_bit_exact(tmp_path):
    """A population stopped at N steps and resumed to 2N == the straight 2N run, every leaf."""
    tiny = [o for o in TINY_DQN if not o.startswith("agent.optim.lr=")]  # agent.lr (the alias) sets optim.lr
    common = (*tiny, "seeds=1", "log_interval=400", "population.agent.lr=[1e-3,3e-3]")
    straight = run(compose([*common, "total_steps=1600"]), tmp_path / "straight")
    run(compose([*common, "total_steps=800"]), tmp_path / "first")
    resumed = run(compose([*common, "total_steps=1600", f"resume={tmp_path / 'first'}"]), tmp_path / "unused")
    for x, y in zip(_leaves(straight["state"]), _leaves(resumed["state"]), strict=True):
        np.testing.assert_array_equal(x, y)
    assert [m["overrides"] for m in straight["members"]] == [{"agent.lr": 1e-3}, {"agent.lr": 3e-3}]
    assert straight["eval_returns"] == resumed["eval_returns"]
    assert (tmp_path / "straight" / "metrics.csv").read_text() == (tmp_path / "first" / "metrics.csv").read_text()
    assert (tmp_path / "straight" / "summary.csv").read_text() == (tmp_path / "first" / "summary.csv").read_text()
    with pytest.raises(ConfigError, match=r"cannot resume: population.agent.lr differ"):
        run(compose([*common[:-1], "population.agent.lr=[1e-3,1e-2]", f"resume={tmp_path / 'first'}"]), tmp_path)


# A value of every DQN population key away from TINY_DQN's (prioritised replay and the Huber loss, so that the
# importance exponent and huber_delta count).
EVERY_KEY = {"optim.lr": 3e-3, "discount": 0.95, "tau": 0.5, "huber_delta": 0.5, "epsilon_start": 0.9,
             "epsilon_end": 0.2, "epsilon_decay_steps": 500, "importance_exponent": 0.7}


@pytest.mark.optimized  # traced and constant hyperparameters compared bit for bit
def test_every_population_key_is_traced(tmp_path):
    """A one-member population setting every key of `POPULATION_KEYS` == the run with those keys set (a key
    the agent ignored in favour of its config would differ)."""
    assert set(EVERY_KEY) == set(POPULATION_KEYS)
    common = (*TINY_DQN, "seeds=1", "total_steps=800", "agent.priority_exponent=0.6", "agent.loss=huber")
    pop = run(compose([*common, *(f"population.agent.{k}=[{v}]" for k, v in EVERY_KEY.items())]), tmp_path / "p")
    alone = run(compose([*common, *(f"agent.{k}={v}" for k, v in EVERY_KEY.items())]), tmp_path / "alone")
    for x, y in zip(_leaves(pop["state"][0].agent.agent), _leaves(alone["state"][0].agent), strict=True):
        np.testing.assert_array_equal(x, y)  # bit-exact on CPU (traced and constant arithmetic agree)
    assert pop["eval_returns"] == alone["eval_returns"]


def test_the_docs_list_dqns_population_keys():
    readme = (Path(__file__).resolve().parents[3] / "docs" / "scaling.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| DQN | `optim.lr`"))
    assert re.findall(r"`([\w.]+)`", row.split("|")[2]) == ["optim.lr", "lr", *POPULATION_KEYS[1:]]


@pytest.mark.parametrize("overrides, message", [
    (["population.agent.batch_size=[16,32]"],
     ("population.agent.batch_size: agent.batch_size changes shapes or control flow, so it cannot vary inside one "
      "program; sweep it with hydra -m")),
    (["population.agent.network.hidden_sizes=[[8],[16]]"],
     "population.agent.network.hidden_sizes: agent.network.hidden_sizes changes shapes or control flow"),
    (["population.agent.foo=[1,2]"], "population.agent.foo: agent dqn has no key 'foo'"),
    (["population.num_envs=[4,8]"], "population.num_envs: only agent hyperparameters form a population"),
    (["population.agent.discount=0.9"], "population.agent.discount must be a non-empty list of values"),
    (["population.agent.discount=[0.9,1.5]"], "population member agent.discount=1.5: "),
    (["agent.optim.lr=1e-3", "population.agent.lr=[1e-3,3e-3]"],
     "population.agent.lr: the members' agent.optim.lr does not follow it"),
    (["env=envpool/cartpole", "population.agent.lr=[1e-3,3e-3]"],
     "population: the envpool (Sebulba) runner trains one setting per run"),
])
def test_refused_population_keys(overrides, message):
    with pytest.raises(ConfigError) as e:
        build(compose([*TINY_DQN, *overrides]))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_an_agent_without_population_keys_refuses():
    cfg = agent_config(compose(["agent=r2d2", "env=cartpole"]).agent)
    with pytest.raises(ValueError, match="population.agent.discount: agent r2d2 has no population keys yet; sweep"):
        members({"agent": {"discount": [0.99, 0.997]}}, cfg, (), lambda m: cfg)


def _cli(*args: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[3]
    return subprocess.run([sys.executable, "-m", "scripts.train", *args], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(root)), timeout=300, check=False)


def test_the_command_line_refuses_in_one_line(tmp_path):
    proc = _cli(*TINY_DQN, "population.agent.n_step=[1,3]", f"hydra.run.dir={tmp_path / 'refused'}")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        ("config error: population.agent.n_step: agent.n_step changes shapes or control flow, so it cannot vary inside "
        "one program; sweep it with hydra -m (agent.n_step=<v1>,<v2>); population keys of dqn: optim.lr, discount, "
        "tau, huber_delta, epsilon_start, epsilon_end, epsilon_decay_steps, importance_exponent")]
    assert not (tmp_path / "refused").exists()
