"""n-step transitions from per-env rows (buffers/nstep.py) against a plain NumPy loop."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buffers.checks import BufferInputError
from buffers.nstep import make_nstep_buffer
from tests.buffers.test_rows import STRIDE, RowsRef
from tests.conftest import SHIPPED

E, T, N, GAMMA = 3, 8, 3, 0.9
PROTO = {"obs": np.zeros(2, np.float32), "action": np.int32(0), "reward": np.float32(0), "terminated": False,
         "truncated": False, "next_obs": np.zeros(2, np.float32)}


def make_steps(ref: RowsRef, env_ids, rng, p_term=0.15, p_trunc=0.15):
    n = len(env_ids)
    counter = np.array([e * STRIDE + ref.written(int(e)) if 0 <= e < ref.E else -1 for e in env_ids], np.float32)
    return {"obs": np.stack([counter, rng.normal(size=n)], 1).astype(np.float32),
            "action": rng.integers(0, 4, n).astype(np.int32),
            "reward": rng.normal(size=n).astype(np.float32),
            "terminated": rng.random(n) < p_term, "truncated": rng.random(n) < p_trunc,
            "next_obs": np.stack([counter + 0.5, rng.normal(size=n)], 1).astype(np.float32)}


def nstep_loop(hist, a, n, gamma):
    """Reference: discounted reward, bootstrap discount and next_obs of the n-step window at step a."""
    ret, disc, last = 0.0, 1.0, a
    for i in range(n):
        if a + i >= len(hist):
            break
        s = hist[a + i]
        ret += disc * float(s["reward"])
        disc *= gamma
        last = a + i
        if s["terminated"]:
            disc = 0.0
            break
        if s["truncated"]:
            break
    return ret, disc, hist[last]["next_obs"]


@functools.cache
def fns(prioritised: bool, n: int = N):
    buf = make_nstep_buffer(E, T, n, GAMMA, priority_exponent=0.7 if prioritised else None)
    return (buf, jax.jit(buf.add), jax.jit(buf.sample, static_argnums=2), jax.jit(buf.set_priorities),
            jax.jit(buf.can_sample))


def check_transitions(s, ref: RowsRef, probs: np.ndarray | None = None, n: int = N):
    s = jax.tree_util.tree_map(np.asarray, s)
    for b in range(len(s.slots)):
        e, a = int(s.env_ids[b]), ref.abs_of_slot(int(s.slots[b]))
        assert a is not None
        assert s.obs[b, 0] == e * STRIDE + a  # the first step of the window, from this env
        np.testing.assert_array_equal(s.obs[b], ref.hist[e][a]["obs"])
        assert s.action[b] == ref.hist[e][a]["action"]
        ret, disc, next_obs = nstep_loop(ref.hist[e], a, n, GAMMA)
        np.testing.assert_allclose(float(s.reward[b]), ret, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(s.discount[b]), disc, rtol=1e-6)
        np.testing.assert_array_equal(s.next_obs[b], next_obs)
        if probs is not None:
            np.testing.assert_allclose(float(s.probabilities[b]), probs[int(s.slots[b])], rtol=1e-4)


@given(prioritised=st.booleans(), n=st.sampled_from([1, N]),
       ops=st.lists(st.tuples(st.permutations(range(E)), st.lists(st.booleans(), min_size=E, max_size=E),
                              st.booleans()), min_size=1, max_size=40),
       seed=st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_nstep_matches_numpy_loop(prioritised, n, ops, seed):
    """Random async writes with terminations and truncations, wrap-around, optional priorities, n of 1 (one
    gather serves every read) or 3: every sampled transition's reward, discount and next_obs equal a NumPy loop
    over the stored history."""
    buf, add, sample, set_prio, can_sample = fns(prioritised, n)
    rng = np.random.default_rng(seed)
    state, ref = buf.init(PROTO), RowsRef(E, T)
    prio = np.zeros(E * T)  # raw priority per slot (reference), new slots at the max so far
    max_p = 1.0
    for perm, mask, do_sample in ops:
        ids = np.array(perm, np.int32)
        steps = make_steps(ref, ids, rng)
        state = add(state, steps, ids, np.array(mask))
        for i, e in enumerate(ids):
            if mask[i]:
                prio[e * T + ref.written(int(e)) % T] = max_p
        ref.add(steps, ids, mask)
        if do_sample and bool(can_sample(state)):
            present = np.zeros(E * T)
            for e in range(E):
                for a in ref.present(e):
                    present[e * T + a % T] = 1.0
            w = present * (prio ** 0.7 if prioritised else 1.0)
            s = sample(state, jax.random.key(int(rng.integers(1 << 30))), 16)
            check_transitions(s, ref, w / w.sum(), n)
            if prioritised:
                new = rng.uniform(0.1, 3.0, size=16).astype(np.float32)
                uniq, first = np.unique(np.asarray(s.slots), return_index=True)
                # fixed shape (one compile): repeats of a slot carry its one value
                state = set_prio(state, np.resize(uniq, 16).astype(np.int32), np.resize(new[first], 16))
                prio[uniq] = new[first]
                max_p = max(max_p, float(new[first].max()))


def test_every_stored_step_is_a_start_uniformly():
    """Without priorities every stored step (terminal ones included) is a start with probability 1/size."""
    buf, add, sample, _, _ = fns(False)
    rng = np.random.default_rng(1)
    state, ref = buf.init(PROTO), RowsRef(E, T)
    for _ in range(11):
        ids = rng.permutation(E).astype(np.int32)
        mask = rng.random(E) < 0.8
        steps = make_steps(ref, ids, rng)
        state = add(state, steps, ids, mask)
        ref.add(steps, ids, mask)
    size = sum(len(ref.present(e)) for e in range(E))
    s = sample(state, jax.random.key(0), 16)  # compiled shape reused
    check_transitions(s, ref)
    np.testing.assert_allclose(np.asarray(s.probabilities), 1.0 / size, rtol=1e-5)
    seen = set()
    for k in range(60):
        seen |= set(np.asarray(sample(state, jax.random.key(k), 16).slots).tolist())
    want = {e * T + a % T for e in range(E) for a in ref.present(e)}
    assert seen == want


def test_empty_sample_and_bad_prototype():
    buf, _, sample, _, can_sample = fns(False)
    state = buf.init(PROTO)
    s = sample(state, jax.random.key(0), 16)
    assert not bool(can_sample(state))
    assert not np.asarray(s.probabilities).any() and not np.asarray(s.discount).any()
    assert not np.asarray(s.reward).any()
    bad = {k: v for k, v in PROTO.items() if k != "next_obs"}
    with pytest.raises(BufferInputError, match="no 'next_obs'"):
        buf.init(bad)
    with pytest.raises(ValueError, match="capacity_per_env .* must exceed"):
        make_nstep_buffer(2, 3, 3, 0.99)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        make_nstep_buffer(2, 6, 0, 0.99)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got 1.5"):
        make_nstep_buffer(2, 6, 1, 1.5)
    make_nstep_buffer(2, 6, 1, 1.0), make_nstep_buffer(2, 6, 1, 0.0)  # the bounds themselves are fine


def test_nstep_scan_vmap_over_seeds():
    """add + sample + set_priorities inside a jitted scan, vmapped over 2 seeds, equal each seed alone."""
    buf = make_nstep_buffer(2, 6, 2, 0.5, priority_exponent=0.6)
    K = 9
    rng = np.random.default_rng(2)
    ref = RowsRef(2, 6)
    xs = [make_steps(ref, np.arange(2), rng) for _ in range(K)]
    for x in xs:
        ref.add(x, np.arange(2))
    xs = jax.tree_util.tree_map(lambda *a: np.stack(a), *xs)

    def run(key):
        def body(s, inp):
            steps, k = inp
            s = buf.add(s, steps, jnp.arange(2))
            smp = buf.sample(s, k, 4)
            s = buf.set_priorities(s, smp.slots, jnp.abs(smp.reward) + 0.1)
            return s, (smp.reward, smp.discount, smp.slots)

        return jax.lax.scan(body, buf.init(PROTO), (xs, jax.random.split(key, K)))

    keys = jax.random.split(jax.random.key(3), 2)
    batched = jax.tree_util.tree_leaves(jax.device_get(jax.jit(jax.vmap(run))(keys)))  # NumPy: indexed below
    single = jax.jit(run)
    for i in range(2):
        s1, out1 = single(keys[i])
        for b, one in zip(batched, jax.tree_util.tree_leaves((s1, out1))):
            np.testing.assert_array_equal(b[i], one)


def test_repeated_and_out_of_range_env_ids():
    """A repeated id stores its last entry and advances once; ids outside [0, E) write nothing: samples are
    the reference transitions of the rows so written (a duplicate used to leave a never-written slot)."""
    buf, add, sample, _, _ = fns(True)
    rng = np.random.default_rng(2)
    state, ref = buf.init(PROTO), RowsRef(E, T)
    for _ in range(12):
        ids = rng.integers(-1, E + 1, size=E + 1).astype(np.int32)
        steps = make_steps(ref, ids, rng)
        state = add(state, steps, ids, np.ones(E + 1, bool))
        ref.add(steps, ids)
    np.testing.assert_array_equal(state.rows.written, [ref.written(e) for e in range(E)])
    check_transitions(sample(state, jax.random.key(0), 64), ref)


def test_peek_returns_each_envs_latest_step():
    """`peek(state, env_ids)`: the newest stored step of each listed env (in the order asked), as written."""
    buf, add, _, _, _ = fns(False)
    rng = np.random.default_rng(5)
    state, ref = buf.init(PROTO), RowsRef(E, T)
    for _ in range(T + 2):  # past a wrap
        ids = rng.permutation(E).astype(np.int32)[: E - 1]
        steps = make_steps(ref, ids, rng)
        state = add(state, steps, ids, np.ones(len(ids), bool))
        ref.add(steps, ids)
    asked = np.array([E - 1, 0, 1], np.int32)
    peeked = jax.tree_util.tree_map(np.asarray, jax.jit(buf.peek)(state, asked))
    for i, e in enumerate(asked):
        latest = ref.hist[int(e)][-1]
        for k in latest:
            np.testing.assert_array_equal(peeked[k][i], latest[k])


def test_bad_priorities_count_as_zero():
    """NaN, +-inf and negative priorities (e.g. from a diverged TD error) leave those starts at weight 0 and
    the buffer sampleable (they used to turn the tree total NaN)."""
    buf, add, sample, set_prio, can_sample = fns(True)
    rng = np.random.default_rng(3)
    state, ref = buf.init(PROTO), RowsRef(E, T)
    for _ in range(4):
        ids = np.arange(E, dtype=np.int32)
        steps = make_steps(ref, ids, rng)
        state = add(state, steps, ids, np.ones(E, bool))
        ref.add(steps, ids)
    bad = np.array([0, 1, 2, 3, T, T + 1], np.int32)
    p = np.array([np.nan, np.inf, -np.inf, -1.0, np.nan, -5.0], np.float32)
    state = set_prio(state, jnp.asarray(np.resize(bad, 16)), jnp.asarray(np.resize(p, 16)))
    assert bool(can_sample(state))
    s = sample(state, jax.random.key(0), 16)
    assert not np.isin(np.asarray(s.slots), bad).any()
    w = np.zeros(E * T)
    w[[e * T + a for e in range(E) for a in range(4)]] = 1.0
    w[bad] = 0.0
    check_transitions(s, ref, w / w.sum())


def test_a_one_step_sample_gathers_the_storage_once():
    """n = 1: the transition, its reward and its next_obs come from one gather of whole packed rows, and the
    one-step window needs no done check (its remaining length is at most 1 whatever the flag)."""
    buf = make_nstep_buffer(E, T, 1, GAMMA)
    text = jax.jit(buf.sample, static_argnums=2).lower(buf.init(PROTO), jax.random.key(0), 16).compile(SHIPPED).as_text()
    storage_gathers = re.findall(r"= u32\[[\d,]+\]\{[\d,]*\} gather\(", text)  # the packed rows are u32 words
    assert len(storage_gathers) == 1, storage_gathers
