"""ONNX through `torch.onnx.export(dynamo=True)` and ONNX Runtime: `exportsmith.verify.onnx_check.verify_onnx`.

Skipped as a whole without the `onnx` extra (`pip install 'exportsmith[onnx]'`). Covers: the generated llama end to
end at every evaluation case with readable graph input/output names; that a copy which differs only under export is
reported as a mismatch; a model whose output is a bare tensor (named `output`); that a model's failure comes back as
a result; a mixture-of-experts decoder (mixtral) end to end, and the ONNX translation of its experts op
(`onnx_translations`) against the op itself; the error naming the extra when a package is missing; and one encoder
(bert), which is exported from the ORIGINAL `transformers.BertModel`, since exportsmith generates nothing for bert yet.
"""

import re
import sys
import types

import pytest

for _package in ("onnx", "onnxscript", "onnxruntime"):
    pytest.importorskip(_package)

import numpy as np  # noqa: E402
import onnxruntime  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

from exportsmith.verify.inputs import DECODE_CASES, PREFILL_CASES  # noqa: E402
from exportsmith.verify.onnx_check import (  # noqa: E402
    ONNX_MAX_ABS_DIFF,
    OUTPUT_NAMES,
    MissingOnnxDependencies,
    named_leaves,
    one_sdpa_kernel,
    output_names,
    quiet_onnx_registry,
    verify_onnx,
)


def test_generated_llama_through_onnx_matches_eager_at_every_case():
    result = verify_onnx("llama")
    assert result.ok, result.summary
    expected_cases = {("decode", case.name) for case in DECODE_CASES} | {
        ("prefill", case.name) for case in PREFILL_CASES
    }
    assert {(record.program, record.name) for record in result.cases} == expected_cases
    assert all(record.error is None and record.max_diff <= ONNX_MAX_ABS_DIFF for record in result.cases)
    assert any(record.batch == 1 and record.new_tokens == 1 and record.past for record in result.cases)
    cache = [f"layers.{layer}.{kind}" for layer in (0, 1) for kind in ("keys", "values")]
    assert result.input_names["decode"] == ["input_ids", "attention_mask"] + [f"past.{name}" for name in cache]
    assert result.input_names["prefill"] == ["input_ids", "attention_mask"]
    for program in ("decode", "prefill"):
        assert result.output_names[program] == ["logits"] + [f"present.{name}" for name in cache]
    assert set(result.export_seconds) == {"decode", "prefill"}
    assert result.summary.startswith("llama: ONNX ok max|diff|=")
    # what a user who deploys the two graphs runs: greedy loops through ORT alone give generate()'s tokens
    assert [(loop["batch"], loop["prompt"]) for loop in result.greedy] == [(b, p) for b in (1, 2) for p in (1, 2, 12)]
    assert all(loop["match"] for loop in result.greedy), result.greedy


def test_an_onnx_decode_graph_that_picks_another_token_fails_the_greedy_loop(monkeypatch):
    from exportsmith.verify import onnx_check

    plain_call = onnx_check.OrtProgram.__call__

    def second_best_at_the_third_decode_step(self, **inputs):
        out = plain_call(self, **inputs)
        if "cache" in inputs and inputs["input_ids"].shape[1] == 1:
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 3:
                second = out.logits[:, -1].topk(2).indices[:, 1]
                out.logits[torch.arange(len(second)), -1, second] = out.logits[:, -1].max(-1).values + 1.0
        return out

    monkeypatch.setattr(onnx_check.OrtProgram, "__call__", second_best_at_the_third_decode_step)
    result = verify_onnx("llama")
    assert result.failure == "greedy-mismatch", result.summary
    assert result.message.startswith("batch1-prompt1: differs from step 3")


