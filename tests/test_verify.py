"""Tests of exportsmith.verify: tiny configs, seeded inputs, dynamic_shapes mirroring, and verify_model's verdicts.

verify_model is exercised on stand-in packages put in sys.modules: the committed generated copy's llama class, a
subclass of it that perturbs its logits, or transformers' own class (whose masks guard on the mask length).
"""

import sys
import types
from dataclasses import dataclass

import pytest
import torch
import transformers
from torch.utils import _pytree as pytree
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.models.llama import modeling_llama

import generated  # noqa: F401 (registers the cache pytree nodes)
from generated.llama import modeling_llama as generated_llama

from exportsmith.verify import verify_model
from exportsmith.verify.inputs import DECODE_CASES, DECODE_EXAMPLE, PREFILL_CASES, PREFILL_EXAMPLE, case_inputs
from exportsmith.verify.check import DIM_STYLES, MAX_ABS_DIFF, export_program
from exportsmith.verify.shapes import dynamic_shapes_like
from exportsmith.verify.tiny import tiny_config

DECODER_TYPES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "mixtral", "olmo2", "granite", "qwen2_moe"]


def build(model_type: str) -> torch.nn.Module:
    config = tiny_config(model_type)
    class_name = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    torch.manual_seed(0)
    return getattr(transformers, class_name)(config).eval()


@pytest.mark.parametrize("model_type", DECODER_TYPES)
def test_tiny_config_builds_a_small_model_that_runs(model_type):
    model = build(model_type)
    config = model.config
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        assert getattr(config, name, None) is None or 0 <= getattr(config, name) < config.vocab_size
    if getattr(config, "layer_types", None) is not None:
        assert len(config.layer_types) == config.num_hidden_layers == 2
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, config.vocab_size, (2, 4)), use_cache=True)
    assert out.logits.shape == (2, 4, config.vocab_size)
    assert out.cache.get_seq_length() == 4


def test_tiny_config_refuses_unknown_model_types():
    with pytest.raises(ValueError, match="unknown model type"):
        tiny_config("no_such_model_type")


def test_cases_cover_the_promised_shapes():
    assert min(DECODE_EXAMPLE[1:]) >= 2 and min(PREFILL_EXAMPLE[1:3]) >= 2 and PREFILL_EXAMPLE.past == 0
    assert {(c.batch, c.new_tokens, c.past) for c in DECODE_CASES} >= {(1, 1, 7), (3, 4, 2), (1, 6, 11), (4, 1, 9)}
    assert any(c.batch == 1 for c in PREFILL_CASES) and all(c.past == 0 for c in PREFILL_CASES)


@pytest.mark.parametrize("case", [DECODE_CASES[2], PREFILL_CASES[1]], ids=lambda c: c.name)
def test_case_inputs_have_the_case_shapes_and_are_seeded(case):
    model = build("llama")
    vocab_size = model.config.vocab_size
    inputs = case_inputs(model, vocab_size, case)
    assert inputs["input_ids"].shape == (case.batch, case.new_tokens)
    assert 0 <= inputs["input_ids"].min() and inputs["input_ids"].max() < vocab_size
    assert torch.equal(inputs["attention_mask"], torch.ones(case.batch, case.past + case.new_tokens, dtype=torch.long))
    assert inputs["use_cache"] is True
    again = case_inputs(model, vocab_size, case)
    assert torch.equal(inputs["input_ids"], again["input_ids"])
    if case.past:
        assert type(inputs["cache"]) is DynamicCache and inputs["cache"].get_seq_length() == case.past
        assert inputs["cache"].layers[0].keys.shape[:1] == (case.batch,)
        assert torch.equal(inputs["cache"].layers[0].keys, again["cache"].layers[0].keys)
    else:
        assert "cache" not in inputs


@dataclass
class Pair:
    tensor: torch.Tensor
    count: int
    label: str


@pytest.fixture
def registered_pair():
    pytree.register_pytree_node(
        Pair,
        lambda pair: ([pair.tensor, pair.count], pair.label),
        lambda children, label: Pair(*children, label),
    )
    yield Pair
    pytree._deregister_pytree_node(Pair)


def test_dynamic_shapes_like_mirrors_nested_registered_nodes(registered_pair):
    dim = torch.export.Dim.DYNAMIC
    tree = {"a": [Pair(torch.zeros(2, 3), 5, "x"), None], "b": (torch.zeros(4), True, 1.5)}
    shapes = dynamic_shapes_like(tree, lambda tensor: {0: dim} if tensor.dim() == 2 else None)
    assert shapes == {"a": [[{0: dim}, torch.export.Dim.AUTO], None], "b": (None, None, None)}


def test_dynamic_shapes_like_leaves_unregistered_objects_static():
    assert dynamic_shapes_like(Pair(torch.zeros(1), 1, "x"), lambda tensor: {0: None}) is None


