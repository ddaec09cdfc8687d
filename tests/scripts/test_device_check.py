"""scripts/device_check.py: the accelerator plan fits the 8-minute budget and runs what issue 45 lists; without a
GPU it refuses in one line unless dry; a dry run of its cheapest step writes the report with that step's JSON."""

from __future__ import annotations

import json

import pytest

from scripts import device_check


def test_the_gpu_plan_runs_the_listed_benchmarks_within_the_budget():
    steps = {s.name: s for s in device_check.plan(dry=False)}
    assert list(steps) == ["bench_train", "bench_update", "buffers", "atari_dqn"]
    assert sum(s.limit_s for s in steps.values()) <= device_check.BUDGET_S <= 8 * 60
    train = steps["bench_train"].argv
    assert train[train.index("--seeds") + 1] == "1,16,256"
    update = steps["bench_update"].argv
    assert update[update.index("--cases") + 1] == "dqn,r2d2,muesli" and "breakout-minatar" in update
    assert "--quick" in steps["buffers"].argv
    atari = steps["atari_dqn"]
    assert atari.argv[0] == "scripts.train" and "env=envpool/pong" in atari.argv and atari.interrupt_s == 120
    assert [s.name for s in device_check.plan(dry=True)] == list(steps)


def test_refuses_without_a_gpu_unless_dry(capsys):
    with pytest.raises(SystemExit) as err:
        device_check.main([])
    assert err.value.code == 2
    msg = capsys.readouterr().err.strip()
    assert len(msg.splitlines()) == 1 and "no GPU here" in msg and "--dry" in msg


def test_dry_run_of_bench_train_writes_its_json_to_the_report(tmp_path):
    path = device_check.main(["--dry", "--only", "bench_train", "--out", str(tmp_path)])
    text = path.read_text()
    assert path.parent == tmp_path and "dry run" in text and "## bench_train" in text and "exit status 0" in text
    records = [json.loads(ln) for ln in text.splitlines() if ln.startswith('{"agent"')]
    assert [r["seeds"] for r in records] == [1, 2] and all(r["kernels"] > 0 for r in records)


def test_a_step_is_interrupted_as_planned_and_its_log_reaches_the_report(tmp_path, request):
    """A step past its `interrupt_s` gets SIGINT (a run's clean stop) and is reported as such, also when this
    process ignores SIGINT (a background job, an xdist worker: the step must not inherit that); the last lines of
    the log file it names (a run's train.log: its SPS) go into the report."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    log = tmp_path / "train.log"
    log.write_text("env step 1,000 per seed: 5,000 SPS (all seeds), ret=9.5\n")
    step = device_check.Step("sleeper", ("timeit", "-n", "1000000000", "pass"), limit_s=20, interrupt_s=1,
                             log=str(log))
    record = device_check.run_step(step, dry=True, log=lambda m: None)
    assert record["status"] == "interrupted at 1 s (planned)" and record["wall_s"] < 15
    text = device_check.report([record], "# header\n")
    assert "5,000 SPS" in text and "interrupted at 1 s (planned)" in text
