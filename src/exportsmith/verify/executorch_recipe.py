"""The ExecuTorch recipe: what `executorch_check` does to a model and to its exported program, beyond ExecuTorch's own
CPU recipe (`to_edge_transform_and_lower(..., partitioner=[XnnpackPartitioner()])`, then `to_executorch()`), so
that the lowered program runs at every shape of the exported one and computes what it computes.

Each function works around one ExecuTorch 1.4.1 behaviour (or sets the model up as transformers' own ExecuTorch
exporter does), met on real model types and reduced in `tests/test_executorch.py`, where the stock path is shown
failing. The graph rewrites keep the program's values: a split's outputs are the slices they are, an `empty` that the
program fills is zeros, an int input is the size of an empty tensor, a `bucketize` the comparisons it counts, a
`nonzero` the coordinates of its flat indices, a `sort` the ranks its comparisons give (the stable order), and a
3-d convolution the 2-d ones over its frames (the same products, summed in another order); only tensor checks
(assertions) go.
docs/INTEROP.md#executorch says what each fixes.
"""

from __future__ import annotations

import operator

import torch
from torch.export.graph_signature import InputKind, InputSpec, SymIntArgument, TensorArgument


def prepare_for_xnnpack(model: torch.nn.Module) -> None:
    """Set `model` up as transformers' own ExecuTorch exporter does for XNNPACK, for inference:
    - parameters that do not require grad: lowering re-traces the program, and an in-place op on a parameter that
      requires grad is refused there ("a leaf Variable that requires grad is being used in an in-place operation":
      bamba's and falcon_h1's Mamba mixers);
    - mixture-of-experts layers on transformers' `batched_mm` experts: the default, `grouped_mm`, counts tokens per
      expert with `torch.histc` and multiplies with `torch._grouped_mm`, neither of which the edge dialect or
      ExecuTorch's kernels have. `set_experts_implementation` sets each sub-model's own (the language model of a
      composite, kimi_k25's; its top-level class has no experts of its own) and leaves models without experts as
      they are.
    The references stay the original model's, with its default experts."""
    model.requires_grad_(False)
    if hasattr(model, "set_experts_implementation"):  # a transformers PreTrainedModel
        model.set_experts_implementation("batched_mm")


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
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        for user in list(node.users):
            index = user.args[1]
            with graph.inserting_before(user):
                if node.target is aten.unbind.int:
                    view = graph.call_function(aten.select.int, (source, dim, index))
                else:
                    view = graph.call_function(aten.slice.Tensor, (source, dim, bounds[index], bounds[index + 1]))
            view.meta.update(user.meta)
            user.replace_all_uses_with(view)
            graph.erase_node(user)
        graph.erase_node(node)
        removed += 1
    exported.graph_module.recompile()
    return removed


XNNPACK_MAX_DIMS = 6  # XNNPACK's XNN_MAX_TENSOR_DIMS


