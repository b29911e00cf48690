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
- any other `if T:` (with `else`, `elif` chains, nested `if`s) whose arms only assign local names -> each arm's body
  is emitted ONCE as a local function (`true_fn`, `false_fn`) taking the *operands* (the results bound on every path
  to the `if`, in source order: for an `if` inside an arm, the arm function's own operands and what the arm bound
  before it, never a name bound in another arm of an `elif` chain; everything else, ints and floats included, comes
  through the closure) and returning the *results* (names assigned in an arm that code outside it reads, after it in
  its block included). Which names are bound where is a definite-assignment analysis (`_bindings.bound_at`), not
  source order. Export calls `torch.cond(<tensor form of T>, true_fn, false_fn, operands)`; eager runs the plain `if`
  over the same functions, so eager results are bit-identical and cost one Python call more. With no `else`, the other
  arm is `lambda x: x.clone()` (export only: torch.cond rejects an output that aliases an input). An `elif` becomes a
  nested `if` in `false_fn` (a nested cond). When both arms end in `return`, the rewritten `if` returns their result
  (a tensor or a tuple of tensors), and the functions' operands are only the names an arm rebinds after reading the
  value they had before the `if` (`x = x * 2`; they must be bound on every path to it). A tensor test in the `elif` of
  a Python `if` is rewritten inside an `else`.
- an early return, `if T:` (no `else`) whose body ends in `return`, followed in its block by statements that end in
  `return` on every path: those statements are its `else` arm (that is what they are), under the same arm rules, and
  the pair is rewritten as above (`false_fn` holds them, emitted once). So `if q.shape[1] == 1: return q + k` then
  `return q * k` keeps both arms in the exported program instead of baking in the traced one. Refused with the
  reason prefixed `early return:` like any arm (a loop, a side effect, an input returned unchanged or as a view, ...),
  and when a Python condition is `and`-joined to the test (the statements after the `if` would be the `else` of both).

What it refuses (left unchanged, reported as `refused` with the reason): a test inside `if self.training:` (a
training-only path: an inference export never traces it, so rewriting it only adds code for reviewers); side effects in an arm (attribute or item
writes, augmented assignment, in-place or mutating calls such as `register_buffer`, `logger`/`warnings`/`print`, `del`,
`yield`), `break`/`continue`, loops (a data-dependent trip count), `with`/`try`; a `return` in one arm only; results
that are None or a literal (`scale = 1.0`: torch.cond returns tensors only), a result not assigned on every path of an
arm (it would pass its input through: an alias), a returned value that is an input unchanged or a view of an input or
of a captured tensor, returned tuples of different lengths, a result with no value before a one-armed `if` or with one
on some paths only, a result that an arm reads before assigning it and that is not bound on every path to the `if` (the
arm's function would not see it), a name an arm assigns that a nested function or lambda outside the arms reads or that
is declared `global`/`nonlocal`; a Python condition `and`-joined to the tensor test of an `if` with an `else`;
functions that already use the names `true_fn`/`false_fn`; tests that use `.item()`, `torch.equal`,
`.any(dim)`/`.all(dim)` or mix Python and tensor conditions other than as leading `and` conjuncts.

Size tests are candidates too: `X.shape[i]`/`X.size(i)` (or a name the function binds only from sizes, `q_len =
x.shape[1]`, `batch, q_len, _ = x.shape`) compared with 0, 1 or another size. Export evaluates them on the traced
sizes and bakes the branch in with no guard; as a `torch.cond` on the SymBool the program keeps both arms. Refused:
a size test whose branch only raises, and one `and`-joined to other tests. Known limit (torch 2.13): torch.cond traces
both arms without the predicate, so an arm that is only well-formed under it (`query * key` when `q_len == kv_len`)
or returns slices with `Max(1, s)` strides fails to export. Comparisons of whole-tensor reductions (`x.sum() > t`)
and `.item()` of an `any`/`all` test are tensor tests. Other tests (a parameter `seq_len == 1`) are neither
rewritten nor reported. Shared modules (`modeling_utils.py`, `cache_utils.py`, ...) are never changed: a rewrite
there would vendor the whole module, and the classes they define must stay transformers' own.

Tests the static rules cannot see come from the committed targets file `cond_targets.json`, which
tools/find_cond_targets.py fills from real export failures (the `if` whose test stopped export of a tiny model on a
data-dependent value). A site is keyed by the module's path in the transformers package, the qualname of the
function that holds it (`Class.method`; a nested function is dotted under its parent) and the test on one line, so
it survives line shifts (its `line` is informative). A listed test is a candidate like any tensor test and obeys
the same rules; when no static form fits, a listed single comparison is itself the predicate (a one-element tensor
or a SymBool: torch.cond takes both), and in a listed `A and T` the leading conjuncts stay a Python `if`. A listed
test has no negation right for both kinds, so its raise-only branch is refused. A listed site in a shared module
is refused with that reason; one the module no longer has is reported as a note. Known limit (torch 2.13): an arm
that reads an unbacked SymInt (`count = x.sum().item()`) through the closure fails to export ("Unbacked SymInt
input is not supported"); the predicate may use it. Reading the targets file is the codemod's only input besides
the source: `generate` stays offline and deterministic, and never runs torch.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import libcst as cst
import libcst.matchers as m

from .base import Codemod, formatted_block
from ._statement_codes import NodeLineState
from ._bindings import Binding, bound_anywhere, bound_at, parameter_names, target_names
from ._walks import child_nodes, nodes_in, statement_children, walk_statements

IS_EXPORTING = "torch.compiler.is_exporting()"
TRAINING = m.Attribute(value=m.Name("self"), attr=m.Name("training"))
TRAINING_ONLY = (
    "training-only: the `if self.training:` around it is never traced for inference (export traces the module in eval "
    "mode), so the rewrite would only add code"
)
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


# Reductions of a whole tensor to one element: comparing one gives a one-element bool tensor
_VALUE_REDUCTIONS = frozenset({"sum", "max", "min", "mean", "prod", "amax", "amin", "count_nonzero"})
_ORDER_OPERATORS = (cst.LessThan, cst.GreaterThan, cst.LessThanEqual, cst.GreaterThanEqual, cst.Equal, cst.NotEqual)


class _Bound(NamedTuple):
    """Names a function binds only from sizes (`seq_len = x.shape[1]`) and only from whole-tensor reductions
    (`seq_len = torch.max(position_ids) + 1`, a one-element tensor)."""

    sizes: frozenset[str]
    values: frozenset[str]
    numpy: bool = False  # the function uses numpy: `a.max() > n` may be an array's, not a tensor's
    # Tests (one line, as `_one_line` writes them) that cond_targets.json lists for the function: export stopped on
    # them with a data-dependent error, so they are tensor (or SymBool) tests whatever their form
    listed: frozenset[str] = frozenset()


NO_NAMES = _Bound(frozenset(), frozenset())


class _LazyBound:
    """A function's `_Bound`, each part found on first use: most functions have no `if` that asks, and the searches
    walk the function."""

    def __init__(self, function: cst.FunctionDef, listed: frozenset[str] = frozenset()):
        self.function = function
        self.listed = listed  # known without the walk

    sizes = property(lambda self: _size_and_value_names(self.function)[0])
    values = property(lambda self: _size_and_value_names(self.function)[1])
    numpy = property(lambda self: _bindings(self.function).numpy)


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


def _value_reduction(node: cst.BaseExpression) -> str | None:
    """The name of a whole-tensor reduction to one element, `X.sum()` or `torch.max(X)` (no other arguments)."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return None
    attr = node.func.attr.value
    if attr not in _VALUE_REDUCTIONS or _dotted(node.func.value) in _NOT_TENSOR_MODULES:
        return None
    if _is_torch_function(node.func, _VALUE_REDUCTIONS):
        one = len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star
        return attr if one else None
    return attr if not node.args else None


def _reduction_comparison(node: cst.BaseExpression, shapes: _Bound = NO_NAMES) -> str | None:
    """`A op B` (one operator) where a side is a whole-tensor reduction (or a name bound only from one): a
    one-element bool tensor."""
    if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
        return None
    if not isinstance(node.comparisons[0].operator, _ORDER_OPERATORS):
        return None
    sides = (node.left, node.comparisons[0].comparator)
    reduction = _value_reduction(sides[0]) or _value_reduction(sides[1])
    # Before asking the function's names (a walk over it): without a name or a reduction there is nothing to find
    if reduction is None and not any(isinstance(side, cst.Name) for side in sides):
        return None
    named = next((side.value for side in sides if isinstance(side, cst.Name) and side.value in shapes.values), None)
    # With numpy in the function `a.max() > n` may be an array's; asked last, as its answer needs a walk
    if (named is None and reduction is None) or shapes.numpy:
        return None
    return named if named is not None else reduction


def _is_size(node: cst.BaseExpression, shapes: _Bound) -> bool:
    """`X.shape[i]`, `X.size(i)` (a constant `i`), or a name the function binds only from such sizes."""
    if isinstance(node, cst.Name):
        return node.value in shapes.sizes
    if isinstance(node, cst.Subscript) and m.matches(node.value, m.Attribute(attr=m.Name("shape"))):
        return (
            len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index) and _is_int(node.slice[0].slice.value)
        )
    if isinstance(node, cst.Call) and m.matches(node.func, m.Attribute(attr=m.Name("size"))):
        return len(node.args) == 1 and node.args[0].keyword is None and _is_int(node.args[0].value)
    return False


def _is_int(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, cst.Integer)


def _shape_comparison(node: cst.BaseExpression, shapes: _Bound) -> bool:
    """A size compared with 0, 1 or another size (`x.shape[1] == 1`, `q_len == kv_len`, `seq_len > 1`): export
    evaluates it on the traced sizes and bakes the branch in with no guard (sizes are assumed >= 2)."""
    if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
        return False
    if not isinstance(node.comparisons[0].operator, _ORDER_OPERATORS):
        return False
    left, right = node.left, node.comparisons[0].comparator
    small = lambda side: isinstance(side, cst.Integer) and side.value in ("0", "1")  # noqa: E731
    if small(right):
        return _is_size(left, shapes)
    if small(left):
        return _is_size(right, shapes)
    # A name asks the function's names (a walk over it): the other side first
    first, second = (right, left) if isinstance(left, cst.Name) else (left, right)
    return _is_size(first, shapes) and _is_size(second, shapes)


def _holds_reduction(node: cst.BaseExpression) -> bool:
    """`X.sum()`, `torch.max(X)`, or arithmetic on one (`torch.max(position_ids) + 1`)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract, cst.Multiply)):
        return _holds_reduction(node.left) or _holds_reduction(node.right)
    return _value_reduction(node) is not None


