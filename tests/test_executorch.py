"""The ExecuTorch check: generated copies lowered to XNNPACK and run in the ExecuTorch runtime against the original's
eager outputs, at the shapes `verify` checks (a decoder LM's decode program with its cache, from a 1-token cache
on, and greedy loops against generate(); an encoder's and a vision model's forward at other batch sizes and lengths).

These need the `executorch` extra; CI runs them in an environment of their own (executorch installs torchao, which
transformers then imports with every model). Without it, only the refusal to run is tested."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

import generated  # noqa: F401  (registers the cache pytree nodes)

HAS_EXECUTORCH = importlib.util.find_spec("executorch") is not None
needs_executorch = pytest.mark.skipif(not HAS_EXECUTORCH, reason="needs the executorch extra")


@pytest.mark.skipif(HAS_EXECUTORCH, reason="executorch is installed")
def test_without_executorch_verify_says_which_extra_to_install():
    run = subprocess.run(
        [sys.executable, "-m", "exportsmith", "verify", "bert", "--executorch"], capture_output=True, text=True
    )
    assert run.returncode != 0
    assert "pip install 'exportsmith[executorch]'" in run.stderr
    assert "Traceback" not in run.stderr


@needs_executorch
def test_verify_runs_the_executorch_check_in_a_child_and_reports_it():
    run = subprocess.run(
        [sys.executable, "-m", "exportsmith", "verify", "bert", "--executorch"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "bert: ExecuTorch ok max|diff|=" in run.stdout


@needs_executorch
@pytest.mark.parametrize("model_type", ["llama", "bert", "vit"])  # a decoder LM, an encoder, a vision model
def test_generated_copy_runs_in_executorch_and_matches_eager(model_type: str):
    from exportsmith.verify.executorch_check import EXECUTORCH_MAX_ABS_DIFF, verify_executorch

    result = verify_executorch(model_type)
    assert result.ok, result.summary
    names = {case.name for case in result.cases}
    if model_type == "llama":
        # the first decode step of a 1-token prompt, and a 1-token prefill, through the lowered programs
        assert {"first-step", "first-step-batch4", "two-tokens-past1", "prefill-one-token"} <= names
        # and generate()'s tokens from greedy loops that only the two lowered programs drive (prompts of 1, 2, 12)
        assert {(loop["batch"], loop["prompt"]) for loop in result.greedy} >= {(1, 1), (2, 12)}
        assert all(loop["error"] is None and (loop["match"] or loop["tie"]) for loop in result.greedy), result.greedy
    else:
        assert any(case.batch == 1 for case in result.cases) and not result.greedy
    assert all(case.max_diff <= EXECUTORCH_MAX_ABS_DIFF for case in result.cases)


@needs_executorch
def test_a_wrong_output_is_a_mismatch(monkeypatch):
    from exportsmith.verify import executorch_check

    call = executorch_check.EtProgram.__call__

    def off_by_a_little(self, **inputs):
        output = call(self, **inputs)
        output.logits = output.logits + 1e-2
        return output

    monkeypatch.setattr(executorch_check.EtProgram, "__call__", off_by_a_little)
    result = executorch_check.verify_executorch("bert")
    assert not result.ok and result.failure == "mismatch", result.summary


class _Padded(torch.nn.Module):
    """A length padded up to a minimum, as the generated copies' masks are under export: `torch.sym_max` in the graph."""

    def forward(self, x):
        kept = torch.sym_max(x.shape[-1], 4)
        return torch.cat([x, x.new_zeros(x.shape[0], 4)], dim=-1)[:, :kept] * 2


@needs_executorch
@pytest.mark.parametrize("example", [6, 2])  # traced longer / shorter than the minimum
def test_a_length_padded_to_a_minimum_lowers_and_is_right_on_both_sides(example: int):
    from executorch.exir import to_edge_transform_and_lower

    from exportsmith.verify.executorch_check import EtProgram

    def export():
        shapes = {"x": {1: torch.export.Dim.DYNAMIC(max=64)}}
        return torch.export.export(_Padded(), (torch.randn(2, example),), dynamic_shapes=shapes, strict=False)

    with pytest.raises(AssertionError):  # the edge verifier refuses the Python function by default
        to_edge_transform_and_lower(export())
    program = EtProgram(export())
    for length in (1, 3, 4, 9):
        x = torch.randn(2, length)
        expected = torch.nn.functional.pad(x, (0, max(4 - length, 0))) * 2
        assert torch.equal(program(x), expected), length


