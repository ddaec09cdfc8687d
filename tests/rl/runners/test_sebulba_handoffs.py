"""Sebulba hand-offs and envpool options, on scripted envs behind envpool's own async interface
(`ScriptedPool`: shuffled, partial recvs; known rewards and episode ends) driven by the real actor threads,
learner and host loop:

* the actors act with the parameters published after the last sync (`env.sync_interval`), chunk by chunk;
* the actor runs at most `env.queue_size` chunks ahead;
* what a log interval reports as mean episode return/length equals a hand computation from the scripted
  envs' own record (means over finished episodes; none: empty), and each env's buffer row and episode
  statistics hold exactly its own steps, whatever order and subset the recvs return (one actor thread,
  and two threads with offset env ids);
* greedy evaluation scores each env's first episode and stops at `env.eval_max_steps` recvs;
* the envpool keys reach envpool (id, batch size, threads, time limit, kwargs, seed, XLA handle), and the
  device keys place actors and learner (forced CPU devices, in a subprocess).

Every session runs under a watchdog (`within`), so a stuck thread fails the test instead of hanging it."""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from agents.experiment import build, validate
from agents.setup import compose
from rl.envs.envpool_source import EnvpoolSource
from rl.infra.logging import RunLogger
from rl.runners import loop, sebulba
from rl.runners.sebulba import Sebulba
from tests.conftest import run_probe
from tests.rl.envs.test_envpool_source import reference
from tests.rl.runners.test_runner_options import ExploringAgent, VersionAgent

ROOT = Path(__file__).resolve().parents[3]

COVERS = {
    "env.envpool.sync_interval": "test_actors_act_with_the_params_published_after_the_last_sync",
    "env.envpool.recvs_per_chunk": ["test_actors_act_with_the_params_published_after_the_last_sync",
                                    "test_envpool_keys_reach_envpool"],
    "env.envpool.queue_size": "test_the_actor_runs_at_most_queue_size_chunks_ahead",
    "env.envpool.eval_max_steps": "test_evaluation_is_greedy_scores_first_episodes_and_stops_at_eval_max_steps",
    "env.envpool.actor_threads": ["test_two_actor_threads_write_their_own_rows", "test_envpool_keys_reach_envpool"],
    "env.envpool.id": "test_envpool_keys_reach_envpool",
    "env.envpool.envs_per_recv": "test_envpool_keys_reach_envpool",
    "env.envpool.num_threads": "test_envpool_keys_reach_envpool",
    "env.envpool.max_episode_steps": "test_envpool_keys_reach_envpool",
    "env.envpool.kwargs": "test_envpool_keys_reach_envpool",
    "env.envpool.xla": "test_xla_key_picks_the_actor_loop",
    "env.envpool.actor_devices": "test_device_keys_place_actors_and_learner",
    "env.envpool.learner_devices": "test_device_keys_place_actors_and_learner",
    "train.seed": "test_envpool_keys_reach_envpool",
    "train.log_interval": "test_logged_episode_means_match_the_scripted_envs",
}


# --------------------------------------------------------------------------- scripted envs, envpool's interface
def _length(e, n):
    return (5, 1, 3, 1, 2, 4)[(e + 2 * n) % 6]


def _reward(e, n, t, action):
    return e + 0.25 * n + 0.125 * t


def _truncated(e, n):
    return (e + n) % 3 == 0


