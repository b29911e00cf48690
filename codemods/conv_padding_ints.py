"""A conv's padding that a module keeps in 0-d integer buffers is computed in Python ints under export.

Why: EnCodec's `EncodecConv1d` (copied by mimi, wavtokenizer and pocket_tts' tokenizer) keeps its
geometry in non-persistent 0-d int64 buffers built from the conv's own ints (`self.stride = nn.Buffer(
torch.tensor(self.conv.stride[0], dtype=torch.int64), persistent=False)`, `kernel_size`, `padding_total`), pads by
them in `forward`, and `_get_extra_padding_for_conv1d` rounds the number of frames with a float32 division and
`torch.ceil`. Under torch.export a buffer is an input whose value is unknown: every padding becomes an unbacked size
(`.item()` in `pad`), and the model fails on the first test of one (`Could not guard on data-dependent expression
Eq(u0, 1)` in `_pad1d`, or later in attention on sums of them: mimi, pocket_tts). The same numbers as Python ints of
the conv (`self.conv.stride[0]`, ...) are sizes export reasons about.

What it rewrites, in a class whose `__init__` makes such buffers: every attribute it can resolve to an int expression
of the conv's hyperparameters (`self.<m>.kernel_size[i]`, `stride`, `dilation`, `padding`, with `self.<m>` made from
a `Conv1d`/`ConvTranspose1d`), through local names, `torch.tensor(E, dtype=torch.int64)`, `+ - * //` and other such
attributes (`self.padding_right = self.padding_total // 2`), non-persistent buffers or plain attributes assigned once
in `__init__` and nowhere else in the class. Export takes a twin of
- each statement of `forward` that reads such an attribute as an operand of `+ - * //` or an item of a tuple: the same
  statement with the int expression (the same number; a 0-d tensor and an int pad alike);
- a method that is the frame rounding `L = X.shape[-1]; N = (L - K + P) / S + 1; N = torch.ceil(N).to(torch.int64) -
  1; I = N * S + K - P; return I - L` (`K`, `P`, `S` such attributes): `N = -((L - K + P) // -S)`, the exact ceiling,
  after `torch._check(abs(L - K + P) + S < 2**23)`. The float32 quotient is the exact one rounded twice, each time by
  at most 2**-24 of its size; while that stays below `1 / S` (the distance of a non-integer quotient to an integer) the
  two ceilings agree: they do for every length up to 2**23 (8388608 samples, 5.8 minutes of 24 kHz audio; measured:
  they first differ at 12582913), and the program refuses longer inputs instead of padding them otherwise;
- the reflect padding of a short input, `M = max(A, B); E = 0; if L <= M: E = M - L + 1; X = pad(X, (0, E))` then
  `Y = pad(X, P, mode, V); Z = Y.shape[-1] - E; return Y[..., :Z]` (`A, B = P` and `mode` known to be "reflect"):
  one gather of the positions reflect padding copies, `|t|` for `t` in `[-A, L + B)`, reflected at `max(L, M + 1)`,
  from `X` followed by `M + 1` zeros (the zeros a short input is extended with). Reflect padding copies values: the
  gather is bit-identical, and it has no test of the length nor the padding's size check (`pad < length`), which
  export guarded on over any range of lengths that torch could not reason about (`max(...)` of floor divisions).
Eager keeps every original statement in the `else` arm: it still reads the buffers. The three forms are matched on
their printed statements (the code transformers has), names captured.

What it refuses (left unchanged, with a finding): a read of such an attribute in `forward` that is not an operand or a
tuple item (a call's receiver, `.device`), a frame rounding whose `K`, `P` or `S` does not resolve or whose method binds
their names, a reflect padding whose method binds `extended` or `positions`, a function that binds the name `torch`, a module that does not `import torch`, and shared modules (`transformers.` outside `models`).
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from ._bindings import bound_anywhere, parameter_names
from ._candidates import CandidateStatements
from ._walks import nodes_in, replace_in_statements, scoped_nodes
from .base import (
    Codemod,
    eager_arm,
    export_twin,
    formatted_block,
    imports_torch,
    scoped_outside_export_twins,
    shared_module_refusal,
    statement_twin,
)

# A conv's hyperparameters, tuples of Python ints on every torch conv module
HYPERPARAMETERS = frozenset({"kernel_size", "stride", "dilation", "padding"})
CONVS = frozenset({"Conv1d", "ConvTranspose1d"})
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)
# The float32 ceiling equals integer ceil-division while |numerator| + stride stays below this (see the docstring)
EXACT_BELOW = "2**23"

TWIN = """
if torch.compiler.is_exporting():
    # the conv's padding in Python ints: export reads the 0-d buffers as unknown values
    pass