def test_a_copy_that_differs_only_under_export_is_a_mismatch(monkeypatch):
    import generated.llama

    class LlamaForCausalLM(generated.llama.LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, cache=None, use_cache=None):
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=use_cache)
            if torch.compiler.is_exporting():
                out.logits = out.logits + 1e-3
            return out

    module = types.ModuleType("onnx_perturbed_llama.llama.modeling_llama")
    module.LlamaForCausalLM = LlamaForCausalLM
    for name in ("onnx_perturbed_llama", "onnx_perturbed_llama.llama"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "onnx_perturbed_llama.llama.modeling_llama", module)
    result = verify_onnx("llama", package="onnx_perturbed_llama")
    assert result.failure == "mismatch", result.summary
    assert all(record.max_diff == pytest.approx(1e-3, abs=ONNX_MAX_ABS_DIFF) for record in result.cases)


def test_bare_tensor_and_tuple_outputs_are_named_under_output():
    tensor = torch.zeros(2)
    assert list(named_leaves(tensor, OUTPUT_NAMES)) == ["output"]
    assert list(named_leaves((tensor, tensor), OUTPUT_NAMES)) == ["output.0", "output.1"]
    assert list(named_leaves({"logits": tensor, "cache": [tensor]}, OUTPUT_NAMES)) == ["logits", "present.0"]


def test_a_model_whose_output_is_a_bare_tensor_through_onnx(monkeypatch):
    """FlavaImageCodebook returns a tensor, not a ModelOutput (so do vocoders and some vision towers); its ONNX
    output is named `output`. The package holds transformers' own class, as if generated unchanged."""
    import generated  # noqa: F401  registers the cache pytree nodes, which `build_pair` requires
    from transformers.models.flava import modeling_flava

    module = types.ModuleType("onnx_bare_output.flava.modeling_flava")
    module.FlavaImageCodebook = modeling_flava.FlavaImageCodebook
    for name in ("onnx_bare_output", "onnx_bare_output.flava"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "onnx_bare_output.flava.modeling_flava", module)
    result = verify_onnx("flava_image_codebook", package="onnx_bare_output")
    assert result.ok, result.summary
    assert result.output_names == {"forward": ["output"]}
    assert len(result.cases) == 3 and result.max_diff <= ONNX_MAX_ABS_DIFF


def test_moe_decoder_mixtral_through_onnx_matches_eager_at_every_case():
    """The experts of mixtral (transformers' default `grouped_mm` implementation) run the custom op
    `transformers::grouped_mm_fallback` under export, which ONNX gets from `onnx_translations`."""
    result = verify_onnx("mixtral")
    assert result.ok, result.summary
    assert {record.program for record in result.cases} == {"decode", "prefill"}
    assert len(result.cases) == len(DECODE_CASES) + len(PREFILL_CASES)


def ort_session(model, example: tuple, dynamic_shapes: tuple, translations: bool = True):
    """`model` through `torch.onnx.export(dynamo=True)` at `example`, with exportsmith's translations unless told
    otherwise, as an ONNX Runtime session."""
    from exportsmith.verify.onnx_translations import translation_table

    with quiet_onnx_registry():
        program = torch.onnx.export(
            model,
            example,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            custom_translation_table=translation_table() if translations else None,
            verbose=False,
        )
    return onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


