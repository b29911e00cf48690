"""vision-grid-loops: the tensor-ops forms of transformers' vision helpers give the loops' results exactly, and the
codemod rewrites only the statements they were proven against.

1. Each helper the codemod adds (`TWINS`) against transformers' own function over random inputs: one to five images,
   one to three frames, merge sizes 1 to 3 (an int or one per image), window sizes of 1 to 4 merged tokens (sizes
   that are and are not multiples of them: empty padded windows), with and without the temporal column; nearest
   position ids over image sizes 1 to 20 and tables of 3 to 16 a side: `torch.equal` and the same dtype; each with
   the number of patches (every size the caller's) and without (a `repeat_interleave` size). A wrong count raises;
   exported with the count, the ids have no data-dependent size.
2. The installed `vision_utils.py` through the codemod: each function rewritten once, a second run changes nothing,
   eager and the export arm (`torch.compiler.is_exporting()` patched to True) of the rewritten functions agree, with
   and without `num_patches`.
3. Statements that differ from the proven ones are refused with the reason, and the module is left as it was.
4. Call sites: a call listed in vision_patch_counts.json passes its count (through a method in between too), a call
   not listed, a count not bound at the call, or a helper transformers ships unproven is refused; every committed
   entry is a call the installed transformers makes.
"""

from __future__ import annotations

import sys
import types
from unittest import mock

import pytest
import torch
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
import transformers
from transformers import vision_utils

from codemods.vision_grid_loops import (
    INVERSE,
    LOCAL_TWINS,
    SEGMENTS,
    TWINS,
    CountedCall,
    Twin,
    VisionGridLoops,
    counted_calls,
)
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods

MODULE = "transformers.vision_utils"


def _compiled(twin: Twin, **names):
    """The helper function of `twin`, compiled with `vision_segments` (and `names`) beside it."""
    namespace = {"torch": torch, **names}
    exec(compile(SEGMENTS + twin.code, "<helper>", "exec"), namespace)
    return namespace[twin.helper]


def _helper(function: str, counted: bool = False):
    """The helper of `function`; `counted`: called with the number of patches (the backed-size form), else None."""
    helper = _compiled(TWINS[function])
    if function == "get_vision_window_index":
        return lambda grid, merge, *args: helper(grid, merge, *args, int(grid.prod(-1).sum()) if counted else None)
    if function == "get_vision_nearest_position_ids":
        return lambda sizes, *args: helper(sizes, *args, int(sizes.prod(-1).sum()) if counted else None)
    return lambda grid, *args: helper(grid, *args, int(grid.prod(-1).sum()) if counted else None)


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


@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("include_temporal", [False, True])
def test_the_tensor_ops_form_gives_the_loops_ids_exactly(include_temporal: bool, counted: bool):
    helper = _helper("get_vision_position_ids", counted)
    for seed in range(40):
        for grid, merge in _grids(seed):
            expected = vision_utils.get_vision_position_ids(grid, merge, include_temporal=include_temporal)
            actual = helper(grid, merge, include_temporal)
            assert actual.dtype == expected.dtype and torch.equal(actual, expected), (grid.tolist(), merge)
    grid = torch.tensor([[1, 4, 6]], dtype=torch.int32)  # an int32 grid still gives int64 ids, as the loop
    assert torch.equal(helper(grid, 2, False), vision_utils.get_vision_position_ids(grid, 2))


