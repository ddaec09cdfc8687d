"""agents/muesli.py: CMPO, unroll masks, the online queue, a learner update, configs; slow: CartPole learning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hydra import compose, initialize

from agents.muesli import Config, cmpo_log_probs, episode_index, make_agent, unroll_indices, unroll_masks
from rl.config import ConfigError, agent_config

SMALL = {"name": "muesli", "batch_size": 8, "sequence_length": 6, "unroll_steps": 3, "num_atoms": 21,
         "support_min": -10.0, "support_max": 10.0, "replay_capacity": 64, "train_interval": 4,
         "learning_starts": 0,
         "network": {"torso": "mlp", "hidden_sizes": [16], "state_dim": 16, "model_hidden": [16], "head_hidden": [16]}}
E = 4


def small_agent(**overrides):
    return make_agent({**SMALL, **overrides}, obs_shape=(3,), obs_dtype=jnp.float32, num_actions=2, num_envs=E)


# ---- CMPO ------------------------------------------------------------------------------------------------

def cmpo_numpy(prior_logits, adv, c):
    prior = np.exp(prior_logits - prior_logits.max(-1, keepdims=True))
    prior /= prior.sum(-1, keepdims=True)
    w = prior * np.exp(np.clip(adv, -c, c))
    return w / w.sum(-1, keepdims=True)


@pytest.mark.parametrize("clip", [0.5, 1.0, 3.0])
def test_cmpo_weights_match_numpy(clip):
    rng = np.random.default_rng(0)
    prior_logits = rng.normal(size=(5, 7, 4)) * 2
    adv = rng.normal(size=(5, 7, 4)) * 2  # many beyond the clip
    got = np.exp(np.asarray(cmpo_log_probs(jnp.asarray(prior_logits), jnp.asarray(adv), clip)))
    np.testing.assert_allclose(got, cmpo_numpy(prior_logits, adv, clip), rtol=1e-5, atol=1e-6)
    # The clip bounds the change: pi_cmpo / pi_prior lies within [exp(-2c), exp(2c)].
    prior = cmpo_numpy(prior_logits, np.zeros_like(adv), clip)
    ratio = got / prior
    assert ratio.max() <= np.exp(2 * clip) * (1 + 1e-5) and ratio.min() >= np.exp(-2 * clip) * (1 - 1e-5)


# ---- unroll masks --------------------------------------------------------------------------------------

def masks_loop(valid, term, trunc, K):
    """Brute force: (same, reward_ok, absorbing) for every root t and unroll step k."""
    B, L = valid.shape
    same = np.zeros((B, L, K + 1), bool)
    reward_ok = np.zeros((B, L, K + 1), bool)
    absorbing = np.zeros((B, L, K + 1), bool)
    for b in range(B):
        for t in range(L):
            for k in range(K + 1):
                j = t + k
                crossed = any(term[b, i] or trunc[b, i] for i in range(t, min(j, L)))
                same[b, t, k] = valid[b, t] and j < L and valid[b, j] and not crossed
                if k >= 1:
                    jp = j - 1
                    crossed_p = any(term[b, i] or trunc[b, i] for i in range(t, min(jp, L)))
                    prev_ok = valid[b, t] and jp < L and valid[b, jp] and not crossed_p
                    reward_ok[b, t, k] = prev_ok
                    absorbing[b, t, k] = prev_ok and term[b, jp]
    return same, reward_ok, absorbing


def test_unroll_masks_stop_at_episode_ends_and_data_end():
    rng = np.random.default_rng(1)
    B, L, K = 16, 9, 4
    valid = np.arange(L)[None] < rng.integers(2, L + 1, size=(B, 1))
    term = rng.random((B, L)) < 0.15
    trunc = (rng.random((B, L)) < 0.1) & ~term
    masks = jax.jit(unroll_masks, static_argnums=3)
    same, prev, absorbing = masks(jnp.asarray(valid), jnp.asarray(term), jnp.asarray(trunc), K)
    ref_same, ref_reward, ref_abs = masks_loop(valid, term, trunc, K)
    np.testing.assert_array_equal(np.asarray(same), ref_same)
    np.testing.assert_array_equal(np.asarray(prev)[..., 1:], ref_reward[..., 1:])
    np.testing.assert_array_equal(np.asarray(absorbing), ref_abs)
    # A hand-checked case: termination at step 1, truncation at step 4, data ends after step 6.
    v = jnp.asarray([[True] * 7 + [False] * 2])
    te = jnp.zeros((1, 9), bool).at[0, 1].set(True)
    tr = jnp.zeros((1, 9), bool).at[0, 4].set(True)
    same, prev, absorbing = masks(v, te, tr, 3)
    assert same[0, 0].tolist() == [True, True, False, False]  # steps 0, 1; step 2 is a new episode
    assert prev[0, 0, 1:].tolist() == [True, True, False]  # rewards of steps 0 and 1 only
    assert absorbing[0, 0].tolist() == [False, False, True, False]  # the state after terminal step 1
    assert same[0, 3].tolist() == [True, True, False, False]  # truncated at 4: no value 0, just masked
    assert not absorbing[0, 3].any()
    assert same[0, 5].tolist() == [True, True, False, False]  # steps 7, 8 are past the data
    np.testing.assert_array_equal(episode_index(te | tr)[0], [0, 0, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(unroll_indices(5, 2)[3], [3, 4, 4])


def random_batch(key, B, L, valid_len):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    valid = jnp.arange(L)[None] < valid_len[:, None]
    batch = {"obs": jax.random.normal(k1, (B, L, 3)), "action": jax.random.randint(k2, (B, L), 0, 2),
             "reward": jax.random.normal(k3, (B, L)), "terminated": jax.random.uniform(k4, (B, L)) < 0.2,
             "truncated": jnp.zeros((B, L), bool), "behaviour_logp": jnp.full((B, L), jnp.log(0.5))}
    return batch, valid


def perturbed_state(agent, key):
    """Initial state with noise on every parameter (so that the zero-initialised heads are not constant)."""
    state = agent.init(key, jnp.zeros(3))
    leaves, tree = jax.tree_util.tree_flatten(state.params)
    keys = jax.random.split(key, len(leaves))
    params = tree.unflatten([x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    return state.replace(params=params, target_params=params)


def test_loss_ignores_steps_past_the_data_and_model_steps_past_episode_ends():
    agent = small_agent()
    state = perturbed_state(agent, jax.random.PRNGKey(0))
    L = agent.cfg.sequence_length
    batch, valid = random_batch(jax.random.PRNGKey(1), 8, L, jnp.array([6, 5, 4, 3, 6, 2, 6, 1]))

    @jax.jit
    def loss(b, v):
        targets, _, _ = agent.targets(state, b, v)
        return agent.loss(state.params, targets, b, v)[0]

    base = loss(batch, valid)
    noise = jax.random.normal(jax.random.PRNGKey(2), batch["obs"].shape) * 5
    scrambled = {**batch, "obs": jnp.where(valid[..., None], batch["obs"], noise),
                 "reward": jnp.where(valid, batch["reward"], 100.0),
                 "action": jnp.where(valid, batch["action"], 1 - batch["action"]),
                 "terminated": jnp.where(valid, batch["terminated"], ~batch["terminated"])}
    np.testing.assert_allclose(loss(scrambled, valid), base, rtol=1e-5)
    # An episode that ended at step 1 followed by a one-step "episode" that is then cut off by the data:
    # root 0's unroll must not see the reward of step 2, which belongs to the next episode.
    one = {k: v[:1] for k, v in batch.items()}
    one = {**one, "terminated": jnp.zeros((1, L), bool).at[0, 1].set(True)}
    v1 = jnp.arange(L)[None] < 3

    @jax.jit
    def reward_loss(r2):
        b = {**one, "reward": one["reward"].at[0, 2].set(r2)}
        targets, _, _ = agent.targets(state, b, v1)
        return agent.loss(state.params, targets, b, v1)[1]["reward_loss"]

    # With roots 0, 1, 2: rewards of steps (0, 1) for root 0, (1,) for root 1, (2,) for root 2 -> 4 terms;
    # r_2 enters only through root 2's own one-step prediction, one term in four.
    d = (reward_loss(9.0) - reward_loss(-9.0)) * 4
    net = agent.network
    root2 = net.apply(state.params, one["obs"][0, 2], method=type(net).represent)
    _, logits = net.apply(state.params, root2, one["action"][0, 2], method=type(net).step)
    expected = agent.support.cross_entropy(logits, 9.0) - agent.support.cross_entropy(logits, -9.0)
    assert abs(float(expected)) > 0.1
    np.testing.assert_allclose(d, expected, rtol=1e-4, atol=1e-5)


# ---- buffer, online queue and train step ----------------------------------------------------------------

def fill(agent, state, buffer_state, key, steps):
    """`steps` env steps of random observations for every env (env 0 terminates every 5th step)."""

    def one(buffer_state, xs):
        i, k = xs
        k1, k2 = jax.random.split(k)
        obs = jax.random.normal(k1, (E, 3))
        action, _, extras = agent.act(state, obs, (), k2, jnp.arange(E))
        step = agent.make_step(obs, action, jnp.ones(E), jnp.zeros(E, bool).at[0].set(i % 5 == 4),
                               jnp.zeros(E, bool), None, (), extras)
        return agent.buffer.add(buffer_state, step, jnp.arange(E)), None

    key, sub = jax.random.split(key)
    buffer_state, _ = jax.lax.scan(one, buffer_state, (jnp.arange(steps), jax.random.split(sub, steps)))
    return buffer_state, key


def test_online_queue_is_sampled_once_then_consumed():
    agent = small_agent(replay_fraction=0.5)
    key = jax.random.PRNGKey(0)
    state = agent.init(key, jnp.zeros(3))
    buffer_state = agent.buffer.init(agent.step_prototype(jnp.zeros(3)))
    buffer_state, key = fill(agent, state, buffer_state, key, 10)
    train = jax.jit(agent.train_step, donate_argnums=(0, 1))
    state, buffer_state, m = train(state, buffer_state, jax.random.PRNGKey(1))
    assert m["online_steps"] > 0 and np.isfinite(float(m["loss"]))
    assert not agent.buffer.can_sample_online(buffer_state)  # consumed by the train step
    np.testing.assert_array_equal(buffer_state.rows.online_start, buffer_state.rows.written)
    # Nothing new: the next train step gets no online data (nothing is sampled from the queue twice).
    state, buffer_state, m = train(state, buffer_state, jax.random.PRNGKey(2))
    assert float(m["online_steps"]) == 0.0 and float(m["replay_steps"]) > 0
    # Two new steps per env: the online part holds at most those (starts inside the queue, masks stop at
    # the newest step), then they are consumed again.
    buffer_state, key = fill(agent, state, buffer_state, key, 2)
    state, buffer_state, m = train(state, buffer_state, jax.random.PRNGKey(3))
    assert 0 < float(m["online_steps"]) <= agent.online_batch * 2
    assert not agent.buffer.can_sample_online(buffer_state)


def test_updates_fit_a_fixed_batch():
    agent = small_agent(optim={"lr": 3e-3})
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(3))
    batch, valid = random_batch(jax.random.PRNGKey(1), 8, agent.cfg.sequence_length, jnp.full(8, 6))
    batch["reward"] = jnp.round(batch["reward"])
    update = jax.jit(agent.update)
    _, first = update(state, batch, valid)
    for _ in range(150):
        state, m = update(state, batch, valid)
    assert float(m["reward_loss"]) < 0.5 * float(first["reward_loss"])
    assert float(m["value_loss"]) < float(first["value_loss"])
    assert int(state.updates) == 150
    # The target network trails the online one by the EMA.
    diff = jax.tree_util.tree_map(lambda a, b: jnp.abs(a - b).max(), state.params, state.target_params)
    assert 0 < max(jax.tree_util.tree_leaves(diff)) < 1.0


def test_act_returns_behaviour_log_probs():
    agent = small_agent()
    state = agent.init(jax.random.PRNGKey(0), jnp.zeros(3))
    obs = jax.random.normal(jax.random.PRNGKey(1), (E, 3))
    action, carry, extras = agent.act(state, obs, (), jax.random.PRNGKey(2), jnp.arange(E))
    assert action.shape == (E,) and action.dtype == jnp.int32 and carry == ()
    np.testing.assert_allclose(extras["behaviour_logp"], np.log(0.5), atol=0.05)  # near-uniform at init
    greedy, _, _ = agent.act(state, obs, (), jax.random.PRNGKey(2), jnp.arange(E), explore=False)
    assert greedy.shape == (E,)


# ---- configs ---------------------------------------------------------------------------------------------

def test_bad_config_is_rejected_with_the_key_named():
    with pytest.raises(ConfigError, match="replay_fraction"):
        agent_config({**SMALL, "replay_fraction": 1.5})
    with pytest.raises(ConfigError, match="torso"):
        agent_config({**SMALL, "network": {"torso": "transformer"}})
    with pytest.raises(ConfigError, match="batch_sise"):
        agent_config({**SMALL, "batch_sise": 3})
    with pytest.raises(ValueError, match="impala"):
        make_agent({**SMALL, "network": {"torso": "impala"}}, obs_shape=(3,), obs_dtype=jnp.float32,
                   num_actions=2, num_envs=E)


def test_hydra_presets():
    with initialize(version_base="1.3", config_path="../../configs"):
        paper = agent_config(compose("config", overrides=["agent=muesli", "env=envpool/pong"]).agent)
        minatar = agent_config(compose("config", overrides=["agent=muesli", "env=breakout-minatar"]).agent)
        cartpole = agent_config(compose("config", overrides=["agent=muesli", "env=cartpole"]).agent)
        small = agent_config(compose("config", overrides=["agent=muesli_small", "env=breakout-minatar"]).agent)
    assert paper == Config()  # configs/agent/muesli.yaml == the dataclass defaults
    assert (paper.batch_size, paper.sequence_length, paper.num_atoms, paper.replay_fraction) == (96, 30, 601, 0.75)
    assert (paper.discount, paper.retrace_lambda, paper.target_update_rate, paper.optim.lr) == (0.995, 0.95, 0.1, 3e-4)
    assert cartpole == small and cartpole.network.torso == "mlp" and cartpole.batch_size < 96
    assert minatar.batch_size == small.batch_size and minatar.network.hidden_sizes == [256, 128]


# ---- learning (slow) ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cartpole_reaches_475_within_500k_steps_on_3_seeds(tmp_path):
    """`python -m scripts.train agent=muesli env=cartpole seeds=3`: every seed's mean training return over a
    log interval (10k env steps) reaches 475 within 500k env steps."""
    from rl.config import compose
    from scripts.muesli_experiments import summary
    from scripts.train import run

    cfg = compose(["agent=muesli", "env=cartpole", "seeds=3", "total_steps=500000", "logger=none",
                   "checkpoint.enabled=false", "eval_episodes=0"])
    run(cfg, tmp_path)
    rows = summary(tmp_path, threshold=475.0)
    print("per seed:", rows)
    assert len(rows) == 3
    assert all(r["first_step_at_threshold"] is not None for r in rows), rows


@pytest.mark.slow
def test_pong_smoke_sebulba(tmp_path):
    """`agent=muesli env=envpool/pong` (paper config, smaller batch) runs 20k env steps through the Sebulba
    runner: episodes are logged and the losses of its updates are finite."""
    import csv

    from rl.config import compose
    from scripts.train import run

    cfg = compose(["agent=muesli", "env=envpool/pong", "num_envs=8", "env.batch_size=4", "total_steps=20000",
                   "log_interval=4000", "logger=none", "eval_episodes=0", "agent.batch_size=8",
                   "agent.learning_starts=4000", "agent.replay_capacity=20000", "agent.train_interval=40"])
    res = run(cfg, tmp_path)
    assert res["env_steps"] >= 20000
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert losses and np.isfinite(losses).all()
    assert any(r.get("episode_return") for r in rows)  # Pong episodes (~800+ steps) ended and were logged
