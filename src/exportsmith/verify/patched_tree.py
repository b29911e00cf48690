"""Verify transformers' own classes on a patched transformers source tree, as a user of that tree would export them.

The upstream patches add no cache registration of their own: a user of the patched tree registers the caches the way
transformers' exporters do (every `Cache` subclass through `exporters.exporter_dynamo.register_pytree_node`; its
`from_pretrained` does it from a saved program's spec). `REGISTER_CACHES` is that step, as a module a process imports
after the model's modeling module: the harness's own process before exporting, and the fresh process before loading a
saved program. It also makes
the cache and layer classes safe globals: the harness reads a decode step's inputs back from a file with
`weights_only`, as a runtime fed from a file would.

`verify_on_tree(src, model_types, work)` runs `verify_model(..., subject="original")` for each model type in a child
process whose `transformers` is the tree's (`src` first on its path), with a memory cap and a timeout, and returns
the records.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

REGISTER_MODULE = "register_transformers_caches"
REGISTER_CACHES = """
import sys

import torch
from transformers import cache_utils
from transformers.cache_utils import Cache
from transformers.exporters.exporter_dynamo import _iter_subclasses, is_cache_class, register_pytree_node

# every `Cache` subclass, and the `*Cache` classes of the modeling modules imported so far (what
# `register_cache_pytrees_for_model` registers for a model)
caches = list(_iter_subclasses(Cache))
for name, module in list(sys.modules.items()):
    if name.startswith("transformers.models.") and ".modeling_" in name:
        caches += [
            value for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == name and is_cache_class(value)
        ]
for cls in caches:
    register_pytree_node(cls)
# the classes of cache_utils: the caches, and their layers of every kind (linear-attention layers have a mixin of
# their own)
classes = [value for value in vars(cache_utils).values() if isinstance(value, type)]
torch.serialization.add_safe_globals([*caches, *(cls for cls in classes if cls.__module__ == cache_utils.__name__)])
"""
# The model's modeling module first, so that the registration sees its caches
_CHILD = """
import importlib, json, sys
import transformers
from exportsmith.verify.tasks import model_class
try:
    importlib.import_module(model_class(sys.argv[1])[1].__module__)
except Exception:  # a part without a model class of its own: verify_model says what it builds, or why not
    pass
import {module}
from exportsmith.verify.check import verify_model
record = verify_model(sys.argv[1], subject="original", imports=("{module}",)).record()
record["transformers_file"] = transformers.__file__
print(json.dumps(record))
""".format(module=REGISTER_MODULE)
MEMORY_LIMIT = 6 * 2**30  # bytes of address space per child
TIMEOUT = 600.0  # seconds per model type


def write_register_module(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{REGISTER_MODULE}.py").write_text(REGISTER_CACHES, encoding="utf-8")
    return directory


def verify_on_tree(src: Path, model_types: list[str], work: Path, timeout: float = TIMEOUT) -> dict[str, dict]:
    """model_type -> the `verify_model` record of transformers' own class on the tree whose package is
    `src/transformers`; a child that fails, runs out of memory or time gives a record with `ok` False saying so."""
    helpers = write_register_module(work)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(helpers), *sys.path])}
    records = {}
    for model_type in model_types:
        try:
            finished = subprocess.run(
                [sys.executable, "-c", _CHILD, model_type],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                preexec_fn=_cap_memory,
            )
            lines = finished.stdout.strip().splitlines()
            record = json.loads(lines[-1]) if finished.returncode == 0 and lines else None
            error = None if record else f"the child failed: {(finished.stderr.strip().splitlines() or ['?'])[-1]}"
        except subprocess.TimeoutExpired:
            record, error = None, f"timeout after {timeout:.0f} s"
        if record is not None and not record["transformers_file"].startswith(str(src)):
            raise RuntimeError(f"{model_type} was verified against {record['transformers_file']}, not the tree {src}")
        records[model_type] = record or {"model_type": model_type, "ok": False, "failure": "crash", "message": error}
    return records


def run_test_on_tree(src: Path, text: str, work: Path, timeout: float = TIMEOUT) -> str:
    """pytest's verdict on the test module `text` with the tree's transformers: "passed", or "failed: " and the
    first line of the error it reports."""
    test = work / "test_pr.py"
    test.write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), *sys.path])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(test)]
    try:
        finished = subprocess.run(
            command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=_cap_memory
        )
    except subprocess.TimeoutExpired:
        return f"failed: timeout after {timeout:.0f} s"
    if finished.returncode == 0:
        return "passed"
    errors = [line[2:].strip() for line in finished.stdout.splitlines() if line.startswith("E ")]
    return "failed: " + (next((e for e in errors if e), None) or finished.stdout.strip().splitlines()[-1])


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
