"""The pad-to-min-length rewrite at run time: the vendored `LinearAttentionLayer` against transformers' own, for
prefills shorter than, as long as and longer than the conv kernel, in eager and through torch.export (one program
traced on either side serves every length, with named dims too)."""

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
        # what a model does with it: a depthwise causal conv, keeping the outputs of the new positions (under export
        # the states come behind all KERNEL padding positions: models read them right-aligned)
        weight = torch.arange(1.0, KERNEL + 1).expand(conv_states.shape[1], 1, KERNEL)
        out = torch.nn.functional.conv1d(full, weight, padding=KERNEL - 1, groups=conv_states.shape[1])
        return full, out[..., : full.shape[-1]][..., -conv_states.shape[-1] :].clone(), layer


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
        # the states behind KERNEL zeros, of which eager keeps the last max(length, KERNEL)
        assert actual[0].shape[-1] == length + KERNEL, length
        assert torch.equal(expected[0], actual[0][..., -expected[0].shape[-1] :]), length
        assert not actual[0][..., :KERNEL].any(), length
        # the conv runs over more positions than in eager: its rounding may differ
        torch.testing.assert_close(actual[1], expected[1], rtol=1e-6, atol=1e-6)
        assert torch.equal(expected[2].conv_states[0], actual[2].conv_states[0]), length
        assert actual[2].has_previous_state[0] is True


def test_a_program_with_named_dims_serves_every_length():
    """The slice of max(length, KERNEL) positions left `Max` in every size after it: named dims failed on guards torch
    could not prove (`L <= max(4, L)`)."""
    layer = vendored.LinearAttentionLayer()
    shapes = (dynamic_shapes_like(layer, lambda t: None), {2: Dim("length", min=1, max=64)})
    program = torch.export.export(_Prefill(), (layer, _states(5, 5)), dynamic_shapes=shapes, strict=False)
    for length in LENGTHS:
        expected = _Prefill()(transformers.cache_utils.LinearAttentionLayer(), _states(length, length))
        actual = program.module()(vendored.LinearAttentionLayer(), _states(length, length))
        torch.testing.assert_close(actual[1], expected[1], rtol=1e-6, atol=1e-6)


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


# The right padding of the 2D attention mask up to the key length (`masking_utils.prepare_padding_mask`, vendored in
# generated/_shared) and of the block ids (`maybe_pad_block_sequence_ids`, another padding value)
from generated._shared import masking_utils as vendored_masks  # noqa: E402

MASK_LENGTHS = [1, 2, 5, 8, 9]  # shorter than the key length (6), equal, longer


def _mask(length: int, dtype=torch.long) -> torch.Tensor:
    return torch.randint(0, 2, (3, length), generator=torch.Generator().manual_seed(length)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.long, torch.bool])
@pytest.mark.parametrize("length", MASK_LENGTHS)
def test_eager_mask_padding_is_bit_identical_to_transformers(length: int, dtype):
    for kv_length, kv_offset in [(6, 0), (4, 2), (1, 7)]:
        expected = transformers.masking_utils.prepare_padding_mask(_mask(length, dtype), kv_length, kv_offset)
        actual = vendored_masks.prepare_padding_mask(_mask(length, dtype), kv_length, kv_offset)
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)
    ids = _mask(length) + 3
    expected = transformers.masking_utils.maybe_pad_block_sequence_ids(ids, None, 4, 2)
    assert torch.equal(vendored_masks.maybe_pad_block_sequence_ids(ids.clone(), None, 4, 2), expected)


class _PadMask(torch.nn.Module):
    """The mask padded up to past + new key positions, read at every key position as the mask functions do."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, attention_mask, past, new):
        kv_length = past.shape[0] + new.shape[0]
        padded = self.module.prepare_padding_mask(attention_mask, kv_length, 0)
        ids = self.module.maybe_pad_block_sequence_ids(attention_mask + 3, None, kv_length, 0)
        positions = torch.arange(kv_length)
        return padded[:, positions], ids[:, positions]


def _export_mask(module, mask: int, past: int, new: int):
    dyn = torch.export.Dim.DYNAMIC
    args = (_mask(mask), torch.zeros(past), torch.zeros(new))
    return torch.export.export(_PadMask(module), args, dynamic_shapes=({1: dyn}, {0: dyn}, {0: dyn}), strict=False)


def test_one_mask_program_serves_every_mask_length_and_a_1_token_cache():
    # traced as generate's decode steps are (the mask as long as past + new, both >= 2): the first step of a
    # generation from a 1-token prompt (past 1, new 1) is in its range, and so is a static cache's shorter mask
    program = _export_mask(vendored_masks, 8, 5, 3)
    for mask, past, new in [(2, 1, 1), (3, 1, 2), (5, 4, 1), (3, 5, 3), (12, 9, 3)]:
        args = (_mask(mask), torch.zeros(past), torch.zeros(new))
        expected = _PadMask(transformers.masking_utils)(*args)
        actual = program.module()(*args)
        assert all(torch.equal(e, a) for e, a in zip(expected, actual)), (mask, past, new)


def test_transformers_own_mask_padding_guards_on_the_traced_lengths():
    """What the rewrite removes: `mask >= past + new` with past, new >= 2 when traced, so >= 4."""
    program = _export_mask(transformers.masking_utils, 8, 5, 3)
    with pytest.raises(Exception, match="Guard failed"):
        program.module()(_mask(2), torch.zeros(1), torch.zeros(1))
