"""A function that returns a constant under export returns it before the local computations it would skip anyway.

Why: `masking_utils._ignore_causal_mask_sdpa` first gathers the visible part of the padding mask when the mask is
longer than the keys (`if padding_mask.shape[-1] > kv_length:`), and only then returns False under export
(`if is_torchdynamo_exporting() or ...: return False`). The gather's result is never used under export, but its shape
test is traced: with a sliding-window cache, `kv_length` is the window and the mask is the whole sequence, so the
program guards on which side of the window the cache is, and rejects the other side.

What it rewrites: in a module-level function, a top-level `if is_torchdynamo_exporting() or <...>: return <literal>`
(or without `or`) preceded, after the docstring, only by statements that bind local names (assignments to plain names,
and `if`s without `else` holding only such assignments) gets `if is_torchdynamo_exporting(): return <literal>` as its
first statement. Under export the original reaches the same `return` (the `or` short-circuits) with the same value;
the skipped statements only bound locals. The one difference: an error they would raise (an out-of-range gather on an
inconsistent mask) is not raised under export. Eager is unchanged (the new test is False there).

The transformers 4.56/4.57 form binds the flag first and tests it at the end: `is_tracing = <a or-chain holding
is_torchdynamo_compiling()>`, statements that bind locals, `if not is_tracing and <...>: return <literal>`, and a last
`return <literal>`. Under torch.compile and export the flag is True, so the function returns the last literal; such a
function gets `if is_torchdynamo_compiling(): return <last literal>` first (the skipped statements call nothing
with side effects: the or-chain's other calls only read tracing state).

What it refuses: a function where anything else (a call statement, a `return`, an attribute or item assignment, a loop)
comes before the test is left unchanged with a finding; a function whose first statement is already the early return
is skipped.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import Codemod

EXPORTING = m.Call(func=m.Name("is_torchdynamo_exporting"), args=[])
RETURN_LITERAL = m.IndentedBlock(
    body=[m.SimpleStatementLine(body=[m.Return(value=m.Name("False") | m.Name("True") | m.Name("None"))])]
)
EXPORT_RETURN = m.If(
    test=EXPORTING | m.BooleanOperation(left=EXPORTING, operator=m.Or()),
    body=RETURN_LITERAL,
    orelse=None,
)
EARLY_RETURN = m.If(test=EXPORTING, body=RETURN_LITERAL, orelse=None)
COMPILING = m.Call(func=m.Name("is_torchdynamo_compiling"), args=[])
COMPILING_RETURN = m.If(test=COMPILING, body=RETURN_LITERAL, orelse=None)
LITERAL = m.Name("False") | m.Name("True") | m.Name("None")
LOCAL_ASSIGN = m.SimpleStatementLine(
    body=[
        m.OneOf(
            m.Assign(targets=[m.AtLeastN(n=1, matcher=m.AssignTarget(target=m.Name()))]),
            m.AnnAssign(target=m.Name()),
        )
    ]
)
LOCAL_BLOCK = LOCAL_ASSIGN | m.If(body=m.IndentedBlock(body=[m.AtLeastN(n=1, matcher=LOCAL_ASSIGN)]), orelse=None)

COMPILING_TEMPLATE = """
# Under torch.compile and export `{flag}` is True: this function returns {value} at its end.
# Returning first skips statements that only bind locals, whose shape tests would become export guards
if is_torchdynamo_compiling():
    return {value}
"""

TEMPLATE = """
# Under export this function returns {value} below; returning first skips statements that only bind locals, whose
# shape tests torch.export would otherwise turn into guards
if is_torchdynamo_exporting():
    return {value}
