"""rl/nets/impala.py: the IMPALA torso's layers (Espeholt et al. 2018, fig. 3): per stage a 3x3 conv, a 3x3
max-pool of stride 2 and two residual blocks of two 3x3 convs each, then a dense layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rl.nets.impala import ImpalaCNN, ResidualBlock


def test_every_layer_has_the_papers_shape():
    params = ImpalaCNN().init(jax.random.PRNGKey(0), jnp.zeros((1, 84, 84, 4)))["params"]
    shapes = jax.tree_util.tree_map(lambda x: x.shape, params)
    stages = [(4, 16), (16, 32), (32, 32)]
    expected = {f"Conv_{i}": {"kernel": (3, 3, cin, c), "bias": (c,)} for i, (cin, c) in enumerate(stages)}
    for b in range(6):  # two blocks per stage
        c = stages[b // 2][1]
        expected[f"ResidualBlock_{b}"] = {f"Conv_{j}": {"kernel": (3, 3, c, c), "bias": (c,)} for j in range(2)}
    expected["Dense_0"] = {"kernel": (11 * 11 * 32, 256), "bias": (256,)}  # 84 -> 42 -> 21 -> 11 (SAME pools)
    assert shapes == expected


def test_a_residual_block_adds_its_input():
    """With the convs' kernels and biases zeroed the block is the identity (x + 0)."""
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 5, 8))
    block = ResidualBlock(8)
    params = jax.tree_util.tree_map(jnp.zeros_like, block.init(jax.random.PRNGKey(0), x))
    np.testing.assert_array_equal(np.asarray(block.apply(params, x)), np.asarray(x))
