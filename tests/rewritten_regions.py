"""The statements a rewrite replaced, paired with their replacements, and a run of both on recording proxies.

`rewritten_regions(before, after)` aligns two versions of a module statement by statement (Python's `ast`, so
layout and comments do not count), descending into statements whose header is unchanged (a `def`, a Python `if`
whose test is the same, ...), and gives each run of statements that differs as a `Region`: the statements as they
were, their replacement, and the function that holds them.

`compare_region(region)` runs both versions in eager on `RecordingProxy` values (see `recording_proxy`) on every
sequence of truth-test answers that the original's arms ask for, once for each binding state of the names that
are bound before the region on some paths only (an independent definite-assignment analysis on the `ast`), and
compares what each leaves behind: the names bound that code after the region may read and their values, the
returned value or the exception, and the questions asked of proxies (truth tests, numbers) with their answers. Both
versions run as the body of one function, `__region__`, whose parameters are the function's names bound at that
point: a name the region assigns is a local of it, as in the real function, so an operand read before it is bound
raises UnboundLocalError here too.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import re
import textwrap
from dataclasses import dataclass, field
from itertools import combinations

from recording_proxy import Answers, ProxyLimit, RecordingProxy, describe

BRANCH_FUNCTIONS = frozenset({"true_fn", "false_fn"})  # what the rewrite adds beside the statements it replaces
MAX_RUNS = 4096  # runs of one region (answer sequences x binding states): more means the proxies cannot end a loop


@dataclass
class Region:
    function: ast.FunctionDef | ast.AsyncFunctionDef | None  # the function that holds the statements, as it was
    before: list[ast.stmt]
    after: list[ast.stmt]

    @property
    def lines(self) -> tuple[int, int]:
        return self.before[0].lineno, self.before[-1].end_lineno


def rewritten_regions(before: str, after: str) -> list[Region]:
    """The runs of statements that differ between the two versions of a module, innermost where headers agree."""
    found: list[Region] = []
    _align(ast.parse(before).body, ast.parse(after).body, None, found)
    return found


def _dump(node: ast.AST) -> str:
    return ast.dump(node)


def _same_header(old: ast.stmt, new: ast.stmt) -> bool:
    if type(old) is not type(new):
        return False
    if isinstance(old, (ast.If, ast.While)):
        return _dump(old.test) == _dump(new.test)
    if isinstance(old, (ast.For, ast.AsyncFor)):
        return _dump(old.target) == _dump(new.target) and _dump(old.iter) == _dump(new.iter)
    if isinstance(old, (ast.With, ast.AsyncWith)):
        return [_dump(item) for item in old.items] == [_dump(item) for item in new.items]
    if isinstance(old, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return (old.name, _dump(old.args), [_dump(d) for d in old.decorator_list]) == (
            new.name,
            _dump(new.args),
            [_dump(d) for d in new.decorator_list],
        )
    if isinstance(old, ast.ClassDef):
        return (old.name, [_dump(b) for b in old.bases]) == (new.name, [_dump(b) for b in new.bases])
    if isinstance(old, ast.Try):
        return [_dump(h.type) if h.type else None for h in old.handlers] == [
            _dump(h.type) if h.type else None for h in new.handlers
        ]
    return False


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    blocks = [getattr(node, name) for name in ("body", "orelse", "finalbody") if hasattr(node, name)]
    blocks += [handler.body for handler in getattr(node, "handlers", [])]
    return blocks


def _align(old: list[ast.stmt], new: list[ast.stmt], function, found: list[Region]) -> None:
    matcher = difflib.SequenceMatcher(None, [_dump(s) for s in old], [_dump(s) for s in new], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        pairs = list(zip(old[i1:i2], new[j1:j2]))
        if tag == "replace" and i2 - i1 == j2 - j1 and all(_same_header(a, b) for a, b in pairs):
            for a, b in pairs:
                inner = a if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                for old_block, new_block in zip(_blocks(a), _blocks(b)):
                    _align(old_block, new_block, inner, found)
        else:
            found.append(Region(function, old[i1:i2], new[j1:j2]))


# ---------------------------------------------------------------------------------------------------------------
# Which names of the function have a value where the region starts (Python's rules, on the `ast`)
# ---------------------------------------------------------------------------------------------------------------


class _Reached(Exception):
    def __init__(self, definite: set[str], possible: set[str]):
        super().__init__()
        self.definite, self.possible = frozenset(definite), frozenset(possible)


def _stored_names(node: ast.AST) -> set[str]:
    """Names that `node` binds in its own scope (assignment targets, imports, defs, `:=`, handler names), without
    looking into nested scopes."""
    names: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, ast.Name) and isinstance(current.ctx, (ast.Store, ast.Del)):
            names.add(current.id)
        elif isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(current.name)  # its body is another scope
            continue
        elif isinstance(current, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in current.names if a.name != "*")
        elif isinstance(current, ast.ExceptHandler) and current.name:
            names.add(current.name)
        elif isinstance(current, ast.Lambda):
            continue
        elif isinstance(current, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            # only `:=` inside a comprehension binds in the function
            names.update(n.target.id for n in ast.walk(current) if isinstance(n, ast.NamedExpr))
            continue
        pending.extend(ast.iter_child_nodes(current))
    return names


def parameter_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return names


def local_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names local to `function`: its parameters and what its body binds, less `global`/`nonlocal` ones."""
    names = set(parameter_names(function))
    declared = set()
    for stmt in function.body:
        names |= _stored_names(stmt)
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                declared.update(node.names)
    return names - declared