class ScriptedPool:
    """envpool's gymnasium interface (`async_reset`, `recv`, `send`, `close`) over scripted envs, with its
    async semantics: `recv` returns `batch_size` of the envs whose action was sent (at first: all of them),
    chosen and ordered by a seeded RNG; the recv after an episode's end is a reset step (reward 0, no end,
    the next episode's first observation). Env e's n-th episode lasts `length(e, n)` steps (truncated where
    `truncated(e, n)`, else terminated) and its step t pays `reward(e, n, t, action)`; observations are
    `[e, n, t]`. `log` holds every recv with the actions sent back for it."""

    def __init__(self, num_envs, batch_size, seed=0, length=_length, reward=_reward, truncated=_truncated):
        self.num_envs, self.batch_size = num_envs, batch_size
        self.length, self.reward, self.truncated = length, reward, truncated
        self.rng = np.random.default_rng(seed)
        self.spec = SimpleNamespace(config=SimpleNamespace(max_episode_steps=20))
        self.log = []

    def async_reset(self):
        self.n, self.t = np.zeros(self.num_envs, int), np.zeros(self.num_envs, int)
        self.ended = np.zeros(self.num_envs, bool)
        self.result = {e: (0.0, False, False) for e in range(self.num_envs)}  # what the env's next recv says
        self.pending = list(range(self.num_envs))

    def recv(self):
        ids = self.rng.permutation(self.pending)[:self.batch_size].astype(np.int32)
        self.pending = [e for e in self.pending if e not in ids]
        obs = np.array([[e, self.n[e], self.t[e]] for e in ids], np.float32)
        reward, term, trunc = (np.array(x) for x in zip(*(self.result[e] for e in ids)))
        reward, term, trunc = reward.astype(np.float32), term.astype(bool), trunc.astype(bool)
        self.ended[ids] = term | trunc
        self.log.append([SimpleNamespace(env_id=ids, obs=obs, reward=reward, terminated=term, truncated=trunc), None])
        return obs, reward, term, trunc, {"env_id": ids}

    def send(self, actions, env_ids):
        recv = self.log[-1][0]
        assert np.array_equal(env_ids, recv.env_id), "send answers the last recv"
        self.log[-1][1] = np.array(actions)
        for a, e in zip(np.asarray(actions), env_ids):
            if self.ended[e]:  # auto-reset: the next recv is the new episode's reset step
                self.n[e], self.t[e], self.result[e] = self.n[e] + 1, 0, (0.0, False, False)
            else:
                self.t[e] += 1
                end, cut = self.t[e] == self.length(e, self.n[e]), self.truncated(e, self.n[e])
                self.result[e] = (self.reward(e, self.n[e], self.t[e], int(a)), end and not cut, end and cut)
            self.pending.append(int(e))

    def close(self):
        pass


def scripted_source(num_envs, batch_size, **kw) -> EnvpoolSource:
    pool = ScriptedPool(num_envs, batch_size, **kw)
    return EnvpoolSource(env=pool, task_id="scripted", num_envs=num_envs, batch_size=batch_size, obs_shape=(3,),
                         obs_dtype=np.dtype(np.float32), num_actions=10**6, atari=False)


def sebulba_cfg(num_envs, batch_size, recvs_per_chunk, *overrides):
    return compose(["agent=dqn", "env=envpool/cartpole", "logger=none", "logger.plot=false", "env.xla=off",
                    "checkpoint.enabled=false", "eval_episodes=0", f"num_envs={num_envs}",
                    f"env.envs_per_recv={batch_size}", f"env.recvs_per_chunk={recvs_per_chunk}", *overrides])


