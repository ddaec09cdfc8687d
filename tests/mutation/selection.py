"""Which tests a library file's mutants run, and the seeded sample of generated mutants.

A mutant runs the fast tests (`-m "not slow"`, `-x`, one pytest process with `-n 0`: xdist workers cost more
than they save on a small CPU) of the test files that import its module, its own `test_<module>.py` first;
TESTS_OF names them for modules tested through another one and for the few that most of the suite imports;
ALSO_TESTS adds tests that run a module without importing it.
"""

from __future__ import annotations

import ast
import dataclasses
import random
from pathlib import Path

from tests.mutation.equivalent import EQUIVALENT
from tests.mutation.operators import Generated, generate

LIBRARY = ("buffers", "rl", "agents")

# Test files (in order) of the modules the import rule does not serve: those no test file imports, tested
# through the module that uses them, and the three that most of the suite imports (their own tests only, so
# that a mutant's run takes minutes, not most of the suite).
MUESLI_TESTS = ("tests/agents/test_muesli.py", "tests/agents/test_muesli_options.py", "tests/agents/test_muesli_model.py",
                "tests/agents/test_muesli_diagnostics.py")
SEQUENCE_TESTS = ("tests/buffers/test_sequences.py", "tests/buffers/test_online_queue.py",
                  "tests/buffers/test_sequence_bad_inputs.py", "tests/buffers/test_sequence_hlo.py")
TESTS_OF: dict[str, tuple[str, ...]] = {
    "agents/__init__.py": ("tests/configs/test_configs.py", "tests/agents/test_dqn.py", "tests/test_option_coverage.py"),
    "rl/config.py": ("tests/configs/test_configs.py", "tests/configs/test_presets.py", "tests/test_option_coverage.py",
                     "tests/rl/runners/test_resume.py"),
    "agents/experiment.py": ("tests/rl/test_entry_points.py", "tests/rl/runners/test_runner_options.py", "tests/configs/test_configs.py",
                         "tests/rl/runners/test_resume.py", "tests/rl/runners/test_runner_reuse.py",
                         "tests/rl/learning/test_population.py"),
    "agents/muesli/agent.py": MUESLI_TESTS,  # the tests import the package, which re-exports these two
    "agents/muesli/targets.py": MUESLI_TESTS,
    "buffers/counted.py": SEQUENCE_TESTS,  # the sequence buffer's weight strategies and online queue
    "buffers/online.py": ("tests/buffers/test_online_queue.py", *SEQUENCE_TESTS),
    "buffers/starts.py": SEQUENCE_TESTS,
    "buffers/tree_weights.py": SEQUENCE_TESTS,
    "rl/learning/exploration.py": ("tests/agents/test_dqn.py", "tests/agents/test_r2d2.py"),
    "rl/learning/target_update.py": ("tests/rl/learning/test_target_update.py", "tests/agents/test_dqn.py",
                                     "tests/agents/test_muesli.py"),
    "rl/runners/totals.py": ("tests/rl/runners/test_runner_options.py", "tests/rl/runners/test_faults.py", "tests/rl/runners/test_resume.py",
                             "tests/scripts/test_bench_kernels.py"),
}
# Test files that run a module without importing it, run after the files that import it: the multi-process
# tests (several jax processes in subprocesses), the PBT tests (the Anakin runner's event chunks, reached
# through the experiment wiring) and the Sebulba hand-off tests (its greedy evaluation, through the runner).
ALSO_TESTS: dict[str, tuple[str, ...]] = {
    **{path: ("tests/rl/infra/test_multiprocess.py",)
       for path in ("rl/runners/sebulba.py", "rl/runners/sebulba_learner.py", "rl/runners/sebulba_actor.py",
                    "rl/infra/distributed.py", "rl/runners/loop.py")},
    "rl/runners/anakin.py": ("tests/rl/learning/test_pbt.py",),
    "rl/runners/evaluate.py": ("tests/rl/runners/test_sebulba_handoffs.py",),
    # the agent protocol's `extras.<key>` step fields: only Muesli stores one (its behaviour log-probabilities)
    "rl/learning/agent.py": ("tests/agents/test_muesli.py",),
}


def module_of(path: str) -> str:
    """'buffers/sumtree.py' -> 'buffers.sumtree'; a package's __init__.py -> the package."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str) -> set[str]:
    """The modules a file imports anywhere: `import a.b` -> a.b; `from a.b import c` -> a.b and a.b.c."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_map(tree: Path, paths: list[str]) -> dict[str, list[str]]:
    """Each library file's test files: its own `tests/<dir>/test_<module>.py` first (whatever it imports), then
    those importing its module; or TESTS_OF's."""
    imports = {f.relative_to(tree).as_posix(): imported(f.read_text()) for f in sorted(tree.glob("tests/**/test_*.py"))}
    out = {}
    for path in paths:
        own = (Path("tests") / Path(path).parent / f"test_{Path(path).stem}.py").as_posix()
        files = [f for f, names in imports.items() if module_of(path) in names or f == own]
        out[path] = list(TESTS_OF[path]) if path in TESTS_OF else sorted(
            files, key=lambda f: Path(f).stem != f"test_{Path(path).stem}")
        out[path] += [f for f in ALSO_TESTS.get(path, ()) if f not in out[path]]
    return out


def generate_tree(tree: Path) -> list[Generated]:
    """Every generated mutant of the library files in `tree`, with its test selection (none: no test file)."""
    paths = sorted(f.relative_to(tree).as_posix() for top in LIBRARY for f in (tree / top).rglob("*.py"))
    tests = test_map(tree, paths)
    return [dataclasses.replace(g, tests=(("-m", "not slow", "-n", "0", *tests[path]),) if tests[path] else ())
            for path in paths for g in generate((tree / path).read_text(), path)]


def sample(candidates: list[Generated], n: int, seed: int, sources: dict[str, str]):
    """(the first `n` not-equivalent mutants of a seeded shuffle of the sorted candidates, the equivalent ones
    met on the way as (mutant, reason))."""
    order = sorted(candidates, key=lambda g: (g.path, g.line, g.col, g.op))
    random.Random(seed).shuffle(order)
    picked, equivalent = [], []
    for g in order:
        if len(picked) == n:
            break
        reason = EQUIVALENT.get(g.key(sources[g.path]))
        if reason:
            equivalent.append((g, reason))
        else:
            picked.append(g)
    return picked, equivalent
