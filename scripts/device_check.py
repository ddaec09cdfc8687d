"""One command for a lent accelerator: the speed benchmarks that matter, within 8 minutes, into one file.

    python -m scripts.device_check            # on a GPU: writes results/gpu/<card>_<date>.md
    python -m scripts.device_check --dry      # anywhere: the same steps at tiny sizes, into a temp dir
    python -m scripts.device_check --only bench_train,buffers   # a subset (names: see PLAN)

Steps, each a `python -m scripts.<bench>` subprocess with its own time limit (a failing or slow step costs
only its own time; the rest still runs), in this order:

1. `bench_train` at 1, 16 and 256 seeds (DQN CartPole, PureJaxRL preset, with the PureJaxRL-style loop and
   the kernel counts of both iterations);
2. `bench_update` for DQN, R2D2 and Muesli on Breakout-MinAtar;
3. `bench_buffers --quick`;
4. a 2-minute envpool Atari (Pong) DQN run of `scripts.train` (Sebulba), stopped by SIGINT at 120 s.

The limits add up to `BUDGET_S` (480 s); a step that would start past the budget is skipped and said so.
Progress is printed as each step starts and ends. The file holds the device, versions and commit, then per
step its command, wall seconds, exit status, its JSON lines (the training run: its train.log's last lines,
with the SPS of each log interval), and on failure its last lines of output. Without
a GPU the command refuses (one line, exit 2) unless `--dry` is given: then every step runs at tiny sizes on
the CPU (minutes, compile-bound) and the file goes to a temp dir.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = 480  # of a 10-minute loan: start-up, the file and a margin left over
ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    argv: tuple  # after `python -m`
    limit_s: int
    interrupt_s: int | None = None  # SIGINT at this many seconds (a run that stops cleanly), else run to the end
    log: str | None = None  # a file the step writes its figures to (a run's train.log): its last lines are kept


def plan(dry: bool, run_dir: str = "outputs/device_check") -> list[Step]:
    """The steps, full size on an accelerator or tiny (`dry`) for a CPU rehearsal; the training run writes into
    `run_dir` (hydra's run dir)."""
    train, log = ("scripts.train", f"hydra.run.dir={run_dir}"), f"{run_dir}/train.log"
    if dry:
        return [
            Step("bench_train", ("scripts.bench_train", "agent=dqn", "env=cartpole", "--seeds", "1,2", "--steps",
                                 "2000", "--repeats", "1", "--learner-steps", "0", "agent.learning_starts=500",
                                 "agent.buffer_size=1000"), 240),
            Step("bench_update", ("scripts.bench_update", "--cases", "dqn,r2d2,muesli", "--env", "breakout-minatar",
                                  "--seeds", "1", "--steps", "2", "--repeats", "1", "agent.learning_starts=200",
                                  "agent.buffer_size=2000"), 600),
            Step("buffers", ("scripts.bench_buffers", "--quick", "--cases", "uniform", "--sizes", "10k"), 240),
            Step("atari_dqn", (*train, "agent=dqn", "env=envpool/cartpole", "total_steps=3000",
                               "agent.learning_starts=500", "num_envs=4", "checkpoint.enabled=false", "logger=none",
                               "eval_episodes=1"), 240, interrupt_s=200, log=log),
        ]
    return [
        Step("bench_train", ("scripts.bench_train", "agent=dqn", "env=cartpole", "--seeds", "1,16,256", "--steps",
                             "300000", "--repeats", "1", "--learner-steps", "200"), 180),
        Step("bench_update", ("scripts.bench_update", "--cases", "dqn,r2d2,muesli", "--env", "breakout-minatar",
                              "--seeds", "1", "--steps", "10", "--repeats", "2"), 105),
        Step("buffers", ("scripts.bench_buffers", "--quick"), 45),
        Step("atari_dqn", (*train, "agent=dqn", "env=envpool/pong", "agent.learning_starts=2000",
                           "num_envs=32", "total_steps=2000000", "checkpoint.enabled=false", "logger=none",
                           "eval_episodes=1"), 150, interrupt_s=120, log=log),
    ]


def device() -> tuple[str, str]:
    """(platform, card) of jax's first device, card as a file-name slug ("h200"; the platform on CPU)."""
    import jax

    d = jax.devices()[0]
    kind = getattr(d, "device_kind", d.platform)
    slug = re.sub(r"[^a-z0-9]+", "_", kind.lower().replace("nvidia", "")).strip("_") or d.platform
    return d.platform, slug


def run_step(step: Step, dry: bool, log=print) -> dict:
    """Run one step as a subprocess (its own process group), under its limit; its JSON lines and output tail."""
    cmd = [sys.executable, "-m", *step.argv]
    env = dict(os.environ)
    if dry:
        env["JAX_PLATFORMS"] = "cpu"
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)  # noqa: PLW1509 (no threads here)
    status = None
    try:
        out, _ = proc.communicate(timeout=step.interrupt_s or step.limit_s)
    except subprocess.TimeoutExpired:
        if step.interrupt_s:  # a clean stop: the run answers SIGINT at its next sub-chunk
            os.killpg(proc.pid, signal.SIGINT)
            status = f"interrupted at {step.interrupt_s} s (planned)"
        try:
            out, _ = proc.communicate(timeout=max(step.limit_s - (step.interrupt_s or step.limit_s), 5))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            status = f"killed at its {step.limit_s} s limit"
    wall = time.perf_counter() - t0
    lines = out.splitlines()
    records = [ln for ln in lines if ln.startswith("{") and ln.endswith("}") and _is_json(ln)]
    log(f"    {step.name}: exit {proc.returncode} in {wall:.0f} s" + (f" ({status})" if status else ""))
    log_tail = Path(step.log).read_text().splitlines()[-20:] if step.log and Path(step.log).exists() else []
    return {"name": step.name, "command": "python -m " + " ".join(step.argv), "wall_s": wall,
            "returncode": proc.returncode, "status": status, "json": records, "tail": lines[-15:], "log": log_tail}