class _Bindings:
    """One walk over every node of a function: the places other than assignments that bind names, and whether it
    uses numpy."""

    def __init__(self, function: cst.FunctionDef):
        self.rebound: set[str] = set()
        self.numpy = False
        pending = [function]
        while pending:
            node = pending.pop()
            kind = type(node)
            if kind in (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr):
                self._rebind(node.target)
            elif kind is cst.Param:
                self._rebind(node.name)
            elif kind is cst.Attribute:
                self.numpy = self.numpy or m.matches(node.value, m.Name("np") | m.Name("numpy"))
            pending.extend(child_nodes(node))

    def _rebind(self, target: cst.CSTNode | None) -> None:
        if target is not None:
            self.rebound.update(name.value for name in m.findall(target, m.Name()))


# Nodes hash by identity: the candidate search and the rewriter ask the same function, each from its own walk
@functools.lru_cache(maxsize=64)
def _bindings(function: cst.FunctionDef) -> _Bindings:
    return _Bindings(function)


@functools.lru_cache(maxsize=64)
def _size_and_value_names(function: cst.FunctionDef) -> tuple[frozenset[str], frozenset[str]]:
    """The names `function` binds only from sizes (`seq_len = x.shape[1]`, `batch, seq_len, _ = x.shape`) and only
    from whole-tensor reductions."""
    sizes, values, others = set(), set(), set()
    # Assignments are statements: a walk of the statements finds them all (in another order: every use is a set)
    for assign in (node for node in walk_statements(function) if type(node) is cst.Assign):
        for target in assign.targets:
            names = [e for e in _target_elements(target.target) if isinstance(e, cst.Name)]
            whole_shape = m.matches(assign.value, m.Attribute(attr=m.Name("shape"))) or m.matches(
                assign.value, m.Call(func=m.Attribute(attr=m.Name("size")), args=[])
            )
            if isinstance(target.target, cst.Name) and _is_size(assign.value, NO_NAMES):
                sizes.add(target.target.value)
            elif isinstance(target.target, cst.Name) and _holds_reduction(assign.value):
                values.add(target.target.value)
            elif isinstance(target.target, (cst.Tuple, cst.List)) and whole_shape:
                sizes.update(name.value for name in names)
            else:
                others.update(name.value for name in names)
    if not sizes and not values:
        return frozenset(), frozenset()  # the other bindings (a walk of every node) could take nothing away
    others |= _bindings(function).rebound
    return frozenset(sizes - others), frozenset(values - others)


def _holds_order_comparison_or_method_call(test: cst.BaseExpression) -> bool:
    """Whether `test` holds what `_data_dependent_call` can answer from: a comparison of one order operator (size
    and reduction comparisons are such), or a call of an attribute."""
    pending = [test]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is cst.Call and isinstance(node.func, cst.Attribute):
            return True
        if kind is cst.Comparison and len(node.comparisons) == 1:
            if isinstance(node.comparisons[0].operator, _ORDER_OPERATORS):
                return True
        pending.extend(child_nodes(node))
    return False


def _source_order_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`child_nodes(node)` in the order a libcst visitor visits them (source order): the fields of a conditional
    expression and of parameters are declared in another order."""
    if type(node) is cst.IfExp:
        return [node.body, node.test, node.orelse]
    if type(node) is cst.Parameters:
        parts = [*node.posonly_params, node.posonly_ind, *node.params, node.star_arg, *node.kwonly_params]
        return [part for part in [*parts, node.star_kwarg] if isinstance(part, cst.Param)]
    return child_nodes(node)


def _comparisons_and_attribute_calls(test: cst.BaseExpression) -> tuple[list[cst.Comparison], list[cst.Call]]:
    """The comparisons and the calls of an attribute in `test`, each in source order (what `m.findall` of
    `m.Comparison()` and of `m.Call(func=m.Attribute())` finds), from one walk of the fields."""
    comparisons, calls = [], []
    pending = [test]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is cst.Comparison:
            comparisons.append(node)
        elif kind is cst.Call and type(node.func) is cst.Attribute:
            calls.append(node)
        pending.extend(reversed(_source_order_children(node)))
    return comparisons, calls


def _data_dependent_call(test: cst.BaseExpression, shapes: _Bound = NO_NAMES) -> str | None:
    """The first call in `test` that reads tensor values into Python (the candidates of this codemod), as written;
    "shape" for a size test that export would specialise; "listed" for a test that cond_targets.json lists."""
    if shapes.listed and _one_line(test) in shapes.listed:
        return "listed"
    if not _holds_order_comparison_or_method_call(test):
        return None  # most tests (flags, `x is None`) have neither: skip the two matcher searches
    comparisons, calls = _comparisons_and_attribute_calls(test)
    for comparison in comparisons:
        if _shape_comparison(comparison, shapes):
            return "shape"
        found = _reduction_comparison(comparison, shapes)
        if found:
            return found
    for call in calls:
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

    def __init__(self, code: str, is_bool: bool, atomic: bool, symbolic: bool = False, listed: bool = False):
        self.code, self.is_bool, self.atomic = code, is_bool, atomic
        self.symbolic = symbolic  # a size test: a SymBool under export, not a tensor
        # a comparison known only from cond_targets.json: a one-element tensor or a SymBool, torch.cond takes both
        self.listed = listed

    def operand(self) -> str:
        return self.code if self.atomic else f"({self.code})"

    def negated(self) -> "_Form":
        if self.listed:
            raise _Refusal(
                "a listed test may be a tensor or a SymBool: no negation (`~`, `torch.sym_not`) is right for both"
            )
        if self.symbolic:
            return _Form(f"torch.sym_not({self.code})", True, True, symbolic=True)
        if self.is_bool:
            return _Form(f"~{self.operand()}", True, True)
        return _Form(f"torch.logical_not({self.code})", True, True)


def _tensor_form(node: cst.BaseExpression, shapes: _Bound = NO_NAMES) -> _Form | None:
    """The tensor form of `node` when it is a tensor test (or a size test: a SymBool), else None."""
    if _shape_comparison(node, shapes):
        return _Form(_one_line(node), True, False, symbolic=True)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = _tensor_form(node.expression, shapes)
        return None if inner is None else inner.negated()
    if isinstance(node, cst.BooleanOperation) or (
        isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr))
    ):
        left, right = _tensor_form(node.left, shapes), _tensor_form(node.right, shapes)
        if left is None or right is None or left.symbolic or right.symbolic or left.listed or right.listed:
            return None  # a SymBool and a tensor do not combine with `&`
        symbol = "&" if isinstance(node.operator, (cst.And, cst.BitAnd)) else "|"
        # `&` binds tighter than `|`: parenthesize every compound operand rather than reason about precedence
        return _Form(f"{left.operand()} {symbol} {right.operand()}", left.is_bool and right.is_bool, False)
    if _reduction_operand(node) is not None:
        return _Form(_one_line(node), _is_bool_tensor(node), True)
    if _reduction_comparison(node, shapes) is not None:
        return _Form(_one_line(node), True, False)
    if m.matches(node, m.Call(func=m.Attribute(attr=m.Name("item")), args=[])):
        # `.item()` of an `any`/`all` test is the same truth value read into Python: drop it
        inner = node.func.value
        if _reduction_operand(inner) is not None:
            return _Form(_one_line(inner), _is_bool_tensor(inner), True)
    if (
        shapes.listed
        and isinstance(node, cst.Comparison)
        and len(node.comparisons) == 1
        and _one_line(node) in shapes.listed
    ):
        return _Form(_one_line(node), True, False, listed=True)
    return None


def _conjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`A and B and C` -> [A, B, C] (parenthesized sub-expressions stay whole)."""
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And) and not node.lpar:
        return [*_conjuncts(node.left), *_conjuncts(node.right)]
    return [node]


