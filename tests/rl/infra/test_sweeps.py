"""Sweeps: launcher/sweeper/distributed configs compose, the sweep callback's files and wandb group, and
a tiny real multirun through the default (joblib) launcher."""

from __future__ import annotations

import csv
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

from rl.infra import sweep

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = str(ROOT / "configs")


def hydra_compose(overrides: list[str]):
    with initialize_config_dir(version_base="1.3", config_dir=CONFIGS, job_name="train"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def test_default_launcher_is_local_joblib_and_callback_registered():
    cfg = hydra_compose([])
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == 4
    assert cfg.hydra.callbacks.sweep._target_ == "rl.infra.sweep.SweepCallback"


# The SLURM/ray launchers and the Optuna sweeper are the `cluster` extra of pyproject.toml.
@pytest.mark.parametrize("launcher, target, override, expected", [
    ("local", "hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs=2",
     {"n_jobs": 2, "prefer": "processes"}),
    ("slurm", "hydra_submitit_launcher.submitit_launcher.SlurmLauncher", "partition=gpu",
     {"partition": "gpu", "gpus_per_node": 1, "timeout_min": 240, "array_parallelism": 64}),
    ("ray_cluster", "hydra_ray_launcher.ray_launcher.RayLauncher", "ray.remote.num_gpus=1",
     {"ray.remote.num_gpus": 1, "ray.remote.num_cpus": 4, "ray.init.address": "head:6379"}),
])
def test_launcher_configs_compose(launcher, target, override, expected, monkeypatch):
    pytest.importorskip(f"hydra_plugins.{target.split('.')[0]}")
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    cfg = hydra_compose([f"hydra/launcher={launcher}", f"hydra.launcher.{override}"])
    assert cfg.hydra.launcher._target_ == f"hydra_plugins.{target}"
    assert {k: OmegaConf.select(cfg.hydra.launcher, k) for k in expected} == expected


def test_launcher_configs_reject_unknown_keys():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="partitionn"):
        hydra_compose(["hydra/launcher=slurm", "hydra.launcher.partitionn=gpu"])


def test_optuna_sweeper_params_parse_and_exist_in_the_agent_config():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides

    cfg = hydra_compose(["hydra/sweeper=optuna_dqn", "agent=dqn"])
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == 0
    distributions, fixed = create_params_from_overrides([f"{k}={v}" for k, v in sweeper.params.items()])
    assert sorted(distributions) == sorted(sweeper.params) and not fixed
    for key in sweeper.params:
        assert OmegaConf.select(cfg, key) is not None, f"{key} is not a key of the dqn config"
    assert type(distributions["agent.optim.lr"]).__name__ == "LogUniformDistribution"


def test_distributed_configs_compose_from_env(monkeypatch):
    assert hydra_compose([]).distributed.enabled is False
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "host0:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    d = hydra_compose(["distributed=env"]).distributed
    assert (d.enabled, d.coordinator_address, d.num_processes, d.process_id) == (True, "host0:1234", 4, 3)
    auto = hydra_compose(["distributed=auto"]).distributed
    assert auto.enabled and auto.num_processes is None
    mesh = hydra_compose(["mesh.devices=8", "mesh.seed_devices=2"]).mesh
    assert (mesh.devices, mesh.seed_devices) == (8, 2)


def _multirun_config(tmp_path: Path, overrides: list[str]):
    cfg = hydra_compose(overrides)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.sweep.dir = str(tmp_path / "multirun" / "2025-01-31" / "12-00-00")
        cfg.hydra.job.num = 3
        cfg.hydra.job.override_dirname = "agent.optim.lr=0.001,seed=2"
        cfg.hydra.runtime.output_dir = str(tmp_path / "job3")
    return cfg