class GroupedMatmul(torch.nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, rows: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch.ops.transformers.grouped_mm_fallback(rows, self.weight, offs)


def test_grouped_mm_fallback_translation_matches_the_op_for_any_routing():
    """Exported once, run in ONNX Runtime with other token counts and expert offsets: experts with no rows, all rows
    to one expert, and rows past the last offset (which the op leaves zero)."""
    import transformers.integrations.moe  # noqa: F401  registers the op

    from exportsmith.verify.onnx_translations import translation_table

    generator = torch.Generator().manual_seed(0)
    model = GroupedMatmul(torch.randn(4, 8, 6, generator=generator)).eval()
    example = (torch.randn(6, 8, generator=generator), torch.tensor([1, 3, 5, 6], dtype=torch.int32))
    with quiet_onnx_registry():
        program = torch.onnx.export(
            model,
            example,
            dynamo=True,
            dynamic_shapes=({0: torch.export.Dim.DYNAMIC}, None),
            custom_translation_table=translation_table(),
            verbose=False,
        )
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for count, offs in ((6, [1, 3, 5, 6]), (5, [0, 0, 5, 5]), (7, [2, 2, 4, 4]), (1, [0, 1, 1, 1]), (3, [0, 0, 0, 0])):
        rows = torch.randn(count, 8, generator=generator)
        offs = torch.tensor(offs, dtype=torch.int32)
        with torch.no_grad():
            expected = model(rows, offs).numpy()
        (actual,) = session.run(None, {"rows": rows.numpy(), "offs": offs.numpy()})
        assert actual.shape == expected.shape == (count, 6)
        assert np.abs(actual - expected).max() <= ONNX_MAX_ABS_DIFF, offs
        assert not actual[int(offs[-1]) :].any()


class AllTrue(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        torch._check_tensor_all(x > -10)  # what transformers' `torch_compilable_check` records on a tensor
        return torch.ops.aten._is_all_true(x > 0), x + 1


def test_is_all_true_translation_gives_the_op_for_any_input():
    """`aten._is_all_true` (transformers' tensor checks under export) is translated: the check's copy is removed with
    its assertion, and the op's value is torch's at other sizes, an empty tensor included."""
    session = ort_session(AllTrue(), (torch.ones(3),), ({0: torch.export.Dim.DYNAMIC},))
    for values in ([1.0, 2.0], [1.0, -2.0], [], [-1.0], [3.0], [0.0, 5.0, 6.0]):
        x = torch.tensor(values, dtype=torch.float32).reshape(-1)
        all_true, plus_one = session.run(None, {"x": x.numpy()})
        assert bool(all_true) == bool(torch.ops.aten._is_all_true(x > 0)), values
        assert np.array_equal(plus_one, (x + 1).numpy())


class InverseErf(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erfinv(x)


def test_erfinv_translation_is_torchs_erfinv_to_float_rounding():
    """`aten.erfinv` (gemma3n's activation sparsity: the normal quantile of a config constant) has no ONNX op and no
    torchlib translation; `onnx_translations.erfinv` is within a few float32 roundings of torch's, over (-1, 1), and
    gives inf at -1 and 1 and NaN outside, as torch does."""
    session = ort_session(InverseErf(), (torch.zeros(5),), ({0: torch.export.Dim.DYNAMIC},))
    x = torch.cat([torch.linspace(-1, 1, 20001), torch.tensor([1 - 1e-7, -1 + 1e-7, 0.9, -1.5, 1.5])])
    (actual,) = session.run(None, {"x": x.numpy()})
    actual, expected = torch.from_numpy(actual), torch.erfinv(x)
    finite = expected.isfinite()
    assert torch.equal(actual[~finite].nan_to_num(), expected[~finite].nan_to_num())  # -inf, inf and NaN where torch
    assert torch.allclose(actual[finite], expected[finite], rtol=1e-6, atol=1e-6)


class TinyEpsilonNorm(torch.nn.Module):
    """muse_spark's post-expert RMSNorm (`post_norm_eps` 1e-8) after a projection whose rows are of the epsilon's
    size, as the tiny model's are."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 16, bias=False)
        torch.nn.init.normal_(self.proj.weight, std=0.02, generator=torch.Generator().manual_seed(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-8)


def test_an_epsilon_the_onnx_optimizer_takes_for_zero_is_kept():
    """onnxscript's optimizer rewrites `x + c` to `x` when c is within 1e-8 of 0: torch.onnx's default export drops
    the norm's epsilon and ONNX Runtime's result differs (a silent wrong result, max|diff| about 1e-3 here).
    `export_onnx` finds the constant (`no_op_hazards`) and leaves that graph unoptimized: the values are torch's."""
    from exportsmith.verify.onnx_check import export_onnx, no_op_hazards

    model = TinyEpsilonNorm().eval()
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1)) * 0.05
    with torch.no_grad():
        expected = model(x).numpy()
    with quiet_onnx_registry():
        plain = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
        unoptimized = torch.onnx.export(model, (x,), dynamo=True, verbose=False, optimize=False)
    assert "Add" not in {node.op_type for node in plain.model_proto.graph.node}  # the epsilon is gone
    assert no_op_hazards(unoptimized.model) == ["Add 9.99999993922529e-09"]
    outputs = {}
    for name, program in (
        ("plain", plain),
        ("recipe", export_onnx(model, {"x": x}, {"x": {0: torch.export.Dim.DYNAMIC}})),
    ):
        session = onnxruntime.InferenceSession(
            program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        outputs[name] = np.abs(session.run(None, {"x": x.numpy()})[0] - expected).max()
    assert outputs["plain"] > 1e-4 and outputs["recipe"] <= 1e-6, outputs


def test_a_graph_the_optimizer_left_with_an_undefined_input_is_found():
    """onnxscript's optimizer made gemma4_audio's graph refer to a value nothing defines (ONNX Runtime: `Node input
    'mul_145_min_1' is not a graph input, initializer, or output of a previous node`); `export_onnx` then keeps the
    graph as translated. `undefined_values` finds such an input, and nothing in a valid graph."""
    import onnx_ir as ir

    from exportsmith.verify.onnx_check import undefined_values

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    lost = ir.Value(name="mul_145_min_1", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    good = ir.node("Relu", inputs=[x], name="relu")
    bad = ir.node("Add", inputs=[good.outputs[0], lost], name="add")
    graph = ir.Graph(inputs=[x], outputs=[bad.outputs[0]], nodes=[good, bad], opset_imports={"": 18})
    assert undefined_values(ir.Model(graph, ir_version=10)) == ["mul_145_min_1"]
    y = ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    relu = ir.node("Relu", inputs=[y])
    graph = ir.Graph(inputs=[y], outputs=[relu.outputs[0]], nodes=[relu], opset_imports={"": 18})
    assert undefined_values(ir.Model(graph, ir_version=10)) == []


class SegmentMask(torch.nn.Module):
    def forward(self, cu_seqlens: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        from generated._shared.masking_utils import block_diagonal_mask

        return block_diagonal_mask(cu_seqlens, query)


def test_block_diagonal_mask_converts_and_gives_torchs_mask_for_any_segments():
    """`segment-attention`'s mask (the vision towers of Qwen2-VL, GLM-4V, ...) goes through torch.onnx without a
    translation, and ONNX Runtime gives its values for other numbers and lengths of segments, empty ones included."""
    query = torch.zeros(1, 2, 8, 4)
    example = (torch.tensor([0, 3, 8], dtype=torch.int32), query)
    dims = ({0: torch.export.Dim.DYNAMIC}, {2: torch.export.Dim.DYNAMIC})
    session = ort_session(SegmentMask(), example, dims, translations=False)
    for lengths in ([9], [3, 7, 1], [4, 0, 6], [1, 1, 1, 1], [2, 5]):
        cu_seqlens = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
        query = torch.zeros(1, 2, sum(lengths), 4)
        (actual,) = session.run(None, {"cu_seqlens": cu_seqlens.numpy(), "query": query.numpy()})
        assert np.array_equal(actual, SegmentMask()(cu_seqlens, query).numpy()), lengths


def test_an_output_field_named_like_an_input_gets_another_graph_name():
    """gemma3n's audio encoder returns the `audio_mel_mask` it takes (downsampled): ONNX Runtime refuses a graph that
    names two values `audio_mel_mask` (`Duplicate definition of name`). The cache keeps its past/present names."""
    mask, cache = torch.ones(2, 3), {"keys": torch.zeros(1)}
    inputs = {"input_features": torch.zeros(2, 3, 4), "audio_mel_mask": mask, "past_key_values": cache}
    output = {"last_hidden_state": torch.zeros(2, 1, 4), "audio_mel_mask": mask[:, :1], "past_key_values": cache}
    in_names = set(named_leaves(inputs, {"past_key_values": "past"}))
    out_names = set(named_leaves(output, output_names(inputs)))
    assert out_names == {"last_hidden_state", "output.audio_mel_mask", "present.keys"}
    assert not in_names & out_names
    # a None is no graph value (pe_audio's text encoder returns hidden states (None, None, tensor))
    assert set(named_leaves({"hidden_states": (None, mask)}, {})) == {"hidden_states.1"}


class SizesOut(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return {"y": x + 1, "window": 8, "length": x.shape[0]}


def test_constant_numbers_of_the_output_become_graph_outputs():
    """torch.onnx cannot return a constant int (`'int' object has no attribute 'name'`: maskformer-swin's spatial
    dimensions, a cache's window size); `export_onnx` returns it as a 0-d tensor, and a size that varies stays one."""
    from exportsmith.verify.onnx_check import export_onnx

    program = export_onnx(SizesOut(), {"x": torch.ones(3)}, {"x": {0: torch.export.Dim.DYNAMIC}})
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    y, window, length = session.run(None, {"x": np.ones(5, dtype=np.float32)})
    assert np.array_equal(y, np.full(5, 2.0, dtype=np.float32)) and int(window) == 8 and int(length) == 5


class KeepsItsState(torch.nn.Module):
    def forward(self, x: torch.Tensor, state: torch.Tensor):
        return {"y": x * 2, "state": state}  # a cache layer a step leaves as it is


@pytest.mark.parametrize("optimized", [True, False])
def test_an_input_returned_as_it_is_gets_an_output_of_its_own(monkeypatch, optimized: bool):
    """An ONNX value has one name: an output that is a graph input becomes an `Identity` of it, so that the output
    can be named apart from the input and ONNX Runtime returns it. An optimized graph has one; a graph left unoptimized
    (muse_spark's, for its epsilon: `no_op_hazards`) has none of its own."""
    from exportsmith.verify import onnx_check

    if not optimized:
        monkeypatch.setattr(onnx_check, "no_op_hazards", lambda model: ["Add 1e-08"])
    dims = {"x": {0: torch.export.Dim.DYNAMIC}, "state": {0: torch.export.Dim.DYNAMIC}}
    program = onnx_check.export_onnx(KeepsItsState(), {"x": torch.ones(3), "state": torch.zeros(2)}, dims)
    graph = program.model.graph
    assert not any(value.is_graph_input() for value in graph.outputs)
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    state = np.arange(4, dtype=np.float32)
    x_name, state_name = (value.name for value in session.get_inputs())
    y, returned = session.run(None, {x_name: np.ones(5, dtype=np.float32), state_name: state})
    assert np.array_equal(y, np.full(5, 2.0, dtype=np.float32)) and np.array_equal(returned, state)


class FoldsAConstant(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return x * (torch.ones(1) * 3)


def test_a_graph_the_optimizer_breaks_is_exported_again_and_kept_as_translated(monkeypatch):
    """When the optimized graph has an input nothing defines (gemma4_audio's), `export_onnx` returns the graph as
    translated, as `optimize=False` gives it (the optimizer would fold the constant product here)."""
    from exportsmith.verify import onnx_check

    dims = {"x": {0: torch.export.Dim.DYNAMIC}}
    optimized = len(onnx_check.export_onnx(FoldsAConstant(), {"x": torch.ones(3)}, dims).model.graph)
    monkeypatch.setattr(onnx_check, "undefined_values", lambda model: ["broken"])
    kept = onnx_check.export_onnx(FoldsAConstant(), {"x": torch.ones(3)}, dims)
    assert len(kept.model.graph) > optimized
    session = onnxruntime.InferenceSession(kept.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.ones(4, dtype=np.float32)})
    assert np.array_equal(y, np.full(4, 3.0, dtype=np.float32))


def test_a_model_failure_is_a_result_not_an_exception():
    result = verify_onnx("llama", package="no_such_package_anywhere")
    assert not result.ok and result.failure == "build" and "no_such_package_anywhere" in result.message


def test_missing_onnxruntime_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    with pytest.raises(MissingOnnxDependencies, match=re.escape("onnxruntime: pip install 'exportsmith[onnx]'")):
        verify_onnx("llama")
    assert issubclass(MissingOnnxDependencies, ImportError)


def bert_inputs(batch: int, length: int) -> dict:
    """Seeded inputs; the first sequence is padded after half its length, so the padding mask matters."""
    generator = torch.Generator().manual_seed(batch * 100 + length)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[0, length // 2 + 1 :] = 0
    return {
        "input_ids": torch.randint(0, 128, (batch, length), generator=generator),
        "attention_mask": attention_mask,
        "token_type_ids": torch.zeros(batch, length, dtype=torch.long),
    }


def test_encoder_bert_original_through_onnx_matches_eager():
    """The ORIGINAL transformers BertModel (nothing is generated for bert yet): exported with dynamic batch and
    length at (2, 7), run in ONNX Runtime at other shapes, including batch 1 with one token."""
    config = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = BertModel(config).eval()
    example = bert_inputs(2, 7)
    dynamic = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    with quiet_onnx_registry():
        program = torch.onnx.export(
            model, (), kwargs=example, dynamo=True, dynamic_shapes={name: dynamic for name in example}, verbose=False
        )
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [graph_input.name for graph_input in session.get_inputs()] == list(example)
    for batch, length in ((2, 7), (1, 1), (1, 9), (3, 12)):
        inputs = bert_inputs(batch, length)
        with torch.no_grad():
            expected = pytree.tree_leaves(model(**inputs))  # last_hidden_state, pooler_output
        actual = session.run(None, {name: tensor.numpy() for name, tensor in inputs.items()})
        assert [e.shape for e in expected] == [(batch, length, 32), (batch, 32)]
        for e, a in zip(expected, actual, strict=True):
            assert np.abs(e.numpy() - a).max() <= ONNX_MAX_ABS_DIFF, (batch, length)


class LearnedBiasAttention(torch.nn.Module):
    """T5's attention in a few lines: SDPA with an additive mask computed from a parameter (its relative position
    bias), then transformers' `attn_output.transpose(1, 2).contiguous()` and `reshape(*input_shape, -1)`."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(4, 1, 1))

    def forward(self, x):
        batch, length, _ = x.shape
        query = x.view(batch, length, 4, 16).transpose(1, 2)
        mask = self.bias.expand(batch, 4, length, length)
        out = torch.nn.functional.scaled_dot_product_attention(query, query, query, attn_mask=mask)
        return out.transpose(1, 2).contiguous().reshape(batch, length, -1)


def onnx_export_error(model: torch.nn.Module, x: torch.Tensor) -> str | None:
    """The innermost error of `torch.onnx.export(dynamo=True)` of `model` at `x` (batch and length dynamic), or None."""
    dims = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    try:
        with quiet_onnx_registry():
            torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=(dims,), verbose=False, report=False)
    except Exception as error:
        while error.__cause__ is not None:
            error = error.__cause__
        return f"{type(error).__name__}: {error}"
    return None


def test_torch_onnx_fails_on_sdpa_whose_mask_requires_grad_unless_parameters_are_frozen():
    """docs/INTEROP.md (t5, mt5, umt5, pop2piano, pix2struct, oneformer, doge, ...): on the CPU, SDPA runs the flash
    kernel (output in the query's layout) when the mask does not require grad and the math kernel (contiguous output)
    when it does; torch.onnx's decomposition traces without grad and turns `.contiguous()` into nothing and the
    reshape into a view, its type-promotion pass re-runs with the parameters requiring grad, and the view fails.
    If the first assertion fails, torch fixed it: update docs/INTEROP.md and the ONNX column."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64)
    query = x.view(2, 3, 4, 16).transpose(1, 2)
    backends = {
        requires_grad: torch._fused_sdp_choice(
            query, query, query, torch.zeros(2, 4, 3, 3, requires_grad=requires_grad)
        )
        for requires_grad in (False, True)
    }
    assert backends == {False: SDPBackend.FLASH_ATTENTION.value, True: SDPBackend.MATH.value}

    model = LearnedBiasAttention()
    error = onnx_export_error(model, x)
    assert error is not None and re.match(r"ValueError: Cannot view a tensor with shape", error), error
    with one_sdpa_kernel():  # the recipe's workaround: every trace sees the math kernel
        assert onnx_export_error(model, x) is None
    model.requires_grad_(False)  # another: no mask requires grad
    assert onnx_export_error(model, x) is None
