"""Benchmark suites: every agent of a suite on every task, one results table, one figure.

    python -m scripts.benchmark suite=minatar                  # DQN, Muesli x 5 MinAtar games, 5M steps, 3 seeds
    python -m scripts.benchmark suite=memory                   # R2D2, DQN x MemoryChain 10/30/50, masked CartPole
    python -m scripts.benchmark suite=minigrid_memory          # R2D2, DQN x xminigrid MemoryS8/S16, success rates
    python -m scripts.benchmark suite=minatar quick=true       # smoke run: 200k steps, 1 seed, 2 games
    python -m scripts.benchmark suite=minatar tasks=[breakout] agents=[dqn] out_dir=/tmp/b
    python -m scripts.benchmark suite=minatar dry_run=true     # print the runs' training commands
    python -m scripts.benchmark suite=memory report_only=true  # tables and figure from what exists, no training
    python -m scripts.benchmark suite=minatar report_only=true results_dir=results/minatar   # ... to commit

Config: configs/benchmark.yaml (budget, seeds, out dir, subsets) and configs/suite/<name>.yaml (the agents
and tasks as training overrides, the budget, the published reference figures and their sources).

Each (agent, task) is one run of the training entry, `python -m scripts.train <overrides>
hydra.run.dir=<out_dir>/runs/<task>/<agent>` in a subprocess (its console output in `console.log` there, the run's own log in `train.log`), with
`seeds` vmapped seeds, the suite's budget, and `checkpoint.interval` = budget / `suite.checkpoints`.

Resumption: run the same command again. A run dir with `summary.json` is finished and skipped; one with a
checkpoint but no summary is resumed from it (`resume=<run dir>`, into the same dir: scripts/train.py
restores the state and the metric history and carries on); one with neither is wiped and restarted. Each
run dir's `benchmark_run.json` records its training overrides (a re-run with different overrides for an
existing run dir stops with an error instead of mixing configs) and every attempt's wall time.

Outputs in `out_dir` (default outputs/benchmark/<suite>, git-ignored):
* `results.csv`: one row per run: agent, task, status, env_steps, seeds, eval_mean/eval_std (greedy
  evaluation after training: mean over seeds of each seed's mean return, std over seeds), eval_episodes
  (per seed), success (tasks with `success_above: <return>` in the suite yaml: the share of greedy episodes
  returning more than that, mean over seeds; empty otherwise), last10_mean/
  last10_std (training episode return over the last 10% of env steps, from metrics.csv: each seed's mean
  over the episodes finished there, then mean/std over seeds), wall_s (summed over attempts, compile and
  evaluation included), wall_complete (False when an attempt was killed outright: its time is unknown and
  sps is left empty), sps (env steps of all seeds per wall second), commits (the git commit of each attempt, in order;
  a run resumed across commits lists several), run_dir.
* `results.md`: the same as markdown, one row per task with the reference figures beside ours.
* With `results_dir=<dir>`: the same three files in `<dir>`, beside a copy of each finished run's metrics.csv,
  summary.json, composed config (config.yaml) and benchmark_run.json in `<dir>/runs/<task>/<agent>/` (no
  checkpoints), from which the tables and the figure there are drawn: the committable record of a suite.
  A finished run published there but missing from the out dir (a new machine) is copied back first and
  counts as done, so `python -m scripts.benchmark suite=minatar results_dir=results/minatar` on a fresh
  clone trains only what the committed table lacks.
* `learning_curves.png`: one panel per task, one colour per agent, mean and band over seeds (the loading
  and aggregation of scripts/plot.py), reference figures as dashed lines.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from agents.setup import compose
from rl.infra.sweep import RETURN_KEY, final_returns, read_metrics
from scripts.plot import aggregate, collect_curves

REPO = Path(__file__).resolve().parent.parent
RECORD = "benchmark_run.json"
CSV_COLUMNS = ("agent", "task", "status", "env_steps", "seeds", "eval_mean", "eval_std", "eval_episodes", "success",
               "last10_mean", "last10_std", "wall_s", "wall_complete", "sps", "commits", "run_dir")


@dataclass
class Run:
    agent: str
    task: str
    run_dir: Path
    overrides: list[str]  # training overrides, without resume / hydra.run.dir
    references: dict[str, float] = field(default_factory=dict)
    success_above: float | None = None  # a greedy episode returning more than this succeeded (suite yaml)


class BenchmarkError(RuntimeError):
    pass


# ---- planning ----------------------------------------------------------------------------------------

def _select(names: list[str], wanted, what: str) -> list[str]:
    if wanted is None:
        return names
    wanted = list(wanted)
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise BenchmarkError(f"unknown {what} {unknown}; the suite has {names}")
    return [n for n in names if n in wanted]


def settings(cfg: DictConfig) -> dict:
    """Budget, seeds, out dir and intervals after `quick` and the defaults are applied."""
    suite = cfg.suite
    quick = bool(cfg.quick)
    steps = int(cfg.total_steps if cfg.total_steps is not None else (cfg.quick_steps if quick else suite.total_steps))
    seeds = 1 if quick else int(cfg.seeds)
    default_dir = Path("outputs/benchmark") / (suite.name + ("-quick" if quick else ""))
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_dir
    log_interval = min(int(suite.log_interval), max(steps // 40, 1))
    ckpt_interval = max(steps // max(int(suite.checkpoints), 1), 1)
    return {"steps": steps, "seeds": seeds, "out_dir": out_dir, "log_interval": log_interval,
            "checkpoint_interval": ckpt_interval, "eval_episodes": int(suite.eval_episodes), "quick": quick}


def plan(cfg: DictConfig) -> tuple[dict, list[Run]]:
    """The runs of the suite, in order (task-major), with their training overrides."""
    suite = cfg.suite
    s = settings(cfg)
    tasks = _select(list(suite.tasks), cfg.tasks, "tasks")
    if s["quick"] and cfg.tasks is None:
        tasks = tasks[: int(cfg.quick_tasks)]
    agents = _select(list(suite.agents), cfg.agents, "agents")
    runs = []
    for task in tasks:
        t = suite.tasks[task]
        for agent in agents:
            per_agent = OmegaConf.select(t, f"agent_overrides.{agent}", default=None) or []
            overrides = [*suite.get("overrides", []), *suite.agents[agent], *t.overrides, *per_agent,
                         f"seeds={s['seeds']}", f"total_steps={s['steps']}", f"eval_episodes={s['eval_episodes']}",
                         f"log_interval={s['log_interval']}", f"checkpoint.interval={s['checkpoint_interval']}",
                         f"logger={cfg.logger}", *cfg.extra_overrides]
            refs = {k: float(v) for k, v in (t.get("references") or {}).items()}
            above = t.get("success_above")
            runs.append(Run(agent, task, s["out_dir"] / "runs" / task / agent, [str(o) for o in overrides], refs,
                            None if above is None else float(above)))
    return s, runs


# ---- running -------------------------------------------------------------------------------------------

def _read_record(run: Run) -> dict | None:
    path = run.run_dir / RECORD
    return json.loads(path.read_text()) if path.exists() else None


def _write_record(run: Run, record: dict) -> None:
    (run.run_dir / RECORD).write_text(json.dumps(record, indent=2))


def _checkpoint_steps(run_dir: Path) -> list[int]:
    ckpts = run_dir / "checkpoints"
    return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []


def _has_checkpoint(run_dir: Path) -> bool:
    return bool(_checkpoint_steps(run_dir))


def state_of(run: Run) -> str:
    """done (summary.json) | resume (a checkpoint, no summary) | fresh (nothing usable)."""
    if (run.run_dir / "summary.json").exists():
        return "done"
    if _has_checkpoint(run.run_dir):
        return "resume"
    return "fresh"


def check_records(runs: list[Run]) -> None:
    """Refuse to continue runs that were started with other training overrides."""
    changed = []
    for run in runs:
        record = _read_record(run)
        if record is not None and record.get("overrides") != run.overrides and state_of(run) != "fresh":
            changed.append(f"{run.run_dir}:\n    before: {record.get('overrides')}\n    now:    {run.overrides}")
    if changed:
        raise BenchmarkError("these run dirs hold runs with other training overrides; pick another out_dir or "
                             "delete them:\n  " + "\n  ".join(changed))


def _total_steps(run: Run) -> int:
    return int(next(o for o in reversed(run.overrides) if o.startswith("total_steps=")).partition("=")[2])


def command(run: Run, resume: bool) -> list[str]:
    extra = [f"resume={run.run_dir.absolute()}"] if resume else []
    if resume and _checkpoint_steps(run.run_dir)[-1] >= _total_steps(run):
        # Training had finished (stopped during the evaluation): the runner would save the final step's
        # checkpoint again, which orbax refuses; checkpointing is resume-free (rl/config.py), so turn it off.
        extra.append("checkpoint.enabled=false")
    return [sys.executable, "-m", "scripts.train", *run.overrides, *extra, f"hydra.run.dir={run.run_dir.absolute()}"]


_LIVE: set[subprocess.Popen] = set()  # training subprocesses running now (several with jobs > 1)


class Interrupted(KeyboardInterrupt):
    """The driver was stopped (Ctrl-C, SIGTERM) after the run in progress checkpointed; one line to print."""


def _call(cmd: list[str], log, env: dict[str, str], name: str) -> int:
    """Run the training subprocess in its own session (a terminal's Ctrl-C reaches only this driver) and
    hand a Ctrl-C or SIGTERM of the driver on to it as one SIGINT: the run checkpoints within seconds and
    this raises `Interrupted` saying how to resume. A second Ctrl-C is handed on too (the run aborts its save)."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    _LIVE.add(proc)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        print(f"[benchmark] stopping: {name} checkpoints and exits (Ctrl-C again aborts its save)", flush=True)
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            rc = proc.wait()
        raise Interrupted(f"stopped: {name} exited with {rc} after checkpointing; run the same command again to "
                          "resume the suite") from None
    finally:
        _LIVE.discard(proc)


def train(run: Run, env: dict[str, str]) -> dict:
    """Train (or resume, or skip) one run; returns `{"status": done|failed, "attempted": bool}`."""
    state = state_of(run)
    if state == "done":
        return {"status": "done", "attempted": False}
    record = _read_record(run) if state == "resume" else None
    if state == "fresh" and run.run_dir.exists():
        shutil.rmtree(run.run_dir)  # a run stopped before its first checkpoint: start over
    run.run_dir.mkdir(parents=True, exist_ok=True)
    record = record or {"agent": run.agent, "task": run.task, "overrides": run.overrides, "attempts": []}
    attempt = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "resumed": state == "resume", "wall_s": None,
               "returncode": None, "commit": _git_commit()}
    record["attempts"].append(attempt)
    _write_record(run, record)  # before the subprocess: an attempt killed outright stays on record
    cmd = command(run, resume=state == "resume")
    print(f"[benchmark] {run.task}/{run.agent}: {'resuming' if state == 'resume' else 'training'} "
          f"(console: {run.run_dir / 'console.log'})", flush=True)
    t0 = time.perf_counter()
    rc = None
    try:
        with (run.run_dir / "console.log").open("a") as log:
            log.write(f"\n$ {shlex.join(cmd)}\n")
            log.flush()
            rc = _call(cmd, log, env, f"{run.task}/{run.agent}")
    finally:  # also on Ctrl-C: the attempt's time is kept for the run's wall time
        attempt["wall_s"] = time.perf_counter() - t0
        attempt["returncode"] = rc
        _write_record(run, record)
    ok = rc == 0 and (run.run_dir / "summary.json").exists()
    if not ok:
        tail = (run.run_dir / "console.log").read_text().splitlines()[-15:]
        print(f"[benchmark] {run.task}/{run.agent} FAILED (exit {rc}); end of its console.log:\n  "
              + "\n  ".join(tail), flush=True)
    else:
        print(f"[benchmark] {run.task}/{run.agent} done in {attempt['wall_s']:.0f}s", flush=True)
    return {"status": "done" if ok else "failed", "attempted": True}


