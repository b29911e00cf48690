"""The last `seq_len` outputs of a causal conv over cached conv states are taken by index under export.

Why: a hybrid model's conv mixer runs its causal conv over what `cache.update_conv_state` returns (the new states
behind the cached ones, or, in a prefill, the states zero-padded up to the conv kernel size: `max(L, K)` positions)
and keeps the outputs of the new positions with `Y = Y[:, :, -seq_len:]`. When the conv output is a fresh tensor
(an activation ran on it), that slice is the whole tensor, and contiguous, exactly when the prefill is at least as long
as the kernel: torch.export evaluates the contiguity and guards on it (`Guard failed: max(4, L) == L`), so a program
traced with a long prefill rejects a one-token prefill. `index_select` over the last `seq_len` positions gives the same
values as a new contiguous tensor at every length.

What it rewrites: in a function of a module that does `import torch`, that assigns `Y = <...>.update_conv_state(...)`,
each statement `Y = Y[:, :, -N:]` or `Y = Y[..., -N:]` (the same name `Y`, `N` a name) becomes, under export,
`torch._check`s that `0 < N <= Y.shape[-1]` (a slice of `-N:` is the last `N` positions only then; the lengths here
always satisfy them, and an exported program asserts them instead of silently differing) and
`Y = Y.index_select(-1, torch.arange(Y.shape[-1] - N, Y.shape[-1]))`; eager keeps the slice, in an `else`.

What it refuses (left unchanged, with a finding): such a slice in a function that already binds the names the export
arm uses (`conv_length`, `last_positions`), and a module that does not `import torch`. Slices of other names, other
bounds, or in functions without `update_conv_state` are not candidates.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, Codemod, export_twin, imports_torch
from ._walks import ReplaceNodes, name_values, statement_children, walk_statements

# Names the export arm binds: refused where the function already uses them
EXPORT_NAMES = ("conv_length", "last_positions")

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # Whether this slice keeps every position (is contiguous) would be an export guard on the length
    conv_length = {states}.shape[-1]
    torch._check({count} > 0)
    torch._check({count} <= conv_length)
    last_positions = torch.arange(conv_length - {count}, conv_length, device={states}.device)
    {states} = {states}.index_select(-1, last_positions)
else:
    pass
"""

UPDATE_CONV_STATE = m.Assign(
    targets=[m.AssignTarget(target=m.Name())],
    value=m.Call(func=m.Attribute(attr=m.Name("update_conv_state"))),
)
EXPORT_CHOICE = m.If(test=EXPORTING, orelse=m.Else())
FULL = m.SubscriptElement(slice=m.Slice(lower=None, upper=None, step=None))


def _tail(count: m.BaseMatcherNode) -> m.SubscriptElement:
    """`-N:`"""
    return m.SubscriptElement(
        slice=m.Slice(lower=m.UnaryOperation(operator=m.Minus(), expression=count), upper=None, step=None)
    )


def _tail_slice(states: str) -> m.SimpleStatementLine:
    """`Y = Y[:, :, -N:]` or `Y = Y[..., -N:]`"""
    index = m.OneOf(
        [FULL, FULL, _tail(m.Name())],
        [m.SubscriptElement(slice=m.Index(value=m.Ellipsis())), _tail(m.Name())],
    )
    return m.SimpleStatementLine(
        body=[
            m.Assign(
                targets=[m.AssignTarget(target=m.Name(states))], value=m.Subscript(value=m.Name(states), slice=index)
            )
        ]
    )


def _candidate_functions(tree: cst.Module) -> list[tuple[cst.FunctionDef, str, int]]:
    """(function, `Class.method` or function name, index of its top-level statement) for every def, nested or not,
    that holds an assignment from `update_conv_state` (in itself or in a nested def), in source order: one walk of
    the fields, no visitor."""
    found: list[list] = []  # [function, dotted name, top-level index, holds an update]

    def walk(node: cst.CSTNode, scopes: list[str], enclosing: list[list], index: int) -> None:
        if type(node) is cst.Assign and m.matches(node, UPDATE_CONV_STATE):
            for entry in enclosing:
                entry[3] = True
        if isinstance(node, cst.ClassDef):
            scopes = [*scopes, node.name.value]
        elif isinstance(node, cst.FunctionDef):
            scopes = [*scopes, node.name.value]
            entry = [node, ".".join(scopes), index, False]
            found.append(entry)
            enclosing = [*enclosing, entry]
        for child in statement_children(node):
            walk(child, scopes, enclosing, index)

    for index, stmt in enumerate(tree.body):
        walk(stmt, [], [], index)
    return [(function, name, index) for function, name, index, holds in found if holds]


class ConvOutputTail(Codemod):
    NAME = "conv-output-tail"
    DESCRIPTION = (
        "The last seq_len outputs of a causal conv over the states update_conv_state returned are taken by an index "
        "range under export, so a program traced with a long prefill accepts one shorter than the conv kernel."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "update_conv_state(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        has_torch = imports_torch(tree)
        replacements = {}
        rewritten_statements = set()  # indexes of the top-level statements that hold a replaced slice
        for function, construct, index in _candidate_functions(tree):
            # The statements hold all the matched nodes: one walk of them, no visitor
            statements = list(walk_statements(function.body))
            assigned = {
                node.targets[0].target.value
                for node in statements
                if type(node) is cst.Assign and m.matches(node, UPDATE_CONV_STATE)
            }
            # a slice already in the eager arm of this rewrite (a second run), or seen in an enclosing def, is done
            done = {
                id(stmt)
                for branch in statements
                if type(branch) is cst.If and m.matches(branch, EXPORT_CHOICE)
                for stmt in branch.orelse.body.body
            }
            lines = [stmt for stmt in statements if type(stmt) is cst.SimpleStatementLine]
            tails = [
                stmt
                for name in sorted(assigned)
                for stmt in lines
                if m.matches(stmt, _tail_slice(name)) and id(stmt) not in done and stmt not in replacements
            ]
            if not tails:
                continue
            names = name_values(function)
            taken = sorted(names & set(EXPORT_NAMES))
            reason = None
            if taken:
                reason = f"the function already uses `{'`, `'.join(taken)}`"
            elif not has_torch:
                reason = "the module does not `import torch`"
            line = self.top_level_line(tree, tree.body[index])
            for stmt in tails:
                if reason is not None:
                    self.report(line, "refused", construct, reason)
                    continue
                replacements[stmt] = self._rewrite(stmt)
                rewritten_statements.add(index)
                self.report(line, "rewritten", construct, "keeps the last positions of the conv by index under export")
        if not replacements:
            return tree
        # Only the statements that hold a replaced slice are rebuilt; the others stay the same objects
        body = [
            stmt.visit(ReplaceNodes(replacements)) if index in rewritten_statements else stmt
            for index, stmt in enumerate(tree.body)
        ]
        return tree.with_changes(body=body)

    @staticmethod
    def _rewrite(stmt: cst.SimpleStatementLine) -> cst.If:
        assign = stmt.body[0]
        states = assign.targets[0].target.value
        count = assign.value.slice[-1].slice.lower.expression.value
        return export_twin(EXPORT_TEMPLATE.format(states=states, count=count), [stmt], stmt.leading_lines)
