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

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Mapping
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


# A process that dies while the others wait for it outside a collective (in `exchange`, or a checkpoint's
# barrier) raises nothing in them: the runtime only notices at its heartbeat timeout (100 s) and then aborts
# with a C++ stack dump. So each process also sets its own beat key every BEAT_S from a daemon thread, which
# watches the others' keys and reports a peer whose key has not changed for STALE_S. The thread needs only
# the GIL, which XLA releases while it compiles and runs, so a busy process still beats.
BEAT_S = 1.0
STALE_S = 20.0
DONE = "done"
_watches = 0  # watches begun by this process (every process begins the same ones, in order)


class PeerSilent(RuntimeError):
    """Another process's beat key stopped changing: it is gone (or frozen)."""


@contextlib.contextmanager
def watch_peers(on_lost: Callable[[str, BaseException], None]) -> Iterator[None]:
    """While inside (several processes; nothing with one): beat this process's key and call
    `on_lost(who, PeerSilent)` from the watching thread when a peer falls silent. `on_lost` must end the
    process (the main thread may be blocked in a barrier that never returns)."""
    import jax

    n, me = jax.process_count(), jax.process_index()
    if n == 1:
        yield
        return
    global _watches
    _watches += 1
    key, stop, client = f"rl/alive/{_watches}/", threading.Event(), _client()
    thread = threading.Thread(target=_watch, args=(client, key, me, n, on_lost, stop), daemon=True,
                              name="rl-peer-watch")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5 * BEAT_S)  # a read of an unreachable coordinator may hang
        with contextlib.suppress(Exception):
            client.key_value_set(f"{key}{me}", DONE, allow_overwrite=True)  # the peers stop judging this one


def _watch(client, key: str, me: int, n: int, on_lost, stop: threading.Event, clock=time.monotonic) -> None:
    """The watching thread: every BEAT_S set `<key><me>` to a new count and read every peer's; a peer whose
    value has not changed for STALE_S is reported once and the thread ends. A peer is judged only once its
    first beat is seen (processes reach the loop seconds apart: a slow start is not a death) and no more
    once it is DONE (it left the watch normally)."""
    seen = {p: (None, 0.0) for p in range(n) if p != me}
    beat = 0
    while not stop.wait(BEAT_S):
        beat += 1
        with contextlib.suppress(Exception):  # the coordinator (process 0) gone: the peers' reads show it
            client.key_value_set(f"{key}{me}", str(beat), allow_overwrite=True)
        now = clock()
        for p, (value, since) in list(seen.items()):
            try:
                got = client.key_value_try_get(f"{key}{p}")
            except Exception:  # noqa: BLE001 - not set yet (NOT_FOUND) or the coordinator unreachable
                got = None
            if got == DONE:
                del seen[p]
            elif got is not None and got != value:
                seen[p] = (got, now)
            elif value is not None and now - since > STALE_S:
                on_lost(f"process {p} of {n}", PeerSilent(f"no heartbeat for {now - since:.0f} s"))
                return


def lost_peer() -> str:
    """Which process went away, as far as this one can tell: with two, the other one."""
    import jax

    n, me = jax.process_count(), jax.process_index()
    return f"process {1 - me} of 2" if n == 2 else f"another of the {n} processes"


def leave(code: int, now: bool = False) -> None:
    """End this process with `code` without JAX's own exit handlers (the distributed shutdown that would
    wait for a dead peer and abort), output flushed first: at interpreter exit, or `now` (from a thread
    while the main thread is blocked)."""
    import atexit
    import os
    import sys

    def end():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    if now:
        end()
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
