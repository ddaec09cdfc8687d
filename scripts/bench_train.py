"""Training throughput: env steps per second (SPS) of the Anakin runner, compile time reported apart.

    python -m scripts.bench_train agent=dqn env=cartpole [hydra overrides] [--steps N] [--seeds 1,16]

For each seed count it compiles one chunk of the runner's loop (timed), then times `--steps` env steps
per seed (SPS = env steps per seed x seeds / s). It also times the agent's buffer operations alone (the
same number of `add` and `sample` calls in a jitted loop) and reports their share of the training time.

Sequential ceiling: in the same process (`--repeats` times, interleaved with the run; medians) it times
the two halves of an iteration alone, each in one jitted scan, compile excluded: the actor side (act +
env step + buffer add, `train_interval` vector steps per iteration, no train step; this run also fills
the buffer) and the learner side (the agent's guarded
`train_step` on that filled buffer, `--learner-steps` steps). With t_actor = actor seconds per env step and
t_learner = train-step seconds / (num_envs * train_interval), the ceiling of a loop that does one after the
other is 1 / (t_actor + t_learner) env steps per second (times seeds); the run's SPS is printed as a
fraction of it (close to 1: nothing left to gain without overlapping or shrinking the halves; the run's
iterations before `learning_starts` do not train, so a short run can exceed 1). The last lines of output
are one JSON object per seed count, in order: `{"agent", "env", "seeds", "sps", "ceiling_sps",
"ceiling_fraction", "baseline_ratio", "kernels", "kernel_counts", "flops", "bytes_accessed", "peer_kernels",
"peer_kernel_counts", "peer_flops", "peer_bytes_accessed", "kernel_ratio"}` (`baseline_ratio` and the `peer_*`
fields and `kernel_ratio` only with the PureJaxRL-style DQN baseline). `kernels` are the XLA kernels of one
iteration of the compiled loop (a train iteration: a `lax.cond` counted as its train branch), by category in
`kernel_counts`, with XLA's cost analysis of it (scripts/hlo_kernels.py; per feature: scripts/bench_kernels.py).

With `agent=dqn` the PureJaxRL DQN CartPole hyperparameters are applied (`--no-preset` keeps the config's
own): 10 envs, buffer 10k, batch 64, a gradient step every 10 env steps (every vector step), target copy
every 500 env steps (50 updates), lr 2.5e-4, learning starts at 10k, MSE loss, plain (not double) DQN,
a 120-84 MLP. A plain re-implementation of PureJaxRL's DQN loop (flashbax flat buffer, its structure)
runs with the same hyperparameters in the same process, and the ratio of the two SPS is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import chex
import flashbax as fbx
import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agents.experiment import validate
from agents.setup import compose
from rl.runners.totals import summarise
from scripts import hlo_kernels

PRESETS = {
    "dqn": [
        "num_envs=10", "agent.buffer_size=10000", "agent.batch_size=64", "agent.train_interval=1",
        "agent.updates_per_train=1", "agent.target_update_period=50", "agent.tau=1.0", "agent.optim.lr=2.5e-4",
        "agent.optim.max_grad_norm=0.0", "agent.learning_starts=10000", "agent.epsilon_start=1.0",
        "agent.epsilon_end=0.05", "agent.epsilon_decay_steps=250000", "agent.discount=0.99", "agent.n_step=1",
        "agent.loss=mse", "agent.double_q=false", "agent.network.hidden_sizes=[120,84]",
        "agent.network.dueling=false", "agent.priority_exponent=null",
    ],
}


# --- a plain re-implementation of PureJaxRL's DQN loop (baseline) -------------------------------------
class _QNet(nn.Module):
    num_actions: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.num_actions)(x)


@chex.dataclass(frozen=True)
class _Transition:
    obs: chex.Array
    action: chex.Array
    reward: chex.Array
    done: chex.Array


def make_purejaxrl_dqn(env_id: str = "CartPole-v1", num_envs: int = 10, buffer_size: int = 10_000,
                       batch_size: int = 64, lr: float = 2.5e-4, gamma: float = 0.99,
                       learning_starts: int = 10_000, training_interval: int = 10,
                       target_update_interval: int = 500, eps_start: float = 1.0, eps_end: float = 0.05,
                       eps_anneal: int = 250_000):
    """`(init(key) -> runner_state, run(runner_state, num_updates) -> (runner_state, returns))` following
    PureJaxRL's DQN: one vector env step per update step, flashbax flat buffer of (obs, action, reward,
    done) with next obs from the following entry, learning when timesteps % interval == 0."""
    env, params = gymnax.make(env_id)
    net = _QNet(env.num_actions)
    tx = optax.adam(lr)
    buffer = fbx.make_flat_buffer(max_length=buffer_size, min_length=batch_size, sample_batch_size=batch_size,
                                  add_sequences=False, add_batch_size=num_envs)

    def init(key):
        k_env, k_net, key = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, num_envs), params)
        p = net.init(k_net, obs[0])
        proto = _Transition(obs=obs[0], action=jnp.int32(0), reward=jnp.float32(0), done=jnp.bool_(False))
        ts = {"params": p, "target": p, "opt": tx.init(p), "timesteps": jnp.int32(0), "updates": jnp.int32(0)}
        return ts, buffer.init(proto), env_state, obs, key, jnp.zeros(num_envs), jnp.zeros(num_envs)

    def update_step(carry, _):
        ts, bstate, env_state, last_obs, key, ep_ret, last_ret = carry
        key, k_a, k_e, k_s, k_l = jax.random.split(key, 5)
        q = net.apply(ts["params"], last_obs)
        eps = jnp.clip(eps_start + (eps_end - eps_start) * ts["timesteps"] / eps_anneal, eps_end, eps_start)
        greedy = jnp.argmax(q, -1)
        rand = jax.random.randint(k_a, greedy.shape, 0, env.num_actions)
        action = jnp.where(jax.random.uniform(k_e, greedy.shape) < eps, rand, greedy)
        obs, env_state, reward, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_s, num_envs), env_state, action, params)
        done = term | trunc
        ep_ret = ep_ret + reward
        last_ret = jnp.where(done, ep_ret, last_ret)
        ep_ret = jnp.where(done, 0.0, ep_ret)
        ts = {**ts, "timesteps": ts["timesteps"] + num_envs}
        bstate = buffer.add(bstate, _Transition(obs=last_obs, action=action, reward=reward, done=done))

        def learn(ts):
            batch = buffer.sample(bstate, k_l).experience
            q_next = jnp.max(net.apply(ts["target"], batch.second.obs), -1)
            target = batch.first.reward + (1 - batch.first.done) * gamma * q_next

            def loss_fn(p):
                qv = net.apply(p, batch.first.obs)
                chosen = jnp.take_along_axis(qv, batch.first.action[:, None], -1)[:, 0]
                return jnp.mean((chosen - target) ** 2)

            grads = jax.grad(loss_fn)(ts["params"])
            upd, opt = tx.update(grads, ts["opt"], ts["params"])
            return {**ts, "params": optax.apply_updates(ts["params"], upd), "opt": opt,
                    "updates": ts["updates"] + 1}

        learn_time = (buffer.can_sample(bstate) & (ts["timesteps"] > learning_starts)
                      & (ts["timesteps"] % training_interval == 0))
        ts = jax.lax.cond(learn_time, learn, lambda ts: ts, ts)
        ts = jax.lax.cond(ts["timesteps"] % target_update_interval == 0,
                          lambda ts: {**ts, "target": optax.incremental_update(ts["params"], ts["target"], 1.0)},
                          lambda ts: ts, ts)
        return (ts, bstate, env_state, obs, key, ep_ret, last_ret), None

    def run(carry, num_updates: int):
        carry, _ = jax.lax.scan(update_step, carry, None, num_updates)
        return carry, carry[-1]

    return init, run


# --- timing -------------------------------------------------------------------------------------------
def _block(tree):
    jax.block_until_ready(tree)
    return tree


def bench_runner(overrides: list[str], seeds: int, steps: int, learner_steps: int = 0, repeats: int = 1) -> dict:
    """Compile time and SPS of the Anakin runner for `steps` env steps per seed; with `learner_steps`, also
    the actor and learner halves alone and the sequential ceiling (`bench_halves`). With `repeats > 1` the
    whole run and the two halves are timed `repeats` times, interleaved (run, actor, learner, run, ...), so
    that load from other processes hits them alike; medians are reported."""
    from agents.experiment import build

    cfg = compose([*overrides, f"seeds={seeds}", f"total_steps={steps}", "logger=none"])
    validate(cfg)
    runner = build(cfg)
    iters = runner.total_iters
    state, it = _block(runner.init())
    t0 = time.perf_counter()
    compiled = runner.chunk.lower(state, it, runner.zero_totals(state), jnp.int32(iters)).compile()
    compile_s = time.perf_counter() - t0
    halves = Halves(runner, seeds, iters, learner_steps) if learner_steps else None
    run_times, actor_times, learner_times = [], [], []
    for r in range(repeats):
        if r:
            state, it = _block(runner.init())
        totals = _block(runner.zero_totals(state))
        t0 = time.perf_counter()
        state, it, totals = _block(compiled(state, it, totals, jnp.int32(iters)))
        run_times.append(time.perf_counter() - t0)
        if halves is not None:
            a, l = halves.time()
            actor_times.append(a)
            learner_times.append(l)
    run_s = float(np.median(run_times))
    env_steps = iters * runner.steps_per_iter
    result = {"seeds": seeds, "compile_s": compile_s, "run_s": run_s, "run_s_all": run_times, "env_steps": env_steps,
              "sps": env_steps * seeds / run_s, "sps_per_seed": env_steps / run_s,
              "return": np.asarray(summarise(totals)["episode_return"]).tolist(),
              **kernel_fields(compiled, runner.block)}
    result.update(bench_buffer(runner, iters, seeds))
    result["buffer_share"] = (result["buffer_add_s"] + result["buffer_sample_s"]) / run_s
    if halves is not None:
        result.update(halves.result(float(np.median(actor_times)), float(np.median(learner_times))))
        result["ceiling_fraction"] = result["sps"] / result["ceiling_sps"]
        # The same bound for this run's schedule (no train step before `learning_starts`).
        trained = max(iters - runner.learn_iter + 1, 0)
        bound_s = env_steps * seeds * result["t_actor_per_env_step"] + trained * result["t_train_step"]
        result["schedule_ceiling_fraction"] = result["sps"] / (env_steps * seeds / bound_s)
    return result


class Halves:
    """The actor side and the learner side of the runner's iteration, each alone in one jitted scan
    (compiled once here), and the sequential ceiling `1 / (t_actor + t_learner)` in env steps per second
    (all seeds). `time()` runs the actor for `max(min(iters, 5000), fill)` iterations from a fresh state,
    `fill` enough to reach `learning_starts` and for the buffer to sample, then `learner_steps` train steps
    (every seed) on that buffer; returns the two wall times."""

    def __init__(self, runner, seeds: int, iters: int, learner_steps: int):
        from rl.infra import sharding, xla_cpu

        self.runner, self.seeds, self.learner_steps = runner, seeds, learner_steps
        agent = runner.agent
        self.per_iter = per_iter = runner.steps_per_iter  # env steps per seed per iteration
        fill = math.ceil(max(int(agent.learning_starts), int(getattr(agent, "batch_size", 1) or 1)) / per_iter) + 1
        self.actor_iters = actor_iters = max(min(iters, 5000), fill)

        def actor(s):
            def body(s, _):
                s, finished = sharding.vmap_seeds(runner._collect)(s)
                return s, jax.tree_util.tree_map(jnp.sum, finished)  # consumed: nothing is optimised away

            return jax.lax.scan(body, s, None, actor_iters)

        def learner(s):
            def body(s, _):
                s, (metrics, _) = runner._train(s)
                return s, jax.tree_util.tree_map(jnp.sum, metrics)

            return jax.lax.scan(body, s, None, learner_steps)

        opts = xla_cpu.loop_options()  # compiled as the runner's chunk is
        with sharding.use_mesh(runner.mesh):
            state, _ = _block(runner.init())
            self.actor_fn = jax.jit(actor, donate_argnums=0, compiler_options=opts).lower(state).compile()
            state, _ = _block(self.actor_fn(state))
            first = jax.tree_util.tree_map(lambda x: x[0], state.buffer)
            if not bool(agent.buffer.can_sample(first)):
                raise RuntimeError(f"the buffer cannot sample after {actor_iters} actor iterations")
            self.learner_fn = jax.jit(learner, donate_argnums=0, compiler_options=opts).lower(state).compile()

    def time(self) -> tuple[float, float]:
        from rl.infra import sharding

        with sharding.use_mesh(self.runner.mesh):
            state, _ = _block(self.runner.init())
            t0 = time.perf_counter()
            state, _ = _block(self.actor_fn(state))
            actor_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            _block(self.learner_fn(state))
            return actor_s, time.perf_counter() - t0

    def result(self, actor_s: float, learner_s: float) -> dict:
        t_actor = actor_s / (self.actor_iters * self.per_iter * self.seeds)  # seconds per env step (all seeds)
        t_train = learner_s / self.learner_steps  # seconds per train step of every seed
        t_learner = t_train / (self.per_iter * self.seeds)  # = train step time / (num_envs * train_interval)
        return {"actor_iters": self.actor_iters, "actor_s": actor_s, "learner_steps": self.learner_steps,
                "learner_s": learner_s, "t_actor_per_env_step": t_actor, "t_train_step": t_train,
                "t_learner_per_env_step": t_learner, "actor_sps": 1 / t_actor, "ceiling_sps": 1 / (t_actor + t_learner)}


def bench_buffer(runner, iters: int, seeds: int) -> dict:
    """Seconds for the buffer ops of `iters` iterations alone: `train_interval` adds of `num_envs` steps
    and one sample of `agent.batch_size` (when the agent has one) per iteration, vmapped over seeds."""
    agent, E = runner.agent, runner.num_envs
    state, _ = runner.init()
    buf = state.buffer
    steps = jax.tree_util.tree_map(
        lambda x: jnp.broadcast_to(x, (seeds, E) + x.shape), agent.step_prototype(state.obs[0, 0]))
    env_ids = jnp.arange(E)

    def adds(b):
        def body(b, _):
            return jax.vmap(lambda bb, st: agent.buffer.add(bb, st, env_ids))(b, steps), None

        return jax.lax.scan(body, b, None, iters * agent.train_interval)[0]

    add_fn = jax.jit(adds, donate_argnums=0).lower(buf).compile()
    t0 = time.perf_counter()
    buf = _block(add_fn(buf))
    add_s = time.perf_counter() - t0
    sample_s = 0.0
    batch = getattr(agent, "batch_size", None)
    if batch:
        def samples(b, key):
            def body(key, _):
                key, k = jax.random.split(key)
                ks = jax.random.split(k, seeds)
                out = jax.vmap(lambda bb, kk: agent.buffer.sample(bb, kk, batch))(b, ks)
                return key, jax.tree_util.tree_map(lambda x: x.ravel()[0].astype(jnp.float32), out)

            return jax.lax.scan(body, key, None, iters)[1]

        sample_fn = jax.jit(samples).lower(buf, jax.random.PRNGKey(0)).compile()
        t0 = time.perf_counter()
        _block(sample_fn(buf, jax.random.PRNGKey(0)))
        sample_s = time.perf_counter() - t0
    return {"buffer_add_s": add_s, "buffer_sample_s": sample_s}


def bench_baseline(seeds: int, steps: int, **kwargs) -> dict:
    """Compile time and SPS of the PureJaxRL-style loop (vmapped over seeds like the runner)."""
    init, run = make_purejaxrl_dqn(**kwargs)
    num_envs = kwargs.get("num_envs", 10)
    updates = -(-steps // num_envs)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    carry = _block(jax.jit(jax.vmap(init))(keys))
    fn = jax.jit(jax.vmap(lambda c: run(c, updates)), donate_argnums=0)
    t0 = time.perf_counter()
    compiled = fn.lower(carry).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    carry, last_ret = _block(compiled(carry))
    run_s = time.perf_counter() - t0
    env_steps = updates * num_envs
    return {"seeds": seeds, "compile_s": compile_s, "run_s": run_s, "env_steps": env_steps,
            "sps": env_steps * seeds / run_s, "return": np.asarray(last_ret.mean(-1)).tolist(),
            **kernel_fields(compiled)}


def kernel_fields(compiled, block: int = 1) -> dict:
    """`kernels` (total) and `kernel_counts` (by category) of one iteration of a compiled loop (of blocks of
    `block` iterations: the runner on accelerators), and XLA's `flops` / `bytes_accessed` of the program
    (scripts/hlo_kernels.py: what is counted)."""
    counts = hlo_kernels.iteration_counts(compiled.as_text(), block)
    return {"kernels": counts["total"], "kernel_counts": counts, **hlo_kernels.cost(compiled)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed (default 500k)")
    parser.add_argument("--seeds", default="1,16", help="comma-separated vmapped seed counts")
    parser.add_argument("--no-preset", action="store_true", help="keep the config's own hyperparameters")
    parser.add_argument("--no-baseline", action="store_true", help="skip the PureJaxRL-style baseline")
    parser.add_argument("--learner-steps", type=int, default=500,
                        help="train steps timed alone for the sequential ceiling (0: skip it)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="times the run and the two halves are timed, interleaved (medians reported)")
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        parser.error(f"unknown options {bad}; hydra overrides look like key=value")
    agent = next((o.split("=", 1)[1] for o in overrides if o.startswith("agent=")), "dqn")
    env = next((o.split("=", 1)[1] for o in overrides if o.startswith("env=")), "cartpole")
    preset = [] if args.no_preset else PRESETS.get(agent, [])
    overrides = preset + overrides
    baseline = not args.no_baseline and agent == "dqn" and env == "cartpole" and not args.no_preset
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} cpus); agent={agent} env={env}; "
          f"{args.steps} env steps per seed")
    if preset:
        print("preset:", " ".join(preset))
    results = []
    for seeds in (int(s) for s in args.seeds.split(",")):
        r = bench_runner(overrides, seeds, args.steps, args.learner_steps, args.repeats)
        line = (f"[ours]     seeds={seeds:3d}  compile {r['compile_s']:6.1f}s  "
                f"run {r['run_s']:7.2f}s (median of {len(r['run_s_all'])})  "
                f"SPS {r['sps']:12,.0f}  buffer ops {100 * r['buffer_share']:5.1f}% "
                f"(add {r['buffer_add_s']:.2f}s, sample {r['buffer_sample_s']:.2f}s)  "
                f"mean return over the run {np.nanmean(r['return']):.1f}")
        print(line, flush=True)
        if args.learner_steps:
            print(f"[halves]   seeds={seeds:3d}  actor alone {r['actor_sps']:12,.0f} SPS "
                  f"({1e6 * r['t_actor_per_env_step']:.3f} us/env step over {r['actor_iters']} iterations); "
                  f"train step {1e3 * r['t_train_step']:.3f} ms ({1e6 * r['t_learner_per_env_step']:.3f} us/env "
                  f"step over {r['learner_steps']} steps); sequential ceiling {r['ceiling_sps']:12,.0f} SPS; "
                  f"run at {100 * r['ceiling_fraction']:.1f}% of it "
                  f"({100 * r['schedule_ceiling_fraction']:.1f}% of the bound for this run's schedule, which has "
                  f"no train step before learning_starts)", flush=True)
        if baseline:
            b = bench_baseline(seeds, args.steps)
            r["baseline"] = b
            print(f"[purejaxrl] seeds={seeds:3d}  compile {b['compile_s']:6.1f}s  run {b['run_s']:7.2f}s  "
                  f"SPS {b['sps']:12,.0f}  last episode return {np.mean(b['return']):.1f}", flush=True)
            print(f"           ratio ours / purejaxrl-style: {r['sps'] / b['sps']:.2f}x", flush=True)
        results.append(r)
    for r in results:  # the last lines, one per seed count: machine-readable
        record = {"agent": agent, "env": env, "seeds": r["seeds"], "sps": r["sps"],
                  "ceiling_sps": r.get("ceiling_sps"), "ceiling_fraction": r.get("ceiling_fraction")}
        if "baseline" in r:
            record["baseline_ratio"] = r["sps"] / r["baseline"]["sps"]
        record.update({k: r[k] for k in ("kernels", "kernel_counts", "flops", "bytes_accessed")})
        if "baseline" in r:
            b = r["baseline"]
            record.update({"peer_kernels": b["kernels"], "peer_kernel_counts": b["kernel_counts"],
                           "peer_flops": b["flops"], "peer_bytes_accessed": b["bytes_accessed"],
                           "kernel_ratio": r["kernels"] / b["kernels"]})
        print(json.dumps(record), flush=True)
    return results


if __name__ == "__main__":
    main()
