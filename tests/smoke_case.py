"""Rows of the smoke matrix (tests/test_smoke_matrix.py), run in a subprocess under a watchdog:

    python -m tests.smoke_case <run root> <agent config>=<source:seeds[:train]>[,...] [...]

for each agent config in turn, for each of its cases (e.g. gymnax:2, envpool:1) builds and initialises the run,
trains until at least two train steps ran and checkpoints; then, unless the case ends in `:train`, resumes it from
its checkpoint with `resume=<dir>` alone plus a higher total_steps (more train steps), and evaluates the saved run
with `agents.experiment.evaluate_run` (as `python -m scripts.evaluate` does). Prints `CASE ... ok` lines; a failing
config prints its traceback and `CASE <config>: failed`, the next config runs, and the exit status is non-zero.
"""

from __future__ import annotations

import csv
import sys
import time
import traceback

import numpy as np

from agents.experiment import evaluate_run, run
from agents.setup import compose

# Per agent config: overrides that let >= 2 train steps run early, the log interval L (a multiple of the
# env steps per iteration, so every chunk of both runs is the same compiled program) and the two totals.
# Only the replay size, learning_starts, (R2D2) the train interval and the sequence agents' batch (8) are lowered
# (Muesli's paper batch of 96 sequences of 30 steps over 601 atoms is half of its case's CPU time, R2D2's of 64
# sequences of 80 steps through a 512-unit LSTM runs unoptimised); networks, sequence lengths and every other
# option stay the preset's (a Muesli batch of 8 still takes 2 sequences from the online queue).
NUM_ENVS, ENVPOOL = 4, ["env.envs_per_recv=2", "env.recvs_per_chunk=8"]
DQN = (["agent.learning_starts=64", "agent.buffer_size=400"], 64, 128, 192)
R2D2 = (["agent.learning_starts=320", "agent.buffer_size=2000", "agent.train_interval=10", "agent.batch_size=8"],
        200, 400, 600)
SETTINGS = {
    "dqn_paper": DQN, "dqn_small": DQN, "r2d2_paper": R2D2, "r2d2_small": R2D2,
    "muesli_paper": (["agent.learning_starts=240", "agent.buffer_size=4000", "agent.batch_size=8"],
                     240, 480, 720),  # 30 x 4 envs
    "muesli_small": (["agent.learning_starts=192", "agent.buffer_size=4000"], 96, 288, 384),  # 8 x 4 envs
}


def updates(state) -> int:
    agent = state[0].agent if isinstance(state, tuple) else state.agent
    return int(np.min(np.asarray(agent.updates)))


def main(agent: str, source: str, seeds: int, run_dir: str, train_only: bool = False) -> None:
    extra, log_interval, first, second = SETTINGS[agent]
    env = ["env=cartpole"] if source == "gymnax" else ["env=envpool/cartpole", *ENVPOOL]
    common = [f"agent={agent}", *env, "logger=none", f"seeds={seeds}", f"num_envs={NUM_ENVS}", "eval_episodes=0",
              *extra]
    name, t0 = f"{agent} {source} seeds={seeds}", time.perf_counter()
    print(f"CASE {name}: train", flush=True)
    res = run(compose([*common, f"total_steps={first}", f"log_interval={log_interval}"]), run_dir)
    assert res["checkpoint"] is not None and updates(res["state"]) >= 2, (res["checkpoint"], updates(res["state"]))
    n = updates(res["state"])
    if train_only:
        print(f"CASE {name}: ok after {n} train steps ({time.perf_counter() - t0:.0f} s)", flush=True)
        return
    print(f"CASE {name}: resume after {n} train steps ({time.perf_counter() - t0:.0f} s)", flush=True)
    overrides = [f"resume={run_dir}", f"total_steps={second}"]
    res2 = run(compose(overrides), run_dir + "-unused", overrides)
    # More train steps only where the data allows one (R2D2's paper sequences of 80 rarely fit in CartPole
    # episodes); resumed training itself is checked bit for bit in tests/rl/runners/test_anakin.py.
    assert res2["run_dir"] == run_dir and updates(res2["state"]) >= n, updates(res2["state"])
    with open(f"{run_dir}/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    steps = sorted({int(r["env_steps"]) for r in rows})
    assert steps[-1] == res2["env_steps"] >= second and len(rows) == len(steps) * seeds, steps
    assert np.isfinite([float(r["train/loss"]) for r in rows if r["train/loss"]]).all()
    print(f"CASE {name}: evaluate ({time.perf_counter() - t0:.0f} s)", flush=True)
    returns = evaluate_run(run_dir, episodes=2)
    assert returns.shape == (seeds, 2) and np.isfinite(returns).all() and (returns >= 1).all(), returns
    print(f"CASE {name}: ok ({time.perf_counter() - t0:.0f} s)", flush=True)


def run_config(agent: str, run_root: str, cases: list[str]) -> None:
    for case in cases:
        source, seeds, *stage = case.split(":")
        main(agent, source, int(seeds), f"{run_root}/{agent}/{source}-{seeds}", train_only=stage == ["train"])


if __name__ == "__main__":
    failed = []
    for arg in sys.argv[2:]:
        agent, _, cases = arg.partition("=")
        try:
            run_config(agent, sys.argv[1], cases.split(","))
        except Exception:  # noqa: BLE001 - reported, and the next config still runs
            traceback.print_exc()
            print(f"CASE {agent}: failed", flush=True)
            failed.append(agent)
    sys.exit(1 if failed else 0)
