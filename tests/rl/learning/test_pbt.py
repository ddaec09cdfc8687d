"""Population-based training inside the Anakin program (rl/learning/pbt.py, rl/runners/anakin.py,
rl/infra/lineage.py): the exploit/explore step against a NumPy reference, PBT off bit-identical, the lineage
file, resume, refusals; and (slow) PBT rescuing a grid with bad learning rates on CartPole."""

from __future__ import annotations

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.experiment import build, run
from agents.setup import compose
from rl.config import ConfigError
from rl.infra import lineage
from rl.learning import pbt
from tests.conftest import SHIPPED, TINY_DQN

COVERS = {"train.population": ["test_the_event_matches_numpy", "test_lineage_and_metrics",
                               "test_bad_config_is_refused"]}

LRS = "population.agent.optim.lr=[1e-4,1e-3,3e-3,1e-2]"
GRID = (LRS, "population.agent.discount=[0.9,0.99]")  # 8 members
PBT = ("population.pbt.interval=400", "population.pbt.quantile=0.25", "population.pbt.perturb=[0.8,1.25]")


def _leaves(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def _equal(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def _reference(returns, key, quantile, perturb, num_keys):
    """NumPy re-derivation of `pbt.choose` from its docstring (the random draws are jax.random's)."""
    m = len(returns)
    k = max(1, int(quantile * m))
    k_choice, k_factor = jax.random.split(key)
    choice = np.asarray(jax.random.randint(k_choice, (m,), 0, k))
    index = np.asarray(jax.random.randint(k_factor, (m, num_keys), 0, len(perturb)))
    order = np.argsort(returns, kind="stable")
    source, factor = np.arange(m), np.ones((m, num_keys), np.float32)
    if np.all(np.isfinite(returns)):
        for member in order[:k]:
            if returns[order[m - k:][choice[member]]] > returns[member]:
                source[member] = order[m - k:][choice[member]]
                factor[member] = np.float32(perturb)[index[member]]
    return source, factor


_choose = jax.jit(lambda r, k: pbt.choose(r, k, 0.25, (0.8, 1.25), 2))


@pytest.mark.parametrize("returns", [
    [3.0, 1.0, 4.0, 1.5, 9.0, 2.0, 6.0, 5.0],
    [1.0, 1.0, 1.0, 2.0, 2.0, 0.5, 7.0, 7.0],  # ties: the stable order decides
    [1.0, 2.0, 3.0],  # quantile 0.25 of 3: one member replaced
    [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0],  # all alike (nothing learned yet): nobody copies
    [1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0],  # the second worst ties the one it would copy: it keeps its own
    [1.0, np.nan, 3.0, 4.0],  # a member without a return: nobody copies
])
@pytest.mark.parametrize("seed", [0, 1])
def test_choose_matches_numpy(returns, seed):
    key = jax.random.PRNGKey(seed)
    source, factor = _choose(np.float32(returns), key)
    ref_source, ref_factor = _reference(np.float32(returns), key, 0.25, (0.8, 1.25), 2)
    np.testing.assert_array_equal(np.asarray(source), ref_source)
    np.testing.assert_array_equal(np.asarray(factor), ref_factor)


def test_next_event():
    """Events fall after the first iteration from `first` on whose env steps reach a multiple of the interval;
    traced and Python arithmetic agree."""
    for spi, interval, first in [(4, 400, 25), (40, 100, 1), (16, 10, 3), (400, 400, 1), (3, 10, 1), (7, 100, 5)]:
        counts = range(200)
        events = [pbt.next_event(c, spi, interval, first) for c in counts]
        traced = jax.jit(lambda c, spi=spi, interval=interval, first=first: pbt.next_event(c, spi, interval, first))
        assert [int(traced(np.int32(c))) for c in counts] == events
        for c, e in zip(counts, events):
            assert e > c and e >= first and (e - 1) * spi // interval < e * spi // interval
            assert not any((j - 1) * spi // interval < j * spi // interval for j in range(max(c + 1, first), e))


def test_the_event_matches_numpy(tmp_path):
    """`_pbt_event` on a real runner state (8 members x 2 seeds, trained 800 steps): members in the bottom
    quantile of the returns we set take the source member's agent state bit for bit (params, optimiser state,
    target params, counter; seed j from seed j) and its hyperparameters times a perturb factor, clipped to the
    agent's bounds; the others keep theirs; buffers, envs, keys and episode statistics are untouched; the
    window restarts and `source` records the lineage."""
    runner = build(compose([*TINY_DQN, "seeds=2", *GRID, "population.pbt.interval=100000"]))
    state, _, _ = runner.advance(runner.init(), 0, 800)
    s, it = state
    returns = np.float32([3.0, 1.0, 4.0, 1.5, 9.0, 2.0, 6.0, 5.0])
    s = s.replace(pbt=s.pbt.replace(score=jnp.repeat(jnp.asarray(returns * 2), 2), count=jnp.full(16, 2.0)))
    before, after = s, jax.jit(runner._pbt_event)(s, it)

    key = pbt.event_key(0, it)
    keys = sorted(before.agent.hparams)
    assert keys == ["discount", "optim.lr"]
    source, factor = _reference(returns, key, 0.25, (0.8, 1.25), 2)
    assert sorted(np.flatnonzero(source != np.arange(8))) == [1, 3]  # the two worst
    rows = (source[:, None] * 2 + np.arange(2)).reshape(-1)
    _equal(after.agent.agent, jax.jit(lambda t: jax.tree_util.tree_map(lambda x: x[rows], t))(before.agent.agent))
    for i, k in enumerate(keys):
        lo, hi = runner.agent.bounds.get(k, (-np.inf, np.inf))
        old = np.asarray(before.agent.hparams[k])[::2]
        new = np.where(source != np.arange(8), np.clip(old[source] * factor[:, i], lo, hi), old)
        np.testing.assert_array_equal(np.asarray(after.agent.hparams[k]), np.repeat(new.astype(np.float32), 2))
    _equal((after.buffer, after.env, after.obs, after.stats, after.key),
           (before.buffer, before.env, before.obs, before.stats, before.key))
    np.testing.assert_array_equal(after.pbt.source, np.repeat(source, 2))
    np.testing.assert_array_equal(after.pbt.recent, np.repeat(returns, 2))
    assert not np.any(after.pbt.count) and not np.any(after.pbt.score)


def _pieces(cfg, block: int, select: bool, calls: list[int]):
    """(state, totals) after running the chunk `calls` times, in blocks of `block` steps, the train step and
    the event selected (accelerators) or under cond."""
    runner = build(cfg)
    runner.block, runner.select = block, select  # read when the chunk is traced
    s, it = runner.init()
    totals = runner.zero_totals(s)
    for n in calls:
        s, it, totals = runner.chunk(s, it, totals, np.int32(n))
    return s, totals


PBT_EVENTS = [*TINY_DQN, "seeds=1", LRS, "population.pbt.interval=40", "population.pbt.quantile=0.5"]


def test_events_do_not_depend_on_calls():
    """The events (every 40 env steps) give the same state whether the chunk runs as one call or three."""
    cfg = compose(PBT_EVENTS)
    expected = _pieces(cfg, 1, False, [100])
    assert np.any(np.asarray(expected[0].agent.hparams["optim.lr"]) != np.float32([1e-4, 1e-3, 3e-3, 1e-2]))
    _equal(expected, _pieces(cfg, 1, False, [7, 30, 63]))


@pytest.mark.slow  # three more programs compiled with XLA's defaults (blocked and straight compared bit for bit)
def test_events_do_not_depend_on_blocks():
    """... nor on blocks of known trip count, with the train step and the event selected (accelerators)."""
    cfg = compose(PBT_EVENTS)
    expected = _pieces(cfg, 1, False, [100])
    for block, select, calls in [(4, True, [100]), (8, True, [13, 50, 37])]:
        _equal(expected, _pieces(cfg, block, select, calls))


def test_accelerator_chunk_has_no_conditional():
    """With PBT too, no `lax.cond` in the accelerators' chunk (the event is computed and selected)."""
    runner = build(compose([*TINY_DQN, "seeds=1", LRS, "population.pbt.interval=40"]))
    runner.block, runner.select = 32, True  # what an accelerator backend sets
    state, it = runner.init()
    hlo = runner.chunk.lower(state, it, runner.zero_totals(state), np.int32(3)).compile(SHIPPED).as_text()
    assert " conditional(" not in hlo


@pytest.fixture(scope="module")
def pbt_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pbt")
    return run(compose([*TINY_DQN, "seeds=2", "total_steps=2000", *GRID, *PBT]), out), out


def test_lineage_and_metrics(pbt_run):
    """pbt.csv: at each event (every 400 env steps from the first train step on) a row per member; the two
    worst by the ranked return copied a better member of the top two and perturbed its values by 0.8 or 1.25
    within the bounds; the others kept theirs. metrics.csv rows carry each row's current values (`hparam/<key>`),
    and the final state holds the last event's."""
    result, out = pbt_run
    events = lineage.read(out / "pbt.csv")
    steps = sorted({r["env_steps"] for r in events})
    assert steps == [400, 800, 1200, 1600, 2000]
    values = {m: (float(o["agent.optim.lr"]), float(o["agent.discount"]))
              for m, o in enumerate(result["members"][i]["overrides"] for i in range(8))}
    for step in steps:
        rows = sorted((r for r in events if r["env_steps"] == step), key=lambda r: r["member"])
        assert [r["member"] for r in rows] == list(range(8))
        returns = [r["return"] for r in rows]
        rank = np.argsort(returns, kind="stable")
        copied = [r["member"] for r in rows if r["source"] != r["member"]]
        assert set(copied) <= set(rank[:2]) and copied  # the worst two, but for one that ties the best two
        assert all(returns[m] >= min(returns[t] for t in rank[-2:]) for m in set(rank[:2]) - set(copied))
        new = {}
        for r in rows:
            lr, discount = r["agent.optim.lr"], r["agent.discount"]
            if r["member"] in copied:
                assert r["source"] in rank[-2:] and returns[r["source"]] > r["return"]
                src_lr, src_discount = values[r["source"]]
                assert any(np.isclose(lr, src_lr * f, rtol=1e-6) for f in (0.8, 1.25))
                assert any(np.isclose(discount, min(src_discount * f, 1.0), rtol=1e-6) for f in (0.8, 1.25))
            else:
                assert (lr, discount) == pytest.approx(values[r["member"]], rel=1e-6)
            new[r["member"]] = (lr, discount)
        values = new
    final = result["state"][0].agent.hparams
    np.testing.assert_allclose(np.asarray(final["optim.lr"]), np.repeat([values[m][0] for m in range(8)], 2),
                               rtol=1e-6)
    with open(out / "metrics.csv", newline="") as f:
        last = [r for r in csv.DictReader(f) if r["env_steps"] == "2000"]
    assert len(last) == 16
    for r in last:
        assert float(r["hparam/optim.lr"]) == pytest.approx(values[int(r["member"])][0], rel=1e-6)
        assert float(r["hparam/discount"]) == pytest.approx(values[int(r["member"])][1], rel=1e-6)
        assert float(r["agent.optim.lr"]) == float(result["members"][int(r["member"])]["overrides"]["agent.optim.lr"])


def test_pbt_off_is_bit_identical(tmp_path):
    """`population.pbt.interval=0` (the default) runs the population as without a pbt section: every leaf,
    metrics.csv; no pbt.csv, no hparam columns."""
    common = [*TINY_DQN, "seeds=1", "total_steps=800", LRS]
    plain = run(compose(common), tmp_path / "plain")
    off = run(compose([*common, "population.pbt.interval=0", "population.pbt.quantile=0.5"]), tmp_path / "off")
    _equal(plain["state"], off["state"])
    assert (tmp_path / "plain" / "metrics.csv").read_text() == (tmp_path / "off" / "metrics.csv").read_text()
    assert not (tmp_path / "off" / "pbt.csv").exists()
    assert "hparam/" not in (tmp_path / "off" / "metrics.csv").read_text()


def test_resume_is_bit_exact(tmp_path, pbt_run):
    """A PBT run stopped at 1000 env steps (between events) and resumed to 2000 == the straight run: every
    leaf (hyperparameters and PBT windows included), pbt.csv and metrics.csv. A resume with other population
    values is refused naming the key."""
    straight, out = pbt_run
    common = [*TINY_DQN, "seeds=2", *GRID, *PBT]
    run(compose([*common, "total_steps=1000"]), tmp_path / "run")
    with open(tmp_path / "run" / "pbt.csv", "a") as f:  # an event the stopped run logged after its checkpoint
        f.write("1200,0,0,1.0,0.1,0.9\n")
    resumed = run(compose([*common, "total_steps=2000", f"resume={tmp_path / 'run'}"]), tmp_path / "unused")
    _equal(straight["state"], resumed["state"])
    assert (tmp_path / "run" / "pbt.csv").read_text() == (out / "pbt.csv").read_text()
    assert (tmp_path / "run" / "metrics.csv").read_text() == (out / "metrics.csv").read_text()
    other = [*TINY_DQN, "seeds=2", LRS, "population.agent.discount=[0.9,0.95]", *PBT, f"resume={tmp_path / 'run'}"]
    with pytest.raises(ConfigError, match=r"cannot resume: population.agent.discount differ"):
        run(compose(other), tmp_path / "unused2")


@pytest.mark.parametrize("overrides, message", [
    (["population.pbt.interval=-5"], "population.pbt.interval must be an integer >= 0"),
    (["population.pbt.interval=1.5"], "population.pbt.interval must be an integer >= 0"),
    (["population.pbt.interval=400", "population.pbt.quantile=0.7"], "population.pbt.quantile must be in (0, 0.5]"),
    (["population.pbt.interval=400", "population.pbt.quantile=0"], "population.pbt.quantile must be in (0, 0.5]"),
    (["population.pbt.interval=400", "population.pbt.perturb=[]"], "population.pbt.perturb must be a non-empty list"),
    (["population.pbt.interval=400", "population.pbt.perturb=[0.8,-1]"], "population.pbt.perturb must be a non-empty"),
    (["population.pbt.interval=400", "population.pbt.perturb=[0,1.25]"], "population.pbt.perturb must be a non-empty"),
    (["population.pbt.interval=400", "population.pbt.perturb=0.8"], "population.pbt.perturb must be a non-empty"),
    (["population.pbt.interval=400", "population.pbt.perturb=[true,1.25]"], "population.pbt.perturb must be a non-empty"),
    (["population.pbt.interval=400", "population.pbt.every=3"], "population.pbt.every: not a PBT key; PBT keys: "),
    (["population.pbt.interval=400", "population.agent.discount=[0.9]"],
     "population.pbt needs a population of at least 2 members"),
])
def test_bad_config_is_refused(overrides, message):
    grid = [] if any("population.agent" in o for o in overrides) else [LRS]
    with pytest.raises(ConfigError) as e:
        build(compose([*TINY_DQN, *grid, *overrides]))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_pbt_without_a_population_is_refused():
    with pytest.raises(ConfigError, match=r"^population.pbt needs a population of at least 2 members .*got 0$"):
        build(compose([*TINY_DQN, "population.pbt.interval=400"]))


@pytest.mark.slow
def test_pbt_rescues_bad_learning_rates_on_cartpole(tmp_path):
    """DQN on CartPole from a grid of 8 learning rates, half of them bad (3e-2 .. 3e-1 diverge or stall), 2
    seeds each, 250k env steps (epsilon decayed over 100k): with PBT every 10k steps the best member reaches
    500 (greedy) and the PBT run's median member (final training return, mean over seeds) beats the fixed
    population's median at the same steps."""
    common = ["agent=dqn", "env=cartpole", "logger=none", "seeds=2", "total_steps=250000", "eval_episodes=10",
              "agent.epsilon_decay_steps=100000", "population.agent.optim.lr=[1e-4,3e-4,1e-3,3e-3,3e-2,1e-1,2e-1,3e-1]"]
    fixed = run(compose(common), tmp_path / "fixed")
    with_pbt = run(compose([*common, "population.pbt.interval=10000", "population.pbt.quantile=0.25"]),
                   tmp_path / "pbt")
    final = lambda r: np.asarray([m["final_return"] for m in r["members"]])
    greedy = lambda r: np.asarray([m["eval_return"] for m in r["members"]])
    print({"fixed": {"final": final(fixed).tolist(), "eval": greedy(fixed).tolist()},
           "pbt": {"final": final(with_pbt).tolist(), "eval": greedy(with_pbt).tolist()}})
    assert max(greedy(with_pbt).max(), final(with_pbt).max()) >= 500
    assert np.median(final(with_pbt)) > np.median(final(fixed))


def test_pbt_accepts_the_smallest_population_its_check_names():
    """Two members (the stated minimum) get a PBT config; one is refused; interval 0 is off for any size."""
    assert pbt.pbt_config({"interval": 400}, members=2).interval == 400
    with pytest.raises(ValueError, match="at least 2 members"):
        pbt.pbt_config({"interval": 400}, members=1)
    assert pbt.pbt_config({"interval": 0}, members=1) is None
