"""Sebulba over several devices and actor threads, on CPU devices forced by
`XLA_FLAGS=--xla_force_host_platform_device_count=4` in a subprocess (tests/multidevice/sebulba_run.py):
the learner update on a 2-device mesh equals the 1-device update; 2 actor threads on 2 actor devices with
a 2-device learner train DQN on envpool CartPole end to end; slow: that setup learns CartPole (>= 475)."""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import xla_flags

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "multidevice" / "sebulba_run.py"
SPLIT = ("env.actor_threads=2", "env.actor_devices=2", "env.learner_devices=2")


def run_script(tmp_path, *args, devices=4, timeout=900):
    out = tmp_path / "out.json"
    env = {**os.environ, "XLA_FLAGS": xla_flags(devices),
           "JAX_PLATFORMS": "cpu", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), args[0], str(out), *map(str, args[1:])], check=False,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_learner_update_on_two_devices_equals_one_device(tmp_path):
    r = run_script(tmp_path, "learner")
    assert r["devices"] == 4
    assert r["updates"] == [3, 3]  # three train steps ran on both
    assert r["all_reduce"] == [False, True]  # the 2-device program averages gradients over devices
    assert "P('data'" in r["buffer_shardings"][0]  # buffer rows split over the learner devices
    for a, b in zip(r["one"], r["two"]):
        np.testing.assert_allclose(np.array(b), np.array(a), rtol=1e-5, atol=1e-6)


def test_two_actor_threads_two_actor_devices_two_learner_devices_train_dqn(tmp_path):
    r = run_script(tmp_path, "train", tmp_path / "run", "agent=dqn", "env=envpool/cartpole", "num_envs=16",
                   "env.envs_per_recv=8", *SPLIT, "env.recvs_per_chunk=16", "total_steps=4096", "log_interval=1024",
                   "agent.learning_starts=512", "agent.buffer_size=4096", "agent.batch_size=32", "eval_episodes=2",
                   "checkpoint.enabled=false")
    assert r["env_steps"] == 4096
    # The learner's state lives on devices 2 and 3 (actors act on 0 and 1).
    assert r["state_devices"]["agent"] == [2, 3] and r["state_devices"]["buffer"] == [2, 3]
    # Both threads wrote their own envs' rows (thread 0: envs 0-7, thread 1: envs 8-15), ~equally.
    written = np.array(r["written"])
    assert (written > 0).all() and 3000 < written.sum() <= 4096
    assert written[:8].sum() > 0.3 * written.sum() and written[8:].sum() > 0.3 * written.sum()
    assert r["updates"] == 4096 // 16 - 512 // 16 + 1  # the replay ratio of one learner
    rows = list(csv.DictReader(io.StringIO(r["metrics_csv"])))
    assert [int(x["env_steps"]) for x in rows] == [1024, 2048, 3072, 4096]
    assert all(np.isfinite(float(x["train/loss"])) for x in rows[1:])
    assert len(r["eval_returns"][0]) == 2


@pytest.mark.slow
def test_split_setup_learns_cartpole(tmp_path):
    """`agent=dqn env=envpool/cartpole` (DQN defaults), 16 envs, 8 per recv, 2 actor threads on 2 actor
    devices, 2 learner devices, 500k env steps: greedy evaluation (20 episodes) >= 475."""
    r = run_script(tmp_path, "train", tmp_path / "run", "agent=dqn", "env=envpool/cartpole", "num_envs=16",
                   "env.envs_per_recv=8", *SPLIT, "total_steps=500000", "log_interval=50000", "eval_episodes=20",
                   "checkpoint.enabled=false", timeout=7200)
    mean = float(np.mean(r["eval_returns"][0]))
    print(f"split-device DQN CartPole: greedy eval mean {mean:.1f}")
    assert mean >= 475, r["eval_returns"]
