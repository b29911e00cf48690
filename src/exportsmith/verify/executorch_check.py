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
   (`onnx_check.one_sdpa_kernel`), and around four ExecuTorch 1.4.1 bugs, each named where it is worked around:
   `torch.sym_max` / `torch.sym_min` let through the edge dialect's verifier (`edge_config`), list-returning ops as
   the slices they are (`slices_for_list_outputs`: else `to_edge` fixes the batch), tensor checks dropped
   (`without_tensor_checks`), and two kinds of node kept from XNNPACK (`xnnpack_partitioner`: a tanh GELU it would
   compute as the erf one, an unsqueeze it cannot reshape);
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
import operator
import time
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.export.graph_signature import (
    ConstantArgument,
    InputKind,
    InputSpec,
    OutputKind,
    SymIntArgument,
    TensorArgument,
)
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

    return result.conclude(original, methods, EXECUTORCH_MAX_ABS_DIFF, "runtime-error")


def prepare_for_xnnpack(model: torch.nn.Module) -> None:
    """Set `model` up as transformers' own ExecuTorch exporter does for XNNPACK, for inference:
    - parameters that do not require grad: lowering re-traces the program, and an in-place op on a parameter that
      requires grad is refused there ("a leaf Variable that requires grad is being used in an in-place operation":
      bamba's and falcon_h1's Mamba mixers);
    - mixture-of-experts layers on transformers' `batched_mm` experts: the default, `grouped_mm`, counts tokens per
      expert with `torch.histc` and multiplies with `torch._grouped_mm`, neither of which the edge dialect or
      ExecuTorch's kernels have.
    The references stay the original model's, with its default experts."""
    model.requires_grad_(False)
    can_set = getattr(model, "_can_set_experts_implementation", None)
    if can_set is not None and can_set():
        model.set_experts_implementation("batched_mm")


def bounded_dims(program: Program) -> dict:
    """`verify`'s named dims for `program`, each `Dim.DYNAMIC` given the maximum `BOUND` (ExecuTorch needs one)."""
    dynamic = torch.export.Dim.DYNAMIC

    def tensor_dims(spec) -> bool:  # a tensor's {dim: Dim} (the other leaves: None, Dim.AUTO for ints)
        return isinstance(spec, dict) and all(isinstance(dim, int) for dim in spec)

    def bound(spec):
        if tensor_dims(spec):
            return {dim: dynamic(max=BOUND) if value is dynamic else value for dim, value in spec.items()}
        return spec

    shapes = varying_dims(program, "named")
    return {name: pytree.tree_map(bound, value, is_leaf=tensor_dims) for name, value in shapes.items()}


def edge_config():
    """The edge dialect's config: its verifier refuses any Python function in the graph, and every decode program that
    pads its mask has `torch.sym_max` (or `torch.sym_min`); `to_executorch` maps both to ExecuTorch's prim ops
    itself, so they are let through as exceptions. (Mapping them to the prim ops before `to_edge` lowers, but the
    runtime then sizes `x[:, :max(n, 4)]` as `n`: a wrong result, not an error.)"""
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_core_aten_ops_exception_list=[torch.sym_max, torch.sym_min])


aten = torch.ops.aten

# The ops that return a list of tensors, each output a slice (or a select, unbind's) of the input along one dim.
LIST_OUTPUT_OPS = (
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.chunk.default,
    aten.tensor_split.sections,
    aten.unbind.int,
)