def _default_sigint():
    """In the step's process before it starts: SIGINT back to its default, so that Python turns it into
    KeyboardInterrupt even when this script runs where SIGINT is ignored (a background job, a test worker)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def report(results: list[dict], header: str) -> str:
    """The markdown file: the header, then per step its command, time, status and JSON lines."""
    parts = [header]
    for r in results:
        parts.append(f"\n## {r['name']}: `{r['command']}`\n")
        if r.get("skipped"):
            parts.append(f"Skipped: {r['skipped']}.\n")
            continue
        parts.append(f"{r['wall_s']:.0f} s, exit status {r['returncode']}" + (f", {r['status']}" if r["status"]
                                                                              else "") + ".\n")
        if r["json"]:
            parts.append("```json\n" + "\n".join(r["json"]) + "\n```\n")
        if r.get("log"):
            parts.append("Its log's last lines (speed: SPS per log interval):\n\n```\n" + "\n".join(r["log"])
                         + "\n```\n")
        if r["returncode"] not in (0, None) or not (r["json"] or r.get("log")):
            parts.append("Last lines of output:\n\n```\n" + "\n".join(r["tail"]) + "\n```\n")
    return "\n".join(parts)


def _header(platform: str, card: str, dry: bool) -> str:
    import jax

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"  # no git (a copied tree): "unknown"
    what = "dry run (tiny sizes, CPU)" if dry else f"{jax.devices()[0].device_kind}"
    return (f"# {what}, {datetime.date.today().isoformat()}: `python -m scripts.device_check`\n\n"
            f"jax {jax.__version__} on {platform} ({card}), {os.cpu_count()} CPU cores, commit {commit}. "
            f"Each figure is one run: indicative, not a median.\n")


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry", action="store_true", help="tiny sizes on the CPU, file in a temp dir")
    parser.add_argument("--only", default=None, help="comma-separated step names (default: all)")
    parser.add_argument("--out", default=None, help="output dir (default results/gpu, or a temp dir with --dry)")
    args = parser.parse_args(argv)
    platform, card = device()
    if platform != "gpu" and not args.dry:
        print(f"device_check: no GPU here (jax platform: {platform}); run it on a machine with one, or pass --dry "
              "for a tiny rehearsal on the CPU", file=sys.stderr)
        raise SystemExit(2)
    out_dir = Path(args.out or (tempfile.mkdtemp(prefix="device_check_") if args.dry else ROOT / "results" / "gpu"))
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="device_check_run_"))  # the training run's files: not kept
    run_dir = scratch / "run"
    steps = plan(args.dry, str(run_dir))
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {s.name for s in steps})
        if unknown:
            parser.error(f"unknown steps {unknown}; choose from {[s.name for s in steps]}")
        steps = [s for s in steps if s.name in names]
    path = out_dir / f"{card}_{datetime.date.today().isoformat()}.md"
    path = path if not path.exists() else out_dir / f"{path.stem}_{int(time.time())}.md"
    start, results = time.perf_counter(), []
    for i, step in enumerate(steps, 1):
        spent = time.perf_counter() - start
        if not args.dry and spent + step.limit_s > BUDGET_S:
            print(f"[{i}/{len(steps)}] {step.name}: skipped ({spent:.0f} s spent, its limit {step.limit_s} s "
                  f"would pass the {BUDGET_S} s budget)", flush=True)
            results.append({"name": step.name, "command": "python -m " + " ".join(step.argv),
                            "skipped": f"{spent:.0f} s were spent, its {step.limit_s} s would pass {BUDGET_S} s"})
            continue
        print(f"[{i}/{len(steps)}] {step.name} (limit {step.limit_s} s, {spent:.0f} s spent): "
              f"python -m {' '.join(step.argv)}", flush=True)
        results.append(run_step(step, args.dry, log=lambda m: print(m, flush=True)))
        path.write_text(report(results, _header(platform, card, args.dry)))  # kept if the loan ends mid-way
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {path} ({time.perf_counter() - start:.0f} s)", flush=True)
    return path


if __name__ == "__main__":
    main()
