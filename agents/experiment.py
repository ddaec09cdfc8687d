"""The one wiring place: a composed config -> env source, agent, runner -> the host loop (rl/runners/loop.py).

The application layer, with agents/setup.py: it stands above the agents (it builds them through the agents
registry, as it builds sources through rl.envs), so it lives in this package rather than under rl/, which the
agents import: buffers <- rl <- agents <- this. Nothing under rl/ and no agent imports it. `scripts/train.py`,
`scripts/evaluate.py` and users' code call it; `run`, `train`, `evaluate_run` and `load_policy` first run the
process's set-up step (agents.setup.setup):

* `train(*overrides, run_dir=None) -> dict`: what `python -m scripts.train <overrides>` does, from Python
  (`from agents.experiment import train; train("agent=dqn", "env=cartpole", "total_steps=20000")`); returns
  the host loop's result dict (final state included).
* `run(cfg, run_dir, overrides=None) -> dict`: train a composed config into `run_dir`.
* `evaluate_run(run_dir, episodes, seed) -> [S, episodes]`: greedy returns of a saved run, either source.
* `load_policy(run_dir, seed=0) -> Policy`: one seed's jitted evaluation policy and its parameters, for a
  user's own code (`act(obs, carry) -> (actions, carry)`, `export(path)` as msgpack).
* `build(cfg) -> runner`: the runner (`rl.runners.anakin.Anakin` for gymnax, `rl.runners.sebulba.Sebulba` for envpool)
  with its source and agent.

`run` keeps the Anakin runners of the process's last `KEEP` runs: a later run whose programs are the same (the
config but the keys only the host loop reads, `HOST_KEYS`; the same agent schedules' length) takes the runner
and its compiled programs, so a resume or the same config trained again in one process compiles nothing.

A population (`population.agent.<key>=[v1,v2,...]`, rl/learning/population.py: `members`) trains every
combination of the values x `seeds` in one Anakin program; keys outside the agent's `POPULATION_KEYS`, other
population sections and the envpool runner are refused with one line. Its metrics.csv rows carry each
member's overrides, `summary.csv` in the run dir has one row per member, and `run` returns them as
`result["members"]`. With `population.pbt.interval` > 0 it is population-based training (rl/learning/pbt.py):
the run dir's `pbt.csv` gets the lineage (rl/infra/lineage.py) and metrics.csv rows the current values.

Resuming (`resume=<run dir>`): the saved run's config is used; `overrides` (the command line) may change
only `rl.config.RESUME_FREE_KEYS` (total_steps, logging, checkpoint cadence, eval episodes, ...), anything
else that differs is refused naming the keys. Both configs are compared with every agent and env field
present (the dataclass default where a yaml had no key), so a preset that later spells out a key at its
default value still resumes older runs. The run continues in the saved run dir (metrics.csv
appended, the same wandb run). A run dir holding a checkpoint but no summary.json (a run that was stopped,
e.g. requeued by SLURM into the same dir) is resumed from it automatically.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from omegaconf import DictConfig, OmegaConf

from agents import agent_config, make_agent, population_bounds, population_keys
from agents.setup import compose, setup
from rl.config import ConfigError, TrainConfig, check_resumable, check_top_level, current_names, resume_config
from rl.envs import env_config, make_source, runner_of
from rl.infra import checkpoint, memory, xla_cpu
from rl.learning.pbt import PBTConfig, pbt_config
from rl.learning.population import Population, canonical
from rl.learning.population import members as population_members
from rl.runners import loop


def validate(cfg: DictConfig) -> TrainConfig:
    """Check the whole composed config once, before anything is built: the config typed once, as
    `rl.config.TrainConfig` with its `agent` and `env` sections as their dataclasses (the agent's config,
    the source's `EnvConfig`); a `ConfigError` naming the key otherwise. Runners take this, never the raw
    config."""
    typed = check_top_level(cfg)
    typed = dataclasses.replace(typed, agent=agent_config(cfg.agent), env=env_config(cfg.env))
    if typed.population and runner_of(typed.env) == "sebulba":
        raise ConfigError(f"population: the envpool (Sebulba) runner trains one setting per run (env "
                          f"{typed.env.id}); sweep the hyperparameters with hydra -m instead")
    if "lr" in typed.population.get("agent", {}) and cfg.agent.get("lr") != cfg.agent.optim.lr:
        raise ConfigError("population.agent.lr: the members' agent.optim.lr does not follow it (set on the command "
                          "line as well?); vary population.agent.optim.lr instead")
    return typed


def _members(typed: TrainConfig) -> tuple[list[dict], list[dict], PBTConfig | None]:
    """`typed.population`'s members (`rl.learning.population.members`: values by population key, overrides),
    each member's agent config typed and checked as its separate run's, and its PBT config (`PBTConfig` or
    None); `([], [], None)` without a population. Anything that cannot form a population is refused with one
    line (`ConfigError`; `validate` refuses what needs the composed config to see)."""
    spec, agent_cfg = typed.population, typed.agent

    def member_config(member: dict):  # the member's agent config: the run's with the member's values set
        section = dataclasses.asdict(agent_cfg)
        for key, value in member.items():
            *path, leaf = canonical(key).split(".")
            node = section
            for part in path:
                node = node[part]
            node[leaf] = value
        return agent_config(section)

    try:
        values, overrides = population_members(spec, agent_cfg, population_keys(agent_cfg.name), member_config)
        return values, overrides, pbt_config(spec.get("pbt"), len(values))
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None


def build(cfg: TrainConfig | DictConfig):
    """The runner for `cfg` (validated first where it is still the composed DictConfig): its env source, the
    agent built for its spaces and the run's length (a `Population` of it where `cfg.population` names one)."""
    typed = cfg if isinstance(cfg, TrainConfig) else validate(cfg)
    agent_cfg, env_cfg = typed.agent, typed.env
    member_values, member_overrides, pbt = _members(typed)
    # Sebulba with several processes: `num_envs` envs per process, seeded apart, each with its buffer rows.
    processes = jax.process_count() if runner_of(env_cfg) == "sebulba" else 1
    seed = typed.seed + jax.process_index() * typed.num_envs * (processes > 1)
    source = make_source(env_cfg, typed.num_envs, seed=seed)  # built once, handed to the runner
    try:
        agent = make_agent(agent_cfg, obs_shape=source.obs_shape, obs_dtype=source.obs_dtype,
                           num_actions=source.num_actions, num_envs=source.num_envs * processes,
                           total_steps=typed.total_steps)
    except ValueError as e:  # settings the env's spaces cannot take (a torso for other observations, ...)
        msg = f"agent.{e}" if str(e).startswith("network.") else str(e)
        raise ConfigError(f"{msg} (env {env_cfg.id}: observations {tuple(source.obs_shape)}, "
                          f"{source.num_actions} actions)") from None
    if member_values:
        agent = Population(agent, member_values, typed.seeds, member_overrides, pbt=pbt,
                           bounds=population_bounds(agent_cfg.name))
    if runner_of(env_cfg) == "sebulba":
        from rl.runners.sebulba import Sebulba

        return Sebulba(typed, agent, source)
    from rl.runners.anakin import Anakin

    return Anakin(typed, agent, source)


# Anakin runners of this process's latest runs by `_program_key`: a run whose programs would be the same (a
# resume, the same config trained again from Python, the test suite's runs) takes the kept runner and with it
# its traced and compiled programs. Sebulba runners hold actor threads and are built for each run.
_KEPT: dict[str, Any] = {}
KEEP = 4
# TrainConfig keys no compiled program reads: the host loop's (rl/runners/loop.py) and the run's length, which
# reaches the programs only as the agent's `run_updates` (its schedules' length, part of the key) or, in a
# population, through its members' values (a population run's key keeps `total_steps`).
HOST_KEYS = ("total_steps", "logger", "checkpoint", "distributed", "log_interval", "eval_episodes", "eval_interval",
             "resume")


def _program_key(runner) -> str:
    """What an Anakin runner's programs are built from: its config but `HOST_KEYS`, the agent's `run_updates`,
    the process count and the settings programs are lowered and compiled with."""
    agent = runner.agent.agent if isinstance(runner.agent, Population) else runner.agent
    cfg = {k: v for k, v in dataclasses.asdict(runner.cfg).items()
           if k not in HOST_KEYS or (k == "total_steps" and runner.cfg.population)}
    return json.dumps([cfg, getattr(agent, "run_updates", None), jax.process_count(),
                       jax.config.read("jax_disable_most_optimizations"), xla_cpu.threefry_unrolled()],
                      sort_keys=True, default=str)


def _runner(typed: TrainConfig):
    """`build(typed)`, or the kept Anakin runner with its `_program_key` (its `cfg` then `typed`)."""
    runner = build(typed)
    if runner_of(typed.env) == "sebulba":
        return runner
    key = _program_key(runner)
    kept = _KEPT.pop(key, None)
    if kept is not None:
        kept.cfg, kept.lineage, runner = typed, None, kept
    _KEPT[key] = runner
    while len(_KEPT) > KEEP:
        del _KEPT[next(iter(_KEPT))]
    return runner


def _unfinished(run_dir: Path) -> bool:
    return checkpoint.latest_step(run_dir) is not None and not (run_dir / "summary.json").exists()


def _filled(config: dict) -> dict:
    """A resolved config container with every field of its agent and env dataclasses present (defaults where
    the yaml had no key; the yaml's own keys, such as the shared `agent.lr`, kept)."""
    typed = {"agent": agent_config(config["agent"]), "env": env_config(config["env"])}
    filled = {k: OmegaConf.merge(dataclasses.asdict(v), config[k]) for k, v in typed.items()}
    return OmegaConf.to_container(OmegaConf.merge(config, filled), resolve=True)


def prepare(cfg: DictConfig, run_dir: str | Path, overrides: list[str] | None = None):
    """`(cfg, run_dir, resume_from)` after resolving `cfg.resume` (see the module docstring)."""
    run_dir = Path(run_dir)
    if cfg.resume is None and _unfinished(run_dir):
        cfg = OmegaConf.merge(cfg, {"resume": str(run_dir)})
    if cfg.resume is None:
        return cfg, run_dir, None
    resume_dir = Path(cfg.resume)
    saved = _filled(current_names(checkpoint.read_meta(resume_dir)["config"]))
    now = OmegaConf.create(_filled(OmegaConf.to_container(cfg, resolve=True)))
    if overrides is None:
        check_resumable(saved, now)
    else:
        cfg = resume_config(saved, now, overrides)
    cfg.resume = str(resume_dir)
    return cfg, resume_dir, resume_dir


def _warn_idle(cfg: TrainConfig, runner, note) -> None:
    starts, total = int(runner.agent.learning_starts), cfg.total_steps
    if starts > total:
        note(f"warning: total_steps={total} < the agent's learning_starts={starts}: no train step will run "
             f"(set agent.learning_starts lower or total_steps higher)")


def run(cfg: DictConfig, run_dir: str | Path, overrides: list[str] | None = None) -> dict:
    """Train `cfg` into `run_dir` (or continue the run it resumes); returns the host loop's result dict.
    A run whose state would not fit the memory is refused first (`ConfigError`, rl/infra/memory.py).

    `overrides`: the command line that composed `cfg` (used to resume: see the module docstring); None
    compares the whole config with a resumed run's."""
    from rl.infra import distributed
    from rl.infra.logging import RunLogger

    setup()
    distributed.initialize(check_top_level(cfg).distributed)  # before anything touches JAX; no-op unless enabled
    run_dir = distributed.shared_run_dir(run_dir)  # several processes: process 0's, for one set of checkpoints
    cfg, run_dir, resume_from = prepare(cfg, run_dir, overrides)
    typed = validate(cfg)  # what everything below reads; `record` is what the run saves as its config
    runner = _runner(typed)
    need = memory.check(runner, typed)  # before anything is allocated or written
    population = runner.agent if isinstance(runner.agent, Population) else None
    logger = RunLogger(typed, run_dir, record=OmegaConf.to_container(cfg, resolve=True),
                       rows=population.row_labels() if population else None, primary=distributed.is_main_process())
    if population is not None and population.pbt is not None and logger.primary:
        from rl.infra.lineage import FILENAME, Lineage

        start = checkpoint.latest_step(resume_from) if resume_from is not None else None
        runner.lineage = Lineage(logger.run_dir / FILENAME, population.keys, resume_step=start)
        logger.paths["pbt_lineage"] = runner.lineage.path
    try:
        if need.total > memory.GB:
            logger.note(f"memory: this run holds about {need.describe()}")
        _warn_idle(typed, runner, logger.note)
        result = loop.run(typed, runner, logger, resume_from)
        if population is not None:
            result["members"] = _member_results(result, population, logger)
        return result
    finally:
        logger.close()


def _member_results(result: dict, population: Population, logger) -> list[dict]:
    """Per member: its row of `summary.csv` (written here, rl/infra/sweep.py) and its seeds' `eval_returns`
    `[seeds, K]` and `episode_return` `[seeds]`."""
    from rl.infra.sweep import summarize_members

    rows = summarize_members(logger.run_dir, population.overrides)
    logger.paths["population_summary"] = logger.run_dir / "summary.csv"
    seeds = population.seeds
    return [{**row, "overrides": population.overrides[m],
             "eval_returns": result["eval_returns"][m * seeds:(m + 1) * seeds],
             "episode_return": result["episode_return"][m * seeds:(m + 1) * seeds]} for m, row in enumerate(rows)]


def train(*overrides: str, run_dir: str | Path | None = None) -> dict:
    """`python -m scripts.train <overrides>` from Python; the run dir defaults to outputs/<date>/<time>."""
    import time

    cfg = compose(list(overrides))
    run_dir = run_dir or Path("outputs") / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")
    return run(cfg, run_dir, list(overrides))


def _restored(run_dir: str | Path):
    """`(cfg, runner, state)` of the run saved in `run_dir`: its config, the runner built from it, the newest
    checkpoint's state."""
    setup()
    cfg = OmegaConf.create(current_names(checkpoint.read_meta(run_dir)["config"]))
    runner = _runner(validate(cfg))
    state, _ = checkpoint.restore(run_dir, runner.restore_target())
    return cfg, runner, state


def evaluate_run(run_dir: str | Path, episodes: int = 10, seed: int = 0) -> np.ndarray:
    """Greedy returns `[S, episodes]` of every seed of the run saved in `run_dir` (either source)."""
    _, runner, state = _restored(run_dir)
    return runner.evaluate(runner.place(state), episodes, jax.random.PRNGKey(seed))


class Policy:
    """A saved run's evaluation policy for one seed, for a user's own code (`load_policy`).

    `act(obs [E, *obs_shape], carry, key=None) -> (actions [E] int32, carry)` is jitted and acts as the run's
    greedy evaluation does (`agent.act(..., explore=False)` with the online parameters); `key` matters only for
    an evaluation policy that samples (e.g. DQN's `eval_epsilon` > 0). `initial_carry(E)` starts episodes
    (`()` for feed-forward agents; reset it yourself where an episode ends). `params` are the online network's
    parameters; `export(path)` writes them as flax msgpack (`flax.serialization.from_bytes(policy.params,
    data)` reads them back into the same structure)."""

    def __init__(self, agent, agent_state):
        self.agent, self.state = agent, agent_state
        self._act = jax.jit(lambda s, obs, carry, key: agent.act(s, obs, carry, key, jnp.arange(obs.shape[0]),
                                                                explore=False)[:2])

    @property
    def params(self):
        return self.state.params

    def initial_carry(self, num_envs: int):
        return self.agent.initial_carry(num_envs)

    def act(self, obs, carry=(), key: jax.Array | None = None):
        key = jax.random.PRNGKey(0) if key is None else key
        return self._act(self.state, jnp.asarray(obs), carry, key)

    def export(self, path: str | Path) -> Path:
        from flax import serialization

        path = Path(path)
        path.write_bytes(serialization.to_bytes(jax.device_get(self.params)))
        return path


def load_policy(run_dir: str | Path, seed: int = 0) -> Policy:
    """The evaluation policy of seed index `seed` (of the run's vmapped seeds) from the run's newest checkpoint."""
    _, runner, state = _restored(run_dir)
    if not 0 <= seed < runner.num_seeds:  # a population's rows: member m seed j is m * seeds + j
        raise ConfigError(f"seed={seed}: the run in {run_dir} trained seeds 0..{runner.num_seeds - 1}")
    return Policy(runner.agent, jax.device_put(runner.agent_state(state, seed), jax.devices()[0]))
