"""Muesli config keys: each test fails when the key it names in COVERS is ignored or misapplied.

The targets and the loss are checked with non-default options against the NumPy references of
tests/agents/test_muesli.py (which read the agent's config); batch composition against the replay_fraction
formula; parameter updates against the optimiser's update rule written out; network outputs against NumPy.
"""

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agents
from agents import make_agent
from agents.muesli import Muesli, MuesliState
from agents.muesli.networks import MuesliNetwork
from rl.config import ConfigError
from tests.agents.test_muesli import (
    REF,
    SMALL,
    A,
    E,
    _jit_net,
    _net,
    _random_params,
    _reference_loss_fn,
    _reference_problem,
    _reference_targets,
    _softmax,
    assert_targets_match,
    fill,
    small_agent,
)
from tests.agents.test_r2d2_options import assert_update, dense_np, flat, mlp_np

COVERS = {
    "agent.muesli.discount": "test_targets_follow_the_target_options",
    "agent.muesli.retrace_lambda": "test_targets_follow_the_target_options",
    "agent.muesli.cmpo_clip": "test_targets_follow_the_target_options",
    "agent.muesli.adv_var_decay": "test_targets_follow_the_target_options",
    "agent.muesli.adv_var_eps": "test_targets_follow_the_target_options",
    "agent.muesli.support_min": ["test_targets_follow_the_target_options",
                                 "test_loss_and_gradient_follow_the_loss_options"],
    "agent.muesli.support_max": ["test_targets_follow_the_target_options",
                                 "test_loss_and_gradient_follow_the_loss_options"],
    "agent.muesli.num_atoms": ["test_loss_and_gradient_follow_the_loss_options", "test_network_sizes_follow_the_config"],
    "agent.muesli.pg_weight": "test_loss_and_gradient_follow_the_loss_options",
    "agent.muesli.cmpo_weight": "test_loss_and_gradient_follow_the_loss_options",
    "agent.muesli.model_policy_weight": "test_loss_and_gradient_follow_the_loss_options",
    "agent.muesli.value_weight": "test_loss_and_gradient_follow_the_loss_options",
    "agent.muesli.reward_weight": "test_loss_and_gradient_follow_the_loss_options",
    "agent.muesli.unroll_steps": ["test_loss_and_gradient_follow_the_loss_options",
                                  "test_network_sizes_follow_the_config"],
    "agent.muesli.dynamics_grad_scale": "test_loss_and_gradient_follow_the_loss_options",
    "agent.muesli.entropy_weight": "test_loss_and_gradient_follow_the_loss_options",
    "agent.muesli.entropy_end_fraction": "test_the_entropy_bonus_decays_linearly_to_its_end_fraction_over_the_run",
    "agent.muesli.prior_uniform_mix": "test_targets_follow_the_target_options",
    "agent.muesli.target_update_rate": "test_target_network_moves_by_target_update_rate",
    "agent.muesli.replay_fraction": "test_train_step_takes_replay_fraction_of_the_batch_from_replay",
    "agent.muesli.batch_size": "test_train_step_takes_replay_fraction_of_the_batch_from_replay",
    "agent.muesli.sequence_length": "test_train_step_takes_replay_fraction_of_the_batch_from_replay",
    "agent.muesli.length_power": "test_sequence_starts_are_weighted_by_length_power",
    "agent.muesli.buffer_size": "test_buffer_size_learning_starts_and_train_interval_reach_the_runner_surface",
    "agent.muesli.learning_starts": "test_buffer_size_learning_starts_and_train_interval_reach_the_runner_surface",
    "agent.muesli.train_interval": "test_buffer_size_learning_starts_and_train_interval_reach_the_runner_surface",
    "agent.muesli.name": "test_name_selects_the_agent",
    "agent.muesli.network.state_dim": "test_network_sizes_follow_the_config",
    "agent.muesli.network.model": "test_network_sizes_follow_the_config",
    "agent.muesli.network.hidden_sizes": ["test_network_sizes_follow_the_config",
                                          "test_network_matches_numpy_forward_pass"],
    "agent.muesli.network.model_hidden": ["test_network_sizes_follow_the_config",
                                          "test_network_matches_numpy_forward_pass"],
    "agent.muesli.network.head_hidden": ["test_network_sizes_follow_the_config",
                                         "test_network_matches_numpy_forward_pass"],
    "agent.muesli.network.activation": "test_network_matches_numpy_forward_pass",
    "agent.muesli.network.torso": "test_image_torsos_follow_torso_cnn_dense_and_impala_channels",
    "agent.muesli.network.cnn_dense": "test_image_torsos_follow_torso_cnn_dense_and_impala_channels",
    "agent.muesli.network.impala_channels": "test_image_torsos_follow_torso_cnn_dense_and_impala_channels",
    "agent.muesli.optim.name": ["test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
                                "test_optim_adamw_eps_and_weight_decay_reach_the_update"],
    "agent.muesli.optim.lr": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.muesli.optim.max_grad_norm": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.muesli.optim.lr_schedule": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.muesli.optim.lr_end_fraction": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.muesli.optim.lr_decay_updates": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.muesli.optim.eps": "test_optim_adamw_eps_and_weight_decay_reach_the_update",
    "agent.muesli.optim.weight_decay": "test_optim_adamw_eps_and_weight_decay_reach_the_update",
}

