"""An exclusive prefix sum written as `F.pad(X.cumsum(0)[:-1], (1, 0))` pads first and drops the total last under
export; eager keeps the original.

Why: `X.cumsum(0)[:-1]` has `n - 1` elements for an `X` of `n`, and torch.export guards on that length while it
checks the slice's layout (`n - 1 < 2`): a program traced with two images then accepts two only, one traced with
three rejects one and two (`Guard failed: grid_thw.size()[0] >= 3`). `vision_utils.get_vision_interpolation_indices_
and_weights`, the position embeddings of the Qwen3-VL family's vision towers, starts each image's patches that way.
`F.pad(X.cumsum(0), (1, 0))[:-1]` holds the same elements, from the same `cumsum` (bit-identical in any dtype),
and its slice keeps `n` elements: no guard.

What it rewrites: a statement `Y = <...>` on a line of its own whose value holds `P(X.cumsum(0)[:-1], (1, 0))`, with
`P` the name transformers' modules give `torch.nn.functional.pad` (`F.pad`, `nn.functional.pad`,
`torch.nn.functional.pad`, resolved by import) and `X` a name (`dim=0` spelled either way). Under
`torch.compiler.is_exporting()` it runs `torch._check(X.shape[0] > 0)` (for an empty `X` the original gives `[0]`,
the padded form nothing) and the statement with `P(X.cumsum(0), (1, 0))[:-1]`; eager runs the original, in an `else`.

What it refuses (left unchanged, with a finding): such a statement in a module that does not `import torch`.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import Codemod, export_twin, imports_torch, scoped_outside_export_twins
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, holds, replace_in_statements

PAD = "torch.nn.functional.pad"
# `X.cumsum(0)[:-1]`
_ZERO = m.Arg(value=m.Integer("0"), keyword=None) | m.Arg(value=m.Integer("0"), keyword=m.Name("dim"))
PREFIX = m.Subscript(
    value=m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("cumsum")), args=[_ZERO]),
    slice=[
        m.SubscriptElement(
            slice=m.Slice(
                lower=None, upper=m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1")), step=None
            )
        )
    ],
)
# `P(X.cumsum(0)[:-1], (1, 0))`, `P` any function: whether it is `pad` is resolved by name
PADDED_PREFIX = m.Call(
    func=m.Attribute(attr=m.Name("pad")) | m.Name("pad"),
    args=[
        m.Arg(value=PREFIX, keyword=None),
        m.Arg(value=m.Tuple(elements=[m.Element(value=m.Integer("1")), m.Element(value=m.Integer("0"))]), keyword=None),
    ],
)
STATEMENT = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # The slice of the n - 1 first sums would make export guard on n: pad first, then drop the total
    pass
else:
    pass
"""


def _is_candidate(node: cst.CSTNode) -> bool:
    return type(node) is cst.Call and m.matches(node, PADDED_PREFIX)


def _candidates(owner: cst.BaseStatement) -> list[tuple[cst.SimpleStatementLine, cst.CSTNode, str]]:
    """Every statement in the top-level statement `owner` holding a candidate call, with its innermost function (or
    `owner`) and its qualname; statements in the eager arm of an export twin (a second run) are left out."""
    return [
        (node, functions[-1] if functions else owner, qualname or "<module>")
        for node, qualname, functions in scoped_outside_export_twins(owner, (cst.SimpleStatementLine,))
        if holds(node, _is_candidate)
    ]


class _Swap(cst.CSTTransformer):
    """`P(X.cumsum(0)[:-1], (1, 0))` -> `P(X.cumsum(0), (1, 0))[:-1]` for the given calls."""

    def __init__(self, calls: set[int]) -> None:
        self.calls = calls

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self.calls:
            return updated_node
        prefix = updated_node.args[0].value
        first, second = updated_node.args
        padded = updated_node.with_changes(args=[first.with_changes(value=prefix.value), second])
        return prefix.with_changes(value=padded)


class ExclusiveCumsum(Codemod):
    NAME = "exclusive-cumsum"
    DESCRIPTION = (
        "F.pad(X.cumsum(0)[:-1], (1, 0)) becomes F.pad(X.cumsum(0), (1, 0))[:-1] under export: the same elements, "
        "without a guard on the length of X."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "cumsum(" in source and "[:-1], (1, 0))" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        candidates, owners = candidates_in_statements(tree, _is_candidate, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self,
            tree,
            [owners[stmt] for stmt, _, _ in candidates],
            [function for _, function, _ in candidates],
            kinds=(cst.SimpleStatementLine,),
        )
        has_torch = imports_torch(tree)
        replacements = {}
        for stmt, _, construct in candidates:
            calls = [
                node
                for node in m.findall(stmt, PADDED_PREFIX)
                if statements.qualified(node.func) == {PAD}
            ]
            if not calls or not m.matches(stmt, STATEMENT):
                continue
            line = statements.line(stmt)
            if not has_torch:
                self.report(line, "refused", construct, "the module does not `import torch`")
                continue
            replacements[stmt] = self._rewrite(stmt, calls)
            self.report(line, "rewritten", construct, "pads the prefix sums before dropping the total under export")
        return replace_in_statements(tree, replacements, [owners[stmt] for stmt in replacements])

    @staticmethod
    def _rewrite(stmt: cst.SimpleStatementLine, calls: list[cst.Call]) -> cst.If:
        names = sorted({call.args[0].value.value.func.value.value for call in calls})
        checks = [cst.parse_statement(f"torch._check({name}.shape[0] > 0)") for name in names]
        swapped = stmt.visit(_Swap({id(call) for call in calls})).with_changes(leading_lines=())
        return export_twin(EXPORT_TEMPLATE, [stmt], stmt.leading_lines, export=[*checks, swapped])
