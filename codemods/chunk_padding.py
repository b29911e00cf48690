"""A padding up to a multiple of a chunk size, and the crop that drops it, in forms torch.export can reason about.

Why: the chunked scans of linear-attention and state-space layers (`torch_chunk_gated_delta_rule` in the Qwen3-Next
family, `torch_chunk_scan` and its kin in the Mamba2 family) pad the sequence with `P = (C - L % C) % C`, split it
into chunks with `reshape(..., -1, C, ...)`, and crop the result with `Y[:, :L]`. torch cannot simplify
`L + (C - L % C) % C` to a multiple of `C`, so the reshape's size checks are guards it cannot prove over a range of
lengths (`Constraints violated (tokens)` for named dims, `... % ... == 0`), and the crop is a slice that is the whole
tensor exactly when `L` is a multiple of `C`: its layout check guards on that (`8*L != 512`). Written as
`P = (L + C - 1) // C * C - L` the padded length is `C * ((L + C - 1) // C)`, which torch divides into chunks
without a guard; `torch.narrow_copy(Y, d, 0, L)` holds the first `L` positions whatever `L`, as a new tensor.

What it rewrites: in a function of a module that does `import torch`, each statement `P = (C - L % C) % C` (`P` a
name, `L` and `C` names or attributes, the same `C` three times) when the same function crops by that `L`: a
statement `Y = Y[:, :L]` (any number of full slices before `:L`, the same name `Y`), alone or as the only statement
of an `if P > 0:` without `else`. Under `torch.compiler.is_exporting()`, the padding becomes
`torch._check(C > 0)` then `P = (L + C - 1) // C * C - L` (the same number for every `L` when `C > 0`), and the crop,
with its `if`, `Y = torch.narrow_copy(Y, d, 0, L)` (the same values; when `P` is 0 the slice keeps every position
and the copy too). Eager runs the original statements, in an `else`.

What it refuses (left unchanged, with a finding): those statements in a module that does not `import torch`.
A padding without a crop in its function (the Swin family's window padding, cropped by its caller) and a crop
without a padding are not candidates.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import Codemod, export_twin, imports_torch, scoped_outside_export_twins
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, replace_in_statements

PAD_TEMPLATE = """
if torch.compiler.is_exporting():
    # The distance to the next multiple of the chunk size, in the form whose padded length torch.export
    # can prove a multiple of it (it cannot of the remainder's, and guards on it)
    torch._check({chunk} > 0)
    {target} = ({length} + {chunk} - 1) // {chunk} * {chunk} - {length}
else:
    pass
"""
CROP_TEMPLATE = """
if torch.compiler.is_exporting():
    # Whether this slice keeps every position (no padding) would be an export guard on the length
    {target} = torch.narrow_copy({target}, {dim}, 0, {length})
else:
    pass
"""

_OPERAND = m.Name() | m.Attribute()
# `(C - L % C) % C`
REMAINDER_PADDING = m.BinaryOperation(
    operator=m.Modulo(),
    left=m.BinaryOperation(
        operator=m.Subtract(),
        left=_OPERAND,
        right=m.BinaryOperation(operator=m.Modulo(), left=_OPERAND, right=_OPERAND),
    ),
    right=_OPERAND,
)
ASSIGN_TO_NAME = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])
FULL = m.SubscriptElement(slice=m.Slice(lower=None, upper=None, step=None))
HEAD = m.SubscriptElement(slice=m.Slice(lower=None, upper=_OPERAND, step=None))


def _padding(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression, cst.BaseExpression] | None:
    """(P, L, C) of `P = (C - L % C) % C`."""
    if type(stmt) is not cst.SimpleStatementLine or not m.matches(stmt, ASSIGN_TO_NAME):
        return None
    assign = stmt.body[0]
    value = assign.value
    if not m.matches(value, REMAINDER_PADDING) or value.lpar or value.left.right.lpar:
        return None
    chunk, length = value.right, value.left.right.left
    if not (value.left.left.deep_equals(chunk) and value.left.right.right.deep_equals(chunk)):
        return None
    return assign.targets[0].target.value, length, chunk


def _crop(stmt: cst.CSTNode) -> tuple[str, int, cst.BaseExpression] | None:
    """(Y, d, L) of `Y = Y[:, ..., :L]` with `d` full slices before `:L`."""
    if type(stmt) is not cst.SimpleStatementLine or not m.matches(stmt, ASSIGN_TO_NAME):
        return None
    assign = stmt.body[0]
    target = assign.targets[0].target.value
    value = assign.value
    if type(value) is not cst.Subscript or not m.matches(value.value, m.Name(target)) or value.lpar:
        return None
    *fulls, last = value.slice
    if not all(m.matches(element, FULL) for element in fulls) or not m.matches(last, HEAD):
        return None
    return target, len(fulls), last.slice.upper


def _guarded_crop(node: cst.CSTNode, amount: str) -> cst.SimpleStatementLine | None:
    """The crop of `if P > 0: <crop>` (no `else`), `P` the padding's name."""
    test = m.Comparison(
        left=m.Name(amount), comparisons=[m.ComparisonTarget(operator=m.GreaterThan(), comparator=m.Integer("0"))]
    )
    if type(node) is not cst.If or node.orelse is not None or not m.matches(node.test, test):
        return None
    body = node.body.body
    return body[0] if len(body) == 1 and _crop(body[0]) is not None else None