class _TwoInputs(torch.nn.Module):
    def forward(self, a, b, scale=2.0):
        return a * scale - b


@needs_executorch
def test_keyword_inputs_in_another_order_reach_the_inputs_of_their_names():
    """generate() calls a program with the keywords in its own order: they are fed by name."""
    from exportsmith.verify.executorch_check import EtProgram

    a, b = torch.randn(2, 3), torch.randn(2, 3)
    exported = torch.export.export(_TwoInputs(), (), {"a": a, "b": b, "scale": 2.0}, strict=False)
    program = EtProgram(exported)
    assert torch.equal(program(b=b, a=a), a * 2.0 - b)  # the constant `scale` as traced
    with pytest.raises(RuntimeError, match="hold no b"):
        program(a=a, c=b)


class _Splits(torch.nn.Module):
    """Every op that returns a list of views, each along a dim other than the (dynamic) batch."""

    def forward(self, x):
        a, b = x.split(4, dim=-1)
        c, d, e = x.split_with_sizes([2, 3, 3], dim=1)
        f, g = x.chunk(2, dim=-1)
        h, i, j = x.tensor_split(3, dim=1)
        rows = x.view(x.shape[0], 2, 4).unbind(1)
        return a * b + c.sum(-1, keepdim=True) - d.mean(-1, keepdim=True) * e[:, :1] + f / (g.abs() + 1) + rows[1], (
            h.sum(-1) + i.sum(-1) - j.sum(-1)
        )


def _exported_splits():
    shapes = {"x": {0: torch.export.Dim("batch", max=16)}}
    return torch.export.export(_Splits(), (torch.randn(3, 8),), dynamic_shapes=shapes, strict=False)


@pytest.mark.parametrize("batch", [1, 2, 3, 7])
def test_list_outputs_become_slices_of_the_same_values(batch: int):
    from exportsmith.verify.executorch_recipe import LIST_OUTPUT_OPS, slices_for_list_outputs

    exported = _exported_splits()
    x = torch.randn(batch, 8)
    expected = exported.module()(x)
    assert slices_for_list_outputs(exported) == 5
    assert not [node for node in exported.graph.nodes if node.target in LIST_OUTPUT_OPS]
    for got, want in zip(exported.module()(x), expected):
        assert torch.equal(got, want)


@needs_executorch
def test_a_split_keeps_the_batch_dynamic_through_lowering():
    """ExecuTorch 1.4.1's `to_edge` alone makes a split program's batch the example's (3); lowered with the slices,
    the program runs at every batch of the range."""
    from executorch.exir import to_edge

    from exportsmith.verify.executorch_check import EtProgram

    assert [str(symbol) for symbol in to_edge(_exported_splits()).exported_program().range_constraints] == ["3"]
    exported = _exported_splits()
    reference = exported.module()
    program = EtProgram(exported)
    for batch in (1, 2, 5, 16):
        x = torch.randn(batch, 8)
        for got, want in zip(program(x), reference(x)):
            torch.testing.assert_close(got, want)


class _RotateEveryTwo(torch.nn.Module):
    """gptj's rotary step: a stack on a new last dim of a tensor with two dynamic dims (batch, tokens)."""

    def forward(self, x):
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2) * 2


@needs_executorch
def test_an_unsqueeze_with_two_dynamic_dims_stays_out_of_the_xnnpack_delegate():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from exportsmith.verify.executorch_check import EtProgram

    def export():
        batch, tokens = torch.export.Dim("batch", max=8), torch.export.Dim("tokens", max=16)
        shapes = {"x": {0: batch, 1: tokens}}
        return torch.export.export(_RotateEveryTwo(), (torch.randn(2, 5, 8),), dynamic_shapes=shapes, strict=False)

    with pytest.raises(Exception, match="only supports 1 dynamic dimension"):  # ExecuTorch's own partitioner
        to_edge_transform_and_lower(export(), partitioner=[XnnpackPartitioner()]).to_executorch()
    program = EtProgram(export())
    for batch, tokens in ((1, 1), (2, 5), (8, 16)):
        x = torch.randn(batch, tokens, 8)
        torch.testing.assert_close(program(x), _RotateEveryTwo()(x))


