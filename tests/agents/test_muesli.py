"""agents/muesli.py: CMPO, unroll masks, the online queue, a learner update, configs; slow: CartPole learning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from agents import agent_config, make_agent
from agents.muesli import Config, cmpo_log_probs, episode_index, unroll_indices, unroll_masks
from agents.muesli.targets import advantage_scale
from agents.setup import compose
from rl.config import ConfigError

SMALL = {"name": "muesli", "batch_size": 8, "sequence_length": 6, "unroll_steps": 3, "num_atoms": 21,
         "support_min": -10.0, "support_max": 10.0, "buffer_size": 64, "train_interval": 4,
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
    got = np.exp(np.asarray(jax.jit(cmpo_log_probs, static_argnums=2)(jnp.asarray(prior_logits), jnp.asarray(adv),
                                                                      clip)))
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

    @jax.jit
    def perturbed(key):
        state = agent.init(key, jnp.zeros(3))
        leaves, tree = jax.tree_util.tree_flatten(state.params)
        keys = jax.random.split(key, len(leaves))
        params = tree.unflatten([x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
        return state.replace(params=params, target_params=params)

    return perturbed(key)


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

    @jax.jit
    def one_step_expected(params, obs, action):
        root2 = net.apply(params, obs, method=type(net).represent)
        _, logits = net.apply(params, root2, action, method=type(net).step)
        return agent.support.cross_entropy(logits, 9.0) - agent.support.cross_entropy(logits, -9.0)

    expected = one_step_expected(state.params, one["obs"][0, 2], one["action"][0, 2])
    assert abs(float(expected)) > 0.1
    np.testing.assert_allclose(d, expected, rtol=1e-4, atol=1e-5)


# ---- the whole loss against a loop-based re-derivation ---------------------------------------------------

REF = {**SMALL, "unroll_steps": 2, "network": {**SMALL["network"], "state_dim": 8}}
A = 3  # three actions: argmaxes, CMPO weights and importance ratios are not forced by a two-way choice


def _h(x, eps=1e-3):
    return np.sign(x) * (np.sqrt(np.abs(x) + 1) - 1) + eps * x


def _h_inv(x, eps=1e-3):
    return np.sign(x) * (((np.sqrt(1 + 4 * eps * (np.abs(x) + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _scalar(logits, lo, hi):
    """h^-1 of the expected atom of categorical logits [..., N] over N atoms in [lo, hi]."""
    atoms = np.linspace(lo, hi, logits.shape[-1])
    return _h_inv(np.sum(_softmax(logits) * atoms, -1))


def _two_hot(x, lo, hi, n):
    """[..., N]: the two atoms around h(x) (clipped to [lo, hi]) share the mass, expectation h(x)."""
    hx = np.clip(_h(np.asarray(x, np.float64)), lo, hi)
    pos = (hx - lo) / (hi - lo) * (n - 1)
    low = np.clip(np.floor(pos).astype(int), 0, n - 2)
    frac = pos - low
    out = np.zeros(np.shape(x) + (n,))
    np.put_along_axis(out, low[..., None], (1 - frac)[..., None], -1)
    np.put_along_axis(out, (low + 1)[..., None], frac[..., None], -1)
    return out


def _retrace_backward(q, v, r, term, trunc, valid, c, gamma):
    """Retrace by the backward recursion G_t = r_t + gamma (v_{t+1} + c_{t+1} (G_{t+1} - q_{t+1})), with
    G_t = r_t at a termination and G_t = r_t + gamma v_{t+1} when step t+1 has no target of its own."""
    L = len(q)
    has = np.array([valid[t] and not trunc[t] and (term[t] or (t + 1 < L and valid[t + 1])) for t in range(L)])
    G = np.zeros(L)
    for t in reversed(range(L)):
        if not has[t]:
            continue
        if term[t]:
            G[t] = r[t]
        elif has[t + 1]:
            G[t] = r[t] + gamma * (v[t + 1] + c[t + 1] * (G[t + 1] - q[t + 1]))
        else:
            G[t] = r[t] + gamma * v[t + 1]
    V = np.where(has, v + c * (G - q), 0.0)
    return G, V, has


def _random_params(agent, seed):
    """Every parameter drawn at random (NumPy; no init compile): kernels and biases N(0, 0.3^2) (the policy
    output layer N(0, 0.05^2)), LayerNorm scales 1 + N(0, 0.3^2); no head is constant (the real init zeroes
    the value and reward heads)."""
    shapes = jax.eval_shape(agent.network.init, jax.random.PRNGKey(0), jnp.zeros((1, 3)))
    rng = np.random.default_rng(seed)

    def draw(path, x):
        name = jax.tree_util.keystr(path)
        base = 1.0 if "scale" in name else 0.0
        std = 0.05 if "policy_head" in name and "Dense_1" in name else 0.3  # a policy that is not too sharp
        return jax.device_put((base + std * rng.normal(size=x.shape)).astype(x.dtype))

    return jax.tree_util.tree_map_with_path(draw, shapes)


def _reference_problem():
    """A small agent, online and target params that differ, a prior advantage EMA and a hand-made batch with a
    termination, a truncation and an early end of the data."""
    from agents.muesli import MuesliState

    agent = make_agent(REF, obs_shape=(3,), obs_dtype=jnp.float32, num_actions=A, num_envs=E)
    params = _random_params(agent, 0)
    state = MuesliState(params=params, target_params=_random_params(agent, 1),
                        opt_state=jax.jit(agent.optimizer.init)(params),
                        adv_ema=rlax.EmaState(mu=jnp.float32(2.0), nu=jnp.float32(10.0), decay_product=jnp.float32(0.5)),
                        updates=jnp.zeros((), jnp.int32))
    rng = np.random.default_rng(0)
    B, L = 3, agent.cfg.sequence_length
    term, trunc = np.zeros((B, L), bool), np.zeros((B, L), bool)
    term[0, 2] = True  # episode ends inside the sequence; a new one starts at 3
    trunc[1, 3] = True  # time limit at step 3
    term[2, 5] = True  # past the data (row 2 holds 4 valid steps): must not count
    valid = np.arange(L)[None] < np.array([[L], [L], [4]])
    batch = {"obs": rng.normal(size=(B, L, 3)).astype(np.float32),
             "action": rng.integers(0, A, (B, L)).astype(np.int32),
             "reward": (rng.normal(size=(B, L)) * 2).astype(np.float32),
             "terminated": term, "truncated": trunc,
             # behaviour probabilities below and above the (near 1/3) target probabilities: pi/mu on both sides of 1
             "behaviour_logp": np.log(np.where((np.arange(B)[:, None] + np.arange(L)) % 2 == 0, rng.uniform(0.08, 0.25, (B, L)),
                                               rng.uniform(0.5, 0.9, (B, L)))).astype(np.float32)}
    return agent, state, batch, valid


@pytest.fixture(scope="module")
def reference_problem():
    """The problem, the agent's targets for it (jitted) and the NumPy reference targets, computed once."""
    agent, state, batch, valid = _reference_problem()
    jbatch, jvalid = jax.tree.map(jnp.asarray, batch), jnp.asarray(valid)
    out = jax.jit(agent.targets)(state, jbatch, jvalid)
    return agent, state, batch, valid, out, _reference_targets(agent, state, batch, valid)


