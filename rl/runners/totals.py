"""The sums one log interval accumulates on the device, from which the host loop logs its means.

The host loop (rl/runners/loop.py) trains a log interval in several compiled calls (sub-chunks); each
runner's `advance` takes the interval's `Totals` so far (donated) and returns them with its own steps added,
inside jit and in step order, so the sums do not depend on where the calls split the interval. At the
interval's end the loop logs `summarise(totals)`; a checkpoint taken inside an interval (a signal) keeps
them (`to_json` / `from_json`).

* Per seed `[S]` (Sebulba: S = 1): episodes ended, the sum of their returns and lengths, train steps taken
  and, per train metric, the sum of its values over those train steps.
* Per seed, per train metric and `"params"` (rl/runners/guard.py): the first env step where it was
  non-finite, or `guard.NOT_SEEN`; the host takes the earliest over seeds (`summarise`). Per seed, so that a
  step's flags need no reduction over the seeds: with the seeds split over devices that was a cross-device
  all-reduce every iteration (the seeds' devices in lockstep).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rl.runners.guard import NOT_SEEN


@struct.dataclass
class Totals:
    """Packed in a few arrays, one add per kind of sum per step (on CPU each separate small sum would be a kernel
    of its own, a large share of a small agent's iteration); read through the named views below."""

    episode_sums: jax.Array  # [S, 3] f32: episodes ended, the sum of their returns, of their lengths
    updates: jax.Array  # [S] i32 train steps taken
    metric_sums: jax.Array  # [S, K] f32 per train metric (`metric_names`), the sum over the train steps
    first_bad: jax.Array  # [S, J] i32 per `bad_names` entry, first env step where non-finite, NOT_SEEN if none
    metric_names: tuple = struct.field(pytree_node=False, default=())
    bad_names: tuple = struct.field(pytree_node=False, default=())

    @classmethod
    def zeros(cls, num_seeds: int, metric_names, bad_names) -> Totals:
        """Fresh totals; every leaf its own buffer (runners donate them)."""
        metric_names, bad_names = tuple(metric_names), tuple(bad_names)
        return cls(episode_sums=jnp.zeros((num_seeds, 3), jnp.float32), updates=jnp.zeros((num_seeds,), jnp.int32),
                   metric_sums=jnp.zeros((num_seeds, len(metric_names)), jnp.float32),
                   first_bad=jnp.full((num_seeds, len(bad_names)), NOT_SEEN, jnp.int32), metric_names=metric_names,
                   bad_names=bad_names)

    # named views `[S]` / {name: [S]}
    episodes = property(lambda self: self.episode_sums[..., 0])
    score = property(lambda self: self.episode_sums[..., 1])
    length = property(lambda self: self.episode_sums[..., 2])
    metrics = property(lambda self: {k: self.metric_sums[..., i] for i, k in enumerate(self.metric_names)})
    nonfinite = property(lambda self: {k: self.first_bad[..., i] for i, k in enumerate(self.bad_names)})

    def add_episodes(self, count, score, length) -> Totals:
        """`count` episodes ended with returns summing to `score` and lengths to `length` (each `[S]` or
        broadcastable)."""
        shape = self.episode_sums.shape[:-1]
        new = jnp.stack([jnp.broadcast_to(jnp.asarray(x, jnp.float32), shape) for x in (count, score, length)], -1)
        return self.replace(episode_sums=self.episode_sums + new)

    def add_update(self, metrics: dict, bad: dict, taken, env_step) -> Totals:
        """One train step per seed if `taken` (bool, `[S]` or scalar), with its `metrics` (name -> `[S]`) and
        `bad` flags (name -> bool `[S]` or scalar) at `env_step`. Elementwise over the seeds (no reduction)."""
        taken = jnp.asarray(taken)
        S = self.updates.shape[0]
        per_seed = lambda x, dtype: jnp.broadcast_to(jnp.asarray(x, dtype), (S,))
        values = jnp.stack([per_seed(metrics[k], jnp.float32) for k in self.metric_names], -1) if \
            self.metric_names else jnp.zeros((S, 0), jnp.float32)
        taken_s = per_seed(taken, bool)[:, None]
        summed = self.metric_sums + jnp.where(taken_s, values, 0.0)
        flags = jnp.stack([per_seed(bad[k], bool) for k in self.bad_names], -1) if self.bad_names else \
            jnp.zeros((S, 0), bool)
        first = jnp.where((self.first_bad == NOT_SEEN) & taken_s & flags, jnp.int32(env_step), self.first_bad)
        return self.replace(updates=self.updates + taken.astype(jnp.int32), metric_sums=summed, first_bad=first)

    def flag(self, name: str, bad, env_step) -> Totals:
        """`name` (one of `bad_names`) non-finite at `env_step` in the seeds where `bad` (bool, `[S]` or scalar:
        all seeds) holds, unless seen there before."""
        i = self.bad_names.index(name)
        column = self.first_bad[:, i]
        first = jnp.where((column == NOT_SEEN) & jnp.asarray(bad), jnp.int32(env_step), column)
        return self.replace(first_bad=self.first_bad.at[:, i].set(first))


def to_json(t: Totals) -> dict:
    """Plain lists and numbers (exact for the float32 sums): a checkpoint taken inside a log interval keeps
    the interval's sums in its metadata, so the resumed run logs the interval as an unstopped run would."""
    t = jax.device_get(t)
    lists = lambda d: {k: np.asarray(v).tolist() for k, v in d.items()}
    return {"episodes": t.episodes.tolist(), "score": t.score.tolist(), "length": t.length.tolist(),
            "updates": t.updates.tolist(), "metrics": lists(t.metrics), "nonfinite": lists(t.nonfinite)}


def from_json(d: dict) -> Totals:
    """The `Totals` that `to_json` wrote (device arrays, dtypes as `Totals.zeros`)."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    names, bad_names = tuple(d["metrics"]), tuple(d["nonfinite"])
    num_seeds = len(d["episodes"])
    # per seed; a checkpoint written before the flags were per seed holds one step per name (all seeds)
    bad = [np.broadcast_to(np.asarray(d["nonfinite"][k], np.int32), (num_seeds,)) for k in bad_names]
    sums = jnp.stack([f32(d["metrics"][k]) for k in names], -1) if names else jnp.zeros((num_seeds, 0), jnp.float32)
    return Totals(episode_sums=jnp.stack([f32(d[k]) for k in ("episodes", "score", "length")], -1),
                  updates=jnp.asarray(d["updates"], jnp.int32), metric_sums=sums,
                  first_bad=jnp.asarray(np.stack(bad, -1) if bad else np.zeros((num_seeds, 0)), jnp.int32),
                  metric_names=names, bad_names=bad_names)


def summarise(t: Totals) -> dict:
    """The log values: per-seed means `[S]` (`episode_return`, `episode_length`, `train/<metric>`; NaN where
    nothing was counted), `episodes` `[S]`, and `nonfinite` {name: int} for `guard.check`."""
    t = jax.device_get(t)
    n, u = np.asarray(t.episodes, np.float64), np.asarray(t.updates, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {"episode_return": np.where(n > 0, t.score / n, np.nan),
               "episode_length": np.where(n > 0, t.length / n, np.nan),
               "episodes": n}
        for k, v in t.metrics.items():
            out[f"train/{k}"] = np.where(u > 0, np.asarray(v, np.float64) / u, np.nan)
    out["nonfinite"] = {k: _earliest(np.asarray(v)) for k, v in t.nonfinite.items()}
    return out


def _earliest(first: np.ndarray) -> int:
    """The earliest of the seeds' first non-finite env steps `[S]`, NOT_SEEN where none was."""
    seen = first[first != NOT_SEEN]
    return int(seen.min()) if seen.size else NOT_SEEN
