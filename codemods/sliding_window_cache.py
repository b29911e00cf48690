"""`DynamicSlidingWindowLayer` keeps and sizes its window without guarding on which side of the window the cache is.

Why: the layer keeps the last `sliding_window - 1` positions with a slice (`full[:, :, -self.sliding_window + 1 :, :]`)
and `get_mask_sizes` takes `max(...)` of its int counter and branches on `cumulative_length >= sliding_window`. Under
torch.export the lengths and the counter are symbolic, so each of these guards on the regime of the example: a program
traced with a short cache rejects a long one, and the other way round. (transformers' own exporter instead makes
sliding layers behave as full layers at export, which changes what the cache holds; this rewrite keeps it.)

What it rewrites, in the module that defines `DynamicSlidingWindowLayer` (transformers' `cache_utils.py`), with eager
still taking the original statements (`torch.compiler.is_exporting()` picks the export form):
- in `update`, a pair `self.keys = A[:, :, -self.sliding_window + 1 :, :]` / `self.values = B[...]` (the same slice)
  becomes, under export, an `index_select` over `torch.arange(L - sym_min(L, w - 1), L)`: the same positions on both
  sides of the window (`L - min(L, w - 1) == max(L - w + 1, 0)`), and a length `sym_min(L, w - 1)` whose range torch
  knows. Only for `sliding_window > 1`: with a window of 1 the slice `[-0:]` keeps everything;
- in `get_mask_sizes`, the tail `flag = c >= w`, `kv_offset = max(c - w + 1, 0)`, `if flag: kv_length = w - 1 + q`
  `else: kv_length = c + q`, `return kv_length, kv_offset` gets, under export, the closed forms
  `kv_length = sym_min(c, w - 1) + q` and `kv_offset = c - sym_min(c, w - 1)`, equal for every int `c` and `w`
  (`c >= w` iff `min(c, w - 1) == w - 1`). Written so that `kv_length + kv_offset` is `c + q` symbolically.
  The transformers 4.56 form takes the offset from the positions, a tensor (`kv_offset = torch.clamp(P - w + 1,
  min=0)`, `P = cache_position[0]`), which the mask code then tests in Python `if`s, and the length from
  `c = self.get_seq_length()`: under export it returns the same closed forms (an int offset) after
  `torch._assert_async(kv_offset == c - sym_min(c, w - 1))`: equal values, or the program raises (positions that do
  not start at the cache length).

What it refuses: a class whose `update` or `get_mask_sizes` does not have these exact shapes (another transformers
version) is left unchanged with a finding; the record-the-past arm of `update` (it keeps everything) is not touched.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, Codemod, export_twin
from ._statement_codes import top_level_lines

LAYER = "DynamicSlidingWindowLayer"


def _self(attr: str) -> m.Attribute:
    return m.Attribute(value=m.Name("self"), attr=m.Name(attr))


# `-self.sliding_window + 1`
WINDOW_START = m.BinaryOperation(
    left=m.UnaryOperation(operator=m.Minus(), expression=_self("sliding_window")),
    operator=m.Add(),
    right=m.Integer("1"),
)
FULL = m.SubscriptElement(slice=m.Slice(lower=None, upper=None, step=None))
# `A[:, :, -self.sliding_window + 1 :, :]`
KEEP_WINDOW = m.Subscript(
    value=m.Name(),
    slice=[
        FULL,
        FULL,
        m.SubscriptElement(slice=m.Slice(lower=WINDOW_START, upper=None, step=None)),
        FULL,
    ],
)


def _keep(attr: str) -> m.SimpleStatementLine:
    return m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=_self(attr))], value=KEEP_WINDOW)])


KEEP_TEMPLATE = """
if torch.compiler.is_exporting() and self.sliding_window > 1:
    # Under export a slice guards on which side of the window the length is; an index range does not, and
    # `length - min(length, w - 1)` is `max(length - w + 1, 0)`: the same positions
    length = {keys}.shape[-2]
    torch._check({values}.shape[-2] == length)
    start = length - torch.sym_min(length, self.sliding_window - 1)
    kept = torch.arange(start, length, device={keys}.device)
    self.keys = {keys}.index_select(-2, kept)
    self.values = {values}.index_select(-2, kept.to({values}.device))
else:
    pass
"""

MASK_SIZES_TEMPLATE = """
if torch.compiler.is_exporting():
    # `max` and the `if` on the counter would make torch.export guard on which side of the window the cache is
    kv_length = torch.sym_min(self.cumulative_length, self.sliding_window - 1) + {query}
    kv_offset = self.cumulative_length - torch.sym_min(self.cumulative_length, self.sliding_window - 1)
    return kv_length, kv_offset
