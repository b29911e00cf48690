"""States shorter than a minimum length are zero-padded on the left in a form that torch.export traces once for every
length.

Why: `LinearAttentionLayer.update_conv_state` (transformers' `cache_utils.py`) pads a prefill's conv states up to the
conv kernel size with `if ... X.shape[-1] < K: P = K - X.shape[-1]; X = pad(X, (P, 0), value=0)`. Under torch.export
the length is symbolic and the test guards on the example's side of `K`: a program traced with a prefill of 5 tokens
rejects a prefill of 1 (`Guard failed: input_ids.size()[1] >= 4`) in every hybrid model (mamba2, qwen3_next, ...), and
one traced with 2 tokens rejects 5. The same guard comes back from `pad(X, (sym_max(K - L, 0), 0))` and from
`pad(X, (sym_max(L, K) - L, 0))` (torch 2.13 guards on whether the padded length equals `K`).

What it rewrites: in a function of a module that does `import torch`, an `if` without `else` whose test is
`X.shape[-1] < K`, or an `and` chain ending in it, and whose body is exactly `P = K - X.shape[-1]` and
`X = torch.nn.functional.pad(X, (P, 0))` (by qualified name; `value=0` or none), with `X` a name, `K` a name, an
attribute or an index of one by a name or an int (evaluated twice: no calls), and `P` used nowhere else in the
function. Export takes a new first arm (the leading conjuncts of the test kept):
`X = torch.cat([zeros, X], dim=-1)[..., -torch.sym_max(X.shape[-1], K) :]` with `zeros` `K` zero positions of `X`'s
dtype and device: the last `max(L, K)` positions behind `K` zeros are `X` padded with `K - L` zeros when `L < K`, and
`X`'s own values otherwise, so it equals the original for every length. Eager takes the original `if` as an `elif`,
statement for statement.

What it refuses (left unchanged, with a finding): such a test whose `if` has an `else`, pads on the right or with
another value, a `K` that calls something, a `P` read elsewhere, a function that already binds the names the export
arm uses (`zeros`, `kept_length`), and a module that does not `import torch`.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, Codemod, export_twin, imports_torch
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, replace_in_statements, scoped_nodes

PAD = "torch.nn.functional.pad"
_PADS = m.MatchIfTrue(lambda name: name.endswith("pad"))
# A call of something named `...pad`: the `if`s worth a finding when they are not the exact form
PAD_CALL = m.Call(func=m.Name(value=_PADS) | m.Attribute(attr=m.Name(value=_PADS)))
# Names the export arm binds: refused where the function already uses them
EXPORT_NAMES = ("zeros", "kept_length")

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting(){conjuncts}:
    # A length test makes torch.export guard on the side of the minimum the length is on. The last
    # max(length, minimum) positions after `minimum` zeros: the padded states, or the states if longer
    zeros = {states}.new_zeros((*{states}.shape[:-1], {minimum}))
    kept_length = torch.sym_max({states}.shape[-1], {minimum})
    {states} = torch.cat([zeros, {states}], dim=-1)[..., -kept_length:]
"""


