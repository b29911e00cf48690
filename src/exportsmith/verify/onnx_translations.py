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

`aten.erfinv`: ONNX has no inverse error function and torchlib raises `NotImplementedError`; gemma3n's activation
sparsity computes the normal quantile of a config constant with it. Translated with Giles' float32 approximation.
"""

import torch
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, TFloat, TInt
from onnxscript.onnx_opset import opset18 as op
from onnxscript.onnx_types import BOOL, FLOAT, INT32


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


# Giles' single-precision approximation of erfinv (M. Giles, "Approximating the erfinv function", GPU Computing Gems,
# 2011): a polynomial in w = -log(1 - x^2), one for the centre (w < 5) and one in sqrt(w) for the tails
ERFINV_CENTRE = (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
    0.246640727, 1.50140941,
)  # fmt: skip
ERFINV_TAILS = (
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
    1.00167406, 2.83297682,
)  # fmt: skip


def _horner(coefficients: tuple[float, ...], w):
    p = op.CastLike(op.Constant(value_float=coefficients[0]), w)
    for coefficient in coefficients[1:]:
        p = op.Add(op.CastLike(op.Constant(value_float=coefficient), w), op.Mul(p, w))
    return p


def erfinv(self: TFloat) -> TFloat:
    """`torch.erfinv(self)`: ONNX has no such op and torchlib does not translate it (gemma3n's activation sparsity
    takes the normal distribution's quantile, `Normal(0, 1).icdf(p)`, of a config constant). Giles' approximation,
    in float32 as torch computes it (measured against torch.erfinv: a relative error of a few 1e-7, the float's own
    rounding); inf at -1 and 1 and NaN outside, as torch."""
    x = op.Cast(self, to=FLOAT.dtype)
    one = op.Constant(value_float=1.0)
    w = op.Neg(op.Log(op.Mul(op.Sub(one, x), op.Add(one, x))))
    centre = _horner(ERFINV_CENTRE, op.Sub(w, op.Constant(value_float=2.5)))
    tails = _horner(ERFINV_TAILS, op.Sub(op.Sqrt(w), op.Constant(value_float=3.0)))
    result = op.Mul(op.Where(op.Less(w, op.Constant(value_float=5.0)), centre, tails), x)
    infinite = op.Mul(x, op.Constant(value_float=float("inf")))
    return op.CastLike(op.Where(op.Equal(op.Abs(x), one), infinite, result), self)


def translation_table() -> dict:
    """The translations whose op is registered in this process (transformers 4.x has no grouped_mm_fallback)."""
    table = {torch.ops.aten._is_all_true.default: is_all_true, torch.ops.aten.erfinv.default: erfinv}
    grouped_mm = getattr(torch.ops.transformers, "grouped_mm_fallback", None)
    if grouped_mm is not None:
        table[grouped_mm.default] = grouped_mm_fallback
    return table
