"""The transformers 4.56 form of `DynamicSlidingWindowLayer.get_mask_sizes` (a tensor offset from `cache_position[0]`,
the length from `get_seq_length()`), rewritten by `sliding-window-cache`, against the original.

1. the export form (run in eager with `torch.compiler.is_exporting()` patched to True) returns the same length and
   the same offset, as an int, on both sides of the window, and raises where the positions do not start at the
   cache length (the original's tensor offset would then differ from the counter's);
2. one exported program that pads and slices a padding mask with these sizes the way `masking_utils` does (a Python
   `if` on the offset) runs on both sides of the window and equals the original in eager; the original form fails to
   export there (a data-dependent guard on its tensor offset).
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from codemods.sliding_window_cache import SlidingWindowCache
from exportsmith.pipeline import run_codemods

FIXTURE = Path(__file__).parent / "fixtures" / "sliding_window_cache" / "layer_456.in.py"


class DynamicLayer:
    """The little of transformers' base layer that `get_mask_sizes` needs."""

    def __init__(self, sliding_window: int, cumulative_length: int = 0):
        self.sliding_window, self.cumulative_length = sliding_window, cumulative_length


def _layer_classes() -> tuple[type, type]:
    source = FIXTURE.read_text()
    change = run_codemods(source, FIXTURE.name, "transformers.cache_utils", codemods=(SlidingWindowCache,))
    assert change.applied == ("sliding-window-cache",)
    classes = []
    for text, name in ((source, "original"), (change.rewritten, "rewritten")):
        module = types.ModuleType(f"sliding_456_{name}")
        module.DynamicLayer = DynamicLayer
        exec(compile(text, f"{module.__name__}.py", "exec"), module.__dict__)
        classes.append(module.DynamicSlidingWindowLayer)
    return classes[0], classes[1]


@pytest.mark.parametrize("window", [1, 2, 4, 6])
def test_export_form_gives_the_same_sizes_on_both_sides_of_the_window(window, monkeypatch):
    original, rewritten = _layer_classes()
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    for past in range(0, 11):
        for new in (1, 3):
            positions = torch.arange(past, past + new)
            length, offset = original(window, past).get_mask_sizes(positions)
            export_length, export_offset = rewritten(window, past).get_mask_sizes(positions)
            assert isinstance(offset, torch.Tensor) and isinstance(export_offset, int)
            assert (export_length, export_offset) == (length, int(offset)), (past, new)


def test_export_form_raises_when_the_positions_do_not_start_at_the_cache_length(monkeypatch):
    _, rewritten = _layer_classes()
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    with pytest.raises(RuntimeError, match="cache_position does not start at the cache length"):
        rewritten(4, 6).get_mask_sizes(torch.arange(8, 10))
    assert rewritten(4, 2).get_mask_sizes(torch.arange(1, 3)) == (4, 0)  # both offsets 0 below the window


class _PaddingMask(torch.nn.Module):
    """The sizes of a layer whose counter is the length of `past`, used as `masking_utils.prepare_padding_mask`
    uses them: pad the 2D mask when it is shorter than offset + length (a Python `if`), then gather the window."""

    def __init__(self, layer_class: type, window: int):
        super().__init__()
        self.layer_class, self.window = layer_class, window

    def forward(self, attention_mask, past, cache_position):
        layer = self.layer_class(self.window, past.shape[0])
        kv_length, kv_offset = layer.get_mask_sizes(cache_position)
        if (padding_length := kv_length + kv_offset - attention_mask.shape[-1]) > 0:
            attention_mask = torch.nn.functional.pad(attention_mask, (0, padding_length))
        indices = torch.arange(kv_length) + kv_offset
        return attention_mask[:, indices]


def _inputs(past: int, new: int):
    """A padding mask over the past and new tokens (the last past position padded), as a model gets it."""
    mask = torch.ones(2, past + new, dtype=torch.bool)
    mask[1, past - 1] = False
    return mask, torch.zeros(past), torch.arange(past, past + new)


def _export(layer_class: type) -> torch.export.ExportedProgram:
    return torch.export.export(
        _PaddingMask(layer_class, 4),
        _inputs(2, 3),
        dynamic_shapes=({1: Dim.AUTO}, {0: Dim.AUTO}, {0: Dim.AUTO}),
        strict=False,
    )


def test_one_program_pads_and_slices_the_mask_on_both_sides_of_the_window():
    original, rewritten = _layer_classes()
    program = _export(rewritten)
    reference = _PaddingMask(original, 4)
    # (sizes stay at least the traced ones' lower bounds: a mask shorter than 4 is a guard of export's, known)
    for past, new in ((2, 3), (3, 1), (9, 1), (7, 4), (3, 2), (8, 2), (4, 1), (2, 2)):
        inputs = _inputs(past, new)
        expected = reference(*inputs)
        assert torch.equal(program.module()(*inputs), expected), (past, new)


def test_the_original_form_does_not_export():
    original, _ = _layer_classes()
    with pytest.raises(Exception, match="data-dependent|GuardOnDataDependentSymNode"):
        _export(original)
