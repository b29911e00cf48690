"""Which names of a function have a value where one of its statements runs: a definite-assignment analysis of libcst
statements (Python's scoping rules, read from the source; nothing runs).

`bound_at(function, target)` walks `function`'s statements in execution order up to `target` (a statement of it at
any depth, or an `elif` of one of its `if`s) and answers two sets of names: those bound on every path that reaches
`target` (`definite`: reading one there cannot raise UnboundLocalError) and those bound on at least one
(`possible`). Source order is not execution order: a name assigned in the `if` arm before an `elif`, or in one arm
of an earlier one-armed `if`, is possible at most.

Rules: an arm of an `if` that cannot fall through (it ends in `return`, `raise`, `break` or `continue`) binds
nothing for the statements after the `if`; a loop body, an `except` handler and a `match` case may not run, and a
loop body may see what an earlier iteration bound (possible); the target of a `for` is definite in its body; a name
bound by an assignment expression (`:=`) is possible only; `del` unbinds. Nested functions, classes, lambdas and
comprehensions are other scopes: only the name a `def` or `class` binds counts.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import libcst as cst

from ._walks import nodes_in


class Binding(NamedTuple):
    definite: frozenset[str]  # bound on every path to the statement
    possible: frozenset[str]  # bound on at least one path (a superset of `definite`)


class _Reached(Exception):
    """Raised when the walk reaches the target statement, carrying the names bound there."""

    def __init__(self, state: "_State"):
        super().__init__()
        self.binding = Binding(frozenset(state.definite), frozenset(state.possible))


class _State:
    __slots__ = ("definite", "possible")

    def __init__(self, definite=(), possible=()):
        self.definite, self.possible = set(definite), set(definite) | set(possible)

    def copy(self) -> "_State":
        return _State(self.definite, self.possible)

    def bind(self, names) -> None:
        names = list(names)
        self.definite.update(names)
        self.possible.update(names)


def bound_at(function: cst.FunctionDef, target: cst.CSTNode) -> Binding:
    """The names of `function` bound on every path (and on some path) to `target`; ValueError if `function` does
    not hold `target` (in its own scope)."""
    state = _State(parameter_names(function.params))
    try:
        _block(function.body, target, state)
    except _Reached as reached:
        return reached.binding
    raise ValueError("the target is not a statement of the function")


def bound_anywhere(statements: Sequence[cst.BaseStatement]) -> frozenset[str]:
    """Every name that `statements` may bind (in their own scope)."""
    state = _State()
    _statements(statements, None, state)
    return frozenset(state.possible)


def parameter_names(params: cst.Parameters) -> list[str]:
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    found += [param for param in (params.star_arg, params.star_kwarg) if isinstance(param, cst.Param)]
    return [param.name.value for param in found]


def target_names(target: cst.BaseExpression) -> list[str]:
    """The names an assignment to `target` binds: `a`, `a, (b, *c)`; none for `a.b` or `a[i]`."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in target_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


def _walrus_names(node: cst.CSTNode) -> list[str]:
    return [found.target.value for found in nodes_in(node, lambda n: type(n) is cst.NamedExpr)]


def _block(block: cst.BaseSuite, target, state: _State) -> bool:
    """Runs `block` over `state`; whether it can fall through to the statement after it."""
    if isinstance(block, cst.SimpleStatementSuite):  # `if x: y = 1` on one line
        return _small_statements(block.body, state)
    return _statements(block.body, target, state)


def _statements(statements: Sequence[cst.BaseStatement], target, state: _State) -> bool:
    falls = True
    for stmt in statements:
        if stmt is target:
            raise _Reached(state)
        # Statements after a `return` are unreachable: what they bind is kept in `possible` only (the caller drops
        # a block that cannot fall through from the names bound on every path)
        falls = _statement(stmt, target, state) and falls
    return falls


def _join(state: _State, arms: list[tuple[_State, bool]]) -> bool:
    """`state` after one of `arms` ran: what every arm that falls through binds, and what any may bind."""
    for arm, _ in arms:
        state.possible.update(arm.possible)
    through = [arm for arm, falls in arms if falls]
    if through:
        state.definite = set.intersection(*(arm.definite for arm in through))
    return bool(through)


