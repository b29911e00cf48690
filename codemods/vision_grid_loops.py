"""transformers' vision helpers that loop over the images of `grid_thw.tolist()` compute the same tensors with tensor
ops under export; eager keeps the loop.

Why: the helpers of `transformers.vision_utils` build each image's position ids or attention windows from the Python
ints of `grid_thw.tolist()` (`target_sizes.tolist()`). Under torch.export those ints are data-dependent: a vision
tower cannot be exported for a number of images or sizes other than the traced ones, and transformers' own exporter
computes these tensors outside the graph and passes them as extra inputs. From each patch's index in the packed
sequence, its image's sizes (`repeat_interleave` of the grid by the patch counts) and integer arithmetic, each helper's
result is computed in the graph, for any number of images of any sizes:

- `get_vision_cu_seqlens` (not a loop: `repeat_interleave` of each frame's size by the frame counts, whose length, the
  number of frames, is data-dependent and unbounded): given the patch count, the segment starts are the patches first
  in their frame (or clip), found by `nonzero`, a length bounded by the patch count, which ExecuTorch can plan;
  `get_vision_attention_seqlens` takes the count too and passes it on;
- `get_vision_interpolation_indices_and_weights` (not a loop either: the Qwen3-VL family's interpolated position
  embeddings, each patch's image by `repeat_interleave` and `arange(counts.sum())`): given the patch count, each
  patch's image by comparisons; without it, the function as it is (`exclusive-cumsum` then rewrites its prefix
  sums). `get_vision_bilinear_indices_and_weights` takes the count and passes it on;
- `get_vision_position_ids` (rotary position ids of the Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, PaddleOCR-VL towers):
  each patch's frame, row and column, laid out block-major over the merge blocks;
- `get_vision_window_index` (Qwen2.5-VL, MiniCPM-V 4.6, Exaone 4.5, Muse Spark windowed attention): each merged
  token's window, numbered over images, frames and the loop's padded window grid; each token's place in the window
  order (by window, then row and column in the window) counted in closed form and inverted by `index_put` (no sort:
  ExecuTorch has no sort kernel), and the ends of the windows that hold tokens the cumulative lengths (the loop's list
  without the repeats an empty window leaves, which it removes with `unique_consecutive`);
- `get_vision_nearest_position_ids` (MiniCPM-V's NaViT packing): each patch's row and column divided by its image's
  height and width, bucketized as the loop does.

What it rewrites: in `transformers.vision_utils`, each of those functions whose statements after its first `if`
(which returns tensors passed in `kwargs`) are the ones its tensor-ops form was proven equal to (as transformers 5.x
ships them, recognised by the SHA-256 of their syntax tree: `TWINS`; a `len(grid_thw)` there would also pin the
number of images). Under `torch.compiler.is_exporting()` the function returns its helper's result, the helper added
to the module once; eager runs the original statements, in an `else`. Integer arithmetic and the same float division
and `bucketize`: the results are equal, not just close (tests/test_vision_grid_loops.py compares them over random
grids, merge and window sizes, frames).

Each rewritten function gains a parameter `num_patches=None`, ignored in eager: the caller's number of patches (the
packed sequence's length, which a tower holds as a size of its input). Given it, every size of the result is the
caller's: each patch's image is counted by comparisons of its index with the images' ends, not spread by
`repeat_interleave`, whose output size is data-dependent (a tower then trips on guards such as sdpa's `q_len > 1`, and
ExecuTorch cannot plan its memory). The helper asserts that the grid's count equals it. In model modules, the calls
that `vision_patch_counts.json` lists (model, function, called name, count expression) pass it; a method in between
gains the parameter too (MiniCPM-V's `get_window_index`).

A tower that undoes its window order with `torch.argsort(window_index)` (Qwen2.5-VL, Exaone 4.5, Muse) gets
`vision_inverse_permutation(window_index)`: the window index is a permutation, whose inverse under export is an
`index_put` (no sort: ExecuTorch has no sort kernel over a dynamic length), and `argsort` itself in eager. Only where
the name holds `get_vision_window_index`'s first result and is assigned nowhere else but `W = W.to(...)`.

What it refuses (left unchanged, with a finding): a function of those names whose statements differ from the proven
ones (a release changed them: the tensor-ops form must be proven again), and a module that already defines a helper's
name; a call with no entry in the table (its result keeps a data-dependent size under export), a count whose names
are not bound at the call, and a call of a function that the installed transformers ships unproven (its own takes no
`num_patches`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import textwrap
from pathlib import Path
from typing import NamedTuple

import libcst as cst
import libcst.matchers as m

from ._bindings import bound_at, parameter_names
from ._candidates import CandidateStatements
from ._imports import add_from_import
from ._walks import ReplaceNodes, nodes_in, replace_in_statements
from .base import EXPORTING, Codemod, export_twin, formatted_block, imports_torch

MODULE = "transformers.vision_utils"
SEGMENTS_HELPER = "vision_segments"
INVERSE_HELPER = "vision_inverse_permutation"


class Twin(NamedTuple):
    fingerprint: str  # SHA-256 of `ast.dump` of the function's statements after its first `if`, as proven
    helper: str  # the helper's name
    code: str  # the helper
    call: str  # what the function returns under export
    counted_only: bool = False  # the helper only when the caller gives the count (the function is tensor ops already)


SEGMENTS = '''def vision_segments(counts: torch.Tensor, total: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """For each element of consecutive segments of `counts` elements: its segment and its index in the segment. With
    `total` (the caller's size, `counts.sum()`) every size is the caller's; without it, the number of elements is a
    data-dependent size (`repeat_interleave`'s), which runtimes that plan memory ahead (ExecuTorch) cannot bound."""
    ends = counts.cumsum(0)
    if total is None:
        segment = torch.repeat_interleave(torch.arange(counts.shape[0], device=counts.device), counts)
    else:
        torch._assert_async(counts.sum() == total)
        # the segment of element i: how many segments end at or before it
        segment = (torch.arange(total, device=counts.device)[:, None] >= ends).sum(-1)
    return segment, torch.arange(segment.shape[0], device=counts.device) - (ends - counts)[segment]
'''

INVERSE = '''def vision_inverse_permutation(permutation: torch.Tensor) -> torch.Tensor:
    """The inverse of a permutation of `0..n-1` (a window index), as `torch.argsort(permutation)` gives it: under
    torch.export by `index_put`, with no sort (ExecuTorch has no sort kernel over a dynamic length); in eager,
    `argsort` itself."""
    if torch.compiler.is_exporting():
        positions = torch.arange(permutation.shape[0], device=permutation.device)
        return torch.empty_like(permutation).index_put_((permutation,), positions)
    return torch.argsort(permutation)
'''

CU_SEQLENS = '''def vision_cu_seqlens_from_grid(grid_thw: torch.Tensor, merge_temporal: bool, num_patches: int | None) -> torch.Tensor:
    """`get_vision_cu_seqlens` under torch.export. With the number of patches, each segment (a frame, or a clip with
    `merge_temporal`) starts where a patch is the first of its segment, found by `nonzero`: a length bounded by the
    patch count, where `repeat_interleave` of the frames' sizes by the frame counts has one that no runtime planning
    memory ahead (ExecuTorch) can bound. Without it, `get_vision_cu_seqlens`'s own computation."""
    frames, heights, widths = grid_thw[:, 0], grid_thw[:, 1], grid_thw[:, 2]
    if num_patches is None:
        seqlens = frames * heights * widths if merge_temporal else torch.repeat_interleave(heights * widths, frames)
        return torch.nn.functional.pad(seqlens.cumsum(dim=0, dtype=torch.int32), (1, 0), value=0)
    # an empty frame or clip would be a segment that no patch starts
    torch._assert_async((frames * heights * widths > 0).all())
    image, index = vision_segments(frames * heights * widths, num_patches)
    within = index if merge_temporal else index % (heights * widths)[image]
    starts = torch.nonzero(within == 0).flatten()
    return torch.cat([starts, starts.new_full((1,), num_patches)]).to(torch.int32)
'''

INTERPOLATION = '''def vision_interpolation_indices_and_weights_from_grid(
    grid_thw: torch.Tensor,
    num_grid_per_side: int,
    mode: str,
    align_corners: bool,
    spatial_merge_size: int,
    padding: str,
    num_patches: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`get_vision_interpolation_indices_and_weights` given the number of patches: each patch's image by comparisons
    (`vision_segments`) instead of `repeat_interleave` and `arange(counts.sum())`, whose data-dependent lengths
    runtimes that plan memory ahead (ExecuTorch) cannot bound; the same integers, taps and weights."""
    side, merge = num_grid_per_side, spatial_merge_size
    counts = grid_thw[:, 0] * grid_thw[:, 1] * grid_thw[:, 2]
    image, index = vision_segments(counts, num_patches)
    heights, widths = grid_thw[:, 1][image], grid_thw[:, 2][image]
    within = index % (heights * widths)
    blocks_w = widths // merge
    row = within // (merge * merge * blocks_w) * merge + (within // merge) % merge
    col = (within // (merge * merge)) % blocks_w * merge + within % merge
    h_taps, h_weights = _interpolation_axis_taps_weights(row, heights, side, mode, align_corners, padding)
    w_taps, w_weights = _interpolation_axis_taps_weights(col, widths, side, mode, align_corners, padding)
    n = h_taps.shape[1]
    indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, n * n)
    weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
    return indices, weights
'''

POSITION_IDS = '''def vision_position_ids_from_grid(
    grid_thw: torch.Tensor, spatial_merge_size: int | torch.Tensor, include_temporal: bool, num_patches: int | None
) -> torch.Tensor:
    """`get_vision_position_ids` with tensor ops instead of a loop over the images (for torch.export, where the ints
    of `grid_thw.tolist()` are data-dependent): each patch's frame, row and column from its index in the packed
    sequence, rows and columns laid out block-major over `merge x merge` blocks as the loop lays them out."""
    grid = grid_thw.long()
    frames, heights, widths = grid[:, 0], grid[:, 1], grid[:, 2]
    if isinstance(spatial_merge_size, int):
        merges = torch.full_like(heights, spatial_merge_size)
    else:  # one per image
        merges = spatial_merge_size.to(grid.device, torch.long)
    torch._assert_async(((heights % merges == 0) & (widths % merges == 0)).all())
    # per patch: its image's height, width and merge size, and its index within the image
    image, index = vision_segments(frames * heights * widths, num_patches)
    height, width, merge = heights[image], widths[image], merges[image]
    frame, within = index // (height * width), index % (height * width)
    block, blocks_per_row = within // (merge * merge), width // merge
    rows = block // blocks_per_row * merge + within // merge % merge
    columns = block % blocks_per_row * merge + within % merge
    return torch.stack([frame, rows, columns] if include_temporal else [rows, columns], dim=-1)
'''

WINDOW_INDEX = '''def vision_window_index_from_grid(
    grid_thw: torch.Tensor, spatial_merge_size: int, window_size: int, patch_size: int, num_patches: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`get_vision_window_index` with tensor ops instead of a loop over the images (for torch.export, where the ints
    of `grid_thw.tolist()` are data-dependent): each merged token's window, numbered over the images and frames in the
    loop's order; each token's place in the window order (by window, then row and column in the window) counted in
    closed form, no sort; the ends of the windows that hold tokens are the cumulative lengths (the loop's, without
    the repeats of empty windows)."""
    grid = grid_thw.long()
    side = window_size // spatial_merge_size // patch_size  # merged tokens per window side
    frames, rows, columns = grid[:, 0], grid[:, 1] // spatial_merge_size, grid[:, 2] // spatial_merge_size
    # windows per frame: the loop pads each side by `side - n % side` (a whole empty window when `n % side == 0`)
    window_rows = (rows + side - rows % side) // side
    window_columns = (columns + side - columns % side) // side
    # per merged token, in the grid's order: its image's sizes and its index within the image
    tokens = None if num_patches is None else num_patches // spatial_merge_size**2
    image, index = vision_segments(frames * rows * columns, tokens)
    token_rows, token_columns = rows[image], columns[image]
    frame = index // (token_rows * token_columns)
    row = index // token_columns % token_rows
    column = index % token_columns
    # each token's window, numbered over the images and frames, and its place in the window
    windows = frames * window_rows * window_columns
    first = (windows.cumsum(0) - windows)[image]
    per_frame, across = (window_rows * window_columns)[image], window_columns[image]
    window = first + frame * per_frame + row // side * across + column // side
    # each token's place in the window order: after the tokens of the frames before its own, of the window rows above
    # it, and of the windows before it in its window row (`side` columns wide, as tall as its window row), at its place
    # in its own window (the last window of a row or column may be smaller); window_index is its inverse
    position = torch.arange(index.shape[0], device=grid.device)
    height = (token_rows - row // side * side).clamp(max=side)
    width = (token_columns - column // side * side).clamp(max=side)
    frame_start = position - (row * token_columns + column)
    place = frame_start + row // side * side * token_columns + column // side * side * height
    place = place + row % side * width + column % side
    window_index = torch.empty_like(place).index_put_((place,), position)
    # the end of each window that holds tokens, counted in patches
    ordered = window[window_index]
    following = ordered[(position + 1).clamp(max=ordered.shape[0] - 1)]
    ends = torch.nonzero((ordered != following) | (position == ordered.shape[0] - 1)).flatten() + 1
    cu_window_seqlens = torch.nn.functional.pad(ends * spatial_merge_size**2, (1, 0)).to(torch.int32)
    return window_index, cu_window_seqlens
'''

NEAREST_POSITION_IDS = '''def vision_nearest_position_ids_from_sizes(
    target_sizes: torch.Tensor, num_patches_per_side: int, num_patches: int | None
) -> torch.Tensor:
    """`get_vision_nearest_position_ids` with tensor ops instead of a loop over the images (for torch.export, where
    the ints of `target_sizes.tolist()` are data-dependent): each patch's row and column, in raster order, divided by
    its image's height and width and bucketized as the loop does."""
    sizes = target_sizes.long()
    heights, widths = sizes[:, 0], sizes[:, 1]
    boundaries = torch.arange(1 / num_patches_per_side, 1.0, 1 / num_patches_per_side, device=target_sizes.device)
    image, index = vision_segments(heights * widths, num_patches)
    height, width = heights[image], widths[image]
    bucket_rows = torch.bucketize(index // width / height, boundaries, right=True)
    bucket_columns = torch.bucketize(index % width / width, boundaries, right=True)
    return bucket_rows * num_patches_per_side + bucket_columns
'''

TWINS = {
    "get_vision_cu_seqlens": Twin(
        "103c6aa569920c8fad84c942d8615c65462fa29258f81b03e27ae1aa732cffa5",
        "vision_cu_seqlens_from_grid",
        CU_SEQLENS,
        "vision_cu_seqlens_from_grid(grid_thw, merge_temporal, num_patches)",
    ),
    "get_vision_interpolation_indices_and_weights": Twin(
        "276274c0a384b68a815a61e4e65c3bf8f08896daf32788277b03b395138f1c0f",
        "vision_interpolation_indices_and_weights_from_grid",
        INTERPOLATION,
        "vision_interpolation_indices_and_weights_from_grid(\n"
        "        grid_thw, num_grid_per_side, mode, align_corners, spatial_merge_size, padding, num_patches\n"
        "    )",
        counted_only=True,
    ),
    "get_vision_position_ids": Twin(
        "e8373b4b9f22f05ba15c5b93fe92ebb1f98b9010b6c75978eb2893a8bbe0c9d9",
        "vision_position_ids_from_grid",
        POSITION_IDS,
        "vision_position_ids_from_grid(grid_thw, spatial_merge_size, include_temporal, num_patches)",
    ),
    "get_vision_window_index": Twin(
        "0226075d64ddad826fa5ec34ca763384a750abaadbd7ac97f96297291d4ab5c0",
        "vision_window_index_from_grid",
        WINDOW_INDEX,
        "vision_window_index_from_grid(grid_thw, spatial_merge_size, window_size, patch_size, num_patches)",
    ),
    "get_vision_nearest_position_ids": Twin(
        "535cff10728f1694c326799802452ecf715dba766a6b66a9f0c0434fd7cf0501",
        "vision_nearest_position_ids_from_sizes",
        NEAREST_POSITION_IDS,
        "vision_nearest_position_ids_from_sizes(target_sizes, num_patches_per_side, num_patches)",
    ),
}

PIXEL_SHUFFLE_INDEX = '''def vision_pixel_shuffle_index_from_grid(
    grid_thw: torch.Tensor, merge_size: int, num_patches: int | None
) -> torch.Tensor:
    """`get_vision_pixel_shuffle_index` with tensor ops instead of a loop over the images (for torch.export, where the
    ints of `grid_thw.tolist()` are data-dependent): for each place of the packed sequence in `merge x merge` block
    order, the raster index of the patch it takes, offset by its frame and image."""
    grid = grid_thw.long()
    frames, heights, widths = grid[:, 0], grid[:, 1], grid[:, 2]
    counts = frames * heights * widths
    image, index = vision_segments(counts, num_patches)
    height, width = heights[image], widths[image]
    frame, within = index // (height * width), index % (height * width)
    block, blocks_per_row = within // (merge_size * merge_size), width // merge_size
    rows = block // blocks_per_row * merge_size + within // merge_size % merge_size
    columns = block % blocks_per_row * merge_size + within % merge_size
    return (counts.cumsum(0) - counts)[image] + frame * height * width + rows * width + columns
'''

FRAME_INDEX = '''def vision_frame_index_from_grid(grid_thw: torch.Tensor, num_patches: int | None) -> torch.Tensor:
    """`get_vision_frame_index` with tensor ops instead of a loop over the clips (for torch.export, where the ints of
    `grid_thw.tolist()` are data-dependent): each patch's frame, plus one in clips of more than one frame."""
    grid = grid_thw.long()
    frames, heights, widths = grid[:, 0], grid[:, 1], grid[:, 2]
    clip, index = vision_segments(frames * heights * widths, num_patches)
    return index // (heights * widths)[clip] + (frames[clip] > 1).long()
'''

# Loops of the same kind that models define in their own module (Muse Spark, Muse Glimmer, Kimi K2.5): rewritten
# there, their helper beside them, `vision_segments` imported from the rewritten `vision_utils`
LOCAL_TWINS = {
    "get_vision_pixel_shuffle_index": Twin(
        "22b44ae1acc503bc3ce192224e8253e502659c1245fc7980ad29e901f270638b",
        "vision_pixel_shuffle_index_from_grid",
        PIXEL_SHUFFLE_INDEX,
        "vision_pixel_shuffle_index_from_grid(grid_thw, merge_size, num_patches)",
    ),
    "get_vision_frame_index": Twin(
        "81e7326fafa865a582809de645aba42d393600a55226b13e248b68605087861c",
        "vision_frame_index_from_grid",
        FRAME_INDEX,
        "vision_frame_index_from_grid(grid_thw, num_patches)",
    ),
}

# The parameter each rewritten function gains, and its line in the docstring's `Args:` (after `kwargs:`)
COUNT = "num_patches"
COUNT_DOC = (
    "        num_patches: optional, the number of patches the sizes describe (the packed sequence's length),\n"
    "            which the caller holds: under `torch.export` the result is sized by it instead of by a\n"
    "            data-dependent size.\n"
)

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # The loop's Python ints would be data-dependent sizes: the same result from tensor ops
    return {call}
else:
    pass
"""
# The test of a rewritten function's export arm (an earlier run's)
REWRITTEN = EXPORTING | m.BooleanOperation(left=EXPORTING, operator=m.And())
# A function of tensor ops already, whose sizes only the caller's count makes the caller's
COUNTED_TEMPLATE = """
if torch.compiler.is_exporting() and num_patches is not None:
    # Each patch's image from the caller's count: no data-dependent length
    return {call}
else:
    pass
"""


def fingerprint(statements: list[cst.BaseStatement]) -> str:
    """SHA-256 of the syntax tree of `statements` (comments and layout do not count)."""
    code = "".join(cst.Module(body=[]).code_for_node(statement) for statement in statements)
    return hashlib.sha256(ast.dump(ast.parse(textwrap.dedent(code))).encode()).hexdigest()


def _after_first_if(statements: list[cst.BaseStatement]) -> int:
    """Where the statements after a function's first `if` (which returns tensors passed in `kwargs`) start."""
    return next((i + 1 for i, inner in enumerate(statements) if isinstance(inner, cst.If)), len(statements))


def proven(function: cst.FunctionDef, twins: dict[str, Twin] = TWINS) -> str | None:
    """Why `function` (of `twins`) cannot be rewritten, or None when its statements after its first `if` (which
    returns tensors passed in `kwargs`) are the proven ones."""
    statements = list(function.body.body)
    start = _after_first_if(statements)
    if start >= len(statements) or fingerprint(statements[start:]) != twins[function.name.value].fingerprint:
        return "its statements are not the ones whose tensor-ops form was proven equal"
    return None


@functools.cache
def counted_functions() -> frozenset[str]:
    """The functions of the installed transformers' `vision_utils` that this codemod rewrites, so that they take
    `num_patches` (a call site passes it only to those: transformers' own would raise TypeError)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        return frozenset()
    source = Path(spec.origin).read_text(encoding="utf-8")
    tree = cst.parse_module(source)
    functions = [stmt for stmt in tree.body if isinstance(stmt, cst.FunctionDef) and stmt.name.value in TWINS]
    rewritten = frozenset(function.name.value for function in functions if proven(function) is None)
    defined = {stmt.name.value: stmt for stmt in tree.body if isinstance(stmt, cst.FunctionDef)}
    forwarding = {
        site.function
        for site in FORWARDING
        if site.call in rewritten
        and site.function in defined
        and f"{site.call}(" in tree.code_for_node(defined[site.function])
    }
    return rewritten | forwarding


class CountedCall(NamedTuple):
    function: str  # the qualified name of the function that holds the call
    call: str  # the called name, as written (a function of `TWINS`, or a method that forwards to one)
    count: str  # an expression of the number of patches there, from names bound before the call
    parameter: bool  # the function gains a `num_patches=None` parameter, which is the count (a method in between)


COUNTS_FILE = Path(__file__).with_name("vision_patch_counts.json")
# In `vision_utils` itself: a function that calls a rewritten one gains the parameter and passes it on
FORWARDING = (
    CountedCall("get_vision_attention_seqlens", "get_vision_cu_seqlens", "num_patches", True),
    CountedCall(
        "get_vision_bilinear_indices_and_weights", "get_vision_interpolation_indices_and_weights", "num_patches", True
    ),
)


@functools.cache
def counted_calls() -> dict[str, tuple[CountedCall, ...]]:
    """model -> the call sites of its modeling (and modular) module that know their patch count
    (`vision_patch_counts.json`, proven by export: the helper asserts that the grid's count equals it)."""
    table = json.loads(COUNTS_FILE.read_text(encoding="utf-8"))
    return {
        model: tuple(
            CountedCall(site["function"], site["call"], site["count"], site.get("parameter", False)) for site in sites
        )
        for model, sites in table["models"].items()
    }


class VisionGridLoops(Codemod):
    NAME = "vision-grid-loops"
    DESCRIPTION = (
        "The loops of transformers' vision helpers over grid_thw.tolist() become tensor ops under export, so a vision "
        "tower's position ids and attention windows follow any number of images of any sizes. API: the rewritten "
        "vision_utils functions gain an optional `num_patches` (the tower's patch count, which its callers hold as "
        "a tensor size; default None, ignored in eager): without it an exported program's sizes depend on the "
        "grid's values, which ExecuTorch cannot plan. A wrong count raises."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return any(f"{name}(" in source for name in (*TWINS, *LOCAL_TWINS))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if self.context.full_module_name == MODULE:
            return self._pass_counts(self._rewrite_helpers(tree), FORWARDING, frozenset())
        parts = (self.context.full_module_name or "").split(".")
        if len(parts) == 4 and parts[:2] == ["transformers", "models"]:
            tree, local = self._rewrite_local_helpers(tree)
            return self._invert_windows(self._pass_counts(tree, counted_calls().get(parts[2], ()), local))
        return tree

    def _rewrite_helpers(self, tree: cst.Module) -> cst.Module:
        """`transformers.vision_utils`: each proven function returns its helper's result under export, and takes the
        caller's `num_patches`; the helpers go before the first function, `vision_segments` first."""
        body, helpers = self._rewrite_functions(tree, TWINS, extra=SEGMENTS_HELPER)
        if not helpers:
            return tree
        first = next(i for i, stmt in enumerate(body) if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)))
        windows = any(code == WINDOW_INDEX for _, code in helpers)
        added = [
            _helper(code) for code in (SEGMENTS, *((INVERSE,) if windows else ()), *(code for _, code in helpers))
        ]
        return tree.with_changes(body=[*body[:first], *added, *body[first:]])

    def _rewrite_local_helpers(self, tree: cst.Module) -> tuple[cst.Module, frozenset[str]]:
        """A model module's own loops of `LOCAL_TWINS` (when `vision_utils` is rewritten: their helpers use its
        `vision_segments`), each helper just before its function; and the names of the rewritten functions."""
        if not counted_functions() or not any(
            isinstance(stmt, cst.FunctionDef) and stmt.name.value in LOCAL_TWINS for stmt in tree.body
        ):
            return tree, frozenset()
        body, helpers = self._rewrite_functions(tree, LOCAL_TWINS)
        if not helpers:
            return tree, frozenset()
        at = dict(helpers)
        rewritten = frozenset(body[index].name.value for index in at)
        body = [
            new for index, stmt in enumerate(body) for new in ((_helper(at[index]), stmt) if index in at else (stmt,))
        ]
        return add_from_import(tree.with_changes(body=body), "vision_utils", 3, SEGMENTS_HELPER), rewritten

    def _rewrite_functions(self, tree: cst.Module, twins: dict[str, Twin], extra: str | None = None):
        """The module's statements with each proven function of `twins` rewritten, and (index, helper code) of each."""
        defined = {stmt.name.value for stmt in tree.body if isinstance(stmt, (cst.FunctionDef, cst.ClassDef))}
        body, helpers = list(tree.body), []
        for index, stmt in enumerate(tree.body):
            if not isinstance(stmt, cst.FunctionDef) or stmt.name.value not in twins:
                continue
            twin = twins[stmt.name.value]
            statements = list(stmt.body.body)
            if any(isinstance(inner, cst.If) and m.matches(inner.test, REWRITTEN) for inner in statements):
                continue  # rewritten by an earlier run
            line = self.top_level_line(tree, stmt)
            reason = proven(stmt, twins)
            taken = [name for name in (twin.helper, extra) if name in defined]
            if reason is None and taken:
                reason = f"the module already defines `{taken[0]}`"
            elif reason is None and COUNT in parameter_names(stmt.params):
                reason = f"it already has a parameter `{COUNT}`"
            elif reason is None and not imports_torch(tree):
                reason = "the module does not `import torch`"
            if reason is not None:
                self.report(line, "refused", stmt.name.value, reason)
                continue
            start = _after_first_if(statements)
            eager = statements[start:]
            template = COUNTED_TEMPLATE if twin.counted_only else EXPORT_TEMPLATE
            statements[start:] = [export_twin(template.format(call=twin.call), eager, eager[0].leading_lines)]
            body[index] = with_count_documented(
                with_count(stmt, 0).with_changes(body=stmt.body.with_changes(body=statements))
            )
            helpers.append((index, twin.code))
            done = (
                "given the patch count, computes its result without data-dependent sizes under export"
                if twin.counted_only
                else "computes its result with tensor ops under export"
            )
            self.report(line, "rewritten", stmt.name.value, done)
        return body, helpers

    def _pass_counts(self, tree: cst.Module, listed: tuple[CountedCall, ...], local: frozenset[str]) -> cst.Module:
        """The calls of the rewritten functions (and of `local`, the module's own rewritten loops) that `listed` names
        pass their patch count; the other calls are reported (under export, their result keeps a data-dependent
        size)."""
        sites = {(site.function, site.call): site for site in listed}
        counted = counted_functions() | local
        # a method in between takes the count (it gains the parameter) when every helper it calls does
        between = {site.function.rsplit(".", 1)[-1] for site in listed if site.parameter}
        between -= {site.function.rsplit(".", 1)[-1] for site in listed if site.parameter and site.call not in counted}
        takes_count = counted | {call for _, call in sites if call.rsplit(".", 1)[-1] in between}
        called = set(TWINS) | set(LOCAL_TWINS) | {call for _, call in sites}
        holders = [stmt for stmt in tree.body if any(f"{name}(" in self.statement_code(tree, stmt) for name in called)]
        positions = CandidateStatements(self, tree, holders, kinds=(cst.SimpleStatementLine,))
        replacements = {}
        for stmt in holders:
            for qualname, function, depth in _functions(stmt):
                names = set(TWINS) | set(LOCAL_TWINS) | {call for name, call in sites if name == qualname}
                calls = [
                    call for call in _call_statements(function.body, names, depth + 1) if not _passes_count(*call)
                ]
                if not calls:  # none, or each passes its count already (an earlier run)
                    continue
                parameter = any(sites.get((qualname, name), _NO_SITE).parameter for _, name, _ in calls)
                if parameter and COUNT in parameter_names(function.params):
                    line = positions.line(calls[0][0])
                    self.report(line, "refused", qualname, f"it already has a parameter `{COUNT}`")
                    continue
                changed = {}
                for statement, name, statement_depth in calls:
                    site, line = sites.get((qualname, name)), positions.line(statement)
                    if site is None:
                        reason = (
                            "no patch count is known for this call (vision_patch_counts.json): under export its "
                            "result has a data-dependent size"
                        )
                    elif name not in takes_count and (name in TWINS or name in LOCAL_TWINS):
                        reason = f"transformers' `{name}` is not the proven one: it takes no `{COUNT}`"
                    elif name not in takes_count:
                        reason = f"`{name}` takes no `{COUNT}`: the helper it calls is not the proven one"
                    elif not site.parameter and not _count_bound(function, statement, site.count):
                        reason = f"`{site.count}` is not bound where `{name}` is called"
                    else:
                        reason = None
                    if reason is not None:
                        self.report(line, "refused", f"{qualname}: {name}", reason)
                        continue
                    count = COUNT if site.parameter else site.count
                    changed[statement] = _with_count_passed(statement, name, count, statement_depth)
                    self.report(line, "rewritten", f"{qualname}: {name}", f"passes its patch count, `{count}`")
                if changed:
                    new = function.visit(ReplaceNodes(changed))
                    replacements[function] = with_count(new, depth) if parameter else new
        return replace_in_statements(tree, replacements, holders)

    def _invert_windows(self, tree: cst.Module) -> cst.Module:
        """`R = torch.argsort(W)` of a window index `W` (the first result of `get_vision_window_index`, assigned nowhere
        else but `W = W.to(...)`: a permutation) becomes `vision_inverse_permutation(W)`, the same inverse without a
        sort under export."""
        if "get_vision_window_index" not in counted_functions():
            return tree
        holders = [stmt for stmt in tree.body if "torch.argsort(" in self.statement_code(tree, stmt)]
        positions = CandidateStatements(self, tree, holders, kinds=(cst.SimpleStatementLine,))
        replacements = {}
        for stmt in holders:
            for qualname, function, _ in _functions(stmt):
                windows = _window_indices(function)
                for line_node in nodes_in(function, lambda node: m.matches(node, ARGSORT_LINE)):
                    assign = line_node.body[0]
                    window = assign.value.args[0].value.value
                    if window not in windows:
                        continue
                    inverse = cst.Call(cst.Name(INVERSE_HELPER), args=[cst.Arg(cst.Name(window))])
                    replacements[line_node] = line_node.with_changes(body=[assign.with_changes(value=inverse)])
                    self.report(
                        positions.line(line_node),
                        "rewritten",
                        f"{qualname}: torch.argsort({window})",
                        "inverts the window permutation without a sort under export",
                    )
        if not replacements:
            return tree
        return add_from_import(replace_in_statements(tree, replacements, holders), "vision_utils", 3, INVERSE_HELPER)


# `R = torch.argsort(W)` on a line of its own
ARGSORT_LINE = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(target=m.Name())],
            value=m.Call(
                func=m.Attribute(value=m.Name("torch"), attr=m.Name("argsort")),
                args=[m.Arg(value=m.Name(), keyword=None)],
            ),
        )
    ]
)


def _window_indices(function: cst.FunctionDef) -> set[str]:
    """The names that hold the first result of `get_vision_window_index` in `function` and are assigned nowhere else
    but `W = W.to(...)`: permutations of the tokens."""
    windows, other = set(), set()
    for assign in nodes_in(function, lambda node: isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign))):
        targets = [target.target for target in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
        value = assign.value
        for target in targets:
            if (
                isinstance(target, cst.Tuple)
                and isinstance(value, cst.Call)
                and _called(value) == "get_vision_window_index"
                and isinstance(target.elements[0].value, cst.Name)
            ):
                windows.add(target.elements[0].value.value)
                rest = target.with_changes(elements=target.elements[1:])
                other.update(node.value for node in nodes_in(rest, lambda node: isinstance(node, cst.Name)))
            elif isinstance(target, cst.Name):
                to = m.Call(func=m.Attribute(value=m.Name(target.value), attr=m.Name("to")))
                if not m.matches(value, to):
                    other.add(target.value)
            else:
                other.update(node.value for node in nodes_in(target, lambda node: isinstance(node, cst.Name)))
    return windows - other


_NO_SITE = CountedCall("", "", "", False)


def _helper(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])


def _functions(stmt: cst.BaseStatement):
    """(qualified name, def, depth) of a top-level def and of the methods of a top-level class."""
    if isinstance(stmt, cst.FunctionDef):
        yield stmt.name.value, stmt, 0
    elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
        for member in stmt.body.body:
            if isinstance(member, cst.FunctionDef):
                yield f"{stmt.name.value}.{member.name.value}", member, 1


def _call_statements(block: cst.BaseSuite, names: set[str], depth: int) -> list:
    """(statement, called name, depth) of the simple statements of `block` (not of nested defs or classes) that call
    one of `names`, in source order."""
    found = []
    for stmt in getattr(block, "body", ()):
        if isinstance(stmt, cst.SimpleStatementLine):
            called = [_called(node) for node in nodes_in(stmt, lambda node: isinstance(node, cst.Call))]
            found += [(stmt, name, depth) for name in sorted({name for name in called if name in names})]
        elif not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            for child in (getattr(stmt, "body", None), getattr(stmt, "orelse", None), *getattr(stmt, "handlers", ())):
                while isinstance(child, (cst.If, cst.Else, cst.ExceptHandler, cst.Finally)):
                    found += _call_statements(child.body, names, depth + 1)
                    child = getattr(child, "orelse", None)
                if isinstance(child, cst.IndentedBlock):
                    found += _call_statements(child, names, depth + 1)
    return found


def _passes_count(statement: cst.SimpleStatementLine, name: str, depth: int) -> bool:
    """Whether the calls of `name` in `statement` pass `num_patches` already."""
    calls = [node for node in nodes_in(statement, lambda node: isinstance(node, cst.Call)) if _called(node) == name]
    return all(any(arg.keyword is not None and arg.keyword.value == COUNT for arg in call.args) for call in calls)


def _called(call: cst.Call) -> str:
    """The called name as written (`get_vision_position_ids`, `self.get_window_index`), or ""."""
    func = call.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        return f"{func.value.value}.{func.attr.value}"
    return ""


def _count_bound(function: cst.FunctionDef, statement: cst.SimpleStatementLine, count: str) -> bool:
    """Whether the names `count` reads have a value on every path to `statement`."""
    expression = cst.parse_expression(count)
    read = {node.value for node in nodes_in(expression, lambda node: isinstance(node, cst.Name))}
    attributes = {node.attr.value for node in nodes_in(expression, lambda node: isinstance(node, cst.Attribute))}
    return (read - attributes) <= bound_at(function, statement).definite


def _with_count_passed(statement: cst.SimpleStatementLine, name: str, count: str, depth: int) -> cst.BaseStatement:
    """`statement` with `num_patches=count` passed to its call of `name`, laid out as black lays it out."""
    calls = [node for node in nodes_in(statement, lambda node: isinstance(node, cst.Call)) if _called(node) == name]
    passed = {
        call: call.with_changes(args=[*call.args, cst.Arg(cst.parse_expression(count), keyword=cst.Name(COUNT))])
        for call in calls
    }
    new = statement.visit(ReplaceNodes(passed))
    # black lays the statement out again (its arguments one per line when they no longer fit)
    code = cst.Module(body=[new.with_changes(leading_lines=())]).code
    block = formatted_block(list(cst.parse_module(code).body), depth, 4)
    return block.body[0].with_changes(leading_lines=statement.leading_lines)


def with_count(function: cst.FunctionDef, depth: int) -> cst.FunctionDef:
    """`function` (`depth` levels deep) with `num_patches: int | None = None` after its last parameter, its parameters
    laid out as black lays them out (one per line, with a trailing comma, when they were)."""
    params = function.params
    parameter = cst.parse_statement(f"def f({COUNT}: int | None = None): pass").params.params[0]
    if params.params and isinstance(params.params[-1].comma, cst.Comma):  # a magic trailing comma: one per line
        parameter = parameter.with_changes(comma=cst.Comma())
    stub = function.with_changes(
        params=params.with_changes(params=[*params.params, parameter]),
        body=cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])]),
        decorators=(),
        leading_lines=(),
    )
    laid_out = formatted_block([stub], depth, 4).body[0]
    return function.with_changes(params=laid_out.params, whitespace_before_params=laid_out.whitespace_before_params)


def with_count_documented(function: cst.FunctionDef) -> cst.FunctionDef:
    """`function` with `num_patches` in its docstring's `Args:`, after `kwargs:` (left as it is without one)."""
    docstring = function.get_docstring(clean=False)
    first = function.body.body[0]
    if docstring is None or "        kwargs:" not in docstring:
        return function
    string = first.body[0].value
    text = string.value
    at = text.index("        kwargs:")
    end = text.index("\n", at) + 1
    while text[end:].startswith("            "):  # the `kwargs:` entry's continuation lines
        end = text.index("\n", end) + 1
    new = string.with_changes(value=text[:end] + COUNT_DOC + text[end:])
    statement = first.with_changes(body=[first.body[0].with_changes(value=new)])
    return function.with_changes(body=function.body.with_changes(body=[statement, *function.body.body[1:]]))
