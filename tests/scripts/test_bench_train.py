"""scripts/bench_train.py runs against the current runner interface (it broke silently once when the
chunk's signature changed): a tiny DQN CartPole run of the runner and its two halves."""

from __future__ import annotations

from scripts.bench_train import PRESETS, bench_runner


def test_bench_runner_times_the_run_and_its_halves():
    overrides = ["agent=dqn", "env=cartpole", *PRESETS["dqn"], "agent.learning_starts=500", "agent.buffer_size=1000"]
    r = bench_runner(overrides, seeds=2, steps=2000, learner_steps=5, repeats=1)
    assert r["env_steps"] == 2000 and r["seeds"] == 2 and r["sps"] > 0 and len(r["return"]) == 2
    assert 0 < r["ceiling_sps"] and r["actor_sps"] > 0 and 0 <= r["buffer_share"]