def xnnpack_partitioner():
    """ExecuTorch's `XnnpackPartitioner`, except for these kinds of node its 1.4.1 configs take and XNNPACK then gets
    wrong; left out of the delegate, they run on ExecuTorch's portable kernels:
    - `gelu(x, approximate="tanh")`: XNNPACK's GELU is the erf one, and its lowering drops `approximate`, so the
      program silently computes another function (4.7e-4 apart at |x| ~ 2: every gemma's MLP, logits off by 2e-4);
    - an `unsqueeze` whose output has more than one dynamic dim: XNNPACK lowers it to a static reshape, which allows
      one, but the config checks only the unsqueezed dim, so lowering fails ("XNNPACK reshape only supports 1 dynamic
      dimension"): `torch.stack(..., dim=-1)` of a `[batch, tokens, ...]` tensor in a rotary embedding;
    - a 1-d convolution of an input with more than one dynamic dim, for the same reason: XNNPACK runs it as a 2-d one
      between an unsqueeze and a squeeze it adds itself (`Conv1dUnsqueezePass`), on `[batch, channels, length]`
      (convbert's separable convolution);
    - a `max` over a dim given as negative, or without `keepdim`: XNNPACK's max-pool lowering of it takes the dim as
      written and only 2 or 3 with `keepdim`, but the config checks neither ("amax.default only supports dim == 2 or
      dim == 3": gpt_oss's attention sinks, `max(dim=-1, keepdim=True)` of a 4-d tensor);
    - a `prelu` of an input that is not 4-d: XNNPACK runs PReLU channels-last, and its channels-last pass can convert
      only a 4-d input ("Attempting to convert non-NHWC compatible node to NHWC": dab-detr's `[batch, 1, d]` PReLU);
    - any node with a tensor of more than `XNNPACK_MAX_DIMS` dims, which XNNPACK cannot define (the method then fails
      to load, "Failed to define tensor ... xnn_status_unsupported_parameter"), but no config checks: inkling's
      vision patches, permuted as an 8-d tensor.

    And a partition's clone whose input is one of its outputs too (`output_clones_of_outputs`) is left out of it."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.gemm_configs import ConvolutionConfig
    from executorch.backends.xnnpack.partition.config.node_configs import MaxDimConfig, PreluConfig
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

    class MaxOverDim2Or3(MaxDimConfig):
        def check_constraints(self, node: torch.fx.Node, ep: torch.export.ExportedProgram) -> bool:
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
            return dim in (2, 3) and keepdim and super().check_constraints(node, ep)

    class PreluOn4d(PreluConfig):
        def check_constraints(self, node: torch.fx.Node, ep: torch.export.ExportedProgram) -> bool:
            return node.args[0].meta["val"].dim() == 4 and super().check_constraints(node, ep)

    def within_xnnpack_dims(config: type) -> type:
        def check_constraints(self, node: torch.fx.Node, ep: torch.export.ExportedProgram) -> bool:
            values = [node.meta.get("val"), *(arg.meta.get("val") for arg in node.all_input_nodes)]
            ranks = [value.dim() for value in values if isinstance(value, torch.Tensor)]
            return max(ranks, default=0) <= XNNPACK_MAX_DIMS and config.check_constraints(self, node, ep)

        return type(config.__name__, (config,), {"check_constraints": check_constraints})

    replaced = {
        MaxDimConfig: MaxOverDim2Or3,
        GeluConfig: ErfGelu,
        UnsqueezeCopyConfig: UnsqueezeOneDynamicDim,
        ConvolutionConfig: ConvolutionOneDynamicDimIn1d,
        PreluConfig: PreluOn4d,
    }
    configs = [within_xnnpack_dims(replaced.get(config, config)) for config in ALL_PARTITIONER_CONFIGS]

    class OutputClonesOutside(XnnpackPartitioner):
        def generate_partitions(self, ep: torch.export.ExportedProgram) -> list:
            partitions = super().generate_partitions(ep)
            for partition in partitions:
                for node in output_clones_of_outputs(set(partition.nodes)):
                    partition.remove_node(node)
            return [partition for partition in partitions if any(node.op != "placeholder" for node in partition.nodes)]

    return OutputClonesOutside(configs=configs)


def output_clones_of_outputs(nodes: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """The clones among the outputs of the partition of `nodes` whose input is an output too, or the input of another
    such clone. XNNPACK removes every clone it is given (its configs take only those that keep the dim order), and the
    partition's outputs then name the same value twice: lowering fails ("Output node ... is already in the inputs":
    pe_audio's patch embedding, a permute read outside and through a clone)."""
    from executorch.exir.dialects._ops import ops

    clone_ops = (ops.edge.aten.clone.default, ops.edge.dim_order_ops._clone_dim_order.default)
    outputs = [node for node in nodes if set(node.users) - nodes]
    clones = [node for node in outputs if node.target in clone_ops]
    roots: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for clone in clones:
        root = clone.args[0]
        while root in nodes and root.target in clone_ops:
            root = root.args[0]
        roots.setdefault(root, []).append(clone)
    return [
        clone
        for root, of_root in roots.items()
        for clone in of_root
        if len(of_root) > 1 or (root in nodes and root in outputs)
    ]


def without_tensor_checks(exported: torch.export.ExportedProgram) -> int:
    """Remove, in place, the runtime checks of tensor conditions, and return how many. transformers'
    `torch_compilable_check` asserts them with `torch._check_tensor_all`, which leaves in the program
    `_is_all_true(cond)`, its `item()` and the assertions on that number: `_is_all_true` is not in the core ATen
    opset the edge dialect accepts, nor is the `torch.sym_ite` after it. torch.onnx drops such assertions too; an
    input that fails the check gets no error from the lowered program, every other input the same result. Only
    checks whose every node is part of the check go."""
    graph = exported.graph_module.graph
    check_ops = {aten.item.default, torch.sym_ite, aten._assert_scalar.default, operator.ge, operator.le, operator.eq}
    order = {node: position for position, node in enumerate(graph.nodes)}
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
        for part in sorted(check, key=order.get, reverse=True):  # users before what they use
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


