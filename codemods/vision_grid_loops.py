"""transformers' vision helpers that loop over the images of `grid_thw.tolist()` compute the same tensors with tensor
ops under export; eager keeps the loop.

Why: the helpers of `transformers.vision_utils` build each image's position ids or attention windows from the Python
ints of `grid_thw.tolist()` (`target_sizes.tolist()`). Under torch.export those ints are data-dependent: a vision
tower cannot be exported for a number of images or sizes other than the traced ones, and transformers' own exporter
computes these tensors outside the graph and passes them as extra inputs. From each patch's index in the packed
sequence, its image's sizes (`repeat_interleave` of the grid by the patch counts) and integer arithmetic, each helper's
result is computed in the graph, for any number of images of any sizes:

- `get_vision_position_ids` (rotary position ids of the Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, PaddleOCR-VL towers):
  each patch's frame, row and column, laid out block-major over the merge blocks;
- `get_vision_window_index` (Qwen2.5-VL, MiniCPM-V 4.6, Exaone 4.5, Muse Spark windowed attention): each merged
  token's window, numbered over images, frames and the loop's padded window grid; the tokens sorted by (window, row,
  column in the window) give the window order, and the ends of the windows that hold tokens the cumulative lengths
  (the loop's list without the repeats an empty window leaves, which it removes with `unique_consecutive`);
- `get_vision_nearest_position_ids` (MiniCPM-V's NaViT packing): each patch's row and column divided by its image's
  height and width, bucketized as the loop does.

What it rewrites: in `transformers.vision_utils`, each of those functions whose statements after its first `if`
(which returns tensors passed in `kwargs`) are the ones its tensor-ops form was proven equal to (as transformers 5.x
ships them, recognised by the SHA-256 of their syntax tree: `TWINS`; a `len(grid_thw)` there would also pin the
number of images). Under `torch.compiler.is_exporting()` the function returns its helper's result, the helper added
to the module once; eager runs the original statements, in an `else`. Integer arithmetic and the same float division
and `bucketize`: the results are equal, not just close (tests/test_vision_grid_loops.py compares them over random
grids, merge and window sizes, frames).

What it refuses (left unchanged, with a finding): a function of those names whose statements differ from the proven
ones (a release changed them: the tensor-ops form must be proven again), and a module that already defines a helper's
name.
"""

from __future__ import annotations

import ast
import hashlib
import textwrap
from typing import NamedTuple

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, Codemod, export_twin, imports_torch

MODULE = "transformers.vision_utils"


class Twin(NamedTuple):
    fingerprint: str  # SHA-256 of `ast.dump` of the function's statements after its first `if`, as proven
    helper: str  # the helper's name
    code: str  # the helper
    call: str  # what the function returns under export


POSITION_IDS = '''def vision_position_ids_from_grid(
    grid_thw: torch.Tensor, spatial_merge_size: int | torch.Tensor, include_temporal: bool
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
    counts = frames * heights * widths
    # per patch: its image's height, width and merge size, and its index within the image
    height = torch.repeat_interleave(heights, counts)
    width = torch.repeat_interleave(widths, counts)
    merge = torch.repeat_interleave(merges, counts)
    starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    index = torch.arange(starts.shape[0], device=grid.device) - starts
    frame, within = index // (height * width), index % (height * width)
    block, blocks_per_row = within // (merge * merge), width // merge
    rows = block // blocks_per_row * merge + within // merge % merge
    columns = block % blocks_per_row * merge + within % merge
    return torch.stack([frame, rows, columns] if include_temporal else [rows, columns], dim=-1)
'''

WINDOW_INDEX = '''def vision_window_index_from_grid(
    grid_thw: torch.Tensor, spatial_merge_size: int, window_size: int, patch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`get_vision_window_index` with tensor ops instead of a loop over the images (for torch.export, where the ints
    of `grid_thw.tolist()` are data-dependent): each merged token's window, numbered over the images and frames in the
    loop's order; the tokens sorted by (window, row and column in the window) are the window order, and the ends of
    the windows that hold tokens are the cumulative lengths (the loop's, without the repeats of empty windows)."""
    grid = grid_thw.long()
    side = window_size // spatial_merge_size // patch_size  # merged tokens per window side
    frames, rows, columns = grid[:, 0], grid[:, 1] // spatial_merge_size, grid[:, 2] // spatial_merge_size
    # windows per frame: the loop pads each side by `side - n % side` (a whole empty window when `n % side == 0`)
    window_rows = (rows + side - rows % side) // side
    window_columns = (columns + side - columns % side) // side
    tokens = frames * rows * columns
    # per merged token, in the grid's order: its image's sizes and its index within the image
    starts = torch.repeat_interleave(tokens.cumsum(0) - tokens, tokens)
    index = torch.arange(starts.shape[0], device=grid.device) - starts
    token_rows = torch.repeat_interleave(rows, tokens)
    token_columns = torch.repeat_interleave(columns, tokens)
    frame = index // (token_rows * token_columns)
    row = index // token_columns % token_rows
    column = index % token_columns
    # each token's window, numbered over the images and frames, and its place in the window
    windows = frames * window_rows * window_columns
    first = torch.repeat_interleave(windows.cumsum(0) - windows, tokens)
    per_frame = torch.repeat_interleave(window_rows * window_columns, tokens)
    across = torch.repeat_interleave(window_columns, tokens)
    window = first + frame * per_frame + row // side * across + column // side
    window_index = torch.argsort((window * side + row % side) * side + column % side)
    # the end of each window that holds tokens, counted in patches
    ordered = window[window_index]
    position = torch.arange(ordered.shape[0], device=grid.device)
    following = ordered[(position + 1).clamp(max=ordered.shape[0] - 1)]
    ends = torch.nonzero((ordered != following) | (position == ordered.shape[0] - 1)).flatten() + 1
    cu_window_seqlens = torch.nn.functional.pad(ends * spatial_merge_size**2, (1, 0)).to(torch.int32)
    return window_index, cu_window_seqlens
'''

