"""Episode statistics, one type for both env sources: the Anakin runner (gymnax, every env every step) and
the Sebulba actor (envpool, the envs of one recv).

`EpisodeStats` keeps the running return (score) and length of every env's current episode; `update` adds
one step for all envs or for `env_ids`, and returns the `Episodes` that ended at it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Episodes:
    """Episodes that ended at one step (leading dim E, or M envs of a recv): `ended` marks them, `score` /
    `length` are theirs (0 elsewhere), `env_id` says which env (None: env i is row i)."""

    ended: jax.Array  # bool (summed over steps/envs: the number of episodes)
    score: jax.Array  # float32
    length: jax.Array  # int32
    env_id: jax.Array | None = None

    @property
    def count(self) -> jax.Array:
        """`ended` as float32 (after summing: the number of episodes that ended)."""
        return self.ended.astype(jnp.float32)


@struct.dataclass
class EpisodeStats:
    """Running return and length `[E]` of every env's current episode."""

    episode_return: jax.Array  # float32
    episode_length: jax.Array  # int32

    @classmethod
    def zeros(cls, num_envs: int) -> EpisodeStats:
        return cls(jnp.zeros(num_envs, jnp.float32), jnp.zeros(num_envs, jnp.int32))

    def update(self, reward: jax.Array, ended: jax.Array, env_ids: jax.Array | None = None,
               counted: jax.Array | None = None) -> tuple[EpisodeStats, Episodes]:
        """Add one step of `reward` for every env (or for `env_ids`, each at most once); `ended` marks the
        episodes that end at it. `counted` (bool, default all): which entries are steps of an episode (a
        reset step is not): the others add nothing and end nothing. Returns the stats and the `Episodes`
        that ended; the stats of those envs restart at 0."""
        ret, length = (self.episode_return, self.episode_length) if env_ids is None else (
            self.episode_return[env_ids], self.episode_length[env_ids])
        if counted is not None:
            reward, ended = jnp.where(counted, reward, 0.0), counted & ended
        ret, length = ret + reward, length + (1 if counted is None else counted.astype(jnp.int32))
        episodes = Episodes(ended=ended, score=jnp.where(ended, ret, 0.0), length=jnp.where(ended, length, 0),
                            env_id=env_ids)
        ret, length = jnp.where(ended, 0.0, ret), jnp.where(ended, 0, length)
        if env_ids is not None:
            ret, length = self.episode_return.at[env_ids].set(ret), self.episode_length.at[env_ids].set(length)
        return EpisodeStats(ret, length), episodes
