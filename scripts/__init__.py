"""Command lines a user runs (`python -m scripts.<name> --help` for each).

Entry points: `train` (a run, a sweep with `-m`, a resume), `evaluate` (greedy returns or a video of a run
dir), `plot` (learning curves from metrics.csv), `benchmark` (a suite of runs from configs/suite/).

Benchmarks, `bench_*`: our code timed against anchors in the same process (docs/benchmarks.md), with
`bench_common` as their shared harness.
"""
