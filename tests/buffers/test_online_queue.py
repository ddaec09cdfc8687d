"""Online queue of the sequence buffer (seed 001, Muesli): a second pointer over the same rows."""

from __future__ import annotations

import functools

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from buffers.sequences import make_sequence_buffer
from tests.buffers.test_rows import PROTO, make_steps
from tests.buffers.test_sequences import SeqRef, check_sequences, jitted

E, T, L, W = 3, 9, 3, 4
CONFIGS = [
    {"online_window": W, "length_power": 1.0},  # counted weights (no sum tree)
    {"online_window": W, "cross_episodes": False, "length_power": 1.0, "priority_exponent": 0.8},
    {"online_window": W, "period": 2, "start": "episode"},
    # sum-tree weights with aligned starts only (T a multiple of the period: one leaf per period)
    {"online_window": W, "period": 3, "priority_exponent": 0.8, "length_power": 1.0},
]


class OnlineRef(SeqRef):
    def __init__(self, cfg, num_envs=E, capacity=T, length=L):
        super().__init__(cfg, num_envs, capacity, length)
        self.W = cfg["online_window"]
        self.online_start = [0] * num_envs

    def consume(self):
        self.online_start = [self.written(e) for e in range(self.E)]

    def queue(self, e) -> range:
        w = self.written(e)
        return range(w - min(w - self.online_start[e], self.W), w)

    def online_weights(self) -> np.ndarray:
        """eligible * remaining**power over queue starts (no priority factor)."""
        w = np.zeros(self.E * self.T)
        for e in range(self.E):
            for a in self.queue(e):
                if self.eligible(e, a):
                    w[e * self.T + a % self.T] = float(self.remaining(e, a)) ** self.power
        return w


@functools.cache
def fns(i):
    return jitted(make_sequence_buffer(E, T, L, **CONFIGS[i]))


def check_online(sample, ref: OnlineRef, rows: slice | None = None):
    w = ref.online_weights()
    sample = jax.tree_util.tree_map(np.asarray, sample)
    sub = sample if rows is None else jax.tree_util.tree_map(lambda x: x[rows], sample)
    for b in range(len(sub.slots)):
        e, a = int(sub.env_ids[b]), ref.abs_of_slot(int(sub.slots[b]))
        assert a in ref.queue(e), f"online sample started outside the unconsumed queue: env {e} step {a}"
    check_sequences(sub, ref, w)


@given(cfg=st.integers(0, len(CONFIGS) - 1),
       ops=st.lists(st.one_of(
           st.tuples(st.just("add"), st.permutations(range(E)), st.lists(st.booleans(), min_size=E, max_size=E)),
           st.tuples(st.sampled_from(["consume", "online", "mixed"]), st.integers(0, 2**16), st.none())),
           min_size=1, max_size=40),
       seed=st.integers(0, 2**31 - 1))
@settings(max_examples=30, deadline=None)
def test_online_queue_matches_reference(cfg, ops, seed):
    """Online samples start only in unconsumed data (last <= W steps per env); after consume the queue is
    empty; mixed batches hold exactly round(B * fraction) online sequences (first) and replay ones."""
    buf = fns(cfg)
    rng = np.random.default_rng(seed)
    state, ref = buf.init(PROTO), OnlineRef(CONFIGS[cfg])
    for kind, arg, mask in ops:
        if kind == "add":
            ids = np.array(arg, np.int32)
            steps = make_steps(ref, ids, rng, done_p=0.3)
            state = buf.add(state, steps, ids, np.array(mask))
            ref.add(steps, ids, mask)
        elif kind == "consume":
            state = buf.consume_online(state)
            ref.consume()
            assert not bool(buf.can_sample_online(state))
            empty = buf.sample_online(state, jax.random.key(arg), 4)
            assert not np.asarray(empty.mask).any() and not np.asarray(empty.probabilities).any()
            assert not np.asarray(empty.slots).any()  # the contract: slots 0 (sequences.py)
        elif kind == "online":
            has = ref.online_weights().sum() > 0
            assert bool(buf.can_sample_online(state)) == has
            if has:
                check_online(buf.sample_online(state, jax.random.key(arg), 8), ref)
        elif kind == "mixed" and ref.online_weights().sum() > 0 and ref.weights().sum() > 0:
            s = jax.tree_util.tree_map(np.asarray, buf.sample_mixed(state, jax.random.key(arg), 10, 0.3))
            assert s.slots.shape == (10,) and s.mask.shape == (10, L)
            check_online(s, ref, slice(0, 3))
            check_sequences(jax.tree_util.tree_map(lambda x: x[3:], s), ref, ref.weights())
    np.testing.assert_array_equal(np.asarray(state.rows.online_start), ref.online_start)


def test_mixed_proportion_exact_and_sources_distinct():
    """With the queue holding only env 0's newest steps, the first round(B*f) rows always come from it and
    the replay rows follow the replay distribution (which also covers consumed data)."""
    buf = jitted(make_sequence_buffer(2, 12, 2, online_window=3))
    state, ref = buf.init(PROTO), OnlineRef({"online_window": 3}, 2, 12, 2)
    rng = np.random.default_rng(0)
    for _ in range(6):
        steps = make_steps(ref, np.array([0, 1]), rng, done_p=0.0)
        state = buf.add(state, steps, np.array([0, 1], np.int32))
        ref.add(steps, [0, 1])
    state = buf.consume_online(state)
    ref.consume()
    for _ in range(2):
        steps = make_steps(ref, np.array([0]), rng, done_p=0.0)
        state = buf.add(state, steps, np.array([0], np.int32))
        ref.add(steps, [0])
    for b, frac in [(10, 0.3), (5, 1.0)]:
        s = buf.sample_mixed(state, jax.random.key(b), b, frac)
        n_on = round(b * frac)
        starts = np.asarray(s.slots)
        assert np.all(np.isin(starts[:n_on], [6, 7])), starts  # env 0, abs steps 6 and 7 only
        assert s.slots.shape == (b,)
    many = buf.sample_mixed(state, jax.random.key(1), 2000, 0.25)
    replay = np.asarray(many.slots[500:])
    assert np.all(np.isin(np.asarray(many.slots[:500]), [6, 7]))
    assert (~np.isin(replay, [6, 7])).mean() > 0.8  # replay draws mostly consumed/other-env data
    np.testing.assert_allclose(np.asarray(many.probabilities[:500]), 0.5, rtol=1e-5)  # remaining**0 each


def test_online_window_bounds_the_queue():
    buf = jitted(make_sequence_buffer(1, 20, 4, online_window=5, length_power=1.0))
    state = buf.init(PROTO)
    for t in range(12):
        state = buf.add(state, {"x": np.array([t], np.int32), "v": np.zeros((1, 2), np.float32),
                                "done": np.zeros(1, bool)}, np.array([0], np.int32))
    s = buf.sample_online(state, jax.random.key(0), 4000)
    starts = np.asarray(s.data["x"][:, 0])
    assert set(starts.tolist()) == {7, 8, 9, 10, 11}  # the last W=5 unconsumed steps
    # weights remaining**1: 4, 4, 3, 2, 1 (capped at the newest step)
    freq = np.bincount(starts - 7, minlength=5) / 4000
    np.testing.assert_allclose(freq, np.array([4, 4, 3, 2, 1]) / 14, atol=0.03)
    np.testing.assert_array_equal(np.asarray(s.mask.sum(1)), np.minimum(4, 12 - starts))