def _net(agent, params, method, *args):
    from agents.muesli.networks import MuesliNetwork

    return agent.network.apply(params, *args, method=getattr(MuesliNetwork, method))


def _jit_net(agent):
    """`_net` of `agent`, jitted (`method` static)."""
    return jax.jit(lambda params, method, *args: _net(agent, params, method, *args), static_argnums=1)


def _reference_targets(agent, state, batch, valid):
    """Targets of agents/muesli.py re-derived in NumPy from the target network's outputs."""
    cfg, lo, hi = agent.cfg, agent.cfg.support_min, agent.cfg.support_max
    tp = state.target_params
    net = _jit_net(agent)
    states = net(tp, "represent", jnp.asarray(batch["obs"]))
    prior_logits = np.asarray(net(tp, "predict", states)[0], np.float64)
    B, L = valid.shape
    q, r = np.zeros((B, L, A)), np.zeros((B, L, A))
    for a in range(A):  # one-step look-ahead for every action: r(s, a) + gamma v(s')
        nxt, reward_logits = net(tp, "step", states, jnp.full((B, L), a, jnp.int32))
        value_logits = net(tp, "predict", nxt)[1]
        r[..., a] = _scalar(np.asarray(reward_logits, np.float64), lo, hi)
        q[..., a] = r[..., a] + cfg.discount * _scalar(np.asarray(value_logits, np.float64), lo, hi)
    prior = _softmax(prior_logits)
    v = np.sum(prior * q, -1)
    act = batch["action"]
    pi_taken = np.take_along_axis(prior, act[..., None], -1)[..., 0]
    c = cfg.retrace_lambda * np.minimum(1.0, pi_taken / np.exp(batch["behaviour_logp"].astype(np.float64)))
    q_taken = np.take_along_axis(q, act[..., None], -1)[..., 0]
    G, V, has = np.zeros((B, L)), np.zeros((B, L)), np.zeros((B, L), bool)
    for b in range(B):
        G[b], V[b], has[b] = _retrace_backward(q_taken[b], v[b], batch["reward"][b], batch["terminated"][b],
                                               batch["truncated"][b], valid[b], c[b], cfg.discount)
    adv = (G - v)[has]
    d = cfg.adv_var_decay
    ema = state.adv_ema
    mu = d * float(ema.mu) + (1 - d) * adv.mean()
    nu = d * float(ema.nu) + (1 - d) * np.mean(adv**2)
    dp = float(ema.decay_product) * d
    scale = np.sqrt(nu / (1 - dp) + cfg.adv_var_eps)  # sqrt of the debiased second moment
    floor = (1 - cfg.prior_uniform_mix) * prior + cfg.prior_uniform_mix / A  # CMPO's prior only
    cmpo = floor * np.exp(np.clip((q - v[..., None]) / scale, -cfg.cmpo_clip, cfg.cmpo_clip))
    cmpo /= cmpo.sum(-1, keepdims=True)
    return {"G": G, "V": V, "mask": has, "cmpo": cmpo, "pg_adv": (G - v) / scale, "scale": scale,
            "ema": (mu, nu, dp), "q": q, "v": v, "prior": floor, "q_taken": q_taken, "r": r}