"""


# transformers 4.56: the offset is a tensor from `cache_position[0]`, the length from `get_seq_length()`
TENSOR_OFFSET_TEMPLATE = """
if torch.compiler.is_exporting():
    # The mask code tests a tensor offset in Python `if`s (data-dependent under export): return it as an
    # int from the counter, asserted equal, and the length with sym_min (no guard on the window's side)
    past = torch.sym_min(self.get_seq_length(), self.sliding_window - 1)
    offset = self.get_seq_length() - past
    torch._assert_async(kv_offset == offset, "cache_position does not start at the cache length")
    return past + {query}, offset
"""


def _tensor_offset_tail(body: list[cst.BaseStatement]) -> tuple[int, str] | None:
    """(index of the `if`, query length name) when `body` ends with the 4.56 form: `kv_offset =
    torch.clamp(P - self.sliding_window + 1, min=0)`, `if self.get_seq_length() >= self.sliding_window:` `kv_length =
    self.sliding_window - 1 + Q` `else: kv_length = self.get_seq_length() + Q`, `return kv_length, kv_offset`."""
    if len(body) < 3:
        return None
    offset_stmt, branch, ret = body[-3:]
    seq_length = m.Call(func=_self("get_seq_length"), args=[])
    offset = m.SimpleStatementLine(
        body=[
            m.Assign(
                targets=[m.AssignTarget(target=m.Name("kv_offset"))],
                value=m.Call(
                    func=m.Attribute(value=m.Name("torch"), attr=m.Name("clamp")),
                    args=[
                        m.Arg(
                            value=m.BinaryOperation(
                                left=m.BinaryOperation(operator=m.Subtract(), right=_self("sliding_window")),
                                operator=m.Add(),
                                right=m.Integer("1"),
                            ),
                            keyword=None,
                        ),
                        m.Arg(keyword=m.Name("min"), value=m.Integer("0")),
                    ],
                ),
            )
        ]
    )

    def length(value: m.BaseExpression) -> m.IndentedBlock:
        target = m.AssignTarget(target=m.Name("kv_length"))
        return m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Assign(targets=[target], value=value)])])

    full = m.BinaryOperation(
        left=m.BinaryOperation(left=_self("sliding_window"), operator=m.Subtract(), right=m.Integer("1")),
        operator=m.Add(),
        right=m.Name(),
    )
    shape = m.If(
        test=m.Comparison(
            left=seq_length,
            comparisons=[m.ComparisonTarget(operator=m.GreaterThanEqual(), comparator=_self("sliding_window"))],
        ),
        body=length(full),
        orelse=m.Else(body=length(m.BinaryOperation(left=seq_length, operator=m.Add(), right=m.Name()))),
    )
    returned = m.SimpleStatementLine(
        body=[
            m.Return(
                value=m.Tuple(elements=[m.Element(value=m.Name("kv_length")), m.Element(value=m.Name("kv_offset"))])
            )
        ]
    )
    if not (m.matches(offset_stmt, offset) and m.matches(branch, shape) and m.matches(ret, returned)):
        return None
    query = branch.body.body[0].body[0].value.right.value
    if branch.orelse.body.body[0].body[0].value.right.value != query:
        return None
    return len(body) - 2, query


def _mask_sizes_tail(body: list[cst.BaseStatement]) -> tuple[int, str] | None:
    """(index of the first statement, query length name) when `body` ends with transformers' sliding mask sizes."""
    if len(body) < 4:
        return None
    flag_stmt, offset_stmt, branch, ret = body[-4:]
    flag = m.SimpleStatementLine(
        body=[
            m.Assign(
                targets=[m.AssignTarget(target=m.Name())],
                value=m.Comparison(
                    left=_self("cumulative_length"),
                    comparisons=[
                        m.ComparisonTarget(
                            operator=m.GreaterThanEqual(),
                            comparator=_self("sliding_window"),
                        )
                    ],
                ),
            )
        ]
    )
    if not m.matches(flag_stmt, flag):
        return None
    flag_name = flag_stmt.body[0].targets[0].target.value
    offset = m.SimpleStatementLine(
        body=[
            m.Assign(
                targets=[m.AssignTarget(target=m.Name("kv_offset"))],
                value=m.Call(
                    func=m.Name("max"),
                    args=[
                        m.Arg(
                            value=m.BinaryOperation(
                                left=m.BinaryOperation(
                                    left=_self("cumulative_length"),
                                    operator=m.Subtract(),
                                    right=_self("sliding_window"),
                                ),
                                operator=m.Add(),
                                right=m.Integer("1"),
                            )
                        ),
                        m.Arg(value=m.Integer("0")),
                    ],
                ),
            )
        ]
    )
    if not m.matches(offset_stmt, offset):
        return None

    def length(value: m.BaseExpression) -> m.IndentedBlock:
        return m.IndentedBlock(
            body=[
                m.SimpleStatementLine(
                    body=[
                        m.Assign(
                            targets=[m.AssignTarget(target=m.Name("kv_length"))],
                            value=value,
                        )
                    ]
                )
            ]
        )

    full = m.BinaryOperation(
        left=m.BinaryOperation(left=_self("sliding_window"), operator=m.Subtract(), right=m.Integer("1")),
        operator=m.Add(),
        right=m.Name(),
    )
    partial = m.BinaryOperation(left=_self("cumulative_length"), operator=m.Add(), right=m.Name())
    shape = m.If(test=m.Name(flag_name), body=length(full), orelse=m.Else(body=length(partial)))
    if not m.matches(branch, shape):
        return None
    query = branch.body.body[0].body[0].value.right.value
    if branch.orelse.body.body[0].body[0].value.right.value != query:
        return None
    returned = m.SimpleStatementLine(
        body=[
            m.Return(
                value=m.Tuple(
                    elements=[
                        m.Element(value=m.Name("kv_length")),
                        m.Element(value=m.Name("kv_offset")),
                    ]
                )
            )
        ]
    )
    if not m.matches(ret, returned):
        return None
    return len(body) - 4, query


