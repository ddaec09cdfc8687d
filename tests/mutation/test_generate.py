"""The generated mutants of tests/mutation (operators.py, selection.py): each operator's edit on small
sources, the skipped code, the seeded sample, and the library-file -> test-files map (no mutant is run here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutation import operators, selection
from tests.mutation.equivalent import EQUIVALENT

ROOT = Path(__file__).resolve().parents[2]


def mutants(expr: str) -> set[tuple[str, str]]:
    """(operator, mutated expression) of every mutant of `return <expr>` in a small function."""
    source = f"def f(a, b, c, i, n, mask):\n    return {expr}\n"
    out = set()
    for g in operators.generate(source, "x.py"):
        lines = g.mutate(source).splitlines()
        assert lines[0] == "def f(a, b, c, i, n, mask):" and lines[1].startswith("    return ")
        out.add((g.op, lines[1].removeprefix("    return ")))
    return out


@pytest.mark.parametrize("expr, expected", [
    ("a < b", {("lt_to_le", "a <= b"), ("lt_to_gt", "a > b")}),
    ("a >= b", {("ge_to_gt", "a > b"), ("ge_to_le", "a <= b")}),
    ("a == b", {("eq_to_ne", "a != b")}),
    ("(a) != (b)", {("ne_to_eq", "(a) == (b)")}),
    ("a < b <= c", {("lt_to_le", "a <= b <= c"), ("lt_to_gt", "a > b <= c"), ("le_to_lt", "a < b < c"),
                    ("le_to_ge", "a < b >= c")}),
    ("a and b", {("and_to_or", "a or b")}),
    ("a or b", {("or_to_and", "a and b")}),
    ("a & b", {("bitand_to_bitor", "a | b")}),
    ("not a", {("not_dropped", "a")}),
    ("not (a or b)", {("not_dropped", "(a or b)"), ("or_to_and", "not (a and b)")}),
    ("~a", {("invert_dropped", "a")}),
    ("True", {("true_to_false", "False")}),
    ("a + b", {("add_to_sub", "a - b")}),
    ("a / b", {("div_to_mult", "a * b")}),
    ("-a", {("neg_dropped", "a")}),
    ("10_000", {("plus_one", "10001"), ("minus_one", "9999")}),
    ("a[i]", {("index_plus_one", "a[i + 1]"), ("index_minus_one", "a[i - 1]")}),
    ("a[:, i + n]", {("index_plus_one", "a[:, (i + n) + 1]"), ("index_minus_one", "a[:, (i + n) - 1]"),
                     ("add_to_sub", "a[:, i - n]")}),
    ("g(a, b, 1.5)", {("args_swapped", "g(b, a, 1.5)")}),
    ("g(a, 'b')", set()),  # a name and a string: not of the same kind
    ("jax.lax.stop_gradient(a)", {("stop_gradient_dropped", "(a)")}),
    ("a % n", {("mod_dropped", "(a)")}),
    ("c * (a + b) % n", {("mod_dropped", "(c * (a + b))"), ("mult_to_div", "c / (a + b) % n"),
                         ("add_to_sub", "c * (a - b) % n")}),
    ("a * mask", {("mask_dropped", "(a)"), ("mult_to_div", "a / mask")}),
    ("jnp.where(mask, a, b)", {("where_to_true_branch", "(a)"), ("args_swapped", "jnp.where(a, mask, b)")}),
])
def test_each_operator_makes_its_edit(expr, expected):
    assert mutants(expr) == expected


def test_an_edit_keeps_the_rest_of_the_file_and_counts_columns_in_characters():
    source = ('"""é."""\n\n\ndef f(a, b):\n    s = "→"; t = a + b  # é\n'
              "    return (s,\n            t)\n")
    (g,) = [g for g in operators.generate(source, "x.py") if g.op == "add_to_sub"]
    assert (g.line, g.col, g.name) == (5, 20, "x.py:5:20:add_to_sub")
    assert g.mutate(source) == source.replace("a + b", "a - b")
    assert g.diff(source) == (['    s = "→"; t = a + b  # é'], ['    s = "→"; t = a - b  # é'])
    assert g.key(source) == ("x.py", 's = "→"; t = a + b  # é', "add_to_sub")
    aug = "def f(x):\n    x += 2 * x\n    return x\n"
    (g,) = [g for g in operators.generate(aug, "x.py") if g.op == "iadd_to_isub"]
    assert g.mutate(aug) == aug.replace("+=", "-=")


def test_docstrings_messages_annotations_defaults_and_config_are_not_mutated():
    source = '''"""Module docstring 1 < 2."""
import dataclasses

LIMIT = 3
TABLE = (1, 2)


@dataclasses.dataclass
class Config:
    """Docstring."""

    size: int = 3
    flag: bool = True


def f(x: dict[str, int], n: int = 4, *, flag=False) -> list[int]:
    """x < 1 + 2."""
    if x:
        raise ValueError(f"bad {n + 1}", n - 1)
    assert x, f"message {n * 2}"
    print(n + 1)
    warnings.warn("too big: %d" % n)
    logging.info("n=%s", n + 1)
    logger.note(f"{n - 1} left")
    draw.ellipse(x, fill=(204, 204, 0))
    return "a" + "b"
'''
    assert [g.description for g in operators.generate(source, "x.py")] == []


def test_the_sample_is_seeded_sorted_and_skips_listed_equivalent_mutants(monkeypatch):
    sources = {p: (f"def {p[0]}(a, b, i):\n    return a[i] < b + 1 and not a\n") for p in ("p.py", "q.py")}
    candidates = [g for path, src in sources.items() for g in operators.generate(src, path)]
    assert len(candidates) == 18
    names = lambda picked: [g.name for g in picked]
    first, equivalent = selection.sample(candidates, 6, seed=0, sources=sources)
    assert equivalent == [] and len(first) == 6 and len(set(names(first))) == 6
    assert names(selection.sample(candidates[::-1], 6, seed=0, sources=sources)[0]) == names(first)  # input order
    ten = names(selection.sample(candidates, 10, seed=0, sources=sources)[0])
    assert ten[:6] == names(first)  # a prefix
    assert names(selection.sample(candidates, 6, seed=1, sources=sources)[0]) != names(first)

    # Listing the second picked mutant as equivalent: it is set aside with its reason and one more is drawn.
    monkeypatch.setitem(EQUIVALENT, first[1].key(sources[first[1].path]), "cannot change anything")
    picked, equivalent = selection.sample(candidates, 6, seed=0, sources=sources)
    assert [(g.name, why) for g, why in equivalent] == [(first[1].name, "cannot change anything")]
    assert names(picked) == names(first[:1] + first[2:]) + ten[6:7]


def test_a_selection_named_by_hand_keeps_the_test_files_that_import_the_module_itself():
    """TESTS_OF replaces the import rule's files: a test file importing the module by name (not its package)
    still runs for its mutants, but for the modules most of the suite imports (their own tests only)."""
    widely = {"agents/__init__.py", "rl/config.py", "agents/experiment.py"}
    imports = {f.relative_to(ROOT).as_posix(): selection.imported(f.read_text())
               for f in ROOT.glob("tests/**/test_*.py")}
    for path, files in selection.TESTS_OF.items():
        direct = {f for f, names in imports.items() if selection.module_of(path) in names}
        assert path in widely or direct <= set(files), (path, sorted(direct - set(files)))


def test_a_library_file_maps_to_the_test_files_that_import_it(tmp_path):
    tests = selection.test_map(ROOT, ["buffers/sumtree.py", "agents/muesli/targets.py", "rl/learning/targets.py"])
    assert tests["buffers/sumtree.py"][0] == "tests/buffers/test_sumtree.py"  # its own test file first
    assert "tests/buffers/test_prioritised.py" in tests["buffers/sumtree.py"]  # also imports buffers.sumtree
    assert tests["agents/muesli/targets.py"] == list(selection.MUESLI_TESTS)  # through the package: TESTS_OF
    assert tests["rl/learning/targets.py"] == ["tests/rl/learning/test_targets.py"]
    assert selection.imported("from a.b import c, d as e\nimport f.g\ndef h():\n    from i import j\n") == {
        "a.b", "a.b.c", "a.b.d", "f.g", "i", "i.j"}
    for path, files in (*selection.TESTS_OF.items(), *selection.ALSO_TESTS.items()):  # the tables follow the tree
        assert (ROOT / path).is_file() and all((ROOT / f).is_file() for f in files), path
    sebulba = selection.test_map(ROOT, ["rl/runners/sebulba.py"])["rl/runners/sebulba.py"]
    # the importing tests, then the multi-process tests that run it in subprocesses
    assert sebulba[0] == "tests/rl/runners/test_sebulba.py" and sebulba[-1] == "tests/rl/infra/test_multiprocess.py"
