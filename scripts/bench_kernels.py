"""What one training iteration launches: XLA kernels of the compiled programs, per feature, and the peer's.

    python -m scripts.bench_kernels [--seeds 1] [--agents dqn,r2d2,muesli,sebulba] [--target-only]

Counts come from the optimised HLO of each compiled program (`jitted.lower(...).compile().as_text()`) by
scripts/hlo_kernels.py: one iteration of the program's main loop (the body of its `while`; a `lax.cond`
counted as its largest branch, i.e. the train step; nested loops times their trip count), in the categories
fusion / custom_call / gather_scatter / copy / control / other and their total; plus XLA's cost analysis
(`flops`, `bytes_accessed`: a loop body counted once, i.e. one iteration). Kernel counts are exact for a
jax/XLA version and backend; they count launches, not their cost.

Cases (one JSON line each, `{"case", "agent", "what", "seeds", <counts>, "flops", "bytes_accessed"}`):

* `peer`: one iteration of the PureJaxRL-style DQN loop of scripts/bench_train.py (vmapped over seeds:
  its two `lax.cond`s become selects, so learn and target copy run every iteration).
* `dqn/<step>`: one iteration of the Anakin chunk (CartPole, the PureJaxRL preset), cumulatively: `bare`
  (act, env step, buffer add, train step; no metric, no flag, no episode sums), `+metrics` (the train
  metrics summed per seed), `+guard` (non-finite flags), `+totals` (episode sums: every default on; checked
  equal to the runner's own chunk), then `+double_q`, `+n_step` (3-step returns). `dqn/select`: the default
  iteration built as on accelerators (the train step computed and selected, blocks of 32), compiled for the CPU. Evaluation hooks run
  between chunks, not in the iteration: `dqn/eval` counts one greedy evaluation program (its loop
  iteration: one vector env step of the evaluation envs).
* `<agent>/train_bare`, `<agent>/train` (r2d2, muesli, dqn): the whole compiled train step of every seed
  (`program_counts`), the agent's own `train_step` with its metrics dropped, then the runner's (guarded, its
  metrics cast to float32).
* `sebulba/update`: one Sebulba learner update (rl/runners/sebulba_learner.py) of one recv of CartPole steps
  and one train step, as a whole program.

The last line is the summary `{"ours", "peer", "ratio"}` (DQN default iteration / peer iteration, totals).
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
from flax import struct

from agents.experiment import build, validate
from agents.setup import compose, setup
from rl.infra import xla_cpu
from rl.runners.guard import guard
from rl.runners.totals import Totals
from scripts import hlo_kernels
from scripts.bench_train import PRESETS, make_purejaxrl_dqn

DQN_STEPS = (("bare", ()), ("+metrics", ("metrics",)), ("+guard", ("metrics", "guard")),
             ("+totals", ("metrics", "guard", "totals")))
CONFIG_STEPS = (("+double_q", ["agent.double_q=true"]), ("+n_step", ["agent.double_q=true", "agent.n_step=3"]))
AGENT_ENVS = {"r2d2": "cartpole", "muesli": "cartpole"}


@struct.dataclass
class _Stripped(Totals):
    """`Totals` that drop the episode sums and ignore flags of names they lack (the variants without them)."""

    def add_episodes(self, count, score, length):
        return self

    def flag(self, name, bad, env_step):
        return super().flag(name, bad, env_step) if name in self.bad_names else self


def _record(case: str, what: str, seeds: int, counts: dict, compiled) -> dict:
    return {"case": case, "agent": case.split("/")[0], "what": what, "seeds": seeds, **counts,
            **hlo_kernels.cost(compiled)}


def _runner(agent: str, seeds: int, extra=(), env: str = "cartpole"):
    preset = PRESETS["dqn"] if agent == "dqn" else []
    cfg = compose([f"agent={agent}", f"env={env}", *preset, f"seeds={seeds}", "total_steps=100000", "logger=none",
                   *extra])
    validate(cfg)
    return build(cfg)


def _chunk_compiled(runner, totals=None):
    state, it = jax.eval_shape(runner.init)
    totals = totals if totals is not None else jax.eval_shape(runner.zero_totals, state)
    return runner.chunk.lower(state, it, totals, jax.ShapeDtypeStruct((), jnp.int32)).compile()


def chunk_counts(runner, totals=None) -> tuple[dict, object]:
    """Kernels of one iteration of the runner's compiled chunk (its blocks on accelerators), and the program."""
    compiled = _chunk_compiled(runner, totals)
    return hlo_kernels.iteration_counts(compiled.as_text(), runner.block), compiled


