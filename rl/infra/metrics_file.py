"""metrics.csv, the run's metric history: one row per log and row of the seed axis (seed; a population's member,
its overrides and seed), columns `env_steps`, the row labels, then the metric names sorted; an empty cell where
a row has no value (NaN, or a metric not logged then).

The file is the one copy: the logger appends to it and keeps no rows in memory, so a long run's memory does not
grow with its logs. A checkpoint records how many rows the file had (`rows`); resuming from it keeps those and
drops the rows logged after it (they are trained again).
"""

from __future__ import annotations

import csv
from pathlib import Path


def columns(rows: list[dict], labels: list[str]) -> list[str]:
    """The header of `rows`: env_steps, the row labels, then the metric names in sorted order."""
    first = ["env_steps", *labels]
    return [*first, *sorted(set().union(*rows) - set(first))]


def _value(text: str) -> int | float | str | None:
    """A cell as written: empty -> None, integers and floats as numbers, anything else (a label) as text."""
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class MetricsFile:
    """`path` (metrics.csv) with row labels `labels`; `rows`: the data rows it holds."""

    def __init__(self, path: str | Path, labels: list[str]):
        self.path, self.labels = Path(path), list(labels)
        self.fields: list[str] | None = None  # the header written (None: nothing yet)
        self.rows = 0

    def start(self, keep: int | None = None, history: list[dict] | None = None) -> None:
        """Begin a run: a fresh file (`keep` None; an earlier attempt's file is removed), the first `keep` rows
        of the file on disk (a resume), or `history` as the whole file (checkpoints that saved their rows)."""
        if history is not None:
            self._write(history)
        elif keep is None:
            self.path.unlink(missing_ok=True)
            self.fields, self.rows = None, 0
        else:
            self._write(self.read()[:keep])

    def append(self, rows: list[dict]) -> None:
        """Add `rows`; a metric not seen before rewrites the file with the union of the columns (earlier rows
        get it empty)."""
        fields = columns(rows, self.labels)
        if self.fields is not None and not set(fields) <= set(self.fields):
            self._write(self.read() + rows)
            return
        new = self.fields is None
        self.fields = self.fields or fields
        with self.path.open("w" if new else "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.fields, restval="")
            if new:
                writer.writeheader()
            writer.writerows(rows)
        self.rows += len(rows)

    def read(self) -> list[dict]:
        """The rows on disk, each `{column: value}` without its empty cells (numbers parsed)."""
        if not self.path.exists():
            return []
        with self.path.open(newline="") as f:
            return [{k: _value(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]

    def _write(self, rows: list[dict]) -> None:
        if not rows:
            self.path.unlink(missing_ok=True)
            self.fields, self.rows = None, 0
            return
        self.fields = columns(rows, self.labels)
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.fields, restval="")
            writer.writeheader()
            writer.writerows(rows)
        self.rows = len(rows)
