"""Where generation spends its CPU time (a profile, not a test): exclusive CPU seconds per phase of `render` +
`write_tree` over a fixed subset of models, in one process, beside the bare libcst parse + print of the same files.

    python tools/profile_generate.py --every 8 --out /tmp/g8     # every 8th model module + the shared modules
    python tools/profile_generate.py --every 1                   # everything (what `generate --all` renders)

CPU time (process_time), not wall time, so a loaded machine moves the numbers less; compare a run with the floor
measured in the same run. A phase's time excludes the phases nested in it (a codemod's template parses are
`codemod X > parse`, not part of `codemod X`); `X > print` is printing code (whole modules or statements).
"""

from __future__ import annotations

import argparse
import functools
import gc
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper

import codemods
from exportsmith import generate, pipeline, vendor
from exportsmith.discover import find_transformers

clock = time.process_time
totals: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)
stack: list[list] = []  # [label, start, time spent in nested phases]
NESTED = ("parse", "parse-snippet", "print", "metadata")  # labelled by the phase they run in


def timed(label: str):
    def wrap(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            parent = stack[-1][0].split(" > ")[-1] if stack else "-"
            if label in NESTED:
                if parent == label:
                    return function(*args, **kwargs)  # counted by the outer call (a print printing its parts)
                full = f"{parent} > {label}"
            else:
                full = label
            entry = [full, clock(), 0.0]
            stack.append(entry)
            try:
                return function(*args, **kwargs)
            finally:
                stack.pop()
                elapsed = clock() - entry[1]
                totals[full] += elapsed - entry[2]
                calls[full] += 1
                if stack:
                    stack[-1][2] += elapsed

        return wrapper

    return wrap


def instrument() -> None:
    cst.parse_module = timed("parse")(cst.parse_module)
    cst.parse_statement = timed("parse-snippet")(cst.parse_statement)
    cst.parse_expression = timed("parse-snippet")(cst.parse_expression)
    cst.Module.code = property(timed("print")(cst.Module.code.fget))
    cst.Module.code_for_node = timed("print")(cst.Module.code_for_node)
    MetadataWrapper.resolve = timed("metadata")(MetadataWrapper.resolve)
    for codemod in codemods.ALL_CODEMODS:
        codemod.transform_module = timed(f"codemod {codemod.NAME}")(codemod.transform_module)
        codemod.might_apply = classmethod(timed("prefilter")(codemod.might_apply.__func__))
    generate.run_codemods = timed("pipeline")(pipeline.run_codemods)
    generate.vendor_module = timed("vendor")(vendor.vendor_module)
    generate.vendor_shared = timed("vendor")(vendor.vendor_shared)
    generate.vendor_auto_classes = timed("vendor")(generate.vendor_auto_classes)
    pipeline.Change.diff = timed("patch")(pipeline.Change.diff)
    pipeline.Change.to_json = timed("json")(pipeline.Change.to_json)
    generate._model_init = timed("model __init__ (black)")(generate._model_init)
    generate._record = timed("REWRITES.md")(generate._record)
    generate._inputs_key = timed("hashing")(generate._inputs_key)
    generate.write_tree = timed("file writes")(generate.write_tree)
    generate.render = timed("render (rest)")(generate.render)


def parse_and_print(sources: list[str]) -> float:
    started = clock()
    for source in sources:
        cst.parse_module(source).code
    return clock() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=8, help="profile every Nth model module (sorted)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the tree (default: a temporary dir)")
    args = parser.parse_args()
    tf = find_transformers()
    modules = sorted(tf.models)[:: args.every]
    paths = list(tf.shared_modules) + [
        p for module in modules for p in tf.models[module].modeling + tf.models[module].modular
    ]
    sources = [path.read_text(encoding="utf-8") for path in paths]
    floor = parse_and_print(sources)
    gc.disable()  # the same with the cyclic collector paused, as render pauses it
    floor_paused = parse_and_print(sources)
    gc.enable()
    instrument()
    out = args.out or Path(tempfile.mkdtemp()) / "generated"
    started = clock()
    rendered = generate.render(tf, modules, jobs=1, cache=None)
    generate.write_tree(rendered.files, out)
    total = clock() - started
    print(f"floor: parse + print of {len(paths)} files: {floor:.2f} s CPU")
    print(f"floor with the cyclic GC paused: {floor_paused:.2f} s CPU")
    print(
        f"render + write of {len(modules)} models: {total:.2f} s CPU (ratio {total / floor:.2f}; "
        f"{total / floor_paused:.2f} to the paused floor)\n"
    )
    print("| phase | calls | CPU s | share |\n|---|---|---|---|")
    for label, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"| {label} | {calls[label]} | {seconds:.2f} | {100 * seconds / total:.1f}% |")


if __name__ == "__main__":
    main()