class _CheckedPositive(torch.nn.Module):
    def forward(self, x):
        torch._check_tensor_all(x.abs() + 1 > 0, lambda: "positive")
        return x * 3


def test_a_tensor_check_goes_and_the_rest_stays():
    from exportsmith.verify.executorch_recipe import without_tensor_checks

    exported = torch.export.export(_CheckedPositive(), (torch.randn(2, 3),), strict=False)
    targets = [node.target for node in exported.graph.nodes]
    assert torch.ops.aten._is_all_true.default in targets
    assert without_tensor_checks(exported) == 1
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets == [torch.ops.aten.mul.Tensor]
    x = torch.randn(2, 3)
    assert torch.equal(exported.module()(x), x * 3)


@needs_executorch
def test_a_checked_tensor_condition_lowers_and_runs():
    from exportsmith.verify.executorch_check import EtProgram

    exported = torch.export.export(_CheckedPositive(), (torch.randn(2, 3),), strict=False)
    program = EtProgram(exported)
    x = torch.randn(2, 3)
    torch.testing.assert_close(program(x), x * 3)


class _UpdatesItsState(torch.nn.Module):
    """A Mamba layer's way: a state input updated in place, and outputs with constants between tensors."""

    def forward(self, x, state):
        state.mul_(2)
        return x + state.sum(), None, state * 1, 3


@needs_executorch
def test_an_input_updated_in_place_is_not_taken_for_an_output():
    from exportsmith.verify.executorch_check import EtProgram

    exported = torch.export.export(_UpdatesItsState(), (torch.randn(2, 3), torch.ones(2)), strict=False)
    program = EtProgram(exported)
    x, state = torch.randn(2, 3), torch.tensor([1.0, 2.0])
    total, nothing, new_state, three = program(x, state.clone())
    torch.testing.assert_close(total, x + 6)
    assert nothing is None and three == 3
    torch.testing.assert_close(new_state, state * 2)


class _TanhGelu(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


@needs_executorch
def test_a_tanh_gelu_is_not_given_to_xnnpack_which_computes_the_erf_one():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from exportsmith.verify.executorch_check import EtProgram

    x = torch.linspace(-4, 4, 401).reshape(1, -1)
    expected = _TanhGelu()(x)
    stock = to_edge_transform_and_lower(torch.export.export(_TanhGelu(), (x,)), partitioner=[XnnpackPartitioner()])
    buffer = stock.to_executorch().buffer  # kept alive: the runtime does not own it
    program = Runtime.get().load_program(buffer)
    method = program.load_method("forward")
    assert (method.execute([x])[0] - expected).abs().max() > 1e-4  # ExecuTorch's own partitioner: the erf GELU
    torch.testing.assert_close(EtProgram(torch.export.export(_TanhGelu(), (x,)))(x), expected)


class _Counter(torch.nn.Module):
    """A sliding-window layer's way: an int counter input slices and offsets, and comes back grown."""

    def forward(self, x, count: int):
        return x[:, : count + 1] * 2 + torch.arange(x.shape[1])[: count + 1], count + x.shape[1]


def _exported_counter():
    shapes = ({1: torch.export.Dim("tokens", min=2, max=16)}, torch.export.Dim.DYNAMIC)
    return torch.export.export(_Counter(), (torch.randn(2, 10), 3), dynamic_shapes=shapes, strict=False)


def test_an_int_input_becomes_the_length_of_an_empty_tensor():
    from exportsmith.verify.executorch_recipe import ints_as_lengths

    exported = _exported_counter()
    assert ints_as_lengths(exported) == [1]
    kinds = [type(spec.arg).__name__ for spec in exported.graph_signature.input_specs]
    assert kinds == ["TensorArgument", "TensorArgument"]
    graph = torch.fx.GraphModule(exported.graph_module, exported.graph)  # the graph alone, inputs as placeholders
    for tokens, count in ((10, 3), (4, 0), (16, 9)):
        x = torch.randn(2, tokens)
        got, want = graph(x, torch.empty(count, 0)), _Counter()(x, count)
        assert torch.equal(got[0], want[0]) and got[1] == want[1]


@needs_executorch
def test_an_int_input_runs_in_executorch():
    from exportsmith.verify.executorch_check import EtProgram

    program = EtProgram(_exported_counter())
    for tokens, count in ((10, 3), (4, 0), (16, 9)):
        x = torch.randn(2, tokens)
        got, want = program(x, count), _Counter()(x, count)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]


