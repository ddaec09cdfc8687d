"""agents/dqn.py: config checks, acting, the update against a NumPy reference, target updates,
prioritised replay, donation; and (slow) learning CartPole with 4 vmapped seeds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import make_agent
from agents.experiment import validate
from agents.setup import compose
from rl.config import ConfigError
from rl.learning.target_update import TargetNetState


def _agent(num_envs=2, num_actions=2, **over):
    cfg = {"name": "dqn", "batch_size": 8, "buffer_size": 64, "learning_starts": 0, "n_step": 2,
           "network": {"hidden_sizes": [8]}, "optim": {"lr": 1e-2}, **over}
    return make_agent(cfg, obs_shape=(3,), obs_dtype=jnp.float32, num_actions=num_actions, num_envs=num_envs)


def _filled(agent, steps=20, seed=0, num_envs=2):
    """A buffer with `steps` random steps per env (some terminated, some truncated)."""
    rng = np.random.default_rng(seed)
    state = jax.jit(agent.buffer.init)(agent.step_prototype(jnp.zeros(3)))
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
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    state = state.replace(target_params=jax.jit(lambda ps: jax.tree_util.tree_map(lambda p: p * 0.5 + 0.1, ps))(
        state.params))
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
    step = jax.tree_util.tree_map(lambda x, y: np.abs(np.asarray(x) - np.asarray(y)), new_state.params, state.params)
    moved = np.concatenate([s.ravel() for s in jax.tree_util.tree_leaves(step)])
    assert np.allclose(moved[moved > 1e-7], 1e-2, rtol=1e-3)
    assert int(new_state.updates) == 1


def test_target_network_period_and_polyak():
    agent = _agent(target_update_period=3)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    buf = _filled(agent)
    step = jax.jit(agent.train_step)
    targets = []
    for i in range(6):
        state, buf, _ = step(state, buf, jax.random.PRNGKey(i))
        targets.append(state.target_params)
        same = jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, state.target_params, state.params))
        assert same == ((i + 1) % 3 == 0)
    polyak = _agent(target_update_period=1, tau=0.25)
    s0 = jax.jit(polyak.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    s1, _, _ = jax.jit(polyak.train_step)(s0, _filled(polyak), jax.random.PRNGKey(0))
    expected = jax.jit(lambda ts, ps: jax.tree_util.tree_map(lambda t, p: 0.75 * t + 0.25 * p, ts, ps))(
        s0.target_params, s1.params)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), s1.target_params, expected)


def test_epsilon_greedy_and_decay():
    agent = _agent(num_envs=4, epsilon_start=1.0, epsilon_end=0.0, epsilon_decay_steps=400, train_interval=2,
                   updates_per_train=1)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)
    greedy = np.asarray(jax.jit(lambda p, o: jnp.argmax(agent.network.apply(p, o), -1))(state.params, obs))
    # 8 env steps per update: epsilon reaches 0 after 50 updates and is 0.5 after 25.
    np.testing.assert_allclose(jax.jit(agent.epsilon)(state.replace(updates=jnp.int32(25))), 0.5)
    keys = jax.random.split(jax.random.PRNGKey(1), 2000)
    act = jax.jit(jax.vmap(lambda st, k: agent.act(st, obs, (), k, jnp.arange(4))[0], in_axes=(None, 0)))
    explore_all = np.asarray(act(state, keys))
    assert abs((explore_all == 1).mean() - 0.5) < 0.03  # epsilon 1: uniform over the 2 actions
    np.testing.assert_array_equal(np.asarray(act(state.replace(updates=jnp.int32(50)), keys)),
                                  np.broadcast_to(greedy, (2000, 4)))
    half = np.asarray(act(state.replace(updates=jnp.int32(25)), keys))
    assert abs((half != greedy).mean() - 0.25) < 0.03  # epsilon 0.5: a random action differs half the time
    evaluation = jax.jit(lambda st, k: agent.act(st, obs, (), k, jnp.arange(4), explore=False)[0])(state, keys[0])
    np.testing.assert_array_equal(np.asarray(evaluation), greedy)


# --------------------------------------------------------------------- the loss against a NumPy re-derivation
def _mlp_params(rng, obs_dim=3, hidden=8, actions=3, scale=1.0):
    """Parameters of the 1-hidden-layer Q network (rl/nets/networks.py, hidden_sizes=[hidden]) drawn at random."""
    f = lambda *shape: jnp.asarray((rng.normal(size=shape) * scale).astype(np.float32))
    return {"params": {"torso": {"Dense_0": {"kernel": f(obs_dim, hidden), "bias": f(hidden)}},
                       "head": {"q_out": {"kernel": f(hidden, actions), "bias": f(actions)}}}}


def _np_params(params):
    p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params["params"])
    return p["torso"]["Dense_0"]["kernel"], p["torso"]["Dense_0"]["bias"], p["head"]["q_out"]["kernel"], \
        p["head"]["q_out"]["bias"]


def _np_q(params, x):
    w1, b1, w2, b2 = _np_params(params)
    return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2


def _np_loss_and_grad(params, target_params, batch, *, loss, double_q, beta, delta=1.0):
    """DQN loss and its gradient w.r.t. the online params, derived by hand (no JAX).

    target  = r + d * Q_target(s', a*),  a* = argmax Q_online(s') (double Q) or argmax Q_target(s')
    loss    = mean_i w_i * l(target_i - Q(s_i, a_i)),  w_i = P_i^-beta / max_j P_j^-beta (1 without priorities)
    The target is a constant: only Q(s_i, a_i) carries gradient; the weights are constants too.
    """
    obs, nxt = np.asarray(batch.obs, np.float64), np.asarray(batch.next_obs, np.float64)
    a, r, d = np.asarray(batch.action), np.asarray(batch.reward, np.float64), np.asarray(batch.discount, np.float64)
    B = len(a)
    q_next_target = _np_q(target_params, nxt)
    selector = _np_q(params, nxt) if double_q else q_next_target
    best = selector.argmax(1)
    target = r + d * q_next_target[np.arange(B), best]
    w1, b1, w2, b2 = _np_params(params)
    z = obs @ w1 + b1
    h = np.maximum(z, 0.0)
    q = h @ w2 + b2
    td = target - q[np.arange(B), a]
    if beta is None:
        w = np.ones(B)
    else:
        raw = np.asarray(batch.probabilities, np.float64) ** -beta
        w = raw / raw.max()
    if loss == "mse":
        elem, dl = 0.5 * td**2, td
    else:
        elem = np.where(np.abs(td) <= delta, 0.5 * td**2, delta * (np.abs(td) - 0.5 * delta))
        dl = np.clip(td, -delta, delta)
    value = np.mean(w * elem)
    dq = np.zeros_like(q)
    dq[np.arange(B), a] = -w * dl / B  # d loss / d Q(s_i, a_i)
    dz = (dq @ w2.T) * (z > 0)
    grads = {"params": {"torso": {"Dense_0": {"kernel": obs.T @ dz, "bias": dz.sum(0)}},
                        "head": {"q_out": {"kernel": h.T @ dq, "bias": dq.sum(0)}}}}
    return value, grads, td, best


def _hand_batch(rng, B=12):
    """Transitions with terminal (discount 0), truncated/n-step (discount gamma^k) and unequal probabilities."""
    from buffers.nstep import NStepSample

    discount = rng.choice([0.0, 0.99, 0.99**2], size=B)
    discount[:2] = [0.0, 0.99**2]
    return NStepSample(obs=jnp.asarray(rng.normal(size=(B, 3)), jnp.float32),
                       action=jnp.asarray(rng.integers(0, 3, B), jnp.int32),
                       reward=jnp.asarray(rng.normal(size=B) * 3, jnp.float32),
                       discount=jnp.asarray(discount, jnp.float32),
                       next_obs=jnp.asarray(rng.normal(size=(B, 3)), jnp.float32),
                       env_ids=jnp.zeros(B, jnp.int32), slots=jnp.arange(B, dtype=jnp.int32),
                       probabilities=jnp.asarray(rng.uniform(0.005, 0.1, B), jnp.float32))


@pytest.mark.parametrize("loss", ["mse", "huber"])
@pytest.mark.parametrize("double_q", [True, False])
@pytest.mark.parametrize("prioritised", [True, False])
def test_loss_and_gradient_match_numpy_reference(loss, double_q, prioritised):
    """`DQN._loss` on a hand-made batch equals a NumPy re-derivation, in value and in gradient: n-step target
    with terminal discounts, double-Q selection by the online net (whose argmax differs from the target
    net's on the batch), importance weights P^-beta / max, and no gradient through the target."""
    over = {"priority_exponent": 0.6, "importance_exponent": 0.5} if prioritised else {}
    agent = _agent(loss=loss, double_q=double_q, num_actions=3, **over)
    rng = np.random.default_rng(0)
    params, target_params = _mlp_params(rng), _mlp_params(rng)
    batch = _hand_batch(rng)
    # The two nets disagree on the greedy next action often enough for the selection to matter.
    disagree = _np_q(params, np.asarray(batch.next_obs)).argmax(1) != _np_q(target_params,
                                                                           np.asarray(batch.next_obs)).argmax(1)
    assert disagree[np.asarray(batch.discount) > 0].sum() >= 3

    (value, (td, _)), grads = jax.jit(jax.value_and_grad(agent._loss, has_aux=True))(params, target_params, batch)
    ref_value, ref_grads, ref_td, _ = _np_loss_and_grad(params, target_params, batch, loss=loss, double_q=double_q,
                                                         beta=0.5 if prioritised else None)
    if loss == "huber":
        assert (np.abs(ref_td) > 1).sum() >= 2 and (np.abs(ref_td) < 1).sum() >= 2  # both branches
    np.testing.assert_allclose(np.asarray(td), ref_td, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(value), ref_value, rtol=1e-5)
    jax.tree_util.tree_map(lambda g, r: np.testing.assert_allclose(np.asarray(g), r, rtol=1e-4, atol=1e-6),
                           grads, ref_grads)
    # No gradient reaches the target network.
    g_target = jax.jit(jax.grad(lambda tp: agent._loss(params, tp, batch)[0]))(target_params)
    assert not any(np.any(np.asarray(x)) for x in jax.tree_util.tree_leaves(g_target))


def test_double_q_reference_differs_from_max_target():
    """Guard for the test above: with these nets, double Q and plain max-target give different targets."""
    rng = np.random.default_rng(0)
    params, target_params = _mlp_params(rng), _mlp_params(rng)
    batch = _hand_batch(rng)
    _, _, td_double, _ = _np_loss_and_grad(params, target_params, batch, loss="mse", double_q=True, beta=None)
    _, _, td_max, _ = _np_loss_and_grad(params, target_params, batch, loss="mse", double_q=False, beta=None)
    assert np.abs(td_double - td_max).max() > 0.1


def test_prioritised_train_step_sets_priorities_and_weights():
    """A prioritised train step: new priorities are exactly (|td| + eps)^alpha for the sampled slots (td from
    the NumPy reference), other slots keep theirs, and the next samples are drawn in proportion to them."""
    alpha, beta, eps = 0.6, 0.5, 1e-6
    agent = _agent(priority_exponent=alpha, importance_exponent=beta, priority_epsilon=eps, num_actions=3)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    rng = np.random.default_rng(1)
    state = state.replace(params=_mlp_params(rng), target_params=_mlp_params(rng))
    buf = _filled(agent)
    priorities = jax.jit(agent.buffer.sequences.priorities)
    sample = jax.jit(agent.buffer.sample, static_argnums=2)
    # Unequal priorities first, so that the importance weights of the sample are not all 1.
    slots_all = jnp.asarray(np.unique(np.asarray(sample(buf, jax.random.PRNGKey(11), 256).slots)))
    buf = jax.jit(agent.buffer.set_priorities)(buf, slots_all,
                                               jnp.asarray(rng.uniform(0.1, 5.0, len(slots_all)), jnp.float32))
    key = jax.random.PRNGKey(3)
    batch = sample(buf, jax.random.split(key, 1)[0], agent.batch_size)  # what train_step samples
    probs = np.asarray(batch.probabilities)
    assert probs.max() > 1.5 * probs.min()  # the importance weights differ
    ref_value, _, ref_td, _ = _np_loss_and_grad(state.params, state.target_params, batch, loss="mse", double_q=True,
                                                beta=beta)
    np.testing.assert_allclose(float(jax.jit(agent._loss)(state.params, state.target_params, batch)[0]), ref_value,
                               rtol=1e-5)

    _, buf2, metrics = jax.jit(agent.train_step)(state, buf, key)
    np.testing.assert_allclose(float(metrics["loss"]), np.mean(0.5 * ref_td**2), rtol=1e-5)
    slots = np.asarray(batch.slots)
    stored = np.asarray(priorities(buf2, jnp.asarray(slots)))
    np.testing.assert_allclose(stored, (np.abs(ref_td) + eps) ** alpha, rtol=1e-5)
    others = np.setdiff1d(np.asarray(slots_all), slots)
    np.testing.assert_array_equal(np.asarray(priorities(buf2, jnp.asarray(others))),
                                  np.asarray(priorities(buf, jnp.asarray(others))))
    # The next sample draws the updated slots in proportion to their new priority**alpha.
    draw = sample(buf2, jax.random.PRNGKey(5), 4096)
    prob = dict(zip(np.asarray(draw.slots).tolist(), np.asarray(draw.probabilities).tolist()))
    seen = [i for i, s in enumerate(slots) if s in prob]
    assert len(seen) >= 2
    i0 = seen[0]
    for i in seen[1:]:
        np.testing.assert_allclose(prob[slots[i]] / prob[slots[i0]], stored[i] / stored[i0], rtol=1e-4)


def test_train_step_donates_buffer():
    agent = _agent()
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    buf = _filled(agent)
    step = jax.jit(agent.train_step, donate_argnums=(0, 1))
    leaf = buf.rows.storage[0]
    state, buf, _ = step(state, buf, jax.random.PRNGKey(0))
    assert leaf.is_deleted()
    assert isinstance(state, TargetNetState)


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
