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
    S = [torch.split(t, L.tolist(), dim=2) for t in (Q, K, V)]
    O = [F(<args>, q, k, v, <args>, attention_mask=None, is_causal=False, <keywords>)[0] for q, k, v in zip(*S)]
    A = torch.cat(O, dim=1)

or `A = torch.cat([<the calls>], dim=1)`, or the calls in a loop that keeps each piece's weights too,

    O, W = [], []
    for q, k, v in zip(*S):
        o, w = F(<args>, q, k, v, <args>, attention_mask=None, is_causal=False, <keywords>)
        O.append(o)
        W.append(w)
    A = torch.cat(O, dim=1)

(any names; `C` and `F` names; `q`, `k`, `v` passed once each, in that order, and nowhere else in the call;
`is_causal=False` said: with no mask, transformers' sdpa would take causality from the module), where the function
reads `L`, `S`, `O` (and `o`, `w`) nowhere else. The edit is the smallest that makes the
export path right: the split and the calls stay as written, and only their sizes and mask are chosen,

    if torch.compiler.is_exporting():
        split_sizes, segment_mask = [Q.shape[2]], block_diagonal_mask(C, Q)
    else:
        L = C[1:] - C[:-1]
        split_sizes, segment_mask = L.tolist(), None
    S = [torch.split(t, split_sizes, dim=2) for t in (Q, K, V)]
    O = [F(<args>, q, k, v, <args>, attention_mask=segment_mask, ...)[0] for q, k, v in zip(*S)]

so under export there is one piece, the whole sequence, attended once with a block-diagonal additive mask, and eager
runs the original statements with the same values (`attention_mask=None`). `L` moves into the eager arm: its slices
of `C`, traced even unused, made export guard `len(C) >= 3` (one segment refused). `block_diagonal_mask` is added to
`transformers.masking_utils` (after `packed_sequence_mask_function`), once for every site, and imported by each
rewritten module: each position's segment is how many of `C - C[0]` are at or before it (a comparison and a sum:
torch.onnx cannot translate `torch.searchsorted`), after `torch._assert_async` that `C` does not decrease and that
the lengths add up to the sequence (what `torch.split` checks); the mask is 0 within a segment and the dtype's lowest
value across segments, shaped `[1, 1, S, S]` as transformers' attention functions take it.

Equivalence: a query's softmax over its segment's keys equals its softmax over all keys with the others at the
lowest value (their exponentials underflow to exactly 0), so outputs agree up to the order of the summation inside
the attention kernel: rounding (measured: at most 4.8e-7 over the 18 tiny vision towers that verify, whose
tolerance, `exportsmith/verify/tolerance.py`, is about 1.1e-5). Each query keeps at least itself, so no row is fully
masked. Attention weights, if the function returns them, are not part of `A`; a loop's `W` holds one entry under
export, the weights of the whole sequence: each segment's weights are its diagonal block, and it is exactly 0
elsewhere (None for each, as in eager, where the attention function returns none: sdpa).

