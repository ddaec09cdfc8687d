"""Muesli proof runs: the Breakout-MinAtar comparison with DQN, and summaries of training runs.

    python -m scripts.muesli_experiments compare --steps 500000 --seeds 3 --out runs/muesli_vs_dqn
    python -m scripts.muesli_experiments compare --report-only --out runs/muesli_vs_dqn
    python -m scripts.muesli_experiments summary <run dir> [--threshold 475]

`compare` trains each agent of `--agents` (default muesli, dqn) on gymnax Breakout-MinAtar for `--steps`
env steps per seed, `--seeds` seeds vmapped in one program (`scripts.train` with `seeds=N`, logger off),
into `<out>/<agent>/`; DQN gets `--dqn-overrides` (default: the MinAtar paper's replay size and epsilon
schedule, Muesli's MLP torso). Then it writes `<out>/table.md` (per agent: mean training return over the
last `--final-frac` of the run and the final greedy evaluation, mean +- std over seeds) and
`<out>/curves.png` (training return per seed-mean with a band of +-1 std over seeds). `--report-only` redoes the table and plot from
existing run dirs.

`summary` reads a run dir's metrics.csv: per seed, the first logged env step whose mean training return
reaches `--threshold`, the best logged return and the final greedy evaluation (summary.json).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

# The MinAtar paper's replay size and epsilon schedule; the MLP torso of Muesli's MinAtar preset
# (agents/muesli.yaml) so both agents see the frame through the same kind of network (on CPU, DQN's small CNN
# made a 2M-step run ~10x slower). DQN's `minatar` preset (agents/dqn.yaml) is agent=dqn_small with these.
DQN_MINATAR = ["agent.buffer_size=100000", "agent.epsilon_decay_steps=100000", "agent.epsilon_end=0.1",
               "agent.network.torso=mlp", "agent.network.hidden_sizes=[256,128]"]


def read_curves(run_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """`(env_steps [T], episode_return [S, T])` from a run's metrics.csv (NaN where no episode ended)."""
    with open(Path(run_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    steps = sorted({int(r["env_steps"]) for r in rows})
    seeds = sorted({int(r["seed"]) for r in rows})
    ret = np.full((len(seeds), len(steps)), np.nan)
    for r in rows:
        value = r["episode_return"]
        ret[seeds.index(int(r["seed"])), steps.index(int(r["env_steps"]))] = float(value) if value else np.nan
    return np.asarray(steps), ret


def read_eval(run_dir: str | Path) -> np.ndarray:
    """Greedy evaluation returns `[S, K]` from a run's summary.json (empty if there was none)."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return np.zeros((0, 0))
    return np.asarray(json.loads(path.read_text()).get("eval_returns", []), dtype=float)


def summary(run_dir: str | Path, threshold: float) -> list[dict]:
    steps, ret = read_curves(run_dir)
    evals = read_eval(run_dir)
    out = []
    for s in range(ret.shape[0]):
        hit = np.nonzero(np.nan_to_num(ret[s], nan=-np.inf) >= threshold)[0]
        out.append({"seed": s, "first_step_at_threshold": int(steps[hit[0]]) if hit.size else None,
                    "best_logged_return": float(np.nanmax(ret[s])), "last_logged_return": float(ret[s, -1]),
                    "greedy_eval": float(evals[s].mean()) if evals.size else None})
    return out


def train(agent: str, steps: int, seeds: int, run_dir: Path, overrides: list[str]) -> dict:
    from rl.config import compose
    from rl.experiment import run

    cfg = compose([f"agent={agent}", "env=breakout-minatar", f"total_steps={steps}", f"seeds={seeds}",
                   "logger=none", *overrides])
    return run(cfg, run_dir)


def report(out: Path, agents: list[str], final_frac: float, steps_budget: int | None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [f"| agent | seeds | env steps / seed | training return, last {final_frac:.0%} of run | final greedy eval |",
             "| --- | --- | --- | --- | --- |"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for agent in agents:
        steps, ret = read_curves(out / agent)
        tail = steps >= steps[-1] * (1 - final_frac)
        per_seed = np.nanmean(ret[:, tail], axis=1)
        evals = read_eval(out / agent)
        ev = evals.mean(axis=1) if evals.size else np.array([np.nan])
        lines.append(f"| {agent} | {ret.shape[0]} | {steps[-1]} | {per_seed.mean():.2f} +- {per_seed.std():.2f} "
                     f"({', '.join(f'{x:.1f}' for x in per_seed)}) | {np.mean(ev):.2f} +- {np.std(ev):.2f} |")
        mean, std = np.nanmean(ret, axis=0), np.nanstd(ret, axis=0)
        ax.plot(steps, mean, label=agent)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel("training episode return")
    ax.set_title("Breakout-MinAtar" + (f" ({steps_budget} steps)" if steps_budget else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--steps", type=int, default=2_000_000)
    c.add_argument("--seeds", type=int, default=3)
    c.add_argument("--agents", default="muesli,dqn")
    c.add_argument("--out", default="runs/muesli_vs_dqn")
    c.add_argument("--final-frac", type=float, default=0.1)
    c.add_argument("--report-only", action="store_true")
    c.add_argument("--dqn-overrides", nargs="*", default=DQN_MINATAR)
    c.add_argument("--muesli-overrides", nargs="*", default=[])
    s = sub.add_parser("summary")
    s.add_argument("run_dir")
    s.add_argument("--threshold", type=float, default=475.0)
    args = parser.parse_args(argv)
    if args.what == "summary":
        for row in summary(args.run_dir, args.threshold):
            print(json.dumps(row))
        return
    out = Path(args.out)
    agents = args.agents.split(",")
    if not args.report_only:
        for agent in agents:
            extra = args.dqn_overrides if agent == "dqn" else args.muesli_overrides if agent == "muesli" else []
            print(f"training {agent} ({args.seeds} seeds x {args.steps} steps) into {out / agent}", flush=True)
            train(agent, args.steps, args.seeds, out / agent, extra)
    print(report(out, agents, args.final_frac, None if args.report_only else args.steps))


if __name__ == "__main__":
    main()
