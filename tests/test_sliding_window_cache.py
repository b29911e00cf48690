"""The sliding-window rewrites: what they refuse, and the rewritten layer against transformers' at lengths on both
sides of the window, in eager and through torch.export (one program for all lengths)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from torch.export import Dim

import generated  # noqa: F401  (registers the cache pytree nodes)
from exportsmith.pipeline import run_codemods
from exportsmith.verify.shapes import dynamic_shapes_like
from generated._shared import cache_utils as vendored

FIXTURES = Path(__file__).parent / "fixtures"


def _findings(codemod: str, case: str):
    path = FIXTURES / codemod / f"{case}.in.py"
    return [(f.kind, f.construct, f.reason) for f in run_codemods(path.read_text(), path.name).findings]


def test_other_forms_of_the_layer_are_refused_with_a_reason():
    assert _findings("sliding_window_cache", "refuse_other_forms") == [
        (
            "refused",
            "DynamicSlidingWindowLayer.get_mask_sizes",
            "not transformers' `is_full`/`max` form of the window sizes",
        ),
        (
            "refused",
            "DynamicSlidingWindowLayer.update",
            "no `self.keys = A[:, :, -self.sliding_window + 1 :, :]` pair",
        ),
    ]


def test_the_4_57_layer_is_rewritten_too():
    kinds = [kind for kind, _, _ in _findings("sliding_window_cache", "layer_457")]
    assert kinds == ["rewritten", "rewritten"]


def test_the_4_57_compiling_flag_form_returns_first_and_refuses_what_it_cannot_prove():
    # an argument augmented in place is not a local binding; a flag tested without `not` is not the form
    path = FIXTURES / "export_early_return" / "compiling_flag_457.in.py"
    findings = [
        (f.kind, f.construct, f.reason)
        for f in run_codemods(path.read_text(), path.name).findings
        if f.codemod == "export-early-return"
    ]
    assert findings == [
        ("rewritten", "def _ignore_causal_mask_sdpa", "returns False first under torch.compile and export"),
        ("refused", "def augments_an_argument", "a statement before the `is_tracing` test does more than bind locals"),
    ]


def test_an_early_return_is_refused_when_something_else_runs_first():
    assert _findings("export_early_return", "refuse_side_effect") == [
        ("refused", "def logs_first", "a statement before the export test does more than bind locals"),
        ("refused", "def writes_an_attribute", "a statement before the export test does more than bind locals"),
    ]


# ----------------------------------------------------------------------------------------------------------------
# Runtime: the rewritten layer (the vendored subclass) against transformers' own, on both sides of the window
# ----------------------------------------------------------------------------------------------------------------

WINDOW = 5
# (past, new) pairs: inside the window, reaching it exactly (past + new == window - 1 and == window), past it
LENGTHS = [(0, 2), (0, 1), (2, 2), (3, 1), (4, 1), (2, 7), (8, 1), (6, 3), (11, 4), (1, 12)]


def _states(seed: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, length, 4, generator=generator), torch.randn(2, 3, length, 6, generator=generator)


def _filled(layer_class, past: int, window: int = WINDOW):
    """A layer after a prefill of `past` positions (none when 0: a fresh, uninitialized layer)."""
    layer = layer_class(sliding_window=window)
    if past:
        layer.update(*_states(past, past))
    return layer


def _step(layer, new: int):
    """What a decoder layer does with its cache: mask sizes for the new tokens, then the update."""
    kv_length, kv_offset = layer.get_mask_sizes(new)
    keys, values = layer.update(*_states(100 + new, new))
    return kv_length, kv_offset, keys, values


@pytest.mark.parametrize("window", [1, 2, WINDOW])
@pytest.mark.parametrize(("past", "new"), LENGTHS)
def test_eager_layer_is_bit_identical_to_transformers(past: int, new: int, window: int):
    original = _filled(transformers.cache_utils.DynamicSlidingWindowLayer, past, window)
    rewritten = _filled(vendored.DynamicSlidingWindowLayer, past, window)
    expected, actual = _step(original, new), _step(rewritten, new)
    assert expected[:2] == actual[:2]
    assert all(torch.equal(e, a) for e, a in zip(expected[2:], actual[2:]))
    assert torch.equal(original.keys, rewritten.keys) and torch.equal(original.values, rewritten.values)
    assert original.cumulative_length == rewritten.cumulative_length


class _Step(torch.nn.Module):
    def forward(self, layer, key_states, value_states):
        kv_length, kv_offset = layer.get_mask_sizes(key_states.shape[-2])
        keys, values = layer.update(key_states, value_states)
        # the mask sizes as a tensor: positions kv_offset .. kv_offset + kv_length - 1
        return keys, values, layer, torch.arange(kv_length) + kv_offset


def _export(layer_class, past: int, new: int, dim=Dim.DYNAMIC):
    layer = _filled(layer_class, past)
    # past the window eager keeps a view of the concatenation; a program traced with a view as input guards on its
    # strides (any input, not the layer's doing), so the example holds contiguous copies
    layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
    key_states, value_states = _states(100 + new, new)
    dims = {2: dim}
    shapes = (dynamic_shapes_like(layer, lambda t: dims if t.dim() == 4 else None), dims, dims)
    return torch.export.export(_Step(), (layer, key_states, value_states), dynamic_shapes=shapes, strict=False)


def _run_both(program, past: int, new: int):
    expected = _Step()(_filled(transformers.cache_utils.DynamicSlidingWindowLayer, past), *_states(100 + new, new))
    actual = program.module()(_filled(vendored.DynamicSlidingWindowLayer, past), *_states(100 + new, new))
    return expected, actual


@pytest.mark.parametrize(("example_past", "example_new"), [(2, 2), (7, 3)])  # traced inside / past the window
def test_one_exported_program_matches_transformers_on_both_sides_of_the_window(example_past, example_new):
    program = _export(vendored.DynamicSlidingWindowLayer, example_past, example_new)
    for past, new in [(p, n) for p, n in LENGTHS if p >= 2 and n >= 1]:
        expected, actual = _run_both(program, past, new)
        for e, a in [(expected[0], actual[0]), (expected[1], actual[1]), (expected[3], actual[3])]:
            assert torch.equal(e, a), (past, new)
        assert torch.equal(expected[2].keys, actual[2].keys) and torch.equal(expected[2].values, actual[2].values)
        assert expected[2].cumulative_length == actual[2].cumulative_length == past + new


def test_transformers_own_layer_guards_on_the_side_of_the_window():
    """What the rewrite removes: transformers' layer specialises lengths declared dynamic, and with automatic dims, a
    program traced inside the window rejects a cache past it."""
    with pytest.raises(Exception, match="Constraints violated"):
        _export(transformers.cache_utils.DynamicSlidingWindowLayer, 2, 2)
    program = _export(transformers.cache_utils.DynamicSlidingWindowLayer, 2, 2, dim=Dim.AUTO)
    layer = _filled(transformers.cache_utils.DynamicSlidingWindowLayer, 8)
    with pytest.raises(Exception, match="Guard failed"):
        program.module()(layer, *_states(101, 1))


def test_the_vendored_cache_builds_the_vendored_layers_and_stays_a_transformers_cache():
    config = transformers.MistralConfig(
        num_hidden_layers=2, sliding_window=WINDOW, hidden_size=8, num_attention_heads=2
    )
    cache = vendored.DynamicCache(config=config)
    assert isinstance(cache, transformers.DynamicCache) and isinstance(cache, transformers.Cache)
    assert [type(layer) for layer in cache.layers] == [vendored.DynamicSlidingWindowLayer] * 2
    assert all(isinstance(layer, transformers.cache_utils.DynamicSlidingWindowLayer) for layer in cache.layers)
    hybrid = vendored.LinearAttentionAndSlidingWindowAttentionLayer
    assert hybrid.update is vendored.DynamicSlidingWindowLayer.update
    assert hybrid.get_mask_sizes is vendored.DynamicSlidingWindowLayer.get_mask_sizes
    assert hybrid.update_conv_state is vendored.LinearAttentionLayer.update_conv_state


# ----------------------------------------------------------------------------------------------------------------
# Runtime: `_ignore_causal_mask_sdpa` returns False first under export (export-early-return)
# ----------------------------------------------------------------------------------------------------------------


def test_ignore_causal_mask_sdpa_is_unchanged_in_eager():
    from generated._shared import masking_utils as vendored_masks

    ones = torch.ones(2, 9, dtype=torch.bool)
    padded = ones.clone()
    padded[0, 0] = False
    cases = [
        (None, 1, 5, 4, 0),
        (ones, 1, 8, 8, 1),  # longer than the keys: the visible part is gathered
        (ones, 4, 9, 5, 0),
        (padded, 4, 9, 5, 0),
        (padded, 1, 8, 8, 1),
        (ones, 9, 9, 0, 0, 4),  # local attention size reached
    ]
    for case in cases:
        expected = transformers.masking_utils._ignore_causal_mask_sdpa(*case)
        assert vendored_masks._ignore_causal_mask_sdpa(*case) == expected, case


class _MaskSkip(torch.nn.Module):
    def __init__(self, ignore):
        super().__init__()
        self.ignore = ignore

    def forward(self, padding_mask, cache_length):
        # a sliding window of 4: the mask covers past + new tokens, the keys at most 3 + new ones
        past = cache_length.shape[0]
        q_length = padding_mask.shape[-1] - past
        kv_length, kv_offset = torch.sym_min(past, 3) + q_length, past - torch.sym_min(past, 3)
        skip = self.ignore(padding_mask, q_length, kv_length, past, kv_offset)
        return padding_mask.float() + float(skip)


@pytest.mark.parametrize("rewritten", [True, False])
def test_ignore_causal_mask_sdpa_exports_without_a_guard_on_the_window(rewritten: bool):
    from generated._shared import masking_utils as vendored_masks

    module = vendored_masks if rewritten else transformers.masking_utils
    example = (torch.ones(2, 5, dtype=torch.bool), torch.zeros(2))  # inside the window
    shapes = ({1: Dim.DYNAMIC}, {0: Dim.DYNAMIC})
    program = torch.export.export(_MaskSkip(module._ignore_causal_mask_sdpa), example, dynamic_shapes=shapes)
    past_the_window = (torch.ones(2, 12, dtype=torch.bool), torch.zeros(9))
    if rewritten:
        assert torch.equal(program.module()(*past_the_window), torch.ones(2, 12))
    else:
        with pytest.raises(Exception, match="Guard failed"):
            program.module()(*past_the_window)
