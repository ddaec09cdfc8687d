"""Learning curves from local logs (no wandb): `python -m scripts.plot <run or sweep dir> [options]`.

Every run dir (a dir with `metrics.csv`, rl/infra/logging.py) at or below the given dir is read. Runs are
grouped by the hydra overrides that differ between them (a population run's members, by their own overrides),
`seed` excepted (so `seed=0,1,2` of one config
form one group; `--group-by` picks the keys instead); every
seed of every run in a group is one curve (vmapped seeds included). Each group is drawn as the mean over
its curves with a band for the spread (std, min-max or none), on the env steps all its curves share.

    python -m scripts.plot outputs/2025-01-31/12-00-00                # one run: its seeds
    python -m scripts.plot multirun/2025-01-31/12-00-00 --metric episode_return --metric train/loss
    python -m scripts.plot <sweep dir> --group-by agent --spread minmax --out curves.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from rl.infra.logging import no_values
from rl.infra.sweep import find_runs, member_overrides, read_metrics, run_overrides

IGNORED_KEYS = ("seed",)


def collect_curves(root: str | Path, metric: str, group_by: list[str] | None = None, allow_empty: bool = False
                   ) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """`{group label: [(env_steps, values), ...]}`, one curve per (run, seed), NaN points dropped.

    A metric that is no column of any run is an error; one whose column has no values yet (e.g.
    `episode_return` before the first episode ended) is an error too unless `allow_empty` (then `{}`)."""
    runs = find_runs(root)
    if not runs:
        raise FileNotFoundError(f"no run under {root}: expected metrics.csv files written by scripts.train")
    curves = []  # (overrides, metric columns) per (run, seed): a population member's overrides added
    for run in runs:
        members = member_overrides(run)
        for key, cols in read_metrics(run).items():
            curves.append(({**run_overrides(run), **(members[key[0]] if members else {})}, cols))
    if group_by is None:  # the keys whose values differ between curves, seed excepted
        keys = list(dict.fromkeys(k for o, _ in curves for k in o if k not in IGNORED_KEYS))
        group_by = [k for k in keys if len({o.get(k) for o, _ in curves}) > 1]
    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    seen = False
    for overrides, cols in curves:
        if metric not in cols:
            continue
        seen = True
        label = " ".join(f"{k}={overrides.get(k, '-')}" for k in group_by) or "all runs"
        x, y = cols["env_steps"], cols[metric]
        keep = ~np.isnan(y)
        if keep.any():
            groups.setdefault(label, []).append((x[keep], y[keep]))
    if not seen:
        raise ValueError(f"metric {metric!r} has no values in the runs under {root}: no column of their metrics.csv")
    if not groups and not allow_empty:
        raise ValueError(f"metric {metric!r} has no values in the runs under {root}")
    return groups


def last_step(root: str | Path) -> int:
    """The last logged env step of the runs under `root` (0 if none)."""
    steps = [cols["env_steps"].max() for run in find_runs(root) for cols in read_metrics(run).values()
             if cols["env_steps"].size]
    return int(max(steps, default=0))


def aggregate(curves: list[tuple[np.ndarray, np.ndarray]], spread: str = "std"
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean and band `(x, mean, low, high)` of curves on the steps they all cover (others interpolated)."""
    lo_x = max(c[0].min() for c in curves)
    hi_x = min(c[0].max() for c in curves)
    x = np.unique(np.concatenate([c[0] for c in curves]))
    x = x[(x >= lo_x) & (x <= hi_x)]
    if x.size == 0:  # curves do not overlap: fall back to the union, each curve held at its ends
        x = np.unique(np.concatenate([c[0] for c in curves]))
    ys = np.stack([np.interp(x, cx, cy) for cx, cy in curves])
    mean = ys.mean(0)
    if spread == "std":
        sd = ys.std(0)
        return x, mean, mean - sd, mean + sd
    if spread == "minmax":
        return x, mean, ys.min(0), ys.max(0)
    if spread == "none":
        return x, mean, mean, mean
    raise ValueError(f"spread must be std, minmax or none, got {spread!r}")


def plot(root: str | Path, metrics: list[str] | tuple[str, ...] = ("episode_return",), out: str | Path | None = None,
         spread: str = "std", group_by: list[str] | None = None, title: str | None = None) -> Path:
    """Draw one panel per metric into a PNG (default `<root>/learning_curves.png`); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = Path(root)
    out = Path(out) if out is not None else root / "learning_curves.png"
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3.6 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics):
        groups = collect_curves(root, metric, group_by, allow_empty=True)
        for label, curves in sorted(groups.items()):
            x, mean, low, high = aggregate(curves, spread)
            (line,) = ax.plot(x, mean, lw=1.8, label=f"{label} (n={len(curves)})")
            if spread != "none" and len(curves) > 1:
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_xlabel("env steps")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if groups:
            ax.legend(fontsize=7, loc="best")
        else:  # e.g. no episode finished yet: say so, rather than an empty 0-1 axis
            no_values(ax, metric, last_step(root))
    axes[0, 0].set_title(title if title is not None else f"{root}  (mean, band: {spread} over seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m scripts.plot", description=__doc__.split("\n")[0])
    parser.add_argument("dir", help="a run dir or a sweep dir (searched recursively for metrics.csv)")
    parser.add_argument("--metric", action="append", help="column of metrics.csv (repeatable); default "
                        "episode_return")
    parser.add_argument("--out", help="PNG path; default <dir>/learning_curves.png")
    parser.add_argument("--spread", default="std", choices=("std", "minmax", "none"), help="band around the mean")
    parser.add_argument("--group-by", nargs="+", help="override keys that define a group (default: those that differ between runs, seed excepted)")
    parser.add_argument("--title")
    args = parser.parse_args(argv)
    path = plot(args.dir, args.metric or ["episode_return"], args.out, args.spread, args.group_by, args.title)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
