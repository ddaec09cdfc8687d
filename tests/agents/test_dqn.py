"""agents/dqn.py: config checks, acting, the update against a NumPy reference, target updates,
prioritised replay, donation; and (slow) learning CartPole with 4 vmapped seeds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import make_agent
from agents.dqn import DQNState
from rl.config import ConfigError, compose, validate


def _agent(num_envs=2, **over):
    cfg = {"name": "dqn", "batch_size": 8, "buffer_size": 64, "learning_starts": 0, "n_step": 2,
           "network": {"hidden_sizes": [8]}, "optim": {"lr": 1e-2}, **over}
    return make_agent(cfg, obs_shape=(3,), obs_dtype=jnp.float32, num_actions=2, num_envs=num_envs)


def _filled(agent, steps=20, seed=0, num_envs=2):
    """A buffer with `steps` random steps per env (some terminated, some truncated)."""
    rng = np.random.default_rng(seed)
    state = agent.buffer.init(agent.step_prototype(jnp.zeros(3)))
    ids = jnp.arange(num_envs)
    add = jax.jit(agent.buffer.add)
    for _ in range(steps):
        term = rng.random(num_envs) < 0.1
        trunc = ~term & (rng.random(num_envs) < 0.1)
        step = agent.make_step(jnp.asarray(rng.normal(size=(num_envs, 3)), jnp.float32),
                               jnp.asarray(rng.integers(0, 2, num_envs)), jnp.asarray(rng.normal(size=num_envs)),
                               jnp.asarray(term), jnp.asarray(trunc),
                               jnp.asarray(rng.normal(size=(num_envs, 3)), jnp.float32), (), {})
        state = add(state, step, ids)
    return state


def test_update_matches_numpy_reference():
    """One gradient step of double DQN with n-step targets equals a hand-written NumPy computation."""
    agent = _agent(loss="mse", double_q=True, target_update_period=1000)
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(3))
    state = state.replace(target_params=jax.tree_util.tree_map(lambda p: p * 0.5 + 0.1, state.params))
    buf = _filled(agent)
    key = jax.random.PRNGKey(7)
    new_state, _, metrics = jax.jit(agent.train_step)(state, buf, key)
    batch = jax.jit(agent.buffer.sample, static_argnums=2)(buf, jax.random.split(key, 1)[0], 8)  # train_step's key

    def q(params, x):
        p = jax.tree_util.tree_map(np.asarray, params["params"])
        h = np.maximum(x @ p["torso"]["Dense_0"]["kernel"] + p["torso"]["Dense_0"]["bias"], 0)
        return h @ p["head"]["q_out"]["kernel"] + p["head"]["q_out"]["bias"]

    obs, nxt = np.asarray(batch.obs), np.asarray(batch.next_obs)
    a = np.asarray(batch.action)
    best = q(state.params, nxt).argmax(1)
    target = np.asarray(batch.reward) + np.asarray(batch.discount) * q(state.target_params, nxt)[np.arange(8), best]
    td = target - q(state.params, obs)[np.arange(8), a]
    np.testing.assert_allclose(metrics["loss"], np.mean(0.5 * td**2), rtol=1e-4)
    np.testing.assert_allclose(metrics["abs_td"], np.mean(np.abs(td)), rtol=1e-4)
    # Adam's first step moves every parameter with a non-zero gradient by lr * sign(grad).
    step = jax.tree_util.tree_map(lambda x, y: np.abs(np.asarray(x - y)), new_state.params, state.params)
    moved = np.concatenate([s.ravel() for s in jax.tree_util.tree_leaves(step)])
    assert np.allclose(moved[moved > 1e-7], 1e-2, rtol=1e-3)
    assert int(new_state.updates) == 1


def test_target_network_period_and_polyak():
    agent = _agent(target_update_period=3)
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(3))
    buf = _filled(agent)
    step = jax.jit(agent.train_step)
    targets = []
    for i in range(6):
        state, buf, _ = step(state, buf, jax.random.PRNGKey(i))
        targets.append(state.target_params)
        same = jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, state.target_params, state.params))
        assert same == ((i + 1) % 3 == 0)
    polyak = _agent(target_update_period=1, tau=0.25)
    s0 = polyak.init(jax.random.PRNGKey(0), jnp.zeros(3))
    s1, _, _ = jax.jit(polyak.train_step)(s0, _filled(polyak), jax.random.PRNGKey(0))
    expected = jax.tree_util.tree_map(lambda t, p: 0.75 * t + 0.25 * p, s0.target_params, s1.params)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), s1.target_params, expected)


def test_epsilon_greedy_and_decay():
    agent = _agent(num_envs=4, epsilon_start=1.0, epsilon_end=0.0, epsilon_decay_steps=400, train_interval=2,
                   updates_per_train=1)
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(3))
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)
    greedy = np.asarray(jnp.argmax(agent.network.apply(state.params, obs), -1))
    # 8 env steps per update: epsilon reaches 0 after 50 updates and is 0.5 after 25.
    np.testing.assert_allclose(agent.epsilon(state.replace(updates=jnp.int32(25))), 0.5)
    keys = jax.random.split(jax.random.PRNGKey(1), 2000)
    act = jax.vmap(lambda st, k: agent.act(st, obs, (), k, jnp.arange(4))[0], in_axes=(None, 0))
    explore_all = np.asarray(act(state, keys))
    assert abs((explore_all == 1).mean() - 0.5) < 0.03  # epsilon 1: uniform over the 2 actions
    np.testing.assert_array_equal(np.asarray(act(state.replace(updates=jnp.int32(50)), keys)),
                                  np.broadcast_to(greedy, (2000, 4)))
    half = np.asarray(act(state.replace(updates=jnp.int32(25)), keys))
    assert abs((half != greedy).mean() - 0.25) < 0.03  # epsilon 0.5: a random action differs half the time
    evaluation = agent.act(state, obs, (), keys[0], jnp.arange(4), explore=False)[0]
    np.testing.assert_array_equal(np.asarray(evaluation), greedy)


def test_prioritised_replay_sets_priorities():
    agent = _agent(priority_exponent=0.6, importance_exponent=0.5)
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(3))
    buf = _filled(agent)
    _, buf2, metrics = jax.jit(agent.train_step)(state, buf, jax.random.PRNGKey(3))
    assert np.isfinite(metrics["loss"])
    changed = np.asarray(buf2.priority) != np.asarray(buf.priority)
    assert 0 < changed.sum() <= 8


def test_train_step_donates_buffer():
    agent = _agent()
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(3))
    buf = _filled(agent)
    step = jax.jit(agent.train_step, donate_argnums=(0, 1))
    leaf = buf.rows.data["obs"]
    state, buf, _ = step(state, buf, jax.random.PRNGKey(0))
    assert leaf.is_deleted()
    assert isinstance(state, DQNState)


@pytest.mark.parametrize("override, match", [
    ("agent.loss=l1", "agent.loss"), ("agent.n_step=0", "agent.n_step"), ("agent.tau=1.5", "agent.tau"),
    ("agent.epsilon_end=2", "agent.epsilon_end"), ("agent.network.torso=transformer", "network.torso"),
    ("agent.buffer_size=8", "buffer_size"),
])
def test_bad_dqn_config_is_rejected_before_jit(override, match):
    cfg = compose(["agent=dqn", override])
    with pytest.raises((ConfigError, ValueError), match=match):
        validate(cfg)
        make_agent(cfg.agent, obs_shape=(4,), obs_dtype=jnp.float32, num_actions=2, num_envs=10)


@pytest.mark.slow
def test_dqn_learns_cartpole_with_4_vmapped_seeds(tmp_path):
    """4 vmapped seeds of `agent=dqn env=cartpole` each reach a mean greedy return >= 475 (20 episodes)
    within 500k env steps, and the mean training return of the last logged chunk is >= 400."""
    from scripts.train import run

    result = run(compose(["agent=dqn", "env=cartpole", "seeds=4", "total_steps=500000", "logger=none",
                          "eval_episodes=20", "log_interval=50000"]), tmp_path)
    assert result["env_steps"] == 500_000
    eval_means = np.asarray(result["eval_returns"]).mean(1)
    assert eval_means.shape == (4,)
    assert np.all(eval_means >= 475), eval_means
    assert np.all(np.asarray(result["episode_return"]) >= 400), result["episode_return"]