else:
    pass
"""
ROUNDING_TWIN = """
if torch.compiler.is_exporting():
    # frames by integer ceil-division (export reads the 0-d buffers as unknown values): the float32
    # ceiling below equals it while the check holds; longer inputs are refused, not padded otherwise
    pass
else:
    pass
"""
REFLECT_TWIN = """
if torch.compiler.is_exporting():
    # reflect padding as a gather of the positions it copies (zeros past a short input): no test of the length
    # and no size check of the padding for export to guard on
    pass
else:
    pass
"""


def _self_attribute(node: cst.CSTNode) -> str | None:
    """`A` of `self.A`, else None."""
    if type(node) is cst.Attribute and type(node.value) is cst.Name and node.value.value == "self":
        return node.attr.value
    return None


PRECEDENCE = {cst.Add: 1, cst.Subtract: 1, cst.Multiply: 2, cst.FloorDivide: 2}


def _operand(expr: cst.BaseExpression, parent: cst.BaseBinaryOp, right: bool) -> cst.BaseExpression:
    """`expr` as the left or right operand of `parent`, parenthesized where the order of operations needs it."""
    if type(expr) is not cst.BinaryOperation:
        return expr
    inner, outer = PRECEDENCE[type(expr.operator)], PRECEDENCE[type(parent)]
    if inner < outer or (right and inner == outer and type(parent) is not cst.Add):
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return expr


def _parenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` in parentheses when composite: how a read of an attribute (an atom) is replaced."""
    if type(expr) is cst.BinaryOperation:
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return expr


