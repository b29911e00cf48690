"""The upstream form of cache export support: caches declare their counters, and transformers' exporters keep them
dynamic. It replaces `cache-pytree` in the upstream series (the vendored package keeps `cache-pytree`: it has no
exporter of its own to extend).

transformers already registers caches for export, at export time (`exporters/exporter_dynamo`: every `Cache` subclass
and the model's own `*Cache` classes, with a generic flattener) and at load time (`exporters/metadata`), and
`integrations/executorch` registers `DynamicCache` its own way. A third registration at import would change what
those paths produce (who registers a class first wins). What the generic flattener lacks is the one thing a decode
program serving every cache length needs: it puts every int attribute into the context, so a counter that changes
from call to call (a sliding window's `cumulative_length`) is frozen at its traced value. So:

- every cache class (the classes of the module that defines `Cache`, and the cache classes of model modules, found as
  `cache-pytree` finds them) that updates int counters outside `__init__` gets `_export_counters = ("name", ...)`,
  unless a class of the same module it derives from declares the same ones;
- `exporters/exporter_dynamo.py`'s `_flatten_to_context` makes the attributes named by `_export_counters` (over the
  class's MRO) leaves: torch.export can then keep them dynamic, and the spec is the same whatever they hold (an int at
  the input, a SymInt while tracing).

It refuses (and says why) a `_flatten_to_context` whose generic-object branch is not the one it knows, and leaves a
class that already declares `_export_counters` as it is.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from .base import Codemod
from .cache_pytree import (
    CachePytreeRegistration,
    _base_names,
    _cache_utils_imports,
    _counters,
    _defined_above,
    cache_classes,
)

COUNTERS = "_export_counters"
FLATTEN = "_flatten_to_context"
# The generic-object branch of transformers' `_flatten_to_context` (5.x), as written
GENERIC_BRANCH = """if hasattr(obj, "__dict__"):
    state = {k: _flatten_to_context(v, tensors) for k, v in vars(obj).items()}
    return {"_t": "obj", "p": _class_to_path(cls), "s": state}
"""
COUNTING_BRANCH = """if hasattr(obj, "__dict__"):
    # A cache's counters (`_export_counters`) are leaves whatever they hold (an int at the input, a SymInt while
    # tracing), so that they stay dynamic and the spec is the same at every step
    counters = {name for klass in cls.__mro__ for name in vars(klass).get("_export_counters", ())}
    state = {}
    for k, v in vars(obj).items():
        if k in counters:
            state[k] = {"_t": "sym", "i": len(tensors)}
            tensors.append(v)
        else:
            state[k] = _flatten_to_context(v, tensors)
    return {"_t": "obj", "p": _class_to_path(cls), "s": state}
"""
_FLATTEN_DEF = re.compile(rf"\ndef {FLATTEN}\(")


def _declares_counters(cls: cst.ClassDef) -> bool:
    target = m.Assign(targets=[m.AssignTarget(target=m.Name(COUNTERS))])
    return any(m.matches(stmt, m.SimpleStatementLine(body=[target])) for stmt in cls.body.body)


def _with_counters(cls: cst.ClassDef, counters: tuple[str, ...]) -> cst.ClassDef:
    """`cls` with `_export_counters = (...)` first after its docstring, set apart by blank lines as black leaves them."""
    items = ", ".join(f'"{name}"' for name in counters) + ("," if len(counters) == 1 else "")
    statement = cst.parse_statement(f"{COUNTERS} = ({items})\n")
    body = list(cls.body.body)
    docstring = bool(body) and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())]))
    index = 1 if docstring else 0
    if docstring:
        statement = statement.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    if index < len(body) and not body[index].leading_lines:
        body[index] = body[index].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    body.insert(index, statement)
    return cls.with_changes(body=cls.body.with_changes(body=body))


class CacheExportCounters(Codemod):
    NAME = "cache-export"
    DESCRIPTION = (
        "Caches declare the int attributes that change from call to call (`_export_counters`), and transformers' "
        "exporters keep them dynamic, so one decode program serves every cache length. No new registration: "
        "transformers' exporters register the caches, at export and at load, as they do today."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return CachePytreeRegistration.might_apply(source) or _FLATTEN_DEF.search("\n" + source) is not None

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.tree = tree
        flatten = next(
            (stmt for stmt in tree.body if isinstance(stmt, cst.FunctionDef) and stmt.name.value == FLATTEN), None
        )
        if flatten is not None:
            return self._count_in_flatten(tree, flatten)
        return self._declare_counters(tree)

    def _declare_counters(self, tree: cst.Module) -> cst.Module:
        classes = [stmt for stmt in tree.body if isinstance(stmt, cst.ClassDef)]
        defines_api = {"Cache", "CacheLayerMixin"} <= {cls.name.value for cls in classes}
        caches = [cls for cls, _ in cache_classes(classes, _cache_utils_imports(tree), defines_api)]
        counters = _counters(classes)
        wanted = {}
        for cls in caches:
            own = counters[cls.name.value]
            bases = [_defined_above(classes, cls, base) for base in _base_names(cls)]
            inherited = {name for base in bases if base is not None for name in counters[base.name.value]}
            if own and set(own) != inherited and not _declares_counters(cls):
                wanted[cls.name.value] = own
        if not wanted:
            return tree
        body = []
        for stmt in tree.body:
            if isinstance(stmt, cst.ClassDef) and stmt.name.value in wanted:
                self.report(
                    self.top_level_line(tree, stmt),
                    "rewritten",
                    f"class {stmt.name.value}",
                    f"declares its counters {', '.join(wanted[stmt.name.value])} for export",
                )
                stmt = _with_counters(stmt, wanted[stmt.name.value])
            body.append(stmt)
        return tree.with_changes(body=body)

    def _count_in_flatten(self, tree: cst.Module, flatten: cst.FunctionDef) -> cst.Module:
        branch = cst.parse_statement(GENERIC_BRANCH)
        found = [stmt for stmt in flatten.body.body if isinstance(stmt, cst.If) and stmt.deep_equals(branch)]
        line = self.top_level_line(tree, flatten)
        if len(found) != 1:
            self.report(
                line,
                "refused",
                f"def {FLATTEN}",
                "its generic-object branch is not the one this rewrite knows (transformers 5.x): counters not added",
            )
            return tree
        self.report(line, "rewritten", f"def {FLATTEN}", "a cache's `_export_counters` are leaves, kept dynamic")
        counting = cst.parse_statement(COUNTING_BRANCH).with_changes(leading_lines=found[0].leading_lines)
        new_body = [counting if stmt is found[0] else stmt for stmt in flatten.body.body]
        new_flatten = flatten.with_changes(body=flatten.body.with_changes(body=new_body))
        return tree.with_changes(body=[new_flatten if stmt is flatten else stmt for stmt in tree.body])
