"""DQN: double Q-learning with n-step returns, a target network (periodic copy or Polyak), epsilon-greedy
exploration with linear decay, Huber or MSE loss, uniform or prioritised replay from buffers/nstep.py.

Follows rl/learning/agent.py. Replay ratio: every `train_interval` vector env steps (num_envs env steps each) the
runner calls `train_step`, which makes `updates_per_train` gradient steps on batches of `batch_size`.
Epsilon decays linearly over `epsilon_decay_steps` env steps counted from the first update; the env-step
count is the learner's update count times the env steps per update, so it is exact in Anakin and follows
the learner in Sebulba.

`POPULATION_KEYS` may vary within one program (`population.agent.<key>=[...]`, rl/learning/population.py):
`act`, `epsilon` and `train_step` take a member's traced values as `hparams` (key -> scalar) in place of the
config's. Other keys change shapes or control flow: sweep them with hydra's `-m`. `POPULATION_BOUNDS`: the
ranges population-based training keeps perturbed values in (rl/learning/pbt.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from buffers.nstep import make_nstep_buffer
from buffers.priority_math import importance_weights
from rl.infra import sharding
from rl.learning.agent import StepFormat, standard_step_spec
from rl.learning.exploration import epsilon_greedy
from rl.learning.optim import OptimConfig, make_optimizer, schedule_run_updates
from rl.learning.population import hyperparams
from rl.learning.replay_ratio import ReplayRatio
from rl.learning.schedules import linear
from rl.learning.target_update import TargetNetState, update_target
from rl.learning.targets import LOSSES, q_target, taken, td_loss
from rl.nets.networks import NetworkConfig, make_q_network

POPULATION_KEYS = ("optim.lr", "discount", "tau", "huber_delta", "epsilon_start", "epsilon_end",
                   "epsilon_decay_steps", "importance_exponent")
EPSILON_KEYS = ("epsilon_start", "epsilon_end", "epsilon_decay_steps")
POPULATION_BOUNDS = {k: (0.0, 1.0) for k in ("discount", "tau", "epsilon_start", "epsilon_end")}  # PBT keeps them in


@dataclasses.dataclass
class Config:
    """Every DQN key with its default; presets (CartPole, MinAtar, the paper's Atari settings): agents/dqn.yaml."""

    name: str = "dqn"
    discount: float = 0.99
    n_step: int = 1
    batch_size: int = 64
    buffer_size: int = 10_000  # transitions in all, split evenly into one row per env
    learning_starts: int = 10_000  # env steps (summed over envs) before the first update
    train_interval: int = 1  # vector env steps between train steps
    updates_per_train: int = 1  # gradient steps per train step
    target_update_period: int = 50  # gradient steps between target-network updates
    tau: float = 1.0  # 1: copy the online params; < 1: Polyak averaging at every period
    double_q: bool = True
    loss: str = "mse"  # mse | huber
    huber_delta: float = 1.0
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_decay_steps: int = 250_000  # env steps
    eval_epsilon: float = 0.0  # epsilon of the evaluation policy (0: greedy)
    priority_exponent: float | None = None  # None: uniform replay; alpha of prioritised replay
    importance_exponent: float = 0.4  # beta of the importance weights (prioritised replay)
    priority_epsilon: float = 1e-6  # added to |td| for new priorities
    network: NetworkConfig = dataclasses.field(default_factory=NetworkConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)

    def __post_init__(self):
        if self.name != "dqn":
            raise ValueError(f"agent.name must be 'dqn' for the DQN config, got {self.name!r}")
        for key in ("n_step", "batch_size", "buffer_size", "train_interval", "updates_per_train",
                    "target_update_period"):
            if getattr(self, key) < 1:
                raise ValueError(f"agent.{key} must be >= 1, got {getattr(self, key)}")
        if self.learning_starts < 0 or self.epsilon_decay_steps < 0:
            raise ValueError("agent.learning_starts and agent.epsilon_decay_steps must be >= 0")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"agent.discount must be in [0, 1], got {self.discount}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"agent.tau must be in (0, 1], got {self.tau}")
        if self.loss not in LOSSES:
            raise ValueError(f"agent.loss must be one of {LOSSES}, got {self.loss!r}")
        for key in ("epsilon_start", "epsilon_end", "eval_epsilon"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"agent.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.priority_exponent is not None and self.priority_exponent < 0:
            raise ValueError(f"agent.priority_exponent must be >= 0 or null, got {self.priority_exponent}")


class DQN(StepFormat):
    """The DQN agent (rl/learning/agent.py protocol) for one observation shape and action count."""

    def __init__(self, cfg: Config, obs_shape: Sequence[int], obs_dtype: Any, num_actions: int,
                 num_envs: int, total_steps: int | None = None):
        capacity_per_env = cfg.buffer_size // num_envs
        if capacity_per_env <= cfg.n_step:
            raise ValueError(
                f"agent.buffer_size={cfg.buffer_size} gives {capacity_per_env} steps per env for "
                f"num_envs={num_envs}: need more than n_step={cfg.n_step}"
            )
        self.cfg, self.num_actions, self.num_envs = cfg, num_actions, num_envs
        self.obs_shape, self.obs_dtype = tuple(obs_shape), jnp.dtype(obs_dtype)
        self.step_spec = standard_step_spec(self.obs_dtype, next_obs=("next_obs", self.obs_dtype))
        self.network = make_q_network(obs_shape, num_actions, cfg.network)
        self.buffer = make_nstep_buffer(num_envs, capacity_per_env, cfg.n_step, cfg.discount,
                                        priority_exponent=cfg.priority_exponent,
                                        min_size=max(cfg.batch_size // num_envs, 1))
        self.train_interval = cfg.train_interval
        self.learning_starts = max(cfg.learning_starts, cfg.batch_size)
        self.batch_size = cfg.batch_size
        self.env_steps_per_update = num_envs * cfg.train_interval / cfg.updates_per_train
        self.run_updates = schedule_run_updates(
            cfg.optim, ReplayRatio.of(self, num_envs).run_updates(total_steps) if total_steps else None)
        self.optimizer = make_optimizer(cfg.optim, run_updates=self.run_updates)
        self._epsilon = linear(cfg.epsilon_start, cfg.epsilon_end,
                               round(cfg.epsilon_decay_steps / self.env_steps_per_update))

    def hyperparams(self, hparams: dict | None = None) -> dict:
        """`POPULATION_KEYS` -> value: a member's traced `hparams` where given, else the config's."""
        return hyperparams(self.cfg, POPULATION_KEYS, hparams)

    # --- acting -------------------------------------------------------------------------------------
    def init(self, key: jax.Array, obs_example: jax.Array) -> TargetNetState:
        params = self.network.init(key, jnp.asarray(obs_example, self.obs_dtype)[None])
        target = jax.tree_util.tree_map(jnp.copy, params)  # distinct buffers: the state can be donated
        return TargetNetState(params=params, target_params=target, opt_state=self.optimizer.init(params),
                        updates=jnp.zeros((), jnp.int32))

    def epsilon(self, state: TargetNetState, hparams: dict | None = None) -> jax.Array:
        """The exploration epsilon after `state.updates` gradient steps."""
        if not set(EPSILON_KEYS) & set(hparams or {}):
            return self._epsilon(state.updates)
        hp = self.hyperparams(hparams)
        steps = jnp.round(jnp.asarray(hp["epsilon_decay_steps"], jnp.float32) / self.env_steps_per_update)
        return linear(hp["epsilon_start"], hp["epsilon_end"], steps.astype(jnp.int32))(state.updates)

    def act(self, state: TargetNetState, obs: jax.Array, carry, key: jax.Array, env_ids: jax.Array,
            explore: bool = True, hparams: dict | None = None):
        eps = self.epsilon(state, hparams) if explore else self.cfg.eval_epsilon
        return epsilon_greedy(key, self.network.apply(state.params, obs), eps), carry, {}

    # --- learning -----------------------------------------------------------------------------------
    def _loss(self, params, target_params, batch, hp: dict | None = None):
        cfg, hp = self.cfg, hp or self.hyperparams()
        q = self.network.apply(params, batch.obs)
        q_taken = taken(q, batch.action)
        q_next_target = self.network.apply(target_params, batch.next_obs)
        q_next_online = self.network.apply(params, batch.next_obs) if cfg.double_q else None
        target = q_target(batch.reward, batch.discount, q_next_target, q_next_online)
        td = target - q_taken
        if cfg.priority_exponent is None:
            weights = jnp.ones_like(td)
        else:
            weights = importance_weights(batch.probabilities, 1, hp["importance_exponent"])
        loss = jnp.mean(weights * td_loss(td, cfg.loss, hp["huber_delta"]))
        return loss, (td, q_taken)

    def _update(self, carry, key, hparams: dict | None = None):
        state, buffer_state = carry
        cfg, hp = self.cfg, self.hyperparams(hparams)
        batch = sharding.shard_batch(self.buffer.sample(buffer_state, key, cfg.batch_size, hp["discount"]))
        grads, (td, q_taken) = jax.grad(self._loss, has_aux=True)(state.params, state.target_params, batch, hp)
        optimizer = self.optimizer if "optim.lr" not in (hparams or {}) else make_optimizer(cfg.optim, hp["optim.lr"],
                                                                                        self.run_updates)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if cfg.priority_exponent is not None:
            buffer_state = self.buffer.set_priorities(buffer_state, batch.slots,
                                                      jnp.abs(td) + cfg.priority_epsilon)
        count = state.updates + 1
        target_params = update_target(state.target_params, params, count, cfg.target_update_period, hp["tau"])
        # One reduction for the three means (XLA:CPU runs each reduction as a kernel of its own).
        loss, q, abs_td = jnp.mean(jnp.stack([td_loss(td, cfg.loss, hp["huber_delta"]), q_taken, jnp.abs(td)]), -1)
        metrics = {"loss": loss, "q": q, "abs_td": abs_td}
        state = TargetNetState(params=params, target_params=target_params, opt_state=opt_state, updates=count)
        return (state, buffer_state), metrics

    def train_step(self, state: TargetNetState, buffer_state, key: jax.Array, hparams: dict | None = None):
        keys = jax.random.split(key, self.cfg.updates_per_train)
        (state, buffer_state), metrics = jax.lax.scan(lambda c, k: self._update(c, k, hparams), (state, buffer_state),
                                                      keys)
        metrics = {k: v.mean() for k, v in metrics.items()}
        metrics["epsilon"] = self.epsilon(state, hparams)
        return state, buffer_state, metrics


def make_agent(cfg: Config, *, obs_shape: Sequence[int], obs_dtype: Any, num_actions: int,
               num_envs: int, total_steps: int | None = None) -> DQN:
    """Registry entry: `agents.make_agent` types a yaml section (`agents.agent_config`) and calls this."""
    return DQN(cfg, obs_shape, obs_dtype, num_actions, num_envs, total_steps)
