"""The smoke matrix: every agent x preset (paper-sized, small) x source (gymnax CartPole, envpool CartPole) x
seeds (1 and 2 where the source vmaps seeds) builds, initialises, runs >= 2 train steps and checkpoints
(tests/smoke_case.py). The small presets also resume with `resume=<dir>` and evaluate, on both sources (2 vmapped
seeds on gymnax); the paper presets (the same resume and evaluation code, other option values and sizes) train on
one gymnax seed and on envpool. One gymnax seed runs the code of two (seeds are always vmapped; no branch reads
the count), so the other seed count of each preset (1 for the small presets, 2 for the paper ones, whose train
steps dominate) is the slow tier's. The cases of one agent config run in one
subprocess with a watchdog, so a hang fails with the case and stage named instead of stalling the suite; two such
subprocesses run at a time (compilation is mostly single-threaded)."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Heaviest first, so the two workers finish together (the small presets run two full cases, the paper two
# train-only ones).
AGENTS = ["muesli_small", "r2d2_small", "dqn_small", "muesli_paper", "r2d2_paper", "dqn_paper"]
# source:seeds[:train] (envpool runs one seed per process; `:train` stops after training and its checkpoint)
CASES = {"small": ("gymnax:2", "envpool:1"), "paper": ("gymnax:1:train", "envpool:1:train")}
SLOW_CASES = {"small": "gymnax:1:train", "paper": "gymnax:2:train"}
WATCHDOG_S = 600


def _run(agent: str, run_root: Path, cases: tuple[str, ...]) -> tuple[int | None, str]:
    """(return code or None on a hang, output) of one agent config's cases."""
    cmd = [sys.executable, "-m", "tests.smoke_case", agent, str(run_root), *cases]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=WATCHDOG_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out
    return proc.returncode, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """All agent configs started at once on 2 workers; each test waits for its own."""
    root = tmp_path_factory.mktemp("smoke")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        yield {agent: pool.submit(_run, agent, root / agent, CASES[agent.split("_")[-1]]) for agent in AGENTS}


def _check(agent: str, code: int | None, out: str, last: str) -> None:
    if code is None:
        stage = [line for line in out.splitlines() if line.startswith("CASE")][-1:] or ["before building"]
        pytest.fail(f"{agent} hung (> {WATCHDOG_S} s) at: {stage[0]}")
    assert code == 0 and f"CASE {agent} {last}: ok" in out, out


@pytest.mark.parametrize("agent", AGENTS)
def test_agent_on_every_source(agent, outcomes):
    _check(agent, *outcomes[agent].result(), "envpool seeds=1")


@pytest.mark.slow
@pytest.mark.parametrize("agent", AGENTS)
def test_presets_on_their_other_gymnax_seed_count(agent, tmp_path):
    case = SLOW_CASES[agent.split("_")[-1]]
    _check(agent, *_run(agent, tmp_path, (case,)), f"gymnax seeds={case.split(':')[1]}")