class _FilledEmpty(torch.nn.Module):
    """axk1's way: an `empty` tensor of a dynamic size that copies then fill."""

    def forward(self, x):
        key = x.new_empty(*x.shape[:-1], 6)
        key[..., :4].copy_(x)
        key[..., 4:].copy_(x[..., :2])
        rows = torch.empty(x.shape[0], 3)
        rows.copy_(x[:, :3])
        return key * 2, rows + torch.empty_like(x)[:, :3].fill_(1)


def _exported_filled_empty():
    shapes = ({0: torch.export.Dim("batch", max=8)},)
    return torch.export.export(_FilledEmpty(), (torch.randn(2, 4),), dynamic_shapes=shapes, strict=False)


def test_an_empty_of_a_dynamic_size_becomes_zeros():
    from exportsmith.verify.executorch_recipe import zeros_for_dynamic_empty

    exported = _exported_filled_empty()
    assert zeros_for_dynamic_empty(exported) == 3
    assert not [node for node in exported.graph.nodes if "empty" in str(node.target)]
    x = torch.randn(5, 4)
    for got, want in zip(exported.module()(x), _FilledEmpty()(x)):
        assert torch.equal(got, want)


@needs_executorch
def test_an_empty_of_a_dynamic_size_keeps_the_batch_dynamic():
    from exportsmith.verify.executorch_check import EtProgram

    program = EtProgram(_exported_filled_empty())
    for batch in (1, 2, 8):
        x = torch.randn(batch, 4)
        for got, want in zip(program(x), _FilledEmpty()(x)):
            torch.testing.assert_close(got, want)


class _Conv1d(torch.nn.Module):
    """convbert's separable convolution: a 1-d convolution over `[batch, channels, length]`."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3, padding=1, groups=4)

    def forward(self, x):
        return self.conv(x)


@needs_executorch
def test_a_1d_convolution_with_two_dynamic_dims_stays_out_of_the_xnnpack_delegate():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from exportsmith.verify.executorch_check import EtProgram

    torch.manual_seed(0)
    model = _Conv1d().eval().requires_grad_(False)

    def export():
        shapes = ({0: torch.export.Dim("batch", max=8), 2: torch.export.Dim("length", min=2, max=32)},)
        return torch.export.export(model, (torch.randn(2, 4, 6),), dynamic_shapes=shapes, strict=False)

    with pytest.raises(Exception, match="only supports 1 dynamic dimension"):  # ExecuTorch's own partitioner
        to_edge_transform_and_lower(export(), partitioner=[XnnpackPartitioner()]).to_executorch()
    program = EtProgram(export())
    for batch, length in ((1, 2), (3, 9), (8, 32)):
        x = torch.randn(batch, 4, length)
        torch.testing.assert_close(program(x), model(x))


class _MaxOverLastDim(torch.nn.Module):
    """gpt_oss's attention sinks: the max of 4-d scores over their last dim, as `dim=-1`."""

    def forward(self, scores):
        return scores - scores.max(dim=-1, keepdim=True).values


@needs_executorch
def test_a_max_over_a_negative_dim_stays_out_of_the_xnnpack_delegate():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from exportsmith.verify.executorch_check import EtProgram

    def export():
        return torch.export.export(_MaxOverLastDim(), (torch.randn(2, 3, 4, 5),), strict=False)

    with pytest.raises(Exception, match="only supports dim == 2 or dim == 3"):  # ExecuTorch's own partitioner
        to_edge_transform_and_lower(export(), partitioner=[XnnpackPartitioner()]).to_executorch()
    scores = torch.randn(2, 3, 4, 5)
    torch.testing.assert_close(EtProgram(export())(scores), _MaxOverLastDim()(scores))


def test_the_copy_is_set_up_for_xnnpack_as_transformers_exporter_sets_a_model_up():
    from exportsmith.verify.check import build_pair
    from exportsmith.verify.executorch_recipe import prepare_for_xnnpack

    _, copy = build_pair("mixtral", "generated")
    assert "batched_mm" not in copy.get_experts_implementation().values()  # grouped_mm by default
    assert any(parameter.requires_grad for parameter in copy.parameters())
    prepare_for_xnnpack(copy)
    assert set(copy.get_experts_implementation().values()) == {"batched_mm"}
    assert not any(parameter.requires_grad for parameter in copy.parameters())


