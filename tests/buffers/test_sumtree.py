"""Sum tree: exact totals after many batched updates, no zero-priority draws, frequencies match p / sum."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from buffers import sumtree

SET = jax.jit(sumtree.set)
TOTAL = jax.jit(sumtree.total)
SAMPLE = jax.jit(sumtree.sample, static_argnums=(2, 3))


def leaves(tree, n):
    return np.asarray(tree.levels[-1], np.float64)[:n]


def assert_consistent(tree, rtol=1e-6):
    """Every parent equals the float64 sum of its children; padding leaves stay 0."""
    f = tree.fanout
    for upper, lower in zip(tree.levels[:-1], tree.levels[1:]):
        sums = np.asarray(lower, np.float64).reshape(-1, f).sum(axis=1)
        up = np.asarray(upper, np.float64)
        np.testing.assert_allclose(up[: sums.size], sums, rtol=rtol, atol=1e-30)
        assert np.all(up[sums.size :] == 0)


@pytest.mark.parametrize("capacity,fanout", [(1, 16), (5, 2), (33, 3), (1000, 16), (1000, 32), (4097, 64)])
def test_set_matches_numpy(capacity, fanout):
    rng = np.random.default_rng(capacity)
    tree = sumtree.init(capacity, fanout)
    ref = np.zeros(capacity)
    for _ in range(5):
        idx = rng.integers(0, capacity, 40)
        vals = rng.exponential(size=capacity)[idx] * (rng.random(40) < 0.7)  # equal values for duplicates
        tree = SET(tree, jnp.asarray(idx), jnp.asarray(vals, jnp.float32))
        ref[idx] = vals.astype(np.float32)
        np.testing.assert_array_equal(leaves(tree, capacity), ref)
        np.testing.assert_allclose(float(TOTAL(tree)), ref.sum(), rtol=1e-6)
        assert_consistent(tree)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(sumtree.get)(tree, jnp.arange(capacity))), ref.astype(np.float32)
    )


def test_set_ignores_out_of_range_indices():
    tree = SET(sumtree.init(20, 4), jnp.arange(20), jnp.ones(20))
    before = [np.asarray(x) for x in tree.levels]
    after = SET(tree, jnp.array([-1, -20, 24, 1000]), jnp.full(4, 7.0))
    for b, a in zip(before, after.levels):
        np.testing.assert_array_equal(b, a)
    assert np.asarray(jax.jit(sumtree.get)(tree, jnp.array([19, 24, -1]))).tolist() == [1.0, 0.0, 0.0]


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def random_updates(tree, steps, batch, capacity, key):
    """`steps` batched sets with duplicate indices (half the batch drawn from 8 hot slots), ~1/3 zeros and
    values spanning 12 orders of magnitude."""

    def body(i, tree):
        k1, k2, k3, k4 = jax.random.split(jax.random.fold_in(key, i), 4)
        idx = jax.random.randint(k1, (batch,), 0, capacity)
        idx = jnp.where(jnp.arange(batch) % 2 == 0, idx, jax.random.randint(k4, (batch,), 0, 8))
        mag = 10.0 ** jax.random.uniform(k2, (batch,), minval=-6, maxval=6)
        vals = jnp.where(jax.random.uniform(k3, (batch,)) < 0.35, 0.0, mag)
        return sumtree.set(tree, idx, vals)

    return jax.lax.fori_loop(0, steps, body, tree)


def test_root_stays_exact_after_10k_batched_updates():
    capacity = 50_000
    tree = random_updates(sumtree.init(capacity), 10_000, 64, capacity, jax.random.key(0))
    exact = leaves(tree, capacity).sum()
    assert exact > 0
    assert abs(float(TOTAL(tree)) - exact) / exact < 1e-6
    assert_consistent(tree, rtol=1e-5)


def test_zero_priority_items_are_never_sampled():
    """90% zeros, positives next to zeros and at group ends, tiny values beside huge ones; 400k draws."""
    capacity, f = 10_000, 16
    rng = np.random.default_rng(1)
    vals = np.where(rng.random(capacity) < 0.9, 0.0, 10.0 ** rng.uniform(-30, 3, capacity)).astype(np.float32)
    vals[f - 1 :: f * 7] = 1e3  # last child of some groups
    vals[-1], vals[0] = 0.0, 0.0
    tree = SET(sumtree.init(capacity, f), jnp.arange(capacity), jnp.asarray(vals))
    for stratified in (False, True):
        idx, probs = SAMPLE(tree, jax.random.key(stratified), 200_000, stratified)
        idx = np.asarray(idx)
        assert np.all(vals[idx] > 0), f"sampled zero-priority leaves {np.unique(idx[vals[idx] == 0])}"
        assert np.all(np.asarray(probs) > 0)
    # Targets on interval boundaries, at and past the total: find still lands on positive leaves.
    csum = np.cumsum(vals.astype(np.float64))
    total = float(TOTAL(tree))
    targets = np.concatenate([csum[vals > 0][:-1], [0.0, total, np.nextafter(total, 0), 2 * total]])
    found = np.asarray(jax.jit(sumtree.find)(tree, jnp.asarray(targets, jnp.float32)))
    assert np.all(vals[found] > 0)


@pytest.mark.parametrize("stratified", [False, True])
def test_sampling_frequencies_match_priorities(stratified, chi_square):
    capacity = 300
    rng = np.random.default_rng(2)
    vals = (rng.exponential(size=capacity) * (rng.random(capacity) < 0.8)).astype(np.float32)
    tree = SET(sumtree.init(capacity, 16), jnp.arange(capacity), jnp.asarray(vals))
    idx, probs = SAMPLE(tree, jax.random.key(3), 400_000, stratified)
    idx = np.asarray(idx)
    counts = np.bincount(idx, minlength=capacity)
    expected = vals / vals.astype(np.float64).sum()
    np.testing.assert_allclose(np.asarray(probs), expected[idx], rtol=1e-5)
    assert chi_square(counts, expected) > 1e-4
    # The test has power: the same draws are rejected against a slightly different distribution.
    tilted = expected * (1 + 0.1 * (np.arange(capacity) % 2))
    assert chi_square(counts, tilted) < 1e-6


def test_per_level_sampling_resolves_millions_of_equal_leaves():
    """A single float32 uniform scaled by the total reaches only 2**23 targets: with C = 0.4 * 2**23 equal
    leaves, even leaves would get 2 of them and odd leaves 3 (a 40/60 split). One uniform per level keeps
    even and odd leaves equally likely; the coarse single-uniform descent shows the split."""
    capacity = 3_355_443
    tree = SET(sumtree.init(capacity), jnp.arange(capacity), jnp.ones(capacity))

    @jax.jit
    def both(tree, key):
        coarse = sumtree.find(tree, jax.random.uniform(key, (200_000,)) * sumtree.total(tree))
        return sumtree.sample(tree, key, 200_000)[0], coarse

    fine, coarse = both(tree, jax.random.key(0))
    assert abs(np.mean(np.asarray(fine) % 2) - 0.5) < 0.01
    assert abs(np.mean(np.asarray(coarse) % 2) - 0.5) > 0.05


def test_empty_tree_samples_index_zero_with_probability_zero():
    idx, probs = SAMPLE(sumtree.init(100), jax.random.key(0), 8, False)
    assert np.all(np.asarray(idx) == 0) and np.all(np.asarray(probs) == 0)


def test_sample_and_set_vmap_over_seeds():
    tree = SET(sumtree.init(50), jnp.arange(50), jnp.arange(50.0))
    keys = jax.random.split(jax.random.key(0), 3)
    draw = jax.jit(lambda k: sumtree.sample(tree, k, 16))
    batched = jax.device_get(jax.jit(jax.vmap(draw))(keys))  # NumPy: indexed below without a compile
    for i, k in enumerate(keys):
        single = draw(k)
        np.testing.assert_array_equal(batched[0][i], single[0])
        np.testing.assert_allclose(batched[1][i], single[1])
    values = jnp.stack([jnp.ones(50), jnp.arange(50.0)])
    trees = jax.jit(jax.vmap(lambda v: sumtree.set(sumtree.init(50), jnp.arange(50), v)))(values)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(sumtree.total))(trees)), [50.0, 1225.0])
