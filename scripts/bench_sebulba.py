"""Sebulba throughput: `python -m scripts.bench_sebulba [--agents dqn r2d2 muesli] [--seconds 10] [overrides]`.

Per agent (default dqn, r2d2, muesli; `agent=<a>` on envpool CartPole picks the vector preset, the same
agent config as on gymnax CartPole), 16 envs, 8 per recv, `agent.learning_starts=1000`:

1. Sebulba training SPS on envpool CartPole (actor thread + learner, replay ratio of the agent's config),
   for each actor-thread count of `--threads` (default 1,2; the first is the agent's `sebulba_sps`), with
   where the time goes over the measurement window: the learner's share waiting for chunks (starved: the
   actor is the bottleneck), the actors' share blocked on a full queue (the learner is the bottleneck), and
   the learner's seconds per chunk in update + publish;
2. the same agent's Anakin training SPS on gymnax CartPole (one seed, same num_envs and config), and the
   ratio Sebulba / Anakin.

Extra `key=value` arguments are hydra overrides for the Sebulba runs (e.g. `env.recvs_per_chunk=32`, or
with `XLA_FLAGS=--xla_force_host_platform_device_count=3`: `env.actor_devices=2 env.learner_devices=1`).
The output ends with one JSON line per agent `{"agent", "sebulba_sps", "anakin_sps", "ratio", ...}`.

`--tasks CartPole-v1 Pong-v5` adds the earlier envpool table before it: per task, in async mode (`--num-envs`
envs, `--batch` per recv), raw envpool (host loop with random actions; the jitted XLA-handle scan), our
actor loop with buffer writes and the learner off (XLA-handle and host-loop actors, with the DQN policy
and with a random one), and DQN training with the faster actor mode.

Every number is taken over a window after a warm-up (compilation excluded). The machine's load changes
them: compare numbers of one run only.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from scripts.bench_common import format_table, print_json_line


def raw_host_sps(task: str, num_envs: int, batch: int, seconds: float) -> float:
    from rl.envs.envpool_source import EnvConfig, make_source

    source = make_source(EnvConfig(id=task), num_envs, seed=0, envs_per_recv=batch)
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
    from rl.envs.envpool_source import EnvConfig, make_source

    source = make_source(EnvConfig(id=task), num_envs, seed=0, envs_per_recv=batch)
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


def pipeline_sps(task: str, num_envs: int, batch: int, seconds: float, xla: bool | None, learn: bool,
                 policy: bool = True, overrides: tuple[str, ...] = (), agent_name: str = "dqn",
                 stats: dict | None = None) -> float:
    """Env steps per second of a Sebulba session (actor thread + learner) over `seconds` after a warm-up.
    `xla=None`: the config's `env.xla` (auto). `stats`: filled with the session's time split over the window
    (`pipeline_stats`)."""
    from agents.experiment import build
    from agents.setup import compose

    env_group = {"CartPole-v1": "cartpole", "Pong-v5": "pong", "Breakout-v5": "breakout"}.get(task, "cartpole")
    xla_opt = [] if xla is None else [f"env.xla={'on' if xla else 'off'}"]
    cfg = compose([f"agent={agent_name}", f"env=envpool/{env_group}", f"env.id={task}", f"num_envs={num_envs}",
                   f"env.envs_per_recv={batch}", *xla_opt, "agent.learning_starts=1000", "logger=none",
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
    warm = max(seconds / 3, 2.0)
    state, env_steps = runner.init(), 0
    thr = 1000 + runner.steps_per_chunk if learn else 0  # measure only once training is on

    def mark():
        return time.perf_counter(), env_steps, session.stats()

    with runner.session(state, 0, learn=learn) as session:
        # Warm-up: compiles (the update's first call, any recompile), learning_starts, then `warm` seconds.
        warm_from = None
        while warm_from is None or time.perf_counter() - warm_from < warm:
            state, env_steps, _ = session.advance(state, env_steps, env_steps + 1)  # one actor chunk
            jax.block_until_ready(state.agent)
            if warm_from is None and env_steps >= thr:
                warm_from = time.perf_counter()
        start, end = mark(), None
        while end is None or end[0] - start[0] < seconds or end[1] - start[1] < 3 * runner.steps_per_chunk:
            state, env_steps, _ = session.advance(state, env_steps, env_steps + 1)
            jax.block_until_ready(state.agent)
            end = mark()
    wall = end[0] - start[0]
    if stats is not None:
        stats.update(pipeline_stats(start[2], end[2], wall, len(runner.rollouts)))
        stats["steps_per_chunk"] = runner.steps_per_chunk
    return (end[1] - start[1]) / wall


def pipeline_stats(before: dict, after: dict, wall: float, threads: int) -> dict:
    """Shares of the window's wall time: the learner waiting for chunks (starved), the actors computing and
    blocked on a full queue (mean over threads), and the learner's seconds per chunk in update + publish."""
    d = {k: after[k] - before[k] for k in after}
    chunks = max(d["chunks"], 1)
    return {"learner_wait_share": d["learner_wait_s"] / wall, "learner_update_share": d["learner_update_s"] / wall,
            "actor_busy_share": d["actor_busy_s"] / (threads * wall),
            "actor_blocked_share": d["actor_blocked_s"] / (threads * wall),
            "update_ms_per_chunk": 1e3 * d["learner_update_s"] / chunks,
            "actor_ms_per_chunk": 1e3 * d["actor_busy_s"] / chunks, "chunks": d["chunks"]}


