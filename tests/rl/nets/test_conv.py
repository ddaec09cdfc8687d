"""rl/nets/conv.py: the fast CPU conv / max-pool equal XLA's native ones (outputs and gradients), `Conv` has
`nn.Conv`'s params, and the torsos take the fast path on CPU (and the native one when told)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.nets.conv import Conv, conv2d, conv_impl, max_pool, use_fast
from rl.nets.impala import ImpalaCNN
from rl.nets.networks import NatureCNN, SmallCNN


def _close(a, b, rtol=2e-5):
    """Equal up to float32 summation order, relative to the largest entry of each leaf."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=0, atol=rtol * max(float(np.abs(y).max()), 1e-6))


# (input [H, W, C], features, kernel, stride, padding): every conv of the torsos, plus odd cases.
CASES = [
    ((84, 84, 4), 32, 8, 4, "VALID"),  # Nature conv 1 (space-to-depth)
    ((20, 20, 32), 64, 4, 2, "VALID"),  # Nature conv 2 (space-to-depth)
    ((9, 9, 64), 64, 3, 1, "VALID"),  # Nature conv 3
    ((10, 10, 4), 16, 3, 1, "VALID"),  # MinAtar (Breakout)
    ((10, 10, 10), 16, 3, 1, "VALID"),  # MinAtar (Seaquest)
    ((84, 84, 4), 16, 3, 1, "SAME"),  # IMPALA stage 1
    ((21, 21, 32), 32, 3, 1, "SAME"),  # IMPALA stage 3 (odd side)
    ((11, 13, 3), 5, 3, 2, "SAME"),  # stride not dividing the kernel: plain strided slices
    ((12, 12, 3), 5, 4, 2, "SAME"),  # space-to-depth with padding
    ((9, 9, 2), 3, 2, 1, ((1, 0), (0, 2))),  # explicit asymmetric padding, even kernel
]


@pytest.mark.parametrize("shape, features, kernel, stride, padding", CASES)
def test_conv_matches_nn_conv(shape, features, kernel, stride, padding):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3) + shape)  # two leading dims, flattened like nn.Conv
    ref = nn.Conv(features, (kernel, kernel), strides=stride, padding=padding)
    params = jax.jit(ref.init)(jax.random.PRNGKey(1), x)

    def outputs(m):
        """m's init from the same key, output, gradients, and the differentiated forward pass's value next to
        the plain loss: each computed on its own, all jitted together."""
        def loss(p, x):
            return jnp.sum(jnp.sin(m.apply(p, x)))

        def run(p, x):
            return (m.init(jax.random.PRNGKey(1), x), m.apply(p, x), jax.grad(loss, argnums=(0, 1))(p, x),
                    jax.value_and_grad(loss)(p, x)[0], loss(p, x))

        return jax.jit(run)(params, x)

    _, ref_y, ref_g, _, ref_loss = outputs(ref)
    for impl in ("fast", "native", "auto"):
        mine, y, g, value, _ = outputs(Conv(features, (kernel, kernel), strides=stride, padding=padding, impl=impl))
        # Same tree, shapes and init values: checkpoints and param counts are unchanged.
        assert jax.tree_util.tree_structure(mine) == jax.tree_util.tree_structure(params)
        for a, b in zip(jax.tree_util.tree_leaves(mine), jax.tree_util.tree_leaves(params)):
            np.testing.assert_array_equal(a, b)
        _close(y, ref_y)
        _close(g, ref_g)
        # The differentiated forward pass (im2col on the fast path) has the same value too.
        _close(value, ref_loss)


def test_conv2d_under_jit_vmap_and_scan():
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 10, 10, 5))
    w = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 5, 7))

    def loss(impl):
        def body(c, xi):
            y = jax.vmap(lambda v: conv2d(v[None], w * c, 1, "SAME", impl=impl)[0])(xi)
            return c, jnp.sum(y ** 2)
        return lambda c: jax.lax.scan(body, c, x)[1].sum()

    _close(jax.jit(jax.grad(loss("fast")))(1.5), jax.grad(loss("native"))(1.5))


@pytest.mark.parametrize("window, strides, padding", [((3, 3), (2, 2), "SAME"), ((2, 2), (2, 2), "VALID"),
                                                      ((3, 3), (1, 1), "SAME"), ((12, 12), (3, 3), "SAME"),
                                                      ((2, 3), (2, 1), "SAME")])
def test_max_pool_matches_native_with_ties(window, strides, padding):
    # Rounded values: many windows have tied maxima, which must get the gradient as XLA gives it (first one).
    # A 12 x 12 window has 144 taps: more than an int8 tap index can count. A 2 x 3 window has 6 taps, not 4 or 9.
    x = jnp.round(jax.random.normal(jax.random.PRNGKey(0), (2, 3, 9, 10, 4)) * 1.5)

    def ref(x):
        return nn.max_pool(x.reshape((-1,) + x.shape[2:]), window, strides=strides, padding=padding)

    fast = jax.jit(lambda x: max_pool(x, window, strides, padding, impl="fast"))  # one program, not 144 taps' ops
    y = fast(x)
    np.testing.assert_array_equal(y.reshape((-1,) + y.shape[2:]), jax.jit(ref)(x))
    g = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(fast(x)) * jnp.arange(4))))(x)
    g_ref = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(ref(x)) * jnp.arange(4))))(x)
    np.testing.assert_array_equal(g, g_ref)