def _last_length(states: m.BaseExpression) -> m.Subscript:
    """`X.shape[-1]`"""
    return m.Subscript(
        value=m.Attribute(value=states, attr=m.Name("shape")),
        slice=[
            m.SubscriptElement(slice=m.Index(value=m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1"))))
        ],
    )


SHORTER = m.Comparison(left=_last_length(m.Name()), comparisons=[m.ComparisonTarget(operator=m.LessThan())])


def _shorter_test(test: cst.BaseExpression) -> tuple[list[cst.BaseExpression], cst.Comparison] | None:
    """(leading conjuncts, `X.shape[-1] < K`) when `test` is that comparison or an `and` chain ending in it."""
    conjuncts = []
    while isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And) and not test.lpar:
        conjuncts.append(test.left)
        test = test.right
    if m.matches(test, SHORTER) and not test.lpar:
        return conjuncts, test
    return None


def _is_pure(expr: cst.BaseExpression) -> bool:
    """A name, an attribute of one, or an index of one by a name or an int: evaluating it twice calls nothing
    (properties aside, which transformers' layers do not use for sizes)."""
    if isinstance(expr, cst.Name):
        return True
    if isinstance(expr, cst.Attribute):
        return _is_pure(expr.value)
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        index = expr.slice[0].slice.value
        return _is_pure(expr.value) and isinstance(index, (cst.Name, cst.Integer))
    return False


def _candidates(owner: cst.BaseStatement) -> list[tuple[cst.If, cst.FunctionDef, str]]:
    """Every `if` of a function in the top-level statement `owner` whose test ends with `X.shape[-1] < K` and whose
    body calls a `...pad` function, with the innermost function and its qualname (`Class.method`); the `elif`s of
    export arms this codemod added (a second run) are left out."""
    ifs, twins = [], set()
    for node, qualname, functions in scoped_nodes(owner, (cst.If,)):
        if m.matches(node.test, EXPORTING | m.BooleanOperation(left=EXPORTING, operator=m.And())):
            twins.add(id(node.orelse))
        if functions and _shorter_test(node.test) is not None:
            ifs.append((node, functions[-1], qualname))
    return [found for found in ifs if id(found[0]) not in twins and m.findall(found[0].body, PAD_CALL)]


def _tests_shorter(node: cst.CSTNode) -> bool:
    return type(node) is cst.If and _shorter_test(node.test) is not None


def _names(node: cst.CSTNode) -> list[str]:
    return [name.value for name in m.findall(node, m.Name())]


class PadToMinLength(Codemod):
    NAME = "pad-to-min-length"
    DESCRIPTION = (
        "A left zero-padding of states up to a minimum length (a conv kernel size) under a length test takes, "
        "under export, the last max(length, minimum) positions behind zeros: one program for every length."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return ".shape[-1] <" in source and "pad(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # Only a top-level statement that holds an `if` on `X.shape[-1] < K` can hold a candidate: the candidate
        # search, the line numbers and the scope analysis are paid for those statements alone
        candidates, owners = candidates_in_statements(tree, _tests_shorter, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self,
            tree,
            [owners[node] for node, _, _ in candidates],
            [function for _, function, _ in candidates],
            kinds=(cst.If,),
        )

        has_torch = imports_torch(tree)
        replacements = {}
        for node, function, construct in candidates:
            line = statements.line(node)
            reason = self._refusal(node, function, statements.qualified, has_torch)
            if reason is not None:
                self.report(line, "refused", construct, reason)
                continue
            replacements[node] = self._rewrite(node)
            self.report(line, "rewritten", construct, "pads with a slice of zeros and the states under export")
        return replace_in_statements(tree, replacements, [owners[node] for node in replacements])

    @staticmethod
    def _refusal(node: cst.If, function: cst.FunctionDef, qualified, has_torch: bool) -> str | None:
        conjuncts, shorter = _shorter_test(node.test)
        states = shorter.left.value.value.value
        minimum = shorter.comparisons[0].comparator
        if node.orelse is not None:
            return "the `if` has an `else`: the export arm would have to choose it too"
        if not _is_pure(minimum):
            return "the minimum length is not a name, an attribute or an index by a name or an int"
        body = node.body.body
        assign = m.SimpleStatementLine(
            body=[
                m.Assign(
                    targets=[m.AssignTarget(target=m.Name())],
                    value=m.BinaryOperation(operator=m.Subtract(), right=_last_length(m.Name(states))),
                )
            ]
        )
        if len(body) != 2 or not m.matches(body[0], assign):
            return "the body is not `P = K - X.shape[-1]` and the padding"
        amount = body[0].body[0].targets[0].target.value
        if not body[0].body[0].value.left.deep_equals(minimum):
            return "the padding amount is not the minimum of the test less the length"
        zero = m.Integer("0") | m.Float("0.0")
        pad = m.SimpleStatementLine(
            body=[
                m.Assign(
                    targets=[m.AssignTarget(target=m.Name(states))],
                    value=m.Call(
                        args=[
                            m.Arg(value=m.Name(states), keyword=None),
                            m.Arg(value=m.Tuple(elements=[m.Element(m.Name(amount)), m.Element(zero)]), keyword=None),
                            m.ZeroOrOne(m.Arg(value=zero, keyword=m.Name("value"))),
                        ]
                    ),
                )
            ]
        )
        if not m.matches(body[1], pad) or qualified(body[1].body[0].value.func) != {PAD}:
            return f"the padding is not `{PAD}(X, (P, 0))` with zeros on the left of the states"
        if _names(function).count(amount) != 2:
            return f"`{amount}` is read outside the padding"
        used = set(_names(function)) & set(EXPORT_NAMES)
        if used:
            return f"the function already uses `{'`, `'.join(sorted(used))}`"
        if not has_torch:
            return "the module does not `import torch`"
        return None

    @staticmethod
    def _rewrite(node: cst.If) -> cst.If:
        conjuncts, shorter = _shorter_test(node.test)
        code = cst.Module(body=[]).code_for_node
        states = shorter.left.value.value.value
        template = EXPORT_TEMPLATE.format(
            conjuncts="".join(f" and {code(conjunct)}" for conjunct in conjuncts),
            states=states,
            minimum=code(shorter.comparisons[0].comparator),
        )
        return export_twin(template, node, node.leading_lines)
