"""rl/infra/logging.py: the progress bar's total and postfix, the rows' env steps per second (the first
call's compile left out), and the learning curve when no episode has finished."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import matplotlib.figure
import numpy as np
import pytest

from rl.config import LoggerConfig, TrainConfig, WandbConfig
from rl.infra.logging import NO_EPISODE, RunLogger, plot_learning_curve


def _cfg(total_steps: int = 1000, progress: bool = True, plot: bool = True, **wandb):
    """A typed run config as the logger reads it (agent and env: their names only); `wandb`: its keys."""
    return TrainConfig(agent=SimpleNamespace(name="dqn"), env=SimpleNamespace(id="CartPole-v1"),
                       total_steps=total_steps,
                       logger=LoggerConfig(WandbConfig(**{"mode": "disabled", "project": "x", **wandb}), progress, plot))


@pytest.fixture
def texts_saved(monkeypatch):
    """The `ax.text`s of every figure saved (notes on the axes; not the title or the labels)."""
    saved: list[list[str]] = []
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        saved.append([t.get_text() for ax in fig.axes for t in ax.texts])
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return saved


def test_bar_total_is_the_rounded_number_the_runner_passes(tmp_path, capsys):
    logger = RunLogger(_cfg(1000), tmp_path)
    logger.start(start_step=0, num_seeds=1, total_steps=1200)  # e.g. 1000 rounded up to iterations of 400
    assert logger._bar.total == 1200
    for step in (400, 800, 1200):
        logger.log(step, {"episode_return": np.nan})
        assert logger._bar.n == step <= logger._bar.total == 1200
    assert "100%" in str(logger._bar) and "1.20k/1.20k" in str(logger._bar)
    logger.close()


def test_bar_never_overshoots_when_the_runner_goes_past_cfg_total(tmp_path, capsys):
    logger = RunLogger(_cfg(1000), tmp_path)
    logger.start(start_step=0, num_seeds=2)
    assert logger._bar.total == 1000
    logger.log(600, {"episode_return": [np.nan, np.nan]})
    logger.log(1200, {"episode_return": [np.nan, np.nan]})  # rounded up without telling start()
    assert logger._bar.n == logger._bar.total == 1200
    logger.close()


def test_postfix_says_no_episode_finished_yet_instead_of_nan(tmp_path, capsys):
    logger = RunLogger(_cfg(1000), tmp_path)
    logger.start(start_step=0, num_seeds=2)
    assert NO_EPISODE == "no episode finished yet"
    assert logger._bar.postfix == NO_EPISODE and "nan" not in str(logger._bar)
    logger.log(200, {"episode_return": [np.nan, np.nan], "train/loss": [np.nan, np.nan]})
    assert NO_EPISODE in str(logger._bar) and "nan" not in str(logger._bar) and "sps=" in str(logger._bar)
    logger.log(400, {"episode_return": [10.0, np.nan]})
    assert "ret=10.0" in str(logger._bar) and NO_EPISODE not in str(logger._bar)
    logger.log(600, {"episode_return": [np.nan, np.nan]})  # no episode ended in this chunk: keep the last one
    assert "ret=10.0" in str(logger._bar)
    logger.close()


def test_resumed_run_shows_the_last_return_of_its_history(tmp_path, capsys):
    history = [{"env_steps": 50, "seed": 0, "episode_return": 1.0}, {"env_steps": 100, "seed": 0, "episode_return": 5.0},
               {"env_steps": 200, "seed": 0, "episode_return": None}]  # the newest log that has a return: 5.0
    logger = RunLogger(_cfg(1000), tmp_path)
    logger.start(start_step=200, num_seeds=1, history=history, total_steps=1000)
    assert logger._bar.n == 200 and "ret=5.0" in str(logger._bar)
    logger.close()


def test_learning_curve_says_no_episode_finished(tmp_path, capsys, texts_saved):
    logger = RunLogger(_cfg(1000), tmp_path)
    logger.start(start_step=0, num_seeds=2, total_steps=1000)
    for step in (500, 1000):
        logger.log(step, {"episode_return": [np.nan, np.nan], "train/loss": [1.0, 2.0]})
    paths = logger.close()
    assert paths["learning_curve"].read_bytes()[:4] == b"\x89PNG"
    assert texts_saved == [["no episode finished in 1,000 env steps"]]


def test_learning_curve_with_episodes_has_no_such_note(tmp_path, texts_saved):
    history = [{"env_steps": s, "seed": 0, "episode_return": float(s) / 10} for s in (100, 200)]
    plot_learning_curve(history, tmp_path / "c.png")
    assert texts_saved == [[]]
    assert not math.isnan(history[0]["episode_return"])


def test_learning_curve_axes_name_env_steps_and_the_metric(tmp_path, monkeypatch):
    labels = []
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        labels.append([(ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) for ax in fig.axes])
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    history = [{"env_steps": s, "seed": 0, "eval_return": 1.0} for s in (100, 200)]
    plot_learning_curve(history, tmp_path / "c.png", key="eval_return", title="CartPole")
    assert labels == [[("env steps", "eval return", "CartPole")]]



def test_learning_curve_draws_each_seed_and_their_mean_only_for_several(tmp_path, monkeypatch):
    """One line per seed; the black mean line (the mean over the seeds logged at each step) only when there
    are several seeds: one seed's curve is its own mean."""
    lines = []
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        lines.append({ln.get_label(): (list(ln.get_ydata()), ln.get_alpha()) for ax in fig.axes
                      for ln in ax.get_lines()})
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    one = [{"env_steps": s, "seed": 0, "episode_return": r} for s, r in ((100, 1.0), (200, 3.0))]
    two = one + [{"env_steps": 100, "seed": 1, "episode_return": 5.0}, {"env_steps": 200, "seed": 1,
                                                                        "episode_return": 9.0}]
    plot_learning_curve(one, tmp_path / "one.png")
    plot_learning_curve(two, tmp_path / "two.png")
    # a lone seed's line is opaque; several seeds' lines are half transparent under their opaque mean
    assert lines == [{"seed 0": ([1.0, 3.0], 1.0)},
                     {"seed 0": ([1.0, 3.0], 0.5), "seed 1": ([5.0, 9.0], 0.5), "mean": ([3.0, 6.0], None)}]

