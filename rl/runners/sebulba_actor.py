"""The Sebulba actor: the compiled rollout of K recvs and the thread that runs it.

`Rollout(agent, source, recvs_per_chunk, use_xla)` compiles one actor chunk: K x [recv -> `track` -> act
-> `make_step` -> send] (rl/envs/envpool_tracking.py). With `use_xla` the K steps are one `lax.scan` over
envpool's XLA handle inside jit; otherwise one jitted call per recv between the host's `recv()` and
`send()`. Each chunk's per-recv keys come from `fold_in(key, chunk index)` inside jit.

`ActorThread` runs rollouts into a bounded queue until stopped. It acts with the newest agent state
published to its `Mailbox` (the learner donates its own state into every update, so it publishes copies)
and never waits for the learner except on a full queue. Errors are kept and re-raised by `get()` on the
learner's thread.

Several actor threads (`env.actor_threads`): each owns its own envpool env (a slice of the envs, env ids
offset by `env_offset` so its chunks address its own buffer rows), its own tracker and key, and acts on
its own device; each puts its chunks into its own queue, which `Actors.get()` reads in turn. Each thread blocks on
its chunk before queueing it and then moves it to the learner's devices (`to_learner`), so the transfer
runs on the actor's thread; `busy_s` / `blocked_s` count its seconds computing and waiting on a full
queue (the benchmark's starved-or-slow diagnosis).

Shapes: E = num_envs, M = envs per recv, K = recvs per chunk.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rl.envs.envpool_source import EnvpoolSource, Recv
from rl.envs.envpool_tracking import init_tracker, track
from rl.envs.episodes import Episodes
from rl.infra import xla_cpu


@struct.dataclass
class Chunk:
    """What the actor hands the learner for K recvs of M envs: steps `[K, M, ...]`, env_ids / mask `[K, M]`,
    episodes that ended `[K, M]`."""

    steps: Any
    env_ids: jax.Array
    mask: jax.Array
    episodes: Episodes


def new_tracker(agent, agent_state, source: EnvpoolSource, explore: bool = True):
    """A fresh `Tracker` for the envs of `source`, with the agent's carry and (zero) act extras."""
    m = source.batch_size
    obs = jnp.zeros((m,) + source.obs_shape, source.obs_dtype)
    extras = jax.eval_shape(lambda s, o: agent.act(s, o, agent.initial_carry(m), jax.random.PRNGKey(0),
                                                   jnp.arange(m), explore=explore)[2], agent_state, obs)
    extras = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape[1:], x.dtype), extras)
    return init_tracker(source.num_envs, source.obs_example(), agent.initial_carry(source.num_envs), extras)


class Rollout:
    """`rollout(tracker, acting, key, index) -> (tracker, Chunk)`: one actor chunk (see the module doc)."""

    def __init__(self, agent, source: EnvpoolSource, recvs_per_chunk: int, use_xla: bool, env_offset: int = 0):
        self.agent, self.source, self.k, self.use_xla = agent, source, int(recvs_per_chunk), use_xla
        self.env_offset = int(env_offset)  # global id of this source's env 0 (several actor threads)
        self.batch = source.batch_size
        self._keys = jax.jit(self._chunk_keys)
        self._act = jax.jit(self.act_step, donate_argnums=0, compiler_options=xla_cpu.loop_options())
        self._stack = jax.jit(lambda rows: jax.tree_util.tree_map(lambda *x: jnp.stack(x), *rows))
        self._handle = None
        if use_xla:
            self._handle, self._recv, self._send = source.xla()
            self._scan = jax.jit(self._scan_fn, donate_argnums=1, compiler_options=xla_cpu.loop_options())

    def _chunk_keys(self, key, index):
        return jax.random.split(jax.random.fold_in(key, index), self.k)

    def act_step(self, tracker, acting, recv: Recv, key):
        """One recv: bookkeeping, policy, step-format data. Returns (tracker, actions [M], Chunk row)."""
        agent = self.agent
        obs = self.source.observation(jnp.asarray(recv.obs))

        def act(o, carry):
            return agent.act(acting, o, carry, key, recv.env_id)

        tracker, actions, tr, episodes = track(tracker, recv, obs, act, agent.initial_carry(self.batch))
        steps = agent.make_step(tr.obs, tr.action, tr.reward, tr.terminated, tr.truncated, tr.next_obs,
                                tr.carry, tr.extras)
        ids = recv.env_id + self.env_offset if self.env_offset else recv.env_id
        return tracker, actions, Chunk(steps=steps, env_ids=ids, mask=tr.valid, episodes=episodes)

    def _scan_fn(self, handle, tracker, acting, key, index):
        def body(c, k):
            handle, tracker = c
            handle, r = self._recv(handle)
            tracker, actions, row = self.act_step(tracker, acting, r, k)
            return (self._send(handle, actions, r.env_id), tracker), row

        (handle, tracker), chunk = jax.lax.scan(body, (handle, tracker), self._chunk_keys(key, index))
        return handle, tracker, chunk

    def __call__(self, tracker, acting, key, index: int):
        if self.use_xla:
            self._handle, tracker, chunk = self._scan(self._handle, tracker, acting, key, np.int32(index))
            return tracker, chunk
        rows = []
        for k in self._keys(key, np.int32(index)):
            r = self.source.recv()
            tracker, actions, row = self._act(tracker, acting, r, k)
            self.source.send(np.asarray(actions), r.env_id)
            rows.append(row)
        return tracker, self._stack(rows)