@pytest.mark.parametrize("merge_temporal", [False, True])
@pytest.mark.parametrize("counted", [False, True])
def test_the_export_form_gives_the_cumulative_lengths_exactly(merge_temporal: bool, counted: bool):
    """Each frame (each clip with `merge_temporal`) a segment: the starts found with `nonzero` from the patch count
    are transformers' `repeat_interleave` cumulative lengths, int32 as they are."""
    helper = _helper("get_vision_cu_seqlens", counted)
    for seed in range(40):
        for grid, _ in _grids(seed):
            expected = vision_utils.get_vision_cu_seqlens(grid, merge_temporal=merge_temporal)
            actual = helper(grid, merge_temporal)
            assert actual.dtype == expected.dtype and torch.equal(actual, expected), (grid.tolist(), merge_temporal)
    # an empty frame would be a segment no patch starts: refused at run time, not another result
    if counted:
        with pytest.raises(RuntimeError):
            helper(torch.tensor([[1, 2, 2], [2, 0, 4]]), merge_temporal)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_with_the_count_the_interpolation_gives_the_same_taps_and_weights(mode: str):
    """`get_vision_interpolation_indices_and_weights` is tensor ops already; given the count, each patch's image by
    comparisons instead of `repeat_interleave`: the same indices and the same weights, bit for bit."""
    taps = vision_utils._interpolation_axis_taps_weights
    helper = _compiled(TWINS["get_vision_interpolation_indices_and_weights"], _interpolation_axis_taps_weights=taps)
    for seed in range(20):
        for grid, merge in _grids(seed):
            if not isinstance(merge, int):
                continue
            for align_corners in (False, True):
                options = (mode, align_corners, merge, "border")
                expected = vision_utils.get_vision_interpolation_indices_and_weights(grid, 7, *options)
                actual = helper(grid, 7, *options, int(grid.prod(-1).sum()))
                for want, got in zip(expected, actual):
                    assert got.dtype == want.dtype and torch.equal(got, want), (grid.tolist(), options)


def _windows(seed: int):
    """(grid_thw, merge, window_size, patch_size): windows of 1 to 4 merged tokens a side."""
    generator = torch.Generator().manual_seed(seed)
    images = int(torch.randint(1, 5, (1,), generator=generator))
    merge, patch, side = (int(torch.randint(1, high, (1,), generator=generator)) for high in (4, 4, 5))
    frames = torch.randint(1, 3, (images,), generator=generator)
    grid = torch.stack([frames, *(torch.randint(1, 9, (2, images), generator=generator) * merge)], dim=-1)
    return grid, merge, side * merge * patch, patch


@pytest.mark.parametrize("counted", [False, True])
def test_the_tensor_ops_form_gives_the_loops_windows_exactly(counted: bool):
    helper = _helper("get_vision_window_index", counted)
    for seed in range(200):
        grid, merge, window_size, patch = _windows(seed)
        expected = vision_utils.get_vision_window_index(grid, merge, window_size, patch)
        actual = helper(grid, merge, window_size, patch)
        for want, got in zip(expected, actual):
            assert got.dtype == want.dtype and torch.equal(got, want), (grid.tolist(), merge, window_size, patch)


@pytest.mark.parametrize("counted", [False, True])
def test_the_tensor_ops_form_gives_the_loops_nearest_positions_exactly(counted: bool):
    helper = _helper("get_vision_nearest_position_ids", counted)
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
    assert sorted((finding.kind, finding.construct) for finding in change.findings) == sorted(
        [("rewritten", function) for function in TWINS]
        # functions that call a rewritten one take the count and pass it on
        + [("rewritten", "get_vision_attention_seqlens: get_vision_cu_seqlens")]
        + [("rewritten", "get_vision_bilinear_indices_and_weights: get_vision_interpolation_indices_and_weights")]
    )
    again = run_codemods(change.rewritten, path.name, MODULE, codemods=(VisionGridLoops,))
    assert not again.changed and not again.findings
    module = _rewritten_module(change.rewritten)
    for seed in range(10):
        for grid, merge in _grids(seed):
            expected = vision_utils.get_vision_position_ids(grid, merge)
            count = int(grid.prod(-1).sum())
            for exporting in (False, True):
                with mock.patch("torch.compiler.is_exporting", return_value=exporting):
                    assert torch.equal(module.get_vision_position_ids(grid, merge), expected)
                    assert torch.equal(module.get_vision_position_ids(grid, merge, num_patches=count), expected)
        grid, merge, window_size, patch = _windows(seed)
        expected = vision_utils.get_vision_window_index(grid, merge, window_size, patch)
        for exporting in (False, True):
            for count in (None, int(grid.prod(-1).sum())):
                with mock.patch("torch.compiler.is_exporting", return_value=exporting):
                    actual = module.get_vision_window_index(grid, merge, window_size, patch, num_patches=count)
                assert all(torch.equal(got, want) for got, want in zip(actual, expected))


