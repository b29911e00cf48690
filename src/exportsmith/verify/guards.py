"""Which line of the model's code made the shape guard an exported program fails on (guard provenance).

A test on a dynamic size (`if x.shape[0] >= 8`, `n = 2 if seq_len > 4 else 1`, a view that only works for even
lengths) does not stop `torch.export`: the ShapeEnv records a guard, the exported program checks it at run time
(`Guard failed: x.size()[0] >= 8`), and a dim declared dynamic that the guard pins to one value makes export itself
fail (`Constraints violated (L['x'].size()[0])`). Neither message names the line that made the guard.

How the line is found, without parsing messages:
- `GuardLog` records, while a program is exported, every guard the ShapeEnv adds with the innermost frame of the
  model's packages on the live stack at that moment: a `logging.Handler` on the ShapeEnv's logger, which logs each
  guard it adds ("[guard added]") before keeping it in `ShapeEnv.guards`;
- `guard_source` takes the exported program's ShapeEnv (from its placeholders' fake tensors), prints each guard of
  `ShapeEnv.guards` as the Python expression the program's guard function evaluates (`L['x'].size()[0] >= 8`),
  evaluates it on the inputs of a case, and reports the first that is false, in the same order the program checks
  them;
- `construct_at` says, from the file's `ast` and the column of the frame's instruction, what the line tests: the
  test of an `if`, `elif`, `while`, conditional expression (`ternary`), comprehension condition, `assert`, the
  iterable of a `for`, or any other `statement`.

It reports nothing (None) when no guard of the ShapeEnv explains the rejection (a runtime assertion inside the
graph, an input tree that does not match), and a guard with no location (construct "outside") when torch added it
with no frame of the named packages on the stack (while making fake inputs of a view, say).
"""

import ast
import functools
import itertools
import linecache
import logging
import math
import sys
import types
from dataclasses import dataclass

import sympy
import torch
from torch.export.exported_program import _get_shape_env
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP, ShapeGuardPythonPrinter
from torch.utils._sympy.value_ranges import bound_sympy

from exportsmith.verify.errors import USER_PACKAGES, package_path

# the logger ShapeEnv.log writes "[guard added]" to (torch's `dynamic` log)
SHAPE_ENV_LOGGER = "torch.fx.experimental.symbolic_shapes"
GUARD_ADDED = "[guard added]"
# the constructs whose test decides which code runs: a guard made there is a branch baked into the program
BRANCHES = ("if", "elif", "while", "ternary", "comprehension")
OUTSIDE = "outside"  # the construct of a guard added with no frame of the named packages on the stack


@dataclass(frozen=True)
class Site:
    """Where the model's code stood when a guard was added: the innermost frame of the named packages."""

    filename: str
    lineno: int
    col: int | None  # column of the frame's current instruction (None when Python does not say)
    location: str  # `package/.../file.py:line`, as `errors.user_location` gives it


@dataclass(frozen=True)
class GuardSource:
    """The guard an exported program fails on at `case`, and the line of user code that added it."""

    guard: str  # as the program's guard function evaluates it: "L['x'].size()[0] >= 8"
    case: str
    location: str | None  # None when no frame of the named packages was on the stack
    line: str  # the source line, stripped
    construct: str  # see `construct_at`; OUTSIDE when no frame of the named packages was on the stack

    @property
    def branch(self) -> bool:
        return self.construct in BRANCHES

    def record(self) -> dict:
        return {
            "guard": self.guard,
            "case": self.case,
            "location": self.location,
            "line": self.line,
            "construct": self.construct,
            "branch": self.branch,
        }


class GuardLog(logging.Handler):
    """While active (a context manager), `sites[str(guard)]` is where the first guard of that expression was added.

    Turns the ShapeEnv's logger on at INFO only if it was off, and then sends its records to this handler alone
    (torch attaches its own handlers to the logger, which would print them); a logger the user turned on
    (TORCH_LOGS=+dynamic) keeps its handlers and level."""

    def __init__(self, packages: tuple[str, ...] = USER_PACKAGES):
        super().__init__(logging.INFO)
        self.packages = packages
        self.sites: dict[str, Site | None] = {}
        self._logger = logging.getLogger(SHAPE_ENV_LOGGER)
        self._saved = None

    def __enter__(self) -> "GuardLog":
        logger = self._logger
        self._saved = (logger.level, logger.propagate, logger.handlers)
        if logger.isEnabledFor(logging.INFO):
            logger.handlers = [*logger.handlers, self]
        else:
            logger.setLevel(logging.INFO)
            logger.propagate, logger.handlers = False, [self]
        return self

    def __exit__(self, *exc) -> None:
        logger = self._logger
        level, logger.propagate, logger.handlers = self._saved
        logger.setLevel(level)  # through setLevel: it clears the loggers' cached isEnabledFor answers

    def emit(self, record: logging.LogRecord) -> None:
        # ShapeEnv._log_guard logs ("%s %s [guard added] %s%s%s", prefix, str(guard), ...); a suppressed guard is
        # logged too but never kept
        if not (isinstance(record.msg, str) and GUARD_ADDED in record.msg and isinstance(record.args, tuple)):
            return
        prefix, expression = record.args[0], record.args[1]
        if "suppressed" in str(prefix) or expression in self.sites:
            return
        # handlers run synchronously: the stack here is the stack that added the guard
        self.sites[expression] = innermost_site(sys._getframe(), self.packages)


def innermost_site(frame: types.FrameType | None, packages: tuple[str, ...]) -> Site | None:
    while frame is not None:
        path = package_path(frame.f_code.co_filename, packages)
        if path is not None:
            return Site(
                frame.f_code.co_filename, frame.f_lineno, instruction_column(frame), f"{path}:{frame.f_lineno}"
            )
        frame = frame.f_back
    return None