def _fake_mode(graph: torch.fx.Graph):
    """The fake mode of the program's input values, to give new nodes theirs."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode([node.meta.get("val") for node in graph.nodes if node.op == "placeholder"])


def _caller(graph: torch.fx.Graph):
    """A function that adds a call node to `graph` at its insertion point, with the value the call gives in the
    program's fake mode (arguments are nodes, or constants)."""
    fake_mode = _fake_mode(graph)

    def call(target, *args, **kwargs):
        node = graph.call_function(target, args, kwargs)
        values = torch.fx.node.map_arg(args, lambda arg: arg.meta["val"])
        with fake_mode:
            node.meta["val"] = target(*values, **kwargs)
        return node

    return call


def comparisons_for_bucketize(exported: torch.export.ExportedProgram) -> int:
    """Replace, in place, each `bucketize(x, boundaries)` by the count of the boundaries it passes, and return how
    many went: `bucketize` is not a core ATen op, and ExecuTorch 1.4.1 has no kernel for it (Idefics2's and
    Idefics3's vision embeddings bucket each patch's fractional coordinates). For sorted boundaries, the index
    `bucketize` returns is the number of boundaries `b` with `not x < b` (`right=True`) or `not x <= b`: equal
    integers, NaN included (it compares false, so it counts every boundary, as `bucketize` puts it last)."""
    graph = exported.graph_module.graph
    found = [n for n in graph.nodes if n.op == "call_function" and n.target is aten.bucketize.Tensor]
    call = _caller(graph)
    for node in found:
        x, boundaries = node.args[:2]
        out_int32 = node.kwargs.get("out_int32", node.args[2] if len(node.args) > 2 else False)
        right = node.kwargs.get("right", node.args[3] if len(node.args) > 3 else False)
        with graph.inserting_before(node):
            below = call(
                aten.le.Tensor if not right else aten.lt.Tensor, call(aten.unsqueeze.default, x, -1), boundaries
            )
            count = call(aten.sum.dim_IntList, call(aten.logical_not.default, below), [-1])
            if out_int32:
                count = call(aten._to_copy.default, count, dtype=torch.int32)
        node.replace_all_uses_with(count)
        graph.erase_node(node)
    exported.graph_module.recompile()
    return len(found)


def conv2d_for_conv3d(exported: torch.export.ExportedProgram) -> int:
    """Replace, in place, each 3-d convolution without temporal padding or dilation by the sum of the 2-d
    convolutions of each temporal tap of its kernel over the frames that tap reads, the output frames in the batch,
    and return how many. ExecuTorch 1.4.1's portable convolution takes 3-d or 4-d inputs only and XNNPACK takes no
    3-d convolution: the method fails at run time (0x12, "Expect input tensor to be 3-D or 4-D, but got, 5": the
    tubelet embeddings of videomae, vivit, videoprism). The same products, summed in another order."""
    from torch.fx.operator_schemas import normalize_function

    graph = exported.graph_module.graph
    found = [
        node
        for node in graph.nodes
        if node.op == "call_function"
        and (
            node.target is aten.conv3d.default
            or node.target is aten.convolution.default
            and not node.args[6]
            and node.args[1].meta["val"].dim() == 5
        )
    ]
    call = _caller(graph)
    converted = 0
    for node in found:
        args = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True).kwargs
        x, weight, bias, groups = args["input"], args["weight"], args.get("bias"), args.get("groups", 1)
        # one value stands for the three dims
        stride, padding, dilation = (
            [*value] * 3 if len(value) == 1 else [*value]
            for value in (args.get("stride", [1]), args.get("padding", [0]), args.get("dilation", [1]))
        )
        if padding[0] or dilation[0] != 1:
            continue
        taps = weight.meta["val"].shape[2]
        with graph.inserting_before(node):
            frames = x.meta["val"].shape[2]  # the output's: (frames - taps) // stride + 1
            if isinstance(frames, torch.SymInt):
                length = call(operator.sub, call(aten.sym_size.int, x, 2), taps)
                frames = call(operator.add, call(operator.floordiv, length, stride[0]), 1)
            else:
                frames = (frames - taps) // stride[0] + 1
            total = None
            for tap in range(taps):
                span = call(operator.mul, call(operator.sub, frames, 1), stride[0]) if _is_node(frames) else None
                end = call(operator.add, span, tap + 1) if span is not None else tap + stride[0] * (frames - 1) + 1
                read = call(aten.slice.Tensor, x, 2, tap, end, stride[0])  # [batch, channels, frames, h, w]
                read = call(aten.flatten.using_ints, call(aten.permute.default, read, [0, 2, 1, 3, 4]), 0, 1)
                kernel = call(aten.select.int, weight, 2, tap)
                tapped = call(aten.conv2d.default, read, kernel, None, stride[1:], padding[1:], dilation[1:], groups)
                total = tapped if total is None else call(aten.add.Tensor, total, tapped)
            if bias is not None:
                total = call(aten.add.Tensor, total, call(aten.view.default, bias, [-1, 1, 1]))
            total = call(aten.unflatten.int, total, 0, [-1, frames])  # [batch, frames, out channels, h, w]
            total = call(aten.permute.default, total, [0, 2, 1, 3, 4])
        node.replace_all_uses_with(total)
        graph.erase_node(node)
        converted += 1
    exported.graph_module.recompile()
    return converted


