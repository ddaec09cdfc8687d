"""Top-level, gymnax and Anakin options checked by their effect (each test here fails when the keys it
covers are ignored or misapplied), and two Anakin-side hand-offs: a chunk's logged mean episode
return/length against a hand computation on a hand-stepped env, and greedy evaluation that stops counting
at each episode's end. Runs use a hand-made agent (`VersionAgent`), so nothing big compiles; wandb and
`jax.distributed` are replaced by recorders (no network, no second process)."""

from __future__ import annotations

import csv
import inspect
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.experiment import build, validate
from agents.setup import compose
from buffers.rows import RowBuffer
from rl.envs.gymnax_source import Timestep
from rl.infra import checkpoint
from rl.infra.logging import RunLogger
from rl.runners import anakin, loop
from rl.runners.anakin import Anakin
from rl.runners.evaluate import evaluate
from rl.runners.guard import NonFiniteError
from tests.conftest import run_probe
from tests.rl.infra.test_logging import _cfg as logger_cfg

ROOT = Path(__file__).resolve().parents[3]

COVERS = {
    "env.gymnax.id": "test_gymnax_id_picks_the_env",
    "env.gymnax.params": "test_gymnax_params_reach_the_env",
    "env.gymnax.obs_features": "test_gymnax_obs_features_keep_those_features",
    "env.gymnax.source": "test_env_source_picks_the_runner",
    "env.envpool.source": "test_env_source_picks_the_runner",
    "train.total_steps": "test_run_length_log_rows_seeds_envs_and_eval_episodes",
    "train.log_interval": "test_run_length_log_rows_seeds_envs_and_eval_episodes",
    "train.seeds": "test_run_length_log_rows_seeds_envs_and_eval_episodes",
    "train.num_envs": "test_run_length_log_rows_seeds_envs_and_eval_episodes",
    "train.eval_episodes": ["test_run_length_log_rows_seeds_envs_and_eval_episodes",
                            "test_anakin_evaluation_is_greedy_and_stops_counting_at_the_episode_end"],
    "train.seed": "test_seed_starts_each_seeds_stream",
    "train.checkpoint.enabled": "test_checkpoint_enabled_interval_and_keep",
    "train.checkpoint.interval": "test_checkpoint_enabled_interval_and_keep",
    "train.checkpoint.keep": "test_checkpoint_enabled_interval_and_keep",
    "train.on_nonfinite": "test_on_nonfinite_stops_or_skips",
    "train.mesh.devices": "test_mesh_keys_shape_the_anakin_mesh",
    "train.mesh.seed_devices": "test_mesh_keys_shape_the_anakin_mesh",
    "train.logger.progress": "test_logger_progress_and_plot",
    "train.logger.plot": "test_logger_progress_and_plot",
    "train.logger.wandb.mode": "test_wandb_keys_reach_wandb_init",
    "train.logger.wandb.project": "test_wandb_keys_reach_wandb_init",
    "train.logger.wandb.entity": "test_wandb_keys_reach_wandb_init",
    "train.logger.wandb.group": "test_wandb_keys_reach_wandb_init",
    "train.logger.wandb.name": "test_wandb_keys_reach_wandb_init",
    "train.logger.wandb.tags": "test_wandb_keys_reach_wandb_init",
    "train.distributed.enabled": "test_distributed_keys_reach_jax_distributed_initialize",
    "train.distributed.coordinator_address": "test_distributed_keys_reach_jax_distributed_initialize",
    "train.distributed.num_processes": "test_distributed_keys_reach_jax_distributed_initialize",
    "train.distributed.process_id": "test_distributed_keys_reach_jax_distributed_initialize",
    "train.distributed.local_device_ids": "test_distributed_keys_reach_jax_distributed_initialize",
    "train.distributed.cluster_detection_method": "test_distributed_keys_reach_jax_distributed_initialize",
    "train.distributed.initialization_timeout": "test_distributed_keys_reach_jax_distributed_initialize",
}