def _split_test(
    test: cst.BaseExpression, shapes: _Bound = NO_NAMES
) -> tuple[cst.BaseExpression | None, cst.BaseExpression, _Form]:
    """(leading Python conjuncts or None, the tensor test as written, its tensor form); raises `_Refusal`."""
    whole = _tensor_form(test, shapes)
    if whole is not None:
        return None, test, whole
    if isinstance(test, cst.BooleanOperation) and test.lpar:
        test = test.with_changes(lpar=[], rpar=[])  # `if (\n    A\n    and T\n):` splits like `A and T`
    items = _conjuncts(test)
    first = next((i for i, item in enumerate(items) if _data_dependent_call(item, shapes) is not None), len(items))
    tensor = items[first:]
    forms = [_tensor_form(item, shapes) for item in tensor]
    if len(forms) > 1 and any(form is not None and form.symbolic for form in forms):
        raise _Refusal("a size test `and`-joined to other tests: a SymBool does not combine with `&`")
    if len(forms) > 1 and any(form is not None and form.listed for form in forms):
        raise _Refusal(
            "a listed test `and`-joined to other tests: it may be a SymBool, which does not combine with `&`"
        )
    if 0 < first < len(items) and all(form is not None for form in forms):
        if len(tensor) == 1:
            form, written = forms[0], tensor[0]
        else:
            form = _Form(" & ".join(f.operand() for f in forms), all(f.is_bool for f in forms), False)
            written = cst.parse_expression(" and ".join(_code(item) for item in tensor))
        return _python_part(test, first), written, form
    raise _Refusal(_test_reason(test, items, shapes))


def _python_part(test: cst.BooleanOperation, count: int) -> cst.BaseExpression:
    """The node of `A1 and ... and An` inside the left-nested `and` chain `test`."""
    node = test
    while len(_conjuncts(node)) > count:
        node = node.left
    return node


def _test_reason(test: cst.BaseExpression, items: list[cst.BaseExpression], shapes: _Bound) -> str:
    calls = [call for call in m.findall(test, m.Call(func=m.Attribute()))]
    if any(call.func.attr.value == "item" for call in calls):
        return "`.item()` reads a tensor into a Python number: no tensor form in this slice"
    if any(_is_torch_function(call.func, frozenset({"equal"})) for call in calls):
        return "`torch.equal` returns a Python bool (False on a shape mismatch): no tensor form in this slice"
    for call in calls:
        if call.func.attr.value in _REDUCTIONS and _reduction_operand(call) is None:
            return f"`.{call.func.attr.value}(...)` with arguments is not a one-element test"
    if len(items) > 1:
        first = next(i for i, item in enumerate(items) if _data_dependent_call(item, shapes) is not None)
        if any(_data_dependent_call(item, shapes) is None for item in items[first:]):
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


@functools.lru_cache(maxsize=1024)  # `_branch_local` asks the same blocks and function once per result name
def _names(node: cst.CSTNode) -> tuple[cst.Name, ...]:
    visitor = _Names()
    node.visit(visitor)
    return tuple(visitor.found)


@functools.lru_cache(maxsize=64)
def _ifs(function: cst.FunctionDef) -> tuple[cst.If, ...]:
    return tuple(m.findall(function, m.If()))


def _assigned_first(block: cst.IndentedBlock, name: str) -> bool:
    """Whether the first top-level statement of `block` that mentions `name` is `name = <expression without it>`
    (or an unpacking into names among which it is, `scores, name = torch.topk(...)`)."""
    for stmt in block.body:
        if not any(n.value == name for n in _names(stmt)):
            continue
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            return False
        assign = stmt.body[0]
        return (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and _unpacks_into_names(assign.targets[0].target)
            and name in target_names(assign.targets[0].target)
            and not any(n.value == name for n in _names(assign.value))
        )
    return False


def _unpacks_into_names(target: cst.BaseExpression) -> bool:
    """`a`, `a, b`, `(a, [b, *c])`: a target that binds names only (no attribute or item)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return all(_unpacks_into_names(element.value) for element in target.elements)
    if isinstance(target, cst.StarredElement):
        return _unpacks_into_names(target.value)
    return isinstance(target, cst.Name)


def _if_parts(node: cst.If) -> tuple[list[cst.BaseExpression], list[cst.BaseSuite]]:
    """The tests and the blocks of an `if`/`elif`/`else` chain, in source order."""
    tests, blocks = [node.test], [node.body]
    if isinstance(node.orelse, cst.Else):
        blocks.append(node.orelse.body)
    elif isinstance(node.orelse, cst.If):
        more_tests, more_blocks = _if_parts(node.orelse)
        tests, blocks = tests + more_tests, blocks + more_blocks
    return tests, blocks


def _branch_local(function: cst.FunctionDef, name: str, site: cst.If) -> bool:
    """Whether every use of `name` in `function` is inside an `if`/`else` block that assigns it first, so no value
    of it flows from one block to another (or out of the branch `site`). A block around `site` does not count: the
    statements after `site` in it read what `site` assigned (`z = x * 2`, then `if T: z = z / 2`, then `y = z`)."""
    around = _blocks_around(function, site)
    covered = set()
    for node in _ifs(function):
        blocks = [node.body] + ([node.orelse.body] if isinstance(node.orelse, cst.Else) else [])
        for block in blocks:
            if isinstance(block, cst.IndentedBlock) and id(block) not in around and _assigned_first(block, name):
                covered.update(id(n) for n in _names(block) if n.value == name)
    return all(id(n) in covered for n in _names(function) if n.value == name)


def _blocks_around(function: cst.FunctionDef, site: cst.CSTNode) -> frozenset[int]:
    """The ids of the blocks of `function` that hold `site` (at any depth)."""
    pending = [(function, ())]
    while pending:
        node, blocks = pending.pop()
        if node is site:
            return frozenset(blocks)
        if isinstance(node, cst.IndentedBlock):
            blocks = (*blocks, id(node))
        pending.extend((child, blocks) for child in statement_children(node))
    return frozenset()


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


def _check_small_statement(statement: cst.BaseSmallStatement, returns: bool) -> None:
    """Raises `_Refusal` unless `statement` is free of side effects: `name = ...` (or unpacking into names), `pass`,
    and `return ...` where the branch becomes a function that returns (`returns`)."""
    if isinstance(statement, cst.Return) and returns:
        if statement.value is not None:
            _check_expression(statement.value)
        return
    if isinstance(statement, cst.Pass):
        return
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
    if len(statement.targets) != 1:
        raise _Refusal("a chained assignment in the branch")
    target = statement.targets[0].target
    for element in _target_elements(target):
        if isinstance(element, cst.Attribute):
            raise _Refusal(f"the branch writes the attribute `{_one_line(element)}`")
        if isinstance(element, cst.Subscript):
            raise _Refusal(f"the branch assigns to `{_one_line(element)}` in place")
        if not isinstance(element, cst.Name):
            raise _Refusal(f"the branch unpacks into `{_one_line(target)}`")
    _check_expression(statement.value)


def _target_elements(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`a` -> [a]; `a, b` and `(a, b)` -> [a, b]; starred or nested unpacking stays whole (and is refused)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [element.value if isinstance(element, cst.Element) else element for element in target.elements]
    return [target]


def _check_block(block: cst.BaseSuite, returns: bool) -> None:
    """Raises `_Refusal` unless every statement of `block` (nested `if`s and the branch functions of already
    rewritten inner `if`s included) is free of side effects and of control flow that `torch.cond` cannot take."""
    if not isinstance(block, cst.IndentedBlock):
        raise _Refusal("the branch is on the `if` line")
    for stmt in block.body:
        if isinstance(stmt, (cst.For, cst.While)):
            raise _Refusal("a loop in the branch")
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                _check_small_statement(small, returns)
        elif isinstance(stmt, cst.If):
            tests, blocks = _if_parts(stmt)
            for test in tests:
                _check_expression(test)
            for inner in blocks:
                _check_block(inner, returns)
        elif isinstance(stmt, cst.FunctionDef) and not stmt.decorators:
            _check_block(stmt.body, returns=True)  # a branch function of a nested `if` this codemod rewrote
        else:
            keyword = {cst.With: "with", cst.Try: "try", cst.FunctionDef: "def", cst.ClassDef: "class"}
            raise _Refusal(f"a nested `{keyword.get(type(stmt), type(stmt).__name__)}` block in the branch")


def _assignments(block: cst.BaseSuite) -> list[cst.Assign]:
    """The assignments of `block` and of its nested `if`s (not of nested functions), in source order."""
    found = []
    for stmt in block.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            found.extend(small for small in stmt.body if isinstance(small, cst.Assign))
        elif isinstance(stmt, cst.If):
            for inner in _if_parts(stmt)[1]:
                found.extend(_assignments(inner))
    return found


# Methods and attributes whose result may share storage with the tensor they are called on
_VIEW_METHODS = frozenset(
    "as_strided bfloat16 bool chunk contiguous detach diagonal double expand expand_as flatten float half int long "
    "movedim narrow permute reshape reshape_as select split squeeze swapaxes t to transpose type type_as unbind "
    "unflatten unsqueeze view view_as".split()
)
_VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})


def _view_root(node: cst.BaseExpression) -> str | None:
    """The name whose storage `node` may share: `x`, `x[:, -1:]`, `x.transpose(1, 2).float()`, `x.T`,
    `torch.narrow(x, ...)`; else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Subscript):
        return _view_root(node.value)
    if isinstance(node, cst.Attribute) and node.attr.value in _VIEW_ATTRIBUTES:
        return _view_root(node.value)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _VIEW_METHODS:
        if isinstance(node.func.value, cst.Name) and node.func.value.value == "torch":  # torch.narrow(x, ...)
            return _first_argument_root(node)
        return _view_root(node.func.value)
    return None