def dqn_variant(seeds: int, features: tuple) -> tuple[dict, object]:
    """Iteration counts of the DQN chunk with only `features` of ("metrics", "guard", "totals") kept: the
    runner's train step and totals replaced here (the product has no switch for them)."""
    runner = _runner("dqn", seeds)
    agent = runner.agent
    if "guard" not in features:
        def step(s, b, k):
            s, b, metrics = agent.train_step(s, b, k)
            return s, b, (metrics if "metrics" in features else {}), {}

        runner.train_step = step
    elif "metrics" not in features:
        raise ValueError("the guard flags the metrics: keep `metrics` with `guard`")
    else:
        runner.train_step = guard(agent.train_step, runner.cfg.on_nonfinite)
    state, _ = jax.eval_shape(runner.init)
    metrics, bad = jax.eval_shape(runner.train, state)[1]
    kind = Totals if "totals" in features else _Stripped
    totals = jax.eval_shape(functools.partial(kind.zeros, runner.num_seeds, tuple(metrics), tuple(bad)))
    return chunk_counts(runner, totals)


def peer(seeds: int) -> dict:
    init, run = make_purejaxrl_dqn()
    carry = jax.eval_shape(jax.vmap(init), jax.random.split(jax.random.PRNGKey(0), seeds))
    compiled = jax.jit(jax.vmap(lambda c: run(c, 100))).lower(carry).compile()
    return _record("peer", "one iteration of the PureJaxRL-style DQN loop", seeds,
                   hlo_kernels.iteration_counts(compiled.as_text()), compiled)


def dqn_cases(seeds: int) -> list[dict]:
    out = []
    for name, features in DQN_STEPS:
        counts, compiled = dqn_variant(seeds, features)
        out.append(_record(f"dqn/{name}", "one iteration of the Anakin chunk", seeds, counts, compiled))
    runner = _runner("dqn", seeds)
    default, compiled = chunk_counts(runner)
    if default != {k: out[-1][k] for k in default}:
        raise AssertionError(f"the +totals variant {out[-1]} differs from the runner's chunk {default}")
    out.append(_record("dqn/default", "one iteration of the runner's own chunk", seeds, default, compiled))
    accelerator = _runner("dqn", seeds)
    accelerator.select, accelerator.block = True, 32  # the accelerator structure, read when the chunk is traced
    counts, compiled = chunk_counts(accelerator)
    out.append(_record("dqn/select", "one iteration as accelerators run it (train step selected, blocks of 32), "
                       "compiled for the CPU", seeds, counts, compiled))
    for name, extra in CONFIG_STEPS:
        counts, compiled = chunk_counts(_runner("dqn", seeds, extra))
        out.append(_record(f"dqn/{name}", "one iteration of the Anakin chunk", seeds, counts, compiled))
    out.append(evaluation(runner))
    return out


def evaluation(runner) -> dict:
    """One greedy evaluation (between chunks, not per iteration): its loop iteration."""
    from rl.envs import make_source
    from rl.runners.evaluate import seeds_evaluator

    fn = seeds_evaluator(runner.agent, make_source(runner.cfg.env, int(runner.cfg.eval_episodes)))
    agent_state = jax.eval_shape(runner.init)[0].agent
    compiled = fn.lower(agent_state, jax.random.PRNGKey(0)).compile()
    return _record("dqn/eval", "one loop iteration of a greedy evaluation (between chunks)",
                   runner.num_seeds, hlo_kernels.iteration_counts(compiled.as_text()), compiled)