def slices_for_list_outputs(exported: torch.export.ExportedProgram) -> int:
    """Replace, in place, each output of a `LIST_OUTPUT_OPS` node by the `slice` (`select`) it is, and return how many
    nodes went. ExecuTorch 1.4.1's edge verifier (`EdgeOpArgValidator`) takes `len()` of such an op's first output
    where it means the list's: on a tensor whose first dim is dynamic (a batch) that is a guard, and `to_edge`
    specializes the dim to the example's size (`x.split(2, -1)` on a dynamic batch gives a program of batch 3 only).
    The runtime then refuses every other batch (`set_inputs` error 0x12) or fails to resize (`arange`, 0x12). A
    slice is the same view of the same elements, so the program computes the same; only static sizes along the
    split dim are rewritten (a symbolic one is left to the op)."""
    graph = exported.graph_module.graph
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in LIST_OUTPUT_OPS:
            continue
        if not all(user.target is operator.getitem for user in node.users):
            continue
        source = node.args[0]
        schema_dim = 1 if node.target is aten.unbind.int else 2
        dim = node.kwargs.get("dim", node.args[schema_dim] if len(node.args) > schema_dim else 0)
        dim %= source.meta["val"].dim()
        outputs = node.meta["val"]
        sizes = [output.shape[dim] if node.target is not aten.unbind.int else 1 for output in outputs]
        if not all(isinstance(size, int) for size in sizes):
            continue
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for user in list(node.users):
            index = user.args[1]
            with graph.inserting_before(user):
                if node.target is aten.unbind.int:
                    view = graph.call_function(aten.select.int, (source, dim, index))
                else:
                    end = starts[index] + sizes[index]
                    view = graph.call_function(aten.slice.Tensor, (source, dim, starts[index], end))
            view.meta.update(user.meta)
            user.replace_all_uses_with(view)
            graph.erase_node(user)
        graph.erase_node(node)
        removed += 1
    exported.graph_module.recompile()
    return removed


