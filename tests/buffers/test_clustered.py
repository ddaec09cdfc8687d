"""Clustered buffer against a NumPy reference (several items of a batch per cluster, more than a cluster
holds, invalid ids); sampling uniform over non-empty clusters then within; jit/scan/vmap; donation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buffers.checks import BufferInputError
from buffers.clustered import make_clustered_buffer
from tests.conftest import SHIPPED

K, TC, MIN, SAMPLE_B = 3, 3, 2, 5
BATCHES = (1, 4, 9)
PROTO = {"obs": np.zeros(2, np.float32), "step": 0}
BUF = make_clustered_buffer(K, TC, min_size=MIN)


def make_items(start, n):
    k = np.arange(start, start + n)
    return {"obs": np.stack([k * 0.5, -k], 1).astype(np.float32), "step": k.astype(np.int32)}


def bump(item):
    return {"obs": item["obs"] + 1, "step": item["step"] * 10}


def at(tree, i):
    """Entry i of every leaf (an index into a leading batch/time axis)."""
    return jax.tree.map(lambda x: x[i], tree)


class RefClustered:
    """K plain NumPy circular buffers, items added one at a time in batch order."""

    def __init__(self):
        self.head, self.size = np.zeros(K, int), np.zeros(K, int)
        self.data = {"obs": np.zeros((K, TC, 2), np.float32), "step": np.zeros((K, TC), np.int32)}

    def add_batch(self, items, cluster_ids):
        for i, c in enumerate(cluster_ids):
            if not 0 <= c < K:
                continue
            for k in self.data:
                self.data[k][c, self.head[c]] = items[k][i]
            self.head[c] = (self.head[c] + 1) % TC
            self.size[c] = min(self.size[c] + 1, TC)

    def update(self):
        for c in range(K):
            for i in range(self.size[c]):
                new = bump({k: v[c, i] for k, v in self.data.items()})
                for k in self.data:
                    self.data[k][c, i] = new[k]


ADD = jax.jit(BUF.add)
ADD_BATCH = jax.jit(BUF.add_batch)
UPDATE = jax.jit(lambda s: BUF.update(s, bump))
SAMPLE = jax.jit(BUF.sample, static_argnums=2)
CAN_SAMPLE = jax.jit(BUF.can_sample)


def assert_matches(state, ref):
    np.testing.assert_array_equal(np.asarray(state.head), ref.head)
    np.testing.assert_array_equal(np.asarray(state.size), ref.size)
    for k in ref.data:
        np.testing.assert_array_equal(np.asarray(state.data[k]), ref.data[k])
    assert int(BUF.size(state)) == ref.size.sum()
    assert bool(CAN_SAMPLE(state)) == (ref.size.sum() >= MIN)


OPS = st.one_of(
    st.tuples(st.just("add"), st.integers(-1, K)),
    st.sampled_from(BATCHES).flatmap(
        lambda b: st.tuples(st.just("add_batch"), st.lists(st.integers(-1, K), min_size=b, max_size=b))
    ),
    st.tuples(st.just("update")),
    st.tuples(st.just("sample"), st.integers(0, 2**31 - 1)),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=12))
def test_matches_numpy_reference(ops):
    state, ref, counter = BUF.init(PROTO), RefClustered(), 1
    for op in ops:
        if op[0] == "add":
            items = make_items(counter, 1)
            state = ADD(state, jax.tree.map(lambda x: x[0], items), op[1])
            ref.add_batch(items, [op[1]])
            counter += 1
        elif op[0] == "add_batch":
            items = make_items(counter, len(op[1]))
            state = ADD_BATCH(state, items, jnp.asarray(op[1], jnp.int32))
            ref.add_batch(items, op[1])
            counter += len(op[1])
        elif op[0] == "update":
            state = UPDATE(state)
            ref.update()
        else:
            sample = SAMPLE(state, jax.random.key(op[1]), SAMPLE_B)
            cid, idx = np.asarray(sample.cluster_ids), np.asarray(sample.indices)
            if ref.size.sum() == 0:
                assert np.all(cid == 0) and np.all(idx == 0)
            else:
                assert np.all(ref.size[cid] > 0) and np.all(idx < ref.size[cid])
            for k in ref.data:
                np.testing.assert_array_equal(np.asarray(sample.items[k]), ref.data[k][cid, idx])
        assert_matches(state, ref)


def test_sampling_is_uniform_over_nonempty_clusters_then_within(chi_square):
    buf = make_clustered_buffer(4, 10)
    # cluster 0: 1 item, cluster 1: empty, cluster 2: 10 items (after wrap), cluster 3: 4 items.
    ids = np.array([0] + [2] * 13 + [3] * 4, np.int32)
    state = jax.jit(buf.add_batch)(buf.init(PROTO), make_items(0, ids.size), jnp.asarray(ids))
    sample = jax.jit(buf.sample, static_argnums=2)(state, jax.random.key(0), 150_000)
    cid, idx = np.asarray(sample.cluster_ids), np.asarray(sample.indices)
    counts = np.bincount(cid, minlength=4)
    assert counts[1] == 0
    assert chi_square(counts, np.array([1, 0, 1, 1])) > 1e-4
    assert chi_square(counts, np.array([1, 0, 10, 4])) < 1e-6  # not proportional to cluster size
    assert chi_square(np.bincount(idx[cid == 2], minlength=10), np.ones(10)) > 1e-4
    assert chi_square(np.bincount(idx[cid == 3], minlength=10), np.array([1, 1, 1, 1] + [0] * 6)) > 1e-4
    # the 13 items of cluster 2 wrapped: slots hold items 11..13 then 4..10 (steps are the batch positions)
    np.testing.assert_array_equal(np.asarray(state.data["step"][2]), [11, 12, 13, 4, 5, 6, 7, 8, 9, 10])


def test_empty_buffer_sample_and_can_sample():
    state = BUF.init(PROTO)
    sample = SAMPLE(state, jax.random.key(0), SAMPLE_B)
    assert not bool(CAN_SAMPLE(state))
    assert np.all(np.asarray(sample.cluster_ids) == 0) and np.all(np.asarray(sample.indices) == 0)
    assert not np.any(np.asarray(sample.items["obs"]))


def test_scan_and_vmap_match_single_steps():
    """A scan of add+sample steps, and that scan vmapped over seeds, equal the same steps called one by one."""

    def step(state, xs):
        items, ids, key = xs
        state = BUF.add_batch(state, items, ids)
        return state, BUF.sample(state, key, SAMPLE_B)

    def inputs(key):
        k_ids, k_sample = jax.random.split(key)
        items = jax.tree.map(lambda x: x.reshape((4, 4) + x.shape[1:]), make_items(1, 16))
        return items, jax.random.randint(k_ids, (4, 4), 0, K), jax.random.split(k_sample, 4)

    def run(key):
        return jax.lax.scan(step, BUF.init(PROTO), inputs(key))

    seeds = jax.random.split(jax.random.key(0), 2)
    batched = jax.jit(jax.vmap(run))(seeds)
    scanned = jax.jit(run)(seeds[0])
    jax.tree.map(np.testing.assert_array_equal, scanned, at(batched, 0))
    single = jax.jit(step)
    for i, seed in enumerate(seeds):
        state, xs = BUF.init(PROTO), inputs(seed)
        for t in range(4):
            state, sample = single(state, at(xs, t))
            jax.tree.map(np.testing.assert_array_equal, at(at(batched[1], i), t), sample)
        jax.tree.map(np.testing.assert_array_equal, at(batched[0], i), state)


def test_donated_add_keeps_storage_in_place(hlo):
    buf = make_clustered_buffer(8, 2000)
    state = buf.init(PROTO)
    ptrs = [x.unsafe_buffer_pointer() for x in jax.tree.leaves(state.data)]
    add_batch = jax.jit(buf.add_batch, donate_argnums=0)
    old = state
    state = add_batch(state, make_items(0, 64), jnp.arange(64, dtype=jnp.int32) % 8)
    state = jax.jit(buf.add, donate_argnums=0)(state, jax.tree.map(lambda x: x[0], make_items(0, 1)), 3)
    assert old.data["obs"].is_deleted()
    assert [x.unsafe_buffer_pointer() for x in jax.tree.leaves(state.data)] == ptrs
    np.testing.assert_array_equal(np.asarray(state.size), [8, 8, 8, 9, 8, 8, 8, 8])

    def step(state, key):
        state = buf.add_batch(state, make_items(0, 64), jnp.arange(64, dtype=jnp.int32) % 5)
        return state, buf.sample(state, key, 32)

    compiled = jax.jit(step, donate_argnums=0).lower(state, jax.random.key(0, impl="unsafe_rbg")).compile(SHIPPED)
    rep = hlo.in_place_report(compiled, state)
    assert rep["copies"] == [] and rep["passes"] == [] and rep["aliased"] and rep["whiles"] == []


def test_bad_inputs_fail_at_trace_time_with_clear_messages():
    state = BUF.init(PROTO)
    with pytest.raises(BufferInputError, match=r"cluster_ids: expected shape \(4,\), received \(3,\)"):
        ADD_BATCH(state, make_items(0, 4), jnp.zeros(3, jnp.int32))
    with pytest.raises(
        BufferInputError, match="cluster_ids: expected an integer array, received dtype float32"
    ):
        ADD_BATCH(state, make_items(0, 4), jnp.zeros(4))
    with pytest.raises(
        BufferInputError, match=r"items leaf \['obs'\]: expected shape \(4, 2\), received \(4, 1\)"
    ):
        ADD_BATCH(
            state,
            {"obs": np.zeros((4, 1), np.float32), "step": np.zeros(4, np.int32)},
            jnp.zeros(4, jnp.int32),
        )
    with pytest.raises(BufferInputError, match=r"cluster_id: expected shape rank 0, received \(1,\)"):
        ADD(state, {"obs": np.zeros(2, np.float32), "step": 0}, jnp.zeros(1, jnp.int32))
    with pytest.raises(
        BufferInputError, match=r"update fn output leaf \['obs'\]: expected shape \(2,\), received \(3,\)"
    ):
        BUF.update(state, lambda it: {**it, "obs": jnp.zeros(3)})
    with pytest.raises(ValueError, match="need num_clusters >= 1"):
        make_clustered_buffer(0, 4)
