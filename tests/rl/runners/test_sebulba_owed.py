"""Sebulba trains a chunk whose train steps are slow in several calls (so a signal is answered between them)
and keeps the replay ratio: the train steps still owed are carried across calls, into the checkpoint and
through a resume. Slow steps are stood in for by a tiny `SUBCHUNK_S` (every call: one train step)."""

from __future__ import annotations

import itertools
import os
import signal

import jax
import numpy as np
import pytest

from agents.experiment import build, run
from agents.setup import compose
from rl.infra import checkpoint
from rl.runners import loop
from rl.runners.loop import Preempted
from rl.runners.sebulba import _Session

# 8 envs, 4 per recv, 8 recvs per chunk: 32 env steps per chunk, one train step per 8: 4 owed per chunk.
OVERRIDES = ["agent=dqn", "env=envpool/cartpole", "logger=none", "num_envs=8", "env.envs_per_recv=4",
             "env.recvs_per_chunk=8", "total_steps=1024", "log_interval=512", "checkpoint.interval=512",
             "agent.learning_starts=256", "agent.buffer_size=1024", "agent.batch_size=16", "eval_episodes=0"]


@pytest.fixture
def calls(monkeypatch):
    """Every `advance` call's returned (env steps, owed); `SUBCHUNK_S` tiny: one train step per call."""
    monkeypatch.setattr(loop, "SUBCHUNK_S", 1e-9)
    seen, advance = [], _Session.advance

    def recording(self, *args):
        out = advance(self, *args)
        seen.append((out[1], int(out[0].owed)))
        if getattr(self, "on_call", None):
            self.on_call(seen)
        return out

    monkeypatch.setattr(_Session, "advance", recording)
    return seen


def test_slow_train_steps_are_split_across_calls_keeping_the_replay_ratio(tmp_path, calls):
    res = run(compose(OVERRIDES), tmp_path / "run")
    learner = build(compose(OVERRIDES)).learner
    assert res["env_steps"] == 1024
    assert int(res["state"].agent.updates) == learner.updates_due(1024) == 97
    # Acting-only chunks are one call each; from learning_starts on, each chunk takes 4 calls (one train step
    # each) and its env steps are counted with the last one.
    owed = [o for _, o in calls]
    assert owed.count(3) == owed.count(2) == owed.count(1) > 20
    assert all(s % 32 == 0 for s, _ in calls)
    # While train steps are owed the chunk is not counted; the call that pays the last one counts it.
    assert all(s1 == s0 + 32 * (o0 == 1) for (s0, o0), (s1, _) in itertools.pairwise(calls) if o0)
    assert int(res["state"].owed) == 0


def test_signal_while_train_steps_are_owed_checkpoints_them_and_resume_pays_them(tmp_path, calls, monkeypatch):
    def stop_once_owed(seen):
        steps, owed = seen[-1]
        if steps >= 640 and owed == 2 and not stop_once_owed.sent:
            stop_once_owed.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    stop_once_owed.sent = False
    monkeypatch.setattr(_Session, "on_call", staticmethod(stop_once_owed), raising=False)
    run_dir = tmp_path / "run"
    with pytest.raises(Preempted):
        run(compose(OVERRIDES), run_dir)
    step = checkpoint.latest_step(run_dir)
    saved = checkpoint.restore(run_dir, build(compose(OVERRIDES)).restore_target())[0]
    learner = build(compose(OVERRIDES)).learner
    # The checkpoint's env steps exclude the chunk whose train steps are owed; its buffer holds that chunk.
    assert step == calls[-1][0] and int(saved.owed) == 2
    assert int(saved.agent.updates) == learner.updates_due(step) + 2
    monkeypatch.setattr(_Session, "on_call", None, raising=False)
    res = run(compose(OVERRIDES), run_dir)  # resumed
    assert res["env_steps"] == 1024 and int(res["state"].agent.updates) == learner.updates_due(1024)


@pytest.mark.parametrize("agent", ["dqn", pytest.param("r2d2", marks=pytest.mark.slow),
                                   pytest.param("muesli", marks=pytest.mark.slow)])
def test_a_train_only_call_writes_and_counts_nothing(agent):
    """`write=False` (the calls that pay owed train steps reuse the last chunk for its shapes): every agent's
    buffer is left bit for bit and no episode is counted. The learner skips the write for every agent alike;
    the sequence agents (~2 and ~4 minutes of compiling on a cold cache) run in the slow tier."""
    cfg = compose([*OVERRIDES[2:], f"agent={agent}", "env=envpool/cartpole", "agent.learning_starts=64"])
    runner = build(cfg)
    learner, state = runner.learner, runner.init()
    with runner.session(state, 0) as session:
        chunks = [session.actors.get()]
        while not bool(chunks[-1].episodes.ended.any()) or len(chunks) < 3:  # one that ends episodes
            chunks.append(session.actors.get())
    agent_state, buffer, key = state.agent, state.buffer, state.key
    totals = learner.zero_totals(agent_state, buffer)
    for c in chunks[:-1]:
        agent_state, buffer, key, totals = learner.update(agent_state, buffer, key, totals, c, np.bool_(True),
                                                          np.int32(0), np.int32(0))
    before = [np.asarray(x).copy() for x in jax.tree_util.tree_leaves(buffer)]
    episodes = float(totals.episodes[0])
    agent_state, buffer, key, totals = learner.update(agent_state, buffer, key, totals, chunks[-1], np.bool_(False),
                                                      np.int32(0), np.int32(0))
    for x, y in zip(before, jax.tree_util.tree_leaves(buffer)):
        np.testing.assert_array_equal(x, np.asarray(y))
    assert float(totals.episodes[0]) == episodes
