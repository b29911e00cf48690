"""vision-grid-loops: the tensor-ops forms of transformers' vision helpers give the loops' results exactly, and the
codemod rewrites only the statements they were proven against.

1. Each helper the codemod adds (`TWINS`) against transformers' own function over random inputs: one to five images,
   one to three frames, merge sizes 1 to 3 (an int or one per image), window sizes of 1 to 4 merged tokens (sizes
   that are and are not multiples of them: empty padded windows), with and without the temporal column; nearest
   position ids over image sizes 1 to 20 and tables of 3 to 16 a side: `torch.equal` and the same dtype.
2. The installed `vision_utils.py` through the codemod: each function rewritten once, a second run changes nothing,
   eager and the export arm (`torch.compiler.is_exporting()` patched to True) of the rewritten functions agree.
3. Statements that differ from the proven ones are refused with the reason, and the module is left as it was.
"""

from __future__ import annotations

import sys
import types
from unittest import mock

import pytest
import torch
import transformers
from transformers import vision_utils

from codemods.vision_grid_loops import TWINS, VisionGridLoops
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods

MODULE = "transformers.vision_utils"


def _helper(function: str):
    twin = TWINS[function]
    namespace = {"torch": torch}
    exec(compile(twin.code, "<helper>", "exec"), namespace)
    return namespace[twin.helper]


def _grids(seed: int):
    """(grid_thw, merge) pairs: sizes that are multiples of the merge size, merge as an int or one per image."""
    generator = torch.Generator().manual_seed(seed)
    images = int(torch.randint(1, 6, (1,), generator=generator))
    merges = torch.randint(1, 4, (images,), generator=generator)
    frames = torch.randint(1, 4, (images,), generator=generator)
    blocks = torch.randint(1, 5, (images, 2), generator=generator)
    per_image = torch.stack([frames, blocks[:, 0] * merges, blocks[:, 1] * merges], dim=-1)
    uniform = torch.stack([frames, blocks[:, 0] * 2, blocks[:, 1] * 2], dim=-1)
    return [(per_image, merges), (uniform, 2)]


@pytest.mark.parametrize("include_temporal", [False, True])
def test_the_tensor_ops_form_gives_the_loops_ids_exactly(include_temporal: bool):
    helper = _helper("get_vision_position_ids")
    for seed in range(40):
        for grid, merge in _grids(seed):
            expected = vision_utils.get_vision_position_ids(grid, merge, include_temporal=include_temporal)
            actual = helper(grid, merge, include_temporal)
            assert actual.dtype == expected.dtype and torch.equal(actual, expected), (grid.tolist(), merge)
    grid = torch.tensor([[1, 4, 6]], dtype=torch.int32)  # an int32 grid still gives int64 ids, as the loop
    assert torch.equal(helper(grid, 2, False), vision_utils.get_vision_position_ids(grid, 2))


def _windows(seed: int):
    """(grid_thw, merge, window_size, patch_size): windows of 1 to 4 merged tokens a side."""
    generator = torch.Generator().manual_seed(seed)
    images = int(torch.randint(1, 5, (1,), generator=generator))
    merge, patch, side = (int(torch.randint(1, high, (1,), generator=generator)) for high in (4, 4, 5))
    frames = torch.randint(1, 3, (images,), generator=generator)
    grid = torch.stack([frames, *(torch.randint(1, 9, (2, images), generator=generator) * merge)], dim=-1)
    return grid, merge, side * merge * patch, patch


def test_the_tensor_ops_form_gives_the_loops_windows_exactly():
    helper = _helper("get_vision_window_index")
    for seed in range(200):
        grid, merge, window_size, patch = _windows(seed)
        expected = vision_utils.get_vision_window_index(grid, merge, window_size, patch)
        actual = helper(grid, merge, window_size, patch)
        for want, got in zip(expected, actual):
            assert got.dtype == want.dtype and torch.equal(got, want), (grid.tolist(), merge, window_size, patch)


def test_the_tensor_ops_form_gives_the_loops_nearest_positions_exactly():
    helper = _helper("get_vision_nearest_position_ids")
    for seed in range(100):
        generator = torch.Generator().manual_seed(seed)
        sizes = torch.randint(1, 21, (int(torch.randint(1, 5, (1,), generator=generator)), 2), generator=generator)
        side = int(torch.randint(3, 17, (1,), generator=generator))
        expected = vision_utils.get_vision_nearest_position_ids(sizes, side)
        actual = helper(sizes, side)
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), (sizes.tolist(), side)


def _rewritten_module(source: str) -> types.ModuleType:
    """The rewritten `vision_utils` as a module of transformers' package (its relative imports resolve)."""
    module = types.ModuleType(MODULE, None)
    module.__package__ = "transformers"
    exec(compile(source, "vision_utils_rewritten.py", "exec"), module.__dict__)
    return module


def test_the_installed_helper_is_rewritten_once_and_both_arms_agree():
    path = find_transformers().root / "vision_utils.py"
    if not path.is_file():
        pytest.skip(f"transformers {transformers.__version__} has no vision_utils")
    change = run_codemods(path.read_text(encoding="utf-8"), path.name, MODULE, codemods=(VisionGridLoops,))
    assert change.applied == ("vision-grid-loops",)
    assert sorted((finding.kind, finding.construct) for finding in change.findings) == [
        ("rewritten", function) for function in sorted(TWINS)
    ]
    again = run_codemods(change.rewritten, path.name, MODULE, codemods=(VisionGridLoops,))
    assert not again.changed and not again.findings
    module = _rewritten_module(change.rewritten)
    for seed in range(10):
        for grid, merge in _grids(seed):
            expected = vision_utils.get_vision_position_ids(grid, merge)
            assert torch.equal(module.get_vision_position_ids(grid, merge), expected)
            with mock.patch("torch.compiler.is_exporting", return_value=True):
                assert torch.equal(module.get_vision_position_ids(grid, merge), expected)
        grid, merge, window_size, patch = _windows(seed)
        expected = vision_utils.get_vision_window_index(grid, merge, window_size, patch)
        for exporting in (False, True):
            with mock.patch("torch.compiler.is_exporting", return_value=exporting):
                actual = module.get_vision_window_index(grid, merge, window_size, patch)
            assert all(torch.equal(got, want) for got, want in zip(actual, expected))


def test_a_loop_other_than_the_proven_one_is_refused():
    path = find_transformers().root / "vision_utils.py"
    if not path.is_file():
        pytest.skip(f"transformers {transformers.__version__} has no vision_utils")
    source = path.read_text(encoding="utf-8")
    changed = source.replace("hpos_ids = hpos_ids.reshape(block_shape).transpose(1, 2).flatten()", "hpos_ids = hpos_ids.flatten()")
    assert changed != source
    change = run_codemods(changed, path.name, MODULE, codemods=(VisionGridLoops,))
    refused = [(f.construct, f.reason) for f in change.findings if f.kind == "refused"]
    assert refused == [
        ("get_vision_position_ids", "its statements are not the ones whose tensor-ops form was proven equal")
    ]
    assert "def get_vision_position_ids" in change.rewritten and "vision_position_ids_from_grid" not in change.rewritten
    assert sys.modules[MODULE] is vision_utils  # the test never replaced transformers' module