# --------------------------------------------------------------------------- hand-made agent and envs
class Rows(RowBuffer):
    """Per-env rows that can always "sample" (the hand-made agents' train steps read nothing)."""

    def can_sample(self, state):
        return jnp.bool_(True)


class VersionAgent:
    """A hand-made agent whose parameters are a version number: each train step adds 1 (metric
    `train/version`: the version before it), each act takes action `version % num_actions` (explored or
    greedy alike) and reports the version in its extras; every stored step (per-env rows) holds the step
    fields and the version that chose its action."""

    train_interval, learning_starts = 1, 0

    def __init__(self, num_envs: int, capacity: int = 64, num_actions: int = 2):
        self.buffer, self.num_actions = Rows(num_envs, capacity), num_actions

    def init(self, key, obs_example):
        return {"version": jnp.zeros((), jnp.int32)}

    def initial_carry(self, num_envs):
        return ()

    def policy(self, state, env_ids, explore):
        return jnp.full(env_ids.shape, state["version"] % self.num_actions, jnp.int32)

    def act(self, state, obs, carry, key, env_ids, explore=True):
        version = jnp.full(env_ids.shape, state["version"], jnp.int32)
        return self.policy(state, env_ids, explore), carry, {"version": version}

    def make_step(self, obs, action, reward, terminated, truncated, next_obs, carry, extras):
        return {"obs": obs, "action": action.astype(jnp.int32), "reward": reward, "terminated": terminated,
                "truncated": truncated, "next_obs": next_obs, "version": extras["version"]}

    def step_prototype(self, obs_example):
        obs, f, b, i = jnp.zeros_like(obs_example), jnp.float32(0), jnp.bool_(False), jnp.int32(0)
        return {"obs": obs, "action": i, "reward": f, "terminated": b, "truncated": b, "next_obs": obs,
                "version": i}

    def train_step(self, state, buffer_state, key):
        return {"version": state["version"] + 1}, buffer_state, {"version": state["version"].astype(jnp.float32)}


class ExploringAgent(VersionAgent):
    """Greedy (`explore=False`): action 1; exploring: action 0."""

    def policy(self, state, env_ids, explore):
        return jnp.full(env_ids.shape, 0 if explore else 1, jnp.int32)


class TableSource:
    """A hand-stepped source for the Anakin runner: at vector step t env e earns `rewards[t, e]` plus a
    per-seed offset (drawn from the reset key, kept in the env state) and its episode ends where
    `ends[t, e]` is 1 (terminated) or 2 (truncated). Observations are `[t, e]`."""

    num_actions, max_episode_steps, obs_shape, obs_dtype = 2, None, (2,), jnp.float32

    def __init__(self, rewards, ends):
        self.rewards, self.ends = jnp.asarray(rewards, jnp.float32), jnp.asarray(ends, jnp.int32)
        self.num_envs = self.rewards.shape[1]

    def _obs(self, t):
        return jnp.stack([jnp.full(self.num_envs, t, jnp.float32), jnp.arange(self.num_envs, dtype=jnp.float32)], -1)

    def reset(self, key):
        return {"t": jnp.zeros((), jnp.int32), "offset": jax.random.uniform(key)}, self._obs(0)

    def step(self, state, action, key, restart=True):
        t, end = state["t"], self.ends[state["t"]]
        obs = self._obs(t + 1)
        ts = Timestep(obs=obs, reward=self.rewards[t] + state["offset"], terminated=end == 1, truncated=end == 2,
                      next_obs=obs)
        return {**state, "t": t + 1}, ts


class CorridorSource:
    """Env e's episodes last 2 + e steps, then it auto-resets and goes on; action 1 earns 1 per step, action 0
    nothing. One greedy episode of `ExploringAgent` in env e returns 2 + e."""

    num_actions, max_episode_steps, obs_shape, obs_dtype = 2, None, (1,), jnp.float32

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self.lengths = 2 + jnp.arange(num_envs)

    def reset(self, key):
        t = jnp.zeros(self.num_envs, jnp.int32)
        return t, t[:, None].astype(jnp.float32)

    def step(self, t, action, key, restart=True):
        t = t + 1
        end = t >= self.lengths
        next_obs = t[:, None].astype(jnp.float32)
        t = jnp.where(end, 0, t)
        ts = Timestep(obs=t[:, None].astype(jnp.float32), reward=(action == 1).astype(jnp.float32), terminated=end,
                      truncated=jnp.zeros_like(end), next_obs=next_obs)
        return t, ts


