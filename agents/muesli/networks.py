"""Muesli's networks (Hessel et al. 2021): representation, learned dynamics, policy/value/reward heads.

* `represent(obs [..., *obs_shape]) -> state [..., S]`: a torso (MLP, MinAtar/Nature CNN from rl/nets/networks.py,
  or the IMPALA CNN from rl/nets/impala.py) and a linear projection, layer-normalised.
* `predict(state [..., S]) -> (policy_logits [..., A], value_logits [..., N])`: shared by the root state and
  every model state.
* `step(state [..., S], action [...]) -> (next_state [..., S], reward_logits [..., N])`: the dynamics model,
  chosen by `network.model`:
  - `mlp` (default): an MLP over the state whose output layers hold one row block per action (Oh et al. 2015
    condition a frame model multiplicatively on the action for the same reason): the next state is
    `LayerNorm(state + delta[a])` and the reward head's output layer gives `[A, N]` logits of which action
    `a`'s are read, so the action selects its own weights and cannot be washed out by a wide state, as a
    one-hot concatenated to it was. `step_all` gives every action's next state and reward from one pass.
  - `lstm`: the paper's form (Hessel et al. 2021, main text: an LSTM over the action sequence, conditioned
    on the policy network's hidden state). The model state is the LSTM's `(h, c)`, `[..., 2 * state_dim]`
    laid out as `[h, c]`: `represent` gives `h_0` (the layer-normalised projection of the torso, the same
    hidden state the root policy reads) and `c_0 = Dense(h_0)`; each `step` feeds the one-hot action to an
    LSTM cell of `state_dim` units and predicts the reward from the new `h`. The policy/value heads read
    `LayerNorm(h)` at the root and at every model step. `model_hidden` is unused.

Value and reward logits are over the categorical support of rl/learning/categorical.py (N atoms). Their output
layers start at zero, so the initial value and reward read back as 0; the policy starts near uniform.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from rl.nets.impala import ImpalaCNN
from rl.nets.networks import ACTIVATIONS, NetworkConfig, channels_first, make_torso

TORSOS = ("auto", "mlp", "small_cnn", "nature_cnn", "impala")
MODELS = ("mlp", "lstm")


@dataclasses.dataclass
class MuesliNetworkConfig:
    """`network:` section of the Muesli config."""

    torso: str = "auto"  # auto (by observation rank/size, see rl/nets/networks.py) | mlp | small_cnn | nature_cnn | impala
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [256, 256])  # MLP torso
    cnn_dense: int = 256  # dense layer after a CNN torso
    impala_channels: list[int] = dataclasses.field(default_factory=lambda: [16, 32, 32])
    model: str = "mlp"  # dynamics model: mlp (residual MLP) | lstm (the paper's LSTM over actions)
    state_dim: int = 256  # model state size S (lstm: LSTM units; its state [h, c] is 2 * state_dim wide)
    model_hidden: list[int] = dataclasses.field(default_factory=lambda: [256])  # dynamics MLP layers (mlp only)
    head_hidden: list[int] = dataclasses.field(default_factory=lambda: [256])  # policy/value/reward heads
    activation: str = "relu"

    def __post_init__(self):
        if self.torso not in TORSOS:
            raise ValueError(f"agent.network.torso must be one of {TORSOS}, got {self.torso!r}")
        if self.model not in MODELS:
            raise ValueError(f"agent.network.model must be one of {MODELS}, got {self.model!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"agent.network.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        sizes = [*self.hidden_sizes, *self.impala_channels, *self.model_hidden, *self.head_hidden, self.cnn_dense,
                 self.state_dim]
        if any(int(h) <= 0 for h in sizes):
            raise ValueError(f"agent.network layer sizes must be positive, got {sizes}")


def make_representation_torso(obs_shape: Sequence[int], cfg: MuesliNetworkConfig) -> nn.Module:
    """The observation torso: `impala` here, anything else from `rl.nets.networks.make_torso`."""
    if cfg.torso == "impala":
        if len(obs_shape) != 3:
            raise ValueError(f"agent.network.torso='impala' needs image observations [H, W, C]; got shape "
                             f"{tuple(obs_shape)}")
        return ImpalaCNN(tuple(cfg.impala_channels), cfg.cnn_dense, channels_first(obs_shape), cfg.activation)
    return make_torso(obs_shape, NetworkConfig(torso=cfg.torso, hidden_sizes=list(cfg.hidden_sizes),
                                               cnn_dense=cfg.cnn_dense, activation=cfg.activation))


class _Head(nn.Module):
    """Hidden dense layers, then an output layer scaled by `out_scale` at init (0: zeros)."""

    hidden: Sequence[int]
    out: int
    out_scale: float
    activation: str

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for h in self.hidden:
            x = act(nn.Dense(h)(x))
        if self.out_scale == 0.0:
            init = nn.initializers.zeros
        else:
            init = nn.initializers.variance_scaling(self.out_scale**2, "fan_in", "truncated_normal")
        return nn.Dense(self.out, kernel_init=init)(x)


@dataclasses.dataclass(frozen=True)
class NetworkSizes:
    """The static sizes of the model and heads (hashable, for the flax module)."""

    state_dim: int
    model_hidden: tuple[int, ...]
    head_hidden: tuple[int, ...]
    num_atoms: int
    activation: str = "relu"
    model: str = "mlp"  # mlp | lstm


class MuesliNetwork(nn.Module):
    """Representation, dynamics and prediction heads; call the methods through `apply(..., method=...)`.

    States are `[..., S]` for the MLP model and `[..., 2 * state_dim]` (`[h, c]`) for the LSTM model; the
    agent treats them as opaque vectors."""

    torso: nn.Module
    num_actions: int
    sizes: NetworkSizes

    def setup(self):
        s = self.sizes
        self.project = nn.Dense(s.state_dim)
        self.state_norm = nn.LayerNorm()
        if s.model == "lstm":
            self.cell_init = nn.Dense(s.state_dim)  # c_0 from h_0
            self.lstm = nn.OptimizedLSTMCell(s.state_dim)
            self.head_norm = nn.LayerNorm()
        else:
            self.dynamics_hidden = [nn.Dense(h) for h in s.model_hidden]
            self.dynamics_out = nn.Dense(self.num_actions * s.state_dim)  # one state change per action
            self.dynamics_norm = nn.LayerNorm()
        reward_out = s.num_atoms * (self.num_actions if s.model == "mlp" else 1)  # mlp: one reward per action
        self.reward_head = _Head(s.head_hidden, reward_out, 0.0, s.activation)
        self.value_head = _Head(s.head_hidden, s.num_atoms, 0.0, s.activation)
        self.policy_head = _Head(s.head_hidden, self.num_actions, 0.01, s.activation)

    def represent(self, obs):
        """Observations `[..., *obs_shape]` -> states `[..., S]` (lstm: `[..., 2 * state_dim]`, `[h_0, c_0]`)."""
        h = self.state_norm(self.project(self.torso(obs)))
        if self.sizes.model == "lstm":
            return jnp.concatenate([h, self.cell_init(h)], axis=-1)
        return h

    def _features(self, state):
        """What the policy and value heads read from a state."""
        if self.sizes.model == "lstm":
            return self.head_norm(state[..., : self.sizes.state_dim])
        return state

    def predict(self, state):
        """States -> (policy logits `[..., A]`, value logits `[..., N]`)."""
        x = self._features(state)
        return self.policy_head(x), self.value_head(x)

    def step(self, state, action):
        """(states, actions `[...]` int) -> (next states, reward logits `[..., N]`)."""
        next_state, features = self.transition(state, action)
        return next_state, self.reward(features, action)

    def step_all(self, state):
        """Every action from every state: states `[..., S]` -> (next states `[..., A, S]`, reward logits
        `[..., A, N]`); the mlp model computes its hidden layers once for all actions."""
        if self.sizes.model == "lstm":
            shape = state.shape[:-1] + (self.num_actions,)
            tiled = jnp.broadcast_to(state[..., None, :], shape + state.shape[-1:])
            return self.step(tiled, jnp.broadcast_to(jnp.arange(self.num_actions), shape))
        x = self._dynamics_hidden(state)
        next_states = self.dynamics_norm(state[..., None, :] + self._per_action(self.dynamics_out(x)))
        return next_states, self._per_action(self.reward_head(x))

    def transition(self, state, action):
        """`step` without its reward head: (next states, what the reward head reads). A model unroll applies
        `reward` once to every step's features (one large matmul instead of one per step)."""
        if self.sizes.model == "lstm":
            d = self.sizes.state_dim
            h, c = state[..., :d], state[..., d:]
            (c, h), _ = self.lstm((c, h), jax.nn.one_hot(action, self.num_actions, dtype=state.dtype))
            return jnp.concatenate([h, c], axis=-1), self.head_norm(h)
        x = self._dynamics_hidden(state)
        return self.dynamics_norm(state + _select(self._per_action(self.dynamics_out(x)), action)), x

    def reward(self, features, action):
        """Reward logits `[..., N]` of `action` `[...]` from `transition`'s features."""
        logits = self.reward_head(features)
        if self.sizes.model == "lstm":
            return logits
        return _select(self._per_action(logits), action)

    def _dynamics_hidden(self, state):
        act = ACTIVATIONS[self.sizes.activation]
        x = state
        for layer in self.dynamics_hidden:
            x = act(layer(x))
        return x

    def _per_action(self, out):
        """`[..., A * D]` -> `[..., A, D]`."""
        return out.reshape(out.shape[:-1] + (self.num_actions, out.shape[-1] // self.num_actions))

    def __call__(self, obs):
        """Touch every module (for `init`): represent, one model step with action 0, predict."""
        state = self.represent(obs)
        next_state, reward_logits = self.step(state, jnp.zeros(state.shape[:-1], jnp.int32))
        return self.predict(next_state), reward_logits


def _select(per_action, action):
    """`[..., A, D]`, actions `[...]` -> `[..., D]`."""
    return jnp.take_along_axis(per_action, action[..., None, None].astype(jnp.int32), axis=-2)[..., 0, :]


def make_network(obs_shape: Sequence[int], num_actions: int, num_atoms: int, cfg: MuesliNetworkConfig) -> MuesliNetwork:
    """The Muesli network for `obs_shape` observations, `num_actions` actions and `num_atoms` value/reward atoms."""
    sizes = NetworkSizes(cfg.state_dim, tuple(cfg.model_hidden), tuple(cfg.head_hidden), num_atoms, cfg.activation,
                         cfg.model)
    return MuesliNetwork(make_representation_torso(obs_shape, cfg), num_actions, sizes)
