"""The smoke matrix: every agent x preset (paper-sized, small) x source (gymnax CartPole, envpool CartPole) x
seeds (1 and 2 where the source vmaps seeds) builds, initialises, runs >= 2 train steps and checkpoints
(tests/smoke_case.py). The small presets also resume with `resume=<dir>` and evaluate, on both sources (2 vmapped
seeds on gymnax); the paper presets (the same resume and evaluation code, other option values and sizes) train on
one gymnax seed and on envpool. One gymnax seed runs the code of two (seeds are always vmapped; no branch reads
the count), so the other seed count of each preset (1 for the small presets, 2 for the paper ones, whose train
steps dominate) is the slow tier's. The agent configs run in two subprocesses at a time (compilation is mostly
single-threaded), three configs each, one after the other, under a watchdog: a hang fails with the config, case
and stage named instead of stalling the suite, and a failing config does not stop the next one."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Two groups of about equal CPU time (the small presets run two full cases, the paper two train-only ones).
GROUPS = (("muesli_small", "r2d2_paper", "dqn_paper"), ("r2d2_small", "muesli_paper", "dqn_small"))
AGENTS = [agent for group in GROUPS for agent in group]
# source:seeds[:train] (envpool runs one seed per process; `:train` stops after training and its checkpoint)
CASES = {"small": ("gymnax:2", "envpool:1"), "paper": ("gymnax:1:train", "envpool:1:train")}
SLOW_CASES = {"small": "gymnax:1:train", "paper": "gymnax:2:train"}
WATCHDOG_S = 600


def _run(run_root: Path, cases: dict[str, tuple[str, ...]]) -> tuple[int | None, str]:
    """(return code or None on a hang, output) of the agent configs' cases, in one process."""
    cmd = [sys.executable, "-m", "tests.smoke_case", str(run_root),
           *(f"{agent}={','.join(c)}" for agent, c in cases.items())]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=WATCHDOG_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out
    return proc.returncode, proc.stdout + proc.stderr[-8000:]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Both groups started at once; each test waits for its own group."""
    root = tmp_path_factory.mktemp("smoke")
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(GROUPS)) as pool:
        futures = [pool.submit(_run, root, {agent: CASES[agent.split("_")[-1]] for agent in group})
                   for group in GROUPS]
        yield {agent: future for group, future in zip(GROUPS, futures) for agent in group}


def _check(agent: str, code: int | None, out: str, last: str) -> None:
    if f"CASE {agent} {last}: ok" in out:
        return
    mine = [line for line in out.splitlines() if line.startswith((f"CASE {agent} ", f"CASE {agent}:"))]
    if code is None:
        pytest.fail(f"{agent} hung (> {WATCHDOG_S} s, its group's watchdog) at: "
                    f"{mine[-1] if mine else 'before it started'}")
    pytest.fail(f"{agent} did not finish its cases (exit status {code}); its last stage: "
                f"{mine[-1] if mine else 'none'}\n{out}")


@pytest.mark.parametrize("agent", AGENTS)
def test_agent_on_every_source(agent, outcomes):
    _check(agent, *outcomes[agent].result(), "envpool seeds=1")


@pytest.mark.slow
@pytest.mark.parametrize("agent", AGENTS)
def test_presets_on_their_other_gymnax_seed_count(agent, tmp_path):
    case = SLOW_CASES[agent.split("_")[-1]]
    _check(agent, *_run(tmp_path, {agent: (case,)}), f"gymnax seeds={case.split(':')[1]}")
