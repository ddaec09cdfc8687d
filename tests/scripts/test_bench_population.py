"""scripts/bench_population.py: its two command lines train the same members (fast: they compose and build), and
on a tiny run the population's results equal the multirun's (slow: three processes)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from agents.experiment import build
from agents.setup import compose
from scripts.bench_population import commands, main

TINY = ["num_envs=4", "agent.learning_starts=100", "agent.batch_size=16", "agent.buffer_size=400",
        "agent.network.hidden_sizes=[16]", "eval_episodes=2", "log_interval=200"]


def test_both_commands_train_the_same_members(tmp_path):
    population, multirun = commands(["1e-4", "3e-4"], ["0.99", "0.995"], 1000, 2, tmp_path, TINY)
    runner = build(compose([a for a in population if not a.startswith("hydra.")]))
    assert [sorted(m.items()) for m in runner.agent.overrides] == [
        [("agent.discount", d), ("agent.optim.lr", lr)] for lr, d in itertools.product([1e-4, 3e-4], [0.99, 0.995])]
    sweep = [a for a in multirun if a != "-m" and not a.startswith("hydra.")]
    values = [a.split("=", 1) for a in sweep]
    for combo in itertools.product(*[v.split(",") if k.startswith("agent.") else [v] for k, v in values]):
        cfg = compose([f"{k}={v}" for (k, _), v in zip(values, combo)])
        assert cfg.total_steps == 1000 and cfg.num_envs == 4 and not cfg.population
    assert "hydra.launcher.n_jobs=2" in multirun and f"hydra.run.dir={Path(tmp_path) / 'population'}" in population


@pytest.mark.slow
def test_tiny_benchmark_gives_the_same_results(tmp_path):
    result = main(["--total-steps", "400", "--lrs", "1e-3,3e-3", "--discounts", "0.99", "--out", str(tmp_path), *TINY])
    assert result["members"] == 2 and result["same_results"] and result["speedup"] > 0
