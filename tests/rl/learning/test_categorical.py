"""rl/learning/categorical.py: h(x) rescaling, two-hot projection, read-back and cross-entropy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.learning.categorical import CategoricalSupport


def h_numpy(x, eps=1e-3):
    return np.sign(x) * (np.sqrt(np.abs(x) + 1) - 1) + eps * x


def test_two_hot_round_trip_muesli_support():
    support = CategoricalSupport()  # 601 atoms over [-300, 300] in h-space
    x = np.concatenate([np.linspace(-5000.0, 5000.0, 101), [0.0, 1.0, -1.0, 0.3, 183.2, 1e4]])
    probs = np.asarray(jax.jit(support.scalar_to_probs)(jnp.asarray(x)))
    assert probs.shape == (x.size, 601)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert ((probs > 0).sum(-1) <= 2).all()  # at most two neighbouring atoms carry mass
    back = np.asarray(jax.jit(support.probs_to_scalar)(jnp.asarray(probs)))
    np.testing.assert_allclose(back, x, rtol=1e-3, atol=1e-3)


def test_two_hot_puts_mass_on_neighbouring_atoms_of_h():
    support = CategoricalSupport(num_atoms=41, min_value=-10.0, max_value=10.0)  # atoms 0.5 apart
    x = np.array([3.0, -7.5, 0.0])
    probs = np.asarray(jax.jit(support.scalar_to_probs)(jnp.asarray(x)))
    atoms = np.linspace(-10, 10, 41)
    hx = h_numpy(x)
    for i in range(x.size):
        lower = np.searchsorted(atoms, hx[i], side="right") - 1
        frac = (hx[i] - atoms[lower]) / 0.5
        expected = np.zeros(41)
        expected[lower] += 1 - frac
        if frac > 0:
            expected[lower + 1] += frac
        np.testing.assert_allclose(probs[i], expected, atol=1e-4)


def test_values_outside_the_support_are_clipped():
    support = CategoricalSupport(num_atoms=21, min_value=-5.0, max_value=5.0)
    big = 1e6
    back = float(jax.jit(lambda x: support.probs_to_scalar(support.scalar_to_probs(x)))(jnp.asarray(big)))
    h_max_inverse = float(jax.jit(lambda: support.probs_to_scalar(jnp.eye(21)[-1]))())
    assert back == pytest.approx(h_max_inverse, rel=1e-4)
    assert h_numpy(back) == pytest.approx(5.0, abs=1e-3)


def test_cross_entropy_is_minimised_by_the_two_hot_target():
    support = CategoricalSupport(num_atoms=51, min_value=-25.0, max_value=25.0)
    target = jnp.asarray([12.3, -0.7])

    @jax.jit
    def terms(target):
        probs = support.scalar_to_probs(target)
        good = jnp.log(probs + 1e-12)
        bad = jnp.zeros_like(good)
        ce_good, ce_bad = support.cross_entropy(good, target), support.cross_entropy(bad, target)
        entropy = -(probs * jnp.log(jnp.where(probs > 0, probs, 1.0))).sum(-1)
        return ce_good, ce_bad, entropy, support.logits_to_scalar(good)

    ce_good, ce_bad, entropy, read_back = terms(target)
    assert ce_good.shape == (2,)
    assert (ce_good < ce_bad).all()
    np.testing.assert_allclose(ce_good, entropy, atol=1e-4)
    np.testing.assert_allclose(read_back, target, rtol=1e-3)


def test_bad_support_is_rejected():
    with pytest.raises(ValueError, match="num_atoms"):
        CategoricalSupport(num_atoms=1)
    with pytest.raises(ValueError, match="max_value > min_value"):
        CategoricalSupport(min_value=3.0, max_value=3.0)