class Mailbox:
    """The newest value put, for a reader on another thread (no history, never blocks)."""

    def __init__(self, value):
        self._value, self._lock = value, threading.Lock()

    def put(self, value) -> None:
        with self._lock:
            self._value = value

    def get(self):
        with self._lock:
            return self._value


class ActorThread(threading.Thread):
    """Runs `rollout` into its own queue of at most `queue_size` chunks until `finish()`. `device`: where it acts (tracker and key are put there; the mailbox
    must hold agent states on it); `to_learner(chunk)`: moves a finished chunk to the learner."""

    def __init__(self, rollout: Rollout, tracker, acting: Mailbox, key, queue_size: int, device=None,
                 to_learner=None, name: str = "sebulba-actor"):
        super().__init__(daemon=True, name=name)
        if device is not None:
            tracker, key = jax.device_put((tracker, key), device)
        self.rollout, self.tracker, self.acting, self.key = rollout, tracker, acting, key
        self.chunks: queue.Queue = queue.Queue(maxsize=queue_size)
        self.to_learner = to_learner
        self._stop_event = threading.Event()
        self.error: BaseException | None = None
        self.index = 0  # chunks rolled out (folded into the acting key)
        self.busy_s = 0.0  # seconds producing chunks (rollout until ready, transfer dispatch)
        self.blocked_s = 0.0  # seconds waiting on a full queue (the learner is behind)

    def run(self):
        try:
            self.rollout.source.reset()
            tracker = self.tracker
            while not self._stop_event.is_set():
                t0 = time.perf_counter()
                tracker, chunk = self.rollout(tracker, self.acting.get(), self.key, self.index)
                chunk = jax.block_until_ready(chunk)
                if self.to_learner is not None:
                    chunk = self.to_learner(chunk)
                self.index += 1
                self.busy_s += time.perf_counter() - t0
                while not self._stop_event.is_set():
                    t1 = time.perf_counter()
                    try:
                        self.chunks.put(chunk, timeout=0.05)
                        break
                    except queue.Full:
                        continue
                    finally:  # counted as it goes, so a reader sees it within 50 ms
                        self.blocked_s += time.perf_counter() - t1
        except BaseException as e:  # noqa: BLE001 - handed to the learner thread, which re-raises
            self.error = e
            self._stop_event.set()

    def stop(self) -> None:
        self._stop_event.set()

    def finish(self) -> None:
        self.stop()
        self.join()


class Actors:
    """The actor threads of a session: `get()` takes the next chunk from each thread's own queue in turn
    (round robin, as Cleanba's learner does), so every thread contributes the same number of chunks and
    none can be starved by a faster one (with one shared queue, one thread was seen to fill it nearly
    alone while the other's puts kept timing out)."""

    def __init__(self, threads: list[ActorThread]):
        self.threads = threads
        self.next = 0
        self.wait_s = 0.0  # seconds the learner waited for a chunk (it was starved)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def get(self) -> Chunk:
        t0 = time.perf_counter()
        thread = self.threads[self.next]
        self.next = (self.next + 1) % len(self.threads)
        try:
            while True:
                for t in self.threads:
                    if t.error is not None:
                        raise RuntimeError(f"the Sebulba actor thread {t.name} failed") from t.error
                try:
                    return thread.chunks.get(timeout=0.05)
                except queue.Empty:
                    if not thread.is_alive():
                        raise RuntimeError(f"the Sebulba actor thread {thread.name} stopped without producing a "
                                           "chunk") from None
        finally:
            self.wait_s += time.perf_counter() - t0

    def finish(self) -> None:
        for t in self.threads:
            t.stop()
        for t in self.threads:
            t.join()

    @property
    def error(self) -> BaseException | None:
        return next((t.error for t in self.threads if t.error is not None), None)

    def stats(self) -> dict:
        """Seconds the actors computed / were blocked on a full queue (summed over threads) and the learner
        waited for chunks."""
        return {"actor_busy_s": sum(t.busy_s for t in self.threads),
                "actor_blocked_s": sum(t.blocked_s for t in self.threads), "learner_wait_s": self.wait_s}