def _reference_loss_fn(agent, batch, valid, ref, rho):
    """The Muesli loss as a function of the online params (differentiable; all targets and the importance
    weights `rho` are constants), with every mask written as an explicit loop over (b, t, k)."""
    cfg, lo, hi, n = agent.cfg, agent.cfg.support_min, agent.cfg.support_max, agent.cfg.num_atoms
    K = cfg.unroll_steps
    B, L = valid.shape
    same, reward_ok, absorbing = masks_loop(valid, batch["terminated"], batch["truncated"], K)
    at = lambda t: min(t, L - 1)
    act = batch["action"]
    # Constant targets per (b, t, k).
    cmpo_k = np.stack([ref["cmpo"][:, [at(t + k) for t in range(L)]] for k in range(K + 1)], 2)  # [B, L, K+1, A]
    value_t = np.zeros((B, L, K + 1))
    value_m = np.zeros((B, L, K + 1))
    reward_t = np.zeros((B, L, K))
    for b in range(B):
        for t in range(L):
            for k in range(K + 1):
                if same[b, t, k] and ref["mask"][b, t + k]:
                    value_t[b, t, k], value_m[b, t, k] = ref["V"][b, t + k], 1.0
                elif absorbing[b, t, k]:
                    value_t[b, t, k], value_m[b, t, k] = 0.0, 1.0
                if k >= 1:
                    reward_t[b, t, k - 1] = batch["reward"][b, at(t + k - 1)]
    value_2hot = _two_hot(value_t, lo, hi, n)
    reward_2hot = _two_hot(reward_t, lo, hi, n)
    model_actions = np.stack([act[:, [at(t + k) for t in range(L)]] for k in range(K)], 0)  # [K, B, L]
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    mask_pg, mask_valid = f32(ref["mask"]), f32(valid)
    same_m, reward_m = f32(same[..., 1:]), f32(reward_ok[..., 1:])
    cmpo_k, value_2hot, reward_2hot, value_m = f32(cmpo_k), f32(value_2hot), f32(reward_2hot), f32(value_m)
    rho, pg_adv = f32(rho), f32(ref["pg_adv"])
    onehot = f32(np.eye(A)[act])
    scale_grad = cfg.dynamics_grad_scale

    def mean_over(x, m):
        return jnp.sum(x * m) / max(float(np.sum(np.asarray(m))), 1.0)

    def loss(params):
        s = _net(agent, params, "represent", jnp.asarray(batch["obs"]))
        policy, value, reward = [], [], []
        for k in range(K + 1):
            p_logits, v_logits = _net(agent, params, "predict", s)
            policy.append(jax.nn.log_softmax(p_logits))
            value.append(jax.nn.log_softmax(v_logits))
            if k < K:  # the gradient entering the dynamics is scaled by dynamics_grad_scale
                s = jax.lax.stop_gradient(s) + scale_grad * (s - jax.lax.stop_gradient(s))
                s, r_logits = _net(agent, params, "step", s, jnp.asarray(model_actions[k]))
                reward.append(jax.nn.log_softmax(r_logits))
        log_pi_taken = jnp.sum(onehot * policy[0], -1)
        pg = mean_over(-rho * pg_adv * log_pi_taken, mask_pg)
        kl = lambda k: jnp.sum(cmpo_k[:, :, k] * (jnp.log(cmpo_k[:, :, k]) - policy[k]), -1)
        cmpo = mean_over(kl(0), mask_valid)
        model_policy = sum(jnp.sum(kl(k) * same_m[..., k - 1]) for k in range(1, K + 1)) / max(
            float(np.sum(np.asarray(same_m))), 1.0)
        ce_v = jnp.stack([-jnp.sum(value_2hot[:, :, k] * value[k], -1) for k in range(K + 1)], -1)
        ce_r = jnp.stack([-jnp.sum(reward_2hot[:, :, k] * reward[k], -1) for k in range(K)], -1)
        value_loss = mean_over(ce_v, value_m)
        reward_loss = mean_over(ce_r, reward_m)
        entropy = mean_over(-jnp.sum(jnp.exp(policy[0]) * policy[0], -1), mask_valid)
        total = (cfg.pg_weight * pg + cfg.cmpo_weight * cmpo + cfg.model_policy_weight * model_policy
                 + cfg.value_weight * value_loss + cfg.reward_weight * reward_loss - cfg.entropy_weight * entropy)
        return total, {"pg_loss": pg, "cmpo_kl": cmpo, "model_policy_loss": model_policy, "value_loss": value_loss,
                       "reward_loss": reward_loss, "entropy": entropy}

    return loss


