"""The Sebulba runner: envpool in async mode, an actor thread and a learner that own disjoint state.

`Sebulba(cfg, agent, source)` holds the compiled parts of a run for the host loop of rl/loop.py (which
owns resume, logging, checkpoints, faults and evaluation; rl/experiment.py builds the envpool source and
the agent). One process, two threads, one JAX device:

    actor thread (rl/sebulba_actor.py)                  learner (the host loop's thread, rl/sebulba_learner.py)
    owns: envpool env, Tracker, actor key                owns: agent state, buffer state, learner key
    loop: acting = mailbox.get()                         advance(): chunk = actor.get()
          K x [recv -> track/act -> make_step -> send] ->           update(agent, buffer, chunk, n)  (donated)
          queue.put(chunk)   (bounded: Q chunks)                    every `sync_interval` chunks:
                                                                    mailbox.put(copy of the agent state)

* Only the learner touches the buffer and agent state, so the donated update never races a write; the
  actor acts with published copies (policy lag <= Q + sync_interval chunks).
* Env steps count every recv'd step (reset steps too); each recv's steps are written per `env_id` with the
  transition mask of `rl.envpool_source.track`, so every row holds its env's transitions in time order.
* State (what is checkpointed): `{"agent", "buffer", "key", "actor_key"}`. Resuming restores them; envs
  restart with fresh episodes (envpool has no state to save), so a resumed run continues but is not
  bit-identical, and the last step stored per env before the checkpoint is not marked done.
* `evaluate` plays whole greedy episodes in a fresh sync envpool (Atari: the game's raw score over all
  lives).
"""

from __future__ import annotations

import contextlib
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from omegaconf import DictConfig

from rl.config import ConfigError, env_config
from rl.envpool_env import build_source, use_xla
from rl.envpool_source import EnvpoolSource, track
from rl.sebulba_actor import ActorThread, Mailbox, Rollout, new_tracker
from rl.sebulba_learner import Learner, summarise

# Donating the learner key or a step counter XLA cannot reuse only warns; the storage is what matters.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class Sebulba:
    """The compiled parts of a Sebulba run (see the module docstring)."""

    num_seeds = 1

    def __init__(self, cfg: DictConfig, agent, source: EnvpoolSource):
        if int(cfg.seeds) != 1:
            raise ConfigError(f"the Sebulba (envpool) runner trains one seed per run, got seeds={cfg.seeds}; "
                              "launch one run per seed (e.g. hydra -m seed=0,1,2)")
        self.cfg, self.agent, self.source = cfg, agent, source
        self.env_cfg = env_config(cfg.env)
        self.learner = Learner(agent, source.num_envs, cfg.get("on_nonfinite", "stop"))
        self.rollout = Rollout(agent, source, self.env_cfg.recvs_per_chunk, use_xla(self.env_cfg))
        self.steps_per_chunk = self.rollout.k * source.batch_size
        self.copy = jax.jit(lambda s: jax.tree_util.tree_map(jnp.copy, s))
        self.used = False

    # --- host-loop interface (rl/loop.py) ------------------------------------------------------------
    def init(self) -> dict:
        """Initial `{"agent", "buffer", "key", "actor_key"}` from `cfg.seed`."""
        k_agent, k_learn, k_act = jax.random.split(jax.random.PRNGKey(int(self.cfg.seed)), 3)
        obs = self.source.obs_example()
        # Jitted (eager network init is slow), then copied: leaves that share a buffer (e.g. target params =
        # params at init) cannot be donated together.
        agent_state = self.copy(jax.jit(self.agent.init)(k_agent, obs))
        buffer_state = self.copy(jax.jit(lambda: self.agent.buffer.init(self.agent.step_prototype(obs)))())
        return {"agent": agent_state, "buffer": buffer_state, "key": k_learn, "actor_key": k_act}

    def restore_target(self):
        return jax.eval_shape(self.init)

    def place(self, state):
        return state

    def rounded_total(self, total_steps: int) -> int:
        return math.ceil(total_steps / self.steps_per_chunk) * self.steps_per_chunk

    @contextlib.contextmanager
    def session(self, state, env_steps: int, learn: bool = True):
        """Start the actor thread (once per runner: the envpool env cannot be restarted mid-flight); yields
        the object whose `advance` the host loop calls. `learn=False`: no train steps (benchmarks)."""
        if self.used:
            raise RuntimeError("a Sebulba runner runs one session (its envpool env cannot be restarted)")
        self.used = True
        tracker = new_tracker(self.agent, state["agent"], self.source)
        mailbox = Mailbox(jax.block_until_ready(self.copy(state["agent"])))
        # A fresh actor stream per (re)start: the envs restart anyway.
        actor = ActorThread(self.rollout, tracker, mailbox, jax.random.fold_in(state["actor_key"], env_steps),
                            self.env_cfg.queue_size)
        actor.start()
        try:
            yield _Session(self, actor, mailbox, learn)
        finally:
            actor.finish()
            self.source.close()
        if actor.error is not None:
            raise RuntimeError("the Sebulba actor thread failed") from actor.error

    def evaluate(self, state, episodes: int, key: jax.Array) -> np.ndarray:
        """Greedy scores `[1, episodes]`."""
        return evaluate(self.agent, state["agent"], self.env_cfg, episodes, int(self.cfg.seed) + 10**6, key,
                        self.env_cfg.eval_max_steps)[None]


class _Session:
    """The learner side of a running Sebulba session."""

    def __init__(self, runner: Sebulba, actor: ActorThread, mailbox: Mailbox, learn: bool):
        self.runner, self.actor, self.mailbox, self.learn = runner, actor, mailbox, learn
        self.chunks = 0

    def advance(self, state, env_steps: int, until: int):
        """Actor chunks (each written, then trained on) until `until` env steps; returns the log values."""
        r, learner = self.runner, self.runner.learner
        totals = learner.zero_totals(state["agent"], state["buffer"])
        agent, buffer, key = state["agent"], state["buffer"], state["key"]
        while env_steps < until:
            chunk = self.actor.get()
            before, env_steps = env_steps, env_steps + r.steps_per_chunk
            n = learner.updates_due(env_steps) - learner.updates_due(before) if self.learn else 0
            agent, buffer, key, totals = learner.update(agent, buffer, key, totals, chunk, np.int32(n),
                                                        np.int32(env_steps))
            self.chunks += 1
            if self.learn and self.chunks % r.env_cfg.sync_interval == 0:
                self.mailbox.put(jax.block_until_ready(r.copy(agent)))
        return {**state, "agent": agent, "buffer": buffer, "key": key}, env_steps, summarise(totals)


def evaluate(agent, agent_state, env_cfg, episodes: int, seed: int, key: jax.Array,
             max_recvs: int | None = None) -> np.ndarray:
    """Scores `[episodes]` of one whole episode per env of a fresh sync envpool, acting with
    `explore=False`."""
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
