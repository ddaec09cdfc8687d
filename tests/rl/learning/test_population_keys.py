"""Every population key of every agent reaches every computation it changes (rl/learning/population.py).

Per agent, with every population key at a value away from the tiny config's (VALUES): a member holding
those values as traced scalars acts and trains, for two train steps on one filled buffer, exactly as the
agent built with them, bit for bit (both read the values traced, so nothing may fall back to the config:
the n-step buffer's reward sums and bootstrap discounts follow a member's discount), and to float rounding
as that agent's plain run (the values as constants). And each key alone changes the result (an ignored key
fails). One compiled program per side and agent, the train steps scanned and the acts vmapped so that each
compiles once; the per-key runs reuse the member's."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import agent_config, make_agent, population_keys
from agents.setup import compose
from rl.learning.population import MemberState, Population, config_value
from tests.conftest import TINY_DQN
from tests.rl.learning.test_population_agents import TINY

NUM_ENVS, ROWS_T, OBS = 4, 24, (4,)
TOTAL_STEPS = 1000  # the run's length: Muesli's entropy bonus decays over its train steps
# Per agent, a value of each population key away from the tiny config's (DQN: n_step=3 so the discount
# enters the n-step reward sums, not only the bootstrap discount).
VALUES = {
    "dqn": {"optim.lr": 3e-3, "discount": 0.9, "tau": 0.5, "huber_delta": 0.5, "epsilon_start": 0.6,
            "epsilon_end": 0.2, "epsilon_decay_steps": 50.0, "importance_exponent": 0.3},
    "r2d2": {"optim.lr": 3e-3, "discount": 0.95, "importance_exponent": 0.3, "priority_eta": 0.5,
             "epsilon_base": 0.3, "epsilon_alpha": 3.0},
    "muesli": {"optim.lr": 3e-3, "discount": 0.95, "retrace_lambda": 0.8, "target_update_rate": 0.2,
               "adv_var_decay": 0.9, "cmpo_clip": 1e-4, "pg_weight": 2.0, "cmpo_weight": 0.5,
               "model_policy_weight": 0.7, "value_weight": 0.5, "reward_weight": 0.8, "dynamics_grad_scale": 0.3,
               "entropy_weight": 0.1, "entropy_end_fraction": 0.5, "prior_uniform_mix": 0.2},
}
OVERRIDES = {
    "dqn": [*TINY_DQN, "agent.n_step=3", "agent.loss=huber", "agent.priority_exponent=0.6", "agent.tau=1.0",
            "agent.target_update_period=1", "agent.learning_starts=16"],
    "r2d2": TINY["r2d2"],
    "muesli": [*TINY["muesli"], "agent.entropy_weight=0.05"],  # a bonus for entropy_end_fraction alone to decay
}
def test_the_cases_cover_every_population_key():
    assert {a: set(v) for a, v in VALUES.items()} == {a: set(population_keys(a)) for a in VALUES}


@functools.cache
def _config(agent: str):
    return agent_config(compose([*OVERRIDES[agent], "env=cartpole"]).agent)


def _with(cfg, key: str, value):
    """`cfg` with dotted `key` set to `value` (typed as the config's field)."""
    head, _, rest = key.partition(".")
    old = getattr(cfg, head)
    new = _with(old, rest, value) if rest else type(old)(value)
    return dataclasses.replace(cfg, **{head: new})


def _agent(name: str, values: dict | None = None):
    """The tiny agent `name`, with `values` (population key -> value) set in its config."""
    cfg = _config(name)
    for key, value in (values or {}).items():
        cfg = _with(cfg, key, value)
    return make_agent(cfg, obs_shape=OBS, obs_dtype=jnp.float32, num_actions=2, num_envs=NUM_ENVS,
                      total_steps=TOTAL_STEPS)


@jax.jit
def _jitter(x, key):
    return x + 0.1 * jax.random.normal(key, x.shape, x.dtype)


def _jittered(params, seed: int):
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(100 + seed), len(leaves))
    return treedef.unflatten([_jitter(x, k) for x, k in zip(leaves, keys)])


