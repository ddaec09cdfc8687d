"""Flat buffer against a NumPy reference under random operation sequences; jit/scan/vmap; in-place donation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buffers.checks import BufferInputError
from buffers.flat import make_flat_buffer, randint_below
from tests.conftest import SHIPPED

CAP, MIN, SAMPLE_B = 7, 3, 5
BATCHES = (2, 5, CAP)
PROTO = {"obs": np.zeros(2, np.float32), "step": 0, "flag": False}
BUF = make_flat_buffer(CAP, min_size=MIN)


def make_items(start, n):
    """n items whose `step` is a counter from `start`; None: one unbatched item."""
    k = np.arange(start, start + (n or 1))
    items = {
        "obs": np.stack([k * 0.5, -k], 1).astype(np.float32),
        "step": k.astype(np.int32),
        "flag": k % 3 == 0,
    }
    return jax.tree.map(lambda x: x[0], items) if n is None else items


def bump(item):
    return {"obs": item["obs"] * 2 + 1, "step": item["step"] + 100, "flag": ~item["flag"]}


def at(tree, i):
    """Entry i of every leaf (an index into a leading batch/time axis)."""
    return jax.tree.map(lambda x: x[i], tree)


class RefFlat:
    """Plain NumPy circular buffer, one item at a time."""

    def __init__(self, capacity):
        self.capacity, self.head, self.size = capacity, 0, 0
        self.data = {
            "obs": np.zeros((capacity, 2), np.float32),
            "step": np.zeros(capacity, np.int32),
            "flag": np.zeros(capacity, bool),
        }

    def add_batch(self, items):
        for i in range(len(items["step"])):
            for k in self.data:
                self.data[k][self.head] = items[k][i]
            self.head = (self.head + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def update(self, indices):
        for i in (
            sorted({int(i) for i in indices if 0 <= i < self.size})
            if indices is not None
            else range(self.size)
        ):
            new = bump({k: v[i] for k, v in self.data.items()})
            for k in self.data:
                self.data[k][i] = new[k]


ADD = jax.jit(BUF.add)
ADD_BATCH = jax.jit(BUF.add_batch)
UPDATE_ALL = jax.jit(lambda s: BUF.update(s, bump))
UPDATE_AT = jax.jit(lambda s, i: BUF.update(s, bump, i))
SAMPLE = jax.jit(BUF.sample, static_argnums=2)
CAN_SAMPLE = jax.jit(BUF.can_sample)
DATA = jax.jit(lambda state: state.data)


def assert_matches(state, ref):
    assert int(state.head) == ref.head and int(state.size) == ref.size
    data = jax.device_get(DATA(state))
    for k in ref.data:
        np.testing.assert_array_equal(data[k], ref.data[k], err_msg=k)
    assert bool(CAN_SAMPLE(state)) == (ref.size >= MIN)


OPS = st.one_of(
    st.tuples(st.just("add")),
    st.tuples(st.just("add_batch"), st.sampled_from(BATCHES)),
    st.tuples(st.just("update_at"), st.lists(st.integers(-2, CAP + 2), min_size=3, max_size=3)),
    st.tuples(st.just("update_all")),
    st.tuples(st.just("sample"), st.integers(0, 2**31 - 1)),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=12))
def test_matches_numpy_reference(ops):
    state, ref, counter = BUF.init(PROTO), RefFlat(CAP), 1
    for op in ops:
        if op[0] == "add":
            item = make_items(counter, None)
            state = ADD(state, item)
            ref.add_batch(jax.tree.map(lambda x: x[None], item))
            counter += 1
        elif op[0] == "add_batch":
            items = make_items(counter, op[1])
            state = ADD_BATCH(state, items)
            ref.add_batch(items)
            counter += op[1]
        elif op[0] == "update_at":
            state = UPDATE_AT(state, jnp.asarray(op[1], jnp.int32))
            ref.update(op[1])
        elif op[0] == "update_all":
            state = UPDATE_ALL(state)
            ref.update(None)
        else:
            sample = SAMPLE(state, jax.random.key(op[1]), SAMPLE_B)
            idx = np.asarray(sample.indices)
            assert np.all((idx >= 0) & (idx < max(ref.size, 1)))
            for k in ref.data:
                np.testing.assert_array_equal(np.asarray(sample.items[k]), ref.data[k][idx])
        assert_matches(state, ref)


def test_init_from_python_scalars_and_arrays():
    state = make_flat_buffer(4).init(
        {"a": 1.5, "b": 2, "c": True, "d": np.zeros((3,), np.uint8), "e": jnp.ones(2)}
    )
    got = {k: (v.shape, v.dtype) for k, v in jax.eval_shape(lambda s: s.data, state).items()}
    assert got == {
        "a": ((4,), jnp.float32),
        "b": ((4,), jnp.int32),
        "c": ((4,), jnp.bool_),
        "d": ((4, 3), jnp.uint8),
        "e": ((4, 2), jnp.float32),
    }
    assert int(state.head) == 0 and int(state.size) == 0


def test_empty_buffer_sample_is_row_zero_and_cannot_sample():
    state = BUF.init(PROTO)
    sample = SAMPLE(state, jax.random.key(0), SAMPLE_B)
    assert not bool(CAN_SAMPLE(state))
    assert np.all(np.asarray(sample.indices) == 0)
    for leaf in jax.tree.leaves(sample.items):
        assert leaf.shape[0] == SAMPLE_B and not np.any(np.asarray(leaf))


def test_sampling_is_uniform_over_stored_items(chi_square):
    state = ADD_BATCH(BUF.init(PROTO), make_items(1, 5))  # 5 of 7 slots filled
    idx = np.asarray(jax.jit(BUF.sample, static_argnums=2)(state, jax.random.key(1), 100_000).indices)
    assert idx.max() < 5
    assert chi_square(np.bincount(idx, minlength=5), np.ones(5)) > 1e-4
    assert (
        chi_square(np.bincount(idx, minlength=5), np.array([1.05, 1, 1, 1, 1])) < 1e-6
    )  # the test has power


def test_randint_below_is_uniform_and_in_range(chi_square):
    draw = jax.jit(randint_below, static_argnums=1)
    for n in (1, 7, 1000, 2**31 - 1):
        x = np.asarray(draw(jax.random.key(n), (200_000,), n))
        assert x.min() >= 0 and x.max() < n
        if 1 < n <= 1000:
            assert chi_square(np.bincount(x, minlength=n), np.ones(n)) > 1e-4
    per_slot = np.asarray(draw(jax.random.key(0), (4, 50_000), jnp.array([[1], [2], [3], [5]])))
    assert [int(r.max()) for r in per_slot] == [0, 1, 2, 4]
    # Exactly floor(n * X / 2**64) with X = hi * 2**32 + lo from the key's two words of bits (Python ints).
    key, n = jax.random.key(5), 2**31 - 1
    bits = np.asarray(jax.random.bits(key, (2, 64), jnp.uint32)).astype(object)
    expected = [(n * ((int(hi) << 32) + int(lo))) >> 64 for hi, lo in zip(bits[0], bits[1])]
    assert np.asarray(draw(key, (64,), n)).tolist() == expected


def test_scan_matches_python_loop():
    step = jax.jit(lambda s, items, k: BUF.add_and_sample(s, items, k, SAMPLE_B))
    keys = jax.random.split(jax.random.key(0), 6)
    items = jax.tree.map(lambda x: x.reshape((6, 3) + x.shape[1:]), make_items(1, 18))

    @jax.jit
    def scanned(state):
        return jax.lax.scan(lambda s, xs: step(s, xs[0], xs[1]), state, (items, keys))

    state_scan, samples = scanned(BUF.init(PROTO))
    samples = jax.device_get(samples)  # NumPy: indexed below without a compile
    state = BUF.init(PROTO)
    for t in range(6):
        state, sample = step(state, at(items, t), keys[t])
        np.testing.assert_array_equal(samples.indices[t], sample.indices)
        np.testing.assert_array_equal(samples.items["step"][t], sample.items["step"])
    jax.tree.map(np.testing.assert_array_equal, state_scan, state)


def test_vmap_over_seeds_matches_single_runs():
    def run(key):
        k1, k2, k3 = jax.random.split(key, 3)
        state = BUF.init(PROTO)
        items = make_items(1, 5)
        items["obs"] = jax.random.normal(k1, (5, 2))
        state = BUF.add_batch(state, items)
        state = BUF.update(state, bump, jax.random.randint(k2, (2,), 0, 5))
        state, sample = BUF.add_and_sample(state, make_items(6, 5), k3, SAMPLE_B)
        return state, sample, BUF.can_sample(state)

    keys = jax.random.split(jax.random.key(0), 3)
    batched = jax.device_get(jax.jit(jax.vmap(run))(keys))  # NumPy: indexed below without a compile
    single = jax.jit(run)
    for i, key in enumerate(keys):
        jax.tree.map(np.testing.assert_array_equal, at(batched, i), single(key))


def test_donated_writes_keep_the_storage_in_place():
    buf = make_flat_buffer(10_000)
    state = buf.init({"obs": np.zeros(16, np.float32), "a": 0})
    ptr = state.storage[0].unsafe_buffer_pointer()
    add = jax.jit(buf.add, donate_argnums=0)
    add_batch = jax.jit(buf.add_batch, donate_argnums=0)
    update = jax.jit(lambda s, i: buf.update(s, bump_obs, i), donate_argnums=0)
    old = state
    state = add(state, {"obs": jnp.ones(16), "a": 1})
    assert old.storage[0].is_deleted()
    state = add_batch(state, {"obs": jnp.ones((64, 16)), "a": jnp.arange(64)})
    state = update(state, jnp.arange(8))
    assert state.storage[0].unsafe_buffer_pointer() == ptr
    assert int(state.size) == 65 and float(np.asarray(jax.jit(lambda s: s.data)(state)["obs"])[3, 0]) == 2.0


def bump_obs(item):
    return {"obs": item["obs"] * 2, "a": item["a"]}


def add_and_sample_step(buf):
    items = {"obs": jnp.ones((128, 4)), "a": jnp.arange(128)}
    return lambda s, k: buf.add_and_sample(s, items, k, 256)


def test_compiled_donated_add_and_sample_is_in_place(hlo):
    buf = make_flat_buffer(50_000)
    state = buf.init({"obs": np.zeros(4, np.float32), "a": 0})
    step = add_and_sample_step(buf)
    # unsafe_rbg keys: threefry itself lowers to a fixed 5-round while loop on CPU, which would hide ours.
    rep = hlo.in_place_report(
        jax.jit(step, donate_argnums=0).lower(state, jax.random.key(0, impl="unsafe_rbg")).compile(SHIPPED), state
    )
    assert rep == {"whiles": [], "copies": [], "passes": [], "aliased": True, "temp_ok": True}
    rep = hlo.in_place_report(
        jax.jit(step, donate_argnums=0).lower(state, jax.random.key(0)).compile(SHIPPED), state
    )
    # jax rolls threefry into a loop on CPU unless rl/infra/xla_cpu.py unrolled it in this process: no other loop
    assert all(hlo.is_threefry_loop(w) for w in rep["whiles"]), rep["whiles"]
    assert rep["copies"] == [] and rep["aliased"]
    # The detector flags copies: without donation the storage is copied; a concatenating write rebuilds it.
    rep = hlo.in_place_report(
        jax.jit(step).lower(state, jax.random.key(0, impl="unsafe_rbg")).compile(SHIPPED), state
    )
    assert rep["copies"] and not rep["aliased"]

    def concat_step(s, k):
        new = s.packing.pack({"obs": jnp.ones((128, 4)), "a": jnp.arange(128)})
        return buf.sample(s.replace(storage=jax.tree.map(lambda x, y: jnp.concatenate([x[128:], y]), s.storage, new)), k, 256)

    rep = hlo.in_place_report(
        jax.jit(concat_step, donate_argnums=0).lower(state, jax.random.key(0, impl="unsafe_rbg")).compile(SHIPPED),
        state,
    )
    assert rep["passes"]


def test_bad_inputs_fail_at_trace_time_with_clear_messages():
    state = BUF.init(PROTO)
    with pytest.raises(
        BufferInputError, match=r"item leaf \['obs'\]: expected shape \(2,\), received \(3,\)"
    ):
        ADD(state, {"obs": np.zeros(3, np.float32), "step": 0, "flag": False})
    with pytest.raises(
        BufferInputError, match=r"item leaf \['step'\]: expected dtype int32, received float32"
    ):
        ADD(state, {"obs": np.zeros(2, np.float32), "step": np.float32(1), "flag": False})
    with pytest.raises(BufferInputError, match=r"item has the wrong tree structure"):
        ADD(state, {"obs": np.zeros(2, np.float32), "step": 0})
    with pytest.raises(
        BufferInputError, match=r"items leaf \['obs'\]: expected shape \(4, 2\), received \(4, 3\)"
    ):
        ADD_BATCH(
            state,
            {"obs": np.zeros((4, 3), np.float32), "step": np.zeros(4, np.int32), "flag": np.zeros(4, bool)},
        )
    with pytest.raises(BufferInputError, match="add_batch: a batch of 8 items exceeds the capacity 7"):
        ADD_BATCH(state, make_items(0, 8))
    with pytest.raises(
        BufferInputError, match=r"update fn output leaf \['step'\]: expected dtype int32, received float32"
    ):
        BUF.update(state, lambda it: {**it, "step": it["step"] * 1.5})
    with pytest.raises(
        BufferInputError, match="update indices: expected an integer array, received dtype float32"
    ):
        UPDATE_AT(state, jnp.zeros(3))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        make_flat_buffer(0)
    with pytest.raises(ValueError, match=r"min_size must be in \[1, capacity=7\], got 8"):
        make_flat_buffer(7, min_size=8)
