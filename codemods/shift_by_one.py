"""A tensor shifted by one along a dim slices the whole under export, not a view of X one shorter.

Why: `X[:, :-1]` is a view one shorter than X, and torch 2.13 checks the layout of a view by asking whether each size
is 1: for `L - 1` at `L = 2` it is, so export keeps a guard `L - 1 != 1`, and a dim declared with a range that holds 2
fails (`Constraints violated (tokens)`: `Unsatisfied for some tokens: L - 1 != 1`). Grounding DINO's text masks
(`prev_special`) and Zaya's delayed values shift with a concatenation, MobileBERT's trigram input and NeoMME's
previous ids with a padding. Concatenating or padding first and slicing the result leaves a tensor whose size is not
`L - 1`.

What it rewrites: in a function of a model module (`transformers.models.*`, or a file outside transformers) that does
`import torch`, a statement holding a shift of a name X by one along dim D, `X[<D full slices>, :-1]` (right) or
`X[<D full slices>, 1:]` (left), in one of two forms:

- a concatenation of two pieces along D, `torch.cat([A, X[:, :-1]], dim=D)` or `torch.cat([X[:, 1:], A], dim=D)`
  (`torch.concat`, `torch.concatenate`; `D` a non-negative integer, positional or `dim=`), which export takes as
  `torch.cat([A, X], dim=D)[:, :-1]` or `torch.cat([X, A], dim=D)[:, 1:]`;
- a constant padding, `F.pad(X[:, 1:], P)` or `F.pad(X[:, :-1], P)` (`torch.nn.functional.pad`, `P` a list or tuple of
  integers, no `mode` but "constant"), whose pads on the cut side are all 0 (every left pad for `1:`, every right pad
  for `:-1`: whatever X's rank, D is padded on the other side only), which export takes as `F.pad(X, P)[:, 1:]` or
  `F.pad(X, P)[:, :-1]`.

Each is the same elements in the same order when X has an element along D, which export checks first
(`torch._check(X.shape[D] > 0)`: with none, the slice of X is empty, and the forms differ). Eager keeps the original
statement in the `else` arm.

What it refuses (left unchanged, with a finding): X not a name (the check would evaluate it a second time), a
module that does not `import torch`, and shared modules (`transformers.` outside `models`), whose classes must stay
transformers' own. Other concatenations and paddings are no candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

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

CONCATENATIONS = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})
PAD = "torch.nn.functional.pad"
QUALIFIED = CONCATENATIONS | {PAD}
NAMES = frozenset({"cat", "concat", "concatenate", "pad"})

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # sliced after concatenating or padding: a one-shorter slice makes export guard on its length being 1
    pass
else:
    pass
"""

_code = cst.Module(body=[]).code_for_node


@dataclass(frozen=True)
class Shift:
    """One shift by one in a statement: the call, its export form, and the shifted tensor X along `dim`."""

    call: cst.Call
    export: str
    tensor: cst.BaseExpression
    dim: int


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


def _shifted(node: cst.BaseExpression) -> tuple[cst.BaseExpression, int, bool] | None:
    """(X, D, right) of `X[<D full slices>, :-1]` (right) or `X[<D full slices>, 1:]`, else None."""
    if type(node) is not cst.Subscript:
        return None
    *leading, last = node.slice
    if not all(_is_full(element) for element in leading) or type(last.slice) is not cst.Slice:
        return None
    piece = last.slice
    if piece.step is not None:
        return None
    if piece.lower is None and _is_minus_one(piece.upper):
        return node.value, len(leading), True
    if piece.upper is None and type(piece.lower) is cst.Integer and piece.lower.value == "1":
        return node.value, len(leading), False
    return None


def _slices(dim: int, right: bool) -> str:
    return ":, " * dim + (":-1" if right else "1:")


def _concatenation(call: cst.Call) -> Shift | None:
    """`cat([A, X[..., :-1]], dim=D)` or `cat([X[..., 1:], A], dim=D)` as a Shift (by its form; the name is checked
    by the caller)."""
    if not call.args or call.args[0].keyword is not None or any(arg.star for arg in call.args):
        return None
    pieces = call.args[0].value
    dims = [arg.value for arg in call.args[1:] if arg.keyword is None or arg.keyword.value == "dim"]
    if len(dims) != len(call.args) - 1 or len(dims) != 1 or type(dims[0]) is not cst.Integer:
        return None
    if type(pieces) not in (cst.List, cst.Tuple) or len(pieces.elements) != 2:
        return None
    if any(type(element) is not cst.Element for element in pieces.elements):
        return None
    dim = int(dims[0].value, 0)
    for index, right in ((1, True), (0, False)):
        found = _shifted(pieces.elements[index].value)
        if found is not None and found[1] == dim and found[2] == right:
            elements = [_code(element.value) for element in pieces.elements]
            elements[index] = _code(found[0])
            opened, closed = ("[", "]") if type(pieces) is cst.List else ("(", ")")
            export = f"{_code(call.func)}({opened}{', '.join(elements)}{closed}, dim={dim})[{_slices(dim, right)}]"
            return Shift(call, export, found[0], dim)
    return None


