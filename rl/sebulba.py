"""The Sebulba runner: envpool in async mode, an actor thread and a learner that own disjoint state.

Runner contract: `train(cfg, logger) -> dict`, the same as rl/anakin.py (see its docstring); the runner is
chosen by `env.source: envpool` (configs/env/envpool/*.yaml), whatever the agent.

Data flow and synchronisation (one process, two threads, one JAX device):

    actor thread                                         learner (calling thread)
    ------------                                         ------------------------
    owns: envpool env, Tracker (per-env last obs/action,  owns: agent state, buffer state, learner key
          carry, episode stats), actor key
    loop over chunks of K recvs:                         loop over chunks:
      acting = mailbox.acting    (params, ready)            chunk = queue.get()
      K x [recv -> track/act -> make_step -> send]  ---->   update(agent, buffer, chunk, n): one jit, both
      queue.put(chunk)           (bounded: Q chunks)          donated: K x buffer.add(steps, env_ids,
                                                              mask), then n x agent.train_step
                                                            every `sync_interval` chunks: copy the agent
                                                            state, wait until ready, mailbox.acting = copy

* The actor step is one jitted function: with `env.xla` (envpool's XLA handle) a `lax.scan` over K
  recv/act/send inside jit; otherwise (host loop) one jitted call per recv between `recv()` and `send()`.
* Only the learner touches the buffer state and the agent state, so the donated `update` never races a
  write. The actor acts with its own copy of the agent state (the learner donates its state into every
  update, which deletes the arrays). The copy is published only once computed, so the actor never waits
  for the learner; it picks up the newest copy at the start of every chunk (policy lag <= Q + sync_interval
  chunks).
* Replay ratio as in Anakin: one `train_step` per `agent.train_interval * num_envs` env steps received,
  once `agent.learning_starts` env steps have been received and the buffer can sample. The learner blocks
  on an empty queue; the actor blocks on a full one. Env steps count every recv'd step (reset steps too).
* Each recv's steps are written per `env_id` with the transition mask of `rl.envpool_source.track` (reset
  steps write nothing), so every env's row holds its transitions in time order whatever the recv order.

Resuming restores the agent state, buffer and keys; envs restart with fresh episodes (envpool has no state
to save), so a resumed run continues but is not bit-identical. The last step stored per env before the
checkpoint is not marked done, so up to n-1 n-step windows may join it to the env's next episode.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from omegaconf import DictConfig

from agents import make_agent
from rl import checkpoint
from rl.config import ConfigError, check_resumable, env_config
from rl.envpool_source import EnvpoolSource, Episodes, Recv, init_tracker, make_source, track

# Donating the learner key or a step counter XLA cannot reuse only warns; the storage is what matters.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


@dataclasses.dataclass
class EnvConfig:
    """`configs/env/envpool/*.yaml` (`source: envpool`). The number of envs is the top-level `num_envs`."""

    source: str = "envpool"
    id: str = "CartPole-v1"  # any envpool task id with discrete actions, e.g. Pong-v5, Breakout-v5
    batch_size: int | None = None  # envs per recv; null: num_envs // 2 (async); = num_envs: sync mode
    num_threads: int = 0  # envpool worker threads (0: envpool's default)
    max_episode_steps: int | None = None  # null: the task's own limit
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # further envpool.make options
    recvs_per_chunk: int = 16  # K: recvs per actor chunk (one jitted rollout, one learner update)
    queue_size: int = 2  # Q: chunks the actor may run ahead of the learner
    sync_interval: int = 1  # chunks between two copies of the agent state to the actor
    xla: str = "auto"  # envpool's XLA handle inside jit: auto (probe, else host loop) | on | off
    eval_max_steps: int | None = None  # recv cap of the final evaluation (null: 2 x the episode limit)

    def __post_init__(self):
        import envpool

        if self.source != "envpool":
            raise ValueError(f"env.source must be 'envpool' for an envpool env config, got {self.source!r}")
        if self.id not in envpool.list_all_envs():
            raise ValueError(f"env.id={self.id!r} is not an envpool task id; see envpool.list_all_envs()")
        for key in ("recvs_per_chunk", "queue_size", "sync_interval"):
            if getattr(self, key) < 1:
                raise ValueError(f"env.{key} must be >= 1, got {getattr(self, key)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"env.batch_size must be >= 1 or null, got {self.batch_size}")
        if self.xla not in ("auto", "on", "off"):
            raise ValueError(f"env.xla must be auto, on or off, got {self.xla!r}")


def build_source(env_cfg: EnvConfig, num_envs: int, seed: int, batch_size: int | None = None) -> EnvpoolSource:
    batch = batch_size or env_cfg.batch_size or max(num_envs // 2, 1)
    if batch > num_envs:
        raise ConfigError(f"env.batch_size={batch} exceeds num_envs={num_envs}")
    return make_source(env_cfg.id, num_envs, batch, seed=seed, num_threads=env_cfg.num_threads,
                       max_episode_steps=env_cfg.max_episode_steps, **dict(env_cfg.kwargs))


def xla_handle_works(env_cfg: EnvConfig) -> bool:
    """Probe envpool's XLA handle on a small env of the same task: one jitted recv + send."""
    try:
        probe = build_source(env_cfg, 2, seed=0, batch_size=1)
        handle, recv, send = probe.xla()

        @jax.jit
        def once(h):
            h, r = recv(h)
            return send(h, jnp.zeros_like(r.env_id), r.env_id), r.env_id

        probe.reset()
        _, ids = once(handle)
        ok = np.asarray(ids).shape == (1,) and int(np.asarray(ids)[0]) in (0, 1)
        probe.close()
        return ok
    except Exception as e:  # noqa: BLE001 - any failure means: use the host loop
        warnings.warn(f"envpool XLA handle unusable ({type(e).__name__}: {e}); using the host loop", stacklevel=2)
        return False


