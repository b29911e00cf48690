"""Windows unfolded from a tensor are made contiguous under export before they are flipped.

Why: `X.unfold(D, K, S)` is a view whose windows overlap in memory (a stride smaller than the window). torch 2.13
flips such a view by laying out a copy whose strides it derives from the view's, and asks on the way whether the
unfolded length is at least K: a dim declared with a range that holds a length below the window fails
(`Constraints violated (tokens)`: `Not all values of tokens ... satisfy the generated guard 4 <= L['x'].size()[1]`).
Inkling2's dynamic short convolution takes the last K tokens of its padded context that way, `windows =
context.unfold(-1, K, 1).flip(-1)`, so its decode and prefill programs could not declare `Dim("tokens", min=1)`.
A contiguous copy of the windows flips without that question.

What it rewrites: in a function of a model module (`transformers.models.*`, or a file outside transformers) that does
`import torch`, a statement holding `X.unfold(...).flip(...)` (any receiver and arguments), which export takes as
`X.unfold(...).contiguous().flip(...)`. The copy holds the same values, and flipping moves values without arithmetic:
the result is bit-identical. Eager keeps the original statement in the `else` arm (no copy).

What it refuses (left unchanged, with a finding): a module that does not `import torch`, and shared modules
(`transformers.` outside `models`), whose classes must stay transformers' own.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import (
    Codemod,
    imports_torch,
    replaced_in_statement,
    scoped_outside_export_twins,
    shared_module_refusal,
    statement_twin,
)
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, nodes_in, replace_in_statements

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # flipped as a contiguous copy: flipping the overlapping windows makes export guard on their length
    pass
else:
    pass
"""

# `X.unfold(...).flip(...)`
FLIP_OF_UNFOLD = m.Call(
    func=m.Attribute(value=m.Call(func=m.Attribute(attr=m.Name("unfold"))), attr=m.Name("flip")),
)


def _flip_of_unfold(node: cst.CSTNode) -> bool:
    return type(node) is cst.Call and m.matches(node, FLIP_OF_UNFOLD)


def _contiguous(call: cst.Call) -> cst.Call:
    """`X.unfold(...).contiguous().flip(...)` of `call`, `X.unfold(...).flip(...)`."""
    unfolded = call.func.value
    copied = cst.Call(func=cst.Attribute(value=unfolded, attr=cst.Name("contiguous")))
    return call.with_changes(func=call.func.with_changes(value=copied))


def _candidates(owner: cst.BaseStatement):
    """(statement, its function, qualname, its flips of unfolded windows) for each statement of a function in `owner`
    that holds one; statements in the eager arm of an export twin (a second run) are left out."""
    found = []
    for node, qualname, functions in scoped_outside_export_twins(owner, (cst.SimpleStatementLine,)):
        flips = nodes_in(node, _flip_of_unfold) if functions else []
        if flips:
            found.append((node, functions[-1], qualname, flips))
    return found


class FlipUnfolded(Codemod):
    NAME = "flip-unfolded"
    DESCRIPTION = (
        "X.unfold(...).flip(...) is X.unfold(...).contiguous().flip(...) under export: flipping the overlapping "
        "windows made export guard on their length."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return ".unfold(" in source and ".flip(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        candidates, owners = candidates_in_statements(tree, _flip_of_unfold, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self,
            tree,
            [owners[stmt] for stmt, *_ in candidates],
            [function for _, function, _, _ in candidates],
            kinds=(cst.SimpleStatementLine,),
        )
        shared = shared_module_refusal(self.context.full_module_name)
        has_torch = imports_torch(tree)
        indent = len(tree.default_indent)
        replacements = {}
        for stmt, _, construct, flips in candidates:
            line, depth = statements.line(stmt), statements.column(stmt) // indent
            reason = shared
            if reason is None and not has_torch:
                reason = "the module does not `import torch`"
            if reason is not None:
                self.report(line, "refused", construct, reason)
                continue
            replacements[stmt] = self._rewrite(stmt, flips, depth, indent)
            self.report(line, "rewritten", construct, "the unfolded windows are flipped as a contiguous copy")
        return replace_in_statements(tree, replacements, [owners[stmt] for stmt in replacements])

    @staticmethod
    def _rewrite(stmt: cst.SimpleStatementLine, flips: list[cst.Call], depth: int, indent: int) -> cst.If:
        exported = replaced_in_statement(stmt, {call: _contiguous(call) for call in flips})
        return statement_twin(EXPORT_TEMPLATE, stmt, [exported], depth, indent)