def _padding(call: cst.Call) -> Shift | None:
    """`pad(X[..., 1:], P)` / `pad(X[..., :-1], P)` with constant padding and no pad on the cut side, as a Shift."""
    if any(arg.star for arg in call.args) or not call.args or call.args[0].keyword is not None:
        return None
    found = _shifted(call.args[0].value)
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    positional = [arg.value for arg in call.args if arg.keyword is None]
    if found is None or set(keywords) - {"pad", "mode", "value"} or len(positional) > 2:
        return None
    pads = positional[1] if len(positional) == 2 else keywords.get("pad")
    mode = keywords.get("mode")
    if mode is not None and not (type(mode) is cst.SimpleString and mode.evaluated_value == "constant"):
        return None
    if type(pads) not in (cst.List, cst.Tuple) or not pads.elements:
        return None
    if any(type(e) is not cst.Element or type(e.value) is not cst.Integer for e in pads.elements):
        return None
    tensor, dim, right = found
    cut_side = [e.value.value for e in pads.elements][1 if right else 0 :: 2]  # right pads for `:-1`, left for `1:`
    if any(int(value, 0) != 0 for value in cut_side):
        return None
    rest = ((f"{arg.keyword.value}=" if arg.keyword else "") + _code(arg.value) for arg in call.args[1:])
    arguments = ", ".join([_code(tensor), *rest])
    return Shift(call, f"{_code(call.func)}({arguments})[{_slices(dim, right)}]", tensor, dim)


def _shift_of(call: cst.Call) -> Shift | None:
    """The shift `call` makes by its form: a concatenation's or a padding's by its name (its qualified name is checked
    where the scope analysis is paid for, on candidates only)."""
    func = call.func
    name = func.value if type(func) is cst.Name else func.attr.value
    return _padding(call) if name == "pad" else _concatenation(call)


def _candidates(owner: cst.BaseStatement):
    """(statement, its function, qualname, its shifts) for each statement of a function in `owner` that holds a call
    named like a concatenation or a padding that shifts by one; statements in the eager arm of an export twin (a
    second run) are left out."""
    found = []
    for node, qualname, functions in scoped_outside_export_twins(owner, (cst.SimpleStatementLine,)):
        shifts = (
            [shift for shift in map(_shift_of, nodes_in(node, _named_call)) if shift is not None] if functions else []
        )
        if shifts:
            found.append((node, functions[-1], qualname, shifts))
    return found


class ShiftByOne(Codemod):
    NAME = "shift-by-one"
    DESCRIPTION = (
        "A shift by one, torch.cat([A, X[:, :-1]], dim=D) or F.pad(X[:, 1:], P), is torch.cat([A, X], dim=D)[:, :-1] "
        "or F.pad(X, P)[:, 1:] under export, after checking X is not empty along D: the slice of X one shorter made "
        "export guard on its length being 1."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return ("cat(" in source or "concat" in source or "pad(" in source) and (":-1]" in source or "1:]" in source)

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
        shared = shared_module_refusal(self.context.full_module_name)
        has_torch = imports_torch(tree)
        indent = len(tree.default_indent)
        replacements = {}
        for stmt, _, construct, found in candidates:
            shifts = [shift for shift in found if statements.qualified(shift.call.func) & QUALIFIED]
            if not shifts:
                continue
            line, depth = statements.line(stmt), statements.column(stmt) // indent
            reason = shared
            if reason is None and any(type(shift.tensor) is not cst.Name for shift in shifts):
                reason = "the shifted tensor is not a name: its size check would evaluate it a second time"
            elif reason is None and not has_torch:
                reason = "the module does not `import torch`"
            if reason is not None:
                self.report(line, "refused", construct, reason)
                continue
            replacements[stmt] = self._rewrite(stmt, shifts, depth, indent)
            shifted = ", ".join(sorted({f"`{shift.tensor.value}`" for shift in shifts}))
            self.report(line, "rewritten", construct, f"the whole is sliced, not {shifted}")
        return replace_in_statements(tree, replacements, [owners[stmt] for stmt in replacements])

    @staticmethod
    def _rewrite(stmt: cst.SimpleStatementLine, shifts: list[Shift], depth: int, indent: int) -> cst.If:
        # the statement's own comments stay with it in the eager arm: a trailing one would make black and ruff lay the
        # export form out differently
        exported = replaced_in_statement(stmt, {shift.call: cst.parse_expression(shift.export) for shift in shifts})
        checks = {f"torch._check({shift.tensor.value}.shape[{shift.dim}] > 0)": None for shift in shifts}
        body = [*(cst.parse_statement(check) for check in checks), exported]
        return statement_twin(EXPORT_TEMPLATE, stmt, body, depth, indent)
