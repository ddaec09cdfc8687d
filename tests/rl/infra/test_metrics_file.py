"""metrics.csv as the run's one metric history (rl/infra/metrics_file.py): rows read back as written (a plain
list of dicts is the reference), new columns rewrite the file, a resume keeps a checkpoint's rows, and the
logger keeps no rows in memory."""

from __future__ import annotations

import tracemalloc

import numpy as np

from rl.infra.metrics_file import MetricsFile
from tests.rl.infra.test_logging import _cfg


def _rows(step: int, **metrics) -> list[dict]:
    return [{"env_steps": step, "seed": s, **{k: v[s] for k, v in metrics.items()}} for s in range(2)]


def test_rows_read_back_as_written_and_a_new_metric_rewrites_the_file(tmp_path):
    f, written = MetricsFile(tmp_path / "metrics.csv", ["seed"]), []
    f.start()
    for rows in (_rows(100, loss=[1.5, 2.0]), _rows(200, loss=[0.5, None], episode_return=[3.0, 4.0]),
                 _rows(300, loss=[0.25, 0.125])):
        f.append(rows)
        written += rows
    reference = [{k: v for k, v in row.items() if v is not None} for row in written]
    assert f.read() == reference and f.rows == 6
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert header == "env_steps,seed,episode_return,loss"  # the union, metrics sorted after the labels


def test_a_resume_keeps_the_checkpoints_rows_and_a_fresh_start_none(tmp_path):
    f = MetricsFile(tmp_path / "metrics.csv", ["seed"])
    f.start()
    for step in (100, 200, 300):
        f.append(_rows(step, loss=[float(step), 1.0]))
    resumed = MetricsFile(tmp_path / "metrics.csv", ["seed"])
    resumed.start(keep=4)  # the checkpoint at 200 had 4 rows: those logged at 300 are trained again
    assert [r["env_steps"] for r in resumed.read()] == [100, 100, 200, 200] and resumed.rows == 4
    resumed.append(_rows(300, loss=[9.0, 9.0]))
    assert resumed.read()[-1] == {"env_steps": 300, "seed": 1, "loss": 9.0}
    history = _rows(50, loss=[7.0, 8.0])  # a checkpoint that saved its rows
    resumed.start(history=history)
    assert resumed.read() == history and resumed.rows == 2
    resumed.start()
    assert not (tmp_path / "metrics.csv").exists() and resumed.read() == [] and resumed.rows == 0


def test_the_logger_keeps_no_rows_in_memory(tmp_path):
    """3000 logs of 2 rows x 20 metrics: the logger's memory grows by less than 100 kB (kept in memory, the
    rows would take several MB)."""
    from rl.infra.logging import RunLogger

    logger = RunLogger(_cfg(10**9, progress=False, plot=False), tmp_path)
    logger.start(start_step=0, num_seeds=2)
    metrics = {f"train/m{i}": np.array([1.0, 2.0]) for i in range(20)}
    logger.log(1, metrics)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for step in range(2, 3002):
        logger.log(step, metrics)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    logger.close()
    assert grown < 100_000, grown
    assert logger.logged_rows == 6002 and len(logger.metrics.read()) == 6002
