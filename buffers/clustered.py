"""Clustered replay: one circular sub-buffer per cluster, sampled uniformly over clusters, then within.

Storage leaves are `[K, Tc, ...]` (K clusters of `capacity_per_cluster` Tc slots); `head[k]` and
`size[k]` are cluster k's write slot and item count. A sample first picks a cluster uniformly among the
non-empty ones, then an item uniformly within it, so rare clusters (e.g. high-return episodes) are replayed
as often as common ones.

Sampling an empty buffer returns cluster 0, index 0 and the zero row `data[0, 0]`; `can_sample` is False.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from buffers import checks
from buffers.flat import checked_update_fn, randint_below, storage_prototype

PyTree = Any


@struct.dataclass
class ClusteredState:
    data: PyTree  # leaves [K, Tc, ...]
    head: jax.Array  # [K] int32: next slot of each cluster
    size: jax.Array  # [K] int32: items stored in each cluster


@struct.dataclass
class ClusteredSample:
    items: PyTree  # leaves [B, ...]
    cluster_ids: jax.Array  # [B] int32
    indices: jax.Array  # [B] int32 slot within the cluster


@dataclasses.dataclass(frozen=True)
class ClusteredBuffer:
    """Static configuration and pure functions of a clustered buffer (see `make_clustered_buffer`)."""

    num_clusters: int
    capacity_per_cluster: int
    min_size: int = 1

    def __post_init__(self):
        if self.num_clusters < 1 or self.capacity_per_cluster < 1:
            raise ValueError(
                f"need num_clusters >= 1 and capacity_per_cluster >= 1, got {self.num_clusters}, "
                f"{self.capacity_per_cluster}"
            )
        if not 1 <= self.min_size <= self.num_clusters * self.capacity_per_cluster:
            raise ValueError(f"min_size must be in [1, total capacity], got {self.min_size}")

    def init(self, prototype: PyTree) -> ClusteredState:
        """Empty state: K sub-buffers of Tc zero items shaped like `prototype`."""
        proto = checks.as_prototype(prototype)
        k = self.num_clusters
        return ClusteredState(
            data=checks.zeros_like_storage(proto, (k, self.capacity_per_cluster)),
            head=jnp.zeros((k,), jnp.int32),
            size=jnp.zeros((k,), jnp.int32),
        )

    def add_batch(self, state: ClusteredState, items: PyTree, cluster_ids: jax.Array) -> ClusteredState:
        """Write items `[B, ...]` to the clusters `cluster_ids` ([B] int), in batch order within a cluster.

        The result equals adding the items one at a time: several items of one cluster take consecutive
        slots from its head (if more than Tc go to one cluster, the last Tc remain). Items whose cluster id
        is outside `[0, K)` are not written.
        """
        proto = storage_prototype(state.data, lead=2)
        (b,) = checks.check_items(proto, items, batch_dims=None, what="items")
        checks.check_index_array("cluster_ids", cluster_ids, length=b)
        k, tc = self.num_clusters, self.capacity_per_cluster
        ids = cluster_ids.astype(jnp.int32)
        valid = (ids >= 0) & (ids < k)
        ids = jnp.where(valid, ids, k)
        # Rank of each item among the batch's items of the same cluster, via a stable sort (no loop).
        # Sorted, each item's rank is its distance to the first of its run of equal ids (a running max).
        order = jnp.argsort(ids, stable=True)
        sorted_ids = ids[order]
        pos = jnp.arange(b, dtype=jnp.int32)
        run_start = jnp.concatenate([jnp.ones((1,), bool), sorted_ids[1:] != sorted_ids[:-1]])
        first = jax.lax.cummax(jnp.where(run_start, pos, 0))
        rank = jnp.zeros((b,), jnp.int32).at[order].set(pos - first, unique_indices=True)
        count = jnp.zeros((k,), jnp.int32).at[ids].add(1, mode="drop")
        ids_c = jnp.minimum(ids, k - 1)
        keep = valid & (rank >= count[ids_c] - tc)  # earlier items that a later one would overwrite: drop
        slot = (state.head[ids_c] + rank) % tc
        row = jnp.where(keep, ids, k)  # row k is out of range: dropped
        items = checks.cast_like(proto, items)
        data = jax.tree_util.tree_map(lambda x, y: x.at[row, slot].set(y, mode="drop"), state.data, items)
        return state.replace(
            data=data, head=(state.head + count) % tc, size=jnp.minimum(state.size + count, tc)
        )

    def add(self, state: ClusteredState, item: PyTree, cluster_id) -> ClusteredState:
        """Write one item to cluster `cluster_id` (int scalar; out of range: not written)."""
        proto = storage_prototype(state.data, lead=2)
        checks.check_items(proto, item, batch_dims=(), what="item")
        checks.check_index_array("cluster_id", cluster_id, ndim=0)
        k, tc = self.num_clusters, self.capacity_per_cluster
        cid = jnp.asarray(cluster_id, jnp.int32)
        valid = (cid >= 0) & (cid < k)
        row = jnp.where(valid, cid, k)
        slot = state.head[jnp.minimum(cid, k - 1)]
        item = checks.cast_like(proto, item)
        data = jax.tree_util.tree_map(lambda x, y: x.at[row, slot].set(y, mode="drop"), state.data, item)
        added = jnp.zeros((k,), jnp.int32).at[row].set(1, mode="drop")
        return state.replace(
            data=data, head=(state.head + added) % tc, size=jnp.minimum(state.size + added, tc)
        )

    def sample(self, state: ClusteredState, key: jax.Array, batch_size: int) -> ClusteredSample:
        """`batch_size` items: cluster uniform over non-empty clusters, then slot uniform within it."""
        k_cluster, k_slot = jax.random.split(key)
        nonempty = state.size > 0
        n = jnp.sum(nonempty, dtype=jnp.int32)
        r = randint_below(k_cluster, (batch_size,), jnp.maximum(n, 1))
        # The r-th non-empty cluster: first cluster whose running count of non-empty clusters exceeds r.
        running = jnp.cumsum(nonempty, dtype=jnp.int32)
        cid = jnp.searchsorted(running, r, side="right", method="compare_all")  # O(B*K), no loop
        cid = jnp.minimum(cid, self.num_clusters - 1).astype(jnp.int32)
        cid = jnp.where(n > 0, cid, 0)
        idx = randint_below(k_slot, (batch_size,), jnp.maximum(state.size[cid], 1))
        items = jax.tree_util.tree_map(lambda x: x[cid, idx], state.data)
        return ClusteredSample(items=items, cluster_ids=cid, indices=idx)

    def can_sample(self, state: ClusteredState) -> jax.Array:
        """bool[]: at least `min_size` items are stored over all clusters."""
        return jnp.sum(state.size) >= self.min_size

    def size(self, state: ClusteredState) -> jax.Array:
        """int32[]: number of stored items over all clusters."""
        return jnp.sum(state.size)

    def update(self, state: ClusteredState, fn: Callable[[PyTree], PyTree]) -> ClusteredState:
        """Replace every stored item by `fn(item)` (one item in, one out; vmapped over clusters and slots)."""
        proto = storage_prototype(state.data, lead=2)
        checked_update_fn(proto, fn)
        new = jax.vmap(jax.vmap(fn))(state.data)
        keep = jnp.arange(self.capacity_per_cluster)[None, :] < state.size[:, None]
        data = jax.tree_util.tree_map(
            lambda n, x: jnp.where(keep.reshape(keep.shape + (1,) * (x.ndim - 2)), n.astype(x.dtype), x),
            new,
            state.data,
        )
        return state.replace(data=data)


def make_clustered_buffer(num_clusters: int, capacity_per_cluster: int, min_size: int = 1) -> ClusteredBuffer:
    """K = `num_clusters` circular sub-buffers of `capacity_per_cluster` items each."""
    return ClusteredBuffer(
        num_clusters=num_clusters, capacity_per_cluster=capacity_per_cluster, min_size=min_size
    )
