"""rl/envs/jax_envs.py: the contract every JAX-library adapter fills in, checked on a counter env whose every
step is known in NumPy: vmapped auto-reset from the step's key, termination and truncation apart, the
observation dtype kept, and the one-line refusals (missing library, unknown id, non-discrete actions)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces

from rl.config import ConfigError
from rl.envs.jax_envs import JaxEnvSource, SingleEnv, check_id, discrete_actions, require

LIMIT = 4  # the counter's time limit


def _counter() -> SingleEnv:
    """State t; obs [t, reset mark] uint8, the mark drawn from the reset key (100..199); action 2 ends the
    episode (terminated), the LIMIT-th step truncates it; reward = action."""

    def reset(key):
        mark = jax.random.randint(key, (), 100, 200).astype(jnp.uint8)
        return (jnp.zeros((), jnp.int32), mark), jnp.stack([jnp.zeros((), jnp.uint8), mark])

    def step(key, state, action):
        t, mark = state
        t = t + 1
        return (t, mark), jnp.stack([t.astype(jnp.uint8), mark]), action, action == 2, t >= LIMIT

    return SingleEnv(name="Counter", num_actions=3, reset=reset, step=step, max_episode_steps=LIMIT)


def _reset_mark(key):
    return int(jax.random.randint(key, (), 100, 200))


def test_auto_reset_keeps_the_final_observation_and_the_two_ends_apart():
    """NumPy reference of the counters: where an episode ends, `next_obs` is the observation the action led
    to, `obs` and the state a fresh reset drawn from that env's step key; terminated and truncated as the env
    said (both at once: terminated only); the observation stays uint8, the reward is float32."""
    num_envs = 3
    source = JaxEnvSource(_counter(), num_envs)
    assert (source.obs_shape, source.obs_dtype, source.num_actions, source.max_episode_steps) == (
        (2,), jnp.uint8, 3, LIMIT)
    state, obs = jax.jit(source.reset)(jax.random.PRNGKey(0))
    step = jax.jit(source.step)
    actions = np.array([[0, 1, 2], [0, 2, 0], [0, 0, 0], [2, 0, 1], [1, 1, 1]])
    t = np.zeros(num_envs, int)
    marks = np.asarray(obs[:, 1]).astype(int)
    for i, a in enumerate(actions):
        key = jax.random.PRNGKey(10 + i)
        state, ts = step(state, jnp.asarray(a), key)
        t = t + 1
        terminated, truncated = a == 2, (t >= LIMIT) & (a != 2)
        np.testing.assert_array_equal(ts.terminated, terminated)
        np.testing.assert_array_equal(ts.truncated, truncated)
        np.testing.assert_array_equal(ts.next_obs, np.stack([t, marks], 1))
        np.testing.assert_array_equal(ts.reward, a.astype(np.float32))
        done = terminated | truncated
        env_keys = jax.random.split(key, num_envs)
        for e in np.flatnonzero(done):  # the reset comes from the second half of env e's step key
            marks[e] = _reset_mark(jax.random.split(env_keys[e])[1])
        t = np.where(done, 0, t)
        np.testing.assert_array_equal(ts.obs, np.stack([t, marks], 1))
        np.testing.assert_array_equal(state[0], t)
        assert ts.obs.dtype == ts.next_obs.dtype == jnp.uint8 and ts.reward.dtype == jnp.float32
        assert ts.terminated.dtype == ts.truncated.dtype == jnp.bool_


def test_shared_resets_go_to_the_envs_that_end_in_env_order():
    """`resets=2` of 4 envs: NumPy reference of the counters, where the j-th env to end in a step (env order)
    starts from fresh reset `j mod 2`, drawn from `split(split(key)[1], 2)[j mod 2]`; the others go on. Three
    ends at once: the first and the third share a start."""
    source = JaxEnvSource(_counter(), 4, resets=2)
    state, obs = jax.jit(source.reset)(jax.random.PRNGKey(0))
    step = jax.jit(source.step)
    actions = np.array([[0, 2, 0, 2], [2, 2, 0, 2], [0, 0, 1, 0], [0, 0, 0, 0]])
    t, marks = np.zeros(4, int), np.asarray(obs[:, 1]).astype(int)
    for i, a in enumerate(actions):
        key = jax.random.PRNGKey(20 + i)
        state, ts = step(state, jnp.asarray(a), key)
        t = t + 1
        done = (a == 2) | (t >= LIMIT)
        np.testing.assert_array_equal(ts.next_obs, np.stack([t, marks], 1))
        fresh = [_reset_mark(k) for k in jax.random.split(jax.random.split(key)[1], 2)]
        for j, e in enumerate(np.flatnonzero(done)):
            marks[e] = fresh[j % 2]
        t = np.where(done, 0, t)
        np.testing.assert_array_equal(ts.obs, np.stack([t, marks], 1))
        np.testing.assert_array_equal(state[0], t)
        np.testing.assert_array_equal(state[1], marks)
    assert int(np.sum(actions[1] == 2)) == 3 and fresh[0] != fresh[1]  # the shared start was tested


def test_a_step_without_restart_draws_no_reset_and_equals_the_restarting_step_up_to_each_end():
    """`restart=False` (greedy evaluation's step): the traced step holds no reset; every env's Timestep equals
    the restarting step's up to and including its episode's end (same keys), and after it the env goes on
    from its last state (obs == next_obs, the counter keeps counting). Greedy evaluation traces the reset
    only for its first observations."""
    from rl.runners.evaluate import evaluate
    from scripts.benchmark import _Uniform

    traced = []
    counter = _counter()
    env = SingleEnv(name="Counter", num_actions=3, reset=lambda k: traced.append(1) or counter.reset(k),
                    step=counter.step, max_episode_steps=LIMIT)
    source, actions = JaxEnvSource(env, 3), jnp.asarray([[2, 0, 1], [0, 2, 1], [1, 1, 1]])
    state, _ = source.reset(jax.random.PRNGKey(0))
    traced.clear()
    jax.make_jaxpr(lambda s, a, k: source.step(s, a, k, restart=False))(state, actions[0], jax.random.PRNGKey(1))
    assert traced == []
    restarting = plain = state
    ended = np.zeros(3, bool)
    for i, a in enumerate(actions):
        key = jax.random.PRNGKey(10 + i)
        restarting, ts_r = source.step(restarting, a, key)
        plain, ts = source.step(plain, a, key, restart=False)
        live = ~ended
        for field in ("next_obs", "reward", "terminated", "truncated"):
            np.testing.assert_array_equal(np.asarray(getattr(ts, field))[live], np.asarray(getattr(ts_r, field))[live])
        np.testing.assert_array_equal(ts.obs, ts.next_obs)
        np.testing.assert_array_equal(plain[0], i + 1)
        ended |= np.asarray(ts_r.terminated | ts_r.truncated)
    assert ended[:2].all() and not ended[2]  # env 0 ended at step 1, env 1 at step 2, env 2 goes on
    traced.clear()
    jax.make_jaxpr(lambda k: evaluate(_Uniform(3), None, source, k))(jax.random.PRNGKey(2))
    assert traced == [1]


def test_resets_per_step_are_one_to_num_envs():
    assert JaxEnvSource(_counter(), 3, resets=3).resets is None  # one per env: the default path
    for bad in (0, 4):
        with pytest.raises(ValueError, match=rf"^Counter: fresh resets per step must be in 1..3 \(num_envs\), got {bad}$"):
            JaxEnvSource(_counter(), 3, resets=bad)


def test_reset_and_step_vmap_over_seeds_inside_jit():
    """As the Anakin runner uses a source: seeds vmapped over the batched reset and step, inside jit."""
    source = JaxEnvSource(_counter(), 2)
    keys = jax.random.split(jax.random.PRNGKey(1), 3)

    @jax.jit
    def rollout(keys):
        state, obs = jax.vmap(source.reset)(keys)
        state, ts = jax.vmap(source.step)(state, jnp.full((3, 2), 2), keys)
        return obs, ts

    obs, ts = rollout(keys)
    assert obs.shape == (3, 2, 2) and ts.terminated.shape == (3, 2) and bool(ts.terminated.all())
    np.testing.assert_array_equal(obs[1], source.reset(keys[1])[1])


def test_the_state_keeps_its_types_across_steps():
    """A library state with a weak-typed leaf (`jnp.asarray(1.0)`, as xminigrid's `discount`): reset and step
    return it strongly typed, the same avals both ways, so the runner's compiled chunk takes what it returns
    (and what a checkpoint restores) without compiling again."""
    counter = _counter()

    def reset(key):
        state, obs = counter.reset(key)
        return (state, jnp.asarray(1.0)), obs

    def step(key, state, action):
        inner, obs, reward, terminated, truncated = counter.step(key, state[0], action)
        discount = jax.lax.select(terminated, jnp.asarray(0.0), jnp.asarray(1.0))
        return (inner, discount), obs, reward, terminated, truncated

    source = JaxEnvSource(SingleEnv("Weak", 3, reset, step, LIMIT), 2)
    key = jax.random.PRNGKey(0)
    after_reset = jax.eval_shape(source.reset, key)[0]
    after_step = jax.eval_shape(source.step, after_reset, jnp.zeros(2, jnp.int32), key)[0]
    assert after_reset == after_step
    assert not any(x.weak_type for x in jax.tree_util.tree_leaves(after_step))


def test_discrete_action_spaces_only():
    class Discrete:  # navix's: shape (), values 0..maximum
        shape, maximum = (), 6

    assert discrete_actions("x", spaces.Discrete(5)) == 5
    assert discrete_actions("x", Discrete()) == 7
    with pytest.raises(ValueError, match=r"^Pendulum: only discrete action spaces are supported, got Box$"):
        discrete_actions("Pendulum", spaces.Box(-1.0, 1.0, (1,)))


def test_a_missing_library_names_its_extra_in_one_line():
    with pytest.raises(ConfigError) as err:
        require("no_such_env_library", "xminigrid")
    message = str(err.value)
    assert len(message.splitlines()) == 1 and message.endswith('pip install -e ".[xminigrid]"'), message
    assert message.startswith("env.source=xminigrid: the no_such_env_library library is not installed")


def test_an_unknown_id_is_refused_in_one_line():
    check_id("navix", "B", ["A", "B"])
    with pytest.raises(ValueError, match=r"^env.id='C' is not a navix task; known ids: A, B$"):
        check_id("navix", "C", ["A", "B"])