"""


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return m.matches(
        stmt,
        m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())]),
    )


# Calls that return a new tensor: an augmented assignment to a name bound from one changes nothing outside
FRESH_TENSOR = m.Call(
    func=m.Attribute(
        value=m.Name("torch"),
        attr=m.Name("arange") | m.Name("zeros") | m.Name("ones") | m.Name("full") | m.Name("empty"),
    )
)


def _fresh_augmented(block: cst.BaseSuite) -> bool:
    """Each statement of `block` binds a local, or augments (`x += ...`) a name bound earlier in it to a new tensor."""
    fresh = set()
    for stmt in block.body:
        if m.matches(stmt, LOCAL_ASSIGN):
            assign = stmt.body[0]
            names = {t.target.value for t in assign.targets} if isinstance(assign, cst.Assign) else set()
            fresh = (fresh - names) | (names if m.matches(assign.value, FRESH_TENSOR) else set())
        elif not m.matches(stmt, m.SimpleStatementLine(body=[m.AugAssign(target=m.Name())])) or (
            stmt.body[0].target.value not in fresh
        ):
            return False
    return True


def _only_binds_locals(stmt: cst.BaseStatement) -> bool:
    if not m.matches(stmt, LOCAL_BLOCK) and not (
        m.matches(stmt, m.If(body=m.IndentedBlock(), orelse=None)) and _fresh_augmented(stmt.body)
    ):
        return False
    # nothing inside may leave the function or write through an object
    return not m.findall(
        stmt,
        m.Return() | m.Raise() | m.Yield() | m.Global() | m.Nonlocal() | m.NamedExpr(),
    )


class ExportEarlyReturn(Codemod):
    NAME = "export-early-return"
    DESCRIPTION = (
        "A function that returns a constant under export returns it before local computations it would skip anyway "
        "(their shape tests became guards)."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "if is_torchdynamo_exporting()" in source or "is_torchdynamo_compiling()" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        body = list(tree.body)
        changed = False
        for index, stmt in enumerate(tree.body):
            if isinstance(stmt, cst.FunctionDef):
                new = self._rewrite(stmt, tree)
                changed |= new is not stmt
                body[index] = new
        return tree.with_changes(body=body) if changed else tree

    def _rewrite(self, function: cst.FunctionDef, tree: cst.Module) -> cst.FunctionDef:
        statements = list(function.body.body)
        start = 1 if statements and _is_docstring(statements[0]) else 0
        target = next(
            (i for i in range(start, len(statements)) if m.matches(statements[i], EXPORT_RETURN)),
            None,
        )
        if target is None:
            return self._rewrite_compiling_flag(function, tree, statements, start)
        if target == start or m.matches(statements[start], EARLY_RETURN):
            return function  # nothing runs before the test, or already rewritten
        construct = f"def {function.name.value}"
        line = self.top_level_line(tree, function)
        blocking = next(
            (stmt for stmt in statements[start:target] if not _only_binds_locals(stmt)),
            None,
        )
        if blocking is not None:
            self.report(
                line,
                "refused",
                construct,
                "a statement before the export test does more than bind locals",
            )
            return function
        value = statements[target].body.body[0].body[0].value.value
        early = cst.parse_statement(TEMPLATE.lstrip("\n").format(value=value))
        self.report(line, "rewritten", construct, f"returns {value} first under export")
        return _insert_first(function, statements, start, early)

    def _rewrite_compiling_flag(self, function, tree, statements, start) -> cst.FunctionDef:
        """The 4.x form: `flag = ... or is_torchdynamo_compiling()`, local bindings, `if not flag and ...: return A`,
        `return B` -> `if is_torchdynamo_compiling(): return B` first."""
        if len(statements) < start + 3 or m.matches(statements[start], COMPILING_RETURN):
            return function  # too short for the form, or already rewritten
        flag = _compiling_flag(statements[start])
        test, last = statements[-2], statements[-1]
        if (
            flag is None
            or not m.matches(last, m.SimpleStatementLine(body=[m.Return(value=LITERAL)]))
            or not m.matches(test, m.If(body=RETURN_LITERAL, orelse=None))
            or not _requires_not(test.test, flag)
        ):
            return function
        construct = f"def {function.name.value}"
        line = self.top_level_line(tree, function)
        between = statements[start + 1 : -2]
        if any(not _only_binds_locals(stmt) or flag in _assigned_names(stmt) for stmt in between):
            self.report(line, "refused", construct, f"a statement before the `{flag}` test does more than bind locals")
            return function
        value = last.body[0].value.value
        early = cst.parse_statement(COMPILING_TEMPLATE.lstrip("\n").format(flag=flag, value=value))
        self.report(line, "rewritten", construct, f"returns {value} first under torch.compile and export")
        return _insert_first(function, statements, start, early)


def _insert_first(function: cst.FunctionDef, statements: list, start: int, early: cst.If) -> cst.FunctionDef:
    """`function` with `early` inserted at `start` of its `statements`; the lines before the old first statement
    (its comments) move above `early`."""
    first = statements[start]
    statements[start:start] = [early.with_changes(leading_lines=[*first.leading_lines, *early.leading_lines])]
    statements[start + 1] = first.with_changes(leading_lines=())
    return function.with_changes(body=function.body.with_changes(body=statements))


def _compiling_flag(stmt: cst.BaseStatement) -> str | None:
    """`flag` of `flag = a or b or is_torchdynamo_compiling()` (the call one operand of an `or` chain), else None."""
    if not m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
        return None
    assign = stmt.body[0]
    operands, value = [], assign.value
    while isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
        operands.append(value.right)
        value = value.left
    operands.append(value)
    if len(operands) < 2 or not any(m.matches(operand, COMPILING) for operand in operands):
        return None
    return assign.targets[0].target.value


def _requires_not(test: cst.BaseExpression, flag: str) -> bool:
    """Whether `test` is `not flag` or an `and` chain with `not flag` as one of its operands (False when flag is)."""
    not_flag = m.UnaryOperation(operator=m.Not(), expression=m.Name(flag))
    while isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        if m.matches(test.right, not_flag):
            return True
        test = test.left
    return m.matches(test, not_flag)


def _assigned_names(stmt: cst.BaseStatement) -> set[str]:
    return {target.target.value for target in m.findall(stmt, m.AssignTarget(target=m.Name()))} | {
        node.target.value for node in m.findall(stmt, m.AnnAssign(target=m.Name()))
    }