def anakin_cfg(*overrides):
    """A config for the hand-made agents: no wandb, no bar, no plot, no checkpoint, no eval."""
    return compose(["agent=dqn", "env=cartpole", "logger=none", "logger.plot=false", "checkpoint.enabled=false",
                    "eval_episodes=0", "num_envs=4", *overrides])


@pytest.fixture
def corridor(monkeypatch):
    """The Anakin runner steps `CorridorSource`s instead of gymnax envs (they compile in a fraction of the
    time); the env keys are checked on real gymnax envs above."""
    monkeypatch.setattr(anakin, "make_source", lambda env_cfg, n: CorridorSource(n))


def run_loop(cfg, runner, run_dir):
    """The host loop (rl/runners/loop.py) with the real logger, as `agents.experiment.run` drives it."""
    cfg = validate(cfg)
    logger = RunLogger(cfg, run_dir)
    try:
        return loop.run(cfg, runner, logger)
    finally:
        logger.close()


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- env keys
def test_gymnax_id_picks_the_env(tiny_cfg):
    """`env.id=Acrobot-v1`: the runner steps Acrobot (6 features, 3 actions, reward -1 per step)."""
    runner = build(tiny_cfg("env.id=Acrobot-v1"))
    source = runner.source
    assert (source.obs_shape, source.num_actions) == ((6,), 3)
    state, obs = source.reset(jax.random.PRNGKey(0))
    _, ts = source.step(state, jnp.zeros(4, jnp.int32), jax.random.PRNGKey(1))
    assert obs.shape == (4, 6) and (np.asarray(ts.reward) == -1).all()


def test_gymnax_params_reach_the_env(tiny_cfg):
    """`env.params.max_steps_in_episode=5`: alternating pushes keep the pole up, and every env is truncated
    at its 5th step (CartPole's own limit is 500)."""
    source = build(tiny_cfg("+env.params.max_steps_in_episode=5")).source
    state, _ = source.reset(jax.random.PRNGKey(0))
    cut = []
    for t in range(6):
        state, ts = source.step(state, jnp.full(4, t % 2, jnp.int32), jax.random.PRNGKey(t))
        cut.append(np.asarray(ts.truncated).all())
        assert not np.asarray(ts.terminated).any()
    assert cut == [False, False, False, False, True, False]