def within(seconds, fn):
    """`fn()` on a daemon thread; the test fails if it has not returned after `seconds` (a hang)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"no result within {seconds} s: a Sebulba thread hangs")
    if "error" in box:
        raise box["error"]
    return box["value"]


def record_gets(monkeypatch, lockstep=False, timeout=60.0):
    """Make the session's `Actors` record every chunk the learner gets (as NumPy). With `lockstep`, the actor
    also reads its parameters for chunk j only once the learner asks for that chunk (its (j+1)-th get, i.e.
    after its update and publish of chunk j-1): one interleaving the threads may take, the one without
    policy lag beyond `sync_interval`."""
    cond, gets, chunks, released = threading.Condition(), [0], [], [False]

    class Recording(sebulba.Actors):
        def get(self):
            with cond:
                gets[0] += 1
                cond.notify_all()
            chunk = super().get()
            chunks.append(jax.device_get(chunk))
            return chunk

        def finish(self):
            with cond:
                released[0] = True
                cond.notify_all()
            super().finish()

    class Gated(sebulba.Mailbox):
        reads = 0

        def get(self):
            with cond:
                if not cond.wait_for(lambda: released[0] or gets[0] > self.reads, timeout):
                    raise TimeoutError(f"the learner never asked for chunk {self.reads}")
            self.reads += 1
            return super().get()

    monkeypatch.setattr(sebulba, "Actors", Recording)
    if lockstep:
        monkeypatch.setattr(sebulba, "Mailbox", Gated)
    return chunks


# --------------------------------------------------------------------------- hand-off: parameters to the actors
@pytest.mark.parametrize("sync", [1, 3])
def test_actors_act_with_the_params_published_after_the_last_sync(sync, monkeypatch):
    """`VersionAgent` acts with its version, which each update (one per chunk here) bumps. With
    `env.sync_interval=k` the learner publishes after chunks k, 2k, ..., so every action sent in chunk j
    (`env.recvs_per_chunk=2` recvs) is the version after chunk k * floor(j / k): the new parameters show in
    the very next chunk after a sync and not before."""
    E, M, K, chunks = 4, 2, 2, 9
    source = scripted_source(E, M)
    runner = Sebulba(validate(sebulba_cfg(E, M, K, f"env.sync_interval={sync}")), VersionAgent(E, num_actions=10**6), source)
    got = record_gets(monkeypatch, lockstep=True)
    state = runner.init()

    def train():
        with runner.session(state, 0) as session:
            return session.advance(state, 0, chunks * K * M)

    state, env_steps, _ = within(120, train)
    assert env_steps == chunks * K * M and int(state.agent["version"]) == chunks and len(got) == chunks
    sent = [actions for _, actions in source.env.log[:chunks * K]]
    expected = [(i // K) // sync * sync for i in range(chunks * K)]
    assert [set(a.tolist()) for a in sent] == [{v} for v in expected]


@pytest.mark.parametrize("queue_size", [1, 3])
def test_the_actor_runs_at_most_queue_size_chunks_ahead(queue_size):
    """With a learner that takes nothing, the actor fills `env.queue_size` chunks, makes one more and waits
    to put it: exactly (queue_size + 1) chunks of recvs are made."""
    E, M, K = 4, 2, 2
    source = scripted_source(E, M)
    runner = Sebulba(validate(sebulba_cfg(E, M, K, f"env.queue_size={queue_size}")), VersionAgent(E), source)
    state = runner.init()

    def fill():
        t0 = time.perf_counter()
        with runner.session(state, 0) as session:
            actor = session.actors.threads[0]
            assert actor.daemon  # an error in the main thread exits the process; it never waits on a blocked actor
            deadline = time.monotonic() + 60
            while actor.blocked_s < 0.3:
                assert actor.error is None and time.monotonic() < deadline, "the actor never blocked"
                time.sleep(0.02)
            stats = session.actors.stats()
            return actor.chunks.qsize(), actor.index, len(source.env.log), stats, time.perf_counter() - t0

    queued, made, recvs, stats, wall = within(120, fill)
    assert (queued, made, recvs) == (queue_size, queue_size + 1, (queue_size + 1) * K)
    # the actor's seconds: busy making its chunks, blocked on the full queue; together within the wall time
    assert 0 < stats["actor_busy_s"] and 0.3 <= stats["actor_blocked_s"]
    assert stats["actor_busy_s"] + stats["actor_blocked_s"] <= wall


# --------------------------------------------------------------------------- hand-off: logged numbers, env rows
E6, M3, K2, CHUNKS = 6, 3, 2, 16


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory):
    """A Sebulba run through the host loop on 6 scripted envs, 3 per recv, 2 recvs per chunk, a log every
    chunk (`log_interval=6`), 16 chunks; returns the recvs the learner consumed, the chunks, the result
    and metrics.csv."""
    run_dir = tmp_path_factory.mktemp("scripted")
    source = scripted_source(E6, M3, seed=1)
    cfg = sebulba_cfg(E6, M3, K2, f"log_interval={M3 * K2}", f"total_steps={CHUNKS * M3 * K2}")
    cfg = validate(cfg)
    runner = Sebulba(cfg, VersionAgent(E6, num_actions=10**6), source)
    with pytest.MonkeyPatch.context() as mp:
        chunks = record_gets(mp)
        logger = RunLogger(cfg, run_dir)
        try:
            res = within(120, lambda: loop.run(cfg, runner, logger))
        finally:
            logger.close()
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return source.env.log[:CHUNKS * K2], chunks, res, rows


def hand_episodes(log):
    """Per recv of `log`, per entry: (env, score, length) of the episode that ended there, else None; from the
    scripted envs' own record (a reset step is no step of any episode)."""
    running, fresh, out = {}, set(range(E6)), []
    for recv, _ in log:
        row = []
        for j, e in enumerate(recv.env_id.tolist()):
            if e in fresh:  # reset step
                fresh.discard(e)
                running[e] = (0.0, 0)
                row.append(None)
                continue
            score, length = running[e]
            running[e] = (score + float(recv.reward[j]), length + 1)
            if recv.terminated[j] or recv.truncated[j]:
                row.append((e, *running[e]))
                fresh.add(e)
            else:
                row.append(None)
        out.append(row)
    return out


