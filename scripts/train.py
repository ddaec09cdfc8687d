"""Train an agent: `python -m scripts.train agent=dqn env=cartpole [key=value ...]`.

Builds the runner of `env.source` (gymnax -> Anakin, envpool -> Sebulba) through agents/experiment.py and
writes metrics, checkpoints and the learning curve into hydra's run directory (or, with `resume=<run dir>`,
into that run's directory). The process is set up first (agents.setup.setup: the `agent=` options hydra
composes from, ...). Exit codes: 0 done; 1 a config or input error (one line, no traceback; set
HYDRA_FULL_ERROR=1 for one); 128 + signal number after SIGTERM/SIGINT/SIGUSR2, once the sub-chunk in
progress (seconds) is checkpointed (the resume command is printed); 130 after a repeated Ctrl-C aborted the
save (one line naming the newest checkpoint on disk, or that nothing was saved).

A hydra run dir that ends up holding nothing of a run (the command failed before training, or it resumed
into the saved run's own dir) is removed, so failed commands leave no empty `outputs/<date>/<time>/`.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from agents.experiment import run
from agents.setup import setup, unknown_key
from rl.config import CONFIG_DIR, ConfigError, refused_override
from rl.infra.checkpoint import MissingCheckpoint
from rl.infra.sweep import objective
from rl.runners.loop import Aborted, Preempted

GROUPS = ("agent", "env")  # config groups a user picks by name on the command line


def group_choices(group: str) -> list[str]:
    """The names `group=<name>` accepts: configs/<group>/**.yaml (sub-folders as `envpool/pong`) and the
    options stored in hydra's ConfigStore (every `agent=` option: the agents registry stores them)."""
    root = CONFIG_DIR / group
    names = {p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml")}
    try:
        names |= {n.removesuffix(".yaml") for n in ConfigStore.instance().list(group) if n.endswith(".yaml")}
    except OSError:  # no such group in the ConfigStore
        pass
    return sorted(names)


def unknown_choice(argv: list[str]) -> str | None:
    """One line for an `agent=` / `env=` override that names no config (hydra's own message lists only the
    top folder's files, not the envpool configs), an override the config would not honour
    (rl.config.refused_override) or one of a key the config lacks (agents.setup.unknown_key), else None."""
    problem = refused_override(argv)
    if problem:
        return problem
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key in GROUPS and "," not in value and value not in group_choices(key):
            hint = {"env": " (another envpool task: a config of its kind with env.id, e.g. env=envpool/pong "
                           "env.id=Qbert-v5)",
                    "agent": " (agent=<agent> sizes it to the env's family, agent=<agent>_<preset> takes a "
                             "preset of agents/<agent>.yaml on any env)"}.get(key, "")
            what = "an agent option" if key == "agent" else f"a config of configs/{key}/"
            return f"{key}={value} is not {what}; choose one of {group_choices(key)}{hint}"
    return unknown_key(argv)


def _is_empty_run_dir(path: Path) -> bool:
    """Nothing but hydra's `.hydra/` and empty log files."""
    return path.is_dir() and all(p.name == ".hydra" or (p.suffix == ".log" and p.stat().st_size == 0)
                                 for p in path.iterdir())


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> float:
    """Returns the run's objective (mean greedy eval return) for sweepers such as Optuna."""
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    try:
        return objective(run(cfg, out_dir, list(hc.overrides.task)))
    except (ConfigError, MissingCheckpoint) as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        kind = "config error" if isinstance(e, ConfigError) else "error"
        print(f"{kind}: {e}", file=sys.stderr)
        sys.exit(1)
    except Preempted as e:
        sys.exit(e.exit_code)
    except Aborted as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
    finally:
        if _is_empty_run_dir(out_dir):
            shutil.rmtree(out_dir, ignore_errors=True)
            day = out_dir.parent  # hydra's default outputs/<date>/<time>: the <date> dir too, if it is now empty
            if re.fullmatch(r"\d{4}-\d{2}-\d{2}", day.name) and day.is_dir() and not any(day.iterdir()):
                day.rmdir()


if __name__ == "__main__":
    setup()
    problem = unknown_choice(sys.argv[1:])
    if problem and os.environ.get("HYDRA_FULL_ERROR") != "1":
        sys.exit(f"config error: {problem}")
    main()
