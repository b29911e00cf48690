"""transformers' vision helpers that loop over the images of `grid_thw.tolist()` compute the same tensors with tensor
ops under export; eager keeps the loop.

Why: `vision_utils.get_vision_position_ids` (the rotary position ids of Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V,
PaddleOCR-VL, ... vision towers) builds each image's ids from Python ints of `grid_thw.tolist()`. Under torch.export
those ints are data-dependent: the tower cannot be exported for a number of images or sizes other than the traced
ones, and transformers' own exporter computes the ids outside the graph and passes them as an extra input. From each
patch's index in the packed sequence, its image's `(t, h, w)` (`repeat_interleave` of the grid by the patch counts)
and integer arithmetic, every id is computed in the graph, for any number of images of any sizes.

What it rewrites: in `transformers.vision_utils`, the loop of `get_vision_position_ids` and the `return` after it,
with what prepares it (everything after the first `if`, which returns ids passed in `kwargs`), when they are the
statements its tensor-ops form was proven equal to (as transformers 5.x ships them, recognised by the SHA-256 of
their syntax tree: `LOOPS`; the preparation's `len(grid_thw)` would also pin the number of images). Under `torch.compiler.is_exporting()` the function returns
`vision_position_ids_from_grid(...)`, a helper added to the module once; eager runs the loop, in an `else`. The
helper checks (`torch._assert_async`) that each height and width is a multiple of the merge size, as the loop's
`reshape` requires. Integer arithmetic: the ids are equal, not just close (tests/test_vision_grid_loops.py compares
them over random grids, merge sizes, frames and `include_temporal`).

What it refuses (left unchanged, with a finding): a helper of that name whose loop differs from the proven one (a
release changed it: its tensor-ops form must be proven again), and a module that already defines the helper's name.
"""

from __future__ import annotations

import ast
import hashlib
import textwrap

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, Codemod, export_twin, imports_torch

MODULE = "transformers.vision_utils"
HELPER = "vision_position_ids_from_grid"

# function name -> SHA-256 of `ast.dump` of its statements after the first `if` (the loop over the grid, what prepares
# it and the `return` after it), as proven
LOOPS = {"get_vision_position_ids": "e8373b4b9f22f05ba15c5b93fe92ebb1f98b9010b6c75978eb2893a8bbe0c9d9"}

HELPER_CODE = '''def vision_position_ids_from_grid(
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

EXPORT_TEMPLATE = """
if torch.compiler.is_exporting():
    # The loop's Python ints would be data-dependent sizes: the same ids from tensor ops
    return vision_position_ids_from_grid(grid_thw, spatial_merge_size, include_temporal)
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
        "tower's position ids follow any number of images of any sizes."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "grid_thw.tolist()" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if self.context.full_module_name != MODULE:
            return tree
        defined = {stmt.name.value for stmt in tree.body if isinstance(stmt, (cst.FunctionDef, cst.ClassDef))}
        body = list(tree.body)
        changed = False
        for index, stmt in enumerate(tree.body):
            if not isinstance(stmt, cst.FunctionDef) or stmt.name.value not in LOOPS:
                continue
            statements = list(stmt.body.body)
            if any(isinstance(inner, cst.If) and m.matches(inner.test, EXPORTING) for inner in statements):
                continue  # rewritten by an earlier run
            # what comes after the first `if` (which returns a precomputed value from `kwargs`)
            ifs = [i for i, inner in enumerate(statements) if isinstance(inner, cst.If)]
            start = ifs[0] + 1 if ifs else len(statements)
            line = self.top_level_line(tree, stmt)
            if start >= len(statements) or fingerprint(statements[start:]) != LOOPS[stmt.name.value]:
                reason = "its loop over the grid is not the one whose tensor-ops form was proven equal"
            elif HELPER in defined:
                reason = f"the module already defines `{HELPER}`"
            elif not imports_torch(tree):
                reason = "the module does not `import torch`"
            else:
                reason = None
            if reason is not None:
                self.report(line, "refused", stmt.name.value, reason)
                continue
            eager = statements[start:]
            twin = export_twin(EXPORT_TEMPLATE, eager, eager[0].leading_lines)
            statements[start:] = [twin]
            body[index] = stmt.with_changes(body=stmt.body.with_changes(body=statements))
            changed = True
            self.report(line, "rewritten", stmt.name.value, "computes the ids from the grid with tensor ops under export")
        if not changed:
            return tree
        # the helper goes before the first function (the rewritten ones are functions of the module)
        first = next(i for i, stmt in enumerate(body) if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)))
        helper = cst.parse_statement(HELPER_CODE).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        return tree.with_changes(body=[*body[:first], helper, *body[first:]])
