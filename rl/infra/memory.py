"""Memory a run will hold, from shapes and dtypes alone, checked against what the process can use.

`estimate(runner, cfg)` sums the bytes of the runner's state (`jax.eval_shape` of its `init`: the replay
buffer, the agent's parameters and optimiser state, env state; exact, nothing is allocated) and adds the
largest single array once more when checkpoints are on (orbax writes a checkpoint one array at a time
through a host copy). `check(runner, cfg)` refuses a run whose estimate exceeds `LIMIT_FRACTION` of the
available memory with one line naming the estimate and the keys that shrink it; it returns the estimate.

Available memory: on CPU the host's (MemAvailable of /proc/meminfo, or physical pages where that file is
missing); on accelerators the sum of `bytes_limit` over the local devices. XLA's working memory during
a train step (a sampled batch and its activations) is not included: it is small beside a replay buffer,
and the margin below 100% is for it.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from rl.config import ConfigError, TrainConfig

LIMIT_FRACTION = 0.9  # refuse a run whose estimate exceeds this share of the available memory
GB = 1e9


@dataclasses.dataclass(frozen=True)
class Estimate:
    buffer: int  # bytes of the replay buffer
    agent: int  # parameters, optimiser state, target networks
    other: int  # env states, keys, counters
    save_copy: int  # the largest array, copied once while a checkpoint is written (0: checkpoints off)

    @property
    def total(self) -> int:
        return self.buffer + self.agent + self.other + self.save_copy

    def describe(self) -> str:
        parts = [f"replay buffer {self.buffer / GB:.2f} GB", f"agent {self.agent / GB:.2f} GB"]
        if self.save_copy:
            parts.append(f"{self.save_copy / GB:.2f} GB copied while checkpointing")
        return f"{self.total / GB:.2f} GB ({', '.join(parts)})"


def _nbytes(x) -> int:
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


def estimate(runner, cfg: TrainConfig) -> Estimate:
    """Bytes of `runner`'s state by part (leaves under a `buffer` / `agent` key), from its abstract init."""
    sizes = {"buffer": 0, "agent": 0, "other": 0}
    largest = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(runner.restore_target()):
        keys = {getattr(p, "key", getattr(p, "name", None)) for p in path}
        part = "buffer" if "buffer" in keys else "agent" if "agent" in keys else "other"
        sizes[part] += _nbytes(leaf)
        largest = max(largest, _nbytes(leaf))
    return Estimate(**sizes, save_copy=largest if cfg.checkpoint.enabled else 0)


def available() -> tuple[int, str]:
    """`(bytes, what)` the process can use: host RAM on CPU, device memory on accelerators."""
    devices = jax.local_devices()
    if devices[0].platform != "cpu":
        limit = sum(int((d.memory_stats() or {}).get("bytes_limit", 0)) for d in devices)
        if limit:
            return limit, f"memory of {len(devices)} {devices[0].device_kind} device(s)"
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024, "available host memory"
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host memory"


def check(runner, cfg: TrainConfig) -> Estimate:
    """The run's `Estimate`; a `ConfigError` (one line) if it does not fit the available memory."""
    est = estimate(runner, cfg)
    have, what = available()
    if est.total > LIMIT_FRACTION * have:
        seeds = cfg.seeds
        per_seed = f" or seeds (now {seeds}: one buffer each)" if seeds > 1 else ""
        raise ConfigError(
            f"this run needs about {est.describe()}, more than {LIMIT_FRACTION:.0%} of the {have / GB:.1f} GB of "
            f"{what}; lower agent.buffer_size (now {cfg.agent.buffer_size}){per_seed}")
    return est
