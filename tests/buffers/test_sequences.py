"""Sequence buffer (buffers/sequences.py) against a plain NumPy reference under random operation sequences."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from buffers import sumtree
from buffers.checks import BufferInputError
from buffers.sequences import make_sequence_buffer
from tests.buffers.test_rows import PROTO, STRIDE, RowsRef, make_steps

E, T, L = 3, 8, 3  # T a multiple of 2 but not 3: tree strides 2 (period 2) and 1 (period 3)

CONFIGS = [
    {},
    {"period": 2, "cross_episodes": False, "length_power": 1.0},
    {"start": "episode", "cross_episodes": False, "complete_only": True, "priority_exponent": 0.6},
    {"period": 3, "priority_exponent": 1.0, "length_power": 0.5, "complete_only": True},
    {"start": "episode", "length_power": 2.0},
    {"period": 2, "start": "episode", "cross_episodes": False, "priority_exponent": 0.5, "length_power": 1.0},
    {"period": 2, "length_power": 1.5},  # counted weights (no sum tree), like 0
    {"period": 3, "cross_episodes": False},  # counted, masks capped from gathered done flags
    {"period": 2, "cross_episodes": False, "layout": "packed"},  # rows packed, windows gathered step by step
    {"start": "episode", "priority_exponent": 0.6, "layout": "packed"},
]


class SeqRef(RowsRef):
    """Reference sequence semantics: remaining, eligibility, priorities and weights from the full history."""

    def __init__(self, cfg: dict, num_envs=E, capacity=T, length=L):
        super().__init__(num_envs, capacity)
        self.L = length
        self.period = cfg.get("period", 1)
        self.start = cfg.get("start", "any")
        self.cross = cfg.get("cross_episodes", True)
        self.complete = cfg.get("complete_only", False)
        self.power = cfg.get("length_power", 0.0)
        self.alpha = cfg.get("priority_exponent")
        self.stride = self.period if capacity % self.period == 0 else 1  # tree stride (tree_weights.py)
        self.prio = np.zeros(num_envs * capacity)  # priority ** alpha per slot
        self.max_p = 1.0

    def done(self, e, a) -> bool:
        return bool(self.hist[e][a]["done"])

    def add(self, steps, env_ids, mask=None):
        for i, e in self.accepted(env_ids, mask):
            if self.alpha is not None:
                self.prio[e * self.T + self.written(e) % self.T] = self.max_p ** self.alpha
            self.hist[e].append({k: np.asarray(v)[i] for k, v in steps.items()})

    def set_priorities(self, slots, priorities):
        for s, p in zip(slots, priorities):
            p = float(p) if np.isfinite(p) and p > 0 else 0.0  # NaN, +-inf and negatives count as 0
            if 0 <= s < self.E * self.T and s % self.T % self.stride == 0:  # else ignored, max not raised
                self.prio[int(s)] = p ** self.alpha
                self.max_p = max(self.max_p, p)

    def remaining(self, e, a) -> int:
        if a not in self.present(e):
            return 0
        r = min(self.L, self.written(e) - a)
        if not self.cross:
            for i in range(r):
                if self.done(e, a + i):
                    return i + 1
        return r

    def eligible(self, e, a) -> bool:
        r = self.remaining(e, a)
        return (r > 0 and a % self.period == 0
                and (self.start == "any" or a == 0 or self.done(e, a - 1))
                and (not self.complete or r == self.L or self.done(e, a + r - 1)))

    def weights(self) -> np.ndarray:
        w = np.zeros(self.E * self.T)
        for e in range(self.E):
            for a in self.present(e):
                slot = e * self.T + a % self.T
                if self.eligible(e, a):
                    w[slot] = float(self.remaining(e, a)) ** self.power
                    if self.alpha is not None:
                        w[slot] *= self.prio[slot]
        return w

    def remaining_array(self) -> np.ndarray:
        """remaining per slot; -1 where the buffer does not track it (starts off the period)."""
        r = np.zeros(self.E * self.T, np.int64)
        for e in range(self.E):
            for a in self.present(e):
                r[e * self.T + a % self.T] = self.remaining(e, a) if a % self.period == 0 else -1
        return r


def check_sequences(sample, ref: SeqRef, weights: np.ndarray | None, x_key="x"):
    """Every sampled sequence: an eligible start, the reference mask, the reference data in its valid part
    (the counter proves it is contiguous in time and from one env), and the episode rules."""
    sample = jax.tree_util.tree_map(np.asarray, sample)  # one transfer, then plain NumPy indexing
    total = None if weights is None else weights.sum()
    for b in range(len(sample.slots)):
        slot, e = int(sample.slots[b]), int(sample.env_ids[b])
        assert slot // ref.T == e
        a = ref.abs_of_slot(slot)
        assert a is not None, "sampled a slot never written"
        rem = ref.remaining(e, a)
        assert ref.eligible(e, a), (e, a)
        np.testing.assert_array_equal(sample.mask[b], np.arange(ref.L) < rem)
        x = np.asarray(sample.data[x_key][b][:rem])
        np.testing.assert_array_equal(x, e * STRIDE + a + np.arange(rem))  # contiguous, one env
        np.testing.assert_array_equal(sample.data["v"][b][:rem], np.stack([ref.hist[e][a + i]["v"] for i in range(rem)]))
        dones = np.asarray(sample.data["done"][b][:rem])
        if not ref.cross:
            assert not dones[:-1].any(), "sequence crosses an episode boundary"
        assert a % ref.period == 0
        if ref.start == "episode":
            assert a == 0 or ref.done(e, a - 1)
        if weights is not None:
            np.testing.assert_allclose(float(sample.probabilities[b]), weights[slot] / total, rtol=1e-4)


def jitted(buf) -> SimpleNamespace:
    """The buffer's ops, each jitted once (tests reuse them across calls and hypothesis examples)."""
    names = ["add", "set_priorities", "can_sample", "consume_online", "can_sample_online", "peek", "weights"]
    ops = {n: jax.jit(getattr(buf, n)) for n in names}
    for n in ("sample", "sample_starts", "sample_online"):
        ops[n] = jax.jit(getattr(buf, n), static_argnums=2)
    ops["sample_mixed"] = jax.jit(buf.sample_mixed, static_argnums=(2, 3))
    return SimpleNamespace(buf=buf, init=buf.init, **ops)


