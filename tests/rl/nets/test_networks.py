"""rl/nets/networks.py: torso choice by observation rank, shapes with any leading dims, dueling head, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.config import ConfigError, to_dataclass
from rl.nets.networks import MLP, NetworkConfig, QHead, _ConvTorso, channels_first, make_q_network, make_torso


def _init_apply(net, obs):
    """net's params from key 0 and its output on obs, as one jitted program."""
    def init_apply(key, obs):
        params = net.init(key, obs)
        return params, net.apply(params, obs)

    return jax.jit(init_apply)(jax.random.PRNGKey(0), obs)


@pytest.mark.parametrize("shape, dtype, kind, convs", [
    ((4,), jnp.float32, MLP, None),
    ((10, 5), jnp.float32, MLP, None),  # bsuite Catch: flattened
    ((10, 10, 4), jnp.float32, _ConvTorso, 1),  # MinAtar
    ((84, 84, 4), jnp.uint8, _ConvTorso, 3),  # Atari, channels last
    ((4, 84, 84), jnp.uint8, _ConvTorso, 3),  # envpool Atari, channels first
])
def test_torso_by_rank_and_leading_dims(shape, dtype, kind, convs):
    torso = make_torso(shape, NetworkConfig(hidden_sizes=[32, 16], cnn_dense=64))
    assert isinstance(torso, kind)
    if convs is not None:
        assert len(torso.convs) == convs
    obs = np.zeros((2, 3) + shape, dtype)
    _, feats = _init_apply(torso, obs)
    assert feats.shape == (2, 3, 16 if kind is MLP else 64)


@pytest.mark.parametrize("shape, convs", [
    ((20, 84, 4), 1), ((84, 20, 4), 1), ((4, 20, 84), 1), ((4, 84, 20), 1),  # a side below 36: the MinAtar CNN
    ((40, 84, 4), 3), ((4, 40, 84), 3),  # both sides >= 36: the Nature CNN
])
def test_auto_torso_reads_the_smaller_spatial_side_in_either_layout(shape, convs):
    assert len(make_torso(shape, NetworkConfig()).convs) == convs


@pytest.mark.parametrize("shape, first", [
    ((4, 84, 84), True), ((3, 10, 10), True), ((84, 84, 4), False), ((10, 10, 4), False),
    ((4, 84, 3), False),  # a 4-pixel-high strip of 3 channels: the first side is not below both others
    ((20, 84, 84), False),  # more than 16 leading "channels": a spatial side
    ((10, 10, 10), False),  # Seaquest-MinAtar's frame, channels last: a first side equal to the others is spatial
])
def test_channels_first_needs_a_few_channels_below_both_spatial_sides(shape, first):
    assert channels_first(shape) is first


def test_nature_cnn_layout_and_scaling():
    """Channels-first input equals the transposed channels-last input; uint8 is scaled by 1/255."""
    cfg = NetworkConfig(torso="nature_cnn", cnn_dense=8)
    last = make_torso((84, 84, 4), cfg)
    first = make_torso((4, 84, 84), cfg)
    x = jax.random.randint(jax.random.PRNGKey(1), (2, 84, 84, 4), 0, 256).astype(jnp.uint8)
    params, y_last = _init_apply(last, x)
    y_first = jax.jit(lambda p, x: first.apply(p, jnp.transpose(x, (0, 3, 1, 2))))(params, x)
    np.testing.assert_allclose(y_last, y_first, rtol=1e-5, atol=1e-5)
    y_float = jax.jit(lambda p, x: last.apply(p, x.astype(jnp.float32) / 255.0))(params, x)
    np.testing.assert_allclose(y_last, y_float, rtol=1e-5, atol=1e-5)
    # The Nature stack (Mnih et al. 2015): 32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1 (84 -> 20 -> 9 -> 7
    # spatial), 64 channels into the dense layer.
    shapes = {k: v["kernel"].shape for k, v in params["params"].items()}
    assert shapes == {"Conv_0": (8, 8, 4, 32), "Conv_1": (4, 4, 32, 64), "Conv_2": (3, 3, 64, 64),
                      "Dense_0": (7 * 7 * 64, 8)}


def test_dueling_head_identifiable():
    head = QHead(num_actions=5, hidden=(8,), dueling=True)
    feats = jax.random.normal(jax.random.PRNGKey(0), (6, 3))
    params, q = _init_apply(head, feats)
    value = jax.jit(lambda p, x: head.apply(p, x, method=lambda m, x: m.__call__(x).mean(-1)))(params, feats)

    # Q = V + A - mean(A): the mean over actions of Q is V (the value stream).
    @jax.jit
    def value_stream(p, feats):
        h = jax.nn.relu(feats @ p["value_0"]["kernel"] + p["value_0"]["bias"])
        return (h @ p["value_out"]["kernel"] + p["value_out"]["bias"])[:, 0]

    v = value_stream(params["params"], feats)
    np.testing.assert_allclose(value, v, rtol=1e-5, atol=1e-6)
    assert q.shape == (6, 5)


def test_q_network_shapes():
    net = make_q_network((6,), 3, NetworkConfig(hidden_sizes=[32], head_hidden=[16], dueling=True))
    _, q = _init_apply(net, np.ones((7, 6), np.float32))
    assert q.shape == (7, 3)


@pytest.mark.parametrize("section, match", [
    ({"torso": "resnet"}, "network.torso"),
    ({"activation": "swish2"}, "network.activation"),
    ({"hidden_sizes": [0]}, "positive"),
    ({"head_hidden": [4, 0]}, "positive"),
    ({"cnn_dense": 0}, "positive"),
    ({"hiden_sizes": [3]}, "hiden_sizes"),
])
def test_bad_network_config(section, match):
    with pytest.raises(ConfigError, match=match):
        to_dataclass(NetworkConfig, section, "agent.network")


def test_cnn_needs_images():
    with pytest.raises(ValueError, match="image observations"):
        make_torso((4,), NetworkConfig(torso="small_cnn"))
    with pytest.raises(ValueError, match="side >= 36"):
        make_torso((10, 10, 4), NetworkConfig(torso="nature_cnn"))
