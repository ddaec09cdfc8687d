"""Multi-device data parallelism for the Anakin runner. Every `jax.sharding` call of the project lives here.

How it works: the runner's whole jitted program stays the *same* program as on one device; only the
placement of its state changes ("computation follows data", jit + `NamedSharding`, no `shard_map`).

* The mesh has two axes: `seed` (the vmapped seeds, `S`) and `data` (envs, buffer rows, batch).
  Both use `AxisType.Auto`: the compiler partitions the scatters of `buffer.add` into a sharded buffer
  and the random gathers of sampling (with `Explicit` axes, the `jax.make_mesh` default, the same program
  fails to trace with a `ShardingTypeError` on mixed operand shardings).
* Runner state leaves are `[S, ...]`. The agent state (params, optimiser state) is replicated over `data`;
  env state, carries, episode statistics and the buffer state are sharded on their second axis (`E`
  envs, buffer rows or capacity) over `data` (`tree_shardings`).
* The agent calls `shard_batch(batch)` on what it sampled: each device computes the loss and gradients
  of `B / D` samples (`D` = data devices) and XLA all-reduces the gradients, i.e. data-parallel gradient
  averaging with the exact semantics of the one-device mean over `B`. So a D-device run equals the
  one-device run with the same global batch up to float summation order (tests/rl/infra/test_sharding.py).
  (With `shard_map` instead, the gradient of replicated params is already summed over devices: a further
  `pmean` would scale the update by D. Not needed here.)
* Without a mesh (one device, the default) every function here is the identity: the runner's
  single-device program is untouched.

Shapes: `S` seeds, `E` envs per seed, `B` batch per seed; `S % seed_devices == 0` and `E % data_devices
== 0` (`check_divisible`, the message names the config key), `B % data_devices == 0` (`shard_batch`, at
trace time).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rl.config import MeshConfig

PyTree = Any
SEED_AXIS = "seed"
DATA_AXIS = "data"


def make_mesh(devices: int | None = None, seed_devices: int = 1) -> Mesh:
    """A `(seed_devices, devices // seed_devices)` mesh with axes `("seed", "data")`, both `Auto`."""
    available = jax.device_count()
    n = available if devices is None else int(devices)
    if not 1 <= n <= available:
        raise ValueError(f"mesh.devices={devices} but {available} devices exist "
                         f"({jax.devices()[0].platform}); use null for all of them")
    if seed_devices < 1 or n % seed_devices:
        raise ValueError(f"mesh.seed_devices={seed_devices} must be >= 1 and divide the {n} devices used")
    return jax.make_mesh((seed_devices, n // seed_devices), (SEED_AXIS, DATA_AXIS),
                         axis_types=(AxisType.Auto, AxisType.Auto), devices=jax.devices()[:n])


def mesh_from_config(section: Mapping | MeshConfig | None) -> Mesh | None:
    """The mesh for the `mesh` config section, or None when it has a single device (the plain path)."""
    if section is None:
        section = MeshConfig()
    get = section.get if isinstance(section, Mapping) else lambda k, d=None: getattr(section, k, d)
    mesh = make_mesh(get("devices", None), get("seed_devices", 1) or 1)
    return mesh if mesh.size > 1 else None


def check_divisible(mesh: Mesh | None, *, seeds: int, **per_seed: int) -> None:
    """Raise a ValueError naming the config key when `seeds` does not split over the seed axis or a
    per-seed size (e.g. `num_envs=...`, `agent.batch_size=...`) does not split over the data axis."""
    if mesh is None:
        return
    if seeds % mesh.shape[SEED_AXIS]:
        raise ValueError(f"seeds={seeds} is not divisible by mesh.seed_devices={mesh.shape[SEED_AXIS]}")
    d = mesh.shape[DATA_AXIS]
    bad = [f"{k}={v}" for k, v in per_seed.items() if v % d]
    if bad:
        raise ValueError(f"{', '.join(bad)} not divisible by the {d} data-parallel devices "
                         f"(mesh.devices / mesh.seed_devices); change them or set mesh.devices")


def _leaf_spec(mesh: Mesh, shape: tuple[int, ...], shard_data: bool) -> P:
    seed = SEED_AXIS if len(shape) >= 1 and shape[0] % mesh.shape[SEED_AXIS] == 0 else None
    if shard_data and len(shape) >= 2 and shape[1] % mesh.shape[DATA_AXIS] == 0:
        return P(seed, DATA_AXIS)
    return P(seed) if seed else P()


def tree_shardings(mesh: Mesh, tree: PyTree, *, shard_data: bool) -> PyTree:
    """`NamedSharding`s for a tree of `[S, ...]` arrays (or `jax.ShapeDtypeStruct`s): axis 0 over `seed`;
    with `shard_data`, axis 1 over `data` where it divides (leaves where it does not, e.g. a sum tree's
    root level, are replicated over `data`, which is correct, only not split)."""

    def one(x):
        return NamedSharding(mesh, _leaf_spec(mesh, tuple(np.shape(x)), shard_data))

    return jax.tree_util.tree_map(one, tree)


def runner_shardings(mesh: Mesh, state: PyTree, replicated: tuple[str, ...] = ("agent",)) -> PyTree:
    """Shardings for a runner state whose top-level fields are named (a dataclass or dict of `[S, ...]`
    subtrees): fields in `replicated` are replicated over `data`, all others sharded on axis 1."""
    if dataclasses.is_dataclass(state):
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
        rebuild = lambda d: state.replace(**d) if hasattr(state, "replace") else dataclasses.replace(state, **d)
    elif isinstance(state, Mapping):
        fields, rebuild = dict(state), lambda d: type(state)(d)
    else:
        raise TypeError(f"runner state must be a dataclass or a dict, got {type(state).__name__}")
    unknown = set(replicated) - set(fields)
    if unknown:
        raise ValueError(f"replicated fields {sorted(unknown)} are not in the runner state {sorted(fields)}")
    return rebuild({k: tree_shardings(mesh, v, shard_data=k not in replicated) for k, v in fields.items()})


def use_mesh(mesh: Mesh | None) -> contextlib.AbstractContextManager:
    """Context in which to trace and run the sharded program (`jax.set_mesh`); a no-op for None."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def loop_shardings(mesh: Mesh | None, state_shardings: PyTree | None, totals: PyTree) -> tuple:
    """`(state, counter, totals)` placements of a runner's compiled loop, given to it as `out_shardings`
    and to everything that goes into its first call (init, restore, fresh totals): the call cache is keyed
    on the inputs' placement, so a restored (committed) state next to fresh (uncommitted) totals, or an
    equivalent spec spelled differently (`P('seed', 'data')` over a data axis of 1 comes back as
    `P('seed')`), would compile the whole program a second and third time. One device: all on it."""
    if mesh is None:
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return one, one, one
    return state_shardings, NamedSharding(mesh, P()), tree_shardings(mesh, totals, shard_data=False)


