"""Finds the `if`s that stop torch.export of tiny models on tensor values, and records them in
`codemods/cond_targets.json` (not a test; runs torch). `generate` never runs this: it only reads the committed file.

    python tools/find_cond_targets.py MODEL_TYPE... [--timeout 300]

For each model type, in its own process: build the tiny original (`verify.check.build_pair`), export each of its
programs like `exportsmith verify` does, and on a data-dependent error (`GuardOnDataDependentSymNode` and friends)
take the innermost transformers frame (`verify.errors.user_location`) and the `if`/`elif` whose test holds that line.
Sites found are merged into the targets file, keyed so that they survive line shifts: the module's path in the
transformers package, the qualname of the function that holds the `if` (`Class.method`, nested names dotted) and
the test written on one line (`cond_branches.site_test`); the line is informative only. One entry per key, sorted;
earlier entries are kept; each names the model type that hit it and the error's first line. A model that exports,
fails for another reason, or fails outside an `if` test is reported on stderr and recorded nowhere.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "codemods" / "cond_targets.json"

CHILD = r"""
import json, sys
import generated  # registers transformers' Cache classes as pytree nodes, so the failures left are the model's own
import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider
from codemods.cond_branches import site_test
from exportsmith.discover import find_transformers
from exportsmith.verify.check import build_pair, export_program, programs_for, varying_dims
from exportsmith.verify.errors import first_line, user_location

DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "data-dependent", "data dependent")

def data_dependent(error):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if any(marker in type(error).__name__ + str(error) for marker in DATA_DEPENDENT):
            return True
        error = error.__cause__ or error.__context__
    return False

class EnclosingIf(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line):
        self.line, self.scopes, self.found = line, [], None

    def visit_ClassDef(self, node):
        self.scopes.append(node.name.value)

    def leave_ClassDef(self, node):
        self.scopes.pop()

    def visit_FunctionDef(self, node):
        self.scopes.append(node.name.value)

    def leave_FunctionDef(self, node):
        self.scopes.pop()

    def visit_If(self, node):
        test = self.get_metadata(PositionProvider, node.test)
        if test.start.line <= self.line <= test.end.line:  # the innermost such `if` is visited last
            line = self.get_metadata(PositionProvider, node).start.line
            self.found = (line, ".".join(self.scopes), site_test(node.test))

def enclosing_if(path, line):
    visitor = EnclosingIf(line)
    MetadataWrapper(cst.parse_module(path.read_text(encoding="utf-8"))).visit(visitor)
    return visitor.found

model_type = sys.argv[1]
tf = find_transformers()
original, _ = build_pair(model_type, None)
for program in programs_for(original):
    try:
        export_program(original, program.cases[0].inputs(), varying_dims(program))
    except Exception as error:
        location = user_location(error)
        result = {"model_type": model_type, "program": program.name, "error": first_line(error)[:300],
                  "location": location, "data_dependent": data_dependent(error)}
        if location and result["data_dependent"] and location.startswith("transformers/"):
            relpath, line = location.removeprefix("transformers/").rsplit(":", 1)
            found = enclosing_if(tf.root / relpath, int(line))
            if found:
                result.update(file=relpath, line=found[0], function=found[1], test=found[2])
        print(json.dumps(result))
        break
else:
    print(json.dumps({"model_type": model_type, "exported": True}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    targets = json.loads(TARGETS.read_text()) if TARGETS.exists() else {"sites": []}
    sites = {(site["file"], site["function"], site["test"]): site for site in targets["sites"]}
    for model_type in args.models:
        try:
            child = subprocess.run(
                [sys.executable, "-c", CHILD, model_type],
                capture_output=True,
                text=True,
                timeout=args.timeout,
                cwd=ROOT,
            )
        except subprocess.TimeoutExpired:
            print(f"{model_type}: timeout", file=sys.stderr)
            continue
        lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
        if not lines:
            tail = (child.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{model_type}: child failed: {tail[:200]}", file=sys.stderr)
            continue
        result = json.loads(lines[-1])
        if "file" in result:
            key = (result["file"], result["function"], result["test"])
            fields = ("file", "function", "test", "line", "model_type", "error")
            sites.setdefault(key, {k: result[k] for k in fields})
            print(f"{model_type}: site {result['file']}:{result['line']}: if {result['test']}", file=sys.stderr)
        elif result.get("exported"):
            print(f"{model_type}: exports", file=sys.stderr)
        else:
            print(f"{model_type}: {result['error'][:150]} at {result['location']} (no `if` recorded)", file=sys.stderr)
    import transformers

    targets = {"transformers": transformers.__version__, "sites": [sites[key] for key in sorted(sites)]}
    TARGETS.write_text(json.dumps(targets, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(sites)} site(s) in {TARGETS.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
