"""Mutation check: plant realistic mistakes in the library one at a time and see whether the fast tests
catch them. Test tooling, not part of the default suite (it runs the suite's files many times over).

    python -m tests.mutation --list                  # the hand mutants, and whether each is still found
    python -m tests.mutation                         # run every hand mutant (tens of minutes on 2 CPU cores)
    python -m tests.mutation --only dqn_weights_dropped --only muesli_pg_sign
    python -m tests.mutation --source HEAD           # mutate the committed tree instead of the working tree
    python -m tests.mutation --random 60 --seed 0 --list   # a seeded sample of generated mutants
    python -m tests.mutation --random 60 --seed 0 --source HEAD --no-baseline --timeout 900
    python -m tests.mutation --only buffers/sumtree.py:74:39:lt_to_le   # generated mutants by id

Hand mutants (`hand.py`) name a function and an expression of it, found by AST; generated ones
(`operators.py`) are one-node operator edits of every library file, sampled with `random.Random(seed)` after
skipping those listed as equivalent (`equivalent.py`), so a seed gives the same sample of the same code.

The tree (the working tree's tracked and untracked, not ignored, files; or `git archive <rev>` with `--source
<rev>`) is copied to a temporary directory once; for each mutant its file is edited there, the mutant's fast
tests run with a timeout (`selection.py`), and the file is restored. A mutant is *caught* when a test fails
(or errors, or times out); otherwise it *survived*. The last line is the score `caught/total`. Before the
mutants, every distinct test selection runs once on the unmutated copy (`--no-baseline` skips this): a
selection that already fails would catch every mutant for nothing, so the run stops.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.mutation import hand
from tests.mutation.equivalent import EQUIVALENT
from tests.mutation.hand import MUTANTS, Mutant
from tests.mutation.operators import Generated
from tests.mutation.selection import generate_tree, sample

ROOT = Path(__file__).resolve().parents[2]


def copy_tree(dest: Path, source: str) -> None:
    """The repo's files into `dest`: the working tree (tracked + untracked, not ignored) or `git archive <rev>`."""
    if source == "worktree":
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             check=True, capture_output=True).stdout
        for rel in filter(None, out.decode().split("\0")):
            src = ROOT / rel
            if src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
    else:
        archive = subprocess.run(["git", "archive", source], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def run_tests(tree: Path, args: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    """('pass' | 'fail' | 'timeout' | 'error', seconds, last lines of output) of one pytest selection."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=str(tree), JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    dt = time.perf_counter() - t0
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
    if proc.returncode == 0:
        return "pass", dt, tail
    if proc.returncode == 1:
        return "fail", dt, tail
    return "error", dt, f"pytest exit {proc.returncode}: {tail}"


def first_failure(tail: str) -> str:
    for line in tail.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line.split(" - ")[0]
    return tail.splitlines()[-1] if tail else ""


def mutated_file(tree: Path, m: Mutant | Generated) -> tuple[Path, str]:
    """The file of `tree` that `m` changes, and its mutated text."""
    if isinstance(m, Generated):
        return tree / m.path, m.mutate((tree / m.path).read_text())
    return tree / m.path, hand.mutate((tree / m.path).read_text(), m)


def choose(tree: Path, args, names: list[str]):
    """(the mutants to run, the listed-equivalent ones as (mutant, reason), the number of generated candidates):
    the hand list, a --random sample, or the --only names (hand names, or generated ids `file:line:col:op`)."""
    listed = [m for m in MUTANTS if m.name in names] if names else [] if args.random is not None else MUTANTS
    if args.random is None and all(":" not in n for n in names):
        return listed, [], 0
    candidates = generate_tree(tree)
    sources = {path: (tree / path).read_text() for path in {g.path for g in candidates}}
    stale = set(EQUIVALENT) - {g.key(sources[g.path]) for g in candidates}
    if stale and args.list:
        print(f"EQUIVALENT entries that match no mutant of this code: {sorted(stale)}")
    if not names:
        picked, equivalent = sample(candidates, args.random, args.seed, sources)
        return picked, equivalent, len(candidates)
    by_name = {g.name: g for g in candidates}
    unknown = sorted(n for n in names if ":" in n and n not in by_name)
    if unknown:
        raise SystemExit(f"no generated mutant {unknown} in this code; see --random N --list")
    chosen = [by_name[n] for n in names if ":" in n]
    equivalent = [(g, EQUIVALENT[g.key(sources[g.path])]) for g in chosen if g.key(sources[g.path]) in EQUIVALENT]
    return listed + [g for g in chosen if g.key(sources[g.path]) not in EQUIVALENT], equivalent, len(candidates)


def label(m: Mutant | Generated) -> str:
    return f"{m.name:46s} {m.description}" if isinstance(m, Generated) else f"{m.name:42s}"


def run_mutant(tree: Path, m: Mutant | Generated, timeout: float) -> tuple[str, float, str]:
    """(outcome, seconds, detail) of one mutant: its selections run in turn until one fails."""
    if not m.tests:
        return "survived", 0.0, "no test file for this module"
    f, text = mutated_file(tree, m)
    original = f.read_text()
    f.write_text(text)
    try:
        total = 0.0
        for sel in m.tests:
            status, dt, tail = run_tests(tree, sel, timeout)
            total += dt
            if status != "pass":
                outcome = "caught" if status == "fail" else f"caught ({status})"
                detail = first_failure(tail) if status == "fail" else tail.splitlines()[-1] if tail else status
                return outcome, total, detail
        return "survived", total, ""
    finally:
        f.write_text(original)


def report(tree: Path, results: list, equivalent: list) -> None:
    """The survivors (a generated one with its diff), the equivalent mutants and the score line."""
    survivors = [m for m, o in results if o == "survived"]
    caught = len(results) - len(survivors)
    if survivors:
        print("\nsurvivors:")
        for m in survivors:
            if isinstance(m, Generated):
                old, new = m.diff((tree / m.path).read_text())
                print(f"  {m.name}  {m.description}")
                print("\n".join(f"    - {line.strip()}" for line in old) + "\n"
                      + "\n".join(f"    + {line.strip()}" for line in new))
            else:
                print(f"  {m.name} ({m.path}){': ' + m.why if m.why else ''}")
    if equivalent:
        print("\nequivalent (listed in EQUIVALENT, not run, not counted):")
        for g, reason in equivalent:
            print(f"  {g.name}  {g.description}: {reason}")
    print(f"\nmutation score: {caught}/{len(results)} caught ({100.0 * caught / max(len(results), 1):.0f}%)"
          + (f"; survived: {', '.join(m.name for m in survivors)}" if survivors else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the mutants (and check they are found), run nothing")
    parser.add_argument("--only", action="append", default=[],
                        help="run only this mutant: a hand name or a generated id file:line:col:op (repeatable, or a,b,c)")
    parser.add_argument("--random", type=int, metavar="N", help="run N generated mutants, sampled with --seed")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --random sample (default 0)")
    parser.add_argument("--source", default="worktree", help="'worktree' (default) or a git revision, e.g. HEAD")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of each test selection")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy of the tree")
    args = parser.parse_args(argv)

    names = [n for item in args.only for n in item.split(",") if n]
    unknown = sorted({n for n in names if ":" not in n} - {m.name for m in MUTANTS})
    if unknown:
        parser.error(f"unknown mutant(s) {unknown}; see --list")
    dupes = {m.name for m in MUTANTS if sum(x.name == m.name for x in MUTANTS) > 1}
    if dupes:
        raise SystemExit(f"duplicate mutant names: {sorted(dupes)}")

    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="mutate-"))
    try:
        tree = tmp / "repo"
        tree.mkdir()
        copy_tree(tree, args.source)
        mutants, equivalent, candidates = choose(tree, args, names)
        problems = hand.check(tree, [m for m in mutants if isinstance(m, Mutant)])
        if args.list:
            bad = {p.split(":")[0] for p in problems}
            for m in mutants:
                tests = " ; ".join(" ".join(t) for t in m.tests) or "(no test file)"
                where = "" if isinstance(m, Generated) else f" {m.path}:{m.scope}"
                print(f"{'MISSING' if m.name in bad else 'ok':8s} {label(m)}{where}  {tests}")
            for g, reason in equivalent:
                print(f"{'EQUIV':8s} {label(g)}  {reason}")
            print(f"{len(mutants)} mutants, {len(problems)} not found"
                  + (f"; {len(equivalent)} equivalent; {candidates} generated candidates" if candidates else ""))
            for p in problems:
                print("  " + p)
            return 1 if problems else 0
        if problems:
            print("The hand mutants are out of sync with the code (fix them in tests/mutation/hand.py):")
            for p in problems:
                print("  " + p)
            return 2
        sampled = f" (seed {args.seed}, of {candidates} generated candidates)" if candidates and not names else ""
        print(f"{len(mutants)} mutants{sampled} over a copy of {args.source} in {tree}", flush=True)

        if not args.no_baseline:
            selections = sorted({t for m in mutants for t in m.tests})
            for sel in selections:
                status, dt, tail = run_tests(tree, sel, args.timeout)
                print(f"baseline {status:7s} {dt:6.1f}s  {' '.join(sel)}", flush=True)
                if status != "pass":
                    print(f"The unmutated tree fails this selection; fix it first:\n{tail}")
                    return 2

        results = []
        for i, m in enumerate(mutants, 1):
            outcome, total, detail = run_mutant(tree, m, args.timeout)
            results.append((m, outcome))
            print(f"[{i:2d}/{len(mutants)}] {outcome.upper():18s} {label(m)} {total:6.1f}s  {detail}", flush=True)
        report(tree, results, equivalent)
        print(f"wall time {time.perf_counter() - start:.0f}s")
        return 0
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