def place(tree: PyTree, shardings: PyTree | None) -> PyTree:
    """Move existing arrays (e.g. a restored checkpoint) to `shardings` (single host); identity for None."""
    return tree if shardings is None else jax.device_put(tree, shardings)


def _context_data_axis() -> int:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or DATA_AXIS not in mesh.axis_names:
        return 1
    return mesh.shape[DATA_AXIS]


def shard_batch(batch: PyTree) -> PyTree:
    """Split a sampled batch (leaves `[B, ...]`, inside the seed vmap) over the `data` devices, so the loss
    and gradients are computed data-parallel and XLA averages the gradients over devices. Identity when
    traced without a mesh (one device)."""
    d = _context_data_axis()
    if d == 1:
        return batch

    def one(x):
        if x.ndim == 0 or x.shape[0] % d:
            raise ValueError(f"batch leaf of shape {x.shape}: leading (batch) axis not divisible by the "
                             f"{d} data-parallel devices")
        return jax.lax.with_sharding_constraint(x, P(DATA_AXIS))

    return jax.tree_util.tree_map(one, batch)


def vmap_seeds(fn: Callable, in_axes: Any = 0, out_axes: Any = 0) -> Callable:
    """`jax.vmap` over the seed axis; under a mesh, sharding constraints inside (`shard_batch`) keep the
    seed axis split over `seed` devices instead of gathering it."""

    def call(*args):
        mesh = jax.sharding.get_abstract_mesh()
        spmd = SEED_AXIS if not mesh.empty and SEED_AXIS in mesh.axis_names else None
        return jax.vmap(fn, in_axes=in_axes, out_axes=out_axes, spmd_axis_name=spmd)(*args)

    return call


def to_host(tree: PyTree) -> PyTree:
    """NumPy copies of `tree` on every process, also for arrays spread over several hosts."""
    if all(getattr(x, "is_fully_addressable", True) for x in jax.tree_util.tree_leaves(tree)):
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def describe(mesh: Mesh | None) -> str:
    """One line for the console: the devices and how they are split."""
    if mesh is None:
        return f"1 device ({jax.devices()[0].platform})"
    return (f"{mesh.size} devices ({mesh.devices.flat[0].platform}, {jax.process_count()} process(es)): "
            f"seed={mesh.shape[SEED_AXIS]} x data={mesh.shape[DATA_AXIS]}")



# --- Sebulba: a learner mesh over chosen devices (rl/runners/sebulba.py) ----------------------------------------
def mesh_over(devices) -> Mesh:
    """A `(1, len(devices))` mesh with axes `("seed", "data")`, both `Auto`, over exactly `devices` (the
    Sebulba learner's devices; `make_mesh` always takes the first ones)."""
    devices = list(devices)
    return Mesh(np.array(devices).reshape(1, len(devices)), (SEED_AXIS, DATA_AXIS),
                axis_types=(AxisType.Auto, AxisType.Auto))


def leading_shardings(mesh: Mesh, tree: PyTree, *, shard_data: bool) -> PyTree:
    """Shardings for a tree without a seed axis (a Sebulba learner's state): with `shard_data`, axis 0 over
    `data` where it divides (e.g. the buffer's env rows), otherwise replicated (the agent state). Any choice
    is correct (computation follows data); the split only saves memory and spreads the buffer writes."""

    def one(x):
        shape = tuple(np.shape(x))
        split = shard_data and len(shape) >= 1 and shape[0] % mesh.shape[DATA_AXIS] == 0
        return NamedSharding(mesh, P(DATA_AXIS) if split else P())

    return jax.tree_util.tree_map(one, tree)


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device of `mesh` holds the whole array."""
    return NamedSharding(mesh, P())


def from_host(tree: PyTree, sharding: NamedSharding) -> PyTree:
    """`tree` (host or device values that every process holds equally) as global arrays of `sharding`, each
    process filling its own devices: no communication. (`jax.device_put` to a sharding spanning several
    processes checks the values with a collective over every device, which must not run while a program
    over some of them is in flight: see rl/infra/distributed.py.)"""
    return jax.tree_util.tree_map(
        lambda x: jax.make_array_from_callback(np.shape(x), sharding, lambda index: np.asarray(x)[index]), tree)