def test_gymnax_obs_features_keep_those_features(tiny_cfg):
    """`env.obs_features=[3,0]`: observations are features 3 and 0 (in that order) of CartPole's, on reset,
    after a step and in the final observation."""
    full = build(tiny_cfg()).source
    kept = build(tiny_cfg("env.obs_features=[3,0]")).source
    assert kept.obs_shape == (2,)
    (s_full, o_full), (s_kept, o_kept) = full.reset(jax.random.PRNGKey(0)), kept.reset(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(o_kept, o_full[:, [3, 0]])
    a, k = jnp.ones(4, jnp.int32), jax.random.PRNGKey(1)
    (_, t_full), (_, t_kept) = full.step(s_full, a, k), kept.step(s_kept, a, k)
    np.testing.assert_array_equal(t_kept.obs, t_full.obs[:, [3, 0]])
    np.testing.assert_array_equal(t_kept.next_obs, t_full.next_obs[:, [3, 0]])


def test_env_source_picks_the_runner():
    """`env.source` picks the runner and the env section's schema: gymnax -> Anakin over gymnax, envpool ->
    Sebulba over envpool."""
    from rl.envs.envpool_source import EnvpoolSource
    from rl.envs.gymnax_source import GymnaxSource
    from rl.runners.sebulba import Sebulba

    gymnax_runner = build(compose(["agent=dqn", "env=cartpole", "logger=none"]))
    assert isinstance(gymnax_runner, Anakin) and isinstance(gymnax_runner.source, GymnaxSource)
    envpool_runner = build(compose(["agent=dqn", "env=envpool/cartpole", "logger=none", "env.xla=off"]))
    try:
        assert isinstance(envpool_runner, Sebulba) and isinstance(envpool_runner.source, EnvpoolSource)
        assert envpool_runner.env_cfg.recvs_per_chunk == 128  # the envpool schema (and yaml) was read
    finally:
        envpool_runner.source.close()


# --------------------------------------------------------------------------- run length, logs, seeds, eval
def test_run_length_log_rows_seeds_envs_and_eval_episodes(tmp_path, corridor):
    """`total_steps=45` ends at 48 (whole iterations of 4 envs), a metrics row per seed every `log_interval=8`
    env steps, `seeds=2` vmapped streams of `num_envs=4` buffer rows (12 steps each), and `eval_episodes=3`
    greedy episodes per seed."""
    cfg = anakin_cfg("seeds=2", "total_steps=45", "log_interval=8", "eval_episodes=3")
    res = run_loop(cfg, Anakin(validate(cfg), ExploringAgent(4)), tmp_path)
    assert res["env_steps"] == 48
    rows = read_csv(tmp_path / "metrics.csv")
    assert [(int(r["env_steps"]), int(r["seed"])) for r in rows] == [(s, i) for s in range(8, 49, 8) for i in (0, 1)]
    written = np.asarray(res["state"][0].buffer.written)
    np.testing.assert_array_equal(written, np.full((2, 4), 12))
    assert np.asarray(res["state"][0].obs).shape == (2, 4, 1)
    np.testing.assert_array_equal(np.asarray(res["state"][0].agent["version"]), [12, 12])  # one update per iteration
    np.testing.assert_array_equal(res["eval_returns"], [[2, 3, 4]] * 2)
    assert json.loads((tmp_path / "summary.json").read_text())["env_steps"] == 48


def test_seed_starts_each_seeds_stream(monkeypatch):
    """Seed i of a run uses PRNGKey(seed + i): seed=5's second stream is seed=6's first (env reset and
    runner key), and differs from its first."""
    monkeypatch.setattr(anakin, "make_source", lambda env_cfg, n: TableSource(np.zeros((1, n)), np.zeros((1, n))))
    two = Anakin(validate(anakin_cfg("seeds=2", "seed=5")), VersionAgent(4))
    one = Anakin(validate(anakin_cfg("seeds=1", "seed=6")), VersionAgent(4))
    (s2, _), (s1, _) = two.init(), one.init()
    offsets = np.asarray(s2.env["offset"])  # drawn from each seed's env reset key
    assert offsets[1] == np.asarray(s1.env["offset"])[0] and offsets[0] != offsets[1]
    np.testing.assert_array_equal(jax.random.key_data(s2.key[1]), jax.random.key_data(s1.key[0]))


def test_checkpoint_enabled_interval_and_keep(tmp_path, corridor):
    """`checkpoint.interval=16` saves at 16, 32 and 48 (the end), `checkpoint.keep=3` keeps all three (the
    newest holds the final state); `checkpoint.enabled=false` writes none; a run of 40 also saves its end."""
    common = ("total_steps=48", "log_interval=8", "checkpoint.interval=16")
    cfg = anakin_cfg(*common, "checkpoint.enabled=true", "checkpoint.keep=3")
    res = run_loop(cfg, Anakin(validate(cfg), VersionAgent(4)), tmp_path / "on")
    ckpts = tmp_path / "on" / "checkpoints"
    assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == [16, 32, 48]
    assert res["checkpoint"] == str(ckpts / "48")
    state, meta = checkpoint.restore(tmp_path / "on", Anakin(validate(cfg), VersionAgent(4)).restore_target())
    assert meta["env_steps"] == 48 and int(state[0].agent["version"][0]) == 12

    cfg = anakin_cfg(*common, "checkpoint.enabled=false")
    res = run_loop(cfg, Anakin(validate(cfg), VersionAgent(4)), tmp_path / "off")
    assert res["checkpoint"] is None and not (tmp_path / "off" / "checkpoints").exists()

    # An interval that does not divide the run: 16 and 32, then the end of the run saves 40 and names it.
    cfg = anakin_cfg("total_steps=40", "log_interval=8", "checkpoint.interval=16", "checkpoint.enabled=true",
                     "checkpoint.keep=3")
    res = run_loop(cfg, Anakin(validate(cfg), VersionAgent(4)), tmp_path / "end")
    ckpts = tmp_path / "end" / "checkpoints"
    assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == [16, 32, 40]
    assert res["checkpoint"] == str(ckpts / "40")


class NaNAgent(VersionAgent):
    """Its train metric `loss` is NaN from version 3 on (the params stay finite)."""

    def train_step(self, state, buffer_state, key):
        state2, buffer_state, _ = super().train_step(state, buffer_state, key)
        return state2, buffer_state, {"loss": jnp.where(state["version"] >= 3, jnp.nan, 0.0)}


def test_on_nonfinite_stops_or_skips(tmp_path, corridor):
    """`on_nonfinite=stop`: the run stops at the 4th update (env step 16) naming the metric;
    `on_nonfinite=skip`: that update and all later ones are dropped (version stays 3) and counted."""
    common = ("total_steps=48", "log_interval=8")
    cfg = anakin_cfg(*common, "on_nonfinite=stop")
    with pytest.raises(NonFiniteError, match="train metric `loss` became non-finite .* at env step 16"):
        run_loop(cfg, Anakin(validate(cfg), NaNAgent(4)), tmp_path / "stop")
    cfg = anakin_cfg(*common, "on_nonfinite=skip")
    res = run_loop(cfg, Anakin(validate(cfg), NaNAgent(4)), tmp_path / "skip")
    assert int(res["state"][0].agent["version"][0]) == 3
    skipped = [float(r["train/skipped"]) for r in read_csv(tmp_path / "skip" / "metrics.csv")]
    assert skipped == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]


