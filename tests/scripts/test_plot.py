"""scripts/plot.py on fake logs laid out like a hydra sweep (real logs: tests/rl/infra/test_sweeps.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from scripts import plot

STEPS = np.array([100, 200, 300, 400, 500])


def ret(lr: float, seed: int, steps: np.ndarray) -> np.ndarray:
    return steps / 10.0 * (1 + 1000 * lr) + seed


def write_run(run_dir: Path, overrides: list[str], steps: np.ndarray, seeds: dict[int, np.ndarray],
              loss: bool = True) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    with (run_dir / "metrics.csv").open("w", newline="") as f:
        fields = ["env_steps", "seed", "episode_return"] + (["train/loss"] if loss else [])
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for i, step in enumerate(steps):
            for s, values in seeds.items():
                v = values[i]
                row = {"env_steps": int(step), "seed": s, "episode_return": "" if np.isnan(v) else v}
                if loss:
                    row["train/loss"] = 1.0 / (i + 1)
                w.writerow(row)


@pytest.fixture
def sweep(tmp_path):
    """4 jobs: lr in {1e-4, 3e-4} x seed in {0, 10}, each with 2 vmapped seeds (csv seed 0, 1)."""
    job = 0
    for lr in (1e-4, 3e-4):
        for seed in (0, 10):
            curves = {s: ret(lr, seed + s, STEPS) for s in (0, 1)}
            write_run(tmp_path / str(job), ["agent=dqn", f"agent.optim.lr={lr}", f"seed={seed}"], STEPS, curves)
            job += 1
    return tmp_path


def test_groups_by_the_overrides_that_differ_except_seed(sweep):
    groups = plot.collect_curves(sweep, "episode_return")
    assert sorted(groups) == ["agent.optim.lr=0.0001", "agent.optim.lr=0.0003"]
    assert all(len(curves) == 4 for curves in groups.values())  # 2 jobs x 2 vmapped seeds
    by_agent = plot.collect_curves(sweep, "episode_return", group_by=["agent"])
    assert list(by_agent) == ["agent=dqn"] and len(by_agent["agent=dqn"]) == 8


def test_mean_and_spread_match_numpy(sweep):
    curves = plot.collect_curves(sweep, "episode_return")["agent.optim.lr=0.0003"]
    ref = np.stack([ret(3e-4, s, STEPS) for s in (0, 1, 10, 11)])
    x, mean, low, high = plot.aggregate(curves, "std")
    np.testing.assert_array_equal(x, STEPS)
    np.testing.assert_allclose(mean, ref.mean(0))
    np.testing.assert_allclose(high - mean, ref.std(0))
    np.testing.assert_allclose(mean - low, ref.std(0))
    _, _, lo, hi = plot.aggregate(curves, "minmax")
    np.testing.assert_allclose(lo, ref.min(0))
    np.testing.assert_allclose(hi, ref.max(0))
    with pytest.raises(ValueError, match="spread must be std, minmax or none"):
        plot.aggregate(curves, "iqr")


def test_unaligned_curves_are_interpolated_on_their_common_range():
    a = (np.array([0.0, 100, 200, 300]), np.array([0.0, 10, 20, 30]))
    b = (np.array([50.0, 150, 250, 350]), np.array([5.0, 5, 5, 5]))
    x, mean, _, _ = plot.aggregate([a, b], "none")
    np.testing.assert_array_equal(x, [50, 100, 150, 200, 250, 300])
    np.testing.assert_allclose(mean, (x / 10 + 5) / 2)


def test_nan_points_are_dropped(tmp_path):
    values = np.array([1.0, np.nan, 3.0, np.nan, 5.0])
    write_run(tmp_path / "run", [], STEPS, {0: values}, loss=False)
    [(x, y)] = plot.collect_curves(tmp_path, "episode_return")["all runs"]
    np.testing.assert_array_equal(x, [100, 300, 500])
    np.testing.assert_array_equal(y, [1, 3, 5])


def test_cli_writes_a_png_per_call(sweep, capsys):
    path = plot.main([str(sweep), "--metric", "episode_return", "--metric", "train/loss", "--spread", "minmax"])
    assert path == sweep / "learning_curves.png" and f"wrote {path}" in capsys.readouterr().out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    single = matplotlib.image.imread(plot.main([str(sweep / "0"), "--out", str(sweep / "one.png")]))
    assert image.shape[0] == 2 * single.shape[0] and image.shape[1] == single.shape[1]  # two stacked panels


def test_clear_errors(tmp_path, sweep):
    with pytest.raises(FileNotFoundError, match="no run under"):
        plot.collect_curves(tmp_path / "nothing", "episode_return")
    with pytest.raises(ValueError, match="metric 'eval/return' has no values"):
        plot.collect_curves(sweep, "eval/return")


def test_no_episode_finished_is_said_on_the_panel(tmp_path, monkeypatch):
    """A run whose episodes have not ended yet: the return panel says so (no empty 0-1 axis), the loss panel
    is drawn; a metric that is no column at all is still an error."""
    import matplotlib.figure

    write_run(tmp_path / "run", ["agent=dqn"], STEPS, {0: np.full(5, np.nan), 1: np.full(5, np.nan)})
    with pytest.raises(ValueError, match="has no values"):
        plot.collect_curves(tmp_path, "episode_return")
    assert plot.collect_curves(tmp_path, "episode_return", allow_empty=True) == {}
    saved = []
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        saved.append([[t.get_text() for t in ax.texts] for ax in fig.axes])
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    path = plot.main([str(tmp_path), "--metric", "episode_return", "--metric", "train/loss"])
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert saved == [[["no episode finished in 500 env steps"], []]]
    with pytest.raises(ValueError, match="no column"):
        plot.main([str(tmp_path), "--metric", "eval/return"])
