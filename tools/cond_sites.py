"""Counts the data-dependent `if` sites of every modeling file of the installed transformers (not a test): how many
`cond-branches` rewrites and how many it refuses, grouped by reason (names in backticks folded to `_`).

    python tools/cond_sites.py [--json FILE] [--list]

Static only: it parses, it never imports a model or runs torch.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys

from codemods.cond_branches import CondBranches
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods


def _reason_kind(reason: str) -> str:
    return re.sub(r"`[^`]*`", "`_`", reason)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every finding here")
    parser.add_argument("--list", action="store_true", help="print every finding")
    args = parser.parse_args()
    tf = find_transformers()
    files = sorted((tf.root / "models").glob("*/modeling_*.py"))
    findings = []
    for path in files:
        change = run_codemods(
            path.read_text(encoding="utf-8"), tf.relpath(path), tf.module_name(path), (CondBranches,)
        )
        findings.extend(change.findings)
    kinds = collections.Counter(f.kind for f in findings)
    refused = collections.Counter(_reason_kind(f.reason) for f in findings if f.kind == "refused")
    shapes = collections.Counter(f.reason for f in findings if f.kind == "rewritten")
    print(
        f"transformers {tf.version}: {len(files)} modeling files, {len(findings)} sites, "
        f"{kinds['rewritten']} rewritten, {kinds['refused']} refused"
    )
    print("rewritten by shape:")
    for shape, count in shapes.most_common():
        print(f"  {count:4d}  {shape}")
    print("refused by reason:")
    for reason, count in refused.most_common():
        print(f"  {count:4d}  {reason}")
    if args.list:
        for finding in findings:
            print(finding)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([finding.__dict__ for finding in findings], handle, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
