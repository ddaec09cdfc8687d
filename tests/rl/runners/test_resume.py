"""Resuming as a user expects it (agents/experiment.py): `resume=<dir>` alone continues that run with its saved
config in its own run dir (one metrics.csv, the same wandb run); overrides may change only the safe keys,
others are refused naming the keys first; a run stopped after its final checkpoint resumes without error;
a run dir left unfinished (e.g. SLURM requeue into the same dir) resumes by itself."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agents.experiment import build, run
from agents.setup import compose
from rl.config import ConfigError
from rl.infra import checkpoint
from tests.conftest import TINY_DQN, compiles_of

BASE = [*TINY_DQN, "seeds=2", "total_steps=800", "log_interval=400", "eval_episodes=1"]

# Config keys whose effect these tests pin down (tests/test_option_coverage.py).
COVERS = {"train.resume": "test_resume_alone_uses_the_saved_config_and_run_dir"}


def _resume(run_dir, *extra):
    overrides = [f"resume={run_dir}", *extra]
    return run(compose(overrides), run_dir.parent / "hydra-dir", overrides)


def test_resume_alone_uses_the_saved_config_and_run_dir(tmp_path):
    first = run(compose([*BASE, "agent.batch_size=8"]), tmp_path / "run")
    res = _resume(tmp_path / "run", "total_steps=1200", "eval_episodes=2")
    assert res["run_dir"] == str(tmp_path / "run") and res["env_steps"] == 1200
    assert not (tmp_path / "hydra-dir").exists()
    saved = checkpoint.read_meta(tmp_path / "run")["config"]
    assert saved["agent"]["batch_size"] == 8 and saved["agent"]["network"]["hidden_sizes"] == [16]
    assert saved["total_steps"] == 1200 and saved["eval_episodes"] == 2  # the safe overrides applied
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["400", "400", "800", "800", "1200", "1200"]
    assert len(res["eval_returns"][0]) == 2 and first["env_steps"] == 800


def test_unsafe_override_is_refused_naming_the_key_first(tmp_path):
    run(compose(BASE), tmp_path / "run")
    with pytest.raises(ConfigError) as err:
        _resume(tmp_path / "run", "agent.optim.lr=0.5", "total_steps=1200")
    message = str(err.value)
    assert message.startswith("cannot resume: agent.optim.lr differ") and len(message.splitlines()) == 1
    with pytest.raises(ConfigError, match=r"cannot resume: agent\..*differ"):
        _resume(tmp_path / "run", "agent=r2d2")  # another agent entirely
    _resume(tmp_path / "run", "agent.optim.lr=0.001", "total_steps=1200")  # repeating a saved value is fine


def test_a_key_the_saved_config_lacks_compares_as_its_default(tmp_path):
    """A run saved before its preset spelled out `agent.optim.lr_schedule` & co. (their defaults) resumes
    with the whole command line repeated (as scripts.benchmark does) and with the whole config compared;
    the same keys at other values are still refused."""
    from omegaconf import open_dict

    cfg = compose(BASE)
    with open_dict(cfg):
        for key in ("lr_schedule", "lr_end_fraction", "lr_decay_updates"):
            del cfg.agent.optim[key]
    run(cfg, tmp_path / "run")
    assert "lr_schedule" not in checkpoint.read_meta(tmp_path / "run")["config"]["agent"]["optim"]
    assert _resume(tmp_path / "run", *BASE, "total_steps=1200")["env_steps"] == 1200
    assert run(compose([*BASE, "total_steps=1600", f"resume={tmp_path / 'run'}"]), tmp_path / "run")["env_steps"] == 1600
    with pytest.raises(ConfigError, match="cannot resume: agent.optim.lr_end_fraction"):
        _resume(tmp_path / "run", *BASE, "agent.optim.lr_end_fraction=0.5", "total_steps=2000")


def test_resume_from_the_final_checkpoint_does_not_save_it_twice(tmp_path):
    run(compose(BASE), tmp_path / "run")
    (tmp_path / "run" / "summary.json").unlink()  # stopped after the last save, before the summary
    res = _resume(tmp_path / "run")
    assert res["env_steps"] == 800 and res["checkpoint"].endswith("/800")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 800


def test_a_resumed_run_compiles_no_program_again(tmp_path):
    """The restored state, the counter and each interval's fresh totals go into the compiled loop placed as
    it returns them, so a resume in the process of the run it resumes runs the run's program (agents.experiment
    keeps the runner), and compiles nothing, not a second program at its second call (Muesli MinAtar: ~13 s, and
    a first rate 50x too slow in the over-an-hour note). A fresh process's resume compiles the same program as
    a fresh run (the next test)."""
    run(compose([*BASE, "total_steps=400"]), tmp_path / "run")
    with compiles_of("_chunk") as compiles:
        assert _resume(tmp_path / "run", "total_steps=1200")["env_steps"] == 1200
    assert not compiles, compiles


def test_a_resumed_run_runs_the_fresh_runs_program(tmp_path):
    """The restored state lowers the loop to the very program the fresh state did (a weak-typed leaf of the
    fresh state, e.g. gymnax's step counter, made it another program: compiled again, and a persistent
    compilation cache missed on every resume)."""
    run(compose([*BASE, "total_steps=400"]), tmp_path / "run")
    runner = build(compose(BASE))
    fresh = runner.init()
    restored = runner.place(checkpoint.restore(tmp_path / "run", runner.restore_target())[0])

    def program(state):
        s, it = state
        return runner.chunk.lower(s, it, runner.zero_totals(s), np.int32(1)).as_text()

    assert program(fresh) == program(restored)


def test_unfinished_run_dir_resumes_by_itself(tmp_path):
    """The same command into the same dir (a requeued SLURM job) continues from the checkpoint."""
    run(compose([*BASE, "checkpoint.interval=400"]), tmp_path / "run")
    (tmp_path / "run" / "summary.json").unlink()
    res = run(compose([*BASE, "checkpoint.interval=400", "total_steps=1200"]), tmp_path / "run")
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert res["env_steps"] == 1200 and len(rows) == 1 + 3 * 2  # 400, 800, 1200 for 2 seeds, once each


def test_wandb_run_id_carries_over(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(compose([*BASE, "logger=wandb"]), tmp_path / "run")
    first_id = checkpoint.read_meta(tmp_path / "run")["wandb_id"]
    _resume(tmp_path / "run", "total_steps=1200")
    assert first_id and checkpoint.read_meta(tmp_path / "run")["wandb_id"] == first_id
    runs = sorted(p.name for p in (tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert all(r.endswith(first_id) for r in runs), runs
