"""Command lines a user runs (`python -m scripts.<name> --help` for each).

Entry points: `train` (a run, a sweep with `-m`, a resume), `evaluate` (greedy returns or a video of a run
dir), `plot` (learning curves from metrics.csv), `benchmark` (a suite of runs from configs/suite/).

Benchmarks (docs/benchmarks.md): the `bench_*` scripts, our code timed against anchors in the same process
(`bench_common` is their shared harness, `hlo_kernels` counts a compiled program's kernels), and
`device_check`, the benchmarks that matter on a lent accelerator in one command.
"""
