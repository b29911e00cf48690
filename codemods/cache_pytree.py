"""Registers transformers' Cache objects as pytree nodes, so `torch.export` takes them as inputs and outputs.

What it rewrites:
- the module that defines the cache API (`cache_utils.py`: it defines `Cache` and `CacheLayerMixin`) gets the
  registration machinery (`register_cache_pytree_node` and its flatten/unflatten functions) appended, followed by one
  registration per concrete cache and cache-layer class, in source order;
- any other module that defines a cache gets `@register_cache_pytree_node` on each such class, and the name added to
  its `cache_utils` import. A decorator, not a call after the class: transformers' modular converter copies a class
  with its decorators into every model that inherits it, so generated modeling files stay consistent. A class is a cache when it derives from a class of `cache_utils` (directly,
  or through a class of the same module) or, as transformers' own exporters decide, when its name ends in `Cache`
  (reported as a finding, since that is a naming convention and not a type).

The emitted flatten is exact: a node's children are its attributes that hold tensors, nested caches or Python ints
(counters that torch.export can keep dynamic); every other attribute (flags, window sizes, devices, dtypes, layer
classes, dicts of flags) goes into a JSON context, so `torch.export.save`/`load` round-trip the object, and unflatten
restores the attributes without calling `__init__`.

What it refuses: abstract base classes (never instantiated, so never flattened) are skipped; a module that already
registers a class is left alone for that class (idempotent). It never changes existing code.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m
from ._imports import add_from_import, add_plain_import
from .base import LINE_LENGTH, Codemod
from ._walks import child_nodes

REGISTER = "register_cache_pytree_node"
# The classes that define transformers' cache API, by the names `cache_utils` gives them.
CACHE_ROOTS = frozenset({"Cache", "CacheLayerMixin", "LinearAttentionCacheLayerMixin", "DummyLayer"})

# The upstream form of the machinery, appended to the module that defines `Cache`. It names nothing of that module
# but the classes it registers, so it can also be rendered as a separate module that imports them.
MACHINERY = '''

# torch.export support: caches and cache layers are pytree nodes, so an exported program can take and return them.
# A node's children are the attributes holding tensors or nested caches, and its counters: int attributes that its
# methods update (`cumulative_length`), which torch.export can then keep dynamic. All other attributes (flags, window
# sizes, devices, dtypes, layer classes) go into a JSON context, so that `torch.export.save`/`load` round-trip it.
_PYTREE_CACHE_CLASSES: dict[str, type] = {}
_PYTREE_CACHE_COUNTERS: dict[type, frozenset[str]] = {}


def _is_cache_context_value(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, torch.device, torch.dtype)):
        return True
    if isinstance(value, type):
        return value in _PYTREE_CACHE_CLASSES.values()
    if isinstance(value, (list, tuple)):
        return all(_is_cache_context_value(item) for item in value)
    if isinstance(value, dict):
        # Keys are structure, never dynamic: int keys (layer or state indices) belong to the context too
        return all(type(key) in (int, str) and _is_cache_context_value(item) for key, item in value.items())
    return False


def _encode_cache_context_value(value):
    # JSON objects only ever appear as tags, so every Python value decodes back to its own type
    if isinstance(value, list):
        return [_encode_cache_context_value(item) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode_cache_context_value(item) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[key, _encode_cache_context_value(item)] for key, item in value.items()]}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, type):
        return {"class": f"{value.__module__}.{value.__qualname__}"}
    return value


def _decode_cache_context_value(value):
    if isinstance(value, list):
        return [_decode_cache_context_value(item) for item in value]
    if not isinstance(value, dict):
        return value
    ((tag, payload),) = value.items()
    if tag == "tuple":
        return tuple(_decode_cache_context_value(item) for item in payload)
    if tag == "dict":
        return {key: _decode_cache_context_value(item) for key, item in payload}
    if tag == "device":
        return torch.device(payload)
    if tag == "dtype":
        return getattr(torch, payload)
    return _PYTREE_CACHE_CLASSES[payload]


def _cache_flatten_with_keys(cache):
    counters = frozenset().union(*(_PYTREE_CACHE_COUNTERS.get(cls, ()) for cls in type(cache).__mro__))
    children, context = [], []
    for name, value in vars(cache).items():
        # A counter's int is a child (dynamic); its other values (None, a tensor) are carried as usual
        is_counter = name in counters and isinstance(value, int) and not isinstance(value, bool)
        if not is_counter and _is_cache_context_value(value):
            context.append([name, _encode_cache_context_value(value)])
        else:
            # A one-element entry marks an attribute that is carried as a child
            context.append([name])
            children.append((torch.utils._pytree.GetAttrKey(name), value))
    return children, json.dumps(context)


def _cache_flatten(cache):
    children, context = _cache_flatten_with_keys(cache)
    return [child for _, child in children], context


def _cache_unflatten(cls, children, context):
    cache = cls.__new__(cls)
    children = iter(children)
    for entry in json.loads(context):
        cache.__dict__[entry[0]] = next(children) if len(entry) == 1 else _decode_cache_context_value(entry[1])
    return cache


def register_cache_pytree_node(cls: type | None = None, *, counters: tuple[str, ...] = ()):
    """
    Registers `cls` (a cache or a cache layer) as a pytree node, so that `torch.export` accepts it as an input and an
    output, and `torch.export.save`/`load` serialize it. `counters` names the int attributes that change from call to
    call (subclasses inherit them). Returns `cls`, so it also works as a class decorator, with or without arguments.
    Idempotent. A registration made earlier by other code is reused when it supports export and serialization, and
    refused otherwise: a class never gets a second node type.
    """
    if cls is None:
        return functools.partial(register_cache_pytree_node, counters=counters)
    serialized_type_name = f"{cls.__module__}.{cls.__qualname__}"
    node = torch.utils._pytree.SUPPORTED_NODES.get(cls)
    if node is not None:
        # torch records a registration made without a serialized name under a placeholder name
        serialized = torch.utils._pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
        unnamed = (
            serialized is None or serialized.serialized_type_name == torch.utils._pytree.NO_SERIALIZED_TYPE_NAME_FOUND
        )
        if node.flatten_with_keys_fn is None or unnamed:
            raise ValueError(
                f"{cls.__name__} is already registered as a pytree node by `{node.flatten_fn.__module__}`, without "
                "the `flatten_with_keys_fn` and `serialized_type_name` that torch.export needs to export and save "
                "it. Import this module before that one, or remove that registration."
            )
    else:
        torch.utils._pytree.register_pytree_node(
            cls,
            _cache_flatten,
            functools.partial(_cache_unflatten, cls),
            serialized_type_name=serialized_type_name,
            flatten_with_keys_fn=_cache_flatten_with_keys,
        )
    # Saved programs pickle their example inputs (caches hold devices); this lets `torch.export.load` read them back
    # with `weights_only`, whoever registered the node
    torch.serialization.add_safe_globals([cls, torch.device])
    _PYTREE_CACHE_CLASSES[serialized_type_name] = cls
    _PYTREE_CACHE_COUNTERS[cls] = _PYTREE_CACHE_COUNTERS.get(cls, frozenset()) | frozenset(counters)
    return cls
'''


def _base_names(node: cst.ClassDef) -> list[str]:
    """The last component of each base class expression (`cache_utils.DynamicCache` -> `DynamicCache`)."""
    names = []
    for arg in node.bases:
        value = arg.value
        if isinstance(value, cst.Attribute):
            names.append(value.attr.value)
        elif isinstance(value, cst.Name):
            names.append(value.value)
    return names


def _is_cache_utils_import(node: cst.ImportFrom) -> bool:
    module = node.module
    if module is None:
        return False
    dotted = cst.helpers.get_full_name_for_node(module) or ""
    return dotted == "cache_utils" or dotted.endswith(".cache_utils")


def _registers(module: cst.Module) -> set[str]:
    """Class names that the module already registers, by a call or as a decorator."""
    found = set()
    registration = m.Call(func=m.Name(REGISTER), args=[m.Arg(value=m.Name()), m.ZeroOrMore()])
    pending = [module]  # a field walk, not a matcher search (several times the cost); the answer is a set
    while pending:
        node = pending.pop()
        if type(node) is cst.Call and m.matches(node, registration):
            found.add(node.args[0].value.value)
        pending.extend(child_nodes(node))
    for stmt in module.body:
        decorator = m.Name(REGISTER) | m.Call(func=m.Name(REGISTER))
        if isinstance(stmt, cst.ClassDef) and any(m.matches(d.decorator, decorator) for d in stmt.decorators):
            found.add(stmt.name.value)
    return found


def _cache_utils_imports(module: cst.Module) -> list[cst.ImportFrom]:
    return [
        stmt.body[0]
        for stmt in module.body
        if isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.ImportFrom)
        and _is_cache_utils_import(stmt.body[0])
        and not isinstance(stmt.body[0].names, cst.ImportStar)
    ]


def _int_like(value: cst.BaseExpression) -> bool:
    """Whether an assigned expression looks like a Python int (a literal, arithmetic, a size, `len`/`int`/`max`)."""
    if isinstance(value, cst.Integer):
        return True
    if isinstance(value, cst.UnaryOperation):
        return _int_like(value.expression)
    if isinstance(value, cst.BinaryOperation):
        return True
    if isinstance(value, cst.Subscript) and m.matches(value.value, m.Attribute(attr=m.Name("shape"))):
        return True
    return m.matches(value, m.Call(func=m.Name("len") | m.Name("int") | m.Name("max") | m.Name("min")))


def _self_attributes_assigned(function: cst.FunctionDef) -> tuple[set[str], set[str]]:
    """(every `X` of `self.X = ...`/`self.X += ...` in a method, those of them assigned something int-like)."""
    names, ints = set(), set()
    self_attribute = m.Attribute(value=m.Name("self"))
    pending = [function]  # a field walk, not matcher searches (several times the cost); the answer is two sets
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is cst.Assign:
            for target in node.targets:
                if m.matches(target.target, self_attribute):
                    names.add(target.target.attr.value)
                    if _int_like(node.value):
                        ints.add(target.target.attr.value)
        elif kind is cst.AugAssign and m.matches(node.target, self_attribute):
            names.add(node.target.attr.value)
            ints.add(node.target.attr.value)
        pending.extend(child_nodes(node))
    return names, ints


def _methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    return [stmt for stmt in cls.body.body if isinstance(stmt, cst.FunctionDef)]


def _counters(classes: list[cst.ClassDef]) -> dict[str, tuple[str, ...]]:
    """Class name -> its counters: int attributes that a method other than `__init__` and lazy initialization (which
    run once) updates, looking through the module's own base classes too. When the class also gets attributes from a
    base defined elsewhere, what that base's `__init__` sets is unknown, so the `__init__` requirement is dropped.
    Non-int values of a counter are carried as usual at run time: the list only has to contain every counter."""
    result = {}
    # A base class's methods are read again for every class deriving from it: read each method once
    assigned: dict[int, tuple[set[str], set[str]]] = {}
    for cls in classes:
        chain, external, todo = [], False, [cls]
        while todo:
            current = todo.pop()
            chain.append(current)
            for base in _base_names(current):
                # A base name means the module's class only if one of that name is defined above: in
                # `class Cache(Cache)` (modular files re-define imported classes) the base is the import
                own = _defined_above(classes, current, base)
                if own is not None:
                    todo.append(own)
                elif base not in ("ABC", "object"):
                    external = True
        initialized, updated, ints = set(), set(), set()
        for current in chain:
            for method in _methods(current):
                if id(method) not in assigned:  # the classes hold their methods alive: ids stay unique
                    assigned[id(method)] = _self_attributes_assigned(method)
                names, int_names = assigned[id(method)]
                ints |= int_names
                if method.name.value == "__init__":
                    initialized |= names
                elif not method.name.value.startswith("lazy_initialization"):
                    updated |= names
        counters = updated & ints if external else updated & ints & initialized
        result[cls.name.value] = tuple(sorted(counters))
    return result


def _defined_above(classes: list[cst.ClassDef], cls: cst.ClassDef, name: str) -> cst.ClassDef | None:
    """The last class named `name` defined before `cls` in the module, which is what `name` is bound to when the
    `class` statement of `cls` runs; None when the name comes from elsewhere (an import)."""
    index = next(i for i, other in enumerate(classes) if other is cls)
    return next((other for other in reversed(classes[:index]) if other.name.value == name), None)


# Searched in "\n" + source: a line start is a newline before it (a pattern opening with `^` is tried at every
# position; one opening with a newline skips to the newlines)
_CACHE_UTILS_IMPORT = re.compile(r"\nfrom [.\w]*cache_utils import (?:\(([^)]*)\)|([^(\n]*)$)", re.MULTILINE)
_CACHE_NAMED_CLASS = re.compile(r"\nclass \w*Cache\b")


def _arguments(cls: cst.ClassDef | None, counters: dict) -> str:
    """`Class, counters=("a",)` for a registration call, or just `counters=(...)` for a decorator (`cls` None)."""
    name = None if cls is None else cls.name.value
    own = counters[name]
    parts = [] if name is None else [name]
    if own:
        items = ", ".join(f'"{counter}"' for counter in own)
        parts.append(f"counters=({items},)" if len(own) == 1 else f"counters=({items})")
    return ", ".join(parts)


def _fitted(statement: str) -> str:
    """A top-level statement laid out as black (and ruff) would at transformers' line length."""
    if len(statement) <= LINE_LENGTH:
        return statement
    import black  # rarely needed: importing black costs a tenth of a second

    return black.format_str(statement, mode=black.Mode(line_length=LINE_LENGTH))