def test_every_rewritten_function_of_the_installed_helpers_gives_the_original_on_both_arms():
    """Each function of the rewritten `vision_utils` (and the two that pass the count on), eager and export arm, with
    and without `num_patches`, against transformers' own: the same tensors and dtypes."""
    path = find_transformers().root / "vision_utils.py"
    if not path.is_file():
        pytest.skip(f"transformers {transformers.__version__} has no vision_utils")
    change = run_codemods(path.read_text(encoding="utf-8"), path.name, MODULE, codemods=(VisionGridLoops,))
    module = _rewritten_module(change.rewritten)
    config = types.SimpleNamespace(_attn_implementation="sdpa")
    for seed in range(10):
        for grid, merge in _grids(seed):
            count = int(grid.prod(-1).sum())
            sizes = grid[:, 1:]
            calls = [
                ("get_vision_cu_seqlens", (grid,), {"merge_temporal": False}),
                ("get_vision_cu_seqlens", (grid,), {"merge_temporal": True}),
                ("get_vision_attention_seqlens", (grid, config), {}),
                ("get_vision_nearest_position_ids", (sizes, 7), {}),
                ("get_vision_interpolation_indices_and_weights", (grid, 7), {"mode": "bicubic"}),
                ("get_vision_bilinear_indices_and_weights", (grid, 7, 1), {}),
            ]
            if isinstance(merge, int):
                calls.append(
                    ("get_vision_interpolation_indices_and_weights", (grid, 7), {"spatial_merge_size": merge})
                )
            for name, args, keywords in calls:
                expected = getattr(vision_utils, name)(*args, **keywords)
                expected = expected if isinstance(expected, tuple) else (expected,)
                patches = int(sizes.prod(-1).sum()) if name == "get_vision_nearest_position_ids" else count
                for exporting in (False, True):
                    for given in (None, patches):
                        with mock.patch("torch.compiler.is_exporting", return_value=exporting):
                            actual = getattr(module, name)(*args, **keywords, num_patches=given)
                        actual = actual if isinstance(actual, tuple) else (actual,)
                        for got, want in zip(actual, expected, strict=True):
                            if isinstance(want, torch.Tensor):
                                assert got.dtype == want.dtype and torch.equal(got, want), (name, grid.tolist())
                            else:
                                assert got == want, (name, grid.tolist())


def test_a_function_that_has_a_num_patches_parameter_already_is_refused():
    path = find_transformers().root / "vision_utils.py"
    if not path.is_file():
        pytest.skip(f"transformers {transformers.__version__} has no vision_utils")
    source = path.read_text(encoding="utf-8").replace(
        "    include_temporal: bool = False,\n", "    include_temporal: bool = False,\n    num_patches: int = 0,\n"
    )
    assert "num_patches: int = 0" in source
    change = run_codemods(source, path.name, MODULE, codemods=(VisionGridLoops,))
    refused = {f.construct: f.reason for f in change.findings if f.kind == "refused"}
    assert refused == {"get_vision_position_ids": "it already has a parameter `num_patches`"}
    # and a method in between that has one: its calls are left as they are
    tower = TOWER.replace(
        "def get_window_index(self, grid_thw, kwargs=None):",
        "def get_window_index(self, grid_thw, kwargs=None, num_patches=None):",
    )
    refused = {f.construct: f.reason for f in _pass_counts(tower).findings if f.kind == "refused"}
    assert refused["Merger.get_window_index"] == "it already has a parameter `num_patches`"


def test_a_loop_other_than_the_proven_one_is_refused():
    path = find_transformers().root / "vision_utils.py"
    if not path.is_file():
        pytest.skip(f"transformers {transformers.__version__} has no vision_utils")
    source = path.read_text(encoding="utf-8")
    changed = source.replace(
        "hpos_ids = hpos_ids.reshape(block_shape).transpose(1, 2).flatten()", "hpos_ids = hpos_ids.flatten()"
    )
    assert changed != source
    change = run_codemods(changed, path.name, MODULE, codemods=(VisionGridLoops,))
    refused = [(f.construct, f.reason) for f in change.findings if f.kind == "refused"]
    assert refused == [
        ("get_vision_position_ids", "its statements are not the ones whose tensor-ops form was proven equal")
    ]
    assert (
        "def get_vision_position_ids" in change.rewritten and "vision_position_ids_from_grid" not in change.rewritten
    )
    assert sys.modules[MODULE] is vision_utils  # the test never replaced transformers' module