def _first_argument_root(call: cst.Call) -> str | None:
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    return _view_root(positional[0].value) if positional else None


def _views_of_inputs(block: cst.BaseSuite) -> dict[str, str]:
    """Names that may leave `block` as a view of (or the same tensor as) a name the block did not compute, e.g.
    `hidden_states = hidden_states[:, -1:]`: torch.cond rejects an output that aliases an input. A later plain
    assignment at the block's top level clears a name; one in a nested `if` cannot (it may not run)."""
    views, computed = {}, set()

    def assign(node: cst.Assign, certain: bool) -> None:
        names = [e.value for t in node.targets for e in _target_elements(t.target) if isinstance(e, cst.Name)]
        root = _view_root(node.value)
        if root is None and isinstance(node.value, cst.Call) and isinstance(node.value.func, cst.Name):
            # `x = slice_logits_to_keep(x, n)`: a helper that transforms its argument may return (a view of) it
            first = _first_argument_root(node.value)
            root = first if first in names else None
        for name in names:
            if root is not None and (root in views or root not in computed):
                views[name] = views.get(root, root)
            elif certain:
                views.pop(name, None)
        computed.update(names)

    for stmt in block.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign):
                    assign(small, certain=True)
        elif isinstance(stmt, cst.If):
            for inner in _if_parts(stmt)[1]:
                for node in _assignments(inner):
                    assign(node, certain=False)
    return views


def _assigned_names(block: cst.BaseSuite) -> list[str]:
    names = []
    for assign in _assignments(block):
        names.extend(e.value for t in assign.targets for e in _target_elements(t.target) if isinstance(e, cst.Name))
    return list(dict.fromkeys(names))


def _always_assigned(block: cst.BaseSuite) -> set[str]:
    """The names that every path through `block` assigns."""
    names = set()
    for stmt in block.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign):
                    names.update(
                        e.value for t in small.targets for e in _target_elements(t.target) if isinstance(e, cst.Name)
                    )
        elif isinstance(stmt, cst.If) and _has_else(stmt):
            names.update(set.intersection(*(_always_assigned(inner) for inner in _if_parts(stmt)[1])))
    return names


def _has_else(node: cst.If) -> bool:
    return isinstance(node.orelse, cst.Else) or (isinstance(node.orelse, cst.If) and _has_else(node.orelse))


def _ends_in_return(block: cst.BaseSuite) -> bool:
    """Whether every path through `block` ends in a `return`."""
    if not isinstance(block, cst.IndentedBlock) or not block.body:
        return False
    last = block.body[-1]
    if isinstance(last, cst.SimpleStatementLine):
        return isinstance(last.body[-1], cst.Return)
    if isinstance(last, cst.If) and _has_else(last):
        return all(_ends_in_return(inner) for inner in _if_parts(last)[1])
    return False


def _returned_values(block: cst.BaseSuite) -> list[tuple[cst.Return, cst.BaseSuite]]:
    """The `return` statements of `block` and of its nested `if`s, each with the block that holds it."""
    found = []
    for stmt in block.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            found.extend((small, block) for small in stmt.body if isinstance(small, cst.Return))
        elif isinstance(stmt, cst.If):
            for inner in _if_parts(stmt)[1]:
                found.extend(_returned_values(inner))
    return found


def _original_arms(node: cst.If) -> list[list[cst.BaseStatement]]:
    """The statements of each arm of `node` as written; an `elif` is one `if` statement in the `else` arm."""
    arms = [list(node.body.body)]
    if isinstance(node.orelse, cst.Else):
        arms.append(list(node.orelse.body.body))
    elif isinstance(node.orelse, cst.If):
        arms.append([node.orelse])
    return arms


def _reads_before_assigning(statements: list[cst.BaseStatement], name: str) -> bool:
    """Whether a path through `statements` (what an arm may hold: simple statements and `if`s) reads `name` before
    it assigns it, i.e. reads the value `name` had before the arm."""
    for stmt in statements:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                read = small.value if isinstance(small, (cst.Assign, cst.Return)) else small
                if read is not None and any(n.value == name for n in _names(read)):
                    return True
                if isinstance(small, cst.Assign) and any(
                    name in target_names(target.target) for target in small.targets
                ):
                    return False
        elif isinstance(stmt, cst.If):
            tests, blocks = _if_parts(stmt)
            if any(n.value == name for test in tests for n in _names(test)):
                return True
            if any(_reads_before_assigning(list(block.body), name) for block in blocks):
                return True
            if name in _always_assigned(cst.IndentedBlock(body=[stmt])):
                return False
        elif any(n.value == name for n in _names(stmt)):
            return True  # not an arm's statement (refused anyway): assume it reads
    return False


def _check_unbound_result(name: str, bound: Binding, arms: list[list[cst.BaseStatement]], one_armed: bool) -> None:
    """Raises `_Refusal` unless result `name`, which is not bound on every path to the `if` (so no operand), is
    right without one: an arm function assigns it, so it is local there, and reading it before must not happen."""
    some_paths = name in bound.possible
    where = "a value before the branch on some paths only" if some_paths else "no value before the branch"
    if one_armed:
        if some_paths:
            raise _Refusal(
                f"`{name}` has a value before the branch on some paths only, so the other arm may have nothing to "
                "return"
            )
        raise _Refusal(f"`{name}` has no value before the branch, so the other arm has nothing to return")
    if any(_reads_before_assigning(arm, name) for arm in arms):
        raise _Refusal(
            f"an arm reads `{name}` before assigning it, and `{name}` has {where}: the arm's function would not "
            "see it"
        )