# Every target and loss option away from its default (REF: the small network of tests/agents/test_muesli.py).
OPT = {**REF, "discount": 0.9, "retrace_lambda": 0.5, "cmpo_clip": 0.08, "adv_var_decay": 0.7, "adv_var_eps": 5.0,
       "num_atoms": 31, "support_min": -6.0, "support_max": 14.0, "pg_weight": 0.7, "cmpo_weight": 1.9,
       "model_policy_weight": 0.45, "value_weight": 1.6, "reward_weight": 0.3, "unroll_steps": 3,
       "dynamics_grad_scale": 0.2, "target_update_rate": 0.3, "prior_uniform_mix": 0.4, "entropy_weight": 0.6}
WEIGHTS = {"pg_loss": "pg_weight", "cmpo_kl": "cmpo_weight", "model_policy_loss": "model_policy_weight",
           "value_loss": "value_weight", "reward_loss": "reward_weight", "entropy": "entropy_weight"}
SIGNS = {"entropy": -1.0}  # the entropy bonus is subtracted


def with_cfg(agent, **changes):
    """The agent seen by the NumPy references with some config values changed (same network and params)."""
    other = copy.copy(agent)
    other.cfg = dataclasses.replace(agent.cfg, **changes)
    return other


def opt_agent(**changes) -> Muesli:
    return make_agent({**OPT, **changes}, obs_shape=(3,), obs_dtype=jnp.float32, num_actions=A, num_envs=E)


@pytest.fixture(scope="module")
def problem():
    """The OPT agent, online and target params that differ, the hand-made batch of tests/agents/test_muesli.py, the
    agent's targets (jitted) and the NumPy reference targets."""
    _, ref_state, batch, valid = _reference_problem()
    agent = opt_agent()
    params = _random_params(agent, 0)
    state = MuesliState(params=params, target_params=_random_params(agent, 1),
                        opt_state=jax.jit(agent.optimizer.init)(params), adv_ema=ref_state.adv_ema, updates=jnp.zeros((), jnp.int32))
    jbatch, jvalid = jax.tree.map(jnp.asarray, batch), jnp.asarray(valid)
    out = jax.jit(agent.targets)(state, jbatch, jvalid)
    return agent, state, batch, valid, out, _reference_targets(agent, state, batch, valid)


@pytest.fixture(scope="module")
def loss_grads(problem):
    """The agent's loss, metrics and gradient on the problem (jitted once)."""
    agent, state, batch, valid, (targets, _, _), _ = problem
    jbatch, jvalid = jax.tree.map(jnp.asarray, batch), jnp.asarray(valid)
    return jax.jit(jax.value_and_grad(agent.loss, has_aux=True))(state.params, targets, jbatch, jvalid)


