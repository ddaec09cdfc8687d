"""Packing of item leaves into uint32 words (buffers/packing.py), against NumPy byte views."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from buffers import BufferInputError, make_flat_buffer
from buffers.flat import gather_items
from buffers.packing import SEPARATE_WORDS, packing_of
from rl.infra import xla_cpu
from tests.conftest import SHIPPED

RNG = np.random.default_rng(0)


def random_leaf(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    return RNG.integers(0, 256, shape + (dtype.itemsize,), dtype=np.uint8).view(dtype).reshape(shape)


ITEM = {  # one leaf of every supported width, odd byte counts, a scalar, an empty leaf
    "f32": (3,), "i32": (), "u32": (2,), "bool": (), "u8": (5,), "i8": (), "f16": (2, 3), "bf16": (1,),
    "u16": (3,), "empty": (0,), "bool3": (3,), "bool6": (2, 3),
}
DTYPES = {"f32": np.float32, "i32": np.int32, "u32": np.uint32, "bool": np.bool_, "u8": np.uint8, "i8": np.int8,
          "f16": np.float16, "bf16": ml_dtypes.bfloat16, "u16": np.uint16, "empty": np.float32,
          "bool3": np.bool_, "bool6": np.bool_}


def items(lead):
    return {k: random_leaf(lead + s, DTYPES[k]) for k, s in ITEM.items()}


def assert_bits_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def test_pack_then_unpack_returns_every_bit_of_every_dtype():
    proto = jax.tree.map(lambda x: x[0, 0], items((1, 1)))
    p = packing_of(proto)
    x = items((4, 3))  # random bit patterns: NaNs with payloads, signed zeros, subnormals
    storage = jax.jit(p.pack)(x)
    (words,) = storage  # every leaf is small: one packed array
    # words per leaf: f32 3, i32 1, u32 2, bool 1 (1 byte padded), u8 2 (5 bytes), i8 1, f16 3, bf16 1, u16 2,
    # bool3 1 (3 bytes in one word), bool6 2
    assert words.shape == (4, 3, 19) and words.dtype == jnp.uint32
    out = jax.jit(p.unpack)(storage)
    for k in ITEM:
        assert_bits_equal(out[k], x[k])
    # A leaf's words are its bytes (little-endian rows, zero padding): u8's 5 bytes fill 2 words.
    o = p.offsets[sorted(ITEM).index("u8")]
    u8_bytes = np.asarray(words)[..., o : o + 2].view(np.uint8)
    np.testing.assert_array_equal(u8_bytes[..., :5], x["u8"])
    assert not u8_bytes[..., 5:].any()


def test_8_byte_leaves_take_two_words_each_with_x64():
    """float64 / int64 leaves (x64 on) are stored as two words per value and read back bit-exactly, whole-row
    and leaf by leaf; a 4-byte leaf beside them keeps one word per value."""
    with jax.enable_x64(True):
        x = {"d": random_leaf((6, 3), np.float64), "i": random_leaf((6,), np.int64), "f": random_leaf((6, 2), np.float32)}
        p = packing_of(jax.tree.map(lambda a: a[0], x))
        assert p.widths == (6, 2, 2)
        storage = jax.jit(p.pack)(x)
        idx = np.asarray([[5, 0], [2, 2]], np.int32)
        for got, want in ((jax.jit(p.unpack)(storage), x),
                          (jax.jit(p.take_leaves)(storage, idx), {k: v[idx] for k, v in x.items()})):
            for k in x:
                assert_bits_equal(got[k], want[k])


def test_a_leaf_over_a_cache_line_keeps_its_own_array():
    proto = {"frame": np.zeros((84, 84, 4), np.uint8), "edge": np.zeros(SEPARATE_WORDS, np.float32),
             "over": np.zeros(SEPARATE_WORDS + 1, np.float32), "r": np.float32(0)}
    p = packing_of(proto)
    assert p.packed == (True, False, False, True)  # edge, frame, over, r (sorted keys)
    storage = p.zeros((7,))
    assert [(a.shape, a.dtype) for a in storage] == [((7, SEPARATE_WORDS + 1), jnp.uint32),
                                                    ((7, 84, 84, 4), jnp.uint8), ((7, SEPARATE_WORDS + 1), jnp.float32)]
    x = {"frame": random_leaf((7, 84, 84, 4), np.uint8), "edge": random_leaf((7, SEPARATE_WORDS), np.float32),
         "over": random_leaf((7, SEPARATE_WORDS + 1), np.float32), "r": random_leaf((7,), np.float32)}
    stored = jax.jit(p.pack)(x)
    assert_bits_equal(stored[1], x["frame"])  # the frame is stored as given, no bitcast
    out = jax.jit(p.unpack)(stored)
    for k, v in x.items():
        assert_bits_equal(out[k], v)


def test_a_flat_buffer_of_frames_and_small_leaves_samples_what_numpy_indexing_gives():
    buf = make_flat_buffer(50)
    proto = {"obs": np.zeros((84, 84, 4), np.uint8), "action": np.int32(0), "reward": np.float32(0),
             "done": False}
    state = buf.init(proto)
    ref = {k: np.zeros((50,) + np.shape(v), np.asarray(v).dtype) for k, v in proto.items()}
    add = jax.jit(buf.add_batch)
    for start in range(0, 70, 10):  # wraps once
        batch = {k: random_leaf((10,) + np.shape(v), np.asarray(v).dtype) for k, v in proto.items()}
        state = add(state, batch)
        for k, v in ref.items():
            v[np.arange(start, start + 10) % 50] = batch[k]
    sample = jax.jit(buf.sample, static_argnums=2)(state, jax.random.key(3), 64)
    idx, data = np.asarray(sample.indices), jax.jit(lambda state: state.data)(state)
    for k, v in ref.items():
        assert_bits_equal(sample.items[k], v[idx])
        assert_bits_equal(data[k], v)


def test_leafwise_take_reads_what_whole_row_take_reads():
    """`take_leaves` (one gather per leaf, for windows) returns every bit `take` does, for every dtype, a
    large leaf kept apart, an empty leaf, and indices past the end (clamped, like `take`)."""
    lead = items((1,))
    proto = {**jax.tree.map(lambda x: x[0], lead), "frame": np.zeros((5, 20), np.uint8)}
    p = packing_of(proto)
    x = {**items((30,)), "frame": random_leaf((30, 5, 20), np.uint8)}
    storage = jax.jit(p.pack)(x)
    idx = jnp.asarray(RNG.integers(0, 33, (4, 7)), jnp.int32)
    got, want = jax.jit(p.take_leaves)(storage, idx), jax.jit(p.take)(storage, idx)
    clamped = np.clip(np.asarray(idx), 0, 29)
    for k in x:
        assert_bits_equal(got[k], want[k])
        assert_bits_equal(got[k], x[k][clamped])


def test_a_window_leaf_nobody_reads_is_never_gathered():
    """n-step rewards read one leaf of their windows: the compiled program gathers that leaf's word alone."""
    from buffers import rows

    state = rows.init_rows({"obs": np.zeros(4, np.float32), "reward": np.float32(0), "done": False}, 3, 10)
    fn = jax.jit(lambda r, e, t: rows.gather(r, e, t, length=5)["reward"])
    text = fn.lower(state, jnp.zeros(8, jnp.int32), jnp.zeros(8, jnp.int32)).compile(SHIPPED).as_text()
    sizes = re.findall(r"slice_sizes=\{([\d,]+)\}", text)
    assert sizes == ["1,1"], sizes


