"""Every `agent.dqn.*` option, checked against what it should produce: each test fails when its option is
ignored (left at its default) or misapplied. Values are compared with hand computations (NumPy) on hand-made
batches, nets and gradients; where a wrong reading of an option would give a nearby value, the test also
asserts that the wrong value is far from the right one, so that it can fail."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agents import make_agent
from agents.dqn import DQN, Config
from agents.experiment import build
from agents.setup import compose as compose_cfg
from tests.agents.test_dqn import _agent, _filled, _hand_batch, _mlp_params, _np_loss_and_grad, _np_q
from tests.buffers.test_nstep import nstep_loop

COVERS = {
    "agent.dqn.name": "test_name_selects_the_dqn_config",
    "agent.dqn.tau": "test_target_moves_by_tau_exactly_at_multiples_of_the_period",
    "agent.dqn.target_update_period": "test_target_moves_by_tau_exactly_at_multiples_of_the_period",
    "agent.dqn.epsilon_start": "test_epsilon_decays_over_env_steps_whatever_the_replay_ratio",
    "agent.dqn.epsilon_end": "test_epsilon_decays_over_env_steps_whatever_the_replay_ratio",
    "agent.dqn.epsilon_decay_steps": "test_epsilon_decays_over_env_steps_whatever_the_replay_ratio",
    "agent.dqn.train_interval": ["test_epsilon_decays_over_env_steps_whatever_the_replay_ratio",
                                 "test_learning_starts_and_train_interval_reach_the_runner"],
    "agent.dqn.updates_per_train": ["test_epsilon_decays_over_env_steps_whatever_the_replay_ratio",
                                    "test_updates_per_train_makes_that_many_gradient_steps"],
    "agent.dqn.eval_epsilon": "test_act_uses_the_online_params_and_the_right_epsilon",
    "agent.dqn.double_q": "test_loss_kind_huber_delta_and_double_q_match_numpy",
    "agent.dqn.loss": "test_loss_kind_huber_delta_and_double_q_match_numpy",
    "agent.dqn.huber_delta": "test_loss_kind_huber_delta_and_double_q_match_numpy",
    "agent.dqn.n_step": "test_replayed_transitions_use_n_step_and_discount",
    "agent.dqn.discount": "test_replayed_transitions_use_n_step_and_discount",
    "agent.dqn.buffer_size": "test_buffer_size_is_split_into_one_row_per_env",
    "agent.dqn.learning_starts": "test_learning_starts_and_train_interval_reach_the_runner",
    "agent.dqn.batch_size": ["test_prioritised_sgd_step_matches_numpy",
                             "test_learning_starts_and_train_interval_reach_the_runner"],
    "agent.dqn.priority_exponent": "test_prioritised_sgd_step_matches_numpy",
    "agent.dqn.importance_exponent": "test_prioritised_sgd_step_matches_numpy",
    "agent.dqn.priority_epsilon": "test_prioritised_sgd_step_matches_numpy",
    "agent.dqn.optim.name": ["test_optimizer_matches_numpy", "test_prioritised_sgd_step_matches_numpy"],
    "agent.dqn.optim.lr": ["test_optimizer_matches_numpy", "test_prioritised_sgd_step_matches_numpy"],
    "agent.dqn.optim.eps": "test_optimizer_matches_numpy",
    "agent.dqn.optim.weight_decay": "test_optimizer_matches_numpy",
    "agent.dqn.optim.max_grad_norm": "test_optimizer_matches_numpy",
    "agent.dqn.optim.lr_schedule": "test_linear_lr_schedule_matches_the_formula",
    "agent.dqn.optim.lr_end_fraction": "test_linear_lr_schedule_matches_the_formula",
    "agent.dqn.optim.lr_decay_updates": ["test_linear_lr_schedule_matches_the_formula",
                                         "test_lr_decay_updates_0_decays_over_the_whole_run"],
    "agent.dqn.network.hidden_sizes": "test_mlp_layers_and_activation_match_numpy",
    "agent.dqn.network.head_hidden": ["test_mlp_layers_and_activation_match_numpy",
                                      "test_dueling_head_matches_numpy"],
    "agent.dqn.network.activation": "test_mlp_layers_and_activation_match_numpy",
    "agent.dqn.network.dueling": "test_dueling_head_matches_numpy",
    "agent.dqn.network.torso": "test_torso_and_cnn_dense_set_the_layers",
    "agent.dqn.network.cnn_dense": "test_torso_and_cnn_dense_set_the_layers",
}


def _np(tree):
    return jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), tree)


def _assert_tree_close(actual, expected, rtol=1e-5, atol=1e-6):
    jax.tree_util.tree_map(lambda a, e: np.testing.assert_allclose(np.asarray(a), e, rtol=rtol, atol=atol),
                           actual, expected)


def _history(agent, steps, num_envs, term=(), trunc=()):
    """A buffer holding `steps` steps per env whose obs[0] is the step index t and obs[1] the env; reward
    r = t + 10 e + 1, terminated at the (t, e) of `term`, truncated at those of `trunc`. Returns the buffer
    state and each env's history (dicts, as `tests/buffers/test_nstep.nstep_loop` reads them)."""
    state = jax.jit(agent.buffer.init)(agent.step_prototype(jnp.zeros(3)))
    add = jax.jit(lambda st, fields, ids: agent.buffer.add(st, agent.make_step(*fields, (), {}), ids))
    hist = [[] for _ in range(num_envs)]
    for t in range(steps):
        obs = np.array([[t, e, 0.0] for e in range(num_envs)], np.float32)
        step = {"obs": obs, "action": np.zeros(num_envs, np.int32),
                "reward": np.array([t + 10 * e + 1.0 for e in range(num_envs)], np.float32),
                "terminated": np.array([(t, e) in term for e in range(num_envs)]),
                "truncated": np.array([(t, e) in trunc for e in range(num_envs)]),
                "next_obs": obs + np.float32(0.5)}
        for e in range(num_envs):
            hist[e].append({k: v[e] for k, v in step.items()})
        state = add(state, tuple(jnp.asarray(step[k]) for k in
                                 ("obs", "action", "reward", "terminated", "truncated", "next_obs")),
                    jnp.arange(num_envs))
    return state, hist


