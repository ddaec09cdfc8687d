"""Kernel counts (scripts/hlo_kernels.py) on hand-written HLO, the DQN iteration's kernel target against the
PureJaxRL-style loop (issue 45: at most 1.2x its kernels), and the bench's feature variants."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from rl.runners.totals import Totals, summarise
from scripts import hlo_kernels
from tests.conftest import TEST_XLA_FLAGS

HLO = """HloModule m, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%fused_add (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %a = f32[4]{0} add(%p, %p)
}

%big (b: f32[4]) -> f32[4] {
  %b = f32[4]{0} parameter(0)
  %f1 = f32[4]{0} fusion(%b), kind=kLoop, calls=%fused_add
  ROOT %f2 = f32[4]{0} fusion(%f1), kind=kLoop, calls=%fused_add
}

%small (s: f32[4]) -> f32[4] {
  %s = f32[4]{0} parameter(0)
  ROOT %c = f32[4]{0} copy(%s)
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4]{0} get-tuple-element(%t), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %pred = pred[] constant(true)
  %y = f32[4]{0} conditional(%pred, %x, %x), true_computation=%big, false_computation=%small
  %g = f32[4]{0} gather(%y, %i), offset_dims={}, slice_sizes={1}
  ROOT %r = (s32[], f32[4]{0}) tuple(%j, %y)
}

%cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]{0}) tuple(%zero, %x)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %out = f32[4]{0} get-tuple-element(%w), index=1
  ROOT %last = f32[4]{0} custom-call(%out), custom_call_target="foo"
}
"""


def test_counts_of_handwritten_hlo():
    """One iteration: the add and the compare (other), the conditional (control) and its larger branch's two
    fusions, the gather; parameters, constants, tuples and get-tuple-elements are free. The whole program: the
    while, 3 iterations (trip count) and the custom call."""
    it = hlo_kernels.iteration_counts(HLO)
    assert it == {"fusion": 2, "custom_call": 0, "gather_scatter": 1, "copy": 0, "control": 1, "other": 2,
                  "total": 6}
    whole = hlo_kernels.program_counts(HLO)
    assert whole == {"fusion": 6, "custom_call": 1, "gather_scatter": 3, "copy": 0, "control": 4, "other": 6,
                     "total": 20}
    no_loop = HLO.split("ENTRY")[0] + "ENTRY %main (x: f32[4]) -> f32[4] {\n  ROOT %x = f32[4]{0} parameter(0)\n}\n"
    with pytest.raises(ValueError, match="no while loop"):
        hlo_kernels.iteration_counts(no_loop)


def test_an_iteration_of_the_accelerator_blocks_is_one_iteration():
    """On accelerators the runner loops over blocks of `block` iterations (a nested loop of that known trip
    count) and selects instead of `lax.cond`: told the block, the count is one iteration, the same as the
    program without blocks (here forced on the CPU)."""
    from scripts import bench_kernels

    counts = []
    for block in (32, 1):
        runner = bench_kernels._runner("dqn", 1)
        runner.select, runner.block = True, block  # read when the chunk is traced
        counts.append(bench_kernels.chunk_counts(runner)[0])
    assert counts[0] == counts[1] and counts[0]["total"] > 0


def test_dqn_iteration_within_1_2x_the_peers_kernels():
    """The default DQN CartPole iteration (the PureJaxRL preset, one seed) launches at most 1.2x the kernels of
    the PureJaxRL-style loop's iteration, compiled as users compile (XLA's default options and emitters, in a
    process of its own: the suite's classic emitters fuse less, ~580 kernels against the peer's ~450)."""
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "0",
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "").replace(TEST_XLA_FLAGS, "")}
    out = subprocess.run([sys.executable, "-m", "scripts.bench_kernels", "--target-only"], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["ours"] <= 1.2 * summary["peer"], summary


def test_bench_variants_add_up_to_the_runners_chunk():
    """The bench's variant with every default feature compiles to the runner's own chunk (its per-feature rows
    are differences between such variants), and the bare one launches fewer kernels."""
    from scripts import bench_kernels

    default, _ = bench_kernels.chunk_counts(bench_kernels._runner("dqn", 1))
    full, _ = bench_kernels.dqn_variant(1, ("metrics", "guard", "totals"))
    bare, _ = bench_kernels.dqn_variant(1, ())
    assert full == default
    assert bare["total"] < full["total"]


def test_totals_without_metrics_count_updates():
    """`Totals` with no train metric (the bench's bare variant) still counts the train steps taken."""
    t = Totals.zeros(2, (), ())
    t = t.add_update({}, {}, jnp.array([True, False]), 10)
    np.testing.assert_array_equal(t.updates, [1, 0])
    assert t.metric_sums.shape == (2, 0) and summarise(t)["nonfinite"] == {}


def test_bench_train_json_line_has_the_kernel_fields(capsys):
    """bench_train's JSON line keeps its fields and adds the kernel counts of ours and of the peer."""
    from scripts.bench_train import main

    main(["--steps", "1000", "--seeds", "1", "--learner-steps", "0", "--repeats", "1", "agent.learning_starts=500",
          "agent.buffer_size=1000"])
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("agent", "env", "seeds", "sps", "ceiling_sps", "ceiling_fraction", "baseline_ratio", "kernels",
                "kernel_counts", "flops", "bytes_accessed", "peer_kernels", "peer_kernel_counts", "peer_flops",
                "peer_bytes_accessed", "kernel_ratio"):
        assert key in record, key
    assert record["kernels"] == record["kernel_counts"]["total"] > 0
    assert record["kernel_ratio"] == pytest.approx(record["kernels"] / record["peer_kernels"])
