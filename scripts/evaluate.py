"""Evaluate a trained run: `python -m scripts.evaluate <run dir> [--episodes K] [--seed N]`.

Loads the run's config and newest checkpoint, runs K greedy episodes per trained seed and prints the
returns (mean, std, min, max per seed). Works for runs of both sources. From Python:
`agents.experiment.evaluate_run(run_dir, episodes)`.

`--video out.gif` (or `.mp4`) instead films K greedy episodes of one trained seed (`--trained-seed`, default 0)
on one env, at most `--max-frames` frames, and prints the file, its frame count and the episodes' returns
(rl/envs/video.py: which envs have frames and how they are drawn).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from agents.experiment import evaluate_run, load_policy
from agents.setup import setup
from rl.config import ConfigError
from rl.envs import env_config, video
from rl.infra import checkpoint
from rl.infra.checkpoint import MissingCheckpoint


def _film(args) -> np.ndarray:
    """Write the video `args` ask for and print one line about it; returns the finished episodes' returns.
    Bad input (suffix, no ffmpeg, no run, an env without frames) fails before any episode runs."""
    video.check_path(args.video)
    env_cfg = env_config(checkpoint.read_meta(args.run_dir)["config"]["env"])
    video.check_env(env_cfg)
    policy = load_policy(args.run_dir, args.trained_seed)
    clip = video.record(env_cfg, policy, args.episodes, args.seed, args.max_frames)
    path, returns = video.write(args.video, clip), np.asarray(clip.returns)
    if args.json:
        print(json.dumps({"video": str(path), "frames": len(clip.frames), "returns": returns.tolist()}))
    else:
        unfinished = args.episodes - len(returns)
        cut = f"; cut at --max-frames {args.max_frames}: {unfinished} episode(s) unfinished" if unfinished else ""
        print(f"video: {path} ({len(clip.frames)} frames at {clip.fps} fps; returns "
              f"{' '.join(f'{r:g}' for r in returns) or 'none finished'}{cut})")
    return returns


def main(argv: list[str] | None = None) -> np.ndarray:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a training run directory (holds checkpoints/)")
    parser.add_argument("--episodes", type=int, default=10, help="greedy episodes per seed (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="evaluation RNG seed (with --video: the env's and the policy's)")
    parser.add_argument("--json", action="store_true", help="print the returns as JSON")
    parser.add_argument("--video", metavar="PATH", help="write a video of the greedy episodes (.gif or .mp4)")
    parser.add_argument("--trained-seed", type=int, default=0, help="video: which of the run's seeds acts (default 0)")
    parser.add_argument("--max-frames", type=int, default=2000, help="video: at most this many frames (default 2000)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    if args.max_frames < 1:
        parser.error("--max-frames must be >= 1")
    setup()
    try:
        if args.video:
            return _film(args)
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
