"""scripts/bench_soak.py: a few seconds of a tiny run print one JSON line of RSS and seconds per log interval,
first and last, and their growth ratios; the ratios are last over first of the intervals after the first."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bench_soak

ROOT = Path(__file__).resolve().parents[2]


def test_summary_compares_the_last_intervals_with_the_first_after_compiling():
    records = [(30.0, 500.0), (2.0, 100.0), (2.0, 100.0), (4.0, 100.0), (3.0, 110.0), (3.0, 120.0), (5.0, 130.0)]
    out = bench_soak.summary(records, 1.0, [], 100, 700)
    assert (out["s_per_interval_first"], out["s_per_interval_last"], out["time_growth"]) == (2.0, 3.0, 1.5)
    assert (out["rss_mb_first"], out["rss_mb_last"], out["rss_growth"]) == (100.0, 120.0, 1.2)
    assert out["intervals"] == 7 and out["env_steps"] == 700
    with pytest.raises(SystemExit, match="no log interval finished"):
        bench_soak.summary([], 1.0, [], 100, 0)


def test_the_ends_are_medians_over_a_tenth_of_the_intervals():
    """61 intervals: the 1st dropped, then windows of 6; a slow interval or two inside a window (the machine
    busy for a moment) move neither median (those of three intervals at each end would read 9 and 9)."""
    seconds = [30.0] + [9.0, 9.0, 1.0, 1.0, 1.0, 1.0] + [5.0] * 48 + [2.0, 2.0, 2.0, 2.0, 9.0, 9.0]
    out = bench_soak.summary([(t, 100.0) for t in seconds], 1.0, [], 100, 6100)
    assert (out["s_per_interval_first"], out["s_per_interval_last"]) == (1.0, 2.0)


def test_a_short_soak_prints_one_json_line(tmp_path):
    """1.2 s of soak, shorter than the first interval's compile: the clock starts when that interval ends, so
    a busy machine still gets intervals after it."""
    args = ["--minutes", "0.02", "--series", str(tmp_path / "soak.csv"), "num_envs=4", "log_interval=400",
            "agent.learning_starts=100", "agent.batch_size=16", "agent.buffer_size=400", "agent.network.hidden_sizes=[16]"]
    proc = subprocess.run([sys.executable, "-m", "scripts.bench_soak", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["intervals"] >= 2 and out["env_steps"] >= 400 * out["intervals"]
    assert out["rss_mb_first"] > 10 and 0.5 < out["rss_growth"] < 2
    assert out["s_per_interval_first"] > 0 and out["time_growth"] > 0
    with open(tmp_path / "soak.csv") as f:  # one row per interval, as recorded
        rows = list(csv.DictReader(f))
    assert [int(r["interval"]) for r in rows] == list(range(1, out["intervals"] + 1))
    assert float(rows[-1]["rss_mb"]) > 10 and all(float(r["seconds"]) > 0 for r in rows)
