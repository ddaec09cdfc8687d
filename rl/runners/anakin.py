"""The Anakin runner: gymnax envs, acting, buffer writes and train steps in one jitted `lax.scan`.

`Anakin(cfg, agent)` holds the compiled parts of a run for the host loop of rl/runners/loop.py (which owns resume,
logging, checkpoints, faults and evaluation; agents/experiment.py builds the agent and picks the runner):

* state: `(RunnerState, it)`: every seed's agent, buffer, envs, obs, carry, episode statistics and key
  (leading seed axis S), and the iteration counter `it`.
* one iteration = `agent.train_interval` vector env steps (act, env step, buffer add) for every seed, then
  one `agent.train_step` per seed once `agent.learning_starts` env steps have been taken and the buffer
  can sample; `steps_per_iter = num_envs * train_interval` env steps per seed.
* `chunk(state, it, totals, n)`: `n` iterations (a traced count: one compiled program for any `n`) in one
  jitted loop, no host round-trip, adding their per-seed sums to `totals` (rl/runners/totals.py; with, per
  train metric and for the parameters, the first env step where it was NaN/Inf: rl/runners/guard.py). The
  host loop calls it for sub-chunks of a few seconds, so a signal is answered quickly. On accelerators no
  `lax.cond` and blocks of known trip count (`_repeat`): a GPU waits on the host for every conditional's
  predicate and every step of a loop of unknown length, a large share of a small agent's iteration.
* Seeds are vmapped (seed i uses PRNGKey(cfg.seed + i)); a population (rl/learning/population.py) makes
  the axis members x seeds rows, row `m * seeds + j` being member m with seed j. Initialisation maps over
  seeds one at a time: batched LAPACK calls (the orthogonal initialisers' QR) can deadlock XLA:CPU's pool.
* Population-based training (`population.pbt`, rl/learning/pbt.py): the rows also count their finished
  episodes' returns (`RunnerState.pbt`), and the train iterations run in segments that end at PBT events, each
  followed by the event (`_pbt_event`: a gather over the member axis, branched as the train step). `advance`
  ends a compiled call at each event to hand its lineage (M sources, returns, hyperparameters) to `lineage`
  (rl/infra/lineage.py); `row_values` gives the rows' hyperparameters for metrics.csv. Without PBT none runs.
* Resuming from a chunk boundary is bit-exact on CPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rl.config import TrainConfig
from rl.envs import make_source
from rl.envs.episodes import EpisodeStats
from rl.infra import sharding, xla_cpu
from rl.learning import pbt as pbt_lib
from rl.learning.agent import reset_carry
from rl.learning.population import Population
from rl.learning.replay_ratio import ReplayRatio
from rl.runners import guard
from rl.runners.evaluate import seeds_evaluator
from rl.runners.totals import Totals

ACCELERATOR_BLOCK = 32  # iterations per block on accelerators: one host wait per block, not per iteration


@struct.dataclass
class RunnerState:
    """Everything one seed's training carries between env steps (leading seed axis S when batched)."""

    agent: Any
    buffer: Any
    env: Any
    obs: jax.Array  # [E, *obs_shape]
    carry: Any  # the actor's recurrent state, () for feed-forward agents
    stats: EpisodeStats
    key: jax.Array
    pbt: Any = None  # rl/learning/pbt.py PBTState with population-based training, else None (no leaves)


