"""Muesli's diagnostics (agents/muesli/targets.py `diagnostics`): whether CMPO moves the policy and whether the
model's look-ahead tells the actions apart, each checked against NumPy, and logged by the agent's update."""

import jax
import jax.numpy as jnp
import numpy as np

from agents.muesli.targets import diagnostics, masked_correlation
from tests.agents.test_muesli import reference_problem  # noqa: F401  (the fixture)

DIAGNOSTICS = ("kl_cmpo_prior", "model_adv_spread", "model_adv_corr", "reward_spread")


def diagnostics_numpy(prior, cmpo, norm_adv, model_reward, model_adv_taken, retrace_adv, retrace_mask, reward,
                      valid):
    """The same four means, written out in NumPy from probabilities (float64)."""
    kl = (cmpo * (np.log(cmpo) - np.log(prior))).sum(-1)[valid].mean()
    spread = (norm_adv.max(-1) - norm_adv.min(-1))[valid].mean()
    corr = np.corrcoef(model_adv_taken[retrace_mask], retrace_adv[retrace_mask])[0, 1]
    paid = valid & (reward != 0)
    reward_spread = (model_reward.max(-1) - model_reward.min(-1))[paid].mean() if paid.any() else 0.0
    return {"kl_cmpo_prior": kl, "model_adv_spread": spread, "model_adv_corr": corr, "reward_spread": reward_spread}


def test_diagnostics_match_numpy():
    rng = np.random.default_rng(0)
    B, L, A = 4, 7, 5
    prior = rng.dirichlet(np.ones(A), size=(B, L))
    cmpo = rng.dirichlet(np.ones(A), size=(B, L))
    norm_adv, model_reward = rng.normal(size=(B, L, A)), rng.normal(size=(B, L, A))
    x = rng.normal(size=(B, L))
    y = 0.6 * x + rng.normal(size=(B, L))
    valid = rng.random((B, L)) < 0.8
    mask = valid & (rng.random((B, L)) < 0.8)
    reward = np.where(rng.random((B, L)) < 0.4, rng.normal(size=(B, L)), 0.0)
    args = (prior, cmpo, norm_adv, model_reward, x, y, mask, reward, valid)
    got = jax.jit(diagnostics)(jnp.log(prior), jnp.log(cmpo), *map(jnp.asarray, args[2:]))
    ref = diagnostics_numpy(*args)
    for name in DIAGNOSTICS:
        np.testing.assert_allclose(float(got[name]), ref[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert 0.2 < ref["model_adv_corr"] < 0.95  # guard: a correlation that is neither 0 nor 1
    # Masked-out entries do not count: scrambling them leaves every figure unchanged.
    scrambled = jax.jit(diagnostics)(jnp.log(prior), jnp.log(cmpo), jnp.where(valid[..., None], norm_adv, 99.0),
                                     jnp.where((valid & (reward != 0))[..., None], model_reward, -99.0),
                                     jnp.where(mask, x, 50.0), jnp.where(mask, y, -50.0), mask, reward, valid)
    for name in ("model_adv_spread", "model_adv_corr", "reward_spread"):
        np.testing.assert_allclose(float(scrambled[name]), float(got[name]), rtol=1e-5, err_msg=name)


def test_correlation_of_constant_values_is_zero_and_no_rewarding_step_gives_zero_spread():
    x = jnp.ones((2, 3))
    assert float(masked_correlation(x, jnp.arange(6.0).reshape(2, 3), jnp.ones((2, 3), bool))) == 0.0
    out = diagnostics(jnp.zeros((2, 3, 2)), jnp.zeros((2, 3, 2)), jnp.ones((2, 3, 2)), jnp.ones((2, 3, 2)),
                      x, x, jnp.ones((2, 3), bool), jnp.zeros((2, 3)), jnp.ones((2, 3), bool))
    assert float(out["reward_spread"]) == 0.0 and np.isfinite([float(v) for v in out.values()]).all()


def test_update_logs_the_diagnostics_of_its_targets(reference_problem):  # noqa: F811
    """The agent's targets log the four figures of its own target network (NumPy reference targets of
    tests/agents/test_muesli.py: look-ahead q and rewards, prior, CMPO, Retrace), and `update` passes them on."""
    agent, state, batch, valid, (_, _, metrics), ref = reference_problem
    adv = (ref["q"] - ref["v"][..., None]) / ref["scale"]
    expected = diagnostics_numpy(ref["prior"], ref["cmpo"], adv, ref["r"], ref["q_taken"] - ref["v"],
                                 ref["G"] - ref["v"], ref["mask"], batch["reward"], valid)
    for name in DIAGNOSTICS:
        np.testing.assert_allclose(float(metrics[name]), expected[name], rtol=2e-4, atol=1e-6, err_msg=name)
        assert abs(expected[name]) > 1e-3, name  # guard: every figure is away from 0 here
    _, update_metrics = jax.jit(agent.update)(state, jax.tree.map(jnp.asarray, batch), jnp.asarray(valid))
    for name in DIAGNOSTICS:
        np.testing.assert_allclose(float(update_metrics[name]), float(metrics[name]), rtol=1e-4, err_msg=name)