def assert_targets_match(targets, adv_ema, metrics, ref):
    """The agent's targets equal `_reference_targets`'s (`ref`) on the valid steps."""
    m = ref["mask"]
    np.testing.assert_array_equal(np.asarray(targets.retrace.mask), m)
    np.testing.assert_allclose(np.asarray(targets.retrace.q)[m], ref["G"][m], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.asarray(targets.retrace.v)[m], ref["V"][m], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose([adv_ema.mu, adv_ema.nu, adv_ema.decay_product], ref["ema"], rtol=1e-4)
    # float32 EMA moments against the float64 reference (a relative 1.04e-5 seen with jax 0.10.2)
    np.testing.assert_allclose(float(metrics["adv_scale"]), ref["scale"], rtol=1e-4)
    np.testing.assert_allclose(np.exp(np.asarray(targets.cmpo_log_probs)), ref["cmpo"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(targets.pg_advantage)[m], ref["pg_adv"][m], rtol=1e-4, atol=1e-4)


def test_targets_match_numpy_reference(reference_problem):
    """Look-ahead q, the baseline v = E_prior q, Retrace with c = lambda min(1, pi_prior/mu) from the target
    network, the advantage EMA (debiased second moment, not the variance), the CMPO policy with advantages
    divided by the scale, and the normalised policy-gradient advantage."""
    agent, _, _, valid, (targets, adv_ema, metrics), ref = reference_problem
    assert_targets_match(targets, adv_ema, metrics, ref)
    m = ref["mask"]
    # Guards: every term matters on this batch.
    adv = (ref["q"] - ref["v"][..., None]) / ref["scale"]
    assert abs(ref["scale"] - 1) > 0.3  # dividing by the scale changes the advantages
    assert ((np.abs(adv) < agent.cfg.cmpo_clip) & (np.abs(adv) > 0.05)).sum() > 10  # ... inside the clip
    mu_hat = ref["ema"][0] / (1 - ref["ema"][2])
    assert mu_hat**2 > 0.2 * ref["scale"] ** 2  # the mean term of the second moment is not negligible
    assert (~m & valid).any() and m.sum() >= 8
    # The logged means: the prior's value over the valid steps, the Retrace value over those with a target.
    assert not np.asarray(valid).all()
    np.testing.assert_allclose(float(metrics["value_prior"]), ref["v"][np.asarray(valid)].mean(), rtol=1e-4)
    np.testing.assert_allclose(float(metrics["retrace_target"]), ref["V"][m].mean(), rtol=1e-4, atol=1e-4)


def test_loss_and_gradient_match_reference(reference_problem):
    """`MuesliAgent.loss` (value, every term, and the gradient w.r.t. all online params) equals the loop-based
    reference: policy gradient -rho * A * log pi(a) with rho = min(1, pi/mu) held constant, KL(pi_cmpo || pi) at
    the root and at the model states, value and reward cross-entropies over two-hot targets (value 0 after a
    termination), and gradients into the model states scaled by dynamics_grad_scale."""
    agent, state, batch, valid, (targets, _, _), ref = reference_problem
    jbatch, jvalid = jax.tree.map(jnp.asarray, batch), jnp.asarray(valid)
    # rho from the online policy at the root, computed outside any gradient.
    net = _jit_net(agent)
    root_logits = np.asarray(net(state.params, "predict",
                                 net(state.params, "represent", jnp.asarray(batch["obs"])))[0], np.float64)
    pi_taken = np.take_along_axis(_softmax(root_logits), batch["action"][..., None], -1)[..., 0]
    rho = np.minimum(1.0, pi_taken / np.exp(batch["behaviour_logp"].astype(np.float64)))
    assert (rho[ref["mask"]] < 0.9).sum() >= 3 and (rho[ref["mask"]] == 1.0).sum() >= 3  # both sides of the clip

    ref_loss = _reference_loss_fn(agent, batch, valid, ref, rho)
    (value, metrics), grads = jax.jit(jax.value_and_grad(agent.loss, has_aux=True))(state.params, targets, jbatch,
                                                                                    jvalid)
    (ref_value, ref_terms), ref_grads = jax.jit(jax.value_and_grad(ref_loss, has_aux=True))(state.params)
    p_root = _softmax(root_logits)  # the logged entropy: of the online policy at the root, over valid steps
    np.testing.assert_allclose(float(metrics["entropy"]), -(p_root * np.log(p_root)).sum(-1)[valid].mean(), rtol=1e-4)
    for name, term in ref_terms.items():
        assert abs(float(term)) > 1e-3, name  # every term is present on this batch
        np.testing.assert_allclose(float(metrics[name]), float(term), rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-4)

    def close(path, g, r):
        g, r = np.asarray(g), np.asarray(r)
        assert np.linalg.norm(g - r) <= 2e-3 * np.linalg.norm(r) + 1e-6, jax.tree_util.keystr(path)

    jax.tree_util.tree_map_with_path(close, grads, ref_grads)
    assert np.linalg.norm(np.asarray(ref_grads["params"]["dynamics_out"]["kernel"])) > 1e-4


def test_target_network_is_an_ema_of_the_online_params(reference_problem):
    agent, state, batch, valid, *_ = reference_problem
    new, _ = jax.jit(agent.update)(state, jax.tree.map(jnp.asarray, batch), jnp.asarray(valid))
    rate = agent.cfg.target_update_rate
    expected = jax.jit(lambda ps, ts: jax.tree.map(lambda p, t: rate * p + (1 - rate) * t, ps, ts))(
        new.params, state.target_params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6),
                 new.target_params, expected)


def test_advantage_ema_moves_by_masked_batch_moments_and_stays_put_without_targets():
    """The EMA of the masked advantage moments against NumPy; a batch without any target leaves it (and so the
    scale) unchanged instead of decaying it towards zero."""
    ema = rlax.EmaState(mu=jnp.float32(2.0), nu=jnp.float32(10.0), decay_product=jnp.float32(0.5))
    adv = np.array([[1.0, -3.0, 5.0], [2.0, 7.0, -1.0]], np.float32)
    mask = np.array([[True, True, False], [False, True, True]])
    scale_of = jax.jit(advantage_scale, static_argnames=("decay", "eps"))
    moved, scale, mean = scale_of(ema, jnp.asarray(adv), jnp.asarray(mask), decay=0.9, eps=1e-4)
    mu, nu, dp = 0.9 * 2.0 + 0.1 * adv[mask].mean(), 0.9 * 10.0 + 0.1 * np.mean(adv[mask] ** 2), 0.45
    np.testing.assert_allclose([moved.mu, moved.nu, moved.decay_product], [mu, nu, dp], rtol=1e-6)
    np.testing.assert_allclose([scale, mean], [np.sqrt(nu / (1 - dp) + 1e-4), mu / (1 - dp)], rtol=1e-5)

    kept, scale, mean = scale_of(ema, jnp.asarray(adv), jnp.zeros_like(mask), decay=0.9, eps=1e-4)
    np.testing.assert_array_equal([kept.mu, kept.nu, kept.decay_product], [2.0, 10.0, 0.5])
    np.testing.assert_allclose([scale, mean], [np.sqrt(20.0 + 1e-4), 4.0], rtol=1e-6)


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
    state = jax.jit(agent.init)(key, jnp.zeros(3))
    buffer_state = jax.jit(agent.buffer.init)(agent.step_prototype(jnp.zeros(3)))
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
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
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
    diff = jax.tree_util.tree_map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(), state.params,
                                  state.target_params)
    assert 0 < max(jax.tree_util.tree_leaves(diff)) < 1.0