# ---- results -------------------------------------------------------------------------------------------

def last_fraction_return(run_dir: Path, fraction: float = 0.1) -> tuple[float, float]:
    """Mean and std over seeds of the training episode return over the last `fraction` of env steps (each
    seed: the mean over the episodes finished there, logged rows weighted by their episode count)."""
    per_seed = []
    for cols in read_metrics(run_dir).values():
        steps, ret = cols["env_steps"], cols.get(RETURN_KEY)
        if ret is None or steps.size == 0:
            continue
        keep = (steps > (1.0 - fraction) * steps.max()) & ~np.isnan(ret)
        if not keep.any():  # coarse logging: the last logged return
            keep = ~np.isnan(ret) & (steps == steps[~np.isnan(ret)].max()) if (~np.isnan(ret)).any() else keep
        if not keep.any():
            continue
        w = cols.get("episodes")
        w = np.where(np.isnan(w[keep]), 0.0, w[keep]) if w is not None else np.ones(keep.sum())
        w = w if w.sum() > 0 else np.ones_like(w)
        per_seed.append(float(np.average(ret[keep], weights=w)))
    if not per_seed:
        return math.nan, math.nan
    return float(np.mean(per_seed)), float(np.std(per_seed))


def result_row(run: Run, status: str | None = None) -> dict:
    record = _read_record(run) or {}
    has_metrics = (run.run_dir / "metrics.csv").exists()
    if status is None:
        status = state_of(run)
        status = {"done": "done", "resume": "incomplete", "fresh": "incomplete" if has_metrics else "missing"}[status]
    fin = final_returns(run.run_dir) if run.run_dir.exists() else {}
    last_mean, last_std = last_fraction_return(run.run_dir) if has_metrics else (math.nan, math.nan)
    attempts = record.get("attempts", [])
    wall = sum(a.get("wall_s") or 0.0 for a in attempts)
    wall_complete = all(a.get("wall_s") is not None for a in attempts)  # an attempt killed outright has none
    steps, seeds = fin.get("env_steps"), fin.get("seeds") or 0
    eval_episodes, success = None, math.nan
    if (run.run_dir / "summary.json").exists():
        evals = json.loads((run.run_dir / "summary.json").read_text()).get("eval_returns") or []
        eval_episodes = len(evals[0]) if evals else 0
        if evals and run.success_above is not None:
            success = float(np.mean([np.mean(np.asarray(e, float) > run.success_above) for e in evals]))
    sps = steps * seeds / wall if steps and seeds and wall > 0 and wall_complete else math.nan
    commits = " ".join(dict.fromkeys(a["commit"] for a in attempts if a.get("commit")))  # in attempt order
    return {"agent": run.agent, "task": run.task, "status": status, "env_steps": steps, "seeds": seeds,
            "eval_mean": fin.get("eval_return", math.nan), "eval_std": fin.get("eval_return_std", math.nan),
            "eval_episodes": eval_episodes, "success": success,
            "last10_mean": last_mean, "last10_std": last_std, "wall_s": wall if wall > 0 else math.nan,
            "wall_complete": wall_complete,
            "sps": sps, "commits": commits, "run_dir": str(run.run_dir)}


