"""Data-dependent `if`s in function bodies: raise-only branches become run-time asserts, single-variable updates
become `torch.cond`, both under `torch.compiler.is_exporting()`; eager keeps the original `if` (byte for byte, except
when a Python condition is split off and the `if` moves one level down).

A *tensor test* is `X.any()`, `X.all()`, `torch.any(X)`, `torch.all(X)` (no other arguments: one element), `not` of
one, and `and`/`or`/`&`/`|` of them. Its tensor form (what export evaluates) writes `and`/`or` as `&`/`|` and
`not T` as `~T` when `T` is known to be a bool tensor (`X` a comparison, `torch.isfinite(...)`, ...) and as
`torch.logical_not(T)` otherwise (`.any()` of a uint8 tensor is uint8, and `~` of it is never zero). A test
`A and T` whose leading conjuncts `A` are plain Python (no tensor test: `x.dtype == torch.float16`) keeps them as an
outer `if A:` around the rewritten structure, which evaluates them exactly as before.

What it rewrites, only in modules under `transformers.models` (or given with no module name, like remote code) that
`import torch`:

- `if T: raise E(...)` (the body is one `raise`, no else) ->
  `if torch.compiler.is_exporting(): torch._assert_async(<not T>, <message>)` `elif T: raise E(...)`. The message is
  the exception's when it is a literal string, else a fixed text naming the exception and the test.
- `if T: <assignments>` (no else) where every assignment targets one name, the *result* (which has a value before the
  `if`), or helper locals whose every use in the function sits in an `if` body that assigns them first ->
  `if torch.compiler.is_exporting():` a nested `def updated_<result>(<result>)` holding the body, then
  `<result> = torch.cond(<T>, updated_<result>, lambda <result>: <result>.clone(), (<result>,))`,
  `elif T:` the original body. Other names reach the branch through the closure.

What it refuses (left unchanged, reported as `refused` with the reason): an `if` with a tensor test and an `else` or
`elif` arm (out of scope of this slice); branches with side effects (attribute or item writes, augmented assignment,
in-place or mutating calls, `logger`/`warnings`/`print`, `return`/`break`/`continue`/`del`, loops, nested blocks);
branches assigning None or a literal, several result variables, or a variable with no value before the `if`; tests
that use `.item()`, `torch.equal`, `.any(dim)`/`.all(dim)` or mix Python and tensor conditions other than as leading
`and` conjuncts. Tests without any of these calls (shape tests such as `x.shape[0] > 1`) are not data-dependent in
this sense and are neither rewritten nor reported. Shared modules (`masking_utils.py`, `cache_utils.py`, ...) are
never changed: they are vendored only when their rewrite is purely additive.
"""

from __future__ import annotations

import json

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from .base import Codemod

LINE_LENGTH = 119
IS_EXPORTING = "torch.compiler.is_exporting()"
_REDUCTIONS = frozenset({"any", "all"})
# Calls that return bool tensors: `~` on them (and on `.any()`/`.all()` of them) is a logical not
_BOOL_FUNCTIONS = frozenset(
    {
        "isfinite",
        "isinf",
        "isnan",
        "isposinf",
        "isneginf",
        "isreal",
        "isin",
        "isclose",
        "signbit",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "logical_not",
        "logical_xor",
        "bool",
    }
)
# Methods that mutate their object (besides torch's in-place `name_` convention)
_MUTATING_METHODS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add", "register_buffer"}
)
_SIDE_EFFECT_OBJECTS = frozenset({"logger", "logging", "warnings"})
# `np.all(...)` and the like compute on Python or numpy values, not on traced tensors
_NOT_TENSOR_MODULES = frozenset({"np", "numpy", "math", "builtins"})


class _Refusal(Exception):
    """Why a candidate `if` is left as it is; caught per site and reported."""


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


class _WithoutComments(cst.CSTTransformer):
    def leave_Comment(self, original_node, updated_node):
        return cst.RemoveFromParent()