def instruction_column(frame: types.FrameType) -> int | None:
    """The start column of the frame's current instruction (the test being evaluated, on a branch's line); None
    before Python 3.11, which keeps no columns."""
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None or frame.f_lasti < 0:
        return None
    # one entry per 2-byte code unit
    lineno, _, col, _ = next(itertools.islice(positions(), frame.f_lasti // 2, None), (None, None, None, None))
    return col if lineno == frame.f_lineno else None


def guard_source(
    program: torch.export.ExportedProgram, log: GuardLog, cases: list[tuple[str, dict]]
) -> GuardSource | None:
    """The guard of `program`'s ShapeEnv that the first case (name, kwargs) it rejects fails, with where `log` saw it
    added; None if no guard explains a rejection.

    A case fails a guard itself (the first false one, in the order the program checks them), or only the range torch
    derived for an input size from a guard and the other sizes' ranges (`keys + new <= 8` with `new >= 2` gives
    `keys <= 6`: a case with keys 7 and new 1 passes the guard but not the range): then the guard reported is the
    first that cannot hold with that input's value whatever the other sizes in their ranges."""
    shape_env = _get_shape_env(program.graph_module)
    if shape_env is None:
        return None
    # the printer and namespace torch itself uses for the program's guard function (exported_program.py, _unlift.py)
    printer = ShapeGuardPythonPrinter(shape_env.var_to_sources, lambda source: source.name, shape_env.var_to_sources)
    namespace = {**SYMPY_INTERP, "math": math, "inf": math.inf}

    def evaluate(code: str, inputs: dict):
        return eval(code, namespace, {"L": inputs})

    for name, inputs in cases:
        for guard in shape_env.guards:
            try:
                code = printer.doprint(guard.expr)
                holds = bool(evaluate(code, inputs))
            except Exception:  # a guard on weights ("L['self']") or on a symbol with no input source
                continue
            if not holds:
                return describe(code, name, log.sites.get(str(guard.expr)))
        # the input sizes outside the range the program checks, by the symbol each was made with (the range is its
        # replacement's: `5*s11` for a size export found to be five times another)
        outside = {}
        for source_name, symbol in shape_env.source_to_var.items():
            bounds = program.range_constraints.get(shape_env.replace(symbol))
            try:
                value = int(evaluate(source_name, inputs)) if bounds is not None else None
            except Exception:
                continue
            if value is not None and not in_checked_range(value, bounds):
                outside[symbol] = value
        for guard in shape_env.guards:
            for symbol in sorted(outside.keys() & guard.expr.free_symbols, key=str):
                pinned = guard.expr.xreplace({symbol: outside[symbol]})
                bounds = {other: shape_env.var_to_range[other] for other in pinned.free_symbols}
                if bound_sympy(pinned, bounds).upper == sympy.false:  # false for every admissible other size
                    return describe(printer.doprint(guard.expr), name, log.sites.get(str(guard.expr)))
    return None


def in_checked_range(value: int, bounds) -> bool:
    """Whether an exported program accepts `value` for a size of range `bounds`: within it, except that a lower bound
    of 2 (every dynamic dim's) is not checked (torch.export._unlift._get_input_guards_for_graph)."""
    return bool((value >= bounds.lower or bounds.lower <= 2) and value <= bounds.upper)


def describe(guard: str, case: str, site: Site | None) -> GuardSource:
    if site is None:  # no frame of the named packages on the stack: torch added it alone (making fake inputs, say)
        return GuardSource(guard, case, None, "", OUTSIDE)
    line = linecache.getline(site.filename, site.lineno).strip()
    return GuardSource(guard, case, site.location, line, construct_at(site.filename, site.lineno, site.col))


def construct_at(filename: str, lineno: int, col: int | None = None) -> str:
    """What the code at (lineno, col) of `filename` is part of, innermost first: the test of an `if`, `elif`,
    `while`, conditional expression ("ternary"), comprehension condition ("comprehension"), `assert`, the iterable
    of a `for` ("for"), else "statement". Without a column, the outermost test on the line counts."""
    tests = _tests(filename)
    for node, construct in reversed(tests) if col is not None else tests:
        if _holds(node, lineno, col):
            return construct
    return "statement"


@functools.lru_cache(maxsize=64)
def _tests(filename: str) -> tuple[tuple[ast.AST, str], ...]:
    """Every test expression of the file with its construct, outer before inner (ast.walk is breadth-first)."""
    source = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            # an `elif` is an If alone in its parent's orelse; its position is its own keyword's
            keyword = "elif" if lines[node.lineno - 1][node.col_offset :].startswith("elif") else "if"
            found.append((node.test, keyword))
        elif isinstance(node, ast.While):
            found.append((node.test, "while"))
        elif isinstance(node, ast.IfExp):
            found.append((node.test, "ternary"))
        elif isinstance(node, ast.comprehension):
            found.extend((test, "comprehension") for test in node.ifs)
        elif isinstance(node, ast.Assert):
            found.append((node.test, "assert"))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            found.append((node.iter, "for"))
    # innermost last: a test inside another's test (a ternary in an if's test) is found after the outer one
    return tuple(sorted(found, key=lambda item: _span(item[0])))


def _span(node: ast.AST) -> tuple:
    # sort outer before inner: earlier start, then later end
    return (node.lineno, node.col_offset, -node.end_lineno, -node.end_col_offset)


def _holds(node: ast.AST, lineno: int, col: int | None) -> bool:
    if not node.lineno <= lineno <= node.end_lineno:
        return False
    if col is None:
        return True
    after_start = (lineno, col) >= (node.lineno, node.col_offset)
    before_end = (lineno, col) < (node.end_lineno, node.end_col_offset)
    return after_start and before_end