SORT_LIMIT = 1024  # the longest static dim `comparisons_for_sort` sorts: it compares every pair of its elements


def comparisons_for_sort(exported: torch.export.ExportedProgram) -> int:
    """Replace, in place, each `sort` / `argsort` along a static dim of at most `SORT_LIMIT` elements by the ranks its
    pairwise comparisons give, and return how many. ExecuTorch 1.4.1 has no `sort` kernel (sam_hq's IoU ranking,
    vit_mae's and pp_doclayout_v2's `argsort`: "Missing operator: aten::sort.values", 0x14 at load). An element's rank
    is the count of those that sort before it: smaller (larger with `descending`; NaN counting as the largest, as
    `sort` places it), or equal and earlier. That is the stable order, which `sort(stable=True)` promises; without it
    torch leaves the order of equal elements unspecified (its CPU kernel does not keep it stable): the values are
    the same, and so are the indices where no two elements are equal."""
    from torch.fx.operator_schemas import normalize_function

    graph = exported.graph_module.graph
    sorts = (aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable)
    call, replaced = _caller(graph), 0
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in sorts]:
        args = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True).kwargs
        x, descending = args["input"], args.get("descending", False)
        value = x.meta["val"]
        dim = args.get("dim", -1) % max(value.dim(), 1)
        length = value.shape[dim] if value.dim() else 1
        if not isinstance(length, int) or length > SORT_LIMIT or value.dim() == 0:
            continue
        with graph.inserting_before(node):
            last = call(aten.movedim.int, x, dim, -1)
            mine, theirs = call(aten.unsqueeze.default, last, -1), call(aten.unsqueeze.default, last, -2)
            # before[..., i, j]: element j sorts before element i
            before = call(aten.gt.Tensor if descending else aten.lt.Tensor, theirs, mine)
            equal = call(aten.eq.Tensor, theirs, mine)
            if value.is_floating_point():
                nan_mine, nan_theirs = (call(aten.isnan.default, t) for t in (mine, theirs))
                larger = (nan_theirs, nan_mine) if descending else (nan_mine, nan_theirs)
                nan_first = call(aten.logical_and.default, larger[0], call(aten.logical_not.default, larger[1]))
                before = call(aten.logical_or.default, before, nan_first)
                equal = call(aten.logical_or.default, equal, call(aten.logical_and.default, nan_mine, nan_theirs))
            positions = call(aten.arange.default, length, dtype=torch.long, device=value.device)
            earlier = call(
                aten.lt.Tensor, call(aten.unsqueeze.default, positions, 0), call(aten.unsqueeze.default, positions, 1)
            )
            before = call(aten.logical_or.default, before, call(aten.logical_and.default, equal, earlier))
            ranks = call(aten.sum.dim_IntList, before, [-1])  # int64: each element's place
            # the element at each place: the one whose rank it is
            placed = call(
                aten.eq.Tensor, call(aten.unsqueeze.default, ranks, -2), call(aten.unsqueeze.default, positions, -1)
            )
            order = call(aten.sum.dim_IntList, call(aten.mul.Tensor, placed, positions), [-1])
            values = call(aten.movedim.int, call(aten.gather.default, last, -1, order), -1, dim)
            indices = call(aten.movedim.int, order, -1, dim)
        if node.target in (aten.argsort.default, aten.argsort.stable):
            node.replace_all_uses_with(indices)
        else:
            for user in list(node.users):
                user.replace_all_uses_with((values, indices)[user.args[1]])
                graph.erase_node(user)
        graph.erase_node(node)
        replaced += 1
    exported.graph_module.recompile()
    return replaced