def _one_line(node: cst.CSTNode) -> str:
    """`node`'s code on one line, without comments or enclosing parentheses: for findings and messages."""
    if getattr(node, "lpar", None):
        node = node.with_changes(lpar=[], rpar=[])
    return " ".join(_code(node.visit(_WithoutComments())).split())


def _dotted(node: cst.BaseExpression) -> str | None:
    return cst.helpers.get_full_name_for_node(node) if isinstance(node, (cst.Name, cst.Attribute)) else None


def _is_torch_function(func: cst.BaseExpression, names: frozenset[str]) -> bool:
    return isinstance(func, cst.Attribute) and _dotted(func.value) == "torch" and func.attr.value in names


def _data_dependent_call(test: cst.BaseExpression) -> str | None:
    """The first call in `test` that reads tensor values into Python (the candidates of this codemod), as written."""
    for call in m.findall(test, m.Call(func=m.Attribute())):
        attr = call.func.attr.value
        if _dotted(call.func.value) in _NOT_TENSOR_MODULES:
            continue
        if attr in ("any", "all", "item") or _is_torch_function(call.func, frozenset({"equal"})):
            return attr
    return None


def _reduction_operand(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`X` of a one-element reduction `X.any()`, `X.all()`, `torch.any(X)`, `torch.all(X)`; None otherwise."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return None
    if node.func.attr.value not in _REDUCTIONS:
        return None
    if _is_torch_function(node.func, _REDUCTIONS):
        if len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star:
            return node.args[0].value
        return None
    return node.func.value if not node.args else None


def _is_bool_tensor(node: cst.BaseExpression) -> bool:
    """Whether `node` is known to evaluate to a bool tensor (or a Python bool), from its form alone."""
    if isinstance(node, cst.Comparison):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return _is_bool_tensor(node.expression)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
        return _is_bool_tensor(node.left) and _is_bool_tensor(node.right)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if node.func.attr.value in _BOOL_FUNCTIONS:
            return True
        operand = _reduction_operand(node)
        return operand is not None and _is_bool_tensor(operand)
    return False


class _Form:
    """The tensor form of a tensor test: its code, whether it is known to be bool, whether it needs parentheses as
    an operand of `~`/`&`/`|`."""

    def __init__(self, code: str, is_bool: bool, atomic: bool):
        self.code, self.is_bool, self.atomic = code, is_bool, atomic

    def operand(self) -> str:
        return self.code if self.atomic else f"({self.code})"

    def negated(self) -> "_Form":
        if self.is_bool:
            return _Form(f"~{self.operand()}", True, True)
        return _Form(f"torch.logical_not({self.code})", True, True)


def _tensor_form(node: cst.BaseExpression) -> _Form | None:
    """The tensor form of `node` when it is a tensor test, else None."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = _tensor_form(node.expression)
        return None if inner is None else inner.negated()
    if isinstance(node, cst.BooleanOperation) or (
        isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr))
    ):
        left, right = _tensor_form(node.left), _tensor_form(node.right)
        if left is None or right is None:
            return None
        symbol = "&" if isinstance(node.operator, (cst.And, cst.BitAnd)) else "|"
        # `&` binds tighter than `|`: parenthesize every compound operand rather than reason about precedence
        return _Form(f"{left.operand()} {symbol} {right.operand()}", left.is_bool and right.is_bool, False)
    if _reduction_operand(node) is not None:
        return _Form(_one_line(node), _is_bool_tensor(node), True)
    return None


def _conjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`A and B and C` -> [A, B, C] (parenthesized sub-expressions stay whole)."""
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And) and not node.lpar:
        return [*_conjuncts(node.left), *_conjuncts(node.right)]
    return [node]


