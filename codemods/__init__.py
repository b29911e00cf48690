"""The codemods, in pipeline order. Each entry is one module with one class; `NAME`s are stable and unique."""

from .base import Codemod, Finding
from .cache_pytree import CachePytreeRegistration
from .cond_branches import CondBranches
from .vmap_masks import VmapMasks

ALL_CODEMODS: tuple[type[Codemod], ...] = (CachePytreeRegistration, CondBranches, VmapMasks)

__all__ = ["ALL_CODEMODS", "Codemod", "Finding"]
