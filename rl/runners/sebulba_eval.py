"""Greedy evaluation of a Sebulba run: whole episodes in a fresh sync envpool, acting with `explore=False`
(Atari: the game's raw score over all lives)."""

from __future__ import annotations

import jax
import numpy as np

from rl.envs.envpool_source import make_source
from rl.envs.envpool_tracking import track
from rl.runners.sebulba_actor import new_tracker


def evaluate(agent, agent_state, env_cfg, episodes: int, seed: int, key: jax.Array,
             max_recvs: int | None = None) -> np.ndarray:
    """Scores `[episodes]` of one whole episode per env of a fresh sync envpool, acting with
    `explore=False`."""
    source = make_source(env_cfg, episodes, seed=seed, batch_size=episodes)
    limit = max_recvs or 2 * int(source.env.spec.config.max_episode_steps) + 10
    tracker = new_tracker(agent, agent_state, source, explore=False)

    @jax.jit
    def step(tracker, recv, key):
        def act(o, c):
            return agent.act(agent_state, o, c, key, recv.env_id, explore=False)

        tracker, actions, _, ep = track(tracker, recv, source.observation(recv.obs), act,
                                        agent.initial_carry(episodes))
        return tracker, actions, ep

    scores = np.full(episodes, np.nan)
    source.reset()
    for i in range(limit):
        r = source.recv()
        tracker, actions, ep = step(tracker, r, jax.random.fold_in(key, i))
        source.send(np.asarray(actions), r.env_id)
        ep = jax.device_get(ep)
        for j in np.flatnonzero(ep.ended):
            e = int(ep.env_id[j])
            if np.isnan(scores[e]):
                scores[e] = ep.score[j]
        if not np.isnan(scores).any():
            break
    source.close()
    return scores
