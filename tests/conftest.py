"""Shared test set-up: the process set up as the entry points set it up (agents.setup.setup: the `agent=`
options compose needs, quiet absl/orbax, ...), wandb never touches the network, compiled programs are
cached on disk and built without LLVM's optimisations and with XLA:CPU's classic emitters (below), and a tiny
DQN config for fast runs."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

# Compiled programs are cached on disk (keyed by program, flags and versions), so the many small runs of
# the same config compile once; subprocesses started by tests inherit the setting through the env. Every program
# is kept, however quick to compile (unoptimised, most take < 0.5 s, and the processes the tests start rebuild them).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "jaxrl-test-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Compiling is most of the suite's time. Without XLA's backend (LLVM) optimisations programs compile in a fraction
# of the time and compute the same functions, not always to the same last bit: two different programs that XLA's default options compile to identical bits (a
# blocked and a straight loop) can differ there. Tests comparing such programs bit for bit are marked `optimized`;
# they and the slow learning runs (run time, not compile time) get XLA's defaults (pytest_runtest_setup below).
_UNOPTIMISED = os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# XLA:CPU's classic fusion emitters compile faster than its newer MLIR ones; their programs run somewhat slower,
# which the tests, compile-bound, do not feel. Constant folding is off: XLA folds the JAX env libraries' renderers
# (a reduce over an iota per frame) for over a second per program, and the learning runs of the slow tier take
# the same time without it. LLVM compiles each program as one module: split into parts for parallel codegen
# threads it costs the split and buys nothing while the suite's workers keep both cores busy (about 6% of the
# CPU time of the compile-bound agent and runner tests). Process-wide (JAX reads XLA_FLAGS once), so `optimized`
# and slow tests get them too; processes the tests start inherit them (env, or `xla_flags` where a test sets its
# own device count).
TEST_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false --xla_disable_hlo_passes=constant_folding "
                  "--xla_cpu_parallel_codegen_split_count=1")
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

import pytest

from agents.setup import compose, setup
from rl.infra import xla_cpu

setup()

# A DQN run on CartPole small enough to compile and run in seconds (episodes still end, updates happen).
TINY_DQN = ["agent=dqn", "env=cartpole", "logger=none", "num_envs=4", "log_interval=200", "eval_episodes=2",
            "agent.learning_starts=100", "agent.batch_size=16", "agent.buffer_size=400",
            "agent.network.hidden_sizes=[16]", "agent.target_update_period=5", "agent.epsilon_decay_steps=300",
            "agent.optim.lr=1e-3"]


@contextlib.contextmanager
def compiles_of(name: str):
    """Inside: a list that gets one entry per XLA compilation of the jitted function `name` (from
    `jax.log_compiles`; a persistent-cache hit counts too, it is logged alike)."""
    import jax

    seen = []

    class Count(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith(f"Finished XLA compilation of jit({name})"):
                seen.append(record.getMessage())

    handler, logger = Count(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield seen
    finally:
        logger.removeHandler(handler)


def pytest_runtest_setup(item):
    """Tests marked `optimized` or `slow` (and their fixtures, and the processes they start) compile with XLA's
    default options and the unrolled threefry of every run (rl/infra/xla_cpu.py); the others without LLVM's
    optimisations (the default set at the top) and with jax's rolled threefry, the same bits in programs that
    compile ~25% faster (tests/rl/infra/test_xla_cpu.py compares the bits; kernel counts against a target run in
    a process set up as a user's, or unroll it themselves). Processes a test starts inherit the choice through
    JAX_DISABLE_MOST_OPTIMIZATIONS (agents.setup.setup)."""
    import jax

    optimized = any(item.iter_markers("optimized")) or any(item.iter_markers("slow"))
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "0" if optimized else _UNOPTIMISED
    jax.config.update("jax_disable_most_optimizations", os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "1")
    xla_cpu.unroll_threefry(optimized)


@pytest.fixture(autouse=True)
def patched_runs_keep_no_runner(request):
    """A test that patches (`monkeypatch`) starts and ends without the runners agents.experiment keeps from a
    process's earlier runs: a runner built before its patches never serves it, nor one built under them another
    test. Other tests share them as a user's runs in one process do (a run of the same programs compiles
    nothing)."""
    from agents import experiment

    patched = "monkeypatch" in request.fixturenames
    if patched:
        experiment._KEPT.clear()
    yield
    if patched:
        experiment._KEPT.clear()


@pytest.fixture
def tiny_cfg():
    """`tiny_cfg(*overrides)` -> the composed TINY_DQN config with extra overrides."""
    return lambda *overrides: compose([*TINY_DQN, *overrides])


# Compile options that undo TEST_XLA_FLAGS for one compile: tests that inspect a compiled program (in-place
# updates, loops, conditionals) compile it as a user's process does (the classic emitters expand a scatter into a
# while loop, for one). `lowered.compile(SHIPPED)`.
SHIPPED = {"xla_cpu_use_fusion_emitters": True, "xla_disable_hlo_passes": ""}


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a process the tests start with `devices` forced CPU devices (and the tests' compile flags)."""
    return f"{TEST_XLA_FLAGS} --xla_force_host_platform_device_count={devices}"


# What a newcomer's console must not show: JAX backend notes, wandb's banner and sync hints, matplotlib's font
# cache, gymnasium's precision warnings (envpool's spaces), absl lines.
CONSOLE_NOISE = ("Unable to initialize backend", "libtpu", "precision lowered", "W&B", "Weights & Biases",
                 "Tracking run", "wandb sync", "fontManager", "UserWarning", "Warning:", "[absl]")


def newcomer_env() -> dict:
    """The environment of a `python -m scripts...` process as a newcomer starts it: this repo importable, and none
    of the suite's own quieting (WANDB_SILENT, PYTHONWARNINGS, WANDB_MODE: the config's mode decides)."""
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_SILENT", "PYTHONWARNINGS", "WANDB_MODE")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return env


def assert_only_our_lines(proc, bar: str) -> None:
    """A finished `scripts.train` run with the progress bar on printed only our lines: stderr holds the bar
    (lines starting with `bar`), stdout our notes (the run dir among them); no CONSOLE_NOISE, no wandb or hydra
    INFO lines."""
    for noise in CONSOLE_NOISE:
        assert noise not in proc.stdout + proc.stderr, (noise, proc.stdout, proc.stderr)
    err = [line.strip() for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert err and all(line.startswith(bar) for line in err), proc.stderr
    assert not [line for line in proc.stdout.splitlines() if line.startswith("wandb:")]
    assert "][INFO]" not in proc.stdout and "run dir:" in proc.stdout


def run_probe(code: str, devices: int) -> dict:
    """Run `code` in a fresh Python with `devices` forced CPU devices; its last stdout line, parsed as JSON."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu",
               PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
