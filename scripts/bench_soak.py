"""Soak: does a long run's host memory or time per log interval grow?

    python -m scripts.bench_soak --minutes 60 [--series soak.csv] [hydra overrides, default the DQN CartPole run]

Trains through the whole host loop (rl/runners/loop.py: sub-chunks, logging, metrics.csv, periodic
checkpoints) into a temporary run dir for `--minutes` of wall time after the first log interval (which
compiles; a busy machine's compile time does not shorten the soak), then stops it the way a preemption
does (SIGTERM to itself: the sub-chunk in progress ends, a checkpoint is written). At every log (every
`log_interval` env steps, default 10,000 here) it records the process's resident memory (RSS, from
/proc/self/statm) and the seconds since the previous log (`--series`: one CSV row `interval, seconds, rss_mb`
per log, written as it goes). Prints one JSON line:

    {"minutes", "overrides", "log_interval", "intervals", "env_steps",
     "rss_mb_first", "rss_mb_last", "rss_growth", "s_per_interval_first", "s_per_interval_last",
     "time_growth"}

"first" is the median over the first tenth of the intervals after the 1st (which compiles), "last" over the
last tenth, each window at least 3 intervals (a load change on the machine moves a median of hundreds of
intervals less than one of three); `*_growth` = last / first (about 1.0: nothing grows). With fewer than 4
intervals first and last are the medians over the intervals there are, past the first when there are two or
more.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time

DEFAULTS = ["agent=dqn", "env=cartpole", "logger=none", "log_interval=10000", "total_steps=1000000000",
            "eval_episodes=0", "eval_interval=0"]


def rss_mb() -> float:
    """Resident memory of this process in MB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _ends(values: list[float]) -> tuple[float, float]:
    """(median of the first tenth, median of the last tenth) of `values` after the first (dropped when there
    are more), each window at least 3 values."""
    rest = values[1:] if len(values) > 1 else values
    n = max(3, len(rest) // 10)
    return statistics.median(rest[:n]), statistics.median(rest[-n:])


def summary(records: list[tuple[float, float]], minutes: float, overrides: list[str], log_interval: int,
            env_steps: int) -> dict:
    """The JSON line's fields from `records`, one `(seconds since the previous log, RSS MB)` per log."""
    if not records:
        raise SystemExit(f"bench_soak: no log interval finished in {minutes} min; lower log_interval")
    seconds, rss = [r[0] for r in records], [r[1] for r in records]
    (s_first, s_last), (m_first, m_last) = _ends(seconds), _ends(rss)
    return {"minutes": minutes, "overrides": overrides, "log_interval": log_interval, "intervals": len(records),
            "env_steps": env_steps, "rss_mb_first": round(m_first, 1), "rss_mb_last": round(m_last, 1),
            "rss_growth": round(m_last / m_first, 4), "s_per_interval_first": round(s_first, 3),
            "s_per_interval_last": round(s_last, 3), "time_growth": round(s_last / s_first, 4)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--series", help="CSV file for one row per log: interval, seconds, rss_mb")
    args, overrides = parser.parse_known_args(argv)
    overrides = [*DEFAULTS, *overrides]

    from agents.experiment import run
    from agents.setup import compose
    from rl.infra.logging import RunLogger
    from rl.runners.loop import Preempted

    cfg = compose(overrides)
    records, last = [], [time.perf_counter()]
    log = RunLogger.log

    series = open(args.series, "w", buffering=1) if args.series else None  # noqa: SIM115 (closed below)
    if series:
        series.write("interval,seconds,rss_mb\n")

    def timed_log(self, env_steps, metrics):
        now = time.perf_counter()
        records.append((now - last[0], rss_mb()))
        last[0] = now
        if series:
            series.write(f"{len(records)},{records[-1][0]:.4f},{records[-1][1]:.2f}\n")
        if len(records) == 1:
            timer.start()
        return log(self, env_steps, metrics)

    RunLogger.log = timed_log
    timer = threading.Timer(args.minutes * 60, os.kill, (os.getpid(), signal.SIGTERM))
    env_steps = 0
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            try:
                env_steps = run(cfg, run_dir)["env_steps"]
            except Preempted as stopped:
                env_steps = int(stopped.checkpoint.name) if stopped.checkpoint else 0
    finally:
        timer.cancel()
        RunLogger.log = log
        if series:
            series.close()
    out = summary(records, args.minutes, overrides, int(cfg.log_interval), env_steps)
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