def coordinates_of_flat_nonzero(exported: torch.export.ExportedProgram) -> int:
    """Replace, in place, each `nonzero(x)` (and `where(x)`, its tuple of columns) by the coordinates of the flat
    indices `nonzero(x.reshape(-1))` gives, and return how many. torch's `nonzero` result is column-major (strides
    `(1, n)`), and ExecuTorch 1.4.1 plans its output so, but its kernel writes it row-major: the program returns the
    indices transposed, silently, or an op that reads them fails at run time on their dim order (0x12: oneformer's
    `attention_mask[torch.where(...)] = False`). The flat indices are a single column, where both orders are one; each
    coordinate is the index divided by the product of the sizes after its dim, modulo its size: the same integers, in
    the same (row-major) order."""
    graph = exported.graph_module.graph
    found = [
        n
        for n in graph.nodes
        if n.op == "call_function"
        and (n.target is aten.nonzero.default or n.target is aten.where.default and len(n.args) == 1)
        and n.args[0].meta["val"].dim()
    ]
    call, fake_mode = _caller(graph), _fake_mode(graph)
    for node in found:
        x, columns = node.args[0], node.target is aten.where.default
        if columns:  # the node becomes the flat `nonzero`, with the binding of its size
            count = node.meta["val"][0].shape[0]
            bindings = node.meta.get("unbacked_bindings", {})
            node.meta["unbacked_bindings"] = {symbol: path[1:] for symbol, path in bindings.items()}
            node.target = aten.nonzero.default
        else:
            count = node.meta["val"].shape[0]
        with graph.inserting_before(node):
            sizes = [
                call(aten.sym_size.int, x, dim) if isinstance(size, torch.SymInt) else size
                for dim, size in enumerate(x.meta["val"].shape)
            ]
            strides = [1]  # of x's dims, the last one's first
            for size in reversed(sizes[1:]):
                symbolic = _is_node(strides[-1]) or _is_node(size)
                strides.append(call(operator.mul, strides[-1], size) if symbolic else strides[-1] * size)
            strides.reverse()
            node.args = (call(aten.reshape.default, x, [-1]),)
        with fake_mode:
            node.meta["val"] = torch.empty_strided((count, 1), (1, count), dtype=torch.long)
        getitems = list(node.users)
        with graph.inserting_before(node.next):
            flat = call(aten.view.default, node, [-1])
            if columns:  # each a 1-d tensor
                for getitem in getitems:
                    dim = getitem.args[1]
                    coordinate = call(aten.div.Scalar_mode, flat, strides[dim], rounding_mode="floor")
                    getitem.replace_all_uses_with(call(aten.remainder.Scalar, coordinate, sizes[dim]))
                    graph.erase_node(getitem)
            else:  # one `[n, dims]` tensor, by broadcasting (ExecuTorch's `cat` of empty columns loses their count)
                divisors, moduli = (
                    call(aten.stack.default, [call(aten.scalar_tensor.default, v, dtype=torch.long) for v in values])
                    for values in (strides, sizes)
                )
                column = call(aten.unsqueeze.default, flat, 1)
                coordinates = call(
                    aten.remainder.Tensor, call(aten.div.Tensor_mode, column, divisors, rounding_mode="floor"), moduli
                )
                node.replace_all_uses_with(coordinates, lambda user: user is not flat)
    exported.graph_module.recompile()
    return len(found)


def _is_node(value) -> bool:
    return isinstance(value, torch.fx.Node)


def ints_as_lengths(exported: torch.export.ExportedProgram) -> list[int]:
    """Replace, in place, each int input of the program by an empty tensor input whose length is the int (shape
    `[n, 0]`, no elements), and return their positions among the user inputs. ExecuTorch 1.4.1 emits an int input
    as `None` and its runtime refuses an int there (`set_inputs` error 0x12: "Input 5 was expected to have type None
    but was Int"), but a tensor's dynamic size is what it is made for. The program reads the int as that size
    (`sym_size`): the same symbol, so the same graph and ranges. A sliding-window cache layer's `cumulative_length`
    (mistral, gemma2, gemma3, ...) is such an input: the decode program serves every cache length with it."""
    graph = exported.graph_module.graph
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    fake_mode = _fake_mode(graph)
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
