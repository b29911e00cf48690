"""What one codemod brings: the model types that verify only because of it (not a test; runs torch).

    python tools/ablation.py cond-branches [--work build/coverage] [--jobs 2]

Reads the coverage sweep of `tools/coverage.py` in WORK. The candidates are the model types whose generated copy
verifies (`generated.jsonl`) and whose own modeling files the codemod changed. The tool renders
the same generated package without that codemod into `WORK/without-CODEMOD/generated`, verifies each candidate there
exactly like the coverage sweep's generated column (isolated, resumable: `WORK/without-CODEMOD.jsonl`), and prints
the candidates that fail without it: the model types that move from failing to passing because of that codemod.
`tools/coverage.py` names them in COVERAGE.md.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from codemods import ALL_CODEMODS
from exportsmith.content_cache import ContentCache
from exportsmith.discover import Transformers, find_transformers
from exportsmith.generate import Rendered, generated_modules, render, write_tree
from exportsmith.vendor import SHARED_PACKAGE
from exportsmith.verify.isolate import JOBS, check_export, recorded, sweep

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300.0  # seconds per model type, as in tools/coverage.py


def changed_by(rendered: Rendered, tf: Transformers, codemod: str) -> list[str]:
    """The model types of the rendered modules whose own files (modeling or modular) `codemod` changed."""
    return sorted(
        model_type
        for module, changes in rendered.groups.items()
        if module != SHARED_PACKAGE and any(codemod in change.applied for change in changes)
        for model_type in tf.models[module].model_types
    )


def main() -> int:
    names = [codemod.NAME for codemod in ALL_CODEMODS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("codemod", choices=names)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "coverage", help="the coverage sweep's records")
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--timeout", type=float, default=TIMEOUT)
    parser.add_argument("--fresh", action="store_true", help="forget the records of an earlier run")
    args = parser.parse_args()
    package = args.work / "generated"
    verified = {name for name, record in recorded(args.work / "generated.jsonl").items() if record["status"] == "ok"}
    if not package.is_dir() or not verified:
        print(f"no coverage sweep in {args.work}: run tools/coverage.py first", file=sys.stderr)
        return 2
    without = args.work / f"without-{args.codemod}"
    records_path = args.work / f"without-{args.codemod}.jsonl"
    if args.fresh:
        records_path.unlink(missing_ok=True)
    tf, modules, cache = find_transformers(), generated_modules(package), ContentCache()
    full = render(tf, modules, jobs=args.jobs, cache=cache)  # the coverage sweep's package: read from the cache
    candidates = [name for name in changed_by(full, tf, args.codemod) if name in verified]
    selected = tuple(codemod for codemod in ALL_CODEMODS if codemod.NAME != args.codemod)
    rendered = render(
        find_transformers(), generated_modules(package), jobs=args.jobs, cache=ContentCache(), codemods=selected
    )
    write_tree(rendered.files, without / "generated")
    check = partial(check_export, subject="generated", package="generated", path=str(without))
    records = sweep(candidates, records_path, check, jobs=args.jobs, timeout=args.timeout)
    moved = [name for name in candidates if records[name]["status"] != "ok"]
    print(f"{len(moved)} of {len(candidates)} model types verified with {args.codemod} fail without it:")
    for name in moved:
        print(
            f"  {name}: {records[name]['status']}: {records[name]['reason'].splitlines()[0] if records[name]['reason'] else ''}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