def _check_names_stay_local(function: cst.FunctionDef, arms: list[list[cst.BaseStatement]], names: list[str]) -> None:
    """Raises `_Refusal` when a name the arms assign is not a plain local of `function`: declared `global` or
    `nonlocal`, or read by a nested function or lambda defined outside the arms, which would keep reading the
    function's variable while the arm's function assigns its own."""
    inside = {id(node) for arm in arms for stmt in arm for node in nodes_in(stmt, _is_scope)}
    declared = set()
    for node in nodes_in(function.body, lambda n: type(n) in (cst.Global, cst.Nonlocal, cst.FunctionDef, cst.Lambda)):
        if type(node) in (cst.Global, cst.Nonlocal):
            declared.update(item.name.value for item in node.names)
        elif id(node) not in inside:
            own = set(parameter_names(node.params))
            if type(node) is cst.FunctionDef:
                own |= bound_anywhere(node.body.body if isinstance(node.body, cst.IndentedBlock) else [])
            for name in names:
                if name not in own and any(n.value == name for n in _names(node)):
                    raise _Refusal(
                        f"`{name}` is read by a nested function outside the branch, which would not see the arm's "
                        "assignment"
                    )
    for name in names:
        if name in declared:
            raise _Refusal(f"`{name}` is declared `global` or `nonlocal`: the arm's function would bind a local")


def _is_scope(node: cst.CSTNode) -> bool:
    return type(node) in (cst.FunctionDef, cst.Lambda)


class _Statements:
    """Mixin: visit statements only. `if` statements never hide inside simple statements or expressions, and
    skipping those makes a pass over a 3,000-line modeling file several times cheaper."""

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseExpression)):
            return False
        return super().on_visit(node)


_NOT_STATEMENTS: dict[type, bool] = (
    {}
)  # type -> whether the candidate search skips it (by exact type: see base.descends)


def _has_candidates(
    stmt: cst.CSTNode, listed: dict[str, frozenset[str]], scopes: tuple[str, ...] = (), shapes: _Bound = NO_NAMES
) -> bool:
    """Whether an `if` in `stmt` (statements only, as `_Statements` visits them) has a candidate test, each test
    read with the names of its innermost enclosing function (`scopes`: the enclosing classes and functions, whose
    dotted name keys the tests `listed` in cond_targets.json)."""
    kind = type(stmt)
    skipped = _NOT_STATEMENTS.get(kind)
    if skipped is None:
        skipped = _NOT_STATEMENTS[kind] = issubclass(kind, (cst.SimpleStatementLine, cst.BaseExpression))
    if skipped:
        return False
    if kind is cst.If and any(_data_dependent_call(test, shapes) for test in _if_parts(stmt)[0]):
        return True
    if kind is cst.ClassDef or kind is cst.FunctionDef:
        scopes = (*scopes, stmt.name.value)
    if kind is cst.FunctionDef:
        shapes = _LazyBound(stmt, listed.get(".".join(scopes), frozenset()))
    return any(_has_candidates(child, listed, scopes, shapes) for child in statement_children(stmt))


@dataclass
class _Scopes:
    """Mixin: the dotted name of the enclosing classes and functions (`Model._pad1d`), which keys the sites of
    cond_targets.json, and a `_LazyBound` for each enclosing function with the tests listed for it."""

    def __init__(self, listed: dict[str, frozenset[str]]):
        self.listed = listed
        self.scopes: list[str] = []
        self.shapes: list[_Bound] = [NO_NAMES]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, *updated):
        self.scopes.pop()
        return updated[0] if updated else None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node.name.value)
        self.shapes.append(_LazyBound(node, self.listed.get(".".join(self.scopes), frozenset())))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, *updated):
        self.scopes.pop()
        self.shapes.pop()
        return updated[0] if updated else None