# ------------------------------------------------------------------------------------------ targets, loss
def test_targets_follow_the_target_options(problem):
    """With discount 0.9, retrace_lambda 0.5, cmpo_clip 0.08, adv_var_decay 0.7, adv_var_eps 5, the support
    [-6, 14] (31 atoms) and prior_uniform_mix 0.4 (CMPO's prior only), Retrace, the advantage EMA and scale, CMPO and the policy-gradient advantages equal the
    NumPy reference; each option set back to its default changes the reference on this batch."""
    agent, state, batch, valid, (targets, adv_ema, metrics), ref = problem
    assert_targets_match(targets, adv_ema, metrics, ref)
    m = ref["mask"]
    # Guards: the clip cuts some advantages and not others; every option matters here.
    adv = np.abs(ref["q"] - ref["v"][..., None]) / ref["scale"]
    assert ((adv > 0.09).sum() >= 5) and ((adv < 0.07).sum() >= 5)
    defaults = agents.agent_config({"name": "muesli"})
    for key in ("discount", "retrace_lambda", "cmpo_clip", "adv_var_decay", "adv_var_eps", "support_min",
                "support_max", "prior_uniform_mix"):
        other = _reference_targets(with_cfg(agent, **{key: getattr(defaults, key)}), state, batch, valid)
        changed = max(np.abs(other["G"] - ref["G"])[m].max(), np.abs(other["cmpo"] - ref["cmpo"]).max(),
                      abs(other["scale"] - ref["scale"]), np.abs(np.subtract(other["ema"], ref["ema"])).max())
        assert changed > 1e-3, key


