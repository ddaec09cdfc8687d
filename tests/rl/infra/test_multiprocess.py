"""Several processes (jax.distributed: 2 local processes x 2 CPU devices, gloo collectives) on the Anakin
runner: one run dir (process 0's), one metrics.csv; a SIGTERM to one process stops both after the same call
with one checkpoint; resuming with 2 processes equals the uninterrupted 2-process run bit for bit; resuming
with 1 process is refused by name. Every process runs under a watchdog: one left waiting in a collective
fails the test, naming the stage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

from rl.config import compose
from rl.experiment import build
from rl.infra import checkpoint
from tests.conftest import TINY_DQN
from tests.rl.infra.test_sharding import _free_port

ROOT = Path(__file__).resolve().parents[3]
RUN = [*TINY_DQN, "seeds=2", "total_steps=800", "log_interval=100", "eval_episodes=0"]
WATCHDOG_S = 300


def _env(port: int, process: int) -> dict:
    return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
                PYTHONPATH=str(ROOT), WANDB_MODE="disabled", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
                JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(process))


def _start(run_dirs: list[Path], *overrides: str) -> list[subprocess.Popen]:
    port = _free_port()
    return [subprocess.Popen([sys.executable, "-m", "scripts.train", *overrides, "distributed=env",
                              f"hydra.run.dir={d}"], cwd=ROOT, env=_env(port, i), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for i, d in enumerate(run_dirs)]


def _finish(procs: list[subprocess.Popen], stage: str) -> list[tuple[int, str]]:
    deadline = time.monotonic() + WATCHDOG_S
    out = []
    for i, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{stage}: process {i} still running after {WATCHDOG_S} s (a collective waiting?)")
        out.append((p.returncode, text))
    return out


def _leaves(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def test_two_processes_stop_together_resume_bit_exact_and_refuse_one(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    straight = _start([tmp_path / "straight", tmp_path / "straight1"], *RUN)
    for code, text in _finish(straight, "uninterrupted run"):
        assert code == 0, text[-3000:]
    assert not (tmp_path / "straight1" / "metrics.csv").exists()  # process 1 logged into process 0's run dir
    assert (tmp_path / "straight" / "train.1.log").exists()

    procs = _start([run, other], *RUN)
    t0 = time.monotonic()
    metrics = run / "metrics.csv"
    while time.monotonic() - t0 < WATCHDOG_S and procs[1].poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) > 2:
            procs[1].send_signal(signal.SIGTERM)  # one process only: both must stop after the same call
            break
        time.sleep(0.05)
    for code, text in _finish(procs, "SIGTERM to process 1"):
        assert code == 128 + signal.SIGTERM, text[-3000:]
    step = checkpoint.latest_step(run)
    assert step is not None and 0 < step < 800
    assert checkpoint.read_meta(run)["process_count"] == 2

    alone = subprocess.run([sys.executable, "-m", "scripts.train", f"resume={run}"], check=False, cwd=ROOT,
                           timeout=WATCHDOG_S,
                           env=dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled", JAX_PLATFORMS="cpu"),
                           capture_output=True, text=True)
    assert alone.returncode != 0 and "resume it with 2" in alone.stdout + alone.stderr, alone.stdout + alone.stderr
    assert checkpoint.latest_step(run) == step

    for code, text in _finish(_start([run, other], f"resume={run}"), "resume with 2 processes"):
        assert code == 0, text[-3000:]
    assert checkpoint.latest_step(run) == 800
    target = build(compose(RUN)).restore_target()
    resumed = checkpoint.restore(run, target)[0]
    uninterrupted = checkpoint.restore(tmp_path / "straight", target)[0]
    for x, y in zip(_leaves(uninterrupted), _leaves(resumed)):
        np.testing.assert_array_equal(x, y)
    assert metrics.read_text() == (tmp_path / "straight" / "metrics.csv").read_text()
