"""rl/infra/sharding.py and rl/infra/distributed.py. Multi-device runs happen in subprocesses that start JAX with
`XLA_FLAGS=--xla_force_host_platform_device_count=N`, so this pytest process stays single-device."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from rl.infra import distributed, sharding
from tests.conftest import run_probe, xla_flags

ROOT = Path(__file__).resolve().parents[3]
TOY = ROOT / "tests" / "multidevice" / "toy_runner.py"
TRAIN = ROOT / "tests" / "multidevice" / "train_run.py"
# DQN on CartPole, small enough to compile fast; epsilon decays within the run so greedy actions (argmax
# of the learnt Q) drive the data: a device-dependent result would change the trajectories.
DQN = ["agent=dqn", "env=cartpole", "logger=none", "seeds=2", "num_envs=4", "total_steps=400", "log_interval=100",
       "eval_episodes=3", "agent.learning_starts=100", "agent.batch_size=32", "agent.network.hidden_sizes=[32]",
       "agent.target_update_period=10", "agent.epsilon_decay_steps=200", "agent.optim.lr=1e-3"]


def _env(devices: int, **extra: str) -> dict:
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices),
               PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", **extra)
    return env


def _run_all(jobs: dict[str, tuple[list[str], dict]], tmp_path: Path, timeout: int = 480, script: Path = TOY,
             out_arg: int = 2) -> dict:
    """Start every job at once (they are mostly JAX start-up and compilation), wait, load their JSON."""
    procs = {name: subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, (args, env) in jobs.items()}
    results = {}
    for name, p in procs.items():
        out, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"{name} failed:\n{out[-3000:]}"
    for name, (args, _) in jobs.items():
        path = Path(args[out_arg])
        if path.exists():
            results[name] = json.loads(path.read_text())
    return results


def test_four_devices_match_one_device_same_global_batch(tmp_path):
    jobs = {
        "one": (["1", "1", str(tmp_path / "one.json")], _env(1)),
        "data4": (["4", "1", str(tmp_path / "data4.json")], _env(4)),
        "seed2_data2": (["4", "2", str(tmp_path / "seed2_data2.json")], _env(4)),
    }
    r = _run_all(jobs, tmp_path)
    one = r["one"]
    assert one["describe"].startswith("1 device") and one["batch_shard_shape"] == [4, 32, 3]
    for name in ("data4", "seed2_data2"):
        np.testing.assert_allclose(r[name]["w"], one["w"], rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(r[name]["losses"], one["losses"], rtol=1e-4, atol=1e-5, err_msg=name)
    # where things lived: batch split over the data devices, buffer rows sharded, params replicated
    assert r["data4"]["batch_shard_shape"] == [4, 8, 3]
    assert r["data4"]["buffer_spec"] == "P(None, 'data')" and r["data4"]["params_spec"] == "P()"
    assert r["seed2_data2"]["batch_shard_shape"] == [2, 16, 3]
    assert r["seed2_data2"]["buffer_spec"] == "P('seed', 'data')"
    assert r["seed2_data2"]["params_spec"] == "P('seed',)"
    # the run is not trivially constant: the loss changes over training
    assert np.ptp(np.asarray(one["losses"])) > 0.1


def test_dqn_anakin_four_devices_match_one_device(tmp_path):
    """The real runner (scripts.train.run: DQN, Anakin, checkpoint) on 1 device, on 4 data-parallel devices
    and on 2 seed x 2 data devices, same global batch: same params, metrics and greedy eval returns; each run
    compiles its loop once (its state, counter and totals go in placed as they come back)."""
    jobs = {name: ([str(tmp_path / f"{name}.json"), str(tmp_path / name), *DQN, *extra], _env(n))
            for name, n, extra in (("one", 1, []), ("data4", 4, []), ("seed2_data2", 4, ["mesh.seed_devices=2"]))}
    r = _run_all(jobs, tmp_path, script=TRAIN, out_arg=0)
    one = r["one"]
    assert one["devices"] == 1 and one["specs"]["buffer"] == ["single"]
    assert {name: got["chunk_compiles"] for name, got in r.items()} == {"one": 1, "data4": 1, "seed2_data2": 1}
    for name in ("data4", "seed2_data2"):
        got = r[name]
        assert got["devices"] == 4
        for a, b in zip(got["params"], one["params"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
        assert got["eval_returns"] == one["eval_returns"], name
        rows_one = [line.split(",") for line in one["metrics_csv"].splitlines()]
        rows = [line.split(",") for line in got["metrics_csv"].splitlines()]
        assert rows[0] == rows_one[0] and len(rows) == len(rows_one) == 1 + 4 * 2
        np.testing.assert_allclose(np.array(rows[1:], float), np.array(rows_one[1:], float), rtol=1e-4, atol=1e-6,
                                   equal_nan=True, err_msg=name)
    # env state and buffer rows split over the data devices; agent params replicated over them (the seed
    # axis, of size 1 in data4, keeps its name in the placement the loop is given)
    assert "P('seed', 'data')" in r["data4"]["specs"]["env"] and "P('seed', 'data')" in r["data4"]["specs"]["buffer"]
    assert all("data" not in spec for spec in r["data4"]["specs"]["agent"])
    assert "P('seed', 'data')" in r["seed2_data2"]["specs"]["buffer"]
    assert r["seed2_data2"]["specs"]["agent"] == ["P('seed',)"]


# The sequence agents, small: a global batch of 8 sequences splits over 4 data devices.
SEQUENCE_AGENTS = {
    "r2d2": ["agent=r2d2_small", "agent.sequence_length=8", "agent.burn_in=2", "agent.period=4",
             "agent.batch_size=8", "agent.buffer_size=256", "agent.learning_starts=64", "agent.train_interval=4",
             "agent.lstm_size=16", "agent.network.hidden_sizes=[16]", "agent.network.head_hidden=[16]"],
    "muesli": ["agent=muesli_small", "agent.sequence_length=6", "agent.batch_size=8", "agent.buffer_size=256",
               "agent.learning_starts=64", "agent.train_interval=4", "agent.network.hidden_sizes=[16]",
               "agent.network.state_dim=16", "agent.network.model_hidden=[16]", "agent.network.head_hidden=[16]"],
}


# Muesli shards its sequences through the same runner code as R2D2 (~1 min of compiling on 2 cores): slow tier.
@pytest.mark.parametrize("agent", ["r2d2", pytest.param("muesli", marks=pytest.mark.slow)])
def test_sequence_agents_four_devices_match_one_device(tmp_path, agent):
    """R2D2 and Muesli shard their sampled sequences over the data devices: a 4-device run (envs, buffer
    rows and batch split 4 ways) ends with the 1-device run's params."""
    common = ["env=cartpole", "logger=none", "num_envs=4", "total_steps=320", "log_interval=160",
              "eval_episodes=0", *SEQUENCE_AGENTS[agent]]
    jobs = {name: ([str(tmp_path / f"{name}.json"), str(tmp_path / name), *common], _env(n))
            for name, n in (("one", 1), ("data4", 4))}
    r = _run_all(jobs, tmp_path, script=TRAIN, out_arg=0)
    assert r["data4"]["devices"] == 4 and "P('seed', 'data')" in r["data4"]["specs"]["buffer"]
    assert r["data4"]["chunk_compiles"] == r["one"]["chunk_compiles"] == 1
    header, *rows = [line.split(",") for line in r["one"]["metrics_csv"].splitlines()]
    assert any(row[header.index("train/loss")] for row in rows)  # updates happened
    for a, b in zip(r["data4"]["params"], r["one"]["params"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    """jax.distributed over 2 processes x 2 CPU devices (gloo collectives) == 1 process x 1 device."""
    port = _free_port()
    common = {"JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2",
                  "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    out = str(tmp_path / "multi.json")
    jobs = {f"proc{i}": (["4", "1", out], _env(2, JAX_PROCESS_ID=str(i), **common)) for i in range(2)}
    jobs["one"] = (["1", "1", str(tmp_path / "one.json")], _env(1))
    r = _run_all(jobs, tmp_path)
    multi = json.loads(Path(out).read_text())
    assert multi["describe"] == "4 devices (cpu, 2 process(es)): seed=1 x data=4"
    np.testing.assert_allclose(multi["w"], r["one"]["w"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(multi["losses"], r["one"]["losses"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_process_training_matches_one_process(tmp_path):
    """`python -m scripts.train distributed=env` in 2 processes x 2 CPU devices == the 1-device run."""
    port = _free_port()
    common = {"JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2",
              "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "scripts.train", *DQN, "checkpoint.enabled=false"]
    procs = [subprocess.Popen([*cmd, "distributed=env", f"hydra.run.dir={tmp_path / str(i)}"], cwd=ROOT,
                              env=_env(2, JAX_PROCESS_ID=str(i), **common), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    procs.append(subprocess.Popen([*cmd, f"hydra.run.dir={tmp_path / 'single'}"], cwd=ROOT, env=_env(1),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-3000:]
    single = np.genfromtxt(tmp_path / "single" / "metrics.csv", delimiter=",", skip_header=1)
    multi = np.genfromtxt(tmp_path / "0" / "metrics.csv", delimiter=",", skip_header=1)
    np.testing.assert_allclose(multi, single, rtol=1e-4, atol=1e-6, equal_nan=True)
    # one run dir (process 0's) and one set of metrics: process 1 adds its console lines only
    assert (tmp_path / "0" / "train.1.log").read_text().strip()
    assert not (tmp_path / "1" / "metrics.csv").exists()


LOOP_COLLECTIVES_PROBE = """
import json, re
import numpy as np
from agents.setup import compose
from agents.experiment import build
from rl.infra import sharding
runner = build(compose(["agent=dqn", "env=cartpole", "logger=none", "seeds=2", "num_envs=4", "mesh.seed_devices=2",
                        "agent.network.hidden_sizes=[16]"]))
state, it = runner.init()
with sharding.use_mesh(runner.mesh):
    hlo = runner.chunk.lower(state, it, runner.zero_totals(state), np.int32(3)).compile().as_text()
names = [m.group(1) for line in hlo.splitlines() if " all-reduce(" in line
         for m in [re.search(r'op_name="([^"]*)"', line)] if m]
print(json.dumps(names))
"""


def test_seeds_on_two_devices_share_no_nonfinite_flags_per_iteration():
    """With the seeds split over devices, a train step's non-finite flags stay with their seed (`Totals` keeps
    them per seed): no all-reduce of them in the loop body, which kept the devices in lockstep every
    iteration; the whole-state check reduces once per call, outside the loop."""
    names = run_probe(LOOP_COLLECTIVES_PROBE, devices=2)
    assert not [n for n in names if "while/body" in n and n.endswith("reduce_or")], names


def test_single_device_is_the_plain_path():
    assert jax.device_count() == 1, "the default test process must stay single-device"
    assert sharding.mesh_from_config(None) is None
    assert sharding.mesh_from_config({"devices": 1, "seed_devices": 1}) is None
    batch = {"obs": jnp.arange(6.0).reshape(3, 2)}
    assert sharding.shard_batch(batch) is batch  # identity without a mesh, also for odd batch sizes
    f = sharding.vmap_seeds(lambda x: x * 2)
    np.testing.assert_array_equal(f(jnp.ones((2, 3))), 2 * np.ones((2, 3)))
    sharding.check_divisible(None, seeds=3, num_envs=7)  # nothing to split


def test_bad_mesh_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"mesh.devices=2 but 1 devices exist"):
        sharding.make_mesh(2)
    with pytest.raises(ValueError, match=r"mesh.seed_devices=2 must be >= 1 and divide"):
        sharding.make_mesh(1, seed_devices=2)
    mesh = AbstractMesh((2, 4), (sharding.SEED_AXIS, sharding.DATA_AXIS))
    with pytest.raises(ValueError, match=r"num_envs=6, agent.batch_size=30 not divisible by the 4"):
        sharding.check_divisible(mesh, seeds=2, num_envs=6, **{"agent.batch_size": 30})
    with pytest.raises(ValueError, match=r"seeds=3 is not divisible by mesh.seed_devices=2"):
        sharding.check_divisible(mesh, seeds=3, num_envs=8)
    sharding.check_divisible(mesh, seeds=4, num_envs=8, batch_size=32)


def test_shard_batch_rejects_batch_not_divisible_by_data_devices():
    mesh = AbstractMesh((1, 4), (sharding.SEED_AXIS, sharding.DATA_AXIS))
    with jax.sharding.use_abstract_mesh(mesh), pytest.raises(
            ValueError, match=r"shape \(6, 2\).*not divisible by the 4 data-parallel"):
        jax.eval_shape(sharding.shard_batch, {"obs": jnp.zeros((6, 2))})


def test_runner_shardings_rejects_unknown_replicated_field():
    with pytest.raises(ValueError, match=r"replicated fields \['agent'\] are not in the runner state"):
        sharding.runner_shardings(jax.make_mesh((1, 1), ("seed", "data")), {"env": jnp.zeros((1, 2))})


def test_distributed_disabled_by_default_and_checks_keys():
    assert distributed.initialize(None) is False
    assert distributed.initialize({"enabled": False, "coordinator_address": "x:1"}) is False
    assert distributed.is_main_process()
    with pytest.raises(ValueError, match=r"unknown keys in `distributed`: \['num_hosts'\]"):
        distributed.initialize({"enabled": True, "num_hosts": 2})
    with pytest.raises(ValueError, match=r"num_processes and distributed.process_id must be set together"):
        distributed.initialize({"enabled": True, "num_processes": 2})
    with pytest.raises(ValueError, match=r"process_id=2 must be in \[0, num_processes=2\)"):
        distributed.initialize({"enabled": True, "num_processes": 2, "process_id": 2})


def test_distributed_enabled_starts_jax_distributed_once_with_the_given_keys(monkeypatch):
    """Enabled: `jax.distributed.initialize` gets the keys that are set (not `enabled`, not the nulls) and the
    call returns True; already initialised, it returns True without starting it again."""
    calls = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    section = {"enabled": True, "coordinator_address": "x:1", "num_processes": 2, "process_id": 1}
    assert distributed.initialize(section) is True
    assert calls == [{"coordinator_address": "x:1", "num_processes": 2, "process_id": 1,
                      "initialization_timeout": 300}]
    assert distributed.initialize(section) is True and len(calls) == 1


def test_leading_shardings_split_the_buffer_rows_and_replicate_the_rest():
    """A Sebulba learner's state: with `shard_data`, axis 0 over `data` where it divides, 1-D leaves (a row
    counter `[E]`) included; scalars and the agent state replicated."""
    mesh = sharding.mesh_over(jax.devices()[:1])
    tree = {"rows": jnp.zeros((4, 3)), "written": jnp.zeros(4, jnp.int32), "head": jnp.zeros((), jnp.int32)}
    specs = {k: v.spec for k, v in sharding.leading_shardings(mesh, tree, shard_data=True).items()}
    assert specs == {"rows": P(sharding.DATA_AXIS), "written": P(sharding.DATA_AXIS), "head": P()}
    assert all(v.spec == P() for v in sharding.leading_shardings(mesh, tree, shard_data=False).values())


def test_leading_shardings_divide_axis_0_by_the_data_axis_size():
    """Over a data axis of 2 (an abstract mesh: this process has one device) rows split where their first axis
    divides by 2, whatever the other axes; `[3, 4]` stays replicated."""
    from jax.sharding import AbstractMesh

    mesh = AbstractMesh((1, 2), (sharding.SEED_AXIS, sharding.DATA_AXIS))
    tree = {"even": jnp.zeros((4, 3)), "odd": jnp.zeros((3, 4)), "counter": jnp.zeros(6, jnp.int32)}
    specs = {k: v.spec for k, v in sharding.leading_shardings(mesh, tree, shard_data=True).items()}
    assert specs == {"even": P(sharding.DATA_AXIS), "odd": P(), "counter": P(sharding.DATA_AXIS)}


def test_mesh_over_takes_exactly_the_devices_given_in_order():
    """The Sebulba learner's mesh: `(seed=1, data=n)` over the given devices, in their order."""
    devices = jax.devices()[::-1][:2]
    mesh = sharding.mesh_over(devices)
    assert dict(mesh.shape) == {sharding.SEED_AXIS: 1, sharding.DATA_AXIS: len(devices)}
    assert list(mesh.devices.flat) == devices


def test_from_host_fills_each_device_with_its_slice():
    """from_host (no collective): a global array of the given sharding whose every shard is the host value's
    slice at that shard's index, for a split and a replicated leaf, a scalar included."""
    mesh = sharding.mesh_over(jax.devices())
    n = len(jax.devices())
    tree = {"rows": np.arange(4 * n * 3, dtype=np.float32).reshape(4 * n, 3), "head": np.int32(7)}
    shardings = {"rows": jax.sharding.NamedSharding(mesh, P(sharding.DATA_AXIS)), "head": sharding.replicated(mesh)}
    out = {k: sharding.from_host(v, shardings[k]) for k, v in tree.items()}
    for k, x in out.items():
        assert x.sharding == shardings[k] and x.shape == np.shape(tree[k])
        np.testing.assert_array_equal(np.asarray(x), tree[k])
        for shard in x.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(tree[k])[shard.index])
