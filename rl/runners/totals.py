"""The sums one log interval accumulates on the device, from which the host loop logs its means.

The host loop (rl/runners/loop.py) trains a log interval in several compiled calls (sub-chunks); each
runner's `advance` takes the interval's `Totals` so far (donated) and returns them with its own steps added,
inside jit and in step order, so the sums do not depend on where the calls split the interval. At the
interval's end the loop logs `summarise(totals)`; a checkpoint taken inside an interval (a signal) keeps
them (`to_json` / `from_json`).

* Per seed `[S]` (Sebulba: S = 1): episodes ended, the sum of their returns and lengths, train steps taken
  and, per train metric, the sum of its values over those train steps.
* Per train metric and `"params"` (rl/runners/guard.py): the first env step where it was non-finite in any
  seed, or `guard.NOT_SEEN`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rl.runners.guard import NOT_SEEN


@struct.dataclass
class Totals:
    episodes: jax.Array  # [S] f32 episodes ended
    score: jax.Array  # [S] f32 sum of their returns
    length: jax.Array  # [S] f32 sum of their lengths
    updates: jax.Array  # [S] i32 train steps taken
    metrics: dict  # name -> [S] f32 sum over the train steps
    nonfinite: dict  # name -> i32 scalar, first env step where non-finite, NOT_SEEN if none

    @classmethod
    def zeros(cls, num_seeds: int, metric_names, bad_names) -> Totals:
        """Fresh totals; every leaf its own buffer (runners donate them)."""
        def zf():
            return jnp.zeros((num_seeds,), jnp.float32)

        return cls(episodes=zf(), score=zf(), length=zf(), updates=jnp.zeros((num_seeds,), jnp.int32),
                   metrics={k: zf() for k in metric_names},
                   nonfinite={k: jnp.full((), NOT_SEEN, jnp.int32) for k in bad_names})

    def add_episodes(self, count, score, length) -> Totals:
        """`count` episodes ended with returns summing to `score` and lengths to `length` (each `[S]` or
        broadcastable)."""
        return self.replace(episodes=self.episodes + count, score=self.score + score, length=self.length + length)

    def add_update(self, metrics: dict, bad: dict, taken, env_step) -> Totals:
        """One train step per seed if `taken` (bool, `[S]` or scalar), with its `metrics` (name -> `[S]`) and
        `bad` flags (name -> bool `[S]` or scalar) at `env_step`."""
        taken = jnp.asarray(taken)
        summed = {k: v + jnp.where(taken, jnp.asarray(metrics[k], jnp.float32), 0.0) for k, v in self.metrics.items()}
        first = {k: jnp.where((v == NOT_SEEN) & taken.any() & jnp.any(bad[k]), jnp.int32(env_step), v)
                 for k, v in self.nonfinite.items()}
        return self.replace(updates=self.updates + taken.astype(jnp.int32), metrics=summed, nonfinite=first)


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
    return Totals(episodes=f32(d["episodes"]), score=f32(d["score"]), length=f32(d["length"]),
                  updates=jnp.asarray(d["updates"], jnp.int32), metrics={k: f32(v) for k, v in d["metrics"].items()},
                  nonfinite={k: jnp.asarray(v, jnp.int32) for k, v in d["nonfinite"].items()})


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
    out["nonfinite"] = {k: int(v) for k, v in t.nonfinite.items()}
    return out