def test_loss_and_gradient_follow_the_loss_options(problem, loss_grads):
    """With unequal loss weights (entropy_weight 0.6 subtracting the root entropy), unroll_steps 3, dynamics_grad_scale 0.2 and the support [-6, 14] (31 atoms), the
    loss, its five terms and its gradient equal the loop-based reference of tests/agents/test_muesli.py, and the
    loss is the weighted sum of the term metrics."""
    agent, state, batch, valid, _, ref = problem
    net = _jit_net(agent)
    root_logits = np.asarray(net(state.params, "predict",
                                 net(state.params, "represent", jnp.asarray(batch["obs"])))[0], np.float64)
    pi_taken = np.take_along_axis(_softmax(root_logits), batch["action"][..., None], -1)[..., 0]
    rho = np.minimum(1.0, pi_taken / np.exp(batch["behaviour_logp"].astype(np.float64)))
    ref_loss = _reference_loss_fn(agent, batch, valid, ref, rho)
    (value, metrics), grads = loss_grads
    (ref_value, ref_terms), ref_grads = jax.jit(jax.value_and_grad(ref_loss, has_aux=True))(state.params)
    for name, term in ref_terms.items():
        assert abs(float(term)) > 1e-3, name
        np.testing.assert_allclose(float(metrics[name]), float(term), rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-4)
    weighted = sum(SIGNS.get(name, 1.0) * OPT[w] * float(metrics[name]) for name, w in WEIGHTS.items())
    np.testing.assert_allclose(float(value), weighted, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"]), float(value), rtol=1e-6)
    g, r = flat(grads), flat(ref_grads)
    assert np.linalg.norm(g - r) <= 2e-3 * np.linalg.norm(r)


def test_the_entropy_bonus_decays_linearly_to_its_end_fraction_over_the_run(problem):
    """entropy_end_fraction 0.25 over a run of T train steps: the update after u steps is the update of a constant
    bonus 0.6 * (1 - 0.75 * min(u / T, 1)); without the run's length the option is refused in one line."""
    agent, state, batch, valid, *_ = problem
    jbatch, jvalid = jax.tree.map(jnp.asarray, batch), jnp.asarray(valid)
    decaying = make_agent({**OPT, "entropy_end_fraction": 0.25}, obs_shape=(3,), obs_dtype=jnp.float32,
                          num_actions=A, num_envs=E, total_steps=40_000)
    T = decaying.run_updates
    for u in (0, T // 2, 2 * T):
        at_u = state.replace(updates=jnp.asarray(u, jnp.int32))
        constant = with_cfg(agent, entropy_weight=0.6 * (1 - 0.75 * min(u / T, 1)))
        got, want = (jax.jit(a.update)(at_u, jbatch, jvalid)[0].params for a in (decaying, constant))
        np.testing.assert_allclose(flat(got), flat(want), rtol=1e-5, atol=1e-7, err_msg=str(u))
    assert np.abs(flat(got) - flat(jax.jit(agent.update)(at_u, jbatch, jvalid)[0].params)).max() > 1e-6
    with pytest.raises(ValueError, match="agent.entropy_end_fraction decays the entropy bonus over the run"):
        opt_agent(entropy_end_fraction=0.5)


def test_target_network_moves_by_target_update_rate(problem):
    """After an update the target params are 0.3 * new online + 0.7 * old target (target_update_rate 0.3)."""
    agent, state, batch, valid, *_ = problem
    new, _ = jax.jit(agent.update)(state, jax.tree.map(jnp.asarray, batch), jnp.asarray(valid))
    expected = 0.3 * flat(new.params) + 0.7 * flat(state.target_params)
    np.testing.assert_allclose(flat(new.target_params), expected, rtol=1e-5, atol=1e-6)
    assert np.abs(flat(new.target_params) - (0.1 * flat(new.params) + 0.9 * flat(state.target_params))).max() > 1e-2


# --------------------------------------------------------------------------------------- batch composition
@pytest.mark.parametrize("replay_fraction,n_online", [(0.6, 3), (1.0, 0)])
def test_train_step_takes_replay_fraction_of_the_batch_from_replay(replay_fraction, n_online):
    """A train step draws round(B * (1 - replay_fraction)) of its B = batch_size sequences of sequence_length
    steps from the online queue: 3 of 7 with replay_fraction 0.6 (ignored: 2; swapped: 4; floored: 2), none with
    1.0. With one fresh step per env queued, each online sequence holds exactly one valid step, so the metric
    online_steps is that count; online_steps + replay_steps are all valid steps of the batch, and the replay
    sequences (starting anywhere in 13 stored steps) hold more than two steps on average."""
    batch, length = 7, 6
    agent = small_agent(replay_fraction=replay_fraction, batch_size=batch, sequence_length=length)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    bs = jax.jit(agent.buffer.init)(agent.step_prototype(jnp.zeros(3)))
    bs, key = fill(agent, state, bs, jax.random.PRNGKey(1), 12)
    bs = jax.jit(agent.buffer.consume_online)(bs)
    bs, key = fill(agent, state, bs, key, 1)
    _, _, metrics = jax.jit(agent.train_step)(state, bs, jax.random.PRNGKey(2))
    assert n_online == round(batch * (1 - replay_fraction))
    online, replay = float(metrics["online_steps"]), float(metrics["replay_steps"])
    assert online == n_online
    np.testing.assert_allclose(online + replay, float(metrics["valid_fraction"]) * batch * length, rtol=1e-6)
    assert replay > 2 * (batch - n_online)


def test_sequence_starts_are_weighted_by_length_power():
    """Sequence starts are weighted by (valid steps from the start, capped at sequence_length) ** length_power
    (2 here): the buffer's weights and the probabilities of sampled sequences."""
    agent = small_agent(length_power=2.0)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    bs, _ = fill(agent, state, jax.jit(agent.buffer.init)(agent.step_prototype(jnp.zeros(3))), jax.random.PRNGKey(1),
                 10)
    T, L = agent.buffer.capacity_per_env, agent.cfg.sequence_length
    a = np.arange(T)
    expected = np.where(a < 10, np.minimum(L, 10 - a), 0).astype(np.float64) ** 2.0
    np.testing.assert_allclose(np.asarray(jax.jit(agent.buffer.weights)(bs)).reshape(E, T), np.tile(expected, (E, 1)),
                               rtol=1e-6)
    sample = jax.jit(agent.buffer.sample, static_argnums=2)(bs, jax.random.PRNGKey(3), 64)
    prob = np.tile(expected, E) / (E * expected.sum())
    np.testing.assert_allclose(np.asarray(sample.probabilities), prob[np.asarray(sample.slots)], rtol=1e-5)


# ------------------------------------------------------------------------------------ runner surface, name
def test_buffer_size_learning_starts_and_train_interval_reach_the_runner_surface():
    """The runners read learning_starts, train_interval and the buffer (buffer_size // num_envs steps per row, at
    least sequence_length + 1) from the agent."""
    agent = small_agent(buffer_size=E * 20, learning_starts=123, train_interval=5)
    assert agent.buffer.capacity_per_env == 20 and agent.learning_starts == 123 and agent.train_interval == 5
    assert agent.buffer.init(agent.step_prototype(jnp.zeros(3))).rows.data["reward"].shape == (E, 20)
    assert small_agent(buffer_size=8).buffer.capacity_per_env == SMALL["sequence_length"] + 1


def test_name_selects_the_agent():
    """agent.name picks the agent the registry builds."""
    agent = agents.make_agent(SMALL, obs_shape=(3,), obs_dtype=jnp.float32, num_actions=A, num_envs=E)
    assert isinstance(agent, Muesli) and agent.cfg == agents.agent_config(SMALL)
    with pytest.raises(ConfigError, match="is not an agent"):
        agents.agent_config({**SMALL, "name": "muesli2"})


# ------------------------------------------------------------------------------------------------ acting
def test_act_uses_the_online_policy():
    """act samples from the ONLINE params' policy (not the target's, which differs here): explore=False is its
    argmax; with exploration the action frequencies over many keys are its softmax and the behaviour
    log-probability is that of the action taken."""
    agent = opt_agent()
    params, target = _random_params(agent, 0), _random_params(agent, 1)
    state = MuesliState(params=params, target_params=target, opt_state=(), adv_ema=None, updates=None)
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(32, 3)) * 2, jnp.float32)
    net = _jit_net(agent)
    logits = lambda p: np.asarray(net(p, "predict", net(p, "represent", obs))[0], np.float64)
    online = logits(params)
    greedy, _, extras = jax.jit(lambda k: agent.act(state, obs, (), k, jnp.arange(32), explore=False))(
        jax.random.PRNGKey(1))
    np.testing.assert_array_equal(np.asarray(greedy), online.argmax(-1))
    assert (logits(target).argmax(-1) != online.argmax(-1)).sum() >= 2  # guard: the target would act otherwise
    keys = jax.random.split(jax.random.PRNGKey(2), 4000)
    actions, _, extras = jax.jit(jax.vmap(lambda k: agent.act(state, obs[:3], (), k, jnp.arange(3))))(keys)
    actions = np.asarray(actions)
    log_pi = np.log(_softmax(online[:3]))
    np.testing.assert_allclose(np.asarray(extras["behaviour_logp"]), log_pi[np.arange(3), actions], atol=1e-5)
    freq = np.stack([(actions == a).mean(0) for a in range(A)], -1)
    np.testing.assert_allclose(freq, np.exp(log_pi), atol=0.035)
    assert np.exp(log_pi).max(-1).min() < 0.9  # the policy is not (near) deterministic: sampling matters