class Anakin:
    """The compiled parts of an Anakin run for one config and agent (see the module docstring)."""

    cheap_eval = True  # greedy episodes vmapped inside jit (rl/runners/evaluate.py)

    def __init__(self, cfg: TrainConfig, agent, source=None):
        """`cfg`: the typed config; `agent` (rl/learning/agent.py) built for `source`'s spaces (default: made here)."""
        self.cfg = cfg
        self.members = agent.members if isinstance(agent, Population) else 1
        self.pbt = agent.pbt if isinstance(agent, Population) else None  # rl/learning/pbt.py PBTConfig or None
        self.lineage = None  # where PBT events go: `write(env_steps, source, returns, hparams)` (per member)
        self.num_seeds = self.members * cfg.seeds  # rows of the seed axis
        self.source = source if source is not None else make_source(cfg.env, cfg.num_envs)
        self.num_envs = self.source.num_envs
        self.agent = agent
        self.train_step = guard.guard(agent.train_step, cfg.on_nonfinite)
        ratio = ReplayRatio.of(agent, self.num_envs)  # one train step per iteration from learn_iter on
        self.steps_per_iter = ratio.env_steps_per_update
        self.learn_iter = ratio.first_update // self.steps_per_iter
        self.train_from = (self.learn_iter - 1) * self.steps_per_iter  # env steps before the first train step
        # Several devices (cfg.mesh): same program, state placed by rl/infra/sharding.py; the host loop runs
        # under `session`, i.e. `sharding.use_mesh(self.mesh)`. One device: mesh and shardings are None.
        self.mesh = sharding.mesh_from_config(cfg.mesh)
        sharding.check_divisible(self.mesh, seeds=self.num_seeds, num_envs=self.num_envs)
        self.state_shardings = None if self.mesh is None else sharding.runner_shardings(self.mesh,
                                                                                        self._abstract_state)
        # Accelerators wait on the host for each `lax.cond` predicate and each step of a loop of unknown length;
        # XLA:CPU reads them for free, and there a cond skips work. Read when the chunk is traced.
        cpu = jax.default_backend() == "cpu"
        self.block = 1 if cpu else ACCELERATOR_BLOCK  # iterations per known-trip-count block (`_repeat`)
        self.select = not cpu  # the train step computed and selected, not under lax.cond
        self._evaluators = {}  # episodes -> jitted greedy evaluation (`evaluate`)

    total_iters = property(lambda self: math.ceil(self.cfg.total_steps / self.steps_per_iter))  # of the whole run

    # --- state --------------------------------------------------------------------------------------
    def _init_one(self, key: jax.Array) -> RunnerState:
        k_agent, k_env, k_run = jax.random.split(key, 3)
        env_state, obs = self.source.reset(k_env)
        agent_state = self.agent.init(k_agent, obs[0])
        buffer_state = self.agent.buffer.init(self.agent.step_prototype(obs[0]))
        return RunnerState(agent=agent_state, buffer=buffer_state, env=env_state, obs=obs,
                           carry=self.agent.initial_carry(self.num_envs),
                           stats=EpisodeStats.zeros(self.num_envs), key=k_run)

    def _init_all(self, seeds: jax.Array) -> RunnerState:
        # lax.map, not vmap: no batched LAPACK calls at init (see the module docstring).
        s = jax.lax.map(lambda s: self._init_one(jax.random.PRNGKey(s)), seeds)
        if self.pbt is not None:
            s = s.replace(pbt=jax.vmap(pbt_lib.PBTState.zeros)(jnp.arange(self.num_seeds) // self.cfg.seeds))
        s = s.replace(agent=self.agent.assign(s.agent)) if isinstance(self.agent, Population) else s
        # Typed as a restore returns it (no weak types, e.g. gymnax's step counter), so a resumed run's state
        # gives the chunk the same program as the fresh one.
        return jax.tree_util.tree_map(lambda x: x.astype(x.dtype), s)

    def init(self) -> tuple[RunnerState, jax.Array]:
        """Initial state of all rows (seed j uses PRNGKey(cfg.seed + j), in every member) and the iteration
        counter."""
        seeds = self.cfg.seed + jnp.arange(self.num_seeds) % self.cfg.seeds
        return self._init_jit(seeds)

    @functools.cached_property
    def _init_jit(self):
        """`_init_all` and a zero counter, jitted once per runner, computed directly into their placement."""
        return jax.jit(lambda seeds: (self._init_all(seeds), jnp.zeros((), jnp.int32)),
                       out_shardings=self.state_placement)

    @functools.cached_property
    def state_placement(self) -> tuple:
        """`placement[:2]` (restores, evaluations, the memory estimate), traced without the train step."""
        return sharding.loop_shardings(self.mesh, self.state_shardings, None)[:2]

    @functools.cached_property
    def placement(self) -> tuple:
        """Where `chunk`'s `(state, it, totals)` go in and come back (rl/infra/sharding.py `loop_shardings`:
        placed alike, the program compiles once per run, fresh or resumed)."""
        return sharding.loop_shardings(self.mesh, self.state_shardings,
                                       jax.eval_shape(self._totals_zeros))

    @functools.cached_property
    def chunk(self):
        """The jitted `_chunk` (state and totals donated; XLA:CPU's loop options)."""
        return jax.jit(self._chunk, donate_argnums=(0, 2), out_shardings=self.placement, compiler_options=xla_cpu.loop_options())

    # --- compiled loop ------------------------------------------------------------------------------
    def _env_step(self, s: RunnerState, _):
        agent, env_ids = self.agent, jnp.arange(self.num_envs)
        key, k_act, k_env = jax.random.split(s.key, 3)
        action, carry, extras = agent.act(s.agent, s.obs, s.carry, k_act, env_ids)
        env_state, ts = self.source.step(s.env, action, k_env)
        step = agent.make_step(s.obs, action, ts.reward, ts.terminated, ts.truncated, ts.next_obs, s.carry,
                               extras)
        buffer_state = agent.buffer.add(s.buffer, step, env_ids)
        done = ts.terminated | ts.truncated
        stats, finished = s.stats.update(ts.reward, done)
        carry = reset_carry(carry, agent.initial_carry(self.num_envs), done)
        s = s.replace(buffer=buffer_state, env=env_state, obs=ts.obs, carry=carry, stats=stats, key=key)
        return s, jax.tree_util.tree_map(jnp.sum, finished)

    def _collect(self, s: RunnerState):
        s, finished = jax.lax.scan(self._env_step, s, None, self.agent.train_interval)
        return s, jax.tree_util.tree_map(jnp.sum, finished)

    @functools.cached_property
    def train(self):
        """`_train` jitted: one trace serves the metric names (`_totals_zeros`), the skipped branch's zeros and
        the chunk (JAX caches a jitted function's trace by input types; Muesli: ~3 s per trace on CPU)."""
        return jax.jit(self._train)

    def _train(self, s: RunnerState):
        keys = jax.vmap(jax.random.split)(s.key)
        agent_state, buffer_state, metrics, bad = sharding.vmap_seeds(self.train_step)(s.agent, s.buffer,
                                                                                       keys[:, 1])
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        return s.replace(agent=agent_state, buffer=buffer_state, key=keys[:, 0]), (metrics, bad)

    def _iteration(self, s: RunnerState, it: jax.Array, totals: Totals, train: bool):
        """One iteration; with `train` also the train step and its sums into `totals` from iteration
        `learn_iter - 1` on where the buffer can sample: under `lax.cond` on CPU, computed and selected on
        accelerators (`select`; XLA folds it away for leaves the step leaves untouched, such as the storage)."""
        s, finished = sharding.vmap_seeds(self._collect)(s)
        totals = totals.add_episodes(finished.count, finished.score, finished.length)
        if self.pbt is not None:
            s = s.replace(pbt=s.pbt.add(finished.count, finished.score))
        if train:
            ready = (it >= self.learn_iter - 1) & self.agent.buffer.can_sample(
                jax.tree_util.tree_map(lambda x: x[0], s.buffer))
            env_step = (it + 1) * self.steps_per_iter
            if self.select:
                trained, (metrics, bad) = self.train(s)
                s = jax.tree_util.tree_map(lambda new, old: jnp.where(ready, new, old), trained, s)
                totals = totals.add_update(metrics, bad, ready, env_step)
            else:
                # The sums are taken inside the branch: its metrics and flags never leave it, so XLA need not
                # write each of them out as a branch result (one kernel apiece on CPU).
                def train(c):
                    s, (metrics, bad) = self.train(c[0])
                    return s, c[1].add_update(metrics, bad, True, env_step)

                s, totals = jax.lax.cond(ready, train, lambda c: c, (s, totals))
        return s, it + 1, totals

    @functools.cached_property
    def _abstract_state(self) -> RunnerState:
        return jax.eval_shape(self._init_all, jnp.arange(self.num_seeds))

    @functools.cached_property
    def _totals_zeros(self):
        """`() -> Totals` of zeros for the train metrics of this agent (their names traced once)."""
        metrics, bad = jax.eval_shape(self.train, self._abstract_state)[1]
        return functools.partial(Totals.zeros, self.num_seeds, tuple(metrics), tuple(bad))

    @functools.cached_property
    def _placed_totals(self):  # `(Totals or None: fresh zeros) -> Totals` placed as `chunk` returns them
        return jax.jit(lambda t: self._totals_zeros() if t is None else t, out_shardings=self.placement[2])

    def zero_totals(self, s: RunnerState) -> Totals:
        """Fresh `Totals` for the train metrics of this agent, placed as `chunk` returns them."""
        return self._placed_totals(None)

    def _chunk(self, s: RunnerState, it: jax.Array, totals: Totals, num_iters: jax.Array):
        """`num_iters` (traced: one compiled program for every length) iterations; returns the state, the
        counter and `totals` with their steps added. Accelerators: collect-only iterations, then train ones (no
        conditional); CPU: one loop whose `lax.cond` also waits for `learn_iter - 1` (one copy of the env step in
        the program: DQN's chunk compiles in ~40% less time, Muesli's ~20%)."""
        carry = (s, it, totals)
        if self.select:
            collect_only = jnp.clip(self.learn_iter - 1 - it, 0, num_iters)
            carry = _repeat(functools.partial(self._iteration, train=False), collect_only, carry, self.block)
            num_iters = num_iters - collect_only
        s, it, totals = self._train_iterations(carry, num_iters)
        totals = guard.check_state(totals, s.agent, it * self.steps_per_iter)
        return s, it, totals

    def _train_iterations(self, carry, n: jax.Array):
        """`n` train iterations from `carry` = (state, counter, totals); with PBT in segments, each up to the
        next event and followed by it where it reached it."""
        step = functools.partial(self._iteration, train=True)
        if self.pbt is None:
            return _repeat(step, n, carry, self.block)

        def segment(c):
            s, it, totals, left = c
            event = self.next_event(it)
            k = jnp.minimum(left, event - it)
            s, it, totals = _repeat(step, k, (s, it, totals), self.block)
            if self.select:  # as the train step (`_iteration`): no conditional on accelerators
                evented = self._pbt_event(s, it)
                s = jax.tree_util.tree_map(lambda new, old: jnp.where(it == event, new, old), evented, s)
            else:
                s = jax.lax.cond(it == event, self._pbt_event, lambda s, it: s, s, it)
            return s, it, totals, left - k

        s, it, totals, _ = jax.lax.while_loop(lambda c: c[3] > 0, segment, (*carry, n))
        return s, it, totals

    # --- population-based training (rl/learning/pbt.py) ---------------------------------------------------
    def next_event(self, count):
        """The iteration count after which the next PBT event falls (int, or int32 when `count` is traced)."""
        return pbt_lib.next_event(count, self.steps_per_iter, self.pbt.interval, self.learn_iter)

    def _pbt_event(self, s: RunnerState, it: jax.Array) -> RunnerState:
        """The PBT event after iteration `it`: exploit/explore on the rows' agent states and hyperparameters
        (their buffers, envs and keys untouched)."""
        agent, pbt = pbt_lib.event(s.agent, s.pbt, pbt_lib.event_key(self.cfg.seed, it), self.cfg.seeds,
                                   self.pbt.quantile, self.pbt.perturb, self.agent.bounds)
        return s.replace(agent=agent, pbt=pbt)

    def row_values(self, state) -> dict[str, np.ndarray]:
        """Per row `[S]`, logged with its metrics: the current hyperparameters (`hparam/<key>`) under PBT."""
        if self.pbt is None:
            return {}
        return {f"hparam/{k}": np.asarray(v) for k, v in jax.device_get(state[0].agent.hparams).items()}

    def _record_event(self, s: RunnerState, env_steps: int) -> None:
        """Hand the event just taken to `lineage`: per member its source, the return ranked, new values."""
        if self.lineage is None:
            return
        seeds = self.cfg.seeds
        source, recent, hparams = jax.device_get((s.pbt.source, s.pbt.recent, s.agent.hparams))
        self.lineage.write(env_steps, np.asarray(source)[::seeds], np.asarray(recent).reshape(-1, seeds).mean(1),
                           {k: np.asarray(v)[::seeds] for k, v in hparams.items()})

    # --- host-loop interface (rl/runners/loop.py) ------------------------------------------------------------
    def rounded_total(self, total_steps: int) -> int:
        return math.ceil(total_steps / self.steps_per_iter) * self.steps_per_iter

    def restore_target(self):
        return jax.eval_shape(self.init)

    def place(self, state):
        return sharding.place(state, self.state_placement)

    @contextlib.contextmanager
    def session(self, state, env_steps: int):
        with sharding.use_mesh(self.mesh):
            yield self

    def advance(self, state, env_steps: int, until: int, totals: Totals | None = None):
        """Whole iterations up to `until` env steps (at least one) in one compiled call (with PBT, one per event
        reached, its lineage to `lineage`); returns the state, the env steps reached and `totals` (None: fresh
        ones; donated; restored sums placed like the rest, else `chunk` compiles again) with the steps added."""
        s, it = state
        n = max((until - env_steps) // self.steps_per_iter, 1)
        totals = self._placed_totals(totals)
        if self.pbt is None:
            s, it, totals = self.chunk(s, it, totals, np.int32(n))
            return (s, it), env_steps + n * self.steps_per_iter, totals
        count = env_steps // self.steps_per_iter
        end = count + n
        while count < end:  # one call per PBT event, so each event's lineage is read
            event = self.next_event(count)
            k = min(end, event) - count
            s, it, totals = self.chunk(s, it, totals, np.int32(k))
            count += k
            if count == event:
                self._record_event(s, count * self.steps_per_iter)
        return (s, it), count * self.steps_per_iter, totals

    def agent_state(self, state, row: int):
        """Row `row`'s agent state (no seed axis)."""
        return jax.tree_util.tree_map(lambda x: x[row], state[0].agent)

    def evaluate(self, state, episodes: int, key: jax.Array) -> np.ndarray:
        """Greedy returns `[S, episodes]` of every row."""
        if episodes not in self._evaluators:  # compiled once per episode count (evaluations during training)
            self._evaluators[episodes] = seeds_evaluator(self.agent, make_source(self.cfg.env, episodes),
                                                         self.members)
        with sharding.use_mesh(self.mesh):
            returns, _ = self._evaluators[episodes](state[0].agent, key)
        return np.asarray(returns)


def _repeat(step, n: jax.Array, carry, block: int):
    """`carry = step(*carry)` `n` (traced) times. `block > 1`: as `n // block` repeats of a `block`-step loop
    of known trip count, then the rest; an accelerator then syncs on the loop predicate once per block
    instead of once per step (XLA:CPU reads it for free: block 1 there)."""
    once = lambda _, c: step(*c)
    if block > 1:
        carry = jax.lax.fori_loop(0, n // block, lambda _, c: jax.lax.fori_loop(0, block, once, c), carry)
        n = n % block
    return jax.lax.fori_loop(0, n, once, carry)