def test_a_count_other_than_the_grids_is_refused_at_run_time():
    """The count is the caller's claim about the grid: the helper asserts it, so a wrong count (a wrong
    vision_patch_counts.json entry) fails loudly, in export or in the program, never gives other ids."""
    grid = torch.tensor([[1, 4, 6], [2, 2, 2]])
    helper = _compiled(TWINS["get_vision_position_ids"])
    assert helper(grid, 2, False, 32).shape == (32, 2)
    with pytest.raises(RuntimeError):
        helper(grid, 2, False, 31)


@pytest.mark.parametrize("counted", [False, True])
def test_with_the_count_the_exported_ids_have_the_callers_size(counted: bool):
    """Exported with the number of patches, the ids are sized by the patch dim (no data-dependent size, no
    `repeat_interleave`: ExecuTorch plans its memory from such bounds); without it, a data-dependent size remains.
    The program gives the loop's ids for another number of images of other sizes."""
    helper = _compiled(TWINS["get_vision_position_ids"])

    class Tower(torch.nn.Module):
        def forward(self, patches, grid_thw):
            return helper(grid_thw, 2, False, patches.shape[0] if counted else None)

    grid = torch.tensor([[1, 4, 6], [2, 2, 2]])
    patches = Dim("patches", min=4, max=4096)
    program = torch.export.export(
        Tower(), (torch.zeros(32, 3), grid), dynamic_shapes=({0: patches}, {0: Dim("images", min=1, max=8)})
    )
    (output,) = [node for node in program.graph.nodes if node.op == "output"]
    size = output.args[0][0].meta["val"].shape[0]
    assert (not free_unbacked_symbols(size)) is counted
    assert any("repeat_interleave" in str(node.target) for node in program.graph.nodes) is not counted
    other = torch.tensor([[2, 2, 4], [1, 6, 2], [1, 2, 2]])
    assert torch.equal(program.module()(torch.zeros(32, 3), other), vision_utils.get_vision_position_ids(other, 2))


TOWER = """import torch

from ...vision_utils import get_vision_position_ids, get_vision_window_index


class Tower(torch.nn.Module):
    def forward(self, hidden_states, grid_thw, **kwargs):
        position_ids = get_vision_position_ids(grid_thw, self.spatial_merge_size, kwargs=kwargs)
        return position_ids


class Other(torch.nn.Module):
    def forward(self, pixel_values, grid_thw):
        return get_vision_position_ids(grid_thw, 2)


class Late(torch.nn.Module):
    def forward(self, pixel_values, grid_thw):
        position_ids = get_vision_position_ids(grid_thw, 2)
        embeds = self.embed(pixel_values)
        return position_ids, embeds


class Merger(torch.nn.Module):
    def get_window_index(self, grid_thw, kwargs=None):
        return get_vision_window_index(grid_thw, 1, 4, 1, kwargs=kwargs)

    def forward(self, hidden_states, grid_thw):
        window_index, cu_seqlens = self.get_window_index(grid_thw)
        return hidden_states[:, window_index], cu_seqlens
"""

SITES = {
    "tower": (
        CountedCall("Tower.forward", "get_vision_position_ids", "hidden_states.shape[0]", False),
        CountedCall("Late.forward", "get_vision_position_ids", "embeds.shape[0]", False),
        CountedCall("Merger.forward", "self.get_window_index", "hidden_states.shape[1]", False),
        CountedCall("Merger.get_window_index", "get_vision_window_index", "num_patches", True),
    )
}


def _pass_counts(source: str, sites=SITES, proven=frozenset(TWINS)):
    with (
        mock.patch("codemods.vision_grid_loops.counted_calls", return_value=sites),
        mock.patch("codemods.vision_grid_loops.counted_functions", return_value=proven),
    ):
        return run_codemods(
            source, "modeling_tower.py", "transformers.models.tower.modeling_tower", (VisionGridLoops,)
        )


