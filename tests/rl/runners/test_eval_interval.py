"""Greedy evaluation during training (`eval_interval`): when it runs, what it logs, and the curve it draws."""

from __future__ import annotations

import csv

import numpy as np

from agents import experiment
from rl.runners.anakin import Anakin
from tests.conftest import TINY_DQN

COVERS = {"train.eval_interval": "test_eval_interval_logs_the_greedy_return_at_its_multiples",
          "train.eval_episodes": "test_eval_interval_logs_the_greedy_return_at_its_multiples"}


def test_eval_interval_logs_the_greedy_return_at_its_multiples(tmp_path, monkeypatch):
    """With log_interval 200 and eval_interval 400 over 1000 steps, the runner's greedy evaluation runs after
    the chunks ending at 400 and 800 only, with eval_episodes episodes, the state trained so far and keys that
    differ per evaluation; metrics.csv holds each seed's mean of the returned episodes, and the learning curve
    is drawn."""
    calls = []
    real = Anakin.evaluate

    def recording(self, state, episodes, key):
        returns = real(self, state, episodes, key)
        calls.append((int(np.asarray(state[0].agent.updates)[0]), episodes, np.asarray(key).tolist(), returns))
        return returns

    monkeypatch.setattr(Anakin, "evaluate", recording)
    experiment.train(*TINY_DQN, "total_steps=1000", "seeds=2", "eval_interval=400", "eval_episodes=3", run_dir=tmp_path)
    assert [c[1] for c in calls] == [3, 3, 3]  # at 400, at 800, the final one
    assert 0 < calls[0][0] < calls[1][0]  # the state trained so far (updates grow)
    assert calls[0][2] != calls[1][2]
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    logged = {(int(r["env_steps"]), int(r["seed"])): r["eval_return"] for r in rows}
    assert sorted(k for k, v in logged.items() if v) == [(400, 0), (400, 1), (800, 0), (800, 1)]
    for (steps, seed), value in logged.items():
        if value:
            returns = calls[0 if steps == 400 else 1][3]
            assert np.isclose(float(value), np.mean(returns[seed]))
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


def test_eval_interval_null_is_a_tenth_of_the_run_where_evaluation_is_cheap_and_off_elsewhere():
    """The default (`eval_interval: null`): every tenth of the run on Anakin (greedy episodes vmapped in jit),
    never on Sebulba (a fresh envpool per evaluation); `eval_episodes=0` turns it off; a number wins."""
    from agents.experiment import validate
    from agents.setup import compose
    from rl.runners.loop import eval_interval
    from rl.runners.sebulba import Sebulba

    def typed(*overrides):
        return validate(compose([*TINY_DQN, *overrides]))

    cfg = typed()
    assert cfg.eval_interval is None
    assert eval_interval(cfg, Anakin, 500000) == 50000
    assert eval_interval(cfg, Sebulba, 500000) == 0
    assert eval_interval(typed("eval_episodes=0"), Anakin, 500000) == 0
    assert eval_interval(typed("eval_interval=0"), Anakin, 500000) == 0
    assert eval_interval(typed("eval_interval=7"), Sebulba, 500000) == 7