def cache_classes(
    classes: list[cst.ClassDef], imports: list[cst.ImportFrom], defines_api: bool
) -> list[tuple[cst.ClassDef, bool]]:
    """Module-level cache classes, in source order, each with whether only its name (`*Cache`) makes it one."""
    imported = {alias.evaluated_alias or alias.evaluated_name for node in imports for alias in node.names}
    caches: set[str] = set(CACHE_ROOTS) if defines_api else set()
    changed = True
    while changed:  # transitive closure over the module's own classes
        changed = False
        for cls in classes:
            name = cls.name.value
            if name not in caches and any(base in caches or base in imported for base in _base_names(cls)):
                caches.add(name)
                changed = True
    result = []
    for cls in classes:
        name = cls.name.value
        if "ABC" in _base_names(cls):
            continue  # abstract: never instantiated, so never flattened
        if name in caches:
            result.append((cls, False))
        elif name.endswith("Cache") and not defines_api:
            result.append((cls, True))
    return result


class CachePytreeRegistration(Codemod):
    NAME = "cache-pytree"
    DESCRIPTION = "Registers Cache classes and cache layers as pytree nodes, so torch.export takes and returns them."

    @classmethod
    def might_apply(cls, source: str) -> bool:
        # A cache class is named *Cache (this covers `class Cache` of the API module) or derives from a name
        # imported from cache_utils; most modeling files only import `Cache` for annotations.
        lines = "\n" + source
        if _CACHE_NAMED_CLASS.search(lines):
            return True
        groups = [group for match in _CACHE_UTILS_IMPORT.findall(lines) for group in match]
        names = {name.strip().split(" as ")[-1] for group in groups for name in group.split(",")}
        names.discard("")
        if not names:
            return False
        bases = re.compile(r"\nclass \w+\([^)]*\b(" + "|".join(map(re.escape, sorted(names))) + r")\b")
        return bases.search(lines) is not None

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        classes = [stmt for stmt in tree.body if isinstance(stmt, cst.ClassDef)]
        defines_api = {"Cache", "CacheLayerMixin"} <= {cls.name.value for cls in classes}
        imports = _cache_utils_imports(tree)
        self.tree = tree
        registered = _registers(tree)
        todo = [cls for cls in self._cache_classes(classes, imports, defines_api) if cls.name.value not in registered]
        if not todo:
            return tree
        for cls in todo:
            self.report(self._line(cls), "rewritten", f"class {cls.name.value}", "registered as a pytree node")
        if defines_api:
            return self._append_machinery(tree, todo)
        return self._import_register(self._decorate_classes(tree, todo), imports)

    def _line(self, node: cst.ClassDef) -> int:
        return self.top_level_line(self.tree, node)

    def _cache_classes(
        self, classes: list[cst.ClassDef], imports: list[cst.ImportFrom], defines_api: bool
    ) -> list[cst.ClassDef]:
        found = cache_classes(classes, imports, defines_api)
        for cls, by_name in found:
            if by_name:
                name = cls.name.value
                self.report(self._line(cls), "note", f"class {name}", "registered because its name ends in `Cache`")
        return [cls for cls, _ in found]

    def _append_machinery(self, tree: cst.Module, todo: list[cst.ClassDef]) -> cst.Module:
        body = list(tree.body)
        defines_register = any(isinstance(stmt, cst.FunctionDef) and stmt.name.value == REGISTER for stmt in body)
        if not defines_register:
            machinery = cst.parse_module(MACHINERY)
            # The leading comment parses as the module header: carry it on the first statement
            first = machinery.body[0]
            body.append(first.with_changes(leading_lines=[*machinery.header, *first.leading_lines]))
            body.extend(machinery.body[1:])
        counters = _counters([stmt for stmt in tree.body if isinstance(stmt, cst.ClassDef)])
        calls = [cst.parse_statement(_fitted(f"{REGISTER}({_arguments(cls, counters)})")) for cls in todo]
        calls[0] = calls[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        body.extend(calls)
        tree = tree.with_changes(body=body)
        if not defines_register:
            for name in ("functools", "json", "torch"):
                tree = add_plain_import(tree, name)
        return tree

    def _decorate_classes(self, tree: cst.Module, todo: list[cst.ClassDef]) -> cst.Module:
        wanted = {cls.name.value for cls in todo}
        counters = _counters([stmt for stmt in tree.body if isinstance(stmt, cst.ClassDef)])
        body = []
        for stmt in tree.body:
            if isinstance(stmt, cst.ClassDef) and stmt.name.value in wanted:
                own = counters[stmt.name.value]
                decorator = cst.parse_expression(f"{REGISTER}({_arguments(None, {None: own})})" if own else REGISTER)
                # Outermost, so that it registers the class other decorators (e.g. @dataclass) return
                stmt = stmt.with_changes(decorators=[cst.Decorator(decorator), *stmt.decorators])
            body.append(stmt)
        return tree.with_changes(body=body)

    def _import_register(self, tree: cst.Module, imports: list[cst.ImportFrom]) -> cst.Module:
        """Imports `register_cache_pytree_node` the way the module imports `cache_utils`: merged into that import,
        else relative when the module lives inside transformers, else absolute."""
        if imports:
            dotted = cst.helpers.get_full_name_for_node(imports[0].module)
            return add_from_import(tree, dotted, len(imports[0].relative), REGISTER)
        parts = (self.context.full_module_name or "").split(".")
        if parts[0] == "transformers" and len(parts) > 1:
            return add_from_import(tree, "cache_utils", len(parts) - 1, REGISTER)
        return add_from_import(tree, "transformers.cache_utils", 0, REGISTER)