def _walrus(node: ast.AST) -> set[str]:
    return {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr)}


def _terminal(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.Return, ast.Raise, ast.Break, ast.Continue))


def _run(block: list[ast.stmt], target, definite: set, possible: set) -> bool:
    """Walks `block`, updating the sets in place; whether it can fall through. Raises `_Reached` at `target`."""
    falls = True
    for stmt in block:
        if stmt is target:
            raise _Reached(definite, possible)
        falls = _run_statement(stmt, target, definite, possible) and falls
    return falls


def _join(definite: set, possible: set, arms: list[tuple[set, set, bool]]) -> bool:
    for _, arm_possible, _ in arms:
        possible |= arm_possible
    through = [arm_definite for arm_definite, _, falls in arms if falls]
    if through:
        definite.clear()
        definite.update(set.intersection(*through))
    return bool(through)


def _run_statement(stmt: ast.stmt, target, definite: set, possible: set) -> bool:
    if isinstance(stmt, ast.If):
        possible |= _walrus(stmt.test)
        arms = []
        for block in (stmt.body, stmt.orelse):
            arm_definite, arm_possible = set(definite), set(possible)
            arms.append((arm_definite, arm_possible, _run(block, target, arm_definite, arm_possible)))
        return _join(definite, possible, arms)
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
        again = set().union(*(_stored_names(s) for s in stmt.body + stmt.orelse))
        if not isinstance(stmt, ast.While):
            again |= _stored_names(stmt.target)
        possible |= _walrus(stmt.iter if not isinstance(stmt, ast.While) else stmt.test) | again
        body_definite = set(definite) | (set() if isinstance(stmt, ast.While) else _stored_names(stmt.target))
        _run(stmt.body, target, body_definite, set(possible) | body_definite)
        _run(stmt.orelse, target, set(definite), set(possible))
        return True
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        before_definite, before_possible = set(definite), set(possible)
        body_definite, body_possible = set(definite), set(possible)
        falls = _run(stmt.body, target, body_definite, body_possible)
        falls = _run(stmt.orelse, target, body_definite, body_possible) and falls
        arms = [(body_definite, body_possible, falls)]
        raised = set().union(*(_stored_names(s) for s in stmt.body))
        for handler in stmt.handlers:
            arm_definite = set(before_definite) | ({handler.name} if handler.name else set())
            arm_possible = set(before_possible) | raised | arm_definite
            arms.append((arm_definite, arm_possible, _run(handler.body, target, arm_definite, arm_possible)))
        falls = _join(definite, possible, arms)
        final_definite, final_possible = set(before_definite), set(possible)
        final_falls = _run(stmt.finalbody, target, final_definite, final_possible)
        definite |= final_definite - before_definite
        possible |= final_possible
        return falls and final_falls
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        for item in stmt.items:
            possible |= _walrus(item.context_expr)
            if item.optional_vars is not None:
                names = _stored_names(item.optional_vars)
                definite |= names
                possible |= names
        return _run(stmt.body, target, definite, possible)
    if isinstance(stmt, ast.Match):
        possible |= _stored_names(stmt)
        for case in stmt.cases:
            _run(case.body, target, set(definite), set(possible))
        return True
    if isinstance(stmt, ast.AugAssign):
        possible |= _stored_names(stmt.target)
        return True
    if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
        return True
    if isinstance(stmt, ast.Delete):
        for node in stmt.targets:
            definite -= _stored_names(node)
        return True
    bound = _stored_names(stmt)
    walrus = _walrus(stmt)
    definite |= bound - walrus
    possible |= bound
    return not _terminal(stmt)


