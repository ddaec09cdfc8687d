"""The Sebulba runner: envpool in async mode, an actor thread and a learner that own disjoint state.

`Sebulba(cfg, agent, source)` holds the compiled parts of a run for the host loop of rl/runners/loop.py (which
owns resume, logging, checkpoints, faults and evaluation; agents/experiment.py builds the envpool source and
the agent). One process; by default two threads and one JAX device (several: see below):

    actor thread (rl/runners/sebulba_actor.py)                  learner (the host loop's thread, rl/runners/sebulba_learner.py)
    owns: envpool env, Tracker, actor key                owns: agent state, buffer state, learner key
    loop: acting = mailbox.get()                         advance(): chunk = actor.get()
          K x [recv -> track/act -> make_step -> send] ->           update(agent, buffer, chunk, n)  (donated)
          queue.put(chunk)   (bounded: Q chunks)                    every `sync_interval` chunks:
                                                                    mailbox.put(copy of the agent state)

* Only the learner touches the buffer and agent state, so the donated update never races a write; the
  actor acts with published copies (policy lag <= Q + sync_interval chunks; with T actor threads, chunks
  of each thread).
* Env steps count every recv'd step (reset steps too); each recv's steps are written per `env_id` with the
  transition mask of `rl.envs.envpool_tracking.track`, so every row holds its env's transitions in time order.
* A chunk's train steps run in calls of about `SUBCHUNK_S` seconds (rl/runners/loop.py; one call unless
  they are slow: R2D2 on Atari on a CPU), so a signal is answered between them; the steps still owed for
  the last chunk are part of the state and its env steps are counted once they are done.
* State (what is checkpointed): `SebulbaState` (agent, buffer, learner and actor keys, train steps owed).
  Resuming restores it; envs
  restart with fresh episodes (envpool has no state to save), so a resumed run continues but is not
  bit-identical, and the last step stored per env before the checkpoint is not marked done.
* Several actor threads and devices (`env.actor_threads`, `env.actor_devices`, `env.learner_devices`;
  default: one thread, everything on device 0): thread i owns its own envpool env of `num_envs / T` envs
  (seeds and env ids offset by `i * num_envs / T`, so it writes its own buffer rows) and acts on actor
  device `i % A`; each thread has its own queue of `queue_size` chunks and the learner takes one chunk
  from each thread in turn (balanced env steps per thread; the slowest thread sets the pace). With L > 1
  learner devices the learner's state lives on a `(seed=1, data=L)` mesh of rl/infra/sharding.py (agent state
  and key replicated, buffer split on its first axis where it divides), its update is traced under that mesh, so the agents'
  `shard_batch` splits each sampled batch over the L devices and XLA averages the gradients: the same
  update as on one device up to float summation order. Chunks are moved to the learner devices on the
  actor threads; every `sync_interval` chunks a copy of the agent state is published to every actor
  device. envpool's worker threads (`env.num_threads`, 0: the cores) are split between the T pools.
  Several processes (jax.distributed): each runs its actor threads over its own `num_envs` envs on its
  local actor devices (buffer rows `process x num_envs + i`); the learner's mesh spans the same local
  learner devices of every process, its state is global (agent replicated, buffer rows split), each update
  takes one chunk from every process (`make_array_from_process_local_data`), and a chunk's train steps run
  in one call, so every process makes the same calls.
* `evaluate` plays whole greedy episodes in a fresh sync envpool (rl/runners/evaluate.py: `evaluate_recvs`;
  Atari: the game's raw score over all lives).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rl.config import ConfigError, TrainConfig
from rl.envs.envpool_source import EnvpoolSource, make_source, use_xla
from rl.infra import sharding
from rl.runners import loop
from rl.runners.evaluate import evaluate_recvs
from rl.runners.sebulba_actor import Actors, ActorThread, Mailbox, Rollout, new_tracker
from rl.runners.sebulba_devices import split_devices
from rl.runners.sebulba_learner import Learner


@struct.dataclass
class SebulbaState:
    """What a Sebulba run carries and checkpoints (one seed; on the learner devices). Fields in name order:
    the leaf order of the dict this was before, so older checkpoints restore."""

    actor_key: jax.Array  # the actor threads' key (folded with the env step, process and thread at each start)
    agent: Any  # the agent's state (rl/learning/agent.py)
    buffer: Any  # the replay buffer's state, one row per env of every process
    key: jax.Array  # the learner's key
    owed: jax.Array  # [] int32: train steps still owed for the last chunk written


class Sebulba:
    """The compiled parts of a Sebulba run (see the module docstring)."""

    num_seeds = 1
    cheap_eval = False  # a fresh envpool plays whole episodes on the host (minutes of Atari on a CPU)

    def __init__(self, cfg: TrainConfig, agent, source: EnvpoolSource):
        """`cfg`: the typed config (`agents.experiment.validate`; `cfg.env` an envpool `EnvConfig`); `agent` built
        for the spaces of `source`, this process's envpool envs."""
        if cfg.seeds != 1:
            raise ConfigError(f"the Sebulba (envpool) runner trains one seed per run, got seeds={cfg.seeds}; "
                              "launch one run per seed (e.g. hydra -m seed=0,1,2)")
        self.cfg, self.agent, self.source = cfg, agent, source
        self.processes, self.process = jax.process_count(), jax.process_index()
        self.env_cfg = cfg.env
        threads = self.env_cfg.actor_threads
        num_envs, batch = source.num_envs, source.batch_size
        if num_envs % threads or batch % threads:
            raise ConfigError(f"num_envs={num_envs} and the envs per recv ({batch}, env.envs_per_recv) must both "
                              f"be divisible by env.actor_threads={threads}")
        local = jax.local_devices()
        self.actor_devices, learner = split_devices(self.env_cfg.actor_devices, self.env_cfg.learner_devices, local)
        # Several processes: each learns on the same local devices; the learner mesh spans all of them.
        at = [local.index(d) for d in learner]
        self.learner_devices = [sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)[i]
                                for p in range(self.processes) for i in at]
        self.mesh = sharding.mesh_over(self.learner_devices) if len(self.learner_devices) > 1 else None
        if self.mesh is not None and int(getattr(agent, "batch_size", 0) or 0) % len(self.learner_devices):
            raise ConfigError(f"agent.batch_size={agent.batch_size} is not divisible by the "
                              f"{len(self.learner_devices)} learner devices (env.learner_devices)")
        if self.processes > 1 and batch % len(learner):
            raise ConfigError(f"the envs per recv ({batch}, env.envs_per_recv) must be divisible by the "
                              f"{len(learner)} learner devices of each process (env.learner_devices)")
        self.learner = Learner(agent, num_envs * self.processes, cfg.on_nonfinite)
        self.train_from = self.learner.train_from
        xla = use_xla(self.env_cfg)
        if threads == 1:
            self.sources = [source]
        else:  # one envpool env per thread; env i keeps the seed it has in one pool of num_envs (seed + i)
            # envpool worker threads split between the pools (env.num_threads=0: the cores), so T pools do
            # not start T times the workers the one pool had, which then compete with the learner.
            source.close()
            per = num_envs // threads
            workers = self.env_cfg.num_threads or os.cpu_count() or 1
            pool_cfg = dataclasses.replace(self.env_cfg, num_threads=max(1, -(-workers // threads)))
            self.sources = [make_source(pool_cfg, per, seed=cfg.seed + self.process * num_envs + i * per,
                                        envs_per_recv=batch // threads) for i in range(threads)]
        first = self.process * num_envs  # this process's first buffer row (agents/experiment.py seeds its envs so)
        self.rollouts = [Rollout(agent, src, self.env_cfg.recvs_per_chunk, xla, env_offset=first + i * src.num_envs)
                         for i, src in enumerate(self.sources)]
        self.rollout = self.rollouts[0]
        self.steps_per_chunk = self.rollout.k * self.sources[0].batch_size * self.processes  # all processes
        self.copy = jax.jit(lambda s: jax.tree_util.tree_map(jnp.copy, s))
        self.shardings = None  # set by `init` (the state's structure is needed)
        self.used = False

    # --- placement ----------------------------------------------------------------------------------
    def _shardings(self, state):
        if self.mesh is None:
            one = jax.sharding.SingleDeviceSharding(self.learner_devices[0])
            return jax.tree_util.tree_map(lambda _: one, state)
        return SebulbaState(**{f.name: sharding.leading_shardings(self.mesh, getattr(state, f.name),
                                                                  shard_data=f.name == "buffer")
                               for f in dataclasses.fields(state)})

    def _chunk_sharding(self):
        if self.mesh is None:
            return jax.sharding.SingleDeviceSharding(self.learner_devices[0])
        return sharding.replicated(self.mesh)

    def _to_learner(self):
        """What an actor thread applies to its chunk for the learner (None: nothing). Several processes: the
        global chunk `[K, processes x M, ...]`, each process's recvs on its own learner devices."""
        if self.processes > 1:
            split = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(None, sharding.DATA_AXIS))
            return lambda c: jax.tree_util.tree_map(
                lambda x: jax.make_array_from_process_local_data(split, np.asarray(x)), c)
        if self.mesh is not None or self.actor_devices != self.learner_devices:  # no mesh: one learner device
            target = self._chunk_sharding()
            return lambda c: jax.device_put(c, target)
        return None

    def _local(self, tree):
        """This process's copy of a replicated learner tree (the tree itself with one process)."""
        if self.processes == 1:
            return tree
        return jax.tree_util.tree_map(lambda x: x.addressable_data(0), tree)

    def publish(self, agent_state) -> dict:
        """A copy of the learner's agent state on every actor device (the learner donates its own), waited
        for: the learner thread blocks on its update once per `sync_interval` chunks, so the actors always
        act with finished parameters and overlap the next update (not waiting would make the actors' next
        rollouts wait on the update in flight instead, and hide the learner's time split from the host)."""
        copy = self._local(self.copy(agent_state))
        values = [jax.device_put(copy, d) for d in self.actor_devices]
        return dict(zip(self.actor_devices, jax.block_until_ready(values)))

    # --- host-loop interface (rl/runners/loop.py) ------------------------------------------------------------
    def init(self) -> dict:
        """The initial `SebulbaState` from `cfg.seed`, on the learner devices."""
        k_agent, k_learn, k_act = jax.random.split(jax.random.PRNGKey(self.cfg.seed), 3)
        obs = self.source.obs_example()
        if self.processes > 1:  # every process computes the same state, each keeping its shards of it
            def make():
                return SebulbaState(agent=self.agent.init(k_agent, obs),
                                    buffer=self.agent.buffer.init(self.agent.step_prototype(obs)),
                                    key=k_learn, actor_key=k_act, owed=jnp.zeros((), jnp.int32))

            self.shardings = self._shardings(jax.eval_shape(make))
            return jax.jit(make, out_shardings=self.shardings)()
        # Jitted (eager network init is slow); leaves that share a buffer (target params = params at init, if
        # XLA returns one buffer for both) cannot be donated together, so those are copied (not all: a copy of
        # the whole replay buffer would double the peak memory).
        agent_state = _unshared(jax.jit(self.agent.init)(k_agent, obs))
        buffer_state = _unshared(jax.jit(lambda: self.agent.buffer.init(self.agent.step_prototype(obs)))())
        return self.place(SebulbaState(agent=agent_state, buffer=buffer_state, key=k_learn, actor_key=k_act,
                                       owed=jnp.zeros((), jnp.int32)))

    def restore_target(self):
        target = jax.eval_shape(self.init)
        if self.processes == 1:
            return target
        # each process restores the shards it holds
        return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), target,
                                      self.shardings)

    def place(self, state):
        if self.shardings is None:
            self.shardings = self._shardings(state)
        if self.processes > 1:  # already global arrays in the runner's shardings
            return state
        # Committed even on the default device (no copy): the learner's update then takes every input placed
        # as it returns it and compiles once (a fresh, uncommitted state compiled it again at the second call).
        return jax.device_put(state, self.shardings)

    def rounded_total(self, total_steps: int) -> int:
        return math.ceil(total_steps / self.steps_per_chunk) * self.steps_per_chunk

    @contextlib.contextmanager
    def session(self, state, env_steps: int, learn: bool = True):
        """Start the actor threads (once per runner: the envpool envs cannot be restarted mid-flight); yields
        the object whose `advance` the host loop calls. `learn=False`: no train steps (benchmarks)."""
        if self.used:
            raise RuntimeError("a Sebulba runner runs one session (its envpool env cannot be restarted)")
        self.used = True
        published = self.publish(state.agent)
        mailboxes = {d: Mailbox(v) for d, v in published.items()}
        to_learner = self._to_learner()
        # A fresh actor stream per (re)start (the envs restart anyway), per process and per actor thread.
        key = jax.random.fold_in(jax.random.fold_in(self._local(state.actor_key), env_steps), self.process)
        actors = []
        for i, rollout in enumerate(self.rollouts):
            device = self.actor_devices[i % len(self.actor_devices)]
            tracker = new_tracker(self.agent, published[device], rollout.source)
            actors.append(ActorThread(rollout, tracker, mailboxes[device], jax.random.fold_in(key, i),
                                      self.env_cfg.queue_size,
                                      device=device, to_learner=to_learner, name=f"sebulba-actor-{i}"))
        group = Actors(actors)
        group.start()
        session = _Session(self, group, mailboxes, learn)
        try:
            yield session
        finally:
            group.finish()
            for src in self.sources:
                src.close()
        if group.error is not None:
            raise RuntimeError("the Sebulba actor thread failed") from group.error

    def agent_state(self, state: SebulbaState, row: int = 0):
        """The agent state (one seed: `row` 0)."""
        return state.agent

    def evaluate(self, state, episodes: int, key: jax.Array) -> np.ndarray:
        """Greedy scores `[1, episodes]`."""
        agent_state = jax.device_put(self._local(self.copy(state.agent)), self.actor_devices[0])
        pool = make_source(self.env_cfg, episodes, seed=self.cfg.seed + 10**6, envs_per_recv=episodes)  # sync
        return evaluate_recvs(self.agent, agent_state, pool, key, self.env_cfg.eval_max_steps)[None]


class _Session:
    """The learner side of a running Sebulba session. `stats()`: seconds the learner waited for chunks and
    spent in updates (dispatch to ready, at each publish), and the actors' busy / blocked seconds."""

    def __init__(self, runner: Sebulba, actors: Actors, mailboxes: dict, learn: bool):
        self.runner, self.actors, self.mailboxes, self.learn = runner, actors, mailboxes, learn
        self.chunks = 0
        self.update_s = 0.0
        self.chunk, self.written = None, False  # the last chunk taken from the actors; written to the buffer?

    def advance(self, state, env_steps: int, until: int, totals=None):
        """Actor chunks (each written, then trained on) until `until` env steps (at least one call), or
        until about `SUBCHUNK_S` seconds have passed while a chunk's train steps are still owed; returns the
        state (`owed`: train steps still owed for the last chunk taken, whose env steps are counted once they
        are done), the env steps reached and `totals` (rl/runners/totals.py; None: fresh ones; donated)."""
        r, learner = self.runner, self.runner.learner
        agent, buffer, key = state.agent, state.buffer, state.key
        owed = int(state.owed)
        t_start = time.perf_counter()
        with sharding.use_mesh(r.mesh):
            totals = learner.zero_totals(agent, buffer) if totals is None else totals
            if r.processes > 1:  # fresh, or restored from a checkpoint's JSON: not yet global arrays
                if all(x.is_fully_addressable for x in jax.tree_util.tree_leaves(totals)):
                    totals = sharding.from_host(totals, r._chunk_sharding())
            else:  # placed as the update returns them (else it compiles again for fresh totals)
                totals = jax.device_put(totals, r._chunk_sharding())
            while True:
                write = owed == 0  # else: train steps owed for the chunk written last (or before a resume)
                if self.chunk is None or (write and self.written):
                    self.chunk, self.written = self.actors.get(), False  # (owed after a resume: for its shapes)
                if write:
                    self.written = True
                    owed = learner.updates_due(env_steps + r.steps_per_chunk) - learner.updates_due(env_steps)
                    owed = owed if self.learn else 0
                # Several processes make the same calls: a chunk's steps in one (no per-process timing).
                n = owed if r.processes > 1 else min(owed, learner.cap(loop.SUBCHUNK_S))
                t0 = time.perf_counter()
                agent, buffer, key, totals = learner.update(agent, buffer, key, totals, self.chunk, np.bool_(write),
                                                            np.int32(n), np.int32(env_steps + r.steps_per_chunk))
                if n:
                    jax.block_until_ready(key)
                    learner.record(n, time.perf_counter() - t0)
                owed -= n
                if owed == 0:  # the chunk is done: count it, publish the new parameters
                    env_steps += r.steps_per_chunk
                    self.chunks += 1
                    if self.learn and self.chunks % r.env_cfg.sync_interval == 0:
                        for d, v in r.publish(agent).items():
                            self.mailboxes[d].put(v)
                self.update_s += time.perf_counter() - t0
                if (env_steps >= until and owed == 0) or (owed and r.processes == 1
                                                          and time.perf_counter() - t_start >= loop.SUBCHUNK_S):
                    break
        owed_now = jnp.asarray(owed, jnp.int32)
        if r.processes > 1:  # a global array like the rest of the state (checkpoints save global arrays)
            owed_now = sharding.from_host(np.int32(owed), sharding.replicated(r.mesh))
        return state.replace(agent=agent, buffer=buffer, key=key, owed=owed_now), env_steps, totals

    def stats(self) -> dict:
        return {**self.actors.stats(), "learner_update_s": self.update_s, "chunks": self.chunks}


def _unshared(tree):
    """`tree` with every leaf in a buffer of its own: a leaf whose buffer an earlier leaf holds is copied."""
    seen = set()

    def own(x):
        if isinstance(x, jax.core.Tracer):  # traced (restore_target's eval_shape): no buffers yet
            return x
        ptr = x.unsafe_buffer_pointer()
        if ptr in seen:
            return jnp.copy(x)
        seen.add(ptr)
        return x

    return jax.tree_util.tree_map(own, tree)
