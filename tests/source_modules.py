"""Runs rewritten source in the test process: the modules a codemod's run-time tests compare, original against
rewritten."""

from __future__ import annotations

import sys
import types

import torch


def module_from_source(source: str, name: str) -> types.ModuleType:
    """`source` executed as a module named `name` (registered in `sys.modules`, so torch.export can find its code)."""
    module = types.ModuleType(name)
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    sys.modules[name] = module
    return module


def model_pair(change, model_class: str, prefix: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """`model_class` of `change`'s original and rewritten source, in eval mode, with the same seeded weights."""
    torch.manual_seed(0)
    original = getattr(module_from_source(change.original, f"{prefix}_original"), model_class)()
    rewritten = getattr(module_from_source(change.rewritten, f"{prefix}_rewritten"), model_class)()
    rewritten.load_state_dict(original.state_dict())
    return original.eval(), rewritten.eval()