def bound_at(function: ast.FunctionDef | ast.AsyncFunctionDef, target: ast.stmt) -> tuple[frozenset, frozenset]:
    """(names bound on every path to `target`, names bound on some path) in `function`."""
    definite = set(parameter_names(function))
    try:
        _run(function.body, target, definite, set(definite))
    except _Reached as reached:
        return reached.definite, reached.possible
    raise ValueError(f"line {target.lineno} is not a statement of {function.name}")


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _assigned_first(block: list[ast.stmt], name: str) -> bool:
    """Whether the first statement of `block` that mentions `name` is `name = <expression without it>` (or an
    unpacking into names among which it is)."""
    for stmt in block:
        if not _mentions(stmt, name):
            continue
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            return False
        target = stmt.targets[0]
        names_only = all(
            isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Starred, ast.Store)) for n in ast.walk(target)
        )
        return names_only and _mentions(target, name) and not _mentions(stmt.value, name)
    return False


def observable_names(function: ast.FunctionDef | ast.AsyncFunctionDef, region: Region) -> set[str]:
    """The names whose value after `region` the rest of `function` may read: those it reads outside the region,
    except where every such read is in a block that does not hold the region and assigns the name before anything
    else there mentions it (so the read sees that block's value, never the region's)."""
    # statements only: the parser shares one `Load()`/`Store()` context object between all names
    inside = {id(node) for stmt in region.before for node in ast.walk(stmt) if isinstance(node, ast.stmt)}
    observable: set[str] = set()

    def visit(block: list[ast.stmt], chain: tuple[list[ast.stmt], ...]) -> None:
        chain = (*chain, block)
        for stmt in block:
            if id(stmt) in inside:
                continue
            for name in _reads_in(stmt):
                if name not in observable and not any(
                    _assigned_first(outer, name) and not any(id(s) in inside for o in outer for s in ast.walk(o))
                    for outer in chain
                ):
                    observable.add(name)
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for child in _blocks(stmt):
                    visit(child, chain)

    visit(function.body, ())
    return observable


