"""rl/envs/episodes.py against a plain NumPy model: running returns and lengths per env, updated for all envs
or for shuffled, partial `env_ids` (as envpool's async recv returns them), with reset steps not counted."""

from __future__ import annotations

import jax
import numpy as np

from rl.envs.episodes import EpisodeStats


def test_episode_stats_follow_env_ids_like_numpy():
    rng = np.random.default_rng(0)
    E = 6
    stats, ret, length = EpisodeStats.zeros(E), np.zeros(E, np.float32), np.zeros(E, np.int64)
    update = jax.jit(EpisodeStats.update)
    for t in range(60):
        ids = rng.permutation(E)[: rng.integers(1, E + 1)] if t % 3 else None  # every third step: all envs
        n = E if ids is None else len(ids)
        reward = rng.normal(size=n).astype(np.float32)
        ended, counted = rng.random(n) < 0.2, rng.random(n) < 0.9
        stats, episodes = update(stats, reward, ended, ids, counted)
        rows = np.arange(E) if ids is None else ids
        ret[rows] += np.where(counted, reward, 0)
        length[rows] += counted
        done = ended & counted
        np.testing.assert_array_equal(np.asarray(episodes.ended), done)
        np.testing.assert_allclose(np.asarray(episodes.score), np.where(done, ret[rows], 0), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(episodes.length), np.where(done, length[rows], 0))
        ret[rows[done]], length[rows[done]] = 0, 0
        np.testing.assert_allclose(np.asarray(stats.episode_return), ret, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(stats.episode_length), length)