# --------------------------------------------------------------------------- hand-off: logged episode means
END_AT = {(1, 0): 1, (1, 1): 1, (3, 0): 2, (3, 2): 1,  # chunk 0 (steps 0-3): four episodes end
          (9, 1): 2,  # chunk 1 (steps 4-7): none; chunk 2: one, begun in chunk 0
          (12, 0): 1, (15, 2): 2}  # chunk 3: two
T, E, CHUNK = 16, 3, 4


def hand_means(rewards, ends, offset):
    """Per chunk of CHUNK vector steps: (mean return, mean length, count) of the episodes that ended in it."""
    ret, length, out = np.zeros(E), np.zeros(E, int), []
    for c in range(T // CHUNK):
        done = []
        for t in range(c * CHUNK, (c + 1) * CHUNK):
            ret += rewards[t] + offset
            length += 1
            for e in np.flatnonzero(ends[t]):
                done.append((ret[e], length[e]))
                ret[e], length[e] = 0.0, 0
        out.append((np.mean([d[0] for d in done]) if done else None, np.mean([d[1] for d in done]) if done else None,
                    len(done)))
    return out


def test_logged_episode_means_match_a_hand_computation(tmp_path, monkeypatch):
    """metrics.csv's `episode_return` / `episode_length` / `episodes` per chunk and seed equal a hand
    computation on a hand-stepped env: the means are over the episodes that ended in the chunk (4, then
    none: empty cells, then 1 begun two chunks earlier, then 2), not over envs or steps; terminated and
    truncated ends both count; each seed's row has its own rewards."""
    rewards = np.random.default_rng(0).normal(size=(T, E)).astype(np.float32)
    ends = np.zeros((T, E), np.int32)
    for (t, e), kind in END_AT.items():
        ends[t, e] = kind
    monkeypatch.setattr(anakin, "make_source", lambda env_cfg, n: TableSource(rewards, ends))
    cfg = anakin_cfg("num_envs=3", "seeds=2", f"total_steps={T * E}", f"log_interval={CHUNK * E}")
    res = run_loop(cfg, Anakin(validate(cfg), VersionAgent(E)), tmp_path)
    offsets = np.asarray(res["state"][0].env["offset"])
    assert offsets[0] != offsets[1]
    rows = read_csv(tmp_path / "metrics.csv")
    assert len(rows) == 2 * T // CHUNK
    for seed in (0, 1):
        got = [r for r in rows if int(r["seed"]) == seed]
        expected = hand_means(rewards.astype(np.float64), ends, float(offsets[seed]))
        assert [e[2] for e in expected] == [4, 0, 1, 2]
        for row, (ret, length, count) in zip(got, expected):
            assert float(row["episodes"]) == count
            if count == 0:
                assert row["episode_return"] == row["episode_length"] == ""
            else:
                assert float(row["episode_return"]) == pytest.approx(ret, rel=1e-5)
                assert float(row["episode_length"]) == pytest.approx(length)
    assert res["episode_return"][1] == pytest.approx(float(got[-1]["episode_return"]), rel=1e-6)


# --------------------------------------------------------------------------- hand-off: greedy evaluation
def test_greedy_evaluation_stops_counting_at_each_episode_end():
    """rl/runners/evaluate.py: the evaluation policy (`explore=False`: action 1, where exploring takes 0)
    plays one episode per env; an env whose episode ended adds nothing while the others go on."""
    agent, source = ExploringAgent(4), CorridorSource(4)
    returns, lengths = jax.jit(lambda k: evaluate(agent, agent.init(None, None), source, k))(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(returns), [2, 3, 4, 5])
    np.testing.assert_array_equal(np.asarray(lengths), [2, 3, 4, 5])

    class DoubleRewards(CorridorSource):  # returns twice the lengths: each output tells which it is
        def step(self, t, action, key, restart=True):
            t, ts = super().step(t, action, key)
            return t, ts.replace(reward=2 * ts.reward)

    returns, lengths = evaluate(agent, agent.init(None, None), DoubleRewards(4), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(returns), [4, 6, 8, 10])
    np.testing.assert_array_equal(np.asarray(lengths), [2, 3, 4, 5])


def test_anakin_evaluation_is_greedy_and_stops_counting_at_the_episode_end(monkeypatch):
    """`Anakin.evaluate`, as the host loop calls it with `eval_episodes`: every seed plays one greedy
    episode in each of `episodes` fresh envs."""
    monkeypatch.setattr(anakin, "make_source", lambda env_cfg, n: CorridorSource(n))
    runner = Anakin(validate(anakin_cfg("num_envs=2", "seeds=2")), ExploringAgent(2))
    returns = runner.evaluate(runner.init(), 5, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(returns, [[2, 3, 4, 5, 6]] * 2)


# --------------------------------------------------------------------------- mesh (forced CPU devices)
MESH_PROBE = """
import json
from rl.runners import anakin
from tests.rl.runners.test_runner_options import Anakin, CorridorSource, VersionAgent, anakin_cfg, validate
anakin.make_source = lambda env_cfg, n: CorridorSource(n)
out = {}
for name, over in {"all": [], "one": ["mesh.devices=1"], "two": ["mesh.devices=2"],
                   "seed2": ["mesh.devices=4", "mesh.seed_devices=2"]}.items():
    runner = Anakin(validate(anakin_cfg("seeds=2", *over)), VersionAgent(4))
    shardings = runner.state_shardings  # where init() puts the state (None: on the default device)
    out[name] = {"mesh": None if runner.mesh is None else dict(runner.mesh.shape),
                 "buffer_devices": None if shardings is None else
                 sorted(d.id for d in shardings.buffer.written.device_set)}
print(json.dumps(out))
"""


def test_mesh_keys_shape_the_anakin_mesh():
    """On 4 forced CPU devices: `mesh.devices` picks how many devices the run uses (null: all) and
    `mesh.seed_devices` how many of them split the seeds; the runner state is placed on those devices."""
    out = run_probe(MESH_PROBE, devices=4)
    assert out["all"] == {"mesh": {"seed": 1, "data": 4}, "buffer_devices": [0, 1, 2, 3]}
    assert out["one"] == {"mesh": None, "buffer_devices": None}
    assert out["two"] == {"mesh": {"seed": 1, "data": 2}, "buffer_devices": [0, 1]}
    assert out["seed2"] == {"mesh": {"seed": 2, "data": 2}, "buffer_devices": [0, 1, 2, 3]}


# --------------------------------------------------------------------------- logger
def test_logger_progress_and_plot(tmp_path, capsys):
    """`logger.progress` turns the console bar on/off; `logger.plot` the learning-curve PNG at close."""
    for progress, plot in ((True, False), (False, True)):
        cfg = logger_cfg(100, progress=progress, plot=plot)
        run_dir = tmp_path / f"{progress}-{plot}"
        logger = RunLogger(cfg, run_dir)
        logger.start(start_step=0, num_seeds=1, total_steps=100)
        assert (logger._bar is not None) == progress
        logger.log(100, {"episode_return": 1.0})
        paths = logger.close()
        assert (run_dir / "learning_curve.png").exists() == plot and ("learning_curve" in paths) == plot
        err = capsys.readouterr().err
        assert ("dqn/CartPole-v1" in err) == progress


class FakeRun:
    def __init__(self, run_dir):
        self.id, self.dir, self.summary, self.logged = "fake-id", str(run_dir / "wandb" / "files"), {}, []

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        pass


def test_wandb_keys_reach_wandb_init(tmp_path, monkeypatch):
    """`logger.wandb.{mode,project,entity,group,name,tags}` are what `wandb.init` gets (recorded, no
    network); `mode=disabled` starts no wandb run."""
    import wandb

    calls = []
    monkeypatch.setattr(wandb, "init", lambda **kw: calls.append(kw) or FakeRun(tmp_path))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    wandb_keys = {"mode": "online", "project": "proj-x", "entity": "team-y", "group": "grp-z", "name": "run-w",
                  "tags": ["a", "b"]}
    cfg = logger_cfg(100, progress=False, **wandb_keys)
    logger = RunLogger(cfg, tmp_path / "on")
    logger.start(start_step=0, num_seeds=1, total_steps=100)
    logger.log(100, {"episode_return": 2.0})
    logger.close()
    assert len(calls) == 1
    got = {k: calls[0][k] for k in ("mode", "project", "entity", "group", "name", "tags")}
    assert got == {"mode": "online", "project": "proj-x", "entity": "team-y", "group": "grp-z", "name": "run-w",
                   "tags": ["a", "b"]}
    assert logger.wandb_id == "fake-id"
    logger = RunLogger(logger_cfg(100, progress=False, **{**wandb_keys, "mode": "disabled"}), tmp_path / "off")
    logger.start(start_step=0, num_seeds=1, total_steps=100)
    logger.close()
    assert len(calls) == 1 and logger.wandb_id is None


# --------------------------------------------------------------------------- distributed
class Started(Exception):
    """Raised by the recorder in place of `agents.experiment.prepare`: the run got past the distributed start."""


def test_distributed_keys_reach_jax_distributed_initialize(tmp_path, monkeypatch):
    """`agents.experiment.run` starts `jax.distributed` first when `distributed.enabled`, with every other key of
    the section passed by its name (recorded; names checked against `jax.distributed.initialize`); not at all
    when disabled."""
    from agents import experiment

    calls, accepted = [], set(inspect.signature(jax.distributed.initialize).parameters)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(experiment, "prepare", lambda *a, **k: (_ for _ in ()).throw(Started()))
    keys = {"coordinator_address": "host0:1234", "num_processes": 4, "process_id": 3, "local_device_ids": [1, 0],
            "cluster_detection_method": "mpi4py", "initialization_timeout": 17}
    with pytest.raises(Started):
        experiment.run(anakin_cfg("distributed.enabled=false"), tmp_path)
    assert calls == []
    overrides = [f"distributed.{k}={v}".replace(" ", "") for k, v in keys.items()]
    with pytest.raises(Started):
        experiment.run(anakin_cfg("distributed.enabled=true", *overrides), tmp_path)
    assert calls == [keys] and set(keys) <= accepted