def xnnpack_partitioner():
    """ExecuTorch's `XnnpackPartitioner`, except for two kinds of node its 1.4.1 configs take and XNNPACK then gets
    wrong; left out of the delegate, they run on ExecuTorch's portable kernels:
    - `gelu(x, approximate="tanh")`: XNNPACK's GELU is the erf one, and its lowering drops `approximate`, so the
      program silently computes another function (4.7e-4 apart at |x| ~ 2: every gemma's MLP, logits off by 2e-4);
    - an `unsqueeze` whose output has more than one dynamic dim: XNNPACK lowers it to a static reshape, which allows
      one, but the config checks only the unsqueezed dim, so lowering fails ("XNNPACK reshape only supports 1 dynamic
      dimension"): `torch.stack(..., dim=-1)` of a `[batch, tokens, ...]` tensor in a rotary embedding;
    - a 1-d convolution of an input with more than one dynamic dim, for the same reason: XNNPACK runs it as a 2-d one
      between an unsqueeze and a squeeze it adds itself (`Conv1dUnsqueezePass`), on `[batch, channels, length]`
      (convbert's separable convolution)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.gemm_configs import ConvolutionConfig
    from executorch.backends.xnnpack.partition.config.generic_node_configs import GeluConfig, UnsqueezeCopyConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from torch.fx.experimental.symbolic_shapes import free_symbols

    class ErfGelu(GeluConfig):
        def check_constraints(self, node: torch.fx.Node, ep: torch.export.ExportedProgram) -> bool:
            approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
            return approximate == "none" and super().check_constraints(node, ep)

    class UnsqueezeOneDynamicDim(UnsqueezeCopyConfig):
        def check_constraints(self, node: torch.fx.Node, ep: torch.export.ExportedProgram) -> bool:
            dynamic = [size for size in node.meta["val"].shape if free_symbols(size)]
            return len(dynamic) <= 1 and super().check_constraints(node, ep)

    class ConvolutionOneDynamicDimIn1d(ConvolutionConfig):
        def check_constraints(self, node: torch.fx.Node, ep: torch.export.ExportedProgram) -> bool:
            one_d = len(node.args[3]) == 1
            dynamic = [size for size in node.args[0].meta["val"].shape if free_symbols(size)]
            return not (one_d and len(dynamic) > 1) and super().check_constraints(node, ep)

    replaced = {
        GeluConfig: ErfGelu,
        UnsqueezeCopyConfig: UnsqueezeOneDynamicDim,
        ConvolutionConfig: ConvolutionOneDynamicDimIn1d,
    }
    return XnnpackPartitioner(configs=[replaced.get(config, config) for config in ALL_PARTITIONER_CONFIGS])


def without_tensor_checks(exported: torch.export.ExportedProgram) -> int:
    """Remove, in place, the runtime checks of tensor conditions, and return how many. transformers'
    `torch_compilable_check` asserts them with `torch._check_tensor_all`, which leaves in the program
    `_is_all_true(cond)`, its `item()` and the assertions on that number: `_is_all_true` is not in the core ATen
    opset the edge dialect accepts, nor is the `torch.sym_ite` after it. torch.onnx drops such assertions too; an
    input that fails the check gets no error from the lowered program, every other input the same result. Only
    checks whose every node is part of the check go."""
    graph = exported.graph_module.graph
    check_ops = {aten.item.default, torch.sym_ite, aten._assert_scalar.default, operator.ge, operator.le, operator.eq}
    removed = 0
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is aten._is_all_true.default]:
        check, frontier = [node], [node]
        while frontier:
            for user in frontier.pop().users:
                if user not in check:
                    check.append(user)
                    frontier.append(user)
        if not all(part.target in check_ops for part in check[1:]):
            continue
        for part in sorted(check, key=lambda n: -list(graph.nodes).index(n)):
            graph.erase_node(part)
        removed += 1
    graph.eliminate_dead_code()
    exported.graph_module.recompile()
    return removed


def zeros_for_dynamic_empty(exported: torch.export.ExportedProgram) -> int:
    """Replace, in place, each `empty` / `new_empty` / `empty_like` of a dynamic size by the `zeros` of that size,
    and return how many. ExecuTorch 1.4.1's memory-format pass turns `empty` into `_empty_dim_order`, declared with
    `int[] size` where aten has `SymInt[]`: the call makes every dynamic size an int, and the edge program's batch
    becomes the example's (axk1's `kv_nope.new_empty(...)` that two `copy_` then fill: arange fails to resize at
    batch 1). A program reads no element of an `empty` tensor it has not written, so zeros give the same results, for
    one fill more."""
    zeros = {
        aten.new_empty.default: aten.new_zeros.default,
        aten.empty.memory_format: aten.zeros.default,
        aten.empty_like.default: aten.zeros_like.default,
    }
    replaced = 0
    for node in exported.graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in zeros:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or all(isinstance(size, int) for size in value.shape):
            continue
        if node.target is aten.empty.memory_format:
            if node.kwargs.get("memory_format") not in (None, torch.contiguous_format):
                continue
            node.kwargs = {key: value for key, value in node.kwargs.items() if key != "memory_format"}
        node.target = zeros[node.target]
        replaced += 1
    exported.graph_module.recompile()
    return replaced


def ints_as_lengths(exported: torch.export.ExportedProgram) -> list[int]:
    """Replace, in place, each int input of the program by an empty tensor input whose length is the int (shape
    `[n, 0]`, no elements), and return their positions among the user inputs. ExecuTorch 1.4.1 emits an int input
    as `None` and its runtime refuses an int there (`set_inputs` error 0x12: "Input 5 was expected to have type None
    but was Int"), but a tensor's dynamic size is what it is made for. The program reads the int as that size
    (`sym_size`): the same symbol, so the same graph and ranges. A sliding-window cache layer's `cumulative_length`
    (mistral, gemma2, gemma3, ...) is such an input: the decode program serves every cache length with it."""
    from torch._guards import detect_fake_mode

    graph = exported.graph_module.graph
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    fake_mode = detect_fake_mode([node.meta.get("val") for node in placeholders.values()])
    user_inputs = [
        i for i, spec in enumerate(exported.graph_signature.input_specs) if spec.kind == InputKind.USER_INPUT
    ]
    positions = []
    for position, i in enumerate(user_inputs):
        spec = exported.graph_signature.input_specs[i]
        if not isinstance(spec.arg, SymIntArgument):
            continue
        node = placeholders[spec.arg.name]
        with graph.inserting_before(node):
            length = graph.placeholder(f"{node.name}_length")
        with fake_mode:
            length.meta["val"] = torch.empty(node.meta["val"], 0)
        with graph.inserting_after(length):
            size = graph.call_function(aten.sym_size.int, (length, 0))
        size.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(size)
        graph.erase_node(node)
        exported.graph_signature.input_specs[i] = InputSpec(InputKind.USER_INPUT, TensorArgument(length.name), None)
        positions.append(position)
    exported.graph_module.recompile()
    return positions


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
