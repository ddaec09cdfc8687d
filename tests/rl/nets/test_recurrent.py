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
    params = jax.jit(net.init)(jax.random.PRNGKey(0), zero_carry(B, net.hidden_size), obs, np.zeros((T, B), bool))
    # a non-zero starting state, as a stored actor state would be
    carry = LSTMCarry(*jax.random.normal(jax.random.PRNGKey(2), (2, B, H)))
    return net, params, obs, carry


@pytest.fixture(scope="module")
def apply(net_and_params):
    """`net.apply`, jitted once for all the tests here."""
    return jax.jit(net_and_params[0].apply)


def test_reset_flags_shift_done_by_one():
    done = np.array([[0, 1], [1, 0], [0, 0], [1, 1]], bool)
    expected = np.zeros_like(done)
    expected[1:] = done[:-1]
    np.testing.assert_array_equal(np.asarray(jax.jit(reset_flags)(done)), expected)


def test_shapes_and_zero_carry(net_and_params, apply):
    _, params, obs, carry = net_and_params
    out_carry, q = apply(params, carry, obs, np.zeros((T, B), bool))
    assert q.shape == (T, B, A)
    assert out_carry.c.shape == out_carry.h.shape == (B, H)
    z = zero_carry(B, H)
    assert isinstance(z, LSTMCarry) and not np.asarray(z.c).any() and not np.asarray(z.h).any()
    with pytest.raises(ValueError, match="time-major"):
        apply(params, carry, obs, np.zeros((T, B + 1), bool))


def test_unroll_in_chunks_equals_one_unroll(net_and_params, apply):
    _, params, obs, carry = net_and_params
    obs, no_reset = np.asarray(obs), np.zeros((T, B), bool)
    _, q_full = apply(params, carry, obs, no_reset)
    mid, q_a = apply(params, carry, obs[:3], no_reset[:3])
    _, q_b = apply(params, mid, obs[3:], no_reset[3:])
    np.testing.assert_allclose(np.concatenate([q_a, q_b]), q_full, rtol=1e-5, atol=1e-6)
    # step by step, as an actor would (T=1 per call)
    c, qs = carry, []
    for t in range(T):
        c, q = apply(params, c, obs[t : t + 1], no_reset[t : t + 1])
        qs.append(q[0])
    np.testing.assert_allclose(np.stack(qs), q_full, rtol=1e-5, atol=1e-6)


def test_reset_flag_restarts_from_zero_state(net_and_params, apply):
    _, params, obs, carry = net_and_params
    obs = np.asarray(obs)
    reset = np.zeros((T, B), bool)
    reset[4, 1] = True  # env 1 starts a new episode at step 4
    q = np.asarray(apply(params, carry, obs, reset)[1])
    q_fresh = np.asarray(apply(params, zero_carry(B, H), obs[4:], np.zeros((T - 4, B), bool))[1])
    np.testing.assert_allclose(q[4:, 1], q_fresh[:, 1], rtol=1e-5, atol=1e-6)
    q_noreset = np.asarray(apply(params, carry, obs, np.zeros((T, B), bool))[1])
    np.testing.assert_allclose(q[:, [0, 2]], q_noreset[:, [0, 2]], rtol=1e-6)  # other envs untouched
    assert not np.allclose(q[4:, 1], q_noreset[4:, 1])
    # the runners' reset_carry applies to the LSTM carry along the env axis
    reset_c = jax.jit(reset_carry)(carry, zero_carry(B, H), np.array([False, True, False]))
    h, carry_h = np.asarray(reset_c.h), np.asarray(carry.h)
    assert not h[1].any() and np.array_equal(h[0], carry_h[0])


@pytest.mark.parametrize("burn_in", [1, 3])
def test_burn_in_passes_no_gradient(net_and_params, apply, burn_in):
    net, params, obs, carry = net_and_params
    obs, reset = np.asarray(obs), np.zeros((T, B), bool)

    def loss(p, o):
        _, q = unroll_with_burn_in(net.apply, p, carry, o, reset, burn_in)
        return jnp.sum(q**2)

    # the outputs equal the full unroll's last T - burn_in steps
    _, q_full = apply(params, carry, obs, reset)
    _, q_burn = jax.jit(lambda p, o: unroll_with_burn_in(net.apply, p, carry, o, reset, burn_in))(params, obs)
    np.testing.assert_allclose(q_burn, np.asarray(q_full)[burn_in:], rtol=1e-5, atol=1e-6)

    g_params, g_obs = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, obs)
    g_obs = np.asarray(g_obs)
    assert not g_obs[:burn_in].any()  # burn-in inputs get no gradient ...
    assert np.abs(g_obs[burn_in:]).sum() > 0  # ... the trained steps do
    # the burn-in still matters for the value: perturbing burn-in inputs changes the loss
    perturbed = obs.copy()
    perturbed[:burn_in] += 1.0
    jit_loss = jax.jit(loss)
    assert not np.isclose(jit_loss(params, obs), jit_loss(params, perturbed))

    # param gradient equals that of an unroll from the burnt-in carry given as a constant
    burnt, _ = apply(params, carry, obs[:burn_in], reset[:burn_in])

    def loss_from_constant(p):
        _, q = net.apply(p, burnt, obs[burn_in:], reset[burn_in:])
        return jnp.sum(q**2)

    g_ref = jax.jit(jax.grad(loss_from_constant))(params)
    for a, b in zip(jax.tree.leaves(g_params), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # and differs from the gradient without stop_gradient (so the test can fail)
    g_through = jax.jit(jax.grad(lambda p: jnp.sum(net.apply(p, carry, obs, reset)[1][burn_in:] ** 2)))(params)
    diffs = [np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(jax.tree.leaves(g_params),
                                                                         jax.tree.leaves(g_through))]
    assert max(diffs) > 1e-6


def test_burn_in_range_checked(net_and_params):
    net, params, obs, carry = net_and_params
    with pytest.raises(ValueError, match="burn_in must be in"):
        unroll_with_burn_in(net.apply, params, carry, obs, np.zeros((T, B), bool), T)


@pytest.mark.parametrize("size", [0, -1])
def test_lstm_size_must_be_positive(size):
    with pytest.raises(ValueError, match=f"lstm_size must be positive, got {size}"):
        make_recurrent_q_network((OBS,), A, NetworkConfig(hidden_sizes=[16]), size)


def test_an_lstm_of_one_unit_is_allowed():
    net = make_recurrent_q_network((OBS,), A, NetworkConfig(hidden_sizes=[16]), 1)
    assert net.hidden_size == 1
