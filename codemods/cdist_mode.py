"""`torch.cdist(A, B)` picks its algorithm under export by testing `B`'s rows first.

Why: for the Euclidean distance, `torch.cdist` with its default `compute_mode` uses the matrix-product form when
either input has more than 25 rows (`r1 > 25 || r2 > 25`, in C++), testing `A`'s rows first. Mimi's quantizer
measures its frames against its codebook, `torch.cdist(hidden_states[None].float(), self.embed[None].float(), p=2)`:
`A` has batch x frames rows, `B` the codebook's (2048, a constant). Export guards on the first test, `2*batch <= 25`
at its example, which no range of batch sizes declares (and torch 2.13's constraint solver fails to print it:
`AssertionError: Expected op to be '==', got <= for batch <= 25/2`). The same choice made in Python, `B`'s rows tested
first, settles on a constant: no guard.

What it rewrites: in a function of a model module (`transformers.models.*`, or a file outside transformers) that does
`import torch`, a statement holding `torch.cdist(A, B)` or `torch.cdist(A, B, p=2)` (by qualified name; `p` the
literal 2 or 2.0, positional or by keyword, no `compute_mode`). Export takes the statement with each such call as
`euclidean_cdist(A, B)`, a helper added to the module once, before its first class or function, that passes
`compute_mode="use_mm_for_euclid_dist"` when `B.shape[-2] > 25 or A.shape[-2] > 25` and
`"donot_use_mm_for_euclid_dist"` otherwise: the algorithm torch picks (the same kernels: bit-identical), with the
tests in the other order. Eager keeps the original statement in the `else` arm.

What it refuses (left unchanged, with a finding): a `p` that is not the literal 2 (the algorithm is chosen for p = 2
only; a name could be 2), a module that uses `euclidean_cdist` otherwise, a module that does not `import torch`, and
shared modules (`transformers.` outside `models`). A call that gives `compute_mode` is left alone without a finding:
it chose its algorithm.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, holds, replace_in_statements
from .base import (
    Codemod,
    ModuleHelper,
    imports_torch,
    replaced_in_statement,
    scoped_outside_export_twins,
    shared_module_refusal,
    statement_twin,
)

CDIST = "torch.cdist"
HELPER = "euclidean_cdist"
HELPER_CODE = '''def euclidean_cdist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """`torch.cdist(x1, x2, p=2)` for torch.export: the algorithm torch picks (the matrix-product form beyond 25 rows
    of either input), with `x2`'s rows tested first, so that a constant number of them (a codebook) settles it and
    export does not guard on `x1`'s."""
    use_mm = x2.shape[-2] > 25 or x1.shape[-2] > 25
    mode = "use_mm_for_euclid_dist" if use_mm else "donot_use_mm_for_euclid_dist"
    return torch.cdist(x1, x2, p=2, compute_mode=mode)
'''
TWIN = """
if torch.compiler.is_exporting():
    # cdist's algorithm chosen as torch chooses it, the second input's (constant) rows tested first: no guard
    pass
else:
    pass
"""


def _named_call(node: cst.CSTNode) -> bool:
    if type(node) is not cst.Call:
        return False
    func = node.func
    return (type(func) is cst.Name and func.value == "cdist") or (
        type(func) is cst.Attribute and func.attr.value == "cdist"
    )


def _candidates(owner: cst.BaseStatement):
    """(statement, its function, qualname) for each statement of a function in `owner` that calls something named
    `cdist`; statements in the eager arm of an export twin (a second run) are left out."""
    return [
        (node, functions[-1], qualname)
        for node, qualname, functions in scoped_outside_export_twins(owner, (cst.SimpleStatementLine,))
        if functions and holds(node, _named_call)
    ]


def _operands(call: cst.Call) -> tuple[tuple[cst.BaseExpression, cst.BaseExpression] | None, str | None]:
    """((A, B), None) for a Euclidean cdist the helper takes, (None, reason) for one it refuses, (None, None) for one
    that chose its algorithm."""
    positional = [arg for arg in call.args if arg.keyword is None]
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    if "compute_mode" in keywords or len(positional) > 3:
        return None, None
    if any(arg.star for arg in call.args) or set(keywords) - {"x1", "x2", "p"}:
        return None, "the call has other arguments"
    values = dict(zip(("x1", "x2", "p"), (arg.value for arg in positional))) | keywords
    if "x1" not in values or "x2" not in values:
        return None, "the call does not give both inputs"
    p = values.get("p")
    if p is not None and not (type(p) in (cst.Integer, cst.Float) and float(p.value) == 2.0):
        return None, "`p` is not the literal 2"
    return (values["x1"], values["x2"]), None


class CdistMode(Codemod):
    NAME = "cdist-mode"
    DESCRIPTION = (
        "torch.cdist(A, B) picks its Euclidean algorithm under export with B's rows tested first (a helper): torch "
        "tests A's first and export guarded on its batch."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "cdist(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        candidates, owners = candidates_in_statements(tree, _named_call, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self,
            tree,
            [owners[stmt] for stmt, _, _ in candidates],
            [function for _, function, _ in candidates],
            kinds=(cst.SimpleStatementLine,),
        )
        shared = shared_module_refusal(self.context.full_module_name)
        has_torch = imports_torch(tree)
        helper = ModuleHelper(tree, HELPER, HELPER_CODE)
        indent = len(tree.default_indent)
        replacements = {}
        for stmt, _, construct in candidates:
            calls = [call for call in m.findall(stmt, m.Call()) if statements.qualified(call.func) == {CDIST}]
            found = [(call, *_operands(call)) for call in calls]
            rewritable = {call: operands for call, operands, _ in found if operands is not None}
            reasons = [reason for _, _, reason in found if reason is not None]
            if not rewritable and not reasons:
                continue
            line = statements.line(stmt)
            reason = shared or (reasons[0] if reasons else None)
            if reason is None and helper.clashes():
                reason = f"the module already uses the name `{HELPER}`"
            if reason is None and not has_torch:
                reason = "the module does not `import torch`"
            if reason is not None:
                self.report(line, "refused", construct, reason)
                continue
            replacements[stmt] = self._rewrite(stmt, rewritable, statements.column(stmt) // indent, indent)
            self.report(line, "rewritten", construct, "cdist picks its algorithm with the constant rows tested first")
        if not replacements:
            return tree
        return helper.added_to(replace_in_statements(tree, replacements, [owners[stmt] for stmt in replacements]))

    @staticmethod
    def _rewrite(stmt: cst.SimpleStatementLine, calls: dict, depth: int, indent: int) -> cst.If:
        new = {
            call: cst.Call(func=cst.Name(HELPER), args=[cst.Arg(value=a), cst.Arg(value=b)])
            for call, (a, b) in calls.items()
        }
        return statement_twin(TWIN, stmt, [replaced_in_statement(stmt, new)], depth, indent)