# --------------------------------------------------------------------------------------------- registry
def test_name_selects_the_dqn_config():
    """`name: dqn` builds the DQN agent; the DQN config refuses any other name."""
    assert isinstance(_agent(), DQN)
    with pytest.raises(ValueError, match="agent.name must be 'dqn'"):
        Config(name="r2d2")


# --------------------------------------------------------------------------------------------- target network
@pytest.mark.parametrize("tau", [0.25, 1.0])
def test_target_moves_by_tau_exactly_at_multiples_of_the_period(tau):
    """With `target_update_period=3`, the target stays put for two updates and at every third one becomes
    tau * online + (1 - tau) * target (the online params after that update), checked over 7 updates."""
    agent = _agent(target_update_period=3, tau=tau, optim={"name": "sgd", "lr": 0.05})
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    state = state.replace(target_params=jax.jit(lambda ps: jax.tree_util.tree_map(lambda p: 0.5 * p + 0.1, ps))(
        state.params))
    buf = _filled(agent)
    step = jax.jit(agent.train_step)
    expected = _np(state.target_params)
    for i in range(1, 8):
        before = _np(state.params)
        state, buf, _ = step(state, buf, jax.random.PRNGKey(i))
        online = _np(state.params)
        assert max(np.abs(a - b).max() for a, b in zip(jax.tree_util.tree_leaves(online),
                                                         jax.tree_util.tree_leaves(before))) > 1e-4
        if i % 3 == 0:
            expected = jax.tree_util.tree_map(lambda o, t: tau * o + (1 - tau) * t, online, expected)
        _assert_tree_close(state.target_params, expected)


