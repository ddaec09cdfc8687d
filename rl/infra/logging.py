"""Run logging on the host, between compiled chunks: a live progress bar (tqdm), wandb (offline by default,
never needs a login), `metrics.csv` (one row per log and seed), `summary.json` and a learning-curve PNG in
the run dir.

Runners call, in order: `start(...)` once (`total_steps=`: the env steps the run will end at, after any
rounding up to whole chunks), `log(env_steps, metrics)` after every chunk with per-seed arrays `[S]` (or
scalars), `summary(...)` at the end; scripts call `close()`, which writes the PNG and prints where all is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from rl.config import TrainConfig
from rl.infra.metrics_file import MetricsFile

RETURN_KEY = "episode_return"
EVAL_KEY = "eval_return"  # greedy return per seed of the evaluations during training (eval_interval)


class _DropStartupNoise(logging.Filter):
    """Library INFO lines at startup that hydra's INFO console logging would show: JAX's about accelerator
    backends it probes and does not find ("Unable to initialize backend 'tpu': ... libtpu.so ...", every
    CPU start) and matplotlib's "generated new fontManager" (first plot on a machine)."""

    NOISE = ("Unable to initialize backend", "generated new fontManager")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOISE)


def quiet_startup() -> None:
    """Drop the startup INFO lines of `_DropStartupNoise` and orbax's INFO lines (absl logger: a dozen per
    checkpoint manager) (idempotent). agents.setup.setup calls it, before JAX starts its backends (importing
    gymnax does)."""
    logging.getLogger("absl").setLevel(logging.WARNING)
    for name in ("jax._src.xla_bridge", "matplotlib.font_manager"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropStartupNoise) for f in logger.filters):
            logger.addFilter(_DropStartupNoise())

NO_EPISODE = "no episode finished yet"


def _last_return(history: list[dict]) -> float:
    """Mean over seeds of the last logged episode return in `history` (NaN if none was logged)."""
    for step in sorted({row["env_steps"] for row in history}, reverse=True):
        values = [row[RETURN_KEY] for row in history if row["env_steps"] == step and row.get(RETURN_KEY) is not None]
        if values:
            return float(np.mean(values))
    return float("nan")


def _float(x) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


