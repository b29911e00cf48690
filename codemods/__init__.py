"""The codemods, in pipeline order. Each entry is one module with one class; `NAME`s are stable and unique."""

from .base import Codemod, Finding
from .cache_export import CacheExportCounters
from .cache_pytree import CachePytreeRegistration
from .chunk_padding import ChunkPadding
from .cond_branches import CondBranches
from .exclusive_cumsum import ExclusiveCumsum
from .fp16_clamp import Fp16Clamp
from .export_early_return import ExportEarlyReturn
from .moe_expert_loop import MoeExpertLoop
from .pad_to_min_length import PadToMinLength
from .segment_attention import SegmentAttention
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
)


def upstream_codemods(codemods: tuple[type[Codemod], ...]) -> tuple[type[Codemod], ...]:
    """The codemods of the upstream form: caches get counters for transformers' exporters (`cache-export`) instead of
    a registration of their own at import (`cache-pytree`, what the vendored package needs, having no exporter to
    extend). `cond-branches` is left out: no model of a release needs it (on 5.24 it rewrites one check of labels in a
    loss path, which no inference export traces; COVERAGE's ablation flips no type), and a PR without a test that fails
    before it is not one to send. It stays in the vendored package and in `exportsmith rewrite PATH`."""
    return tuple(
        CacheExportCounters if codemod is CachePytreeRegistration else codemod
        for codemod in codemods
        if codemod is not CondBranches
    )


UPSTREAM_CODEMODS = upstream_codemods(ALL_CODEMODS)

__all__ = ["ALL_CODEMODS", "UPSTREAM_CODEMODS", "Codemod", "Finding", "upstream_codemods"]
