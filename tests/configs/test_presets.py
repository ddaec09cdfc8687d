"""Agent presets sized to the env family: each env config declares its `family` (configs/env/*.yaml), each agent
declares its presets once in agents/<agent>.yaml (`families: {family: preset}`, `presets: {name: keys that
differ from Config's defaults}`), and rl.presets.register_agent composes `Config` defaults < preset < the
command line into hydra's `agent=<agent>` (by the env's family) and `agent=<agent>_<preset>` (any env).
Composition only, but for the toy agent's short run."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import sys

import pytest
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import agents
from agents import agent_config
from agents.experiment import _filled, validate
from agents.setup import compose
from rl import config, presets
from rl.config import CONFIG_DIR, ConfigError
from rl.envs import env_config
from scripts.train import group_choices, unknown_choice

AGENTS = ("dqn", "r2d2", "muesli")
ENVS = sorted(str(p.relative_to(CONFIG_DIR / "env").with_suffix("")) for p in (CONFIG_DIR / "env").rglob("*.yaml"))
AGENT_OPTIONS = group_choices("agent")
COVERS = {  # read with ast by tests/test_option_coverage.py: literals only
    "env.gymnax.family": ["test_every_shipped_env_declares_its_family_once", "test_agent_picks_the_family_preset",
                          "test_an_unknown_family_is_refused_in_one_line"],
    "env.envpool.family": ["test_every_shipped_env_declares_its_family_once", "test_agent_picks_the_family_preset",
                           "test_an_unknown_family_is_refused_in_one_line"],
}


@functools.cache
def _cfg(agent: str, env: str):
    return compose([f"agent={agent}", f"env={env}"])


@functools.cache
def _agent(agent: str, env: str):
    return agent_config(_cfg(agent, env).agent)


def _section(*overrides):
    return OmegaConf.to_container(compose(list(overrides)).agent, resolve=True)


@functools.cache
def _presets_yaml(agent: str) -> dict:
    """agents/<agent>.yaml as plain containers (read once; callers copy what they change)."""
    return OmegaConf.to_container(OmegaConf.load(agents.presets_file(sys.modules[f"agents.{agent}"])))


def _families(agent: str) -> dict[str, str]:
    return _presets_yaml(agent)["families"]


FAMILIES = presets.env_families()  # env -> family, read once (the next test checks the reader)


def test_every_shipped_env_declares_its_family_once():
    fams = presets.env_families()
    assert sorted(fams) == ENVS and len(ENVS) >= 12 and set(fams.values()) == set(config.ENV_FAMILIES)
    assert fams["cartpole"] == fams["envpool/cartpole"] == fams["acrobot"] == fams["catch"] == "vector"
    assert fams["mountaincar"] == "vector"
    assert all(fams[e] == "minatar" for e in ENVS if e.endswith("-minatar"))
    assert fams["envpool/pong"] == fams["envpool/breakout"] == "atari"
    assert all(_cfg("dqn", env).env.family == fams[env] for env in ("cartpole", "breakout-minatar", "envpool/pong"))


def test_the_options_are_every_agent_and_its_presets_and_no_plumbing():
    assert AGENT_OPTIONS == sorted([*AGENTS, *(f"{a}_{p}" for a in AGENTS for p in ("small", "paper", "minatar"))])
    assert not (CONFIG_DIR / "agent").exists()  # no family/, preset/, *_small.yaml, *_paper.yaml


def _merged(base: dict, keys: dict) -> dict:
    """`base` with `keys` merged over it, nested mappings key by key."""
    out = dict(base)
    for k, v in keys.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _expected_section(agent: str, preset: str | None) -> dict:
    """What `agent=<agent>_<preset>` must compose to, worked out here from the dataclass and the yaml alone: every
    `Config` default, the shared `lr` key beside `optim.lr`, then the preset's mappings merged in order (a list
    item naming a preset brings its mappings); `optim.lr` follows `lr` unless a mapping sets it."""
    module = sys.modules[f"agents.{agent}"]
    plain = json.loads(json.dumps(dataclasses.asdict(module.Config())))  # tuples -> lists, as the yaml has them
    section = {"lr": plain["optim"]["lr"], **plain} if "lr" in plain.get("optim", {}) else plain
    presets_of = copy.deepcopy(_presets_yaml(agent).get("presets", {}))

    def parts(name):
        items = presets_of[name] if isinstance(presets_of[name], list) else [presets_of[name]]
        return [p for item in items for p in (parts(item) if isinstance(item, str) else [item])]

    chosen = parts(preset) if preset else []
    for part in chosen:
        section = _merged(section, part)
    if "lr" in section and not any("lr" in p.get("optim", {}) for p in chosen):
        section["optim"]["lr"] = section["lr"]
    return section


def _kind(env: str) -> str:
    """The first env of `env`'s source and family: a named preset's keys do not depend on the env (hydra stores
    it once), so one env per source and family shows it on all of them."""
    return next(e for e in ENVS if (e.rpartition("/")[0], FAMILIES[e]) == (env.rpartition("/")[0], FAMILIES[env]))


KINDS = sorted({_kind(e) for e in ENVS})  # one env per source and family


def _option_env_pairs():
    """`agent=<agent>` on every env (its preset follows the env); a named preset on one env per source and
    family (`KINDS`)."""
    return [(option, env) for option in AGENT_OPTIONS for env in (ENVS if option in AGENTS else KINDS)]


@pytest.mark.parametrize(("option", "env"), _option_env_pairs())
def test_every_option_composes_to_the_defaults_with_its_preset_merged_over_them(option, env):
    """Every `agent=` option on every env gives the `Config` defaults with its preset's keys merged over them
    (`agent=<agent>` the preset its yaml names for the env's family), key for key, and the composed section
    holds every effective key (nothing left for the dataclass defaults to fill)."""
    agent, _, preset = option.partition("_")
    if not preset:
        preset = _families(agent).get(FAMILIES[env])
    cfg = _cfg(option, env)
    section = OmegaConf.to_container(cfg.agent, resolve=True)
    assert section == _expected_section(agent, preset)
    assert _filled(OmegaConf.to_container(cfg, resolve=True))["agent"] == section


def test_the_expected_section_reads_the_preset():
    """The reference above is not the defaults alone: the small R2D2 preset's keys and its lr reach it."""
    small = _expected_section("r2d2", "small")
    assert (small["lstm_size"], small["lr"], small["optim"]["lr"], small["network"]["torso"]) == (64, 5e-4, 5e-4, "mlp")
    assert _expected_section("r2d2", None)["lstm_size"] == 512
    assert _expected_section("dqn", "minatar")["network"]["hidden_sizes"] == [256, 128]  # a list: small, then keys


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("agent", AGENTS)
def test_agent_picks_the_family_preset(agent, env):
    cfg = _agent(agent, env)
    fam = FAMILIES[env]
    assert cfg == _agent(f"{agent}_{_families(agent)[fam]}", _kind(env))  # the preset its yaml names, selected directly
    if fam == "vector":
        assert cfg == _agent(f"{agent}_small", _kind(env))  # the CartPole-tested small settings, exactly
    elif fam == "atari":
        assert cfg == _agent(f"{agent}_paper", _kind(env))
    else:
        assert cfg == _agent(f"{agent}_minatar", "cartpole")
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
    # Muesli on MinAtar: the MinAtar suite's settings (replay ratio 4, MLP model, constant lr) and its
    # exploration floor (an entropy bonus and a uniform share in CMPO's prior).
    minatar = _agent("muesli", "breakout-minatar")
    assert (minatar.train_interval, minatar.network.model, minatar.optim.lr_schedule) == (16, "mlp", "constant")
    assert (minatar.entropy_weight, minatar.prior_uniform_mix) == (0.1, 0.03)
    # DQN on MinAtar: the small preset with the MinAtar paper's replay size and epsilon schedule and Muesli's
    # MinAtar torso (the MinAtar suite's settings).
    minatar_dqn = ["agent.buffer_size=100000", "agent.epsilon_decay_steps=100000", "agent.epsilon_end=0.1",
                   "agent.network.torso=mlp", "agent.network.hidden_sizes=[256,128]"]
    assert _agent("dqn", "breakout-minatar") == agent_config(
        compose(["agent=dqn_small", "env=breakout-minatar", *minatar_dqn]).agent)


@pytest.mark.parametrize("env", KINDS)
@pytest.mark.parametrize("agent", AGENTS)
def test_paper_override_gives_the_paper_settings_on_any_env(agent, env):
    paper = _agent(f"{agent}_paper", env)
    assert paper == _agent(agent, "envpool/pong")
    if agent == "r2d2":
        assert (paper.lstm_size, paper.batch_size, paper.sequence_length, paper.burn_in) == (512, 64, 80, 40)
    elif agent == "muesli":
        from agents.muesli import Config

        assert paper == Config()  # the paper preset is empty: the dataclass defaults are the paper's table
    else:
        assert (paper.batch_size, paper.optim.name, paper.loss, paper.epsilon_end) == (32, "rmsprop", "huber", 0.1)


def test_single_keys_still_override_a_preset():
    cfg = _agent_with("agent=r2d2", "env=asterix-minatar", "agent.batch_size=8", "agent.lr=0.001")
    assert cfg.batch_size == 8 and cfg.optim.lr == 0.001 and cfg.lstm_size == 64
    # A key the preset itself sets: the command line wins, the preset's other keys stay.
    cfg = _agent_with("agent=dqn", "env=breakout-minatar", "agent.buffer_size=123", "agent.network.hidden_sizes=[8]")
    assert (cfg.buffer_size, cfg.network.hidden_sizes, cfg.network.torso, cfg.epsilon_end) == (123, [8], "mlp", 0.1)
    assert _agent_with("agent=muesli_paper", "env=cartpole", "agent.num_atoms=51").num_atoms == 51


def test_unknown_keys_are_refused_by_name():
    """One line naming the key and the closest valid keys (agents.setup.unknown_key), not hydra's `+` hint."""
    for override, key, close in (("agent.lrr=1", "lrr", "agent.lr"),
                                 ("agent.network.hidden=[4]", "hidden", "agent.network.hidden_sizes")):
        with pytest.raises(ConfigError, match=rf"has no key `{key}`; closest: .*\b{close}\b") as e:
            compose(["agent=dqn", "env=breakout-minatar", override])
        assert "\n" not in str(e.value) and "+" not in str(e.value)
    with pytest.raises(ConfigError, match="foo"):  # `+` appends it to the section: the typed config refuses it
        validate(compose(["agent=r2d2_small", "+agent.foo=1"]))


def test_sweeps_over_agent_keys_compose_each_run():
    """hydra -m composes each combination as a plain run: `agent=dqn,muesli env=... agent.lr=a,b`."""
    for agent in ("dqn", "muesli"):
        for lr in (1e-3, 3e-4):
            cfg = _agent_with(f"agent={agent}", "env=breakout-minatar", f"agent.lr={lr}")
            assert cfg.optim.lr == lr and cfg.network.hidden_sizes == [256, 128]


def _agent_with(*overrides):
    return agent_config(compose(list(overrides)).agent)


@pytest.mark.parametrize(("agent", "env"), _option_env_pairs())
def test_every_agent_env_pair_validates(agent, env):
    """validate types the agent and env sections apart (no key of one reads the other), so every env with every
    `agent=<agent>` and every named preset on one env per source and family covers every pair."""
    typed = validate(_cfg(agent, env))
    assert typed.agent.name in AGENTS and typed.env.id
    assert type(typed.env).__module__.endswith(f"{typed.env.source}_source")  # the source's own EnvConfig


@pytest.mark.parametrize("agent", AGENT_OPTIONS)
def test_every_preset_takes_the_lr_schedule_keys_without_plus(agent):
    """The optimiser's schedule keys exist in every preset, so `agent.optim.lr_schedule=linear` needs no `+`
    (r2d2 and muesli_small used to refuse it as a key to append)."""
    cfg = _agent_with(f"agent={agent}", "env=cartpole", "agent.optim.lr_schedule=linear",
                      "agent.optim.lr_decay_updates=100", "agent.optim.lr_end_fraction=0.1")
    assert (cfg.optim.lr_schedule, cfg.optim.lr_decay_updates, cfg.optim.lr_end_fraction) == ("linear", 100, 0.1)


# ---- refusals: one line each -------------------------------------------------------------------------------

def _one_line(err) -> str:
    message = str(err.value)
    assert len(message.splitlines()) == 1, message
    return message


def test_an_unknown_family_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"env.family='mujoco' is not an env family; env families: vector") as err:
        env_config({"source": "gymnax", "id": "CartPole-v1", "family": "mujoco"})
    _one_line(err)
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "hopper.yaml").write_text("source: gymnax\nid: CartPole-v1\nfamily: mujoco\n")
    with pytest.raises(ConfigError, match=r"hopper.yaml: `family` must be one of vector, minatar, atari") as err:
        presets.env_families(tmp_path)
    _one_line(err)
    (tmp_path / "env" / "hopper.yaml").write_text("source: gymnax\nid: CartPole-v1\n")  # none declared
    with pytest.raises(ConfigError, match="got None"):
        presets.env_families(tmp_path)
    # On the command line: the env config's own family picks the preset; another preset is agent=<a>_<preset>.
    with pytest.raises(ConfigError, match=r"env.family=atari: env.family is the env config's own") as err:
        compose(["agent=dqn", "env=cartpole", "env.family=atari"])
    _one_line(err)
    assert unknown_choice(["env=cartpole", "env.family=atari"]).startswith("env.family=atari: ")