def test_a_listed_call_passes_its_count_and_the_others_are_reported():
    change = _pass_counts(TOWER)
    findings = sorted((f.kind, f.construct, f.reason) for f in change.findings)
    assert findings == [
        (
            "refused",
            "Late.forward: get_vision_position_ids",
            "`embeds.shape[0]` is not bound where `get_vision_position_ids` is called",
        ),
        (
            "refused",
            "Other.forward: get_vision_position_ids",
            "no patch count is known for this call (vision_patch_counts.json): under export its result has a "
            "data-dependent size",
        ),
        ("rewritten", "Merger.forward: self.get_window_index", "passes its patch count, `hidden_states.shape[1]`"),
        ("rewritten", "Merger.get_window_index: get_vision_window_index", "passes its patch count, `num_patches`"),
        ("rewritten", "Tower.forward: get_vision_position_ids", "passes its patch count, `hidden_states.shape[0]`"),
    ]
    expected = (
        TOWER.replace(
            "get_vision_position_ids(grid_thw, self.spatial_merge_size, kwargs=kwargs)",
            "get_vision_position_ids(\n            grid_thw, self.spatial_merge_size, kwargs=kwargs, "
            "num_patches=hidden_states.shape[0]\n        )",
        )
        .replace(
            "def get_window_index(self, grid_thw, kwargs=None):",
            "def get_window_index(self, grid_thw, kwargs=None, num_patches: int | None = None):",
        )
        .replace("(grid_thw, 1, 4, 1, kwargs=kwargs)", "(grid_thw, 1, 4, 1, kwargs=kwargs, num_patches=num_patches)")
        .replace(
            "self.get_window_index(grid_thw)", "self.get_window_index(grid_thw, num_patches=hidden_states.shape[1])"
        )
    )
    assert change.rewritten == expected
    assert not _pass_counts(change.rewritten).changed  # a second run passes nothing twice: refused, count given


def test_no_count_is_passed_to_a_helper_transformers_ships_unproven():
    """transformers' own `get_vision_position_ids` (not rewritten) takes no `num_patches`: passing one would raise."""
    change = _pass_counts(TOWER, proven=frozenset({"get_vision_window_index"}))
    refused = {f.construct: f.reason for f in change.findings if f.kind == "refused"}
    assert refused["Tower.forward: get_vision_position_ids"] == (
        "transformers' `get_vision_position_ids` is not the proven one: it takes no `num_patches`"
    )
    assert "num_patches=hidden_states.shape[0]" not in change.rewritten
    assert "num_patches=num_patches" in change.rewritten
    # nor to a method in between whose helper is unproven (it does not gain the parameter)
    change = _pass_counts(TOWER, proven=frozenset({"get_vision_position_ids"}))
    refused = {f.construct: f.reason for f in change.findings if f.kind == "refused"}
    assert refused["Merger.forward: self.get_window_index"] == (
        "`self.get_window_index` takes no `num_patches`: the helper it calls is not the proven one"
    )
    assert "num_patches" not in change.rewritten.split("class Merger")[1]


def test_the_committed_table_names_calls_the_installed_models_make():
    """Every entry of vision_patch_counts.json is a call transformers makes, and each is rewritten."""
    root = find_transformers().root
    missing = []
    for model, sites in counted_calls().items():
        path = root / "models" / model / f"modeling_{model}.py"
        if not path.is_file():
            continue  # a model of another release
        change = run_codemods(
            path.read_text(encoding="utf-8"),
            path.name,
            f"transformers.models.{model}.modeling_{model}",
            (VisionGridLoops,),
        )
        rewritten = {f.construct for f in change.findings if f.kind == "rewritten"}
        missing += [
            f"{model}: {site.function}: {site.call}"
            for site in sites
            if f"{site.function}: {site.call}" not in rewritten
        ]
    assert not missing


@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize(
    "model, function, merged",
    [("kimi_k25", "get_vision_frame_index", False), ("muse_spark", "get_vision_pixel_shuffle_index", True)],
)
def test_the_tensor_ops_form_gives_a_models_own_loops_result_exactly(model, function, merged, counted: bool):
    """`LOCAL_TWINS` against the model's own loop over random grids and frames: Kimi K2.5's frame index (images and
    clips of one to three frames), Muse Spark's pixel shuffle index (and merge sizes: one for all images, as the
    model's)."""
    loop = getattr(pytest.importorskip(f"transformers.models.{model}.modeling_{model}"), function)
    helper = _compiled(LOCAL_TWINS[function])
    for seed in range(40):
        for grid, merge in _grids(seed):
            if merged and not isinstance(merge, int):
                continue
            args = (merge,) if merged else ()
            expected = loop(grid, *args)
            actual = helper(grid, *args, int(grid.prod(-1).sum()) if counted else None)
            assert actual.dtype == expected.dtype and torch.equal(actual, expected), (grid.tolist(), merge)


