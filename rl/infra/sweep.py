"""Hydra multirun support: one wandb group per sweep and a CSV table of final returns in the sweep dir.

`SweepCallback` is registered in configs/config.yaml under `hydra.callbacks`; in a multirun
(`python -m scripts.train -m ...`) it

* before each job (in the job's own process, also on SLURM/ray workers): sets `WANDB_RUN_GROUP` (one
  group per sweep, named after the sweep dir, unless `logger.wandb.group` is set) and `WANDB_NAME` (the
  job's overrides), which `wandb.init` picks up; with the local joblib launcher it also sets
  `XLA_PYTHON_CLIENT_PREALLOCATE=false` (unless set) so parallel jobs can share one GPU;
* after each job: writes `job.json` (overrides, status, the returned objective, the error) in its run dir;
* after the sweep: writes `<sweep dir>/summary.csv`, one row per job (see `summarize`);
  `python -m rl.infra.sweep <sweep dir>` rewrites it (e.g. after a SLURM sweep whose launcher was stopped).

A population run (`population.agent.<key>=[...]`, one program) gets the same table per member in its own
run dir (`summarize_members`). Single runs are otherwise untouched. The readers below (`find_runs`, `read_metrics`, `run_overrides`) are shared
with scripts/plot.py. Everything is read from the local files the runs write (rl/infra/logging.py:
`metrics.csv`, `summary.json`; hydra: `.hydra/overrides.yaml`), never from wandb.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

RETURN_KEY = "episode_return"
SUMMARY_COLUMNS = ("job", "status", "env_steps", "seeds", "final_return", "final_return_std", "eval_return",
                   "eval_return_std", "objective")


def find_runs(root: str | Path) -> list[Path]:
    """Run dirs (dirs holding a `metrics.csv`) at or below `root`, sorted by hydra job number then path."""
    root = Path(root)
    runs = sorted({p.parent for p in root.rglob("metrics.csv")}, key=lambda p: (_job_number(p), str(p)))
    return runs


def _job_number(run_dir: Path) -> int:
    job = run_dir / "job.json"
    if job.exists():
        return int(json.loads(job.read_text()).get("job", 1 << 30))
    return int(run_dir.name) if run_dir.name.isdigit() else 1 << 30


def run_overrides(run_dir: str | Path) -> dict[str, str]:
    """The command-line overrides of a hydra run (`key=value` from `.hydra/overrides.yaml`), in order."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.exists():
        return {}
    out = {}
    for item in OmegaConf.to_container(OmegaConf.load(path)):
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def read_metrics(run_dir: str | Path) -> dict[Any, dict[str, np.ndarray]]:
    """`metrics.csv` of a run as `{seed: {column: float array over log rows}}` (empty cells are NaN); a
    population run's (a `member` column) as `{(member, seed): ...}`, its other columns the member's overrides."""
    by_seed: dict[Any, dict[str, list[float]]] = {}
    with (Path(run_dir) / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            seed = int(float(row["seed"]))
            cols = by_seed.setdefault(seed if "member" not in row else (int(float(row["member"])), seed), {})
            for k, v in row.items():
                if k not in ("seed", "member") and k is not None:
                    cols.setdefault(k, []).append(float(v) if v not in ("", None) else math.nan)
    return {s: {k: np.asarray(v, np.float64) for k, v in cols.items()} for s, cols in sorted(by_seed.items())}


def member_overrides(run_dir: str | Path) -> dict[int, dict[str, str]]:
    """A population run's `{member: {override: value}}` (the metrics.csv columns between `member` and `seed`,
    rl/infra/logging.py); `{}` for other runs."""
    with (Path(run_dir) / "metrics.csv").open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        if "member" not in header:
            return {}
        first, last = header.index("member"), header.index("seed")
        return {int(float(row[first])): dict(zip(header[first + 1:last], row[first + 1:last])) for row in reader}


def _finals(curves: list[dict[str, np.ndarray]], evals: list[np.ndarray]) -> dict[str, Any]:
    """Final results of some seeds: their last logged `episode_return` (`curves`: each seed's metrics columns)
    and greedy evaluation returns (`evals`: each seed's `[episodes]`), mean and std over seeds."""
    out: dict[str, Any] = {"env_steps": None, "seeds": len(curves), "final_return": math.nan,
                           "final_return_std": math.nan, "eval_return": math.nan, "eval_return_std": math.nan}
    last = []
    for cols in curves:
        r = cols.get(RETURN_KEY, np.array([]))
        r = r[~np.isnan(r)]
        last.append(r[-1] if r.size else math.nan)
    if curves:
        out["env_steps"] = int(max(c["env_steps"].max() for c in curves))
    if last and not np.all(np.isnan(last)):
        out["final_return"], out["final_return_std"] = float(np.nanmean(last)), float(np.nanstd(last))
    per_seed = [r.mean() for r in evals if r.size]
    if per_seed:
        out["eval_return"], out["eval_return_std"] = float(np.mean(per_seed)), float(np.std(per_seed))
    return out


def _summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def final_returns(run_dir: str | Path) -> dict[str, Any]:
    """Final results of one run: the last logged `episode_return` of each seed (mean and std over seeds)
    and, from `summary.json`, the greedy evaluation returns (mean over seeds and episodes, std over the
    per-seed means) and env steps. NaN where a run logged nothing."""
    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir) if (run_dir / "metrics.csv").exists() else {}
    summary = _summary(run_dir)
    out = _finals(list(metrics.values()), [np.asarray(r, np.float64) for r in summary.get("eval_returns") or []])
    if summary.get("env_steps") is not None:
        out["env_steps"] = int(summary["env_steps"])
    return out


