"""Evidence for each PR of the upstream series, measured on the patched transformers tree: without and with its patch.

    python tools/upstream_evidence.py --series DIR [--work build/upstream-evidence] [--per-patch 1]

For each patch of the series (`exportsmith diff --all --out DIR`), verifies its representative model types on two
transformers source trees laid out from the installed release: the series applied without that patch (before), and
the whole series (after). Verified are transformers' own classes, caches registered as transformers' exporters
register them, with the full harness: every case, the three dims styles, the fresh-process load, the greedy loops
(`exportsmith.verify.patched_tree`). A tree holds the series' edits to the shared modules and to the representative's
own modules (the files its code comes from), rendered by the same codemods as the series. "Before" shows what the
patch fixes even where other patches of the series are needed too; "after" that the series with it is enough. Writes
DIR/evidence.json, which `exportsmith diff --all --out DIR --evidence DIR/evidence.json` puts into the PR texts.

A patch's representatives: the model types of the modules it edits whose generated copies verify (generated/
COVERAGE.json), tried in order (those whose original class does not export first) until one fails without the patch,
`--tries` at most; for a patch that changes shared modules, also the model that exercises them
(`REPRESENTATIVES`). Resumable: a patch already in
evidence.json is not measured again (delete the file to start over).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import sys
from pathlib import Path

import torch

from codemods import ALL_CODEMODS, upstream_codemods
from exportsmith.content_cache import ContentCache
from exportsmith.discover import find_transformers
from exportsmith.generate import render
from exportsmith.upstream_tests import NoTest, export_test
from exportsmith.verify.patched_tree import run_test_on_tree, verify_on_tree

ROOT = Path(__file__).resolve().parents[1]
# The models known to exercise a patch, measured first: for a shared module, a model that takes the changed path (a
# sliding-window decoder for the cache's counters and layer; models whose masks pass an `and`/`or` mask function, which
# transformers expands with vmap); for a model patch, one of its models whose harness inputs reach the rewritten site
REPRESENTATIVES = {
    "cache-export": ["mistral"],
    "sliding-window-cache": ["mistral"],
    "pad-to-min-length": ["llama", "lfm2"],  # the mask padding; the conv states of update_conv_state
    "export-early-return": ["llama", "mistral", "gemma2"],  # the padding mask sliced to a sliding window
    "vision-grid-loops": ["qwen2_5_vl_vision"],  # position ids and window index
    "vmap-masks": ["unlimited_ocr_text", "t5gemma2_encoder"],
    "shift-by-one": ["zaya"],  # a decoder LM: its test declares named new tokens, which a forward's cannot
    "flip-unfolded": ["inkling2_text"],  # its short convolution's windows, in every decode step
    "sequence-scan": ["zamba"],  # the Mamba layers' reference scan: the one of their copies that verifies with it
    "conv-padding-ints": ["mimi_encoder"],  # Mimi's convs without its quantizer (whose cdist needs cdist-mode)
    "cdist-mode": ["mimi"],  # its quantizer's codebook
}
# Codemods whose paths only half precision takes: their test runs the model in float16
HALF_PRECISION = {"fp16-clamp"}
# Codemods whose paths a default configuration does not take: their test sets these (transformers 5.x runs MoE experts
# with `grouped_mm` by default, and the loop the rewrite changes is the `eager` implementation; the sparse indexer's
# top-k is bounded by `index_topk`, 2048 in the harness's configuration, which no prompt of the test crosses)
TEST_CONFIG = {"moe-expert-loop": {"experts_implementation": "eager"}, "bounded-topk": {"index_topk": 4}}
# Codemods whose failures `Dim.AUTO` accepts (the guards hold over the range, torch cannot prove it): their test declares
# the new tokens with a named dim, as users do
NAMED_TOKENS = {"chunk-padding", "shift-by-one", "flip-unfolded", "sequence-scan"}
# Codemods whose site a prefill reaches and a decode step does not declare across (the sparse indexer's top-k over a
# prompt longer than `index_topk`, 4 in the test's configuration): their test exports the prefill, its prompt length
# a named dim
PREFILL = {"bounded-topk"}
_EDITED_MODEL = re.compile(r"^diff --git a/src/transformers/models/(\w+)/", re.MULTILINE)


def representatives(name: str, patch: str, coverage: dict, tf) -> tuple[list[str], list[str]]:
    """(the model types always measured for the patch of codemod `name`, the others to try in order)."""
    cells = {row["model_type"]: row for row in coverage["models"]}
    modules = sorted(set(_EDITED_MODEL.findall(patch)))
    candidates = [t for module in modules if module in tf.models for t in tf.models[module].model_types]
    verified = [t for t in candidates if cells.get(t, {}).get("generated", {}).get("status") == "ok"]
    verified.sort(key=lambda t: (cells[t]["original"]["status"] == "ok", t))  # original fails first
    shared = REPRESENTATIVES.get(name, [])
    return shared, [t for t in verified if t not in shared]


def without(name: str) -> tuple:
    """The codemods whose upstream form is every patch of the series but `name`'s."""
    return tuple(codemod for codemod in ALL_CODEMODS if name not in {c.NAME for c in upstream_codemods((codemod,))})


