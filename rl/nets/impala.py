"""The IMPALA residual CNN torso (Espeholt et al. 2018, Fig. 3 "large" network), used by Muesli on images.

Each stage: 3x3 conv -> 3x3 max-pool stride 2 -> two residual blocks (relu, conv, relu, conv, +skip);
then relu, flatten and a dense layer. Observations `[..., H, W, C]` (any leading dims; channels-first
stacks such as envpool's `[4, 84, 84]` are transposed when `channels_first`) -> features `[..., dense]`.
uint8 pixels are scaled to [0, 1]. Convs and max-pools are `rl.nets.conv`'s (same params as `nn.Conv`; on CPU
their gradients are im2col + matmul and sliced maxima, much faster than XLA:CPU's in the train loops).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn

from rl.nets.conv import Conv, max_pool
from rl.nets.networks import ACTIVATIONS, image_batch


class ResidualBlock(nn.Module):
    """relu -> conv3x3 -> relu -> conv3x3, plus the input."""

    channels: int

    @nn.compact
    def __call__(self, x):
        y = Conv(self.channels, (3, 3))(nn.relu(x))
        y = Conv(self.channels, (3, 3))(nn.relu(y))
        return x + y


class ImpalaCNN(nn.Module):
    """IMPALA torso: `channels` stages of conv + max-pool + 2 residual blocks, then a dense layer."""

    channels: Sequence[int] = (16, 32, 32)
    dense: int = 256
    channels_first: bool = False
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs):
        x, lead = image_batch(obs, self.channels_first)
        for c in self.channels:
            x = Conv(c, (3, 3))(x)
            x = max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = ResidualBlock(c)(x)
            x = ResidualBlock(c)(x)
        x = nn.relu(x).reshape(x.shape[0], -1)
        x = ACTIVATIONS[self.activation](nn.Dense(self.dense)(x))
        return x.reshape(lead + (self.dense,))