class _Rewriter(_Scopes, _Statements, cst.CSTTransformer):
    def __init__(
        self,
        codemod: "CondBranches",
        if_lines,
        first_line: int,
        torch_imported: bool,
        indent: int,
        listed: dict[str, frozenset[str]],
    ):
        super().__init__(listed)
        self.codemod = codemod
        self.if_lines = if_lines  # id(if) -> its line in the top-level statement being rewritten
        self.first_line = first_line  # where that statement starts
        self.torch_imported = torch_imported
        self.indent = indent
        self.functions: list[cst.FunctionDef] = []
        self.depth = 0  # enclosing indented blocks
        self.eager_arms: set[int] = set()  # `elif T:` arms this codemod emitted (a second run leaves them)
        self.elifs: set[int] = set()  # `elif` arms: rewritten as part of the `if` that holds them
        self.nested_originals: dict[int, cst.If] = {}  # an `elif` made a standalone `if` -> the node as written
        self.rewrites = 0  # `if`s replaced
        # `if T: ...; return A` (no else) followed in its block by statements that end in `return`: the ids of those
        # `if`s as written, and (by the id of the node the visit leaves in the block) those rewritten with the block
        self.early_return_ifs: set[int] = set()
        self.deferred: dict[int, cst.If] = {}
        self.training_bodies: set[int] = set()  # the bodies of `if self.training:` (and `if self.training and ...:`)
        self.training = 0  # how many of them enclose the statements being visited

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        super().visit_FunctionDef(node)
        self.functions.append(node)

    def leave_FunctionDef(self, original_node, updated_node):
        super().leave_FunctionDef(original_node, updated_node)
        self.functions.pop()
        return updated_node.with_changes(body=_blank_before_branch_function(updated_node.body, blank=False))

    def leave_Else(self, original_node, updated_node):
        return updated_node.with_changes(body=_blank_before_branch_function(updated_node.body, blank=True))

    def leave_For(self, original_node, updated_node):
        return updated_node.with_changes(body=_blank_before_branch_function(updated_node.body, blank=True))

    def leave_While(self, original_node, updated_node):
        return updated_node.with_changes(body=_blank_before_branch_function(updated_node.body, blank=True))

    def leave_With(self, original_node, updated_node):
        return updated_node.with_changes(body=_blank_before_branch_function(updated_node.body, blank=True))

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.depth += 1
        self.training += id(node) in self.training_bodies
        body = node.body
        for index in range(len(body) - 1):
            stmt = body[index]
            if type(stmt) is cst.If and stmt.orelse is None and _ends_in_return(stmt.body):
                if _ends_in_return(cst.IndentedBlock(body=body[index + 1 :])):
                    self.early_return_ifs.add(id(stmt))

    def leave_IndentedBlock(self, original_node, updated_node):
        if self.deferred:
            updated_node = self._early_returns(original_node, updated_node)
        self.depth -= 1
        self.training -= id(original_node) in self.training_bodies
        return _blank_lines_before_branch_functions(updated_node)

    def _early_returns(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        """`updated` with each early return of it that `leave_If` deferred rewritten together with the statements
        after it, its `else` arm; the last first, so an earlier one's arm holds a later one rewritten."""
        body, changed = list(updated.body), False
        for index in range(len(body) - 1, -1, -1):
            written = self.deferred.pop(id(body[index]), None)
            if written is None:
                continue
            position = next(i for i, stmt in enumerate(original.body) if stmt is written)
            replacement = self._early_return(written, body[index], original.body[position + 1 :], body[index + 1 :])
            if replacement is not None:
                body[index:] = replacement
                changed = True
        return updated.with_changes(body=body) if changed else updated

    def _early_return(self, written: cst.If, updated: cst.If, tail_written, tail_updated):
        """The statements that replace an early return and the rest of its block (`if T: ...; return A` then
        `...; return B` is `if T: ...; return A` `else: ...; return B`), or None (refused and reported)."""
        line = self.first_line - 1 + self.if_lines[id(written)]
        construct = _one_line(written.test)
        original = written.with_changes(orelse=cst.Else(body=cst.IndentedBlock(body=list(tail_written))))
        self.nested_originals[id(original)] = written
        tail = list(tail_updated)
        # The blank lines that set the statements apart from the `if` would open `false_fn`; comments stay
        tail[0] = tail[0].with_changes(leading_lines=[line for line in tail[0].leading_lines if line.comment])
        whole = updated.with_changes(orelse=cst.Else(body=cst.IndentedBlock(body=tail)))
        try:
            if _split_test(written.test, self.shapes[-1])[0] is not None:
                raise _Refusal(
                    "a Python condition `and`-joined to the tensor test: the statements after the `if` run when "
                    "either is false, so they would be the `else` arm of both"
                )
            statements, _ = self._rewrite(original, whole)
            formatted = formatted_block(statements, self.depth, self.indent).body
        except _Refusal as refusal:
            why = self.codemod.site_whys.get((".".join(self.scopes), construct))
            reason = f"early return: {refusal}"
            self.codemod.report(line, "refused", construct, f"{reason}; {why}" if why else reason)
            return None
        self.codemod.report(line, "rewritten", construct, "early return -> torch.cond")
        self.rewrites += 1
        return [formatted[0].with_changes(leading_lines=updated.leading_lines), *formatted[1:]]

    def visit_If(self, node: cst.If) -> None:
        if m.matches(node.test, m.Call(func=m.Attribute(attr=m.Name("is_exporting")))) and node.orelse is not None:
            self.eager_arms.add(id(node.orelse))
        if isinstance(node.orelse, cst.If):
            self.elifs.add(id(node.orelse))  # rewritten with the `if` that holds it, as the nested `else` of a cond
        if m.matches(node.test, TRAINING | m.BooleanOperation(left=TRAINING, operator=m.And())):
            self.training_bodies.add(id(node.body))

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        updated_node = updated_node.with_changes(body=_blank_before_branch_function(updated_node.body, blank=True))
        if self.shapes[-1].listed:
            qualname = ".".join(self.scopes)
            for test in _if_parts(original_node)[0]:
                self.codemod.seen_sites.add((qualname, _one_line(test)))
        if not self.functions or id(original_node) in self.eager_arms or id(original_node) in self.elifs:
            return updated_node
        if m.matches(original_node.test, m.Call(func=m.Attribute(attr=m.Name("is_exporting")))):
            return updated_node  # emitted by a previous run
        tests = _if_parts(original_node)[0]
        shapes = self.shapes[-1]
        if all(_data_dependent_call(test, shapes) is None for test in tests):
            return updated_node
        site = original_node if _data_dependent_call(original_node.test, shapes) is not None else original_node.orelse
        if site is original_node and id(original_node) in self.early_return_ifs and not self.training:
            # The statements after it are its `else` arm: rewritten with the block that holds them all
            self.deferred[id(updated_node)] = original_node
            return updated_node
        line = self.first_line - 1 + self.if_lines[id(site)]
        construct = _one_line(site.test)
        if self.training:
            self.codemod.report(line, "refused", construct, TRAINING_ONLY)
            return updated_node
        try:
            if site is not original_node:
                # A Python `if` whose `elif` chain holds a tensor test: the chain after it becomes a nested `else`
                replacement, shape = self._python_if_with_tensor_elif(original_node, updated_node)
            else:
                statements, shape = self._rewrite(original_node, updated_node)
                formatted = formatted_block(statements, self.depth, self.indent).body
                first = formatted[0].with_changes(leading_lines=original_node.leading_lines)
                replacement = cst.FlattenSentinel([first, *formatted[1:]])
        except _Refusal as refusal:
            # A listed site may say why no other equivalent form exists either (reviewed by hand)
            why = self.codemod.site_whys.get((".".join(self.scopes), construct))
            self.codemod.report(line, "refused", construct, f"{refusal}; {why}" if why else str(refusal))
            return updated_node
        self.codemod.report(line, "rewritten", construct, shape)
        self.rewrites += 1
        return replacement

    def _python_if_with_tensor_elif(self, original: cst.If, updated: cst.If) -> tuple[cst.If, str]:
        inner_original = cst.If(test=original.orelse.test, body=original.orelse.body, orelse=original.orelse.orelse)
        inner_updated = cst.If(test=updated.orelse.test, body=updated.orelse.body, orelse=updated.orelse.orelse)
        if _data_dependent_call(inner_original.test, self.shapes[-1]) is None:
            raise _Refusal("a tensor test in a later `elif` of a Python `if` chain: out of scope")
        self.nested_originals[id(inner_original)] = original.orelse
        statements, shape = self._rewrite(inner_original, inner_updated)
        else_block = formatted_block(statements, self.depth + 1, self.indent)
        if len(else_block.body) == 1 and isinstance(else_block.body[0], cst.If):
            return updated.with_changes(orelse=else_block.body[0]), shape  # stays an `elif` chain
        return updated.with_changes(orelse=cst.Else(body=else_block)), shape

    def _rewrite(self, original: cst.If, updated: cst.If) -> tuple[list[cst.BaseStatement], str]:
        """The statements that replace `updated` (the `if` with its nested `if`s already rewritten); `original` is
        the same `if` in the function as written, for the analysis of names."""
        if not self.torch_imported:
            raise _Refusal("the module does not `import torch`")
        outer, written, form = _split_test(original.test, self.shapes[-1])
        if form.listed:
            _check_no_unbacked_int_in_arms(self.functions[-1], written, original)
        if outer is not None and original.orelse is not None:
            raise _Refusal("a Python condition joined to the tensor test, with an `else`: it would run both ways")
        body = updated.body
        one_raise = (
            original.orelse is None
            and isinstance(body, cst.IndentedBlock)
            and len(body.body) == 1
            and isinstance(body.body[0], cst.SimpleStatementLine)
            and len(body.body[0].body) == 1
            and isinstance(body.body[0].body[0], cst.Raise)
        )
        if one_raise and form.symbolic:
            raise _Refusal("a size test whose branch only raises: export assumes sizes >= 2 (torch._check is the fix)")
        if one_raise:
            export = [self._assertion(body.body[0].body[0], original, written, form)]
            eager = original.with_changes(test=_parenthesized(written) if outer is not None else original.test)
            exporting = cst.If(test=cst.parse_expression(IS_EXPORTING), body=cst.IndentedBlock(body=export))
            statements, shape = [exporting.with_changes(orelse=eager.with_changes(leading_lines=[]))], "raise"
            shape = "raise -> torch._assert_async"
        else:
            statements, shape = self._branches(original, updated, written, form)
        if outer is None:
            return statements, shape
        # The Python conjuncts stay outside and evaluate exactly as before
        return [cst.If(test=_parenthesized(outer), body=cst.IndentedBlock(body=statements))], shape

    def _false_block(self, original: cst.If, updated: cst.If) -> cst.IndentedBlock | None:
        """The `else` arm as a block; an `elif` becomes a nested `if` (rewritten when its test is a tensor test)."""
        if updated.orelse is None:
            return None
        if isinstance(updated.orelse, cst.Else):
            return updated.orelse.body
        inner_original = cst.If(test=original.orelse.test, body=original.orelse.body, orelse=original.orelse.orelse)
        inner_updated = cst.If(test=updated.orelse.test, body=updated.orelse.body, orelse=updated.orelse.orelse)
        if _data_dependent_call(inner_original.test, self.shapes[-1]) is None:
            return cst.IndentedBlock(body=[inner_updated])
        self.nested_originals[id(inner_original)] = original.orelse
        return cst.IndentedBlock(body=self._rewrite(inner_original, inner_updated)[0])

    def _branches(self, original: cst.If, updated: cst.If, written: cst.BaseExpression, form: _Form):
        function = self.functions[-1]
        true_block, false_block = updated.body, self._false_block(original, updated)
        returning = false_block is not None and _ends_in_return(true_block) and _ends_in_return(false_block)
        _check_block(true_block, returns=returning)
        if false_block is not None:
            _check_block(false_block, returns=returning)
        for name in ("true_fn", "false_fn"):
            if any(n.value == name for n in _names(function)):
                raise _Refusal(f"the name `{name}` for a branch function is taken")
        if returning:
            return self._returning(original, true_block, false_block, written, form)
        if _returned_values(true_block):
            raise _Refusal("`return` in the branch")
        if false_block is not None and _returned_values(false_block):
            raise _Refusal("`return` in the `else` arm only")
        blocks = [true_block] + ([false_block] if false_block is not None else [])
        names = list(dict.fromkeys(name for block in blocks for name in _assigned_names(block)))
        anchor = self.nested_originals.get(id(original), original)
        results = [name for name in names if not _branch_local(function, name, anchor)]
        if not results:
            raise _Refusal("the branch assigns only variables that no code after it reads")
        for block in blocks:
            for assign in _assignments(block):
                targets = [e for t in assign.targets for e in _target_elements(t.target)]
                if _is_non_tensor(assign.value) and any(
                    m.matches(t, m.Name()) and t.value in results for t in targets
                ):
                    raise _Refusal(
                        f"the branch sets `{_one_line(targets[0])}` to the non-tensor value "
                        f"`{_one_line(assign.value)}`"
                    )
        for block in blocks:
            views = _views_of_inputs(block)
            for name in results:
                if name in views:
                    raise _Refusal(
                        f"the branch may leave `{name}` a view of `{views[name]}`, which torch.cond cannot alias"
                    )
        arms = _original_arms(original)
        _check_names_stay_local(function, arms, names)
        # The operands are the results bound on every path to the `if` (inside an arm that becomes a function: the
        # arm's parameters and what it bound before), not those that merely occur before it in the source
        bound = bound_at(function, anchor)
        operands = [name for name in results if name in bound.definite]
        for name in results:
            missing = [block for block in blocks if name not in _always_assigned(block)]
            if name not in bound.definite:
                _check_unbound_result(name, bound, arms, one_armed=false_block is None)
            if false_block is None:
                earlier = _non_tensor_value(function, name, anchor)
                if earlier is not None:
                    raise _Refusal(f"`{name}` may be `{earlier}` before the branch, and the other arm would return it")
            if missing:
                raise _Refusal(
                    f"`{name}` is not assigned on every path of an arm: that arm would return its input unchanged, "
                    "which torch.cond cannot alias"
                )
        results_code = ", ".join(results)
        parameters = ", ".join(operands)
        operands_code = f"({parameters},)" if len(operands) == 1 else f"({parameters})"
        statements = [self._branch_function("true_fn", parameters, true_block, results)]
        if false_block is None:
            clones = ", ".join(f"{name}.clone()" for name in results)
            false_fn = f"lambda {parameters}: {clones if len(results) == 1 else f'({clones})'}"
        else:
            statements.append(self._branch_function("false_fn", parameters, false_block, results))
            false_fn = "false_fn"
        export = cst.parse_statement(f"{results_code} = torch.cond({form.code}, true_fn, {false_fn}, {operands_code})")
        eager_true = cst.parse_statement(f"{results_code} = true_fn({parameters})")
        eager_false = None
        if false_block is not None:
            eager_false = cst.Else(
                body=cst.IndentedBlock(body=[cst.parse_statement(f"{results_code} = false_fn({parameters})")])
            )
        eager = cst.If(test=_parenthesized(written), body=cst.IndentedBlock(body=[eager_true]), orelse=eager_false)
        statements.append(
            cst.If(test=cst.parse_expression(IS_EXPORTING), body=cst.IndentedBlock(body=[export]), orelse=eager)
        )
        shape = "select -> torch.cond" if false_block is None else "if/else -> torch.cond"
        if isinstance(updated.orelse, cst.If):
            shape = "elif chain -> nested torch.cond"
        return statements, shape

    def _returning(self, original: cst.If, true_block, false_block, written, form):
        """Both arms end in `return`: each becomes a function returning what the arm returns. Tensors come through
        the closure; the operands are the names an arm assigns after reading the value they had before the `if`
        (`q = q * 2`), which its function would otherwise read unbound."""
        function = self.functions[-1]
        arms = _original_arms(original)
        assigned = list(dict.fromkeys(name for arm in arms for name in _assigned_names(cst.IndentedBlock(body=arm))))
        _check_names_stay_local(function, arms, assigned)
        operands = [name for name in assigned if any(_reads_before_assigning(arm, name) for arm in arms)]
        if operands:
            bound = bound_at(function, self.nested_originals.get(id(original), original))
            for name in operands:
                if name not in bound.definite:
                    _check_unbound_result(name, bound, arms, one_armed=False)
        arities = set()
        for block in (true_block, false_block):
            views, always = _views_of_inputs(block), _always_assigned(block)
            for statement, holder in _returned_values(block):
                value = statement.value
                # A tuple of tensors is a pytree torch.cond returns; its items must be tensors
                for item in _target_elements(value) if value is not None else [None]:
                    if item is None or _is_non_tensor(item):
                        raise _Refusal(
                            f"the branch returns the non-tensor value `{_one_line(item) if item else 'None'}`"
                        )
                if isinstance(value, cst.Tuple) and not any(isinstance(e, cst.StarredElement) for e in value.elements):
                    arities.add(len(value.elements))
                holder_assigned = set(_assigned_names(holder))
                for element in _target_elements(value):
                    root = _view_root(element)
                    if root is None:
                        continue  # a tensor the arm computes
                    assigned = root in holder_assigned or root in always
                    if isinstance(element, cst.Name) and not assigned:
                        raise _Refusal(
                            f"the branch returns `{element.value}` unchanged, which torch.cond cannot alias"
                        )
                    # A view of a tensor the arm computed is its own; of an input (an operand it did not assign
                    # anew on every path, a captured tensor) it is an alias
                    if root in views or not assigned or (root in operands and root not in always):
                        raise _Refusal(
                            f"the branch returns `{_one_line(element)}`, which may be a view of "
                            f"`{views.get(root, root)}`: torch.cond cannot alias an input"
                        )
        if len(arities) > 1:
            raise _Refusal("the arms return tuples of different lengths: torch.cond needs the same structure")
        parameters = ", ".join(operands)
        operands_code = f"({parameters},)" if len(operands) == 1 else f"({parameters})"
        params = cst.parse_statement(f"def f({parameters}): pass").params
        statements = [
            cst.FunctionDef(name=cst.Name("true_fn"), params=params, body=true_block),
            cst.FunctionDef(name=cst.Name("false_fn"), params=params, body=false_block),
        ]
        export = cst.parse_statement(f"return torch.cond({form.code}, true_fn, false_fn, {operands_code})")
        eager = cst.If(
            test=_parenthesized(written),
            body=cst.IndentedBlock(body=[cst.parse_statement(f"return true_fn({parameters})")]),
            orelse=cst.Else(body=cst.IndentedBlock(body=[cst.parse_statement(f"return false_fn({parameters})")])),
        )
        statements.append(
            cst.If(test=cst.parse_expression(IS_EXPORTING), body=cst.IndentedBlock(body=[export]), orelse=eager)
        )
        return statements, "return -> torch.cond"

    @staticmethod
    def _branch_function(name: str, parameters: str, block: cst.IndentedBlock, results: list[str]):
        """`def name(parameters):` holding `block`, then returning `results` (a last `result = value` folds in)."""
        body = list(block.body)
        last = body[-1]
        single = len(results) == 1
        if (
            single
            and isinstance(last, cst.SimpleStatementLine)
            and len(last.body) == 1
            and isinstance(last.body[0], cst.Assign)
            and len(last.body[0].targets) == 1
            and m.matches(last.body[0].targets[0].target, m.Name(results[0]))
        ):
            body[-1] = last.with_changes(body=[cst.Return(value=last.body[0].value)])
        else:
            body.append(cst.parse_statement(f"return {', '.join(results)}"))
        params = cst.parse_statement(f"def f({parameters}): pass").params
        return cst.FunctionDef(name=cst.Name(name), params=params, body=block.with_changes(body=body))

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


def _int_valued(node: cst.BaseExpression) -> bool:
    """Whether `node` is a Python int under export: a size (`x.shape[i]`, `x.size(i)`, `len(...)`), a tensor value
    read into Python (`.item()`, `int(...)`), or arithmetic, `min` or `max` over one."""
    if isinstance(node, cst.Subscript):
        return m.matches(node.value, m.Attribute(attr=m.Name("shape")))
    if isinstance(node, cst.BinaryOperation):
        return _int_valued(node.left) or _int_valued(node.right)
    if not isinstance(node, cst.Call):
        return False
    if m.matches(node.func, m.Attribute(attr=m.Name("size") | m.Name("item"))) or m.matches(
        node.func, m.Name("len") | m.Name("int")
    ):
        return True
    return m.matches(node.func, m.Name("min") | m.Name("max")) and any(_int_valued(arg.value) for arg in node.args)


def _check_no_unbacked_int_in_arms(function: cst.FunctionDef, test: cst.BaseExpression, node: cst.If) -> None:
    """A listed test that stopped export may compare data-dependent ints (unbacked SymInts) when its names are bound
    from sizes or `.item()`; torch.cond (torch 2.13) rejects an arm that reads one through the closure ("Unbacked
    SymInt input is not supported"). Which side is unbacked is not visible in the source, so such a site is refused
    (conservatively) rather than rewritten into a failing export."""
    in_test = {name.value for name in _names(test)}
    ints = set()
    for assign in m.findall(function, m.Assign()):
        whole_shape = m.matches(assign.value, m.Attribute(attr=m.Name("shape")))  # `batch, length = x.shape`
        if whole_shape or _int_valued(assign.value):
            ints.update(e.value for t in assign.targets for e in _target_elements(t.target) if isinstance(e, cst.Name))
    arms = _if_parts(node)[1]
    read = {name.value for block in arms for name in _names(block)}
    for name in sorted(in_test & ints & read):
        raise _Refusal(
            f"an arm reads `{name}`, an int the listed test compares: where it is what export found data-dependent "
            "(an unbacked SymInt), torch.cond rejects it in a branch's closure (torch 2.13)"
        )


def _blank_before_branch_function(block: cst.BaseSuite, blank: bool) -> cst.BaseSuite:
    """Black's layout of a branch function that opens a block: a blank line before it, except in a `def`."""
    if not isinstance(block, cst.IndentedBlock) or not block.body:
        return block
    first = block.body[0]
    if not (isinstance(first, cst.FunctionDef) and first.name.value in ("true_fn", "false_fn")):
        return block
    if any(line.comment is not None for line in first.leading_lines):
        return block
    leading = [cst.EmptyLine(indent=False)] if blank else []
    if len(first.leading_lines) == len(leading):
        return block
    return block.with_changes(body=[first.with_changes(leading_lines=leading), *block.body[1:]])


def _blank_lines_before_branch_functions(block: cst.IndentedBlock) -> cst.IndentedBlock:
    """Black's layout: a branch function that follows other code in its block has a blank line before it."""
    body = list(block.body)
    for index in range(1, len(body)):
        stmt = body[index]
        if not (isinstance(stmt, cst.FunctionDef) and stmt.name.value in ("true_fn", "false_fn")):
            continue
        if isinstance(body[index - 1], cst.FunctionDef):
            continue
        if not stmt.leading_lines or stmt.leading_lines[0].comment is not None:
            body[index] = stmt.with_changes(leading_lines=[cst.EmptyLine(indent=False), *stmt.leading_lines])
    return block.with_changes(body=body)


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


def _visit_candidates(
    stmt: cst.BaseStatement, rewriter: _Rewriter, listed: dict[str, frozenset[str]], scopes: tuple[str, ...] = ()
) -> cst.BaseStatement:
    """`stmt.visit(rewriter)`, where a class visits only its members that hold a candidate (with the class's scope and
    depth): in a statement without branch functions, the others hold nothing to rewrite or lay out, and visiting
    them would only rebuild them."""
    if type(stmt) is not cst.ClassDef or type(stmt.body) is not cst.IndentedBlock:
        return stmt.visit(rewriter)
    scopes = (*scopes, stmt.name.value)
    rewriter.visit_ClassDef(stmt)
    rewriter.depth += 1  # the class's block, as `visit_IndentedBlock` counts it
    body, changed = [], False
    for member in stmt.body.body:
        new = (
            _visit_candidates(member, rewriter, listed, scopes) if _has_candidates(member, listed, scopes) else member
        )
        changed = changed or new is not member
        body.extend(new.nodes if isinstance(new, cst.FlattenSentinel) else [new])
    rewriter.depth -= 1
    rewriter.leave_ClassDef(stmt)
    if not changed:
        return stmt
    return stmt.with_changes(body=_blank_lines_before_branch_functions(stmt.body.with_changes(body=body)))


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


TARGETS_FILE = Path(__file__).with_name("cond_targets.json")


def load_targets(path: Path = TARGETS_FILE) -> tuple[dict, ...]:
    """The sites of the committed targets file (written by tools/find_cond_targets.py), in file order."""
    return tuple(json.loads(path.read_text(encoding="utf-8"))["sites"])


def site_test(test: cst.BaseExpression) -> str:
    """How a site's test is written in the targets file: one line, no comments, no enclosing parentheses."""
    return _one_line(test)


def _site_in(site: dict, relpath: str) -> bool:
    """Whether `site` (found in a `modeling_*.py`) is in `relpath`: that file, or the `modular_*.py` it is generated
    from, where the upstream patch makes the same rewrite."""
    folder, _, name = site["file"].rpartition("/")
    modular = f"{folder}/{name.replace('modeling_', 'modular_', 1)}" if name.startswith("modeling_") else None
    return relpath in (site["file"], modular)


def _listed_tests(sites: tuple[dict, ...], relpath: str) -> dict[str, frozenset[str]]:
    """Function qualname -> the tests listed for it in `relpath`. An `A and T` test also lists `T`, its last
    conjunct: the leading ones stay a Python `if` around the rewrite, as for any tensor test."""
    listed: dict[str, set[str]] = {}
    for site in sites:
        if not _site_in(site, relpath):
            continue
        test = cst.parse_expression(site["test"])
        texts = listed.setdefault(site["function"], set())
        texts.add(_one_line(test))
        conjuncts = _conjuncts(test.with_changes(lpar=[], rpar=[]) if isinstance(test, cst.BooleanOperation) else test)
        if len(conjuncts) > 1:
            texts.add(_one_line(conjuncts[-1]))
    return {function: frozenset(texts) for function, texts in listed.items()}


class CondBranches(Codemod):
    NAME = "cond-branches"
    DESCRIPTION = (
        "Data-dependent `if`s: raise-only branches become run-time asserts, branches torch.cond under export (each "
        "arm emitted once as a function that eager calls through the plain `if`)."
    )
    # The `if`s that export of a tiny model stopped on, found by tools/find_cond_targets.py and committed, so that
    # generating stays offline and deterministic: {"file", "function", "test", "line" (informative), ...}; an
    # optional "why", written by hand, is added to the reason of a refusal (why no other equivalent form exists)
    TARGETS: tuple[dict, ...] = load_targets()

    @classmethod
    def with_targets(cls, sites) -> type["CondBranches"]:
        """This codemod reading `sites` instead of the committed targets file (for tests and other files)."""
        return type(cls.__name__, (cls,), {"TARGETS": tuple(sites)})

    @classmethod
    def might_apply(cls, source: str) -> bool:
        markers = (".any(", ".all(", ".item()", "torch.equal(", ".shape", ".size(")
        markers += tuple(f".{name}(" for name in sorted(_VALUE_REDUCTIONS))
        markers += tuple(f"def {site['function'].rsplit('.', 1)[-1]}(" for site in cls.TARGETS)
        return any(marker in source for marker in markers)

    def _report_sites(self, sites: list[dict], kind: str, reason: str) -> None:
        for site in sites:
            self.report(site["line"], kind, site["test"], f"{reason}; {site['why']}" if site.get("why") else reason)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        module = self.context.full_module_name
        relpath = self.context.filename or "<string>"
        sites = [site for site in self.TARGETS if _site_in(site, relpath)]
        if module is not None and module.startswith("transformers.") and not module.startswith("transformers.models."):
            # a shared module's classes must stay transformers' own (see the module docstring)
            self._report_sites(
                sites,
                "refused",
                f"listed in cond_targets.json, but `{module}` is a shared module, which this codemod never changes: "
                "a rewrite would vendor it whole and its classes would stop being transformers' own",
            )
            return tree
        listed = _listed_tests(self.TARGETS, relpath)
        self.seen_sites: set[tuple[str, str]] = set()
        self.site_whys = {
            (site["function"], _one_line(cst.parse_expression(site["test"]))): site["why"]
            for site in sites
            if site.get("why")
        }
        try:
            return self._transform(tree, listed)
        finally:
            missing = [
                site
                for site in sites
                if (site["function"], _one_line(cst.parse_expression(site["test"]))) not in self.seen_sites
            ]
            self._report_sites(
                missing, "note", "listed in cond_targets.json, but this module has no such `if` in that function"
            )

    def _transform(self, tree: cst.Module, listed: dict[str, frozenset[str]]) -> cst.Module:
        with_candidates = [index for index, stmt in enumerate(tree.body) if _has_candidates(stmt, listed)]
        if not with_candidates:
            return tree
        torch_imported, indent = _imports_torch(tree), len(tree.default_indent.expandtabs(4))
        # The lines of a candidate's `if`s come from printing it (libcst's PositionProvider costs several times it).
        # Printed first, the candidates also place the statements between them in the source, whose lines are then
        # counted there instead of printed.
        printed = {}
        for index in with_candidates:
            stmt = tree.body[index]
            state = NodeLineState(
                default_indent=tree.default_indent, default_newline=tree.default_newline, kinds=(cst.If,)
            )
            stmt._codegen(state)
            code = "".join(state.tokens)
            self.remember_statement_code(tree, stmt, code)
            printed[index] = (state.lines, code)
        body, changed = list(tree.body), False
        for index in with_candidates:
            if_lines, code = printed[index]
            rewriter = _Rewriter(self, if_lines, self.first_line(tree, index), torch_imported, indent, listed)
            if "true_fn" in code or "false_fn" in code:
                new = tree.body[index].visit(rewriter)  # branch functions to lay out: every block is visited
            else:
                new = _visit_candidates(tree.body[index], rewriter, listed)
            # The visit rebuilds every node; with no `if` replaced and no branch function to lay out, the text is the
            # same, and keeping the statement object lets the engine and vendoring reuse its printed code
            if rewriter.rewrites or "true_fn" in code or "false_fn" in code:
                body[index] = new
                changed = True
        return tree.with_changes(body=body) if changed else tree
