"""conv-padding-ints: which conv paddings it rewrites or refuses (with reasons); at run time the rewritten forms of
`fixtures/conv_padding_ints/conv.in.py` (EnCodec's conv) are bit-identical to the original in eager and under the
export arm at every length, one program exported with a range of lengths from 2 frames matches it at every length
where the original's export is rejected, and every class the codemod rewrites in the installed transformers (encodec, mimi,
wavtokenizer, pocket_tts) runs both arms bit-identical to transformers' own inside a tiny model of each. And the
bound of the frame rounding: integer ceil-division equals the float32 form below 2**23 and the export arm refuses
the lengths from which they differ."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.export import Dim

from codemods.conv_padding_ints import ConvPaddingInts
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods
from exportsmith.verify.tiny import tiny_config
from source_modules import module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "conv_padding_ints"
LENGTHS = (1, 2, 3, 4, 5, 6, 7, 8, 11, 16, 29, 64)
# The model types whose modeling module the codemod rewrites in transformers (each one's tiny model holds its convs)
MODELS = ("encodec", "mimi", "pocket_tts_audio_tokenizer", "wavtokenizer")


def _change(case: str, module: str = "transformers.models.toy.modeling_toy"):
    path = FIXTURES / f"{case}.in.py"
    return run_codemods(path.read_text(), path.name, module, codemods=(ConvPaddingInts,))


def test_findings_name_each_rewrite_and_each_refusal_with_its_reason():
    rewritten = [(f.line, f.construct) for f in _change("conv").findings if f.kind == "rewritten"]
    assert rewritten == [
        (27, "PaddedConv1d._get_extra_padding_for_conv1d"),
        (45, "PaddedConv1d._pad1d"),
        (55, "PaddedConv1d.forward"),
        (57, "PaddedConv1d.forward"),
        (58, "PaddedConv1d.forward"),
    ]
    assert [(f.kind, f.reason) for f in _change("refuse_unresolved").findings] == [
        ("refused", "`self.kernel_size` is not an int of the conv's that `__init__` keeps"),
        ("refused", "`self.padding_total` is read as a tensor (not an operand nor a tuple item)"),
    ]
    assert {f.reason for f in _change("refuse_no_torch_import").findings} == {"the module does not `import torch`"}
    taken = _change("refuse_names_taken")
    assert not taken.changed
    assert [(f.line, f.kind, f.reason) for f in taken.findings] == [
        (17, "refused", "the function binds the names of the attributes the export arm binds"),
        (33, "refused", "the function binds `extended` or `positions`"),
        (42, "refused", "the function binds the name `torch`"),
    ]
    shared = _change("conv", module="transformers.audio_utils")
    assert not shared.changed
    assert {f.reason for f in shared.findings} == {
        "`transformers.audio_utils` is a shared module, whose classes must stay transformers' own"
    }


def _pair(change, **kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    original = module_from_source(change.original, "conv_padding_original").PaddedConv1d(**kwargs)
    rewritten = module_from_source(change.rewritten, "conv_padding_rewritten").PaddedConv1d(**kwargs)
    rewritten.load_state_dict(original.state_dict())
    return original.eval(), rewritten.eval()


def _signal(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 2, length, generator=torch.Generator().manual_seed(length))


GEOMETRIES = [
    {"kernel_size": 7, "stride": 3},
    {"kernel_size": 4, "stride": 2, "causal": True},
    {"kernel_size": 3, "stride": 1, "dilation": 2},
    {"kernel_size": 10, "stride": 5, "causal": True},
    {"kernel_size": 2, "stride": 4},
]


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_both_arms_are_bit_identical_to_the_original(geometry: dict):
    original, rewritten = _pair(_change("conv"), **geometry)
    with torch.no_grad():
        for length in LENGTHS:
            expected = original(_signal(length))
            assert torch.equal(rewritten(_signal(length)), expected), length
            with mock.patch("torch.compiler.is_exporting", return_value=True):
                assert torch.equal(rewritten(_signal(length)), expected), length


def test_one_program_from_short_inputs_matches_the_original():
    """From 4 samples (2 frames: torch specialises a conv output of 1 frame, the rewrite or not) to 256, the reflect
    padding of inputs shorter than the padding included."""
    samples = Dim("samples", min=4, max=256)
    original, rewritten = _pair(_change("conv"), kernel_size=7, stride=3)
    with pytest.raises(Exception, match="data-dependent|Constraints violated"):
        torch.export.export(original, (_signal(40),), dynamic_shapes=({2: samples},), strict=False)
    program = torch.export.export(rewritten, (_signal(40),), dynamic_shapes=({2: samples},), strict=False).module()
    with torch.no_grad():
        for length in (*LENGTHS[3:], 255, 256):
            assert torch.equal(program(_signal(length)), original(_signal(length))), length


@pytest.fixture(scope="module")
def rewritten_module(tmp_path_factory):
    """model type -> transformers' modeling module of it rewritten by the codemod, imported in transformers' package
    (its relative imports) from a file (transformers' docstring decorators read the source file of each class)."""
    tf, folder, modules = find_transformers(), tmp_path_factory.mktemp("conv_padding_ints"), {}

    def load(model_type: str) -> types.ModuleType:
        if model_type not in modules:
            path = tf.root / "models" / model_type / f"modeling_{model_type}.py"
            change = run_codemods(
                path.read_text(encoding="utf-8"), path.name, tf.module_name(path), codemods=(ConvPaddingInts,)
            )
            assert any(f.kind == "rewritten" for f in change.findings), model_type
            assert not any(f.kind == "refused" for f in change.findings), model_type
            name = f"{tf.module_name(path)}_conv_padding_ints"
            source = folder / f"{name}.py"
            source.write_text(change.rewritten, encoding="utf-8")
            spec = importlib.util.spec_from_file_location(name, source)
            module = importlib.util.module_from_spec(spec)
            module.__package__ = tf.module_name(path).rsplit(".", 1)[0]
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            finally:
                del sys.modules[name]
            classes = sorted({f.construct.split(".")[0] for f in change.findings})
            modules[model_type] = module, classes
        return modules[model_type]

    return load


def test_the_models_rewritten_are_those_tested():
    tf = find_transformers()
    rewritten = set()
    for path in sorted((tf.root / "models").glob("*/modeling_*.py")):
        source = path.read_text(encoding="utf-8")
        if ConvPaddingInts.might_apply(source):
            change = run_codemods(source, path.name, tf.module_name(path), codemods=(ConvPaddingInts,))
            if change.findings:
                rewritten.add(path.parent.name)
    assert rewritten == set(MODELS)


@pytest.mark.parametrize("model_type", MODELS)
def test_every_class_rewritten_in_transformers_runs_both_arms_as_the_original(model_type: str, rewritten_module):
    """Every conv of the model type's tiny model whose class the codemod rewrote, run as the rewritten class (the
    same instance, its class swapped) on both arms, against transformers' class: bit-identical at every length, the
    short inputs of the reflect padding included."""
    rewritten, classes = rewritten_module(model_type)
    config = tiny_config(model_type)
    original_module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    torch.manual_seed(0)
    model = getattr(original_module, _model_class(original_module, config))(config).eval()
    exercised = 0
    for class_name in classes:
        convs = [module for module in model.modules() if type(module).__name__ == class_name]
        assert convs, class_name
        for conv in convs:
            channels = conv.conv.in_channels
            for length in LENGTHS:
                signal = torch.randn(2, channels, length, generator=torch.Generator().manual_seed(length))
                with torch.no_grad():
                    expected = conv(signal)
                    conv.__class__ = getattr(rewritten, class_name)
                    try:
                        assert torch.equal(conv(signal), expected), (class_name, length)
                        with mock.patch("torch.compiler.is_exporting", return_value=True):
                            assert torch.equal(conv(signal), expected), (class_name, length)
                    finally:
                        conv.__class__ = getattr(original_module, class_name)
            exercised += 1
    assert exercised >= 2


def _model_class(module: types.ModuleType, config) -> str:
    """The `...Model` class of `module` that takes `config` (the whole codec: encoder and decoder convs)."""
    return next(
        name
        for name in dir(module)
        if name.endswith("Model")
        and isinstance(getattr(module, name), type)
        and getattr(getattr(module, name), "config_class", None) is type(config)
    )


# The frame rounding's bound: EnCodec's float32 form against integer ceil-division, and the export arm's check


def _conv(stride: int):
    from transformers.models.encodec import modeling_encodec

    config = modeling_encodec.EncodecConfig()
    return modeling_encodec.EncodecConv1d(config, 1, 1, kernel_size=2 * stride, stride=stride)


def _float32_frames(conv, length: int) -> int:
    """transformers' extra padding for a signal of `length` (only the shape is read: a meta tensor)."""
    return int(conv._get_extra_padding_for_conv1d(torch.empty(1, 1, length, device="meta")))


def _export_arm(rewritten, conv, length: int) -> int:
    with mock.patch("torch.compiler.is_exporting", return_value=True):
        return rewritten._get_extra_padding_for_conv1d(conv, torch.empty(1, 1, length, device="meta"))


@pytest.mark.parametrize("stride", [2, 3, 4, 5, 8])
def test_integer_frames_equal_the_float32_ones_on_short_lengths(stride: int, rewritten_module):
    conv = _conv(stride)
    rewritten = rewritten_module("encodec")[0].EncodecConv1d
    with mock.patch("torch.compiler.is_exporting", return_value=True):
        for length in range(1, 3000):
            signal = torch.empty(1, 1, length, device="meta")
            assert rewritten._get_extra_padding_for_conv1d(conv, signal) == _float32_frames(conv, length), length


@pytest.mark.parametrize(("stride", "first"), [(3, 12582913), (2, 16777217), (8, 16777217)])
def test_the_export_arm_refuses_the_lengths_where_the_forms_differ(stride: int, first: int, rewritten_module):
    """The float32 form first differs at `first` (measured over every length below 2**25); the export arm's check
    refuses it, and holds up to 2**23 - 1, where both forms agree."""
    conv, rewritten = _conv(stride), rewritten_module("encodec")[0].EncodecConv1d
    assert _export_arm(rewritten, conv, 2**23 - 1) == _float32_frames(conv, 2**23 - 1)
    assert _float32_frames(conv, first - 1) == -(-(first - 1 - stride) // stride) * stride + stride - (first - 1)
    assert _float32_frames(conv, first) != -(-(first - stride) // stride) * stride + stride - first
    for length in (2**23, first):
        with pytest.raises(RuntimeError):
            _export_arm(rewritten, conv, length)
