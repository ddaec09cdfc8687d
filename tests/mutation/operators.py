"""Generated operator mutants: one-node edits of library source made with Python's `ast`.

Operators: comparison flips (< <=, > >=, == !=, < with >); boolean flips (and/or, & and |, `not` and `~`
dropped, True/False); arithmetic swaps (+ -, * /, also as `+=`; unary minus dropped); off-by-one of integer
constants and of non-constant subscript indices (n -> n+1 / n-1); the first two positional arguments of a
call swapped when of the same kind; `stop_gradient(x)` -> x; `x % n` -> x; mask terms dropped (`x * m` -> x
where m names a mask, valid, done... flag; `where(m, a, b)` -> a). Skipped: docstrings and strings,
f-strings, `raise` statements, assert messages, message calls (print, warnings.warn, logging.*, a logger's
`.note`), type annotations, default values of parameters and of class-level (dataclass) fields, module-level
UPPER_CASE constants (config and tuning tables), and drawing colours (`fill=`).

Each mutant is a text edit at its node's source span, so the rest of the file keeps its formatting; its id
is `file:line:col:op`. (mutmut and cosmic-ray rerun whole test suites per mutant, far too slow for jitted
code on a small CPU.)
"""

from __future__ import annotations

import ast
import dataclasses


@dataclasses.dataclass(frozen=True)
class Generated:
    path: str  # relative to the repo root
    line: int  # 1-based, of the edit's focus (the operator, the constant, the dropped operand)
    col: int  # 1-based, in characters
    op: str  # operator slug, e.g. lt_to_le
    description: str
    start: int  # the edit: bytes [start, end) of the file's UTF-8 text become `replacement`
    end: int
    replacement: str
    tests: tuple[tuple[str, ...], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}:{self.col}:{self.op}"

    def mutate(self, source: str) -> str:
        data = source.encode()
        return (data[: self.start] + self.replacement.encode() + data[self.end :]).decode()

    def diff(self, source: str) -> tuple[list[str], list[str]]:
        """The lines the edit touches: (original lines, mutated lines)."""
        data = source.encode()
        first = data.rfind(b"\n", 0, self.start) + 1
        last = data.find(b"\n", self.end)
        last = len(data) if last < 0 else last
        old = data[first:last].decode()
        new = (data[first : self.start] + self.replacement.encode() + data[self.end : last]).decode()
        return old.splitlines(), new.splitlines()

    def key(self, source: str) -> tuple[str, str, str]:
        return self.path, source.splitlines()[self.line - 1].strip(), self.op


CMP_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
CMP_FLIPS = {"<": ("<=", ">"), "<=": ("<", ">="), ">": (">=", "<"), ">=": (">", "<="), "==": ("!=",), "!=": ("==",)}
BIN_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.BitAnd: "&", ast.BitOr: "|"}
BIN_FLIP = {"+": "-", "-": "+", "*": "/", "/": "*", "&": "|", "|": "&", "and": "or", "or": "and"}
SLUG = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne", "+": "add", "-": "sub", "*": "mult",
        "/": "div", "&": "bitand", "|": "bitor", "and": "and", "or": "or", "+=": "iadd", "-=": "isub",
        "*=": "imult", "/=": "idiv"}
MASK_WORDS = ("mask", "valid", "alive", "done", "terminat", "continu")
MESSAGE_CALLS = ("print", "warn", "note")  # print, warnings.warn, a run logger's human-readable `.note`
NOT_ARITHMETIC = (ast.JoinedStr, ast.Tuple, ast.List, ast.ListComp)  # `+`/`*` of these build strings/sequences


