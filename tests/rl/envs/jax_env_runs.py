"""Shared by the JAX-library source tests (tests/rl/envs/test_<lib>_source.py): stepping a source from the
host, a small end-to-end run (`smoke`): tiny network, a few hundred env steps, 2 vmapped seeds, a greedy
evaluation during training and after it; a learning run (`learns`); compiling `unoptimised`."""

from __future__ import annotations

import contextlib
import csv
import os

import jax
import jax.numpy as jnp
import numpy as np

from agents.experiment import run
from agents.setup import compose

TINY = {  # per agent: its option and overrides for a tiny network and a buffer that trains within the run
    "dqn": ["agent=dqn", "agent.network.torso=mlp", "agent.network.hidden_sizes=[16]", "agent.learning_starts=64",
            "agent.batch_size=8", "agent.buffer_size=256", "agent.target_update_period=5"],
    "r2d2": ["agent=r2d2_small", "agent.network.hidden_sizes=[16]", "agent.network.head_hidden=[16]",
             "agent.lstm_size=16", "agent.sequence_length=8", "agent.burn_in=2", "agent.period=4",
             "agent.batch_size=4", "agent.learning_starts=64", "agent.buffer_size=512", "agent.train_interval=8"],
    "muesli": ["agent=muesli_small", "agent.network.hidden_sizes=[16]", "agent.network.state_dim=16",
               "agent.network.model_hidden=[16]", "agent.network.head_hidden=[16]", "agent.batch_size=4",
               "agent.sequence_length=8", "agent.learning_starts=96", "agent.buffer_size=1024"],
}


def _reset(source, key, steps: int):
    """A reset drawn from `key` and the keys of the `steps` steps after it: (state, first obs, [step keys])."""
    k0, key = jax.random.split(key)
    state, obs = jax.jit(source.reset)(k0)
    keys = []
    for _ in range(steps):
        key, k = jax.random.split(key)
        keys.append(k)
    return state, obs, keys


def rollout(source, actions, key):
    """Step `source` with `actions [T, E]` from a reset drawn from `key`: (first obs, [Timestep] of each step)."""
    state, obs, keys = _reset(source, key, len(actions))
    step, out = jax.jit(source.step), []
    for a, k in zip(actions, keys):
        state, ts = step(state, jnp.asarray(a, jnp.int32), k)
        out.append(jax.device_get(ts))
    return obs, out


def step_ends(source, actions, key):
    """`rollout`'s first obs and its steps' `terminated` and `truncated` `[T, E]`, stepped in one jitted scan that
    returns no observation (XLA then drops the drawing of a library whose observation is a rendered frame)."""
    state, obs, keys = _reset(source, key, len(actions))

    def body(state, x):
        state, ts = source.step(state, *x)
        return state, (ts.terminated, ts.truncated)

    scan = jax.jit(lambda state, xs: jax.lax.scan(body, state, xs)[1])
    terminated, truncated = scan(state, (jnp.asarray(actions, jnp.int32), jnp.stack(keys)))
    return obs, np.asarray(terminated), np.asarray(truncated)


def smoke(run_dir, env: list[str], agent: str = "dqn", total_steps: int = 256, *extra: str) -> dict:
    """Train `agent` (TINY) on `env` (overrides) for `total_steps` env steps per seed on 2 seeds of 4 envs,
    with a greedy evaluation half way and at the end; checks that training ran, logged finite losses and
    evaluated 2 episodes per seed. Returns `agents.experiment.run`'s result."""
    cfg = compose([*TINY[agent], *env, "logger=none", "seeds=2", "num_envs=4",
                   f"total_steps={total_steps}", f"log_interval={total_steps // 2}",
                   f"eval_interval={total_steps // 2}", "eval_episodes=2", *extra])
    res = run(cfg, run_dir)
    assert res["env_steps"] == total_steps
    assert int(np.min(np.asarray(res["state"][0].agent.updates))) > 0  # both seeds trained
    evals = np.asarray(res["eval_returns"])
    assert evals.shape == (2, 2) and np.isfinite(evals).all(), evals
    with open(f"{run_dir}/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert np.isfinite([float(r["train/loss"]) for r in rows if r.get("train/loss")]).all()
    assert any(r.get("eval_return") for r in rows[:2]), rows[0]  # the greedy evaluation during training
    return res


def learns(run_dir, env: list[str], total_steps: int, *extra: str) -> np.ndarray:
    """DQN (its preset for the env's family, a replay and exploration sized to the run) for `total_steps` env
    steps per seed on 2 seeds of 16 envs; returns the final greedy returns `[2, 8]`."""
    cfg = compose(["agent=dqn", *env, "logger=none", "seeds=2", "num_envs=16", f"total_steps={total_steps}",
                   f"log_interval={total_steps // 10}", "eval_interval=0", "eval_episodes=8",
                   "agent.buffer_size=20000", "agent.learning_starts=1000",
                   f"agent.epsilon_decay_steps={total_steps // 4}", *extra])
    return np.asarray(run(cfg, run_dir)["eval_returns"])


@contextlib.contextmanager
def unoptimised():
    """Inside: programs compile without XLA's backend optimisations, here and in the processes started (as the
    default suite compiles). The slow tier's XLA defaults with the suite's classic emitters (tests/conftest.py)
    take over 15 minutes to compile navix's reset (LLVM on one fusion: the key split stored in its state)."""
    before, saved = jax.config.read("jax_disable_most_optimizations"), os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS")
    jax.config.update("jax_disable_most_optimizations", True)
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
        if saved is None:
            os.environ.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
        else:
            os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = saved