def _is_padding(node: cst.CSTNode) -> bool:
    return type(node) is cst.SimpleStatementLine and _padding(node) is not None


def _candidates(owner: cst.BaseStatement) -> list[tuple[cst.BaseStatement, cst.FunctionDef, str]]:
    """(statement, innermost function, qualname) for each padding with a crop of its length in the same function,
    and each such crop (the `if P > 0:` around it when there is one), in `owner`; the eager arms of export twins (a
    second run) are left out."""
    nodes = [
        (node, functions[-1], qualname)
        for node, qualname, functions in scoped_outside_export_twins(owner, (cst.If, cst.SimpleStatementLine))
        if functions
    ]
    by_function: dict[int, list] = {}
    for found in nodes:
        by_function.setdefault(id(found[1]), []).append(found)
    candidates = []
    for found in by_function.values():
        paddings = [(item, _padding(item[0])) for item in found if _is_padding(item[0])]
        for item, (amount, length, _) in paddings:
            crops = []
            inner = set()
            for other in found:
                guarded = _guarded_crop(other[0], amount)
                if guarded is not None:
                    inner.add(id(guarded))
                crop = _crop(guarded if guarded is not None else other[0])
                if crop is not None and crop[2].deep_equals(length):
                    crops.append(other)
            crops = [other for other in crops if id(other[0]) not in inner]
            if crops:
                candidates.extend([item, *crops])
    return candidates


class ChunkPadding(Codemod):
    NAME = "chunk-padding"
    DESCRIPTION = (
        "A padding up to a multiple of a chunk size, (C - L % C) % C, and the crop back to L take, under export, "
        "forms whose sizes torch can prove: (L + C - 1) // C * C - L and a narrow_copy."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return " % " in source and ") % " in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        candidates, owners = candidates_in_statements(tree, _is_padding, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self, tree, [owners[stmt] for stmt, _, _ in candidates], kinds=(cst.SimpleStatementLine, cst.If)
        )
        has_torch = imports_torch(tree)
        replacements = {}
        for stmt, _, construct in candidates:
            if stmt in replacements:
                continue
            line = statements.line(stmt)
            if not has_torch:
                self.report(line, "refused", construct, "the module does not `import torch`")
                continue
            padding = _padding(stmt)
            if padding is not None:
                replacements[stmt] = self._rewrite_padding(stmt, *padding)
                how = "pads up to the next multiple of the chunk size in a form export can divide"
            else:
                replacements[stmt] = self._rewrite_crop(stmt)
                how = "crops the padding with a copy under export"
            self.report(line, "rewritten", construct, how)
        return replace_in_statements(tree, replacements, {owners[stmt] for stmt in replacements})

    @staticmethod
    def _rewrite_padding(stmt, amount: str, length: cst.BaseExpression, chunk: cst.BaseExpression) -> cst.If:
        code = cst.Module(body=[]).code_for_node
        template = PAD_TEMPLATE.format(target=amount, length=code(length), chunk=code(chunk))
        return export_twin(template, [stmt], stmt.leading_lines)

    @staticmethod
    def _rewrite_crop(stmt: cst.BaseStatement) -> cst.If:
        guarded = type(stmt) is cst.If
        target, dim, length = _crop(stmt.body.body[0] if guarded else stmt)
        template = CROP_TEMPLATE.format(target=target, dim=dim, length=cst.Module(body=[]).code_for_node(length))
        # the `if P > 0:` becomes the `elif` of the export arm
        return export_twin(template, stmt if guarded else [stmt], stmt.leading_lines)
