"""One typed config flows down: `agents.experiment.validate` types the composed config once (frozen
`rl.config.TrainConfig`, the agent's and the source's dataclasses inside), and the runners, the host loop, the
logger, the memory check and the checkpoints read that; the raw DictConfig stops at the application layer."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import agents
from agents.experiment import run, validate
from agents.setup import compose
from rl.infra.logging import RunLogger
from tests.conftest import TINY_DQN

ROOT = Path(__file__).resolve().parents[2]
# Where the composed config may still be a DictConfig: the config schema and presets (they build it), hydra's
# sweep callback (hydra hands it one) and the env registry (it types the env section).
HYDRA_SIDE = {"rl/config.py", "rl/presets.py", "rl/infra/sweep.py", "rl/envs/__init__.py"}


def test_the_typed_config_is_frozen_all_the_way_down():
    cfg = validate(compose(TINY_DQN))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.total_steps = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.checkpoint.interval = 1


def test_runner_loop_logger_memory_and_checkpoint_code_never_sees_omegaconf():
    """No module under rl/ outside the hydra side imports omegaconf: they cannot read a DictConfig's `.get`."""
    readers = []
    for path in sorted((ROOT / "rl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        if any(name.split(".")[0] == "omegaconf" for name in names) and rel not in HYDRA_SIDE:
            readers.append(rel)
    assert readers == []


def test_the_logger_refuses_the_raw_config(tmp_path):
    with pytest.raises(TypeError, match="RunLogger takes the typed config"):
        RunLogger(compose(TINY_DQN), tmp_path)


def test_a_run_types_its_agent_config_once_and_builds_its_agent_once(tmp_path, monkeypatch):
    """`lr_schedule=linear` with `lr_decay_updates=0` included: the run's length goes to the one agent built
    (`make_agent(..., total_steps)`), so nothing is built twice to learn it."""
    typed, built = [], []
    to_dataclass, make = agents.to_dataclass, agents.make_agent

    def counting_to_dataclass(cls, section, where):
        if where == "agent" and not isinstance(section, cls):
            typed.append(cls)
        return to_dataclass(cls, section, where)

    monkeypatch.setattr(agents, "to_dataclass", counting_to_dataclass)
    monkeypatch.setattr("agents.experiment.make_agent", lambda *a, **k: built.append(k) or make(*a, **k))
    run(compose([*TINY_DQN, "total_steps=400", "agent.optim.lr_schedule=linear", "eval_episodes=0"]), tmp_path)
    assert len(typed) == 1 and [k["total_steps"] for k in built] == [400]


def test_the_checkpoint_saves_the_composed_config_as_plain_containers(tmp_path):
    from rl.infra import checkpoint

    cfg = compose([*TINY_DQN, "total_steps=400", "eval_episodes=0"])
    run(cfg, tmp_path)
    saved = checkpoint.read_meta(tmp_path)["config"]
    assert saved["agent"]["lr"] == cfg.agent.lr and saved["total_steps"] == 400


def test_typing_a_section_leaves_the_shared_schema_as_it_was():
    """rl.config builds each class's schema once and merges every section into a copy of it: a value, a
    refused value or a nested section typed before never reaches the next section's instance."""
    from agents.dqn import Config
    from rl.config import ConfigError, to_dataclass

    first = to_dataclass(Config, {"batch_size": 7, "optim": {"lr": 0.5}}, "agent")
    with pytest.raises(ConfigError):
        to_dataclass(Config, {"batch_size": "many"}, "agent")
    second = to_dataclass(Config, {}, "agent")
    assert (first.batch_size, first.optim.lr) == (7, 0.5)
    assert (second.batch_size, second.optim.lr) == (Config().batch_size, Config().optim.lr) != (7, 0.5)
