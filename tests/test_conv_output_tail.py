"""conv-output-tail at run time, with pad-to-min-length: a conv mixer (`fixtures/conv_output_tail/runtime_mixer.in.py`
run through the codemod here) over the vendored `LinearAttentionLayer` behaves like the original over transformers'
layer in eager, and one exported program serves prefills shorter than, as long as and longer than the conv kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from torch.export import Dim

import generated  # noqa: F401  (registers the cache pytree nodes)
from codemods.conv_output_tail import ConvOutputTail
from exportsmith.pipeline import run_codemods
from exportsmith.verify.shapes import dynamic_shapes_like
from generated._shared import cache_utils as vendored
from source_modules import module_from_source

SOURCE = Path(__file__).parent / "fixtures" / "conv_output_tail" / "runtime_mixer.in.py"
LENGTHS = [1, 2, 3, 4, 5, 9]  # the kernel is 4


def _mixers():
    source = SOURCE.read_text()
    change = run_codemods(source, SOURCE.name, "transformers.models.toy.modeling_toy", codemods=(ConvOutputTail,))
    assert change.applied == ("conv-output-tail",)
    original = module_from_source(source, "runtime_mixer_original").ShortConvMixer()
    rewritten = module_from_source(change.rewritten, "runtime_mixer_rewritten").ShortConvMixer()
    rewritten.load_state_dict(original.state_dict())
    return original.eval(), rewritten.eval()


def _hidden(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, length, 6, generator=torch.Generator().manual_seed(length))


def _run(mixer, layer_class, length: int, past: int = 0):
    """The mixer's output and its layer's conv state, after a prefill of `past` positions when `past`."""
    layer = layer_class()
    if past:
        mixer(_hidden(past), layer)
    return mixer(_hidden(length), layer), layer


@pytest.mark.parametrize("past", [0, 3, 6])
@pytest.mark.parametrize("length", LENGTHS)
def test_eager_mixer_is_bit_identical(length: int, past: int):
    original, rewritten = _mixers()
    with torch.no_grad():
        expected, expected_layer = _run(original, transformers.cache_utils.LinearAttentionLayer, length, past)
        actual, actual_layer = _run(rewritten, vendored.LinearAttentionLayer, length, past)
    assert torch.equal(expected, actual)
    assert torch.equal(expected_layer.conv_states[0], actual_layer.conv_states[0])


class _AndLayer(torch.nn.Module):
    """The mixer, returning its cache layer too (an exported program returns what the layer holds after the call)."""

    def __init__(self, mixer):
        super().__init__()
        self.mixer = mixer

    def forward(self, hidden_states, layer):
        return self.mixer(hidden_states, layer), layer


def _export(mixer, layer_class, length: int):
    layer = layer_class()
    shapes = ({1: Dim.DYNAMIC}, dynamic_shapes_like(layer, lambda t: None))
    with torch.no_grad():
        return torch.export.export(_AndLayer(mixer), (_hidden(length), layer), dynamic_shapes=shapes, strict=False)


@pytest.mark.parametrize("example", [5, 2])  # traced longer / shorter than the kernel
def test_one_exported_prefill_matches_the_original_at_every_length(example: int):
    original, rewritten = _mixers()
    program = _export(rewritten, vendored.LinearAttentionLayer, example)
    for length in LENGTHS:
        with torch.no_grad():
            expected, expected_layer = _run(original, transformers.cache_utils.LinearAttentionLayer, length)
        actual, actual_layer = program.module()(_hidden(length), vendored.LinearAttentionLayer())
        assert torch.equal(expected, actual), length
        assert torch.equal(expected_layer.conv_states[0], actual_layer.conv_states[0]), length


def test_the_slice_alone_still_guards_on_the_side_of_the_kernel():
    """Why the tail needs its rewrite too: with only the padding rewritten, the activated conv output is `max(L, 4)`
    long and the slice of its last L positions is contiguous only when L >= 4, which the program guards."""
    original, _ = _mixers()
    program = _export(original, vendored.LinearAttentionLayer, 5)
    with pytest.raises(Exception, match="Guard failed"):
        program.module()(_hidden(1), vendored.LinearAttentionLayer())