# --------------------------------------------------------------------------------------------- exploration
def test_epsilon_decays_over_env_steps_whatever_the_replay_ratio():
    """2 envs, `train_interval=3`, `updates_per_train=4`: each train step is 6 env steps and 4 updates. After
    k train steps epsilon is start + (end - start) * min(6k / epsilon_decay_steps, 1) (env steps, not
    updates), in `agent.epsilon` and in the train metrics."""
    start, end, decay = 0.9, 0.1, 48
    agent = _agent(train_interval=3, updates_per_train=4, epsilon_start=start, epsilon_end=end,
                   epsilon_decay_steps=decay)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    buf = _filled(agent)
    step, epsilon = jax.jit(agent.train_step), jax.jit(agent.epsilon)
    np.testing.assert_allclose(epsilon(state), start, rtol=1e-6)
    for k in range(1, 11):
        state, buf, metrics = step(state, buf, jax.random.PRNGKey(k))
        assert int(state.updates) == 4 * k
        expected = start + (end - start) * min(6 * k / decay, 1.0)
        np.testing.assert_allclose(epsilon(state), expected, rtol=1e-5)
        np.testing.assert_allclose(metrics["epsilon"], expected, rtol=1e-5)


def test_updates_per_train_makes_that_many_gradient_steps():
    """`updates_per_train=3`: one train step equals 3 single updates made in turn with the keys
    split(key, 3) (plain SGD, so every update moves the params)."""
    agent = _agent(updates_per_train=3, target_update_period=2, optim={"name": "sgd", "lr": 0.05})
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    buf = _filled(agent)
    key = jax.random.PRNGKey(4)
    new_state, _, _ = jax.jit(agent.train_step)(state, buf, key)
    update = jax.jit(agent._update)
    manual, biases = (state, buf), []
    for k in jax.random.split(key, 3):
        manual, _ = update(manual, k)
        biases.append(np.asarray(manual[0].params["params"]["head"]["q_out"]["bias"]))
    assert int(new_state.updates) == int(manual[0].updates) == 3
    _assert_tree_close(new_state.params, _np(manual[0].params))
    _assert_tree_close(new_state.target_params, _np(manual[0].target_params))
    assert np.abs(biases[0] - biases[2]).max() > 1e-4  # one update would not do


def test_logged_metrics_are_the_mean_over_the_updates_of_a_train_step():
    """`updates_per_train=3`: the train step's `loss`, `q` and `abs_td` are the means over its 3 updates of
    each update's values, computed here with NumPy from the batch that update sampled (the last update's values
    alone are far from them: SGD moves the params between updates); `epsilon` is the one after the step."""
    agent = _agent(updates_per_train=3, loss="mse", optim={"name": "sgd", "lr": 0.5})
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    buf = _filled(agent)
    key = jax.random.PRNGKey(4)
    _, _, metrics = jax.jit(agent.train_step)(state, buf, key)
    update, sample = jax.jit(agent._update), jax.jit(lambda b, k: agent.buffer.sample(b, k, 8, 0.99))
    manual, per_update = (state, buf), []
    for k in jax.random.split(key, 3):
        s, batch = manual[0], sample(manual[1], k)
        _, _, td, _ = _np_loss_and_grad(s.params, s.target_params, batch, loss="mse", double_q=True, beta=None)
        q_taken = _np_q(s.params, np.asarray(batch.obs, np.float64))[np.arange(8), np.asarray(batch.action)]
        per_update.append([np.mean(0.5 * td**2), np.mean(q_taken), np.mean(np.abs(td))])
        manual, _ = update(manual, k)
    expected, last = np.mean(per_update, 0), np.asarray(per_update[-1])
    got = np.array([float(metrics[k]) for k in ("loss", "q", "abs_td")])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert np.abs(last - expected).max() > 1e-2 * np.abs(expected).max()  # the last update's would fail
    assert float(metrics["epsilon"]) == pytest.approx(float(jax.jit(agent.epsilon)(manual[0])))