class _Uniform:
    """A uniformly random policy with the agent surface `rl.runners.evaluate.evaluate` calls."""

    def __init__(self, num_actions: int):
        self.num_actions = num_actions

    def initial_carry(self, num: int):
        return ()

    def act(self, state, obs, carry, key, env_ids, explore: bool = False):
        return jax.random.randint(key, (obs.shape[0],), 0, self.num_actions), carry, {}


def random_policy_return(env_overrides: str | list[str], episodes: int = 1000, seed: int = 0) -> float:
    """Mean return of a uniformly random policy over `episodes` episodes of the env that `env_overrides`
    compose (`env=<name>` and any `env.*` keys; an Anakin source: gymnax or a JAX env library). The floor of
    the normalised scores: the figures in configs/suite/*.yaml `random:` come from here."""
    from rl.envs import make_source
    from rl.runners.evaluate import evaluate

    overrides = [env_overrides] if isinstance(env_overrides, str) else list(env_overrides)
    source = make_source(compose(overrides).env, episodes)
    returns, _ = jax.jit(lambda k: evaluate(_Uniform(source.num_actions), None, source, k))(jax.random.PRNGKey(seed))
    return float(np.mean(returns))


def seed_scores(run_dir: Path) -> np.ndarray | None:
    """Each seed's mean greedy return `[S]` after training (summary.json), None if the run has none."""
    path = run_dir / "summary.json"
    evals = json.loads(path.read_text()).get("eval_returns") if path.exists() else None
    return np.asarray(evals, float).mean(axis=1) if evals else None


