"""The hand mutants of tests/mutation/hand.py: each is found by AST exactly once in the library as it is now
(so the list follows the code), placement ignores formatting, and a missing or repeated expression is
reported by name (no mutant is run here)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.mutation import hand
from tests.mutation.hand import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
SOURCE = '''
class Agent:
    def loss(self, w, td):
        # a comment inside the expression's line breaks
        return jnp.mean(w *
                        td_loss(td))  # the end

    def other(self, w, td):
        return jnp.mean(w * td_loss(td))
'''


def _mutant(scope="Agent.loss", old="w * td_loss(td)", new="td_loss(td)"):
    return Mutant("m", "x.py", scope, old, new, ())


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_every_hand_mutant_is_found_once_and_changes_its_file(m):
    assert hand.check(ROOT, [m]) == []
    source = (ROOT / m.path).read_text()
    mutated = hand.mutate(source, m)
    assert ast.dump(ast.parse(mutated)) != ast.dump(ast.parse(source))


def test_names_are_unique_and_every_mutant_has_tests():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert all(m.tests and all((ROOT / m.tests[i][0]).is_file() for i in range(len(m.tests))) for m in MUTANTS)


def test_an_expression_is_found_by_structure_in_its_function_only():
    mutated = hand.mutate(SOURCE, _mutant())
    assert "return jnp.mean((td_loss(td)))  # the end" in mutated  # the line breaks and the comment went with it
    assert "return jnp.mean(w * td_loss(td))" in mutated  # Agent.other is another function: untouched


def test_the_replacement_is_parenthesised_so_precedence_holds():
    mutated = hand.mutate("def f(x, c, d, a, b):\n    return x - c * d\n", _mutant("f", "c * d", "a + b"))
    assert "return x - (a + b)" in mutated


@pytest.mark.parametrize("scope, old, problem", [
    ("Agent.gone", "w * td_loss(td)", "no function 'Agent.gone' in x.py"),
    ("Agent.loss", "w * td_loss(td, 1)", "occurs 0 times in x.py:Agent.loss"),
    ("Agent", "w * td_loss(td)", "occurs 2 times in x.py:Agent"),
])
def test_a_missing_or_repeated_expression_is_reported_by_name(scope, old, problem):
    span, message = hand.locate(SOURCE, _mutant(scope, old))
    assert span is None and message.startswith("m: ") and problem in message
    with pytest.raises(ValueError, match=problem):
        hand.mutate(SOURCE, _mutant(scope, old))


def test_check_reports_a_missing_file(tmp_path):
    assert hand.check(tmp_path, [_mutant()]) == ["m: no file x.py"]
