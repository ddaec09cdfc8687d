"""scripts/benchmark.py: suites compose, a tiny suite writes its results, a stopped suite redoes only what is
missing (resumed from a checkpoint, or restarted); slow: `quick=true` on MinAtar."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
from omegaconf import OmegaConf

from agents.experiment import validate
from agents.setup import compose
from scripts.benchmark import RECORD, BenchmarkError, plan, run_benchmark, state_of

# Tiny DQN runs (tests/conftest.py's TINY_DQN sizes), appended to every run's training overrides.
TINY = ["num_envs=4", "log_interval=200", "eval_episodes=2", "agent.learning_starts=100", "agent.batch_size=16",
        "agent.buffer_size=400", "agent.network.hidden_sizes=[16]", "agent.target_update_period=5",
        "agent.epsilon_decay_steps=300"]


def bench_cfg(*overrides, extra=TINY):
    cfg = compose(list(overrides), config_name="benchmark")
    OmegaConf.update(cfg, "extra_overrides", list(extra), force_add=True)
    return cfg


@pytest.mark.parametrize("suite, runs", [("minatar", 10), ("memory", 8), ("minigrid_memory", 4)])
def test_suites_plan_runs_that_compose_and_validate(suite, runs):
    s, planned = plan(bench_cfg(f"suite={suite}", extra=[]))
    assert len(planned) == runs and s["seeds"] == 3 and s["steps"] == compose(
        [f"suite={suite}"], config_name="benchmark").suite.total_steps
    assert len({str(r.run_dir) for r in planned}) == runs
    for run in planned:
        cfg = compose(run.overrides)
        validate(cfg)
        assert cfg.seeds == 3 and cfg.checkpoint.interval > 0
    if suite == "minatar":
        refs = {r.task: r.references for r in planned}
        assert refs["breakout"] == {"gymnax_ppo": 28.0, "random": 0.406} and refs["seaquest"] == {"random": 0.104}
    if suite == "minigrid_memory":
        assert {r.task: r.success_above for r in planned} == {"memory_s8": 0.0, "memory_s16": 0.0}


def test_quick_mode_and_subsets():
    s, planned = plan(bench_cfg("suite=minatar", "quick=true", extra=[]))
    assert s["steps"] == 200_000 and s["seeds"] == 1 and s["out_dir"].as_posix() == "outputs/benchmark/minatar-quick"
    assert [(r.task, r.agent) for r in planned] == [("asterix", "dqn"), ("asterix", "muesli"), ("breakout", "dqn"),
                                                    ("breakout", "muesli")]
    _, planned = plan(bench_cfg("suite=memory", "agents=[r2d2]", "tasks=[memory_chain_30]", extra=[]))
    assert len(planned) == 1 and "agent.sequence_length=70" in planned[0].overrides
    with pytest.raises(BenchmarkError, match="unknown tasks"):
        plan(bench_cfg("suite=memory", "tasks=[pong]"))


def test_report_only_writes_the_table_of_unfinished_runs_and_trains_nothing(tmp_path):
    """report_only=true: results for every run of the suite as it stands (a run with logged metrics but no
    summary is `incomplete` with its last-10% return, the others `missing`); no run is trained or created."""
    run_dir = tmp_path / "runs" / "cartpole_masked" / "dqn"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("env_steps,seed,episode_return,episodes\n"
                                         "100,0,10.0,2\n100,1,20.0,2\n1000,0,30.0,1\n1000,1,50.0,1\n")
    res = run_benchmark(bench_cfg("suite=memory", "report_only=true", f"out_dir={tmp_path}"))
    assert res["trained"] == [] and res["failed"] == []
    rows = _rows(tmp_path)
    assert len(rows) == 8 and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["cartpole_masked"]
    row = rows[("dqn", "cartpole_masked")]
    assert row["status"] == "incomplete" and float(row["last10_mean"]) == 40.0 and row["eval_mean"] in ("", "nan")
    assert all(r["status"] == "missing" for k, r in rows.items() if k != ("dqn", "cartpole_masked"))
    md = (tmp_path / "results.md").read_text()
    assert all(f"| {task} |" in md for task in ("memory_chain_10", "memory_chain_30", "memory_chain_50",
                                                  "cartpole_masked"))
    assert (tmp_path / "learning_curves.png").stat().st_size > 0


def test_an_attempt_is_on_record_before_it_runs_and_a_killed_one_leaves_the_wall_time_open(tmp_path, monkeypatch):
    """The run's record holds the attempt (wall_s None) while the training subprocess runs, so an attempt
    killed outright (kill -9, the session ending) is not lost: the run's wall time is then a lower bound
    (wall_complete False, `+` in results.md) and no SPS is computed from it."""
    import scripts.benchmark as bench

    seen = []

    def killed(cmd, *args):  # the subprocess as the record sees it mid-run; then the process "dies"
        seen.append(json.loads((tmp_path / "runs" / "cartpole_masked" / "dqn" / RECORD).read_text()))
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "_call", killed)
    cfg = bench_cfg("suite=memory", "agents=[dqn]", "tasks=[cartpole_masked]", f"out_dir={tmp_path}")
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(cfg)
    assert [(a["wall_s"], a["returncode"]) for a in seen[0]["attempts"]] == [(None, None)]
    run_dir = tmp_path / "runs" / "cartpole_masked" / "dqn"
    assert seen[0]["attempts"][0]["commit"] == bench._git_commit() != "unknown"
    record = seen[0] | {"attempts": [{"started": "t0", "resumed": False, "wall_s": None, "returncode": None,
                                      "commit": "abc1234"},
                                     {"started": "t1", "resumed": True, "wall_s": 30.0, "returncode": 0,
                                      "commit": "def5678"}]}
    (run_dir / RECORD).write_text(json.dumps(record))
    (run_dir / "summary.json").write_text(json.dumps({"env_steps": 1200, "seeds": 2, "eval_returns": [[1.0], [2.0]]}))
    run_benchmark(bench_cfg("suite=memory", "agents=[dqn]", "tasks=[cartpole_masked]", f"out_dir={tmp_path}",
                            "report_only=true"))
    row = _rows(tmp_path)[("dqn", "cartpole_masked")]
    assert (row["wall_s"], row["wall_complete"], row["sps"]) == ("30.0", "False", "")
    assert row["commits"] == "abc1234 def5678"  # the commit of each attempt: a run resumed across commits
    assert "| 30+ |" in (tmp_path / "results.md").read_text()


def _rows(out_dir):
    with (out_dir / "results.csv").open() as f:
        return {(r["agent"], r["task"]): r for r in csv.DictReader(f)}


def _attempts(run_dir):
    return json.loads((run_dir / RECORD).read_text())["attempts"]


@pytest.mark.slow  # ~50 s: the default suite's 15-minute budget; resumption itself is tested in test_resume.py
def test_tiny_suite_writes_results_and_redoes_only_missing_runs(tmp_path):
    out = tmp_path / "bench"
    cfg = bench_cfg("suite=memory", "agents=[dqn]", "tasks=[cartpole_masked,memory_chain_10]", "seeds=2",
                    "total_steps=1200", f"out_dir={out}")
    res = run_benchmark(cfg)
    assert res["failed"] == [] and sorted(res["trained"]) == ["cartpole_masked/dqn", "memory_chain_10/dqn"]
    rows = _rows(out)
    assert set(rows) == {("dqn", "cartpole_masked"), ("dqn", "memory_chain_10")}
    for row in rows.values():
        assert row["status"] == "done" and int(row["env_steps"]) >= 1200 and int(row["seeds"]) == 2
        for key in ("eval_mean", "eval_std", "last10_mean", "wall_s", "sps"):
            assert row[key] != "", key
    md = (out / "results.md").read_text()
    assert "| cartpole_masked |" in md and "| memory_chain_10 |" in md and "optimal" in md
    assert (out / "learning_curves.png").stat().st_size > 0

    a, b = out / "runs" / "cartpole_masked" / "dqn", out / "runs" / "memory_chain_10" / "dqn"
    untouched = (b / "summary.json").stat().st_mtime_ns
    # Run a stopped mid-run: no summary, no final checkpoint (checkpoints every 1200 / 10 steps, the newest two
    # kept). It is resumed from its newest checkpoint and finishes; b is skipped.
    steps = sorted(int(p.name) for p in (a / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) == 2 and steps[-1] >= 1200
    (a / "summary.json").unlink()
    shutil.rmtree(a / "checkpoints" / str(steps[-1]))
    res = run_benchmark(cfg)
    assert res["trained"] == ["cartpole_masked/dqn"] and res["failed"] == []
    assert (a / "summary.json").exists() and (b / "summary.json").stat().st_mtime_ns == untouched
    assert [x["resumed"] for x in _attempts(a)] == [False, True] and len(_attempts(b)) == 1
    assert f"at env step {steps[0]}" in (a / "train.log").read_text()
    metrics = list(csv.DictReader((a / "metrics.csv").open()))
    keys = [(r["seed"], r["env_steps"]) for r in metrics]
    assert len(keys) == len(set(keys)) and max(int(r["env_steps"]) for r in metrics) >= 1200  # no step twice
    assert _rows(out)[("dqn", "cartpole_masked")]["status"] == "done"
    # Stopped after training, during the evaluation: resumed from the final checkpoint, only evaluated.
    (a / "summary.json").unlink()
    assert run_benchmark(cfg)["trained"] == ["cartpole_masked/dqn"] and (a / "summary.json").exists()
    # Run b lost its summary and its checkpoints (stopped before the first): restarted from scratch.
    (b / "summary.json").unlink()
    shutil.rmtree(b / "checkpoints")
    res = run_benchmark(cfg)
    assert res["trained"] == ["memory_chain_10/dqn"] and len(_attempts(b)) == 1 and len(_attempts(a)) == 3
    assert not _attempts(b)[0]["resumed"] and _rows(out)[("dqn", "memory_chain_10")]["status"] == "done"
    # Nothing missing: nothing trained; other overrides for the same dirs are refused.
    assert run_benchmark(cfg)["trained"] == []
    with pytest.raises(BenchmarkError, match="other training overrides"):
        run_benchmark(bench_cfg("suite=memory", "agents=[dqn]", "tasks=[cartpole_masked]", "seeds=1",
                                "total_steps=1200", f"out_dir={out}"))


@pytest.mark.slow
def test_quick_minatar_suite(tmp_path):
    """`suite=minatar quick=true`, 1 seed, 2 games, DQN and Muesli, end to end, with 30k instead of the
    quick 200k steps (about 10 minutes on 2 CPU cores: the slow tests share CI's 90 minutes)."""
    res = run_benchmark(compose(["suite=minatar", "quick=true", "quick_steps=30000", f"out_dir={tmp_path}"],
                                config_name="benchmark"))
    assert res["failed"] == [] and len(res["rows"]) == 4
    rows = _rows(tmp_path)
    assert all(r["status"] == "done" and int(r["env_steps"]) >= 30_000 for r in rows.values())
    assert (tmp_path / "results.md").exists() and (tmp_path / "learning_curves.png").exists()


def test_results_dir_publishes_tables_and_each_runs_files_but_no_checkpoints(tmp_path):
    """results_dir=<dir>: results.csv/md and the figure, drawn from copies of each run's metrics.csv,
    summary.json, composed config and record in <dir>/runs/<task>/<agent>/; checkpoints stay behind."""
    out, results = tmp_path / "out", tmp_path / "results"
    run_dir = out / "runs" / "cartpole_masked" / "dqn"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoints" / "1000").mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("env_steps,seed,episode_return,episodes\n1000,0,30.0,1\n1000,1,50.0,1\n")
    (run_dir / "summary.json").write_text(json.dumps({"env_steps": 1000, "seeds": 2, "eval_returns": [[1.0], [3.0]]}))
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")
    run_benchmark(bench_cfg("suite=memory", "agents=[dqn]", "tasks=[cartpole_masked]", f"out_dir={out}",
                            "report_only=true", f"results_dir={results}"))
    copy = results / "runs" / "cartpole_masked" / "dqn"
    assert sorted(p.name for p in copy.iterdir()) == ["config.yaml", "metrics.csv", "summary.json"]
    assert (copy / "metrics.csv").read_text() == (run_dir / "metrics.csv").read_text()
    row = _rows(results)[("dqn", "cartpole_masked")]
    assert row["status"] == "done" and float(row["eval_mean"]) == 2.0 and row["run_dir"] == "runs/cartpole_masked/dqn"
    assert "runs/cartpole_masked/dqn" in (results / "results.md").read_text()
    assert (results / "learning_curves.png").stat().st_size > 0
    assert not list(results.rglob("checkpoints"))


def test_a_published_run_missing_from_the_out_dir_is_restored_as_done(tmp_path, capsys):
    """A finished run published in results_dir whose out dir is gone (a new machine) is copied back and
    counts as done: the same row, nothing trained; a run dir that holds a checkpoint is left alone."""
    out, results = tmp_path / "out", tmp_path / "results"
    run_dir = out / "runs" / "cartpole_masked" / "dqn"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("env_steps,seed,episode_return,episodes\n1000,0,30.0,1\n1000,1,50.0,1\n")
    (run_dir / "summary.json").write_text(json.dumps({"env_steps": 1000, "seeds": 2, "eval_returns": [[1.0], [3.0]]}))
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")
    args = ("suite=memory", "agents=[dqn]", "tasks=[cartpole_masked,memory_chain_10]", f"results_dir={results}")
    run_benchmark(bench_cfg(*args, f"out_dir={out}", "report_only=true"))
    before = _rows(results)[("dqn", "cartpole_masked")]
    fresh = tmp_path / "fresh"
    kept = fresh / "runs" / "memory_chain_10" / "dqn" / "checkpoints" / "500"
    kept.mkdir(parents=True)
    shutil.copytree(results / "runs" / "cartpole_masked" / "dqn", results / "runs" / "memory_chain_10" / "dqn")
    res = run_benchmark(bench_cfg(*args, f"out_dir={fresh}", "report_only=true"))
    assert "cartpole_masked/dqn: finished run restored from" in capsys.readouterr().out
    restored = fresh / "runs" / "cartpole_masked" / "dqn"
    assert state_of(next(r for r in plan(bench_cfg(*args, f"out_dir={fresh}"))[1] if r.task == "cartpole_masked"))\
        == "done"
    assert (restored / ".hydra" / "config.yaml").read_text() == "seed: 0\n"
    assert (restored / "metrics.csv").read_text() == (run_dir / "metrics.csv").read_text()
    assert res["trained"] == [] and _rows(results)[("dqn", "cartpole_masked")] == before
    assert not (kept.parent.parent / "summary.json").exists()  # a run dir with a checkpoint is not overwritten


def test_report_on_a_fresh_out_dir_says_nothing_has_run_and_how_long_the_suite_takes(tmp_path, capsys):
    res = run_benchmark(compose(["suite=minatar", "report_only=true", f"out_dir={tmp_path}"],
                                config_name="benchmark"), "python -m scripts.benchmark suite=minatar report_only=true")
    out = capsys.readouterr().out
    assert f"nothing has run yet in {tmp_path}" in out and "`python -m scripts.benchmark suite=minatar`" in out
    assert "about 25 h on a 2-core CPU" in out
    assert res["rows"] == [] and not (tmp_path / "results.md").exists() and not (tmp_path / "learning_curves.png").exists()


def test_ctrl_c_in_the_driver_checkpoints_the_run_and_exits_cleanly(tmp_path):
    """SIGINT to the driver alone (the run is in its own session): the run in progress checkpoints within
    seconds, the driver prints one line and exits 130, no traceback; the run is left resumable."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    extra = "extra_overrides=[" + ",".join(f"'{o}'" for o in [*TINY, "log_interval=2000000"]) + "]"
    cmd = [sys.executable, "-m", "scripts.benchmark", "suite=memory", "agents=[dqn]", "tasks=[cartpole_masked]",
           "seeds=1", "total_steps=2000000", f"out_dir={tmp_path}", extra]
    proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, "WANDB_MODE": "disabled"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    log = tmp_path / "runs" / "cartpole_masked" / "dqn" / "train.log"
    t0 = time.monotonic()
    while "first call" not in (log.read_text() if log.exists() else ""):
        if proc.poll() is not None or time.monotonic() - t0 > 240:
            proc.kill()
            pytest.fail("the run did not start training: " + "".join(proc.communicate()))
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the driver did not stop within 120 s of Ctrl-C")
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("[benchmark] stopped: cartpole_masked/dqn")
    run_dir = log.parent
    assert (run_dir / "checkpoints").is_dir() and not (run_dir / "summary.json").exists()
    _, runs = plan(bench_cfg("suite=memory", "agents=[dqn]", "tasks=[cartpole_masked]", "seeds=1",
                             "total_steps=2000000", f"out_dir={tmp_path}", extra=[*TINY, "log_interval=2000000"]))
    assert [state_of(r) for r in runs] == ["resume"]  # the same command again resumes it


def test_aggregate_is_the_iqm_of_normalised_seed_scores_with_a_bootstrap_interval(tmp_path):
    """aggregate_scores: per seed (R - random) / (best - random), best the highest mean greedy return of the
    task in the table (references included, `random` excluded); the IQM over tasks x seeds equals the 25%
    trimmed mean (NumPy/SciPy reference), inside its 95% interval; an agent with an unfinished task has no
    aggregate and is listed with it."""
    from scipy.stats import trim_mean

    from scripts.benchmark import Run, aggregate_scores, result_row

    evals = {("a", "t1"): [[2.0, 4.0], [6.0, 6.0], [1.0, 1.0]], ("b", "t1"): [[8.0], [10.0], [9.0]],
             ("a", "t2"): [[0.0], [5.0], [10.0]], ("b", "t2"): [[3.0], [3.0], [3.0]]}
    refs = {"t1": {"random": 1.0, "ppo": 5.0}, "t2": {"random": 0.0, "ppo": 20.0}}
    runs = []
    for (agent, task), ev in evals.items():
        run = Run(agent, task, tmp_path / task / agent, [], refs[task])
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "summary.json").write_text(json.dumps({"env_steps": 10, "seeds": 3, "eval_returns": ev,
                                                              "eval_return": float(np.mean(ev))}))
        runs.append(run)
    rows = [result_row(r) for r in runs]
    agg = aggregate_scores(runs, rows, reps=2000)
    best = {"t1": 9.0, "t2": 20.0}  # b's mean on t1; the ppo reference on t2
    for agent in ("a", "b"):
        norm = [(np.mean(evals[agent, t], axis=1) - refs[t]["random"]) / (best[t] - refs[t]["random"])
                for t in ("t1", "t2")]
        expected = trim_mean(np.concatenate(norm), 0.25)
        assert agg[agent]["iqm"] == pytest.approx(expected, rel=1e-6)
        assert agg[agent]["low"] <= expected <= agg[agent]["high"] and agg[agent]["low"] < agg[agent]["high"]
    (runs[-1].run_dir / "summary.json").unlink()  # b/t2 unfinished
    agg = aggregate_scores(runs, [result_row(r) for r in runs], reps=2000)
    assert "b" not in agg and agg["_missing"] == {"b": ["t2"]} and "a" in agg


@pytest.mark.parametrize("suite, task", [("minatar", "breakout"), ("minigrid_memory", "memory_s8")])
def test_random_floor_of_a_suite_is_what_random_policy_return_gives(suite, task):
    """The suite yaml's `random` figure of a task is the uniform policy's mean return (seed 0, 1000 episodes),
    on gymnax and on a JAX env library alike."""
    from scripts.benchmark import random_policy_return

    suite = compose([f"suite={suite}"], config_name="benchmark").suite
    assert random_policy_return(list(suite.tasks[task].overrides)) == pytest.approx(
        suite.tasks[task].references.random, abs=5e-4)


def test_success_is_the_share_of_greedy_episodes_above_the_tasks_threshold(tmp_path):
    """A task with `success_above` gets each agent's success share (per seed: the fraction of greedy episodes
    returning more than the threshold; then the mean over seeds) in results.csv and results.md; a task
    without one leaves it empty, and a table without any has no success column."""
    from scripts.benchmark import Run, result_row, write_csv, write_markdown

    evals = {("a", "t1"): [[0.0, 0.7, 0.9, 0.0], [0.8, 0.8, 0.0, 0.6]], ("b", "t1"): [[0.0, 0.0, 0.9, 0.0], [0.5] * 4],
             ("a", "t2"): [[3.0, 4.0], [5.0, 6.0]]}
    runs = []
    for (agent, task), ev in evals.items():
        run = Run(agent, task, tmp_path / task / agent, [], {}, 0.0 if task == "t1" else None)
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "summary.json").write_text(json.dumps({"env_steps": 10, "seeds": 2, "eval_returns": ev,
                                                              "eval_return": float(np.mean(ev))}))
        runs.append(run)
    rows = [result_row(r) for r in runs]
    expected = {k: float(np.mean([np.mean(np.asarray(e) > 0.0) for e in ev])) for k, ev in evals.items()}
    assert expected[("a", "t1")] == 0.625 and expected[("b", "t1")] == 0.625  # (2/4 + 3/4) / 2, (1/4 + 4/4) / 2
    for row in rows:
        key = (row["agent"], row["task"])
        assert row["success"] == pytest.approx(expected[key]) if key[1] == "t1" else np.isnan(row["success"])
    write_csv(rows, tmp_path / "results.csv")
    with (tmp_path / "results.csv").open() as f:
        assert [r["success"] for r in csv.DictReader(f)] == ["0.625", "0.625", ""]
    cfg = bench_cfg("suite=memory", extra=[])
    md = write_markdown(cfg, {"steps": 10, "seeds": 2, "eval_episodes": 4}, runs, rows, tmp_path / "r.md", "cmd")
    table = [line for line in md.read_text().splitlines() if line.startswith(("| t1 ", "| t2 "))]
    assert "| a success | b success |" in md.read_text()
    assert table[0].split(" | ")[3:5] == ["0.62", "0.62"] and table[1].split(" | ")[3:5] == ["–", "–"]
    plain = [Run(r.agent, r.task, r.run_dir, [], {}) for r in runs]
    md = write_markdown(cfg, {"steps": 10, "seeds": 2, "eval_episodes": 4}, plain,
                        [result_row(r) for r in plain], tmp_path / "p.md", "cmd")
    assert "success" not in md.read_text()


def test_the_figure_title_fits_a_one_task_figure(tmp_path, monkeypatch):
    """A suite's title (name, steps, seeds, spread) is wider than one 5-inch panel: it wraps inside the figure
    instead of running past both edges."""
    import matplotlib.figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from scripts.benchmark import Run, write_figure

    run = Run("dqn", "memory_s8", tmp_path / "run", [], {"random": 0.17})
    run.run_dir.mkdir()
    (run.run_dir / "metrics.csv").write_text("env_steps,seed,episode_return,episodes\n100,0,0.5,2\n200,0,0.6,2\n")
    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    title = "minigrid_memory: 4,000,000 env steps, 3 seed(s); mean and band (std) over seeds"
    write_figure([run], tmp_path / "curves.png", "std", title)
    fig = saved[0]
    canvas = FigureCanvasAgg(fig)  # pyplot's close left the figure without one
    canvas.draw()
    (text,) = [t for t in fig.texts if t.get_text() == title]
    box = text.get_window_extent(canvas.get_renderer())
    assert 0 <= box.x0 < box.x1 <= fig.bbox.x1, (box, fig.bbox)
