"""What `import <package>` must register so that a fresh process can `torch.export.load` the package's programs.

A saved program names the pytree types of its inputs and outputs by serialized name and the custom ops of its graph
by qualified name; loading fails on a name that nothing registered yet. transformers registers each `ModelOutput`
subclass when its class statement runs (`ModelOutput.__init_subclass__`, serialized name `module.Name`), and defines
its custom ops when the module defining them is imported (`transformers::grouped_mm_fallback` in
`integrations/moe.py`). So the package's `__init__` needs:

- `eager`: the transformers modules it imports: `transformers.modeling_outputs` when a model uses its classes (cheap,
  shared by nearly every model), and every module defining custom ops that a model imports a name from;
- `deferred`: module -> the other ModelOutput classes the models define or import, and the cache classes a model
  module defines and registers itself (minimax's MiniMaxCache, by the cache-pytree codemod), which the package
  registers under their serialized names without importing their modules (a model module costs seconds to import:
  transformers' `modeling_utils`). A model module of the package is keyed relative to it (`.gemma3.modeling_gemma3`),
  since the package's name is only known when it is imported.

Static, from source (`ast`): a class is a ModelOutput when a base resolves, through the imports of the module that
names it (re-exports, lazy packages' `TYPE_CHECKING` imports, star imports), to transformers'
`utils.generic.ModelOutput` or to another such class, wherever that is defined; the package's model modules answer
from their rewritten source, any other transformers module from the installed one. Nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

MODEL_OUTPUT = ("transformers.utils.generic", "ModelOutput")
# The transformers module whose ModelOutput classes `import <package>` registers by importing it (~0.1 s): every
# decoder LM returns one of them. Classes of other modules are deferred.
EAGER_OUTPUTS = "transformers.modeling_outputs"
# Calls that define a custom op when the module runs them (`torch.library.custom_op` also as a decorator)
CUSTOM_OP_DEFINERS = frozenset(
    {
        "torch.library.custom_op",
        "torch.library.triton_op",
        "torch.library.define",
        "torch.library.Library",
        "torch._library.custom_ops.custom_op",
    }
)
MODELS_PREFIX = "transformers.models."
# What the cache-pytree codemod registers a cache class defined in a modeling file with (a decorator, with or without
# arguments, or a call): the model module registers it, so `import <package>` defers it like a ModelOutput class
CACHE_REGISTER = "register_cache_pytree_node"

Ref = tuple[str, str]  # (dotted module, name defined there)


@dataclass(frozen=True)
class ModuleSummary:
    """What resolution needs from one module's top level (through `if`/`try`/`with` blocks, not into functions):
    class bases as dotted names, the names it defines, its import bindings, whether it defines custom ops, and the
    cache classes it registers."""

    classes: dict[str, list[list[str]]]  # class name -> its bases that are dotted names, as parts
    definitions: list[str]  # other names bound by def, assignment
    imports: dict[str, list[str | None]]  # bound name -> [absolute module, imported name or None for `import m`]
    stars: list[str]  # modules of `from m import *`
    custom_ops: bool
    caches: list[str]  # classes the module registers with the cache-pytree codemod's `register_cache_pytree_node`

    def to_json(self) -> dict:
        return {
            "classes": self.classes,
            "definitions": self.definitions,
            "imports": self.imports,
            "stars": self.stars,
            "custom_ops": self.custom_ops,
            "caches": self.caches,
        }

    @classmethod
    def from_json(cls, data: dict) -> "ModuleSummary":
        return cls(**data)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported, through blocks that are not scopes."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.If, ast.For, ast.While)):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _top_level(stmt.body)
            for handler in stmt.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(stmt.orelse)
            yield from _top_level(stmt.finalbody)
        elif isinstance(stmt, ast.With):
            yield from _top_level(stmt.body)


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def absolute_module(module_name: str, is_package: bool, level: int, target: str | None) -> str:
    """The module `from <level dots><target> import ...` in `module_name` refers to."""
    if level == 0:
        return target or ""
    package = module_name.split(".") if is_package else module_name.split(".")[:-1]
    package = package[: len(package) - (level - 1)]
    return ".".join([*package, target] if target else package)


def summarize(source: str, module_name: str, is_package: bool = False) -> ModuleSummary:
    """The `ModuleSummary` of a module's source (`module_name` resolves its relative imports)."""
    tree = ast.parse(source)
    classes: dict[str, list[list[str]]] = {}
    definitions: set[str] = set()
    imports: dict[str, list[str | None]] = {}
    stars: list[str] = []
    calls: list[ast.expr] = []
    caches: list[str] = []
    for stmt in _top_level(tree.body):
        if isinstance(stmt, ast.ClassDef):
            classes[stmt.name] = [parts for base in stmt.bases if (parts := _dotted(base)) is not None]
            calls.extend(stmt.decorator_list)
            if any(_callee(decorator) == CACHE_REGISTER for decorator in stmt.decorator_list):
                caches.append(stmt.name)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            definitions.add(stmt.name)
            calls.extend(stmt.decorator_list)
        elif isinstance(stmt, ast.ImportFrom):
            module = absolute_module(module_name, is_package, stmt.level, stmt.module)
            for alias in stmt.names:
                if alias.name == "*":
                    stars.append(module)
                else:
                    # the first binding wins: a fallback in an `except ImportError:` comes after the import
                    imports.setdefault(alias.asname or alias.name, [module, alias.name])
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    imports.setdefault(alias.asname, [alias.name, None])
                else:
                    head = alias.name.split(".")[0]
                    imports.setdefault(head, [head, None])
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            definitions.update(target.id for target in targets if isinstance(target, ast.Name))
        if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            calls.append(stmt.value)
            value = stmt.value
            if isinstance(value, ast.Call) and _callee(value.func) == CACHE_REGISTER and value.args:
                if isinstance(value.args[0], ast.Name):
                    caches.append(value.args[0].id)
    custom_ops = False
    for expr in calls:
        for node in ast.walk(expr):
            func = node.func if isinstance(node, ast.Call) else node
            parts = _dotted(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
            if parts is not None and _qualified(parts, imports) in CUSTOM_OP_DEFINERS:
                custom_ops = True
    definitions -= set(classes)
    return ModuleSummary(
        classes,
        sorted(definitions),
        dict(sorted(imports.items())),
        stars,
        custom_ops,
        sorted(set(caches) & set(classes)),
    )


def _callee(node: ast.expr) -> str | None:
    """The last name of what a decorator or call calls: `register(...)`, `@register`, `@module.register(...)`."""
    node = node.func if isinstance(node, ast.Call) else node
    parts = _dotted(node)
    return parts[-1] if parts else None


def summarize_file(path: Path, module_name: str, is_package: bool) -> ModuleSummary:
    return summarize(path.read_text(encoding="utf-8"), module_name, is_package)


# (path, module name, whether it is a package's __init__) -> its summary: `summarize_file`, or a cached equivalent
Load = Callable[[Path, str, bool], ModuleSummary]


def _qualified(parts: list[str], imports: dict[str, list[str | None]]) -> str:
    """A dotted name with its first part replaced by what the module's imports bind it to."""
    binding = imports.get(parts[0])
    if binding is None:
        return ".".join(parts)
    module, name = binding
    head = module if name is None else f"{module}.{name}"
    return ".".join([head, *parts[1:]])


class Resolver:
    """Resolves names to the module that defines them, and tells ModelOutput classes, over the installed transformers
    (`root`, parsed on demand) and the package's model modules (`package`: transformers module name -> summary of the
    rewritten source, which answers in place of the installed file)."""

    def __init__(self, root: Path, package: dict[str, ModuleSummary], load: Load | None = None) -> None:
        self.root = root
        self.package = package
        self.load = load or summarize_file
        self._summaries: dict[str, ModuleSummary | None] = {}
        self._outputs: dict[Ref, bool] = {MODEL_OUTPUT: True}
        self._definitions: dict[Ref, Ref | None] = {}

    def _path(self, module: str) -> tuple[Path, bool] | None:
        parts = module.split(".")
        if parts[0] != "transformers":
            return None
        base = self.root.joinpath(*parts[1:])
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), False
        return None

    def is_module(self, module: str) -> bool:
        return module in self.package or self._path(module) is not None

    def summary(self, module: str) -> ModuleSummary | None:
        if module in self.package:
            return self.package[module]
        if module not in self._summaries:
            found = self._path(module)
            self._summaries[module] = None if found is None else self.load(found[0], module, found[1])
        return self._summaries[module]

    def definition(self, module: str, name: str, seen: frozenset[Ref] = frozenset()) -> Ref | None:
        """Where `name`, as `module` binds it, is defined: (module, name) of a class, function or variable."""
        summary = self.summary(module)
        if summary is None or (module, name) in seen or self.is_module(f"{module}.{name}"):
            return None  # not a transformers module, a cycle, or a submodule (`from . import initialization`)
        if (module, name) in self._definitions:
            return self._definitions[module, name]
        found = self._definition(module, name, summary, seen | {(module, name)})
        self._definitions[module, name] = found
        return found

    def _definition(self, module: str, name: str, summary: ModuleSummary, seen: frozenset[Ref]) -> Ref | None:
        if name in summary.classes:
            return module, name
        if name in summary.imports:
            source, imported = summary.imports[name]
            if imported is None:
                return None  # a module, not a definition
            return self.definition(source, imported, seen)
        if name in summary.definitions:
            return module, name
        for star in summary.stars:
            found = self.definition(star, name, seen)
            if found is not None:
                return found
        return None

    def resolve_dotted(self, module: str, parts: list[str]) -> Ref | None:
        """The definition a dotted name in `module` refers to (`ModelOutput`, `modeling_outputs.BaseModelOutput`)."""
        summary = self.summary(module)
        if summary is None:
            return None
        head, rest = parts[0], parts[1:]
        if not rest:
            return self.definition(module, head)
        binding = summary.imports.get(head)
        if binding is None:
            return None
        source, imported = binding
        target = source if imported is None else f"{source}.{imported}"
        # attributes through submodules: `transformers.modeling_outputs.X` after `import transformers`
        while len(rest) > 1 and self.is_module(f"{target}.{rest[0]}"):
            target, rest = f"{target}.{rest[0]}", rest[1:]
        if len(rest) != 1 or not self.is_module(target):
            return None
        return self.definition(target, rest[0])

    def is_model_output(self, ref: Ref, seen: frozenset[Ref] = frozenset()) -> bool:
        """Whether the class `ref` derives from transformers' ModelOutput (itself included)."""
        if ref in self._outputs:
            return self._outputs[ref]
        if ref in seen:
            return False
        module, name = ref
        summary = self.summary(module)
        bases = summary.classes.get(name) if summary is not None else None
        found = False
        for parts in bases or ():
            base = self.resolve_dotted(module, parts)
            if base is not None and self.is_model_output(base, seen | {ref}):
                found = True
                break
        self._outputs[ref] = found
        return found