def _split_test(test: cst.BaseExpression) -> tuple[cst.BaseExpression | None, cst.BaseExpression, _Form]:
    """(leading Python conjuncts or None, the tensor test as written, its tensor form); raises `_Refusal`."""
    whole = _tensor_form(test)
    if whole is not None:
        return None, test, whole
    if isinstance(test, cst.BooleanOperation) and test.lpar:
        test = test.with_changes(lpar=[], rpar=[])  # `if (\n    A\n    and T\n):` splits like `A and T`
    items = _conjuncts(test)
    first = next((i for i, item in enumerate(items) if _data_dependent_call(item) is not None), len(items))
    tensor = items[first:]
    forms = [_tensor_form(item) for item in tensor]
    if 0 < first < len(items) and all(form is not None for form in forms):
        if len(tensor) == 1:
            form, written = forms[0], tensor[0]
        else:
            form = _Form(" & ".join(f.operand() for f in forms), all(f.is_bool for f in forms), False)
            written = cst.parse_expression(" and ".join(_code(item) for item in tensor))
        return _python_part(test, first), written, form
    raise _Refusal(_test_reason(test, items))


def _python_part(test: cst.BooleanOperation, count: int) -> cst.BaseExpression:
    """The node of `A1 and ... and An` inside the left-nested `and` chain `test`."""
    node = test
    while len(_conjuncts(node)) > count:
        node = node.left
    return node


def _test_reason(test: cst.BaseExpression, items: list[cst.BaseExpression]) -> str:
    calls = [call for call in m.findall(test, m.Call(func=m.Attribute()))]
    if any(call.func.attr.value == "item" for call in calls):
        return "`.item()` reads a tensor into a Python number: no tensor form in this slice"
    if any(_is_torch_function(call.func, frozenset({"equal"})) for call in calls):
        return "`torch.equal` returns a Python bool (False on a shape mismatch): no tensor form in this slice"
    for call in calls:
        if call.func.attr.value in _REDUCTIONS and _reduction_operand(call) is None:
            return f"`.{call.func.attr.value}(...)` with arguments is not a one-element test"
    if len(items) > 1:
        first = next(i for i, item in enumerate(items) if _data_dependent_call(item) is not None)
        if any(_data_dependent_call(item) is None for item in items[first:]):
            return "a Python condition follows the tensor test in the `and` chain: it cannot be split off exactly"
    return "the test mixes tensor and Python values in a form this slice does not rewrite (e.g. `or`, a comparison)"


def _literal_message(exc: cst.BaseExpression) -> str | None:
    """The code of the message of `E("literal")` or `E("implicitly" "concatenated")`; None for anything else."""
    if not isinstance(exc, cst.Call) or len(exc.args) != 1 or exc.args[0].keyword or exc.args[0].star:
        return None
    value = exc.args[0].value
    if isinstance(value, cst.SimpleString) and "b" not in value.prefix.lower():
        return _code(value)
    if isinstance(value, cst.ConcatenatedString) and isinstance(value.evaluated_value, str):
        return _code(value)  # inside the call's parentheses: black lays the parts out one a line
    return None


class _Names(cst.CSTVisitor):
    """Every `Name` that denotes a variable (not an attribute or a keyword), in source order."""

    def __init__(self):
        self.found: list[cst.Name] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False


class _NamesBefore(_Names):
    """The variable names that come before `stop` in source order."""

    def __init__(self, stop: cst.CSTNode):
        super().__init__()
        self.stop, self.stopped = stop, False

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.stopped = self.stopped or node is self.stop
        return not self.stopped and super().on_visit(node)


def _names(node: cst.CSTNode) -> list[cst.Name]:
    visitor = _Names()
    node.visit(visitor)
    return visitor.found


def _assigned_first(block: cst.IndentedBlock, name: str) -> bool:
    """Whether the first top-level statement of `block` that mentions `name` is `name = <expression without it>`."""
    for stmt in block.body:
        if not any(n.value == name for n in _names(stmt)):
            continue
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            return False
        assign = stmt.body[0]
        return (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and m.matches(assign.targets[0].target, m.Name(name))
            and not any(n.value == name for n in _names(assign.value))
        )
    return False


