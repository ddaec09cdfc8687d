"""Agent presets sized to the env family (configs/agent/family/<env>.yaml -> configs/agent/preset/<agent>_<family>):
`agent=<name>` picks the vector / MinAtar / Atari settings for every env config the project ships, and
`agent=<name>_paper` gives the paper's settings on any env. Composition only (no jit)."""

from __future__ import annotations

import functools

import pytest

from agents import agent_config
from rl.config import CONFIG_DIR, compose
from rl.experiment import validate

AGENTS = ("dqn", "r2d2", "muesli")
ENVS = sorted(str(p.relative_to(CONFIG_DIR / "env").with_suffix("")) for p in (CONFIG_DIR / "env").rglob("*.yaml"))
AGENT_OPTIONS = sorted(p.stem for p in (CONFIG_DIR / "agent").glob("*.yaml"))


@functools.cache
def _cfg(agent: str, env: str):
    return compose([f"agent={agent}", f"env={env}"])


@functools.cache
def _agent(agent: str, env: str):
    return agent_config(_cfg(agent, env).agent)


def family(env: str) -> str:
    """The family from the env config itself (not from configs/agent/family): Atari = envpool `*-v5` tasks,
    MinAtar = `*-MinAtar` ids, everything else (CartPole, Acrobot, MountainCar, Catch, envpool CartPole) vector."""
    cfg = compose([f"env={env}"]).env
    if cfg.source == "envpool" and cfg.id.endswith("-v5"):
        return "atari"
    return "minatar" if cfg.id.endswith("-MinAtar") else "vector"


def test_every_shipped_env_has_a_family_file_and_the_families_are_the_expected_ones():
    assert len(ENVS) >= 12
    for env in ENVS:
        assert (CONFIG_DIR / "agent" / "family" / f"{env}.yaml").exists(), env
        text = (CONFIG_DIR / "agent" / "family" / f"{env}.yaml").read_text()
        assert "${agent}_" + family(env) in text, env
    fams = {env: family(env) for env in ENVS}
    assert fams["cartpole"] == fams["envpool/cartpole"] == fams["acrobot"] == fams["catch"] == "vector"
    assert fams["asterix-minatar"] == fams["breakout-minatar"] == "minatar"
    assert fams["envpool/pong"] == fams["envpool/breakout"] == "atari"


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("agent", AGENTS)
def test_agent_picks_the_family_preset(agent, env):
    cfg = _agent(agent, env)
    fam = family(env)
    expected = _agent(f"preset/{agent}_{fam}", env)  # the preset file itself, selected directly
    assert cfg == expected
    if fam == "vector":
        assert cfg == _agent(f"{agent}_small", env)  # the CartPole-tested small settings, exactly
    elif fam == "atari":
        assert cfg == _agent(f"{agent}_paper", env)
    # The sizes the family is about.
    if agent == "r2d2":
        assert (cfg.lstm_size, cfg.batch_size, cfg.sequence_length) == ((512, 64, 80) if fam == "atari" else (64, 32, 40))
        assert cfg.network.torso == ("auto" if fam == "atari" else "mlp")
    elif agent == "muesli":
        assert (cfg.batch_size, cfg.num_atoms) == ((96, 601) if fam == "atari" else (32, 81))
        assert cfg.network.hidden_sizes == {"vector": [128, 128], "minatar": [256, 128], "atari": [256, 256]}[fam]
    else:
        assert cfg.buffer_size == {"vector": 10_000, "minatar": 100_000, "atari": 100_000}[fam]
        assert cfg.network.torso == {"vector": "auto", "minatar": "mlp", "atari": "auto"}[fam]
        assert cfg.optim.name == ("rmsprop" if fam == "atari" else "adam")


def test_tested_settings_are_kept():
    """Settings the slow learning tests train with stay exactly what they were."""
    dqn = _agent("dqn", "cartpole")
    assert dqn == _agent("dqn", "envpool/cartpole")
    assert (dqn.network.hidden_sizes, dqn.buffer_size, dqn.learning_starts, dqn.target_update_period) == (
        [120, 84], 10_000, 10_000, 50)
    assert (dqn.optim.name, dqn.optim.lr, dqn.loss, dqn.epsilon_decay_steps) == ("adam", 2.5e-4, "mse", 250_000)
    r2d2 = _agent("r2d2_small", "cartpole")
    assert (r2d2.lstm_size, r2d2.burn_in, r2d2.period, r2d2.optim.lr, r2d2.learning_starts) == (64, 10, 20, 5e-4, 5000)
    muesli = _agent("muesli", "cartpole")
    assert (muesli.sequence_length, muesli.train_interval, muesli.support_max, muesli.discount) == (20, 8, 20.0, 0.99)
    # Muesli on MinAtar: the MinAtar suite's settings (replay ratio 4, MLP model, constant lr).
    minatar = _agent("muesli", "breakout-minatar")
    assert (minatar.train_interval, minatar.network.model, minatar.optim.lr_schedule) == (16, "mlp", "constant")
    # DQN on MinAtar: the Breakout-MinAtar comparison's overrides (scripts/muesli_experiments.py).
    from scripts.muesli_experiments import DQN_MINATAR

    assert _agent("dqn", "breakout-minatar") == agent_config(
        compose(["agent=dqn_small", "env=breakout-minatar", *DQN_MINATAR]).agent)


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("agent", AGENTS)
def test_paper_override_gives_the_paper_settings_on_any_env(agent, env):
    paper = _agent(f"{agent}_paper", env)
    assert paper == _agent(agent, "envpool/pong")
    if agent == "r2d2":
        assert (paper.lstm_size, paper.batch_size, paper.sequence_length, paper.burn_in) == (512, 64, 80, 40)
    elif agent == "muesli":
        from agents.muesli import Config

        assert paper == Config()  # muesli_paper.yaml == the dataclass defaults == the paper's table
    else:
        assert (paper.batch_size, paper.optim.name, paper.loss, paper.epsilon_end) == (32, "rmsprop", "huber", 0.1)


def test_single_keys_still_override_a_preset():
    cfg = _agent_with("agent=r2d2", "env=asterix-minatar", "agent.batch_size=8", "agent.lr=0.001")
    assert cfg.batch_size == 8 and cfg.optim.lr == 0.001 and cfg.lstm_size == 64


def _agent_with(*overrides):
    return agent_config(compose(list(overrides)).agent)


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("agent", AGENT_OPTIONS)
def test_every_agent_env_pair_validates(agent, env):
    typed_agent, typed_env = validate(_cfg(agent, env))
    assert typed_agent.name in AGENTS and typed_env.id


@pytest.mark.parametrize("agent", AGENT_OPTIONS)
def test_every_preset_takes_the_lr_schedule_keys_without_plus(agent):
    """The optimiser's schedule keys exist in every preset, so `agent.optim.lr_schedule=linear` needs no `+`
    (r2d2 and muesli_small used to refuse it as a key to append)."""
    cfg = _agent_with(f"agent={agent}", "env=cartpole", "agent.optim.lr_schedule=linear",
                      "agent.optim.lr_decay_updates=100", "agent.optim.lr_end_fraction=0.1")
    assert (cfg.optim.lr_schedule, cfg.optim.lr_decay_updates, cfg.optim.lr_end_fraction) == ("linear", 100, 0.1)