What it refuses (left unchanged, with a finding): the statements in a module that does not `import torch` or defines
its own `block_diagonal_mask`, and in a function that reads `L`, `S` or `O` elsewhere or already uses `split_sizes` or
`segment_mask`. Other forms (radio's, which also lays out per-segment weights) are not candidates.
"""

from __future__ import annotations

from collections import Counter

import libcst as cst
import libcst.matchers as m

from .base import Codemod, formatted_block, imports_torch
from ._imports import add_from_import
from ._walks import ReplaceNodes, name_values, nodes_in, statement_children

# Names the rewrite binds in the function: refused where the function already uses them
BOUND_NAMES = ("split_sizes", "segment_mask")
# The mask helper, added to `transformers.masking_utils` and imported by each rewritten module
HELPER = "block_diagonal_mask"
HELPER_MODULE = "transformers.masking_utils"
HELPER_HOME = "def create_causal_mask("  # in masking_utils' source: might_apply lets it through
NEIGHBOUR = "packed_sequence_mask_function"  # the helper goes after it

CHOICE = """
if torch.compiler.is_exporting():
    # One attention call, each position seeing only its own segment (split at `.tolist()`
    # sizes, every segment would have a data-dependent size)
    split_sizes, segment_mask = [{query}.shape[2]], block_diagonal_mask({cu}, {query})
else:
    split_sizes, segment_mask = {lengths}.tolist(), None
"""

HELPER_CODE = '''
def block_diagonal_mask(cu_seqlens: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """
    The additive attention mask of segments packed one after another along the sequence axis of `query`
    (`[batch, heads, sequence, head_dim]`), `cu_seqlens` holding where each starts and the last one ends: 0 where a
    query and a key are in the same segment, the dtype's lowest value elsewhere, shaped `[1, 1, sequence, sequence]`.
    One attention call with it gives each query the keys of its own segment, as one call per segment does, without
    splitting at the lengths' values, which torch.export cannot trace for any number of segments of any lengths.
    """
    segment_ends = cu_seqlens - cu_seqlens[0]
    # what splitting at the lengths checks: none is negative, and they add up to the sequence
    torch._assert_async((cu_seqlens == cu_seqlens.cummax(0).values).all() & (segment_ends[-1] == query.shape[2]))
    positions = torch.arange(query.shape[2], device=segment_ends.device, dtype=segment_ends.dtype)
    # a position's segment: the number of segment starts at or before it (torch.onnx cannot translate searchsorted)
    segment_ids = (segment_ends[None, :] <= positions[:, None]).sum(-1)
    mask = torch.zeros(query.shape[2], query.shape[2], dtype=query.dtype, device=query.device)
    mask = mask.masked_fill(segment_ids[:, None] != segment_ids[None, :], torch.finfo(query.dtype).min)
    return mask[None, None]
'''

OTHER_FORM = (
    "the pieces split at `.tolist()` sizes are not attended by `F(..., attention_mask=None, is_causal=False)`, its "
    "outputs taken as `[0]` or appended with their weights in a loop, and concatenated on the sequence axis (a mask "
    "passed, causality left to the module, weights laid out otherwise, or another layout)"
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
    if (
        len(set(names)) != 3
        or len(found) != 1
        or not unmasked
        or not m.matches(keywords.get("is_causal"), m.Name("False"))
    ):
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
    """The statements at `block.body[start:start + count]` and what the export arm needs of them: three when the
    concatenation holds the calls, four when a comprehension does, five when a loop does; `bound`: the names the
    statements bind that only they may read; `called`: the index of the statement that holds the call."""

    def __init__(self, block: cst.IndentedBlock, start: int, count: int, cu: str, qkv, call: cst.Call, bound, called):
        self.block, self.start = block, start
        self.cu, self.qkv, self.call, self.bound, self.called = cu, qkv, call, bound, called
        self.statements = block.body[start : start + count]

    def statements_after(self, depth: int, indent: int) -> list[cst.BaseStatement]:
        """The site's statements as the rewrite leaves them: the split at `split_sizes` and the call with
        `attention_mask=segment_mask` (`depth`: their block's), each laid out as ruff would lay out its new length."""
        lengths = self.statements[0].body[0].targets[0].target.value
        tolist = m.Call(func=m.Attribute(value=m.Name(lengths), attr=m.Name("tolist")), args=[])
        split = self.statements[1]
        found = nodes_in(split, lambda node: type(node) is cst.Call and m.matches(node, tolist))
        split = split.visit(ReplaceNodes({found[0]: cst.Name("split_sizes")}))
        args = [
            (
                arg.with_changes(value=cst.Name("segment_mask"))
                if arg.keyword is not None and arg.keyword.value == "attention_mask"
                else arg
            )
            for arg in self.call.args
        ]
        called = self.statements[self.called].visit(ReplaceNodes({self.call: self.call.with_changes(args=args)}))
        split, called = formatted_block([split, called], depth, indent).body
        split = split.with_changes(leading_lines=self.statements[1].leading_lines)
        called = called.with_changes(leading_lines=self.statements[self.called].leading_lines)
        return [split, *self.statements[2 : self.called], called, *self.statements[self.called + 1 :]]


def _module_names(tree: cst.Module) -> set[str]:
    """The names the module's top-level defs, classes, assignments and imports bind (an import of the helper from
    masking_utils does not count: a rewrite of the module already made it)."""
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    module = cst.helpers.get_full_name_for_node(small.module) if small.module else ""
                    if module.split(".")[-1] != "masking_utils":
                        names.update(alias.evaluated_alias or alias.evaluated_name for alias in small.names)
                elif isinstance(small, cst.Assign):
                    names.update(t.target.value for t in small.targets if isinstance(t.target, cst.Name))
    return names


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
            concatenated = (
                _concatenation(fourth[1]) if fourth is not None and isinstance(fourth[1], cst.Call) else None
            )
            if m.matches(concatenated, m.Name(third[0])):
                count, calls = 4, third[1]
        attention = _calls(calls, split[0]) if calls is not None else None
        if attention is not None:
            call, names = attention
            bound = (lengths, split[0], *([third[0]] if count == 4 else []))
            found.append(_Site(block, start, count, value.left.value.value, parts, call, bound, 2))
            continue
        loop = _loop(body[start + 2 : start + 5], split[0])
        if loop is None:
            found.append(None)
            continue
        call, bound = loop
        found.append(_Site(block, start, 5, value.left.value.value, parts, call, (lengths, split[0], *bound), 3))
    return found


def _loop(statements, pieces: str) -> tuple[cst.Call, tuple[str, ...]] | None:
    """(the call, the names only the site may read) of

        O, W = [], []
        for q, k, v in zip(*S):
            o, w = F(..., q, k, v, ..., attention_mask=None, ..., is_causal=False, ...)
            O.append(o)
            W.append(w)
        A = torch.cat(O, dim=1)

    W, the per-piece weights, may be read after: under export it holds one entry, the block-diagonal weights of the
    whole sequence (each piece's are a diagonal block of it, exactly 0 elsewhere)."""
    if len(statements) != 3:
        return None
    lists, loop, last = statements
    pair = m.Tuple(elements=[m.Element(value=m.Name()), m.Element(value=m.Name())])
    empty = m.Tuple(elements=[m.Element(value=m.List(elements=[]))] * 2)
    if not m.matches(
        lists, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=pair)], value=empty)])
    ):
        return None
    outputs, weights = (element.value.value for element in lists.body[0].targets[0].target.elements)
    concatenated = _assign(last)
    if concatenated is None or not isinstance(concatenated[1], cst.Call):
        return None
    if not m.matches(_concatenation(concatenated[1]), m.Name(outputs)):
        return None
    body = loop.body.body if isinstance(loop, cst.For) and isinstance(loop.body, cst.IndentedBlock) else ()
    if len(body) != 3 or loop.orelse is not None or not m.matches(body[0], m.SimpleStatementLine(body=[m.Assign()])):
        return None
    assign = body[0].body[0]
    if len(assign.targets) != 1 or not m.matches(assign.targets[0].target, pair):
        return None
    output, weight = (element.value.value for element in assign.targets[0].target.elements)
    appends = [
        m.SimpleStatementLine(
            body=[
                m.Expr(
                    value=m.Call(
                        func=m.Attribute(value=m.Name(into), attr=m.Name("append")), args=[m.Arg(m.Name(name))]
                    )
                )
            ]
        )
        for into, name in ((outputs, output), (weights, weight))
    ]
    if not all(m.matches(statement, append) for statement, append in zip(body[1:], appends)):
        return None
    # the same call as the comprehension form's, unsubscripted: `[F(...)[0] for q, k, v in zip(*S)]`
    comprehension = cst.ListComp(
        elt=cst.Subscript(value=assign.value, slice=[cst.SubscriptElement(slice=cst.Index(value=cst.Integer("0")))]),
        for_in=cst.CompFor(target=loop.target, iter=loop.iter),
    )
    attention = _calls(comprehension, pieces)
    if attention is None:
        return None
    # the loop's own names hold one piece's output and weights: read after, they would hold the whole sequence's
    own = (weight,) if output == concatenated[0] else (output, weight)
    return assign.value, (outputs, *own)


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
        return ".tolist()" in source and "torch.split(" in source or HELPER_HOME in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if self.context.full_module_name == HELPER_MODULE:
            return self._add_helper(tree)
        has_torch = imports_torch(tree)
        defined = _module_names(tree)
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
                reason = self._refusal(function, site, has_torch, defined)
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
        return self._import_helper(tree.with_changes(body=body))

    def _import_helper(self, tree: cst.Module) -> cst.Module:
        """Imports the mask helper from masking_utils: relative when the module lives inside transformers."""
        parts = (self.context.full_module_name or "").split(".")
        if parts[0] == "transformers" and len(parts) > 1:
            return add_from_import(tree, "masking_utils", len(parts) - 1, HELPER)
        return add_from_import(tree, HELPER_MODULE, 0, HELPER)

    def _add_helper(self, tree: cst.Module) -> cst.Module:
        """masking_utils with the mask helper after the packed-sequence mask function (else at the end)."""
        names = [stmt.name.value if isinstance(stmt, cst.FunctionDef) else None for stmt in tree.body]
        if HELPER in names:
            return tree  # rewritten by an earlier run
        after = names.index(NEIGHBOUR) + 1 if NEIGHBOUR in names else len(names)
        helper = cst.parse_statement(HELPER_CODE).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        line = self.top_level_line(tree, tree.body[after - 1])
        self.report(line, "rewritten", HELPER, "added after this line: the mask a rewritten segment attention takes")
        return tree.with_changes(body=[*tree.body[:after], helper, *tree.body[after:]])

    @staticmethod
    def _refusal(function: cst.FunctionDef, site: _Site, has_torch: bool, defined: set[str]) -> str | None:
        if not has_torch:
            return "the module does not `import torch`"
        if HELPER in defined:
            return f"the module already defines `{HELPER}`"
        taken = sorted(name_values(function) & set(BOUND_NAMES))
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
        """`block` with the site's lengths in the eager arm of a choice of the split sizes and the mask, the split at
        those sizes and the call given that mask; `depth`: the block's."""
        lengths = site.statements[0]
        code = CHOICE.format(cu=site.cu, query=site.qkv[0], lengths=lengths.body[0].targets[0].target.value)
        choice = formatted_block(list(cst.parse_module(code).body), depth, indent).body[0]
        eager = choice.orelse.body
        eager = eager.with_changes(body=[lengths.with_changes(leading_lines=()), *eager.body])
        choice = choice.with_changes(
            leading_lines=lengths.leading_lines, orelse=choice.orelse.with_changes(body=eager)
        )
        body = list(block.body)
        start = next(index for index, statement in enumerate(body) if statement is site.statements[0])
        body[start : start + len(site.statements)] = [choice, *site.statements_after(depth, indent)]
        return block.with_changes(body=body)