def test_a_composite_gets_batched_mm_experts_in_its_language_model():
    """kimi_k25's top-level class has no experts of its own (`_can_set_experts_implementation()` is False there); its
    DeepSeek-V3 language model has, and kept `grouped_mm` (`torch.histc`, no ExecuTorch op) before."""
    from exportsmith.verify.executorch_recipe import prepare_for_xnnpack
    from exportsmith.verify.tasks import model_class
    from exportsmith.verify.tiny import build_tiny_model, tiny_config

    def original(model_type: str) -> torch.nn.Module:
        return build_tiny_model(model_class(model_type)[1], tiny_config(model_type))

    model = original("kimi_k25")
    assert not model._can_set_experts_implementation()
    language_model = model.model.language_model
    assert language_model.config._experts_implementation != "batched_mm"
    prepare_for_xnnpack(model)
    assert language_model.config._experts_implementation == "batched_mm"
    prepare_for_xnnpack(original("llava"))  # no experts: no error


class _Buckets(torch.nn.Module):
    """Idefics2's vision embeddings: each patch's fractional coordinate bucketed by the patch grid's boundaries."""

    def __init__(self, right: bool, out_int32: bool):
        super().__init__()
        self.right, self.out_int32 = right, out_int32
        self.register_buffer("boundaries", torch.arange(1 / 7, 1.0, 1 / 7))

    def forward(self, coordinates):
        return torch.bucketize(coordinates, self.boundaries, right=self.right, out_int32=self.out_int32)


def _coordinates(batch: int) -> torch.Tensor:
    # every boundary itself (where `right` matters), points between them, both ends, beyond them, and a NaN
    points = torch.cat([torch.arange(0, 8) / 7, torch.rand(9), torch.tensor([-1.0, 2.0, float("nan")])])
    return points.repeat(batch, 1)


def _exported_buckets(right: bool, out_int32: bool):
    return torch.export.export(
        _Buckets(right, out_int32), (_coordinates(2),), dynamic_shapes=({0: torch.export.Dim("batch", max=8)},)
    )


@pytest.mark.parametrize("right", [True, False])
@pytest.mark.parametrize("out_int32", [True, False])
def test_a_bucketize_becomes_the_count_of_the_boundaries_it_passes(right: bool, out_int32: bool):
    from exportsmith.verify.executorch_recipe import comparisons_for_bucketize

    exported = _exported_buckets(right, out_int32)
    assert comparisons_for_bucketize(exported) == 1
    assert not any(node.target is torch.ops.aten.bucketize.Tensor for node in exported.graph.nodes)
    for batch in (1, 3):
        coordinates = _coordinates(batch)
        expected = _Buckets(right, out_int32)(coordinates)
        actual = exported.module()(coordinates)
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), (right, out_int32)


@needs_executorch
def test_a_bucketize_lowers_and_runs():
    from exportsmith.verify.executorch_check import EtProgram

    program = EtProgram(_exported_buckets(True, False))
    for batch in (1, 3):
        coordinates = _coordinates(batch)
        assert torch.equal(program(coordinates), _Buckets(True, False)(coordinates))


class _EightDims(torch.nn.Module):
    """inkling's vision patches: a patch grid permuted as an 8-d tensor."""

    def forward(self, x):
        return x.reshape(x.shape[0], 2, 1, 1, 4, 1, 4, 3).permute(0, 1, 2, 3, 5, 4, 6, 7).reshape(x.shape[0], -1) * 2


@needs_executorch
def test_a_tensor_of_more_dims_than_xnnpack_has_stays_out_of_the_delegate():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from exportsmith.verify.executorch_check import EtProgram

    x = torch.randn(2, 96)
    stock = to_edge_transform_and_lower(torch.export.export(_EightDims(), (x,)), partitioner=[XnnpackPartitioner()])
    buffer = stock.to_executorch().buffer
    with pytest.raises(RuntimeError, match="Failed to load method"):  # XNNPACK cannot define an 8-d tensor
        Runtime.get().load_program(buffer).load_method("forward")
    torch.testing.assert_close(EtProgram(torch.export.export(_EightDims(), (x,)))(x), _EightDims()(x))


