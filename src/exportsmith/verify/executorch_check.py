"""Verify one generated model through ExecuTorch: torch.export, XNNPACK lowering, the ExecuTorch runtime vs eager.

`verify_executorch(model_type, package)` builds the original and the generated model exactly as `check.build_pair`
does, then for each program of `check.programs_for` (decode with a cache and prefill for a causal LM, else one
forward):

1. exports the generated copy, set up for inference on XNNPACK as transformers' own ExecuTorch exporter sets a model
   up (`prepare_for_xnnpack`: no grad, `batched_mm` experts), with torch.export in the named-dims style `verify`
   saves (`check.varying_dims(program, "named")`), each other varying dim (a cache's length, a mask's) bounded by
   `BOUND`: ExecuTorch plans the memory of every tensor for its largest size, and a dim without a maximum cannot be
   planned;
2. lowers it as ExecuTorch's own recipe for CPU does, `to_edge_transform_and_lower(..., partitioner=
   [XnnpackPartitioner()])` then `to_executorch()`, with SDPA on its math kernel in both traces
   (`onnx_check.one_sdpa_kernel`), and around ExecuTorch 1.4.1's bugs and gaps, each worked around by one function
   of `executorch_recipe` (docs/INTEROP.md#executorch lists them);
3. loads the program with the ExecuTorch Python runtime (`executorch.runtime.Runtime`) and runs `forward` at every
   case of the program (shapes other than the traced one: batch 1, 1-token steps on a 1-token cache, ...), and
   compares every output leaf (logits, cache tensors) with the ORIGINAL model's eager output at that case;
4. for a decoder LM or an encoder-decoder LM, runs `greedy.greedy_loops` with the lowered programs standing for the
   exported ones (`EtProgram`), against the original's `generate(do_sample=False)`: what a user who deploys the two
   ExecuTorch programs runs.

It never raises for a model's failure: a build error, an export or lowering error, a runtime error or a difference
above `EXECUTORCH_MAX_ABS_DIFF` becomes a failed `ExecutorchResult` (one of `FAILURE_KINDS`, with the first line of the
error). It refuses to run at all, raising `MissingExecutorch`, when executorch is not installed.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind
from torch.utils import _pytree as pytree

from exportsmith.verify.check import (
    CaseRecord,
    Program,
    build_pair,
    export_program,
    in_range,
    programs_for,
    varying_dims,
)
from exportsmith.verify.errors import first_line
from exportsmith.verify.executorch_recipe import (
    edge_config,
    comparisons_for_bucketize,
    comparisons_for_sort,
    conv2d_for_conv3d,
    coordinates_of_flat_nonzero,
    ints_as_lengths,
    prepare_for_xnnpack,
    slices_for_list_outputs,
    without_tensor_checks,
    xnnpack_partitioner,
    zeros_for_dynamic_empty,
)
from exportsmith.verify.onnx_check import (
    output_names,
    RuntimeResult,
    max_abs_diff,
    named_leaves,
    one_sdpa_kernel,
    original_references,
)

INSTALL_HINT = "pip install 'exportsmith[executorch]'"

# XNNPACK's float32 kernels (GEMM, softmax) accumulate in another order than torch's, as ONNX Runtime's do: outputs
# differ at rounding level; a wrong mask, branch or cache slice moves logits by 1e-2 or more.
EXECUTORCH_MAX_ABS_DIFF = 1e-4

# The largest size of a dim `verify` leaves `Dim.DYNAMIC` (a cache's length, a mask's): ExecuTorch allocates every
# tensor at its largest size, so this is a memory budget too (a 128-position cache of the tiny models).
BOUND = 128

FAILURE_KINDS = ("build", "export-error", "lowering-error", "runtime-error", "mismatch", "greedy-mismatch")


class MissingExecutorch(ImportError):
    """executorch is not installed."""


@dataclass
class ExecutorchResult(RuntimeResult):
    """`export_seconds`: ExecuTorch's lowering of each exported program."""

    runtime: ClassVar[str] = "ExecuTorch"
    kinds: ClassVar[tuple[str, ...]] = FAILURE_KINDS


def require_executorch() -> None:
    """Raise MissingExecutorch, naming the extra to install, unless executorch can be imported."""
    if importlib.util.find_spec("executorch") is None:
        raise MissingExecutorch(f"ExecuTorch verification needs executorch: {INSTALL_HINT}")


def verify_executorch(model_type: str, package: str = "generated") -> ExecutorchResult:
    """Verify `<package>.<module>`'s model class of `model_type` through ExecuTorch; raises only if it is missing."""
    require_executorch()
    result = ExecutorchResult(model_type)
    try:
        original, generated = build_pair(model_type, package)
        prepare_for_xnnpack(generated)
        references = original_references(original, programs_for(original))
        # the same cases, with the generated copy's own cache (its layer classes are its own), as `verify` does
        programs = in_range(programs_for(original, cache_model=generated), references)
    except Exception as error:
        return result.fail("build", first_line(error))

    methods = {}
    for program in programs:
        with one_sdpa_kernel():  # the export and the edge dialect's re-trace must agree on SDPA's output layout
            try:
                exported = export_program(generated, program.cases[0].inputs(), bounded_dims(program))
            except Exception as error:
                return result.fail("export-error", f"{program.name}: {first_line(error)}")
            try:
                started = time.perf_counter()
                method = EtProgram(exported)
                result.export_seconds[program.name] = time.perf_counter() - started
            except Exception as error:
                return result.fail("lowering-error", f"{program.name}: {first_line(error)}")
        methods[program.name] = method
        for case in program.cases:
            record = CaseRecord(program.name, case.name, case.batch, case.new_tokens, case.past)
            try:
                inputs = case.inputs()
                actual = named_leaves(method(**inputs), output_names(inputs))
            except Exception as error:
                record.error = first_line(error)
            else:
                record.max_diff = max_abs_diff(references[program.name, case.name], actual)
            result.cases.append(record)

    return result.conclude(original, generated, methods, EXECUTORCH_MAX_ABS_DIFF, "runtime-error")


