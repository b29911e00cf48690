"""exclusive-cumsum at run time: the rewritten fixture (`fixtures/exclusive_cumsum/prefix_sums.in.py`) gives the
original's values bit for bit in eager and on its export arm (run in eager), for integer and float sums; the
original exported with a dynamic number of images rejects other numbers, the rewritten one serves them all."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.export import Dim

from codemods.exclusive_cumsum import ExclusiveCumsum
from exportsmith.pipeline import run_codemods
from source_modules import module_from_source

SOURCE = Path(__file__).parent / "fixtures" / "exclusive_cumsum" / "prefix_sums.in.py"


def _modules():
    source = SOURCE.read_text()
    change = run_codemods(source, SOURCE.name, "transformers.models.toy.modeling_toy", codemods=(ExclusiveCumsum,))
    assert change.applied == ("exclusive-cumsum",)
    return module_from_source(source, "prefix_sums_original"), module_from_source(change.rewritten, "prefix_sums_rewritten")


def _grid(images: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 5, (images, 3), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("exporting", [False, True])
def test_both_arms_give_the_original_bit_for_bit(exporting: bool):
    original, rewritten = _modules()
    with mock.patch("torch.compiler.is_exporting", return_value=exporting):
        for images in (1, 2, 3, 7):
            grid = _grid(images, images)
            assert torch.equal(rewritten.patch_starts(grid), original.patch_starts(grid))
            lengths = grid[:, 0]
            weights = torch.rand(images, generator=torch.Generator().manual_seed(images), dtype=torch.float64)
            for expected, actual in zip(original.Offsets()(lengths, weights), rewritten.Offsets()(lengths, weights)):
                assert expected.dtype == actual.dtype and torch.equal(expected, actual)


class _Starts(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, grid):
        return self.function(grid)


def _export(function, images: int):
    return torch.export.export(_Starts(function), (_grid(images),), dynamic_shapes=({0: Dim.DYNAMIC},), strict=False)


def test_one_program_serves_any_number_of_images():
    original, rewritten = _modules()
    with pytest.raises(AssertionError, match="Guard failed"):  # traced with 3 images, the original refuses 1
        _export(original.patch_starts, 3).module()(_grid(1))
    for traced in (2, 3):
        program = _export(rewritten.patch_starts, traced).module()
        for images in (1, 2, 3, 6):
            grid = _grid(images, images)
            assert torch.equal(program(grid), original.patch_starts(grid))
