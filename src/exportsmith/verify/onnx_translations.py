"""ONNX translations, for `torch.onnx.export(custom_translation_table=...)`, of ops that torchlib cannot translate
but that the programs of generated models hold. Imported only with the `onnx` extra (it needs onnxscript).

`transformers::grouped_mm_fallback` (transformers 5.x, `transformers/integrations/moe.py`): the default
(`grouped_mm`) experts implementation of mixture-of-experts blocks calls it under export when the weights are not
bfloat16, in place of `torch._grouped_mm`. The op is opaque to the exporter (a `torch.library.custom_op`), so
without a translation every MoE model fails with `DispatchError: No ONNX function found for
<OpOverload(op='transformers.grouped_mm_fallback', overload='default')>`. The translation computes what the op
computes, from standard ONNX ops: the exported program stays the one `torch.export` verifies, with the model's own
experts implementation (switching it to `batched_mm` for ONNX would export another computation than the one the
user runs, and gathers a weight matrix per token).

`aten._is_all_true` (is every element of a bool tensor true, as a 0-d bool tensor): what `torch._check_tensor_all`
records under export, and transformers' `torch_compilable_check` calls it on tensor conditions while tracing (siglip2's
`(spatial_shapes > 0).all()`, the RT-DETR decoders', ...). torch.onnx removes the assertion it feeds
(`remove_assertion_nodes`) but not the op, which torchlib does not translate: `ConversionError: Error when
translating node %_is_all_true`. Translated, the op is dead in the ONNX graph and ONNX Runtime drops it; it is
still the op's value (`ReduceMin` over the elements as 0/1, true for no elements), in case an exported graph uses it.
"""

import torch
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, TFloat, TInt
from onnxscript.onnx_opset import opset18 as op
from onnxscript.onnx_types import BOOL, INT32


def grouped_mm_fallback(input: TFloat, weight: TFloat, offs: TInt) -> TFloat:
    """`torch.ops.transformers.grouped_mm_fallback(input, weight, offs)`: rows `offs[e-1]:offs[e]` of `input` (S, K),
    sorted by expert, times `weight[e]` (E, K, N); rows past `offs[-1]` are zero. One MatMul per expert, unrolled
    (E is the static first dim of the experts' stacked parameter), then one Concat in row order."""
    experts = weight.shape[0]
    if not isinstance(experts, int):
        raise ValueError(f"grouped_mm_fallback: the number of experts must be static, got {experts}")
    rows_axis = op.Constant(value_ints=[0])
    ends = op.Cast(offs, to=INT64.dtype)
    start = op.Constant(value_ints=[0])
    blocks = []
    for expert in range(experts):
        end = op.Slice(ends, op.Constant(value_ints=[expert]), op.Constant(value_ints=[expert + 1]), rows_axis)
        rows = op.Slice(input, start, end, rows_axis)  # (tokens of this expert, K), possibly empty
        blocks.append(op.MatMul(rows, op.Gather(weight, op.Constant(value_int=expert), axis=0)))
        start = end
    # The fallback starts from zeros: rows no expert owns (tokens routed to another shard) stay zero
    tail_shape = op.Concat(op.Sub(op.Shape(input, start=0, end=1), start), op.Shape(weight, start=2, end=3), axis=0)
    blocks.append(op.Expand(op.CastLike(op.Constant(value_float=0.0), input), tail_shape))
    return op.Concat(*blocks, axis=0)


def is_all_true(self: BOOL) -> BOOL:
    """`torch.ops.aten._is_all_true(self)`: every element true. The minimum of the elements as 0/1: ONNX reduces no
    elements to the type's largest value, so an empty tensor gives true, as in torch."""
    return op.Cast(op.ReduceMin(op.Cast(self, to=INT32.dtype), keepdims=0), to=BOOL.dtype)


def translation_table() -> dict:
    """The translations whose op is registered in this process (transformers 4.x has no grouped_mm_fallback)."""
    table = {torch.ops.aten._is_all_true.default: is_all_true}
    grouped_mm = getattr(torch.ops.transformers, "grouped_mm_fallback", None)
    if grouped_mm is not None:
        table[grouped_mm.default] = grouped_mm_fallback
    return table
