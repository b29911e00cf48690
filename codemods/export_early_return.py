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

What it refuses: a function where anything else (a call statement, a `return`, an attribute or item assignment, a loop)
comes before the test is left unchanged with a finding; a function whose first statement is already the early return
is skipped.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import Codemod, top_level_lines

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
LOCAL_ASSIGN = m.SimpleStatementLine(
    body=[
        m.OneOf(
            m.Assign(targets=[m.AtLeastN(n=1, matcher=m.AssignTarget(target=m.Name()))]),
            m.AnnAssign(target=m.Name()),
        )
    ]
)
LOCAL_BLOCK = LOCAL_ASSIGN | m.If(body=m.IndentedBlock(body=[m.AtLeastN(n=1, matcher=LOCAL_ASSIGN)]), orelse=None)

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


def _only_binds_locals(stmt: cst.BaseStatement) -> bool:
    if not m.matches(stmt, LOCAL_BLOCK):
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
        return "if is_torchdynamo_exporting()" in source

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
        if target is None or target == start or m.matches(statements[start], EARLY_RETURN):
            return function  # nothing runs before the test, or already rewritten
        construct = f"def {function.name.value}"
        line = top_level_lines(tree)[id(function)]
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
        first = statements[start]
        statements[start:start] = [early.with_changes(leading_lines=[*first.leading_lines, *early.leading_lines])]
        statements[start + 1] = first.with_changes(leading_lines=())
        self.report(line, "rewritten", construct, f"returns {value} first under export")
        return function.with_changes(body=function.body.with_changes(body=statements))