def new_tracker(agent, agent_state, source: EnvpoolSource, explore: bool = True):
    """A fresh `Tracker` for the envs of `source`, with the agent's carry and (zero) act extras."""
    m = source.batch_size
    obs = jnp.zeros((m,) + source.obs_shape, source.obs_dtype)
    extras = jax.eval_shape(lambda s, o: agent.act(s, o, agent.initial_carry(m), jax.random.PRNGKey(0),
                                                   jnp.arange(m), explore=explore)[2], agent_state, obs)
    extras = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape[1:], x.dtype), extras)
    return init_tracker(source.num_envs, source.obs_example(), agent.initial_carry(source.num_envs), extras)


@struct.dataclass
class Chunk:
    """What the actor hands the learner for K recvs of M envs: steps `[K, M, ...]`, env_ids / mask `[K, M]`,
    episodes that ended `[K, M]`."""

    steps: Any
    env_ids: jax.Array
    mask: jax.Array
    episodes: Episodes


@struct.dataclass
class Totals:
    """Sums since the last log: episodes ended, their scores and lengths, train steps and metric sums."""

    episodes: jax.Array
    score: jax.Array
    length: jax.Array
    updates: jax.Array
    metrics: dict


class Sebulba:
    """The compiled parts of a Sebulba run: actor rollout (XLA handle or host loop) and learner update."""

    def __init__(self, agent, source: EnvpoolSource, recvs_per_chunk: int, use_xla: bool):
        self.agent, self.source = agent, source
        self.num_envs, self.batch = source.num_envs, source.batch_size
        self.k = int(recvs_per_chunk)
        self.use_xla = use_xla
        self.steps_per_chunk = self.k * self.batch
        self.steps_per_update = self.num_envs * int(agent.train_interval)
        self.update = jax.jit(self._update, donate_argnums=(0, 1, 2, 3))
        self.copy = jax.jit(lambda s: jax.tree_util.tree_map(jnp.copy, s))
        self._act_step = jax.jit(self._act_step_fn, donate_argnums=0)
        self._stack = jax.jit(lambda outs: jax.tree_util.tree_map(lambda *x: jnp.stack(x), *outs))
        self.used = False

    # --- actor --------------------------------------------------------------------------------------
    def init_tracker(self, agent_state):
        return new_tracker(self.agent, agent_state, self.source)

    def _act_step_fn(self, tracker, acting, recv: Recv, key):
        """One recv: bookkeeping, policy, step-format data. Returns (tracker, actions [M], Chunk row)."""
        agent = self.agent
        obs = self.source.observation(jnp.asarray(recv.obs))

        def act(o, carry):
            return agent.act(acting, o, carry, key, recv.env_id)

        tracker, actions, tr, episodes = track(tracker, recv, obs, act, agent.initial_carry(self.batch))
        steps = agent.make_step(tr.obs, tr.action, tr.reward, tr.terminated, tr.truncated, tr.next_obs,
                                tr.carry, tr.extras)
        return tracker, actions, Chunk(steps=steps, env_ids=recv.env_id, mask=tr.valid, episodes=episodes)

    def make_rollout(self):
        """`rollout(tracker, acting, key, index) -> (tracker, Chunk)`: K recvs with sends, from the actor
        thread; the chunk's per-recv keys are split from `fold_in(key, index)` inside jit."""

        def chunk_keys(key, index):
            return jax.random.split(jax.random.fold_in(key, index), self.k)

        if self.use_xla:
            handle, recv, send = self.source.xla()

            def scan_fn(handle, tracker, acting, key, index):
                def body(c, k):
                    handle, tracker = c
                    handle, r = recv(handle)
                    tracker, actions, row = self._act_step_fn(tracker, acting, r, k)
                    return (send(handle, actions, r.env_id), tracker), row

                (handle, tracker), chunk = jax.lax.scan(body, (handle, tracker), chunk_keys(key, index))
                return handle, tracker, chunk

            scan_jit = jax.jit(scan_fn, donate_argnums=1)
            state = {"handle": handle}

            def rollout(tracker, acting, key, index):
                state["handle"], tracker, chunk = scan_jit(state["handle"], tracker, acting, key, np.int32(index))
                return tracker, chunk

            return rollout

        source, keys_jit = self.source, jax.jit(chunk_keys)

        def rollout(tracker, acting, key, index):
            rows = []
            for k in keys_jit(key, np.int32(index)):
                r = source.recv()
                tracker, actions, row = self._act_step(tracker, acting, r, k)
                source.send(np.asarray(actions), r.env_id)
                rows.append(row)
            return tracker, self._stack(rows)

        return rollout

    # --- learner ------------------------------------------------------------------------------------
    def zero_totals(self, agent_state, buffer_state) -> Totals:
        metrics = jax.eval_shape(self.agent.train_step, agent_state, buffer_state, jax.random.PRNGKey(0))[2]
        def zf():  # a distinct buffer per leaf: the totals are donated
            return jnp.zeros((), jnp.float32)

        return Totals(episodes=zf(), score=zf(), length=zf(), updates=jnp.zeros((), jnp.int32),
                      metrics={k: zf() for k in metrics})

    def _update(self, agent_state, buffer_state, key, totals: Totals, chunk: Chunk, num_updates):
        """Write the chunk (K adds by env_id), then up to `num_updates` train steps (each only if the buffer
        can sample). Agent state, buffer, key and totals are donated."""
        agent = self.agent

        def add(b, row):
            steps, ids, mask = row
            return agent.buffer.add(b, steps, ids, mask), None

        buffer_state, _ = jax.lax.scan(add, buffer_state, (chunk.steps, chunk.env_ids, chunk.mask))

        def train(c):
            s, b, k, t = c
            k, sub = jax.random.split(k)
            s, b, m = agent.train_step(s, b, sub)
            metrics = {n: t.metrics[n] + jnp.asarray(m[n], jnp.float32) for n in t.metrics}
            return s, b, k, t.replace(updates=t.updates + 1, metrics=metrics)

        def body(_, c):
            return jax.lax.cond(agent.buffer.can_sample(c[1]), train, lambda c: c, c)

        agent_state, buffer_state, key, totals = jax.lax.fori_loop(
            0, num_updates, body, (agent_state, buffer_state, key, totals))
        ep = chunk.episodes
        ended = ep.ended.astype(jnp.float32)
        totals = totals.replace(episodes=totals.episodes + ended.sum(), score=totals.score + (ep.score * ended).sum(),
                                length=totals.length + (ep.length * ended).sum())
        return agent_state, buffer_state, key, totals

    def updates_due(self, env_steps: int) -> int:
        """Train steps owed after `env_steps` env steps (cumulative): one per `steps_per_update` env steps
        from the first multiple of it that reaches `agent.learning_starts` (as in Anakin)."""
        first = max(math.ceil(self.agent.learning_starts / self.steps_per_update), 1)
        return max(env_steps // self.steps_per_update - first + 1, 0)


def summarise(totals: Totals) -> dict:
    """Host-side log values (per-seed arrays `[1]`) from the totals of one log interval."""
    t = jax.device_get(totals)
    n, u = float(t.episodes), int(t.updates)
    out = {"episode_return": np.array([t.score / n if n else np.nan]),
           "episode_length": np.array([t.length / n if n else np.nan]),
           "episodes": np.array([n])}
    for k, v in t.metrics.items():
        out[f"train/{k}"] = np.array([v / u if u else np.nan])
    return out


class _Actor(threading.Thread):
    """Runs rollouts into `chunks` until `stop` is set; any error is kept in `error` and stops the run."""

    def __init__(self, runner: Sebulba, tracker, acting, key, chunks: queue.Queue):
        super().__init__(daemon=True, name="sebulba-actor")
        self.runner, self.tracker, self.key, self.chunks = runner, tracker, key, chunks
        self.acting = acting  # the mailbox: replaced by the learner with a ready copy
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.chunks_made = 0

    def run(self):
        try:
            rollout = self.runner.make_rollout()
            self.runner.source.reset()
            tracker = self.tracker
            while not self.stop.is_set():
                tracker, chunk = rollout(tracker, self.acting, self.key, self.chunks_made)
                self.chunks_made += 1
                while not self.stop.is_set():
                    try:
                        self.chunks.put(chunk, timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # noqa: BLE001 - handed to the learner thread, which re-raises
            self.error = e
            self.stop.set()

    def get(self):
        """Next chunk (blocks); re-raises an actor error."""
        while True:
            if self.error is not None:
                raise RuntimeError("the Sebulba actor thread failed") from self.error
            try:
                return self.chunks.get(timeout=0.05)
            except queue.Empty:
                if not self.is_alive() and self.error is None:
                    raise RuntimeError("the Sebulba actor thread stopped without producing a chunk") from None

    def finish(self):
        self.stop.set()
        self.join()


def run_loop(runner: Sebulba, agent_state, buffer_state, key, actor_key, env_steps: int, total_steps: int,
             sync_interval: int, queue_size: int, learn: bool = True, on_chunk=None):
    """Actor thread + learner loop until `total_steps` env steps. `on_chunk(env_steps, state, totals) ->
    totals` runs on the learner after every chunk (logging, checkpoints); returns the final
    `(agent_state, buffer_state, key, env_steps, totals)`."""
    if runner.used:
        raise RuntimeError("run_loop runs once per Sebulba runner (its envpool env cannot be restarted mid-flight)")
    runner.used = True
    tracker = runner.init_tracker(agent_state)
    totals = runner.zero_totals(agent_state, buffer_state)
    acting = jax.block_until_ready(runner.copy(agent_state))
    actor = _Actor(runner, tracker, acting, actor_key, queue.Queue(maxsize=queue_size))
    actor.start()
    chunks = 0
    try:
        while env_steps < total_steps:
            chunk = actor.get()
            before, env_steps = env_steps, env_steps + runner.steps_per_chunk
            n = runner.updates_due(env_steps) - runner.updates_due(before) if learn else 0
            agent_state, buffer_state, key, totals = runner.update(agent_state, buffer_state, key, totals, chunk,
                                                                   np.int32(n))
            chunks += 1
            if learn and chunks % sync_interval == 0:
                actor.acting = jax.block_until_ready(runner.copy(agent_state))
            if on_chunk is not None:
                totals = on_chunk(env_steps, (agent_state, buffer_state, key), totals)
    finally:
        actor.finish()
    if actor.error is not None:
        raise RuntimeError("the Sebulba actor thread failed") from actor.error
    return agent_state, buffer_state, key, env_steps, totals


def evaluate(agent, agent_state, env_cfg: EnvConfig, episodes: int, seed: int, max_recvs: int | None = None):
    """Scores `[episodes]` of one whole episode per env of a fresh sync envpool, acting with
    `explore=False` (Atari: the game's raw score over all lives)."""
    source = build_source(env_cfg, episodes, seed=seed, batch_size=episodes)
    limit = max_recvs or 2 * int(source.env.spec.config.max_episode_steps) + 10
    tracker = new_tracker(agent, agent_state, source, explore=False)

    @jax.jit
    def step(tracker, recv, key):
        def act(o, c):
            return agent.act(agent_state, o, c, key, recv.env_id, explore=False)

        tracker, actions, _, ep = track(tracker, recv, source.observation(recv.obs), act,
                                        agent.initial_carry(episodes))
        return tracker, actions, ep

    scores = np.full(episodes, np.nan)
    key = jax.random.PRNGKey(seed)
    source.reset()
    for i in range(limit):
        r = source.recv()
        tracker, actions, ep = step(tracker, r, jax.random.fold_in(key, i))
        source.send(np.asarray(actions), r.env_id)
        ep = jax.device_get(ep)
        for j in np.flatnonzero(ep.ended):
            e = int(ep.env_id[j])
            if np.isnan(scores[e]):
                scores[e] = ep.score[j]
        if not np.isnan(scores).any():
            break
    source.close()
    return scores


def _resolve_xla(env_cfg: EnvConfig) -> bool:
    if env_cfg.xla == "off":
        return False
    works = xla_handle_works(env_cfg)
    if env_cfg.xla == "on" and not works:
        raise RuntimeError(f"env.xla=on but envpool's XLA handle does not work for {env_cfg.id}")
    return works


def build(cfg: DictConfig, seed_offset: int = 0):
    """`(runner, env_cfg)` for a config: the training envpool env, the agent and the compiled parts."""
    env_cfg = env_config(cfg.env)
    if int(cfg.seeds) != 1:
        raise ConfigError(f"the Sebulba (envpool) runner trains one seed per run, got seeds={cfg.seeds}; "
                          "launch one run per seed (e.g. hydra -m seed=0,1,2)")
    source = build_source(env_cfg, int(cfg.num_envs), seed=int(cfg.seed) + seed_offset)
    agent = make_agent(cfg.agent, obs_shape=source.obs_shape, obs_dtype=source.obs_dtype,
                       num_actions=source.num_actions, num_envs=source.num_envs)
    return Sebulba(agent, source, env_cfg.recvs_per_chunk, _resolve_xla(env_cfg)), env_cfg


def init_state(runner: Sebulba, seed: int):
    """Initial `(agent_state, buffer_state, learner_key, actor_key)`."""
    k_agent, k_learn, k_act = jax.random.split(jax.random.PRNGKey(seed), 3)
    obs = runner.source.obs_example()
    # Jitted (eager network init is slow), then copied: leaves that share a buffer (e.g. target params =
    # params at init) cannot be donated together.
    agent_state = runner.copy(jax.jit(runner.agent.init)(k_agent, obs))
    buffer_state = runner.copy(jax.jit(lambda: runner.agent.buffer.init(runner.agent.step_prototype(obs)))())
    return agent_state, buffer_state, k_learn, k_act


def train(cfg: DictConfig, logger) -> dict:
    """Train `cfg.agent` on envpool `cfg.env` with the Sebulba runner (see the module docstring)."""
    runner, env_cfg = build(cfg)
    agent_state, buffer_state, key, actor_key = init_state(runner, int(cfg.seed))
    env_steps, wandb_id, history = 0, None, []
    if cfg.resume:
        meta = checkpoint.read_meta(cfg.resume)
        check_resumable(meta["config"], cfg)
        target = {"agent": agent_state, "buffer": buffer_state, "key": key, "actor_key": actor_key,
                  "env_steps": jnp.zeros((), jnp.int32)}
        state, meta = checkpoint.restore(cfg.resume, jax.eval_shape(lambda: target))
        agent_state, buffer_state, key = state["agent"], state["buffer"], state["key"]
        # A fresh actor key per resumption: the envs restart anyway.
        actor_key = jax.random.fold_in(state["actor_key"], int(state["env_steps"]))
        env_steps = int(state["env_steps"])
        wandb_id, history = meta.get("wandb_id"), meta.get("history", [])
    logger.start(start_step=env_steps, num_seeds=1, wandb_id=wandb_id, history=history)
    mode = "XLA handle" if runner.use_xla else "host loop"
    logger.note(f"sebulba: {env_cfg.id}, {runner.num_envs} envs, {runner.batch} per recv, {mode}, "
                f"{runner.steps_per_chunk} env steps per chunk")
    if cfg.resume:
        logger.note(f"resumed from {Path(cfg.resume).absolute()} at env step {env_steps}")

    total = int(cfg.total_steps)
    log_every, ckpt_every = int(cfg.log_interval), int(cfg.checkpoint.interval)
    ckpt_dir = logger.run_dir / "checkpoints"
    box = {"last_log": env_steps, "last": {}, "ckpt": None, "t0": time.perf_counter(), "first": True}

    def save(step, state):
        agent_state, buffer_state, key = state
        box["ckpt"] = checkpoint.save(
            ckpt_dir, step, {"agent": agent_state, "buffer": buffer_state, "key": key, "actor_key": actor_key,
                             "env_steps": jnp.asarray(step, jnp.int32)},
            checkpoint.make_meta(cfg, step, logger), keep=int(cfg.checkpoint.keep))

    def on_chunk(step, state, totals):
        before = step - runner.steps_per_chunk
        if step // log_every > box["last_log"] // log_every or step >= total:
            out = summarise(totals)
            if box["first"]:
                logger.note(f"first log (compile + {step - box['last_log']} env steps): "
                            f"{time.perf_counter() - box['t0']:.1f}s")
                box["first"] = False
            logger.log(step, out)
            box["last"], box["last_log"] = out, step
            totals = runner.zero_totals(state[0], state[1])
        if cfg.checkpoint.enabled and ckpt_every and step // ckpt_every > before // ckpt_every:
            save(step, state)
        return totals

    agent_state, buffer_state, key, env_steps, _ = run_loop(
        runner, agent_state, buffer_state, key, actor_key, env_steps, total, env_cfg.sync_interval,
        env_cfg.queue_size, on_chunk=on_chunk)
    runner.source.close()
    if cfg.checkpoint.enabled and (box["ckpt"] is None or not str(box["ckpt"]).endswith(f"/{env_steps}")):
        save(env_steps, (agent_state, buffer_state, key))
    if box["ckpt"] is not None:
        logger.paths["checkpoint"] = box["ckpt"]
    eval_returns = np.zeros((1, 0))
    if int(cfg.eval_episodes) > 0:
        scores = evaluate(runner.agent, agent_state, env_cfg, int(cfg.eval_episodes), int(cfg.seed) + 10**6,
                          env_cfg.eval_max_steps)
        eval_returns = scores[None]
        logger.note(f"greedy eval return: {np.nanmean(scores):.1f} over {len(scores)} episodes")
    last = box["last"]
    result = {
        "env_steps": env_steps,
        "eval_returns": eval_returns.tolist(),
        "episode_return": np.asarray(last.get("episode_return", np.full(1, np.nan))).tolist(),
        "checkpoint": None if box["ckpt"] is None else str(box["ckpt"]),
        "run_dir": str(logger.run_dir),
    }
    logger.summary({**result, "eval_return_mean": [float(np.nanmean(r)) if r.size else None for r in eval_returns]})
    result["state"] = {"agent": agent_state, "buffer": buffer_state}
    return result
