"""The compiled, donated learner step of a sequence buffer (add + sample + set_priorities) updates storage in
place: no while loop, no capacity-sized copy or temporary; the detector is shown to catch copying variants."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from buffers.nstep import make_nstep_buffer
from buffers.sequences import make_sequence_buffer
from tests.conftest import SHIPPED

E, T, OBS = 4, 1500, 32
CAP = E * T
INSTR = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(\w+)\[([\d,]*)\]\S*\s+([\w-]+)\(")


def capacity_sized_copies(hlo: str, shapes: set[tuple[int, ...]], min_elements: int) -> list[str]:
    """HLO copy/concatenate/pad/transpose/reverse instructions producing one of the capacity-sized state
    `shapes`, or any array of >= `min_elements` elements."""
    found = []
    for line in hlo.splitlines():
        m = INSTR.match(line)
        if not m or m.group(3) not in ("copy", "concatenate", "pad", "transpose", "reverse", "copy-start"):
            continue
        dims = tuple(int(d) for d in m.group(2).split(",") if d)
        if dims in shapes or int(np.prod(dims)) >= min_elements:
            found.append(line.strip()[:160])
    return found


def in_place_report(compiled, state) -> dict:
    """A `while` instruction; capacity-sized copies; a temporary buffer as large as the main storage; whether
    every state buffer is aliased (donated in, updated in place, returned)."""
    hlo = compiled.as_text()
    ma = compiled.memory_analysis()
    leaves = jax.tree_util.tree_leaves(state)
    shapes = {tuple(x.shape) for x in leaves if x.size >= CAP}
    largest = max(leaves, key=lambda x: x.nbytes)
    state_bytes = sum(x.nbytes for x in leaves)
    return {"while": has_while(hlo), "copies": capacity_sized_copies(hlo, shapes, largest.size),
            "temp_ok": ma.temp_size_in_bytes < largest.nbytes,
            "aliased_ok": ma.alias_size_in_bytes >= state_bytes - 64}


def has_while(hlo: str) -> bool:
    return re.search(r"\swhile\(", hlo) is not None


def setup(prioritised: bool = True):
    """R2D2-like (priorities, sum tree) or Muesli-like (uniform, counted weights) buffer and inputs."""
    buf = make_sequence_buffer(E, T, 80, period=40, priority_exponent=0.9 if prioritised else None,
                               online_window=100)
    state = buf.init({"obs": np.zeros(OBS, np.float32), "done": False})
    steps = {"obs": jnp.ones((E, OBS), jnp.float32), "done": jnp.zeros(E, bool)}
    # unsafe_rbg keys: on CPU threefry itself lowers to a fixed-trip while loop, which would hide ours.
    key = jax.random.key(0, impl="unsafe_rbg")
    return buf, state, steps, key


def learner_step(buf):
    def step(state, key, steps, env_ids):
        state = buf.add(state, steps, env_ids)
        sample = buf.sample_mixed(state, key, 16, 0.25)
        if not buf.prioritised:
            return state, (sample.data, sample.mask)
        td = jnp.abs(sample.data["obs"][:, :, 0]).max(axis=1) + 0.1
        return buf.set_priorities(state, sample.slots, td), sample.mask.sum()

    return step


@pytest.mark.parametrize("prioritised", [True, False])
def test_donated_step_has_no_while_and_no_capacity_copy(prioritised):
    buf, state, steps, key = setup(prioritised)
    compiled = jax.jit(learner_step(buf), donate_argnums=0).lower(state, key, steps, jnp.arange(E)).compile(SHIPPED)
    report = in_place_report(compiled, state)
    assert report == {"while": False, "copies": [], "temp_ok": True, "aliased_ok": True}, report


def test_detector_catches_copying_variants():
    buf, state, steps, key = setup()
    ids = jnp.arange(E)
    step = learner_step(buf)
    # 1. Not donated: XLA must copy the storage before scattering into it.
    report = in_place_report(jax.jit(step).lower(state, key, steps, ids).compile(SHIPPED), state)
    assert report["copies"] and not report["aliased_ok"]

    # 2. Donated, but the old storage stays live next to the new one.
    def keeps_old(state, key, steps, env_ids):
        new, n = step(state, key, steps, env_ids)
        return new, n + jnp.sum(state.rows.storage[0]) + jnp.sum(new.rows.storage[0])

    report = in_place_report(jax.jit(keeps_old, donate_argnums=0).lower(state, key, steps, ids).compile(SHIPPED), state)
    assert report["copies"] or not report["temp_ok"]

    # 3. Donated, but storage rebuilt by a roll (what a shifting buffer would do).
    def rolls(state, key, steps, env_ids):
        new, n = step(state, key, steps, env_ids)
        storage = tuple(jnp.roll(x, 1, axis=1) for x in new.rows.storage)
        return new.replace(rows=new.rows.replace(storage=storage)), n

    report = in_place_report(jax.jit(rolls, donate_argnums=0).lower(state, key, steps, ids).compile(SHIPPED), state)
    assert report["copies"] or not report["temp_ok"]

    # 4. The while detector sees a data-dependent loop.
    loop = jax.jit(lambda n: jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2), (0, 1)))
    assert has_while(loop.lower(5).compile(SHIPPED).as_text())


@pytest.mark.parametrize("kind", ["sequence", "nstep"])
def test_donated_ops_keep_storage_pointers(kind):
    """Donated jitted add / set_priorities / consume_online reuse the storage buffers (device pointers)."""
    if kind == "sequence":
        buf = make_sequence_buffer(E, 50, 8, period=4, priority_exponent=0.6, online_window=8)
        state = buf.init({"obs": np.zeros(OBS, np.float32), "done": False})
        steps = {"obs": jnp.ones((3, OBS), jnp.float32), "done": jnp.zeros(3, bool)}
        leaf = lambda s: s.rows.storage[0]
    else:
        buf = make_nstep_buffer(E, 50, 3, 0.99, priority_exponent=0.6)
        proto = {"obs": np.zeros(OBS, np.float32), "action": np.int32(0), "reward": np.float32(0),
                 "terminated": False, "truncated": False, "next_obs": np.zeros(OBS, np.float32)}
        state = buf.init(proto)
        steps = jax.tree_util.tree_map(lambda x: jnp.ones((3,) + np.shape(x), np.asarray(x).dtype), proto)
        leaf = lambda s: s.rows.storage[0]
    add = jax.jit(buf.add, donate_argnums=0)
    setp = jax.jit(buf.set_priorities, donate_argnums=0)
    ptrs = lambda s: (leaf(s).unsafe_buffer_pointer(), s.weights.tree.levels[-1].unsafe_buffer_pointer(),
                      s.weights.priority.unsafe_buffer_pointer())
    state = add(state, steps, jnp.array([2, 0, 3]))
    before = ptrs(state)
    for t in range(5):
        state = add(state, steps, jnp.array([t % E, (t + 1) % E, (t + 2) % E]))
        state = setp(state, jnp.array([0, 50, 100]), jnp.array([1.0, 2.0, 3.0]))
        assert ptrs(state) == before
    if kind == "sequence":
        state = jax.jit(buf.consume_online, donate_argnums=0)(state)
        assert ptrs(state) == before


@pytest.mark.parametrize("layout", ["windows", "packed"])
def test_windows_layout_gathers_each_window_as_one_slice(layout):
    """With `layout="windows"` the compiled sample reads every window of L steps as one slice per leaf (its
    gathers' slice sizes hold L) and no gather reads one step per index; packed rows gather step by step."""
    L = 80
    buf = make_sequence_buffer(E, T, L, period=40, layout=layout)
    state = buf.init({"obs": np.zeros(OBS, np.float32), "done": False})
    hlo = jax.jit(lambda s, k: buf.sample(s, k, 16).data).lower(state, jax.random.key(0)).compile(SHIPPED).as_text()
    sizes = [tuple(int(d) for d in m.split(",")) for m in re.findall(r"slice_sizes=\{([\d,]+)\}", hlo)]
    assert sizes, "no gather in the compiled sample"
    windowed = [s for s in sizes if L in s]
    if layout == "windows":
        assert sorted(windowed) == [(1, L), (1, L, OBS)], sizes
    else:
        assert not windowed, sizes
