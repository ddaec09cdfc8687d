"""Flax linen networks shared by the agents: torsos chosen by observation rank, and Q heads.

Shapes: a torso maps observations `[..., *obs_shape]` to features `[..., F]` (any number of leading batch
dims); a Q head maps features `[..., F]` to action values `[..., A]`.

* `MLP`: flat observations (rank 1; higher ranks are flattened).
* `NatureCNN`: Atari frames, 84x84 with stacked frames (Mnih et al. 2015: 32x8x8/4, 64x4x4/2, 64x3x3/1,
  dense 512). uint8 inputs are scaled by 1/255.
* `SmallCNN`: small images such as MinAtar's 10x10xC (one 3x3 conv with 16 channels, then dense).
* `make_torso(obs_shape, cfg)` picks one from `cfg.torso` ("auto" chooses by rank and size).
  Images are channels-last `[H, W, C]`; a channels-first stack such as envpool's `[4, 84, 84]` is
  detected (first dim <= 16 and smaller than the last two) and transposed.

The convolutions are `rl.nets.conv.Conv` (same params as `nn.Conv`): on CPU their gradient is im2col + matmul,
several times faster than XLA:CPU's convolution gradient inside the train loops (see rl/nets/conv.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from rl.nets.conv import Conv

ACTIVATIONS: dict[str, Callable] = {"relu": nn.relu, "tanh": nn.tanh, "elu": nn.elu, "gelu": nn.gelu,
                                    "silu": nn.silu}
TORSOS = ("auto", "mlp", "nature_cnn", "small_cnn")


@dataclasses.dataclass
class NetworkConfig:
    """Network options every agent config can embed under `network:`."""

    torso: str = "auto"  # one of TORSOS
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [256, 256])  # MLP torso layers
    cnn_dense: int = 512  # width of the dense layer after the conv stack (CNN torsos)
    head_hidden: list[int] = dataclasses.field(default_factory=list)  # Q-head hidden layers
    dueling: bool = False  # value + advantage streams, Q = V + A - mean(A)
    activation: str = "relu"

    def __post_init__(self):
        if self.torso not in TORSOS:
            raise ValueError(f"network.torso must be one of {TORSOS}, got {self.torso!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"network.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if any(int(h) <= 0 for h in list(self.hidden_sizes) + list(self.head_hidden)) or self.cnn_dense <= 0:
            raise ValueError("network layer sizes must be positive")


def _scale(x: jnp.ndarray) -> jnp.ndarray:
    """Cast to float32; uint8 pixels are scaled to [0, 1]."""
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


def image_batch(obs: jnp.ndarray, channels_first: bool) -> tuple[jnp.ndarray, tuple[int, ...]]:
    """Images `[..., H, W, C]` (or `[..., C, H, W]`) as scaled float32 `[N, H, W, C]`, and the leading dims."""
    x = _scale(obs)
    lead = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    if channels_first:
        x = jnp.transpose(x, (0, 2, 3, 1))
    return x, lead


class MLP(nn.Module):
    """Dense layers with activation after each; observations of rank > 1 are flattened."""

    hidden_sizes: Sequence[int]
    obs_rank: int = 1
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs):
        x = _scale(obs)
        x = x.reshape(x.shape[: x.ndim - self.obs_rank] + (-1,))
        act = ACTIVATIONS[self.activation]
        for h in self.hidden_sizes:
            x = act(nn.Dense(h)(x))
        return x


class _ConvTorso(nn.Module):
    """Conv stack over `[..., H, W, C]` (leading dims flattened for the convs), then a dense layer."""

    convs: Sequence[tuple[int, int, int]]  # (features, kernel, stride)
    dense: int
    channels_first: bool = False
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs):
        x, lead = image_batch(obs, self.channels_first)
        act = ACTIVATIONS[self.activation]
        for features, kernel, stride in self.convs:
            x = act(Conv(features, (kernel, kernel), strides=(stride, stride), padding="VALID")(x))
        x = x.reshape(x.shape[0], -1)
        x = act(nn.Dense(self.dense)(x))
        return x.reshape(lead + (self.dense,))


def NatureCNN(dense: int = 512, channels_first: bool = False, activation: str = "relu") -> nn.Module:
    """The DQN Nature torso for 84x84 frame stacks."""
    return _ConvTorso(((32, 8, 4), (64, 4, 2), (64, 3, 1)), dense, channels_first, activation)


def SmallCNN(dense: int = 128, channels_first: bool = False, activation: str = "relu") -> nn.Module:
    """The MinAtar torso (Young & Tian 2019): one 3x3 conv with 16 channels, then a dense layer."""
    return _ConvTorso(((16, 3, 1),), dense, channels_first, activation)


def channels_first(obs_shape: Sequence[int]) -> bool:
    """Whether an image shape `[a, b, c]` is channels-first (a few channels before two larger sides)."""
    return obs_shape[0] <= 16 and obs_shape[0] < min(obs_shape[1], obs_shape[2])


def make_torso(obs_shape: Sequence[int], cfg: NetworkConfig) -> nn.Module:
    """The torso for observations of `obs_shape` (no batch dims): rank 1 -> MLP, rank 3 -> CNN.

    With `torso="auto"`, rank-3 observations whose spatial side is >= 36 get the Nature CNN, smaller ones
    the MinAtar CNN; anything else gets the MLP over the flattened observation.
    """
    obs_shape = tuple(int(d) for d in obs_shape)
    kind = cfg.torso
    if kind == "auto":
        if len(obs_shape) == 3:
            side = min(obs_shape[1:]) if channels_first(obs_shape) else min(obs_shape[:2])
            kind = "nature_cnn" if side >= 36 else "small_cnn"
        else:
            kind = "mlp"
    if kind == "mlp":
        return MLP(tuple(cfg.hidden_sizes), obs_rank=max(len(obs_shape), 1), activation=cfg.activation)
    if len(obs_shape) != 3:
        raise ValueError(f"network.torso={kind!r} needs image observations [H, W, C]; got shape {obs_shape}")
    cf = channels_first(obs_shape)
    if kind == "nature_cnn":
        if min(obs_shape[1:] if cf else obs_shape[:2]) < 36:
            raise ValueError(f"network.torso='nature_cnn' needs images of side >= 36; got shape {obs_shape}")
        return NatureCNN(cfg.cnn_dense, cf, cfg.activation)
    return SmallCNN(cfg.cnn_dense, cf, cfg.activation)


class QHead(nn.Module):
    """Features `[..., F]` -> Q values `[..., A]`; optionally dueling (Wang et al. 2016)."""

    num_actions: int
    hidden: Sequence[int] = ()
    dueling: bool = False
    activation: str = "relu"

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]

        def stream(y, out, name):
            for i, h in enumerate(self.hidden):
                y = act(nn.Dense(h, name=f"{name}_{i}")(y))
            return nn.Dense(out, name=f"{name}_out")(y)

        if not self.dueling:
            return stream(x, self.num_actions, "q")
        value = stream(x, 1, "value")
        adv = stream(x, self.num_actions, "advantage")
        return value + adv - adv.mean(axis=-1, keepdims=True)


class QNetwork(nn.Module):
    """Torso + Q head: observations `[..., *obs_shape]` -> Q values `[..., A]`."""

    torso: nn.Module
    head: QHead

    def __call__(self, obs):
        return self.head(self.torso(obs))


def make_q_network(obs_shape: Sequence[int], num_actions: int, cfg: NetworkConfig) -> QNetwork:
    """A Q network for `obs_shape` observations and `num_actions` discrete actions."""
    head = QHead(num_actions, tuple(cfg.head_hidden), cfg.dueling, cfg.activation)
    return QNetwork(make_torso(obs_shape, cfg), head)
