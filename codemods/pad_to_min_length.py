"""States shorter than a minimum length are padded up to it in a form that torch.export traces once for every length.

Why: `LinearAttentionLayer.update_conv_state` (transformers' `cache_utils.py`) pads a prefill's conv states up to the
conv kernel size with `if ... X.shape[-1] < K: P = K - X.shape[-1]; X = pad(X, (P, 0), value=0)`. Under torch.export
the length is symbolic and the test guards on the example's side of `K`: a program traced with a prefill of 5 tokens
rejects a prefill of 1 (`Guard failed: input_ids.size()[1] >= 4`) in every hybrid model (mamba2, qwen3_next, ...), and
one traced with 2 tokens rejects 5. The same guard comes back from `pad(X, (sym_max(K - L, 0), 0))` and from
`pad(X, (sym_max(L, K) - L, 0))` (torch 2.13 guards on whether the padded length equals `K`).
`masking_utils.prepare_padding_mask` pads the 2D attention mask on the right up to the key length with
`if (P := kv_length + kv_offset - M.shape[-1]) > 0: mask = pad(M, (0, P))`: the guard `M >= past + new` it leaves
gets the traced lower bounds of the past and the new tokens (2 each, export's example sizes), so every decode
program rejected a 1-token step on a 1-token cache (`Guard failed: attention_mask.size()[1] >= 4`).

What it rewrites: in a function of a module that does `import torch`, an `if` without `else` whose test is
`X.shape[-1] < K` (the body then starts with `P = K - X.shape[-1]`) or `(P := K - X.shape[-1]) > 0`, optionally
after leading `and` conjuncts, and whose body then is exactly `Y = torch.nn.functional.pad(X, (P, 0))` (left) or
`(0, P)` (right), by qualified name, with a number as `value` or none; `X`, `Y` and `P` names, `K` a name, an
attribute or an index of one by a name or an int, or a sum or difference of those (evaluated more than once: no
calls), and `P` used nowhere else in the function. Export takes a new first arm (the leading conjuncts kept):
`Y = torch.cat([fill, X], dim=-1)[..., -torch.sym_max(X.shape[-1], K) :]` on the left, or
`Y = torch.cat([X, fill], dim=-1)[..., : torch.sym_max(X.shape[-1], K)]` on the right, with `fill` `K` positions of
the padding value in `X`'s dtype and device: `X` padded with `K - L` values when `L < K`, and `X`'s own values
otherwise, so it equals the original for every length. Eager takes the original `if` as an `elif`, statement for
statement.

The conv states of `update_conv_state` take another export arm: `Y = pad(X, (K, 0))`, `X` behind the whole `K`
padding positions whatever its length, of which the original keeps the last `max(L, K)`. Its readers take the states
right-aligned (a causal conv whose last `L` outputs the model keeps, the last `K` states the cache keeps; a decode
step's states are the same way behind the `K` cached ones), so they read the same values; and the slice of
`max(L, K)` positions left `Max` in every size after it, which torch cannot reason about: a program exported with
named dims failed on guards true over the whole range (`L <= max(4, L)`), and the causal conv's output was sliced to
`L` positions exactly when `L >= K`, which torch.export guarded on (the slice's layout). The conv then runs over
`K` positions more than in eager, which may change its rounding (measured: 3e-08 at 64 positions).

What it refuses (left unchanged, with a finding): such a test whose `if` has an `else`, another body, a padding value
that is not a number, a `K` that calls something, a `P` read elsewhere, a function that already binds the names the
slice forms use (`zeros`, `filler`, `kept_length`), and a module that does not `import torch`.
"""

from __future__ import annotations

from typing import NamedTuple

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
EXPORT_NAMES = ("zeros", "filler", "kept_length")
# The one function whose left padding has known readers: every caller of a cache layer's `update_conv_state` reads
# the states right-aligned (the last `L` outputs of a causal conv over them, the last `K` states)
RIGHT_ALIGNED_READERS = "update_conv_state"