def test_act_returns_behaviour_log_probs():
    agent = small_agent()
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), jnp.zeros(3))
    obs = jax.random.normal(jax.random.PRNGKey(1), (E, 3))
    action, carry, extras = jax.jit(lambda st, o, k: agent.act(st, o, (), k, jnp.arange(E)))(
        state, obs, jax.random.PRNGKey(2))
    assert action.shape == (E,) and action.dtype == jnp.int32 and carry == ()
    np.testing.assert_allclose(extras["behaviour_logp"], np.log(0.5), atol=0.05)  # near-uniform at init
    greedy, _, _ = jax.jit(lambda st, o, k: agent.act(st, o, (), k, jnp.arange(E), explore=False))(
        state, obs, jax.random.PRNGKey(2))
    assert greedy.shape == (E,)


# ---- configs ---------------------------------------------------------------------------------------------

def test_bad_config_is_rejected_with_the_key_named():
    with pytest.raises(ConfigError, match="replay_fraction"):
        agent_config({**SMALL, "replay_fraction": 1.5})
    with pytest.raises(ConfigError, match="learning_starts must be >= 0, got -1"):
        agent_config({**SMALL, "learning_starts": -1})
    assert agent_config({**SMALL, "learning_starts": 0}).learning_starts == 0
    with pytest.raises(ConfigError, match="torso"):
        agent_config({**SMALL, "network": {"torso": "transformer"}})
    with pytest.raises(ConfigError, match="batch_sise"):
        agent_config({**SMALL, "batch_sise": 3})
    with pytest.raises(ValueError, match="impala"):
        make_agent({**SMALL, "network": {"torso": "impala"}}, obs_shape=(3,), obs_dtype=jnp.float32,
                   num_actions=2, num_envs=E)