@functools.cache
def fns(i: int) -> SimpleNamespace:
    return jitted(make_sequence_buffer(E, T, L, **CONFIGS[i]))


def op_strategy():
    add = st.tuples(st.just("add"), st.permutations(range(E)), st.lists(st.booleans(), min_size=E, max_size=E))
    other = st.tuples(st.sampled_from(["sample", "prio", "prio"]), st.integers(0, 2**16), st.none())
    return st.lists(st.one_of(add, add, add, other), min_size=1, max_size=45)


@given(cfg=st.integers(0, len(CONFIGS) - 1), ops=op_strategy(), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_sequences_match_reference(cfg, ops, seed):
    """Weights, remaining lengths and samples agree with the reference after every operation, across
    wrap-around, uneven rows (random env subsets in random order) and episode boundaries."""
    j = fns(cfg)
    buf, add, sample, set_prio = j.buf, j.add, j.sample, j.set_priorities
    rng = np.random.default_rng(seed)
    state, ref = buf.init(PROTO), SeqRef(CONFIGS[cfg])
    for kind, arg, mask in ops:
        if kind == "add":
            ids = np.array(arg, np.int32)
            steps = make_steps(ref, ids, rng, done_p=0.3)
            state = add(state, steps, ids, np.array(mask))
            ref.add(steps, ids, mask)
        elif kind == "prio" and ref.alpha is not None:
            slots = rng.choice(E * T, size=4, replace=False).astype(np.int32)
            p = rng.choice([0.0, 0.5, 1.0, 3.0], size=4).astype(np.float32)
            state = set_prio(state, slots, p)
            ref.set_priorities(slots, p)
        elif kind == "sample":
            w = ref.weights()
            s = sample(state, jax.random.key(arg), 8)
            assert bool(j.can_sample(state)) == (w.sum() > 0)
            if w.sum() > 0:
                check_sequences(s, ref, w)
            else:
                assert not np.asarray(s.mask).any() and not np.asarray(s.probabilities).any()
    w = ref.weights()
    np.testing.assert_allclose(np.asarray(j.weights(state)), w, rtol=1e-5, atol=1e-7)
    if buf.counted:
        assert state.weights is None  # counted: no per-slot state
    else:
        assert state.weights.tree.levels[-1].shape[0] >= E * T // buf.stride + 1
        np.testing.assert_allclose(float(sumtree.total(state.weights.tree)), w.sum(), rtol=1e-5)
    if w.sum() > 0:
        check_sequences(sample(state, jax.random.key(seed), 16), ref, w)


@pytest.mark.parametrize("capacity", [30, 32])  # tree over every slot / over aligned slots only (stride 4)
def test_r2d2_periodic_starts_long_run(capacity):
    """R2D2 layout (L=8, period 4, T a multiple of the period or not): after many wraps every sample starts
    on a multiple of the period, is contiguous and from one env; stale weights are cleared on overwrite;
    priorities set between adds (R2D2's learner) carry into the weights the adds refresh."""
    cfg = {"period": 4, "priority_exponent": 0.9}
    buf = make_sequence_buffer(4, capacity, 8, **cfg)
    ref = SeqRef(cfg, 4, capacity, 8)
    assert buf.stride == (4 if capacity == 32 else 1)
    add, sample = jax.jit(buf.add), jax.jit(buf.sample, static_argnums=2)
    set_prio = jax.jit(buf.set_priorities)
    state, rng = buf.init(PROTO), np.random.default_rng(1)
    for t in range(137):
        ids = rng.permutation(4).astype(np.int32)
        mask = np.arange(4) < rng.integers(1, 5)
        steps = make_steps(ref, ids, rng, done_p=0.05)
        state = add(state, steps, ids, mask)
        ref.add(steps, ids, mask)
        if t % 7 == 6:
            slots = np.unique(np.asarray(sample(state, jax.random.key(t), 8).slots))
            slots = np.resize(slots, 8).astype(np.int32)  # fixed shape; repeats carry the same value below
            p = rng.uniform(0.1, 5.0, size=8).astype(np.float32)
            p = p[np.searchsorted(np.unique(slots), slots)]
            state = set_prio(state, slots, p)
            ref.set_priorities(slots, p)
    w = ref.weights()
    np.testing.assert_allclose(np.asarray(jax.jit(buf.weights)(state)), w, rtol=1e-5)
    check_sequences(sample(state, jax.random.key(0), 256), ref, w)


def test_sampling_frequencies_follow_length_power_and_priorities():
    """>= 100k draws each: empirical start frequencies match eligible * remaining**power * p**alpha / sum
    (chi-square), and zero-weight starts are never drawn; for a sum-tree buffer with priorities and for a
    counted (tree-free) one."""
    for cfg, use_prio in [({"cross_episodes": False, "length_power": 1.5, "priority_exponent": 0.7, "period": 2},
                           True), ({"length_power": 1.5, "period": 2}, False)]:
        buf = jitted(make_sequence_buffer(3, 10, 4, **cfg))  # tree stride 2
        ref = SeqRef(cfg, 3, 10, 4)
        rng = np.random.default_rng(3)
        state = buf.init(PROTO)
        for t in range(16):
            ids = rng.permutation(3).astype(np.int32)
            mask = rng.random(3) < (0.8 if t < 12 else 0.4)  # uneven rows: different tail lengths
            steps = make_steps(ref, ids, rng, done_p=0.2)
            state = buf.add(state, steps, ids, mask)
            ref.add(steps, ids, mask)
        if use_prio:
            slots = np.arange(0, 30, 2, dtype=np.int32)
            p = rng.uniform(0.0, 4.0, size=len(slots)).astype(np.float32)
            p[0] = 0.0
            state = buf.set_priorities(state, slots, p)
            ref.set_priorities(slots, p)
        w = ref.weights()
        assert (w > 0).sum() >= 6 and len(set(w[w > 0].round(4))) >= 3  # non-trivial distribution
        n = 200_000
        s = buf.sample_starts(state, jax.random.key(42), n)
        counts = np.bincount(np.asarray(s.slots), minlength=30)
        assert counts[w == 0].sum() == 0
        chi2, pval = stats.chisquare(counts[w > 0], w[w > 0] / w.sum() * n)
        assert pval > 1e-3, (cfg, chi2, pval, counts, w)
        np.testing.assert_allclose(np.asarray(s.probabilities), (w / w.sum())[np.asarray(s.slots)], rtol=1e-4)


def test_empty_and_ineligible_buffers():
    buf = jitted(make_sequence_buffer(2, 5, 3, start="episode", min_size=4))
    state = buf.init(PROTO)
    s = buf.sample(state, jax.random.key(0), 4)
    assert not np.asarray(s.mask).any() and not np.asarray(s.probabilities).any()
    assert not bool(buf.can_sample(state))
    steps = {"x": np.array([0, 1000], np.int32), "v": np.zeros((2, 2), np.float32), "done": np.zeros(2, bool)}
    state = buf.add(state, steps, np.array([0, 1], np.int32))
    assert not bool(buf.can_sample(state))  # eligible starts exist but fewer than min_size steps
    state = buf.add(state, steps, np.array([0, 1], np.int32))
    assert bool(buf.can_sample(state))


@pytest.mark.parametrize("kwargs", [{}, {"start": "episode"}, {"priority_exponent": 0.6}],
                         ids=["counted", "tree", "prioritised"])
def test_an_empty_sample_is_the_documented_one_from_every_weight_strategy(kwargs):
    """Nothing stored: every start is slot 0 of env 0, with no valid step and probability 0."""
    buf = make_sequence_buffer(3, 5, 2, **kwargs)
    s = jax.jit(buf.sample, static_argnums=2)(buf.init(PROTO), jax.random.key(1), 4)
    for name in ("slots", "env_ids", "probabilities", "mask"):
        assert not np.asarray(getattr(s, name)).any(), (name, getattr(s, name))


def test_set_priorities_with_duplicates_stays_consistent():
    buf = jitted(make_sequence_buffer(2, 6, 2, priority_exponent=0.5))
    state = buf.init(PROTO)
    for t in range(4):
        steps = {"x": np.full(2, t, np.int32), "v": np.zeros((2, 2), np.float32), "done": np.zeros(2, bool)}
        state = buf.add(state, steps, np.array([0, 1], np.int32))
    state = buf.set_priorities(state, np.array([1, 1, 7, 1], np.int32), np.array([4.0, 9.0, 16.0, 1.0]))
    leaves = np.asarray(state.weights.tree.levels[-1][:12])
    np.testing.assert_allclose(leaves, np.asarray(state.weights.base) * np.asarray(state.weights.priority), rtol=1e-6)
    assert float(state.weights.priority[7]) == pytest.approx(4.0)
    assert float(state.weights.max_priority) == 16.0
    # A slot written after that gets the max priority seen (16 ** 0.5).
    state = buf.add(state, {"x": np.full(1, 9, np.int32), "v": np.zeros((1, 2), np.float32),
                            "done": np.zeros(1, bool)}, np.array([0], np.int32))
    assert float(state.weights.priority[4]) == pytest.approx(4.0)


def test_bad_config_and_calls():
    with pytest.raises(ValueError, match="capacity_per_env .* must exceed sequence_length"):
        make_sequence_buffer(2, 4, 4)
    with pytest.raises(ValueError, match="start must be"):
        make_sequence_buffer(2, 8, 4, start="middle")
    for window in (9, -1):
        with pytest.raises(ValueError, match="online_window"):
            make_sequence_buffer(2, 8, 4, online_window=window)
    for key in ("priority_exponent", "length_power"):  # 0 is a value (uniform), below it is refused
        make_sequence_buffer(2, 8, 4, **{key: 0.0})
        with pytest.raises(ValueError, match=f"{key} must be >= 0"):
            make_sequence_buffer(2, 8, 4, **{key: -0.1})
    buf = make_sequence_buffer(2, 8, 4)
    state = buf.init(PROTO)
    with pytest.raises(BufferInputError, match="priority_exponent"):
        buf.set_priorities(state, np.zeros(2, np.int32), np.ones(2))
    with pytest.raises(BufferInputError, match="done_fn cannot read"):
        buf.init({"x": np.int32(0)})
    with pytest.raises(BufferInputError, match="online_window > 0"):
        buf.sample_online(state, jax.random.key(0), 2)
    pbuf = make_sequence_buffer(2, 8, 4, priority_exponent=0.6)
    with pytest.raises(BufferInputError, match=r"priorities: expected shape \(2,\)"):
        pbuf.set_priorities(pbuf.init(PROTO), np.zeros(2, np.int32), np.ones(3))
    with pytest.raises(BufferInputError, match="slots: expected an integer array"):
        pbuf.set_priorities(pbuf.init(PROTO), np.zeros(2, np.float32), np.ones(2))


@pytest.mark.parametrize("power", [0.0, 1.0])  # counted weights, sum tree
def test_custom_done_fn_caps_sequences(power):
    """done_fn reads any leaves (here terminated | truncated); masks stop just after each episode end."""
    proto = {"t": np.int32(0), "term": False, "trunc": False}
    buf = jitted(make_sequence_buffer(1, 10, 4, cross_episodes=False, length_power=power,
                                      done_fn=lambda s: jnp.logical_or(s["term"], s["trunc"])))
    assert buf.buf.counted == (power == 0.0)
    state = buf.init(proto)
    for t in range(6):
        state = buf.add(state, {"t": np.array([t], np.int32), "term": np.array([t == 1]),
                                "trunc": np.array([t == 3])}, np.array([0], np.int32))
    s = buf.sample(state, jax.random.key(0), 256)
    starts, lengths = np.asarray(s.data["t"][:, 0]), np.asarray(s.mask.sum(1))
    assert set(starts.tolist()) == set(range(6))
    np.testing.assert_array_equal(lengths, np.array([2, 1, 2, 1, 2, 1])[starts])


@pytest.mark.parametrize("power", [0.0, 1.0])  # counted weights, sum tree
def test_a_step_of_one_leaf(power):
    """A step may be a single array (here the done flag alone): the batch size is read from that leaf."""
    buf = jitted(make_sequence_buffer(1, 10, 4, cross_episodes=False, length_power=power))
    state = buf.init({"done": False})
    for t in range(6):
        state = buf.add(state, {"done": np.array([t == 2])}, np.array([0], np.int32))
    s = buf.sample(state, jax.random.key(0), 256)
    starts, lengths = np.asarray(s.slots), np.asarray(s.mask.sum(1))
    assert set(starts.tolist()) == set(range(6))
    np.testing.assert_array_equal(lengths, np.array([3, 2, 1, 3, 2, 1])[starts])  # episode end at 2, head at 5


def test_jit_scan_vmap_of_every_op():
    """add/sample/set_priorities/peek/can_sample/online ops inside one jitted scan, vmapped over 2 seeds,
    equal the same ops run one seed at a time."""
    buf = make_sequence_buffer(E, T, L, period=1, cross_episodes=False, length_power=1.0,
                               priority_exponent=0.6, online_window=4)
    K = 10
    rng = np.random.default_rng(5)
    ids = np.stack([rng.permutation(E) for _ in range(K)]).astype(np.int32)
    xs = {"x": np.arange(K * E, dtype=np.int32).reshape(K, E), "v": rng.normal(size=(K, E, 2)).astype(np.float32),
          "done": rng.random((K, E)) < 0.3}

    def run(key):
        def body(s, inp):
            steps, i, k = inp
            k1, k2, k3 = jax.random.split(k, 3)
            s = buf.add(s, steps, i)
            smp = buf.sample(s, k1, 4)
            s = buf.set_priorities(s, smp.slots, jnp.abs(smp.data["v"][:, 0, 0]) + 0.1)
            mixed = buf.sample_mixed(s, k2, 4, 0.5)
            s = jax.lax.cond(jax.random.bernoulli(k3), buf.consume_online, lambda z: z, s)
            out = (smp.data["x"], smp.mask, mixed.data["x"], buf.can_sample(s), buf.can_sample_online(s),
                   buf.peek(s, jnp.arange(E))["x"])
            return s, out

        keys = jax.random.split(key, K)
        return jax.lax.scan(body, buf.init(PROTO), (xs, ids, keys))

    keys = jax.random.split(jax.random.key(0), 2)
    vs, vout = jax.jit(jax.vmap(run))(keys)
    batched = jax.tree_util.tree_leaves(jax.device_get((vs, vout)))  # NumPy: indexed below without a compile
    run_one = jax.jit(run)
    for i in range(2):
        s1, out1 = run_one(keys[i])
        for b, one in zip(batched, jax.tree_util.tree_leaves((s1, out1))):
            np.testing.assert_array_equal(b[i], one)
    consumed = jax.jit(jax.vmap(buf.consume_online))(vs)
    assert not np.asarray(jax.jit(jax.vmap(buf.can_sample_online))(consumed)).any()


def test_the_last_slot_keeps_its_weight_when_the_slots_fill_whole_tree_blocks():
    """24 slots (3 rows x 8, stride 1) in a sum tree of fanout 23: the dummy leaf for dropped writes (index 24)
    lies past the first full block, and every real slot, the last one included, keeps its weight."""
    cfg = {"period": 3, "priority_exponent": 1.0}
    j = jitted(make_sequence_buffer(E, T, L, fanout=23, **cfg))
    state, ref, rng = j.buf.init(PROTO), SeqRef(cfg), np.random.default_rng(0)
    ids = np.arange(E, dtype=np.int32)
    for _ in range(2 * T):
        steps = make_steps(ref, ids, rng, done_p=0.0)
        state = j.add(state, steps, ids, np.ones(E, bool))
        ref.add(steps, ids, [True] * E)
    w = ref.weights()
    assert w.shape == (E * T,) and w[-1] > 0
    np.testing.assert_allclose(np.asarray(jax.jit(j.buf.weights)(state)), w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("period", [1, 2])  # a tree leaf per slot / per aligned slot (stride 2)
def test_zeroed_priorities_sample_nothing(period):
    """Stored, eligible starts whose priorities are all set to 0 leave a zero total: sampling gives an
    all-masked batch with zero probabilities (the contract of an empty buffer), not the stale remaining
    lengths of the leaves the sum tree falls back to."""
    buf = jitted(make_sequence_buffer(E, T, L, period=period, priority_exponent=0.6))
    state = buf.init(PROTO)
    steps = {"x": np.arange(E, dtype=np.int32), "v": np.zeros((E, 2), np.float32), "done": np.zeros(E, bool)}
    for _ in range(T):
        state = buf.add(state, steps, np.arange(E, dtype=np.int32))
    assert bool(buf.can_sample(state))
    state = buf.set_priorities(state, np.arange(E * T, dtype=np.int32), np.zeros(E * T, np.float32))
    assert float(sumtree.total(state.weights.tree)) == 0 and not bool(buf.can_sample(state))
    s = buf.sample(state, jax.random.key(0), 8)
    assert not np.asarray(s.mask).any() and not np.asarray(s.probabilities).any()


@pytest.mark.parametrize("kwargs, message", [
    ({"num_envs": 0}, "need num_envs >= 1"), ({"sequence_length": 0}, "sequence_length >= 1"),
    ({"capacity_per_env": 4}, r"capacity_per_env \(4\) must exceed sequence_length \(4\)"),
    ({"period": 0}, "period must be >= 1"), ({"start": "step"}, "start must be 'any' or 'episode'"),
    ({"online_window": -1}, r"online_window must be in \[0, capacity_per_env=10\]"),
    ({"online_window": 11}, r"online_window must be in \[0, capacity_per_env=10\]"),
    ({"priority_exponent": -0.5}, "priority_exponent must be >= 0 or None"),
    ({"length_power": -1.0}, "length_power must be >= 0"),
    ({"layout": "rows"}, "layout must be 'windows' or 'packed'"),
])
def test_each_bad_constructor_argument_is_refused_alone(kwargs, message):
    """Every other argument valid; the bounds themselves are accepted (last call)."""
    args = {"num_envs": 2, "capacity_per_env": 10, "sequence_length": 4}
    with pytest.raises(ValueError, match=message):
        make_sequence_buffer(**{**args, **kwargs})
    make_sequence_buffer(num_envs=1, capacity_per_env=2, sequence_length=1, period=1, online_window=2,
                         priority_exponent=0.0, length_power=0.0)


@pytest.mark.parametrize("period", [1, 2, 3])
def test_counted_sample_probabilities_are_the_weights_normalised_for_rows_shorter_than_a_sequence(period):
    """Counted weights (no sum tree), length_power 1: a start's weight is its remaining length, so short rows
    (fewer than L steps: their first start at 0 is short too) weigh less; every sampled start's probability is
    its weight over the sum of all weights, the slots of the per-slot view (`weights`)."""
    L = 6
    buf = make_sequence_buffer(3, 20, L, period=period, length_power=1.0, cross_episodes=True)
    state, add = buf.init({"x": np.int32(0), "done": False}), jax.jit(buf.add)
    for t, ids in enumerate([[0, 1, 2], [0, 1, 2], [0, 2], [0, 2], [0], [0], [0], [0], [0]]):
        state = add(state, {"x": np.full(len(ids), t, np.int32), "done": np.zeros(len(ids), bool)},
                    np.array(ids, np.int32))
    weights = np.asarray(jax.jit(buf.weights)(state))  # rows hold 9, 2 and 4 steps
    assert weights.reshape(3, 20)[1, 0] == 2.0 and weights.reshape(3, 20)[2, 0] == 4.0
    sample = jax.jit(buf.sample, static_argnums=2)(state, jax.random.key(0), 256)
    slots = np.asarray(sample.slots)
    np.testing.assert_allclose(np.asarray(sample.probabilities), weights[slots] / weights.sum(), rtol=1e-5)
    assert np.all(weights[slots] > 0)


@pytest.mark.parametrize("cfg", [{}, {"period": 2, "cross_episodes": False, "priority_exponent": 0.6}])
def test_both_layouts_sample_the_same_windows_masked_positions_included(cfg):
    """`layout="windows"` (mirrored rows, leaves apart) and `"packed"` draw the same starts and read the same
    steps at every position of every window, masked ones included (they hold the row's older steps)."""
    rng = np.random.default_rng(3)
    bufs = [make_sequence_buffer(E, T, L, layout=layout, **cfg) for layout in ("windows", "packed")]
    states = [b.init(PROTO) for b in bufs]
    adds = [jax.jit(b.add) for b in bufs]
    samples = [jax.jit(b.sample, static_argnums=2) for b in bufs]
    ref = SeqRef(cfg)
    for i in range(40):  # every row wraps several times, rows advance unevenly
        ids = np.sort(rng.permutation(E)[: E - i % 2]).astype(np.int32)  # two shapes: two compiles per op
        steps = make_steps(ref, ids, rng, done_p=0.3)
        ref.add(steps, ids)
        states = [add(s, steps, ids) for add, s in zip(adds, states)]
        a, b = (sample(s, jax.random.key(i), 8) for sample, s in zip(samples, states))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
