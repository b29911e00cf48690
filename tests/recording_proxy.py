"""Symbolic stand-ins for the values a piece of model code reads, so that it runs without a model, torch or any real
input: every free name is a `RecordingProxy`, and whatever the code does to one (an attribute, a call, an operator,
an index) gives a new proxy whose `expression` records how it was computed. Two pieces of code run on the same
proxies computed the same values exactly when their records are equal.

Truth tests (`if p:`, `not p`, `p and q`, `x in p`, `isinstance(x, p)`) answer from `Answers`, a sequence of
bits the caller chooses, and are recorded in order: enumerating the sequences takes every arm. A number read from a
proxy (`int(p)`, `float(p)`, `len(p)`, an index) is a fixed value, recorded with the expression it stands for.
`torch.compiler.is_exporting()` answers False, as in eager. What a proxy cannot stand for raises `ProxyLimit`
(iterating other than unpacking into a fixed number of names, writes to a proxy, `with`), so that the caller counts
the code as not run instead of comparing an accident.
"""

from __future__ import annotations

import dis
import sys
import types
from typing import Sequence

EXPORTING = "torch.compiler.is_exporting"
MAX_TRUTH_TESTS = 64  # more in one run means a loop the proxies cannot end


class ProxyLimit(Exception):
    """The code needs a real value where a proxy stands (an int, a length, an iteration of unknown length)."""


class Answers:
    """What one run's questions to proxies get, in order, and the record of them (`asked`): truth tests answer from
    `bits` first and False after it; a number read from a proxy (`int(p)`, `float(p)`, `len(p)`, an index) is
    `NUMBER`, and recorded, so two runs that read numbers from different expressions differ."""

    NUMBER = 3  # any fixed value: what matters is that it is recorded with the expression it stands for

    def __init__(self, bits: Sequence[bool] = ()):
        self.bits = tuple(bits)
        self.asked: list[tuple[str, str, object]] = []  # (question, expression, answer)
        self.tests = 0

    def truth(self, expression: str) -> bool:
        if self.tests >= MAX_TRUTH_TESTS:
            raise ProxyLimit(f"more than {MAX_TRUTH_TESTS} truth tests")
        bit = self.bits[self.tests] if self.tests < len(self.bits) else False
        self.tests += 1
        self.asked.append(("bool", expression, bit))
        return bit

    def number(self, question: str, expression: str, kind: type):
        value = kind(self.NUMBER)
        self.asked.append((question, expression, value))
        return value


def render(value) -> str:
    """How `value` appears in the expression of a proxy computed from it."""
    if isinstance(value, RecordingProxy):
        return object.__getattribute__(value, "_expression")
    if isinstance(value, tuple):
        inner = ", ".join(render(item) for item in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return f"[{', '.join(render(item) for item in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{render(key)}: {render(item)}" for key, item in value.items()) + "}"
    if isinstance(value, slice):
        parts = [render(part) if part is not None else "" for part in (value.start, value.stop, value.step)]
        return ":".join(parts[:2]) + (f":{parts[2]}" if value.step is not None else "")
    if value is Ellipsis:
        return "..."
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return f"<{getattr(value, '__qualname__', value.__name__)}>"
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return repr(value)
    return f"<{type(value).__name__}>"