class Tree:
    """One copy of the installed release, whose files a state's edits overwrite and `reset` restores."""

    def __init__(self, tf, root: Path) -> None:
        self.tf, self.src = tf, root / "src"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(tf.root, self.src / "transformers", ignore=shutil.ignore_patterns("__pycache__"))
        self.written: list[str] = []

    def lay_out(self, module: str, codemods: tuple, cache: ContentCache) -> None:
        """The release with the upstream edits of `codemods` to the shared modules and to `module`'s files."""
        self.reset()
        rendered = render(self.tf, [module], codemods=codemods, cache=cache)
        for changes in rendered.upstream.values():
            for change in changes:
                if change.changed:
                    (self.src / "transformers" / change.relpath).write_text(change.rewritten, encoding="utf-8")
                    self.written.append(change.relpath)

    def reset(self) -> None:
        for relpath in self.written:
            shutil.copyfile(self.tf.root / relpath, self.src / "transformers" / relpath)
        self.written = []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=Path, required=True, help="a directory written by `exportsmith diff --out`")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "upstream-evidence")
    parser.add_argument(
        "--tries", type=int, default=3, help="model types of the patch's own models tried, until one fails before it"
    )
    parser.add_argument("--coverage", type=Path, default=ROOT / "generated" / "COVERAGE.json")
    args = parser.parse_args(argv)
    args.work = args.work.resolve()  # the children run in it: a relative tree path would not point at the tree
    tf, cache = find_transformers(), ContentCache()
    coverage = json.loads(args.coverage.read_text())
    out = args.series / "evidence.json"
    evidence = json.loads(out.read_text()) if out.exists() else {}
    if evidence and evidence.get("transformers") != tf.version:
        print(f"{out} was measured on transformers {evidence['transformers']}: delete it first", file=sys.stderr)
        return 2
    evidence.update(transformers=tf.version, torch=torch.__version__.split("+")[0])
    patches = evidence.setdefault("patches", {})
    module_of = {t: module for module, files in tf.models.items() for t in files.model_types}
    tree = Tree(tf, args.work / "tree")
    after: dict[str, dict] = {}  # model type -> its record on the whole series (the same for every patch)
    for file_name in (args.series / "series").read_text().split():
        stem = file_name.removesuffix(".patch")
        name = stem.split("-", 1)[1]
        if stem in patches:
            continue
        shared, own = representatives(name, (args.series / file_name).read_text(), coverage, tf)
        print(f"{stem}: {', '.join(shared + own[: args.tries]) or 'no model type shows it'}", file=sys.stderr)
        measured = {}
        for model_type in shared + own[: args.tries]:
            if model_type in own and any(not pair["before"]["ok"] for t, pair in measured.items() if t in own):
                break  # one of the patch's own models that needs it is enough
            if model_type not in after:
                tree.lay_out(module_of[model_type], ALL_CODEMODS, cache)
                after.update(verify_on_tree(tree.src, [model_type], args.work))
            tree.lay_out(module_of[model_type], without(name), cache)
            before = verify_on_tree(tree.src, [model_type], args.work)[model_type]
            measured[model_type] = {"before": summary(before), "after": summary(after[model_type])}
            print(f"  {model_type}: {_verdict(before)} -> {_verdict(after[model_type])}", file=sys.stderr, flush=True)
        patches[stem] = measured
        evidence["date"] = datetime.date.today().isoformat()
        out.write_text(json.dumps(evidence, indent=1, sort_keys=True) + "\n")
    tests = evidence.setdefault("tests", {})
    for stem, measured in patches.items():
        if stem not in tests:
            tests[stem] = pr_test(stem, measured, tree, cache, module_of, args.work)
            print(f"{stem} test: {tests[stem].get('before')} -> {tests[stem].get('after')}", file=sys.stderr)
            out.write_text(json.dumps(evidence, indent=1, sort_keys=True) + "\n")
    tree.reset()
    return 0


def pr_test(stem: str, measured: dict, tree: Tree, cache: ContentCache, module_of: dict, work: Path) -> dict:
    """The PR's test (`upstream_tests.export_test`) on a representative that needs the patch, run without the patch
    and with the series: `{"model_type", "path", "text", "before", "after"}` (pytest's verdict, and its error)."""
    name = stem.split("-", 1)[1]
    half = name in HALF_PRECISION
    # a model that fails without the patch (the harness, in float32 and default configs, cannot tell for the others)
    needing = [t for t, pair in measured.items() if half or name in TEST_CONFIG or not pair["before"]["ok"]]
    if not needing:
        return {"why": "no representative fails without the patch"}
    model_type = needing[0]
    try:
        dtype = torch.float16 if half else torch.float32
        path, text = export_test(
            model_type, name, dtype, TEST_CONFIG.get(name), named_tokens=name in NAMED_TOKENS, prefill=name in PREFILL
        )
    except NoTest as error:
        return {"model_type": model_type, "why": f"no test written: {error}"}
    result = {"model_type": model_type, "path": path, "text": text, "overrides": TEST_CONFIG.get(name, {})}
    if half:
        result["overrides"] = {**result["overrides"], "dtype": "float16"}
    if name in NAMED_TOKENS or name in PREFILL:
        result["overrides"] = {**result["overrides"], "tokens": 'Dim("tokens", min=1, max=64)'}
    for state, codemods in (("before", without(name)), ("after", ALL_CODEMODS)):
        tree.lay_out(module_of[model_type], codemods, cache)
        result[state] = run_test_on_tree(tree.src, text, work)
    return result


def summary(record: dict) -> dict:
    """What a PR text shows of a `verify_model` record: the verdict, why, the cases that ran and their largest
    max|diff| against eager."""
    diffs = [case["max_diff"] for case in record.get("cases", []) if case.get("max_diff") is not None]
    return {
        "ok": record["ok"],
        "failure": record["failure"],
        "message": (record.get("message") or "")[:500],
        "cases": len(record.get("cases", [])),
        "max_diff": max(diffs) if diffs else None,
    }


def _verdict(record: dict) -> str:
    return "ok" if record["ok"] else f"FAIL {record['failure']}"


if __name__ == "__main__":
    sys.exit(main())
