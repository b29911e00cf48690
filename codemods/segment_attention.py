"""Attention over packed segments (one per image, frame or audio chunk) is one attention call with a block-diagonal
mask under export; eager keeps the call per segment.

Why: vision and audio towers that pack every image's patches into one sequence attend within each image by
splitting the queries, keys and values at `lengths.tolist()` (`lengths = cu_seqlens[1:] - cu_seqlens[:-1]`) and
calling the attention function once per piece. Under torch.export the list holds data-dependent sizes and the split
guards on them (`GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u8, 0)`: Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, GLM-4V, PaddleOCR-VL, ... 34 modeling files in transformers 5.24). One call over the whole
sequence, with a mask that lets a position see only the positions of its own segment, gives each query the same keys
and values: masked keys get a weight of exactly 0 after the softmax. The program stays one graph for any number of
segments of any lengths.

What it rewrites: in a block, the four statements

    L = C[1:] - C[:-1]
    S = [torch.split(t, L.tolist(), dim=D) for t in (Q, K, V)]
    O = [F(<args>, q, k, v, <args>, attention_mask=None, is_causal=False, <keywords>)[0] for q, k, v in zip(*S)]
    A = torch.cat(O, dim=E)

or `A = torch.cat([<the calls>], dim=1)` (any names; `C` and `F` names; `q`, `k`, `v` passed once each, in that
order, and nowhere else in the call; `is_causal=False` said: with no mask, transformers' sdpa would take causality
from the module), where the function reads `L`, `S`, `O` nowhere else. Under `torch.compiler.is_exporting()` they become: the segments' ends
from the first start, `C - C[0]`; `torch._assert_async` that `C` does not decrease (no length < 0) and that the
lengths add up to the sequence (`Q.shape[2]`: what `torch.split` checks); each position's segment,
`torch.searchsorted(ends, arange, right=True)`; an additive mask, 0 within a segment and the dtype's lowest value
across segments; and `A = F(<the same arguments>)[0]` with `Q`, `K`, `V` for `q`, `k`, `v` and the mask as
`attention_mask` (shaped `[1, 1, S, S]`, as transformers' attention functions take it). Eager runs the original
statements, in an `else`. No slice of `C`: a slice's length `n - 1` made export guard `n >= 3` (one segment
refused).

Equivalence: a query's softmax over its segment's keys equals its softmax over all keys with the others at the
lowest value (their exponentials underflow to exactly 0), so outputs agree up to the order of the summation inside
the attention kernel: rounding (measured: at most 4.8e-7 over the 18 tiny vision towers that verify, whose
tolerance, `exportsmith/verify/tolerance.py`, is about 1.1e-5). Each query keeps at least itself, so no row is fully masked. Attention weights, if the
function returns them, are not part of `A`.

What it refuses (left unchanged, with a finding): the statements in a module that does not `import torch`, and in a
function that reads `L`, `S` or `O` elsewhere or already uses the names the export arm binds. Other forms (radio's,
which also lays out per-segment weights) are not candidates.
"""

from __future__ import annotations

from collections import Counter

import libcst as cst
import libcst.matchers as m

from .base import Codemod, export_twin, formatted_block, imports_torch
from ._walks import ReplaceNodes, name_values, statement_children

# Names the export arm binds: refused where the function already uses them
EXPORT_NAMES = ("segment_ends", "positions", "segment_ids", "segment_mask")

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # One attention call, each position seeing only its own segment (split at `.tolist()`
    # sizes, every segment would have a data-dependent size)
    pass
else:
    pass
