"""One Sebulba learner update on a fixed global chunk, in a subprocess started by
tests/rl/infra/test_multiprocess.py (1 process, or one of 2 under jax.distributed).

`python tests/multidevice/sebulba_update.py OUT.json key=value ...` builds the runner of the overrides, writes
K recvs of 8 envs (the chunk's values depend only on the recv and the global env id, so 1 process with 16 envs
and 2 processes with 8 each hold the same global buffer), takes 5 train steps and writes the parameters
(process 0) before and after, and the op_name of each all-gather in the compiled update, as JSON.
"""

from __future__ import annotations

import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

from agents.experiment import build
from agents.setup import compose
from rl.envs.episodes import Episodes
from rl.infra import distributed, sharding
from rl.runners.sebulba_actor import Chunk

K = 8


def local_chunk(runner) -> Chunk:
    """This process's share of the chunk: its M envs per recv, values f(recv, global env id)."""
    src, agent = runner.sources[0], runner.agent
    m = src.batch_size
    # Global column c of recv k holds env (c // 4) * 8 + (4k + c % 4) % 8: with 2 processes (8 envs, 4 per recv
    # each) process p holds columns 4p..4p+3, all in its own rows 8p..8p+7; 1 process (16 envs, 8 per recv)
    # holds all 8 columns.
    c = runner.process * m + np.arange(m)[None, :]
    ids = (c // 4) * 8 + (np.arange(K)[:, None] * 4 + c % 4) % 8  # [K, M] global env ids
    proto = agent.step_prototype(src.obs_example())

    def fill(i, x):
        v = (np.arange(K)[:, None] * 7 + ids * 3 + i) % 5  # [K, M]
        v = v.reshape(v.shape + (1,) * x.ndim) * np.ones((1, 1) + x.shape)
        return jnp.asarray(v % 2 if x.dtype in (jnp.int32, jnp.bool_) else v / 5, x.dtype)

    steps = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(proto),
                                         [fill(i, x) for i, x in enumerate(jax.tree_util.tree_leaves(proto))])
    zeros = jnp.zeros((K, m))
    episodes = Episodes(ended=zeros.astype(bool), score=zeros, length=zeros.astype(jnp.int32),
                        env_id=jnp.asarray(ids, jnp.int32))
    return Chunk(steps=steps, env_ids=jnp.asarray(ids, jnp.int32), mask=jnp.ones((K, m), bool), episodes=episodes)


def main(out: str, overrides: list[str]) -> None:
    cfg = compose(overrides)
    distributed.initialize(cfg.distributed)
    runner = build(cfg)
    state = runner.init()
    init = runner.copy(state.agent.params)
    chunk = local_chunk(runner)
    to_learner = runner._to_learner()
    chunk = to_learner(chunk) if to_learner is not None else chunk
    learner = runner.learner
    with sharding.use_mesh(runner.mesh):
        totals = learner.zero_totals(state.agent, state.buffer)
        if runner.mesh is not None:
            totals = jax.device_put(totals, runner._chunk_sharding())
        args = (state.agent, state.buffer, state.key, totals, chunk, np.bool_(True), np.int32(5),
                np.int32(1000))
        hlo = learner.update.lower(*args).compile().as_text()
        agent, *_ = learner.update(*args)
    # where each all-gather of the compiled update comes from (its op_name)
    gathers = re.findall(r"all-gather(?:-start)?\(.*?op_name=\"([^\"]*)\"", hlo)
    if jax.process_index() == 0:
        leaves = lambda p: [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(runner._local(p))]
        with open(out, "w") as f:
            json.dump({"init": leaves(init), "params": leaves(agent.params), "all_gathers": gathers}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