def _dotted(node: ast.AST) -> str:
    """'jax.lax.stop_gradient' for a Name/Attribute chain, '' otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _is_message(node: ast.AST) -> bool:
    if isinstance(node, (ast.Raise, ast.JoinedStr)):
        return True
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        return name.split(".")[-1] in MESSAGE_CALLS or name.startswith("logging.")
    return False


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, str)


class _Generator:
    """The mutants of one file's source (see `generate`)."""

    def __init__(self, source: str, path: str):
        self.path, self.data = path, source.encode()
        self.line_start = [0]
        for i, byte in enumerate(self.data):
            if byte == 10:
                self.line_start.append(i + 1)
        self.out: list[Generated] = []

    def offset(self, line: int, col: int) -> int:
        return self.line_start[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode()

    def add(self, focus: int, op: str, description: str, start: int, end: int, replacement: str) -> None:
        line = self.data.count(b"\n", 0, focus) + 1
        col = len(self.data[self.line_start[line - 1] : focus].decode()) + 1
        self.out.append(Generated(self.path, line, col, op, description, start, end, replacement))

    def token(self, left: ast.AST, right: ast.AST, symbol: str) -> int | None:
        """Byte offset of the operator `symbol` between two operands (parentheses and spaces around it)."""
        start, end = self.span(left)[1], self.span(right)[0]
        between = self.data[start:end].decode()
        stripped = between.replace("(", " ").replace(")", " ")
        if stripped.split() != [symbol]:
            return None  # a comment or line continuation between the operands: leave it alone
        return start + len(between[: stripped.index(symbol)].encode())

    def swap_token(self, left: ast.AST, right: ast.AST, symbol: str, new: str) -> None:
        at = self.token(left, right, symbol)
        if at is not None:
            self.add(at, f"{SLUG[symbol]}_to_{SLUG[new]}", f"`{symbol}` -> `{new}`", at, at + len(symbol), new)

    # --- the walk ----------------------------------------------------------------------------------------
    def walk(self, node: ast.AST) -> None:
        if _is_message(node):
            return
        self.mutate(node)
        for field, value in ast.iter_fields(node):
            if field in ("annotation", "returns", "defaults", "kw_defaults", "msg"):
                continue  # type annotations, parameter defaults, assert messages
            if isinstance(node, ast.keyword) and node.arg == "fill":
                continue  # the colour of a drawing call
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST) and not self.skipped_statement(node, child):
                    self.walk(child)

    @staticmethod
    def skipped_statement(parent: ast.AST, child: ast.AST) -> bool:
        """Docstrings, class-level annotated fields (dataclass config), module-level UPPER_CASE constants."""
        if isinstance(child, ast.Expr) and _is_str(child.value):
            return True
        if isinstance(parent, ast.ClassDef) and isinstance(child, ast.AnnAssign):
            return True
        if isinstance(parent, ast.Module) and isinstance(child, (ast.Assign, ast.AnnAssign)):
            targets = child.targets if isinstance(child, ast.Assign) else [child.target]
            return all(isinstance(t, ast.Name) and t.id.isupper() for t in targets)
        return False

    def mutate(self, node: ast.AST) -> None:
        kind = type(node).__name__
        getattr(self, f"mutate_{kind}", lambda _: None)(node)

    def mutate_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            symbol = CMP_SYMBOL.get(type(op))
            for new in CMP_FLIPS.get(symbol, ()):
                self.swap_token(operands[i], operands[i + 1], symbol, new)

    def mutate_BoolOp(self, node: ast.BoolOp) -> None:
        symbol = "and" if isinstance(node.op, ast.And) else "or"
        for left, right in zip(node.values, node.values[1:]):
            self.swap_token(left, right, symbol, BIN_FLIP[symbol])

    def mutate_BinOp(self, node: ast.BinOp) -> None:
        if any(_is_str(x) or isinstance(x, NOT_ARITHMETIC) for x in (node.left, node.right)):
            return
        symbol = BIN_SYMBOL.get(type(node.op))
        if symbol:
            self.swap_token(node.left, node.right, symbol, BIN_FLIP[symbol])
        start, end = self.span(node)
        if isinstance(node.op, ast.Mod):
            self.add(self.token(node.left, node.right, "%") or start, "mod_dropped",
                     f"`% {self.text(node.right)}` dropped", start, end, f"({self.text(node.left)})")
        if isinstance(node.op, ast.Mult):
            for mask, other in ((node.left, node.right), (node.right, node.left)):
                if any(word in self.text(mask).lower() for word in MASK_WORDS):
                    self.add(self.span(mask)[0], "mask_dropped", f"mask term `{self.text(mask)}` dropped",
                             start, end, f"({self.text(other)})")

    def mutate_AugAssign(self, node: ast.AugAssign) -> None:
        symbol = BIN_SYMBOL.get(type(node.op))
        if symbol in ("+", "-", "*", "/"):
            new = BIN_FLIP[symbol]
            self.swap_token(node.target, node.value, symbol + "=", new + "=")

    def mutate_UnaryOp(self, node: ast.UnaryOp) -> None:
        start = self.span(node)[0]
        if isinstance(node.op, ast.Not):
            end = start + 3
            while self.data[end : end + 1] in (b" ", b"\\", b"\n"):
                end += 1
            self.add(start, "not_dropped", "`not` dropped", start, end, "")
        elif isinstance(node.op, ast.Invert):
            self.add(start, "invert_dropped", "`~` dropped", start, start + 1, "")
        elif isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant):
            self.add(start, "neg_dropped", "unary `-` dropped", start, start + 1, "")

    def mutate_Constant(self, node: ast.Constant) -> None:
        start, end = self.span(node)
        if isinstance(node.value, bool):
            new = str(not node.value)
            self.add(start, f"{str(node.value).lower()}_to_{new.lower()}", f"`{node.value}` -> `{new}`",
                     start, end, new)
        elif isinstance(node.value, int):
            for delta, op in ((1, "plus_one"), (-1, "minus_one")):
                self.add(start, op, f"`{self.text(node)}` -> `{node.value + delta}`", start, end,
                         str(node.value + delta))

    def mutate_Subscript(self, node: ast.Subscript) -> None:
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for element in elements:
            bounds = [element.lower, element.upper] if isinstance(element, ast.Slice) else [element]
            for index in bounds:
                if isinstance(index, (ast.Name, ast.Attribute, ast.BinOp, ast.UnaryOp, ast.Call)) and not (
                        isinstance(index, ast.UnaryOp) and isinstance(index.operand, ast.Constant)):
                    text = self.text(index)
                    text = text if isinstance(index, (ast.Name, ast.Attribute, ast.Call)) else f"({text})"
                    start, end = self.span(index)
                    for sign, op in (("+", "index_plus_one"), ("-", "index_minus_one")):
                        self.add(start, op, f"index `{self.text(index)}` -> `{text} {sign} 1`", start, end,
                                 f"{text} {sign} 1")

    def mutate_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func).split(".")[-1]
        start, end = self.span(node)
        args = node.args
        if name == "stop_gradient" and len(args) == 1:
            self.add(start, "stop_gradient_dropped", "`stop_gradient` dropped", start, end,
                     f"({self.text(args[0])})")
        if name == "where" and len(args) == 3:
            self.add(start, "where_to_true_branch", f"`where({self.text(args[0])}, a, b)` -> a", start, end,
                     f"({self.text(args[1])})")
        if (len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2])
                and type(args[0]) is type(args[1]) and self.text(args[0]) != self.text(args[1])
                and not (isinstance(args[0], ast.Constant) and type(args[0].value) is not type(args[1].value))):
            a, b = self.span(args[0]), self.span(args[1])
            between = self.data[a[1] : b[0]].decode()
            self.add(a[0], "args_swapped", f"arguments `{self.text(args[0])}`, `{self.text(args[1])}` swapped",
                     a[0], b[1], self.text(args[1]) + between + self.text(args[0]))


def generate(source: str, path: str) -> list[Generated]:
    """Every mutant of one file's `source` (the operators and skips of the module docstring), each checked
    to parse; sorted by position."""
    gen = _Generator(source, path)
    gen.walk(ast.parse(source))
    out, count = [], {}
    for g in sorted(gen.out, key=lambda g: (g.line, g.col, g.op, g.start)):
        try:
            ast.parse(g.mutate(source))
        except SyntaxError:
            continue
        count[g.name] = count.get(g.name, 0) + 1
        if count[g.name] > 1:  # two mutants at one spot with one operator slug: number them
            g = dataclasses.replace(g, op=f"{g.op}{count[g.name]}")
        out.append(g)
    return out
