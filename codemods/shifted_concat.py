"""A tensor shifted by one along a dim, `torch.cat([A, X[:, :-1]], dim=1)`, slices the concatenation under export.

Why: the slice `X[:, :-1]` is a view one shorter than X, and torch 2.13 checks the layout of a view by asking whether
each size is 1: for `L - 1` at `L = 2` it is, so export keeps a guard `L - 1 != 1`, and a dim declared with a range
that holds 2 fails (`Constraints violated (tokens)`: `Unsatisfied for some tokens: L - 1 != 1`). Grounding DINO's text
masks (`prev_special`), Zaya's delayed values (`value_delayed`) shift so. Concatenating first and slicing the result,
`torch.cat([A, X], dim=1)[:, :-1]`, leaves a tensor as long as X (or A plus X, less one), whose size torch knows is
not 1.

What it rewrites: in a function of a model module (`transformers.models.*`, or a file outside transformers) that does
`import torch`, a statement `T = torch.cat([A, X[:, :-1]], dim=D)` (shift right: `D` full slices then `:-1`) or
`T = torch.cat([X[:, 1:], A], dim=D)` (shift left: then `1:`), by qualified name (`torch.cat`, `torch.concat`,
`torch.concatenate`), `D` a non-negative integer (positional or `dim=`), X a name. Export takes
`torch._check(X.shape[D] > 0)` then `T = torch.cat([A, X], dim=D)[:, :-1]` (or `torch.cat([X, A], dim=D)[:, 1:]`): the
same elements in the same order when X has an element along D (checked: with none, the slice of X is empty and the
original keeps all of A). Eager keeps the original statement in the `else` arm.

What it refuses (left unchanged, with a finding): X not a name (the check would evaluate it a second time), a call
with other arguments, a module that does not `import torch`, and shared modules (`transformers.` outside `models`),
whose classes must stay transformers' own. Other concatenations are no candidates.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, Codemod, export_twin, formatted_block, imports_torch
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, holds, replace_in_statements, scoped_nodes

CONCATENATIONS = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})
NAMES = frozenset(name.rsplit(".", 1)[1] for name in CONCATENATIONS)

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # sliced after concatenating: a one-shorter slice makes export guard on its length being 1
    torch._check({tensor}.shape[{dim}] > 0)
    {target} = {function}({pieces}, dim={dim})[{slices}]
else:
    pass
"""

_code = cst.Module(body=[]).code_for_node


def _named_call(node: cst.CSTNode) -> bool:
    if type(node) is not cst.Call:
        return False
    func = node.func
    return (type(func) is cst.Name and func.value in NAMES) or (
        type(func) is cst.Attribute and func.attr.value in NAMES
    )


def _is_full(element: cst.SubscriptElement) -> bool:
    piece = element.slice
    return type(piece) is cst.Slice and piece.lower is None and piece.upper is None and piece.step is None


def _is_minus_one(node) -> bool:
    return (
        type(node) is cst.UnaryOperation
        and type(node.operator) is cst.Minus
        and type(node.expression) is cst.Integer
        and node.expression.value == "1"
    )


def _shift(node: cst.BaseExpression, dim: int, right: bool) -> cst.BaseExpression | None:
    """X of `X[<dim full slices>, :-1]` (`right`) or `X[<dim full slices>, 1:]`, else None."""
    if type(node) is not cst.Subscript or len(node.slice) != dim + 1:
        return None
    *leading, last = node.slice
    if not all(_is_full(element) for element in leading) or type(last.slice) is not cst.Slice:
        return None
    piece = last.slice
    if piece.step is not None:
        return None
    if right and piece.lower is None and _is_minus_one(piece.upper):
        return node.value
    if not right and piece.upper is None and type(piece.lower) is cst.Integer and piece.lower.value == "1":
        return node.value
    return None


