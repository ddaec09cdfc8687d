"""Sebulba throughput: `python -m scripts.bench_sebulba [--tasks CartPole-v1 Pong-v5] [--seconds 10]`.

For each envpool task, in async mode (`--num-envs` envs, `--batch` per recv), prints env steps per second:

1. raw envpool: host loop `recv` -> NumPy random actions -> `send` (and the same inside one jitted scan
   through envpool's XLA handle);
2. our actor loop with buffer writes, learner off: the real Sebulba pipeline (actor thread: per-env
   bookkeeping + DQN policy + step building; learner thread: `buffer.add` by env_id, no train steps),
   with the XLA-handle rollout and with the host loop, each also as a fraction of raw envpool;
   the same with a random policy (`--no-policy` column) isolates the loop's own cost from network inference;
3. full training (DQN, learner on, replay ratio of configs/agent/dqn.yaml) with the faster actor mode.

Every number is taken over a window after a warm-up (compilation excluded). Machine-readable JSON lines
follow the table.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from scripts.bench_common import format_table, print_json_line


def raw_host_sps(task: str, num_envs: int, batch: int, seconds: float) -> float:
    from rl.envpool_env import EnvConfig, build_source

    source = build_source(EnvConfig(id=task), num_envs, seed=0, batch_size=batch)
    env, n_act, rng = source.env, source.num_actions, np.random.default_rng(0)
    env.async_reset()

    def loop(duration):
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < duration:
            for _ in range(100):
                _, _, _, _, info = env.recv()
                ids = info["env_id"]
                env.send(rng.integers(0, n_act, len(ids)), ids)
                steps += len(ids)
        return steps / (time.perf_counter() - t0)

    loop(min(1.0, seconds / 4))
    sps = loop(seconds)
    source.close()
    return sps


def raw_xla_sps(task: str, num_envs: int, batch: int, seconds: float, k: int = 256) -> float:
    from rl.envpool_env import EnvConfig, build_source

    source = build_source(EnvConfig(id=task), num_envs, seed=0, batch_size=batch)
    handle, recv, send = source.xla()

    @jax.jit
    def rollout(handle, key):
        def body(h, k):
            h, r = recv(h)
            return send(h, jax.random.randint(k, r.env_id.shape, 0, source.num_actions), r.env_id), None

        return jax.lax.scan(body, handle, jax.random.split(key, k))[0]

    source.reset()
    handle = jax.block_until_ready(rollout(handle, jax.random.PRNGKey(0)))
    steps, t0, i = 0, time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        i += 1
        handle = jax.block_until_ready(rollout(handle, jax.random.PRNGKey(i)))
        steps += k * batch
    sps = steps / (time.perf_counter() - t0)
    source.close()
    return sps


def pipeline_sps(task: str, num_envs: int, batch: int, seconds: float, xla: bool, learn: bool,
                 policy: bool = True, overrides: tuple[str, ...] = ()) -> float:
    """Env steps per second of a Sebulba session (actor thread + learner) over `seconds` after a warm-up."""
    from rl.config import compose
    from rl.experiment import build

    env_group = {"CartPole-v1": "cartpole", "Pong-v5": "pong", "Breakout-v5": "breakout"}.get(task, "cartpole")
    cfg = compose(["agent=dqn", f"env=envpool/{env_group}", f"env.id={task}", f"num_envs={num_envs}",
                   f"env.batch_size={batch}", f"env.xla={'on' if xla else 'off'}", "agent.learning_starts=1000",
                   *overrides])
    runner = build(cfg)
    if not policy:  # random actions: the loop's own cost, without network inference
        agent = runner.agent

        class RandomPolicy:
            def __getattr__(self, name):
                return getattr(agent, name)

            def act(self, state, obs, carry, key, env_ids, explore=True):
                return jax.random.randint(key, obs.shape[:1], 0, runner.source.num_actions, jnp.int32), carry, {}

        runner.rollout.agent = RandomPolicy()
    marks, warm = [], max(seconds / 3, 2.0)
    state, env_steps = runner.init(), 0
    with runner.session(state, 0, learn=learn) as session:
        while not marks or marks[-1][0] - marks[0][0] <= warm + seconds:
            state, env_steps, _ = session.advance(state, env_steps, env_steps + 1)  # one actor chunk
            marks.append((time.perf_counter(), env_steps))
    start = next(m for m in marks if m[0] - marks[0][0] >= warm)
    if learn:  # measure only once training is on
        assert start[1] >= 1000, "learning must have started within the warm-up window"
    return (marks[-1][1] - start[1]) / (marks[-1][0] - start[0])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["CartPole-v1", "Pong-v5"])
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window per case")
    args = p.parse_args(argv)
    rows, records = [], []
    for task in args.tasks:
        e, b, s = args.num_envs, args.batch, args.seconds
        small = ("agent.buffer_size=20000",) if task.endswith("-v5") else ()
        raw = raw_host_sps(task, e, b, s)
        raw_x = raw_xla_sps(task, e, b, s)
        r = {"task": task, "num_envs": e, "batch": b, "raw_host": raw, "raw_xla": raw_x}
        for mode in ("xla", "host"):
            r[f"actor_{mode}"] = pipeline_sps(task, e, b, s, xla=mode == "xla", learn=False, overrides=small)
            r[f"actor_{mode}_nopolicy"] = pipeline_sps(task, e, b, s, xla=mode == "xla", learn=False, policy=False,
                                                       overrides=small)
        best = "xla" if r["actor_xla"] >= r["actor_host"] else "host"
        r["train_mode"] = best
        r["train"] = pipeline_sps(task, e, b, s, xla=best == "xla", learn=True, overrides=small)
        records.append(r)
        for mode in ("xla", "host"):
            rows.append([task, mode, raw, r[f"actor_{mode}_nopolicy"], r[f"actor_{mode}_nopolicy"] / raw,
                         r[f"actor_{mode}"], r[f"actor_{mode}"] / raw,
                         r["train"] if mode == best else None])
    print(f"env steps per second; {args.num_envs} envs, {args.batch} per recv; raw = envpool host loop with "
          "random actions; fractions are of raw")
    print(format_table(["task", "actor", "raw", "no-policy", "frac", "actor+DQN", "frac", "train (DQN)"], rows))
    for r in records:
        print(f"{r['task']}: raw envpool through the XLA handle (jitted scan, random actions): "
              f"{r['raw_xla']:,.0f} steps/s")
        print_json_line(r)


if __name__ == "__main__":
    main()
