"""Evaluate a trained run: `python -m scripts.evaluate <run dir> [--episodes K] [--seed N]`.

Loads the run's config and newest checkpoint, runs K greedy episodes per trained seed and prints the
returns (mean, std, min, max per seed). Works for runs of both sources. From Python: `rl.evaluate_run(run_dir, episodes)`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np

from rl.config import ConfigError
from rl.experiment import evaluate_run
from rl.infra.checkpoint import MissingCheckpoint


def main(argv: list[str] | None = None) -> np.ndarray:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a training run directory (holds checkpoints/)")
    parser.add_argument("--episodes", type=int, default=10, help="greedy episodes per seed (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="evaluation RNG seed")
    parser.add_argument("--json", action="store_true", help="print the returns as JSON")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    logging.getLogger("absl").setLevel(logging.WARNING)
    try:
        returns = evaluate_run(args.run_dir, args.episodes, args.seed)
    except (MissingCheckpoint, ConfigError) as e:  # a dir that is not a run; a run this code cannot build
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"evaluate: {e}")
    if args.json:
        print(json.dumps({"returns": returns.tolist()}))
    else:
        for s, r in enumerate(returns):
            print(f"seed {s}: mean {r.mean():.2f}  std {r.std():.2f}  min {r.min():.1f}  max {r.max():.1f}  "
                  f"({args.episodes} greedy episodes)")
    return returns


if __name__ == "__main__":
    main()
