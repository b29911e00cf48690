"""The length of a freshly concatenated tensor is read from its shape under export.

Why: `len(tensor)` must return a Python int, so torch.export (non-strict) turns the symbolic first size into the
example's value and specialises it: the RT-DETR decoder family (rt_detr, rt_detr_v2, d_fine, deimv2, pp_doclayout_v3,
... copied by modular) takes `batch_size = len(source_flatten)` after `source_flatten = torch.cat(source_flatten, 1)`,
and exporting with a dynamic batch fails with `Constraints violated (L['pixel_values'].size()[0])`.
`X.shape[0]` is the same size, kept symbolic.

What it rewrites: in a function of a module that does `import torch`, a statement `N = len(X)` (`len` the builtin,
`X` a name) whose block binds `X = torch.cat(...)` (or `torch.concat`, `torch.concatenate`, `torch.stack`, by
qualified name) earlier, with no statement in between naming `X`, and `X` named in no nested function, lambda or
`global`/`nonlocal` of the function. Then `X` is that result when `len` runs: a new tensor of at least one dimension
(torch.cat and torch.stack refuse 0-d inputs and return at least 1-d), so `len(X)` is `X.shape[0]`
(`Tensor.__len__` returns `self.shape[0]` for every tensor of one dimension or more). Export takes `X.shape[0]`,
eager the original `len(X)`: `N = X.shape[0] if torch.compiler.is_exporting() else len(X)` where that fits the line
(as ruff's SIM108 asks), an `if`/`else` otherwise.

What it refuses (left unchanged, with a finding): such a `len(X)` of a name the function binds from one of those
calls, when the binding is not in the same block before it, when a statement in between names `X`, when `X` is named
in a nested function, lambda or `global`/`nonlocal`, and in a module that does not `import torch`. `len` of other
names (lists, tuples, dicts) is not a candidate.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, LINE_LENGTH, Codemod, export_twin, imports_torch
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, nodes_in, replace_in_statements, scoped_nodes

# Calls whose result is a new tensor of at least one dimension
CONCATENATIONS = ("torch.cat", "torch.concat", "torch.concatenate", "torch.stack")
LEN_ASSIGN = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(target=m.Name())],
            value=m.Call(func=m.Name("len"), args=[m.Arg(value=m.Name(), keyword=None, star="")]),
        )
    ]
)
# The text of `N = len(X)` and of `X = <...>cat/concat/concatenate/stack(`: a file where no `len()` of a name has a
# concatenation binding that name is never a candidate (on 5.24, 12 of 872 files pass; each of the 354 others that
# a test for `len(` and `cat(` anywhere in the file lets through gives no change and no finding)
LEN_TEXT = re.compile(r"=\s*len\((\w+)\)")
CONCATENATION_TEXT = r"\b{}\s*=\s*[\w.]*(?:cat|concat|concatenate|stack)\("
# `X = <call>`: a binding whose call may be a concatenation
CALL_ASSIGN = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Call(func=m.Attribute() | m.Name()))]
)

COMMENT = "# len() of a tensor is a Python int: torch.export would specialise this size to the example's"
# One line where it fits (what ruff's SIM108 asks for), else an `if`/`else`
EXPORT_LINE = "{count} = {tensor}.shape[0] if torch.compiler.is_exporting() else len({tensor})\n"
EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    {count} = {tensor}.shape[0]
else:
    pass
"""


def _assigns_len(node: cst.CSTNode) -> bool:
    """Whether `node` is an assignment of a call of something named `len` (what `LEN_ASSIGN` asks, and more)."""
    if type(node) is not cst.Assign or type(node.value) is not cst.Call:
        return False
    func = node.value.func
    return type(func) is cst.Name and func.value == "len"


def _counted(stmt: cst.SimpleStatementLine) -> str:
    """`X` of `N = len(X)`"""
    return stmt.body[0].value.args[0].value.value


def _bound(stmt: cst.CSTNode) -> str | None:
    """`X` of `X = <call>`"""
    return stmt.body[0].targets[0].target.value if m.matches(stmt, CALL_ASSIGN) else None


def _call_bindings(node: cst.CSTNode) -> dict[str, list[cst.SimpleStatementLine]]:
    """`X` -> the statements `X = <call>` in `node` that may be concatenations: the call of a name (which an import
    may alias) or of an attribute named as one of `CONCATENATIONS` (an attribute's qualified names end in its own
    name)."""
    found = {}
    for stmt in nodes_in(node, lambda node: type(node) is cst.SimpleStatementLine):
        name = _bound(stmt)
        func = stmt.body[0].value.func if name is not None else None
        if type(func) is cst.Name or (type(func) is cst.Attribute and func.attr.value in _CONCATENATION_NAMES):
            found.setdefault(name, []).append(stmt)
    return found


_CONCATENATION_NAMES = frozenset(name.rsplit(".", 1)[1] for name in CONCATENATIONS)


