"""rl/envs/gymnax_source.py: batched auto-reset, terminated vs truncated, final observations, episode stats."""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.config import ConfigError
from rl.envs.episodes import EpisodeStats
from rl.envs.gymnax_source import make_source


def _rollout(source, actions, key):
    """Step `source` with `actions [T, E]`; returns the list of Timesteps and the initial obs."""
    k0, key = jax.random.split(key)
    env_state, obs = source.reset(k0)
    out = []
    step = jax.jit(source.step)
    for a in actions:
        key, k = jax.random.split(key)
        env_state, ts = step(env_state, jnp.asarray(a, jnp.int32), k)
        out.append(jax.device_get(ts))
    return obs, out


def test_truncation_bootstraps_from_final_observation():
    """A time limit sets truncated (not terminated); next_obs is the pre-reset observation and obs the reset one."""
    source = make_source({"source": "gymnax", "id": "CartPole-v1", "params": {"max_steps_in_episode": 5}}, 3)
    actions = np.tile([0, 1], 10)[:, None].repeat(3, 1)  # alternate: the pole stays up for 5 steps
    obs0, steps = _rollout(source, actions, jax.random.PRNGKey(0))
    ts5 = steps[4]
    assert ts5.truncated.all() and not ts5.terminated.any()
    assert not any(s.truncated.any() or s.terminated.any() for s in steps[:4])
    # next_obs continues the trajectory (CartPole: x' = x + tau * x_dot), obs is a fresh reset.
    prev = steps[3].obs
    np.testing.assert_allclose(prev[:, 0] + 0.02 * prev[:, 1], ts5.next_obs[:, 0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(ts5.next_obs, ts5.obs)
    assert np.all(np.abs(ts5.obs) <= 0.05)  # CartPole resets uniformly in [-0.05, 0.05]
    # Without a reset, next_obs is the obs returned by the same step.
    for ts in steps[:4]:
        np.testing.assert_array_equal(ts.next_obs, ts.obs)
    np.testing.assert_allclose(obs0[:, 0] + 0.02 * obs0[:, 1], steps[0].next_obs[:, 0], rtol=1e-5, atol=1e-6)


def test_termination_is_not_truncation():
    """Pushing one way topples the pole: terminated, not truncated; rewards are 1 per step."""
    source = make_source({"source": "gymnax", "id": "CartPole-v1"}, 2)
    _, steps = _rollout(source, np.ones((60, 2), int), jax.random.PRNGKey(1))
    term = np.array([s.terminated for s in steps])
    trunc = np.array([s.truncated for s in steps])
    assert term.any(axis=0).all() and not trunc.any()
    first = term.argmax(0)
    for e in range(2):
        final = steps[first[e]].next_obs[e]
        assert abs(final[2]) > 0.2094 or abs(final[0]) > 2.4  # the terminal observation is out of bounds
        assert np.all(np.abs(steps[first[e]].obs[e]) <= 0.05)  # and obs is already the reset one
    np.testing.assert_array_equal(np.array([s.reward for s in steps]), 1.0)


def test_matches_unbatched_gymnax():
    """Env e of the batched source follows gymnax's own step with the same per-env keys."""
    source = make_source({"source": "gymnax", "id": "Acrobot-v1"}, 4)
    env, params = gymnax.make("Acrobot-v1")
    key = jax.random.PRNGKey(3)
    state, obs = source.reset(key)
    ref_obs, ref_state = env.reset(jax.random.split(key, 4)[2], params)
    np.testing.assert_allclose(obs[2], ref_obs)
    k = jax.random.PRNGKey(4)
    _, ts = source.step(state, jnp.array([0, 1, 2, 1]), k)
    o, _, r, term, trunc, info = env.step(jax.random.split(k, 4)[2], ref_state, 2, params)
    np.testing.assert_allclose(ts.obs[2], o)
    np.testing.assert_allclose(ts.next_obs[2], info["final_observation"])
    assert ts.reward[2] == r and ts.terminated[2] == term and ts.truncated[2] == trunc


def test_episode_stats_against_numpy():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(50, 3)).astype(np.float32)
    dones = rng.random((50, 3)) < 0.15
    stats = EpisodeStats.zeros(3)
    got = []
    for r, d in zip(rewards, dones):
        stats, fin = stats.update(jnp.asarray(r), jnp.asarray(d))
        # envs whose episode did not end report nothing: score 0, length 0
        assert not np.asarray(fin.score)[~d].any() and not np.asarray(fin.length)[~d].any()
        got += [(t, e, float(fin.score[e]), int(fin.length[e])) for e in range(3) for t in [len(got)]
                if d[e]]
    ret, length, expected = np.zeros(3), np.zeros(3, int), []
    for r, d in zip(rewards, dones):
        ret += r
        length += 1
        expected += [(e, ret[e], length[e]) for e in range(3) if d[e]]
        ret[d], length[d] = 0, 0
    assert [(e, round(v, 4), n) for _, e, v, n in got] == [(e, round(float(v), 4), int(n)) for e, v, n in expected]


def test_minatar_and_obs_features():
    s = make_source({"source": "gymnax", "id": "Breakout-MinAtar"}, 2)
    assert s.obs_shape == (10, 10, 4) and s.num_actions == 3
    s = make_source({"source": "gymnax", "id": "CartPole-v1", "obs_features": [0, 2]}, 2)
    _, obs = s.reset(jax.random.PRNGKey(0))
    assert s.obs_shape == (2,) and obs.shape == (2, 2)


@pytest.mark.parametrize("section, match", [
    ({"source": "gymnax", "id": "CartPole-v9"}, "not a gymnax environment"),
    ({"source": "gymnax", "id": "CartPole-v1", "params": {"gravityy": 1.0}}, "gravityy"),
    ({"source": "gymnax", "id": "CartPole-v1", "bogus": 1}, "bogus"),
    ({"source": "gymnax", "id": "Pendulum-v1"}, "discrete"),
])
def test_bad_env_config(section, match):
    with pytest.raises((ConfigError, ValueError), match=match):
        make_source(section, 2)


def test_max_episode_steps_is_the_time_limit_of_the_env_params():
    """`max_episode_steps` (the default step limit of rl/runners/evaluate.py) is the params' time limit."""
    assert make_source({"source": "gymnax", "id": "CartPole-v1"}, 2).max_episode_steps == 500
    limited = {"source": "gymnax", "id": "CartPole-v1", "params": {"max_steps_in_episode": 7}}
    assert make_source(limited, 2).max_episode_steps == 7


def test_matches_unbatched_gymnax_with_array_valued_env_state():
    """The batch axis of every env-state leaf is its first one, also for grids (Breakout-MinAtar's brick map
    `[E, 10, 10]`): env e follows gymnax's own step."""
    source = make_source({"source": "gymnax", "id": "Breakout-MinAtar"}, 3)
    env, params = gymnax.make("Breakout-MinAtar")
    key, k = jax.random.PRNGKey(5), jax.random.PRNGKey(6)
    state, _ = source.reset(key)
    _, ref_state = env.reset(jax.random.split(key, 3)[1], params)
    _, ts = source.step(state, jnp.array([0, 2, 1]), k)
    o, _, r, term, trunc, _ = env.step(jax.random.split(k, 3)[1], ref_state, 2, params)
    np.testing.assert_array_equal(ts.obs[1], o)
    assert ts.reward[1] == r and ts.terminated[1] == term and ts.truncated[1] == trunc


def test_gymnax_plotting_imports_load_on_first_use(monkeypatch):
    """gymnax imports seaborn and matplotlib.pyplot for its `render` helpers alone (~1.7 s of a process start):
    the setup step (`agents.setup.setup`, not the import of rl.envs) leaves stand-ins (`OnFirstUse`) that import a
    module when an attribute is first read and then read as it."""
    import subprocess
    import sys

    from rl.envs import OnFirstUse

    probe = ("import sys, matplotlib; from agents.setup import setup; setup(); "
             "import rl.envs.gymnax_source, gymnax.environments.misc.pong as pong; "
             "print(type(pong.sns).__name__, 'seaborn.palettes' in sys.modules, 'matplotlib.figure' in sys.modules, "
             "type(matplotlib.pyplot).__name__)")  # the package attribute too (`matplotlib.pyplot.plot(...)`)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["OnFirstUse", "False", "False", "OnFirstUse"], out.stdout + out.stderr[-2000:]
    monkeypatch.delitem(sys.modules, "wave", raising=False)  # a small stdlib module, as the stand-in's target
    monkeypatch.setitem(sys.modules, "wave", OnFirstUse("wave"))
    import wave

    assert isinstance(wave, OnFirstUse) and "open" not in vars(wave)
    opener = wave.open  # the first read imports the real module, which replaces the stand-in
    real = sys.modules["wave"]
    assert real is not wave and opener is real.open and wave.Error is real.Error
