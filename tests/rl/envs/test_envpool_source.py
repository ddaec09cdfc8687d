"""envpool source: recv -> per-env transitions, checked against a plain-Python reference built from the raw
recv/send log and against CartPole's own dynamics; episode statistics; Atari layout; the XLA handle."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.envs.envpool_source import EnvConfig, Recv, open_envpool
from rl.envs.envpool_tracking import init_tracker, track

MAX_STEPS = 40  # short CartPole episodes so that truncation happens often


def random_act(num_actions):
    def act(obs, carry, key):
        return jax.random.randint(key, obs.shape[:1], 0, num_actions), carry, {}
    return act


def make_step_fn(source):
    """Jitted bookkeeping with a random policy; carry and extras are empty."""

    @jax.jit
    def step(tracker, recv, key):
        obs = source.observation(recv.obs)
        act = lambda o, c: random_act(source.num_actions)(o, c, key)
        return track(tracker, recv, obs, act, ())

    return step


def run_host(source, num_recvs, seed=0):
    """Host loop; returns the raw log [(recv, actions)] and the per-recv outputs as NumPy."""
    step = make_step_fn(source)
    tracker = init_tracker(source.num_envs, source.obs_example(), (), {})
    key = jax.random.PRNGKey(seed)
    log, outs = [], []
    source.reset()
    for _ in range(num_recvs):
        recv = source.recv()
        key, k = jax.random.split(key)
        tracker, actions, transition, episodes = step(tracker, recv, k)
        actions = np.asarray(actions)
        source.send(actions, recv.env_id)
        log.append((recv, actions))
        outs.append(jax.tree_util.tree_map(np.asarray, (transition, episodes)))
    return log, outs


def reference(log, observation=lambda o: o):
    """Plain-Python per-env transitions from the raw log: {env: [(obs, action, reward, term, trunc, next_obs)]}
    plus the per-recv validity."""
    last, rows, valid = {}, {}, []
    for recv, actions in log:
        v = []
        for j, e in enumerate(recv.env_id):
            e = int(e)
            obs = observation(recv.obs[j])
            if e in last and not last[e][2]:
                prev_obs, prev_action, _ = last[e]
                rows.setdefault(e, []).append((prev_obs, prev_action, recv.reward[j], recv.terminated[j],
                                               recv.truncated[j], obs))
                v.append(True)
            else:
                v.append(False)
            last[e] = (obs, int(actions[j]), bool(recv.terminated[j] or recv.truncated[j]))
        valid.append(v)
    return rows, valid


def ours_per_env(log, outs):
    rows = {}
    for (recv, _), (tr, _) in zip(log, outs):
        for j, e in enumerate(recv.env_id):
            if tr.valid[j]:
                rows.setdefault(int(e), []).append((tr.obs[j], tr.action[j], tr.reward[j], tr.terminated[j],
                                                    tr.truncated[j], tr.next_obs[j]))
    return rows


def cartpole_next(obs, action):
    """CartPole-v1 dynamics (Euler, as in gym/envpool)."""
    x, x_dot, th, th_dot = [np.float64(v) for v in obs]
    force = 10.0 if action == 1 else -10.0
    cos, sin = np.cos(th), np.sin(th)
    temp = (force + 0.05 * th_dot**2 * sin) / 1.1
    th_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
    x_acc = temp - 0.05 * th_acc * cos / 1.1
    return np.array([x + 0.02 * x_dot, x_dot + 0.02 * x_acc, th + 0.02 * th_dot, th_dot + 0.02 * th_acc])


def check_cartpole_rows(rows, max_steps=MAX_STEPS):
    """Each env's transitions `[(obs, action, reward, terminated, truncated, next_obs)]` follow CartPole's
    dynamics and episode ends in time order (episodes cut at `max_steps`)."""
    for e, row in rows.items():
        length = 0
        for t, (obs, action, reward, term, trunc, next_obs) in enumerate(row):
            np.testing.assert_allclose(next_obs, cartpole_next(obs, action), atol=1e-4, err_msg=f"env {e} t {t}")
            assert reward == 1.0
            out = abs(next_obs[0]) > 2.4 or abs(next_obs[2]) > 12 * 2 * np.pi / 360
            length += 1
            # envpool reports a terminal state reached at the step limit as truncated only.
            assert bool(term) == (out and length < max_steps), f"env {e} t {t}: terminated={term} state {next_obs}"
            assert bool(trunc) == (length == max_steps), f"env {e} t {t}: truncated={trunc} at length {length}"
            if t + 1 < len(row):
                nxt = row[t + 1][0]
                if term or trunc:
                    assert np.all(np.abs(nxt) <= 0.05), f"env {e}: episode after a done does not start at reset"
                    length = 0
                else:
                    np.testing.assert_array_equal(nxt, next_obs)


@pytest.fixture(scope="module")
def cartpole_host_run():
    source = open_envpool("CartPole-v1", num_envs=16, batch_size=8, seed=3, max_episode_steps=MAX_STEPS)
    log, outs = run_host(source, 500)
    source.close()
    return log, outs


def test_transitions_match_reference_and_dynamics(cartpole_host_run):
    log, outs = cartpole_host_run
    ref_rows, ref_valid = reference(log)
    for (tr, _), v in zip(outs, ref_valid):
        np.testing.assert_array_equal(tr.valid, v)
    ours = ours_per_env(log, outs)
    assert sorted(ours) == list(range(16))
    for e in ref_rows:
        assert len(ours[e]) == len(ref_rows[e])
        for a, b in zip(ours[e], ref_rows[e]):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    check_cartpole_rows(ours)
    # Both kinds of episode end occurred, so the checks above covered them.
    dones = [(t[3], t[4]) for row in ours.values() for t in row]
    assert any(term for term, _ in dones) and any(trunc for _, trunc in dones)


def test_episode_statistics_per_env_do_not_carry_across_truncation(cartpole_host_run):
    log, outs = cartpole_host_run
    ref_rows, _ = reference(log)
    # Reference episode lengths per env, from the reference transitions.
    expected = {}
    for e, row in ref_rows.items():
        n = 0
        for (_, _, _, term, trunc, _) in row:
            n += 1
            if term or trunc:
                expected.setdefault(e, []).append(n)
                n = 0
    got = {}
    for (_, ep) in outs:
        for j in np.flatnonzero(ep.ended):
            got.setdefault(int(ep.env_id[j]), []).append((float(ep.score[j]), int(ep.length[j])))
    assert got.keys() == expected.keys()
    for e, lengths in expected.items():
        assert [n for _, n in got[e]] == lengths
        assert [s for s, _ in got[e]] == [float(n) for n in lengths]  # CartPole reward is 1 per step
        assert max(n for _, n in got[e]) <= MAX_STEPS


def test_atari_layout_life_loss_and_game_statistics():
    source = open_envpool("Breakout-v5", num_envs=4, batch_size=2, seed=1)
    assert source.obs_shape == (84, 84, 4) and source.obs_dtype == np.uint8 and source.atari
    log, outs = run_host(source, 1000)
    source.close()
    to_hwc = lambda o: np.transpose(o, (1, 2, 0))
    ref_rows, ref_valid = reference(log, to_hwc)
    ours = ours_per_env(log, outs)
    for e in ref_rows:
        for a, b in zip(ours[e], ref_rows[e]):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    # Statistics: raw score summed over a whole game (all lives), ended at game over only.
    raw_score, lives_lost, games = {}, {}, []
    for (recv, _), v, (_, ep) in zip(log, ref_valid, outs):
        for j, e in enumerate(recv.env_id):
            e = int(e)
            if v[j]:
                raw_score[e] = raw_score.get(e, 0.0) + float(recv.score[j])
                lives_lost[e] = lives_lost.get(e, 0) + int(recv.terminated[j])
                assert abs(recv.reward[j]) <= 1.0  # reward clipping
            if ep.ended[j]:
                games.append((float(ep.score[j]), raw_score.pop(e), lives_lost.pop(e)))
    assert len(games) >= 3
    for score, ref_score, lost in games:
        assert score == ref_score
        assert lost == 5  # Breakout: every life lost ends an agent episode, the game ends with the fifth


def test_xla_handle_inside_jit():
    source = open_envpool("CartPole-v1", num_envs=16, batch_size=8, seed=5, max_episode_steps=MAX_STEPS)
    handle, recv, send = source.xla()

    @functools.partial(jax.jit, static_argnums=3)
    def rollout(handle, tracker, key, n):
        def body(c, k):
            handle, tracker = c
            handle, r = recv(handle)
            act = lambda o, cr: random_act(2)(o, cr, k)
            tracker, actions, tr, _ = track(tracker, r, source.observation(r.obs), act, ())
            handle = send(handle, actions, r.env_id)
            return (handle, tracker), (r.env_id, tr)
        (handle, tracker), out = jax.lax.scan(body, (handle, tracker), jax.random.split(key, n))
        return handle, tracker, out

    source.reset()
    tracker = init_tracker(16, source.obs_example(), (), {})
    handle, tracker, (ids, tr) = rollout(handle, tracker, jax.random.PRNGKey(0), 300)
    ids, tr = jax.tree_util.tree_map(np.asarray, (ids, tr))
    source.close()
    rows, seen = {}, set()
    for t in range(ids.shape[0]):
        for j, e in enumerate(ids[t]):
            if int(e) not in seen:
                assert not tr.valid[t, j], "the first recv of an env (reset step) must not be a transition"
            seen.add(int(e))
            if tr.valid[t, j]:
                rows.setdefault(int(e), []).append(tuple(np.asarray(x)[t, j] for x in (
                    tr.obs, tr.action, tr.reward, tr.terminated, tr.truncated, tr.next_obs)))
    assert sorted(rows) == list(range(16))
    assert sum(len(r) for r in rows.values()) > 16 * 100
    check_cartpole_rows(rows)


def test_make_source_errors():
    with pytest.raises(ValueError, match="unknown envpool task id 'NoSuchEnv-v0'"):
        open_envpool("NoSuchEnv-v0", 4, 2)
    with pytest.raises(ValueError, match="batch_size <= num_envs"):
        open_envpool("CartPole-v1", 4, 8)
    with pytest.raises(ValueError, match="no option"):
        open_envpool("CartPole-v1", 4, 2, frame_skip=4)


@pytest.mark.parametrize("key", ["actor_devices", "learner_devices"])
def test_env_config_device_counts_are_positive_or_null(key):
    """`env.actor_devices` / `env.learner_devices`: null or N >= 1 (rl/envs/envpool_source.py's EnvConfig)."""
    assert getattr(EnvConfig(**{key: 1}), key) == 1 and getattr(EnvConfig(**{key: None}), key) is None
    with pytest.raises(ValueError, match=f"env.{key} must be >= 1 or null, got 0"):
        EnvConfig(**{key: 0})


def test_recv_fields_are_typed():
    source = open_envpool("CartPole-v1", num_envs=4, batch_size=2)
    source.reset()
    r = source.recv()
    source.close()
    assert isinstance(r, Recv)
    assert r.obs.shape == (2, 4) and r.env_id.dtype == np.int32 and r.terminated.dtype == bool
    assert jnp.asarray(r.reward).dtype == jnp.float32
