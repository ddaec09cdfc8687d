"""Config composition for every config group, shared keys, overrides, and clear errors before any jit."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from agents import agent_config, available_agents, make_agent
from agents.experiment import validate
from agents.setup import compose
from rl.config import CONFIG_DIR, ConfigError
from rl.envs import env_config
from rl.envs.gymnax_source import make_source
from scripts.train import group_choices


def _options(group: str) -> list[str]:
    root = CONFIG_DIR / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


ENV_OPTIONS = _options("env")
AGENT_OPTIONS = group_choices("agent")  # stored in hydra's ConfigStore by the agents registry (no yaml folder)


def test_every_group_is_covered():
    groups = {p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name != "hydra"}
    assert {"env", "logger", "distributed"} <= groups
    assert "dqn" in AGENT_OPTIONS and "cartpole" in ENV_OPTIONS


@pytest.mark.parametrize("agent", AGENT_OPTIONS)
def test_agent_configs_compose_and_validate(agent):
    cfg = compose([f"agent={agent}"])
    assert cfg.agent.name in available_agents()
    typed = agent_config(cfg.agent)
    assert typed.name == cfg.agent.name


@pytest.mark.parametrize("agent", AGENT_OPTIONS)
def test_agent_lr_is_a_shared_key(agent):
    """`agent.lr=...` (one sweep axis for every agent) sets the optimiser's lr; `agent.optim.lr` still wins."""
    default = agent_config(compose([f"agent={agent}"]).agent).optim.lr
    assert agent_config(compose([f"agent={agent}", "agent.lr=0.00123"]).agent).optim.lr == 0.00123 != default
    both = compose([f"agent={agent}", "agent.lr=0.00123", "agent.optim.lr=0.5"])
    assert agent_config(both.agent).optim.lr == 0.5
    assert agent_config({"name": cfg_name(agent), "lr": 0.007}).optim.lr == 0.007  # plain dicts too


def cfg_name(agent: str) -> str:
    return compose([f"agent={agent}"]).agent.name


@pytest.mark.parametrize("env", ENV_OPTIONS)
def test_env_configs_compose_and_validate(env):
    cfg = compose([f"env={env}"])
    typed = env_config(cfg.env)
    assert typed.source == cfg.env.source and typed.id == cfg.env.id
    if cfg.env.source == "gymnax":
        source = make_source(cfg.env, 2)
        assert source.num_actions >= 2


@pytest.mark.parametrize("group", ["logger", "distributed"])
def test_other_groups_compose(group):
    """Each option of the group composes into `cfg.<group>` with exactly its file's keys and values, the other
    options give different sections, and the whole config still validates."""
    sections = {}
    for option in _options(group):
        cfg = compose([f"{group}={option}"])
        validate(cfg)
        composed = OmegaConf.to_container(cfg[group], resolve=False)
        on_disk = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / group / f"{option}.yaml"), resolve=False)
        assert composed == on_disk, option
        sections[option] = composed
    assert len(sections) >= 2 and len({repr(v) for v in sections.values()}) == len(sections)
    if group == "logger":
        assert sections["none"]["wandb"]["mode"] == "disabled" and sections["wandb"]["wandb"]["mode"] == "offline"
    else:
        assert sections["none"]["enabled"] is False
        assert all(sections[o]["enabled"] is True for o in sections if o != "none")
        assert compose([]).distributed.enabled is False  # one process by default


def test_shared_keys_and_defaults():
    cfg = compose([])
    for key in ("seed", "seeds", "total_steps", "num_envs", "logger.wandb.mode", "resume", "log_interval",
                "eval_episodes", "checkpoint.interval"):
        assert OmegaConf.select(cfg, key, throw_on_missing=True) is not None or key == "resume"
    assert cfg.agent.name == "dqn" and cfg.env.id == "CartPole-v1" and cfg.logger.wandb.mode == "offline"
    validate(cfg)


@pytest.mark.parametrize("env_id, actions, shape", [("Acrobot-v1", 3, (6,)), ("Breakout-MinAtar", 3, (10, 10, 4)),
                                                    ("SpaceInvaders-MinAtar", 4, (10, 10, 6))])
def test_any_gymnax_id_by_override(env_id, actions, shape):
    cfg = compose(["env=cartpole", f"env.id={env_id}", "num_envs=2"])
    validate(cfg)
    source = make_source(cfg.env, cfg.num_envs)
    assert source.num_actions == actions and source.obs_shape == shape
    agent = make_agent(cfg.agent, obs_shape=source.obs_shape, obs_dtype=source.obs_dtype,
                       num_actions=source.num_actions, num_envs=cfg.num_envs)
    assert agent.num_actions == actions