# ------------------------------------------------------------------------------------------------ network
NET = {"torso": "mlp", "hidden_sizes": [7, 5], "state_dim": 6, "model_hidden": [9, 4], "head_hidden": [3]}


def net_agent(obs_shape=(3,), unroll_steps=2, **network):
    return make_agent({**SMALL, "num_atoms": 11, "unroll_steps": unroll_steps, "network": {**NET, **network}},
                      obs_shape=obs_shape, obs_dtype=jnp.float32, num_actions=A, num_envs=E)


def param_shapes(agent, obs_shape=(3,)):
    """Kernel shapes of the network's layers, nested as the params (no init compile)."""
    def kernels(tree):
        return tree["kernel"].shape if "kernel" in tree else {k: kernels(v) for k, v in tree.items()
                                                             if isinstance(v, dict)}

    return kernels(jax.eval_shape(agent.network.init, jax.random.PRNGKey(0), jnp.zeros((1,) + obs_shape))["params"])


@pytest.mark.parametrize("model", ["mlp", "lstm"])
def test_network_sizes_follow_the_config(model):
    """Layer sizes follow hidden_sizes, state_dim, model_hidden (mlp model), head_hidden and num_atoms (11); the
    model is a residual MLP or an LSTM of state_dim units whose state [h, c] is 2 * state_dim wide; the unroll
    yields unroll_steps (4) model steps."""
    agent = net_agent(model=model, unroll_steps=4)
    p = param_shapes(agent)
    assert p["torso"] == {"Dense_0": (3, 7), "Dense_1": (7, 5)} and p["project"] == (5, 6)
    per_action = A if model == "mlp" else 1  # the mlp model's output layers hold one block per action
    for head, out in (("policy_head", A), ("value_head", 11), ("reward_head", 11 * per_action)):
        assert p[head]["Dense_1"] == (3, out), head
    if model == "mlp":
        assert p["dynamics_hidden_0"] == (6, 9) and p["dynamics_hidden_1"] == (9, 4)
        assert p["dynamics_out"] == (4, 6 * A) and p["reward_head"]["Dense_0"] == (4, 3)
        assert "lstm" not in p
        width = 6
    else:
        assert p["lstm"]["hi"] == (6, 6) and p["lstm"]["ii"] == (A, 6) and p["cell_init"] == (6, 6)
        assert not any(k.startswith("dynamics") for k in p)
        width = 12
    params = jax.eval_shape(agent.network.init, jax.random.PRNGKey(0), jnp.zeros((1, 3)))
    states = jax.eval_shape(lambda p, o: _net(agent, p, "represent", o), params, jnp.zeros((2, 5, 3)))
    assert states.shape == (2, 5, width)
    out = jax.eval_shape(agent.unroll, params, states, jnp.zeros((2, 5, 4), jnp.int32))
    assert [x.shape for x in out] == [(2, 5, 5, A), (2, 5, 5, 11), (2, 5, 4, 11)]