def install_package(monkeypatch, name: str, model_class: type, module: str = "llama") -> str:
    """Put `<name>.<module>.modeling_<module>` with `model_class` under its class name in sys.modules."""
    modeling = types.ModuleType(f"{name}.{module}.modeling_{module}")
    setattr(modeling, model_class.__name__, model_class)
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, f"{name}.{module}", types.ModuleType(f"{name}.{module}"))
    monkeypatch.setitem(sys.modules, f"{name}.{module}.modeling_{module}", modeling)
    return name


def perturbed_llama(when) -> type:
    """A LlamaForCausalLM whose logits move by 1e-3 whenever `when()` is true."""

    class LlamaForCausalLM(generated_llama.LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, cache=None, use_cache=None):
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=use_cache)
            if when():
                out.logits = out.logits + 1e-3
            return out

    return LlamaForCausalLM


def test_verify_passes_an_identical_copy(monkeypatch, tmp_path):
    # on disk: the save/load stage imports the package in a fresh process. Its registrations are `generated`'s, as
    # the process that saves and the one that loads must agree on them
    package = tmp_path / "same_llama"
    (package / "llama").mkdir(parents=True)
    (package / "__init__.py").write_text("import generated  # noqa: F401 (registers the cache pytree nodes)\n")
    (package / "llama" / "__init__.py").write_text("")
    (package / "llama" / "modeling_llama.py").write_text(
        "from generated.llama.modeling_llama import LlamaForCausalLM  # noqa: F401\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = verify_model("llama", "same_llama")
    assert result.ok and result.eager_identical and result.failure is None, result.summary
    assert len(result.cases) == (len(DECODE_CASES) + len(PREFILL_CASES)) * len(DIM_STYLES)
    assert {record.dims for record in result.cases} == set(DIM_STYLES)
    # exported vs eager: within the harness's tolerance, not 0, which another CPU's kernels need not give
    assert not any(record.wrong for record in result.cases) and set(result.export_seconds) == {"decode", "prefill"}
    assert result.summary.startswith(f"llama: ok max|diff|={result.max_diff:.3g} (decode ")
    assert len(result.greedy) == 6 and all(loop["match"] for loop in result.greedy)


def test_transformers_own_llama_rejects_the_first_decode_step_of_a_1_token_prompt(monkeypatch):
    # the harness's first-step cases (a 1-token cache) find what users met: the mask-length guard of masking_utils'
    # padding test, whose traced bounds (past >= 2, new >= 2) made it `attention_mask.size()[1] >= 4`
    result = verify_model("llama", install_package(monkeypatch, "own_llama", modeling_llama.LlamaForCausalLM))
    assert result.failure == "guard-rejected", result.summary
    assert "decode first-step: AssertionError: Guard failed: attention_mask.size()[1] >= 4" in result.message
    assert result.location.startswith("transformers/masking_utils.py:")
    assert result.guard["line"].startswith("if (padding_length := kv_length + kv_offset - attention_mask.shape[-1])")
    rejected = {record.name for record in result.cases if record.error}
    assert rejected == {"first-step", "first-step-batch4", "two-tokens-past1", "second-step"}


def test_verify_reports_an_eager_mismatch(monkeypatch):
    package = install_package(monkeypatch, "perturbed_llama", perturbed_llama(lambda: True))
    result = verify_model("llama", package)
    assert not result.ok and not result.eager_identical
    assert result.failure == "eager-mismatch", result.summary
    assert "max|diff|=0.001" in result.summary


def test_verify_reports_an_exported_mismatch(monkeypatch):
    package = install_package(monkeypatch, "export_perturbed_llama", perturbed_llama(torch.compiler.is_exporting))
    result = verify_model("llama", package)
    assert result.eager_identical and result.failure == "mismatch", result.summary
    assert all(record.max_diff == pytest.approx(1e-3, abs=MAX_ABS_DIFF) for record in result.cases)


def test_verify_never_raises():
    result = verify_model("llama", package="no_such_package_anywhere")
    assert result.failure == "build" and "no_such_package_anywhere" in result.message


def test_an_encoder_decoder_decodes_from_encoder_outputs_and_an_encoder_decoder_cache():
    from transformers import EncoderDecoderCache, T5ForConditionalGeneration

    from exportsmith.verify.check import programs_for

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(tiny_config("t5")).eval()
    decode, forward = programs_for(model)
    assert (decode.name, forward.name) == ("decode", "forward")
    for case in decode.cases:
        inputs = case.inputs()
        assert "input_ids" not in inputs  # as in generate: the encoder ran once
        assert isinstance(inputs["cache"], EncoderDecoderCache)
        assert inputs["cache"].get_seq_length() == case.past
        assert inputs["decoder_input_ids"].shape == (case.batch, case.new_tokens)
        assert inputs["encoder_outputs"][0].shape[0] == case.batch
    assert len({case.inputs()["encoder_outputs"][0].shape[1] for case in decode.cases}) > 1


def test_the_tensors_of_a_decode_step_are_no_views_even_when_the_encoder_returns_one():
    # fsmt's encoder returns a transpose, the new decoder tokens are a slice of the seeded ones; export of a view input
    # guards on the sizes of the tensor it views, and the program then fails on a tensor that is no view, as one
    # loaded from a file
    from exportsmith.verify.check import build_pair, programs_for

    original, _ = build_pair("fsmt", None)
    decode = programs_for(original)[0]
    assert decode.name == "decode"
    for case in decode.cases:
        inputs = case.inputs()
        for tensor in (inputs["encoder_outputs"][0], inputs["decoder_input_ids"]):
            assert tensor.is_contiguous() and tensor._base is None


def test_a_failure_is_located_in_the_innermost_frame_of_the_named_packages(tmp_path):
    import importlib.util

    from exportsmith.verify.errors import user_location

    (tmp_path / "my_generated").mkdir()
    path = tmp_path / "my_generated" / "masks.py"
    path.write_text("def build():\n    raise ValueError('data-dependent')\n")
    spec = importlib.util.spec_from_file_location("my_generated_masks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.build()
    except ValueError as error:
        assert user_location(error, ("transformers", "my_generated")) == "my_generated/masks.py:2"
        assert user_location(error) is None  # not a package it was told about


def test_nan_only_matches_nan():
    from exportsmith.verify.check import identical, max_abs_diff, tensor_diff

    nan, inf = float("nan"), float("inf")
    reference = torch.tensor([1.0, nan, inf])
    assert identical(reference, reference.clone()) and tensor_diff(reference, reference.clone()) == 0.0
    # a NaN where the reference has a number (or the reverse) is never a small difference
    assert not identical(reference, torch.tensor([1.0, 2.0, inf]))
    assert tensor_diff(reference, torch.tensor([1.0, 2.0, inf])) == inf
    assert tensor_diff(torch.tensor([1.0, 2.0]), torch.tensor([nan, 2.0])) == inf
    assert max_abs_diff({"logits": torch.tensor([1.0, 2.0])}, {"logits": torch.tensor([nan, 2.5])}) == inf
    assert tensor_diff(reference, torch.tensor([1.5, nan, inf])) == 0.5
    assert tensor_diff(reference, torch.tensor([1.0, nan, -inf])) == inf


def test_a_part_of_a_model_is_found_in_its_generated_modeling_module(monkeypatch):
    # A model type whose class is a part of a model (not exported by the package's __init__) is still paired
    from exportsmith.verify import check

    part = modeling_llama.LlamaRotaryEmbedding
    monkeypatch.setattr(check, "model_class", lambda model_type: (None, part))
    original, generated = check.build_pair("llama", "generated")
    assert type(original) is part
    assert type(generated).__module__ == "generated.llama.modeling_llama" and type(generated).__name__ == part.__name__


def test_a_copied_model_cache_that_is_registered_compares_with_the_unregistered_original(monkeypatch):
    from exportsmith.verify import check

    def cache_class(module):
        cls = type("FakeModelCache", (), {"__module__": module})
        cls.__qualname__ = "FakeModelCache"
        return cls

    original_class = cache_class("transformers.models.fake.modeling_fake")
    copy_class = cache_class("generated.fake.modeling_fake")
    pytree.register_pytree_node(copy_class, lambda c: ([c.keys], None), lambda children, _: copy_class())
    try:
        original, copy = original_class(), copy_class()
        original.keys, copy.keys = torch.ones(2), torch.ones(2)
        original.offset = copy.offset = torch.zeros(1)  # an attribute the registration does not flatten
        assert check._same_or_registered_subclass(copy, original)
        assert [t.shape for t in check.output_tensors([original])] == [t.shape for t in check.output_tensors([copy])]
        assert len(check.output_tensors([copy])) == 2
        # an unregistered copy, or another model's class, is refused
        assert not check._same_or_registered_subclass(original_class(), copy)
        assert not check._same_or_registered_subclass(cache_class("transformers.models.fake.x")(), copy)
    finally:
        pytree._deregister_pytree_node(copy_class)


def test_check_onnx_records_the_onnx_verdict(monkeypatch):
    from exportsmith.verify import isolate
    from exportsmith.verify.onnx_check import OnnxResult

    monkeypatch.setattr(
        isolate, "verify_onnx", lambda model_type, package: OnnxResult(model_type).fail("ort-error", "x")
    )
    record = isolate.check_onnx("llama", "generated")
    assert record == {"status": "ort-error", "reason": "x", "details": {"max_diff": None, "cases": 0}}
    assert isolate.Record("llama", **{k: record[k] for k in ("status", "reason")}).status == "ort-error"


class _KeywordsCollected(torch.nn.Module):
    """A forward that collects `use_cache` and `extra` with **kwargs, like llava's and granitemoe's."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x, mask=None, **kwargs):
        y = self.linear(x) + (1 if kwargs.get("use_cache") else 0)
        return y * kwargs["extra"]


def test_inputs_collected_by_kwargs_export_with_dict_dynamic_shapes():
    model = _KeywordsCollected()
    dim = torch.export.Dim.DYNAMIC
    example = {"x": torch.randn(3, 2), "mask": None, "use_cache": True, "extra": torch.randn(3, 2)}
    shapes = {"x": {0: dim}, "mask": None, "use_cache": None, "extra": {0: dim}}
    with pytest.raises(Exception):  # torch 2.13 alone: the traced-order arguments hold `extra` nested and flat
        torch.export.export(model, (), example, dynamic_shapes=shapes, strict=False)
    program = export_program(model, example, shapes)
    other = {**example, "x": torch.randn(5, 2), "extra": torch.randn(5, 2)}
    assert torch.equal(program.module()(**other), model(**other))


class _HoldsModulesOutsideItsTree(torch.nn.Module):
    """Modules kept where `state_dict` does not look: a plain list (as oneformer's input projections), a dict, a list
    in such a module, a list of registered children (as transformers' PredictionBlock) and a back-reference."""

    def __init__(self):
        super().__init__()
        self.registered = torch.nn.Linear(2, 2)
        self.projections = [torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2))]
        inner = torch.nn.Linear(2, 2)
        inner.extra = [torch.nn.Linear(2, 2)]  # a list in a module outside the tree
        self.by_name = {"inner": inner}
        self.again = [self.registered]
        self.registered.owner = [self]  # a cycle back to the root

    def forward(self, x):
        inner = self.by_name["inner"]
        for layer in [self.registered, *self.projections, inner, *inner.extra]:
            x = layer(x)
        return x


def test_copy_unregistered_modules_loads_the_weights_that_state_dict_leaves_out():
    from exportsmith.verify.check import copy_unregistered_modules

    torch.manual_seed(0)
    original = _HoldsModulesOutsideItsTree()
    torch.manual_seed(1)
    copy = _HoldsModulesOutsideItsTree()
    copy.load_state_dict(original.state_dict())
    x = torch.randn(3, 2)
    assert not torch.equal(original(x), copy(x))  # the state dict alone misses them
    copied = copy_unregistered_modules(original, copy)
    assert copied == ["by_name['inner']", "by_name['inner'].extra[0]", "projections[0]", "projections[1]"]
    assert torch.equal(original(x), copy(x))


def test_a_copy_of_oneformer_gets_the_input_projections_that_its_state_dict_leaves_out(monkeypatch):
    # OneFormerTransformerModule keeps its input projections (Conv2d when conv_dim != hidden_dim, as in the tiny
    # config) in a plain list: with transformers' own class as the copy, eager differed (max|diff| 2.97) before
    from dataclasses import replace

    from transformers.models.oneformer import modeling_oneformer

    from exportsmith.verify.check import build_pair, check_eager_identity, programs_for, run

    name = "same_oneformer"
    modeling = types.ModuleType(f"{name}.oneformer.modeling_oneformer")
    modeling.OneFormerModel = modeling_oneformer.OneFormerModel
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, f"{name}.oneformer", types.ModuleType(f"{name}.oneformer"))
    monkeypatch.setitem(sys.modules, f"{name}.oneformer.modeling_oneformer", modeling)
    original, copy = build_pair("oneformer", name)
    assert isinstance(original.transformer_module.input_projections, list)
    assert isinstance(original.transformer_module.input_projections[0], torch.nn.Conv2d)
    forward = programs_for(original)[0]
    forward = replace(forward, cases=forward.cases[:1])
    case = forward.cases[0]
    check_eager_identity(original, copy, [forward], {(forward.name, case.name): run(original, case)})


def test_named_dims_share_one_batch_and_one_tokens_dim_and_leave_the_rest_dynamic():
    from dataclasses import replace

    from exportsmith.verify.check import tokens_dim
    from exportsmith.verify.check import BATCH, build_pair, programs_for, varying_dims

    original, generated = build_pair("llama", "generated")
    decode, prefill = programs_for(original, cache_model=generated)
    named = varying_dims(decode, "named")
    tokens = named["input_ids"][1]
    assert named["input_ids"] == {0: BATCH, 1: tokens} and (tokens.__name__, tokens.min, tokens.max) == (
        "tokens",
        1,
        64,
    )
    assert named["attention_mask"] == {0: BATCH, 1: torch.export.Dim.DYNAMIC}  # past + new: its own dim
    cache_dims = [leaf for leaf in pytree.tree_leaves(named["cache"], is_leaf=lambda x: isinstance(x, dict))]
    assert all(dims == {0: BATCH, 2: torch.export.Dim.DYNAMIC} for dims in cache_dims if isinstance(dims, dict))
    assert varying_dims(prefill, "named")["input_ids"][0] is BATCH
    assert varying_dims(decode, "auto")["input_ids"] == {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    assert varying_dims(decode)["input_ids"] == {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    assert (BATCH.min, BATCH.max) == (1, 32)
    longer = replace(prefill, cases=(*prefill.cases, replace(prefill.cases[-1], name="long", new_tokens=100)))
    assert tokens_dim(longer).max == 100  # the range holds every case
    with pytest.raises(ValueError, match="unknown dims style"):
        varying_dims(decode, "static")


def test_a_decode_step_takes_the_mask_generate_passes_it():
    """Mamba's `prepare_inputs_for_generation` drops the attention mask after the first step, and its forward takes a
    mask of the new tokens only: the harness's decode steps gave it one of past + new tokens, which its eager forward
    rejected (`The size of tensor a (3) must match the size of tensor b (8)`), so the type was never measured."""
    from exportsmith.verify.check import build_original, programs_for
    from exportsmith.verify.inputs import decode_takes_mask

    mamba, _ = build_original("mamba")
    llama, _ = build_original("llama")
    assert not decode_takes_mask(mamba) and decode_takes_mask(llama)
    decode, prefill = programs_for(mamba)
    stepped = [case.inputs() for case in decode.cases if case.past]
    assert stepped and not any("attention_mask" in inputs for inputs in stepped)
    assert all("attention_mask" in case.inputs() for case in prefill.cases if not case.past)
    assert all("attention_mask" in case.inputs() for case in programs_for(llama)[0].cases)
    # measured now: it gets past eager, to its export
    result = verify_model("mamba", subject="original", styles=("named",))
    assert result.failure != "eager", result.message


def test_a_model_whose_multi_token_step_is_another_path_decodes_one_token_at_a_time():
    """Mamba's eager step of several tokens after a cache restarts its state from zero, its one-token step updates
    it: the two differ far beyond rounding, so its decode range is one token (as generate() decodes), and the record
    says why. A transformer's differ by rounding: its range keeps the multi-token steps."""
    from exportsmith.verify.check import build_original, one_token_steps, programs_for, vocab
    from exportsmith.verify.inputs import ONE_TOKEN_DECODE_EXAMPLE, step_gap

    mamba, _ = build_original("mamba")
    llama, _ = build_original("llama")
    gap, rounding = step_gap(mamba, vocab(mamba.config))
    assert gap > 100 * rounding
    gap, rounding = step_gap(llama, vocab(llama.config))
    assert gap < rounding
    assert one_token_steps(mamba, vocab(mamba.config)) and not one_token_steps(llama, vocab(llama.config))
    decode, prefill = programs_for(mamba)
    assert decode.cases[0].name == ONE_TOKEN_DECODE_EXAMPLE.name
    assert {case.new_tokens for case in decode.cases} == {1} and len(decode.cases) > 3
    assert len({case.new_tokens for case in prefill.cases}) > 1  # the prompt keeps its range
    assert len({case.new_tokens for case in programs_for(llama)[0].cases}) > 1
    result = verify_model("mamba", subject="original", styles=("named",))
    assert any(entry.startswith("decode: steps of several new tokens") for entry in result.outside_range)


def test_the_tokens_range_stops_at_the_longest_text_the_model_takes():
    """owlvit's text tower has 16 learned positions: a range to 64 contradicts the slice of its position ids (export
    fails with `Constraints violated (tokens)`), and no user declares it."""
    from dataclasses import replace

    from exportsmith.verify.check import build_original, programs_for, text_positions, tokens_dim

    original, _ = build_original("owlvit_text_model")
    (forward,) = programs_for(original)
    assert text_positions(original.config) == forward.max_tokens == 16
    assert tokens_dim(forward).max == 16
    assert tokens_dim(replace(forward, max_tokens=None)).max == 64
    longer = replace(forward, cases=(*forward.cases, replace(forward.cases[-1], name="long", new_tokens=20)))
    assert tokens_dim(longer).max == 20  # never short of a case: that case fails instead
    # transformers' own class needs no rewrite: with the range a user declares, it verifies
    result = verify_model("owlvit_text_model", subject="original", styles=("named",))
    assert result.ok, result.message


def _windowed_mistral():
    """The generated mistral copy with a 4-token window, and decode inputs of a given shape (seeded)."""
    from transformers import MistralConfig

    import generated.mistral

    config = MistralConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=4,
    )
    torch.manual_seed(0)
    model = generated.mistral.MistralForCausalLM(config).eval()

    def inputs(batch, new, past):
        generator = torch.Generator().manual_seed(batch * 100 + new * 10 + past)
        with torch.no_grad():
            cache = model(torch.randint(0, 128, (batch, past), generator=generator), use_cache=True).cache
        ids = torch.randint(0, 128, (batch, new), generator=generator)
        return dict(input_ids=ids, attention_mask=torch.ones(batch, new + past, dtype=torch.long), cache=cache)

    return model, inputs


def test_a_program_traced_on_a_cache_that_crossed_its_window_accepts_a_fresh_cache():
    # eager crops a sliding cache that crossed its window with a slice: the example's keys are views, and a program
    # traced with a view guards on its strides, rejecting the contiguous caches programs return and 1-token caches
    model, inputs = _windowed_mistral()
    example = inputs(2, 3, 5)
    assert not example["cache"].layers[0].keys.is_contiguous()
    dyn = torch.export.Dim.DYNAMIC
    shapes = dict(
        input_ids={0: dyn, 1: dyn},
        attention_mask={0: dyn, 1: dyn},
        cache=dynamic_shapes_like(example["cache"], lambda t: {0: dyn, 2: dyn} if t.dim() == 4 else None),
    )
    plain = torch.export.export(model, (), example, dynamic_shapes=shapes, strict=False)
    with pytest.raises(Exception, match="stride"):
        plain.module()(**inputs(1, 1, 1))
    program = export_program(model, inputs(2, 3, 5), shapes)
    with torch.no_grad():
        for batch, new, past in [(1, 1, 1), (4, 1, 1), (1, 2, 1), (1, 1, 7), (1, 6, 11)]:
            expected = model(**inputs(batch, new, past)).logits
            assert torch.allclose(
                program.module()(**inputs(batch, new, past)).logits, expected, atol=MAX_ABS_DIFF, rtol=0
            )


OUTPUTS_MODULE = """
import dataclasses

import torch
from torch.utils import _pytree as pytree


@dataclasses.dataclass
class Pair:
    first: torch.Tensor
    second: torch.Tensor


pytree.register_dataclass(Pair, serialized_type_name=f"{__name__}.Pair")
torch.serialization.add_safe_globals([Pair])  # as the cache-pytree codemod's registration does for a cache


class Model(torch.nn.Module):
    def forward(self, x):
        return Pair(x + 1, x * 2)


class Sum(torch.nn.Module):
    def forward(self, pair):
        return pair.first + pair.second
"""


def outputs_package(tmp_path, monkeypatch, name: str, registers: bool):
    """A package on disk whose `outputs` module registers `Pair`; its `__init__` imports that module or not."""
    import importlib

    (tmp_path / name).mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text("from . import outputs  # noqa: F401\n" if registers else "")
    (tmp_path / name / "outputs.py").write_text(OUTPUTS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(f"{name}.outputs")


@pytest.mark.parametrize("registers", [False, True])
def test_save_load_loads_in_a_fresh_process_that_imports_only_the_package(monkeypatch, tmp_path, registers):
    """The program returns a type that the package's module registers; the harness's process imported that module,
    a fresh process importing the package alone has it only when the package's `__init__` imports it."""
    from exportsmith.verify.check import Case, Program, VerifyResult, check_programs, run

    name = f"outputs_package_{registers}"
    model = outputs_package(tmp_path, monkeypatch, name, registers).Model()
    cases = tuple(
        Case(f"batch{b}", b, 0, 0, lambda b=b: {"x": torch.randn(b, 4, generator=torch.Generator().manual_seed(b))})
        for b in (2, 3)
    )
    program = Program("forward", cases)
    references = {(program.name, case.name): run(model, case) for case in cases}
    result = check_programs(VerifyResult("fixture"), model, [program], references, (name,), imports=(name,))
    if registers:
        assert result.ok, result.summary
    else:
        assert result.failure == "save-load", result.summary
        assert result.message == (
            f"RuntimeError: in a fresh process (import torch, {name}): NotImplementedError: Deserializing "
            f"{name}.outputs.Pair in pytree is not registered"
        )


def test_the_fresh_process_imports_the_package_the_harness_imports_not_one_in_its_working_directory(
    monkeypatch, tmp_path
):
    # the coverage sweep verifies `build/coverage/generated` from a repository whose root holds the committed
    # `generated`: `python -c` puts its working directory first on sys.path, ahead of PYTHONPATH
    from exportsmith.verify.check import Case, Program, VerifyResult, check_programs, run

    name = "shadowed_outputs_package"
    model = outputs_package(tmp_path / "swept", monkeypatch, name, registers=True).Model()
    shadow = tmp_path / "root" / name
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the package of the working directory')\n")
    monkeypatch.chdir(shadow.parent)
    case = Case("batch2", 2, 0, 0, lambda: {"x": torch.randn(2, 4, generator=torch.Generator().manual_seed(2))})
    program = Program("forward", (case,))
    references = {(program.name, case.name): run(model, case)}
    result = check_programs(VerifyResult("fixture"), model, [program], references, (name,), imports=(name,))
    assert result.ok, result.summary


def test_a_fresh_process_error_is_the_first_exception_it_reports_in_one_line():
    from exportsmith.verify.check import fresh_process_error

    prefix = "W1205 14:44:13.696000 6029 torch/export/__init__.py:348] "
    logged = (
        f"{prefix}Ran into the following error when deserializing\n{prefix}Traceback (most recent call last):\n"
        f"{prefix}torch._export.serde.serialize.SerializeError: We failed to resolve "
        "torch.ops.transformers.grouped_mm_fallback.default to an operator. If it's a custom op, ...\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: We ran into an error when deserializing the saved file. Please check the warnings above.\n"
    )
    assert fresh_process_error(logged) == (
        "SerializeError: We failed to resolve torch.ops.transformers.grouped_mm_fallback.default to an operator"
    )
    refused = (
        "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, ...\n"
        "\tWeightsUnpickler error: Unsupported global: GLOBAL pkg.Cache was not an allowed global by default. Please\n"
    )
    assert (
        fresh_process_error(refused)
        == "UnpicklingError: Unsupported global: GLOBAL pkg.Cache was not an allowed global by default"
    )


def test_torch_export_load_imports_the_module_of_an_example_inputs_class(monkeypatch, tmp_path):
    """What README says of a program taking a cache class that a model module defines (and registers): in a process
    that imported only the package, torch.export.load unpickles the program's example inputs, fails weights-only on
    the class, retries without (which imports its module, registering the class) and reads the input spec after."""
    from exportsmith.verify.check import Case, Program, VerifyResult, check_programs, run

    name = "inputs_package"
    outputs = outputs_package(tmp_path, monkeypatch, name, registers=False)

    def inputs(batch):
        generator = torch.Generator().manual_seed(batch)
        return {
            "pair": outputs.Pair(torch.randn(batch, 4, generator=generator), torch.randn(batch, 4, generator=generator))
        }

    program = Program("forward", tuple(Case(f"batch{b}", b, 0, 0, lambda b=b: inputs(b)) for b in (2, 3)))
    model = outputs.Sum()
    references = {(program.name, case.name): run(model, case) for case in program.cases}
    result = check_programs(VerifyResult("fixture"), model, [program], references, (name,), imports=(name,))
    assert result.ok, result.summary


def test_a_failure_before_export_says_whether_the_harness_or_the_rewrite_is_at_fault(monkeypatch):
    from exportsmith.verify import check

    copy_broken = verify_model("llama", package="no_such_generated_package")
    assert copy_broken.failure == "build"
    assert copy_broken.message.endswith("(the generated copy; transformers' own class builds)")

    def no_tiny_config(model_type):
        raise ValueError(f"no tiny config for {model_type}")

    monkeypatch.setattr(check, "tiny_config", no_tiny_config)
    harness = verify_model("llama", package="generated")
    assert harness.failure == "build"
    assert harness.message == (
        "ValueError: no tiny config for llama (transformers' own class fails alike: the harness's limit, not the "
        "rewrite's)"
    )
    # the original alone is verified: nothing to compare with
    assert verify_model("llama", subject="original").message == "ValueError: no tiny config for llama"


def test_a_named_dim_guard_says_whether_it_holds_over_the_range_or_where_it_pins():
    from torch.export import Dim

    from exportsmith.verify.check import export_message

    class ViewBack(torch.nn.Module):  # docs/TORCH_BUGS.md #3: a guard torch cannot prove
        def forward(self, x):
            return x.view(-1, x.size(-1)).view(x.shape) * 2

    class PinsTwo(torch.nn.Module):
        def forward(self, x):
            return x * 3 if x.shape[1] == 2 else x * 2

    dims = {"x": {0: Dim("batch", min=1, max=32), 1: Dim("tokens", min=1, max=64)}}
    messages = []
    for module in (ViewBack(), PinsTwo()):
        with pytest.raises(Exception) as raised:
            torch.export.export(module, (torch.randn(2, 5, 64),), dynamic_shapes=dims, strict=False)
        messages.append(export_message(raised.value))
    assert messages[0].endswith("(true over the whole range: torch cannot prove it)")
    assert messages[1].endswith(
        "Unsatisfied for some tokens: L['x'].size()[1] != 2 (false at tokens = 2: the code pins it)"
    )


def test_a_text_models_forward_program_runs_at_one_and_two_tokens_and_a_vision_models_does_not():
    from exportsmith.verify.check import build_pair, programs_for

    bert, _ = build_pair("bert", None)
    (forward,) = programs_for(bert)
    edges = [case for case in forward.cases if case.optional]
    assert [(case.name, case.inputs()["input_ids"].shape) for case in edges] == [
        ("batch1-text1", (1, 1)),
        ("batch1-text2", (1, 2)),
    ]
    vit, _ = build_pair("vit", None)
    assert not any(case.optional for program in programs_for(vit) for case in program.cases)


def test_a_one_token_input_that_the_trace_took_for_longer_is_a_silent_specialisation(monkeypatch):
    class BertForMaskedLM(transformers.BertForMaskedLM):
        """The same results as bert's in eager; the trace (at 2+ tokens) takes the 2+ token arm, with no guard, and
        that arm scales the logits by 0 at one token."""

        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None):
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            if input_ids.shape[1] > 1:
                out.logits = out.logits * (torch.arange(input_ids.shape[1]) >= 1).any()
            return out

    result = verify_model("bert", install_package(monkeypatch, "longer_bert", BertForMaskedLM, "bert"))
    assert result.eager_identical and result.failure == "silent-specialisation", result.summary
    wrong = {record.name for record in result.cases if record.wrong}
    assert wrong == {"batch1-text1"}


def test_an_edge_case_the_original_refuses_in_eager_is_left_out_of_the_range_and_named(monkeypatch):
    from exportsmith.verify import check

    plain_run = check.run

    def no_single_token(model, inputs):
        if not callable(getattr(model, "module", None)) and isinstance(model, transformers.BertForMaskedLM):
            case_inputs = inputs.inputs() if isinstance(inputs, check.Case) else inputs
            if case_inputs["input_ids"].shape[1] == 1:
                raise RuntimeError("a kernel wider than one token")
        return plain_run(model, inputs)

    monkeypatch.setattr(check, "run", no_single_token)
    result = verify_model("bert", subject="original")
    assert result.ok, result.summary
    assert result.outside_range == ["forward batch1-text1: RuntimeError: a kernel wider than one token"]
    assert {record.name for record in result.cases} == {"batch2-text8", "batch1-text5", "batch3-text11", "batch1-text2"}
    assert result.record()["outside_range"] == result.outside_range


def test_the_tolerance_is_rounding_relative_to_the_outputs_magnitude():
    from exportsmith.verify.check import CaseRecord
    from exportsmith.verify.tolerance import ATOL, RTOL, allowed

    assert allowed([torch.zeros(3), torch.tensor([1, 2])]) == ATOL  # integer outputs must be equal anyway
    largest = torch.tensor(-5.4).abs().item()  # as float32 holds it
    assert allowed([torch.tensor([0.1, -5.4]), torch.tensor([float("inf"), float("nan")])]) == ATOL + RTOL * largest
    # Mistral-7B's step past its window: 1.51e-5 on logits up to 5.4 is rounding; the same on outputs of order 1 is not
    at_real_width = CaseRecord("decode", "window-crossed", 1, 1, 4101, 1.51e-5, tolerance=allowed([torch.tensor([5.4])]))
    at_tiny_width = CaseRecord("decode", "window-crossed", 1, 1, 14, 1.51e-5, tolerance=allowed([torch.tensor([1.0])]))
    assert not at_real_width.wrong and at_tiny_width.wrong


def test_an_lms_programs_build_no_forward_inputs(monkeypatch):
    # an LM is checked through its decode and prefill programs: inputs of a forward program it does not have must not
    # be built (a model whose dummy inputs cannot be built would fail for them)
    from exportsmith.verify import check

    llama, _ = check.build_pair("llama", None)

    def no_dummy_inputs(*args, **kwargs):
        raise ValueError("no dummy inputs")

    monkeypatch.setattr(check, "dummy_inputs", no_dummy_inputs)
    assert [program.name for program in check.programs_for(llama)] == ["decode", "prefill"]


def test_the_named_inputs_wrapper_is_in_the_models_mode():
    from exportsmith.verify.shapes import with_named_inputs

    class Collects(torch.nn.Module):
        def forward(self, x, **kwargs):
            return x

    model = Collects().eval()
    wrapper = with_named_inputs(model, {"x": torch.zeros(1), "use_cache": True})
    assert wrapper is not model and wrapper.model is model
    assert not wrapper.training and not model.training


@pytest.mark.parametrize(("model_type", "name", "axis"), [("wav2vec2", "input_values", 1), ("whisper", None, None)])
def test_a_models_own_audio_varies_with_the_case_and_its_programs_declare_it_dynamic(model_type, name, axis):
    """Users' audio has any length: raw audio takes 4400, 3200 and 5600 samples at the forward shapes and its dim is
    declared in every style; Whisper's features stay at the 3000 frames (here twice its positions) it requires."""
    from exportsmith.verify.check import build_original, programs_for, varying_dims

    original, _ = build_original(model_type, None)
    (forward,) = [program for program in programs_for(original) if program.name == "forward"]
    if name is None:
        lengths = {case.inputs()["input_features"].shape[-1] for case in forward.cases}
        assert len(lengths) == 1
        return
    lengths = [case.inputs()[name].shape[axis] for case in forward.cases]
    assert lengths == [4400, 3200, 5600]
    assert varying_dims(forward)[name] == {0: torch.export.Dim.DYNAMIC, axis: torch.export.Dim.DYNAMIC}
    assert varying_dims(forward, "auto")[name][axis] is torch.export.Dim.AUTO


def test_an_audio_lms_audio_beside_its_text_keeps_the_examples_length():
    """Audio beside text (an LM's, counted by its placeholder tokens) is not the case's to vary; a model's own is."""
    from exportsmith.verify.tasks import EXAMPLE, InputShape, audio_inputs

    config = tiny_config("parakeet_encoder")
    shapes = (EXAMPLE, InputShape(batch=EXAMPLE.batch, text_length=5))

    def sizes(main: str) -> set:
        inputs = (audio_inputs(config, {"input_features"}, main, 0, shape, torch.Generator()) for shape in shapes)
        return {features["input_features"].shape for features in inputs}

    assert len(sizes("input_ids")) == 1
    assert len(sizes("input_features")) == 2