def test_a_sample_of_small_items_is_one_gather():
    """The point of packing: a CartPole transition's five leaves are read with one gather, not five."""
    buf = make_flat_buffer(1000)
    proto = {"obs": np.zeros(4, np.float32), "action": np.int32(0), "reward": np.float32(0), "done": False,
             "next_obs": np.zeros(4, np.float32)}
    state = buf.init(proto)
    hlo = jax.jit(gather_items).lower(state, jnp.zeros(256, jnp.int32)).as_text()
    assert hlo.count("\"stablehlo.gather\"") == 1
    hlo = jax.jit(buf.add_batch).lower(state, jax.tree.map(lambda x: jnp.zeros((8,) + np.shape(x),
                                                                              np.asarray(x).dtype), proto)).as_text()
    assert hlo.count("\"stablehlo.scatter\"") == 1


def test_an_unsupported_dtype_is_named_with_its_leaf():
    with pytest.raises(BufferInputError, match=r"prototype leaf \['z'\]: dtype complex64 cannot be stored"):
        make_flat_buffer(4).init({"x": np.float32(0), "z": np.complex64(0)})


def test_a_gather_never_recomputes_the_random_draw_of_its_indices():
    """XLA:CPU would fuse the threefry draw of uniform indices (its xors) into the gather of rows and redo it
    for every gathered element (`computed_once`)."""
    xla_cpu.unroll_threefry()  # as every run does: the rolled draw is a while loop, which never fuses
    proto = {"obs": np.zeros(4, np.float32), "action": np.int32(0), "reward": np.float32(0), "done": False,
             "next_obs": np.zeros(4, np.float32)}
    buf = make_flat_buffer(1000)
    text = jax.jit(lambda s, k: buf.sample(s, k, 256).items).lower(buf.init(proto), jax.random.key(0)).compile(SHIPPED)
    index_ops = [ops for c in text.as_text().split("\n\n") for ops in gather_index_ops(c)]
    assert index_ops and not [ops for ops in index_ops if "xor" in ops], index_ops


def gather_index_ops(computation: str):
    """For each gather of rows (more than one element per index) in one HLO computation, the opcodes computing
    its indices inside that computation (what the gather's loop recomputes for every element of a row)."""
    defs, rows = {}, set()
    for line in computation.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.-]+) = [^ ]+ ([\w-]+)\(([^)]*)\)", line)
        if m:
            defs[m[1]] = (m[2], re.findall(r"%([\w.-]+)", m[3]))
            sizes = re.search(r"slice_sizes=\{([\d,]+)\}", line)
            if m[2] == "gather" and sizes and np.prod([int(x) for x in sizes[1].split(",")]) > 1:
                rows.add(m[1])
    for name, (opcode, operands) in defs.items():
        if name in rows:
            seen, todo = set(), [operands[1]]
            while todo:
                name = todo.pop()
                if name in defs and name not in seen:
                    seen.add(name)
                    todo += defs[name][1]
            yield {defs[n][0] for n in seen}
