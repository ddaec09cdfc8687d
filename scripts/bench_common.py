"""Timing helpers shared by the `scripts.bench_*` benchmarks.

A workload is a loop body `body(i, carry) -> carry` over a carry pytree (typically
`(buffer_state, key, last_sample)`), timed two ways:

* `time_in_loop` / `loop_runner`: K steps inside one jitted `lax.fori_loop`, the carry donated into the jit;
* `time_calls` / `calls_runner`: K separate jitted calls from Python, the carry donated into every call.

`time_interleaved` times several workloads round-robin (repeat r of every workload before repeat r+1 of
any), so that load from other processes on a shared machine hits them alike.

Each way warms up (compiles and runs) until the carry's signature (shapes, dtypes, weak types) stops
changing, then reports the median over `repeats` of (wall time of K steps) / K, in seconds per step, with
`jax.block_until_ready` around every measurement; each run's process CPU time (all threads) is kept too,
since on a machine shared with other jobs it varies far less than wall time. A state whose signature changes after one step (e.g. a
weak-typed scalar that the step returns strongly typed) makes jit retrace and recompile on the *second*
call; a harness that warms up once then times that recompilation as if it were step time. Both functions
return a `Timing`: seconds per step, the carry they end with (so a caller can chain them on one state:
donation invalidates the carry it was given) and the wall time of each warm-up run (one when the
signature is stable; the second is then the recompilation a once-warmed harness would time).

The body must consume what it samples (e.g. return it in the carry); otherwise XLA removes the unused
gathers and the timing measures nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

PyTree = Any
Body = Callable[[Any, PyTree], PyTree]

# Donating a carry leaf XLA cannot reuse (e.g. a PRNG key) only warns; the storage is what matters here.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


def signature(tree: PyTree):
    """Structure plus (shape, dtype, weak_type) of every leaf: what jit keys its compilation cache on."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((x.shape, x.dtype, getattr(jax.typeof(x), "weak_type", False)) for x in leaves)


@dataclasses.dataclass
class Timing:
    per_step_s: float  # median over repeats of (K steps wall time) / K
    carry: PyTree  # the carry after the last run
    warmup_s: list  # wall time of each warm-up run (compile included)
    runs_s: list = dataclasses.field(default_factory=list)  # per-step wall seconds of every timed run
    cpu_s: list = dataclasses.field(default_factory=list)  # per-step process CPU seconds of every timed run

    @property
    def cpu_per_step_s(self) -> float:
        """Median process CPU seconds per step: less sensitive than wall time to other processes' load."""
        return statistics.median(self.cpu_s) if self.cpu_s else float("nan")


def loop_runner(body: Body, k: int) -> Callable[[PyTree], PyTree]:
    """`run(carry)`: K steps of `body` inside one jitted fori_loop, the carry donated."""
    return jax.jit(lambda c: jax.lax.fori_loop(0, k, body, c), donate_argnums=0)


def calls_runner(body: Body, k: int) -> Callable[[PyTree], PyTree]:
    """`run(carry)`: K separate donated jitted calls of `body` from Python."""
    step = jax.jit(lambda i, c: body(i, c), donate_argnums=1)

    def run(c):
        for i in range(k):
            c = step(i, c)
        return c

    return run


def warm_up(run: Callable[[PyTree], PyTree], carry: PyTree, max_runs: int = 3) -> tuple[PyTree, list]:
    """Run until the carry's signature is stable (compiles included); returns the carry and each run's seconds."""
    sig, warmup_s = signature(carry), []
    while len(warmup_s) < max_runs:
        t0 = time.perf_counter()
        carry = jax.block_until_ready(run(carry))
        warmup_s.append(time.perf_counter() - t0)
        new = signature(carry)
        if new == sig:
            break
        sig = new
    return carry, warmup_s


def timed_run(run: Callable[[PyTree], PyTree], carry: PyTree, k: int) -> tuple[float, PyTree, float]:
    """(wall seconds per step, carry, process CPU seconds per step) of one `run` of K steps (blocked)."""
    c0, t0 = time.process_time(), time.perf_counter()
    carry = jax.block_until_ready(run(carry))
    return (time.perf_counter() - t0) / k, carry, (time.process_time() - c0) / k


def _median_per_step(run, carry, k: int, repeats: int) -> Timing:
    carry, warmup_s = warm_up(run, carry)
    times, cpu = [], []
    for _ in range(repeats):
        sec, carry, c = timed_run(run, carry, k)
        times.append(sec)
        cpu.append(c)
    return Timing(statistics.median(times), carry, warmup_s, times, cpu)


def time_in_loop(body: Body, carry: PyTree, k: int, repeats: int = 5) -> Timing:
    """Seconds per step of `body` run K times inside one jitted fori_loop (carry donated)."""
    return _median_per_step(loop_runner(body, k), carry, k, repeats)


def time_calls(body: Body, carry: PyTree, k: int, repeats: int = 5) -> Timing:
    """Seconds per step of K separate donated jitted calls of `body` from Python."""
    return _median_per_step(calls_runner(body, k), carry, k, repeats)


def time_interleaved(entries: dict, k: int, repeats: int) -> dict:
    """Time several workloads round-robin so that load from other processes hits them alike.

    `entries`: name -> (runs, carry) where `runs` maps a way (e.g. "loop", "calls") to a `run` from
    `loop_runner` / `calls_runner`, all threading the same carry. Every run is warmed up, then each repeat
    times every (name, way) once in turn. Returns name -> way -> `Timing` (carry: the entry's last carry).
    """
    carries, warm = {}, {}
    for name, (runs, carry) in entries.items():
        for way, run in runs.items():
            carry, warm[name, way] = warm_up(run, carry)
        carries[name] = carry
    times = {(name, way): [] for name, (runs, _) in entries.items() for way in runs}
    cpu = {key: [] for key in times}
    for _ in range(repeats):
        for name, (runs, _) in entries.items():
            for way, run in runs.items():
                sec, carries[name], c = timed_run(run, carries[name], k)
                times[name, way].append(sec)
                cpu[name, way].append(c)
    return {name: {way: Timing(statistics.median(times[name, way]), carries[name], warm[name, way],
                               times[name, way], cpu[name, way]) for way in runs}
            for name, (runs, _) in entries.items()}


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width text table (floats with 3 decimals, None as '-')."""

    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    return "\n".join(out)


def print_json_line(record: dict) -> None:
    """One JSON object on one line (machine-readable record of a case)."""
    print(json.dumps(record, sort_keys=False, default=float), flush=True)


def tree_nbytes(tree: PyTree) -> int:
    """Total bytes of the array leaves of `tree` (arrays or `ShapeDtypeStruct`s)."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))