def test_a_dynamic_dim_is_bounded_by_the_largest_size_the_cases_give_it(monkeypatch):
    """neomme's and inkling's `pixel_values` of 3 images have 192 patches: bounded by BOUND (128), that case failed
    at `set_inputs` (0x10). A dim no case takes above BOUND keeps BOUND, and a cache's dims too."""
    from types import SimpleNamespace

    from exportsmith.verify import executorch_check

    dynamic = torch.export.Dim.DYNAMIC
    shapes = {
        "pixel_values": {0: dynamic},
        "input_ids": {0: torch.export.Dim("batch", max=32), 1: dynamic},
        "cache": [{0: dynamic}],
    }
    monkeypatch.setattr(executorch_check, "varying_dims", lambda program, style: shapes)
    sizes = [(128, 72), (64, 69), (192, 75)]
    cases = [
        SimpleNamespace(inputs=lambda p=p, t=t: {"pixel_values": torch.zeros(p, 48), "input_ids": torch.zeros(1, t)})
        for p, t in sizes
    ]
    bounded = executorch_check.bounded_dims(SimpleNamespace(cases=cases))
    assert bounded["pixel_values"][0] == dynamic(max=192)
    assert bounded["input_ids"][1] == dynamic(max=executorch_check.BOUND)
    assert bounded["input_ids"][0] is shapes["input_ids"][0]
    assert bounded["cache"] == [{0: dynamic(max=executorch_check.BOUND)}]


class _PermutedReadTwice(torch.nn.Module):
    """pe_audio's patch embedding: a permuted tensor read outside the delegate, and through a clone."""

    def forward(self, x):
        permuted = (x * 2).permute(0, 2, 1)
        return torch.cumsum(permuted, 1), torch.cumsum(permuted.clone(), 2)


@needs_executorch
def test_a_clone_of_an_output_of_the_delegate_stays_out_of_it():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from exportsmith.verify.executorch_check import EtProgram

    x = torch.randn(2, 3, 4)
    with pytest.raises(RuntimeError, match="already in the inputs"):  # XNNPACK removes the clone: one output twice
        to_edge_transform_and_lower(
            torch.export.export(_PermutedReadTwice(), (x,)), partitioner=[XnnpackPartitioner()]
        )
    batch = {0: torch.export.Dim("batch", max=8)}
    program = EtProgram(torch.export.export(_PermutedReadTwice(), (x,), dynamic_shapes=(batch,)))
    for batch in (1, 3):
        x = torch.randn(batch, 3, 4)
        for got, expected in zip(program(x), _PermutedReadTwice()(x), strict=True):
            torch.testing.assert_close(got, expected)


class _Indices(torch.nn.Module):
    """The indices of a mask, as `nonzero` gives them and as `where` does (oneformer's `attention_mask[torch.where(
    ...)] = False`), over a 3-d input."""

    def forward(self, x):
        mask = x.reshape(x.shape[0], 2, -1) > 0
        rows = mask.clone()
        rows[torch.where(mask.sum(-1) == mask.shape[-1])] = False
        return torch.nonzero(mask), rows, torch.nonzero(x[:, 0] > 0)


def _exported_indices():
    batch = {0: torch.export.Dim("batch", max=8)}
    return torch.export.export(_Indices(), (torch.randn(5, 6),), dynamic_shapes=(batch,))


def _masks():  # none set, all set, whole rows set, random
    yield torch.full((3, 6), -1.0)
    yield torch.ones(1, 6)
    yield torch.tensor([[1.0, 1, 1, -1, 1, -1], [-1, 1, 1, 1, 1, 1]])
    generator = torch.Generator().manual_seed(0)
    for batch in (1, 2, 5, 8):
        yield torch.randn(batch, 6, generator=generator)


def test_the_indices_of_a_mask_become_coordinates_of_its_flat_indices():
    from exportsmith.verify.executorch_recipe import coordinates_of_flat_nonzero

    exported = _exported_indices()
    assert coordinates_of_flat_nonzero(exported) == 3
    nonzero = [n for n in exported.graph.nodes if n.target is torch.ops.aten.nonzero.default]
    assert [n.meta["val"].shape[1] for n in nonzero] == [1, 1, 1]  # each of a flat input
    program = exported.module()
    for x in _masks():
        for got, expected in zip(program(x), _Indices()(x), strict=True):
            assert torch.equal(got, expected) and got.is_contiguous()


