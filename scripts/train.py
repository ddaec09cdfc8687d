"""Train an agent: `python -m scripts.train agent=dqn env=cartpole [key=value ...]`.

Builds the runner of `env.source` (gymnax -> Anakin, envpool -> Sebulba) through rl/experiment.py and
writes metrics, checkpoints and the learning curve into hydra's run directory (or, with `resume=<run dir>`,
into that run's directory). Exit codes: 0 done; 1 a config error (its message, no traceback; set
HYDRA_FULL_ERROR=1 for one); 128 + signal number after SIGTERM/SIGINT/SIGUSR2, once the current chunk is
checkpointed (the resume command is printed).
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rl.config import ConfigError
from rl.experiment import run
from rl.infra.sweep import objective
from rl.runners.loop import Preempted


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> float:
    """Returns the run's objective (mean greedy eval return) for sweepers such as Optuna."""
    hc = HydraConfig.get()
    try:
        return objective(run(cfg, hc.runtime.output_dir, list(hc.overrides.task)))
    except ConfigError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(1)
    except Preempted as e:
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