@pytest.mark.parametrize("text, match", [
    ("families: {mujoco: small}\npresets: {small: {}}", r"families.mujoco: not an env family; env families: vector"),
    ("families: {vector: smal}\npresets: {small: {}}", r"families.vector: no preset 'smal'; its presets: small"),
    ("presets: {small: {batch_sise: 3}}", r"preset 'small': Key 'batch_sise' is not in struct"),
    ("presets: {small: {batch_size: 0}}", r"preset 'small'.*batch_size must be >= 1"),
    ("presets: {a: [b], b: [a]}", r"preset 'a' includes itself \(a -> b -> a\)"),
    ("presets: {small: 3}", r"preset 'small' must be a mapping of keys or a list"),
    ("preset: {small: {}}", r"holds `families` and `presets` only"),
])
def test_a_bad_presets_file_is_refused_in_one_line_naming_it(tmp_path, text, match):
    from agents.dqn import Config

    path = tmp_path / "dqn.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as err:
        presets.agent_presets(Config, path)
    assert _one_line(err).startswith(str(path))


def test_an_unknown_preset_is_refused_in_one_line():
    assert unknown_choice(["agent=dqn_nope", "env=cartpole"]).startswith("agent=dqn_nope is not an agent option; "
                                                                         "choose one of ['dqn', 'dqn_minatar'")
    assert "\n" not in unknown_choice(["agent=dqn_nope"])
    with pytest.raises(ConfigCompositionException, match="dqn_nope"):  # hydra's own message, from Python
        compose(["agent=dqn_nope"])


