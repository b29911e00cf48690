"""`K = min(A, X.shape[D])`, the k of a top-k over X's dim D, is a size read back from a tensor under export.

Why: torch 2.13 cannot prove `Min(A, s) <= s` for a dynamic size `s` (its value ranges bound each side apart), and
`topk`'s meta asserts `k <= s`; torch.export keeps that as a guard, which holds for every `s`, and a dim declared with
a range that crosses `A` (`Dim("tokens", max=4096)`, what users write) fails with `Constraints violated` (`Dim.AUTO`
accepts the guard). DeepSeek-V3.2's sparse-attention indexer (`topk = min(self.index_topk, index_scores.shape[-1])`)
fails so, with the models that copy it (glm_moe_dsa, mistral_large4, hy_v4, dots3_note, axk2, glm5_next's pooled
form).

What it rewrites: in a function of a model module (`transformers.models.*`, or a file outside transformers) that does
`import torch`, a statement `K = min(A, S)` or `K = min(S, A)` (the builtin `min`), `S` being `X.shape[D]` or
`X.size(D)`, where `K` is the k of a top-k of X (`X.topk(K, ...)`, `torch.topk(X, K, ...)`, positional or `k=`) and
every other use of the name `K` in the function is one too, over the dim written as D (`dim`, -1 by default). Export
takes `K = topk_size(A, S)`, a helper added to the module once: the minimum of the two as a 0-dim int64 tensor, read
back with `.item()`: an unbacked size that torch knows (`torch._check`, asserted at run time) to lie in [1, A] and to
be at most S, all the top-k asserts. The value is the same min of the same two ints; two static ints keep the int
`min`. Eager keeps the original statement in the `else` arm.

What it refuses (left unchanged, with a finding): `K` used otherwise (an unbacked size as a loop bound, in a test or a
shape would need guards of its own), a top-k over another dim, a module that does not `import torch`, a module that
already uses the name `topk_size` otherwise, and shared modules (`transformers.` outside `models`). An assignment whose
`K` no top-k takes is not a candidate and gets no finding.
"""

from __future__ import annotations

import libcst as cst

from .base import (
    Codemod,
    ModuleHelper,
    imports_torch,
    scoped_outside_export_twins,
    shared_module_refusal,
    statement_twin,
)
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, child_nodes, nodes_in, replace_in_statements

BUILTIN_MIN = "builtins.min"
TORCH_TOPK = "torch.topk"
HELPER = "topk_size"

HELPER_CODE = '''def topk_size(bound: int, size: int) -> int:
    """`min(bound, size)`, the k of a top-k over a dim of `size` elements, for torch.export: torch cannot prove
    `min(bound, size) <= size` of a dynamic size, which the top-k asserts, and export rejects a dim whose range
    crosses `bound`. Read back from a tensor, the minimum is a size torch knows (checked) to lie in [1, bound] and
    within `size`: an exported program's dims are at least 1, and ExecuTorch lays a tensor out by its sizes."""
    if isinstance(bound, int) and isinstance(size, int):
        return min(bound, size)
    k = torch.minimum(torch.scalar_tensor(bound, dtype=torch.int64), torch.scalar_tensor(size, dtype=torch.int64))
    k = k.item()
    torch._check(k >= 1)
    torch._check(k <= bound)
    torch._check(k <= size)
    return k
'''

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    {target} = topk_size({bound}, {size})
else:
    pass
