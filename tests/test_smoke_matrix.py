"""The smoke matrix: every agent x preset (paper-sized, small) x source (gymnax CartPole, envpool CartPole) x
seeds (1 and 2 where the source vmaps seeds) builds, initialises, runs >= 2 train steps, checkpoints,
resumes with `resume=<dir>` and evaluates (tests/smoke_case.py). The cases of one agent config run in one
subprocess with a watchdog, so a hang fails with the case and stage named instead of stalling the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGENTS = [f"{name}_{preset}" for name in ("dqn", "r2d2", "muesli") for preset in ("paper", "small")]
SOURCES = ("gymnax:1", "gymnax:2", "envpool:1")  # source:seeds (envpool runs one seed per process)
WATCHDOG_S = 420


@pytest.mark.parametrize("agent", AGENTS)
def test_agent_on_every_source(agent, tmp_path):
    cmd = [sys.executable, "-m", "tests.smoke_case", agent, str(tmp_path), *SOURCES]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=WATCHDOG_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stage = [line for line in out.splitlines() if line.startswith("CASE")][-1:] or ["before building"]
        pytest.fail(f"{agent} hung (> {WATCHDOG_S} s) at: {stage[0]}")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