class _Geometry:
    """The attributes of a class that `__init__` makes from its convs' ints: name -> an int expression over
    `self.<conv>.<hyperparameter>[i]` (parenthesized when composite)."""

    def __init__(self, cls: cst.ClassDef):
        self.attributes: dict[str, cst.BaseExpression] = {}
        self.convs: set[str] = set()
        methods = {stmt.name.value: stmt for stmt in cls.body.body if type(stmt) is cst.FunctionDef}
        init = methods.get("__init__")
        if init is None:
            return
        self.convs = self._convs(init)
        if not self.convs:
            return
        locals_: dict[str, cst.BaseExpression] = {}
        for stmt in init.body.body:
            if type(stmt) is not cst.SimpleStatementLine:
                # a name or attribute bound inside a compound statement may differ by path: forget it
                for target in nodes_in(stmt, lambda node: type(node) in (cst.AssignTarget, cst.AugAssign)):
                    self._forget(target.target, locals_)
                continue
            for small in stmt.body:
                if type(small) is cst.Assign and len(small.targets) == 1:
                    self._assign(small.targets[0].target, small.value, locals_)
                elif type(small) in (cst.AugAssign, cst.AnnAssign):
                    self._forget(small.target, locals_)
        # assigned anywhere else in the class: not a constant of the instance
        for name, method in methods.items():
            if name == "__init__":
                continue
            for target in nodes_in(method, lambda node: type(node) in (cst.AssignTarget, cst.AugAssign)):
                self.attributes.pop(_self_attribute(target.target) or "", None)

    @staticmethod
    def _convs(init: cst.FunctionDef) -> set[str]:
        convs = set()
        for call in nodes_in(init, lambda node: type(node) is cst.Assign):
            target, value = call.targets[0].target, call.value
            if len(call.targets) == 1 and _self_attribute(target) and type(value) is cst.Call:
                func = value.func
                name = func.attr.value if type(func) is cst.Attribute else getattr(func, "value", None)
                if name in CONVS:
                    convs.add(_self_attribute(target))
        return convs

    def _forget(self, target: cst.BaseExpression, locals_: dict) -> None:
        if type(target) is cst.Name:
            locals_.pop(target.value, None)
        elif _self_attribute(target):
            self.attributes.pop(_self_attribute(target), None)

    def _assign(self, target: cst.BaseExpression, value: cst.BaseExpression, locals_: dict) -> None:
        attribute = _self_attribute(target)
        if attribute is not None and attribute in self.attributes:
            self.attributes.pop(attribute)  # assigned twice: not one value
            return
        if (
            attribute is not None
            and type(value) is cst.Call
            and m.matches(value.func, m.Attribute(attr=m.Name("Buffer")))
        ):
            if len(value.args) == 2 and m.matches(
                value.args[1], m.Arg(keyword=m.Name("persistent"), value=m.Name("False"))
            ):
                resolved = self.resolve(value.args[0].value, locals_)
                if resolved is not None:
                    self.attributes[attribute] = resolved
            return
        resolved = self.resolve(value, locals_)
        if type(target) is cst.Name:
            if resolved is None:
                locals_.pop(target.value, None)
            else:
                locals_[target.value] = resolved
        elif attribute is not None and resolved is not None and type(value) is cst.BinaryOperation:
            self.attributes[attribute] = resolved  # a tensor computed from the buffers (`self.padding_total // 2`)

    def resolve(self, expr: cst.BaseExpression, locals_: dict) -> cst.BaseExpression | None:
        """`expr` as an int expression of the convs' hyperparameters, or None."""
        kind = type(expr)
        if kind is cst.Integer:
            return expr
        if kind is cst.Name:
            return locals_.get(expr.value)
        if kind is cst.Attribute and _self_attribute(expr) is not None:
            return self.attributes.get(_self_attribute(expr))
        if kind is cst.Subscript and self._hyperparameter(expr):
            return expr.with_changes(lpar=(), rpar=())
        if kind is cst.BinaryOperation and type(expr.operator) in ARITHMETIC:
            left, right = self.resolve(expr.left, locals_), self.resolve(expr.right, locals_)
            if left is None or right is None:
                return None
            operator = expr.operator.with_changes(
                whitespace_before=cst.SimpleWhitespace(" "), whitespace_after=cst.SimpleWhitespace(" ")
            )
            left, right = left.with_changes(lpar=(), rpar=()), right.with_changes(lpar=(), rpar=())
            return cst.BinaryOperation(
                left=_operand(left, operator, False), operator=operator, right=_operand(right, operator, True)
            )
        if kind is cst.Call and m.matches(
            expr,
            m.Call(
                func=m.Attribute(value=m.Name("torch"), attr=m.Name("tensor")),
                args=[
                    m.Arg(keyword=None),
                    m.Arg(
                        keyword=m.Name("dtype"),
                        value=m.Attribute(value=m.Name("torch"), attr=m.Name("int64") | m.Name("long")),
                    ),
                ],
            ),
        ):
            return self.resolve(expr.args[0].value, locals_)
        return None

    def _hyperparameter(self, expr: cst.Subscript) -> bool:
        """`self.<conv>.<hyperparameter>[<int>]`."""
        value = expr.value
        return (
            type(value) is cst.Attribute
            and value.attr.value in HYPERPARAMETERS
            and _self_attribute(value.value) in self.convs
            and len(expr.slice) == 1
            and type(expr.slice[0].slice) is cst.Index
            and type(expr.slice[0].slice.value) is cst.Integer
        )


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _substituted(node: cst.CSTNode, geometry: _Geometry) -> tuple[cst.CSTNode, list[str]]:
    """`node` with each read of a geometry attribute replaced by its int expression, and the refused reads' codes
    (neither an operand of `+ - * //` nor a tuple item)."""
    replacements = {}
    for child in nodes_in(node, lambda other: type(other) in (cst.BinaryOperation, cst.Tuple)):
        if type(child) is cst.BinaryOperation:
            for operand in (child.left, child.right):
                if _self_attribute(operand) in geometry.attributes:
                    replacements[operand] = _parenthesized(geometry.attributes[_self_attribute(operand)])
        else:
            for element in child.elements:
                if _self_attribute(element.value) in geometry.attributes:
                    replacements[element.value] = geometry.attributes[_self_attribute(element.value)]
    reads = nodes_in(node, lambda child: _self_attribute(child) in geometry.attributes)
    refused = [_code(read) for read in reads if read not in replacements]
    if refused:
        return node, refused
    return replace_in_statements(cst.Module(body=[node]), replacements, [node]).body[0], []