class _KeepWindow(cst.CSTTransformer):
    """Puts every `self.keys = A[...window...]` / `self.values = B[...window...]` pair under the export choice."""

    def __init__(self) -> None:
        self.count = 0

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = list(updated_node.body)
        index = 0
        while index + 1 < len(body):
            keys, values = body[index], body[index + 1]
            if m.matches(keys, _keep("keys")) and m.matches(values, _keep("values")):
                full = keys.body[0].value.value.value
                full_values = values.body[0].value.value.value
                template = KEEP_TEMPLATE.format(keys=full, values=full_values)
                body[index : index + 2] = [export_twin(template, [keys, values], keys.leading_lines)]
                self.count += 1
            index += 1
        return updated_node.with_changes(body=body)


class SlidingWindowCache(Codemod):
    NAME = "sliding-window-cache"
    DESCRIPTION = (
        "Sliding-window cache layers keep their last window - 1 positions and size their masks in forms that "
        "torch.export traces once for caches on both sides of the window."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return f"class {LAYER}(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        body = list(tree.body)
        for index, stmt in enumerate(tree.body):
            if isinstance(stmt, cst.ClassDef) and stmt.name.value == LAYER:
                line = top_level_lines(tree)[id(stmt)]
                body[index] = self._rewrite_class(stmt, line)
        return tree.with_changes(body=body) if body != list(tree.body) else tree

    def _rewrite_class(self, cls: cst.ClassDef, line: int) -> cst.ClassDef:
        methods = []
        for stmt in cls.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "update":
                stmt = self._rewrite_update(stmt, line)
            elif isinstance(stmt, cst.FunctionDef) and stmt.name.value == "get_mask_sizes":
                stmt = self._rewrite_mask_sizes(stmt, line)
            methods.append(stmt)
        return cls.with_changes(body=cls.body.with_changes(body=methods))

    def _rewrite_update(self, function: cst.FunctionDef, line: int) -> cst.FunctionDef:
        construct = f"{LAYER}.update"
        if m.findall(function, EXPORTING):
            return function  # already rewritten
        keeper = _KeepWindow()
        rewritten = function.visit(keeper)
        if keeper.count == 0:
            self.report(
                line,
                "refused",
                construct,
                "no `self.keys = A[:, :, -self.sliding_window + 1 :, :]` pair",
            )
            return function
        self.report(
            line,
            "rewritten",
            construct,
            "keeps the window with an index range under export",
        )
        return rewritten

    def _rewrite_mask_sizes(self, function: cst.FunctionDef, line: int) -> cst.FunctionDef:
        construct = f"{LAYER}.get_mask_sizes"
        if m.findall(function, EXPORTING):
            return function  # already rewritten
        body = list(function.body.body)
        tail, template = _mask_sizes_tail(body), MASK_SIZES_TEMPLATE
        if tail is None:
            tail, template = _tensor_offset_tail(body), TENSOR_OFFSET_TEMPLATE
        if tail is None:
            self.report(
                line,
                "refused",
                construct,
                "not transformers' `is_full`/`max` form of the window sizes",
            )
            return function
        index, query = tail
        choice = cst.parse_statement(template.format(query=query))
        body[index:index] = [choice.with_changes(leading_lines=body[index].leading_lines)]
        body[index + 1] = body[index + 1].with_changes(leading_lines=(cst.EmptyLine(indent=False),))
        self.report(line, "rewritten", construct, "closed forms with sym_min under export")
        return function.with_changes(body=function.body.with_changes(body=body))
