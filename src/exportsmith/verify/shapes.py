"""`dynamic_shapes` entries that mirror (possibly nested) pytree inputs such as a registered `DynamicCache`.

torch.export matches `dynamic_shapes` to an input the way `torch.export.dynamic_shapes._tree_map_with_path` does:
built-in containers (list, tuple, dict, namedtuple, ...) are mirrored as the same container, and an instance of any
other registered pytree class as the children its `flatten_fn` returns (with that container's exact type).
Tensors map through a caller-given function, plain ints (e.g. a cache layer's length counter) to `Dim.AUTO`, and
every other leaf (None, bool, float, str, unregistered objects) to None, i.e. static.
"""

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

TensorDims = Callable[[torch.Tensor], Any]


def dynamic_shapes_like(obj: Any, tensor_dims: TensorDims) -> Any:
    """The `dynamic_shapes` entry for input `obj`; `tensor_dims(tensor)` gives each tensor's dims (or None)."""
    if isinstance(obj, torch.Tensor):
        return tensor_dims(obj)
    if type(obj) is int:  # not bool: a bool is a flag, never a size
        return torch.export.Dim.AUTO
    node_type = pytree._get_node_type(obj)
    if node_type in pytree.BUILTIN_TYPES:
        node = pytree.SUPPORTED_NODES[node_type]
        children, context = node.flatten_fn(obj)
        return node.unflatten_fn([dynamic_shapes_like(child, tensor_dims) for child in children], context)
    if node_type in pytree.SUPPORTED_NODES:
        children, _ = pytree.SUPPORTED_NODES[node_type].flatten_fn(obj)
        return dynamic_shapes_like(children, tensor_dims)
    return None


def with_named_inputs(model: torch.nn.Module, inputs: dict) -> torch.nn.Module:
    """`model`, or when its forward collects some of `inputs` with `**kwargs`, a module whose forward names every
    input and calls `model` with them. torch 2.13's export cannot match dict `dynamic_shapes` to inputs collected by
    `**kwargs`: the arguments it rebuilds "in traced order" hold them both under the `**kwargs` name and flat, and no
    spec matches both (llava's and granitemoe's `use_cache`). Only the call signature changes."""
    parameters = inspect.signature(model.forward).parameters
    named = {name for name, p in parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if set(inputs) <= named:
        return model

    def forward(self, **keywords):
        return self.model(**keywords)

    # torch.export binds the inputs to `inspect.signature(module.forward)`
    forward.__signature__ = inspect.Signature(
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in inputs),
        ]
    )
    wrapper = type(f"{type(model).__name__}WithNamedInputs", (torch.nn.Module,), {"forward": forward})()
    wrapper.model = model
    wrapper.training = model.training  # torch.onnx warns of a module exported in training mode
    return wrapper