def bounded_dims(program: Program) -> dict:
    """`verify`'s named dims for `program`, each `Dim.DYNAMIC` given a maximum (ExecuTorch needs one): `BOUND`, or the
    largest size the program's cases give that dim of a top-level input, when larger (neomme's and inkling's
    `pixel_values` of 3 images: 192 patches; a bound below it fails the case at `set_inputs`, error 0x10)."""
    dynamic = torch.export.Dim.DYNAMIC
    cases = [case.inputs() for case in program.cases]

    def tensor_dims(spec) -> bool:  # a tensor's {dim: Dim} (the other leaves: None, Dim.AUTO for ints)
        return isinstance(spec, dict) and all(isinstance(dim, int) for dim in spec)

    def largest(name: str, dim: int) -> int:
        sizes = [inputs[name].shape[dim] for inputs in cases if isinstance(inputs.get(name), torch.Tensor)]
        return max([BOUND, *sizes])

    def bound(spec, name: str | None = None):
        if tensor_dims(spec):
            return {
                dim: dynamic(max=largest(name, dim) if name else BOUND) if value is dynamic else value
                for dim, value in spec.items()
            }
        return spec

    shapes = varying_dims(program, "named")
    return {
        name: bound(value, name) if tensor_dims(value) else pytree.tree_map(bound, value, is_leaf=tensor_dims)
        for name, value in shapes.items()
    }


class EtProgram:
    """An exported program lowered to ExecuTorch (XNNPACK) and loaded in the ExecuTorch runtime, called as the
    program is: inputs (a cache object among them) in, and the model's output rebuilt from the runtime's flat outputs
    with the program's output tree spec out. The runtime returns, in the lowered program's output order, the new
    value of every input the program updates in place (a Mamba layer's conv state, before lowering a `copy_` into the
    input) and every user output, constants included; only the user outputs are the model's. The runtime takes
    every user input of the program in order, the ones it holds as constants too: inputs with the program's tree spec
    go in as they flatten; keyword inputs in another order or with other keys (generate()'s calls) by the names torch
    gives the program's inputs (`cache.layers.0.keys` is `cache_layers_0_keys`), a constant the call lacks with the
    value it was traced with; an int input as the empty tensor of its length (`ints_as_lengths`)."""

    def __init__(self, exported: torch.export.ExportedProgram):
        from executorch.exir import to_edge_transform_and_lower
        from executorch.runtime import Runtime

        signature = exported.graph_signature
        self.in_spec, self.out_spec = exported.call_spec.in_spec, exported.call_spec.out_spec
        self.inputs = [s.arg for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
        slices_for_list_outputs(exported)
        comparisons_for_bucketize(exported)
        coordinates_of_flat_nonzero(exported)
        conv2d_for_conv3d(exported)
        comparisons_for_sort(exported)
        without_tensor_checks(exported)
        zeros_for_dynamic_empty(exported)
        self.lengths = set(ints_as_lengths(exported))
        lowered = to_edge_transform_and_lower(
            exported, partitioner=[xnnpack_partitioner()], compile_config=edge_config()
        ).to_executorch()
        specs = lowered.exported_program().graph_signature.output_specs
        self.returned = [spec.kind for spec in specs if spec.kind != OutputKind.BUFFER_MUTATION]
        # the runtime reads the program from this buffer, and a method from its program, without owning either
        self.buffer = lowered.buffer
        self.program = Runtime.get().load_program(self.buffer)
        self.method = self.program.load_method("forward")

    def __call__(self, *args, **inputs):
        leaves, spec = pytree.tree_flatten((args, inputs))
        if spec != self.in_spec:
            if args:
                raise RuntimeError("positional inputs that do not match the exported program's input tree spec")
            leaves = self.by_name(inputs)
        feed = [
            (
                torch.empty(leaf, 0)
                if i in self.lengths
                else leaf.contiguous() if isinstance(leaf, torch.Tensor) else leaf
            )
            for i, leaf in enumerate(leaves)
        ]
        values = self.method.execute(feed)
        if len(values) != len(self.returned):
            raise RuntimeError(
                f"the runtime returned {len(values)} values, the lowered program has {len(self.returned)}"
            )
        outputs = [value for value, kind in zip(values, self.returned) if kind == OutputKind.USER_OUTPUT]
        return pytree.tree_unflatten(outputs, self.out_spec)

    def by_name(self, inputs: dict) -> list:
        """The program's user inputs, in order, taken from keyword `inputs` by name."""
        named = {name.replace(".", "_"): leaf for name, leaf in named_leaves(inputs, {}).items()}
        leaves = []
        for arg in self.inputs:
            if arg.name in named:
                leaves.append(named[arg.name])
            elif isinstance(arg, ConstantArgument):
                leaves.append(arg.value)
            else:
                raise RuntimeError(f"the inputs hold no {arg.name}, an input of the exported program")
        return leaves