def test_hydra_presets():
    paper = agent_config(compose(["agent=muesli", "env=envpool/pong"]).agent)
    minatar = agent_config(compose(["agent=muesli", "env=breakout-minatar"]).agent)
    cartpole = agent_config(compose(["agent=muesli", "env=cartpole"]).agent)
    small = agent_config(compose(["agent=muesli_small", "env=breakout-minatar"]).agent)
    assert paper == Config()  # the paper preset of agents/muesli.yaml is the dataclass defaults
    assert (paper.batch_size, paper.sequence_length, paper.num_atoms, paper.replay_fraction) == (96, 30, 601, 0.75)
    assert (paper.discount, paper.retrace_lambda, paper.target_update_rate, paper.optim.lr) == (0.995, 0.95, 0.1, 3e-4)
    assert cartpole == small and cartpole.network.torso == "mlp" and cartpole.batch_size < 96
    assert minatar.batch_size == small.batch_size and minatar.network.hidden_sizes == [256, 128]


# ---- learning (slow) ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cartpole_reaches_475_within_500k_steps_on_3_seeds(tmp_path):
    """`python -m scripts.train agent=muesli env=cartpole seeds=3`: every seed's mean training return over a
    log interval (10k env steps) reaches 475 within 500k env steps."""
    import csv

    from scripts.train import run

    cfg = compose(["agent=muesli", "env=cartpole", "seeds=3", "total_steps=500000", "logger=none",
                   "checkpoint.enabled=false", "eval_episodes=0"])
    run(cfg, tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    best = {}  # seed -> its best logged mean training return
    for r in rows:
        if r["episode_return"]:
            best[r["seed"]] = max(best.get(r["seed"], -np.inf), float(r["episode_return"]))
    print("best logged return per seed:", best)
    assert len(best) == 3 and min(best.values()) >= 475.0, best


@pytest.mark.slow
def test_pong_smoke_sebulba(tmp_path):
    """`agent=muesli env=envpool/pong` (paper config, smaller batch) runs 20k env steps through the Sebulba
    runner: episodes are logged and the losses of its updates are finite."""
    import csv

    from scripts.train import run

    cfg = compose(["agent=muesli", "env=envpool/pong", "num_envs=8", "env.envs_per_recv=4", "total_steps=20000",
                   "log_interval=4000", "logger=none", "eval_episodes=0", "agent.batch_size=8",
                   "agent.learning_starts=4000", "agent.buffer_size=20000", "agent.train_interval=40"])
    res = run(cfg, tmp_path)
    assert res["env_steps"] >= 20000
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert losses and np.isfinite(losses).all()
    assert any(r.get("episode_return") for r in rows)  # Pong episodes (~800+ steps) ended and were logged
