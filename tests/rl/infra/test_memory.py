"""The memory estimate (exact from shapes x dtypes, Atari frames kept uint8) and the refusal of a run that
does not fit, before anything is allocated or written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from agents.experiment import build, run, validate
from agents.setup import compose
from rl.config import ConfigError
from rl.infra import memory

ROOT = Path(__file__).resolve().parents[3]
FRAME_STACK = 4 * 84 * 84  # bytes of one uint8 Atari observation


def test_estimate_counts_the_buffer_from_shapes_with_uint8_frames():
    cfg = compose(["agent=dqn", "env=envpool/pong", "logger=none", "agent.buffer_size=100000"])
    est = memory.estimate(build(cfg), validate(cfg))
    frames = 2 * 100_000 * FRAME_STACK  # obs and next_obs, one byte per pixel
    assert frames <= est.buffer <= 1.01 * frames, est  # float32 frames would be 4x
    assert 0 < est.agent < 0.1 * memory.GB
    assert est.save_copy == 100_000 * FRAME_STACK  # the largest array: one of the two frame arrays
    no_ckpt = memory.estimate(build(cfg), validate(compose(["agent=dqn", "env=envpool/pong", "checkpoint.enabled=false",
                                                            "agent.buffer_size=100000"])))
    assert no_ckpt.save_copy == 0 and no_ckpt.total == est.total - est.save_copy


def test_estimate_parts_are_the_bytes_of_the_states_agent_buffer_and_rest():
    """Each part summed from the real initial state's leaves, by the runner state's fields."""
    cfg = compose(["agent=dqn", "env=cartpole", "logger=none", "agent.buffer_size=1000", "seeds=2"])
    runner = build(cfg)
    state, it = runner.init()
    est = memory.estimate(runner, validate(cfg))
    nbytes = lambda tree: sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))
    assert est.buffer == nbytes(state.buffer) > 2 * 1000 * 4 * 4  # at least obs and next_obs (4 floats) of 1000 steps
    assert est.agent == nbytes(state.agent) > 0
    assert est.other == nbytes((state, it)) - est.buffer - est.agent > 0
    assert est.save_copy == max(x.nbytes for x in jax.tree_util.tree_leaves((state, it)))


def test_a_run_that_does_not_fit_is_refused_before_allocating(tmp_path, monkeypatch):
    from rl.runners import loop

    monkeypatch.setattr(memory, "available", lambda: (8 * 10**9, "test memory"))
    monkeypatch.setattr(loop, "run", lambda *a: pytest.fail("the host loop (which allocates the state) started"))
    cfg = compose(["agent=muesli", "env=envpool/pong", "logger=none"])  # the paper's 1.5M-step buffer
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path / "run")
    msg = str(err.value)
    est = memory.estimate(build(cfg), validate(cfg))
    assert msg.startswith(f"this run needs about {est.describe()}, ") and "\n" not in msg
    assert 42.3 < est.buffer / memory.GB < 42.4  # 1.5M uint8 frame stacks (28 kB each) and the rest of a step
    assert "more than 90% of the 8.0 GB of test memory" in msg and "agent.buffer_size (now 1500000)" in msg
    assert not (tmp_path / "run").exists()
    seeds = compose(["agent=dqn", "env=breakout-minatar", "seeds=3", "agent.buffer_size=10000000"])
    with pytest.raises(ConfigError, match=r"or seeds \(now 3: one buffer each\)"):
        run(seeds, tmp_path / "seeds")


def test_large_runs_print_their_estimate(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "GB", 1000)  # "over 1 GB": over 1 kB here
    run(compose(["agent=dqn", "env=cartpole", "logger=none", "total_steps=200", "eval_episodes=0",
                 "agent.learning_starts=100", "log_interval=100"]), tmp_path)
    assert "memory: this run holds about" in (tmp_path / "train.log").read_text()


def test_cli_refusal_is_one_line_and_leaves_no_run_dir(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "scripts.train", "agent=dqn", "env=breakout-minatar",
                           "agent.buffer_size=1000000000", f"hydra.run.dir={out}"], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=240, env={**os.environ, "WANDB_MODE": "disabled"})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: this run needs about"), proc.stderr
    assert not out.exists()


def test_available_host_memory_reads_meminfo_else_physical_memory(monkeypatch):
    """On CPU: MemAvailable of /proc/meminfo (kB -> bytes); where it cannot be read, the physical memory."""
    import builtins
    import io

    real_open = builtins.open
    fake = "MemTotal:       24000000 kB\nMemAvailable:   12345678 kB\n"
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: io.StringIO(fake) if f == "/proc/meminfo"
                        else real_open(f, *a, **k))
    assert memory.available() == (12345678 * 1024, "available host memory")

    def refuse(f, *a, **k):
        if f == "/proc/meminfo":
            raise OSError("no procfs")
        return real_open(f, *a, **k)

    monkeypatch.setattr(builtins, "open", refuse)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory.available() == (physical, "host memory") and physical > 2**30