@pytest.mark.parametrize("eval_epsilon", [0.0, 0.3, 1.0])
def test_act_uses_the_online_params_and_the_right_epsilon(eval_epsilon):
    """act's greedy action is the argmax of the ONLINE params (a target net that disagrees on many
    observations is ignored); `explore=False` draws a random action with probability `eval_epsilon`,
    `explore=True` with `agent.epsilon(state)` (set far from eval_epsilon): the fraction of actions off the
    greedy one is eps * (A - 1) / A, and with eps = 1 every action is equally likely."""
    train_eps = 1.0 if eval_epsilon < 0.5 else 0.0
    agent = _agent(num_actions=3, eval_epsilon=eval_epsilon, epsilon_start=train_eps, epsilon_end=train_eps)
    rng = np.random.default_rng(0)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    state = state.replace(params=_mlp_params(rng), target_params=_mlp_params(rng))
    obs = rng.normal(size=(32, 3)).astype(np.float32)
    greedy, target_greedy = _np_q(state.params, obs).argmax(1), _np_q(state.target_params, obs).argmax(1)
    assert (greedy != target_greedy).sum() >= 10
    keys = jax.random.split(jax.random.PRNGKey(1), 1000)
    ids = jnp.arange(32)
    for explore, eps in ((False, eval_epsilon), (True, train_eps)):
        acts = np.asarray(jax.jit(jax.vmap(lambda k, explore=explore: agent.act(state, jnp.asarray(obs), (), k, ids,
                                                                                explore=explore)[0]))(keys))
        if eps == 0.0:
            np.testing.assert_array_equal(acts, np.broadcast_to(greedy, acts.shape))
        assert abs((acts != greedy).mean() - eps * 2 / 3) < 0.015, (explore, eps)
        if eps == 1.0:
            np.testing.assert_allclose(np.bincount(acts.ravel(), minlength=3) / acts.size, 1 / 3, atol=0.015)


# --------------------------------------------------------------------------------------------- loss
@pytest.mark.parametrize("loss, delta, double_q", [("huber", 2.5, True), ("huber", 0.4, False), ("mse", 2.5, False)])
def test_loss_kind_huber_delta_and_double_q_match_numpy(loss, delta, double_q):
    """`DQN._loss` on a hand-made batch (nets whose greedy next actions disagree) equals the NumPy loss for
    these options: Huber with this `huber_delta` (TD errors on both sides of it) or 0.5 td^2, and the
    bootstrap action chosen by the online net (double Q) or the target net. Reading any of the three options
    wrongly (default delta, the other loss, the other selector) gives a loss far from this one."""
    agent = _agent(loss=loss, huber_delta=delta, double_q=double_q, num_actions=3)
    rng = np.random.default_rng(0)
    params, target_params = _mlp_params(rng), _mlp_params(rng)
    batch = _hand_batch(rng)
    value, (td, _) = jax.jit(agent._loss)(params, target_params, batch)

    def ref(**over):
        kw = {"loss": loss, "delta": delta, "double_q": double_q, **over}
        return _np_loss_and_grad(params, target_params, batch, beta=None, **kw)

    ref_value, _, ref_td, _ = ref()
    np.testing.assert_allclose(np.asarray(td), ref_td, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(value), ref_value, rtol=1e-5)
    abs_td = np.abs(ref_td)
    if loss == "huber":
        assert (abs_td < delta).any() and (abs_td > delta).sum() >= 2  # both branches of the Huber loss
        assert ((abs_td - delta) * (abs_td - 1.0) < 0).any()  # a TD error between the delta and the default 1
    wrong = [ref(double_q=not double_q)[0], ref(loss="mse" if loss == "huber" else "huber")[0]]
    if loss == "huber":
        wrong.append(ref(delta=1.0)[0])
    for w in wrong:
        assert abs(w - ref_value) > 0.05 * abs(ref_value), (w, ref_value)