def _branch_local(function: cst.FunctionDef, name: str) -> bool:
    """Whether every use of `name` in `function` is inside an `if` body that assigns it first, so no value of it
    flows from one block to another (or out of the branch)."""
    covered = set()
    for node in m.findall(function, m.If()):
        if isinstance(node.body, cst.IndentedBlock) and _assigned_first(node.body, name):
            covered.update(id(n) for n in _names(node.body) if n.value == name)
    return all(id(n) in covered for n in _names(function) if n.value == name)


def _is_side_effect_call(call: cst.Call) -> str | None:
    func = call.func
    dotted = _dotted(func)
    if dotted in ("print", "setattr", "delattr"):
        return f"calls `{dotted}`"
    if isinstance(func, cst.Attribute):
        attr = func.attr.value
        owner = _dotted(func.value)
        if owner and owner.split(".")[-1] in _SIDE_EFFECT_OBJECTS:
            return f"calls `{owner}.{attr}` (a side effect)"
        if attr.endswith("_") and not attr.endswith("__"):
            return f"calls the in-place `.{attr}(...)`"
        if attr in _MUTATING_METHODS:
            return f"calls `.{attr}(...)`, which mutates its object"
        if attr in ("item", "tolist", "nonzero"):
            return f"calls `.{attr}()` (data-dependent) inside the branch"
    return None


def _check_expression(node: cst.BaseExpression) -> None:
    if m.findall(node, m.Call(func=m.Name("super"), args=[])):
        raise _Refusal("the branch calls `super()`, which a nested function cannot")
    for call in m.findall(node, m.Call()):
        reason = _is_side_effect_call(call)
        if reason:
            raise _Refusal(f"the branch {reason}")
    if m.findall(node, m.NamedExpr() | m.Yield() | m.Await()):
        raise _Refusal("the branch has an assignment expression, `yield` or `await`")


_STATEMENT_REASONS = {
    cst.Return: "`return` in the branch",
    cst.Break: "`break` in the branch",
    cst.Continue: "`continue` in the branch",
    cst.Del: "`del` in the branch",
    cst.Global: "`global` in the branch",
    cst.Nonlocal: "`nonlocal` in the branch",
    cst.Pass: "the branch assigns nothing",
    cst.Assert: "`assert` in the branch",
}
_NON_TENSOR_VALUES = (
    cst.Integer,
    cst.Float,
    cst.Imaginary,
    cst.SimpleString,
    cst.ConcatenatedString,
    cst.FormattedString,
    cst.List,
    cst.Tuple,
    cst.Dict,
    cst.Set,
    cst.ListComp,
    cst.DictComp,
    cst.SetComp,
)


def _branch_assignment(statement: cst.BaseSmallStatement) -> cst.Assign:
    """`statement` when it is `name = <expression without side effects>`; raises `_Refusal` otherwise."""
    reason = next((text for kind, text in _STATEMENT_REASONS.items() if isinstance(statement, kind)), None)
    if reason:
        raise _Refusal(reason)
    if isinstance(statement, cst.Raise):
        raise _Refusal("the branch raises after other statements")
    if isinstance(statement, cst.AugAssign):
        raise _Refusal(f"augmented assignment to `{_one_line(statement.target)}` (in place on tensors)")
    if isinstance(statement, cst.AnnAssign):
        raise _Refusal("an annotated assignment in the branch")
    if isinstance(statement, cst.Expr):
        if isinstance(statement.value, cst.Call) and _is_side_effect_call(statement.value):
            raise _Refusal(f"the branch {_is_side_effect_call(statement.value)}")
        raise _Refusal(f"the branch evaluates `{_one_line(statement.value)}` for its side effects")
    if not isinstance(statement, cst.Assign):
        raise _Refusal(f"`{_one_line(statement)}` in the branch")
    for target in statement.targets:
        if isinstance(target.target, cst.Attribute):
            raise _Refusal(f"the branch writes the attribute `{_one_line(target.target)}`")
        if isinstance(target.target, cst.Subscript):
            raise _Refusal(f"the branch assigns to `{_one_line(target.target)}` in place")
        if not isinstance(target.target, cst.Name):
            raise _Refusal(f"the branch unpacks into `{_one_line(target.target)}`")
    if len(statement.targets) != 1:
        raise _Refusal("a chained assignment in the branch")
    _check_expression(statement.value)
    return statement