def _statement(stmt: cst.BaseStatement, target, state: _State) -> bool:
    kind = type(stmt)
    if kind is cst.SimpleStatementLine:
        return _small_statements(stmt.body, state)
    if kind is cst.If:
        return _if(stmt, target, state)
    if kind is cst.For or kind is cst.While:
        return _loop(stmt, target, state)
    if kind is cst.Try or kind is cst.TryStar:
        return _try(stmt, target, state)
    if kind is cst.With:
        for item in stmt.items:
            state.possible.update(_walrus_names(item.item))
            if item.asname is not None:
                state.bind(target_names(item.asname.name))
        return _block(stmt.body, target, state)
    if kind is cst.FunctionDef or kind is cst.ClassDef:
        state.bind([stmt.name.value])
        return True
    if kind is cst.Match:
        state.possible.update(_walrus_names(stmt.subject))
        arms = []
        for case in stmt.cases:
            arm = state.copy()
            arm.possible.update(name.value for name in nodes_in(case.pattern, lambda n: type(n) is cst.Name))
            arms.append((arm, _block(case.body, target, arm)))
        _join(state, arms + [(state.copy(), True)])
        return True
    return True


def _if(stmt: cst.If, target, state: _State) -> bool:
    arms, node = [], stmt
    while True:
        state.possible.update(_walrus_names(node.test))
        arm = state.copy()
        arms.append((arm, _block(node.body, target, arm)))
        orelse = node.orelse
        if isinstance(orelse, cst.If):
            if orelse is target:  # an `elif` runs its test when every test before it was false
                raise _Reached(state)
            node = orelse
            continue
        if isinstance(orelse, cst.Else):
            arm = state.copy()
            arms.append((arm, _block(orelse.body, target, arm)))
        else:
            arms.append((state.copy(), True))  # no arm taken
        return _join(state, arms)


def _loop(stmt: cst.For | cst.While, target, state: _State) -> bool:
    header = stmt.iter if isinstance(stmt, cst.For) else stmt.test
    state.possible.update(_walrus_names(header))
    loop_target = target_names(stmt.target) if isinstance(stmt, cst.For) else []
    again = bound_anywhere(stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else [])
    entry = state.copy()
    entry.possible.update(again | set(loop_target))  # bound by an earlier iteration
    body = entry.copy()
    body.bind(loop_target)
    _block(stmt.body, target, body)
    if stmt.orelse is not None:
        _block(stmt.orelse.body, target, entry.copy())
    # The body may not run: what it binds is possible after the loop, never definite
    state.possible.update(body.possible | entry.possible)
    if stmt.orelse is not None:
        state.possible.update(bound_anywhere(_suite_statements(stmt.orelse.body)))
    return True


def _suite_statements(block: cst.BaseSuite) -> list:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else [cst.SimpleStatementLine(body=block.body)]


def _try(stmt: cst.Try | cst.TryStar, target, state: _State) -> bool:
    before = state.copy()
    body = state.copy()
    falls = _block(stmt.body, target, body)
    if stmt.orelse is not None:
        falls = _block(stmt.orelse.body, target, body) and falls
    arms = [(body, falls)]
    raised = bound_anywhere(_suite_statements(stmt.body))  # a handler may run after any part of the body
    for handler in stmt.handlers:
        arm = before.copy()
        arm.possible.update(raised)
        if handler.name is not None:
            arm.bind(target_names(handler.name.name))
        arms.append((arm, _block(handler.body, target, arm)))
    falls = _join(state, arms)
    if stmt.finalbody is not None:
        # `finally` also runs on the paths that raise: it is reached with what the `try` began with
        final = before.copy()
        final.possible.update(state.possible)
        final_falls = _block(stmt.finalbody.body, target, final)
        state.bind(final.definite - before.definite)
        state.possible.update(final.possible)
        falls = falls and final_falls
    return falls


def _small_statements(smalls: Sequence[cst.BaseSmallStatement], state: _State) -> bool:
    falls = True
    for small in smalls:
        kind = type(small)
        state.possible.update(_walrus_names(small))
        if kind is cst.Assign:
            for target in small.targets:
                state.bind(target_names(target.target))
        elif kind is cst.AnnAssign:
            if small.value is not None:
                state.bind(target_names(small.target))
        elif kind is cst.AugAssign:
            state.possible.update(target_names(small.target))  # it reads the name first: bound already, or raises
        elif kind is cst.Import:
            state.bind(_alias_name(alias, dotted=True) for alias in small.names)
        elif kind is cst.ImportFrom:
            if not isinstance(small.names, cst.ImportStar):
                state.bind(_alias_name(alias, dotted=False) for alias in small.names)
        elif kind is cst.Del:
            for name in target_names(small.target):
                state.definite.discard(name)
        elif kind in (cst.Return, cst.Raise, cst.Break, cst.Continue):
            falls = False
    return falls


def _alias_name(alias: cst.ImportAlias, dotted: bool) -> str:
    if alias.asname is not None:
        return alias.asname.name.value
    name = alias.evaluated_name
    return name.split(".")[0] if dotted else name
