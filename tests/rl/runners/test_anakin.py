"""rl/runners/anakin.py: bit-exact resume, a recurrent carry handled generically, no host round-trips in a chunk,
vmapped seeds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.experiment import build, run, validate
from buffers.sequences import make_sequence_buffer
from rl.runners.anakin import Anakin, _repeat
from tests.conftest import SHIPPED


def _leaves(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def test_resume_is_bit_exact(tiny_cfg, tmp_path):
    """N steps, checkpoint, resume to N+M == N+M straight: every leaf of the runner state, bit for bit."""
    common = ("seeds=2", "log_interval=400")
    straight = run(tiny_cfg(*common, "total_steps=1600"), tmp_path / "straight")
    first = run(tiny_cfg(*common, "total_steps=800"), tmp_path / "first")
    resumed = run(tiny_cfg(*common, "total_steps=1600", f"resume={tmp_path / 'first'}"), tmp_path / "unused")
    assert first["env_steps"] == 800 and resumed["env_steps"] == straight["env_steps"] == 1600
    a, b = _leaves(straight["state"]), _leaves(resumed["state"])
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert int(np.asarray(resumed["state"][0].agent.updates)[0]) > 0  # training happened on both sides of the resume
    assert straight["eval_returns"] == resumed["eval_returns"]
    # The resumed run continues in its own run dir: one metrics.csv with the same rows as the straight run.
    assert resumed["run_dir"] == str(tmp_path / "first") and not (tmp_path / "unused").exists()
    assert (tmp_path / "straight" / "metrics.csv").read_text() == (tmp_path / "first" / "metrics.csv").read_text()


class CountingAgent:
    """A random agent whose carry counts the steps since its episode began; it stores the carry it had
    before acting. Exercises the runner's carry handling for recurrent agents."""

    train_interval, learning_starts, batch_size = 2, 16, 4

    def __init__(self, num_envs):
        self.buffer = make_sequence_buffer(num_envs, 64, 4)

    def init(self, key, obs_example):
        return {"updates": jnp.zeros((), jnp.int32)}

    def initial_carry(self, num_envs):
        return {"count": jnp.zeros((num_envs,), jnp.int32)}

    def act(self, state, obs, carry, key, env_ids, explore=True):
        return jax.random.randint(key, env_ids.shape, 0, 2), {"count": carry["count"] + 1}, {}

    def make_step(self, obs, action, reward, terminated, truncated, next_obs, carry, extras):
        return {"obs": obs, "count": carry["count"], "done": terminated | truncated}

    def step_prototype(self, obs_example):
        return {"obs": obs_example, "count": jnp.int32(0), "done": jnp.bool_(False)}

    def train_step(self, state, buffer_state, key):
        return {"updates": state["updates"] + 1}, buffer_state, {"size": self.buffer.size(buffer_state)}


