import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.envs.wrappers import ObservationFeatureWrapper


@pytest.mark.parametrize("indices, match", [((), "empty"), ((0, 0), "duplicates"), ((5,), "out of range")])
def test_bad_feature_indices(indices, match):
    env, params = gymnax.make("CartPole-v1")
    with pytest.raises(ValueError, match=match):
        ObservationFeatureWrapper(env, indices, params)


def test_gymnax_wrapper_masks_reset_step_and_final_observation():
    env, params = gymnax.make("CartPole-v1")
    wrapped = ObservationFeatureWrapper(env, (0, 2), params)
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
    with pytest.raises(ValueError, match="out of range"):
        ObservationFeatureWrapper(env, (3,), params)