"""

_code = cst.Module(body=[]).code_for_node


def _size_of(node: cst.BaseExpression) -> tuple[str, str] | None:
    """(X, D) as code of `X.shape[D]` or `X.size(D)`, else None."""
    if type(node) is cst.Subscript and len(node.slice) == 1 and type(node.slice[0].slice) is cst.Index:
        value = node.value
        if type(value) is cst.Attribute and value.attr.value == "shape":
            return _code(value.value), _code(node.slice[0].slice.value)
    if type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "size":
        if len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star:
            return _code(node.func.value), _code(node.args[0].value)
    return None


def _min_assignment(stmt: cst.SimpleStatementLine):
    """(K, the `min` call, A, S, X, D) of `K = min(A, S)` / `K = min(S, A)` with S a size of X at D, else None."""
    if len(stmt.body) != 1 or type(stmt.body[0]) is not cst.Assign:
        return None
    assign = stmt.body[0]
    call = assign.value
    if len(assign.targets) != 1 or type(assign.targets[0].target) is not cst.Name or type(call) is not cst.Call:
        return None
    if type(call.func) is not cst.Name or call.func.value != "min" or len(call.args) != 2:
        return None
    if any(arg.keyword is not None or arg.star for arg in call.args):
        return None
    first, second = (arg.value for arg in call.args)
    for size, bound in ((second, first), (first, second)):
        found = _size_of(size)
        if found is not None:
            return assign.targets[0].target.value, call, bound, size, *found
    return None


def _topk_arguments(call: cst.Call, method: bool) -> dict[str, cst.BaseExpression] | None:
    """input, k and dim of a top-k call (`X.topk(k, dim)` when `method`, else `torch.topk(X, k, dim)`)."""
    if any(arg.star for arg in call.args):
        return None
    names = ("k", "dim", "largest", "sorted") if method else ("input", "k", "dim", "largest", "sorted")
    positional = [arg.value for arg in call.args if arg.keyword is None]
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    if len(positional) > len(names) or set(keywords) - set(names):
        return None
    values = dict(zip(names, positional))
    if set(values) & set(keywords):
        return None
    values |= keywords
    if method:
        values["input"] = call.func.value
    return values if "k" in values and "input" in values else None


def _name_reads(node: cst.CSTNode, name: str) -> list[cst.Name]:
    """The `Name` nodes spelling `name` in `node` as a variable (not an attribute's or a keyword argument's name)."""
    found, pending = [], [node]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is cst.Name:
            if node.value == name:
                found.append(node)
        elif kind is cst.Attribute:
            pending.append(node.value)
        elif kind is cst.Arg:
            pending.append(node.value)
        else:
            pending.extend(child_nodes(node))
    return found


def _topk_named(node: cst.CSTNode) -> bool:
    return type(node) is cst.Call and (
        (type(node.func) is cst.Attribute and node.func.attr.value == "topk")
        or (type(node.func) is cst.Name and node.func.value == "topk")
    )


def _candidates(owner: cst.BaseStatement):
    """(statement, its function, qualname, the assignment's parts) for each `K = min(A, X.shape[D])` statement of a
    function in `owner` whose K some call named `topk` in that function takes as an argument; statements in the
    eager arm of an export twin (a second run) are left out."""
    candidates = []
    for stmt, qualname, functions in scoped_outside_export_twins(owner, (cst.SimpleStatementLine,)):
        parts = _min_assignment(stmt) if functions else None
        if parts is None:
            continue
        function, target = functions[-1], parts[0]
        if any(_name_reads(arg.value, target) for call in nodes_in(function, _topk_named) for arg in call.args):
            candidates.append((stmt, function, qualname, parts))
    return candidates


class BoundedTopk(Codemod):
    NAME = "bounded-topk"
    DESCRIPTION = (
        "K = min(A, X.shape[D]), the k of a top-k of X over D, is under export a size read back from a tensor and "
        "checked to lie in [1, A] and within X's dim: torch cannot prove min(A, s) <= s and rejects a dim range "
        "crossing A."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "topk(" in source and "min(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        candidates, owners = candidates_in_statements(tree, _topk_named, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self,
            tree,
            [owners[stmt] for stmt, *_ in candidates],
            [function for _, function, _, _ in candidates],
            kinds=(cst.SimpleStatementLine,),
        )
        qualified = statements.qualified
        module = self.context.full_module_name
        has_torch = imports_torch(tree)
        helper = ModuleHelper(tree, HELPER, HELPER_CODE)
        indent = len(tree.default_indent)
        replacements = {}
        for stmt, function, construct, parts in candidates:
            target, call, bound, size, tensor, dim = parts
            if qualified(call.func) != {BUILTIN_MIN}:
                continue
            line = statements.line(stmt)
            reason = self._refusal(target, tensor, dim, function, stmt, qualified)
            if reason is None:
                reason = shared_module_refusal(module)
            if reason is None:
                if helper.clashes():
                    reason = f"the module already uses the name `{HELPER}`"
                elif not has_torch:
                    reason = "the module does not `import torch`"
            if reason is not None:
                self.report(line, "refused", construct, reason)
                continue
            template = EXPORT_TEMPLATE.format(target=target, bound=_code(bound), size=_code(size))
            # laid out to the line length where the statement is
            depth = statements.column(stmt) // indent
            export = list(cst.parse_statement(template).body.body)
            replacements[stmt] = statement_twin(template, stmt, export, depth, indent)
            self.report(line, "rewritten", construct, f"`{target}` is a checked size read back from a tensor")
        if not replacements:
            return tree
        return helper.added_to(replace_in_statements(tree, replacements, [owners[stmt] for stmt in replacements]))

    @staticmethod
    def _refusal(target, tensor, dim, function, stmt, qualified) -> str | None:
        """Why `K = min(A, X.shape[D])` cannot become an unbacked size, None when every other read of K in the
        function is the k of a top-k of X over D."""
        assigned = {id(node) for node in _name_reads(stmt, target)}
        reads = [node for node in _name_reads(function, target) if id(node) not in assigned]
        topk_ks = set()
        for call in nodes_in(function, _topk_named):
            function_form = qualified(call.func) == {TORCH_TOPK}
            if not function_form and type(call.func) is not cst.Attribute:
                continue
            arguments = _topk_arguments(call, method=not function_form)
            if arguments is None or type(arguments["k"]) is not cst.Name or arguments["k"].value != target:
                continue
            if _code(arguments["input"]) != tensor:
                return f"`{target}` is the k of a top-k of another tensor than `{tensor}`"
            topk_dim = _code(arguments["dim"]) if "dim" in arguments else "-1"
            if topk_dim.replace(" ", "") != dim.replace(" ", ""):
                return f"`{target}` is the k of a top-k over another dim than {dim}"
            topk_ks.add(id(arguments["k"]))
        others = [node for node in reads if id(node) not in topk_ks]
        if others:
            return (
                f"`{target}` is used otherwise than as the k of `{tensor}`'s top-k: an unbacked size there would need "
                "guards of its own"
            )
        return None