def _assigned_name(statement: cst.Assign) -> str:
    return statement.targets[0].target.value


def _small_statements(body: cst.BaseSuite) -> list[cst.BaseSmallStatement]:
    """The branch's statements, each a simple statement on its own line; raises `_Refusal` for anything else."""
    if not isinstance(body, cst.IndentedBlock):
        raise _Refusal("the branch is on the `if` line")
    result = []
    for stmt in body.body:
        if isinstance(stmt, (cst.For, cst.While)):
            raise _Refusal("a loop in the branch")
        if not isinstance(stmt, cst.SimpleStatementLine):
            keyword = {cst.If: "if", cst.With: "with", cst.Try: "try"}.get(type(stmt), type(stmt).__name__)
            raise _Refusal(f"a nested `{keyword}` block in the branch")
        result.extend(stmt.body)
    return result


class _Statements:
    """Mixin: visit statements only. `if` statements never hide inside simple statements or expressions, and
    skipping those makes a pass over a 3,000-line modeling file several times cheaper."""

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseExpression)):
            return False
        return super().on_visit(node)


class _Candidates(_Statements, cst.CSTVisitor):
    def __init__(self):
        self.found = False

    def visit_If(self, node: cst.If) -> bool:
        self.found = self.found or _data_dependent_call(node.test) is not None
        return not self.found