LEFT_TEMPLATE = """
if torch.compiler.is_exporting(){conjuncts}:
    # A length test makes torch.export guard on the side of the minimum the length is on: the last
    # max(length, minimum) positions of the padding then the states are the padded states when
    # shorter, the states otherwise
    {fill}
    kept_length = torch.sym_max({states}.shape[-1], {minimum})
    {target} = torch.cat([{fill_name}, {states}], dim=-1)[..., -kept_length:]
"""
CONV_STATES_TEMPLATE = """
if torch.compiler.is_exporting(){conjuncts}:
    # A length test makes torch.export guard on the side of the minimum the length is on: the
    # states take the whole minimum as padding instead (callers read them right-aligned, as they
    # read a decode step's states behind the cached ones)
    {target} = {pad}({states}, ({minimum}, 0){value})
"""
RIGHT_TEMPLATE = """
if torch.compiler.is_exporting(){conjuncts}:
    # A length test makes torch.export guard on the side of the minimum the length is on: the first
    # max(length, minimum) positions of the states then the padding are the padded states when
    # shorter, the states otherwise
    {fill}
    kept_length = torch.sym_max({states}.shape[-1], {minimum})
    {target} = torch.cat([{states}, {fill_name}], dim=-1)[..., :kept_length]
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
# `(P := K - X.shape[-1]) > 0`
MISSING = m.Comparison(
    left=m.NamedExpr(target=m.Name(), value=m.BinaryOperation(operator=m.Subtract(), right=_last_length(m.Name()))),
    comparisons=[m.ComparisonTarget(operator=m.GreaterThan(), comparator=m.Integer("0"))],
)


class _LengthTest(NamedTuple):
    """An `if`'s test: the leading conjuncts, the states `X`, the minimum `K`, and the amount `P` when the test binds
    it (`(P := K - X.shape[-1]) > 0`; None for `X.shape[-1] < K`, whose body binds it)."""

    conjuncts: list[cst.BaseExpression]
    states: str
    minimum: cst.BaseExpression
    amount: str | None


def _length_test(test: cst.BaseExpression) -> _LengthTest | None:
    """The `_LengthTest` of `test` when it is `X.shape[-1] < K` or `(P := K - X.shape[-1]) > 0`, or an `and` chain
    ending in one."""
    conjuncts = []
    while isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And) and not test.lpar:
        conjuncts.append(test.left)
        test = test.right
    if test.lpar:
        return None
    if m.matches(test, SHORTER):
        return _LengthTest(conjuncts, test.left.value.value.value, test.comparisons[0].comparator, None)
    if m.matches(test, MISSING) and test.left.lpar:
        missing = test.left.value
        return _LengthTest(conjuncts, missing.right.value.value.value, missing.left, test.left.target.value)
    return None


def _is_pure(expr: cst.BaseExpression) -> bool:
    """A name, an attribute of one, an index of one by a name or an int, or a sum or difference of those: evaluating
    it twice calls nothing (properties aside, which transformers' layers do not use for sizes)."""
    if isinstance(expr, cst.Name):
        return True
    if isinstance(expr, cst.Attribute):
        return _is_pure(expr.value)
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        index = expr.slice[0].slice.value
        return _is_pure(expr.value) and isinstance(index, (cst.Name, cst.Integer))
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Subtract)):
        return _is_pure(expr.left) and _is_pure(expr.right)
    return False


def _number(expr: cst.BaseExpression) -> bool:
    """An int or float literal, possibly negated."""
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        expr = expr.expression
    return isinstance(expr, (cst.Integer, cst.Float)) and not expr.lpar


def _zero(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float)) and float(expr.evaluated_value) == 0


class _Padding(NamedTuple):
    """The padding statement of a candidate's body: `Y = pad(X, (P, 0) | (0, P), value=V)`."""

    target: str
    left: bool
    value: cst.BaseExpression | None  # None: the default, zeros


def _padding(statement: cst.BaseStatement, test: _LengthTest, amount: str, qualified) -> _Padding | str:
    """The `_Padding` of `statement`, or why it is not the exact form."""
    expected = f"`Y = {PAD}(X, (P, 0))` or `(0, P)` with a number as `value`"
    if not m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
        return f"the padding is not {expected}"
    assign = statement.body[0]
    call = assign.value
    if not isinstance(call, cst.Call) or qualified(call.func) != {PAD}:
        return f"the padding is not {expected}"
    # pad(input, pad, mode="constant", value=None): at most `input` and `pad` by position
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    given = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    if len(positional) > 2 or len(positional) + len(given) != len(call.args):
        return f"the padding is not {expected}"
    if not set(given).isdisjoint(("input", "pad")[: len(positional)]):
        return f"the padding is not {expected}"
    given.update(zip(("input", "pad"), positional))
    mode = given.pop("mode", None)
    if mode is not None and not m.matches(mode, m.SimpleString('"constant"') | m.SimpleString("'constant'")):
        return f"the padding is not {expected}"
    if set(given) - {"input", "pad", "value"} or not m.matches(given.get("input"), m.Name(test.states)):
        return f"the padding is not {expected}"
    pair = given.get("pad")
    if not m.matches(pair, m.Tuple(elements=[m.Element(), m.Element()])):
        return f"the padding is not {expected}"
    first, second = (element.value for element in pair.elements)
    zero = m.Integer("0")
    if m.matches(first, m.Name(amount)) and m.matches(second, zero):
        left = True
    elif m.matches(first, zero) and m.matches(second, m.Name(amount)):
        left = False
    else:
        return f"the padding is not {expected}"
    value = given.get("value")
    if value is not None and not _number(value):
        return "the padding value is not a number"
    return _Padding(assign.targets[0].target.value, left, None if value is None or _zero(value) else value)


def _candidates(owner: cst.BaseStatement) -> list[tuple[cst.If, cst.FunctionDef, str]]:
    """Every `if` of a function in the top-level statement `owner` whose test ends with `X.shape[-1] < K` or
    `(P := K - X.shape[-1]) > 0` and whose body calls a `...pad` function, with the innermost function and its
    qualname (`Class.method`); the `elif`s of export arms this codemod added (a second run) are left out."""
    ifs, twins = [], set()
    for node, qualname, functions in scoped_nodes(owner, (cst.If,)):
        if m.matches(node.test, EXPORTING | m.BooleanOperation(left=EXPORTING, operator=m.And())):
            twins.add(id(node.orelse))
        if functions and _length_test(node.test) is not None:
            ifs.append((node, functions[-1], qualname))
    return [found for found in ifs if id(found[0]) not in twins and m.findall(found[0].body, PAD_CALL)]


