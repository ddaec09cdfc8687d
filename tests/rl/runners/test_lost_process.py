"""A process of a multi-process run that goes away (killed, crashed): the survivors stop within seconds with
one line naming it and the newest checkpoint every process shares, exit 1 without the runtime's shutdown
(which waited ~70 s for the dead peer, then aborted with a C++ stack dump), and the whole run resumes from
that checkpoint. The 2-process test is in the slow tier; its fast twin raises the collective's error in one
process."""

from __future__ import annotations

import signal
import time

import jax
import pytest

from agents.experiment import run
from agents.setup import compose
from rl.infra import checkpoint, distributed
from rl.runners import loop
from rl.runners.stopping import LostProcess
from tests.conftest import TINY_DQN
from tests.rl.infra.test_multiprocess import WATCHDOG_S, _finish, _start

GLOO = "UNKNOWN: Gloo AllGather failed: [pair.cc:547] Connection closed by peer [127.0.0.1]:28594"


def test_a_collective_failing_on_a_lost_peer_stops_the_run_in_one_line(tmp_path, monkeypatch):
    """The error a survivor's collective raises (gloo, peer gone) after the checkpoint at 400: `LostProcess`,
    one line naming the checkpoint and the resume command, and the exit without the runtime's shutdown is
    arranged (`distributed.leave`, patched here: it would end pytest)."""
    calls, agree, left = [], distributed.agree, []

    def agree_then_fail(*args, **kwargs):
        calls.append(args)
        if len(calls) == 150:  # past the checkpoint at 400 env steps (4 per call)
            raise jax.errors.JaxRuntimeError(GLOO)
        return agree(*args, **kwargs)

    monkeypatch.setattr(loop, "SUBCHUNK_S", 1e-9)
    monkeypatch.setattr(distributed, "lost_peer", lambda: "process 1 of 2")  # as the survivor of two says
    monkeypatch.setattr(distributed, "agree", agree_then_fail)
    monkeypatch.setattr(distributed, "leave", left.append)
    cfg = compose([*TINY_DQN, "total_steps=2000", "log_interval=200", "checkpoint.interval=400"])
    with pytest.raises(LostProcess) as e:
        run(cfg, tmp_path)
    message, ckpt = str(e.value), checkpoint.checkpoints_dir(tmp_path) / "400"
    assert "\n" not in message and left == [1] and e.value.exit_code == 1
    assert message == (f"process 1 of 2 went away ({GLOO}); this process stops; the newest checkpoint "
                       f"all processes share: {ckpt}; resume the whole run with: python -m scripts.train "
                       f"resume={tmp_path.absolute()}")


def test_other_runtime_errors_are_not_taken_for_a_lost_peer():
    assert not distributed.peer_lost(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory"))
    assert distributed.peer_lost(jax.errors.JaxRuntimeError(GLOO))


@pytest.mark.slow  # two 2-process runs (~3 min); the fast twin above raises the collective's error in one process
def test_a_killed_process_stops_the_other_within_a_minute_and_the_run_resumes(tmp_path):
    """Process 1 killed (SIGKILL) 3 s into the sub-chunks (~10 s each) after the first log and checkpoint:
    process 0's collective fails and it stops within a minute, exit 1, one line naming process 1 and the
    checkpoint, no traceback or C++ stack (wherever it waited: a collective's error, or the peer watch's
    silence in the agreement or a barrier); both resume from it and finish."""
    run_dirs = [tmp_path / "p0", tmp_path / "p1"]
    overrides = [*TINY_DQN, "seeds=2", "total_steps=100000", "log_interval=1000", "eval_episodes=0",
                 "checkpoint.interval=1000"]
    procs = _start(run_dirs, *overrides)
    metrics, t0 = run_dirs[0] / "metrics.csv", time.monotonic()
    while not metrics.exists() and time.monotonic() - t0 < WATCHDOG_S and procs[0].poll() is None:
        time.sleep(0.05)
    time.sleep(3.0)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    (code, text), _ = _finish(procs, "a process killed", watchdog_s=120)
    assert time.monotonic() - killed < 60 and code == 1, text[-3000:]
    lines = [line for line in text.splitlines() if "went away" in line]
    step = checkpoint.latest_step(run_dirs[0])
    assert len(lines) == 1 and lines[0].startswith("process 1 of 2 went away (") and step >= 1000, text[-3000:]
    assert f"the newest checkpoint all processes share: {checkpoint.checkpoints_dir(run_dirs[0]) / str(step)}" in lines[0]
    assert "Check failure" not in text and "Traceback" not in text
    resumed = _start([run_dirs[0], tmp_path / "unused"], f"resume={run_dirs[0]}", f"total_steps={step + 400}")
    for code, text in _finish(resumed, "resumed"):
        assert code == 0, text[-3000:]
    assert checkpoint.latest_step(run_dirs[0]) == step + 400


@pytest.mark.slow  # one 2-process run (~1 min)
def test_a_frozen_process_is_reported_by_its_silence_within_a_minute(tmp_path):
    """Process 1 stopped (SIGSTOP: its sockets stay open, so no collective fails; the survivor waits in a
    collective or the agreement): process 0's peer watch reports it after STALE_S, in one line, exit 1."""
    run_dirs = [tmp_path / "p0", tmp_path / "p1"]
    procs = _start(run_dirs, *TINY_DQN, "seeds=2", "total_steps=100000", "log_interval=1000", "eval_episodes=0",
                   "checkpoint.interval=1000")
    metrics, t0 = run_dirs[0] / "metrics.csv", time.monotonic()
    while not metrics.exists() and time.monotonic() - t0 < WATCHDOG_S and procs[0].poll() is None:
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        code, text = _finish(procs[:1], "a process frozen", watchdog_s=120)[0]
    finally:
        procs[1].kill()
        procs[1].wait()
    assert time.monotonic() - stopped < 60 and code == 1, text[-3000:]
    lines = [line for line in text.splitlines() if "went away" in line]
    assert len(lines) == 1 and lines[0].startswith("process 1 of 2 went away (no heartbeat for "), text[-3000:]
    assert "Check failure" not in text and "Traceback" not in text
