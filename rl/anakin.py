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
