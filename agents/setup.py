"""The one set-up step of a process (`setup()`), and config composition, which needs it (`compose`).

Importing a module of buffers/, rl/ or agents/ changes nothing outside it (tests/test_imports.py checks
this); what a process needs set once happens here, when an entry point asks: scripts.train and
scripts.evaluate first thing, `compose`, and agents/experiment.py's `run`, `train`, `evaluate_run` and
`load_policy` (tests/conftest.py for the tests). Each action is idempotent; `setup()` runs them once.

Like agents/experiment.py this is the application layer, above the agents: it needs the agents registry
(`agent=` options) and rl's pieces, and no agent and nothing under rl/ imports it.

`unknown_key(overrides)` turns an override of a key the config lacks (`agent.foo=1`, which hydra answers
with several lines suggesting `+agent.foo=1`, then refused by the schema) into one line naming the key and
the closest valid keys; `compose` raises it, scripts.train prints it.
"""

from __future__ import annotations

import difflib
import functools
import gc
import warnings
from collections.abc import Callable, Sequence

import jax
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import agents
from rl.config import CONFIG_DIR, ConfigError, refused_override, store_schema
from rl.envs import defer_plotting_imports
from rl.infra.logging import quiet_startup
from rl.infra.xla_cpu import unroll_threefry


@functools.cache
def setup() -> None:
    """Set the process up for runs, benchmarks and tests (once; later calls return at once)."""
    # Tracing and lowering allocate millions of short-lived objects into a heap that jax's caches keep growing:
    # with Python's default young generation (700) the collector's full passes cost ~6% of a run's start-up
    # and ~10% of a long-lived process's (the test suite's workers); with 20k, a fraction of that.
    gc.set_threshold(20_000, 10, 10)
    quiet_startup()  # before JAX starts its backends: no "Unable to initialize backend 'tpu'" or orbax INFO lines
    defer_plotting_imports()  # gymnax imports seaborn and pyplot for render helpers only: import them on use
    # The same random bits as jax's rolled CPU lowering, in far fewer kernels; a process that asks jax for
    # unoptimised programs (JAX_DISABLE_MOST_OPTIMIZATIONS=1: compile time over run time, as the test suite's
    # processes) keeps the rolled loop, which compiles ~25% faster.
    unroll_threefry(not jax.config.read("jax_disable_most_optimizations"))
    # Sebulba donates a key and a step counter XLA cannot reuse, which only warns: the buffers are what matter.
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    # envpool builds gymnasium Boxes from float64 bounds with a float32 dtype at every make: a harmless warning each.
    warnings.filterwarnings("ignore", message=r".*Box (low|high)'s precision lowered by casting", category=UserWarning)
    # hydra 1.3 deep-copies the ConfigStore (every agent's options) on each compose, half of its time; as on
    # hydra's main (facebookresearch/hydra#2928) copies read the live store (`ConfigStore.load` copies nodes).
    ConfigStore.__deepcopy__ = lambda self, memo: self
    store_schema()  # `base_config`, the typed top level configs/config.yaml starts from
    agents.register()  # every agent's `agent=` options


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """The config `python -m scripts.train <overrides>` would use (hydra's compose API, no run dir). An
    override the config would not honour (rl.config.refused_override) or of a key it lacks (`unknown_key`)
    is a one-line `ConfigError`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import ConfigCompositionException

    setup()
    overrides = list(overrides)
    problem = refused_override(overrides)
    if problem:
        raise ConfigError(problem)
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR), job_name="compose"):
        try:
            return hydra_compose(config_name, overrides=overrides)
        except ConfigCompositionException:
            problem = _unknown_key(overrides, lambda choices: hydra_compose(config_name, overrides=choices))
            if problem is None:
                raise
            raise ConfigError(problem) from None


def unknown_key(overrides: Sequence[str]) -> str | None:
    """One line for the first override (of `overrides`, a command line's) that sets a key the composed config
    lacks, naming it and the closest valid keys; None if there is none (or hydra cannot parse the line: hydra
    then says why)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    setup()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR), job_name="compose"):
        return _unknown_key(overrides, lambda choices: hydra_compose("config", overrides=choices))


def _groups() -> set[str]:
    """The config groups a command line picks options of (`agent=dqn`): configs/ folders and stored groups."""
    return {p.name for p in CONFIG_DIR.iterdir() if p.is_dir()} | set(ConfigStore.instance().repo)


def _unknown_key(overrides: Sequence[str], compose_choices: Callable[[list[str]], DictConfig]) -> str | None:
    """`unknown_key`, composing the overrides' group choices (the first of a sweep's) with `compose_choices`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if "=" in o and o[0] != "-"])
    except HydraException:
        return None
    groups, choices, keys = _groups(), [], []
    for o in parsed:
        name = o.key_or_group
        if name.split("/")[0] in groups or name.startswith("hydra"):
            if not o.is_delete() and "/" not in name:
                choices.append(f"{name}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override()
                               else o.input_line)
        elif not (o.is_add() or o.is_delete() or o.is_force_add()):
            keys.append(o)
    if not keys:
        return None
    try:
        cfg = compose_choices(choices)
    except (HydraException, OmegaConfBaseException):
        return None  # a bad group choice: hydra says which
    for o in keys:
        missing = _missing(cfg, o.key_or_group)
        if missing:
            return _message(o.input_line, missing, cfg)
    return None


def _missing(cfg: DictConfig, key: str) -> str | None:
    """The first prefix of dotted `key` that a struct node of `cfg` lacks, else None."""
    node, parts = cfg, key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            return None  # a list or a value below: hydra judges the rest
        if part not in node:
            return ".".join(parts[:i + 1]) if OmegaConf.is_struct(node) else None
        node = node._get_node(part)
    return None


def _message(line: str, missing: str, cfg: DictConfig) -> str:
    """`line` sets `missing`, which the config lacks: say so with the closest keys of its section."""
    section, _, _ = missing.rpartition(".")
    node = OmegaConf.select(cfg, section) if section else cfg
    valid = [f"{section}.{k}" if section else k for k in _keys(node)]
    if section.split(".")[0] in ("agent", "env"):  # a key at another depth of the agent or env section
        valid += [f"{section.split('.')[0]}.{k}" for k in _keys(cfg[section.split(".")[0]])]
    close = difflib.get_close_matches(missing, sorted(set(valid)), n=3, cutoff=0.0)
    where = f"`{section}`" if section else "the config"
    agent = f" (agent {cfg.agent.name})" if section.split(".")[0] == "agent" else ""
    return f"{line}: {where}{agent} has no key `{missing.rpartition('.')[2]}`; closest: {', '.join(close)}"


def _keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key at and below `node`."""
    out = []
    for k in node:
        out.append(f"{prefix}{k}")
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            out += _keys(child, f"{prefix}{k}.")
    return out