"""
EXPORT_STATEMENTS = """
segment_ends = {cu} - {cu}[0]
torch._assert_async(({cu} == {cu}.cummax(0).values).all() & (segment_ends[-1] == {query}.shape[2]))
positions = torch.arange({query}.shape[2], device=segment_ends.device, dtype=segment_ends.dtype)
segment_ids = torch.searchsorted(segment_ends, positions, right=True)
segment_mask = torch.zeros(segment_ids.shape[0], segment_ids.shape[0], dtype={query}.dtype, device={query}.device)
segment_mask = segment_mask.masked_fill(segment_ids[:, None] != segment_ids[None, :], torch.finfo({query}.dtype).min)
{result} = {call}[0]
"""

OTHER_FORM = (
    "the pieces split at `.tolist()` sizes are not attended as one list of "
    "`F(..., attention_mask=None, is_causal=False)[0]` concatenated on the sequence axis (per-piece weights kept, a "
    "mask passed, causality left to the module, or another layout)"
)

# `L = C[1:] - C[:-1]`
LENGTHS = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(target=m.Name())],
            value=m.BinaryOperation(
                left=m.Subscript(
                    value=m.Name(),
                    slice=[m.SubscriptElement(slice=m.Slice(lower=m.Integer("1"), upper=None, step=None))],
                ),
                operator=m.Subtract(),
                right=m.Subscript(
                    value=m.Name(),
                    slice=[
                        m.SubscriptElement(
                            slice=m.Slice(
                                lower=None,
                                upper=m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1")),
                                step=None,
                            )
                        )
                    ],
                ),
            ),
        )
    ]
)


def _assign(statement: cst.BaseStatement) -> tuple[str, cst.BaseExpression] | None:
    """(name, value) of `name = value` on a line of its own."""
    if not m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
        return None
    assign = statement.body[0]
    return assign.targets[0].target.value, assign.value


def _split(value: cst.BaseExpression, lengths: str) -> tuple[str, str, str] | None:
    """(Q, K, V) of `[torch.split(t, L.tolist(), dim=2) for t in (Q, K, V)]`: the sequence axis of transformers'
    `[batch, heads, sequence, head_dim]` queries, keys and values."""
    if not isinstance(value, cst.ListComp) or value.for_in.ifs or value.for_in.inner_for_in is not None:
        return None
    target, source, call = value.for_in.target, value.for_in.iter, value.elt
    tolist = m.Call(func=m.Attribute(value=m.Name(lengths), attr=m.Name("tolist")), args=[])
    pattern = m.Call(
        func=m.Attribute(value=m.Name("torch"), attr=m.Name("split")),
        args=[
            m.Arg(value=m.Name(target.value) if isinstance(target, cst.Name) else m.DoNotCare(), keyword=None),
            m.Arg(value=tolist, keyword=None),
            m.Arg(value=m.Integer("2"), keyword=m.Name("dim")),
        ],
    )
    names = m.Tuple(elements=[m.Element(value=m.Name())] * 3)
    if not isinstance(target, cst.Name) or not m.matches(source, names) or not m.matches(call, pattern):
        return None
    return tuple(element.value.value for element in source.elements)


def _calls(value: cst.BaseExpression, pieces: str) -> tuple[cst.Call, tuple[str, str, str]] | None:
    """(the call, (q, k, v)) of `[F(..., q, k, v, ..., attention_mask=None, ...)[0] for q, k, v in zip(*S)]`."""
    if not isinstance(value, cst.ListComp) or value.for_in.ifs or value.for_in.inner_for_in is not None:
        return None
    zipped = m.Call(func=m.Name("zip"), args=[m.Arg(value=m.Name(pieces), star="*")])
    first = m.Subscript(value=m.Call(func=m.Name()), slice=[m.SubscriptElement(slice=m.Index(value=m.Integer("0")))])
    loop = m.Tuple(elements=[m.Element(value=m.Name())] * 3)
    if not m.matches(value.for_in.iter, zipped) or not m.matches(value.for_in.target, loop):
        return None
    if not m.matches(value.elt, first):
        return None
    names = tuple(element.value.value for element in value.for_in.target.elements)
    call = value.elt.value
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    values = [arg.value.value if isinstance(arg.value, cst.Name) else None for arg in positional]
    found = [index for index in range(len(values) - 2) if tuple(values[index : index + 3]) == names]
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    # no mask and not causal: with `attention_mask=None` transformers' sdpa takes `is_causal` from the module
    unmasked = m.matches(keywords.get("attention_mask"), m.Name("None"))
    if len(set(names)) != 3 or len(found) != 1 or not unmasked or not m.matches(keywords.get("is_causal"), m.Name("False")):
        return None
    # each of q, k, v once in the call: the positions where the whole tensors go
    if sum(name in names for name in _name_list(call)) != 3:
        return None
    return call, names


def _name_list(node: cst.CSTNode) -> list[str]:
    """Every `Name` in `node`, with repeats."""
    found, pending = [], [node]
    while pending:
        current = pending.pop()
        if type(current) is cst.Name:
            found.append(current.value)
        else:
            pending.extend(current.children)
    return found


def _concatenation(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`O` of `torch.cat(O, dim=1)`: the outputs' sequence axis (transformers' attention functions return
    `[batch, sequence, heads, head_dim]`)."""
    pattern = m.Call(
        func=m.Attribute(value=m.Name("torch"), attr=m.Name("cat")),
        args=[m.Arg(keyword=None), m.Arg(value=m.Integer("1"), keyword=m.Name("dim"))],
    )
    return value.args[0].value if m.matches(value, pattern) else None