def anakin_sps(agent_name: str, num_envs: int, seconds: float, overrides: tuple[str, ...] = ()) -> float:
    """Training SPS of the Anakin runner, one seed on one device, `agent=<agent_name> env=cartpole` (gymnax
    CartPole-v1), over `seconds` after the compile and `learning_starts` (chunks of ~4k env steps)."""
    from agents.experiment import build
    from agents.setup import compose

    cfg = compose([f"agent={agent_name}", "env=cartpole", f"num_envs={num_envs}", "agent.learning_starts=1000",
                   "mesh.devices=1", "seeds=1", "logger=none", *overrides])
    runner = build(cfg)
    n = max(1, 4096 // runner.steps_per_iter)
    state, it = runner.init()
    with runner.session((state, it), 0):
        fn = runner.chunk.lower(state, it, n).compile()
        env_steps, marks = 0, []
        while (not marks or marks[-1][0] - marks[0][0] <= seconds or len(marks) < 3
               or env_steps < 1000 + 2 * n * runner.steps_per_iter):
            state, it, _ = jax.block_until_ready(fn(state, it))
            env_steps += n * runner.steps_per_iter
            if env_steps >= 1000 + n * runner.steps_per_iter:  # training is on for the whole chunk
                marks.append((time.perf_counter(), env_steps))
    return (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])


def bench_agents(agents: list[str], seconds: float, threads: list[int], overrides: tuple[str, ...],
                 num_envs: int = 16, batch: int = 8) -> list[dict]:
    """Per agent: Sebulba SPS for each actor-thread count (with its time split), Anakin SPS, their ratio."""
    records = []
    for name in agents:
        rec = {"agent": name}
        by_threads, splits = {}, {}
        for t in threads:
            st = {}
            by_threads[t] = pipeline_sps("CartPole-v1", num_envs, batch, seconds, xla=None, learn=True,
                                         overrides=(f"env.actor_threads={t}", *overrides), agent_name=name, stats=st)
            splits[t] = st
            print(f"[sebulba] {name:7s} actor_threads={t}  SPS {by_threads[t]:10,.0f}  "
                  f"learner waits {100 * st['learner_wait_share']:5.1f}%  "
                  f"updating {100 * st['learner_update_share']:5.1f}%"
                  f" ({st['update_ms_per_chunk']:.1f} ms/chunk of {st['steps_per_chunk']} steps)  actors busy "
                  f"{100 * st['actor_busy_share']:5.1f}% ({st['actor_ms_per_chunk']:.1f} ms/chunk) blocked "
                  f"{100 * st['actor_blocked_share']:5.1f}%", flush=True)
        ana = anakin_sps(name, num_envs, seconds)
        print(f"[anakin]  {name:7s} gymnax CartPole, 1 seed  SPS {ana:10,.0f}", flush=True)
        first = threads[0]
        rec.update({"sebulba_sps": by_threads[first], "anakin_sps": ana, "ratio": by_threads[first] / ana,
                    "actor_threads": first, "sebulba_sps_by_threads": {str(k): v for k, v in by_threads.items()},
                    "time_split": {str(k): v for k, v in splits.items()}})
        records.append(rec)
    return records


def bench_tasks(tasks: list[str], num_envs: int, batch: int, seconds: float) -> None:
    """The envpool table (see the module docstring)."""
    rows, records = [], []
    for task in tasks:
        e, b, s = num_envs, batch, seconds
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
    print(f"env steps per second; {num_envs} envs, {batch} per recv; raw = envpool host loop with "
          "random actions; fractions are of raw")
    print(format_table(["task", "actor", "raw", "no-policy", "frac", "actor+DQN", "frac", "train (DQN)"], rows))
    for r in records:
        print(f"{r['task']}: raw envpool through the XLA handle (jitted scan, random actions): "
              f"{r['raw_xla']:,.0f} steps/s")
        print(json.dumps(r, default=float))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", nargs="+", default=["dqn", "r2d2", "muesli"])
    p.add_argument("--threads", default="1,2", help="comma-separated actor-thread counts (env.actor_threads)")
    p.add_argument("--tasks", nargs="*", default=[], help="also the envpool table for these tasks")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window per case")
    args, overrides = p.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-") or "=" not in o]
    if bad:
        p.error(f"unknown arguments {bad}; hydra overrides look like key=value")
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} device(s); "
          f"{args.num_envs} envs, {args.batch} per recv; {args.seconds:g}s windows", flush=True)
    if args.tasks:
        bench_tasks(args.tasks, args.num_envs, args.batch, args.seconds)
    records = bench_agents(args.agents, args.seconds, [int(t) for t in args.threads.split(",")], tuple(overrides),
                           args.num_envs, args.batch)
    for r in records:  # the last lines: one JSON object per agent
        print_json_line(r)
    return records


if __name__ == "__main__":
    main()