def test_callback_sets_one_wandb_group_per_sweep_and_writes_job_json(tmp_path, monkeypatch):
    for key in ("WANDB_RUN_GROUP", "WANDB_NAME", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.setenv(key, "")  # restored after the test
        monkeypatch.delenv(key)
    cb = sweep.SweepCallback()
    cfg = _multirun_config(tmp_path, ["agent.optim.lr=0.001", "seed=2", "hydra/launcher=local"])
    seen = {}
    cb.on_job_start(cfg, task_function=None)
    seen.update({k: os.environ.get(k) for k in ("WANDB_RUN_GROUP", "WANDB_NAME", "XLA_PYTHON_CLIENT_PREALLOCATE")})
    assert seen == {"WANDB_RUN_GROUP": "sweep-2025-01-31-12-00-00", "WANDB_NAME": "agent.optim.lr=0.001,seed=2",
                    "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    ret = JobReturn(status=JobStatus.COMPLETED, _return_value=12.5)
    cb.on_job_end(cfg, job_return=ret)
    assert "WANDB_RUN_GROUP" not in os.environ
    job = json.loads((tmp_path / "job3" / "job.json").read_text())
    assert job["status"] == "COMPLETED" and job["objective"] == 12.5 and job["job"] == 3
    cb.on_job_end(cfg, job_return=JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("diverged")))
    job = json.loads((tmp_path / "job3" / "job.json").read_text())
    assert job["status"] == "FAILED" and job["objective"] is None and job["error"] == "RuntimeError: diverged"

    # an explicit logger.wandb.group wins; single runs are left alone
    cfg = _multirun_config(tmp_path, ["logger.wandb.group=mine"])
    cb.on_job_start(cfg, task_function=None)
    assert "WANDB_RUN_GROUP" not in os.environ
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.RUN
        cfg.logger.wandb.group = None
    cb.on_job_start(cfg, task_function=None)
    assert "WANDB_RUN_GROUP" not in os.environ


def _write_job(d: Path, num: int, overrides: list[str], status: str, rows=None, summary=None, objective=None):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (d / "job.json").write_text(json.dumps({"job": num, "status": status, "objective": objective,
                                            "error": None if status == "COMPLETED" else "ValueError: bad"}))
    if rows is not None:
        with (d / "metrics.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["env_steps", "seed", "episode_return"])
            w.writeheader()
            w.writerows(rows)
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))


def test_summary_csv_of_final_returns(tmp_path):
    rows = [{"env_steps": 100, "seed": 0, "episode_return": 10}, {"env_steps": 100, "seed": 1, "episode_return": 20},
            {"env_steps": 200, "seed": 0, "episode_return": 30}, {"env_steps": 200, "seed": 1, "episode_return": ""}]
    _write_job(tmp_path / "0", 0, ["agent.optim.lr=0.001"], "COMPLETED", rows,
               {"env_steps": 200, "eval_returns": [[1.0, 3.0], [5.0, 7.0]]}, objective=4.0)
    _write_job(tmp_path / "1", 1, ["agent.optim.lr=0.01", "seed=1"], "FAILED")
    path = sweep.summarize(tmp_path)
    table = list(csv.DictReader(path.open()))
    assert list(table[0])[:4] == ["job", "status", "agent.optim.lr", "seed"]
    ok, failed = table
    assert (ok["job"], ok["status"], ok["agent.optim.lr"], ok["seed"]) == ("0", "COMPLETED", "0.001", "")
    # last non-empty episode_return per seed: 30 (seed 0) and 20 (seed 1)
    assert float(ok["final_return"]) == 25.0 and float(ok["final_return_std"]) == 5.0
    assert float(ok["eval_return"]) == 4.0 and float(ok["eval_return_std"]) == 2.0
    assert (ok["env_steps"], ok["seeds"], ok["objective"]) == ("200", "2", "4.0")
    # run_dir is the run's path (not its job number), usable from anywhere
    assert ok["run_dir"] == str((tmp_path / "0").absolute()) and Path(ok["run_dir"]).is_absolute()
    assert failed["run_dir"] == str((tmp_path / "1").absolute())
    assert (failed["status"], failed["final_return"], failed["error"]) == ("FAILED", "", "ValueError: bad")


def test_population_summary_has_each_members_final_and_greedy_returns(tmp_path):
    """summarize_members: one row per member, its overrides, the mean/std over its seeds of the last logged
    return (metrics.csv rows keyed by member and seed) and of each seed's mean greedy return (summary.json's
    eval_returns, member-major)."""
    with (tmp_path / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["env_steps", "member", "agent.optim.lr", "seed", "episode_return"])
        w.writerows([[100, 0, 0.1, 0, 1], [100, 0, 0.1, 1, 3], [100, 1, 0.2, 0, 5], [100, 1, 0.2, 1, 9],
                     [200, 0, 0.1, 0, 2], [200, 0, 0.1, 1, 4], [200, 1, 0.2, 0, 6], [200, 1, 0.2, 1, ""]])
    (tmp_path / "summary.json").write_text(json.dumps({"env_steps": 200, "eval_returns": [
        [1.0, 3.0], [5.0, 5.0], [10.0, 20.0], [30.0, 30.0]]}))  # member 0: seeds 0, 1; member 1: seeds 0, 1
    rows = sweep.summarize_members(tmp_path, [{"agent.optim.lr": 0.1}, {"agent.optim.lr": 0.2}])
    table = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [(r["member"], r["agent.optim.lr"]) for r in table] == [("0", "0.1"), ("1", "0.2")]
    expected = [(3.0, 1.0, 3.5, 1.5), (7.5, 1.5, 22.5, 7.5)]  # final (last non-empty) and eval, mean and std
    for row, csv_row, want in zip(rows, table, expected):
        got = tuple(row[k] for k in ("final_return", "final_return_std", "eval_return", "eval_return_std"))
        assert got == pytest.approx(want) and float(csv_row["eval_return"]) == pytest.approx(want[2])
        assert (row["seeds"], row["env_steps"]) == (2, 200)