# ---- resume ------------------------------------------------------------------------------------------------

def test_a_run_saved_before_the_families_resumes():
    """A saved config of the old layout (no env.family; muesli_small.yaml listed only some keys) matches the
    config composed now, compared whole or through the command line repeated (as scripts.benchmark does)."""
    def filled(cfg):
        return _filled(OmegaConf.to_container(cfg, resolve=True))

    saved = OmegaConf.to_container(compose(["agent=muesli", "env=cartpole"]), resolve=True)
    del saved["env"]["family"]
    for key in ("impala_channels", "cnn_dense", "model"):  # keys muesli_small.yaml did not list
        del saved["agent"]["network"][key]
    for key in ("replay_fraction", "unroll_steps", "pg_weight"):
        del saved["agent"][key]
    config.check_resumable(_filled(saved), OmegaConf.create(filled(compose(["agent=muesli", "env=cartpole"]))))
    command = ["agent=muesli_small", "env=cartpole", "total_steps=9"]
    assert config.resume_config(_filled(saved), OmegaConf.create(filled(compose(command))), command).total_steps == 9
    with pytest.raises(ConfigError, match="cannot resume: agent.batch_size"):
        config.check_resumable(_filled(saved), OmegaConf.create(filled(compose(["agent=muesli", "agent.batch_size=8"]))))



