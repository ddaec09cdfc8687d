"""The entry points a newcomer uses: `from rl import train, evaluate_run` (same result as the CLI), config
errors printed as one message without a traceback (exit 1), unused `+key=value` overrides refused by name,
and a warning when total_steps leaves no room for a train step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rl
from rl.config import ConfigError, compose
from rl.experiment import validate
from tests.conftest import TINY_DQN

ROOT = Path(__file__).resolve().parents[1]


def test_python_entry_point_trains_and_evaluates(tmp_path):
    result = rl.train(*TINY_DQN, "total_steps=800", run_dir=tmp_path)
    assert result["env_steps"] == 800 and result["run_dir"] == str(tmp_path)
    assert {"eval_returns", "episode_return", "checkpoint", "state"} <= set(result)
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "summary.json").exists()
    returns = rl.evaluate_run(tmp_path, episodes=3)
    assert returns.shape == (1, 3) and np.all(returns >= 1)


@pytest.mark.parametrize("override,key", [("+foo=1", "'foo' not in 'TrainConfig'"),
                                          ("+logger.colour=red", "'colour' not in 'LoggerConfig'"),
                                          ("+agent.zzz=2", "'zzz' not in 'Config'")])
def test_unused_plus_overrides_are_refused_by_name(override, key):
    with pytest.raises(ConfigError, match=key):
        validate(compose([override]))


def test_config_error_prints_one_message_without_traceback(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "scripts.train", "agent=dqn", "agent.optim.lr=-1", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "config error: bad config in `agent`: optim.lr must be > 0, got -1" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env={**env, "HYDRA_FULL_ERROR": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr  # hydra's convention for the full trace


def test_warns_when_no_train_step_will_run(tmp_path, capsys):
    rl.train(*TINY_DQN, "total_steps=80", "agent.learning_starts=100", "eval_episodes=0", run_dir=tmp_path)
    out = capsys.readouterr().out
    assert "total_steps=80 < the agent's learning_starts=100: no train step will run" in out
