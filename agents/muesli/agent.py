"""Muesli (Hessel et al. 2021, "Muesli: Combining Improvements in Policy Optimization").

Acting: the policy head on the representation of the observation (no search). Learning, per train step,
on B sequences of L steps drawn from one sequence buffer: round(B * (1 - replay_fraction)) from its online
queue (the freshest unconsumed steps, consumed after every train step) and the rest from replay.

Targets come from the target ("prior") network, an EMA of the online parameters (rate 0.1):
* one-step look-ahead q(s, a) = r(s, a) + gamma v(s') through the learned model, for every action, and
  the baseline v(s) = E_{pi_prior} q(s, .);
* Retrace (lambda 0.95) over the sequence with pi_prior as target policy and the stored behaviour
  log-probabilities: G_t estimates q(s_t, a_t), V_t the state value (rl/learning/retrace.py);
* advantages normalised by the running second moment of the Retrace advantages G_t - v(s_t) (EMA, beta
  0.99), their variance since they are centred;
* CMPO: pi_cmpo(a|s) proportional to pi_prior(a|s) exp(clip((q(s, a) - v(s)) / sigma, -c, c)).

Losses on the online network: clipped-importance-weight policy gradient with the Retrace advantage (weight
3), KL(pi_cmpo || pi) at the root (weight 1), and the model loss over a K=5 step unroll from every sampled
state: KL(pi_cmpo(s_{t+k}) || pi^k), value cross-entropy towards V_{t+k} (weight 0.25) and reward
cross-entropy towards r_{t+k-1} (weight 1), both categorical over an h(x)-rescaled two-hot support.
Exploration floor (off by default): `prior_uniform_mix` mixes a uniform policy into CMPO's prior, `entropy_weight`
subtracts the root policy's entropy from the loss (linear to `entropy_end_fraction` of it over the run).
Unroll steps past an episode end (or past the stored data) are masked; the value after a terminal step
is trained towards 0.

`POPULATION_KEYS` may vary within one program (`population.agent.<key>=[...]`, rl/learning/population.py):
`train_step` takes a member's traced values as `hparams` (key -> scalar) in place of the config's (`act`
takes and ignores them). Other keys change shapes or control flow: sweep them with hydra's `-m`.
`POPULATION_BOUNDS`: the ranges population-based training keeps perturbed values in (rl/learning/pbt.py).

Shapes: B batch, L sequence length, K unroll steps, A actions, N atoms, S model state size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
import rlax
from flax import struct

from agents.muesli.networks import MuesliNetwork, MuesliNetworkConfig, make_network
from agents.muesli.targets import (
    NEEDS_RUN_LENGTH,
    Targets,
    advantage_scale,
    cmpo_log_probs,
    diagnostics,
    entropy_weight_at,
    masked_mean,
    mixed_prior_log_probs,
    unroll_indices,
    unroll_masks,
)
from buffers.sequences import make_sequence_buffer
from rl.infra import sharding
from rl.learning.agent import StepFormat, episode_done, standard_step_spec
from rl.learning.categorical import CategoricalSupport
from rl.learning.optim import OptimConfig, make_optimizer, schedule_run_updates
from rl.learning.population import hyperparams
from rl.learning.replay_ratio import ReplayRatio
from rl.learning.retrace import retrace_coefficients, retrace_targets
from rl.learning.target_update import update_target
from rl.learning.targets import taken

POPULATION_KEYS = ("optim.lr", "discount", "retrace_lambda", "target_update_rate", "adv_var_decay", "cmpo_clip",
                   "pg_weight", "cmpo_weight", "model_policy_weight", "value_weight", "reward_weight",
                   "dynamics_grad_scale", "entropy_weight", "entropy_end_fraction", "prior_uniform_mix")
POPULATION_BOUNDS = {"adv_var_decay": (0.0, 0.9999),  # PBT keeps them in (the config's ranges)
                     **{k: (0.0, 1.0) for k in ("discount", "retrace_lambda", "target_update_rate",
                                                "dynamics_grad_scale", "prior_uniform_mix", "entropy_end_fraction")}}

@dataclasses.dataclass
class Config:
    """Muesli hyper-parameters; defaults are the paper's Atari settings (Hessel et al. 2021, Tables 5-6, 9)
    where it gives them; agents/muesli.yaml cites their sources and holds the presets."""

    name: str = "muesli"
    network: MuesliNetworkConfig = dataclasses.field(default_factory=MuesliNetworkConfig)
    # Categorical value and reward: num_atoms atoms over [support_min, support_max] in h-space.
    num_atoms: int = 601
    support_min: float = -300.0
    support_max: float = 300.0
    # Data.
    batch_size: int = 96  # sequences per train step
    sequence_length: int = 30
    replay_fraction: float = 0.75  # share of each batch drawn from replay; the rest from the online queue
    buffer_size: int = 1_500_000  # env steps stored in all (split evenly over the env rows)
    length_power: float = 1.0  # sequence starts weighted by (valid steps from the start) ** power
    train_interval: int = 30  # vector env steps between train steps
    learning_starts: int = 10_000  # env steps (summed over envs) before the first train step
    # Learning.
    unroll_steps: int = 5  # K
    discount: float = 0.995
    retrace_lambda: float = 0.95
    target_update_rate: float = 0.1  # EMA step of the target/prior network towards the online one
    adv_var_decay: float = 0.99  # beta of the advantage variance EMA
    adv_var_eps: float = 1e-12
    cmpo_clip: float = 1.0  # c
    pg_weight: float = 3.0
    cmpo_weight: float = 1.0
    model_policy_weight: float = 1.0
    value_weight: float = 0.25
    reward_weight: float = 1.0
    dynamics_grad_scale: float = 0.5  # gradient scale entering each model step (as in MuZero)
    # Exploration floor. prior_uniform_mix: the share of a uniform policy in CMPO's prior (its targets keep every
    # action at >= mix / A before the advantage reweighting); entropy_weight: a bonus on the root policy's entropy,
    # linear over the run's train steps to entropy_weight * entropy_end_fraction (1: constant).
    prior_uniform_mix: float = 0.0
    entropy_weight: float = 0.0
    entropy_end_fraction: float = 1.0
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=3e-4, max_grad_norm=10.0))

    def __post_init__(self):
        def check(ok: bool, what: str):
            if not ok:
                raise ValueError(f"agent.{what}")

        check(self.name == "muesli", f"name must be 'muesli', got {self.name!r}")
        check(self.num_atoms >= 2, f"num_atoms must be >= 2, got {self.num_atoms}")
        check(self.support_max > self.support_min, "support_max must be > support_min")
        check(self.batch_size >= 1 and self.sequence_length >= 2,
              f"batch_size >= 1 and sequence_length >= 2 needed, got {self.batch_size}, {self.sequence_length}")
        for key in ("replay_fraction", "discount", "retrace_lambda", "entropy_end_fraction", "dynamics_grad_scale"):
            check(0.0 <= getattr(self, key) <= 1.0, f"{key} must be in [0, 1], got {getattr(self, key)}")
        check(self.train_interval >= 1, f"train_interval must be >= 1, got {self.train_interval}")
        check(self.learning_starts >= 0, f"learning_starts must be >= 0, got {self.learning_starts}")
        check(self.unroll_steps >= 1, f"unroll_steps must be >= 1, got {self.unroll_steps}")
        check(0.0 < self.target_update_rate <= 1.0, f"target_update_rate must be in (0, 1], got "
                                                    f"{self.target_update_rate}")
        check(0.0 <= self.adv_var_decay < 1.0, f"adv_var_decay must be in [0, 1), got {self.adv_var_decay}")
        check(self.cmpo_clip > 0, f"cmpo_clip must be > 0, got {self.cmpo_clip}")
        check(0.0 <= self.prior_uniform_mix < 1.0, f"prior_uniform_mix must be in [0, 1), got "
                                                   f"{self.prior_uniform_mix}")
        check(self.entropy_weight >= 0.0, f"entropy_weight must be >= 0, got {self.entropy_weight}")


@struct.dataclass
class MuesliState:
    params: Any
    target_params: Any
    opt_state: Any
    adv_ema: rlax.EmaState  # EMAs of the mean and second moment of the Retrace advantages
    updates: jax.Array  # int32[] train steps taken


class Muesli(StepFormat):
    """The agent surface of rl/learning/agent.py; static configuration and pure methods."""

    def __init__(self, cfg: Config, *, obs_shape: Sequence[int], obs_dtype: Any, num_actions: int, num_envs: int,
                 total_steps: int | None = None):
        self.cfg = cfg
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.obs_dtype = jnp.dtype(obs_dtype)
        self.step_spec = standard_step_spec(self.obs_dtype, behaviour_logp=("extras.behaviour_logp", jnp.float32))
        self.num_actions = int(num_actions)
        self.num_envs = int(num_envs)
        self.train_interval = cfg.train_interval
        self.batch_size = cfg.batch_size  # sequences per train step (read by scripts/bench_train.py)
        self.learning_starts = cfg.learning_starts
        self.network = make_network(self.obs_shape, self.num_actions, cfg.num_atoms, cfg.network)
        self.support = CategoricalSupport(cfg.num_atoms, cfg.support_min, cfg.support_max)
        # The run's train steps; `run_updates` only where this config's programs read them (agents/experiment.py)
        self.decay_updates = ReplayRatio.of(self, num_envs).run_updates(total_steps) if total_steps else None
        decays = cfg.entropy_end_fraction != 1.0
        self.run_updates = self.decay_updates if decays else schedule_run_updates(cfg.optim, self.decay_updates)
        self.optimizer = make_optimizer(cfg.optim, run_updates=self.run_updates)
        if decays and not self.run_updates:
            raise ValueError(NEEDS_RUN_LENGTH)
        capacity_per_env = max(cfg.buffer_size // self.num_envs, cfg.sequence_length + 1)
        self.online_batch = round(cfg.batch_size * (1.0 - cfg.replay_fraction))
        self.buffer = make_sequence_buffer(
            num_envs=self.num_envs, capacity_per_env=capacity_per_env, sequence_length=cfg.sequence_length,
            period=1, start="any", cross_episodes=True, length_power=cfg.length_power,
            online_window=cfg.sequence_length, done_fn=episode_done)

    def hyperparams(self, hparams: dict | None = None) -> dict:
        """`POPULATION_KEYS` -> value: a member's traced `hparams` where given, else the config's."""
        return hyperparams(self.cfg, POPULATION_KEYS, hparams)

    # ---- the rl/learning/agent.py surface -------------------------------------------------------------------

    def init(self, key: jax.Array, obs_example: jax.Array) -> MuesliState:
        params = self.network.init(key, jnp.asarray(obs_example)[None])
        # A copy, not the same arrays: runners donate the state, and one buffer cannot be donated twice.
        target_params = jax.tree_util.tree_map(jnp.copy, params)
        return MuesliState(params=params, target_params=target_params, opt_state=self.optimizer.init(params),
                           adv_ema=rlax.EmaState(mu=jnp.zeros(()), nu=jnp.zeros(()), decay_product=jnp.ones(())),
                           updates=jnp.zeros((), jnp.int32))

    def act(self, state: MuesliState, obs: jax.Array, carry, key: jax.Array, env_ids: jax.Array,
            explore: bool = True, hparams: dict | None = None):
        """Sample from the policy head (argmax when `explore` is False); extras hold the behaviour
        log-probability of the chosen action, which Retrace needs."""
        logits, _ = self._apply(state.params, MuesliNetwork.predict,
                                self._apply(state.params, MuesliNetwork.represent, obs))
        if explore:
            action = jax.random.categorical(key, logits, axis=-1)
        else:
            action = jnp.argmax(logits, axis=-1)
        action = action.astype(jnp.int32)
        logp = taken(jax.nn.log_softmax(logits, axis=-1), action)
        return action, carry, {"behaviour_logp": logp}

    def train_step(self, state: MuesliState, buffer_state, key: jax.Array, hparams: dict | None = None):
        """Sample online + replay sequences, consume the online queue, take one Adam step, move the target
        network and the advantage statistics."""
        sample = sharding.shard_batch(self.buffer.sample_mixed(buffer_state, key, self.cfg.batch_size,
                                                               1.0 - self.cfg.replay_fraction))  # data-parallel
        buffer_state = self.buffer.consume_online(buffer_state)
        state, metrics = self.update(state, sample.data, sample.mask, hparams)
        n_on = self.online_batch
        metrics = {**metrics, "online_steps": jnp.sum(sample.mask[:n_on]).astype(jnp.float32),
                   "replay_steps": jnp.sum(sample.mask[n_on:]).astype(jnp.float32)}
        return state, buffer_state, metrics

    # ---- learning -------------------------------------------------------------------------------------

    def update(self, state: MuesliState, batch: dict, valid: jax.Array, hparams: dict | None = None):
        """One learner update on sequences `batch` `[B, L, ...]` with validity `valid` `[B, L]`."""
        hp = self.hyperparams(hparams)
        if self.cfg.entropy_end_fraction != 1.0 or "entropy_end_fraction" in (hparams or {}):
            hp = {**hp, "entropy_weight": entropy_weight_at(hp, state.updates, self.decay_updates)}
        targets, adv_ema, target_metrics = self.targets(state, batch, valid, hp)
        grads, metrics = jax.grad(self.loss, has_aux=True)(state.params, targets, batch, valid, hp)
        optimizer = (self.optimizer if "optim.lr" not in (hparams or {})
                     else make_optimizer(self.cfg.optim, hp["optim.lr"], self.run_updates))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        updates = state.updates + 1
        target_params = update_target(state.target_params, params, updates, rate=hp["target_update_rate"])
        metrics = {**metrics, **target_metrics, "grad_norm": optax.global_norm(grads)}
        state = MuesliState(params=params, target_params=target_params, opt_state=opt_state, adv_ema=adv_ema,
                            updates=updates)
        return state, metrics

    def _apply(self, params, method, *args):
        return self.network.apply(params, *args, method=method)

    def lookahead(self, params, states: jax.Array, discount=None):
        """One-step look-ahead for every action: states `[..., S]` -> (q `[..., A]` = r + gamma v', the model's
        rewards r `[..., A]`); `discount` in place of the config's."""
        discount = self.cfg.discount if discount is None else discount
        next_states, reward_logits = self._apply(params, MuesliNetwork.step_all, states)
        _, next_value_logits = self._apply(params, MuesliNetwork.predict, next_states)
        reward = self.support.logits_to_scalar(reward_logits)
        return reward + discount * self.support.logits_to_scalar(next_value_logits), reward

    def baseline(self, params, obs: jax.Array, discount=None):
        """At observations `obs` `[..., *obs]`: (v `[...]`, q `[..., A]`, the prior's logits `[..., A]`, the
        model's rewards `[..., A]`), with q the one-step look-ahead and v its mean under the prior, the baseline
        every advantage is taken against (Retrace's v, CMPO's and the policy gradient's)."""
        states = self._apply(params, MuesliNetwork.represent, obs)
        prior_logits, _ = self._apply(params, MuesliNetwork.predict, states)
        q, model_reward = self.lookahead(params, states, discount)
        return jnp.sum(jax.nn.softmax(prior_logits, axis=-1) * q, axis=-1), q, prior_logits, model_reward

    def targets(self, state: MuesliState, batch: dict, valid: jax.Array, hp: dict | None = None):
        """Retrace, CMPO and advantage targets from the target network; updates the advantage EMA. `hp`:
        `hyperparams(...)` (default the config's)."""
        cfg, hp = self.cfg, hp or self.hyperparams()
        # v is E_prior q of the same look-ahead, so that q and v are consistent: [B, L], then [B, L, A] x 3
        v, q, prior_logits, model_reward = self.baseline(state.target_params, batch["obs"], hp["discount"])
        log_prior_taken = taken(jax.nn.log_softmax(prior_logits), batch["action"])
        q_taken = taken(q, batch["action"])
        c = retrace_coefficients(log_prior_taken, batch["behaviour_logp"], hp["retrace_lambda"])
        retrace = jax.vmap(lambda *a: retrace_targets(*a, discount=hp["discount"]))(
            q_taken, v, batch["reward"], batch["terminated"], batch["truncated"], valid, c)
        advantage = retrace.q - v
        adv_ema, scale, adv_mean = advantage_scale(state.adv_ema, advantage, retrace.mask, hp["adv_var_decay"],
                                                   cfg.adv_var_eps)
        norm_adv = (q - v[..., None]) / scale
        log_prior = mixed_prior_log_probs(prior_logits, hp["prior_uniform_mix"])
        log_cmpo = cmpo_log_probs(log_prior, norm_adv, hp["cmpo_clip"])
        targets = Targets(retrace=retrace, cmpo_log_probs=log_cmpo, pg_advantage=advantage / scale)
        metrics = {"adv_scale": scale, "adv_mean": adv_mean, "value_prior": masked_mean(v, valid),
                   "retrace_target": masked_mean(retrace.v, retrace.mask),
                   **diagnostics(log_prior, log_cmpo, norm_adv, model_reward, q_taken - v, advantage, retrace.mask,
                                 batch["reward"], valid)}
        return targets, adv_ema, metrics

    def unroll(self, params, states: jax.Array, actions: jax.Array, grad_scale=None):
        """Unroll the model K steps from every state: states `[B, L, S]`, actions `[B, L, K]` ->
        (policy logits `[B, L, K+1, A]`, value logits `[B, L, K+1, N]`, reward logits `[B, L, K, N]`);
        index 0 is the root. `grad_scale`: in place of the config's `dynamics_grad_scale`."""
        grad_scale = self.cfg.dynamics_grad_scale if grad_scale is None else grad_scale

        def body(s, a):
            s = s * grad_scale + jax.lax.stop_gradient(s) * (1 - grad_scale)
            s, features = self._apply(params, MuesliNetwork.transition, s, a)
            return s, (s, features)

        steps = jnp.moveaxis(actions, -1, 0)  # [K, B, L]
        _, (model_states, features) = jax.lax.scan(body, states, steps)
        reward_logits = self._apply(params, MuesliNetwork.reward, features, steps)  # [K, B, L, N]: one batch
        all_states = jnp.concatenate([states[None], model_states], axis=0)  # [K+1, B, L, S]
        policy_logits, value_logits = self._apply(params, MuesliNetwork.predict, all_states)
        return (jnp.moveaxis(policy_logits, 0, 2), jnp.moveaxis(value_logits, 0, 2),
                jnp.moveaxis(reward_logits, 0, 2))

    def loss(self, params, targets: Targets, batch: dict, valid: jax.Array, hp: dict | None = None):
        """The Muesli loss on sequences `[B, L]`; returns (loss, metrics). `hp`: `hyperparams(...)` (default
        the config's)."""
        cfg, hp = self.cfg, hp or self.hyperparams()
        idx = unroll_indices(valid.shape[1], cfg.unroll_steps)  # [L, K+1]
        states = self._apply(params, MuesliNetwork.represent, batch["obs"])
        policy_logits, value_logits, reward_logits = self.unroll(params, states, batch["action"][:, idx[:, :-1]],
                                                                 hp["dynamics_grad_scale"])
        log_pi = jax.nn.log_softmax(policy_logits, axis=-1)  # [B, L, K+1, A]
        same, prev_same, absorbing = unroll_masks(valid, batch["terminated"], batch["truncated"], cfg.unroll_steps)

        # Policy gradient at the root, clipped importance weight pi/mu, Retrace advantage.
        log_pi_taken = taken(log_pi[:, :, 0], batch["action"])
        rho = jax.lax.stop_gradient(jnp.minimum(1.0, jnp.exp(log_pi_taken - batch["behaviour_logp"])))
        pg_loss = masked_mean(-rho * targets.pg_advantage * log_pi_taken, targets.retrace.mask)

        # KL(pi_cmpo || pi) at the root and at the model states.
        cmpo = targets.cmpo_log_probs[:, idx]  # [B, L, K+1, A]
        kl = jnp.sum(jnp.exp(cmpo) * (cmpo - log_pi), axis=-1)  # [B, L, K+1]
        cmpo_loss = masked_mean(kl[:, :, 0], valid)
        model_policy_loss = masked_mean(kl[:, :, 1:], same[:, :, 1:])

        # Value: Retrace V at steps of the same episode; 0 right after a termination.
        has_value = same & targets.retrace.mask[:, idx]
        value_mask = has_value | absorbing
        value_target = jnp.where(has_value, targets.retrace.v[:, idx], 0.0)
        value_loss = masked_mean(self.support.cross_entropy(value_logits, value_target), value_mask)

        # Reward of the action taken at t + k - 1.
        reward_target = batch["reward"][:, idx[:, :-1]]  # [B, L, K]
        reward_loss = masked_mean(self.support.cross_entropy(reward_logits, reward_target), prev_same[:, :, 1:])

        entropy = masked_mean(-jnp.sum(jnp.exp(log_pi[:, :, 0]) * log_pi[:, :, 0], axis=-1), valid)
        loss = (hp["pg_weight"] * pg_loss + hp["cmpo_weight"] * cmpo_loss
                + hp["model_policy_weight"] * model_policy_loss + hp["value_weight"] * value_loss
                + hp["reward_weight"] * reward_loss - hp["entropy_weight"] * entropy)
        metrics = {"loss": loss, "pg_loss": pg_loss, "cmpo_kl": cmpo_loss, "model_policy_loss": model_policy_loss,
                   "value_loss": value_loss, "reward_loss": reward_loss, "entropy": entropy,
                   "valid_fraction": jnp.mean(valid.astype(jnp.float32))}
        return loss, metrics


def make_agent(cfg: Config, *, obs_shape, obs_dtype, num_actions, num_envs, total_steps=None) -> Muesli:
    """Registry entry: `agents.make_agent` types a yaml section (`agents.agent_config`) and calls this."""
    return Muesli(cfg, obs_shape=obs_shape, obs_dtype=obs_dtype, num_actions=num_actions,
                  num_envs=num_envs, total_steps=total_steps)
