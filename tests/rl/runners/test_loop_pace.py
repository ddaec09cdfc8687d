"""The host loop's sub-chunks (`Pace`), its signal handling (`SignalWatch`) and the abort message."""

from __future__ import annotations

import os
import signal

import jax.numpy as jnp
import pytest

from rl.infra import checkpoint
from rl.runners.loop import SUBCHUNK_S, Aborted, Pace, SignalWatch


def test_pace_sizes_calls_from_the_last_rate_and_never_across_training_start():
    pace = Pace(train_from=1000, total=10**6)
    assert pace.next_until(0, 5000) == 1  # no rate yet (the compiling call): one unit of work
    pace.record(0, 100, 1.0)  # 100 steps/s
    assert pace.next_until(100, 5000) == 1000  # capped at the first train step, not 100 + 100 * SUBCHUNK_S
    pace.record(100, 1000, 0.1)  # fast acting-only steps, ending where training starts
    assert pace.next_until(1000, 5000) == 1001  # their rate says nothing about training: one unit again
    pace.record(1000, 1010, 1.0)  # training: 10 steps/s
    assert pace.next_until(1010, 5000) == 1010 + int(10 * SUBCHUNK_S)
    assert pace.next_until(1010, 1020) == 1020  # never past the log interval's end
    pace.record(900, 1100, 1.0)  # a call that reached the training start resets the rate
    assert pace.next_until(1100, 5000) == 1101


def test_calls_that_count_no_env_steps_add_their_seconds_to_the_next_rate():
    """Sebulba pays a slow chunk's train steps in several calls and counts its env steps with the last."""
    pace = Pace(train_from=0, total=10**6)
    pace.record(0, 100, 1.0)
    pace.record(100, 100, 3.0)  # owed train steps only: no rate from it (and no division by zero)
    pace.record(100, 100, 3.0)
    assert pace.rate == 100.0
    pace.record(100, 200, 4.0)  # the chunk counted: 100 env steps in 3 + 3 + 4 s
    assert pace.rate == 10.0
    assert "at 10 env steps/s" in (note := pace.eta_note(200, num_seeds=1)) and "about 27.8 h" in note
    slow = Pace(train_from=0, total=10**6)
    slow.record(0, 1, 2.0)
    slow.record(1, 2, 2.0)
    assert "at 0.50 env steps/s" in slow.eta_note(2, num_seeds=1)  # R2D2 on Atari on a CPU: not "0"


def test_pace_says_once_when_the_rest_takes_over_an_hour():
    pace = Pace(train_from=0, total=10**6)
    pace.record(0, 10, 1.0)
    assert pace.eta_note(10, num_seeds=2) is None  # the first (compiling) call is not trusted
    pace.record(10, 110, 1.0)  # 100 steps/s: (10**6 - 110) / 100 s = 2.8 h
    note = pace.eta_note(110, num_seeds=2)
    assert note is not None and "200 env steps/s (all seeds)" in note and "about 2.8 h" in note
    pace.record(110, 210, 1.0)
    assert pace.eta_note(210, num_seeds=2) is None  # once
    quick = Pace(train_from=0, total=10**4)
    quick.record(0, 100, 1.0)
    quick.record(100, 200, 1.0)
    assert quick.eta_note(200, num_seeds=1) is None  # 98 s left: nothing to say


def test_second_ctrl_c_aborts_only_while_saving_third_always():
    notes, before = [], signal.getsignal(signal.SIGINT)
    with SignalWatch(notes.append) as watch:
        os.kill(os.getpid(), signal.SIGINT)
        assert watch.signum == signal.SIGINT and "stopping after the current sub-chunk" in notes[-1]
        os.kill(os.getpid(), signal.SIGINT)  # during training: the stop is already under way
        assert "already stopping" in notes[-1]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # a third
    with SignalWatch(notes.append) as watch:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt), watch.saving():
            os.kill(os.getpid(), signal.SIGINT)  # a second one while the checkpoint is written
    assert signal.getsignal(signal.SIGINT) is before  # the handler there before is back


def test_abort_names_the_checkpoint_on_disk_or_says_nothing_was_saved(tmp_path):
    assert "nothing was saved (no checkpoint on disk)" in str(Aborted(tmp_path))
    checkpoint.save(tmp_path / "checkpoints", 300, {"w": jnp.ones(2)}, {"env_steps": 300})
    msg = str(Aborted(tmp_path))
    assert f"newest checkpoint on disk: {tmp_path / 'checkpoints' / '300'}" in msg
    assert f"python -m scripts.train resume={tmp_path.absolute()}" in msg
    assert Aborted(tmp_path).exit_code == 130 and isinstance(Aborted(tmp_path), KeyboardInterrupt)
