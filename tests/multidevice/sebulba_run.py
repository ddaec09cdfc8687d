"""Sebulba over several (CPU-forced) devices, run in a subprocess by tests/rl/runners/test_sebulba_multidevice.py with
`XLA_FLAGS=--xla_force_host_platform_device_count=N` (JAX must start with it).

    python tests/multidevice/sebulba_run.py learner OUT.json
        the learner update (buffer write of a synthetic chunk + 3 DQN train steps) on 1 device and on a
        2-device learner mesh, from the same state, chunk and key: both params, and whether the 2-device
        program all-reduces (data-parallel gradients).
    python tests/multidevice/sebulba_run.py train OUT.json RUN_DIR key=value ...
        one real training run (agents.experiment.run) with the overrides: env steps, metrics, eval returns,
        where the learner state lives, rows written per env.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np


def learner_case(out: str) -> None:
    from agents import agent_config, make_agent
    from agents.setup import compose
    from rl.envs.envpool_source import EnvpoolSource, Recv
    from rl.infra import sharding
    from rl.runners.sebulba_actor import Rollout, new_tracker
    from rl.runners.sebulba_learner import Learner

    E, T = 8, 24
    cfg = compose(["agent=dqn", "env=envpool/cartpole", f"num_envs={E}", "agent.batch_size=32",
                   "agent.buffer_size=1024", "agent.learning_starts=0"])
    agent = make_agent(agent_config(cfg.agent), obs_shape=(4,), obs_dtype=np.float32, num_actions=2, num_envs=E)
    source = EnvpoolSource(env=None, task_id="synthetic", num_envs=E, batch_size=E, obs_shape=(4,),
                           obs_dtype=np.dtype(np.float32), num_actions=2, atari=False)
    rollout = Rollout(agent, source, recvs_per_chunk=1, use_xla=False)
    obs0 = np.zeros(4, np.float32)
    agent_state = jax.jit(agent.init)(jax.random.PRNGKey(0), obs0)
    buffer_state = jax.jit(lambda: agent.buffer.init(agent.step_prototype(obs0)))()
    tracker = new_tracker(agent, agent_state, source)
    rng = np.random.default_rng(0)
    rows = []
    for t in range(T):
        ids = rng.permutation(E).astype(np.int32)
        term = rng.random(E) < 0.1
        recv = Recv(obs=rng.normal(size=(E, 4)).astype(np.float32), reward=rng.normal(size=E).astype(np.float32),
                    terminated=term, truncated=np.zeros(E, bool), env_id=ids,
                    score=np.zeros(E, np.float32), episode_over=term)
        tracker, _, row = rollout._act(tracker, agent_state, recv, jax.random.PRNGKey(t))
        rows.append(row)
    chunk = rollout._stack(rows)
    key = jax.random.PRNGKey(7)
    copy = jax.jit(lambda s: jax.tree_util.tree_map(jnp_copy, s))

    def run(mesh):
        learner = Learner(agent, E)
        state = copy({"agent": agent_state, "buffer": buffer_state, "key": key})
        c = chunk
        if mesh is not None:
            shard = {k: sharding.leading_shardings(mesh, v, shard_data=k == "buffer") for k, v in state.items()}
            state = jax.device_put(state, shard)
            c = jax.device_put(chunk, sharding.replicated(mesh))
        with sharding.use_mesh(mesh):
            totals = learner.zero_totals(state["agent"], state["buffer"])
            if mesh is not None:
                totals = jax.device_put(totals, sharding.replicated(mesh))
            args = (state["agent"], state["buffer"], state["key"], totals, c, np.bool_(True), np.int32(3),
                    np.int32(T * E))
            hlo = learner.update.lower(*args).compile().as_text()
            a, b, _, tot = learner.update(*args)
        params = [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(a.params)]
        return params, int(tot.updates[0]), "all-reduce" in hlo, sorted({str(x.sharding) for x in
                                                                       jax.tree_util.tree_leaves(b)})[:3]

    p1, u1, ar1, _ = run(None)
    p2, u2, ar2, buffer_shardings = run(sharding.mesh_over(jax.devices()[:2]))
    with open(out, "w") as f:
        json.dump({"devices": jax.device_count(), "one": p1, "two": p2, "updates": [u1, u2],
                   "all_reduce": [ar1, ar2], "buffer_shardings": buffer_shardings}, f)


def jnp_copy(x):
    import jax.numpy as jnp

    return jnp.copy(x)


def train_case(out: str, run_dir: str, overrides: list[str]) -> None:
    from agents.experiment import run
    from agents.setup import compose

    result = run(compose(["logger=none", *overrides]), run_dir)
    state = result["state"]
    devices = {k: sorted({d.id for x in jax.tree_util.tree_leaves(getattr(state, k)) for d in x.devices()})
               for k in ("actor_key", "agent", "buffer", "key", "owed")}
    written = np.asarray(state.buffer.rows.written).tolist() if hasattr(state.buffer, "rows") else None
    with open(f"{run_dir}/metrics.csv") as f:
        metrics = f.read()
    record = {"devices": jax.device_count(), "env_steps": result["env_steps"], "eval_returns": result["eval_returns"],
              "state_devices": devices, "written": written, "metrics_csv": metrics,
              "updates": int(state.agent.updates) if hasattr(state.agent, "updates") else None}
    with open(out, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    if sys.argv[1] == "learner":
        learner_case(sys.argv[2])
    else:
        train_case(sys.argv[2], sys.argv[3], sys.argv[4:])
