"""The lineage of a PBT run (rl/learning/pbt.py): `<run dir>/pbt.csv`, one row per member and event.

Columns: `env_steps` (per seed, at the event), `member`, `source` (the member whose agent state it took; its
own index where it kept its own), `return` (the member's recent return the event ranked, mean over its
seeds), then `agent.<key>` for each population key: the member's values after the event. The Anakin runner
calls `write` after each event (rl/runners/anakin.py); a resumed run first drops the rows past its
checkpoint (the stopped run's events after it are taken again).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

FILENAME = "pbt.csv"


class Lineage:
    """Appends PBT events to `path` (`resume_step`: keep the rows up to that env step of an existing file;
    None: start a new file)."""

    def __init__(self, path: str | Path, keys: Sequence[str], resume_step: int | None = None):
        self.path, self.keys = Path(path), list(keys)
        self.fields = ["env_steps", "member", "source", "return", *(f"agent.{k}" for k in self.keys)]
        kept = []
        if resume_step is not None and self.path.exists():
            with self.path.open(newline="") as f:
                kept = [r for r in csv.DictReader(f) if int(r["env_steps"]) <= resume_step]
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.fields)
            writer.writeheader()
            writer.writerows(kept)

    def write(self, env_steps: int, source: np.ndarray, returns: np.ndarray,
              hparams: Mapping[str, np.ndarray]) -> None:
        """One event: per member `[M]` its source, the return ranked and (key -> `[M]`) its new values."""
        rows = [{"env_steps": int(env_steps), "member": m, "source": int(source[m]), "return": str(np.float32(returns[m])),
                 **{f"agent.{k}": str(np.float32(hparams[k][m])) for k in self.keys}} for m in range(len(source))]
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerows(rows)


def read(path: str | Path) -> list[dict]:
    """The rows of a `pbt.csv` (numbers as floats, `env_steps`/`member`/`source` as ints)."""
    with Path(path).open(newline="") as f:
        ints = ("env_steps", "member", "source")
        return [{k: int(v) if k in ints else float(v) for k, v in r.items()} for r in csv.DictReader(f)]