# --------------------------------------------------------------------------------------------- replay
def test_replayed_transitions_use_n_step_and_discount():
    """The agent's buffer returns `n_step=3`-step transitions discounted by `discount=0.8`: every sampled
    reward, discount and next_obs equals the NumPy n-step loop over the stored history (episode ends
    included)."""
    n, gamma, E = 3, 0.8, 2
    agent = _agent(num_envs=E, n_step=n, discount=gamma, buffer_size=64)
    buf, hist = _history(agent, 20, E, term=[(5, 0), (12, 1)], trunc=[(9, 0)])
    sample = jax.jit(agent.buffer.sample, static_argnums=2)(buf, jax.random.PRNGKey(0), 256)
    s = jax.tree_util.tree_map(np.asarray, sample)
    full = 0
    for b in range(256):
        t, e = int(s.obs[b, 0]), int(s.obs[b, 1])
        ret, disc, next_obs = nstep_loop(hist[e], t, n, gamma)
        np.testing.assert_allclose(s.reward[b], ret, rtol=1e-5)
        np.testing.assert_allclose(s.discount[b], disc, rtol=1e-5)
        np.testing.assert_array_equal(s.next_obs[b], next_obs)
        full += disc == pytest.approx(gamma**n)
    assert full >= 50  # many full 3-step windows were checked


def test_buffer_size_is_split_into_one_row_per_env():
    """`buffer_size=12` with 2 envs keeps the newest 6 steps of each env: after 10 steps the samples are
    exactly the steps 4..9 of both envs."""
    agent = _agent(num_envs=2, n_step=1, buffer_size=12)
    buf, _ = _history(agent, 10, 2)
    s = jax.jit(agent.buffer.sample, static_argnums=2)(buf, jax.random.PRNGKey(0), 512)
    seen = {(int(t), int(e)) for t, e in np.asarray(s.obs)[:, :2]}
    assert seen == {(t, e) for t in range(4, 10) for e in range(2)}


def test_prioritised_sgd_step_matches_numpy():
    """One train step with prioritised replay and plain SGD: the batch is the `batch_size=6` sample of
    train_step's key, the params move by -lr * the NumPy gradient of the loss weighted by
    P^-importance_exponent / max (unequal priorities first, so the weights differ), and the sampled slots get
    the priority (|td| + priority_epsilon)^priority_exponent."""
    alpha, beta, eps, lr, B = 0.5, 0.9, 0.25, 0.1, 6
    agent = _agent(num_actions=3, batch_size=B, priority_exponent=alpha, importance_exponent=beta,
                   priority_epsilon=eps, optim={"name": "sgd", "lr": lr})
    rng = np.random.default_rng(1)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    state = state.replace(params=_mlp_params(rng), target_params=_mlp_params(rng))
    buf = _filled(agent)
    written = jnp.asarray([e * 32 + t for e in range(2) for t in range(20)], jnp.int32)  # _filled's slots
    buf = jax.jit(agent.buffer.set_priorities)(buf, written, jnp.asarray(rng.uniform(0.1, 20.0, 40), jnp.float32))
    key = jax.random.PRNGKey(3)
    batch = jax.jit(agent.buffer.sample, static_argnums=2)(buf, jax.random.split(key, 1)[0], B)  # train_step's
    assert np.asarray(batch.probabilities).max() > 2 * np.asarray(batch.probabilities).min()
    ref = lambda b: _np_loss_and_grad(state.params, state.target_params, batch, loss="mse", double_q=True, beta=b)
    _, ref_grads, ref_td, _ = ref(beta)
    new_state, buf2, _ = jax.jit(agent.train_step)(state, buf, key)
    _assert_tree_close(new_state.params, jax.tree_util.tree_map(lambda p, g: p - lr * g, _np(state.params),
                                                                ref_grads))
    stored = np.asarray(jax.jit(agent.buffer.sequences.priorities)(buf2, batch.slots))
    np.testing.assert_allclose(stored, (np.abs(ref_td) + eps) ** alpha, rtol=1e-5)
    # The weights matter: the default beta (0.4) moves the head bias elsewhere.
    bias = lambda g: g["params"]["head"]["q_out"]["bias"]
    assert np.abs(bias(ref(0.4)[1]) - bias(ref_grads)).max() > 0.05 * np.abs(bias(ref_grads)).max()


def test_learning_starts_and_train_interval_reach_the_runner(tiny_cfg):
    """The runner reads the replay ratio from the agent: `train_interval` vector steps per iteration and the
    first train step at the first iteration with max(learning_starts, batch_size) env steps."""
    runner = build(tiny_cfg("agent.learning_starts=50", "agent.batch_size=8", "agent.train_interval=3"))
    assert runner.agent.learning_starts == 50 and runner.agent.batch_size == 8
    assert runner.agent.train_interval == 3 and runner.steps_per_iter == 4 * 3
    assert runner.learn_iter == math.ceil(50 / 12)
    assert _agent(learning_starts=3, batch_size=16).learning_starts == 16  # never before one batch is stored


