"""The command lines a user types: train (wandb offline, progress, outputs in the run dir), resume,
evaluate, and a clear error for a bad value. Each runs a few thousand env steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_DQN, assert_only_our_lines, newcomer_env

ROOT = Path(__file__).resolve().parents[2]
# TINY_DQN plus what makes it learn CartPole in ~16k env steps (greedy returns of 180-320 on seeds 0-3, where a
# random policy averages ~22 and a constant action ~9).
LEARNS = ["agent.learning_starts=500", "agent.batch_size=32", "agent.buffer_size=4000", "agent.n_step=3",
          "agent.optim.lr=3e-3", "agent.target_update_period=20", "agent.epsilon_decay_steps=2000"]
RANDOM_POLICY_RETURN = 22.0  # mean CartPole-v1 return of uniformly random actions


def _run(*args: str, check: bool = True, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=newcomer_env(), capture_output=True, text=True, check=False,
                          timeout=600)
    if check and proc.returncode != 0:
        pytest.fail(f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`python -m scripts.train` for 3000 env steps with wandb offline and the progress bar on."""
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    over = [o for o in TINY_DQN if not o.startswith("logger=")] + LEARNS
    proc = _run("scripts.train", *over, "total_steps=3000", "logger.wandb.mode=offline", "logger.progress=true",
                f"hydra.run.dir={run_dir}")
    return run_dir, proc


def test_train_writes_and_reports_outputs(trained):
    run_dir, proc = trained
    for name in ("metrics.csv", "summary.json", "learning_curve.png", "checkpoints/3000", "wandb"):
        assert (run_dir / name).exists(), name
    assert f"run dir: {run_dir}" in proc.stdout
    assert str(run_dir / "checkpoints" / "3000") in proc.stdout
    assert "sps=" in proc.stderr and "ret=" in proc.stderr  # the live progress bar
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("env_steps,seed,episode_length,episode_return") and len(rows) == 1 + 3000 // 200
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 3000 and len(summary["eval_returns"][0]) == 2
    assert list((run_dir / "wandb").glob("offline-run-*")), "wandb wrote an offline run"
    log = (run_dir / "train.log").read_text()  # the console's lines: one per logged step, the outputs
    assert log.count(" SPS (all seeds), ") == 3000 // 200 and f"run dir: {run_dir}" in log
    assert summary["run_dir"] == str(run_dir) and Path(summary["run_dir"]).is_absolute()


def test_the_console_holds_only_our_lines(trained):
    """As a newcomer runs it (wandb offline by the config, no WANDB_SILENT): stderr holds only the progress bar,
    stdout only our notes: no JAX backend INFO line, no wandb banner or sync hint, no font-cache note."""
    assert_only_our_lines(trained[1], "dqn/CartPole-v1:")


def test_resume_then_evaluate(trained, tmp_path):
    """Resume the 3000-step run to 3400 steps in its own run dir, then `scripts.evaluate` the checkpoint: the
    greedy returns of the run's one seed, as JSON. (That they show learning: the slow test below.)"""
    run_dir, _ = trained
    over = [o for o in TINY_DQN if not o.startswith("logger=")] + LEARNS
    proc = _run("scripts.train", *over, "total_steps=3400", "logger=none", f"resume={run_dir}",
                f"hydra.run.dir={tmp_path / 'resumed'}")
    assert f"resumed from {run_dir} at env step 3000" in proc.stdout + proc.stderr
    # The resumed run continues in its own run dir (hydra's new dir is not used for outputs).
    assert (run_dir / "checkpoints" / "3400").is_dir() and not (tmp_path / "resumed" / "checkpoints").exists()
    assert not (tmp_path / "resumed").exists()  # hydra's new run dir held nothing of the run: removed
    assert "resumed from" in (run_dir / "train.log").read_text()  # the resumed run's log continues there
    proc = _run("scripts.evaluate", str(run_dir), "--episodes", "3", "--json")
    returns = json.loads(proc.stdout.strip().splitlines()[-1])["returns"]
    assert len(returns) == 1 and len(returns[0]) == 3 and min(returns[0]) >= 1, returns


@pytest.mark.slow  # 13k env steps of learning
def test_resumed_run_evaluates_as_a_learned_policy(trained, tmp_path):
    """Resume the run to 16000 steps, then `scripts.evaluate` it: the greedy policy has learned, i.e. its mean
    return is far above a random policy's (~22), which a broken resume (fresh params), a broken evaluation
    (wrong params, random actions) or a learner that does not learn would all fail."""
    run_dir, _ = trained
    over = [o for o in TINY_DQN if not o.startswith("logger=")] + LEARNS
    _run("scripts.train", *over, "total_steps=16000", "logger=none", f"resume={run_dir}",
         f"hydra.run.dir={tmp_path / 'resumed'}")
    assert (run_dir / "checkpoints" / "16000").is_dir()
    proc = _run("scripts.evaluate", str(run_dir), "--episodes", "5", "--json")
    returns = json.loads(proc.stdout.strip().splitlines()[-1])["returns"]
    assert len(returns) == 1 and len(returns[0]) == 5
    assert sum(returns[0]) / 5 >= 3.5 * RANDOM_POLICY_RETURN, returns


def test_bad_value_is_a_clear_error(tmp_path):
    proc = _run("scripts.train", "agent.loss=l1", "logger=none", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert "agent.loss must be one of" in proc.stderr
    assert "jax" not in proc.stderr.lower().split("agent.loss")[0][-2000:]  # failed before building anything


def _one_line_error(proc: subprocess.CompletedProcess, start: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "Warning" not in ln and "warn(" not in ln]
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith(start), proc.stderr[-2000:]
    return lines[0]


def test_runtime_input_errors_are_one_line_and_leave_no_run_dir(tmp_path):
    """A resume of a dir without a checkpoint and an env config name that does not exist: one line each
    naming what to change, exit 1, and hydra's run dir is not left behind empty."""
    proc = _run("scripts.train", "env=envpool/typo", f"hydra.run.dir={tmp_path / 'b'}", check=False)
    line = _one_line_error(proc, "config error: env=envpool/typo")
    assert "envpool/pong" in line and "env.id=" in line  # the envpool configs and the way to any other task
    assert not (tmp_path / "b").exists()
    (tmp_path / "c").mkdir()  # hydra's default run dir, outputs/<date>/<time>: removed, and its <date> dir too
    proc = _run("scripts.train", "resume=/nonexistent", "logger=none", check=False, cwd=tmp_path / "c")
    assert "no checkpoint found in /nonexistent" in _one_line_error(proc, "error: ")
    assert [p.name for p in (tmp_path / "c").rglob("*")] == ["outputs"]
    proc = _run("scripts.evaluate", str(tmp_path), check=False)
    assert "no checkpoint found" in _one_line_error(proc, "evaluate: ")
