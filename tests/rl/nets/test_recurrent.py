import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.learning.agent import reset_carry
from rl.nets.networks import NetworkConfig
from rl.nets.recurrent import (
    LSTMCarry,
    make_recurrent_q_network,
    reset_flags,
    unroll_with_burn_in,
    zero_carry,
)

T, B, OBS, A, H = 7, 3, 5, 4, 8


@pytest.fixture(scope="module")
def net_and_params():
    net = make_recurrent_q_network((OBS,), A, NetworkConfig(hidden_sizes=[16], dueling=True), H)
    obs = jax.random.normal(jax.random.PRNGKey(1), (T, B, OBS))
    params = net.init(jax.random.PRNGKey(0), zero_carry(B, net.hidden_size), obs, jnp.zeros((T, B), bool))
    # a non-zero starting state, as a stored actor state would be
    carry = LSTMCarry(*jax.random.normal(jax.random.PRNGKey(2), (2, B, H)))
    return net, params, obs, carry


def test_reset_flags_shift_done_by_one():
    done = np.array([[0, 1], [1, 0], [0, 0], [1, 1]], bool)
    expected = np.zeros_like(done)
    expected[1:] = done[:-1]
    np.testing.assert_array_equal(np.asarray(reset_flags(jnp.asarray(done))), expected)


def test_shapes_and_zero_carry(net_and_params):
    net, params, obs, carry = net_and_params
    out_carry, q = net.apply(params, carry, obs, jnp.zeros((T, B), bool))
    assert q.shape == (T, B, A)
    assert out_carry.c.shape == out_carry.h.shape == (B, H)
    z = zero_carry(B, H)
    assert isinstance(z, LSTMCarry) and not np.asarray(z.c).any() and not np.asarray(z.h).any()
    with pytest.raises(ValueError, match="time-major"):
        net.apply(params, carry, obs, jnp.zeros((T, B + 1), bool))


def test_unroll_in_chunks_equals_one_unroll(net_and_params):
    net, params, obs, carry = net_and_params
    no_reset = jnp.zeros((T, B), bool)
    _, q_full = net.apply(params, carry, obs, no_reset)
    mid, q_a = net.apply(params, carry, obs[:3], no_reset[:3])
    _, q_b = net.apply(params, mid, obs[3:], no_reset[3:])
    np.testing.assert_allclose(np.concatenate([q_a, q_b]), q_full, rtol=1e-5, atol=1e-6)
    # step by step, as an actor would (T=1 per call)
    c, qs = carry, []
    for t in range(T):
        c, q = net.apply(params, c, obs[t : t + 1], no_reset[t : t + 1])
        qs.append(q[0])
    np.testing.assert_allclose(np.stack(qs), q_full, rtol=1e-5, atol=1e-6)


def test_reset_flag_restarts_from_zero_state(net_and_params):
    net, params, obs, carry = net_and_params
    reset = np.zeros((T, B), bool)
    reset[4, 1] = True  # env 1 starts a new episode at step 4
    _, q = net.apply(params, carry, obs, jnp.asarray(reset))
    _, q_fresh = net.apply(params, zero_carry(B, H), obs[4:], jnp.zeros((T - 4, B), bool))
    np.testing.assert_allclose(q[4:, 1], q_fresh[:, 1], rtol=1e-5, atol=1e-6)
    _, q_noreset = net.apply(params, carry, obs, jnp.zeros((T, B), bool))
    np.testing.assert_allclose(q[:, [0, 2]], q_noreset[:, [0, 2]], rtol=1e-6)  # other envs untouched
    assert not np.allclose(q[4:, 1], q_noreset[4:, 1])
    # the runners' reset_carry applies to the LSTM carry along the env axis
    reset_c = reset_carry(carry, zero_carry(B, H), jnp.array([False, True, False]))
    assert not np.asarray(reset_c.h[1]).any() and np.array_equal(reset_c.h[0], carry.h[0])


@pytest.mark.parametrize("burn_in", [1, 3])
def test_burn_in_passes_no_gradient(net_and_params, burn_in):
    net, params, obs, carry = net_and_params
    reset = jnp.zeros((T, B), bool)

    def loss(p, o):
        _, q = unroll_with_burn_in(net.apply, p, carry, o, reset, burn_in)
        return jnp.sum(q**2)

    # the outputs equal the full unroll's last T - burn_in steps
    _, q_full = net.apply(params, carry, obs, reset)
    _, q_burn = unroll_with_burn_in(net.apply, params, carry, obs, reset, burn_in)
    np.testing.assert_allclose(q_burn, q_full[burn_in:], rtol=1e-5, atol=1e-6)

    g_params, g_obs = jax.grad(loss, argnums=(0, 1))(params, obs)
    assert not np.asarray(g_obs[:burn_in]).any()  # burn-in inputs get no gradient ...
    assert np.abs(np.asarray(g_obs[burn_in:])).sum() > 0  # ... the trained steps do
    # the burn-in still matters for the value: perturbing burn-in inputs changes the loss
    assert not np.isclose(loss(params, obs), loss(params, obs.at[:burn_in].add(1.0)))

    # param gradient equals that of an unroll from the burnt-in carry given as a constant
    burnt, _ = net.apply(params, carry, obs[:burn_in], reset[:burn_in])

    def loss_from_constant(p):
        _, q = net.apply(p, burnt, obs[burn_in:], reset[burn_in:])
        return jnp.sum(q**2)

    g_ref = jax.grad(loss_from_constant)(params)
    for a, b in zip(jax.tree.leaves(g_params), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # and differs from the gradient without stop_gradient (so the test can fail)
    g_through = jax.grad(lambda p: jnp.sum(net.apply(p, carry, obs, reset)[1][burn_in:] ** 2))(params)
    diffs = [np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(jax.tree.leaves(g_params),
                                                                         jax.tree.leaves(g_through))]
    assert max(diffs) > 1e-6


def test_burn_in_range_checked(net_and_params):
    net, params, obs, carry = net_and_params
    with pytest.raises(ValueError, match="burn_in must be in"):
        unroll_with_burn_in(net.apply, params, carry, obs, jnp.zeros((T, B), bool), T)


@pytest.mark.parametrize("size", [0, -1])
def test_lstm_size_must_be_positive(size):
    with pytest.raises(ValueError, match=f"lstm_size must be positive, got {size}"):
        make_recurrent_q_network((OBS,), A, NetworkConfig(hidden_sizes=[16]), size)


def test_an_lstm_of_one_unit_is_allowed():
    net = make_recurrent_q_network((OBS,), A, NetworkConfig(hidden_sizes=[16]), 1)
    assert net.hidden_size == 1