def layer_norm_np(x, p, eps=1e-6):
    x = np.asarray(x, np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * np.asarray(p["scale"], np.float64) + np.asarray(p["bias"], np.float64)


def test_network_matches_numpy_forward_pass():
    """With activation tanh, the torso (hidden_sizes), the policy/value/reward heads (head_hidden) and the MLP
    model (model_hidden, residual, layer-normalised) compute exactly what NumPy does with the params."""
    agent = net_agent(activation="tanh")
    params = _random_params(agent, 0)
    p = params["params"]
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.normal(size=(5, 3)) * 2, jnp.float32)
    action = jnp.asarray(rng.integers(0, A, 5), jnp.int32)
    act = "tanh"

    @jax.jit
    def forward(params, obs, action):
        state, inter = agent.network.apply(params, obs, method=MuesliNetwork.represent, capture_intermediates=True,
                                           mutable=["intermediates"])
        policy, value = agent.network.apply(params, state, method=MuesliNetwork.predict)
        next_state, reward = agent.network.apply(params, state, action, method=MuesliNetwork.step)
        return inter["intermediates"]["torso"]["__call__"][0], state, policy, value, next_state, reward

    torso, state, policy, value, next_state, reward = forward(params, obs, action)
    np.testing.assert_allclose(torso, mlp_np([p["torso"]["Dense_0"], p["torso"]["Dense_1"]], obs, act), rtol=1e-5,
                               atol=1e-5)
    s = np.asarray(state, np.float64)
    np.testing.assert_allclose(s, layer_norm_np(dense_np(p["project"], torso), p["state_norm"]), rtol=1e-4, atol=1e-4)

    def head(name, x):
        return dense_np(p[name]["Dense_1"], mlp_np([p[name]["Dense_0"]], x, act))

    np.testing.assert_allclose(policy, head("policy_head", s), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(value, head("value_head", s), rtol=1e-4, atol=1e-5)
    # The model: hidden layers over the state; the action picks its block of each output layer.
    x = mlp_np([p["dynamics_hidden_0"], p["dynamics_hidden_1"]], s, act)
    rows = np.arange(len(s))
    reward_all = head("reward_head", x).reshape(len(s), A, -1)
    delta_all = dense_np(p["dynamics_out"], x).reshape(len(s), A, -1)
    np.testing.assert_allclose(reward, reward_all[rows, np.asarray(action)], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(next_state, layer_norm_np(s + delta_all[rows, np.asarray(action)], p["dynamics_norm"]),
                               rtol=1e-4, atol=1e-4)
    assert len(set(np.asarray(action).tolist())) > 1  # guard: several actions read
    assert (np.asarray(torso) < 0).any()  # guard: relu would differ here


@pytest.mark.parametrize("torso", ["mlp", "small_cnn", "impala"])
def test_image_torsos_follow_torso_cnn_dense_and_impala_channels(torso):
    """On 10x10x3 images `torso` picks the MLP over the flattened image, the MinAtar CNN or the IMPALA CNN (channels
    impala_channels = [4, 6]); the dense layer after a CNN has cnn_dense (12) units."""
    agent = net_agent(obs_shape=(10, 10, 3), torso=torso, hidden_sizes=[8], cnn_dense=12, impala_channels=[4, 6])
    p = param_shapes(agent, (10, 10, 3))["torso"]
    if torso == "mlp":
        assert p == {"Dense_0": (300, 8)}
    elif torso == "small_cnn":
        assert p == {"Conv_0": (3, 3, 3, 16), "Dense_0": (8 * 8 * 16, 12)}
    else:
        assert p["Conv_0"] == (3, 3, 3, 4) and p["Conv_1"] == (3, 3, 4, 6) and p["Dense_0"] == (3 * 3 * 6, 12)
        assert sorted(k for k in p if k.startswith("Residual")) == [f"ResidualBlock_{i}" for i in range(4)]


# ------------------------------------------------------------------------------------------------ optimiser
def updates(problem, optim, steps):
    """`steps` updates of the OPT agent with `optim` instead on the hand-made batch, from the problem's state; per
    update the parameter change and the params before it."""
    _, state, batch, valid, *_ = problem
    agent = opt_agent(optim=optim)
    state = state.replace(opt_state=jax.jit(agent.optimizer.init)(state.params))
    update = jax.jit(agent.update)
    out = []
    for _ in range(steps):
        new, _ = update(state, jax.tree.map(jnp.asarray, batch), jnp.asarray(valid))
        out.append((flat(new.params) - flat(state.params), flat(state.params)))
        state = new
    return out


def test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update(problem, loss_grads):
    """optim name=sgd, lr=0.5, max_grad_norm=1e-3, lr_schedule=linear, lr_end_fraction=0.25, lr_decay_updates=2:
    update k is -lr_k * g * max_grad_norm / |g| (the clip is active), so its norm is lr_k * max_grad_norm with
    lr_k = 0.5, 0.3125, 0.125; the first one is that multiple of the loss gradient g."""
    steps = updates(problem, {"name": "sgd", "lr": 0.5, "max_grad_norm": 1e-3, "lr_schedule": "linear",
                              "lr_end_fraction": 0.25, "lr_decay_updates": 2}, steps=3)
    g = flat(loss_grads[1])
    assert np.linalg.norm(g) > 1e-2  # the clip is active
    assert_update(steps[0][0], -0.5 * g * 1e-3 / np.linalg.norm(g))
    norms = [np.linalg.norm(delta) for delta, _ in steps]
    np.testing.assert_allclose(norms, np.array([0.5, 0.3125, 0.125]) * 1e-3, rtol=1e-3)


def test_optim_adamw_eps_and_weight_decay_reach_the_update(problem, loss_grads):
    """optim name=adamw, lr=0.01, eps=0.5, weight_decay=0.5, max_grad_norm=0: the first update is
    -lr (g / (|g| + eps) + wd * params) for the loss gradient g (Adam's bias-corrected moments are g and g^2)."""
    [(delta, params)] = updates(problem, {"name": "adamw", "lr": 0.01, "eps": 0.5, "weight_decay": 0.5,
                                          "max_grad_norm": 0.0}, steps=1)
    g = flat(loss_grads[1])
    assert np.median(np.abs(g[g != 0])) < 0.5
    assert_update(delta, -0.01 * (g / (np.abs(g) + 0.5) + 0.5 * params))


@pytest.mark.parametrize("key", ["hidden_sizes", "impala_channels", "model_hidden", "head_hidden", "cnn_dense",
                                 "state_dim"])
def test_network_sizes_must_be_positive(key):
    """Every layer size of `agent.network` is refused at 0 (one line naming the section), accepted at 1."""
    from agents.muesli.networks import MuesliNetworkConfig

    value = lambda v: v if key in ("cnn_dense", "state_dim") else [v]
    with pytest.raises(ValueError, match=r"agent.network layer sizes must be positive"):
        MuesliNetworkConfig(**{key: value(0)})
    MuesliNetworkConfig(**{key: value(1)})
