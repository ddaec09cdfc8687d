"""The Anakin runner: gymnax envs, acting, buffer writes and train steps in one jitted `lax.scan`.

Runner contract (shared with rl/sebulba.py; scripts/train.py picks the runner from `cfg.env.source`):

    train(cfg: DictConfig, logger: rl.logging.RunLogger) -> dict

`cfg` is the composed hydra config, already checked by `rl.config.validate(cfg)`. Shared keys: `seed`,
`seeds` (vmapped seed count S), `total_steps` (env steps per seed, summed over envs), `num_envs`,
`log_interval` (env steps between host-side logs), `eval_episodes`, `resume` (a run dir or null),
`checkpoint.{enabled,interval,keep}`, `agent` (built by `agents.make_agent`), `env`, `logger`.
A runner must:

1. Build the envs from `cfg.env` and the agent with `agents.make_agent(cfg.agent, obs_shape=...,
   obs_dtype=..., num_actions=..., num_envs=cfg.num_envs)`, then its initial state: agent state
   (`agent.init`), buffer state (`agent.buffer.init(agent.step_prototype(obs))`), env state, carry
   (`agent.initial_carry`), episode statistics, RNG key, env-step counter.
2. If `cfg.resume` is set: `rl.checkpoint.restore(cfg.resume, target)` the whole runner state, check the
   saved config is compatible (`rl.config.check_resumable`) and carry on from the saved step; the result
   must equal the uninterrupted run (bit for bit on CPU for Anakin).
3. `logger.start(start_step=..., num_seeds=S, wandb_id=<saved or None>, history=<saved or []>)`, then,
   after every chunk of about `cfg.log_interval` env steps, `logger.log(env_steps, metrics)` with per-seed
   arrays `[S]`: `episode_return`, `episode_length` (means over episodes finished in the chunk, NaN when
   none finished), `episodes`, plus the agent's train metrics averaged over the chunk, as `train/<name>`.
   No host round-trip inside a chunk.
4. Save `rl.checkpoint.save(logger.run_dir / "checkpoints", env_steps, state, meta)` every
   `cfg.checkpoint.interval` env steps (0: only at the end) and at the end, with `meta` from
   `rl.checkpoint.make_meta(cfg, env_steps, logger)` (config, wandb id, metric history).
5. At the end evaluate the greedy policy for `cfg.eval_episodes` episodes per seed and
   `logger.summary({...})` the result.
6. Return `{"env_steps": int, "eval_returns": [S, K] list, "episode_return": [S] list (last logged),
   "checkpoint": str | None, "run_dir": str}`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from omegaconf import DictConfig, OmegaConf

from agents import make_agent
from rl import checkpoint, sharding
from rl.agent import reset_carry
from rl.config import check_resumable
from rl.evaluate import evaluate_seeds
from rl.gymnax_source import EpisodeStats, make_source


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


class Anakin:
    """The compiled parts of an Anakin run for one config: initial state and `chunk` of iterations.

    One iteration = `agent.train_interval` vector env steps (act, env step, buffer add) for every seed,
    then one `agent.train_step` per seed once `agent.learning_starts` env steps have been taken and the
    buffer can sample. `steps_per_iter = num_envs * train_interval` env steps per seed.
    """

    def __init__(self, cfg: DictConfig, agent=None):
        """`agent`: an object following rl/agent.py to use instead of building `cfg.agent` (tests)."""
        self.cfg = cfg
        self.num_seeds, self.num_envs = int(cfg.seeds), int(cfg.num_envs)
        self.source = make_source(cfg.env, self.num_envs)
        self.agent = agent or make_agent(cfg.agent, obs_shape=self.source.obs_shape,
                                         obs_dtype=self.source.obs_dtype, num_actions=self.source.num_actions,
                                         num_envs=self.num_envs)
        self.steps_per_iter = self.num_envs * int(self.agent.train_interval)
        self.learn_iter = max(math.ceil(self.agent.learning_starts / self.steps_per_iter), 1)
        self.total_iters = math.ceil(int(cfg.total_steps) / self.steps_per_iter)
        # Several devices (cfg.mesh): same program, state placed by rl/sharding.py; `train` traces and runs
        # it under `sharding.use_mesh(self.mesh)`. One device: mesh and shardings are None (plain jit).
        self.mesh = sharding.mesh_from_config(cfg.get("mesh"))
        sharding.check_divisible(self.mesh, seeds=self.num_seeds, num_envs=self.num_envs)
        self.state_shardings = None if self.mesh is None else sharding.runner_shardings(
            self.mesh, jax.eval_shape(self._init_all, jnp.arange(self.num_seeds)))
        self.chunk = jax.jit(self._chunk, static_argnums=2, donate_argnums=0)

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
        return jax.vmap(lambda s: self._init_one(jax.random.PRNGKey(s)))(seeds)

    def init(self) -> tuple[RunnerState, jax.Array]:
        """Initial state of all seeds (seed i uses PRNGKey(cfg.seed + i)) and the iteration counter."""
        seeds = int(self.cfg.seed) + jnp.arange(self.num_seeds)
        state = sharding.init_sharded(self._init_all, self.state_shardings, seeds)
        return state, jnp.zeros((), jnp.int32)

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

    def _train(self, s: RunnerState):
        keys = jax.vmap(jax.random.split)(s.key)
        agent_state, buffer_state, metrics = sharding.vmap_seeds(self.agent.train_step)(s.agent, s.buffer,
                                                                                         keys[:, 1])
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        return s.replace(agent=agent_state, buffer=buffer_state, key=keys[:, 0]), metrics

    def _iteration(self, carry, _):
        s, it = carry
        s, finished = sharding.vmap_seeds(self._collect)(s)
        first_buffer = jax.tree_util.tree_map(lambda x: x[0], s.buffer)
        ready = (it + 1 >= self.learn_iter) & self.agent.buffer.can_sample(first_buffer)
        skipped = jax.tree_util.tree_map(lambda m: jnp.zeros(m.shape, m.dtype),
                                         jax.eval_shape(self._train, s)[1])
        s, metrics = jax.lax.cond(ready, self._train, lambda s: (s, skipped), s)
        return (s, it + 1), (finished, metrics, ready)

    def _chunk(self, s: RunnerState, it: jax.Array, num_iters: int):
        """`num_iters` iterations; returns the state, the counter and per-seed summaries `[S]`."""
        (s, it), (finished, metrics, trained) = jax.lax.scan(self._iteration, (s, it), None, num_iters)
        count = finished["count"].sum(0)
        n_train = trained.sum()
        nan = jnp.float32(jnp.nan)
        out = {
            "episode_return": jnp.where(count > 0, finished["return"].sum(0) / jnp.maximum(count, 1), nan),
            "episode_length": jnp.where(count > 0, finished["length"].sum(0) / jnp.maximum(count, 1), nan),
            "episodes": count,
        }
        for k, v in metrics.items():
            out[f"train/{k}"] = jnp.where(n_train > 0, v.sum(0) / jnp.maximum(n_train, 1), nan)
        return sharding.constrain(s, self.state_shardings), it, out

    # --- evaluation ---------------------------------------------------------------------------------
    def evaluate(self, agent_states, episodes: int, key: jax.Array):
        """Greedy returns `[S, episodes]` of every seed."""
        source = make_source(self.cfg.env, episodes)
        returns, _ = evaluate_seeds(self.agent, agent_states, source, key)
        return np.asarray(returns)


def _restore_target(runner: Anakin):
    return jax.eval_shape(runner.init)


def train(cfg: DictConfig, logger) -> dict:
    """Train `cfg.seeds` seeds of `cfg.agent` on gymnax `cfg.env` (see the module docstring)."""
    runner = Anakin(cfg)
    if runner.mesh is not None:
        logger.note(f"sharded over {sharding.describe(runner.mesh)}")
    with sharding.use_mesh(runner.mesh):
        return _train(cfg, logger, runner)


def _train(cfg: DictConfig, logger, runner: Anakin) -> dict:
    spi = runner.steps_per_iter
    wandb_id, history = None, []
    if cfg.resume:
        meta = checkpoint.read_meta(cfg.resume)
        check_resumable(meta["config"], cfg)
        (state, it), meta = checkpoint.restore(cfg.resume, _restore_target(runner))
        state = sharding.place(state, runner.state_shardings)
        wandb_id, history = meta.get("wandb_id"), meta.get("history", [])
    else:
        state, it = runner.init()
    done_iters = int(it)
    logger.start(start_step=done_iters * spi, num_seeds=runner.num_seeds, wandb_id=wandb_id, history=history)
    if cfg.resume:
        logger.note(f"resumed from {Path(cfg.resume).absolute()} at env step {done_iters * spi}")
    chunk_iters = max(int(cfg.log_interval) // spi, 1)
    ckpt_every = int(cfg.checkpoint.interval)
    ckpt_dir = logger.run_dir / "checkpoints"
    last_ckpt, last, first = None, {}, True
    while done_iters < runner.total_iters:
        n = min(chunk_iters, runner.total_iters - done_iters)
        t0 = time.perf_counter()
        state, it, out = runner.chunk(state, it, n)
        out = sharding.to_host(out)
        if first:
            logger.note(f"first chunk (compile + {n * spi} env steps per seed): {time.perf_counter() - t0:.1f}s")
            first = False
        before, done_iters = done_iters, done_iters + n
        env_steps = done_iters * spi
        logger.log(env_steps, out)
        last = out
        if cfg.checkpoint.enabled and ckpt_every and env_steps // ckpt_every > before * spi // ckpt_every:
            last_ckpt = checkpoint.save(ckpt_dir, env_steps, (state, it), checkpoint.make_meta(cfg, env_steps, logger),
                                        keep=int(cfg.checkpoint.keep))
    env_steps = done_iters * spi
    if cfg.checkpoint.enabled and (last_ckpt is None or not str(last_ckpt).endswith(f"/{env_steps}")):
        last_ckpt = checkpoint.save(ckpt_dir, env_steps, (state, it), checkpoint.make_meta(cfg, env_steps, logger),
                                    keep=int(cfg.checkpoint.keep))
    if last_ckpt is not None:
        logger.paths["checkpoint"] = last_ckpt
    eval_returns = np.zeros((runner.num_seeds, 0))
    if int(cfg.eval_episodes) > 0:
        eval_returns = runner.evaluate(state.agent, int(cfg.eval_episodes), jax.random.PRNGKey(int(cfg.seed) + 10**6))
        logger.note("greedy eval return per seed: " + ", ".join(f"{r:.1f}" for r in eval_returns.mean(1)))
    result = {
        "env_steps": env_steps,
        "eval_returns": eval_returns.tolist(),
        "episode_return": np.asarray(last.get("episode_return", np.full(runner.num_seeds, np.nan))).tolist(),
        "checkpoint": None if last_ckpt is None else str(last_ckpt),
        "run_dir": str(logger.run_dir),
    }
    logger.summary({**result, "eval_return_mean": [float(r.mean()) if r.size else None for r in eval_returns]})
    result["state"] = state
    return result


def restore_agent(run_dir: str | Path, num_eval_envs: int):
    """`(agent, agent_states [S, ...], eval_source)` from the newest checkpoint of a training run."""
    meta = checkpoint.read_meta(run_dir)
    cfg = OmegaConf.create(meta["config"])
    runner = Anakin(cfg)
    (state, _), _ = checkpoint.restore(run_dir, _restore_target(runner))
    return runner.agent, state.agent, make_source(cfg.env, num_eval_envs)
