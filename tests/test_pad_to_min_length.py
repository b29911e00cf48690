"""The pad-to-min-length rewrite at run time: the vendored `LinearAttentionLayer` against transformers' own, for
prefills shorter than, as long as and longer than the conv kernel, in eager and through torch.export (one program
traced on either side serves every length)."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.export import Dim

import generated  # noqa: F401  (registers the cache pytree nodes)
from exportsmith.verify.shapes import dynamic_shapes_like
from generated._shared import cache_utils as vendored

KERNEL = 4
LENGTHS = [1, 2, 3, 4, 5, 9]  # shorter than the kernel, equal, longer


def _states(seed: int, length: int, channels: int = 6) -> torch.Tensor:
    return torch.randn(2, channels, length, generator=torch.Generator().manual_seed(seed))


def _prefill(layer_class, length: int, record_past: bool = False):
    layer = layer_class()
    if record_past:
        layer.activate_past_recording()
    full = layer.update_conv_state(_states(length, length), conv_kernel_size=KERNEL)
    return layer, full


@pytest.mark.parametrize("record_past", [False, True])
@pytest.mark.parametrize("length", LENGTHS)
def test_eager_layer_is_bit_identical_to_transformers(length: int, record_past: bool):
    original, expected = _prefill(transformers.cache_utils.LinearAttentionLayer, length, record_past)
    rewritten, actual = _prefill(vendored.LinearAttentionLayer, length, record_past)
    assert expected.shape[-1] == (length if record_past else max(length, KERNEL))
    assert torch.equal(expected, actual)
    assert torch.equal(original.conv_states[0], rewritten.conv_states[0])
    # the decode step after it (untouched by the rewrite) sees the same state
    step = _states(99, 1)
    assert torch.equal(original.update_conv_state(step), rewritten.update_conv_state(step))
    assert torch.equal(original.conv_states[0], rewritten.conv_states[0])


class _Prefill(torch.nn.Module):
    def forward(self, layer, conv_states):
        full = layer.update_conv_state(conv_states, conv_kernel_size=KERNEL)
        # what a model does with it: a depthwise causal conv, keeping the outputs of the new positions
        weight = torch.arange(1.0, KERNEL + 1).expand(conv_states.shape[1], 1, KERNEL)
        out = torch.nn.functional.conv1d(full, weight, padding=KERNEL - 1, groups=conv_states.shape[1])
        return full, out[..., : full.shape[-1]].clone(), layer


def _export(layer_class, length: int):
    layer = layer_class()
    shapes = (dynamic_shapes_like(layer, lambda t: None), {2: Dim.DYNAMIC})
    return torch.export.export(_Prefill(), (layer, _states(length, length)), dynamic_shapes=shapes, strict=False)


@pytest.mark.parametrize("example", [5, 2])  # traced longer / shorter than the kernel
def test_one_exported_program_matches_transformers_on_both_sides_of_the_kernel(example: int):
    program = _export(vendored.LinearAttentionLayer, example)
    for length in LENGTHS:
        expected = _Prefill()(transformers.cache_utils.LinearAttentionLayer(), _states(length, length))
        actual = program.module()(vendored.LinearAttentionLayer(), _states(length, length))
        assert torch.equal(expected[0], actual[0]), length
        assert torch.equal(expected[1], actual[1]), length
        assert torch.equal(expected[2].conv_states[0], actual[2].conv_states[0]), length
        assert actual[2].has_previous_state[0] is True


def test_transformers_own_layer_guards_on_the_side_of_the_kernel():
    """What the rewrite removes: a program traced with a prefill longer than the kernel rejects a shorter one."""
    program = _export(transformers.cache_utils.LinearAttentionLayer, 5)
    with pytest.raises(Exception, match="Guard failed"):
        program.module()(transformers.cache_utils.LinearAttentionLayer(), _states(1, 1))


def test_the_vendored_caches_build_the_vendored_linear_attention_layers():
    config = transformers.Qwen3NextConfig(
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        hidden_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    cache = vendored.DynamicCache(config=config)
    assert isinstance(cache, transformers.DynamicCache)
    assert [type(layer) for layer in cache.layers] == [vendored.LinearAttentionLayer, transformers.DynamicLayer]
    for name in (
        "LinearAttentionAndFullAttentionLayer",
        "LinearAttentionAndSlidingWindowAttentionLayer",
        "LinearAttentionAndStaticFullAttentionLayer",
        "LinearAttentionAndStaticSlidingWindowAttentionLayer",
    ):
        hybrid = getattr(vendored, name)
        assert issubclass(hybrid, getattr(transformers.cache_utils, name))
        assert hybrid.update_conv_state is vendored.LinearAttentionLayer.update_conv_state
