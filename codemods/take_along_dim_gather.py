"""`torch.take_along_dim` is a `torch.gather` under export.

Why: torch 2.13's `take_along_dim` reads the sizes of its inputs as ints (`aten.size.default`), so torch.export
(non-strict) specialises every one of them: PP-DocLayoutV2's post-processing sorts its detections with
`torch.take_along_dim(class_ids, indices, dim=1)`, and exporting with a dynamic batch fails with
`Constraints violated (L['pixel_values'].size()[0])`. `torch.gather` keeps the sizes symbolic.

What it rewrites: in a function of a model module (`transformers.models.*`, or a file outside transformers) that
does `import torch`, a statement `Y = torch.take_along_dim(X, I, dim=D)` (by qualified name; `D` positional or by
keyword, `X` and `I` positional or as `input=`/`indices=`). Export takes `Y = gather_along_dim(X, I, D)`, a helper
added to the module once, before its first class or function: it asserts (`torch._check`, so an exported program
rejects other inputs instead of differing) that `I` has `X`'s number of dimensions and `X`'s sizes outside `D`, and
returns `torch.gather(X, D, I)`. That is take_along_dim exactly: take_along_dim broadcasts `X` (with `I`'s size at
`D`) and `I` against each other and gathers, and with those sizes the broadcasts are the tensors themselves. Eager
keeps the original statement in the `else` arm.

What it refuses (left unchanged, with a finding): a call without `dim` (it flattens), a call that is not the whole
value of a one-name assignment (`return torch.take_along_dim(...)...`), a module that already defines or uses
`gather_along_dim` otherwise, a module that does not `import torch`, and shared modules (`transformers.` outside
`models`), whose classes must stay transformers' own.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, Codemod, ModuleHelper, export_twin, imports_torch, shared_module_refusal
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, holds, replace_in_statements, scoped_nodes

TAKE_ALONG_DIM = "torch.take_along_dim"
# A call of something named `take_along_dim`: the statements worth a look (the name is resolved for those alone)
NAMED_CALL = m.Call(func=m.Attribute(attr=m.Name("take_along_dim")) | m.Name("take_along_dim"))
HELPER = "gather_along_dim"

HELPER_CODE = '''def gather_along_dim(input: torch.Tensor, indices: torch.Tensor, dim: int) -> torch.Tensor:
    """`torch.take_along_dim(input, indices, dim)` for torch.export, which specialises every size take_along_dim
    reads. With `indices` of `input`'s sizes outside `dim` (checked), take_along_dim broadcasts nothing: a gather."""
    torch._check(indices.dim() == input.dim())
    dim = dim % input.dim()
    for axis in range(input.dim()):
        if axis != dim:
            torch._check(indices.shape[axis] == input.shape[axis])
    return torch.gather(input, dim, indices)
'''

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    {target} = gather_along_dim({tensor}, {indices}, {dim})
else:
    pass
"""


def _arguments(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression] | None:
    """(X, I, D) of `take_along_dim(X, I, dim=D)` in any of its spellings, None without `dim` or with others."""
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    if any(arg.star for arg in call.args) or set(keywords) - {"input", "indices", "dim"}:
        return None
    names = ("input", "indices", "dim")
    if len(positional) > 3 or any(name in keywords for name in names[: len(positional)]):
        return None
    values = dict(zip(names, positional)) | keywords
    if set(values) != set(names) or m.matches(values["dim"], m.Name("None")):
        return None
    return values["input"], values["indices"], values["dim"]


def _named_call(node: cst.CSTNode) -> bool:
    """`m.matches(node, NAMED_CALL)`, without a matcher's cost at every node of a module."""
    if type(node) is not cst.Call:
        return False
    func = node.func
    return (type(func) is cst.Name and func.value == "take_along_dim") or (
        type(func) is cst.Attribute and func.attr.value == "take_along_dim"
    )


def _candidates(owner: cst.BaseStatement) -> list[tuple[cst.SimpleStatementLine, cst.FunctionDef, str]]:
    """Every statement of a function in the top-level statement `owner` holding a call of something named
    `take_along_dim`, with the innermost function and its qualname (`Class.method`); statements in the eager arm of
    an export twin (a second run) are left out."""
    statements, twins = [], set()
    for node, qualname, functions in scoped_nodes(owner, (cst.If, cst.SimpleStatementLine)):
        if type(node) is cst.If:
            if type(node.test) is cst.Call and m.matches(node.test, EXPORTING) and isinstance(node.orelse, cst.Else):
                twins.update(id(stmt) for stmt in node.orelse.body.body)
        elif functions:
            statements.append((node, functions[-1], qualname))
    return [found for found in statements if id(found[0]) not in twins and holds(found[0], _named_call)]


class TakeAlongDimGather(Codemod):
    NAME = "take-along-dim-gather"
    DESCRIPTION = (
        "Y = torch.take_along_dim(X, I, dim=D) is a torch.gather under export (after checking that I has X's sizes "
        "outside D), which keeps the sizes symbolic where take_along_dim specialises them."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "take_along_dim(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # Only a top-level statement that calls something named `take_along_dim` can hold a candidate: the candidate
        # search, the line numbers and the scope analysis are paid for those statements alone
        candidates, owners = candidates_in_statements(tree, _named_call, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self,
            tree,
            [owners[node] for node, _, _ in candidates],
            [function for _, function, _ in candidates],
            kinds=(cst.SimpleStatementLine,),
        )
        qualified = statements.qualified

        module = self.context.full_module_name
        has_torch = imports_torch(tree)
        helper = ModuleHelper(tree, HELPER, HELPER_CODE)
        replacements = {}
        for stmt, _, construct in candidates:
            calls = [call for call in m.findall(stmt, m.Call()) if qualified(call.func) == {TAKE_ALONG_DIM}]
            if not calls:
                continue
            line = statements.line(stmt)
            reason = None
            assign = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Call())])
            arguments = _arguments(stmt.body[0].value) if m.matches(stmt, assign) else None
            if (shared := shared_module_refusal(module)) is not None:
                reason = shared
            elif not m.matches(stmt, assign) or stmt.body[0].value is not calls[0] or len(calls) != 1:
                reason = "the call is not the whole value of a `Y = torch.take_along_dim(X, I, dim=D)` statement"
            elif arguments is None:
                reason = "the call does not give `dim` (it flattens) or has other arguments"
            else:
                if helper.clashes():
                    reason = f"the module already uses the name `{HELPER}`"
                elif not has_torch:
                    reason = "the module does not `import torch`"
            if reason is not None:
                self.report(line, "refused", construct, reason)
                continue
            replacements[stmt] = self._rewrite(stmt, arguments)
            self.report(line, "rewritten", construct, "take_along_dim is a gather with checked sizes under export")
        if not replacements:
            return tree
        return helper.added_to(replace_in_statements(tree, replacements, [owners[stmt] for stmt in replacements]))

    @staticmethod
    def _rewrite(stmt: cst.SimpleStatementLine, arguments) -> cst.If:
        code = cst.Module(body=[]).code_for_node
        tensor, indices, dim = (code(argument) for argument in arguments)
        target = stmt.body[0].targets[0].target.value
        template = EXPORT_TEMPLATE.format(target=target, tensor=tensor, indices=indices, dim=dim)
        return export_twin(template, [stmt], stmt.leading_lines)