def test_logged_episode_means_match_the_scripted_envs(scripted_run):
    """Each metrics.csv row (one chunk of 2 recvs, `log_interval=6`) reports the episodes that ended in its
    recvs: their number, mean score and mean length (over those episodes, not envs or steps; empty cells
    when none ended), computed here from the scripted envs' own record."""
    log, _, res, rows = scripted_run
    assert [int(r["env_steps"]) for r in rows] == [6 * (i + 1) for i in range(CHUNKS)]
    ended = hand_episodes(log)
    counts = []
    for i, row in enumerate(rows):
        episodes = [x for recv in ended[i * K2:(i + 1) * K2] for x in recv if x is not None]
        counts.append(len(episodes))
        assert float(row["episodes"]) == len(episodes), i
        if not episodes:
            assert row["episode_return"] == row["episode_length"] == "", i
            continue
        assert float(row["episode_return"]) == pytest.approx(np.mean([s for _, s, _ in episodes]), rel=1e-6), i
        assert float(row["episode_length"]) == pytest.approx(np.mean([n for _, _, n in episodes])), i
    assert 0 in counts[1:] and max(counts) >= 2  # the scenario: chunks with none and with several
    assert res["env_steps"] == CHUNKS * 6


def unpacked(rows):
    """`rows.data` (a row buffer's items unpacked, `[E, T, ...]`) as NumPy, unpacked in one program."""
    return jax.device_get(jax.jit(lambda r: r.data)(rows))


def test_env_rows_and_episode_statistics_follow_env_ids(scripted_run):
    """With shuffled, partial recvs (3 of 6 envs, any order), every env's buffer row holds exactly its own
    transitions in order (checked against the scripted record; the version stored is the one that chose the
    action), and every chunk's ended episodes carry their env, score and length."""
    log, chunks, res, _ = scripted_run
    assert len({tuple(recv.env_id) for recv, _ in log}) > len(log) // 2
    ref, _ = reference(log)
    rows = jax.device_get(res["state"].buffer)
    data = unpacked(rows)
    for e in range(E6):
        n = int(rows.written[e])
        assert n == len(ref[e]) > 3, e
        for i, (obs, action, reward, term, trunc, next_obs) in enumerate(ref[e]):
            d = {k: v[e, i] for k, v in data.items()}
            np.testing.assert_array_equal(d["obs"], obs)
            np.testing.assert_array_equal(d["next_obs"], next_obs)
            assert (d["action"], d["reward"], d["terminated"], d["truncated"]) == (action, reward, term, trunc)
            assert d["version"] == d["action"]
    ended = hand_episodes(log)
    assert len(chunks) == CHUNKS
    for c, chunk in enumerate(chunks):
        ep = chunk.episodes
        for k in range(K2):
            got = [(int(ep.env_id[k, j]), float(ep.score[k, j]), int(ep.length[k, j])) if ep.ended[k, j] else None
                   for j in range(M3)]
            assert got == ended[c * K2 + k], (c, k)


