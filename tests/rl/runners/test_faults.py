"""Faults lose at most the work since the last checkpoint: non-finite values (stop / skip), SIGTERM mid-run
(checkpoint, resume command, exit 128 + 15; the resumed Anakin run equals the uninterrupted one bit for
bit; Sebulba continues and finishes), a process killed while writing a checkpoint, and the 2-seed R2D2
initialisation that used to deadlock (under a watchdog)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.experiment import build, run
from agents.setup import compose
from rl.infra import checkpoint
from rl.runners import totals as totals_lib
from rl.runners.guard import NOT_SEEN, NonFiniteError, all_finite
from tests.conftest import TINY_DQN

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}


def _leaves(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def _restore(run_dir, cfg):
    return checkpoint.restore(run_dir, build(cfg).restore_target())[0]


# --- non-finite values -------------------------------------------------------------------------------
NAN_RUN = [*TINY_DQN, "total_steps=1600", "log_interval=400", "checkpoint.interval=400",
           "agent.learning_starts=500", "agent.optim.lr=inf"]  # the first update makes the params inf


def test_all_finite_finds_one_bad_element_in_any_leaf_and_no_false_alarm():
    """The guard's parameter check (one fused sum of `x * 0`), jitted: a single NaN, +Inf or -Inf anywhere in any
    float leaf (bf16 included) is found; huge finite values whose plain sum overflows are not an alarm; int
    leaves are ignored."""
    check = jax.jit(all_finite)
    tree = {"w": jnp.ones((120, 84)), "b": jnp.zeros(84, jnp.bfloat16), "n": jnp.arange(5), "s": jnp.float32(2.0)}
    assert bool(check(tree))
    for leaf, index in (("w", (119, 83)), ("b", (3,)), ("s", ())):
        for bad in (jnp.nan, jnp.inf, -jnp.inf):
            broken = {**tree, leaf: tree[leaf].at[index].set(bad)}
            assert not bool(check(broken)), (leaf, bad)
    assert bool(check({"w": jnp.full((1000,), 3e38), "v": jnp.full((7,), -3e38)}))
    assert bool(check({"n": jnp.arange(3)}))


def test_nonfinite_flags_are_kept_per_seed_and_the_earliest_is_reported():
    """A step's flags are folded in per seed (no reduction over the seeds, which are split over devices on a
    mesh); the host reports each name's earliest step over the seeds; a checkpoint's interval sums written
    when the flags were one per name restore to every seed."""
    t = totals_lib.Totals.zeros(3, ("loss",), ("loss", "params"))
    t = t.add_update({"loss": jnp.ones(3)}, {"loss": jnp.array([False, True, False]), "params": False}, True, 40)
    t = t.add_update({"loss": jnp.ones(3)}, {"loss": jnp.array([True, True, False]), "params": False},
                     jnp.array([True, True, False]), 80)
    t = t.add_update({"loss": jnp.ones(3)}, {"loss": jnp.array([False, False, True]), "params": False},
                     jnp.array([True, True, False]), 120)  # seed 2 took no step: its flag does not count
    t = t.flag("params", jnp.array([False, False, True]), 160)
    np.testing.assert_array_equal(t.first_bad, [[80, NOT_SEEN], [40, NOT_SEEN], [NOT_SEEN, 160]])
    assert totals_lib.summarise(t)["nonfinite"] == {"loss": 40, "params": 160}
    again = totals_lib.from_json(totals_lib.to_json(t))
    np.testing.assert_array_equal(again.first_bad, t.first_bad)
    old = {**totals_lib.to_json(t), "nonfinite": {"loss": 40, "params": NOT_SEEN}}
    np.testing.assert_array_equal(totals_lib.from_json(old).first_bad, [[40, NOT_SEEN]] * 3)


def test_nonfinite_stops_naming_metric_and_step_keeping_last_finite_checkpoint(tmp_path):
    cfg = compose(NAN_RUN)
    with pytest.raises(NonFiniteError, match=r"agent's parameters became non-finite .* at env step 500"):
        run(cfg, tmp_path)
    assert checkpoint.latest_step(tmp_path) == 400  # the chunk that went non-finite was not saved
    state = _restore(tmp_path, cfg)
    assert all(np.isfinite(x).all() for x in _leaves(state[0].agent.params))


def test_nonfinite_state_beyond_the_parameters_stops_before_any_checkpoint(tmp_path, monkeypatch):
    """Every update leaves the online parameters finite but makes the target network Inf (as an overflowing
    optimiser moment would): `stop` mode's once-per-call check of the whole agent state stops the run at the
    end of the compiled call holding the first update (the first update is at env step 500, its log interval
    ends at 800), and the last checkpoint (400) is finite."""
    from agents.dqn import DQN

    train_step = DQN.train_step

    def poisoned(self, state, buffer_state, key, hparams=None):
        state, buffer_state, metrics = train_step(self, state, buffer_state, key, hparams)
        inf = jax.tree_util.tree_map(lambda x: jnp.full_like(x, jnp.inf), state.target_params)
        return state.replace(target_params=inf), buffer_state, metrics

    monkeypatch.setattr(DQN, "train_step", poisoned)
    cfg = compose([*NAN_RUN[:-1], "agent.target_update_period=1000"])  # a finite lr: the metrics stay finite
    with pytest.raises(NonFiniteError, match=r"agent's parameters became non-finite \(NaN/Inf\) at env step (\d+)") as e:
        run(cfg, tmp_path)
    step = int(e.value.args[0].split("at env step ")[1].split(".")[0].split(" ")[0])
    assert 500 <= step <= 800, e.value
    assert checkpoint.latest_step(tmp_path) == 400
    assert all(np.isfinite(x).all() for x in _leaves(_restore(tmp_path, cfg)))
    # The Sebulba learner checks the whole state once per update call as well.
    sebulba = compose(["agent=dqn", "env=envpool/cartpole", "logger=none", "num_envs=8", "env.envs_per_recv=4",
                       "env.recvs_per_chunk=8", "total_steps=2048", "log_interval=1024", "eval_episodes=1",
                       "agent.learning_starts=256", "agent.buffer_size=1024", "agent.batch_size=16",
                       "agent.target_update_period=1000", "checkpoint.enabled=false"])
    with pytest.raises(NonFiniteError, match=r"agent's parameters became non-finite"):
        run(sebulba, tmp_path / "sebulba")


def test_nonfinite_skip_drops_the_updates(tmp_path):
    res = run(compose([*NAN_RUN, "on_nonfinite=skip"]), tmp_path)
    assert res["env_steps"] == 1600
    params = _leaves(res["state"][0].agent.params)
    assert all(np.isfinite(x).all() for x in params)
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    skipped = [float(r.split(",")[header.index("train/skipped")]) for r in rows[2:]]
    assert skipped and all(s == 1.0 for s in skipped)  # every update was non-finite and dropped


# --- preemption ----------------------------------------------------------------------------------------
def _train_cmd(run_dir, *overrides):
    return [sys.executable, "-m", "scripts.train", *overrides, f"hydra.run.dir={run_dir}"]


def _sigterm_when_logged(cmd, metrics: Path, rows: int, timeout: float = 240):
    """Start `cmd`, send SIGTERM once `metrics` has `rows` data rows; returns (returncode, output)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) > rows:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("training did not stop within the watchdog timeout after SIGTERM")
    return proc.returncode, out