# The frame rounding: `L = X.shape[-1]; N = (L - self.K + self.P) / self.S + 1; N = torch.ceil(N).to(torch.int64) - 1;
# I = N * self.S + self.K - self.P; return I - L`, captured by name
def _rounding(body: list[cst.BaseStatement]) -> dict | None:
    statements = [stmt for stmt in body if not m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())]))]
    code = [_code(stmt).strip() for stmt in statements]
    if len(code) != 5 or not all(type(stmt) is cst.SimpleStatementLine for stmt in statements):
        return None
    name, attr = r"([A-Za-z_]\w*)", r"self\.([A-Za-z_]\w*)"
    patterns = [
        rf"{name} = ([A-Za-z_]\w*)\.shape\[-1\]",
        rf"{name} = \({name} - {attr} \+ {attr}\) / {attr} \+ 1",
        rf"{name} = torch\.ceil\({name}\)\.to\(torch\.int64\) - 1",
        rf"{name} = {name} \* {attr} \+ {attr} - {attr}",
        rf"return {name} - {name}",
    ]
    groups = []
    for pattern, line in zip(patterns, code):
        found = re.fullmatch(pattern, line)
        if found is None:
            return None
        groups.append(found.groups())
    (
        (length, tensor),
        (frames, length2, k, p, s),
        (frames2, frames3),
        (ideal, frames4, s2, k2, p2),
        (ideal2, length3),
    ) = groups
    if not (length == length2 == length3 and frames == frames2 == frames3 == frames4 and ideal == ideal2):
        return None
    if not (k == k2 and p == p2 and s == s2):
        return None
    return {"length": length, "tensor": tensor, "frames": frames, "ideal": ideal, "K": k, "P": p, "S": s}


SHORT_INPUT = m.If(
    test=m.Comparison(
        left=m.Name(), comparisons=[m.ComparisonTarget(operator=m.LessThanEqual(), comparator=m.Name())]
    ),
    orelse=None,
)
NAME = r"([A-Za-z_]\w*)"
# The names the reflect padding's export arm binds
REFLECT_NAMES = ("extended", "positions")


def _reflect_padding(body: list, index: int) -> dict | None:
    """The names of EnCodec's reflect padding of a short input in `body`, its `if` at `index`, else None:
    `A, B = P; ...; M = max(A, B); E = 0; if L <= M: E = M - L + 1; X = F(X, (0, E))`, then `Y = F(X, P, mode, V)`,
    `Z = Y.shape[-1] - E` and `return Y[..., :Z]`, where `F` is a `...pad` and `mode` is known to be 'reflect'
    (an earlier `if mode != "reflect": return ...`)."""
    stmt = body[index]
    if not m.matches(stmt, SHORT_INPUT) or type(stmt.body) is not cst.IndentedBlock or index < 2:
        return None
    length, most = stmt.test.left.value, stmt.test.comparisons[0].comparator.value
    inner = [_code(line).strip() for line in stmt.body.body]
    before = [_code(line).strip() for line in body[:index]]
    after = [_code(line).strip() for line in body[index + 1 : index + 4]]
    if len(inner) != 2 or len(after) != 3 or index + 4 != len(body):
        return None
    first = re.fullmatch(rf"{NAME} = {most} - {length} \+ 1", inner[0])
    second = re.fullmatch(rf"{NAME} = ((?:{NAME}\.)*pad)\(\1, \(0, {NAME}\)\)", inner[1])
    if first is None or second is None or second.group(4) != first.group(1):
        return None
    extra, tensor, pad = first.group(1), second.group(1), second.group(2)
    maximum = re.fullmatch(rf"{most} = max\({NAME}, {NAME}\)", before[-2])
    if before[-1] != f"{extra} = 0" or maximum is None:
        return None
    left, right = maximum.groups()
    padded = re.fullmatch(rf"{NAME} = {re.escape(pad)}\({tensor}, {NAME}, {NAME}, {NAME}\)", after[0])
    if padded is None:
        return None
    result, paddings, mode = padded.group(1), padded.group(2), padded.group(3)
    if f"{left}, {right} = {paddings}" not in before or not any(
        re.fullmatch(rf"if {mode} != [\"']reflect[\"']:\s+return .*", line, re.DOTALL) for line in before
    ):
        return None
    end = re.fullmatch(rf"{NAME} = {result}\.shape\[-1\] - {extra}", after[1])
    if end is None or after[2] != f"return {result}[..., :{end.group(1)}]":
        return None
    return {"length": length, "most": most, "left": left, "right": right, "tensor": tensor, "pad": pad}


