"""Multi-host start (`jax.distributed.initialize` from the `distributed` config section) and the config
dataclasses of the `distributed` and `mesh` sections (typed in rl/config.py:TrainConfig; this module
imports JAX only when it starts the runtime, so composing configs stays light).

One process runs per host (or per GPU, with `local_device_ids`); every process runs the same command.
After `initialize`, `jax.devices()` lists the devices of all processes and the mesh of `rl/infra/sharding.py`
spans them, so the Anakin runner shards seeds/envs/buffer/batch over every host with no other change.

Config (`configs/distributed/*.yaml`, all keys optional):

    enabled: false               # true: call jax.distributed.initialize before any JAX op
    coordinator_address: null    # "host:port" of process 0; env JAX_COORDINATOR_ADDRESS also works
    num_processes: null          # total processes
    process_id: null             # this process, 0 .. num_processes-1
    local_device_ids: null       # devices this process uses, e.g. [0] for one process per GPU
    cluster_detection_method: null  # e.g. "slurm", "mpi4py"; null: JAX auto-detects SLURM, Open MPI,
                                    # Kubernetes and Cloud TPU when the three keys above are null
    initialization_timeout: 300  # seconds to wait for all processes

`configs/distributed/env.yaml` fills the keys from the environment variables `JAX_COORDINATOR_ADDRESS`,
`JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` (set them per process; see README "Multiple devices and hosts").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


@dataclasses.dataclass
class MeshConfig:
    """`mesh` section: which devices the Anakin runner uses (rl/infra/sharding.py).

    devices: devices used in all (over all hosts); null = every device (`jax.device_count()`).
    seed_devices: how many of them split the vmapped seeds; the rest (`devices / seed_devices`) split
        envs, buffer and batch of each seed.
    """

    devices: int | None = None
    seed_devices: int = 1


@dataclasses.dataclass
class DistributedConfig:
    """`distributed` section (see the module docstring)."""

    enabled: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: list[int] | None = None
    cluster_detection_method: str | None = None
    initialization_timeout: int = 300


def initialize(section: Mapping | DistributedConfig | None) -> bool:
    """Start the multi-process runtime when `section.enabled`; returns whether it was started.

    Must run before any JAX computation. Idempotent: a second call (e.g. a resumed run in the same
    process) does nothing."""
    import jax

    cfg = _as_config(section)
    if not cfg.enabled:
        return False
    if jax.distributed.is_initialized():
        return True
    given = (cfg.coordinator_address, cfg.num_processes, cfg.process_id)
    if any(v is not None for v in given[1:]) and not all(v is not None for v in given[1:]):
        raise ValueError("distributed.num_processes and distributed.process_id must be set together "
                         f"(got num_processes={cfg.num_processes}, process_id={cfg.process_id})")
    if cfg.num_processes is not None and not 0 <= cfg.process_id < cfg.num_processes:
        raise ValueError(f"distributed.process_id={cfg.process_id} must be in [0, num_processes="
                         f"{cfg.num_processes})")
    kwargs = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "enabled" and v is not None}
    jax.distributed.initialize(**kwargs)
    return True


def is_main_process() -> bool:
    """True on the process that writes metrics.csv, summary.json, wandb and the figure (process 0)."""
    import jax

    return jax.process_index() == 0


# --- what every process must agree on (several processes; each is a no-op with one) -------------------------
def shared_run_dir(run_dir: str | Path) -> Path:
    """Process 0's run dir, on every process: checkpoints are written by all processes into one directory
    (orbax multi-process; on several hosts it must be on a filesystem they share)."""
    import jax

    run_dir = Path(run_dir).absolute()
    if jax.process_count() == 1:
        return run_dir
    from jax.experimental import multihost_utils

    raw = str(run_dir).encode()
    if len(raw) > _PATH_BYTES:
        raise ValueError(f"run dir path longer than {_PATH_BYTES} bytes: {run_dir}")
    buf = np.zeros(_PATH_BYTES, np.uint8)
    buf[:len(raw)] = np.frombuffer(raw, np.uint8)
    got = np.asarray(multihost_utils.broadcast_one_to_all(buf), np.uint8)
    return Path(got.tobytes().rstrip(b"\0").decode())


def agree(until: int, signum: int | None) -> tuple[int, int | None]:
    """`(until, signum)` that every process shares before a compiled call: process 0's `until` (the sub-chunk
    sizes come from each process's own timing) and the signal of any process that received one, so every
    process makes the same calls of the same lengths and all stop after the same one (a process that
    stopped alone would leave the others waiting in a collective)."""
    import jax

    if jax.process_count() == 1:
        return until, signum
    from jax.experimental import multihost_utils

    got = np.asarray(multihost_utils.process_allgather(np.array([until, signum or 0], np.int32)))
    received = [int(s) for s in got.reshape(-1, 2)[:, 1] if s]
    return int(got.reshape(-1, 2)[0, 0]), signum or (received[0] if received else None)


_PATH_BYTES = 4096


def _as_config(section: Any) -> DistributedConfig:
    if section is None:
        return DistributedConfig()
    if isinstance(section, DistributedConfig):
        return section
    known = {f.name for f in dataclasses.fields(DistributedConfig)}
    items = dict(section.items())
    unknown = set(items) - known
    if unknown:
        raise ValueError(f"unknown keys in `distributed`: {sorted(unknown)}; known: {sorted(known)}")
    if items.get("local_device_ids") is not None:
        items["local_device_ids"] = [int(i) for i in items["local_device_ids"]]
    return DistributedConfig(**items)
