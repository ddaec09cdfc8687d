"""Several processes (jax.distributed: 2 local processes x 2 CPU devices, gloo collectives) on the Anakin
runner: one run dir (process 0's), one metrics.csv; a SIGTERM to one process stops both after the same call
with one checkpoint; resuming with 1 process is refused by name; resuming with 2 processes equals the
uninterrupted 2-process run bit for bit (slow tier; the fast tier resumes 2 Sebulba processes). Every process
runs under a watchdog: one left waiting in a collective fails the test, naming the stage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from agents.experiment import build
from agents.experiment import run as train_run
from agents.setup import compose
from rl.config import ConfigError
from rl.infra import checkpoint
from tests.conftest import TINY_DQN, xla_flags
from tests.rl.infra.test_sharding import _free_port

ROOT = Path(__file__).resolve().parents[3]
RUN = [*TINY_DQN, "seeds=2", "total_steps=1600", "log_interval=100", "eval_episodes=0"]  # SIGTERM after the 1st of 16 logs
WATCHDOG_S = 300


def _env(port: int, process: int) -> dict:
    return dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_PLATFORMS="cpu",
                PYTHONPATH=str(ROOT), WANDB_MODE="disabled", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
                JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(process))


def _start(run_dirs: list[Path], *overrides: str) -> list[subprocess.Popen]:
    port = _free_port()
    return [subprocess.Popen([sys.executable, "-m", "scripts.train", *overrides, "distributed=env",
                              f"hydra.run.dir={d}"], cwd=ROOT, env=_env(port, i), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for i, d in enumerate(run_dirs)]


def _finish(procs: list[subprocess.Popen], stage: str, watchdog_s: float = WATCHDOG_S) -> list[tuple[int, str]]:
    deadline = time.monotonic() + watchdog_s
    out = []
    for i, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{stage}: process {i} still running after {watchdog_s} s (a collective waiting?)")
        out.append((p.returncode, text))
    return out


def _stop_process_1(run_dirs: list[Path], overrides: list[str], lines: int, stage: str) -> None:
    """Start 2 processes, SIGTERM process 1 alone once process 0's metrics.csv has more than `lines` lines:
    both must stop after the same call (exit 128 + 15)."""
    procs = _start(run_dirs, *overrides)
    t0 = time.monotonic()
    metrics = run_dirs[0] / "metrics.csv"
    while time.monotonic() - t0 < WATCHDOG_S and procs[1].poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) > lines:
            procs[1].send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    for code, text in _finish(procs, stage):
        assert code == 128 + signal.SIGTERM, text[-3000:]


def _refused_alone(run: Path) -> None:
    """`resume=<run>` in this one process is refused naming the process count to use, before anything is
    restored (in-process: the refusal is rl/runners/loop.py's, whichever process count JAX started with)."""
    overrides = [f"resume={run}"]
    with pytest.raises(ConfigError, match=r"checkpointed by 2 process\(es\) and is resumed by 1: resume it with 2"):
        train_run(compose(overrides), run.parent / "alone", overrides)


def _leaves(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def _stopped_anakin_run(run: Path, other: Path) -> int:
    """The env step of the checkpoint a SIGTERM to process 1 leaves in `run`, after the first log's rows."""
    _stop_process_1([run, other], RUN, 2, "SIGTERM to process 1")  # header + the first log's 2 seed rows
    step = checkpoint.latest_step(run)
    assert step is not None and 0 < step < 1600
    return step


def test_two_processes_stop_together_and_refuse_one(tmp_path):
    """Both processes log into process 0's run dir; a SIGTERM to process 1 alone stops both after the same call
    with one checkpoint, which a one-process resume refuses. (Its resume: the slow test below.)"""
    run, other = tmp_path / "run", tmp_path / "other"
    step = _stopped_anakin_run(run, other)
    assert checkpoint.read_meta(run)["process_count"] == 2
    assert (run / "train.1.log").exists() and not (other / "metrics.csv").exists()  # process 1 logged into run
    _refused_alone(run)
    assert checkpoint.latest_step(run) == step


@pytest.mark.slow
def test_two_processes_resume_bit_exact(tmp_path):
    """Stopped by a SIGTERM to process 1 and resumed with 2 processes == the uninterrupted 2-process run, every
    leaf and every metrics row. (Slow: three 2-process runs, ~3.5 min on 2 cores; the fast tier resumes 2
    processes in the Sebulba test below.)"""
    run, other = tmp_path / "run", tmp_path / "other"
    straight = _start([tmp_path / "straight", tmp_path / "straight1"], *RUN)
    for code, text in _finish(straight, "uninterrupted run"):
        assert code == 0, text[-3000:]
    _stopped_anakin_run(run, other)
    for code, text in _finish(_start([run, other], f"resume={run}"), "resume with 2 processes"):
        assert code == 0, text[-3000:]
    assert checkpoint.latest_step(run) == 1600
    target = build(compose(RUN)).restore_target()
    resumed = checkpoint.restore(run, target)[0]
    uninterrupted = checkpoint.restore(tmp_path / "straight", target)[0]
    for x, y in zip(_leaves(uninterrupted), _leaves(resumed)):
        np.testing.assert_array_equal(x, y)
    assert (run / "metrics.csv").read_text() == (tmp_path / "straight" / "metrics.csv").read_text()


SEBULBA = ["agent=dqn", "env=envpool/cartpole", "logger=none", "num_envs=8", "log_interval=1000", "eval_episodes=2",
           "agent.learning_starts=500", "agent.batch_size=16", "agent.buffer_size=2000",
           "agent.network.hidden_sizes=[16]", "total_steps=3000", "env.actor_devices=1", "env.learner_devices=1"]


def test_sebulba_two_processes_train_stop_together_and_resume(tmp_path):
    """Each process acts on its own local device over its own 8 envs (its own buffer rows), the learner is
    data-parallel over one device of each process; env steps count both processes' recvs."""
    run, other = tmp_path / "run", tmp_path / "other"
    _stop_process_1([run, other], SEBULBA, 1, "Sebulba, SIGTERM to process 1")
    metrics = run / "metrics.csv"
    step = checkpoint.latest_step(run)
    assert step is not None and 0 < step < 3072

    # What a one-process resume is refused by (rl/runners/loop.py; its refusal: the Anakin test above).
    assert checkpoint.read_meta(run)["process_count"] == 2

    for code, text in _finish(_start([run, other], f"resume={run}"), "Sebulba, resume with 2 processes"):
        assert code == 0, text[-3000:]
    rows = np.genfromtxt(metrics, delimiter=",", names=True)
    # A chunk is 128 recvs x 4 envs per process: 1024 env steps over both processes (3000 rounds up to 3072).
    np.testing.assert_array_equal(rows["env_steps"], 1024 * np.arange(1, 4))
    # Both processes' episodes are counted: ended episodes cover most of the steps (one process's envs alone
    # would give about half).
    assert np.sum(rows["episodes"] * rows["episode_length"]) > 0.75 * 3072
    assert (run / "train.1.log").exists() and not (other / "metrics.csv").exists()


UPDATE = ROOT / "tests" / "multidevice" / "sebulba_update.py"
LEARNER = ["agent=dqn", "env=envpool/cartpole", "logger=none", "agent.batch_size=16", "agent.buffer_size=64",
           "agent.network.hidden_sizes=[16]", "agent.learning_starts=0", "agent.optim.lr=1e-2"]


def test_sebulba_two_process_learner_update_equals_one_process(tmp_path):
    """5 train steps on the same global chunk (tests/multidevice/sebulba_update.py): 2 processes x 8 envs with
    the learner on one device of each == 1 process x 16 envs on one device, up to float summation order."""
    port = _free_port()
    two = [subprocess.Popen([sys.executable, str(UPDATE), str(tmp_path / "two.json"), *LEARNER, "num_envs=8",
                             "env.actor_devices=1", "env.learner_devices=1", "distributed=env"], cwd=ROOT,
                            env=_env(port, i), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
    one = subprocess.Popen([sys.executable, str(UPDATE), str(tmp_path / "one.json"), *LEARNER, "num_envs=16"],
                           cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for code, text in _finish([*two, one], "learner update"):
        assert code == 0, text[-3000:]
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "one"))
    assert len(a["params"]) == len(b["params"]) > 0
    for x, y, x0, y0 in zip(a["params"], b["params"], a["init"], b["init"]):
        np.testing.assert_array_equal(x0, y0)  # the same initial parameters
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(x, x0) for x, x0 in zip(b["params"], b["init"]))  # the steps trained
    # The chunk (split by process) is gathered once, outside every loop: the buffer writes of the K recvs
    # (the add scan) and the fori loop around the train steps hold no all-gather; before, each recv's
    # write all-gathered its ~14 fields. (Sampling inside the train step, `cond/`, still gathers rows.)
    looped = [g for g in a["all_gathers"] if "/while/body/" in g and "/cond/" not in g]
    assert a["all_gathers"] and not looped, looped

