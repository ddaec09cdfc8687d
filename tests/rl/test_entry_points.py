"""The entry points a newcomer uses: `from agents.experiment import train, evaluate_run` (same result as the
CLI), config errors printed as one message without a traceback (exit 1), unknown keys named in one line with
the closest valid keys, unused `+key=value` overrides refused by name, and a warning when total_steps leaves
no room for a train step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents import experiment
from agents.experiment import validate
from agents.setup import compose
from rl.config import ConfigError
from tests.conftest import TINY_DQN

ROOT = Path(__file__).resolve().parents[2]


def test_python_entry_point_trains_and_evaluates(tmp_path):
    result = experiment.train(*TINY_DQN, "total_steps=800", run_dir=tmp_path)
    assert result["env_steps"] == 800 and result["run_dir"] == str(tmp_path)
    assert {"eval_returns", "episode_return", "checkpoint", "state"} <= set(result)
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "summary.json").exists()
    returns = experiment.evaluate_run(tmp_path, episodes=3)
    assert returns.shape == (1, 3) and np.all(returns >= 1)


@pytest.mark.parametrize("override,key", [("+foo=1", "'foo' not in 'TrainConfig'"),
                                          ("+logger.colour=red", "'colour' not in 'LoggerConfig'"),
                                          ("+agent.zzz=2", "'zzz' not in 'Config'")])
def test_unused_plus_overrides_are_refused_by_name(override, key):
    with pytest.raises(ConfigError, match=key):
        validate(compose([override]))


def test_config_error_prints_one_message_without_traceback(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "scripts.train", "agent=dqn", "agent.optim.lr=-1", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "config error: bad config in `agent`: optim.lr must be > 0, got -1" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env={**env, "HYDRA_FULL_ERROR": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr  # hydra's convention for the full trace


def test_an_unknown_key_on_the_command_line_is_one_line_naming_it_and_the_closest_keys(tmp_path):
    """Not hydra's six lines suggesting `+agent.foo=1` (which the typed config would then refuse). The command
    line prints the line `compose` raises (one process; the other sections' keys in-process)."""
    for override, close in (("agent.foo=1", "agent."), ("env.bar=0.1", "env.")):
        with pytest.raises(ConfigError) as e:
            compose(["agent=dqn", override])
        key = override.partition("=")[0].rpartition(".")[2]
        line = str(e.value)
        assert line.startswith(f"{override}: ") and f"no key `{key}`; closest: {close}" in line and "\n" not in line
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "scripts.train", "agent=dqn", "agent.batchsize=8", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: agent.batchsize=8: ") and "no key `batchsize`; closest: agent.batch_size" in last, last
    assert "Traceback" not in proc.stderr and "+agent" not in proc.stderr and not (tmp_path / "run").exists()


def test_warns_when_no_train_step_will_run(tmp_path, capsys):
    experiment.train(*TINY_DQN, "total_steps=80", "agent.learning_starts=100", "eval_episodes=0", run_dir=tmp_path)
    out = capsys.readouterr().out
    assert "total_steps=80 < the agent's learning_starts=100: no train step will run" in out


def test_load_policy_acts_as_the_runs_greedy_evaluation_with_the_chosen_seeds_online_params(tmp_path):
    """`experiment.load_policy(run_dir, seed)` plays exactly the episodes the run's greedy evaluation plays with that
    seed's online parameters (same keys), picks the seed asked for (the two seeds' greedy actions differ),
    and exports the parameters in a form that reads back into the same values."""
    import flax.serialization
    import jax
    import jax.numpy as jnp

    from agents.experiment import load_policy
    from rl.envs.gymnax_source import make_source
    from rl.runners.evaluate import evaluate

    result = experiment.train(*TINY_DQN, "total_steps=2000", "seeds=2", run_dir=tmp_path)
    agent_states = result["state"][0].agent
    source = make_source(_saved_env(tmp_path), 6)
    key = jax.random.PRNGKey(3)
    for seed in (0, 1):
        policy = load_policy(tmp_path, seed=seed)
        own = jax.tree_util.tree_map(lambda x, s=seed: x[s], agent_states)
        assert jax.tree_util.tree_all(jax.tree_util.tree_map(
            lambda a, b: bool(jnp.array_equal(a, b)), policy.params, own.params))

        class Acting:  # the policy as evaluate() calls an agent: no state of its own
            initial_carry = staticmethod(policy.initial_carry)

            @staticmethod
            def act(_state, obs, carry, k, env_ids, explore=True, policy=policy):
                action, carry = policy.act(obs, carry, k)
                return action, carry, {}

        want, _ = evaluate(policy.agent, own, source, key)  # the greedy evaluation of the trained state
        got, _ = evaluate(Acting, None, source, key)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    obs = jax.random.normal(jax.random.PRNGKey(0), (256, 4)) * 2
    a0 = load_policy(tmp_path, seed=0).act(obs)[0]
    a1 = load_policy(tmp_path, seed=1).act(obs)[0]
    assert bool(jnp.any(a0 != a1)), "both seeds act alike: the seed index is not applied"
    path = policy.export(tmp_path / "params.msgpack")
    back = flax.serialization.from_bytes(policy.params, path.read_bytes())
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), back,
                                                         policy.params))
    with pytest.raises(ConfigError, match="trained seeds 0..1"):
        load_policy(tmp_path, seed=2)


def _saved_env(run_dir):
    from omegaconf import OmegaConf

    from rl.infra import checkpoint

    return OmegaConf.create(checkpoint.read_meta(run_dir)["config"]).env