@functools.cache
def _filled(name: str):
    """The base agent's state, its online and target parameters jittered apart from their initialisation
    (whose zero heads make Muesli's advantages 0, so that no clip would bind), and a buffer of ROWS_T random
    steps per env (episodes ending now and then)."""
    agent = _agent(name)
    key = jax.random.PRNGKey(0)
    state = jax.jit(agent.init)(key, jnp.zeros(OBS))
    jitter = {f: _jittered(getattr(state, f), i) for i, f in enumerate(("params", "target_params"))}
    state = state.replace(**jitter)
    buffer_state = jax.jit(lambda: agent.buffer.init(agent.step_prototype(jnp.zeros(OBS))))()
    carry, env_ids = agent.initial_carry(NUM_ENVS), jnp.arange(NUM_ENVS)
    act, add = jax.jit(agent.act), jax.jit(agent.buffer.add)
    obs = jax.random.normal(key, (NUM_ENVS, *OBS))
    for t in range(ROWS_T):
        k_act, k_obs, k_r, k_done = jax.random.split(jax.random.fold_in(key, t), 4)
        action, next_carry, extras = act(state, obs, carry, k_act, env_ids)
        next_obs = jax.random.normal(k_obs, (NUM_ENVS, *OBS))
        done = jax.random.uniform(k_done, (NUM_ENVS,))
        step = agent.make_step(obs, action, jax.random.normal(k_r, (NUM_ENVS,)), done < 0.1,
                               (done >= 0.1) & (done < 0.15), next_obs, carry, extras)
        buffer_state = add(buffer_state, step, env_ids)
        obs, carry = next_obs, next_carry
    return state, buffer_state, obs, carry


def _program(name: str, agent, traced: bool):
    """Two train steps and exploring acts of `agent` from `_filled(name)`, compiled: `hparams ->` every leaf
    of the agent and buffer state, the metrics and the actions. `traced`: as a one-member `Population` whose
    row holds `hparams` (every population key); else the plain agent (its config's values)."""
    state, buffer_state, obs, carry = _filled(name)
    member = Population(agent, [VALUES[name]], seeds=1, overrides=[{}])

    def steps(hparams, state, buffer_state):
        if traced:
            agent_, state = member, MemberState(hparams=hparams, agent=state)
        else:
            agent_ = agent
        def train(carry_, i):  # scanned, not unrolled: the train step compiles once
            state_, buffer_state_, metrics = agent_.train_step(*carry_, jax.random.PRNGKey(i + 1))
            return (state_, buffer_state_), metrics

        (state, buffer_state), metrics = jax.lax.scan(train, (state, buffer_state), jnp.arange(2))
        # eight draws, so that an exploration rate's change shows in the actions taken
        acted = jax.vmap(lambda i: agent_.act(state, obs, carry, jax.random.PRNGKey(9 + i),
                                              jnp.arange(NUM_ENVS)))(jnp.arange(8))
        plain = state.agent if traced else state
        return jax.tree_util.tree_leaves((plain, buffer_state, metrics, acted))

    compiled = jax.jit(steps)
    return lambda hparams: [np.asarray(x) for x in compiled(hparams, state, buffer_state)]


def _hparams(values: dict) -> dict:
    return {k: np.float32(v) for k, v in values.items()}


@pytest.mark.parametrize("name", list(VALUES))
def test_members_train_as_the_agent_built_with_their_values_and_every_key_counts(name):
    cfg, values = _config(name), VALUES[name]
    built = _agent(name, values)
    member = _program(name, _agent(name), traced=True)
    ours = member(_hparams(values))
    for x, y in zip(ours, _program(name, built, traced=True)(_hparams(values)), strict=True):
        np.testing.assert_array_equal(x, y)  # nothing reads the config in place of the member's value
    for x, y in zip(ours, _program(name, built, traced=False)({}), strict=True):  # its plain run
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    base = {k: config_value(cfg, k) for k in values}
    at_base = member(_hparams(base))
    for key, value in values.items():
        moved = member(_hparams({**base, key: value}))
        assert not all(np.array_equal(x, y) for x, y in zip(moved, at_base, strict=True)), f"{name} {key} is ignored"