class _IndicesOfAScalar(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x.sum() > 0)


def test_the_indices_of_a_0d_mask_are_left_as_they_are():  # `[n, 0]`: no coordinates to compute
    from exportsmith.verify.executorch_recipe import coordinates_of_flat_nonzero

    assert coordinates_of_flat_nonzero(torch.export.export(_IndicesOfAScalar(), (torch.randn(3),))) == 0


@needs_executorch
def test_the_indices_of_a_mask_come_out_of_executorch_in_their_order():
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from exportsmith.verify.executorch_check import EtProgram

    x = torch.tensor([[1.0, -1, 1, 1, -1, 1]])
    stock = to_edge_transform_and_lower(torch.export.export(_Indices(), (x,))).to_executorch()
    method = Runtime.get().load_program(stock.buffer).load_method("forward")
    with pytest.raises(RuntimeError, match="0x12"):  # its `where` columns: slices of another dim order
        method.execute([x])
    program = EtProgram(_exported_indices())
    for x in _masks():
        for got, expected in zip(program(x), _Indices()(x), strict=True):
            assert torch.equal(got, expected)


# kernel (frames, h, w), stride, groups, spatial padding, bias: tubelet embeddings (kernel = stride) and overlapping ones
_CONV3D = [((2, 4, 4), (2, 4, 4), 1, 0, True), ((3, 3, 3), (1, 2, 2), 2, 1, False), ((1, 3, 3), (1, 1, 1), 4, 1, True)]


def _exported_conv3d(kernel, stride, groups, padding, bias, temporal_padding=0):
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(4, 8, kernel, stride, (temporal_padding, padding, padding), groups=groups, bias=bias)
    batch = {0: torch.export.Dim("batch", max=8)}
    return conv, torch.export.export(conv, (torch.randn(2, 4, 6, 12, 12),), dynamic_shapes=(batch,))


@pytest.mark.parametrize(("kernel", "stride", "groups", "padding", "bias"), _CONV3D)
def test_a_3d_convolution_becomes_a_sum_of_2d_ones_over_its_frames(kernel, stride, groups, padding, bias):
    from exportsmith.verify.executorch_recipe import conv2d_for_conv3d

    conv, exported = _exported_conv3d(kernel, stride, groups, padding, bias)
    assert conv2d_for_conv3d(exported) == 1
    program = exported.module()
    for batch in (1, 3):
        x = torch.randn(batch, 4, 6, 12, 12)
        torch.testing.assert_close(program(x), conv(x), rtol=1e-5, atol=1e-5)  # the same products, another order


def test_a_3d_convolution_padded_in_time_is_left_as_it_is():
    from exportsmith.verify.executorch_recipe import conv2d_for_conv3d

    _, exported = _exported_conv3d((3, 3, 3), (1, 1, 1), 1, 1, True, temporal_padding=1)
    assert conv2d_for_conv3d(exported) == 0


@needs_executorch
def test_a_tubelet_embedding_runs_in_executorch():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from exportsmith.verify.executorch_check import EtProgram

    conv, exported = _exported_conv3d(*_CONV3D[0])
    x = torch.randn(2, 4, 6, 12, 12)
    stock = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    method = Runtime.get().load_program(stock.buffer).load_method("forward")
    with pytest.raises(RuntimeError, match="0x12"):  # a 5-d input to the portable convolution
        method.execute([x])
    program = EtProgram(_exported_conv3d(*_CONV3D[0])[1])
    for batch in (1, 3):
        x = torch.randn(batch, 4, 6, 12, 12)
        torch.testing.assert_close(program(x), conv(x), rtol=1e-5, atol=1e-5)


class _Sorts(torch.nn.Module):
    """sam_hq's IoU ranking (`sort(descending=True)`), vit_mae's `argsort`, and a stable sort along another dim."""

    def forward(self, x):
        values, indices = torch.sort(x, dim=2, descending=True)
        stable = torch.sort(x, dim=1, stable=True, descending=True)
        return values, indices, torch.argsort(x, dim=-1), stable.values, stable.indices


def _exported_sorts():
    batch = {0: torch.export.Dim("batch", max=8)}
    return torch.export.export(_Sorts(), (torch.randn(3, 4, 6),), dynamic_shapes=(batch,))