def test_resume_compares_interpolations_by_their_values():
    """A key given as an interpolation (`agent.batch_size=${num_envs}`) matches a saved run whose value is the
    same number; the saved config is resolved, so the one resumed is compared resolved."""
    now = compose(["agent=dqn", "env=cartpole"])
    saved = _filled(OmegaConf.to_container(now, resolve=True))
    saved["agent"]["batch_size"] = int(now.num_envs)
    now.agent.batch_size = "${num_envs}"
    config.check_resumable(saved, now)
    saved["agent"]["batch_size"] += 1
    with pytest.raises(ConfigError, match="cannot resume: agent.batch_size"):
        config.check_resumable(saved, now)


def test_a_section_that_was_a_value_is_refused_by_name():
    """A saved run whose `agent.network` was a plain value where the config now has a section: resuming is
    refused naming the key (not a crash comparing a value with a section)."""
    now = compose(["agent=dqn", "env=cartpole"])
    saved = _filled(OmegaConf.to_container(now, resolve=True))
    saved["agent"]["network"] = "mlp"
    with pytest.raises(ConfigError, match="cannot resume: agent.network"):
        config.check_resumable(saved, now)


def test_a_free_section_given_on_resume_replaces_the_saved_one():
    """`logger=none` on resume replaces the saved logger section whole: a key only the saved run had is gone."""
    saved = _filled(OmegaConf.to_container(compose(["agent=dqn", "env=cartpole"]), resolve=True))
    saved["logger"]["stale"] = 1
    command = ["agent=dqn", "env=cartpole", "logger=none"]
    now = compose(command)
    merged = config.resume_config(saved, now, command)
    assert OmegaConf.to_container(merged.logger) == OmegaConf.to_container(now.logger, resolve=True)


