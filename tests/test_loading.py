"""exportsmith.loading: which ModelOutput classes and custom-op modules a package's `__init__` registers, found
statically by resolving names through imports (not by their spelling)."""

import importlib
from pathlib import Path

from exportsmith.discover import find_transformers
from exportsmith.loading import (
    CUSTOM_OPS,
    EAGER_OUTPUTS,
    MODEL_OUTPUT,
    MODEL_OUTPUTS,
    Resolver,
    package_loading,
    summarize,
)

TF = find_transformers()
ROOT = Path(__file__).parents[1]
FOO = "transformers.models.foo.modeling_foo"

# A model module as transformers writes them: relative imports, ModelOutput classes under any name
SOURCE = """
from dataclasses import dataclass

import torch
from torch import nn

from ... import modeling_outputs
from ...generation.utils import GenerateDecoderOnlyOutput
from ...modeling_outputs import BaseModelOutputWithPast as Base
from ...utils import ModelOutput, auto_docstring
from ..clip.modeling_clip import CLIPOutput


class FooOutput(nn.Module):
    pass


@dataclass
class FooState(ModelOutput):
    x: torch.Tensor | None = None


class FooDerived(FooState):
    pass


class FooAliased(Base):
    pass


class FooAttribute(modeling_outputs.CausalLMOutputWithPast):
    pass


class FooGenerateOutput(GenerateDecoderOnlyOutput):
    pass


if True:
    class FooNested(ModelOutput):
        pass


def make():
    class FooLocal(ModelOutput):  # not a module attribute: never returned by name
        pass
"""


def loading_of(source: str, module: str = FOO):
    return package_loading(TF.root, {module: summarize(source, module)})


def test_a_model_output_is_found_by_its_bases_through_the_imports_not_by_its_name():
    loading = loading_of(SOURCE)
    assert loading.deferred[".foo.modeling_foo"] == (
        "FooAliased",
        "FooAttribute",
        "FooDerived",
        "FooGenerateOutput",
        "FooNested",
        "FooState",
    )


def test_model_outputs_imported_from_transformers_modules_are_imported_or_deferred_by_their_module():
    loading = loading_of(SOURCE)
    # modeling_outputs is imported by the package (cheap, shared); the others are deferred under transformers' name:
    # a vendored model imports transformers' module, even for a model the package holds
    assert loading.eager == {EAGER_OUTPUTS: MODEL_OUTPUTS}
    assert loading.deferred["transformers.generation.utils"] == ("GenerateDecoderOnlyOutput",)
    assert loading.deferred["transformers.models.clip.modeling_clip"] == ("CLIPOutput",)
    assert set(loading.deferred) == {
        ".foo.modeling_foo",
        "transformers.generation.utils",
        "transformers.models.clip.modeling_clip",
    }


def test_the_module_defining_a_custom_op_is_imported_only_for_a_model_that_imports_a_name_it_provides():
    experts = "from ...integrations import use_experts_implementation, use_kernel_forward_from_hub\n"
    assert loading_of(experts).eager == {"transformers.integrations.moe": CUSTOM_OPS}
    # the same lazy package, a name of another of its modules
    assert loading_of("from ...integrations import use_kernel_forward_from_hub\n").eager == {}
    assert loading_of("from ...integrations import moe\n").eager == {"transformers.integrations.moe": CUSTOM_OPS}


def test_a_cache_class_a_model_module_registers_itself_is_deferred_with_its_model_outputs():
    source = """
import torch

from ...cache_utils import DynamicCache, register_cache_pytree_node


@register_cache_pytree_node
class FooCache:
    pass


@register_cache_pytree_node(counters=("cumulative_length",))
class FooLayer:
    pass


class FooLater:
    pass


register_cache_pytree_node(FooLater)


class FooPlain(DynamicCache):
    pass
"""
    assert loading_of(source).deferred == {".foo.modeling_foo": ("FooCache", "FooLater", "FooLayer")}


def test_a_custom_op_is_one_defined_when_the_module_runs():
    defined = [
        "import torch\n\n@torch.library.custom_op('x::f', mutates_args=())\ndef f(x): return x\n",
        "from torch.library import custom_op\n\n@custom_op('x::f', mutates_args=())\ndef f(x): return x\n",
        "import torch\nif torch.cuda.is_available():\n    torch.library.custom_op('x::f', g, mutates_args=())\n",
        "import torch.library as library\nlib = library.Library('x', 'DEF')\n",
    ]
    for source in defined:
        assert summarize(source, "transformers.x").custom_ops, source
    # inside a function the op is defined when it is called, not when the module is imported
    later = "import torch\n\ndef load():\n    torch.library.custom_op('x::f', g, mutates_args=())\n"
    assert not summarize(later, "transformers.x").custom_ops


def test_every_class_of_modeling_outputs_resolves_to_model_output():
    resolver = Resolver(TF.root, {})
    classes = resolver.summary(EAGER_OUTPUTS).classes
    assert len(classes) > 40
    assert all(resolver.is_model_output((EAGER_OUTPUTS, name)) for name in classes)
    assert resolver.definition("transformers.utils", "ModelOutput") == MODEL_OUTPUT
    assert not resolver.is_model_output(("transformers.modeling_utils", "PreTrainedModel"))


def test_the_committed_package_defers_exactly_the_classes_its_model_modules_register():
    """The static tables against the truth: every class a committed model module defines that is a pytree node once
    the module is imported (ModelOutput classes register themselves, model-defined caches are registered by the
    module), found by importing them."""
    import generated
    from generated._shared import loading
    from torch.utils import _pytree as pytree

    found = set()
    for model in generated.MODELS:
        for path in sorted((ROOT / "generated" / model).glob("modeling_*.py")):
            module = importlib.import_module(f"generated.{model}.{path.stem}")
            found |= {
                f"{module.__name__}.{name}"
                for name, value in vars(module).items()
                if isinstance(value, type) and value.__module__ == module.__name__ and value in pytree.SUPPORTED_NODES
            }
    assert found and found == {name for name in loading.DEFERRED if name.startswith("generated.")}