class ConvPaddingInts(Codemod):
    NAME = "conv-padding-ints"
    DESCRIPTION = (
        "A conv's padding kept in 0-d integer buffers is computed from the conv's Python ints under export: export "
        "reads a buffer's value as an unknown size."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "nn.Buffer(" in source and "persistent=False" in source and "Conv" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        sites = []  # (top-level statement, kind, node, class, method, data)
        for owner in tree.body:
            for cls, _, _ in scoped_nodes(owner, (cst.ClassDef,)):
                sites.extend((owner, *site) for site in self._sites(cls, _Geometry(cls)))
        if not sites:
            return tree
        owners = [site[0] for site in sites]
        statements = CandidateStatements(
            self, tree, owners, [site[4] for site in sites], kinds=(cst.SimpleStatementLine, cst.If, cst.FunctionDef)
        )
        refusal = shared_module_refusal(self.context.full_module_name)
        if refusal is None and not imports_torch(tree):
            refusal = "the module does not `import torch`"
        indent = len(tree.default_indent)
        replacements, touched = {}, []
        for owner, kind, node, cls, method, data in sites:
            where = f"{cls.name.value}.{method.name.value}"
            line = statements.line(data.get("at", node))
            reason = refusal or data.get("refused")
            if reason is None and "torch" in _bound_names(method):
                reason = "the function binds the name `torch`"
            if reason is not None:
                self.report(line, "refused", where, reason)
                continue
            depth = statements.column(node) // indent
            if kind == "read":
                replacements[node] = self._read_twin(node, data["exported"], depth, indent)
                self.report(line, "rewritten", where, "the padding is read as the conv's Python ints")
            elif kind == "rounding":
                replacements[node] = self._rounding_twin(node, data, depth, indent)
                self.report(line, "rewritten", where, "the frames are rounded by integer ceil-division")
            else:
                replacements[node] = self._reflect_twin(node, data, depth, indent)
                self.report(line, "rewritten", where, "the reflect padding is a gather of the positions it copies")
            touched.append(owner)
        if not replacements:
            return tree
        return replace_in_statements(tree, replacements, touched)

    def _sites(self, cls: cst.ClassDef, geometry: _Geometry):
        methods = [stmt for stmt in cls.body.body if type(stmt) is cst.FunctionDef]
        for method in methods:
            if type(method.body) is not cst.IndentedBlock:
                continue
            body = list(method.body.body)
            rounding = _rounding(body)
            if rounding is not None:
                missing = [rounding[key] for key in "KPS" if rounding[key] not in geometry.attributes]
                data = {**rounding, **{key + "_name": rounding[key] for key in "KPS"}}
                taken = _bound_names(method) & {rounding[key] for key in "KPS"}
                if missing:
                    data["refused"] = f"`self.{missing[0]}` is not an int of the conv's that `__init__` keeps"
                elif taken or len({rounding[key] for key in "KPS"}) != 3:
                    data["refused"] = "the function binds the names of the attributes the export arm binds"
                else:
                    data.update({key: geometry.attributes[rounding[key]] for key in "KPS"})
                yield "rounding", method, cls, method, data
                continue
            for index, stmt in enumerate(body if geometry.attributes else ()):
                if type(stmt) is cst.If:
                    found = _reflect_padding(body, index)
                    if found is not None:
                        if _bound_names(method) & set(REFLECT_NAMES):
                            found["refused"] = "the function binds `extended` or `positions`"
                        yield "reflect", method, cls, method, {**found, "index": index, "at": stmt}
            if method.name.value != "forward" or not geometry.attributes:
                continue
            for stmt, _, _ in scoped_outside_export_twins(method, (cst.SimpleStatementLine,)):
                if not nodes_in(stmt, lambda node: _self_attribute(node) in geometry.attributes):
                    continue
                exported, refused = _substituted(stmt, geometry)
                data = {"exported": exported}
                if refused:
                    data["refused"] = f"`{refused[0]}` is read as a tensor (not an operand nor a tuple item)"
                yield "read", stmt, cls, method, data

    @staticmethod
    def _read_twin(stmt, exported, depth: int, indent: int) -> cst.If:
        return statement_twin(TWIN, stmt, [exported.with_changes(leading_lines=())], depth, indent)

    @staticmethod
    def _rounding_twin(method: cst.FunctionDef, data: dict, depth: int, indent: int) -> cst.FunctionDef:
        length, frames, ideal = data["length"], data["frames"], data["ideal"]
        k, p, s = (data[key + "_name"] for key in "KPS")
        code = (
            f"{length} = {data['tensor']}.shape[-1]\n"
            + "".join(f"{data[key + '_name']} = {_code(data[key])}\n" for key in "KPS")
            + f"torch._check(abs({length} - {k} + {p}) + {s} < {EXACT_BELOW})\n"
            f"{frames} = -(({length} - {k} + {p}) // -{s})\n"
            f"{ideal} = {frames} * {s} + {k} - {p}\n"
            f"return {ideal} - {length}\n"
        )
        exported = list(cst.parse_module(code).body)
        body = list(method.body.body)
        docstring = body[:1] if m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) else []
        rest = body[len(docstring) :]
        export = formatted_block(exported, depth + 2, indent).body
        eager = eager_arm([stmt for stmt in rest], depth + 2, indent)
        twin = export_twin(ROUNDING_TWIN, eager, rest[0].leading_lines, list(export))
        # the eager arm runs the original statements: unindented back, they are the `else` of the twin
        return method.with_changes(body=method.body.with_changes(body=[*docstring, twin]))

    @staticmethod
    def _reflect_twin(method: cst.FunctionDef, data: dict, depth: int, indent: int) -> cst.FunctionDef:
        """`method` with its reflect padding of a short input (the `if` at `data["index"]` and the three statements
        after it) in the eager arm of a twin whose export arm gathers the same positions."""
        length, most, left, right, tensor = (data[key] for key in ("length", "most", "left", "right", "tensor"))
        code = (
            f"{REFLECT_NAMES[0]} = torch.sym_max({length}, {most} + 1)\n"
            f"{REFLECT_NAMES[1]} = torch.arange(-{left}, {length} + {right}, device={tensor}.device).abs()\n"
            f"{REFLECT_NAMES[1]} = torch.where({REFLECT_NAMES[1]} < {REFLECT_NAMES[0]}, {REFLECT_NAMES[1]}, "
            f"2 * ({REFLECT_NAMES[0]} - 1) - {REFLECT_NAMES[1]})\n"
            f"return {data['pad']}({tensor}, (0, {most} + 1))[..., {REFLECT_NAMES[1]}]\n"
        )
        body, index = list(method.body.body), data["index"]
        tail = body[index:]
        export = formatted_block(list(cst.parse_module(code).body), depth + 2, indent).body
        eager = eager_arm([stmt for stmt in tail], depth + 2, indent)
        twin = export_twin(REFLECT_TWIN, eager, tail[0].leading_lines, list(export))
        return method.with_changes(body=method.body.with_changes(body=[*body[:index], twin]))


def _bound_names(function: cst.FunctionDef) -> set[str]:
    return set(bound_anywhere(function.body.body)) | set(parameter_names(function.params))
