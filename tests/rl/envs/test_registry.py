"""rl/envs/__init__.py: the env-source registry. Adding a source is one module `rl/envs/<name>_source.py`
(`EnvConfig`, `make_source`, `RUNNER`), shown here by adding one: a toy source in a temporary folder on the
package's path trains DQN end to end through `agents.experiment.run` (its greedy evaluation too)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

import rl.envs
from agents.setup import compose
from rl.config import ConfigError

TOY = '''
"""A toy source: each episode is LENGTH steps; action 1 pays 1, action 0 pays 0; obs = steps left."""
import dataclasses

import jax.numpy as jnp

from rl.envs.gymnax_source import Timestep

RUNNER = "anakin"


@dataclasses.dataclass
class EnvConfig:
    source: str = "toy"
    id: str = "Toy-v0"
    length: int = 5


class ToySource:
    num_actions, obs_shape, obs_dtype = 2, (1,), jnp.float32

    def __init__(self, cfg, num_envs):
        self.num_envs, self.length, self.max_episode_steps = num_envs, cfg.length, cfg.length

    def _obs(self, t):
        return (self.length - t)[:, None].astype(jnp.float32)

    def reset(self, key):
        t = jnp.zeros(self.num_envs, jnp.int32)
        return t, self._obs(t)

    def step(self, t, action, key, restart=True):
        t1 = t + 1
        done = t1 >= self.length
        nxt = jnp.where(done, 0, t1)
        return nxt, Timestep(obs=self._obs(nxt), reward=(action == 1).astype(jnp.float32), terminated=done,
                             truncated=jnp.zeros_like(done), next_obs=self._obs(t1))


def make_source(env_cfg, num_envs, seed=0, envs_per_recv=None):
    return ToySource(env_cfg, num_envs)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    folder = tmp_path / "sources"
    folder.mkdir()
    (folder / "toy_source.py").write_text(TOY)
    monkeypatch.setattr(rl.envs, "__path__", [*rl.envs.__path__, str(folder)])
    yield
    import sys

    sys.modules.pop("rl.envs.toy_source", None)


def test_sources_are_the_source_modules_of_the_package():
    names = ("craftax", "envpool", "gymnax", "navix", "popgym_arcade", "xminigrid")
    assert rl.envs.sources() == {name: f"rl.envs.{name}_source" for name in names}
    assert rl.envs.runner_of({"source": "gymnax", "id": "CartPole-v1"}) == "anakin"
    known = r"\['craftax', 'envpool', 'gymnax', 'navix', 'popgym_arcade', 'xminigrid'\]"
    with pytest.raises(ConfigError, match=rf"env.source='nope' is not an env source; available: {known}"):
        rl.envs.env_config({"source": "nope"})


def test_a_new_source_is_one_module_and_trains(toy, tmp_path):
    """The toy source is found by name, typed by its EnvConfig, built by its make_source, stepped by the runner
    its RUNNER names; DQN learns to press 1 (greedy return = the episode length 5)."""
    from agents.experiment import run

    assert rl.envs.sources()["toy"] == "rl.envs.toy_source"
    assert rl.envs.env_config({"source": "toy", "length": 3}).length == 3
    cfg = compose(["agent=dqn", "env=cartpole", "total_steps=3000", "num_envs=4", "agent.learning_starts=200",
                   "agent.epsilon_decay_steps=1000", "logger=none", "eval_episodes=4", "checkpoint.enabled=false"])
    cfg.env = OmegaConf.create({"source": "toy", "id": "Toy-v0", "length": 5})
    res = run(cfg, tmp_path / "run")
    assert type(rl.envs.make_source(cfg.env, 2)).__name__ == "ToySource"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_returns"] == [[5.0] * 4], summary["eval_returns"]
    assert res["env_steps"] == 3000