def test_two_actor_threads_write_their_own_rows(monkeypatch):
    """`env.actor_threads=2`: two envpool envs of 4 envs (2 per recv), seeded `seed` and `seed + 4`; thread 1's
    env ids are offset by 4, so rows 0-3 hold exactly pool 0's transitions and rows 4-7 pool 1's, and the
    learner takes chunks from both in turn."""
    pools = {}

    def fake_build(env_cfg, num_envs, seed, envs_per_recv=None):
        src = scripted_source(num_envs, envs_per_recv, seed=seed)
        pools[seed] = src.env
        return src

    monkeypatch.setattr(sebulba, "make_source", fake_build)
    runner = Sebulba(validate(sebulba_cfg(8, 4, 2, "env.actor_threads=2", "seed=3")), VersionAgent(8), scripted_source(8, 4))
    assert sorted(pools) == [3, 7]
    state = runner.init()

    def train():
        with runner.session(state, 0) as session:
            return session.advance(state, 0, 8 * 4)  # 8 chunks of 2 recvs x 2 envs: 4 from each thread

    state, _, _ = within(120, train)
    rows = jax.device_get(state.buffer)
    data = unpacked(rows)
    for i, seed in enumerate((3, 7)):
        ref, _ = reference(pools[seed].log[:4 * 2])
        for e in range(4):
            n = int(rows.written[4 * i + e])
            assert n == len(ref.get(e, [])), (i, e)
            for t, (obs, action, reward, _, _, next_obs) in enumerate(ref.get(e, [])):
                np.testing.assert_array_equal(data["obs"][4 * i + e, t], obs)
                np.testing.assert_array_equal(data["next_obs"][4 * i + e, t], next_obs)
                assert data["reward"][4 * i + e, t] == reward
    assert rows.written[:4].sum() > 0 and rows.written[4:].sum() > 0


