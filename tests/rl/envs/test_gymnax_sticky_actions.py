"""`env.sticky_actions=p` on the gymnax source (MinAtar's own protocol): gymnax's `StickyActionWrapper` executes
the previous executed action instead of the chosen one with probability p, drawn from each step's key."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.config import ConfigError
from rl.envs import env_config
from rl.envs.gymnax_source import make_source
from tests.rl.envs.jax_env_runs import rollout

COVERS = {  # read with ast by tests/test_option_coverage.py: literals only
    "env.gymnax.sticky_actions": ["test_executed_actions_follow_the_sticky_draws",
                                  "test_always_sticky_executes_the_first_action_only",
                                  "test_a_probability_outside_0_1_is_refused"],
}


def test_executed_actions_follow_the_sticky_draws():
    """Breakout-MinAtar, p = 0.25, 8 envs x 60 steps of random chosen actions: the action each env executed
    (the wrapper's state) is NumPy's `where(replay, previous executed, chosen)` with `replay` the wrapper's
    Bernoulli draw from the first half of each env's step key; about a quarter of the steps replay."""
    p, num_envs, steps = 0.25, 8, 60
    source = make_source({"source": "gymnax", "id": "Breakout-MinAtar", "sticky_actions": p}, num_envs)
    chosen = np.asarray(jax.random.randint(jax.random.PRNGKey(7), (steps, num_envs), 0, source.num_actions))
    state, _ = source.reset(jax.random.PRNGKey(0))
    step = jax.jit(source.step)
    previous, replays = np.zeros(num_envs, int), []
    for t in range(steps):
        key = jax.random.PRNGKey(100 + t)
        state, _ = step(state, jnp.asarray(chosen[t]), key)
        draw_keys = [jax.random.split(k)[0] for k in jax.random.split(key, num_envs)]
        replay = np.array([bool(jax.random.bernoulli(k, p)) for k in draw_keys])
        previous = np.where(replay, previous, chosen[t])
        np.testing.assert_array_equal(state.last_action, previous)
        replays.append(replay)
    assert 0.15 < np.mean(replays) < 0.35, np.mean(replays)


def test_always_sticky_executes_the_first_action_only():
    """p = 1 repeats the first executed action (0: push left) whatever is chosen: chosen pushes right give the
    observations of a plain CartPole pushed left (5 steps, before the pole falls); p = 0 does what is chosen."""
    pushes = np.ones((5, 2))
    sticky = rollout(make_source({"source": "gymnax", "id": "CartPole-v1", "sticky_actions": 1.0}, 2), pushes,
                     jax.random.PRNGKey(0))
    left = rollout(make_source({"source": "gymnax", "id": "CartPole-v1"}, 2), 0 * pushes, jax.random.PRNGKey(0))
    right = rollout(make_source({"source": "gymnax", "id": "CartPole-v1"}, 2), pushes, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(sticky[0], left[0])
    for s, lt, rt in zip(sticky[1], left[1], right[1]):
        np.testing.assert_allclose(s.next_obs, lt.next_obs, rtol=1e-6)
        assert not np.allclose(s.next_obs, rt.next_obs)
    assert not any(s.terminated.any() for s in left[1])


def test_a_probability_outside_0_1_is_refused():
    assert env_config({"source": "gymnax", "id": "Breakout-MinAtar", "sticky_actions": 0.1}).sticky_actions == 0.1
    with pytest.raises(ConfigError, match=r"env.sticky_actions must be a probability in \[0, 1\], got 1.5"):
        env_config({"source": "gymnax", "sticky_actions": 1.5})
