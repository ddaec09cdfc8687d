"""XLA:CPU settings that change speed, never results.

* `unroll_threefry()`: jax lowers its threefry PRNG on CPU as a rolled 5-trip `while` loop (a smaller program
  to compile), so every `split`, `uniform` or `randint` becomes a loop of tiny kernels, each paying XLA:CPU's
  per-kernel dispatch. The unrolled lowering (jax's own, the one it uses on GPU/TPU) computes the same bits in
  a few fused kernels (`python -m scripts.bench_train` measures it). Process-wide: agents.setup.setup applies it
  (never an import), so every run and benchmark of a process set up so gets it; a jax without the private hooks
  used here keeps its default (a speed difference only).
"""

from __future__ import annotations


def unroll_threefry() -> bool:
    """Lower `threefry2x32` on CPU unrolled (identical bits). Returns whether it took effect."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as threefry
    except ImportError:
        return False
    rule = getattr(threefry, "_threefry2x32_lowering_rule", None)
    if rule is None:
        return False
    mlir.register_lowering(threefry.threefry2x32_p, rule, platform="cpu")
    return True