# --------------------------------------------------------------------------------------------- optimiser
_GRADS = [np.array([30.0, -40.0, 0.5, 2.0]), np.array([0.3, 0.1, -0.2, 0.05]), np.array([-6.0, 8.0, 1.0, -2.0]),
          np.array([0.2, -0.1, 0.4, 0.3])]
_PARAMS = np.array([1.0, -2.0, 0.5, 3.0])
_DEFAULTS = {"name": "adam", "lr": 2.5e-4, "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 0.0}


def _np_updates(name, lr, eps, weight_decay, max_grad_norm, clip_after=False):
    """The updates of `optim.name` on _GRADS from _PARAMS, by hand: the raw gradient clipped to global norm
    `max_grad_norm` first (or, `clip_after`, the optimiser's update clipped instead), then sgd (-lr g), adam
    (b1 0.9, b2 0.999, bias-corrected, eps outside the root), adamw (adam + weight_decay * params) or
    centered rmsprop (decay 0.9, eps inside the root, no bias correction)."""
    p, m, v, out = _PARAMS.copy(), np.zeros(4), np.zeros(4), []
    clip = lambda x: x * min(1.0, max_grad_norm / np.linalg.norm(x)) if max_grad_norm > 0 else x
    for t, g in enumerate(_GRADS, 1):
        g = g if clip_after else clip(g)
        if name == "sgd":
            u = -lr * g
        elif name == "rmsprop":
            m, v = 0.9 * m + 0.1 * g, 0.9 * v + 0.1 * g**2
            u = -lr * g / np.sqrt(v - m**2 + eps)
        else:
            m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g**2
            u = (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + eps)
            u = -lr * (u + (weight_decay * p if name == "adamw" else 0.0))
        u = clip(u) if clip_after else u
        p = p + u
        out.append(u)
    return np.stack(out)


def _run_optimizer(opt, grads=_GRADS):
    """The updates `opt` makes on `grads` from _PARAMS (compiled, as a run's train step is)."""
    params = {"w": jnp.asarray(_PARAMS, jnp.float32)}
    state, out = jax.jit(opt.init)(params), []

    def step(g, state, params):
        u, state = opt.update(g, state, params)
        return u, state, optax.apply_updates(params, u)

    step = jax.jit(step)

    for g in grads:
        u, state, params = step({"w": jnp.asarray(g, jnp.float32)}, state, params)
        out.append(np.asarray(u["w"]))
    return np.stack(out)


@pytest.mark.parametrize("optim", [
    {"name": "sgd", "lr": 0.1},
    {"name": "adam", "lr": 0.1, "eps": 0.3},
    {"name": "adamw", "lr": 0.1, "eps": 0.3, "weight_decay": 0.5},
    {"name": "rmsprop", "lr": 0.1, "eps": 0.3},
    {"name": "adam", "lr": 2.0, "max_grad_norm": 1.0},
    {"name": "sgd", "lr": 0.5, "max_grad_norm": 1.0},
])
def test_optimizer_matches_numpy(optim):
    """The DQN agent's optimiser (its `optim:` section) makes the updates of the NumPy reference over 4
    gradients of very different norms; every option of the case matters: resetting any one to its default,
    or clipping the optimiser's update instead of the raw gradient, gives updates far from these."""
    actual = _run_optimizer(_agent(optim=optim).optimizer)
    cfg = {**_DEFAULTS, **optim}
    expected = _np_updates(**cfg)
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=1e-7)
    wrong = [_np_updates(**{**cfg, key: _DEFAULTS[key]}) for key in optim if optim[key] != _DEFAULTS[key]]
    if cfg["max_grad_norm"] > 0:
        wrong.append(_np_updates(**cfg, clip_after=True))
    if cfg["name"] == "adamw":
        wrong.append(_np_updates(**{**cfg, "weight_decay": 1e-4}))  # optax's own default
    for w in wrong:
        assert np.abs(w - expected).max() > 0.02 * np.abs(expected).max()