# --------------------------------------------------------------------------- quiet start (a real tiny run)
def test_train_console_has_only_our_lines_on_envpool(tmp_path):
    """`python -m scripts.train agent=dqn env=envpool/cartpole logger=wandb` (wandb offline, as a newcomer runs
    it): stderr holds only the progress bar, stdout only our notes: no JAX backend INFO line, no wandb banner, no
    gymnasium precision warnings from envpool's spaces. (gymnax's CartPole: tests/scripts/test_cli.py.)"""
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import assert_only_our_lines, newcomer_env

    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.train", "agent=dqn", "env=envpool/cartpole", "logger=wandb",
         "total_steps=640", "num_envs=4", "log_interval=200", "eval_episodes=1", "agent.learning_starts=100",
         "agent.batch_size=16", "agent.buffer_size=400", "agent.network.hidden_sizes=[16]",
         "checkpoint.enabled=false", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=root, env=newcomer_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*")), "wandb ran (offline)"
    assert_only_our_lines(proc, "dqn/CartPole-v1:")


def test_a_population_logs_one_wandb_run_per_member_in_one_group(tmp_path, monkeypatch):
    """Offline wandb: a run per member, named by its overrides, in a group named after the run dir, each with
    its member's overrides in its config and only its own seeds' values; the ids resume the same runs."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = _cfg(1000, progress=False, mode="offline")
    rows = [{"member": m, "agent.optim.lr": lr, "seed": s} for m, lr in enumerate([1e-3, 3e-3]) for s in (0, 1)]
    logger = RunLogger(cfg, tmp_path / "pop", rows=rows)
    logger.start(start_step=0, num_seeds=4, total_steps=1000)
    runs = [run for run, _ in logger._wandb]
    assert [r.name for r in runs] == ["agent.optim.lr=0.001", "agent.optim.lr=0.003"]
    assert {r.group for r in runs} == {"pop"}
    assert [(r.config["member"], r.config["agent.optim.lr"]) for r in runs] == [(0, 1e-3), (1, 3e-3)]
    logged = {r.id: [] for r in runs}
    for run in runs:
        monkeypatch.setattr(run, "log", lambda data, step, i=run.id: logged[i].append((step, data)))
    logger.log(500, {"episode_return": [1.0, 2.0, 3.0, 5.0]})
    first, second = (logged[r.id][0] for r in runs)
    assert first[1]["episode_return/seed0"] == 1.0 and first[1]["episode_return/mean"] == 1.5
    assert second[1]["episode_return/seed1"] == 5.0 and second[1]["episode_return/mean"] == 4.0
    # Lists of numbers are summarised per member; lists of anything else (no eval: None per row) are not.
    logger.summary({"eval_return_mean": [10.0, 20.0, 30.0, 40.0], "eval_none": [None] * 4, "names": list("abcd")})
    assert [r.summary["eval_return_mean/mean"] for r in runs] == [15.0, 35.0]
    assert not [k for r in runs for k in dict(r.summary) if k.startswith(("eval_none", "names"))]
    assert logger.wandb_id == ",".join(r.id for r in runs)
    paths = logger.close()
    assert len(list(paths["wandb"].glob("offline-run-*"))) == 2


def test_the_rate_of_the_row_holding_the_first_call_leaves_its_compile_out(tmp_path, monkeypatch):
    """The env steps per second of the row holding the first call count from that call's end; a row that is
    only the first call keeps the rate from the start (nothing else to time)."""
    clock = iter([0.0, 10.0, 12.0, 14.0, 100.0, 110.0, 112.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    logger = RunLogger(_cfg(4000, progress=False), tmp_path)
    logger.start(start_step=0, num_seeds=2)  # t = 0
    logger.first_call(0, 200, 10.0)  # t = 10: 200 env steps per seed in 10 s, compile included
    logger.log(1000, {})  # t = 12: 800 more in 2 s
    logger.log(2000, {})  # t = 14
    logger.close()
    resumed = RunLogger(_cfg(4000, progress=False), tmp_path / "resumed")
    resumed.start(start_step=2000, num_seeds=2)  # t = 100
    resumed.first_call(2000, 3000, 10.0)  # t = 110: the first call is the whole first row
    resumed.log(3000, {})  # t = 112
    resumed.close()
    rates = [line.split("] ", 1)[1] for run in (tmp_path, tmp_path / "resumed")
             for line in (run / "train.log").read_text().splitlines() if "SPS" in line]
    assert rates == [
        "env step 1,000 per seed: 800 SPS (all seeds), no episode finished yet",  # 2 x 800 / 2 s, not 2 x 1000 / 12 s
        "env step 2,000 per seed: 1,000 SPS (all seeds), no episode finished yet",
        "env step 3,000 per seed: 167 SPS (all seeds), no episode finished yet"]  # 2 x 1000 / 12 s


def test_a_member_with_one_seed_logs_its_values_under_their_own_names(tmp_path, monkeypatch):
    """One seed per member: its wandb run gets `<key>` (the value itself) and `<key>/mean`, no `/seed<i>` keys."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = _cfg(1000, progress=False, mode="offline")
    rows = [{"member": m, "agent.optim.lr": lr, "seed": 0} for m, lr in enumerate([1e-3, 3e-3])]
    logger = RunLogger(cfg, tmp_path / "pop", rows=rows)
    logger.start(start_step=0, num_seeds=2, total_steps=1000)
    runs = [run for run, _ in logger._wandb]
    logged = {r.id: [] for r in runs}
    for run in runs:
        monkeypatch.setattr(run, "log", lambda data, step, i=run.id: logged[i].append((step, data)))
    logger.log(500, {"episode_return": [1.0, 2.0]})
    for run, value in zip(runs, (1.0, 2.0)):
        (step, data), = logged[run.id]
        assert step == 500 and {k: v for k, v in data.items() if k != "sps"} == {
            "episode_return": value, "episode_return/mean": value}
    logger.close()


def test_metrics_csv_grows_its_columns_for_a_new_metric_and_leaves_missing_ones_empty(tmp_path):
    """A log with a metric not seen before rewrites metrics.csv with the union of the columns (earlier rows get
    it empty); a later log with fewer metrics is appended, its missing columns empty."""
    import csv

    logger = RunLogger(_cfg(1000, progress=False), tmp_path)
    logger.start(start_step=0, num_seeds=1)
    logger.log(100, {"loss": 1.0})
    logger.log(200, {"loss": 2.0, "episode_return": 5.0})
    logger.log(300, {"loss": 3.0})
    logger.close()
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["env_steps"], r["loss"], r["episode_return"]) for r in rows] == [
        ("100", "1.0", ""), ("200", "2.0", "5.0"), ("300", "3.0", "")]