def _names(node: cst.CSTNode) -> set[str]:
    return {name.value for name in m.findall(node, m.Name())}


def _candidates(owner: cst.BaseStatement) -> list[tuple]:
    """Every `N = len(X)` statement of a function in the top-level statement `owner`, with its block, its index
    there, the innermost function and its qualname (`Class.method`); the `else` arms of export twins this codemod
    added (a second run) are left out."""
    blocks, twins = [], set()
    for node, qualname, functions in scoped_nodes(owner, (cst.If, cst.IndentedBlock)):
        if type(node) is cst.If:
            if type(node.test) is cst.Call and m.matches(node.test, EXPORTING) and isinstance(node.orelse, cst.Else):
                twins.add(id(node.orelse.body))
        elif functions:
            blocks.append((node, qualname, functions[-1]))
    found = []
    for block, qualname, function in blocks:
        if id(block) in twins:
            continue
        for index, stmt in enumerate(block.body):
            if type(stmt) is cst.SimpleStatementLine and m.matches(stmt, LEN_ASSIGN):
                found.append((stmt, block.body, index, function, qualname))
    return found


class TensorLen(Codemod):
    NAME = "tensor-len"
    DESCRIPTION = (
        "len() of a tensor just built by torch.cat/torch.stack is its shape[0] under export, so the size stays "
        "symbolic instead of being specialised to the example's."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        if "len(" not in source:
            return False
        names = set(LEN_TEXT.findall(source))
        return any(re.search(CONCATENATION_TEXT.format(re.escape(name)), source) for name in sorted(names))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # Only a top-level statement that holds a `N = len(...)` can hold a candidate, and only one whose function
        # binds `X = <call>` can be rewritten or refused: the candidate search, the line numbers and the scope
        # analysis are paid for those alone (a few functions of a module of thousands of lines)
        candidates, owners = candidates_in_statements(tree, _assigns_len, _candidates)
        bindings = {}  # id(function) -> `X` -> the statements `X = <call>` in it
        for _, _, _, function, _ in candidates:
            if id(function) not in bindings:
                bindings[id(function)] = _call_bindings(function.body)
        found = [found for found in candidates if _counted(found[0]) in bindings[id(found[3])]]
        if not found:
            return tree
        statements = CandidateStatements(
            self,
            tree,
            [owners[stmt] for stmt, *_ in found],
            [function for *_, function, _ in found],
            kinds=(cst.SimpleStatementLine,),
        )
        qualified = statements.qualified

        def concatenates(stmt: cst.CSTNode, name: str) -> bool:
            return _bound(stmt) == name and bool(qualified(stmt.body[0].value.func) & set(CONCATENATIONS))

        has_torch = imports_torch(tree)
        replacements = {}
        for stmt, block, index, function, construct in found:
            if qualified(stmt.body[0].value.func) != {"builtins.len"}:
                continue
            tensor = _counted(stmt)
            # a candidate only where the function makes `X` a concatenation somewhere
            if not any(concatenates(binding, tensor) for binding in bindings[id(function)][tensor]):
                continue
            reason = self._refusal(stmt, block, index, function, tensor, concatenates, has_torch)
            line = statements.line(stmt)
            if reason is not None:
                self.report(line, "refused", construct, reason)
                continue
            replacements[stmt] = self._rewrite(stmt, statements.column(stmt))
            self.report(line, "rewritten", construct, f"len({tensor}) is {tensor}.shape[0] under export")
        return replace_in_statements(tree, replacements, [owners[stmt] for stmt in replacements])

    @staticmethod
    def _refusal(stmt, block, index, function, tensor, concatenates, has_torch) -> str | None:
        earlier = [j for j in range(index) if tensor in _names(block[j])]
        if not earlier or not concatenates(block[earlier[-1]], tensor):
            if earlier and any(concatenates(block[j], tensor) for j in earlier):
                return f"a statement between the concatenation and the len() names `{tensor}`"
            return f"`{tensor}` is not bound by a concatenation earlier in the same block"
        nested = m.findall(function.body, m.FunctionDef() | m.Lambda() | m.Global() | m.Nonlocal())
        if any(tensor in _names(node) for node in nested):
            return f"`{tensor}` is named in a nested function, lambda or global/nonlocal"
        if not has_torch:
            return "the module does not `import torch`"
        return None

    @staticmethod
    def _rewrite(stmt: cst.SimpleStatementLine, column: int) -> cst.BaseStatement:
        count = stmt.body[0].targets[0].target.value
        comment = cst.EmptyLine(comment=cst.Comment(COMMENT))
        line = EXPORT_LINE.format(count=count, tensor=_counted(stmt))
        if column + len(line) - 1 <= LINE_LENGTH:
            return cst.parse_statement(line).with_changes(leading_lines=[*stmt.leading_lines, comment])
        template = EXPORT_TEMPLATE.format(count=count, tensor=_counted(stmt))
        return export_twin(template, [stmt], [*stmt.leading_lines, comment])