class _Rewriter(_Statements, cst.CSTTransformer):
    def __init__(self, codemod: "CondBranches", positions, first_line: int, torch_imported: bool, indent: int):
        self.codemod = codemod
        self.positions = positions  # of the top-level statement being rewritten, which starts at `first_line`
        self.first_line = first_line
        self.torch_imported = torch_imported
        self.indent = indent
        self.functions: list[cst.FunctionDef] = []
        self.depth = 0  # enclosing indented blocks
        self.eager_arms: set[int] = set()  # `elif T:` arms this codemod emitted (a second run leaves them)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original_node, updated_node):
        self.functions.pop()
        return updated_node

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.depth += 1

    def leave_IndentedBlock(self, original_node, updated_node):
        self.depth -= 1
        return updated_node

    def visit_If(self, node: cst.If) -> None:
        if m.matches(node.test, m.Call(func=m.Attribute(attr=m.Name("is_exporting")))) and node.orelse is not None:
            self.eager_arms.add(id(node.orelse))

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        if not self.functions or id(original_node) in self.eager_arms:
            return updated_node
        if _data_dependent_call(original_node.test) is None:
            return updated_node
        line = self.first_line - 1 + self.positions[original_node].start.line
        construct = _one_line(original_node.test)
        try:
            replacement, shape = self._rewrite(original_node)
        except _Refusal as refusal:
            self.codemod.report(line, "refused", construct, str(refusal))
            return updated_node
        self.codemod.report(line, "rewritten", construct, shape)
        return replacement

    def _rewrite(self, node: cst.If) -> tuple[cst.If, str]:
        if not self.torch_imported:
            raise _Refusal("the module does not `import torch`")
        outer, written, form = _split_test(node.test)
        if node.orelse is not None:
            raise _Refusal("the `if` has an `else`/`elif` arm: out of scope of this slice")
        statements = _small_statements(node.body)
        if len(statements) == 1 and isinstance(statements[0], cst.Raise):
            export, shape = [self._assertion(statements[0], node, written, form)], "raise -> torch._assert_async"
        else:
            export, shape = self._select(statements, node, form), "select -> torch.cond"
        if outer is None:
            # The eager arm is the original `if`, byte for byte
            export_arm = _formatted_block(export, self.depth + 1, self.indent)
            eager = node.with_changes(leading_lines=[])
            exporting = cst.If(test=cst.parse_expression(IS_EXPORTING), body=export_arm, orelse=eager)
            return exporting.with_changes(leading_lines=node.leading_lines), shape
        # The Python conjuncts stay outside and the rest moves one level down: new lines, formatted as a whole
        eager = node.with_changes(test=_parenthesized(written), leading_lines=[])
        exporting = cst.If(test=cst.parse_expression(IS_EXPORTING), body=cst.IndentedBlock(body=export), orelse=eager)
        wrapped = cst.If(test=_parenthesized(outer), body=cst.IndentedBlock(body=[exporting]))
        formatted = _formatted_block([wrapped], self.depth, self.indent).body[0]
        return formatted.with_changes(leading_lines=node.leading_lines), shape

    def _assertion(self, statement: cst.Raise, node: cst.If, written: cst.BaseExpression, form: _Form):
        # The message is evaluated in eager only, so what it calls does not matter to export
        if statement.exc is None:
            raise _Refusal("a bare `raise` (re-raise) in the branch")
        message = _literal_message(statement.exc)
        if message is None:
            exc_name = _dotted(statement.exc.func if isinstance(statement.exc, cst.Call) else statement.exc)
            text = f"eager raises {exc_name or 'an exception'} when {_one_line(node.test)}"
            message = json.dumps(text, ensure_ascii=False)
        # The program asserts the negation of the test; `not T` needs no double negation
        if isinstance(written, cst.UnaryOperation) and isinstance(written.operator, cst.Not):
            holds = _tensor_form(written.expression)
        else:
            holds = form.negated()
        return cst.parse_statement(f"torch._assert_async({holds.code}, {message})")

    def _select(self, statements: list[cst.BaseSmallStatement], node: cst.If, form: _Form) -> list[cst.BaseStatement]:
        function = self.functions[-1]
        targets = [(_assigned_name(statement), statement.value) for statement in map(_branch_assignment, statements)]
        names = list(dict.fromkeys(name for name, _ in targets))
        results = [name for name in names if not _branch_local(function, name)]
        if len(results) != 1:
            if not results:
                raise _Refusal("the branch assigns only variables that no code after it reads")
            listed = ", ".join(f"`{name}`" for name in results)
            raise _Refusal(f"the branch assigns several variables that live on after it: {listed}")
        result = results[0]
        for name, value in targets:
            if name == result and _is_non_tensor(value):
                raise _Refusal(f"the branch sets `{result}` to the non-tensor value `{_one_line(value)}`")
        earlier = _non_tensor_value(function, result, node)
        if earlier is not None:
            raise _Refusal(f"`{result}` may be `{earlier}` before the branch, and the other arm would return it")
        if not self._has_value_before(function, result, node):
            raise _Refusal(f"`{result}` has no value before the branch, so the other arm has nothing to return")
        branch = f"updated_{result}"
        if any(n.value == branch for n in _names(function)):
            raise _Refusal(f"the name `{branch}` for the branch function is taken")
        body = list(node.body.body)
        if targets[-1][0] == result and len(body[-1].body) == 1:
            # The last assignment computes the result: return its value
            body[-1] = cst.SimpleStatementLine(
                body=[cst.Return(value=targets[-1][1])], leading_lines=body[-1].leading_lines
            )
        else:
            body.append(cst.parse_statement(f"return {result}"))
        definition = cst.FunctionDef(
            name=cst.Name(branch),
            params=cst.Parameters(params=[cst.Param(cst.Name(result))]),
            body=cst.IndentedBlock(body=body),
        )
        call = f"{result} = torch.cond({form.code}, {branch}, lambda {result}: {result}.clone(), ({result},))"
        return [definition, cst.parse_statement(call)]

    @staticmethod
    def _has_value_before(function: cst.FunctionDef, name: str, node: cst.If) -> bool:
        """Whether `name` occurs (as a parameter, a target or a read) before `node` in source order."""
        visitor = _NamesBefore(node)
        function.visit(visitor)
        return any(found.value == name for found in visitor.found)