def test_member_overrides_are_the_columns_between_member_and_seed(tmp_path):
    """A population run's metrics.csv: `{member: {override: value}}` from the columns between `member` and
    `seed` (two of them here, each keeping its own value); a run without members gives {}."""
    with (tmp_path / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["env_steps", "member", "agent.optim.lr", "agent.discount", "seed", "episode_return"])
        w.writerows([[100, 0, 0.1, 0.9, 0, 1], [100, 1.0, 0.2, 0.99, 0, 5]])
    assert sweep.member_overrides(tmp_path) == {0: {"agent.optim.lr": "0.1", "agent.discount": "0.9"},
                                                1: {"agent.optim.lr": "0.2", "agent.discount": "0.99"}}
    (tmp_path / "metrics.csv").write_text("env_steps,seed,episode_return\n100,0,1\n")
    assert sweep.member_overrides(tmp_path) == {}


def test_find_runs_orders_by_job_number_then_path(tmp_path):
    """Run dirs (a metrics.csv) in hydra job order: job.json's number, else a numeric dir name; runs with
    neither, and a job.json without a number, come last, by path."""
    for name, job in (("b", {"job": 10}), ("a", None), ("2", None), ("c", {"job": 1}), ("z", {}), ("m", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text("env_steps,seed\n")
        if job is not None:
            (tmp_path / name / "job.json").write_text(json.dumps(job))
    (tmp_path / "no_metrics").mkdir()
    assert [p.name for p in sweep.find_runs(tmp_path)] == ["c", "2", "b", "a", "m", "z"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # runpy: rl.infra.sweep is already imported
def test_command_line_rewrites_the_summary(tmp_path, monkeypatch, capsys):
    """`python -m rl.infra.sweep <sweep dir>` (README) writes the sweep's summary.csv and prints its path;
    without the directory it exits with its usage line."""
    _write_job(tmp_path / "0", 0, ["seed=1"], "COMPLETED")
    monkeypatch.setattr(sys, "argv", ["sweep", str(tmp_path)])
    runpy.run_module("rl.infra.sweep", run_name="__main__")
    assert capsys.readouterr().out.strip() == str(tmp_path / "summary.csv")
    assert [row["seed"] for row in csv.DictReader((tmp_path / "summary.csv").open())] == ["1"]
    monkeypatch.setattr(sys, "argv", ["sweep"])
    with pytest.raises(SystemExit, match="usage: python -m rl.infra.sweep <sweep dir>"):
        runpy.run_module("rl.infra.sweep", run_name="__main__")


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """`python -m scripts.train -m` with 2 jobs (two learning rates) on the default joblib launcher."""
    out = tmp_path_factory.mktemp("sweep")
    cmd = [sys.executable, "-m", "scripts.train", "-m", "agent=dqn", "agent.optim.lr=0.001,0.0003",
           "env=cartpole", "logger=none", "checkpoint.enabled=false", "total_steps=256", "num_envs=4",
           "log_interval=64", "eval_episodes=2", "agent.learning_starts=64", "agent.batch_size=16",
           "agent.network.hidden_sizes=[16]", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={out}"]
    env = dict(os.environ, WANDB_MODE="disabled", JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout + proc.stderr


def test_tiny_multirun_writes_summary_csv(tiny_sweep):
    out, log = tiny_sweep
    assert "Joblib.Parallel(n_jobs=2" in log and f"sweep summary: {out / 'summary.csv'}" in log
    table = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["agent.optim.lr"] for r in table] == ["0.001", "0.0003"]
    for job, row in enumerate(table):
        assert row["job"] == str(job) and row["status"] == "COMPLETED" and row["env_steps"] == "256"
        assert Path(row["run_dir"]) == (out / str(job)).absolute()
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        np.testing.assert_allclose(float(row["eval_return"]), np.mean(summary["eval_returns"]), rtol=1e-6)
        assert float(row["objective"]) == pytest.approx(float(row["eval_return"]))
        assert np.isfinite(float(row["final_return"])) and float(row["final_return"]) > 0


def test_plot_real_sweep_logs(tiny_sweep):
    from scripts import plot

    out, _ = tiny_sweep
    groups = plot.collect_curves(out, "episode_return")
    assert sorted(groups) == ["agent.optim.lr=0.0003", "agent.optim.lr=0.001"]
    path = plot.main([str(out), "--metric", "episode_return", "--metric", "train/loss"])
    assert path.exists() and path.read_bytes()[:4] == b"\x89PNG"


def test_objective_is_the_mean_eval_return_else_the_last_logged_return():
    assert sweep.objective({"eval_returns": [[1.0, 3.0], [5.0, 7.0]], "episode_return": [0.0, 0.0]}) == 4.0
    assert sweep.objective({"eval_returns": [[], []], "episode_return": [2.0, float("nan"), 4.0]}) == 3.0
    assert np.isnan(sweep.objective({"eval_returns": [], "episode_return": [float("nan")]}))