def test_a_renamed_key_is_refused_naming_its_new_name_and_old_runs_resume_with_it():
    """`env.batch_size` (envs per recv, read as the learner's batch) is `env.envs_per_recv` now: on the
    command line the old name gets one line naming the new one; a run saved with the old name resumes."""
    with pytest.raises(ConfigError, match=r"env.batch_size=4: env.batch_size is now env.envs_per_recv; "
                                          r"write env.envs_per_recv=4") as err:
        compose(["agent=dqn", "env=envpool/cartpole", "env.batch_size=4"])
    _one_line(err)
    now = ["agent=dqn", "env=envpool/cartpole", "env.envs_per_recv=4"]
    saved = OmegaConf.to_container(compose(now), resolve=True)
    saved["env"] = {("batch_size" if k == "envs_per_recv" else k): v for k, v in saved["env"].items()}
    filled = _filled(config.current_names(saved))
    assert filled["env"]["envs_per_recv"] == 4 and "batch_size" not in filled["env"]
    config.check_resumable(filled, OmegaConf.create(_filled(OmegaConf.to_container(compose(now), resolve=True))))

# ---- a new agent: its module and one yaml ------------------------------------------------------------------

TOY = '''"""A toy agent: DQN with one hidden layer of `width` units (agents/dqn.py does the work)."""
import dataclasses

from agents import dqn


@dataclasses.dataclass
class Config:
    name: str = "toy"
    width: int = 32
    learning_starts: int = 100
    optim: dqn.OptimConfig = dataclasses.field(default_factory=lambda: dqn.OptimConfig(lr=1e-3))

    def __post_init__(self):
        if self.width < 1:
            raise ValueError(f"agent.width must be >= 1, got {self.width}")


def make_agent(cfg, **spaces):
    return dqn.make_agent(dqn.Config(batch_size=16, buffer_size=400, learning_starts=cfg.learning_starts,
                                     network=dqn.NetworkConfig(hidden_sizes=[cfg.width]), optim=cfg.optim), **spaces)
'''
TOY_PRESETS = """families: {minatar: wide}  # vector and atari envs: Config's defaults
presets:
  wide: {width: 64, lr: 5.0e-4}
"""