def describe(value):
    """A comparable record of `value`: proxies by their expression, containers item by item."""
    if isinstance(value, RecordingProxy):
        return ("proxy", render(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(describe(item) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple((describe(key), describe(item)) for key, item in value.items()))
    return ("value", render(value))


def _unpacked_count(frame: types.FrameType) -> int | None:
    """The number of names `frame` is unpacking into (`a, b = value`), or None if it is not unpacking."""
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset == frame.f_lasti:
            return instruction.arg if instruction.opname == "UNPACK_SEQUENCE" else None
    return None


def _binary(symbol: str, reflected: bool = False):
    def operator(self, other):
        left, right = (other, self) if reflected else (self, other)
        return self._new(f"({render(left)} {symbol} {render(right)})")

    return operator


def _unary(symbol: str):
    def operator(self):
        return self._new(f"({symbol}{render(self)})")

    return operator


def _number(question: str, kind: type):
    def operator(self):
        return object.__getattribute__(self, "_bits").number(question, render(self), kind)

    return operator


def _limit(what: str):
    def operator(self, *args):
        raise ProxyLimit(f"{what} of `{render(self)}`")

    return operator


class RecordingProxy:
    """A value known only by how it was computed (`expression`); see the module docstring."""

    __slots__ = ("_expression", "_bits")

    def __init__(self, expression: str, bits: Answers):
        object.__setattr__(self, "_expression", expression)
        object.__setattr__(self, "_bits", bits)

    def _new(self, expression: str) -> "RecordingProxy":
        return RecordingProxy(expression, object.__getattribute__(self, "_bits"))

    def __getattr__(self, name: str) -> "RecordingProxy":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # protocols (`__array__`, `__torch_function__`, ...) are not values
        return self._new(f"{render(self)}.{name}")

    def __call__(self, *args, **kwargs):
        if render(self) == EXPORTING:
            return False
        parts = [render(arg) for arg in args] + [f"{key}={render(value)}" for key, value in kwargs.items()]
        return self._new(f"{render(self)}({', '.join(parts)})")

    def __getitem__(self, key) -> "RecordingProxy":
        if isinstance(key, tuple):
            return self._new(f"{render(self)}[{', '.join(render(part) for part in key)}]")
        return self._new(f"{render(self)}[{render(key)}]")

    def __bool__(self) -> bool:
        return object.__getattribute__(self, "_bits").truth(render(self))

    def __contains__(self, item) -> bool:
        return object.__getattribute__(self, "_bits").truth(f"({render(item)} in {render(self)})")

    def __instancecheck__(self, instance) -> bool:
        return object.__getattribute__(self, "_bits").truth(f"isinstance({render(instance)}, {render(self)})")

    def __subclasscheck__(self, subclass) -> bool:
        return object.__getattribute__(self, "_bits").truth(f"issubclass({render(subclass)}, {render(self)})")

    def __iter__(self):
        count = _unpacked_count(sys._getframe(1))
        if count is None:
            raise ProxyLimit(f"iteration of `{render(self)}` (not unpacking into names)")
        return iter([self._new(f"{render(self)}[{index}]") for index in range(count)])

    def __hash__(self) -> int:
        return hash(render(self))

    def __repr__(self) -> str:
        return f"<proxy {render(self)}>"

    def __str__(self) -> str:
        return render(self)

    def __format__(self, spec: str) -> str:
        return f"{{{render(self)}:{spec}}}" if spec else f"{{{render(self)}}}"

    __len__ = _number("len", int)
    __index__ = _number("index", int)
    __int__ = _number("int", int)
    __float__ = _number("float", float)
    __complex__ = _limit("complex()")
    __setattr__ = _limit("an attribute write")
    __delattr__ = _limit("an attribute delete")
    __setitem__ = _limit("an item write")
    __delitem__ = _limit("an item delete")
    __enter__ = _limit("`with`")
    __exit__ = _limit("`with`")

    __neg__ = _unary("-")
    __pos__ = _unary("+")
    __invert__ = _unary("~")

    def __abs__(self):
        return self._new(f"abs({render(self)})")

    def __round__(self, *digits):
        return self._new(f"round({render(self)}{''.join(f', {render(d)}' for d in digits)})")


for _name, _symbol in {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "matmul": "@",
    "truediv": "/",
    "floordiv": "//",
    "mod": "%",
    "pow": "**",
    "lshift": "<<",
    "rshift": ">>",
    "and": "&",
    "xor": "^",
    "or": "|",
}.items():
    setattr(RecordingProxy, f"__{_name}__", _binary(_symbol))
    setattr(RecordingProxy, f"__r{_name}__", _binary(_symbol, reflected=True))
for _name, _symbol in {"lt": "<", "le": "<=", "eq": "==", "ne": "!=", "gt": ">", "ge": ">="}.items():
    setattr(RecordingProxy, f"__{_name}__", _binary(_symbol))
