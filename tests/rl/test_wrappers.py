import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.wrappers import (
    ObservationFeatureWrapper,
    hide_cartpole_velocities,
    hide_cartpole_velocities_env,
    select_features,
)


def test_select_features_numpy_and_jax_match_reference():
    obs = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    expected = np.stack([obs[..., 3], obs[..., 1]], axis=-1)
    out_np = select_features(obs, (3, 1))
    assert isinstance(out_np, np.ndarray)
    np.testing.assert_array_equal(out_np, expected)
    out_jax = jax.jit(lambda o: select_features(o, (3, 1)))(jnp.asarray(obs))
    np.testing.assert_array_equal(np.asarray(out_jax), expected)


def test_hide_cartpole_velocities_keeps_positions():
    obs = np.array([[0.1, 1.0, 0.2, 2.0], [0.3, 3.0, 0.4, 4.0]], np.float32)
    np.testing.assert_array_equal(hide_cartpole_velocities(obs), obs[:, [0, 2]])
    with pytest.raises(ValueError, match=r"expected CartPole observations \[\.\.\., 4\]"):
        hide_cartpole_velocities(np.zeros((2, 3)))


@pytest.mark.parametrize("indices, match", [((), "empty"), ((0, 0), "duplicates"), ((5,), "out of range")])
def test_select_features_bad_indices(indices, match):
    with pytest.raises(ValueError, match=match):
        select_features(np.zeros((2, 4)), indices)


def test_gymnax_wrapper_masks_reset_step_and_final_observation():
    env, params = gymnax.make("CartPole-v1")
    wrapped = hide_cartpole_velocities_env(env, params)
    space = wrapped.observation_space(params)
    assert space.shape == (2,)
    np.testing.assert_allclose(np.asarray(space.low), np.asarray(env.observation_space(params).low)[[0, 2]])

    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    obs_full, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    obs, state_w = jax.vmap(wrapped.reset, in_axes=(0, None))(keys, params)
    np.testing.assert_array_equal(np.asarray(obs), np.asarray(obs_full)[:, [0, 2]])

    def rollout(e, state):
        def body(s, key):
            o, s, _r, term, _trunc, info = jax.vmap(e.step, in_axes=(0, 0, 0, None))(
                jax.random.split(key, 8), s, jnp.ones(8, jnp.int32), params
            )
            return s, (o, term, info["final_observation"])

        return jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(1), 40))[1]

    full, masked = rollout(env, state), rollout(wrapped, state_w)
    assert bool(full[1].any())  # pushing right for 40 steps ends some episodes: final obs is exercised
    np.testing.assert_array_equal(np.asarray(masked[0]), np.asarray(full[0])[..., [0, 2]])
    np.testing.assert_array_equal(np.asarray(masked[1]), np.asarray(full[1]))
    np.testing.assert_array_equal(np.asarray(masked[2]), np.asarray(full[2])[..., [0, 2]])


def test_gymnax_wrapper_rejects_bad_spaces():
    env, params = gymnax.make("MemoryChain-bsuite")
    with pytest.raises(ValueError, match=r"expected CartPole observations of shape \(4,\)"):
        hide_cartpole_velocities_env(env, params)
    with pytest.raises(ValueError, match="out of range"):
        ObservationFeatureWrapper(env, (3,), params)