def _parts(stmt: cst.SimpleStatementLine):
    """(target, call, pieces, dim, shifted element's index, X) of `T = cat([A, X[..., :-1]], dim=D)` or
    `T = cat([X[..., 1:], A], dim=D)`, else None."""
    if len(stmt.body) != 1 or type(stmt.body[0]) is not cst.Assign:
        return None
    assign = stmt.body[0]
    call = assign.value
    if len(assign.targets) != 1 or type(assign.targets[0].target) is not cst.Name or not _named_call(call):
        return None
    if not call.args or call.args[0].keyword is not None or call.args[0].star:
        return None
    pieces = call.args[0].value
    dims = [arg.value for arg in call.args[1:] if arg.keyword is None or arg.keyword.value == "dim"]
    if type(pieces) not in (cst.List, cst.Tuple) or len(pieces.elements) != 2 or len(dims) != 1:
        return None
    if type(dims[0]) is not cst.Integer or any(type(e) is not cst.Element for e in pieces.elements):
        return None
    dim = int(dims[0].value, 0)
    for index, right in ((1, True), (0, False)):
        tensor = _shift(pieces.elements[index].value, dim, right)
        if tensor is not None:
            return assign.targets[0].target.value, call, pieces, dim, index, tensor
    return None


def _candidates(owner: cst.BaseStatement):
    """(statement, qualname, parts) for each shifted concatenation of a function in `owner`; statements in the eager
    arm of an export twin (a second run) are left out."""
    found, twins = [], set()
    for node, qualname, functions in scoped_nodes(owner, (cst.If, cst.SimpleStatementLine)):
        if type(node) is cst.If:
            if type(node.test) is cst.Call and m.matches(node.test, EXPORTING) and isinstance(node.orelse, cst.Else):
                twins.update(id(stmt) for stmt in node.orelse.body.body)
        elif functions and holds(node, _named_call):
            parts = _parts(node)
            if parts is not None:
                found.append((node, functions[-1], qualname, parts))
    return [candidate for candidate in found if id(candidate[0]) not in twins]


class ShiftedConcat(Codemod):
    NAME = "shifted-concat"
    DESCRIPTION = (
        "T = torch.cat([A, X[:, :-1]], dim=D) (a shift by one) is torch.cat([A, X], dim=D)[:, :-1] under export, "
        "after checking X is not empty along D: the slice of X one shorter made export guard on its length being 1."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return ("cat(" in source or "concat" in source) and (":-1]" in source or "1:]" in source)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        candidates, owners = candidates_in_statements(tree, _named_call, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self,
            tree,
            [owners[stmt] for stmt, *_ in candidates],
            [function for _, function, _, _ in candidates],
            kinds=(cst.SimpleStatementLine,),
        )
        module = self.context.full_module_name
        has_torch = imports_torch(tree)
        indent = len(tree.default_indent)
        replacements = {}
        for stmt, _, construct, (target, call, pieces, dim, index, tensor) in candidates:
            if not statements.qualified(call.func) & CONCATENATIONS:
                continue
            line, depth = statements.line(stmt), statements.column(stmt) // indent
            reason = None
            shared = module is not None and module.startswith("transformers.")
            if shared and not module.startswith("transformers.models."):
                reason = f"`{module}` is a shared module, whose classes must stay transformers' own"
            elif type(tensor) is not cst.Name:
                reason = "the shifted tensor is not a name: its size check would evaluate it a second time"
            elif not has_torch:
                reason = "the module does not `import torch`"
            if reason is not None:
                self.report(line, "refused", construct, reason)
                continue
            elements = [_code(element.value) for element in pieces.elements]
            elements[index] = tensor.value
            open_, close = ("[", "]") if type(pieces) is cst.List else ("(", ")")
            template = EXPORT_TEMPLATE.format(
                tensor=tensor.value,
                dim=dim,
                target=target,
                function=_code(call.func),
                pieces=f"{open_}{', '.join(elements)}{close}",
                slices=":, " * dim + (":-1" if index == 1 else "1:"),
            )
            # laid out to the line length where the statement is
            export = formatted_block(list(cst.parse_statement(template).body.body), depth + 1, indent).body
            replacements[stmt] = export_twin(template, [stmt], stmt.leading_lines, list(export))
            self.report(line, "rewritten", construct, f"the concatenation is sliced, not `{tensor.value}`")
        return replace_in_statements(tree, replacements, [owners[stmt] for stmt in replacements])
