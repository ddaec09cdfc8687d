"""R2D2 config keys: each test fails when the key it names in COVERS is ignored or misapplied.

Values are checked against what produced them: priorities and TD errors against NumPy, exploration against the
Ape-X formula per env id, parameter updates against the optimiser's update rule written out, network outputs
against a NumPy forward pass of the parameters.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agents
from agents.r2d2 import R2D2, Config
from rl.config import ConfigError
from rl.learning.optim import OptimConfig
from rl.nets.networks import NetworkConfig
from rl.nets.recurrent import LSTMCarry
from tests.agents.test_r2d2 import H, h_inv_np, h_np, reference_td, sequence_priority_np, small_config

COVERS = {
    "agent.r2d2.priority_eta": "test_priorities_are_eta_mixed_over_valid_steps_only",
    "agent.r2d2.priority_exponent": "test_priorities_are_eta_mixed_over_valid_steps_only",
    "agent.r2d2.batch_size": ["test_priorities_are_eta_mixed_over_valid_steps_only",
                              "test_importance_weights_use_importance_exponent"],
    "agent.r2d2.epsilon_base": "test_actor_epsilons_are_looked_up_by_env_id",
    "agent.r2d2.epsilon_alpha": "test_actor_epsilons_are_looked_up_by_env_id",
    "agent.r2d2.n_step": "test_td_errors_follow_n_step_discount_rescaling_burn_in_and_stored_state",
    "agent.r2d2.discount": "test_td_errors_follow_n_step_discount_rescaling_burn_in_and_stored_state",
    "agent.r2d2.value_rescaling": "test_td_errors_follow_n_step_discount_rescaling_burn_in_and_stored_state",
    "agent.r2d2.rescaling_eps": "test_td_errors_follow_n_step_discount_rescaling_burn_in_and_stored_state",
    "agent.r2d2.burn_in": "test_td_errors_follow_n_step_discount_rescaling_burn_in_and_stored_state",
    "agent.r2d2.stored_state": "test_td_errors_follow_n_step_discount_rescaling_burn_in_and_stored_state",
    "agent.r2d2.sequence_length": "test_sequences_follow_length_period_and_cross_episodes",
    "agent.r2d2.period": "test_sequences_follow_length_period_and_cross_episodes",
    "agent.r2d2.cross_episodes": "test_sequences_follow_length_period_and_cross_episodes",
    "agent.r2d2.target_update_period": "test_target_network_is_copied_every_target_update_period",
    "agent.r2d2.importance_exponent": "test_importance_weights_use_importance_exponent",
    "agent.r2d2.buffer_size": "test_buffer_size_learning_starts_and_train_interval_reach_the_runner_surface",
    "agent.r2d2.learning_starts": "test_buffer_size_learning_starts_and_train_interval_reach_the_runner_surface",
    "agent.r2d2.train_interval": "test_buffer_size_learning_starts_and_train_interval_reach_the_runner_surface",
    "agent.r2d2.lstm_size": "test_network_matches_numpy_forward_pass",
    "agent.r2d2.name": "test_name_selects_the_agent",
    "agent.r2d2.network.hidden_sizes": "test_network_matches_numpy_forward_pass",
    "agent.r2d2.network.head_hidden": "test_network_matches_numpy_forward_pass",
    "agent.r2d2.network.dueling": "test_network_matches_numpy_forward_pass",
    "agent.r2d2.network.activation": "test_network_matches_numpy_forward_pass",
    "agent.r2d2.network.torso": "test_image_torso_follows_torso_and_cnn_dense",
    "agent.r2d2.network.cnn_dense": "test_image_torso_follows_torso_and_cnn_dense",
    "agent.r2d2.optim.name": ["test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
                              "test_optim_adamw_eps_and_weight_decay_reach_the_update"],
    "agent.r2d2.optim.lr": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.r2d2.optim.max_grad_norm": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.r2d2.optim.eps": "test_optim_adamw_eps_and_weight_decay_reach_the_update",
    "agent.r2d2.optim.weight_decay": "test_optim_adamw_eps_and_weight_decay_reach_the_update",
    "agent.r2d2.optim.lr_schedule": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.r2d2.optim.lr_end_fraction": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
    "agent.r2d2.optim.lr_decay_updates": "test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update",
}

A = 3  # actions
E = 4  # envs of the buffer tests
B = 6  # batch_size (not the default 64)
STEPS = 40  # steps written per env row

# Non-default values of the replay options, shared by the buffer tests (one compile of the train step).
REPLAY = {"priority_eta": 0.3, "priority_exponent": 0.5, "importance_exponent": 0.3, "target_update_period": 3,
          "batch_size": B, "cross_episodes": True}


# ------------------------------------------------------------------------------------------------ helpers
ACT_NP = {"relu": lambda x: np.maximum(x, 0.0), "tanh": np.tanh, "elu": lambda x: np.where(x > 0, x, np.expm1(x))}


def dense_np(layer, x):
    return np.asarray(x, np.float64) @ np.asarray(layer["kernel"], np.float64) + np.asarray(layer["bias"], np.float64)


def mlp_np(layers, x, activation):
    """Dense layers, each followed by `activation`, in NumPy."""
    for layer in layers:
        x = ACT_NP[activation](dense_np(layer, x))
    return x


def flat(tree):
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def make(obs_shape=(2,), num_envs=E, **kw) -> R2D2:
    return R2D2(small_config(**kw), obs_shape=obs_shape, obs_dtype=jnp.float32, num_actions=A, num_envs=num_envs)


def fill(agent, reward, terminated, truncated, seed=0):
    """A fresh buffer holding hand-made rows: `reward`, `terminated`, `truncated` `[T, E]`; random observations,
    actions and stored LSTM states."""
    rng = np.random.default_rng(seed)
    steps, num_envs = reward.shape
    hsize = agent.cfg.lstm_size
    xs = (rng.normal(size=(steps, num_envs) + agent.obs_shape).astype(np.float32),
          rng.integers(0, A, (steps, num_envs)).astype(np.int32), np.asarray(reward, np.float32),
          np.asarray(terminated, bool), np.asarray(truncated, bool),
          LSTMCarry(*rng.normal(size=(2, steps, num_envs, hsize)).astype(np.float32)))
    env_ids = jnp.arange(num_envs)

    def add(bs, x):
        obs, action, rew, term, trunc, carry = x
        return agent.buffer.add(bs, agent.make_step(obs, action, rew, term, trunc, None, carry, {}), env_ids), None

    bs = jax.jit(agent.buffer.init)(agent.step_prototype(jnp.zeros(agent.obs_shape)))
    return jax.jit(lambda bs, xs: jax.lax.scan(add, bs, xs)[0])(bs, xs)


def replay_rows(seed=0):
    """`[STEPS, E]` rewards and done flags with frequent truncations (every 7th step, shifted per env) and a few
    terminations, so that many trained steps have no usable n-step target."""
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS)[:, None] + np.arange(E)[None, :]
    truncated = t % 7 == 6
    terminated = (t % 11 == 10) & ~truncated
    return rng.normal(size=(STEPS, E)) * 3, terminated, truncated


@pytest.fixture(scope="module")
def replay():
    """An agent with non-default replay options, its initial state, a filled buffer and its jitted train step."""
    agent = make(**REPLAY)
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(2))
    state = state.replace(target_params=agent.init(jax.random.PRNGKey(1), jnp.zeros(2)).params)
    bs = fill(agent, *replay_rows())
    return agent, state, bs, jax.jit(agent.train_step)


def importance_weights_np(probabilities, beta):
    w = np.asarray(probabilities, np.float64) ** -beta
    return w / w.max()


# ------------------------------------------------------------------------------------------------ priorities
def test_priorities_are_eta_mixed_over_valid_steps_only(replay):
    """A train step samples `batch_size` sequences and writes back p = eta * max|td| + (1 - eta) * mean|td| over
    the VALID trained steps (no n-step target past a truncation does not count), raised to priority_exponent;
    |td| and validity come from the NumPy reference of tests/agents/test_r2d2.py."""
    agent, state, bs, train = replay
    key = jax.random.PRNGKey(7)
    sample = jax.jit(agent.buffer.sample, static_argnums=2)(bs, key, B)  # what the train step draws
    data = jax.tree.map(np.asarray, sample.data)
    abs_td, ok = reference_td(agent, state.params, state.target_params, data, np.asarray(sample.mask))
    expected = sequence_priority_np(abs_td, ok, REPLAY["priority_eta"])
    # Guards: invalid steps change the priority where they would be counted, and eta matters.
    everything = sequence_priority_np(abs_td, np.ones_like(ok), REPLAY["priority_eta"])
    assert (~ok).sum() >= B and (np.abs(everything - expected) > 1e-3 * expected).sum() >= 2
    assert (np.abs(sequence_priority_np(abs_td, ok, 0.9) - expected) > 1e-2 * expected).sum() >= 2

    _, new_bs, metrics = train(state, bs, key)
    stored = np.asarray(jax.jit(agent.buffer.priorities)(new_bs, sample.slots))
    np.testing.assert_allclose(stored, expected ** REPLAY["priority_exponent"], rtol=2e-4)
    np.testing.assert_allclose(float(metrics["priority"]), expected.mean(), rtol=2e-4)
    np.testing.assert_allclose(float(metrics["valid_fraction"]), ok.mean(), rtol=1e-6)


def test_importance_weights_use_importance_exponent(replay):
    """With unequal priorities, the loss of a train step is weighted by w = P^-beta / max P^-beta with the
    configured beta (0.3, not 0.6) over the `batch_size` sequences it sampled."""
    agent, state, bs, train = replay
    every = np.arange(0, agent.buffer.num_slots, agent.cfg.period)
    bs = jax.jit(agent.buffer.set_priorities)(bs, jnp.asarray(every), jnp.asarray(
        np.random.default_rng(1).uniform(0.05, 5.0, len(every)), jnp.float32))
    key = jax.random.PRNGKey(8)
    sample = jax.jit(agent.buffer.sample, static_argnums=2)(bs, key, B)
    w = importance_weights_np(sample.probabilities, REPLAY["importance_exponent"])
    assert w.min() < 0.9 and abs(w.mean() - importance_weights_np(sample.probabilities, 0.6).mean()) > 1e-2
    loss = jax.jit(agent.sequence_loss)(state.params, state.target_params, sample.data, sample.mask,
                                        jnp.asarray(w, jnp.float32))[0]
    _, _, metrics = train(state, bs, key)
    np.testing.assert_allclose(float(metrics["importance_weight"]), w.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-4)


def test_target_network_is_copied_every_target_update_period(replay):
    """target_update_period=3: the target params stay as they were after updates 1 and 2 and equal the online
    params after update 3 (and only then)."""
    _, state, bs, train = replay
    target0 = flat(state.target_params)
    for k in range(1, 5):
        state, bs, _ = train(state, bs, jax.random.PRNGKey(10 + k))
        online, target = flat(state.params), flat(state.target_params)
        if k < 3:
            np.testing.assert_array_equal(target, target0)
        if k == 3:
            np.testing.assert_array_equal(target, online)
            copied = online
        if k == 4:
            np.testing.assert_array_equal(target, copied)
            assert np.abs(online - target).max() > 0


# ---------------------------------------------------------------------------------------------- exploration
def test_actor_epsilons_are_looked_up_by_env_id():
    """Rows of an act call take their env's Ape-X epsilon eps_i = base^(1 + alpha i / (N - 1)), looked up by env
    id: with env_ids [3, 0, 2] (a partial, shuffled recv as envpool returns it) the share of non-greedy actions of
    each row over many keys is eps_env * (A - 1) / A."""
    n, base, alpha = 5, 0.6, 2.0
    agent = make(num_envs=n, epsilon_base=base, epsilon_alpha=alpha)
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(2))
    env_ids = jnp.asarray([3, 0, 2])
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)
    carry = LSTMCarry(*map(jnp.asarray, rng.normal(size=(2, 3, H)).astype(np.float32)))
    greedy = jax.jit(lambda k: agent.act(state, obs, carry, k, env_ids, explore=False)[0])(jax.random.PRNGKey(1))
    keys = jax.random.split(jax.random.PRNGKey(2), 6000)
    actions = jax.jit(jax.vmap(lambda k: agent.act(state, obs, carry, k, env_ids)[0]))(keys)
    off = np.mean(np.asarray(actions) != np.asarray(greedy)[None], axis=0)
    eps = np.array([base ** (1 + alpha * i / (n - 1)) for i in [3, 0, 2]])
    np.testing.assert_allclose(off, eps * (A - 1) / A, atol=0.03)
    # Guard: by row position (or with the default base and alpha) the shares would be far from these.
    assert np.abs(np.array([base ** (1 + alpha * i / (n - 1)) for i in range(3)]) - eps).max() > 0.2


def test_act_carries_are_per_row_and_acting_uses_the_online_params():
    """act's carry rows belong to its obs rows (env_ids only pick epsilons): each row's next carry and greedy action
    are one LSTM step of that row's own carry under the ONLINE params (not the target params, which choose
    differently here); explore=False is greedy even where epsilon is 1."""
    n = 24
    agent = make(num_envs=n, epsilon_base=1.0)
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(2))
    state = state.replace(target_params=agent.init(jax.random.PRNGKey(1), jnp.zeros(2)).params)
    rng = np.random.default_rng(0)
    env_ids = jnp.asarray(rng.permutation(n)[:16])
    obs = jnp.asarray(rng.normal(size=(16, 2)) * 2, jnp.float32)
    carry = LSTMCarry(*map(jnp.asarray, rng.normal(size=(2, 16, H)).astype(np.float32)))
    actions, next_carry, _ = jax.jit(lambda st, k: agent.act(st, obs, carry, k, env_ids, explore=False))(
        state, jax.random.PRNGKey(3))

    apply = jax.jit(agent.network.apply)
    one = lambda p, r: apply(p, LSTMCarry(carry.c[r:r + 1], carry.h[r:r + 1]), obs[r][None, None], jnp.zeros((1, 1), bool))
    for r in range(16):
        c, q = one(state.params, r)
        np.testing.assert_allclose(np.asarray(next_carry.h[r]), np.asarray(c.h[0]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(next_carry.c[r]), np.asarray(c.c[0]), rtol=1e-5, atol=1e-6)
        assert int(actions[r]) == int(np.argmax(np.asarray(q[0, 0])))
    target_greedy = np.array([int(np.argmax(np.asarray(one(state.target_params, r)[1][0, 0]))) for r in range(16)])
    assert (target_greedy != np.asarray(actions)).sum() >= 2  # guard: the two nets disagree here


# ------------------------------------------------------------------------------------------- TD errors
def nstep_abs_td_np(agent, cfg, params, target_params, data):
    """|td| `[B, L-b-1]` for sequences without episode ends (all stored), written out: unroll from the stored (or
    zero) state; k = min(n, L-1-t); G = sum_j<k g^j r_t+j + g^k h^-1(Q_target(s_t+k, argmax Q_online(s_t+k)));
    td = h(G) - Q(s_t, a_t), with h the identity when value rescaling is off."""
    if cfg.value_rescaling:
        h, h_inv = (lambda x: h_np(x, cfg.rescaling_eps)), (lambda x: h_inv_np(x, cfg.rescaling_eps))
    else:
        h = h_inv = lambda x: x
    batch, length = data["reward"].shape
    obs = jnp.swapaxes(jnp.asarray(data["obs"]), 0, 1)
    start = (LSTMCarry(jnp.asarray(data["carry"].c[:, 0]), jnp.asarray(data["carry"].h[:, 0])) if cfg.stored_state
             else agent.initial_carry(batch))
    no_reset = jnp.zeros((length, batch), bool)
    apply = jax.jit(agent.network.apply)
    q = np.asarray(apply(params, start, obs, no_reset)[1], np.float64)
    qt = np.asarray(apply(target_params, start, obs, no_reset)[1], np.float64)
    r, a, rows = data["reward"].T.astype(np.float64), data["action"].T, np.arange(batch)
    b, n, g = cfg.burn_in, cfg.n_step, cfg.discount
    out = np.zeros((length - b - 1, batch))
    for t in range(b, length - 1):
        k = min(n, length - 1 - t)
        ret = sum(g**j * r[t + j] for j in range(k)) + g**k * h_inv(qt[t + k, rows, np.argmax(q[t + k], -1)])
        out[t - b] = h(ret) - q[t, rows, a[t]]
    return np.abs(out).T


@pytest.mark.parametrize("options", [
    {"n_step": 1, "discount": 0.5, "value_rescaling": False, "burn_in": 0, "stored_state": False},
    {"n_step": 3, "discount": 0.8, "rescaling_eps": 0.1, "burn_in": 3},
], ids=["n1-unscaled-zero-state", "n3-eps0.1-burn-in3-stored"])
def test_td_errors_follow_n_step_discount_rescaling_burn_in_and_stored_state(options):
    """sequence_loss's |td| over the steps after `burn_in` equal the n-step double-Q errors written out with the
    configured n_step, discount, value rescaling (and its eps) and start state (stored or zero)."""
    agent = make(sequence_length=8, period=4, **options)
    rng = np.random.default_rng(3)
    batch, length = 4, 8
    data = {"obs": rng.normal(size=(batch, length, 2)).astype(np.float32),
            "action": rng.integers(0, A, (batch, length)).astype(np.int32),
            "reward": (rng.normal(size=(batch, length)) * 3).astype(np.float32),
            "terminated": np.zeros((batch, length), bool), "truncated": np.zeros((batch, length), bool),
            "carry": LSTMCarry(*rng.normal(size=(2, batch, length, H)).astype(np.float32))}
    params = agent.init(jax.random.PRNGKey(0), jnp.zeros(2)).params
    target = agent.init(jax.random.PRNGKey(1), jnp.zeros(2)).params
    _, aux = jax.jit(agent.sequence_loss)(params, target, jax.tree.map(jnp.asarray, data),
                                          jnp.ones((batch, length), bool), jnp.ones(batch))
    expected = nstep_abs_td_np(agent, agent.cfg, params, target, data)
    got = np.asarray(aux["abs_td"]).T
    assert got.shape == expected.shape == (batch, length - options["burn_in"] - 1)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5)
    # Guards: each option, set back to its default, gives other TD errors on this data.
    defaults = Config()
    for key in ("n_step", "discount", "value_rescaling", "rescaling_eps", "stored_state"):
        if key in options:
            other = dataclasses.replace(agent.cfg, **{key: getattr(defaults, key)})
            assert np.abs(nstep_abs_td_np(agent, other, params, target, data) - expected).max() > 1e-3, key


# ------------------------------------------------------------------------------------------- sequences
@pytest.mark.parametrize("cross", [False, True])
def test_sequences_follow_length_period_and_cross_episodes(cross):
    """Sampled sequences have sequence_length steps of one row in order, start every `period` steps, and run past
    an episode end only with cross_episodes (otherwise their mask stops after it; complete_only keeps only
    sequences that are full or end at an episode end)."""
    length, period = 6, 3
    agent = make(num_envs=2, sequence_length=length, burn_in=1, period=period, cross_episodes=cross,
                 buffer_size=2 * 50)
    t = np.arange(30)[:, None] + np.zeros((1, 2), int)
    terminated = np.zeros((30, 2), bool)
    terminated[[7, 15], 0] = True
    truncated = np.zeros((30, 2), bool)
    truncated[10, 1] = True
    bs = fill(agent, t + 1000 * np.arange(2)[None, :], terminated, truncated)
    sample = jax.jit(lambda k: agent.buffer.sample(bs, k, 512))(jax.random.PRNGKey(0))
    reward, mask = np.asarray(sample.data["reward"]), np.asarray(sample.mask)
    done = np.asarray(sample.data["terminated"] | sample.data["truncated"])
    assert reward.shape == mask.shape == (512, length)
    step = reward % 1000
    start = step[:, 0]
    assert (start % period == 0).all() and len(np.unique(start)) >= 6
    np.testing.assert_array_equal(np.where(mask, step, 0), np.where(mask, start[:, None] + np.arange(length), 0))
    np.testing.assert_array_equal(np.where(mask, reward // 1000, 0), np.where(mask, (reward // 1000)[:, :1], 0))
    crossed = (done[:, :-1] & mask[:, 1:]).any(axis=1)  # a valid step after an episode end
    if cross:
        assert mask.all() and crossed.sum() > 10
    else:
        assert not crossed.any() and (~mask).any(axis=1).sum() > 10
        last = mask.sum(axis=1) - 1
        assert (mask.all(axis=1) | done[np.arange(512), last]).all()


# ------------------------------------------------------------------------------------ runner surface, name
def test_buffer_size_learning_starts_and_train_interval_reach_the_runner_surface():
    """The runners read `learning_starts` (at least num_envs * sequence_length, so every row holds a sequence),
    `train_interval` and the buffer (buffer_size // num_envs steps per row) from the agent."""
    agent = make(buffer_size=4 * 75, learning_starts=1000, train_interval=3)
    assert agent.buffer.capacity_per_env == 75 and agent.train_interval == 3 and agent.learning_starts == 1000
    bs = jax.jit(agent.buffer.init)(agent.step_prototype(jnp.zeros(2)))
    assert bs.rows.data["reward"].shape == (E, 75)
    assert make(learning_starts=10).learning_starts == E * 12  # raised to num_envs * sequence_length


def test_name_selects_the_agent():
    """agent.name picks the agent the registry builds."""
    section = {**dataclasses.asdict(small_config()), "name": "r2d2"}
    agent = agents.make_agent(section, obs_shape=(2,), obs_dtype=jnp.float32, num_actions=A, num_envs=E)
    assert isinstance(agent, R2D2) and agent.cfg == small_config()
    with pytest.raises(ConfigError, match="is not an agent"):
        agents.agent_config({**section, "name": "r2d3"})


# ------------------------------------------------------------------------------------------------ network
@pytest.mark.parametrize("dueling,activation", [(True, "tanh"), (False, "elu")])
def test_network_matches_numpy_forward_pass(dueling, activation):
    """The torso is an MLP of `hidden_sizes` with `activation`, the LSTM has `lstm_size` units (carry and
    params), and the Q head (dueling or not, `head_hidden` layers, `activation`) maps the LSTM output to Q values
    exactly as written out in NumPy."""
    lstm, hidden, head = 7, [8, 6], [5]
    agent = make(obs_shape=(3,), lstm_size=lstm, network=NetworkConfig(
        hidden_sizes=hidden, head_hidden=head, dueling=dueling, activation=activation))
    assert jax.tree.map(jnp.shape, agent.initial_carry(3)) == LSTMCarry((3, lstm), (3, lstm))
    shapes = jax.eval_shape(agent.init, jax.random.PRNGKey(0), jnp.zeros(3)).params  # no init compile
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: jax.device_put((rng.normal(size=x.shape) * 0.5).astype(x.dtype)), shapes)
    p = params["params"]
    assert [p["torso"][f"Dense_{i}"]["kernel"].shape for i in range(len(hidden))] == [(3, 8), (8, 6)]
    assert p["core"]["lstm"]["cell"]["hi"]["kernel"].shape == (lstm, lstm)
    streams = ["value", "advantage"] if dueling else ["q"]
    assert sorted(p["head"]) == sorted([f"{s}_{i}" for s in streams for i in range(len(head))]
                                       + [f"{s}_out" for s in streams])
    obs = jnp.asarray(rng.normal(size=(2, 3, 3)) * 2, jnp.float32)
    carry = LSTMCarry(*map(jnp.asarray, rng.normal(size=(2, 3, lstm)).astype(np.float32)))
    apply = jax.jit(lambda *a: agent.network.apply(*a, capture_intermediates=True, mutable=["intermediates"]))
    (_, q), inter = apply(params, carry, obs, jnp.zeros((2, 3), bool))
    inter = inter["intermediates"]
    torso = mlp_np([p["torso"][f"Dense_{i}"] for i in range(len(hidden))], obs, activation)
    np.testing.assert_allclose(np.asarray(inter["torso"]["__call__"][0]), torso, rtol=1e-5, atol=1e-5)
    x = np.asarray(inter["core"]["__call__"][0][1], np.float64)
    assert x.shape == (2, 3, lstm)

    def stream(name, y, out):
        y = mlp_np([p["head"][f"{name}_{i}"] for i in range(len(head))], y, activation)
        assert p["head"][f"{name}_out"]["kernel"].shape == (head[-1], out)
        return dense_np(p["head"][f"{name}_out"], y)

    if dueling:
        adv = stream("advantage", x, A)
        expected = stream("value", x, 1) + adv - adv.mean(-1, keepdims=True)
    else:
        expected = stream("q", x, A)
    np.testing.assert_allclose(np.asarray(q), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("torso", ["mlp", "small_cnn"])
def test_image_torso_follows_torso_and_cnn_dense(torso):
    """On 10x10x3 images `torso` picks the MLP over the flattened image or the MinAtar CNN, whose dense layer has
    `cnn_dense` units (auto would pick the CNN; the default width is 512)."""
    agent = make(obs_shape=(10, 10, 3), network=NetworkConfig(torso=torso, hidden_sizes=[8], cnn_dense=12))
    shapes = jax.eval_shape(agent.init, jax.random.PRNGKey(0), jnp.zeros((10, 10, 3))).params["params"]["torso"]
    shapes = {k: v["kernel"].shape for k, v in shapes.items()}
    if torso == "mlp":
        assert shapes == {"Dense_0": (300, 8)}
    else:
        assert shapes == {"Conv_0": (3, 3, 3, 16), "Dense_0": (8 * 8 * 16, 12)}


# ------------------------------------------------------------------------------------------------ optimiser
def updates(replay, optim, steps):
    """`steps` train steps of the REPLAY agent with `optim` instead (same params, fresh optimiser state) on the
    filled buffer; per step the gradient of the loss it sampled (computed here), the parameter change and the
    params before it."""
    _, state, bs, _ = replay
    agent = make(**{**REPLAY, "optim": optim})
    state = state.replace(opt_state=jax.jit(agent.optimizer.init)(state.params))
    train = jax.jit(agent.train_step)
    grad_fn = jax.jit(jax.grad(lambda p, t, d, m, w: agent.sequence_loss(p, t, d, m, w)[0]))
    sample_fn = jax.jit(agent.buffer.sample, static_argnums=2)
    out = []
    for k in range(steps):
        key = jax.random.PRNGKey(20 + k)
        sample = sample_fn(bs, key, B)
        w = jnp.asarray(importance_weights_np(sample.probabilities, REPLAY["importance_exponent"]), jnp.float32)
        g = flat(grad_fn(state.params, state.target_params, sample.data, sample.mask, w))
        new, bs, _ = train(state, bs, key)
        out.append((g, flat(new.params) - flat(state.params), flat(state.params)))
        state = new
    return out


def assert_update(delta, expected):
    scale = np.abs(expected).max()
    assert scale > 0
    np.testing.assert_allclose(delta, expected, rtol=2e-3, atol=2e-3 * scale)


def test_optim_sgd_lr_clipping_and_linear_schedule_reach_the_update(replay):
    """optim name=sgd, lr=0.5, max_grad_norm=1e-3, lr_schedule=linear, lr_end_fraction=0.25, lr_decay_updates=2:
    step k is -lr_k * g * min(1, max_grad_norm / |g|) with lr_k = 0.5, 0.3125, 0.125 (linear to lr * end_fraction
    over 2 updates, then constant)."""
    steps = updates(replay, OptimConfig(name="sgd", lr=0.5, max_grad_norm=1e-3, lr_schedule="linear",
                                        lr_end_fraction=0.25, lr_decay_updates=2), steps=3)
    for (g, delta, _), lr in zip(steps, [0.5, 0.3125, 0.125]):
        norm = np.linalg.norm(g)
        assert norm > 1e-2  # the clip is active
        assert_update(delta, -lr * g * 1e-3 / norm)


def test_optim_adamw_eps_and_weight_decay_reach_the_update(replay):
    """optim name=adamw, lr=0.01, eps=0.5, weight_decay=0.5: the first step is -lr (g / (|g| + eps) + wd * params)
    (Adam's bias-corrected moments are g and g^2 after one step)."""
    [(g, delta, params)] = updates(replay, OptimConfig(name="adamw", lr=0.01, eps=0.5, weight_decay=0.5), steps=1)
    assert np.median(np.abs(g[g != 0])) < 0.5  # eps is not negligible against |g|
    assert_update(delta, -0.01 * (g / (np.abs(g) + 0.5) + 0.5 * params))