def _reads_in(stmt: ast.stmt) -> set[str]:
    """The names `stmt` reads, without its nested blocks (visited on their own); for a nested `def` or `class`, the
    names its body reads from this function (they may run later)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        loads = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        return loads - local_names(stmt)
    skip = {id(n) for block in _blocks(stmt) for child in block for n in ast.walk(child)}
    return {
        n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in skip
    }


# ---------------------------------------------------------------------------------------------------------------
# Running a region on proxies
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    kind: str  # "fell through", "returned", "raised" or "proxy limit"
    payload: object  # bound names -> values, the returned value, the exception
    asked: tuple[tuple[str, str, object], ...]  # the questions asked of proxies, with their answers


@dataclass
class RegionResult:
    paths: int = 0  # runs compared (answer sequences x binding states)
    limits: list[str] = field(default_factory=list)  # why the original could not run on some path
    mismatches: list[str] = field(default_factory=list)

    @property
    def fully_run(self) -> bool:
        return not self.limits


_FELL_THROUGH = object()


def _describe_exception(error: BaseException):
    if isinstance(error, NameError):
        # The same unbound name raises UnboundLocalError where it is a local and NameError where a nested function
        # reads it from the closure: both are a read of an unbound name
        match = re.search(r"'(\w+)'", str(error))
        return ("NameError", match.group(1) if match else str(error))
    return (type(error).__name__, describe(error.args))


def _region_code(statements: list[ast.stmt], parameters: list[str]):
    body = textwrap.indent("\n".join(ast.unparse(stmt) for stmt in statements), "    ")
    source = f"def __region__({', '.join(parameters)}):\n{body}\n    return __fell_through__, locals()\n"
    return compile(source, "<region>", "exec")


def _names_in(statements: list[ast.stmt]) -> set[str]:
    return {node.id for stmt in statements for node in ast.walk(stmt) if isinstance(node, ast.Name)}


def _run_region(code, parameters: list[str], free: list[str], classes: dict, prefix: tuple[bool, ...]) -> Outcome:
    bits = Answers(prefix)
    namespace = {name: RecordingProxy(name, bits) for name in free}
    namespace.update(classes)
    namespace["__fell_through__"] = _FELL_THROUGH
    exec(code, namespace)
    try:
        result = namespace["__region__"](*(RecordingProxy(name, bits) for name in parameters))
    except ProxyLimit as limit:
        return Outcome("proxy limit", str(limit), tuple(bits.asked))
    except Exception as error:  # noqa: BLE001 - what the code raises is part of what it does
        return Outcome("raised", _describe_exception(error), tuple(bits.asked))
    if isinstance(result, tuple) and len(result) == 2 and result[0] is _FELL_THROUGH:
        names = {name: describe(value) for name, value in sorted(result[1].items()) if name not in BRANCH_FUNCTIONS}
        return Outcome("fell through", names, tuple(bits.asked))
    return Outcome("returned", describe(result), tuple(bits.asked))


def binding_states(definite: frozenset, possible: frozenset, referenced: set[str]) -> list[frozenset[str]]:
    """The sets of the function's names bound at the region to try: those bound on every path, plus each subset of
    those bound on some paths only (all of them when there are at most 3, else all, none and each one alone)."""
    always = definite & referenced
    maybe = sorted((possible - definite) & referenced)
    if len(maybe) <= 3:
        subsets = [set(c) for size in range(len(maybe) + 1) for c in combinations(maybe, size)]
    else:
        subsets = [set(maybe), set()] + [{name} for name in maybe]
    return [frozenset(always | subset) for subset in subsets]


def _kept(outcome: Outcome, observable: set[str]) -> Outcome:
    """`outcome` with only the bound names that code after the region may read (a name local to an arm, which the
    rewrite keeps inside the arm's function, is not left behind)."""
    if outcome.kind != "fell through":
        return outcome
    kept = {name: value for name, value in outcome.payload.items() if name in observable}
    return Outcome(outcome.kind, kept, outcome.asked)


def compare_region(region: Region) -> RegionResult:
    """Runs the region's statements as they were and as rewritten, on every arm and binding state; see the module
    docstring."""
    result = RegionResult()
    if region.function is None:
        result.limits.append("not in a function")
        return result
    referenced = _names_in(region.before) | _names_in(region.after)
    locals_ = local_names(region.function)
    definite, possible = bound_at(region.function, region.before[0])
    free = sorted(name for name in referenced - locals_ if not hasattr(builtins, name))
    classes = {name: type(name, (Exception,), {}) for name in free if name.endswith(("Error", "Exception"))}
    free = [name for name in free if name not in classes]
    observable = observable_names(region.function, region)
    for state in binding_states(definite, possible, referenced & locals_):
        parameters = sorted(state)
        before = _region_code(region.before, parameters)
        after = _region_code(region.after, parameters)
        pending: list[tuple[bool, ...]] = [()]
        while pending:
            prefix = pending.pop()
            original = _run_region(before, parameters, free, classes, prefix)
            answers = tuple(answer for question, _, answer in original.asked if question == "bool")
            rewritten = _run_region(after, parameters, free, classes, answers)
            result.paths += 1
            if original.kind == "proxy limit":
                result.limits.append(str(original.payload))
            elif _kept(original, observable) != _kept(rewritten, observable):
                unbound = sorted((possible & referenced & locals_) - state)
                result.mismatches.append(
                    f"answers {list(answers)}, unbound {unbound}:\n  original:  {original}\n  rewritten: {rewritten}"
                )
            pending.extend(answers[:index] + (True,) for index in range(len(prefix), len(answers)))
            if result.paths > MAX_RUNS:
                result.limits.append(f"more than {MAX_RUNS} runs")
                return result
    return result