def train_cases(agent_name: str, seeds: int) -> list[dict]:
    """The agent's bare train step (metrics dropped) and the runner's guarded one, whole programs."""
    runner = _runner(agent_name, seeds, env=AGENT_ENVS.get(agent_name, "cartpole"))
    agent = runner.agent
    state = jax.eval_shape(runner.init)[0]
    keys = jax.ShapeDtypeStruct((seeds, 2), jnp.uint32)
    bare = jax.jit(jax.vmap(lambda s, b, k: agent.train_step(s, b, k)[:2]))
    opts, out = xla_cpu.loop_options(), []  # as the chunk compiles them
    for what, compiled in (("train_bare", bare.lower(state.agent, state.buffer, keys).compile(opts)),
                           ("train", runner.train.lower(state).compile(opts))):
        out.append(_record(f"{agent_name}/{what}", "one train step of every seed (whole program)", seeds,
                           hlo_kernels.program_counts(compiled.as_text()), compiled))
    return out


def sebulba_case() -> dict:
    """One Sebulba learner update: one recv of CartPole steps written, one guarded train step."""
    from rl.envs.episodes import Episodes
    from rl.runners.sebulba_actor import Chunk
    from rl.runners.sebulba_learner import Learner

    runner = _runner("dqn", 1)
    agent, E = runner.agent, runner.num_envs
    learner = Learner(agent, E)
    state = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                                   jax.eval_shape(runner.init)[0])
    sds = jax.ShapeDtypeStruct
    steps = jax.eval_shape(lambda o: jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (1, E) + x.shape),
                                                             agent.step_prototype(o)),
                           jax.ShapeDtypeStruct(state.obs.shape[1:], state.obs.dtype))
    chunk = Chunk(steps=steps, env_ids=sds((1, E), jnp.int32), mask=sds((1, E), jnp.bool_),
                  episodes=Episodes(ended=sds((1, E), jnp.bool_), score=sds((1, E), jnp.float32),
                                    length=sds((1, E), jnp.int32)))
    totals = jax.eval_shape(learner.zero_totals, state.agent, state.buffer)
    compiled = learner.update.lower(state.agent, state.buffer, state.key, totals, chunk, jnp.bool_(True),
                                    jnp.int32(1), jnp.int32(0)).compile()
    return _record("sebulba/update", "one learner update: one recv written, one train step (whole program)",
                   1, hlo_kernels.program_counts(compiled.as_text()), compiled)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1, help="vmapped seeds of every program (default 1)")
    parser.add_argument("--agents", default="dqn,r2d2,muesli,sebulba",
                        help="comma-separated: dqn (with the peer), r2d2, muesli, sebulba")
    parser.add_argument("--target-only", action="store_true",
                        help="only the peer, the default DQN iteration and the summary line")
    args = parser.parse_args(argv)
    wanted = ["dqn"] if args.target_only else args.agents.split(",")
    setup()  # as every run: jax's unrolled threefry lowering on CPU (rl/infra/xla_cpu.py), the peer's too
    records = []

    def emit(r):
        records.append(r)
        print(json.dumps(r), flush=True)

    if args.target_only:
        emit(peer(args.seeds))
        counts, compiled = chunk_counts(_runner("dqn", args.seeds))
        emit(_record("dqn/default", "one iteration of the runner's own chunk", args.seeds, counts, compiled))
    elif "dqn" in wanted:
        emit(peer(args.seeds))
        for r in dqn_cases(args.seeds):
            emit(r)
        for r in train_cases("dqn", args.seeds):
            emit(r)
    for name in ("r2d2", "muesli"):
        if name in wanted:
            for r in train_cases(name, args.seeds):
                emit(r)
    if "sebulba" in wanted:
        emit(sebulba_case())
    if "dqn" in wanted:
        ours = next(r for r in records if r["case"] == "dqn/default")["total"]
        theirs = records[0]["total"]
        print(json.dumps({"ours": ours, "peer": theirs, "ratio": ours / theirs}), flush=True)
    return records


if __name__ == "__main__":
    main()
