"""Shared helpers for the buffer tests: an HLO in-place report and a chi-square goodness-of-fit p-value."""

from __future__ import annotations

import re
import types

import jax
import numpy as np
import pytest
from scipy import stats

_HEAD = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*")
_COPY_OPS = ("copy", "copy-start", "concatenate", "pad", "transpose", "reverse", "dynamic-slice", "slice")


def hlo_instructions(text: str):
    """(opcode, array dims of the result (first array of a tuple), line) for every HLO instruction.

    A line is `%name = <type> opcode(...)`, where <type> is an array type or a parenthesised tuple type
    (which may hold `/*index=5*/` comments), so the type is skipped by matching parentheses.
    """
    for line in text.splitlines():
        head = _HEAD.match(line)
        if not head:
            continue
        rest = line[head.end() :]
        if rest.startswith("("):
            depth, end = 0, 0
            for end, ch in enumerate(rest):
                depth += {"(": 1, ")": -1}.get(ch, 0)
                if depth == 0:
                    break
            type_str, rest = rest[: end + 1], rest[end + 1 :]
        else:
            type_str, _, rest = rest.partition(" ")
        op = re.match(r"\s*([\w\-]+)\(", rest)
        if op:
            dims = re.search(r"\[([\d,]*)\]", type_str)
            shape = tuple(int(d) for d in dims.group(1).split(",") if d) if dims else ()
            yield op.group(1), shape, line.strip()


def while_loops(text: str) -> list[str]:
    """The `while` instructions of a compiled module (each as its line, which names its source op)."""
    return [line for op, _, line in hlo_instructions(text) if op == "while"]


def is_threefry_loop(line: str) -> bool:
    """Whether a `while` line is JAX's CPU lowering of threefry (a rolled loop of 5 rounds over uint32
    words; the op metadata does not say so, the shape does: trip count 5, a tuple of only u32/s32 arrays)."""
    types_ = re.findall(r"\b([a-z]+\d*)\[", line.split(" while(")[0])
    return '"known_trip_count":{"n":"5"}' in line and set(types_) <= {"u32", "s32"}


def capacity_copies(text: str, capacity_dims: set[int]) -> list[str]:
    """Instructions that copy/rebuild an array having one of `capacity_dims` (copy, concatenate, pad, ...)."""
    return [
        line[:200]
        for op, shape, line in hlo_instructions(text)
        if op in _COPY_OPS and any(d in capacity_dims for d in shape)
    ]


_IN_PLACE_OPS = ("parameter", "bitcast", "get-tuple-element", "tuple", "scatter", "dynamic-update-slice")


def capacity_passes(text: str, capacity_dims: set[int]) -> list[str]:
    """Instructions writing a whole array having one of `capacity_dims` that is not an in-place update.

    In-place updates are scatters and dynamic-update-slices, bare or as the root of a fusion (XLA names
    such fusions after them); anything else with a capacity-sized result (an elementwise select over the
    storage, a broadcast, a copy) is a full pass over the buffer.
    """
    found = []
    for op, shape, line in hlo_instructions(text):
        if not any(d in capacity_dims for d in shape) or op in _IN_PLACE_OPS:
            continue
        name = line.split("=")[0]
        if op == "fusion" and ("scatter" in name or "dynamic-update-slice" in name or "update_slice" in name):
            continue
        found.append(line[:200])
    return found


def in_place_report(compiled, state) -> dict:
    """What the compiled, donated step does with the buffer state `state`.

    `whiles`: its while loops; `copies`: copies of arrays with a capacity-sized dim (any dim of a state leaf
    of >= 1000 entries); `passes`: any non-in-place instruction with such a result; `aliased`: every state byte is an input aliased to an output; `temp_ok`: no
    temporary as large as the largest state leaf.
    """
    text = compiled.as_text()
    leaves = jax.tree_util.tree_leaves(state)
    dims = {d for x in leaves for d in x.shape if d >= 1000}
    mem = compiled.memory_analysis()
    largest = max(x.nbytes for x in leaves)
    return {
        "whiles": while_loops(text),
        "copies": capacity_copies(text, dims),
        "passes": capacity_passes(text, dims),
        "aliased": mem.alias_size_in_bytes >= sum(x.nbytes for x in leaves),
        "temp_ok": mem.temp_size_in_bytes < largest,
    }


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness-of-fit p-value of observed `counts` against `probs` (cells with prob 0 must have count 0)."""
    counts, probs = np.asarray(counts, np.float64), np.asarray(probs, np.float64)
    assert counts[probs == 0].sum() == 0, "draws landed on zero-probability cells"
    keep = probs > 0
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    return float(stats.chisquare(counts[keep], expected).pvalue)


@pytest.fixture
def hlo():
    """HLO inspection helpers (see this module)."""
    return types.SimpleNamespace(
        instructions=hlo_instructions,
        while_loops=while_loops,
        is_threefry_loop=is_threefry_loop,
        capacity_copies=capacity_copies,
        capacity_passes=capacity_passes,
        in_place_report=in_place_report,
    )


@pytest.fixture
def chi_square():
    return chi_square_pvalue
