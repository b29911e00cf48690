"""The README's flow for every committed model: export, `torch.export.save`, then in a fresh process `import torch,
generated` and `torch.export.load`, run, compare with eager. Also the deferred registration of ModelOutput classes
(`generated/_shared/loading.py`) in both orders, and the torch behaviour it relies on.

One fresh process loads every program before it runs any: running a program may import a model module (to build a
deferred ModelOutput class), which imports transformers' modeling_utils and with it everything a model module
registers; loading first shows that `import generated` alone is enough.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

import generated
from exportsmith.verify.check import (
    MAX_ABS_DIFF,
    build_pair,
    export_program,
    fresh_process_error,
    max_abs_diff,
    programs_for,
    run,
    varying_dims,
)

ROOT = Path(__file__).parents[1]


def fresh_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c code args` in a new process, from the repository root (where `generated` is)."""
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    """For each committed model, its last program (prefill for decoder LMs: it returns the model's ModelOutput and
    cache; the harness's save/load check covers the first, decode), exported with the harness's dynamic shapes and
    saved, the inputs of its second case and the eager output there. Decode, with a cache input, is what
    `test_generated_model_verifies` loads in a fresh process."""
    directory = tmp_path_factory.mktemp("programs")
    references = {}
    for model in generated.MODELS:
        original, copy = build_pair(model, "generated")
        program = programs_for(original, cache_model=copy)[-1]
        case = program.cases[1]
        exported = export_program(copy, program.cases[0].inputs(), varying_dims(program))
        torch.export.save(exported, directory / f"{model}.pt2")
        torch.save(case.inputs(), directory / f"{model}.inputs.pt")
        references[model] = run(copy, case)
    return directory, references


LOAD_ALL_THEN_RUN = """
import json, sys
from pathlib import Path
import torch, generated

directory, models = Path(sys.argv[1]), json.loads(sys.argv[2])
programs = {model: torch.export.load(directory / f"{model}.pt2") for model in models}
# loading imported no model module, nor what they import
imported = sorted(name for name in sys.modules if name.startswith("generated.") and ".modeling_" in name)
assert not imported and "transformers.modeling_utils" not in sys.modules, imported
for model, program in programs.items():
    inputs = torch.load(directory / f"{model}.inputs.pt", weights_only=True)
    torch.manual_seed(0)
    with torch.no_grad():
        torch.save(program.module()(**inputs), directory / f"{model}.outputs.pt")
"""


def test_every_committed_model_loads_and_runs_in_a_fresh_process_that_imports_only_generated(saved):
    directory, references = saved
    finished = fresh_python(LOAD_ALL_THEN_RUN, str(directory), json.dumps(list(generated.MODELS)))
    assert finished.returncode == 0, fresh_process_error(finished.stderr)
    for model, reference in references.items():
        outputs = torch.load(directory / f"{model}.outputs.pt", weights_only=False)
        assert type(outputs) is type(reference), model
        assert max_abs_diff(reference, outputs) <= MAX_ABS_DIFF, model


GEMMA3_OUTPUT = "generated.gemma3.modeling_gemma3.Gemma3CausalLMOutputWithPast"

BOTH_ORDERS = """
import sys
from pathlib import Path
import torch, generated
from generated._shared import loading
from torch.utils import _pytree as pytree

directory, name = Path(sys.argv[1]), sys.argv[2]
program = directory / "gemma3.pt2"
placeholder = loading.DEFERRED[name]
assert placeholder is not None and pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] is placeholder


def outputs(loaded):
    inputs = torch.load(directory / "gemma3.inputs.pt", weights_only=True)
    torch.manual_seed(0)
    with torch.no_grad():
        return loaded.module()(**inputs)


before = torch.export.load(program)  # before the model module is imported: the placeholder
assert "generated.gemma3.modeling_gemma3" not in sys.modules
first = outputs(before)  # its unflatten imports the module and builds the real class
from generated.gemma3 import modeling_gemma3

assert type(first) is modeling_gemma3.Gemma3CausalLMOutputWithPast
# the class's own registration took the name over; the placeholder stays registered for `before`
assert pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] is modeling_gemma3.Gemma3CausalLMOutputWithPast
assert placeholder in pytree.SUPPORTED_NODES
after = torch.export.load(program)  # after: the class itself
results = [first, outputs(before), outputs(after)]
# a loaded program saved again (its output spec holds the placeholder, or the class) loads and runs
for index, loaded in enumerate((before, after)):
    torch.export.save(loaded, directory / f"again{index}.pt2")
    results.append(outputs(torch.export.load(directory / f"again{index}.pt2")))
torch.save(results, directory / "orders.pt")
"""