def test_linear_lr_schedule_matches_the_formula():
    """`lr_schedule=linear`: SGD update k (0-based) is -lr_k g with lr_k = lr (1 - (1 - lr_end_fraction)
    min(k / lr_decay_updates, 1)), so the lr falls over `lr_decay_updates` updates and then stays at
    lr * lr_end_fraction; `constant` keeps lr."""
    grads = [np.array([1.0, -2.0, 0.5, 4.0])] * 7
    lr, frac, decay = 0.2, 0.25, 4
    linear = _agent(optim={"name": "sgd", "lr": lr, "lr_schedule": "linear", "lr_end_fraction": frac,
                           "lr_decay_updates": decay}).optimizer
    steps = _run_optimizer(linear, grads) / -grads[0]
    expected = [lr * (1 - (1 - frac) * min(k / decay, 1)) for k in range(7)]
    np.testing.assert_allclose(steps, np.broadcast_to(np.array(expected)[:, None], steps.shape), rtol=1e-5)
    constant = _agent(optim={"name": "sgd", "lr": lr, "lr_end_fraction": frac, "lr_decay_updates": decay}).optimizer
    np.testing.assert_allclose(_run_optimizer(constant, grads) / -grads[0], lr, rtol=1e-5)


def test_lr_decay_updates_0_decays_over_the_whole_run(tmp_path):
    """`lr_schedule=linear lr_decay_updates=0`: the decay spans the run's gradient steps, counted by the
    runner (4 envs x train_interval 3 = 12 env steps per train step from the first iteration reaching
    learning_starts=50, i.e. iterations 5..17 (1-based) of ceil(200 / 12) = 17, x updates_per_train 2 = 26: the
    agent's optimiser reaches 0 at its 27th step); a set lr_decay_updates is kept; an agent built outside a run refuses 0 with a message naming the fix."""
    from agents.experiment import train

    common = ["agent=dqn", "env=cartpole", "total_steps=200", "num_envs=4", "agent.learning_starts=50",
              "agent.batch_size=8", "agent.train_interval=3", "agent.updates_per_train=2",
              "agent.optim.lr_schedule=linear", "logger=none", "eval_interval=0", "eval_episodes=1",
              "checkpoint.enabled=false"]
    res = train(*common, run_dir=tmp_path / "run")
    updates = int(np.asarray(res["state"][0].agent.updates).reshape(-1)[0])
    assert updates == 26
    agent = build(compose_cfg(common)).agent
    lr = agent.cfg.optim.lr
    # Adam on constant grads: the lr itself. Op by op, the lr is exactly 0 once decayed (under jit, optax's
    # linear schedule ends at about -1e-11, which atol=1e-12 would refuse).
    steps = -_run_optimizer(agent.optimizer, [np.ones(4)] * 28)[:, 0]
    np.testing.assert_allclose(steps, [lr * max(1 - k / 26, 0) for k in range(28)], rtol=1e-4, atol=1e-12)
    assert build(compose_cfg([*common, "agent.optim.lr_decay_updates=7"])).agent.cfg.optim.lr_decay_updates == 7
    with pytest.raises(ValueError, match="lr_decay_updates=0 decays over the whole run"):
        _agent(optim={"lr_schedule": "linear"})


