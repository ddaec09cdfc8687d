"""A population in one program against the same runs as a hydra multirun: wall time to the same results.

    python -m scripts.bench_population [--total-steps 200000] [--lrs 1e-4,3e-4,1e-3,3e-3] [--discounts 0.99,0.995]
        [--jobs 2] [--out DIR] [hydra overrides ...]

Both sides are the command a user types, timed from start to exit (start-up and compiles included), DQN on
CartPole with one seed per member by default: `python -m scripts.train population.agent.optim.lr=[...]
population.agent.discount=[...]` (one process, one program), and `python -m scripts.train -m
agent.optim.lr=... agent.discount=...` (one job per member, `--jobs` at a time through the joblib launcher).
The last line printed is one JSON object `{"members", "population_s", "multirun_s", "speedup",
"same_results"}`; `same_results`: every member's greedy eval returns equal its multirun job's (a member
equals its separate run: tests/rl/learning/test_population.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ["agent=dqn", "env=cartpole", "logger=none", "logger.progress=false", "checkpoint.enabled=false"]


def commands(lrs: list[str], discounts: list[str], total_steps: int, jobs: int, out: Path,
             overrides: list[str]) -> tuple[list[str], list[str]]:
    """`(population, multirun)` argument lists of `python -m scripts.train`."""
    common = [*BASE, f"total_steps={total_steps}", *overrides]
    population = [*common, f"population.agent.optim.lr=[{','.join(lrs)}]",
                  f"population.agent.discount=[{','.join(discounts)}]", f"hydra.run.dir={out / 'population'}"]
    multirun = ["-m", *common, f"agent.optim.lr={','.join(lrs)}", f"agent.discount={','.join(discounts)}",
                f"hydra.launcher.n_jobs={jobs}", f"hydra.sweep.dir={out / 'multirun'}"]
    return population, multirun


def _timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "scripts.train", *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False)
    if proc.returncode != 0:
        raise SystemExit(f"scripts.train {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def _same_results(out: Path) -> bool:
    """Every member's greedy eval returns (the population's summary.json, rows member-major; its members'
    overrides from its summary.csv) == its multirun job's."""
    from rl.infra.sweep import find_runs, run_overrides

    def key(overrides: dict) -> tuple[float, float]:
        return float(overrides["agent.optim.lr"]), float(overrides["agent.discount"])

    jobs = {key(run_overrides(run)): json.loads((run / "summary.json").read_text())["eval_returns"]
            for run in find_runs(out / "multirun")}
    returns = json.loads((out / "population" / "summary.json").read_text())["eval_returns"]
    with (out / "population" / "summary.csv").open(newline="") as f:
        members = list(csv.DictReader(f))
    seeds = len(returns) // len(members)
    return len(jobs) == len(members) and all(jobs.get(key(m)) == returns[i * seeds:(i + 1) * seeds]
                                             for i, m in enumerate(members))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_population", description=__doc__.split("\n")[0])
    parser.add_argument("--total-steps", type=int, default=200_000)
    parser.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3")
    parser.add_argument("--discounts", default="0.99,0.995")
    parser.add_argument("--jobs", type=int, default=2, help="multirun jobs at a time (joblib launcher)")
    parser.add_argument("--out", default=f"outputs/bench_population/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    args, overrides = parser.parse_known_args(argv)
    lrs, discounts, out = args.lrs.split(","), args.discounts.split(","), Path(args.out).absolute()
    population, multirun = commands(lrs, discounts, args.total_steps, args.jobs, out, overrides)
    population_s, multirun_s = _timed(population), _timed(multirun)
    result = {"members": len(lrs) * len(discounts), "population_s": round(population_s, 1),
              "multirun_s": round(multirun_s, 1), "speedup": round(multirun_s / population_s, 2),
              "same_results": _same_results(out)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