def test_a_deferred_model_output_loads_before_and_after_its_module_is_imported_and_saves_again(saved):
    directory, references = saved
    finished = fresh_python(BOTH_ORDERS, str(directory), GEMMA3_OUTPUT)
    assert finished.returncode == 0, fresh_process_error(finished.stderr)
    results = torch.load(directory / "orders.pt", weights_only=False)
    assert len(results) == 5
    for outputs in results:
        assert type(outputs) is type(references["gemma3"])
        assert max_abs_diff(references["gemma3"], outputs) <= MAX_ABS_DIFF


def test_torch_keeps_the_last_registration_of_a_serialized_name():
    """The deferred registration relies on it: a ModelOutput class registered by transformers when its module is
    imported takes over the serialized name of its placeholder, silently. If torch starts refusing a second
    registration of a name, importing a model module after `import generated` fails; if it keeps the first, programs
    loaded later still go through the placeholder. Either way this test fails first."""
    name = "test_fresh_load.Output"
    first = type("Placeholder", (), {})
    second = type("Output", (), {})
    for cls in (first, second):
        pytree.register_pytree_node(cls, lambda x: ([], None), lambda values, context: None, serialized_type_name=name)
    try:
        assert pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] is second
        spec = pytree.treespec_loads(pytree.treespec_dumps(pytree.tree_flatten(second())[1]))
        assert spec.type is second
        assert pytree.SUPPORTED_NODES[first].unflatten_fn is not None  # the first stays registered
    finally:
        pytree._deregister_pytree_node(second)  # deletes the name, which the first still had
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = first
        pytree._deregister_pytree_node(first)


def test_a_placeholder_never_takes_a_name_that_is_registered_and_is_registered_once():
    from generated._shared import loading

    nodes = len(pytree.SUPPORTED_NODES)
    # transformers' own registration of a class already holds its name
    loading.defer_registrations("generated", {"transformers.modeling_outputs": ("CausalLMOutputWithPast",)})
    assert loading.DEFERRED["transformers.modeling_outputs.CausalLMOutputWithPast"] is None
    # the package's own tables again (an importlib.reload of the package): nothing new
    loading.defer_registrations("generated", {".gemma3.modeling_gemma3": ("Gemma3CausalLMOutputWithPast",)})
    assert len(pytree.SUPPORTED_NODES) == nodes


class _ReadsEncoderOutputs(torch.nn.Module):
    def forward(self, encoder_outputs, scale):
        return encoder_outputs.last_hidden_state * scale


def test_an_encoder_output_object_input_reaches_the_fresh_process_built_from_its_fields(tmp_path):
    # no weights-only load accepts a ModelOutput, even allowlisted (an OrderedDict subclass): the harness writes its
    # fields and the fresh process builds the object again, as a runtime builds it from an encoder's outputs
    from transformers.modeling_outputs import BaseModelOutput

    from exportsmith.verify.check import Case, plain_inputs, save_and_load

    def inputs():
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=torch.ones(2, 3)), "scale": torch.full((3,), 2.0)}

    torch.save(inputs(), tmp_path / "inputs.pt")
    with pytest.raises(Exception, match="SETITEM"), torch.serialization.safe_globals([BaseModelOutput]):
        torch.load(tmp_path / "inputs.pt", weights_only=True)
    assert set(plain_inputs(inputs())["encoder_outputs"]) == {"__model_output__", "last_hidden_state"}
    exported = torch.export.export(_ReadsEncoderOutputs(), (), inputs(), strict=False)
    loaded = save_and_load(exported, Case("example", 2, 3, 0, inputs))
    assert torch.equal(loaded, torch.full((2, 3), 2.0))