def _is_non_tensor(value: cst.BaseExpression) -> bool:
    return isinstance(value, _NON_TENSOR_VALUES) or _dotted(value) in ("None", "True", "False")


def _non_tensor_value(function: cst.FunctionDef, name: str, node: cst.If) -> str | None:
    """A None or literal that `name` is given outside `node` in `function` (a parameter default or an assignment),
    so that it may hold it when the branch is not taken."""
    for param in m.findall(function.params, m.Param(name=m.Name(name))):
        if param.default is not None and _is_non_tensor(param.default):
            return _one_line(param.default)
    inside = {id(n) for n in m.findall(node.body, m.Assign())}
    for assign in m.findall(function, m.Assign() | m.AnnAssign()):
        targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
        if id(assign) in inside or assign.value is None or not any(m.matches(t, m.Name(name)) for t in targets):
            continue
        if _is_non_tensor(assign.value):
            return _one_line(assign.value)
    return None


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` in parentheses, so that its line breaks stay valid wherever it goes (black drops them if redundant)."""
    return cst.parse_expression(f"({_code(node)})")


def _formatted_block(statements: list[cst.BaseStatement], depth: int, indent: int) -> cst.IndentedBlock:
    """`statements` as a block, formatted by black as they would be `depth` levels deep."""
    import black  # only when there is something to emit: importing black costs a tenth of a second

    wrapped = cst.Module(body=[cst.If(test=cst.Name("True"), body=cst.IndentedBlock(body=statements))]).code
    line_length = max(LINE_LENGTH - indent * depth + 4, 40)
    formatted = black.format_str(wrapped, mode=black.Mode(line_length=line_length))
    return cst.parse_module(formatted).body[0].body


def _imports_torch(tree: cst.Module) -> bool:
    """Whether the module runs `import torch` at its top level (also under `if is_torch_available():`)."""
    top_level = [
        stmt
        for outer in tree.body
        for stmt in ([outer] if isinstance(outer, cst.SimpleStatementLine) else [])
        + (list(outer.body.body) if isinstance(outer, (cst.If, cst.Try)) else [])
    ]
    return any(
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Import)
        and any(alias.evaluated_name == "torch" and alias.asname is None for alias in stmt.body[0].names)
        for stmt in top_level
    )


class CondBranches(Codemod):
    NAME = "cond-branches"
    DESCRIPTION = (
        "Data-dependent `if`s: raise-only branches become run-time asserts and single-variable updates torch.cond "
        "under export; eager keeps the original `if`."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return any(marker in source for marker in (".any(", ".all(", ".item()", "torch.equal("))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        module = self.context.full_module_name
        if module is not None and module.startswith("transformers.") and not module.startswith("transformers.models."):
            return tree  # shared modules are vendored only when their rewrite is purely additive
        body, changed, line = [], False, 1 + len(tree.header)
        torch_imported, indent = _imports_torch(tree), len(tree.default_indent.expandtabs(4))
        for stmt in tree.body:
            first_line = line
            line += tree.code_for_node(stmt).count("\n")
            candidates = _Candidates()
            stmt.visit(candidates)
            if not candidates.found:
                body.append(stmt)
                continue
            # Positions cost several times a plain code generation: resolve them for this statement only
            alone = tree.with_changes(header=[], body=[stmt], footer=[])
            positions = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
            new = stmt.visit(_Rewriter(self, positions, first_line, torch_imported, indent))
            changed = changed or new is not stmt
            body.append(new)
        return tree.with_changes(body=body) if changed else tree
