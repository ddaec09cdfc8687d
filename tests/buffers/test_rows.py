"""Per-env rows (buffers/rows.py) against a plain NumPy reference; the reference model also serves the
sequence, online-queue and n-step tests (imported from here)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import checkify

from buffers import checks
from buffers.checks import BufferInputError
from buffers.rows import make_row_buffer
from buffers.sequences import make_sequence_buffer

E, T = 3, 7
STRIDE = 1000  # counter = env * STRIDE + absolute step: proves env and time of every stored item


class RowsRef:
    """Plain-Python model of per-env rows: the full history of every env, never forgotten."""

    def __init__(self, num_envs: int, capacity: int):
        self.E, self.T = num_envs, capacity
        self.hist = [[] for _ in range(num_envs)]  # per env: list of step dicts (numpy scalars/arrays)

    def accepted(self, env_ids, mask=None) -> list[tuple[int, int]]:
        """(entry, env) pairs an add stores: unmasked, id in [0, E), the last entry of each repeated id."""
        last = {}
        for i, e in enumerate(np.asarray(env_ids).tolist()):
            if (mask is None or bool(np.asarray(mask)[i])) and 0 <= e < self.E:
                last[e] = i
        return sorted((i, e) for e, i in last.items())

    def add(self, steps: dict, env_ids, mask=None):
        for i, e in self.accepted(env_ids, mask):
            self.hist[e].append({k: np.asarray(v)[i] for k, v in steps.items()})

    def written(self, e: int) -> int:
        return len(self.hist[e])

    def present(self, e: int) -> range:
        w = self.written(e)
        return range(max(0, w - self.T), w)

    def storage(self, key: str, zeros: np.ndarray) -> np.ndarray:
        """Expected `[E, T, ...]` storage of leaf `key` (zeros where never written)."""
        out = zeros.copy()
        for e in range(self.E):
            for a in self.present(e):
                out[e, a % self.T] = self.hist[e][a][key]
        return out

    def abs_of_slot(self, slot: int) -> int | None:
        """Absolute step held at flat slot e*T + pos, or None if never written."""
        e, pos = divmod(int(slot), self.T)
        hits = [a for a in self.present(e) if a % self.T == pos]
        return hits[0] if hits else None


def make_steps(ref: RowsRef, env_ids, rng, done_p=0.25):
    """Steps [N] whose `x` is the counter env*STRIDE + abs step each entry will get (masked ones too)."""
    env_ids = np.asarray(env_ids)
    x = np.array([e * STRIDE + ref.written(int(e)) if 0 <= e < ref.E else -1 for e in env_ids], np.int32)
    return {"x": x, "v": rng.normal(size=(len(env_ids), 2)).astype(np.float32),
            "done": rng.random(len(env_ids)) < done_p}


PROTO = {"x": np.int32(0), "v": np.zeros(2, np.float32), "done": False}


@functools.cache
def row_buffer_fns():
    buf = make_row_buffer(E, T)
    return buf, jax.jit(buf.add), jax.jit(buf.peek)


@given(ops=st.lists(st.tuples(st.permutations(range(E)), st.lists(st.booleans(), min_size=E, max_size=E)),
                    min_size=1, max_size=40), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_rows_match_reference_under_async_writes(ops, seed):
    """Random env subsets in random order (mask), with wrap-around: storage, written and peek match."""
    buf, add, peek = row_buffer_fns()
    rng = np.random.default_rng(seed)
    state, ref = buf.init(PROTO), RowsRef(E, T)
    for perm, mask in ops:
        ids = np.array(perm, np.int32)
        steps = make_steps(ref, ids, rng)
        state = add(state, steps, ids, np.array(mask))
        ref.add(steps, ids, mask)
    check_rows(state, ref, peek(state, np.arange(E, dtype=np.int32)))
    assert int(buf.size(state)) == sum(min(ref.written(e), T) for e in range(E))


_rows_data = jax.jit(lambda state: state.data)


def check_rows(state, ref: RowsRef, peeked):
    """written, every leaf of the storage and the latest step of every written row match the reference."""
    np.testing.assert_array_equal(state.written, [ref.written(e) for e in range(ref.E)])
    data = jax.device_get(_rows_data(state))
    for key in ("x", "v", "done"):
        want = ref.storage(key, np.zeros_like(data[key]))
        np.testing.assert_array_equal(data[key], want)
    for e in range(ref.E):
        if ref.written(e):
            assert peeked["x"][e] == ref.hist[e][-1]["x"]
            np.testing.assert_array_equal(peeked["v"][e], ref.hist[e][-1]["v"])


BAD_IDS = st.lists(st.integers(-2, E + 1), min_size=E + 2, max_size=E + 2)  # out of range and repeated


@given(ops=st.lists(st.tuples(BAD_IDS, st.lists(st.booleans(), min_size=E + 2, max_size=E + 2)),
                    min_size=1, max_size=25), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=30, deadline=None)
def test_out_of_range_ids_are_dropped_and_the_last_duplicate_is_kept(ops, seed):
    """Ids < 0 or >= E write nothing and advance no row (-1 used to wrap to the last row); of a repeated id
    the last entry is stored and its row advances once (it used to advance once per entry)."""
    buf, add, peek = row_buffer_fns()
    rng = np.random.default_rng(seed)
    state, ref = buf.init(PROTO), RowsRef(E, T)
    for ids, mask in ops:
        ids = np.array(ids, np.int32)
        steps = make_steps(ref, ids, rng)
        state = add(state, steps, ids, np.array(mask))
        ref.add(steps, ids, mask)
    check_rows(state, ref, peek(state, np.arange(E, dtype=np.int32)))


def test_rows_scan_and_vmap_match_python_loop():
    buf = make_row_buffer(E, T)
    rng = np.random.default_rng(0)
    K = 12
    ids = np.stack([rng.permutation(E) for _ in range(K)]).astype(np.int32)
    masks = rng.random((K, E)) < 0.7
    xs = {"x": rng.integers(0, 100, (K, E)).astype(np.int32), "v": rng.normal(size=(K, E, 2)).astype(np.float32),
          "done": rng.random((K, E)) < 0.3}
    def at(tree, t):
        return jax.tree_util.tree_map(lambda a: a[t], tree)

    add, peek = jax.jit(buf.add), jax.jit(buf.peek)
    looped = buf.init(PROTO)
    for t in range(K):
        looped = add(looped, at(xs, t), ids[t], masks[t])

    def body(s, inp):
        steps, i, m = inp
        return buf.add(s, steps, i, m), None

    scanned, _ = jax.jit(lambda s: jax.lax.scan(body, s, (xs, ids, masks)))(buf.init(PROTO))
    jax.tree_util.tree_map(np.testing.assert_array_equal, scanned, looped)

    # vmap over 2 "seeds": the second seed writes different data; each equals its own loop.
    xs2 = jax.tree_util.tree_map(lambda a: np.stack([a, a[::-1]]), xs)
    batched = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), buf.init(PROTO))
    vscan = jax.jit(jax.vmap(lambda s, x: jax.lax.scan(body, s, (x, ids, masks))[0]))(batched, xs2)
    jax.tree_util.tree_map(lambda b, one: np.testing.assert_array_equal(b[0], one), vscan, looped)
    looped2 = buf.init(PROTO)
    for t in range(K):
        looped2 = add(looped2, at(xs, K - 1 - t), ids[t], masks[t])
    jax.tree_util.tree_map(lambda b, one: np.testing.assert_array_equal(b[1], one), vscan, looped2)
    peeked = jax.jit(jax.vmap(buf.peek, in_axes=(0, None)))(vscan, np.arange(E, dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(peeked["x"])[0], peek(looped, np.arange(E))["x"])


def test_rows_donated_add_is_in_place():
    buf = make_row_buffer(4, 50)
    proto = {"obs": np.zeros((8, 8), np.uint8), "r": np.float32(0)}
    add = jax.jit(buf.add, donate_argnums=0)
    state = buf.init(proto)
    ptrs = [x.unsafe_buffer_pointer() for x in state.storage]
    for t in range(3):
        steps = {"obs": np.full((2, 8, 8), t, np.uint8), "r": np.ones(2, np.float32)}
        state = add(state, steps, np.array([3, 1], np.int32))
        assert [x.unsafe_buffer_pointer() for x in state.storage] == ptrs
    assert list(np.asarray(state.written)) == [0, 3, 0, 3]


@pytest.mark.parametrize("make", [lambda: make_row_buffer(E, T), lambda: make_sequence_buffer(E, T, 3)])
def test_bad_steps_fail_at_trace_time_naming_the_leaf(make):
    buf = make()
    state = buf.init(PROTO)
    ids = np.arange(2, dtype=np.int32)
    good = {"x": np.zeros(2, np.int32), "v": np.zeros((2, 2), np.float32), "done": np.zeros(2, bool)}
    with pytest.raises(BufferInputError, match=r"\['v'\].*expected shape \(2, 2\), received \(2, 3\)"):
        jax.jit(buf.add)(state, {**good, "v": np.zeros((2, 3), np.float32)}, ids)
    with pytest.raises(BufferInputError, match=r"\['x'\].*expected dtype int32, received float32"):
        buf.add(state, {**good, "x": np.zeros(2, np.float32)}, ids)
    with pytest.raises(BufferInputError, match="wrong tree structure"):
        buf.add(state, {"x": good["x"], "v": good["v"]}, ids)
    with pytest.raises(BufferInputError, match=r"\['done'\].*expected shape \(3,\), received \(2,\)"):
        buf.add(state, good, np.arange(3, dtype=np.int32))  # leading dim must match env_ids
    with pytest.raises(BufferInputError, match="env_ids: expected an integer array"):
        buf.add(state, good, np.arange(2, dtype=np.float32))
    with pytest.raises(BufferInputError, match="mask: expected shape"):
        buf.add(state, good, ids, np.ones(3, bool))
    with pytest.raises(BufferInputError, match="mask: expected dtype bool"):
        buf.add(state, good, ids, np.ones(2, np.int32))


@pytest.mark.parametrize("make", [lambda: make_row_buffer(E, T, debug=True),
                                  lambda: make_sequence_buffer(E, T, 3, debug=True)])
def test_debug_flag_rejects_bad_env_ids_under_checkify(make):
    buf = make()
    state = buf.init(PROTO)
    steps = {"x": np.zeros(2, np.int32), "v": np.zeros((2, 2), np.float32), "done": np.zeros(2, bool)}
    checked = jax.jit(checkify.checkify(buf.add))
    err, _ = checked(state, steps, np.array([0, E], np.int32))
    with pytest.raises(checkify.JaxRuntimeError, match=rf"env_ids out of range \[0, {E}\)"):
        err.throw()
    err, _ = checked(state, steps, np.array([1, 1], np.int32))
    with pytest.raises(checkify.JaxRuntimeError, match="env_ids must be distinct"):
        err.throw()
    err, _ = checked(state, steps, np.array([-1, 1], np.int32), np.array([True, False]))
    with pytest.raises(checkify.JaxRuntimeError, match="out of range"):
        err.throw()
    # Masked-out entries may carry any id (e.g. padding): duplicates or out of range among them are fine.
    err, out = checked(state, steps, np.array([1, 1], np.int32), np.array([True, False]))
    assert err.get() is None
    written = out.written if hasattr(out, "written") else out.rows.written
    assert list(np.asarray(written)) == [0, 1, 0]
    err, _ = checked(state, steps, np.array([2, 9], np.int32), np.array([True, False]))
    assert err.get() is None
    # Eagerly (no jit) the check raises directly.
    with pytest.raises(checkify.JaxRuntimeError, match="out of range"):
        buf.add(state, steps, np.array([0, 5], np.int32))
    err, _ = jax.jit(checkify.checkify(buf.peek))(state, np.array([0, 7], np.int32))
    with pytest.raises(checkify.JaxRuntimeError, match="out of range"):
        err.throw()


def test_masked_entries_write_nothing_even_with_garbage_ids():
    buf = make_sequence_buffer(E, T, 3, priority_exponent=0.5)
    state = buf.init(PROTO)
    steps = {"x": np.array([7, 8, 9], np.int32), "v": np.zeros((3, 2), np.float32), "done": np.zeros(3, bool)}
    before = state
    state = jax.jit(buf.add)(state, steps, np.array([1, 1, 99], np.int32), np.array([True, False, False]))
    assert list(np.asarray(state.rows.written)) == [0, 1, 0]
    x = np.asarray(_rows_data(state.rows)["x"])
    assert int(x[1, 0]) == 7
    assert int(np.sum(x != 0)) == 1
    assert float(np.asarray(state.weights.tree.levels[-1])[E * T]) == 0.0  # the dummy leaf stays empty
    np.testing.assert_array_equal(np.asarray(before.weights.done), np.asarray(state.weights.done))


@pytest.mark.parametrize("window", [1, 4])  # packed rows; rows laid out for windows of 4 (mirrored, leaves apart)
def test_gather_reads_steps_and_windows_like_numpy_indexing(window):
    """`rows.gather` at `(env, position)` and its windows of `length` steps forward in time (wrapping at T):
    `data[e, p]` and `data[e, (p + arange(L)) % T]`, for every leaf. Rows laid out for windows hold each
    leaf apart, `[E, T + L - 1]`, their first L - 1 positions repeated after position T - 1."""
    from buffers import rows as rows_lib

    rng = np.random.default_rng(0)
    E, T, L = 3, 7, 4
    state = rows_lib.init_rows(checks.as_prototype(PROTO), E, T, window)
    write = jax.jit(lambda s, steps, ids: rows_lib.write(s, steps, ids, jnp.ones(ids.shape, bool))[0])
    for _ in range(12):  # wraps every row
        ids = rng.permutation(E).astype(np.int32)
        steps = {"x": rng.integers(0, 99, E).astype(np.int32), "v": rng.normal(size=(E, 2)).astype(np.float32),
                 "done": rng.random(E) < 0.5}
        state = write(state, steps, ids)
    data = jax.device_get(_rows_data(state))
    if window > 1:
        assert len(state.storage) == 3 and all(x.shape[:2] == (E, T + L - 1) for x in state.storage)
        for x in state.storage:
            np.testing.assert_array_equal(np.asarray(x)[:, T:], np.asarray(x)[:, : L - 1])
    env, pos = rng.integers(0, E, 20).astype(np.int32), rng.integers(0, T, 20).astype(np.int32)
    one = jax.jit(rows_lib.gather)(state, env, pos)
    window = jax.jit(rows_lib.gather, static_argnums=3)(state, env, pos, L)
    for k, leaf in data.items():
        np.testing.assert_array_equal(np.asarray(one[k]), leaf[env, pos])
        np.testing.assert_array_equal(np.asarray(window[k]), leaf[env[:, None], (pos[:, None] + np.arange(L)) % T])


def test_smallest_rows_hold_one_step_of_one_env_and_empty_sizes_are_rejected():
    """num_envs = capacity_per_env = 1 is a valid buffer (each add replaces the one step); 0 of either fails
    naming both sizes."""
    buf = make_row_buffer(1, 1)
    state, add = buf.init(PROTO), jax.jit(buf.add)
    for i in range(3):
        state = add(state, {"x": np.array([i], np.int32), "v": np.zeros((1, 2), np.float32),
                            "done": np.array([False])}, np.array([0], np.int32))
    assert int(np.asarray(state.written)[0]) == 3 and int(jax.jit(buf.size)(state)) == 1
    assert int(np.asarray(jax.jit(buf.peek)(state, np.array([0], np.int32))["x"])[0]) == 2
    for e, t in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match="num_envs >= 1 and capacity_per_env >= 1"):
            make_row_buffer(e, t)
