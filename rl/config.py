"""Structured configs: the shared top-level schema and checks that run before anything is traced.

* `TrainConfig` (registered in hydra's ConfigStore as `base_config`, first in configs/config.yaml's
  defaults) types the keys every agent and env share, so hydra rejects `seeds=abc` at compose time.
* Each env source defines an `EnvConfig` dataclass and each agent a `Config` dataclass; `rl.envs.env_config`
  (the env-source registry) and `agents.agent_config` (the agents registry) turn the yaml section into that
  dataclass, rejecting unknown keys, wrong types and bad values (in the dataclass's `__post_init__`) with a
  `ConfigError` naming the section (`to_dataclass`).
* `validate(cfg)` (agents/experiment.py) runs all of these; scripts call it before building anything.
* `store_schema()` stores `TrainConfig` for hydra; agents.setup.setup calls it, and `agents.setup.compose`
  composes a config as the command line does.
* Agent presets (`agent=<name>_<preset>`, the env family's preset for `agent=<name>`): rl/presets.py.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

WANDB_MODES = ("offline", "online", "disabled")
# Keys that may differ between a run and its resumption (they do not change what is computed).
# `env.family` only picks the agent's preset, whose keys are compared themselves (runs saved before it existed lack it).
RESUME_FREE_KEYS = ("total_steps", "resume", "logger", "checkpoint", "log_interval", "eval_episodes", "eval_interval", "mesh",
                    "distributed", "on_nonfinite", "env.family")
# Env families (`family:` of every configs/env/*.yaml): each agent's yaml maps them to its presets.
ENV_FAMILIES = ("vector", "minatar", "atari")


class ConfigError(ValueError):
    """A config key or value is wrong; the message names it."""


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """`mesh` section: which devices the Anakin runner uses (rl/infra/sharding.py).

    devices: devices used in all (over all hosts); null = every device (`jax.device_count()`).
    seed_devices: how many of them split the vmapped seeds; the rest (`devices / seed_devices`) split
        envs, buffer and batch of each seed.
    """

    devices: int | None = None
    seed_devices: int = 1


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """`distributed` section: the multi-host start (rl/infra/distributed.py's docstring lists the keys)."""

    enabled: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: list[int] | None = None
    cluster_detection_method: str | None = None
    initialization_timeout: int = 300


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    mode: str = "offline"  # offline (default: no login, no network) | online | disabled
    project: str = "jaxrl"
    entity: str | None = None
    group: str | None = None
    name: str | None = None
    tags: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class LoggerConfig:
    wandb: WandbConfig = dataclasses.field(default_factory=WandbConfig)
    progress: bool = True  # live progress bar on the console
    plot: bool = True  # learning-curve PNG in the run dir at the end


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written (docs/faults.md): every `interval` env steps (0: none by steps) and every
    `every_minutes` of wall time (0: none by time; process 0's clock decides for all processes), so a crash
    loses at most that much; always at the end and on a signal. `on_error`: a failed save stops the run
    (`stop`) or is retried at the next checkpoint (`continue`)."""

    enabled: bool = True
    interval: int = 0  # env steps between checkpoints; 0 = none by steps
    every_minutes: float = 10.0  # wall-clock minutes between checkpoints; 0 = none by time
    keep: int = 2  # most recent checkpoints kept
    on_error: str = "stop"  # stop | continue


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    agent: Any = MISSING
    env: Any = MISSING
    logger: LoggerConfig = dataclasses.field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)  # devices of the Anakin runner
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)  # multi-host
    seed: int = 0
    seeds: int = 1  # seeds trained together, vmapped in one program
    total_steps: int = 500_000  # env steps per seed (summed over envs)
    num_envs: int = 10
    log_interval: int = 10_000  # env steps between host-side logs (one compiled chunk)
    eval_episodes: int = 10  # greedy episodes per seed at the end (and at each eval_interval)
    # env steps between greedy evaluations during training (logged as eval_return); 0: off; null: the runner's
    # default (rl/runners/loop.py:eval_every: a tenth of the run on gymnax envs, off on envpool)
    eval_interval: int | None = None
    resume: str | None = None  # a run dir to resume from (its saved config is used; see agents/experiment.py)
    on_nonfinite: str = "stop"  # NaN/Inf in a train metric or the params: stop (error) | skip the update
    # population.agent.<key>=[v1, v2, ...]: a hyperparameter population in one program (agents/experiment.py)
    population: dict[str, Any] = dataclasses.field(default_factory=dict)


def _structured(cls: type) -> DictConfig:
    """`cls`'s schema as a config hydra and `to_dataclass` can merge into (a frozen dataclass's nodes are
    read-only; the instance `to_object` makes of the merged config is frozen again)."""
    def writable(node):
        OmegaConf.set_readonly(node, None)
        for key in node.keys() if isinstance(node, DictConfig) else ():
            if isinstance(child := node._get_node(key), DictConfig):
                writable(child)
        return node

    return writable(OmegaConf.structured(cls))


@functools.cache
def _merge_base(cls: type) -> DictConfig:
    """`_structured(cls)`, built once per class for `to_dataclass` (`OmegaConf.merge` copies its first config and
    leaves it as it was); not for `_schema`, which edits the node it gets."""
    return _structured(cls)


def _schema():
    """`TrainConfig` for hydra, with `population` open: `population.agent.optim.lr=[...]` needs no `+`."""
    node = _structured(TrainConfig)
    OmegaConf.set_struct(node.population, False)
    return node


def store_schema() -> None:
    """Store `TrainConfig` in hydra's ConfigStore as `base_config` (configs/config.yaml's first default);
    idempotent (agents.setup.setup calls it)."""
    ConfigStore.instance().store(name="base_config", node=_schema())


def to_dataclass(cls: type, section: Any, where: str):
    """`section` (DictConfig/dict/dataclass) as an instance of `cls`, or a `ConfigError` naming `where`."""
    if isinstance(section, cls):
        return section
    try:
        merged = OmegaConf.merge(_merge_base(cls), section)
        return OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        lines = str(e).strip().splitlines() or [type(e).__name__]
        key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("full_key:")), "")
        raise ConfigError(f"bad config in `{where}`: {lines[0]}" + (f" (key `{key}`)" if key else "")) from None


def _positive(cfg: DictConfig, key: str, minimum: int = 1) -> None:
    value = OmegaConf.select(cfg, key)
    if not isinstance(value, int) or value < minimum:
        raise ConfigError(f"`{key}` must be an integer >= {minimum}, got {value!r}")


def check_top_level(cfg: DictConfig) -> TrainConfig:
    """Check the keys every run shares; returns them typed, with `agent` and `env` left empty
    (agents.experiment.validate types those)."""
    top = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in ("agent", "env")}
    typed = to_dataclass(TrainConfig, {**top, "agent": {}, "env": {}}, "config")  # unknown keys (`+foo=1`) refused
    for key in ("seeds", "total_steps", "num_envs", "log_interval"):
        _positive(cfg, key)
    for key in ("seed", "eval_episodes", "checkpoint.interval"):
        _positive(cfg, key, minimum=0)
    if cfg.get("eval_interval") is not None:
        _positive(cfg, "eval_interval", minimum=0)
    _positive(cfg, "checkpoint.keep")
    if not cfg.checkpoint.get("every_minutes", 0) >= 0:
        raise ConfigError(f"`checkpoint.every_minutes` must be >= 0 (0: no checkpoints by wall time), got "
                          f"{cfg.checkpoint.every_minutes}")
    if cfg.checkpoint.get("on_error", "stop") not in ("stop", "continue"):
        raise ConfigError(f"`checkpoint.on_error` must be stop or continue, got {cfg.checkpoint.on_error!r}")
    if cfg.get("eval_interval", 0) and not cfg.eval_episodes:
        raise ConfigError("`eval_interval` needs `eval_episodes` >= 1 (the greedy episodes of each evaluation)")
    if cfg.get("on_nonfinite", "stop") not in ("stop", "skip"):
        raise ConfigError(f"`on_nonfinite` must be stop or skip, got {cfg.on_nonfinite!r}")
    mode = OmegaConf.select(cfg, "logger.wandb.mode")
    if mode not in WANDB_MODES:
        raise ConfigError(f"`logger.wandb.mode` must be one of {WANDB_MODES}, got {mode!r}")
    return typed


def _diff(before: Any, now: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """`(dotted key, before, now)` for every leaf where two config containers differ."""
    if isinstance(before, dict) and isinstance(now, dict):
        out = []
        for k in sorted(set(before) | set(now)):
            out += _diff(before.get(k, "<absent>"), now.get(k, "<absent>"), f"{prefix}{k}.")
        return out
    return [] if before == now else [(prefix[:-1], before, now)]


def _free(key: str) -> bool:
    """Whether dotted `key` is (under) one of `RESUME_FREE_KEYS`."""
    return any(key == k or key.startswith(k + ".") for k in RESUME_FREE_KEYS)


def _refuse(diffs: list[tuple[str, Any, Any]]) -> None:
    diffs = [d for d in diffs if not _free(d[0])]
    if not diffs:
        return
    keys = ", ".join(k for k, _, _ in diffs[:8]) + (f" (+{len(diffs) - 8} more)" if len(diffs) > 8 else "")
    detail = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in diffs[:3])
    raise ConfigError(f"cannot resume: {keys} differ from the saved run ({detail}). On resume only "
                      f"{', '.join(RESUME_FREE_KEYS)} may change; start a new run to change the others.")


def check_resumable(saved: dict, cfg: DictConfig) -> None:
    """Raise a `ConfigError` naming the keys where `cfg` differs from the saved run's config (other than
    `RESUME_FREE_KEYS`, which may change on resume)."""
    now = OmegaConf.to_container(cfg, resolve=True)
    _refuse(_diff(dict(saved), now))


def resume_config(saved: dict, cfg: DictConfig, overrides: list[str] | tuple[str, ...]) -> DictConfig:
    """The config of a resumed run: the saved one, with the command line's `overrides` (already composed
    into `cfg`) applied where they touch `RESUME_FREE_KEYS`. An override of any other key that changes
    its saved value is refused (`ConfigError` naming the keys); repeating a saved value is fine."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    merged = OmegaConf.create(saved)
    diffs = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group.lstrip("+~")
        if key.startswith("hydra"):
            continue
        now = OmegaConf.select(cfg, key, default=None)
        now = OmegaConf.to_container(now, resolve=True) if OmegaConf.is_config(now) else now
        if _free(key):
            OmegaConf.update(merged, key, now, force_add=True, merge=False)
            continue
        before = OmegaConf.select(merged, key, default="<absent>")
        before = OmegaConf.to_container(before, resolve=True) if OmegaConf.is_config(before) else before
        diffs += _diff(before, now, f"{key}.")
    _refuse(diffs)
    return merged


CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


RENAMED = {"env.batch_size": "env.envs_per_recv"}  # old key -> its name (the old one read as the learner's batch)


def current_names(config: dict) -> dict:
    """A saved run's resolved config (plain containers) with `RENAMED` keys under their names now."""
    config = {**config}
    for old, new in RENAMED.items():
        (section, _, key), new_key = old.partition("."), new.partition(".")[2]
        if isinstance(config.get(section), dict) and key in config[section]:
            config[section] = {(new_key if k == key else k): v for k, v in config[section].items()}
    return config


def refused_override(overrides: list[str] | tuple[str, ...]) -> str | None:
    """One line for an override hydra would apply but the composed config would not honour, else None:
    `env.family`, which picks the agent's preset from the env config's own yaml when hydra composes it, and
    a key `RENAMED` since."""
    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key in RENAMED:
            return f"{override}: {key} is now {RENAMED[key]}; write {RENAMED[key]}={value}"
        if key == "env.family":
            return (f"{override}: env.family is the env config's own (it picks the agent's preset as the config "
                    f"is composed); for another preset on any env choose agent=<agent>_<preset>, e.g. "
                    f"agent=dqn_minatar")
    return None