def test_sigterm_checkpoints_and_resume_is_bit_exact(tmp_path):
    overrides = [*TINY_DQN, "total_steps=40000", "log_interval=400", "eval_episodes=2"]
    stopped = tmp_path / "stopped"
    code, out = _sigterm_when_logged(_train_cmd(stopped, *overrides), stopped / "metrics.csv", rows=2)
    assert code == 128 + signal.SIGTERM, out
    assert f"Resume with: python -m scripts.train resume={stopped.absolute()}" in out
    step = checkpoint.latest_step(stopped)
    assert step is not None and 0 < step < 40000
    # `resume=<dir>` alone: the saved config is used (TINY_DQN is not repeated).
    done = subprocess.run(_train_cmd(tmp_path / "hydra", f"resume={stopped}"), check=False, cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert checkpoint.latest_step(stopped) == 40000
    cfg = compose(overrides)
    straight = run(cfg, tmp_path / "straight")
    for x, y in zip(_leaves(straight["state"]), _leaves(_restore(stopped, cfg))):
        np.testing.assert_array_equal(x, y)
    # One learning curve: the rows of the straight run, in order, once each.
    assert (tmp_path / "straight" / "metrics.csv").read_text() == (stopped / "metrics.csv").read_text()


def test_signal_inside_a_log_interval_keeps_its_sums_and_resumes_bit_exact(tmp_path, monkeypatch):
    """Sub-chunks of one iteration (4 env steps); SIGTERM after the 40th call, past learning_starts, inside the
    first 2000-step log
    interval: the checkpoint holds that step and the interval's sums, and the resumed run's state and
    metrics.csv equal an unstopped run's."""
    from rl.runners import loop
    from rl.runners.anakin import Anakin
    from rl.runners.loop import Preempted

    monkeypatch.setattr(loop, "SUBCHUNK_S", 1e-9)  # every call: one iteration
    overrides = [*TINY_DQN, "total_steps=4000", "log_interval=2000", "checkpoint.interval=2000"]
    calls, advance = [], Anakin.advance

    def signalling(self, *args):
        out = advance(self, *args)
        calls.append(out[1])
        if len(calls) == 40:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(Anakin, "advance", signalling)
    stopped = tmp_path / "stopped"
    with pytest.raises(Preempted):
        run(compose(overrides), stopped)
    step = checkpoint.latest_step(stopped)
    assert step == calls[39] == 160  # stopped after the call in progress, inside the interval
    partial = checkpoint.read_meta(stopped)["partial_interval"]
    assert partial["start"] == 0 and sum(partial["totals"]["updates"]) > 0
    assert not (stopped / "metrics.csv").exists()  # nothing logged for the unfinished interval
    monkeypatch.setattr(Anakin, "advance", advance)
    resumed = run(compose(overrides), stopped)  # a run dir with a checkpoint and no summary: resumed
    straight = run(compose(overrides), tmp_path / "straight")
    for x, y in zip(_leaves(straight["state"]), _leaves(resumed["state"])):
        np.testing.assert_array_equal(x, y)
    assert (tmp_path / "straight" / "metrics.csv").read_text() == (stopped / "metrics.csv").read_text()


def test_signal_while_processes_agree_is_not_lost(tmp_path, monkeypatch):
    """A SIGTERM that lands while the host loop waits in `distributed.agree` (where a process of a multi-process
    run spends its time waiting for the others) stops the run after the next call: the agreement's answer,
    computed before the signal came, must not overwrite it."""
    from rl.infra import distributed
    from rl.runners import loop
    from rl.runners.loop import Preempted

    monkeypatch.setattr(loop, "SUBCHUNK_S", 1e-9)  # every call: one iteration
    calls, agree = [], distributed.agree

    def signalled_while_waiting(until, signum, save=False):
        out = agree(until, signum, save)
        calls.append(out[0])
        if len(calls) == 30:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside the agreement
        return out

    monkeypatch.setattr(distributed, "agree", signalled_while_waiting)
    with pytest.raises(Preempted):
        run(compose([*TINY_DQN, "total_steps=4000", "log_interval=2000"]), tmp_path / "run")
    # The 30th agreement's call (4 env steps each) runs, the 31st agreement stops every process.
    assert checkpoint.latest_step(tmp_path / "run") == 30 * 4 == calls[30] - 1


def test_ctrl_c_is_answered_within_seconds_whatever_the_log_interval(tmp_path):
    """One log interval of 50M env steps (minutes of work): Ctrl-C stops the run after the sub-chunk in
    progress, well within a minute, with a checkpoint inside the interval."""
    run_dir = tmp_path / "run"
    cmd = _train_cmd(run_dir, *TINY_DQN, "total_steps=50000000", "log_interval=50000000")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0 = time.monotonic()
    while "first call" not in ((run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""):
        if proc.poll() is not None or time.monotonic() - t0 > 240:
            proc.kill()
            pytest.fail("the run did not start training: " + proc.communicate()[0][-2000:])
        time.sleep(0.1)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("Ctrl-C not answered within 120 s")
    waited = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGINT, out
    assert waited < 60, f"Ctrl-C answered after {waited:.0f} s"
    step = checkpoint.latest_step(run_dir)
    assert step is not None and 0 < step < 50000000, out


def test_sigterm_sebulba_continues_and_finishes(tmp_path):
    overrides = ["agent=dqn", "env=envpool/cartpole", "logger=none", "num_envs=8", "env.envs_per_recv=4",
                 "env.recvs_per_chunk=8", "total_steps=200000", "log_interval=1024", "agent.learning_starts=512",
                 "agent.buffer_size=4096", "agent.batch_size=16", "eval_episodes=1"]
    stopped = tmp_path / "run"
    code, out = _sigterm_when_logged(_train_cmd(stopped, *overrides), stopped / "metrics.csv", rows=2)
    assert code == 128 + signal.SIGTERM, out
    step = checkpoint.latest_step(stopped)
    assert step is not None and step < 200000
    done = subprocess.run(_train_cmd(tmp_path / "hydra", f"resume={stopped}", "total_steps=" + str(step + 2048)),
                          check=False, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert checkpoint.latest_step(stopped) == step + 2048 and (stopped / "summary.json").exists()


# --- checkpoint writes -----------------------------------------------------------------------------------
KILL_DURING_SAVE = """
import os, sys
import jax.numpy as jnp
from orbax.checkpoint._src.path import atomicity
from rl.infra import checkpoint
d = sys.argv[1]
checkpoint.save(d, 1, {"w": jnp.ones(10)}, {"env_steps": 1})
async def die(self, *args, **kwargs):  # the data of step 2 is on disk, not yet committed
    print(sorted(os.listdir(d)), flush=True)
    os._exit(3)
atomicity.AtomicRenameTemporaryPath.finalize = die
atomicity.CommitFileTemporaryPath.finalize = die
checkpoint.save(d, 2, {"w": jnp.full((10,), 2.0)}, {"env_steps": 2})
"""


def test_checkpoint_killed_while_saving_leaves_previous_restorable(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILL_DURING_SAVE, str(tmp_path)], check=False, cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "'2." in proc.stdout  # killed with step 2 half-written
    target = {"w": jax.ShapeDtypeStruct((10,), np.float32)}
    assert checkpoint.latest_step(tmp_path) == 1
    state, meta = checkpoint.restore(tmp_path, target)
    np.testing.assert_array_equal(state["w"], np.ones(10))
    assert meta["env_steps"] == 1
    checkpoint.save(tmp_path, 2, {"w": np.full(10, 2.0, np.float32)}, {"env_steps": 2})  # the next save works
    assert checkpoint.latest_step(tmp_path) == 2


# --- initialisation of several seeds (used to deadlock) ----------------------------------------------------
INIT = """
import sys
from agents.setup import compose
from agents.experiment import build
runner = build(compose(sys.argv[1:]))
state, it = runner.init()
print("initialised", int(it))
"""


# The fast tier initialises both presets with 2 seeds too, under its watchdog: the smoke matrix's gymnax:2 cases.
@pytest.mark.slow
@pytest.mark.parametrize("agent", ["r2d2_paper", "muesli_paper"])
def test_two_seed_init_finishes(agent):
    """R2D2's LSTM with 2 vmapped seeds deadlocked on 2 cores (batched LAPACK QRs in flight together);
    run in a subprocess with a watchdog so a hang fails with the case named."""
    args = [f"agent={agent}", "env=cartpole", "seeds=2", "logger=none"]
    try:
        proc = subprocess.run([sys.executable, "-c", INIT, *args], check=False, cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{agent} with seeds=2 did not initialise within 240 s (hang)")
    assert proc.returncode == 0 and "initialised 0" in proc.stdout, proc.stderr


def test_the_error_names_the_earliest_non_finite_value_and_prefers_the_loss_on_a_tie():
    """`guard.check`: the earliest step wins; at the same step the loss is named first, the others after."""
    from rl.runners import guard

    guard.check({"loss": NOT_SEEN, "params": NOT_SEEN})  # nothing seen: no error
    with pytest.raises(NonFiniteError, match=r"^the agent's parameters became non-finite \(NaN/Inf\) at env step 40 "
                                             r"\(also: loss\)\."):
        guard.check({"loss": 80, "params": 40})
    with pytest.raises(NonFiniteError, match=r"^train metric `loss` became non-finite \(NaN/Inf\) at env step 40 "
                                             r"\(also: params, q\)\."):
        guard.check({"params": 40, "q": 40, "loss": 40})
