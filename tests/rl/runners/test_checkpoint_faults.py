"""Checkpoint faults lose at most the work since the newest intact checkpoint (docs/faults.md): checkpoints by
wall time (a patched clock), a damaged newest checkpoint skipped on resume (one line naming it, the env steps
lost), none intact (one line), and a save that fails (a writer raising ENOSPC: one line, its temporary dir
removed, the older checkpoints kept; the run stops with the resume command, or goes on with
`checkpoint.on_error=continue`)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from agents.experiment import build, run
from agents.setup import compose
from rl.config import ConfigError
from rl.infra import checkpoint
from rl.runners import loop
from tests.conftest import TINY_DQN, compiles_of

COVERS = {"train.checkpoint.every_minutes": ["test_checkpoints_by_wall_time_land_inside_log_intervals_and_resume",
                                             "test_every_minutes_zero_writes_none_by_time"],
          "train.checkpoint.on_error": ["test_a_failed_save_stops_the_run_with_the_resume_command",
                                        "test_on_error_continue_goes_on_and_the_next_checkpoint_saves"]}

BASE = [*TINY_DQN, "log_interval=400", "checkpoint.interval=400", "checkpoint.keep=3"]
RUN = [*BASE, "total_steps=1200"]


def _leaves(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def _steps(run_dir: Path) -> list[int]:
    return sorted(checkpoint.steps(run_dir))


# --- checkpoints by wall time ------------------------------------------------------------------------
@pytest.fixture
def fast_clock(monkeypatch):
    """Each reading of the loop's clock is 61 s after the previous one; every call does one iteration."""
    now = [0.0]

    def tick():
        now[0] += 61.0
        return now[0]

    monkeypatch.setattr(loop, "clock", tick)
    monkeypatch.setattr(loop, "SUBCHUNK_S", 1e-9)


def test_checkpoints_by_wall_time_land_inside_log_intervals_and_resume(tmp_path, fast_clock):
    """`checkpoint.every_minutes=1` with a minute passing between calls: a checkpoint after every call (inside
    the one log interval, its sums kept); the newest restores into the runner's state."""
    cfg = compose([*TINY_DQN, "total_steps=48", "log_interval=48", "checkpoint.every_minutes=1",
                   "checkpoint.keep=100", "agent.learning_starts=16"])
    result = run(cfg, tmp_path)
    steps = _steps(tmp_path)
    assert steps[-1] == 48 and len(steps) >= 5 and steps[:3] == [4, 8, 12]  # 4 envs: 4 env steps per call
    inside = checkpoint.read_meta(tmp_path, steps[-2])
    assert inside["env_steps"] == steps[-2] and inside["partial_interval"]["start"] == 0  # the interval's sums
    state, meta = checkpoint.restore(tmp_path, build(cfg).restore_target())
    assert meta["env_steps"] == 48 and "partial_interval" not in meta
    for x, y in zip(_leaves(state), _leaves(result["state"]), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_crash_after_a_checkpoint_by_wall_time_resumes_bit_for_bit(tmp_path, fast_clock, monkeypatch):
    """A run that dies (an exception, as a kill would leave it) after a checkpoint by wall time inside a log
    interval resumes from it: the interval's sums saved with it complete the interval, so the state and
    metrics.csv equal those of the run that never stopped."""
    from rl.runners.anakin import Anakin

    overrides = [*TINY_DQN, "total_steps=240", "log_interval=120", "checkpoint.every_minutes=1",
                 "agent.learning_starts=16", "eval_episodes=0"]
    calls, advance = [], Anakin.advance

    def crashing(self, *args):
        calls.append(1)
        if len(calls) == 40:  # inside the second log interval (4 env steps per call), after call 39's checkpoint
            raise RuntimeError("the process dies")
        return advance(self, *args)

    monkeypatch.setattr(Anakin, "advance", crashing)
    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="the process dies"):
        run(compose(overrides), crashed)
    meta = checkpoint.read_meta(crashed)
    assert meta["env_steps"] == 156 and meta["partial_interval"]["start"] == 120
    monkeypatch.setattr(Anakin, "advance", advance)
    # The saved sums go in placed as the loop returns them: the crashed run's program (kept with its runner by
    # agents.experiment), no other.
    with compiles_of("_chunk") as compiles:
        resumed = run(compose(overrides), crashed)  # a run dir with a checkpoint and no summary: resumed
    assert not compiles, compiles
    straight = run(compose(overrides), tmp_path / "straight")
    for x, y in zip(_leaves(straight["state"]), _leaves(resumed["state"]), strict=True):
        np.testing.assert_array_equal(x, y)
    assert (tmp_path / "straight" / "metrics.csv").read_text() == (crashed / "metrics.csv").read_text()


def test_every_minutes_zero_writes_none_by_time(tmp_path, fast_clock):
    run(compose([*TINY_DQN, "total_steps=48", "log_interval=48", "checkpoint.every_minutes=0", "checkpoint.keep=100",
                 "agent.learning_starts=16"]), tmp_path)
    assert _steps(tmp_path) == [48]