@pytest.mark.parametrize("make, shape", [
    (lambda: SmallCNN(32), (10, 10, 4)),
    (lambda: NatureCNN(32), (84, 84, 4)),
    (lambda: ImpalaCNN((4, 8), 16), (24, 24, 3)),
])
def test_torsos_fast_path_equals_native(make, shape):
    """The torsos give the same features and gradients on the fast path as with native convs."""
    torso = make()
    x = jax.random.randint(jax.random.PRNGKey(0), (2, 2) + shape, 0, 256).astype(jnp.uint8)
    params = jax.jit(torso.init)(jax.random.PRNGKey(1), x)

    def loss(p):
        return jnp.sum(jnp.tanh(torso.apply(p, x)))

    with conv_impl("native"):  # a new jitted lambda per impl: the impl is read when it is traced
        y_nat, g_nat = jax.jit(lambda p: jax.value_and_grad(loss)(p))(params)
    with conv_impl("fast"):
        y_fast, g_fast = jax.jit(lambda p: jax.value_and_grad(loss)(p))(params)
    _close(y_fast, y_nat)
    _close(g_fast, g_nat, rtol=1e-4)


def _grad_jaxpr(torso, shape):
    x = jnp.zeros((2,) + shape)
    params = jax.eval_shape(torso.init, jax.random.PRNGKey(0), x)  # only shapes: the jaxpr needs no values
    return str(jax.make_jaxpr(jax.grad(lambda p: torso.apply(p, x).sum()))(params))


TORSOS = [(SmallCNN(8), (10, 10, 4)), (NatureCNN(8), (84, 84, 4)), (ImpalaCNN((4,), 8), (12, 12, 3))]


@pytest.mark.parametrize("torso, shape", TORSOS)
def test_torsos_take_fast_path_on_cpu(torso, shape):
    """On the CPU backend ("auto") the torsos' gradients are im2col + matmul and sliced pooling: no XLA conv
    or select-and-scatter in the gradient's jaxpr; `conv_impl("native")` restores XLA's ops."""
    assert use_fast("auto") == (jax.default_backend() == "cpu")
    with conv_impl("fast"):
        fast = _grad_jaxpr(torso, shape)
    assert "conv_general_dilated" not in fast and "select_and_scatter" not in fast and "dot_general" in fast
    with conv_impl("native"):
        native = _grad_jaxpr(torso, shape)
    assert "conv_general_dilated" in native
    if isinstance(torso, ImpalaCNN):
        assert "select_and_scatter" in native
    if jax.default_backend() == "cpu":
        assert _grad_jaxpr(torso, shape) == fast


def test_bad_impl():
    with pytest.raises(ValueError, match="impl"):
        use_fast("cudnn")
    with pytest.raises(ValueError, match="padding"):
        conv2d(jnp.zeros((1, 5, 5, 1)), jnp.zeros((3, 3, 1, 1)), padding="CIRCULAR", impl="fast")


def test_impala_torso_equals_the_paper_architecture_in_plain_jax():
    """ImpalaCNN against a plain-JAX reading of Espeholt et al. (2018, Fig. 3) with the same parameters: per
    stage a 3x3 conv, a 3x3 max-pool with stride 2 (SAME), two residual blocks (relu, conv, relu, conv, +skip);
    then relu, flatten, dense, relu. Pixels scaled to [0, 1]."""
    torso = ImpalaCNN((4, 8), 16)
    x = jax.random.randint(jax.random.PRNGKey(0), (2, 11, 11, 3), 0, 256).astype(jnp.uint8)
    params = jax.jit(torso.init)(jax.random.PRNGKey(1), x)["params"]

    def conv(p, h):
        out = jax.lax.conv_general_dilated(h, p["kernel"], (1, 1), "SAME",
                                           dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return out + p["bias"]

    @jax.jit
    def paper(params, x):
        h = x.astype(jnp.float32) / 255.0
        convs, blocks = (params[f"Conv_{i}"] for i in range(2)), iter(params[f"ResidualBlock_{i}"] for i in range(4))
        for p in convs:
            h = conv(p, h)
            h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
            for _ in range(2):
                b = next(blocks)
                h = h + conv(b["Conv_1"], jax.nn.relu(conv(b["Conv_0"], jax.nn.relu(h))))
        h = jax.nn.relu(h).reshape(2, -1)
        return jax.nn.relu(h @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])

    _close(jax.jit(torso.apply)({"params": params}, x), paper(params, x))