def _sortable(kind: str, batch: int, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(batch, 4, 6, generator=generator)
    if kind == "ties":  # -0.0 and 0.0 among them
        x = torch.randint(-1, 2, (batch, 4, 6), generator=generator).float() * torch.tensor([1.0, -1, 1, -1, 1, -1])
    elif kind == "nan":
        x[0, 1, 1], x[-1, 0, 3], x[0, 1, 2], x[-1, 2, 3] = float("nan"), float("nan"), float("inf"), float("nan")
    return x


def _assert_same_sorts(got, expected, ties: bool):
    values, indices, argsorted, stable_values, stable_indices = got
    torch.testing.assert_close(values, expected[0], equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(stable_values, expected[3], equal_nan=True, rtol=0, atol=0)
    assert torch.equal(stable_indices, expected[4])  # the stable order is one order
    if not ties:  # where two elements are equal, torch leaves their order unspecified
        assert torch.equal(indices, expected[1]) and torch.equal(argsorted, expected[2])


def test_a_sort_becomes_the_ranks_of_pairwise_comparisons():
    from exportsmith.verify.executorch_recipe import comparisons_for_sort

    exported = _exported_sorts()
    assert comparisons_for_sort(exported) == 3
    assert not [n for n in exported.graph.nodes if "sort" in str(n.target)]
    program, generator = exported.module(), torch.Generator().manual_seed(0)
    for kind in ("distinct", "ties", "nan"):
        for batch in (1, 2, 5, 8):
            x = _sortable(kind, batch, generator)
            got = program(x)
            _assert_same_sorts(got, _Sorts()(x), ties=kind == "ties")
            # an unstable sort's indices are still an order of the values
            assert torch.equal(torch.gather(x, 2, got[1]).nan_to_num(), got[0].nan_to_num())


class _SortsTheBatch(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=0).values, torch.sort(x, dim=1).values


def test_a_sort_along_a_long_or_dynamic_dim_is_left_as_it_is():
    from exportsmith.verify.executorch_recipe import SORT_LIMIT, comparisons_for_sort

    batch = {0: torch.export.Dim("batch", max=8)}
    along_batch = torch.export.export(_SortsTheBatch(), (torch.randn(3, 6),), dynamic_shapes=(batch,))
    long = torch.export.export(_SortsTheBatch(), (torch.randn(3, SORT_LIMIT + 1),))
    assert comparisons_for_sort(along_batch) == 1  # the batch's sort stays (its length is dynamic)
    assert comparisons_for_sort(long) == 1  # the sort along the 3 rows goes, the one along SORT_LIMIT + 1 stays


@needs_executorch
def test_a_sort_runs_in_executorch():
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from exportsmith.verify.executorch_check import EtProgram

    stock = to_edge_transform_and_lower(torch.export.export(_SortsTheBatch(), (torch.randn(3, 6),))).to_executorch()
    with pytest.raises(
        RuntimeError, match="error: 0x:14"
    ):  # no `sort` kernel (and `sort.stable` is not even core ATen)
        Runtime.get().load_program(stock.buffer).load_method("forward")
    program, generator = EtProgram(_exported_sorts()), torch.Generator().manual_seed(0)
    for kind in ("distinct", "ties", "nan"):
        for batch in (1, 5):
            x = _sortable(kind, batch, generator)
            _assert_same_sorts(program(x), _Sorts()(x), ties=kind == "ties")


class _PreluOf3d(torch.nn.Module):
    """dab-detr's PReLU of a linear's `[batch, 1, d]` output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.prelu = torch.nn.Linear(8, 8), torch.nn.PReLU()

    def forward(self, x):
        return self.prelu(self.linear(x))


@needs_executorch
def test_a_prelu_of_a_3d_input_stays_out_of_the_xnnpack_delegate():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from exportsmith.verify.executorch_check import EtProgram

    model, x = _PreluOf3d(), torch.randn(2, 1, 8)
    with pytest.raises(Exception, match="ChannelsLastTaggedReshapePass"):  # XNNPACK's PReLU is channels-last, 4-d
        to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[XnnpackPartitioner()])
    batch = {0: torch.export.Dim("batch", max=8)}
    program = EtProgram(torch.export.export(model, (x,), dynamic_shapes=(batch,)))
    for batch in (1, 3):
        x = torch.randn(batch, 1, 8)
        torch.testing.assert_close(program(x), model(x))