def test_the_default_checkpoints_every_ten_minutes_and_stops_on_a_failed_save():
    cfg = compose([*TINY_DQN])
    assert cfg.checkpoint.every_minutes == 10 and cfg.checkpoint.on_error == "stop"
    for bad, message in (("checkpoint.every_minutes=-1", "every_minutes"), ("checkpoint.on_error=retry", "on_error")):
        with pytest.raises(ConfigError, match=message):
            build(compose([*TINY_DQN, bad]))


# --- a damaged newest checkpoint -------------------------------------------------------------------------
def _damage(step_dir: Path) -> int:
    """Overwrite every data file of a checkpoint's state with 100 random bytes; returns how many."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    for p in files:
        p.write_bytes(os.urandom(100))
    return len(files)


def test_a_damaged_newest_checkpoint_is_skipped_on_resume(tmp_path, capsys):
    """keep=3 (400, 800, 1200); 1200's data files damaged: the resume names it in one line (no other output:
    orbax's abandoned reads are quiet), says it uses 800 and loses 400 env steps, trains on to 1600 and
    writes 1200 anew in place of the damaged one."""
    first = tmp_path / "first"
    run(compose(RUN), first)
    assert _steps(first) == [400, 800, 1200]
    assert _damage(checkpoint.checkpoints_dir(first) / "1200") > 0
    capsys.readouterr()
    cfg = compose([*BASE, "total_steps=1600", f"resume={first}"])
    resumed = run(cfg, tmp_path / "unused")
    out, err = capsys.readouterr()
    bad = [line for line in out.splitlines() if "does not restore" in line]
    assert len(bad) == 1 and str(checkpoint.checkpoints_dir(first) / "1200") in bad[0], out
    assert f"newest intact checkpoint, {checkpoint.checkpoints_dir(first) / '800'}: 400 env steps" in out
    assert "Event loop is closed" not in err
    assert resumed["env_steps"] == 1600 and _steps(first) == [800, 1200, 1600]
    shutil.rmtree(checkpoint.checkpoints_dir(first) / "1600")
    _, meta = checkpoint.restore(first, build(cfg).restore_target(), note=pytest.fail)  # 1200 intact again
    assert meta["env_steps"] == 1200


def test_no_intact_checkpoint_is_one_line(tmp_path):
    run(compose([*BASE, "total_steps=800"]), tmp_path / "first")
    for step in _steps(tmp_path / "first"):
        _damage(checkpoint.checkpoints_dir(tmp_path / "first") / str(step))
    with pytest.raises(checkpoint.MissingCheckpoint) as e:
        run(compose([*BASE, "total_steps=1600", f"resume={tmp_path / 'first'}"]), tmp_path / "unused")
    assert "\n" not in str(e.value) and str(e.value).startswith("no checkpoint in ")
    assert "(steps 800, 400)" in str(e.value) and "does not restore" in str(e.value)


# --- a save that fails -----------------------------------------------------------------------------------
@pytest.fixture
def full_disk_at(monkeypatch):
    """`full_disk_at(step)`: orbax's writer leaves a temporary dir for checkpoint `step` and raises ENOSPC."""
    save = ocp.CheckpointManager.save

    def install(failing: int):
        def writer(self, step, *args, **kwargs):
            if step != failing:
                return save(self, step, *args, **kwargs)
            (Path(self.directory) / f"{step}.orbax-checkpoint-tmp-1234").mkdir(parents=True)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(ocp.CheckpointManager, "save", writer)

    return install


def test_a_failed_save_is_one_line_removes_its_temporary_dir_and_keeps_the_older_ones(tmp_path, full_disk_at):
    import jax.numpy as jnp

    checkpoint.save(tmp_path, 1, {"w": jnp.ones(3)}, {"env_steps": 1})
    full_disk_at(2)
    with pytest.raises(checkpoint.SaveFailed) as e:
        checkpoint.save(tmp_path, 2, {"w": jnp.zeros(3)}, {"env_steps": 2})
    assert str(e.value) == f"checkpoint {tmp_path.absolute() / '2'} could not be written: No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]
    state, _ = checkpoint.restore(tmp_path, {"w": jax.ShapeDtypeStruct((3,), np.float32)})
    np.testing.assert_array_equal(state["w"], np.ones(3))


def test_a_failed_save_stops_the_run_with_the_resume_command(tmp_path, full_disk_at, capsys):
    full_disk_at(800)
    with pytest.raises(loop.CheckpointFailed) as e:
        run(compose(RUN), tmp_path)
    message, ckpts = str(e.value), checkpoint.checkpoints_dir(tmp_path)
    assert e.value.exit_code == 1 and "\n" not in message
    assert message.startswith(f"checkpoint {ckpts / '800'} could not be written: No space left on device; stopped")
    assert f"resume from {ckpts / '400'} with: python -m scripts.train resume={tmp_path.absolute()}" in message
    assert message in capsys.readouterr().out
    assert _steps(tmp_path) == [400] and sorted(p.name for p in ckpts.iterdir()) == ["400"]


def test_on_error_continue_goes_on_and_the_next_checkpoint_saves(tmp_path, full_disk_at, capsys):
    full_disk_at(800)
    result = run(compose([*RUN, "checkpoint.on_error=continue"]), tmp_path)
    assert result["env_steps"] == 1200 and _steps(tmp_path) == [400, 1200]
    out = capsys.readouterr().out
    assert "could not be written: No space left on device; training goes on and the next checkpoint tries again" in out