def summarize_members(run_dir: str | Path, overrides: list[dict[str, Any]], filename: str = "summary.csv"
                      ) -> list[dict[str, Any]]:
    """Write `<run_dir>/<filename>` for a population run: one row per member (`overrides[m]`: what a separate
    run would set), with `summarize`'s columns (final return and greedy eval return, mean/std over the
    member's seeds) from the run's `metrics.csv` and `summary.json` (rows member-major); returns the rows."""
    run_dir = Path(run_dir)
    metrics, summary = read_metrics(run_dir), _summary(run_dir)
    evals = [np.asarray(r, np.float64) for r in summary.get("eval_returns") or []]
    seeds = len(evals) // len(overrides)  # 0 without eval returns
    rows = []
    for m, member in enumerate(overrides):
        curves = [cols for (mm, _), cols in metrics.items() if mm == m]
        finals = _finals(curves, evals[m * seeds:(m + 1) * seeds])
        rows.append({"member": m, **member, **finals, "env_steps": summary.get("env_steps", finals["env_steps"])})
    keys = list(dict.fromkeys(k for o in overrides for k in o))
    columns = ["member", *keys, *[c for c in SUMMARY_COLUMNS if c not in ("job", "status", "objective")]]
    with (run_dir / filename).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in columns})
    return rows


def summarize(sweep_dir: str | Path, filename: str = "summary.csv") -> Path:
    """Write `<sweep_dir>/<filename>`: one row per job of the sweep (every dir below with a `job.json` or a
    `metrics.csv`): job number, status, one column per overridden key, env steps, seeds, final return
    (mean/std over seeds of the last logged episode return), greedy eval return (mean/std), the job's
    returned objective, its run dir (absolute path) and error if it failed."""
    sweep_dir = Path(sweep_dir)
    dirs = {p.parent for p in sweep_dir.rglob("job.json")} | set(find_runs(sweep_dir))
    rows, keys = [], []
    for run_dir in sorted(dirs, key=lambda p: (_job_number(p), str(p))):
        job = json.loads((run_dir / "job.json").read_text()) if (run_dir / "job.json").exists() else {}
        overrides = run_overrides(run_dir)
        keys += [k for k in overrides if k not in keys]
        row = {"job": job.get("job", _job_number(run_dir) if run_dir.name.isdigit() else ""),
               "status": job.get("status", "UNKNOWN"), "objective": job.get("objective"),
               **final_returns(run_dir), **overrides,
               "run_dir": str(run_dir.absolute()), "error": job.get("error") or ""}
        rows.append(row)
    columns = ["job", "status", *keys, *[c for c in SUMMARY_COLUMNS if c not in ("job", "status")], "run_dir",
               "error"]
    path = sweep_dir / filename
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in columns})
    return path


def _cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return v


def objective(result: dict) -> float:
    """The number a run reports to hydra sweepers: its mean greedy eval return over seeds and episodes, or
    (no evaluation) the mean last logged episode return; NaN if neither exists."""
    for key in ("eval_returns", "episode_return"):
        values = np.asarray(result.get(key) or [], np.float64)
        if values.size and not np.all(np.isnan(values)):
            return float(np.nanmean(values))
    return math.nan


def sweep_group(config: DictConfig) -> str:
    """The wandb group of a sweep: `sweep-` and the last two parts of the sweep dir (date and time by
    default, e.g. `sweep-2025-01-31-12-00-00`)."""
    parts = Path(str(config.hydra.sweep.dir)).parts[-2:]
    return "sweep-" + "-".join(parts)


class SweepCallback(Callback):
    """Hydra callback: wandb grouping and result files for multiruns (see the module docstring).

    summary_file: name of the CSV written in the sweep dir.
    group: wandb group for every job; null = `sweep_group(config)`.
    """

    def __init__(self, summary_file: str = "summary.csv", group: str | None = None):
        self.summary_file = summary_file
        self.group = group

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        if not OmegaConf.select(config, "logger.wandb.group"):
            os.environ["WANDB_RUN_GROUP"] = self.group or sweep_group(config)
        if not OmegaConf.select(config, "logger.wandb.name"):
            os.environ["WANDB_NAME"] = config.hydra.job.override_dirname or f"job{config.hydra.job.num}"
        if "joblib" in str(OmegaConf.select(config, "hydra.launcher._target_")):
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        for key in ("WANDB_RUN_GROUP", "WANDB_NAME"):
            os.environ.pop(key, None)
        failed = job_return.status.name != "COMPLETED"
        value = None if failed else job_return.return_value
        record = {
            "job": int(config.hydra.job.num),
            "overrides": list(config.hydra.overrides.task),
            "status": job_return.status.name,
            "objective": float(value) if isinstance(value, (int, float)) else None,
            "error": f"{type(job_return._return_value).__name__}: {job_return._return_value}" if failed else None,
        }
        out = Path(config.hydra.runtime.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "job.json").write_text(json.dumps(record, indent=2))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        path = summarize(config.hydra.sweep.dir, self.summary_file)
        print(f"sweep summary: {path.absolute()}")


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m rl.infra.sweep <sweep dir>")
    print(summarize(sys.argv[1]))