@pytest.mark.parametrize("overrides, match", [
    (["seeds=0"], "seeds"),
    (["total_steps=-5"], "total_steps"),
    (["logger.wandb.mode=sometimes"], "logger.wandb.mode"),
    (["env.id=CartPole-v7"], "not a gymnax environment"),
    (["env.source=mujoco"], "env.source"),
    (["agent.name=ppo"], "agent.name"),
    (["agent.loss=l1"], "agent.loss"),
    (["agent.discount=1.5"], "agent.discount"),
    (["agent.optim.name=adagrad"], "optim.name"),
])
def test_bad_values_get_our_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose(overrides))


@pytest.mark.parametrize("overrides, match", [
    (["seeds=abc"], "seeds"),
    (["agent=nope"], "nope"),
    (["logger.wandb.mode=[1,2]"], "mode"),
])
def test_bad_values_and_choices_get_hydras_error(overrides, match):
    with pytest.raises(ConfigCompositionException, match=match):
        compose(overrides)


@pytest.mark.parametrize("override, message", [
    ("agent.lrr=1e-3", "agent.lrr=1e-3: `agent` (agent dqn) has no key `lrr`; closest: agent.lr, "),
    ("num_env=3", "num_env=3: the config has no key `num_env`; closest: num_envs, "),
    ("logger.wandb.moed=online", ("logger.wandb.moed=online: `logger.wandb` has no key `moed`; closest: "
                                  "logger.wandb.mode, ")),
    ("env.bar=0.1", "env.bar=0.1: `env` has no key `bar`; closest: env."),
])
def test_unknown_keys_get_one_line_with_the_closest_keys(override, message):
    """An override of a key the config lacks: one line naming it and the closest valid keys (difflib), not
    hydra's lines suggesting `+key=...` (which the typed config then refuses)."""
    with pytest.raises(ConfigError) as e:
        compose([override])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_configs_ship_with_the_package():
    assert Path(CONFIG_DIR / "config.yaml").is_file()
    agent = make_agent(compose([]).agent, obs_shape=(4,), obs_dtype=jnp.float32, num_actions=2, num_envs=10)
    assert type(agent).__module__ == "agents.dqn" and agent.num_actions == 2 and agent.num_envs == 10


def test_a_torso_the_env_cannot_take_is_a_config_error_naming_the_key_and_the_env():
    from agents.experiment import build

    cfg = compose(["agent=dqn", "env=breakout-minatar", "agent.network.torso=nature_cnn", "logger=none"])
    with pytest.raises(ConfigError, match=r"agent\.network\.torso='nature_cnn' .* \(env Breakout-MinAtar: "
                                          r"observations \(10, 10, 4\)"):
        build(cfg)


def test_unknown_group_choices_list_every_config_including_subfolders():
    from scripts.train import unknown_choice

    assert "envpool/pong" in group_choices("env") and "dqn_paper" in group_choices("agent")
    assert not any("/" in c for c in group_choices("agent"))  # the presets' per-env nodes are not choices
    assert unknown_choice(["env=envpool/pong", "agent=muesli", "agent.lr=1e-3"]) is None
    assert unknown_choice(["agent=dqn,muesli"]) is None  # a multirun list: hydra checks each value
    assert unknown_choice(["agent=dqnn"]).startswith("agent=dqnn is not an agent option; choose one of ['dqn'")
    assert unknown_choice(["env=pong"]).startswith("env=pong is not a config of configs/env/")


def test_composing_shares_the_config_store_and_leaves_it_as_stored():
    """hydra copies its config repository on every compose; the copy reads the live ConfigStore (rl/config.py:
    copying the store was half of a compose's time). A compose leaves the stored options as they were, and an
    option stored after a compose is found by the next one."""
    import copy

    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    assert copy.deepcopy(store) is store
    before = OmegaConf.to_yaml(store.load("agent/dqn.yaml").node)
    cfg = compose(["agent=dqn", "env=cartpole", "agent.batch_size=7", "agent.optim.lr=0.5"])
    cfg.agent.discount = 0.1  # a composed config is the caller's to change
    assert OmegaConf.to_yaml(store.load("agent/dqn.yaml").node) == before
    assert compose(["agent=dqn", "env=cartpole"]).agent.batch_size != 7
    store.store(group="agent", name="dqn_test_late", node=store.load("agent/dqn.yaml").node)
    try:
        assert compose(["agent=dqn_test_late", "env=cartpole"]).agent.name == "dqn"
    finally:
        del store.repo["agent"]["dqn_test_late.yaml"]
