"""Why the conv padding of encodec/wavtokenizer (and the copies in mimi, pocket_tts) stays refused: the length rounding
of `_get_extra_padding_for_conv1d` is a float32 division of 0-d int64 buffers, which integer ceil-division equals only
below a length, and the cond-branches refusal of `_pad1d` says so (`codemods/cond_targets.json`)."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers.models.encodec import modeling_encodec

from codemods.cond_branches import CondBranches
from exportsmith.pipeline import run_codemods


def _conv(stride: int) -> modeling_encodec.EncodecConv1d:
    config = modeling_encodec.EncodecConfig()
    return modeling_encodec.EncodecConv1d(config, 1, 1, kernel_size=2 * stride, stride=stride)


def _helper(conv, length: int) -> int:
    """The helper's extra padding for a signal of `length` (only the shape is read: a meta tensor)."""
    return int(conv._get_extra_padding_for_conv1d(torch.empty(1, 1, length, device="meta")))


def _ceil_division(conv, length: int) -> int:
    """The integer candidate: the same formula with `-(-a // b)` on ints."""
    stride, kernel, padding = int(conv.stride), int(conv.kernel_size), int(conv.padding_total)
    frames = -(-(length - kernel + padding) // stride)
    return frames * stride + kernel - padding - length


@pytest.mark.parametrize("stride", [2, 3, 4, 5, 8])
def test_ceil_division_equals_the_helper_on_short_lengths(stride: int):
    conv = _conv(stride)
    for length in range(0, 3000):
        assert _helper(conv, length) == _ceil_division(conv, length), length


@pytest.mark.parametrize(("stride", "first"), [(3, 12582913), (2, 16777217), (8, 16777217)])
def test_ceil_division_differs_from_the_helper_at_long_lengths(stride: int, first: int):
    conv = _conv(stride)
    assert _helper(conv, first - 1) == _ceil_division(conv, first - 1)
    assert _helper(conv, first) != _ceil_division(conv, first)


def test_the_pad1d_refusal_gives_the_measured_reason():
    source = inspect.getsource(modeling_encodec)
    change = run_codemods(
        source, "models/encodec/modeling_encodec.py", modeling_encodec.__name__, codemods=(CondBranches,)
    )
    refusals = [f.reason for f in change.findings if f.kind == "refused" and f.construct == "length <= max_pad"]
    assert len(refusals) == 1
    assert "float32 quotient rounds differently from a length of 12582913" in refusals[0]
