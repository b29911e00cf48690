"""The fp16 clamp of encoder and decoder layers takes T5's branch-free form: `torch.where` picks the clamp value.

Why: bart, led, marian, mvp, plbart, blenderbot-small, bigbird-pegasus, nllb-moe, informer, autoformer,
time-series-transformer, longt5 and pix2struct clamp their hidden states in fp16 only when some value is not finite,

    if hidden_states.dtype == torch.float16 and torch.isinf(hidden_states).any():
        clamp_value = torch.finfo(hidden_states.dtype).max - 1000
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)

and the `if` on a tensor's values stops torch.export in fp16 (`GuardOnDataDependentSymNode`). transformers already
writes the same clamp without a branch in T5, switch-transformers and udop:

    if hidden_states.dtype == torch.float16:
        clamp_value = torch.where(
            torch.isinf(hidden_states).any(),
            torch.finfo(hidden_states.dtype).max - 1000,
            torch.finfo(hidden_states.dtype).max,
        )
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)

This codemod writes the first form as the second: the smallest edit, in the idiom the library already uses, instead of
a `torch.cond` with nested functions.

What it rewrites: an `if H.dtype == torch.float16 and P:` with no `else`, whose body is exactly
`C = torch.finfo(H.dtype).max - N` then `H = torch.clamp(H, min=-C, max=C)`, where `P` is `torch.isinf(H).any()` or
`not torch.isfinite(H).all()` (written `~torch.isfinite(H).all()` in the tensor form), `H` and `C` names, `N` a number.

Equivalence: when `P` holds, both clamp at `max - N`. When it does not, no value of `H` is infinite (both predicates
say so), and a clamp at the dtype's largest finite value leaves every finite value and NaN as it is: the same tensor,
bit for bit (tests/test_fp16_clamp.py runs both forms on values with and without infinities, NaN and values beyond
`max - N`). Only fp16 runs the new code, as before.

What it refuses: nothing is refused; other forms (the clamp under `if self.training:`, which an inference export never
traces, or another predicate) are not candidates and cond-branches sees them as before.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import Codemod, formatted_block, imports_torch
from ._candidates import CandidateStatements
from ._walks import candidates_in_statements, replace_in_statements, scoped_nodes


def _tensor_predicate(test: cst.BaseExpression, hidden: str) -> str | None:
    """The tensor form of `P` (`torch.isinf(H).any()` or `not torch.isfinite(H).all()`), else None."""
    code = cst.Module([]).code_for_node(test)
    if code == f"torch.isinf({hidden}).any()":
        return code
    if code == f"not torch.isfinite({hidden}).all()":
        return f"~torch.isfinite({hidden}).all()"
    return None


def _site(node: cst.If) -> tuple[str, str, str, str] | None:
    """(H, the tensor predicate, C, the clamp value's expression) of a candidate `if`, else None."""
    if node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
        return None
    test = node.test
    if not m.matches(test, m.BooleanOperation(operator=m.And())):
        return None
    dtype = cst.Module([]).code_for_node(test.left)
    if not dtype.endswith(".dtype == torch.float16"):
        return None
    hidden = dtype.removesuffix(".dtype == torch.float16")
    if not hidden.isidentifier():
        return None
    predicate = _tensor_predicate(test.right, hidden)
    body = node.body.body
    if predicate is None or len(body) != 2:
        return None
    value, clamp = (cst.Module([]).code_for_node(statement.with_changes(leading_lines=())) for statement in body)
    first, _, expression = value.strip().partition(" = ")
    limit = f"torch.finfo({hidden}.dtype).max - "
    number = expression.removeprefix(limit)
    if not first.isidentifier() or not expression.startswith(limit) or not number.replace(".", "", 1).isdigit():
        return None
    if clamp.strip() != f"{hidden} = torch.clamp({hidden}, min=-{first}, max={first})":
        return None
    return hidden, predicate, first, expression


def _is_candidate(node: cst.CSTNode) -> bool:
    # cheap: an `and` whose left side tests a dtype; `_site` reads the rest once, in `_candidates`
    return type(node) is cst.If and m.matches(node.test, m.BooleanOperation(operator=m.And()))


def _candidates(owner: cst.BaseStatement) -> list[tuple[cst.If, str, tuple[str, str, str, str]]]:
    found = []
    for node, qualname, _ in scoped_nodes(owner, (cst.If,)):
        site = _site(node)
        if site is not None:
            found.append((node, qualname or "<module>", site))
    return found


class Fp16Clamp(Codemod):
    NAME = "fp16-clamp"
    DESCRIPTION = (
        "The fp16 clamp `if h.dtype == torch.float16 and torch.isinf(h).any():` takes T5's branch-free form, "
        "`torch.where` choosing the clamp value: no branch on a tensor's values, the same results."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "torch.float16 and" in source and "torch.clamp(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        candidates, owners = candidates_in_statements(tree, _is_candidate, _candidates)
        if not candidates:
            return tree
        statements = CandidateStatements(self, tree, [owners[node] for node, _, _ in candidates], kinds=(cst.If,))
        has_torch = imports_torch(tree)
        indent = len(tree.default_indent)
        replacements = {}
        for node, construct, site in candidates:
            line = statements.line(node)
            if not has_torch:
                self.report(line, "refused", construct, "the module does not `import torch`")
                continue
            replacements[node] = self._rewrite(node, site, statements.column(node) // indent, indent)
            self.report(line, "rewritten", construct, "the clamp value chosen by `torch.where`, as T5 does")
        return replace_in_statements(tree, replacements, [owners[node] for node in replacements])

    @staticmethod
    def _rewrite(node: cst.If, site: tuple[str, str, str, str], depth: int, indent: int) -> cst.If:
        hidden, predicate, value, expression = site
        code = (
            f"{value} = torch.where({predicate}, {expression}, torch.finfo({hidden}.dtype).max)\n"
            f"{hidden} = torch.clamp({hidden}, min=-{value}, max={value})\n"
        )
        body = formatted_block(list(cst.parse_module(code).body), depth + 1, indent)
        first, second = node.body.body
        body = body.with_changes(
            body=[
                body.body[0].with_changes(leading_lines=first.leading_lines),
                body.body[1].with_changes(leading_lines=second.leading_lines),
            ]
        )
        return node.with_changes(test=node.test.left, body=node.body.with_changes(body=body.body))
