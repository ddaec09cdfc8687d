"""Multi-host start (`jax.distributed.initialize` from the `distributed` config section, typed as
rl.config.DistributedConfig; this module imports JAX only when it starts the runtime).

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
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rl.config import DistributedConfig


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
# Through the coordination service's key-value store, never an XLA collective: a collective over all devices
# launched while a compiled program over some of them (the Sebulba learner's update) is still running
# mismatches gloo's messages (an abort: "Received data size doesn't match expected size"; tests/rl/infra/
# test_agreement.py reproduces it with jax's own process_allgather).
AGREE_TIMEOUT_S = 3600.0  # the longest one process may wait for the others at one agreement
_POLL_MS = 1000           # each wait returns to Python this often, so signals are handled while waiting
_round = 0                # agreements made by this process (every process makes the same ones, in order)


def _client():
    from jax._src import distributed  # the runtime's client (orbax reaches it the same way)

    return distributed.global_state.client


def _get(client, key: str, what: str, timeout_s: float) -> str:
    """The value of `key` once some process has set it, waiting at most `timeout_s` (then a clear error)."""
    import jax

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.blocking_key_value_get(key, _POLL_MS)
        except jax.errors.JaxRuntimeError as e:
            if "DEADLINE_EXCEEDED" not in str(e):
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what} ({key}): that process is stuck or gone")


def exchange(value: str, timeout_s: float = AGREE_TIMEOUT_S) -> list[str]:
    """Every process's `value` (a short string), in process order, on every process: one round of the
    coordination service's key-value store (no device work). Every process must call it equally often."""
    import jax

    global _round
    n, me = jax.process_count(), jax.process_index()
    if n == 1:
        return [value]
    client, _round = _client(), _round + 1
    client.key_value_set(f"rl/exchange/{_round}/{me}", value)
    got = [_get(client, f"rl/exchange/{_round}/{p}", f"process {p} at exchange {_round}", timeout_s)
           for p in range(n)]
    if _round > 2:  # every process has read round - 2 (it set round - 1 after reading it)
        client.key_value_delete(f"rl/exchange/{_round - 2}/{me}")
    return got


def shared_run_dir(run_dir: str | Path) -> Path:
    """Process 0's run dir, on every process: checkpoints are written by all processes into one directory
    (orbax multi-process; on several hosts it must be on a filesystem they share)."""
    run_dir = Path(run_dir).absolute()
    return Path(exchange(str(run_dir))[0])


class Agreement(NamedTuple):
    until: int  # process 0's end of the next compiled call
    signum: int | None  # this process's signal, else any other process's (None: none)
    save: bool  # process 0's: checkpoint now (its wall clock says one is due)


def agree(until: int, signum: int | None, save: bool = False) -> Agreement:
    """What every process shares before a compiled call: process 0's `until` (the sub-chunk sizes come from
    each process's own timing) and `save`, and the signal of any process that received one, so every
    process makes the same calls of the same lengths, checkpoints at the same ones and all stop after the
    same one (a process that stopped alone would leave the others waiting in a collective)."""
    got = [tuple(int(v) for v in x.split(",")) for x in exchange(f"{until},{signum or 0},{int(save)}")]
    received = [s for _, s, _ in got if s]
    return Agreement(got[0][0], signum or (received[0] if received else None), bool(got[0][2]))


# --- a process that went away -----------------------------------------------------------------------------
# A killed peer shows in the survivors as an error of the collective in flight (gloo: "Connection reset by
# peer") or of the coordination service; the runtime cannot shut down after it (its shutdown barrier waits
# for the dead process, then aborts with a C++ stack dump), so `leave` ends the process without it.
PEER_LOST = ("Gloo", "gloo", "Connection reset by peer", "Connection closed by peer", "heartbeat", "UNAVAILABLE")


def peer_lost(error: BaseException) -> bool:
    """Whether `error` (a `jax.errors.JaxRuntimeError`) says another process of the run is gone."""
    return any(s in str(error) for s in PEER_LOST)


def lost_peer() -> str:
    """Which process went away, as far as this one can tell: with two, the other one."""
    import jax

    n, me = jax.process_count(), jax.process_index()
    return f"process {1 - me} of 2" if n == 2 else f"another of the {n} processes"


def leave(code: int) -> None:
    """At interpreter exit, end this process with `code` at once, before JAX's own exit handlers (the
    distributed shutdown that would wait for a dead peer and abort); output is flushed first."""
    import atexit
    import os
    import sys

    def end():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    atexit.register(end)  # atexit runs last-registered first: before jax's shutdown


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