# --------------------------------------------------------------------------- hand-off: greedy evaluation
def test_evaluation_is_greedy_scores_first_episodes_and_stops_at_eval_max_steps(monkeypatch):
    """Sebulba's evaluation plays the greedy policy (action 1 earns t at step t, exploring's action 0 earns
    -1) in a fresh sync pool, scores each env's first episode (env e's first episode lasts 2 + e steps, later
    ones 1 step: env 0's second ends before env 3's first) and stops after `env.eval_max_steps` recvs
    (episodes not over by then: NaN)."""
    def fake_build(env_cfg, num_envs, seed, envs_per_recv=None):
        return scripted_source(num_envs, envs_per_recv, seed=seed, length=lambda e, n: 1 if n else 2 + e,
                               reward=lambda e, n, t, a: float(t) if a == 1 else -1.0, truncated=lambda e, n: False)

    monkeypatch.setattr(sebulba, "make_source", fake_build)  # the evaluation pool
    expected = [sum(range(1, 3 + e)) for e in range(4)]  # 3, 6, 10, 15
    runner = Sebulba(validate(sebulba_cfg(4, 2, 2)), ExploringAgent(4), scripted_source(4, 2))
    scores = runner.evaluate(runner.init(), 4, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(scores, [expected])
    # 4 recvs: the reset step and 3 steps; only the episodes of 2 and 3 steps end within them.
    runner = Sebulba(validate(sebulba_cfg(4, 2, 2, "env.eval_max_steps=4")), ExploringAgent(4), scripted_source(4, 2))
    scores = runner.evaluate(runner.init(), 4, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(scores, [expected[:2] + [np.nan, np.nan]])


# --------------------------------------------------------------------------- envpool keys (real envpool)
def test_envpool_keys_reach_envpool():
    """`env.id`, `env.envs_per_recv`, `env.num_threads`, `env.max_episode_steps`, `env.kwargs` and `seed` are
    the envpool env's settings, `env.recvs_per_chunk` the actor's chunk; with `env.actor_threads=2` each
    thread's env has half the envs, half the batch, half the worker threads and its own seed."""
    runner = build(compose(["agent=dqn", "env=envpool/cartpole", "logger=none", "env.xla=off", "num_envs=6",
                            "env.id=Acrobot-v1", "env.envs_per_recv=2", "env.num_threads=2", "env.max_episode_steps=9",
                            "+env.kwargs.reward_threshold=-77.0", "env.recvs_per_chunk=5", "seed=11"]))
    src = runner.source
    try:
        config = src.env.config
        assert (src.task_id, src.obs_shape, src.num_actions) == ("Acrobot-v1", (6,), 3)
        assert {k: config[k] for k in ("num_envs", "batch_size", "num_threads", "max_episode_steps", "seed")} == \
            {"num_envs": 6, "batch_size": 2, "num_threads": 2, "max_episode_steps": 9, "seed": 11}
        assert config["reward_threshold"] == -77.0
        assert runner.rollout.k == 5 and runner.steps_per_chunk == 10
        src.reset()
        assert src.recv().env_id.shape == (2,)
    finally:
        src.close()
    runner = build(compose(["agent=dqn", "env=envpool/cartpole", "logger=none", "env.xla=off", "num_envs=8",
                            "env.envs_per_recv=6", "env.num_threads=4", "env.actor_threads=2", "seed=5"]))
    try:
        configs = [s.env.config for s in runner.sources]
        assert [(c["num_envs"], c["batch_size"], c["num_threads"], c["seed"]) for c in configs] == \
            [(4, 3, 2, 5), (4, 3, 2, 9)]
        assert [r.env_offset for r in runner.rollouts] == [0, 4] and runner.steps_per_chunk == 128 * 3
    finally:
        for s in runner.sources:
            s.close()


def test_xla_key_picks_the_actor_loop():
    """`env.xla=off`: the host loop (one jitted call per recv); `env.xla=on`: envpool's XLA handle inside
    one jitted scan."""
    for xla, expected in (("off", False), ("on", True)):
        runner = build(compose(["agent=dqn", "env=envpool/cartpole", "logger=none", "num_envs=4",
                                f"env.xla={xla}"]))
        try:
            assert runner.rollout.use_xla is expected and (runner.rollout._handle is not None) is expected
        finally:
            runner.source.close()


DEVICE_PROBE = """
import json
import jax
from tests.rl.runners.test_sebulba_handoffs import Sebulba, VersionAgent, scripted_source, sebulba_cfg, validate
out = {}
for name, over in {"default": [], "a1": ["env.actor_devices=1"], "a1l1": ["env.actor_devices=1", "env.learner_devices=1"],
                   "l2": ["env.learner_devices=2"], "a2": ["env.actor_devices=2"]}.items():
    runner = Sebulba(validate(sebulba_cfg(4, 2, 2, *over)), VersionAgent(4), scripted_source(4, 2))
    state = runner.init()
    out[name] = {"actors": [d.id for d in runner.actor_devices], "learner": [d.id for d in runner.learner_devices],
                 "state": sorted(d.id for d in state.agent["version"].devices()),
                 "published": sorted((d.id, *(x.id for x in v["version"].devices()))
                                     for d, v in runner.publish(state.agent).items())}
    with runner.session(state, 0) as session:  # chunks cross from the actor to the learner devices
        state, steps, totals = session.advance(state, 0, 8)
    out[name]["trained"] = [steps, int(state.agent["version"]), sorted(d.id for d in state.agent["version"].devices()),
                            sorted({d.id for x in jax.tree_util.tree_leaves(totals) for d in x.devices()})]
# One process: 3 envs per recv need not divide over the 2 learner devices (only several processes need it).
runner = Sebulba(validate(sebulba_cfg(6, 3, 2, "env.learner_devices=2")), VersionAgent(6), scripted_source(6, 3))
state = runner.init()
with runner.session(state, 0) as session:
    state, steps, _ = session.advance(state, 0, 12)
out["l2, 3 per recv"] = [steps, int(state.agent["version"])]
print(json.dumps(out))
"""


def test_device_keys_place_actors_and_learner():
    """On 3 forced CPU devices: `env.actor_devices=N` acts on the first N devices and the learner takes the
    rest, or `env.learner_devices=M` of them; with only `learner_devices` the actors stay on device 0; the
    learner state lives on the learner devices and parameters are published to every actor device; a short
    session trains with each split, also with envs per recv that do not divide over the learner devices (one
    process)."""
    out = run_probe(DEVICE_PROBE, devices=3)
    # ... and training runs there: 2 chunks of 2 recvs x 2 envs, one update each, state and sums on the learner.
    placed = lambda a, l: {"actors": a, "learner": l, "state": l, "published": [[d, d] for d in a],
                           "trained": [8, 2, l, l]}
    assert out == {"default": placed([0], [0]), "a1": placed([0], [1, 2]), "a1l1": placed([0], [1]),
                   "l2": placed([0], [0, 1]), "a2": placed([0, 1], [2]), "l2, 3 per recv": [12, 2]}
