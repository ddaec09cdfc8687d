"""Benchmark (not a test): the conv torsos' gradient step with XLA's native convs vs rl/nets/conv.py's fast path.

    python -m scripts.bench_conv                       # all torsos, batch 64 (minutes: the IMPALA CNN is slow)
    python -m scripts.bench_conv --torsos minatar,nature --k 10 --repeats 5

One Adam step (loss: mean squared Q error of a 6-action linear head on the torso, like a DQN update) on a
batch of 64 uint8 frames, for the MinAtar CNN (10x10x4), the Nature CNN (84x84x4) and the IMPALA CNN
(84x84x4, Muesli's), each with `conv_impl("native")` (XLA's convolution / reduce-window everywhere) and
`conv_impl("fast")` (what `impl="auto"` picks on CPU). Timed two ways, round-robin in one process
(`scripts.bench_common.time_interleaved`, median over --repeats): "loop" = K steps inside one jitted
`fori_loop`, as the runners and agents take their train steps (the observations differ every step, so
nothing is hoisted out of the loop), and "calls" = K separate jitted calls. A forward-only pass (acting)
is timed the same way ("fwd", calls). Prints a table, then one JSON line per torso with `native_ms`,
`fast_ms` and `speedup` for the loop gradient step (the fields `*_calls_ms` and `*_fwd_ms` for the others).
On a machine shared with other jobs the wall times are noisy; compare the columns of one run only.
"""

from __future__ import annotations

import argparse
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rl.nets.conv import conv_impl
from rl.nets.impala import ImpalaCNN
from rl.nets.networks import NatureCNN, SmallCNN
from scripts.bench_common import calls_runner, format_table, loop_runner, print_json_line, time_interleaved

warnings.filterwarnings("ignore", message="Some donated buffers were not usable")

TORSOS = {
    "minatar": (lambda: SmallCNN(128), (10, 10, 4)),
    "nature": (lambda: NatureCNN(512), (84, 84, 4)),
    "impala": (lambda: ImpalaCNN((16, 32, 32), 256), (84, 84, 4)),
}
NUM_ACTIONS = 6
BANK = 4  # distinct observation batches cycled through by the steps


class _Net(nn.Module):
    torso: nn.Module

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(NUM_ACTIONS)(self.torso(obs))


def _workloads(name: str, batch: int, impl: str):
    make, shape = TORSOS[name]
    net = _Net(make())
    key = jax.random.PRNGKey(0)
    obs = jax.random.randint(key, (BANK, batch) + shape, 0, 256).astype(jnp.uint8)
    targets = jax.random.normal(jax.random.PRNGKey(1), (BANK, batch, NUM_ACTIONS))
    params = net.init(jax.random.PRNGKey(2), obs[0])
    opt = optax.adam(1e-4)

    def grad_body(i, carry):
        with conv_impl(impl):  # read while the body is traced
            params, opt_state = carry
            x, t = obs[i % BANK], targets[i % BANK]
            grads = jax.grad(lambda p: jnp.mean((net.apply(p, x) - t) ** 2))(params)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

    def fwd_body(i, carry):
        with conv_impl(impl):
            params, acc = carry
            return params, acc + net.apply(params, obs[i % BANK]).sum()

    fwd_params = jax.tree.map(jnp.copy, params)  # the grad runs donate theirs
    return (grad_body, (params, opt.init(params))), (fwd_body, (fwd_params, jnp.zeros(())))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torsos", default=",".join(TORSOS), help=f"comma-separated subset of {list(TORSOS)}")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=None, help="steps per timed run (default: 20, IMPALA 2)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"backend {jax.default_backend()}, devices {jax.devices()}, batch {args.batch}; ms per step, "
          f"median of {args.repeats} (min in brackets)", flush=True)
    rows, records = [], []
    for name in args.torsos.split(","):
        if name not in TORSOS:
            raise SystemExit(f"unknown torso {name!r}; choose from {list(TORSOS)}")
        k = args.k or (2 if name == "impala" else 20)
        entries = {}
        for impl in ("native", "fast"):
            (grad_body, grad_carry), (fwd_body, fwd_carry) = _workloads(name, args.batch, impl)
            entries[impl] = ({"loop": loop_runner(grad_body, k), "calls": calls_runner(grad_body, k)}, grad_carry)
            entries[impl + "_fwd"] = ({"calls": calls_runner(fwd_body, k)}, fwd_carry)
        res = time_interleaved(entries, k, args.repeats)

        def ms(impl, way, res=res):
            t = res[impl][way]
            return 1e3 * t.per_step_s, 1e3 * min(t.runs_s)

        rec = {"torso": name, "batch": args.batch, "k": k}
        for way, suffix in (("loop", ""), ("calls", "_calls")):
            nat, fast = ms("native", way), ms("fast", way)
            rec.update({f"native{suffix}_ms": nat[0], f"fast{suffix}_ms": fast[0],
                        f"speedup{suffix}": nat[0] / fast[0]})
            rows.append([name, f"grad step ({way})", f"{nat[0]:.2f} ({nat[1]:.2f})", f"{fast[0]:.2f} ({fast[1]:.2f})",
                         f"{nat[0] / fast[0]:.2f}x"])
        nat, fast = ms("native_fwd", "calls"), ms("fast_fwd", "calls")
        rec.update({"native_fwd_ms": nat[0], "fast_fwd_ms": fast[0]})
        rows.append([name, "forward (calls)", f"{nat[0]:.2f} ({nat[1]:.2f})", f"{fast[0]:.2f} ({fast[1]:.2f})",
                     f"{nat[0] / fast[0]:.2f}x"])
        records.append({k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in rec.items()})
        print(f"{name} done", flush=True)
    print(format_table(["torso", "workload", "native ms", "fast ms", "speedup"], rows))
    for rec in records:
        print_json_line(rec)


if __name__ == "__main__":
    main()