def test_a_models_own_loop_other_than_the_proven_one_is_refused_and_its_call_passes_nothing():
    path = find_transformers().root / "models" / "muse_spark" / "modeling_muse_spark.py"
    if not path.is_file():
        pytest.skip(f"transformers {transformers.__version__} has no muse_spark")
    source = path.read_text(encoding="utf-8")
    changed = source.replace(
        "permutation = permutation.permute(0, 2, 1, 3)", "permutation = permutation.permute(0, 1, 2, 3)"
    )
    assert changed != source
    module = "transformers.models.muse_spark.modeling_muse_spark"
    change = run_codemods(changed, path.name, module, codemods=(VisionGridLoops,))
    refused = {f.construct: f.reason for f in change.findings if f.kind == "refused"}
    assert refused["get_vision_pixel_shuffle_index"] == (
        "its statements are not the ones whose tensor-ops form was proven equal"
    )
    assert refused["MuseSparkVisionModel.pixel_shuffle: get_vision_pixel_shuffle_index"] == (
        "transformers' `get_vision_pixel_shuffle_index` is not the proven one: it takes no `num_patches`"
    )
    assert "vision_pixel_shuffle_index_from_grid" not in change.rewritten


def test_the_inverse_of_a_window_permutation_is_argsorts_without_a_sort():
    namespace = {"torch": torch}
    exec(compile(INVERSE, "<helper>", "exec"), namespace)
    inverse = namespace["vision_inverse_permutation"]
    for seed in range(20):
        permutation = torch.randperm(int(torch.randint(1, 50, (1,))), generator=torch.Generator().manual_seed(seed))
        with mock.patch("torch.compiler.is_exporting", return_value=True):
            assert torch.equal(inverse(permutation), torch.argsort(permutation))


WINDOWED = """import torch

from ...vision_utils import get_vision_window_index


class Tower(torch.nn.Module):
    def forward(self, hidden_states, grid_thw):
        window_index, cu_window_seqlens = get_vision_window_index(grid_thw, 2, 8, 1)
        window_index = window_index.to(hidden_states.device)
        reverse_indices = torch.argsort(window_index)
        return reverse_indices


class Other(torch.nn.Module):
    def forward(self, hidden_states, grid_thw):
        window_index, cu_window_seqlens = get_vision_window_index(grid_thw, 2, 8, 1)
        window_index = window_index.flip(0)
        return torch.argsort(window_index), torch.argsort(hidden_states)
"""


def test_argsort_of_a_window_index_inverts_it_without_a_sort_and_nothing_else_is_touched():
    change = _pass_counts(WINDOWED, sites={})
    rewritten = [f.construct for f in change.findings if f.kind == "rewritten"]
    assert rewritten == ["Tower.forward: torch.argsort(window_index)"]
    assert "reverse_indices = vision_inverse_permutation(window_index)" in change.rewritten
    assert "from ...vision_utils import get_vision_window_index, vision_inverse_permutation" in change.rewritten
    # reassigned by something other than `.to(...)`: maybe no longer a permutation, left as it is
    assert change.rewritten.count("torch.argsort(") == 2


def test_a_module_that_defines_a_helpers_name_or_lacks_torch_is_refused():
    path = find_transformers().root / "vision_utils.py"
    if not path.is_file():
        pytest.skip(f"transformers {transformers.__version__} has no vision_utils")
    source = path.read_text(encoding="utf-8")
    taken = run_codemods(source + "\n\ndef vision_segments():\n    pass\n", path.name, MODULE, (VisionGridLoops,))
    reasons = {f.reason for f in taken.findings if f.kind == "refused"}
    assert reasons == {"the module already defines `vision_segments`"} and "if torch.compiler" not in taken.rewritten
    no_torch = run_codemods(source.replace("\nimport torch\n", "\n"), path.name, MODULE, (VisionGridLoops,))
    assert {f.reason for f in no_torch.findings if f.kind == "refused"} == {"the module does not `import torch`"}