@contextlib.contextmanager
def toy_agent(tmp_path, monkeypatch):
    """The toy agent registered (its module and yaml in a folder on the registry's path), removed after."""
    folder = tmp_path / "more_agents"
    folder.mkdir()
    (folder / "toy.py").write_text(TOY)
    (folder / "toy.yaml").write_text(TOY_PRESETS)
    monkeypatch.setattr(agents, "__path__", [*agents.__path__, str(folder)])
    options = agents.register()  # what agents.setup.setup does: every agent's options stored, the toy's too
    try:
        yield options
    finally:
        repo = ConfigStore.instance().repo
        for option in ("toy.yaml", "toy_wide.yaml"):
            repo["agent"].pop(option, None)
        repo["_agent_by_env"].pop("toy", None)
        repo["_agent_by_family"].pop("toy", None)
        sys.modules.pop("agents.toy", None)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    with toy_agent(tmp_path, monkeypatch) as options:
        yield options


def test_a_new_agent_is_its_module_and_one_yaml(toy, tmp_path):
    """The toy agent is found by name: `agent=toy` takes the preset its yaml names for the env's family (the
    defaults where it names none), `agent=toy_wide` the preset on any env, single keys override either,
    unknown keys are refused, and it trains through the runner."""
    from agents.experiment import run

    assert toy["toy"] == toy["toy_wide"] == "toy" and "toy" in group_choices("agent")
    assert _section("agent=toy", "env=cartpole") == {"name": "toy", "width": 32, "learning_starts": 100, "lr": 1e-3,
                                                     "optim": {**_section("agent=dqn")["optim"], "lr": 1e-3}}
    assert agent_config(compose(["agent=toy", "env=breakout-minatar"]).agent).width == 64
    wide = agent_config(compose(["agent=toy_wide", "env=cartpole"]).agent)
    assert (wide.width, wide.optim.lr) == (64, 5e-4)
    assert agent_config(compose(["agent=toy", "env=breakout-minatar", "agent.width=8"]).agent).width == 8
    with pytest.raises(ConfigError, match=r"agent.batch_size=8: `agent` \(agent toy\) has no key `batch_size`"):
        compose(["agent=toy", "agent.batch_size=8"])
    with pytest.raises(ConfigError, match="agent.width must be >= 1"):
        validate(compose(["agent=toy", "agent.width=0"]))
    cfg = compose(["agent=toy", "env=cartpole", "total_steps=400", "num_envs=4", "log_interval=200", "logger=none",
                   "eval_episodes=2", "checkpoint.enabled=false"])
    assert run(cfg, tmp_path / "run")["env_steps"] == 400


def test_the_toy_agent_leaves_nothing_behind(tmp_path):
    """The toy fixture removes its options again (they are global in hydra's ConfigStore)."""
    with pytest.MonkeyPatch.context() as monkeypatch, toy_agent(tmp_path, monkeypatch) as options:
        assert "toy" in group_choices("agent") and "toy" in options
    assert "toy" not in group_choices("agent") and "toy" not in agents.available_agents()