# --------------------------------------------------------------------------------------------- network
_ACT = {"relu": lambda x: np.maximum(x, 0), "tanh": np.tanh, "elu": lambda x: np.where(x > 0, x, np.expm1(x)),
        "silu": lambda x: x / (1 + np.exp(-x)),
        "gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))}


def _dense(p, x):
    return x @ p["kernel"] + p["bias"]


@pytest.mark.parametrize("activation", sorted(_ACT))
def test_mlp_layers_and_activation_match_numpy(activation):
    """`hidden_sizes=[5, 4]`, `head_hidden=[3]`: the param shapes are those layers, and Q equals the NumPy
    forward pass with `activation` after every hidden layer of the torso and of the head."""
    agent = _agent(network={"hidden_sizes": [5, 4], "head_hidden": [3], "activation": activation})
    params = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3)).params
    shapes = jax.tree_util.tree_map(np.shape, params["params"])
    assert shapes == {"torso": {"Dense_0": {"kernel": (3, 5), "bias": (5,)}, "Dense_1": {"kernel": (5, 4), "bias": (4,)}},
                      "head": {"q_0": {"kernel": (4, 3), "bias": (3,)}, "q_out": {"kernel": (3, 2), "bias": (2,)}}}
    p = _np(params["params"])
    x = np.random.default_rng(0).normal(size=(16, 3)) * 2
    f = _ACT[activation]
    h = f(_dense(p["torso"]["Dense_1"], f(_dense(p["torso"]["Dense_0"], x))))
    q = _dense(p["head"]["q_out"], f(_dense(p["head"]["q_0"], h)))
    np.testing.assert_allclose(np.asarray(jax.jit(agent.network.apply)(params, jnp.asarray(x, jnp.float32))), q,
                               rtol=1e-4, atol=1e-5)


def test_dueling_head_matches_numpy():
    """`dueling=true` (with `head_hidden=[3]`): value and advantage streams, Q = V + A - mean_a A."""
    agent = _agent(num_actions=3, network={"hidden_sizes": [4], "head_hidden": [3], "dueling": True})
    params = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3)).params
    head = _np(params["params"]["head"])
    assert set(head) == {"value_0", "value_out", "advantage_0", "advantage_out"}
    assert head["value_out"]["kernel"].shape == (3, 1) and head["advantage_out"]["kernel"].shape == (3, 3)
    x = np.random.default_rng(0).normal(size=(16, 3))
    h = np.maximum(_dense(_np(params["params"]["torso"])["Dense_0"], x), 0)
    v = _dense(head["value_out"], np.maximum(_dense(head["value_0"], h), 0))
    a = _dense(head["advantage_out"], np.maximum(_dense(head["advantage_0"], h), 0))
    q = v + a - a.mean(1, keepdims=True)
    np.testing.assert_allclose(np.asarray(jax.jit(agent.network.apply)(params, jnp.asarray(x, jnp.float32))), q,
                               rtol=1e-4, atol=1e-5)
    assert np.abs(a.mean(1)).max() > 1e-3  # the mean is not zero by chance


_NATURE = {"Conv_0": (8, 8, 4, 32), "Conv_1": (4, 4, 32, 64), "Conv_2": (3, 3, 64, 64)}


@pytest.mark.parametrize("obs_shape, network, kernels", [
    ((10, 10, 4), {"cnn_dense": 7}, {"Conv_0": (3, 3, 4, 16), "Dense_0": (8 * 8 * 16, 7)}),
    ((10, 10, 4), {"torso": "mlp", "hidden_sizes": [5]}, {"Dense_0": (400, 5)}),
    ((36, 36, 4), {"cnn_dense": 9}, {**_NATURE, "Dense_0": (64, 9)}),
    ((36, 36, 4), {"torso": "small_cnn", "cnn_dense": 7}, {"Conv_0": (3, 3, 4, 16), "Dense_0": (34 * 34 * 16, 7)}),
    ((4, 36, 36), {"torso": "nature_cnn"}, {**_NATURE, "Dense_0": (64, 512)}),
])
def test_torso_and_cnn_dense_set_the_layers(obs_shape, network, kernels):
    """`torso` picks the layers (auto by image side, or forced: an MLP over flattened images, the MinAtar CNN
    on large images) and `cnn_dense` the width of the dense layer after the convolutions."""
    agent = make_agent({"name": "dqn", "buffer_size": 64, "batch_size": 8, "network": network},
                       obs_shape=obs_shape, obs_dtype=jnp.float32, num_actions=2, num_envs=2)
    shapes = jax.eval_shape(agent.network.init, jax.random.PRNGKey(0),
                            jax.ShapeDtypeStruct((1, *obs_shape), jnp.float32))["params"]
    assert {name: leaf["kernel"].shape for name, leaf in shapes["torso"].items()} == kernels