def aggregate_scores(runs: list[Run], rows: list[dict], reps: int = 50_000) -> dict:
    """IQM of normalised scores over tasks x seeds with a 95% stratified bootstrap interval (rliable), for
    each agent that finished every task. A score is (R - random) / (best - random): `random` the task's
    uniform-policy return (suite yaml), `best` the highest mean greedy return of the task in this table,
    agents and reference figures alike. Returns {agent: {"iqm", "low", "high", "tasks"}} and, under
    "_missing", the agents left out with their unfinished tasks."""
    from rliable import library as rly
    from rliable import metrics

    tasks = list(dict.fromkeys(r.task for r in runs))
    agents = list(dict.fromkeys(r.agent for r in runs))
    done = {(r["agent"], r["task"]): r for r in rows if r["status"] == "done"}
    best = {t: max([done[a, t]["eval_mean"] for a in agents if (a, t) in done]
                   + [v for k, v in next(r.references for r in runs if r.task == t).items() if k != "random"],
                   default=math.nan) for t in tasks}
    floors = {r.task: r.references["random"] for r in runs}
    scores, missing = {}, {}
    for a in agents:
        lacking = [t for t in tasks if (a, t) not in done]
        if lacking:
            missing[a] = lacking
            continue
        per_task = [seed_scores(next(r.run_dir for r in runs if r.agent == a and r.task == t)) for t in tasks]
        n = min(len(p) for p in per_task)
        scores[a] = np.stack([(p[:n] - floors[t]) / (best[t] - floors[t]) for p, t in zip(per_task, tasks)], axis=1)
    if not scores:
        return {"_missing": missing}
    point, interval = rly.get_interval_estimates(scores, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps,
                                                 random_state=np.random.RandomState(0))
    out = {a: {"iqm": float(point[a][0]), "low": float(interval[a][0, 0]), "high": float(interval[a][1, 0]),
               "tasks": tasks} for a in scores}
    return {**out, "_missing": missing}