def _conv_states(padding: _Padding, function: cst.FunctionDef) -> bool:
    """Whether the padding is the left one of `update_conv_state`, whose readers take the states right-aligned."""
    return padding.left and function.name.value == RIGHT_ALIGNED_READERS


def _tests_length(node: cst.CSTNode) -> bool:
    return type(node) is cst.If and _length_test(node.test) is not None


def _names(node: cst.CSTNode) -> list[str]:
    return [name.value for name in m.findall(node, m.Name())]


class PadToMinLength(Codemod):
    NAME = "pad-to-min-length"
    DESCRIPTION = (
        "A padding of states up to a minimum length (a conv kernel size, a mask's key length) under a length test "
        "takes, under export, max(length, minimum) positions of the states beside the padding: one program for "
        "every length."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return (".shape[-1] <" in source or ".shape[-1]) > 0" in source) and "pad(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # Only a top-level statement that holds an `if` on a length test can hold a candidate: the candidate
        # search, the line numbers and the scope analysis are paid for those statements alone
        candidates, owners = candidates_in_statements(tree, _tests_length, _candidates)
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
            padding = self._padding_or_refusal(node, function, statements.qualified, has_torch)
            if isinstance(padding, str):
                self.report(line, "refused", construct, padding)
                continue
            replacements[node] = self._rewrite(node, function, padding)
            if _conv_states(padding, function):
                how = "pads (left) by the whole minimum under export: its readers take the states right-aligned"
            else:
                side = "left" if padding.left else "right"
                how = f"pads ({side}) with a slice of the states and the padding under export"
            self.report(line, "rewritten", construct, how)
        return replace_in_statements(tree, replacements, [owners[node] for node in replacements])

    @staticmethod
    def _padding_or_refusal(node: cst.If, function: cst.FunctionDef, qualified, has_torch: bool) -> _Padding | str:
        test = _length_test(node.test)
        if node.orelse is not None:
            return "the `if` has an `else`: the export arm would have to choose it too"
        if not _is_pure(test.minimum):
            return "the minimum length is not a name, an attribute, an index by a name or an int, or a sum of those"
        body = node.body.body
        amount = test.amount
        if amount is None:  # `X.shape[-1] < K`: the body binds `P = K - X.shape[-1]` first
            assign = m.SimpleStatementLine(
                body=[
                    m.Assign(
                        targets=[m.AssignTarget(target=m.Name())],
                        value=m.BinaryOperation(operator=m.Subtract(), right=_last_length(m.Name(test.states))),
                    )
                ]
            )
            if len(body) != 2 or not m.matches(body[0], assign):
                return "the body is not `P = K - X.shape[-1]` and the padding"
            amount = body[0].body[0].targets[0].target.value
            if not body[0].body[0].value.left.deep_equals(test.minimum):
                return "the padding amount is not the minimum of the test less the length"
        elif len(body) != 1:
            return "the body is not the padding alone"
        padding = _padding(body[-1], test, amount, qualified)
        if isinstance(padding, str):
            return padding
        if _names(function).count(amount) != 2:
            return f"`{amount}` is read outside the padding"
        used = set(_names(function)) & set(EXPORT_NAMES)
        if used and not _conv_states(padding, function):
            return f"the function already uses `{'`, `'.join(sorted(used))}`"
        if not has_torch:
            return "the module does not `import torch`"
        return padding

    @staticmethod
    def _rewrite(node: cst.If, function: cst.FunctionDef, padding: _Padding) -> cst.If:
        test = _length_test(node.test)
        code = cst.Module(body=[]).code_for_node
        minimum = code(test.minimum)
        conjuncts = "".join(f" and {code(conjunct)}" for conjunct in test.conjuncts)
        if _conv_states(padding, function):
            pad_call = node.body.body[-1].body[0].value
            value = "" if padding.value is None else f", value={code(padding.value)}"
            template = CONV_STATES_TEMPLATE.format(
                conjuncts=conjuncts,
                states=test.states,
                minimum=minimum,
                target=padding.target,
                pad=code(pad_call.func),
                value=value,
            )
            return export_twin(template, node, node.leading_lines)
        if padding.value is None:
            fill_name, fill = "zeros", f"zeros = {test.states}.new_zeros((*{test.states}.shape[:-1], {minimum}))"
        else:
            fill_name = "filler"
            fill = f"filler = {test.states}.new_full((*{test.states}.shape[:-1], {minimum}), {code(padding.value)})"
        template = (LEFT_TEMPLATE if padding.left else RIGHT_TEMPLATE).format(
            conjuncts=conjuncts,
            states=test.states,
            minimum=minimum,
            target=padding.target,
            fill=fill,
            fill_name=fill_name,
        )
        return export_twin(template, node, node.leading_lines)
