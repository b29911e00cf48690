"""The codemods, in pipeline order. Each entry is one module with one class; `NAME`s are stable and unique."""

from .base import Codemod, Finding
from .bounded_topk import BoundedTopk
from .cache_export import CacheExportCounters
from .cache_pytree import CachePytreeRegistration
from .cdist_mode import CdistMode
from .chunk_padding import ChunkPadding
from .conv_padding_ints import ConvPaddingInts
from .cond_branches import CondBranches
from .exclusive_cumsum import ExclusiveCumsum
from .fp16_clamp import Fp16Clamp
from .export_early_return import ExportEarlyReturn
from .flip_unfolded import FlipUnfolded
from .moe_expert_loop import MoeExpertLoop
from .pad_to_min_length import PadToMinLength
from .segment_attention import SegmentAttention
from .sequence_scan import SequenceScan
from .shift_by_one import ShiftByOne
from .sliding_window_cache import SlidingWindowCache
from .take_along_dim_gather import TakeAlongDimGather
from .tensor_len import TensorLen
from .vision_grid_loops import VisionGridLoops
from .vmap_masks import VmapMasks

ALL_CODEMODS: tuple[type[Codemod], ...] = (
    CachePytreeRegistration,
    SlidingWindowCache,
    PadToMinLength,
    ChunkPadding,
    TensorLen,
    TakeAlongDimGather,
    ExportEarlyReturn,
    MoeExpertLoop,
    Fp16Clamp,
    CondBranches,
    SegmentAttention,
    VisionGridLoops,
    ExclusiveCumsum,
    VmapMasks,
    BoundedTopk,
    ShiftByOne,
    FlipUnfolded,
    SequenceScan,
    ConvPaddingInts,
    CdistMode,
)


# The codemods the upstream series leaves out, and why: a PR belongs in it when a model fails without it. They stay in
# the vendored package and in `exportsmith rewrite PATH`.
NOT_UPSTREAM = {
    CondBranches: "on 5.24 it rewrites one check of labels in wav2vec2's loss, which no inference export traces; no "
    "model type fails without it (COVERAGE's ablation flips none)",
    CdistMode: "on the harness's audio Mimi's tiny quantizer measures at most 9 rows against its codebook, where torch's "
    "first test (25 rows or fewer) holds over the whole range, so no model type fails without it; outside the harness "
    "it does (a mimi program exported at the harness's example refuses 30 frames at batch 1: `Guard failed: batch * "
    "frames <= 25`), which a PR would have to show with audio the harness does not give",
    ExclusiveCumsum: "it rewrites the path of get_vision_interpolation_indices_and_weights that runs without "
    "num_patches; every Qwen3-VL-family tower passes the count (vision-grid-loops), and the two embedders that do not "
    "(inkling2, paddleocr_vl) fail for other reasons: no model type fails without it",
}


def upstream_codemods(codemods: tuple[type[Codemod], ...]) -> tuple[type[Codemod], ...]:
    """The codemods of the upstream form: caches get counters for transformers' exporters (`cache-export`) instead of
    a registration of their own at import (`cache-pytree`, what the vendored package needs, having no exporter to
    extend), and those of NOT_UPSTREAM are left out."""
    return tuple(
        CacheExportCounters if codemod is CachePytreeRegistration else codemod
        for codemod in codemods
        if codemod not in NOT_UPSTREAM
    )


UPSTREAM_CODEMODS = upstream_codemods(ALL_CODEMODS)

__all__ = ["ALL_CODEMODS", "NOT_UPSTREAM", "UPSTREAM_CODEMODS", "Codemod", "Finding", "upstream_codemods"]
