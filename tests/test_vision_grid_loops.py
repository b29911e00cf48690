"""vision-grid-loops: the tensor-ops form of `get_vision_position_ids` gives the loop's ids exactly, and the codemod
rewrites only the loop it was proven against.

1. The helper the codemod adds (`HELPER_CODE`) against transformers' own `vision_utils.get_vision_position_ids`
   over random grids: one to five images, one to three frames, merge sizes 1, 2 and 3 as an int or one per image,
   with and without the temporal column: `torch.equal` (integer arithmetic, no rounding).
2. The installed `vision_utils.py` through the codemod: rewritten once, a second run changes nothing, eager (the
   loop) and the export arm (`torch.compiler.is_exporting()` patched to True) of the rewritten function agree.
3. A loop that differs from the proven one is refused with the reason, and the module is left as it was.
"""

from __future__ import annotations

import sys
import types
from unittest import mock

import pytest
import torch
import transformers
from transformers import vision_utils

from codemods.vision_grid_loops import HELPER, HELPER_CODE, VisionGridLoops
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods

MODULE = "transformers.vision_utils"


def _helper():
    namespace = {"torch": torch}
    exec(compile(HELPER_CODE, "<helper>", "exec"), namespace)
    return namespace[HELPER]


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
    helper = _helper()
    for seed in range(40):
        for grid, merge in _grids(seed):
            expected = vision_utils.get_vision_position_ids(grid, merge, include_temporal=include_temporal)
            actual = helper(grid, merge, include_temporal)
            assert actual.dtype == expected.dtype and torch.equal(actual, expected), (grid.tolist(), merge)
    grid = torch.tensor([[1, 4, 6]], dtype=torch.int32)  # an int32 grid still gives int64 ids, as the loop
    assert torch.equal(helper(grid, 2, False), vision_utils.get_vision_position_ids(grid, 2))


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
    assert [finding.kind for finding in change.findings] == ["rewritten"]
    again = run_codemods(change.rewritten, path.name, MODULE, codemods=(VisionGridLoops,))
    assert not again.changed and not again.findings
    module = _rewritten_module(change.rewritten)
    for seed in range(10):
        for grid, merge in _grids(seed):
            expected = vision_utils.get_vision_position_ids(grid, merge)
            assert torch.equal(module.get_vision_position_ids(grid, merge), expected)
            with mock.patch("torch.compiler.is_exporting", return_value=True):
                assert torch.equal(module.get_vision_position_ids(grid, merge), expected)


def test_a_loop_other_than_the_proven_one_is_refused():
    path = find_transformers().root / "vision_utils.py"
    if not path.is_file():
        pytest.skip(f"transformers {transformers.__version__} has no vision_utils")
    source = path.read_text(encoding="utf-8")
    changed = source.replace("hpos_ids = hpos_ids.reshape(block_shape).transpose(1, 2).flatten()", "hpos_ids = hpos_ids.flatten()")
    assert changed != source
    change = run_codemods(changed, path.name, MODULE, codemods=(VisionGridLoops,))
    assert not change.changed
    assert [(f.kind, f.construct, f.reason) for f in change.findings] == [
        ("refused", "get_vision_position_ids", "its loop over the grid is not the one whose tensor-ops form was proven equal")
    ]
    assert sys.modules[MODULE] is vision_utils  # the test never replaced transformers' module
