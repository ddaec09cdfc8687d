"""A miniature Anakin loop run in a subprocess by tests/rl/infra/test_sharding.py (JAX must start with the forced
device count, so this never runs inside the pytest process).

`python tests/multidevice/toy_runner.py DEVICES SEED_DEVICES OUT.json` with
`XLA_FLAGS=--xla_force_host_platform_device_count=N` set by the caller. Per seed: E envs step a random
walk, each env writes its row of a `[E, T, D]` buffer (scatter by env id), a batch of B is gathered at
random, a linear regressor is trained by Adam on it. Writes final params, losses and where things lived.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import optax
from flax import struct

from rl.infra import distributed, sharding

S, E, T, B, D, STEPS = 4, 8, 16, 32, 3, 40
OPT = optax.adam(1e-2)


@struct.dataclass
class State:
    agent: dict
    env: jax.Array  # [E, D]
    buffer: dict  # rows [E, T, D], head [E]
    key: jax.Array


def init(key):
    k1, k2 = jax.random.split(key)
    params = {"w": jax.random.normal(k1, (D, 1)), "b": jnp.zeros(1)}
    agent = {"params": params, "opt": OPT.init(params)}
    buffer = {"rows": jnp.zeros((E, T, D)), "head": jnp.zeros((E,), jnp.int32)}
    return State(agent, jax.random.normal(k2, (E, D)), buffer, key)


def train_step(agent, buffer, key, report):
    r, c = jax.random.split(key)
    rows = jax.random.randint(r, (B,), 0, E)
    cols = jax.random.randint(c, (B,), 0, T)
    x = sharding.shard_batch(buffer["rows"][rows, cols])
    if report is not None:
        jax.debug.inspect_array_sharding(x, callback=report)

    def loss(p):
        y = (x @ p["w"] + p["b"])[:, 0]
        return jnp.mean((y - jnp.sin(x).sum(-1)) ** 2)

    value, grads = jax.value_and_grad(loss)(agent["params"])
    updates, opt = OPT.update(grads, agent["opt"])
    return {"params": optax.apply_updates(agent["params"], updates), "opt": opt}, value


def make_run(report=None):
    def step(state, _):
        key, k_env, k_train = jax.random.split(state.key, 3)
        env = 0.9 * state.env + 0.1 * jax.random.normal(k_env, state.env.shape)
        ids = jnp.arange(E)
        rows = state.buffer["rows"].at[ids, state.buffer["head"] % T].set(env)
        buffer = {"rows": rows, "head": state.buffer["head"] + 1}
        agent, loss = train_step(state.agent, buffer, k_train, report)
        return State(agent, env, buffer, key), loss

    return sharding.vmap_seeds(lambda s: jax.lax.scan(step, s, None, STEPS))


def main(devices: int, seed_devices: int, out: str) -> None:
    if "JAX_NUM_PROCESSES" in os.environ:  # one of several processes (tests/rl/infra/test_sharding.py)
        distributed.initialize({"enabled": True, "coordinator_address": os.environ["JAX_COORDINATOR_ADDRESS"],
                                "num_processes": int(os.environ["JAX_NUM_PROCESSES"]),
                                "process_id": int(os.environ["JAX_PROCESS_ID"])})
    mesh = sharding.mesh_from_config({"devices": devices, "seed_devices": seed_devices})
    sharding.check_divisible(mesh, seeds=S, num_envs=E, batch_size=B)
    keys = jax.random.split(jax.random.key(0), S)
    seen = []
    with sharding.use_mesh(mesh):
        if mesh is None:
            state = jax.vmap(init)(keys)
            shardings = None
        else:
            shardings = sharding.runner_shardings(mesh, jax.eval_shape(jax.vmap(init), keys))
            state = jax.jit(jax.vmap(init), out_shardings=shardings)(keys)
        run = make_run(report=lambda s: seen.append(list(s.shard_shape((S, B, D)))))

        def chunk(state):
            state, losses = run(state)
            return (state if shardings is None else jax.lax.with_sharding_constraint(state, shardings)), losses

        state, losses = jax.jit(chunk, donate_argnums=0)(state)
        state, losses2 = jax.jit(chunk, donate_argnums=0)(state)
    host = sharding.to_host({"w": state.agent["params"]["w"], "losses": jnp.concatenate([losses, losses2], 1)})
    result = {
        "w": host["w"].tolist(), "losses": host["losses"].tolist(),
        "batch_shard_shape": seen[0],
        "buffer_spec": str(state.buffer["rows"].sharding.spec) if mesh else None,
        "params_spec": str(state.agent["params"]["w"].sharding.spec) if mesh else None,
        "describe": sharding.describe(mesh),
    }
    if not distributed.is_main_process():
        return
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