NEAREST_POSITION_IDS = '''def vision_nearest_position_ids_from_sizes(target_sizes: torch.Tensor, num_patches_per_side: int) -> torch.Tensor:
    """`get_vision_nearest_position_ids` with tensor ops instead of a loop over the images (for torch.export, where
    the ints of `target_sizes.tolist()` are data-dependent): each patch's row and column, in raster order, divided by
    its image's height and width and bucketized as the loop does."""
    sizes = target_sizes.long()
    heights, widths = sizes[:, 0], sizes[:, 1]
    boundaries = torch.arange(1 / num_patches_per_side, 1.0, 1 / num_patches_per_side, device=target_sizes.device)
    counts = heights * widths
    starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    index = torch.arange(starts.shape[0], device=target_sizes.device) - starts
    height = torch.repeat_interleave(heights, counts)
    width = torch.repeat_interleave(widths, counts)
    bucket_rows = torch.bucketize(index // width / height, boundaries, right=True)
    bucket_columns = torch.bucketize(index % width / width, boundaries, right=True)
    return bucket_rows * num_patches_per_side + bucket_columns
'''

TWINS = {
    "get_vision_position_ids": Twin(
        "e8373b4b9f22f05ba15c5b93fe92ebb1f98b9010b6c75978eb2893a8bbe0c9d9",
        "vision_position_ids_from_grid",
        POSITION_IDS,
        "vision_position_ids_from_grid(grid_thw, spatial_merge_size, include_temporal)",
    ),
    "get_vision_window_index": Twin(
        "0226075d64ddad826fa5ec34ca763384a750abaadbd7ac97f96297291d4ab5c0",
        "vision_window_index_from_grid",
        WINDOW_INDEX,
        "vision_window_index_from_grid(grid_thw, spatial_merge_size, window_size, patch_size)",
    ),
    "get_vision_nearest_position_ids": Twin(
        "535cff10728f1694c326799802452ecf715dba766a6b66a9f0c0434fd7cf0501",
        "vision_nearest_position_ids_from_sizes",
        NEAREST_POSITION_IDS,
        "vision_nearest_position_ids_from_sizes(target_sizes, num_patches_per_side)",
    ),
}

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # The loop's Python ints would be data-dependent sizes: the same result from tensor ops
    return {call}
else:
    pass
"""


def fingerprint(statements: list[cst.BaseStatement]) -> str:
    """SHA-256 of the syntax tree of `statements` (comments and layout do not count)."""
    code = "".join(cst.Module(body=[]).code_for_node(statement) for statement in statements)
    return hashlib.sha256(ast.dump(ast.parse(textwrap.dedent(code))).encode()).hexdigest()


class VisionGridLoops(Codemod):
    NAME = "vision-grid-loops"
    DESCRIPTION = (
        "The loops of transformers' vision helpers over grid_thw.tolist() become tensor ops under export, so a vision "
        "tower's position ids and attention windows follow any number of images of any sizes."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return ".tolist()" in source and any(f"def {name}(" in source for name in TWINS)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if self.context.full_module_name != MODULE:
            return tree
        defined = {stmt.name.value for stmt in tree.body if isinstance(stmt, (cst.FunctionDef, cst.ClassDef))}
        body, helpers = list(tree.body), []
        for index, stmt in enumerate(tree.body):
            if not isinstance(stmt, cst.FunctionDef) or stmt.name.value not in TWINS:
                continue
            twin = TWINS[stmt.name.value]
            statements = list(stmt.body.body)
            if any(isinstance(inner, cst.If) and m.matches(inner.test, EXPORTING) for inner in statements):
                continue  # rewritten by an earlier run
            # what comes after the first `if` (which returns tensors passed in `kwargs`)
            ifs = [i for i, inner in enumerate(statements) if isinstance(inner, cst.If)]
            start = ifs[0] + 1 if ifs else len(statements)
            line = self.top_level_line(tree, stmt)
            if start >= len(statements) or fingerprint(statements[start:]) != twin.fingerprint:
                reason = "its statements are not the ones whose tensor-ops form was proven equal"
            elif twin.helper in defined:
                reason = f"the module already defines `{twin.helper}`"
            elif not imports_torch(tree):
                reason = "the module does not `import torch`"
            else:
                reason = None
            if reason is not None:
                self.report(line, "refused", stmt.name.value, reason)
                continue
            eager = statements[start:]
            statements[start:] = [export_twin(EXPORT_TEMPLATE.format(call=twin.call), eager, eager[0].leading_lines)]
            body[index] = stmt.with_changes(body=stmt.body.with_changes(body=statements))
            helpers.append(twin.code)
            self.report(line, "rewritten", stmt.name.value, "computes its result with tensor ops under export")
        if not helpers:
            return tree
        # the helpers go before the first function (the rewritten ones are functions of the module), in file order
        first = next(i for i, stmt in enumerate(body) if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)))
        added = [
            cst.parse_statement(code).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) for code in helpers
        ]
        return tree.with_changes(body=[*body[:first], *added, *body[first:]])