class _Site:
    """The statements at `block.body[start:start + len(statements)]` and what the export arm needs of them: three
    when the concatenation holds the calls, else four."""

    def __init__(self, block: cst.IndentedBlock, start: int, count: int, cu: str, qkv, call: cst.Call, names):
        self.block, self.start = block, start
        self.cu, self.qkv, self.call, self.names = cu, qkv, call, names
        self.statements = block.body[start : start + count]
        self.bound = tuple(_assign(statement)[0] for statement in self.statements[:-1])
        self.result = _assign(self.statements[-1])[0]

    def export_call(self) -> str:
        """The attention call on the whole `Q`, `K`, `V`, with the segment mask."""
        renamed = dict(zip(self.names, self.qkv))
        args = []
        for arg in self.call.args:
            if arg.keyword is None and not arg.star and isinstance(arg.value, cst.Name) and arg.value.value in renamed:
                arg = arg.with_changes(value=cst.Name(renamed[arg.value.value]))
            elif arg.keyword is not None and arg.keyword.value == "attention_mask":
                arg = arg.with_changes(value=cst.parse_expression("segment_mask[None, None]"))
            args.append(arg)
        # one line: black lays it out where the export arm is
        args = [arg.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace("")) for arg in args]
        call = self.call.with_changes(
            args=args, whitespace_before_args=cst.SimpleWhitespace(""), whitespace_after_func=cst.SimpleWhitespace("")
        )
        return cst.Module([]).code_for_node(call)


def _sites(block: cst.IndentedBlock) -> list[_Site | None]:
    """The sites in `block`; None for a split at `.tolist()` sizes whose calls have another form."""
    found = []
    body = block.body
    for start in range(len(body) - 2):
        if not m.matches(body[start], LENGTHS):
            continue
        lengths, value = _assign(body[start])
        split = _assign(body[start + 1])
        if value.left.value.value != value.right.value.value or split is None:
            continue
        parts = _split(split[1], lengths)
        if parts is None:
            continue
        # `A = torch.cat([<calls>], dim=1)`, or `O = [<calls>]` then `A = torch.cat(O, dim=1)`
        third = _assign(body[start + 2])
        outputs = _concatenation(third[1]) if third is not None and isinstance(third[1], cst.Call) else None
        count, calls = 3, outputs
        if outputs is None and third is not None and start + 3 < len(body):
            fourth = _assign(body[start + 3])
            concatenated = _concatenation(fourth[1]) if fourth is not None and isinstance(fourth[1], cst.Call) else None
            if m.matches(concatenated, m.Name(third[0])):
                count, calls = 4, third[1]
        attention = _calls(calls, split[0]) if calls is not None else None
        if attention is None:
            found.append(None)
            continue
        call, names = attention
        found.append(_Site(block, start, count, value.left.value.value, parts, call, names))
    return found