CUSTOM_OPS = "custom ops"
MODEL_OUTPUTS = "ModelOutput classes"


@dataclass(frozen=True)
class PackageLoading:
    """What the package's `__init__` imports (`eager`: module -> what its import registers, CUSTOM_OPS or
    MODEL_OUTPUTS) and registers deferred (`deferred`: module -> the names of its ModelOutput and cache classes,
    package modules relative to it), sorted."""

    eager: dict[str, str]
    deferred: dict[str, tuple[str, ...]] = field(default_factory=dict)


def package_module(module: str) -> str:
    """The module of the package a vendored model module is, relative to the package: `.gemma3.modeling_gemma3`."""
    return "." + module.removeprefix(MODELS_PREFIX)


def package_loading(root: Path, package: dict[str, ModuleSummary], load: Load | None = None) -> PackageLoading:
    """The `PackageLoading` of a package holding the model modules `package` (transformers name -> summary of the
    rewritten source). An imported name refers to transformers' module even when the package holds a copy of it:
    vendoring makes every import absolute (`from ..clip.modeling_clip import CLIPOutput` returns transformers'
    class)."""
    resolver = Resolver(root, package, load)
    eager: dict[str, str] = {}
    deferred: dict[str, set[str]] = {}
    for module, summary in sorted(package.items()):
        for name in summary.classes:
            if resolver.is_model_output((module, name)) and (module, name) != MODEL_OUTPUT:
                deferred.setdefault(package_module(module), set()).add(name)
        if summary.caches:
            deferred.setdefault(package_module(module), set()).update(summary.caches)
        if summary.custom_ops:  # no model module defines one in transformers 5.24: its import would be the price
            eager[package_module(module)] = CUSTOM_OPS
        for source, imported in summary.imports.values():
            # a module imported itself (`from ... import modeling_outputs`): its classes and ops are at hand
            whole = source if imported is None else f"{source}.{imported}"
            if resolver.is_module(whole):
                if resolver.summary(whole).custom_ops:
                    eager[whole] = CUSTOM_OPS
                if whole == EAGER_OUTPUTS:
                    eager.setdefault(whole, MODEL_OUTPUTS)
                continue
            ref = resolver.definition(source, imported) if imported is not None else None
            if ref is None:
                continue
            defined_in = resolver.summary(ref[0])
            if defined_in.custom_ops:
                eager[ref[0]] = CUSTOM_OPS
            if ref[1] in defined_in.classes and resolver.is_model_output(ref) and ref != MODEL_OUTPUT:
                if ref[0] == EAGER_OUTPUTS:
                    eager.setdefault(ref[0], MODEL_OUTPUTS)
                else:
                    deferred.setdefault(ref[0], set()).add(ref[1])
    return PackageLoading(
        dict(sorted(eager.items())), {module: tuple(sorted(names)) for module, names in sorted(deferred.items())}
    )
