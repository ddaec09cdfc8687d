"""XLA:CPU settings that change speed, never results.

* `unroll_threefry()`: jax lowers its threefry PRNG on CPU as a rolled 5-trip `while` loop (a smaller program
  to compile), so every `split`, `uniform` or `randint` becomes a loop of tiny kernels, each paying XLA:CPU's
  per-kernel dispatch. The unrolled lowering (jax's own, the one it uses on GPU/TPU) computes the same bits in
  a few fused kernels (`python -m scripts.bench_train` measures it). Process-wide: agents.setup.setup applies it
  (never an import), so every run and benchmark of a process set up so gets it, unless the process asked jax for
  unoptimised programs (`JAX_DISABLE_MOST_OPTIMIZATIONS=1`, as the test suite does), where the rolled loop's
  faster compile is what counts; a jax without the private hooks used here keeps its default (a speed
  difference only).
* `loop_options()`: compiler options for the runners' programs. XLA's default copy insertion copies
  loop-carried values (parameters, env state, episode sums) that a `while` body reads after writing their new
  values; its region-based analysis (`xla_cpu_copy_insertion_use_region_analysis`) proves most of those copies
  unneeded. The default DQN CartPole iteration goes from 14 copies to 4 (144 kernels to 134) with bit-identical
  results. Per program (`jax.jit(..., compiler_options=...)`), so a user's own programs keep XLA's defaults.
"""

from __future__ import annotations

import jax

LOOP_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}
_UNROLLED = [False]  # whether the last `unroll_threefry` call put the unrolled lowering in effect


def loop_options() -> dict:
    """`LOOP_OPTIONS` where the default backend is the CPU, else none (the options are XLA:CPU's)."""
    return dict(LOOP_OPTIONS) if jax.default_backend() == "cpu" else {}


def unroll_threefry(unrolled: bool = True) -> bool:
    """Lower `threefry2x32` on CPU unrolled (identical bits), or with jax's rolled default (`unrolled=False`:
    a program that is compiled far more often than run, as in the test suite, compiles ~25% faster with
    the loop). Returns whether it took effect."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as threefry
    except ImportError:
        return False
    rule = getattr(threefry, "_threefry2x32_lowering_rule" if unrolled else "_threefry2x32_cpu_lowering_rule", None)
    if rule is None:
        return False
    mlir.register_lowering(threefry.threefry2x32_p, rule, platform="cpu")
    _UNROLLED[0] = unrolled
    return True


def threefry_unrolled() -> bool:
    """Whether programs lowered now get the unrolled threefry (`unroll_threefry`): part of what they are, for
    code that keeps compiled programs across runs (agents/experiment.py)."""
    return _UNROLLED[0]