def test_recurrent_carry_is_reset_on_done(tiny_cfg):
    cfg = tiny_cfg("num_envs=3", "seeds=2", "total_steps=120")
    runner = Anakin(validate(cfg), agent=CountingAgent(3))
    state, it = runner.init()
    state, it, out = runner.chunk(state, it, runner.zero_totals(state), runner.total_iters)
    data = jax.device_get(jax.jit(lambda rows: rows.data)(state.buffer.rows))
    written = np.asarray(state.buffer.rows.written)
    assert written.shape == (2, 3) and (written == 120 // 3).all()
    for s in range(2):
        for e in range(3):
            count, done = data["count"][s, e, :40], data["done"][s, e, :40]
            expected = np.zeros(40, int)
            for t in range(1, 40):
                expected[t] = 0 if done[t - 1] else expected[t - 1] + 1
            np.testing.assert_array_equal(count, expected)
            assert done.any()  # random CartPole episodes end within 40 steps
    # Training starts once 16 env steps were taken: iterations of 6 env steps, 20 of them, from the 3rd.
    np.testing.assert_array_equal(np.asarray(state.agent["updates"]), [18, 18])
    assert np.all(np.asarray(out.episodes) > 0)


def test_chunk_has_no_host_round_trips(tiny_cfg):
    runner = build(tiny_cfg("seeds=2"))
    state, it = runner.init()
    jaxpr = str(jax.make_jaxpr(runner._chunk)(state, it, runner.zero_totals(state), 3))
    for primitive in ("callback", "io_callback", "debug_print", "outfeed"):
        assert primitive not in jaxpr


@pytest.mark.optimized  # a vmapped and a single init program compared bit for bit
def test_seeds_are_independent_streams(tiny_cfg):
    """Seed i of a vmapped run starts like a single run with seed = cfg.seed + i; seeds differ."""
    two = build(tiny_cfg("seeds=2", "seed=5"))
    one = build(tiny_cfg("seeds=1", "seed=6"))
    (s2, _), (s1, _) = two.init(), one.init()
    for x, y in zip(_leaves(s2.agent.params), _leaves(s1.agent.params)):
        np.testing.assert_array_equal(x[1], y[0])
        assert x.ndim == 2 or not np.array_equal(x[0], x[1])  # kernels differ (biases start at zero)
    np.testing.assert_array_equal(np.asarray(s2.obs)[1], np.asarray(s1.obs)[0])


def _run_in_pieces(runner, pieces):
    state, it = runner.init()
    totals = runner.zero_totals(state)
    for n in pieces:
        state, it, totals = runner.chunk(state, it, totals, n)
    return state, it, totals


@pytest.mark.optimized  # blocked and straight loops compared bit for bit
def test_blocked_loop_and_split_calls_equal_one_straight_call(tiny_cfg):
    """Accelerators run the chunk as blocks of known trip count plus the rest (`block`); both, and calls
    split across the start of training, give the one straight call's state and totals bit for bit."""
    cfg = tiny_cfg("num_envs=3", "seeds=2", "total_steps=120")
    ref = Anakin(validate(cfg), agent=CountingAgent(3))
    assert (ref.block, ref.select, ref.learn_iter) == (1, False, 3)  # CPU; 6 env steps an iteration, training from the 3rd
    assert ref.train_from == 12  # env steps collected before the first train step (iterations 1 and 2)
    expected = _run_in_pieces(ref, [20])
    for block, select, pieces in [(1, False, [1, 4, 15]), (1, True, [20]), (4, True, [20]), (4, True, [2, 11, 7]),
                                  (8, False, [5, 15])]:
        runner = Anakin(validate(cfg), agent=CountingAgent(3))
        runner.block, runner.select = block, select  # read when the chunk is traced
        got = _run_in_pieces(runner, pieces)
        for x, y in zip(_leaves(expected), _leaves(got)):
            np.testing.assert_array_equal(x, y, err_msg=f"block {block}, select {select}, calls {pieces}")
    np.testing.assert_array_equal(np.asarray(expected[0].agent["updates"]), [18, 18])


def test_repeat_runs_blocks_of_known_trip_count_then_the_rest():
    """`_repeat(step, n, carry, block)`: n steps in all (n traced); with block > 1 as an outer loop of
    `n // block` runs of a `block`-step loop of known trip count (a scan of that length) and the rest; block 1:
    one loop, no scan."""
    step = lambda i, total: (i + 1, total + i)  # the step index and the sum of the indices seen

    def jaxpr(block):
        return str(jax.make_jaxpr(lambda n: _repeat(step, n, (jnp.int32(0), jnp.int32(0)), block))(np.int32(0)))

    assert "length=4" in jaxpr(4) and "scan" not in jaxpr(1)
    for block in (1, 4):
        repeat = jax.jit(lambda n, b=block: _repeat(step, n, (jnp.int32(0), jnp.int32(0)), b))
        for n in (0, 3, 4, 11):
            i, total = repeat(np.int32(n))
            assert (int(i), int(total)) == (n, n * (n - 1) // 2)


class WaitingAgent(CountingAgent):
    """Its buffer can sample only once 40 steps are stored (after `learning_starts`)."""

    def __init__(self, num_envs):
        self.buffer = make_sequence_buffer(num_envs, 64, 4, min_size=40)


def test_train_steps_wait_until_the_buffer_can_sample(tiny_cfg):
    runner = Anakin(validate(tiny_cfg("num_envs=3", "seeds=2", "total_steps=120")), agent=WaitingAgent(3))
    state, _, totals = _run_in_pieces(runner, [20])
    # 6 env steps per iteration: 42 stored after the 7th, so iterations 7..20 train.
    np.testing.assert_array_equal(np.asarray(state.agent["updates"]), [14, 14])
    np.testing.assert_array_equal(np.asarray(totals.updates), [14, 14])
    sizes = np.asarray(totals.metrics["size"]) / 14
    np.testing.assert_allclose(sizes, np.mean([6 * k for k in range(7, 21)]))


def test_accelerator_chunk_has_no_conditional(tiny_cfg):
    """No `lax.cond` in the accelerators' loop: on a GPU each costs a device-to-host copy of its predicate."""
    runner = Anakin(validate(tiny_cfg("num_envs=3", "seeds=2", "total_steps=120")), agent=CountingAgent(3))
    runner.block, runner.select = 32, True  # what an accelerator backend sets
    state, it = runner.init()
    hlo = runner.chunk.lower(state, it, runner.zero_totals(state), np.int32(3)).compile(SHIPPED).as_text()
    assert " conditional(" not in hlo


def test_agent_state_is_one_rows_state_without_the_seed_axis(tiny_cfg):
    """`agent_state(state, row)` (what `agents.experiment.load_policy` acts with): row `row` of every leaf of the agent state."""
    runner = build(tiny_cfg("seeds=2", "seed=5"))
    state = runner.init()
    for row in (0, 1):
        got = runner.agent_state(state, row)
        for x, y in zip(_leaves(got), _leaves(state[0].agent), strict=True):
            np.testing.assert_array_equal(x, y[row])


def test_the_train_step_is_traced_once_per_runner(tiny_cfg):
    """Restoring or evaluating traces no train step; the totals' metric names and the chunk share one trace of
    it (jitted `Anakin.train`: a trace of Muesli's step takes seconds)."""
    traced = []

    class Traced(CountingAgent):
        def train_step(self, state, buffer_state, key):
            traced.append(1)
            return super().train_step(state, buffer_state, key)

    runner = Anakin(validate(tiny_cfg("num_envs=3", "total_steps=60")), agent=Traced(3))
    runner.restore_target()
    assert traced == []
    state, it = runner.init()
    totals = runner.zero_totals(state)
    runner.chunk(state, it, totals, np.int32(10))
    assert len(traced) == 1


def test_the_chunk_compiles_with_region_based_copy_insertion(tiny_cfg):
    """On the CPU the chunk is compiled with `xla_cpu.loop_options()` (region-based copy insertion): fewer copies
    of loop-carried values than XLA's default copy insertion, and the same state bit for bit after 40 iterations."""
    from rl.infra.xla_cpu import LOOP_OPTIONS
    from scripts.hlo_kernels import iteration_counts

    runner = build(tiny_cfg("seeds=2", "total_steps=800"))
    state, it = runner.init()
    lowered = runner.chunk.lower(state, it, runner.zero_totals(state), np.int32(40))
    default = {k: not v for k, v in LOOP_OPTIONS.items()}
    ours, xla_default = lowered.compile(SHIPPED), lowered.compile({**SHIPPED, **default})
    copies = [iteration_counts(c.as_text(), runner.block)["copy"] for c in (ours, xla_default)]
    assert copies[0] < copies[1], copies
    copy = jax.jit(lambda tree: jax.tree_util.tree_map(jnp.copy, tree))
    ends = [c(copy(state), it, runner.zero_totals(state), np.int32(40))[0]
            for c in (ours, xla_default)]
    assert int(ends[0].agent.updates[0]) > 0
    for x, y in zip(_leaves(ends[0]), _leaves(ends[1]), strict=True):
        np.testing.assert_array_equal(x, y)
