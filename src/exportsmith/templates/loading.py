"""What a fresh process needs to `torch.export.load` a program of this package's models, registered when the package
is imported (its `__init__` calls these with tables written at generation time).

A saved program names the pytree types of its inputs and outputs by serialized name, and a ModelOutput class is
registered (by transformers, under `module.Name`) only when its class statement runs, that is when its module is
imported; so is a cache class that a model module defines (by the module, through `register_cache_pytree_node`). A
model module costs seconds to import (transformers' `modeling_utils`). So each such class of a module the package
does not import gets a placeholder pytree node under its serialized name, whose unflatten imports the module and
builds the object with the class's own registered unflatten: loading needs no model module, and running the program
returns the real classes. When the module is imported, the class's own registration takes the serialized name over
(torch's registry keeps the last registration of a name: `tests/test_fresh_load.py` pins this), so programs loaded
afterwards use the class directly.

For an input of such a class, torch.export.load (2.13) imports the module itself before it reads the input spec: it
unpickles the program's example inputs first, and when weights-only unpickling refuses the class (not a safe global
before its module is imported), retries without, which imports the module (and logs a warning).
"""

import functools
import importlib
import importlib.util

from torch.utils import _pytree as pytree


def import_modules(package: str, modules: tuple[str, ...]) -> None:
    """Import `modules` (absolute, or relative to `package`): they register ModelOutput classes, define custom ops."""
    for module in modules:
        importlib.import_module(module, package)


class Deferred:
    """The base of the placeholders; they have no instances: their unflatten returns the real class's."""

    module = ""
    name = ""


def _flatten(value):
    raise TypeError(f"{type(value).__qualname__} is a placeholder for loading programs, it has no instances")


def _unflatten(placeholder: type, values, context):
    cls = getattr(importlib.import_module(placeholder.module), placeholder.name)
    node = pytree.SUPPORTED_NODES.get(cls)
    if node is None:
        raise TypeError(f"importing {placeholder.module} did not register {placeholder.name} as a pytree node")
    return node.unflatten_fn(values, context)


# serialized name of each class of the tables -> the placeholder registered under it, or None where a registration
# held the name already
DEFERRED: dict[str, type | None] = {}


def defer_registrations(package: str, table: dict[str, tuple[str, ...]]) -> None:
    """Register a placeholder under the serialized name of each class of `table` (module, absolute or relative to
    `package` -> class names) that nothing registered yet: never one for a name the class itself, or anything else,
    already holds."""
    for module, names in table.items():
        module = importlib.util.resolve_name(module, package)
        for name in names:
            serialized = f"{module}.{name}"
            if serialized in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
                DEFERRED.setdefault(serialized, None)
                continue
            attributes = {"module": module, "name": name, "__module__": __name__}
            placeholder = type(f"Deferred[{serialized}]", (Deferred,), attributes)
            pytree.register_pytree_node(
                placeholder,
                _flatten,
                functools.partial(_unflatten, placeholder),
                serialized_type_name=serialized,
            )
            DEFERRED[serialized] = placeholder
