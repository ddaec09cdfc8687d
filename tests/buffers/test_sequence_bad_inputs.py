"""Sequence buffer under bad inputs, against the reference of test_sequences.py: repeated and out-of-range
env_ids (the write rule of buffers/rows.py) and non-finite, negative or out-of-range priorities."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from buffers import sumtree
from buffers.sequences import make_sequence_buffer
from tests.buffers.test_rows import PROTO, make_steps
from tests.buffers.test_sequences import CONFIGS, E, L, SeqRef, T, check_sequences, jitted


@pytest.mark.parametrize("cfg", [0, 2, 5, 7])  # counted and sum-tree weights, with and without priorities
def test_out_of_range_and_repeated_env_ids(cfg):
    """Adds whose ids repeat or fall outside [0, E) (as rows.py documents: dropped, the last duplicate kept,
    one advance per row): storage, weights and samples match the reference (a repeated id used to advance
    its row twice, so later starts pointed at a slot never written)."""
    buf = make_sequence_buffer(E, T, L, **CONFIGS[cfg])
    add, sample = jax.jit(buf.add), jax.jit(buf.sample, static_argnums=2)
    rng = np.random.default_rng(cfg)
    state, ref = buf.init(PROTO), SeqRef(CONFIGS[cfg])
    for t in range(30):
        ids = rng.integers(-2, E + 2, size=E + 2).astype(np.int32)
        mask = rng.random(E + 2) < 0.8
        steps = make_steps(ref, ids, rng, done_p=0.3)
        state = add(state, steps, ids, mask)
        ref.add(steps, ids, mask)
    np.testing.assert_array_equal(state.rows.written, [ref.written(e) for e in range(E)])
    np.testing.assert_array_equal(state.rows.data["x"], ref.storage("x", np.zeros((E, T), np.int32)))
    w = ref.weights()
    np.testing.assert_allclose(np.asarray(buf.weights(state)), w, rtol=1e-5, atol=1e-7)
    check_sequences(sample(state, jax.random.key(0), 64), ref, w)


def _filled(cfg: dict):
    """A sequence buffer of `cfg` and its reference after T + 2 steps of every env (no episode ends)."""
    buf, ref = jitted(make_sequence_buffer(E, T, L, **cfg)), SeqRef(cfg)
    state, rng = buf.init(PROTO), np.random.default_rng(0)
    for _ in range(T + 2):
        ids = np.arange(E, dtype=np.int32)
        steps = make_steps(ref, ids, rng, done_p=0.0)
        state = buf.add(state, steps, ids)
        ref.add(steps, ids)
    return buf, ref, state


@pytest.mark.parametrize("period", [1, 2])  # sum tree over every slot / over aligned slots only
def test_non_finite_negative_and_out_of_range_priorities(period):
    """NaN, +-inf and negative priorities count as 0 and slots outside [0, E*T) are ignored, as in the flat
    prioritised buffer (a NaN or negative priority used to make the tree total NaN: can_sample False and
    garbage samples; slot -1 used to write the last leaf's priority without its tree leaf)."""
    buf, ref, state = _filled({"period": period, "priority_exponent": 0.5})
    slots = np.array([0, 2, 4, 6, 8, -1, E * T, 10], np.int32)
    p = np.array([np.nan, np.inf, -np.inf, -3.0, 0.0, 50.0, 50.0, 4.0], np.float32)
    state = buf.set_priorities(state, slots, p)
    ref.set_priorities(slots, p)
    w = ref.weights()
    assert bool(buf.can_sample(state)) and float(state.weights.max_priority) == 4.0
    np.testing.assert_allclose(np.asarray(buf.buf.weights(state)), w, rtol=1e-5)
    np.testing.assert_allclose(float(sumtree.total(state.weights.tree)), w.sum(), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(buf.buf.priorities(state, slots))[:6], [0, 0, 0, 0, 0, 0])
    check_sequences(buf.sample(state, jax.random.key(1), 64), ref, w)


def test_every_priority_zero_samples_nothing():
    """Data stored but every start's priority 0 (or cleaned to 0): nothing can be sampled, and a sample call
    returns no valid step and zero probabilities, as from an empty buffer."""
    buf, _, state = _filled({"period": 1, "priority_exponent": 1.0})
    assert bool(buf.can_sample(state))
    slots = np.arange(E * T, dtype=np.int32)
    state = buf.set_priorities(state, slots, np.where(slots % 2, 0.0, np.nan).astype(np.float32))
    s = buf.sample(state, jax.random.key(0), 16)
    assert not bool(buf.can_sample(state))
    assert not np.asarray(s.mask).any() and not np.asarray(s.probabilities).any()
