"""Train an agent: `python -m scripts.train agent=dqn env=cartpole [key=value ...]`.

Picks the runner from `env.source` (gymnax -> rl.anakin, envpool -> rl.sebulba), writes metrics, the
checkpoint and the learning curve into hydra's run directory and prints where they are.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rl import distributed
from rl.config import RUNNERS, validate
from rl.sweep import objective


def run(cfg: DictConfig, run_dir: str | Path) -> dict:
    """Validate `cfg`, then train with the runner of `cfg.env.source`, writing into `run_dir`."""
    distributed.initialize(cfg.distributed)  # before anything touches JAX; no-op unless enabled
    validate(cfg)
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's per-save INFO lines
    from rl.logging import RunLogger

    runner = importlib.import_module(RUNNERS[cfg.env.source])
    logger = RunLogger(cfg, run_dir)
    try:
        return runner.train(cfg, logger)
    finally:
        logger.close()


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> float:
    """Returns the run's objective (mean greedy eval return) for sweepers such as Optuna."""
    return objective(run(cfg, HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
