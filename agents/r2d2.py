"""R2D2 (Kapturowski et al. 2019): recurrent Q-learning from prioritised replay of stored-state sequences.

* Network: torso (MLP for vectors, Nature CNN for Atari) -> LSTM -> dueling Q head (rl/nets/recurrent.py).
* Replay: the per-env rows of `buffers.sequences`; every step stores the actor's LSTM state from *before*
  it acted (`make_step` gets it from the runner), so a sampled sequence `[L]` starts from the state the
  actor had at its first step ("stored state"; `stored_state=False` starts from zeros instead: the paper's
  zero-state ablation). Sequences start every `period` steps of a row.
* Learner: the first `burn_in` steps are unrolled without gradient (online and target network), the
  remaining `L - burn_in` are trained with n-step double-Q targets under the invertible value rescaling
  h(x) = sign(x)(sqrt(|x|+1)-1)+eps*x (rlax.transformed_n_step_q_learning). Inside a sequence the LSTM
  state is reset where an episode starts (as the actor's was), n-step returns stop at episode ends, only
  `terminated` ends a return without bootstrap, and TD errors whose n-step window would need a value past
  a truncation or past the newest stored step are masked out of the loss and the priority.
* Priorities: eta * max|td| + (1 - eta) * mean|td| over the trained steps (buffers/priority_math.py), written
  back with `buffer.set_priorities` inside the same `train_step` that receives the (donated) buffer state;
  importance weights with exponent `importance_exponent` (0 switches them off).
* Exploration: Ape-X per-actor epsilons eps_i = eps_base^(1 + alpha * i / (N - 1)) over the N envs.

`POPULATION_KEYS` may vary within one program (`population.agent.<key>=[...]`, rl/learning/population.py):
`act` and `train_step` take a member's traced values as `hparams` (key -> scalar) in place of the config's.
Other keys change shapes or control flow: sweep them with hydra's `-m`. `POPULATION_BOUNDS`: the ranges
population-based training keeps perturbed values in (rl/learning/pbt.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax

from buffers.priority_math import importance_weights, sequence_priority
from buffers.sequences import make_sequence_buffer
from rl.infra import sharding
from rl.learning.agent import StepFormat, episode_done, standard_step_spec
from rl.learning.exploration import epsilon_greedy
from rl.learning.optim import OptimConfig, make_optimizer, schedule_run_updates
from rl.learning.population import hyperparams
from rl.learning.replay_ratio import ReplayRatio
from rl.learning.target_update import TargetNetState, update_target
from rl.nets.networks import NetworkConfig
from rl.nets.recurrent import (
    LSTMCarry,
    make_recurrent_q_network,
    reset_flags,
    unroll_with_burn_in,
    zero_carry,
)

POPULATION_KEYS = ("optim.lr", "discount", "importance_exponent", "priority_eta", "epsilon_base", "epsilon_alpha")
EPSILON_KEYS = ("epsilon_base", "epsilon_alpha")
POPULATION_BOUNDS = {k: (0.0, 1.0) for k in ("discount", "priority_eta", "epsilon_base")}  # PBT keeps them in


@dataclasses.dataclass
class Config:
    """Defaults are the paper's (Acme's importance exponent); presets: agents/r2d2.yaml."""

    name: str = "r2d2"
    network: NetworkConfig = dataclasses.field(
        default_factory=lambda: NetworkConfig(hidden_sizes=[512], dueling=True, head_hidden=[512])
    )
    lstm_size: int = 512
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=1e-4, eps=1e-3))
    sequence_length: int = 80  # L: steps per replayed sequence, burn-in included
    burn_in: int = 40  # leading steps unrolled without gradient
    period: int = 40  # a sequence starts every `period` steps of an env's row (overlap L - period)
    stored_state: bool = True  # False: start every replayed sequence from the zero state
    cross_episodes: bool = False  # sequences may run past an episode end (state reset inside)
    batch_size: int = 64  # sequences per update
    n_step: int = 5
    discount: float = 0.997
    value_rescaling: bool = True  # h / h^-1 around the n-step target
    rescaling_eps: float = 1e-3
    target_update_period: int = 2500  # updates between target network copies
    buffer_size: int = 100_000  # steps in all, one row of buffer_size // num_envs steps per env
    priority_exponent: float = 0.9
    importance_exponent: float = 0.6  # 0: no importance weighting (the paper)
    priority_eta: float = 0.9  # priority = eta * max|td| + (1 - eta) * mean|td|
    epsilon_base: float = 0.4  # Ape-X actor epsilons eps_i = base^(1 + alpha i / (N-1))
    epsilon_alpha: float = 7.0
    learning_starts: int = 50_000  # env steps before the first update (at least num_envs * L)
    train_interval: int = 1  # vector env steps between updates

    def __post_init__(self):
        def need(ok: bool, msg: str):
            if not ok:
                raise ValueError(f"agent (r2d2): {msg}")

        need(self.sequence_length >= 2, f"sequence_length must be >= 2, got {self.sequence_length}")
        need(0 <= self.burn_in <= self.sequence_length - 2,
             f"burn_in must be in [0, sequence_length - 2] = [0, {self.sequence_length - 2}], got {self.burn_in}")
        need(1 <= self.period <= self.sequence_length, f"period must be in [1, sequence_length], got {self.period}")
        need(self.n_step >= 1, f"n_step must be >= 1, got {self.n_step}")
        need(0.0 <= self.discount <= 1.0, f"discount must be in [0, 1], got {self.discount}")
        need(self.lstm_size >= 1 and self.batch_size >= 1, "lstm_size and batch_size must be >= 1")
        need(self.target_update_period >= 1 and self.train_interval >= 1,
             "target_update_period and train_interval must be >= 1")
        need(self.priority_exponent >= 0 and self.importance_exponent >= 0,
             "priority_exponent and importance_exponent must be >= 0")
        need(0.0 <= self.priority_eta <= 1.0, f"priority_eta must be in [0, 1], got {self.priority_eta}")
        need(0.0 <= self.epsilon_base <= 1.0, f"epsilon_base must be in [0, 1], got {self.epsilon_base}")
        need(self.rescaling_eps >= 0 and self.learning_starts >= 0, "rescaling_eps, learning_starts must be >= 0")


def actor_epsilons(num_envs: int, base=0.4, alpha=7.0, xp=np) -> np.ndarray:
    """Ape-X epsilons `[N]`: eps_i = base^(1 + alpha * i / (N - 1)); a single env gets `base`. `xp=jnp`:
    traced `base`/`alpha` (a population member's), computed in float32 (NumPy's in float64, then rounded)."""
    if num_envs < 1:
        raise ValueError(f"actor_epsilons: num_envs must be >= 1, got {num_envs}")
    i = xp.arange(num_envs, dtype=xp.float64 if xp is np else xp.float32)
    exponent = 1.0 + alpha * i / max(num_envs - 1, 1)
    return (base**exponent).astype(xp.float32)


def valid_td_mask(mask: jax.Array, terminated: jax.Array, done: jax.Array, n: int) -> jax.Array:
    """Which TD errors of a time-major sequence have a usable n-step target: `[T, B] -> [T-1, B]` bool.

    Step t (0 <= t < T-1) bootstraps from step t+k with k = min(n, T-1-t) unless the chain stops earlier at
    a step j in its window that is done or is the newest stored step (mask[j+1] False). Stopping is fine
    when step j terminated (no bootstrap needed); after a truncation or the newest step the value needed is
    not in the sequence, so the TD error is invalid. Step t itself must be valid (mask[t]).
    """
    steps = mask.shape[0]
    stop = done[:-1] | ~mask[1:]  # [T-1]: the chain cannot continue past t
    term = terminated[:-1]
    pad = lambda x: jnp.concatenate([x, jnp.zeros((n,) + x.shape[1:], x.dtype)])
    stop_p, term_p = pad(stop), pad(term)
    ok = mask[:-1]
    alive = jnp.ones_like(ok)
    for k in range(min(n, steps - 1)):
        s, tm = stop_p[k : k + steps - 1], term_p[k : k + steps - 1]
        ok = ok & ~(alive & s & ~tm)
        alive = alive & ~s
    return ok


class R2D2(StepFormat):
    """The agent (rl/learning/agent.py protocol). Each stored step holds the actor's LSTM state from *before* it acted
    on `obs` (stored state); the next observation is the next step of the row."""

    def __init__(self, cfg: Config, *, obs_shape, obs_dtype, num_actions: int, num_envs: int,
                 total_steps: int | None = None):
        self.cfg, self.num_actions, self.num_envs = cfg, int(num_actions), int(num_envs)
        self.obs_shape, self.obs_dtype = tuple(obs_shape), jnp.dtype(obs_dtype)
        self.step_spec = standard_step_spec(self.obs_dtype, carry=("carry", None))
        self.network = make_recurrent_q_network(self.obs_shape, self.num_actions, cfg.network, cfg.lstm_size)
        self.epsilons = jnp.asarray(actor_epsilons(self.num_envs, cfg.epsilon_base, cfg.epsilon_alpha))  # [N]
        self.tx_pair = (rlax.TxPair(lambda x: rlax.signed_hyperbolic(x, cfg.rescaling_eps),
                                    lambda x: rlax.signed_parabolic(x, cfg.rescaling_eps))
                        if cfg.value_rescaling else rlax.IDENTITY_PAIR)
        capacity_per_env = cfg.buffer_size // self.num_envs
        if capacity_per_env <= cfg.sequence_length:
            raise ValueError(
                f"agent (r2d2): buffer_size // num_envs = {cfg.buffer_size} // {self.num_envs} = {capacity_per_env} "
                f"steps per env row must exceed sequence_length ({cfg.sequence_length})"
            )
        self.buffer = make_sequence_buffer(
            num_envs=self.num_envs,
            capacity_per_env=capacity_per_env,
            sequence_length=cfg.sequence_length,
            period=cfg.period,
            cross_episodes=cfg.cross_episodes,
            complete_only=True,
            priority_exponent=cfg.priority_exponent,
            done_fn=episode_done,
        )
        self.train_interval, self.batch_size = cfg.train_interval, cfg.batch_size
        # a full sequence must exist in every row before sampling can start
        self.learning_starts = max(cfg.learning_starts, self.num_envs * cfg.sequence_length)
        self.run_updates = schedule_run_updates(
            cfg.optim, ReplayRatio.of(self, num_envs).run_updates(total_steps) if total_steps else None)
        self.optimizer = make_optimizer(cfg.optim, run_updates=self.run_updates)

    def hyperparams(self, hparams: dict | None = None) -> dict:
        """`POPULATION_KEYS` -> value: a member's traced `hparams` where given, else the config's."""
        return hyperparams(self.cfg, POPULATION_KEYS, hparams)

    # ----------------------------------------------------------------------------------------- acting
    def initial_carry(self, num_envs: int) -> LSTMCarry:
        return zero_carry(num_envs, self.cfg.lstm_size)

    def init(self, key: jax.Array, obs_example: jax.Array) -> TargetNetState:
        obs = jnp.asarray(obs_example, self.obs_dtype)[None, None]  # [T=1, B=1, *obs_shape]
        params = self.network.init(key, self.initial_carry(1), obs, jnp.zeros((1, 1), bool))
        target = jax.tree_util.tree_map(jnp.copy, params)  # distinct buffers: the state may be donated
        return TargetNetState(params, target, self.optimizer.init(params), jnp.zeros((), jnp.int32))

    def member_epsilons(self, hparams: dict | None = None) -> jax.Array:
        """The actors' epsilons `[N]` (a member's, from its traced `hparams`, where they set them)."""
        if not set(EPSILON_KEYS) & set(hparams or {}):
            return self.epsilons
        hp = self.hyperparams(hparams)
        return actor_epsilons(self.num_envs, hp["epsilon_base"], hp["epsilon_alpha"], xp=jnp)

    def act(self, state: TargetNetState, obs, carry, key, env_ids, explore: bool = True,
            hparams: dict | None = None):
        """Epsilon-greedy over one LSTM step: obs `[E, ...]`, carry `[E, H]` -> actions `[E]`, next carry."""
        carry, q = self.network.apply(state.params, carry, obs[None], jnp.zeros((1, obs.shape[0]), bool))
        return epsilon_greedy(key, q[0], self.member_epsilons(hparams)[env_ids] if explore else 0.0), carry, {}

    # --------------------------------------------------------------------------------------- learning
    def sequence_loss(self, params, target_params, data, mask, weights, discount=None):
        """Loss, |td| `[T-b-1, B]` and its validity mask for batch-major sequences `data` (`[B, L, ...]`).
        `discount`: in place of the config's (a member's, traced)."""
        cfg = self.cfg
        discount = cfg.discount if discount is None else discount
        seq = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), data)  # time-major [L, B, ...]
        mask = jnp.swapaxes(mask, 0, 1)
        done = episode_done(seq)
        reset = reset_flags(done)
        batch = mask.shape[1]
        start = LSTMCarry(seq["carry"].c[0], seq["carry"].h[0])
        if not cfg.stored_state:
            start = self.initial_carry(batch)

        b = cfg.burn_in
        _, q = unroll_with_burn_in(self.network.apply, params, start, seq["obs"], reset, b)  # [L-b, B, A]
        _, q_target = unroll_with_burn_in(self.network.apply, target_params, start, seq["obs"], reset, b)
        q_target = jax.lax.stop_gradient(q_target)

        valid = valid_td_mask(mask[b:], seq["terminated"][b:], done[b:], cfg.n_step)  # [L-b-1, B]
        stop = done[b:-1] | ~mask[b + 1 :]
        discount = discount * (~stop).astype(jnp.float32)
        reward = seq["reward"][b:-1]  # padding (~mask) never reaches a valid TD: its chain is cut, hence invalid
        a_tm1 = seq["action"][b:-1]
        a_t = jnp.argmax(q[1:], axis=-1).astype(jnp.int32)  # double Q: online argmax, target value

        def td_fn(q_tm1, a_tm1, q_t, a_t, r_t, d_t):
            return rlax.transformed_n_step_q_learning(
                q_tm1, a_tm1, q_t, a_t, r_t, d_t, cfg.n_step, stop_target_gradients=True, tx_pair=self.tx_pair
            )

        td = jax.vmap(td_fn, in_axes=1, out_axes=1)(q[:-1], a_tm1, q_target[1:], a_t, reward, discount)
        td = jnp.where(valid, td, 0.0)
        per_seq = 0.5 * jnp.sum(jnp.square(td), axis=0) / td.shape[0]  # [B]
        loss = jnp.mean(weights * per_seq)
        aux = {"abs_td": jnp.abs(td), "valid": valid, "q": q}
        return loss, aux

    def train_step(self, state: TargetNetState, buffer_state, key, hparams: dict | None = None):
        cfg, hp = self.cfg, self.hyperparams(hparams)
        sample = sharding.shard_batch(self.buffer.sample(buffer_state, key, cfg.batch_size))  # data-parallel
        weights = importance_weights(sample.probabilities, self.buffer.num_slots, hp["importance_exponent"])
        grad_fn = jax.value_and_grad(self.sequence_loss, has_aux=True)
        (loss, aux), grads = grad_fn(state.params, state.target_params, sample.data, sample.mask, weights,
                                     hp["discount"])
        optimizer = self.optimizer if "optim.lr" not in (hparams or {}) else make_optimizer(cfg.optim, hp["optim.lr"],
                                                                                        self.run_updates)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        count = state.updates + 1
        target_params = update_target(state.target_params, params, count, cfg.target_update_period)

        priorities = sequence_priority(aux["abs_td"].T, aux["valid"].T, hp["priority_eta"])
        buffer_state = self.buffer.set_priorities(buffer_state, sample.slots, priorities)

        valid = aux["valid"]
        n_valid = jnp.maximum(valid.sum(), 1)
        metrics = {
            "loss": loss,
            "abs_td": jnp.sum(aux["abs_td"]) / n_valid,
            "q_mean": jnp.mean(aux["q"]),
            "priority": jnp.mean(priorities),
            "valid_fraction": valid.mean(),
            "importance_weight": jnp.mean(weights),
        }
        return TargetNetState(params, target_params, opt_state, count), buffer_state, metrics


def make_agent(cfg: Config, *, obs_shape, obs_dtype, num_actions: int, num_envs: int,
               total_steps: int | None = None) -> R2D2:
    """Registry entry: `agents.make_agent` types a yaml section (`agents.agent_config`) and calls this."""
    return R2D2(cfg, obs_shape=obs_shape, obs_dtype=obs_dtype, num_actions=num_actions,
                num_envs=num_envs, total_steps=total_steps)