def _cell(v, digits: int = 4):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return round(v, digits)
    return v


def write_csv(rows: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row[k]) for k in CSV_COLUMNS})
    return path


def _pm(mean: float, std: float) -> str:
    if mean is None or math.isnan(mean):
        return "–"
    return f"{mean:.2f} ± {std:.2f}" if not math.isnan(std) else f"{mean:.2f}"


def _share(row: dict | None) -> str:
    return "–" if row is None or math.isnan(row["success"]) else f"{row['success']:.2f}"


def _git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"],
                               cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_markdown(cfg: DictConfig, s: dict, runs: list[Run], rows: list[dict], path: Path, cmd: str) -> Path:
    suite = cfg.suite
    agents = list(dict.fromkeys(r.agent for r in runs))
    tasks = list(dict.fromkeys(r.task for r in runs))
    ref_keys = list(dict.fromkeys(k for r in runs for k in r.references))
    by = {(r["agent"], r["task"]): r for r in rows}
    refs = {r.task: r.references for r in runs}
    settings_line = (f"`{cmd}` — {s['steps']:,} env steps per seed, {s['seeds']} seed(s) per run (vmapped), "
                     f"greedy evaluation on {s['eval_episodes']} episodes per seed after training; "
                     f"table written at git {_git_commit()} (each run's training commits: the git column).")
    lines = [f"# Benchmark `{suite.name}`", "", settings_line, ""]
    if cfg.extra_overrides:
        lines += [(f"Extra overrides on every run (they may change the settings above): "
                   f"`{' '.join(map(str, cfg.extra_overrides))}`."), ""]
    lines += [("Greedy eval: mean over seeds of each seed's mean greedy return ± std over seeds. Last 10%: "
               "training episode return over the last 10% of env steps (exploring policy), mean ± std over "
               "seeds."), ""]
    with_success = any(r.success_above is not None for r in runs)
    if with_success:
        lines += [("Success: the share of greedy episodes returning more than the task's `success_above` "
                   "(suite yaml), mean over seeds."), ""]
    head = (["task"] + [f"{a} greedy eval" for a in agents] + [f"{a} success" for a in agents if with_success]
            + [f"{a} last 10%" for a in agents] + ref_keys)
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task in tasks:
        cells = [task]
        for key in ("eval", "last10"):
            for a in agents:
                r = by.get((a, task))
                if r is None:
                    cells.append("–")
                else:
                    flag = "" if r["status"] == "done" else f" ({r['status']})"
                    cells.append(_pm(r[f"{key}_mean"], r[f"{key}_std"]) + flag)
            if key == "eval" and with_success:
                cells += [_share(by.get((a, task))) for a in agents]
        cells += [f"{refs[task][k]:g}" if k in refs[task] else "–" for k in ref_keys]
        lines.append("| " + " | ".join(cells) + " |")
    if all("random" in r.references for r in runs):  # suites with a chance floor on every task
        agg = aggregate_scores(runs, rows)
        lines += ["", "## Aggregate", "",
                  ("IQM of normalised greedy scores over tasks x seeds, 95% stratified bootstrap interval "
                   "(rliable). Normalised score: (R - random) / (best - random), with `random` a uniform "
                   "policy's return on the task and `best` the highest mean greedy return of that task in "
                   "this table (our agents and the reference figures): 1 is the best of the table, 0 chance."),
                  ""]
        for a, v in agg.items():
            if a != "_missing":
                lines.append(f"* {a}: IQM {v['iqm']:.3f} [{v['low']:.3f}, {v['high']:.3f}] over {len(v['tasks'])} "
                             f"tasks x seeds")
        for a, lacking in agg["_missing"].items():
            lines.append(f"* {a}: none yet (unfinished: {', '.join(lacking)})")
    lines += ["", "## Runs", "",
              "| agent | task | status | env steps | seeds | eval episodes | wall (s) | SPS | git | run dir |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        wall = "–" if math.isnan(r["wall_s"]) else f"{r['wall_s']:.0f}" + ("" if r["wall_complete"] else "+")
        sps = "–" if math.isnan(r["sps"]) else f"{r['sps']:,.0f}"
        steps = "–" if r["env_steps"] is None else f"{r['env_steps']:,}"
        episodes = "–" if r["eval_episodes"] is None else r["eval_episodes"]
        lines.append(f"| {r['agent']} | {r['task']} | {r['status']} | {steps} | {r['seeds']} | {episodes} | "
                     f"{wall} | {sps} | {r['commits'] or '–'} | {os.path.relpath(r['run_dir'], path.parent)} |")
    lines += ["", ("SPS: env steps of all seeds per second of the run's wall time (compilation, evaluation and "
                   "checkpointing included; summed over the benchmark's attempts of the run). A wall time "
                   "marked + misses an attempt that was killed outright (its time unknown; no SPS)."), "",
              "## Training overrides", ""]
    for run in runs:
        lines.append(f"* {run.task}/{run.agent}: `{' '.join(run.overrides)}`")
    if ref_keys:
        lines += ["", "## Reference figures", ""]
        for k in ref_keys:
            lines.append(f"* {k}: {OmegaConf.select(suite, f'references.{k}', default='(no source given)')}")
    notes = list(suite.get("notes") or [])
    if notes:
        lines += ["", "## Notes", ""] + [f"* {n}" for n in notes]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_figure(runs: list[Run], path: Path, spread: str = "std", title: str = "") -> Path:
    """One panel per task, one colour per agent: mean and band over seeds (scripts/plot.py's readers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = list(dict.fromkeys(r.agent for r in runs))
    tasks = list(dict.fromkeys(r.task for r in runs))
    colours = {a: f"C{i}" for i, a in enumerate(agents)}
    ncols = min(len(tasks), 3)
    nrows = math.ceil(len(tasks) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    for ax, task in zip(axes.ravel(), tasks):
        for run in (r for r in runs if r.task == task):
            if not (run.run_dir / "metrics.csv").exists():
                continue
            try:
                curves = collect_curves(run.run_dir, RETURN_KEY, group_by=[])["all runs"]
            except (ValueError, KeyError):
                continue  # nothing logged yet
            x, mean, low, high = aggregate(curves, spread)
            ax.plot(x, mean, color=colours[run.agent], lw=1.6, label=f"{run.agent} (n={len(curves)})")
            if spread != "none" and len(curves) > 1:
                ax.fill_between(x, low, high, color=colours[run.agent], alpha=0.2, lw=0)
        refs = next((r.references for r in runs if r.task == task), {})
        for i, (k, v) in enumerate(refs.items()):
            ax.axhline(v, color="grey", ls=("--", ":", "-.")[i % 3], lw=1, label=f"{k} {v:g}")
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("env steps")
        ax.set_ylabel("episode return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in axes.ravel()[len(tasks):]:
        ax.set_visible(False)
    fig.suptitle(title or f"mean and band ({spread}) over seeds", fontsize=10, wrap=True)  # a panel can be narrower than it
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---- publishing ----------------------------------------------------------------------------------------

PUBLISHED = {"metrics.csv": "metrics.csv", "summary.json": "summary.json", ".hydra/config.yaml": "config.yaml",
             RECORD: RECORD}  # run file -> name in the results dir (never checkpoints)


def publish(cfg: DictConfig, s: dict, runs: list[Run], cmd: str, results_dir: Path) -> Path:
    """Copy what each finished run produced (PUBLISHED: metrics, summary, composed config, attempt record) to
    `results_dir/runs/<task>/<agent>/` and write results.csv/md and the figure there from those copies, so
    the table can be committed (e.g. results/minatar/) and outlives the run dirs."""
    copies = []
    for run in runs:
        dest = results_dir / "runs" / run.task / run.agent
        if dest.exists():
            shutil.rmtree(dest)  # what an earlier publish copied; replaced by the run's files as they are now
        for src, name in PUBLISHED.items():
            if state_of(run) == "done" and (run.run_dir / src).exists():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run.run_dir / src, dest / name)
        copies.append(Run(run.agent, run.task, dest, run.overrides, run.references, run.success_above))
    rows = []
    for run, copy in zip(runs, copies):
        row = result_row(run)  # status and wall time from the live run dir
        row["run_dir"] = str(copy.run_dir)
        rows.append(row)
    write_csv([{**r, "run_dir": os.path.relpath(r["run_dir"], results_dir)} for r in rows], results_dir / "results.csv")
    write_markdown(cfg, s, copies, rows, results_dir / "results.md", cmd)
    write_figure(copies, results_dir / "learning_curves.png", str(cfg.spread),
                 f"{cfg.suite.name}: {s['steps']:,} env steps, {s['seeds']} seed(s); mean and band ({cfg.spread}) "
                 "over seeds")
    return results_dir


def restore_published(runs: list[Run], results_dir: Path) -> list[Run]:
    """Put back into its run dir each finished run that `publish` copied to `results_dir` but that the out dir
    no longer holds (a new machine, a cleaned out dir), so the suite counts it as done instead of training
    it again; a run dir holding anything usable (a summary or a checkpoint) is left alone. Returns the
    restored runs."""
    restored = []
    for run in runs:
        copy = results_dir / "runs" / run.task / run.agent
        if state_of(run) != "fresh" or not (copy / "summary.json").exists():
            continue
        for src, name in PUBLISHED.items():
            if (copy / name).exists():
                (run.run_dir / src).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(copy / name, run.run_dir / src)
        restored.append(run)
    return restored


# ---- entry ---------------------------------------------------------------------------------------------

def run_benchmark(cfg: DictConfig, cmd: str | None = None) -> dict:
    """Train what is missing, then write results.csv, results.md and learning_curves.png; returns
    `{"out_dir", "rows", "trained": [task/agent, ...], "failed": [...]}`."""
    s, runs = plan(cfg)
    out_dir = s["out_dir"]
    cmd = cmd or f"python -m scripts.benchmark suite={cfg.suite.name}"
    if cfg.dry_run:
        for run in runs:
            print("python " + shlex.join(command(run, resume=state_of(run) == "resume")[1:]))
        return {"out_dir": out_dir, "rows": [], "trained": [], "failed": []}
    if cfg.get("results_dir"):
        for run in restore_published(runs, Path(cfg.results_dir)):
            print(f"[benchmark] {run.task}/{run.agent}: finished run restored from {cfg.results_dir}", flush=True)
    check_records(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "benchmark_config.yaml").write_text(OmegaConf.to_yaml(cfg))
    missing = [r for r in runs if state_of(r) != "done"]
    if cfg.report_only and not any((r.run_dir / f).exists() for r in runs for f in ("metrics.csv", "summary.json")):
        hours = cfg.suite.get("cpu_hours")
        took = f" (the whole suite: about {hours} h on a 2-core CPU)" if hours and not s["quick"] else ""
        print(f"[benchmark] nothing has run yet in {out_dir}: nothing to report. Train it with "
              f"`{cmd.replace(' report_only=true', '')}`{took}.", flush=True)
        return {"out_dir": out_dir, "rows": [], "trained": [], "failed": []}
    todo = [] if cfg.report_only else missing
    print(f"[benchmark] {cfg.suite.name}: {len(runs)} runs ({len(runs) - len(missing)} already done"
          f"{', report only: none trained' if cfg.report_only else ''}), "
          f"{s['steps']:,} env steps x {s['seeds']} seed(s) each, into {out_dir}", flush=True)
    env = dict(os.environ)
    if int(cfg.jobs) > 1:
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # runs share the device's memory
    if int(cfg.jobs) > 1:
        try:
            with ThreadPoolExecutor(max_workers=int(cfg.jobs)) as pool:
                results = list(pool.map(lambda r: train(r, env), todo))
        except KeyboardInterrupt:  # only this thread sees it: hand it on to every run in progress
            for proc in list(_LIVE):
                proc.send_signal(signal.SIGINT)
            raise Interrupted("stopped: the runs in progress checkpointed; run the same command again to resume "
                              "the suite") from None
    else:
        results = [train(r, env) for r in todo]
    outcomes = dict(zip([f"{r.task}/{r.agent}" for r in todo], results))
    failed = [k for k, o in outcomes.items() if o["status"] == "failed"]
    rows = [result_row(r, "failed" if f"{r.task}/{r.agent}" in failed else None) for r in runs]
    write_csv(rows, out_dir / "results.csv")
    write_markdown(cfg, s, runs, rows, out_dir / "results.md", cmd)
    write_figure(runs, out_dir / "learning_curves.png", str(cfg.spread),
                 f"{cfg.suite.name}: {s['steps']:,} env steps, {s['seeds']} seed(s); mean and band ({cfg.spread}) "
                 "over seeds")
    print(f"[benchmark] wrote {out_dir / 'results.csv'}, {out_dir / 'results.md'}, "
          f"{out_dir / 'learning_curves.png'}", flush=True)
    if cfg.get("results_dir"):
        published = publish(cfg, s, runs, cmd, Path(cfg.results_dir))
        print(f"[benchmark] published the runs' metrics, summaries and configs with the tables in {published}",
              flush=True)
    return {"out_dir": out_dir, "rows": rows, "trained": list(outcomes), "failed": failed}


@hydra.main(version_base="1.3", config_path="../configs", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    cmd = "python -m scripts.benchmark " + " ".join(HydraConfig.get().overrides.task)
    # Ctrl-C and SIGTERM stop the suite (KeyboardInterrupt), also where the driver was started with SIGINT
    # ignored (a background job of a script, a pytest-xdist worker: ignored signals are inherited).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = run_benchmark(cfg, cmd.strip())
    except BenchmarkError as e:
        sys.exit(f"benchmark: {e}")
    except Interrupted as e:
        print(f"[benchmark] {e}", file=sys.stderr)
        sys.exit(130)
    if result["failed"]:
        sys.exit(f"benchmark: {len(result['failed'])} run(s) failed: {', '.join(result['failed'])}")


if __name__ == "__main__":
    main()
