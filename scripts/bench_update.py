"""Where a train step's time goes: FLOPs, achieved GFLOP/s against the machine's matmul rate, per component.

    python -m scripts.bench_update                          # DQN (MLP), DQN (MinAtar CNN), Muesli, R2D2 on Breakout-MinAtar
    python -m scripts.bench_update --cases muesli --env asterix-minatar --seeds 3 --steps 20

For each case the Anakin runner is built as `scripts.train` builds it (`agent=<preset> env=<env>
seeds=<seeds>`, the MinAtar presets unless overridden), its buffer filled by the actor half of
`scripts.bench_train` (act + env step + add, past `learning_starts`), then:

* `flops`: XLA's cost analysis of the compiled train step (all vmapped seeds, one step);
* `train_step_ms`: one train step's wall time, the median over `--repeats` jitted scans of `--steps` steps
  (the buffer and agent state donated, as in training);
* `gflops`: flops / train step time, and `matmul_gflops`: a 1024x1024 float32 matmul's rate timed in the
  same process just before (the dense ceiling of this machine for XLA:CPU); `matmul_fraction` their ratio;
* `components`: each named part of the step jitted alone on the same sampled batch (vmapped over seeds),
  its milliseconds and its share of the train step (they overlap where one contains another: see the names;
  DQN and Muesli only, R2D2's is `{}`);
* `replay_ratio`: sampled transitions per env step (batch x sequence length x updates per train step /
  (num_envs x train_interval)); the MinAtar paper's DQN (batch 32 every env step) has 32.

One JSON object per case is printed (its last lines). Timings are wall clock on a possibly shared machine:
pause other jobs for figures to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from agents.experiment import build, validate
from agents.setup import compose
from scripts.bench_train import Halves, _block

CASES = {  # name -> training overrides (besides env and seeds)
    "dqn": ["agent=dqn"],
    "dqn_cnn": ["agent=dqn", "agent.network.torso=small_cnn"],
    "muesli": ["agent=muesli"],
    "r2d2": ["agent=r2d2"],
}
PAPER_DQN_REPLAY_RATIO = 32  # Young & Tian 2019: batch 32, one update per env step


def _timed(fn, *args, n: int) -> float:
    """Milliseconds per call of `jax.jit(fn)(*args)` (compiled and run once first), median of 3 x n calls."""
    fn = jax.jit(fn)
    _block(fn(*args))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        _block(out)
        times.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(times)


def matmul_gflops(size: int = 1024, n: int = 30) -> float:
    """Dense float32 matmul rate of this backend (GFLOP/s), the ceiling the train step is compared with."""
    a = jnp.ones((size, size), jnp.float32)
    ms = _timed(lambda x: x @ x, a, n=n)
    return 2 * size**3 / (ms / 1e3) / 1e9


def replay_ratio(agent) -> float:
    """Sampled transitions per env step."""
    cfg = agent.cfg
    per_sample = cfg.batch_size * getattr(cfg, "sequence_length", 1) * getattr(cfg, "updates_per_train", 1)
    return per_sample / (agent.num_envs * cfg.train_interval)


def _dqn_components(agent, state, buf, keys, n):
    V = jax.vmap
    batch = jax.jit(V(lambda b, k: agent.buffer.sample(b, k, agent.cfg.batch_size)))(buf, keys)
    loss = lambda s, b: agent._loss(s.params, s.target_params, b)[0]
    grads = jax.jit(V(jax.grad(lambda p, t, b: agent._loss(p, t, b)[0])))(state.params, state.target_params, batch)
    torso_in = batch.obs

    def opt(s, g):
        u, o = agent.optimizer.update(g, s.opt_state, s.params)
        return optax.apply_updates(s.params, u), o

    return {
        "buffer sample": _timed(V(lambda b, k: agent.buffer.sample(b, k, agent.cfg.batch_size)), buf, keys, n=n),
        "loss forward (online + target q)": _timed(V(loss), state, batch, n=n),
        "loss gradient (contains the forward)": _timed(
            V(lambda s, b: jax.grad(lambda p: agent._loss(p, s.target_params, b)[0])(s.params)), state, batch, n=n),
        "q network forward on obs (one pass)": _timed(V(lambda s, o: agent.network.apply(s.params, o)), state,
                                                      torso_in, n=n),
        "optimiser": _timed(V(opt), state, grads, n=n),
    }


def _muesli_components(agent, state, buf, keys, n):
    from agents.muesli.networks import MuesliNetwork
    from agents.muesli.targets import unroll_indices

    V, cfg = jax.vmap, agent.cfg
    sample = V(lambda b, k: agent.buffer.sample_mixed(b, k, cfg.batch_size, 1.0 - cfg.replay_fraction))
    smp = jax.jit(sample)(buf, keys)
    batch, valid = smp.data, smp.mask
    represent = lambda p, o: agent._apply(p, MuesliNetwork.represent, o)
    states = jax.jit(V(lambda s, b: represent(s.target_params, b["obs"])))(state, batch)
    targets = jax.jit(V(lambda s, b, v: agent.targets(s, b, v)[0]))(state, batch, valid)
    idx = unroll_indices(cfg.sequence_length, cfg.unroll_steps)

    def unroll_sum(p, x, b):  # the model unroll's outputs, summed so that the gradient flows through all
        pl, vl, rl = agent.unroll(p, x, b["action"][:, idx[:, :-1]])
        return jnp.sum(pl) + jnp.sum(vl) + jnp.sum(rl)

    grad = V(lambda s, t, b, v: jax.grad(agent.loss, has_aux=True)(s.params, t, b, v)[0])
    grads = jax.jit(grad)(state, targets, batch, valid)

    def opt(s, g):
        u, o = agent.optimizer.update(g, s.opt_state, s.params)
        p = optax.apply_updates(s.params, u)
        return p, o, jax.tree_util.tree_map(lambda a, b: a + cfg.target_update_rate * (b - a), s.target_params, p)

    return {
        "buffer sample (online + replay)": _timed(sample, buf, keys, n=n),
        "targets (target net: torso, look-ahead, Retrace, CMPO)": _timed(
            V(lambda s, b, v: agent.targets(s, b, v)[0]), state, batch, valid, n=n),
        "targets: torso + projection": _timed(V(lambda s, b: represent(s.target_params, b["obs"])), state, batch,
                                              n=n),
        "targets: one-step look-ahead (model step x actions)": _timed(
            V(lambda s, x: agent.lookahead(s.target_params, x)), state, states, n=n),
        "loss forward": _timed(V(lambda s, t, b, v: agent.loss(s.params, t, b, v)[0]), state, targets, batch, valid,
                               n=n),
        "loss gradient (contains the forward)": _timed(grad, state, targets, batch, valid, n=n),
        "gradient: torso + projection alone": _timed(
            V(lambda s, b: jax.grad(lambda p: jnp.sum(represent(p, b["obs"])))(s.params)), state, batch, n=n),
        "gradient: model unroll + heads alone": _timed(
            V(lambda s, x, b: jax.grad(unroll_sum)(s.params, x, b)), state, states, batch, n=n),
        "optimiser + target EMA": _timed(V(opt), state, grads, n=n),
    }


COMPONENTS = {"dqn": _dqn_components, "muesli": _muesli_components}


def bench_case(name: str, overrides: list[str], env: str, seeds: int, steps: int, repeats: int) -> dict:
    cfg = compose([*overrides, f"env={env}", f"seeds={seeds}", "total_steps=100000", "logger=none"])
    validate(cfg)
    runner = build(cfg)
    agent = runner.agent
    halves = Halves(runner, seeds, runner.total_iters, steps)
    from rl.infra import sharding

    with sharding.use_mesh(runner.mesh):
        state, _ = _block(runner.init())
        state, _ = _block(halves.actor_fn(state))
        cost = jax.jit(runner._train).lower(state).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops = float(cost.get("flops", float("nan")))
        mm = matmul_gflops()
        step_ms = []
        for _ in range(repeats):  # the learner scan donates the state: refill a fresh one each time
            state, _ = _block(runner.init())
            state, _ = _block(halves.actor_fn(state))
            t0 = time.perf_counter()
            _block(halves.learner_fn(state))
            step_ms.append((time.perf_counter() - t0) / steps * 1e3)
        ms = statistics.median(step_ms)
        state, _ = _block(runner.init())
        state, _ = _block(halves.actor_fn(state))
        keys = jax.random.split(jax.random.PRNGKey(0), seeds)
        components = COMPONENTS.get(cfg.agent.name)  # R2D2: the whole step only
        parts = components(agent, state.agent, state.buffer, keys, max(steps // 2, 3)) if components else {}
    gflops = flops / (ms / 1e3) / 1e9
    return {"case": name, "env": env, "seeds": seeds, "overrides": overrides, "flops": flops, "train_step_ms": ms,
            "gflops": gflops, "matmul_gflops": mm, "matmul_fraction": gflops / mm,
            "replay_ratio": replay_ratio(agent), "paper_dqn_replay_ratio": PAPER_DQN_REPLAY_RATIO,
            "components": {k: {"ms": v, "share": v / ms} for k, v in parts.items()}}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--env", default="breakout-minatar")
    parser.add_argument("--seeds", type=int, default=3, help="vmapped seeds (the suite's 3)")
    parser.add_argument("--steps", type=int, default=20, help="train steps per timed scan")
    parser.add_argument("--repeats", type=int, default=3, help="timed scans (median)")
    args, extra = parser.parse_known_args(argv)
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} cpus); env={args.env}, "
          f"{args.seeds} vmapped seeds", flush=True)
    results = []
    for name in args.cases.split(","):
        r = bench_case(name, CASES[name] + extra, args.env, args.seeds, args.steps, args.repeats)
        print(f"\n[{name}] train step {r['train_step_ms']:.1f} ms, {r['flops'] / 1e9:.2f} GFLOP -> "
              f"{r['gflops']:.1f} GFLOP/s = {100 * r['matmul_fraction']:.0f}% of the {r['matmul_gflops']:.0f} GFLOP/s "
              f"matmul; replay ratio {r['replay_ratio']:.1f} sampled transitions per env step "
              f"(MinAtar paper DQN: {PAPER_DQN_REPLAY_RATIO})", flush=True)
        for part, v in r["components"].items():
            print(f"    {part:58s} {v['ms']:8.2f} ms  {100 * v['share']:5.1f}%")
        results.append(r)
    for r in results:
        print(json.dumps(r), flush=True)
    return results


if __name__ == "__main__":
    main()
