"""rl/learning/retrace.py against a plain Python loop over the Retrace sum, with episode ends inside sequences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.learning.retrace import RetraceTargets, retrace_coefficients, retrace_targets

targets_jit = jax.jit(retrace_targets, static_argnames="discount")  # one compile per shape and discount


def retrace_loop(q, v, r, term, trunc, valid, c, gamma):
    """Q^ret(s_t, a_t) = q_t + sum_{s>=t} (prod_{i=t}^{s-1} gamma_i c_{i+1}) (r_s + gamma_s v_{s+1} - q_s),
    summed until the episode or the data ends; returns (G, V, has_target) as NumPy arrays."""
    T = len(q)

    def has_target(t):
        if not valid[t] or trunc[t]:
            return False
        return bool(term[t]) or (t + 1 < T and bool(valid[t + 1]))

    G, V = np.zeros(T), np.zeros(T)
    mask = np.array([has_target(t) for t in range(T)])
    for t in range(T):
        if not mask[t]:
            continue
        total, weight, s = q[t], 1.0, t
        while True:
            if term[s]:
                total += weight * (r[s] - q[s])
                break
            total += weight * (r[s] + gamma * v[s + 1] - q[s])
            if not mask[s + 1]:  # the next step has no target of its own: the trace stops at its v
                break
            weight *= gamma * c[s + 1]
            s += 1
        G[t] = total
        V[t] = v[t] + c[t] * (G[t] - q[t])
    return G, V, mask


def random_sequence(rng, T):
    q, v, r = rng.normal(size=T), rng.normal(size=T), rng.normal(size=T)
    term = rng.random(T) < 0.12
    trunc = (rng.random(T) < 0.08) & ~term
    valid = np.arange(T) < rng.integers(T // 2, T + 1)
    pi, mu = rng.uniform(0.05, 1.0, T), rng.uniform(0.05, 1.0, T)
    c = 0.95 * np.minimum(1.0, pi / mu)  # written out here, not taken from the function under test
    return q, v, r, term, trunc, valid, c


@pytest.mark.parametrize("lambda_", [1.0, 0.95, 0.0])
def test_retrace_coefficients_are_lambda_min_one_pi_over_mu(lambda_):
    """c = lambda * min(1, pi(a|s) / mu(a|s)) in probability space, against the log-space implementation;
    both sides of the truncation are exercised (pi < mu and pi > mu)."""
    rng = np.random.default_rng(3)
    pi, mu = rng.uniform(0.02, 1.0, 50), rng.uniform(0.02, 1.0, 50)
    assert (pi < mu).sum() > 10 and (pi > mu).sum() > 10
    got = np.asarray(retrace_coefficients(jnp.log(pi), jnp.log(mu), lambda_))
    np.testing.assert_allclose(got, lambda_ * np.minimum(1.0, pi / mu), rtol=1e-5, atol=1e-7)
    # Hand-checked values: pi = 0.2, mu = 0.8 -> 0.25 lambda; pi = 0.8, mu = 0.2 -> lambda (truncated at 1).
    hand = retrace_coefficients(jnp.log(jnp.array([0.2, 0.8, 0.5])), jnp.log(jnp.array([0.8, 0.2, 0.5])), lambda_)
    np.testing.assert_allclose(np.asarray(hand), lambda_ * np.array([0.25, 1.0, 1.0]), rtol=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_retrace_matches_python_loop(seed):
    rng = np.random.default_rng(seed)
    T, gamma = 23, 0.97
    seq = random_sequence(rng, T)
    out = targets_jit(*(jnp.asarray(x) for x in seq), discount=gamma)
    G, V, mask = retrace_loop(*seq, gamma)
    np.testing.assert_array_equal(np.asarray(out.mask), mask)
    assert mask.any()
    np.testing.assert_allclose(np.asarray(out.q)[mask], G[mask], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(out.v)[mask], V[mask], rtol=1e-4, atol=1e-4)


def test_retrace_vmaps_over_a_batch():
    rng = np.random.default_rng(7)
    seqs = [random_sequence(rng, 11) for _ in range(5)]
    batch = [jnp.asarray(np.stack(x)) for x in zip(*seqs)]
    out = jax.jit(jax.vmap(lambda *a: retrace_targets(*a, discount=0.9)))(*batch)
    assert isinstance(out, RetraceTargets) and out.q.shape == (5, 11)
    for i, seq in enumerate(seqs):
        G, _, mask = retrace_loop(*seq, 0.9)
        np.testing.assert_allclose(np.asarray(out.q[i])[mask], G[mask], rtol=1e-4, atol=1e-4)


def test_episode_ends_and_lambda_zero_give_one_step_targets():
    # lambda = 0: every target is the one-step r_t + gamma v_{t+1}; terminal: r_t; truncated/last: masked.
    q = jnp.zeros(5)
    v = jnp.array([1.0, 2.0, 3.0, 4.0, 5.0])
    r = jnp.array([0.5, 0.5, 0.5, 0.5, 0.5])
    term = jnp.array([False, True, False, False, False])
    trunc = jnp.array([False, False, False, True, False])
    valid = jnp.ones(5, bool)
    out = targets_jit(q, v, r, term, trunc, valid, jnp.zeros(5), discount=0.5)
    np.testing.assert_array_equal(out.mask, [True, True, True, False, False])
    np.testing.assert_allclose(out.q[:3], [0.5 + 0.5 * 2.0, 0.5, 0.5 + 0.5 * 4.0])


def test_on_policy_full_trace_is_the_discounted_return_within_an_episode():
    # c = 1 and q = v: Retrace telescopes to the n-step return bootstrapped at the last valid state.
    T, gamma = 6, 0.9
    v = jnp.arange(T, dtype=jnp.float32)
    r = jnp.ones(T)
    none = jnp.zeros(T, bool)
    out = targets_jit(v, v, r, none, none, jnp.ones(T, bool), jnp.ones(T), discount=gamma)
    expected0 = sum(gamma**k for k in range(T - 1)) + gamma ** (T - 1) * float(v[-1])
    assert float(out.q[0]) == pytest.approx(expected0, rel=1e-5)
    assert float(out.v[0]) == pytest.approx(expected0, rel=1e-5)


def test_bad_shapes_are_rejected():
    x = jnp.zeros(4)
    b = jnp.zeros(4, bool)
    with pytest.raises(ValueError, match="rank 1"):
        retrace_targets(jnp.zeros((2, 4)), x, x, b, b, b, x, discount=0.9)
    with pytest.raises(ValueError, match="share one shape"):
        retrace_targets(jnp.zeros(3), x, x, b, b, b, x, discount=0.9)
