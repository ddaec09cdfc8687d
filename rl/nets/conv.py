"""2-D convolution and max-pooling that are fast to differentiate on XLA:CPU; a drop-in `Conv` for `nn.Conv`.

Why: XLA:CPU's convolution is fast on its own, but the convolutions that compute its gradient are very slow
inside a loop (`lax.scan`/`fori_loop`, where every runner and agent here takes its train steps), and so is
`nn.max_pool`'s gradient (select-and-scatter); this module's gradient steps inside a loop are several to tens
of times faster for the MinAtar, Nature and IMPALA torsos (`python -m scripts.bench_conv`; docs/benchmarks.md).
Caveat: a gradient step jitted on its own, *outside* any loop, is slower this way for the big torsos: there
XLA's own conv gradient is fast. Use `conv_impl("native")` around such code if it matters. Forward passes
(acting) are unchanged.

What: on the CPU backend (`jax.default_backend() == "cpu"`, decided when the function is traced)
`conv2d` and `max_pool` are `jax.custom_vjp`s whose primal is XLA's own op (an undifferentiated forward
pass, e.g. acting, is as fast as before) and whose differentiated forward pass is the fast form:

* conv: im2col built by slicing (one strided slice per kernel tap, stacked on the channel axis) and
  one matmul with the kernel reshaped to `[kh * kw * C, F]`; a strided conv whose kernel is a multiple of
  its stride (the Nature CNN's 8x8/4 and 4x4/2) is first turned into a stride-1 conv by space-to-depth
  (`[H, W, C] -> [H/s, W/s, s*s*C]`), so it needs (k/s)^2 slices instead of k^2. Slicing beat
  `lax.conv_general_dilated_patches` (whose own gradient is a slow conv) in forward+backward.
* max-pool: the max over the window's shifted strided slices; the gradient goes, as XLA's
  select-and-scatter does, to the first maximum of each window in row-major order (ties included).

Elsewhere (GPU/TPU) both are XLA's native ops. `impl="native" | "fast"` forces either (tests, benchmarks);
so does `with conv_impl("native"):` for everything traced inside the block.
Outputs and gradients equal the native ones up to float32 summation order. Not supported by the fast path
(forward-mode autodiff of a `custom_vjp`): `jax.jvp`/`jax.jacfwd` through the CPU path; use `impl="native"`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.dtypes import promote_dtype
from jax import lax

IMPLS = ("auto", "native", "fast")
_DN = ("NHWC", "HWIO", "NHWC")
Padding = str | int | Sequence[tuple[int, int]]


_default_impl = "auto"


@contextlib.contextmanager
def conv_impl(impl: str) -> Iterator[None]:
    """Within the block, what `impl="auto"` means for functions *traced* there (e.g. `conv_impl("native")`
    around a first jitted call, to time or differentiate forward-mode through XLA's own convs)."""
    global _default_impl
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    old, _default_impl = _default_impl, impl
    try:
        yield
    finally:
        _default_impl = old


def use_fast(impl: str = "auto") -> bool:
    """Whether `impl` means the fast (im2col / sliced) path: "auto" picks it on the CPU backend."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        impl = _default_impl
    return impl == "fast" or (impl == "auto" and jax.default_backend() == "cpu")


def _pairs(v: int | Sequence[int], n: int = 2) -> tuple[int, ...]:
    return (int(v),) * n if isinstance(v, int) else tuple(int(a) for a in v)


def _explicit_pads(spatial: Sequence[int], window: Sequence[int], strides: Sequence[int],
                   padding: Padding) -> tuple[tuple[int, int], ...]:
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise ValueError(f"padding must be 'SAME', 'VALID', an int or (low, high) pairs; got {padding!r}")
        return tuple(lax.padtype_to_pads(tuple(spatial), tuple(window), tuple(strides), padding.upper()))
    if isinstance(padding, int):
        return ((padding, padding),) * len(spatial)
    return tuple((int(lo), int(hi)) for lo, hi in padding)


def _taps(x: jnp.ndarray, window: Sequence[int], strides: Sequence[int]) -> tuple[list[jnp.ndarray], int, int]:
    """The strided slices of padded `x [N, H, W, C]` under each window tap (row-major), and the output size."""
    (kh, kw), (sh, sw) = window, strides
    ho, wo = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
    taps = [x[:, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw, :] for i in range(kh) for j in range(kw)]
    return taps, ho, wo


def _im2col_conv(x, kernel, strides, pads, precision):
    """Conv of `x [N, H, W, C]` with `kernel [kh, kw, C, F]` as im2col (slices) + one matmul."""
    kh, kw, c, f = kernel.shape
    sh, sw = strides
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    if (sh > 1 or sw > 1) and kh % sh == 0 and kw % sw == 0:
        # Space-to-depth: a k x k / s conv is a (k/s) x (k/s) / 1 conv over s x s pixel blocks.
        ho, wo = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
        hu, wu = sh * (ho - 1) + kh, sw * (wo - 1) + kw  # the rows/cols the conv reads
        n = x.shape[0]
        x = x[:, :hu, :wu, :].reshape(n, hu // sh, sh, wu // sw, sw, c)
        x = x.transpose(0, 1, 3, 2, 4, 5).reshape(n, hu // sh, wu // sw, sh * sw * c)
        kernel = kernel.reshape(kh // sh, sh, kw // sw, sw, c, f).transpose(0, 2, 1, 3, 4, 5)
        kh, kw, c, sh, sw = kh // sh, kw // sw, sh * sw * c, 1, 1
        kernel = kernel.reshape(kh, kw, c, f)
        x = lax.optimization_barrier(x)  # materialise the blocks: fused into the slices they are slow
    taps, _, _ = _taps(x, (kh, kw), (sh, sw))
    # Stacked on a new axis then merged: XLA:CPU runs this much faster than a concatenation on the channel axis.
    cols = jnp.stack(taps, axis=-2).reshape(taps[0].shape[:-1] + (kh * kw * c,))
    return jnp.dot(cols, kernel.reshape(kh * kw * c, f), precision=precision)


def _native_conv(x, kernel, strides, pads, precision):
    return lax.conv_general_dilated(x, kernel, strides, pads, dimension_numbers=_DN, precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _fast_conv(x, kernel, strides, pads, precision):
    return _native_conv(x, kernel, strides, pads, precision)


def _fast_conv_fwd(x, kernel, strides, pads, precision):
    return jax.vjp(lambda x, k: _im2col_conv(x, k, strides, pads, precision), x, kernel)


def _fast_conv_bwd(strides, pads, precision, vjp, g):
    return vjp(g)


_fast_conv.defvjp(_fast_conv_fwd, _fast_conv_bwd)


def conv2d(x: jnp.ndarray, kernel: jnp.ndarray, strides: int | Sequence[int] = 1, padding: Padding = "VALID",
           precision: Any = None, impl: str = "auto") -> jnp.ndarray:
    """2-D conv of `x [N, H, W, C]` with `kernel [kh, kw, C, F]` -> `[N, H', W', F]` (no bias).

    Same result as `lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=NHWC/HWIO/NHWC)`;
    differentiated through im2col + matmul when `use_fast(impl)` (see the module docstring).
    """
    strides = _pairs(strides)
    pads = _explicit_pads(x.shape[1:3], kernel.shape[:2], strides, padding)
    if not use_fast(impl):
        return _native_conv(x, kernel, strides, pads, precision)
    return _fast_conv(x, kernel, strides, pads, precision)


def _native_pool(x, window, strides, pads):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, *window, 1), (1, *strides, 1), ((0, 0), *pads, (0, 0)))


def _sliced_pool(x, window, strides, pads):
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)), constant_values=-jnp.inf)
    taps, _, _ = _taps(x, window, strides)
    return functools.reduce(jnp.maximum, taps), taps


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _fast_pool(x, window, strides, pads):
    return _native_pool(x, window, strides, pads)


def _fast_pool_fwd(x, window, strides, pads):
    y, taps = _sliced_pool(x, window, strides, pads)
    # Which tap is each window's first maximum (row-major, as XLA's select-and-scatter for max-pool picks).
    first = jnp.full(y.shape, len(taps), jnp.int8 if len(taps) <= jnp.iinfo(jnp.int8).max else jnp.int32)
    for k in reversed(range(len(taps))):
        first = jnp.where(taps[k] == y, jnp.asarray(k, first.dtype), first)
    return y, (x, first)


def _fast_pool_bwd(window, strides, pads, res, g):
    x, first = res

    def tap_stack(x):
        return jnp.stack(_taps(jnp.pad(x, ((0, 0), *pads, (0, 0))), window, strides)[0])

    _, vjp = jax.vjp(tap_stack, x)
    k = jnp.arange(window[0] * window[1], dtype=first.dtype).reshape((-1,) + (1,) * g.ndim)
    return vjp(jnp.where(k == first[None], g[None], jnp.zeros((), g.dtype)))


_fast_pool.defvjp(_fast_pool_fwd, _fast_pool_bwd)


def max_pool(x: jnp.ndarray, window_shape: Sequence[int], strides: Sequence[int] | None = None,
             padding: Padding = "VALID", impl: str = "auto") -> jnp.ndarray:
    """`nn.max_pool` over `x [..., H, W, C]` (2-D windows); differentiated through slices when fast."""
    window = _pairs(window_shape)
    strides = _pairs(strides if strides is not None else 1)
    lead = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    pads = _explicit_pads(x.shape[1:3], window, strides, padding)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"max_pool needs floating inputs, got {x.dtype}")
    y = _fast_pool(x, window, strides, pads) if use_fast(impl) else _native_pool(x, window, strides, pads)
    return y.reshape(lead + y.shape[1:])


class Conv(nn.Module):
    """A 2-D `nn.Conv` (same params: `kernel [kh, kw, C, F]`, `bias [F]`, same init, same auto-name `Conv_i`)
    whose gradient is im2col + matmul on CPU (`conv2d`). Inputs `[..., H, W, C]`, any number of leading dims.
    No dilation, feature groups or circular padding (use `nn.Conv` for those)."""

    features: int
    kernel_size: int | Sequence[int]
    strides: int | Sequence[int] = 1
    padding: Padding = "SAME"
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Any = nn.linear.default_kernel_init
    bias_init: Any = nn.initializers.zeros_init()
    impl: str = "auto"  # "auto" (fast on CPU, native elsewhere) | "native" | "fast"

    @nn.compact
    def __call__(self, inputs):
        kernel_size = _pairs(self.kernel_size)
        if len(kernel_size) != 2:
            raise ValueError(f"Conv is 2-D; got kernel_size {self.kernel_size!r}")
        kernel = self.param("kernel", self.kernel_init, kernel_size + (inputs.shape[-1], self.features),
                            self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        inputs, kernel, bias = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        lead = inputs.shape[:-3]
        x = inputs.reshape((-1,) + inputs.shape[-3:])
        y = conv2d(x, kernel, self.strides, self.padding, self.precision, self.impl)
        if bias is not None:
            y = y + bias
        return y.reshape(lead + y.shape[1:])
