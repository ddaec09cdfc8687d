"""Host-side agreement while compiled programs run, in a subprocess started by tests/rl/infra/test_agreement.py
(one of 2 processes x 2 CPU devices under jax.distributed, gloo collectives).

`python tests/multidevice/agreement.py OUT.json ROUNDS` dispatches, each round, a program over one device of each
process (like the Sebulba learner's update: all-gathers, not waited for), then `rl.infra.distributed.agree`
and `rl.infra.sharding.from_host` at once, as the host loop does. Agreeing through a collective over all
devices (jax's process_allgather) aborted this within 2 s ("Received data size doesn't match expected size").
Writes the agreed values and the program's last result as JSON (process 0).
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from rl.infra import distributed, sharding


def main(out: str, rounds: int) -> None:
    distributed.initialize({"enabled": True, "coordinator_address": os.environ["JAX_COORDINATOR_ADDRESS"],
                            "num_processes": 2, "process_id": int(os.environ["JAX_PROCESS_ID"])})
    me = jax.process_index()
    second = [sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)[1] for p in range(2)]
    mesh = sharding.mesh_over(second)
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(sharding.DATA_AXIS))
    rep = sharding.replicated(mesh)

    @jax.jit
    def program(a, b, w):  # all-gathers of different sizes inside a loop, then a replicated result
        def body(_, w):
            return jnp.tanh(w @ w) + jax.lax.with_sharding_constraint(a, rep).sum() * 1e-3
        w = jax.lax.fori_loop(0, 20, body, w)
        return w + jax.lax.with_sharding_constraint(b, rep).sum()

    w = sharding.from_host(np.eye(32, dtype=np.float32) * 0.1, rep)
    agreed = []
    for i in range(rounds):
        a = jax.make_array_from_process_local_data(split, np.arange(4, dtype=np.int32) + i)
        b = jax.make_array_from_process_local_data(split, np.ones(4, np.float32))
        w = program(a, b, w)  # in flight while the processes agree
        signal = 15 if (me == 1 and i == rounds - 3) else None  # process 1 alone "receives" a signal
        agreed.append(distributed.agree(1000 * i + 7 * me, signal, save=(i % 3 == 0) == (me == 0)))
        w = w + sharding.from_host(np.float32(0.0), rep)
    result = np.asarray(w.addressable_data(0))
    if me == 0:
        with open(out, "w") as f:
            json.dump({"agreed": agreed, "finite": bool(np.isfinite(result).all()),
                       "run_dir": str(distributed.shared_run_dir(f"/tmp/run-of-{me}"))}, f)
    else:
        distributed.shared_run_dir(f"/tmp/run-of-{me}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