class RunLogger:
    """Console progress, wandb, CSV/JSON metrics and the learning curve for one training run.

    `primary=False` (processes other than 0 of a multi-process run, which log the same global metrics):
    console lines only, appended to `train.<process index>.log`; no metrics.csv, summary.json, wandb,
    figure or progress bar."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, record: dict | None = None,
                 rows: list[dict] | None = None, primary: bool = True):
        """`cfg`: the typed config. `record`: the composed config as plain containers (wandb's config, saved
        in checkpoints); default `cfg`'s. `rows`: a label per row of the seed axis, metrics.csv's first columns
        (a population's member, overrides, seed); default `{"seed": s}`."""
        if not isinstance(cfg, TrainConfig):
            raise TypeError(f"RunLogger takes the typed config (agents.experiment.validate), got {type(cfg).__name__}")
        self.cfg, self.primary = cfg, primary
        self.record = record if record is not None else dataclasses.asdict(cfg)
        self.rows = rows
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logged_rows = 0  # rows logged so far (per log, one per row of the seed axis), resumed included
        self.wandb_id: str | None = None  # a population's: its members' run ids, comma-separated
        self.paths: dict[str, Path] = {}
        self._wandb: list[tuple[Any, list[int]]] = []  # (wandb run, the rows it logs)
        self._bar = None
        self._started = False
        # the console's lines, appended (a resumed run continues it)
        self._log_path = self.run_dir / "train.log"
        if not primary:
            import jax

            self._log_path = self.run_dir / f"train.{jax.process_index()}.log"

    def _file(self, line: str) -> None:
        with self._log_path.open("a") as f:
            f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}\n")

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self, *, start_step: int, num_seeds: int, wandb_id: str | None = None, logged_rows: int | None = None,
              history: list[dict] | None = None, total_steps: int | None = None) -> None:
        """Open metrics.csv, the progress bar and wandb (resuming run `wandb_id` if given) from `start_step`.
        A resume keeps the first `logged_rows` rows of metrics.csv (a checkpoint's `metrics_rows`), or writes
        `history` (the rows older checkpoints saved) as the file.

        `total_steps`: the env steps the run will really end at (per seed), e.g. `cfg.total_steps` rounded up
        to whole iterations/chunks by the runner; default `cfg.total_steps`. The bar's total is this number,
        and grows to the logged step if a run goes past it, so the bar never overshoots 100%."""
        self.num_seeds = num_seeds
        self.rows = self.rows or [{"seed": s} for s in range(num_seeds)]
        assert len(self.rows) == num_seeds, f"{len(self.rows)} row labels for {num_seeds} rows"
        self.total_steps = self.cfg.total_steps if total_steps is None else int(total_steps)
        self.metrics = MetricsFile(self.run_dir / "metrics.csv", list(self.rows[0]))
        self._last = (time.perf_counter(), start_step)
        self._warm: tuple[float, int] | None = None  # (time, env steps) at the end of the first call
        self._recent = float("nan")
        if not self.primary:
            self.logged_rows, self._started = logged_rows or len(history or []), True
            return
        self.metrics.start(logged_rows, history)
        self.logged_rows = self.metrics.rows
        if self.logged_rows:
            self._recent = _last_return(self.metrics.read())
            self.paths["metrics"] = self.metrics.path
        self._start_wandb(wandb_id)
        if self.cfg.logger.progress:
            from tqdm.auto import tqdm

            # smoothing=1: rate and ETA of the last sub-chunk (the host loop updates the bar after each), so
            # they reflect training, not the faster acting-only steps before learning_starts.
            self._bar = tqdm(total=max(self.total_steps, start_step), initial=start_step, unit="step",
                             unit_scale=True, dynamic_ncols=True, desc=f"{self.cfg.agent.name}/{self.cfg.env.id}",
                             postfix=self._postfix(None), smoothing=1.0)
        self._started = True

    def _postfix(self, sps: float | None) -> str:
        """`sps=1,234, ret=97.5`, or `no episode finished yet` (instead of `ret=nan`) before the first one."""
        ret = NO_EPISODE if math.isnan(self._recent) else f"ret={self._recent:.1f}"
        return ret if sps is None else f"sps={sps:,.0f}, {ret}"

    def _members(self) -> list[tuple[dict, list[int]]]:
        """What each wandb run logs: `(labels, rows)`. A population: one run per member (its overrides, its
        seeds' rows); otherwise one run of every row."""
        if "member" not in self.rows[0]:
            return [({}, list(range(self.num_seeds)))]
        members: dict[Any, list[int]] = {}
        for i, row in enumerate(self.rows):
            members.setdefault(row["member"], []).append(i)
        return [({k: v for k, v in self.rows[r[0]].items() if k != "seed"}, r) for r in members.values()]

    def _start_wandb(self, wandb_id: str | None) -> None:
        wcfg = self.cfg.logger.wandb
        mode = os.environ.get("WANDB_MODE") or wcfg.mode  # the env var (e.g. disabled in CI) wins
        if mode == "disabled":
            return
        if not os.environ.get("WANDB_MODE"):
            os.environ.pop("WANDB_MODE", None)  # set but empty (`WANDB_MODE= python ...`): wandb rejects ""
        # No product banner, sync hints or "Tracking run with wandb" lines (offline mode: nothing to sign up
        # for); where the files are is printed by close().
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        members = self._members()
        ids = wandb_id.split(",") if wandb_id else [None] * len(members)
        # A population is a group of runs, one per member, named like a multirun's jobs (its overrides).
        group = wcfg.group or (self.run_dir.name if len(members) > 1 else None)
        for (labels, rows), run_id in zip(members, ids, strict=True):
            name = wcfg.name
            if labels:
                name = " ".join(f"{k}={v}" for k, v in labels.items() if k != "member") or f"member {labels['member']}"
            run = wandb.init(
                mode=mode, project=wcfg.project, entity=wcfg.entity, group=group, name=name,
                tags=list(wcfg.tags), dir=str(self.run_dir), id=run_id, resume="allow" if run_id else None,
                config={**self.record, **labels}, settings=wandb.Settings(silent=True),
                reinit="create_new" if len(members) > 1 else "default")
            self._wandb.append((run, rows))
        self.wandb_id = ",".join(run.id for run, _ in self._wandb)

    # --- logging ------------------------------------------------------------------------------------
    def log(self, env_steps: int, metrics: dict[str, Any]) -> None:
        """Record `metrics` (name -> `[S]` array or scalar) at `env_steps`."""
        per_seed = {k: np.broadcast_to(np.asarray(v, np.float64), (self.num_seeds,)) for k, v in metrics.items()}
        rows = [{"env_steps": int(env_steps), **self.rows[s], **{k: _float(v[s]) for k, v in per_seed.items()}}
                for s in range(self.num_seeds)]
        self.logged_rows += len(rows)
        if self.primary:
            self.metrics.append(rows)
            self.paths["metrics"] = self.metrics.path
        now = time.perf_counter()
        t0, s0 = self._warm if self._warm is not None and env_steps > self._warm[1] else self._last
        sps = (env_steps - s0) / max(now - t0, 1e-9)
        self._last, self._warm = (now, env_steps), None
        if RETURN_KEY in per_seed and not np.all(np.isnan(per_seed[RETURN_KEY])):
            self._recent = float(np.nanmean(per_seed[RETURN_KEY]))
        for run, mine in self._wandb:  # each run its rows: `<key>/mean`, and per seed or the value itself
            data = {"sps": sps}
            for k, v in per_seed.items():
                v = v[mine]
                if not np.all(np.isnan(v)):
                    data[f"{k}/mean"] = float(np.nanmean(v))
                if len(mine) > 1:
                    data.update({f"{k}/seed{self.rows[r]['seed']}": float(x) for r, x in zip(mine, v)
                                 if not np.isnan(x)})
                else:
                    data[k] = float(v[0])
            run.log(data, step=int(env_steps))
        ret = f"return {self._recent:.2f}" if not math.isnan(self._recent) else NO_EPISODE
        self._file(f"env step {int(env_steps):,} per seed: {sps * self.num_seeds:,.0f} SPS (all seeds), {ret}")
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(sps), refresh=False)
            self.progress(env_steps)

    def progress(self, env_steps: int) -> None:
        """Move the progress bar to `env_steps` (between logs)."""
        if self._bar is not None:
            self._bar.total = max(self._bar.total, env_steps)
            self._bar.update(env_steps - self._bar.n)

    def summary(self, values: dict[str, Any]) -> None:
        """Write `summary.json` (and the wandb summary) with final results."""
        if not self.primary:
            return
        values = json.loads(json.dumps(values, default=lambda x: np.asarray(x).tolist()))
        path = self.run_dir / "summary.json"
        path.write_text(json.dumps(values, indent=2))
        self.paths["summary"] = path
        for run, mine in self._wandb:  # per-row lists (one entry per seed row) summarised over the run's rows
            for k, v in values.items():
                if isinstance(v, (int, float)):
                    run.summary[k] = v
                elif isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in np.ravel(v)):
                    rows = [v[r] for r in mine] if len(v) == self.num_seeds else v
                    run.summary[f"{k}/mean"] = float(np.mean(rows))

    def first_call(self, start: int, env_steps: int, seconds: float) -> None:
        """The run's first call (it compiles) took `seconds` from `start` to `env_steps`: a line saying so, and
        the env steps per second of the row that holds it count from its end (a row that is only that call
        keeps the rate with the compile in it)."""
        self.note(f"first call (compile + {env_steps - start} env steps per seed): {seconds:.1f}s")
        self._warm = (time.perf_counter(), env_steps)

    def note(self, message: str) -> None:
        """Print a line without breaking the progress bar (and append it to train.log)."""
        self._file(message)
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> dict[str, Path]:
        """Finish: learning-curve PNG, close the bar and wandb, print where the outputs are."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.cfg.logger.plot and self.primary and self._started and self.metrics.rows:
            self.paths["learning_curve"] = plot_learning_curve(self.metrics.read(), self.run_dir / "learning_curve.png",
                                                               title=f"{self.cfg.agent.name} on {self.cfg.env.id}")
        if self._wandb:
            run_dir = Path(self._wandb[0][0].dir).parent  # wandb/<offline-run-...>; several: wandb/
            self.paths["wandb"] = run_dir if len(self._wandb) == 1 else run_dir.parent
            for run, _ in self._wandb:
                run.finish()
            self._wandb = []
        if self._started:
            lines = [f"run dir: {self.run_dir.absolute()}"]
            lines += [f"  {name}: {Path(path).absolute()}" for name, path in sorted(self.paths.items())]
            for line in lines:
                print(line)
                self._file(line)
        return self.paths


def plot_learning_curve(history: list[dict], path: str | Path, key: str = RETURN_KEY, title: str = "") -> Path:
    """Plot `key` against env steps, one line per seed plus the mean, into a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({(row.get("member", -1), row["seed"]) for row in history})  # a population: (member, seed)
    fig, ax = plt.subplots(figsize=(7, 4))
    curves = []
    for m, s in seeds:
        pts = [(row["env_steps"], row.get(key)) for row in history
               if (row.get("member", -1), row["seed"]) == (m, s) and row.get(key) is not None]
        if pts:
            x, y = map(np.asarray, zip(*pts))
            label = f"seed {s}" if m < 0 else f"member {m} seed {s}"
            ax.plot(x, y, lw=1, alpha=0.5 if len(seeds) > 1 else 1.0, label=label)
            curves.append((x, y))
    if len(curves) > 1:
        steps = sorted({int(x) for c in curves for x in c[0]})
        mean = [np.nanmean([c[1][c[0] == st][0] for c in curves if np.any(c[0] == st)]) for st in steps]
        ax.plot(steps, mean, lw=2, color="black", label="mean")
    greedy = {}  # the greedy evaluations during training (eval_interval), mean over seeds
    for row in history:
        if key == RETURN_KEY and row.get(EVAL_KEY) is not None:
            greedy.setdefault(int(row["env_steps"]), []).append(row[EVAL_KEY])
    if greedy:
        steps = sorted(greedy)
        ax.plot(steps, [np.mean(greedy[s]) for s in steps], "o--", lw=1.5, color="C3", ms=4,
                label="greedy eval (mean over seeds)")
    ax.set_xlabel("env steps")
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if curves or greedy:
        ax.legend(fontsize=7, loc="best")
    else:  # say so, rather than an empty 0-1 axis
        last = max((int(row["env_steps"]) for row in history), default=0)
        no_values(ax, key, last)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def no_values(ax, key: str, last_step: int) -> str:
    """Write on an empty panel why it is empty: no episode finished (episode metrics) or no values of `key`
    within the first `last_step` env steps; returns the message."""
    what = "no episode finished" if key.startswith("episode") else f"no values of {key}"
    message = f"{what} in {last_step:,} env steps" if last_step else what
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center", fontsize=12, color="0.3")
    ax.set_yticks([])
    if last_step:
        ax.set_xlim(0, last_step)
    return message
