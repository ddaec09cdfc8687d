"""agents.experiment keeps the Anakin runners of a process's last runs: a run whose programs are the same takes
the kept runner and compiles nothing, and trains exactly as a fresh runner does; a run whose programs differ (a
value the train step holds, the run length a schedule reads, the process's compile settings) has another key
(`_program_key`) and builds its own."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agents import experiment
from agents.experiment import run
from agents.setup import compose
from rl.infra import xla_cpu
from tests.conftest import TINY_DQN, compiles_of

BASE = [*TINY_DQN, "seeds=2", "total_steps=400", "log_interval=200", "eval_episodes=1"]


@pytest.fixture(autouse=True)
def nothing_kept():
    """Each test starts with no runner kept from the worker's earlier tests."""
    experiment._KEPT.clear()


def _leaves(result):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(result["state"])]


def test_a_run_of_the_same_programs_compiles_nothing_and_trains_as_a_fresh_runner(tmp_path):
    run(compose(BASE), tmp_path / "first")
    later = [*BASE, "total_steps=600", "log_interval=300", "eval_episodes=2", "checkpoint.interval=300"]
    with compiles_of("_chunk") as compiles:
        reused = run(compose(later), tmp_path / "reused")
    assert not compiles, compiles
    experiment._KEPT.clear()
    with compiles_of("_chunk") as compiles:
        fresh = run(compose(later), tmp_path / "fresh")
    assert len(compiles) == 1, compiles
    assert reused["env_steps"] == fresh["env_steps"] == 600
    for x, y in zip(_leaves(reused), _leaves(fresh), strict=True):
        np.testing.assert_array_equal(x, y)
    assert (tmp_path / "reused" / "metrics.csv").read_text() == (tmp_path / "fresh" / "metrics.csv").read_text()
    np.testing.assert_array_equal(reused["eval_returns"], fresh["eval_returns"])


def _key(*overrides: str) -> str:
    return experiment._program_key(experiment.build(compose([*BASE, *overrides])))


def test_runs_differing_only_in_what_the_host_loop_reads_share_a_key():
    assert _key() == _key("total_steps=600", "log_interval=300", "eval_episodes=2", "eval_interval=200",
                          "checkpoint.interval=300", "resume=null")


@pytest.mark.parametrize("then", [
    ["agent.optim.lr=2e-3"],  # a value the train step holds
    ["seeds=3"],  # the state's shapes
    ["on_nonfinite=skip"],  # the guard around the train step
], ids=["lr", "seeds", "on_nonfinite"])
def test_a_run_whose_programs_differ_has_its_own_key(then):
    assert _key() != _key(*then)


def test_the_run_length_a_schedule_reads_is_in_the_key():
    linear = "agent.optim.lr_schedule=linear"
    assert _key(linear) != _key(linear, "total_steps=600")
    assert _key(linear, "agent.optim.lr_decay_updates=50") == _key(linear, "agent.optim.lr_decay_updates=50",
                                                                   "total_steps=600")  # a set length: shared


MUESLI = ["agent=muesli_small", "env=cartpole", "logger=none", "agent.batch_size=4", "agent.learning_starts=64"]


def test_a_muesli_run_holds_its_length_only_where_a_decay_reads_it():
    """Muesli's programs read the run's length for a linear lr over the run and for the entropy bonus's decay,
    the config's or a population member's (the agent cannot know which members decay: a population's key keeps
    the length); a run of another length shares the rest."""
    def key(*overrides):
        return experiment._program_key(experiment.build(compose([*MUESLI, *overrides])))

    assert key("total_steps=400") == key("total_steps=800")
    for decays in (["agent.optim.lr_schedule=linear"], ["agent.entropy_end_fraction=0.5"],
                   ["population.agent.entropy_end_fraction=[1.0,0.5]"]):
        assert key("total_steps=400", *decays) != key("total_steps=800", *decays), decays


@pytest.mark.parametrize("setting", ["optimizations", "threefry"])
def test_the_compile_settings_are_in_the_key(setting):
    before = _key()
    unoptimised, unrolled = jax.config.read("jax_disable_most_optimizations"), xla_cpu.threefry_unrolled()
    try:
        if setting == "optimizations":
            jax.config.update("jax_disable_most_optimizations", not unoptimised)
        else:
            assert xla_cpu.unroll_threefry(not unrolled)
        assert _key() != before
    finally:
        jax.config.update("jax_disable_most_optimizations", unoptimised)
        xla_cpu.unroll_threefry(unrolled)
