"""One real training run (scripts.train.run) in a subprocess started by tests/rl/infra/test_sharding.py with
`XLA_FLAGS=--xla_force_host_platform_device_count=N`.

`python tests/multidevice/train_run.py OUT.json RUN_DIR key=value ...` writes the final agent params, the
logged metrics, the eval returns, where the runner state lived and how often its loop compiled.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from agents.experiment import run
from agents.setup import compose
from rl.infra import sharding
from tests.conftest import compiles_of


def main(out: str, run_dir: str, overrides: list[str]) -> None:
    with compiles_of("_chunk") as compiles:
        result = run(compose(overrides), run_dir)
    state = result["state"][0]  # Anakin: (RunnerState, iteration counter)
    params = sharding.to_host(state.agent.params)
    specs = {name: sorted({str(x.sharding.spec) if hasattr(x.sharding, "spec") else "single"
                           for x in jax.tree_util.tree_leaves(getattr(state, name))})
             for name in ("agent", "buffer", "env", "obs")}
    with open(f"{run_dir}/metrics.csv") as f:
        metrics = f.read()
    record = {
        "devices": jax.device_count(),
        "params": [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(params)],
        "eval_returns": result["eval_returns"],
        "metrics_csv": metrics,
        "specs": specs,
        "chunk_compiles": len(compiles),
    }
    with open(out, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
