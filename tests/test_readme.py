"""The README's and docs/'s commands work as written: every `python -m scripts.train ...` of their fenced
blocks and inline code composes and validates (multirun lines: every combination; placeholders such as
`<date>` and cluster launchers are skipped), and the lines marked `(quick)` run for real (slow tier: they are
learning runs; the smoke matrix trains every agent on every source in the fast tier). The README's
architecture map is the one tests/test_architecture.py enforces, row for row."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agents.experiment import validate
from agents.setup import compose

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _train_lines(text: str) -> list[tuple[str, bool]]:
    """`(command, quick)` for each `python -m scripts.train` line in a markdown text's fenced blocks and inline
    code."""
    blocks, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            blocks += [[]] if inside else []
        elif inside:
            blocks[-1].append(line)
    lines = []
    for block in blocks:
        for line in "\n".join(block).replace("\\\n", " ").splitlines():
            if "python -m scripts.train" in line:
                command, _, comment = line.partition("#")
                lines.append((command.split("python -m", 1)[1].strip(), "(quick)" in comment))
    inline = re.findall(r"`python -m (scripts\.train [^`]*)`", text)
    return lines + [(c, False) for c in inline]


def _overrides(command: str) -> list[list[str]]:
    """The override lists a command composes (a multirun expands comma lists into combinations)."""
    args = [a for a in shlex.split(command)[1:] if not a.startswith(("hydra.", "hydra/"))]
    multirun = "-m" in args
    args = [a.rstrip(";") for a in args if a not in ("-m", "&", "\\") and "=" in a]
    if not multirun:
        return [args]
    options = [[f"{a.split('=', 1)[0]}={v}" for v in a.split("=", 1)[1].split(",")] for a in args]
    return [list(c) for c in itertools.product(*options)]


QUICK_CLAIMS = {line.split("python -m", 1)[1].partition("#")[0].strip(): line.partition("#")[2]
                for path in DOCS for line in path.read_text().splitlines()
                if "python -m scripts.train" in line and "(quick)" in line}
LINES = [(c, q) for path in DOCS for c, q in _train_lines(path.read_text())
         if "<" not in c and "launcher=" not in c and "sweeper=" not in c]


def test_readme_has_train_commands():
    assert len(_train_lines((ROOT / "README.md").read_text())) >= 8 and any(q for _, q in LINES)


def test_train_lines_are_found_in_blocks_and_inline_code():
    text = ("```bash\npython -m scripts.train agent=dqn \\\n    seeds=2   # (quick) a run\n```\n"
            "and `python -m scripts.train agent=muesli` inline")
    found = [(shlex.split(c), q) for c, q in _train_lines(text)]
    assert found == [(["scripts.train", "agent=dqn", "seeds=2"], True), (["scripts.train", "agent=muesli"], False)]


def test_docs_commands_are_checked():
    commands = {c for c, _ in LINES}
    assert any("population.agent.pg_weight" in c for c in commands)  # docs/results.md's population run
    assert any("scripts.train agent=dqn population.agent.optim.lr" in c for c in commands)  # docs/scaling.md


@pytest.mark.parametrize("command", sorted({c for c, _ in LINES}))
def test_train_command_composes_and_validates(command):
    for overrides in _overrides(command):
        validate(compose(overrides))


@pytest.mark.slow  # a learning run (the first one says it reaches return 500): ~1 min on 2 cores
@pytest.mark.parametrize("command", sorted({c for c, q in LINES if q}))
def test_quick_command_runs(command, tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    args = [*shlex.split(command)[2:], f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-m", "scripts.train", *args], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "metrics.csv").exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    if "return 500" in QUICK_CLAIMS.get(command, ""):  # the README's first run says it learns CartPole
        assert min(summary["eval_return_mean"]) >= 450, summary


def _architecture_map() -> dict[str, set[str]]:
    """The README's architecture table: module prefix (`rl/envs/` -> `rl.envs`) -> the packages its last column
    names (backticked; "jax only" and the like name none), for the rows of buffers/, rl/ and agents/."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`(buffers|rl|agents)[\w/.]*`", cells[0]):
            module = cells[0].strip("`").removesuffix("/").removesuffix(".py").replace("/", ".")
            rows[module] = set(re.findall(r"`([\w.]+)`", cells[2]))
    return rows


def test_the_architecture_map_is_the_one_the_architecture_test_enforces():
    from tests.test_architecture import ALLOWED

    rows = _architecture_map()
    assert rows == {k: v for k, v in ALLOWED.items() if k != "rl"}  # rl/__init__.py: a docstring, no row


def test_the_map_parser_reads_rows_and_ignores_other_tables(monkeypatch, tmp_path):
    (tmp_path / "README.md").write_text("| folder | holds | may import |\n|---|---|---|\n"
                                        "| `rl/envs/` | sources | `rl.config` |\n| `buffers/` | replay | jax only |\n"
                                        "| `scripts/` | command lines | anything |\n| agent | for | `x` |\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _architecture_map() == {"rl.envs": {"rl.config"}, "buffers": set()}