def _functions(tree: cst.Module):
    """(function, `Class.method` or function name, top-level index, depth of its body) of every def in a class or
    module body, nested defs included."""

    def walk(node, scopes, index, depth):
        if isinstance(node, (cst.ClassDef, cst.FunctionDef)) and isinstance(node.body, cst.IndentedBlock):
            scopes = [*scopes, node.name.value]
            if isinstance(node, cst.FunctionDef):
                yield node, ".".join(scopes), index, depth + 1
            for child in node.body.body:
                yield from walk(child, scopes, index, depth + 1)

    for index, stmt in enumerate(tree.body):
        yield from walk(stmt, [], index, 0)


def _blocks(block: cst.IndentedBlock, depth: int):
    """(block, depth) of `block` and of every indented block inside it but those of nested defs and classes."""
    yield block, depth
    for statement in block.body:
        if not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            yield from _inner_blocks(statement, depth)


def _inner_blocks(node: cst.CSTNode, depth: int):
    for child in statement_children(node):
        if type(child) is cst.IndentedBlock:
            yield from _blocks(child, depth + 1)
        elif isinstance(child, (cst.If, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)):
            yield from _inner_blocks(child, depth)


class SegmentAttention(Codemod):
    NAME = "segment-attention"
    DESCRIPTION = (
        "Attention split into packed segments at lengths.tolist() becomes, under export, one attention call with a "
        "block-diagonal mask, so a vision tower takes any number of images of any sizes."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return ".tolist()" in source and "torch.split(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        has_torch = imports_torch(tree)
        replacements = {}
        rewritten = set()
        indent = len(tree.default_indent)
        for function, construct, index, depth in _functions(tree):
            sites = [(site, depth) for block, depth in _blocks(function.body, depth) for site in _sites(block)]
            if not sites:
                continue
            line = self.top_level_line(tree, tree.body[index])
            for site, depth in sites:
                if site is None:
                    self.report(line, "refused", construct, OTHER_FORM)
                    continue
                reason = self._refusal(function, site, has_torch)
                if reason is not None:
                    self.report(line, "refused", construct, reason)
                    continue
                block = replacements.get(site.block, site.block)
                replacements[site.block] = self._rewrite(block, site, depth, indent)
                rewritten.add(index)
                self.report(line, "rewritten", construct, "attends within each segment by a mask under export")
        if not replacements:
            return tree
        body = [
            stmt.visit(ReplaceNodes(replacements)) if index in rewritten else stmt
            for index, stmt in enumerate(tree.body)
        ]
        return tree.with_changes(body=body)

    @staticmethod
    def _refusal(function: cst.FunctionDef, site: _Site, has_torch: bool) -> str | None:
        if not has_torch:
            return "the module does not `import torch`"
        taken = sorted(name_values(function) & set(EXPORT_NAMES))
        if taken:
            return f"the function already uses `{'`, `'.join(taken)}`"
        # the names the site's statements bind, named anywhere else in the function (more often than in the site):
        # the export arm binds only the result
        everywhere = Counter(_name_list(function.body))
        in_site = Counter(name for statement in site.statements for name in _name_list(statement))
        read = sorted(name for name in set(site.bound) if everywhere[name] > in_site[name])
        if read:
            return f"the function reads `{'`, `'.join(read)}` outside the split attention"
        return None

    @staticmethod
    def _rewrite(block: cst.IndentedBlock, site: _Site, depth: int, indent: int) -> cst.IndentedBlock:
        """`block` with the site's four statements replaced by their export twin; `depth`: the block's."""
        code = EXPORT_STATEMENTS.format(
            cu=site.cu,
            query=site.qkv[0],
            result=site.result,
            call=site.export_call(),
        )
        export = formatted_block(list(cst.parse_module(code).body), depth + 1, indent).body
        statements = list(site.statements)
        twin = export_twin(EXPORT_TEMPLATE, statements, statements[0].leading_lines, export=list(export))
        body = list(block.body)
        start = next(index for index, statement in enumerate(body) if statement is statements[0])
        body[start : start + len(statements)] = [twin]
        return block.with_changes(body=body)
