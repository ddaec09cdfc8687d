"""Kernel counts of a compiled XLA program, read from its optimised HLO text (`compiled.as_text()`).

A *kernel* is one instruction of an executed (non-fused) computation that is not free: every instruction
except `parameter`, `constant`, `get-tuple-element`, `tuple`, `bitcast` and `after-all` (which move no data
and launch nothing). A `fusion` counts as one kernel; the computations it calls (and the `to_apply`
reducers of reduce / scatter / sort) are its insides, not kernels of their own. Control flow is expanded:

* a `while` counts 1 (the loop itself) plus its condition and body, each times the trip count XLA proved
  (`known_trip_count`; 1 when unknown);
* a `conditional` counts 1 plus its largest branch (the branch that does the work: for the runners, the
  train step; for the PureJaxRL-style loop also the target copy, which it takes once in 50 updates);
* a `call` counts its callee.

`iteration_counts(text, block)` counts one iteration of a program's main loop: the body (and condition) of the
entry computation's `while` whose expanded body has the most kernels, i.e. one step of a `lax.scan` /
`fori_loop` that runs the iterations (with `block > 1`, of the nested loop of `block` known trips inside it). `program_counts(text)` counts the whole entry computation once.
Both return the categories of `CATEGORIES` (disjoint) and their `total`.
"""

from __future__ import annotations

import re
from collections import Counter

FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all"}
CATEGORIES = ("fusion", "custom_call", "gather_scatter", "copy", "control", "other")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT )?%?[\w.\-]+ = .*?\b([a-z][a-z0-9\-]*)\((.*)$")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def parse(text: str) -> tuple[dict[str, list[tuple[str, str]]], str]:
    """`({computation name: [(opcode, instruction line)]}, entry name)` of an HLO module's text."""
    comps, entry, current = {}, None, None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and not line.startswith("HloModule"):
                current = m.group(2)
                comps[current] = []
                if m.group(1):
                    entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if m:
            comps[current].append((_opcode(line), line))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def _opcode(line: str) -> str:
    """The opcode of an instruction line: the word before the first '(' after the result's type."""
    rhs = line.split(" = ", 1)[1]
    # The result type may itself contain parentheses (tuples): skip a balanced leading "(...)".
    if rhs.startswith("("):
        depth = 0
        for i, ch in enumerate(rhs):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                rhs = rhs[i + 1:]
                break
    m = re.search(r"\b([a-z][a-z0-9\-]*)\(", rhs)
    return m.group(1) if m else "?"


def _attr(line: str, name: str) -> list[str]:
    m = re.search(rf"\b{name}=\{{([^}}]*)\}}", line) or re.search(rf"\b{name}=%?([\w.\-]+)", line)
    return [c.strip().lstrip("%") for c in m.group(1).split(",")] if m else []


def _category(op: str) -> str:
    if op == "fusion":
        return "fusion"
    if op == "custom-call":
        return "custom_call"
    if op in ("gather", "scatter"):
        return "gather_scatter"
    if op in ("copy", "copy-start", "copy-done"):
        return "copy"
    if op in ("while", "conditional", "call"):
        return "control"
    return "other"


def _count(comps: dict, name: str, memo: dict) -> Counter:
    if name in memo:
        return memo[name]
    total = Counter()
    for op, line in comps[name]:
        if op in FREE:
            continue
        if op != "call":
            total[_category(op)] += 1
        if op == "while":
            m = _TRIP.search(line)
            trips = int(m.group(1)) if m else 1
            for part in (_attr(line, "condition") + _attr(line, "body")):
                total.update({k: v * trips for k, v in _count(comps, part, memo).items()})
        elif op == "conditional":
            branches = _attr(line, "branch_computations") or (
                _attr(line, "true_computation") + _attr(line, "false_computation"))
            total.update(max((_count(comps, b, memo) for b in branches), key=lambda c: sum(c.values())))
        elif op == "call":
            for callee in _attr(line, "to_apply"):
                total.update(_count(comps, callee, memo))
    memo[name] = total
    return total


def _result(counter: Counter) -> dict:
    out = {k: int(counter.get(k, 0)) for k in CATEGORIES}
    out["total"] = sum(out.values())
    return out


def program_counts(text: str) -> dict:
    """Kernels of one run of the whole program (entry computation, control flow expanded)."""
    comps, entry = parse(text)
    return _result(_count(comps, entry, {}))


def iteration_counts(text: str, block: int = 1) -> dict:
    """Kernels of one iteration of the program's main loop (see the module docstring); raises ValueError
    when the entry computation has no `while`. `block > 1`: the main loop runs blocks of `block` iterations
    (the Anakin runner on accelerators, rl/runners/anakin.py `_repeat`), so one iteration is the body of the
    nested loop of that known trip count where the main loop's body holds one."""
    comps, entry = parse(text)
    memo = {}
    loops = [line for op, line in comps[entry] if op == "while"]
    if not loops:
        raise ValueError("the program's entry computation has no while loop")

    def one_iteration(line):
        c = Counter()
        for part in _attr(line, "condition") + _attr(line, "body"):
            c.update(_count(comps, part, memo))
        return c

    main = max(loops, key=lambda line: sum(one_iteration(line).values()))
    if block > 1:
        inner = [ln for op, ln in comps[_attr(main, "body")[0]]
                 if op == "while" and (m := _TRIP.search(ln)) and int(m.group(1)) == block]
        main = inner[0] if inner else main
    return _result(one_iteration(main))


def cost(compiled) -> dict:
    """XLA's cost analysis of a compiled program: `flops` and `bytes_accessed` (a while body counted once)."""
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list | tuple) else analysis
    return {"flops": float(analysis.get("flops", 0.0)), "bytes_accessed": float(analysis.get("bytes accessed", 0.0))}
