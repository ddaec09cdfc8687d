"""R2D2 proof runs: buffer-op share of a train step, and bsuite MemoryChain memory lengths.

    python -m scripts.r2d2_experiments buffer-share agent=r2d2 env=cartpole [overrides] [--updates N]
    python -m scripts.r2d2_experiments memory-chain --lengths 5,10,20 [--budget 1000000] [overrides]

`buffer-share` fills the buffer of a runner built from the overrides, then times `--updates` jitted train
steps (buffer donated, one seed) against the same number of the train step's buffer part alone
(`buffer.sample` of `batch_size` sequences + `buffer.set_priorities`), and prints the share.

`memory-chain` trains R2D2 (small-task config by default) on gymnax `MemoryChain-bsuite` for each memory
length, evaluating the greedy policy every `--eval-every` env steps on `--eval-episodes` episodes; a length
is solved when the greedy mean return reaches `--solve` (return is +1 for the right answer, -1 for the
wrong one), and training stops there or at `--budget` env steps. Sequence length, burn-in and period scale
with the episode length (memory length + 1) so that the trained part of a sequence holds a whole episode.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from rl.config import compose
from rl.experiment import validate
from rl.runners.totals import summarise


def _block(tree):
    jax.block_until_ready(tree)
    return tree


def buffer_share(overrides: list[str], updates: int) -> dict:
    """Seconds per train step and per sample+set_priorities on a full buffer (one seed, jitted scans)."""
    from rl.experiment import build

    cfg = compose([*overrides, "seeds=1", "logger=none"])
    validate(cfg)
    runner = build(cfg)
    agent = runner.agent
    state, _ = runner.init()
    s = jax.tree_util.tree_map(lambda x: x[0], state)  # one seed
    # fill every row with a few sequences of data: eligibility and sum tree as in a running buffer
    steps = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (runner.num_envs,) + x.shape),
                                   agent.step_prototype(s.obs[0]))
    fill = max(4 * agent.cfg.sequence_length, 1000)
    env_ids = jnp.arange(runner.num_envs)

    def fill_fn(b, key):
        def body(b, k):
            st = {**steps, "reward": jax.random.normal(k, (runner.num_envs,))}
            return agent.buffer.add(b, st, env_ids), None

        return jax.lax.scan(body, b, jax.random.split(key, fill))[0]

    buf = _block(jax.jit(fill_fn, donate_argnums=0)(s.buffer, jax.random.PRNGKey(0)))

    def train_loop(a, b, key):
        def body(c, k):
            a, b = c
            a, b, m = agent.train_step(a, b, k)
            return (a, b), m["loss"]

        return jax.lax.scan(body, (a, b), jax.random.split(key, updates))

    def buffer_loop(b, key):
        def body(b, k):
            sample = agent.buffer.sample(b, k, agent.cfg.batch_size)
            # a priority that reads every gathered leaf, so no part of the sample is optimised away
            touch = sum(jnp.sum(x.astype(jnp.float32), axis=tuple(range(1, x.ndim)))
                        for x in jax.tree_util.tree_leaves(sample.data))
            prio = jnp.abs(touch) * 1e-6 + sample.probabilities
            return agent.buffer.set_priorities(b, sample.slots, prio), prio.sum()

        return jax.lax.scan(body, b, jax.random.split(key, updates))

    out = {}
    copy = jax.jit(lambda t: jax.tree_util.tree_map(jnp.copy, t))
    for name, fn, args in (("train_step", train_loop, (s.agent, buf)), ("buffer_ops", buffer_loop, (buf,))):
        compiled = jax.jit(fn, donate_argnums=tuple(range(len(args)))).lower(*args, jax.random.PRNGKey(1)).compile()
        _block(compiled(*copy(args), jax.random.PRNGKey(1)))  # warm-up run
        fresh = _block(copy(args))
        t0 = time.perf_counter()
        _block(compiled(*fresh, jax.random.PRNGKey(2)))
        out[name] = (time.perf_counter() - t0) / updates
    out["share"] = out["buffer_ops"] / out["train_step"]
    return out


def memory_chain(length: int, budget: int, eval_every: int, eval_episodes: int, solve: float,
                 overrides: list[str], seed: int) -> dict:
    """Train on MemoryChain with `memory_length=length` until solved or `budget` env steps per seed."""
    from rl.experiment import build

    episode = length + 1
    train_len = 2 * episode
    burn_in = min(8, episode)
    cfg = compose([
        "agent=r2d2_small", "env=catch", "env.id=MemoryChain-bsuite", f"+env.params.memory_length={length}",
        f"agent.sequence_length={train_len + burn_in}", f"agent.burn_in={burn_in}", f"agent.period={episode}",
        f"seed={seed}", "seeds=1",
        "logger=none", *overrides,
    ])
    validate(cfg)
    runner = build(cfg)
    state, it = runner.init()
    chunk_iters = max(eval_every // runner.steps_per_iter, 1)
    total_iters = math.ceil(budget / runner.steps_per_iter)
    done_iters, history, t0 = 0, [], time.perf_counter()
    solved_at = None
    while done_iters < total_iters:
        n = min(chunk_iters, total_iters - done_iters)
        state, it, out = runner.chunk(state, it, runner.zero_totals(state), n)
        done_iters += n
        steps = done_iters * runner.steps_per_iter
        ret = float(runner.evaluate((state, it), eval_episodes, jax.random.PRNGKey(steps)).mean())
        history.append({"env_steps": steps, "greedy_return": ret,
                        "train_return": float(np.nanmean(summarise(out)["episode_return"]))})
        print(f"  memory_length={length} steps={steps} greedy={ret:.3f} "
              f"train={history[-1]['train_return']:.3f} ({time.perf_counter() - t0:.0f}s)", flush=True)
        if ret >= solve:
            solved_at = steps
            break
    return {"memory_length": length, "solved": solved_at is not None, "solved_at": solved_at,
            "history": history, "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("buffer-share", "memory-chain"))
    parser.add_argument("--updates", type=int, default=200, help="buffer-share: timed train steps")
    parser.add_argument("--lengths", default="5,10,20,40", help="memory-chain: memory lengths, in order")
    parser.add_argument("--budget", type=int, default=1_000_000, help="memory-chain: env steps per length")
    parser.add_argument("--eval-every", type=int, default=50_000)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--solve", type=float, default=0.9, help="greedy mean return that counts as solved")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args, overrides = parser.parse_known_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} cpus)", flush=True)
    if args.what == "buffer-share":
        r = buffer_share(overrides, args.updates)
        print(f"train_step {1e3 * r['train_step']:.2f} ms, sample+set_priorities {1e3 * r['buffer_ops']:.3f} ms: "
              f"buffer share {100 * r['share']:.1f}% ({' '.join(overrides)})")
        results = r
    else:
        results = []
        for length in (int(x) for x in args.lengths.split(",")):
            r = memory_chain(length, args.budget, args.eval_every, args.eval_episodes, args.solve, overrides,
                             args.seed)
            results.append(r)
            print(f"memory_length={length}: {'solved at ' + str(r['solved_at']) if r['solved'] else 'not solved'}"
                  f" ({r['wall_s']:.0f}s)", flush=True)
            if not r["solved"]:
                break
        solved = [r["memory_length"] for r in results if r["solved"]]
        print(f"longest memory length solved within {args.budget} steps: {max(solved) if solved else None}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
