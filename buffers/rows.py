"""Per-env rows for asynchronous envs (envpool async): one circular time axis per env.

Storage is a short tuple of `[E, T, ...]` arrays (E = num_envs, T = capacity_per_env): the small step
leaves packed into one `uint32 [E, T, W]`, each large leaf (a frame) in its own array (`buffers/packing.py`;
`state.data` unpacks it as a pytree of `[E, T, *leaf_shape]`). Each row has its own head: absolute step `a`
of env `e` (the a-th step ever written to that row, from 0) lives at `[e, a % T]`, so a row holds its last
`min(written[e], T)` steps. `add(state, steps, env_ids)` writes step i to row
`env_ids[i]` at that row's head; rows advance independently, any subset of envs in any order.

Rows read in windows of up to L steps (sequence buffers) are laid out for it (`init_rows(..., window=L)`):
every leaf in its own array, and each row `[T + M]` long with `M = L - 1`, its first M positions repeated
at `[T, T + M)` (written twice). Every window is then L contiguous steps of each leaf, gathered as one
slice per window instead of one index per step, which XLA:CPU gathers faster.
`state.data` shows positions `[0, T)` only.

`online_start [E]` is a second pointer over the same rows (the absolute step where the not-yet-consumed
online queue begins); `buffers/online.py` samples from it.

env_ids are traced values, so their range and distinctness cannot be checked at trace time: with
`debug=True` the buffers add `checkify` checks, which raise when called eagerly and are reported by
`jax.experimental.checkify.checkify(fn)` under jit. Without `debug` the write rule is: an entry whose id
is outside `[0, E)` (negative ones included) or whose mask is False writes nothing and advances no row;
of unmasked entries sharing an id, the last one (highest index in the batch) is stored and its row
advances once. `peek` and the samplers expect ids in `[0, E)` (not checked without `debug`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.experimental import checkify

from buffers import checks
from buffers.packing import PackedStorage, Packing, computed_once, packing_of


@struct.dataclass
class RowState(PackedStorage):
    storage: tuple  # arrays [E, T + M, ...]: step a of env e at [e, a % T], also at [e, T + a % T] if a % T < M
    written: jax.Array  # [E] int32: total steps ever written to each row
    online_start: jax.Array  # [E] int32: absolute step where the unconsumed online queue begins
    packing: Packing = struct.field(pytree_node=False)
    capacity: int = struct.field(pytree_node=False)  # T: steps held per row
    mirror: int = struct.field(pytree_node=False)  # M: positions [0, M) repeated at [T, T + M)

    @property
    def data(self):
        """The rows unpacked: leaves `[..., E, T, ...]` (a copy; for inspection and tests; any leading dims)."""
        return self.packing.unpack(tuple(jax.lax.slice_in_dim(x, 0, self.capacity, axis=x.ndim - k - 1)
                                         for x, k in zip(self.storage, self.packing.item_ndims)))


def init_rows(prototype, num_envs: int, capacity_per_env: int, window: int = 1) -> RowState:
    """Zero storage for steps like `prototype` (a tree of ShapeDtypeStructs or arrays): `[E, T, ...]` with
    the small leaves packed, or, for rows read in windows of `window > 1` steps, every leaf apart and
    `[E, T + window - 1, ...]` (see the module docstring)."""
    packing = packing_of(prototype, pack_small=window <= 1)
    mirror = max(window - 1, 0)
    return RowState(
        storage=packing.zeros((num_envs, capacity_per_env + mirror)),
        written=jnp.zeros((num_envs,), jnp.int32),
        online_start=jnp.zeros((num_envs,), jnp.int32),
        packing=packing,
        capacity=capacity_per_env,
        mirror=mirror,
    )


def check_env_ids(env_ids: jax.Array, mask: jax.Array, num_envs: int, distinct: bool = True,
                  what: str = "env_ids") -> None:
    """`checkify` checks: unmasked env_ids ([N], mask [N]) in [0, num_envs) and, if `distinct`, pairwise distinct."""
    in_range = (env_ids >= 0) & (env_ids < num_envs)
    checkify.check(
        jnp.all(in_range | ~mask),
        f"{what} out of range [0, {num_envs}): {{ids}}",
        ids=env_ids,
    )
    if distinct and env_ids.shape[0] > 1:
        # Masked entries get distinct negative keys so only unmasked ids can collide.
        keys = jnp.where(mask, env_ids, -1 - jnp.arange(env_ids.shape[0], dtype=env_ids.dtype))
        s = jnp.sort(keys)
        checkify.check(
            jnp.all(s[1:] != s[:-1]),
            f"{what} must be distinct within one add (one step per env per call): {{ids}}",
            ids=env_ids,
        )


def prepare_add(prototype, steps, env_ids, mask, what: str = "steps"):
    """Trace-time checks of an add; returns `(steps cast to the prototype dtypes, env_ids int32, mask bool)`."""
    checks.check_index_array("env_ids", env_ids)
    n = env_ids.shape[0]
    checks.check_items(prototype, steps, (n,), what=what)
    if mask is None:
        mask = jnp.ones((n,), bool)
    else:
        if tuple(jnp.shape(mask)) != (n,):
            raise checks.BufferInputError(f"mask: expected shape ({n},), received {tuple(jnp.shape(mask))}")
        if jnp.result_type(mask) != jnp.bool_:
            raise checks.BufferInputError(f"mask: expected dtype bool, received {jnp.result_type(mask)}")
    return checks.cast_like(prototype, steps), jnp.asarray(env_ids, jnp.int32), jnp.asarray(mask, bool)


def write(rows: RowState, steps, env_ids: jax.Array, mask: jax.Array):
    """Write `steps [N, ...]` at each row's head; masked-out entries and ids outside `[0, E)` write nothing,
    and of entries sharing an id only the last one (highest index) writes, advancing the row once.

    Returns `(rows, abs_steps [N] int32, row_index [N] int32)`: the absolute step each entry was written
    as, and its row (`E`, an out-of-range index that scatters drop, where it wrote nothing).
    """
    num_envs, cap, m = rows.storage[0].shape[0], rows.capacity, rows.mirror
    n = env_ids.shape[0]
    row = jnp.where(mask & (env_ids >= 0) & (env_ids < num_envs), env_ids, num_envs)
    # Last entry per row: scatter-max of the entry index (row E collects every dropped entry).
    last = jnp.full((num_envs + 1,), -1, jnp.int32).at[row].max(jnp.arange(n, dtype=jnp.int32))
    row = jnp.where(last[row] == jnp.arange(n), row, num_envs)
    abs_steps = rows.written[jnp.clip(env_ids, 0, num_envs - 1)]
    pos = abs_steps % cap
    items, to_row, to_pos = rows.packing.pack(steps), row, pos
    if m:  # positions below M are written again at T + pos (one scatter; row E drops the others)
        items = tuple(jnp.concatenate([x, x]) for x in items)
        to_row = jnp.concatenate([row, jnp.where(pos < m, row, num_envs)])
        to_pos = jnp.concatenate([pos, pos + cap])
    storage = jax.tree_util.tree_map(lambda s, x: s.at[to_row, to_pos].set(x, mode="drop"), rows.storage, items)
    written = rows.written.at[row].add(1, mode="drop")
    return rows.replace(storage=storage, written=written), abs_steps, row


def peek(rows: RowState, env_ids: jax.Array):
    """Latest step of each env in `env_ids [N]` -> tree of `[N, ...]` (zeros for a row never written)."""
    return gather(rows, env_ids, (rows.written[env_ids] - 1) % rows.capacity)


def gather(rows: RowState, env_ids: jax.Array, positions: jax.Array, length: int | None = None):
    """The steps at `(env_ids [B], positions [B])` -> leaves `[B, ...]`; with `length` L, the windows of L
    steps starting there (wrapping at T) -> leaves `[B, L, ...]`.

    Windows of rows laid out for them (`length <= M + 1`) are one slice `[L, ...]` per window and leaf.
    Otherwise the storage is indexed viewed flat as `[E*(T+M), ...]` (a free reshape; one index per step,
    about 3x faster on CPU than an (env, pos) pair): single steps as whole packed rows, unpacked
    (`Packing.take`), other windows one leaf at a time (`Packing.take_leaves`: a caller that uses some
    leaves only pays for theirs).
    """
    e, stride = rows.storage[0].shape[:2]
    t = rows.capacity
    env_ids, positions = computed_once(env_ids), computed_once(positions)  # the samplers' arithmetic, once
    if length is not None and 1 < length <= rows.mirror + 1:
        return _windows(rows, env_ids, positions, length)
    if length is None:
        flat = env_ids * stride + positions
    else:
        flat = computed_once(env_ids[:, None] * stride + (positions[:, None] + jnp.arange(length)[None, :]) % t)
    storage = tuple(s.reshape((e * stride,) + s.shape[2:]) for s in rows.storage)
    return rows.packing.take(storage, flat) if length is None else rows.packing.take_leaves(storage, flat)


def _windows(rows: RowState, env_ids: jax.Array, positions: jax.Array, length: int):
    """Windows of mirrored rows (every leaf apart): leaf `[E, T + M, *S]` -> `[B, L, *S]`, one slice each."""
    starts = jnp.stack([env_ids, positions], axis=-1)  # [B, 2]

    def window(leaf):
        dn = jax.lax.GatherDimensionNumbers(offset_dims=tuple(range(1, leaf.ndim)), collapsed_slice_dims=(0,),
                                            start_index_map=(0, 1))
        return jax.lax.gather(leaf, starts, dn, (1, length) + leaf.shape[2:], mode=jax.lax.GatherScatterMode.CLIP)

    return jax.tree_util.tree_map(window, rows.packing.unpack(rows.storage))


def stored_steps(rows: RowState, capacity_per_env: int) -> jax.Array:
    """Number of steps held over all rows (scalar int32)."""
    return jnp.sum(jnp.minimum(rows.written, capacity_per_env))


@dataclasses.dataclass(frozen=True)
class RowBuffer:
    """Per-env rows only (no sampling): `init`, `add`, `peek`, `size`. See the module docstring."""

    num_envs: int
    capacity_per_env: int
    debug: bool = False

    def init(self, prototype) -> RowState:
        return init_rows(checks.as_prototype(prototype), self.num_envs, self.capacity_per_env)

    def add(self, state: RowState, steps, env_ids, mask=None) -> RowState:
        """Write `steps [N, ...]` to rows `env_ids [N]`, skipping entries where `mask [N]` is False (repeated
        or out-of-range ids: see the module docstring)."""
        steps, env_ids, mask = prepare_add(state.packing.prototype, steps, env_ids, mask)
        if self.debug:
            check_env_ids(env_ids, mask, self.num_envs)
        state, _, _ = write(state, steps, env_ids, mask)
        return state

    def peek(self, state: RowState, env_ids) -> Any:
        env_ids = jnp.asarray(env_ids, jnp.int32)
        if self.debug:
            check_env_ids(env_ids, jnp.ones(env_ids.shape, bool), self.num_envs, distinct=False)
        return peek(state, env_ids)

    def size(self, state: RowState) -> jax.Array:
        return stored_steps(state, self.capacity_per_env)


def make_row_buffer(num_envs: int, capacity_per_env: int, debug: bool = False) -> RowBuffer:
    """Rows `[num_envs, capacity_per_env, ...]` written per env (envpool async)."""
    if num_envs < 1 or capacity_per_env < 1:
        raise ValueError(f"need num_envs >= 1 and capacity_per_env >= 1, got {num_envs=} {capacity_per_env=}")
    return RowBuffer(num_envs=num_envs, capacity_per_env=capacity_per_env, debug=debug)
