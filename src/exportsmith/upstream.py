"""Renders `Change`s as an upstream patch series: one patch per mechanism (codemod), each with a PR description.

A reviewer reads one mechanism at a time: the series has a patch per codemod that changed something, in pipeline
order, holding that codemod's change to every file (shared modules and models alike); each applies on top of the ones
before it (a file two codemods change is in both patches, as the first left it and as the second changes it). The PR
text says what changed and why, which models it serves, which files are sources and which are generated from a
`modular_*.py` (regenerate those with transformers' `utils/modular_model_converter.py`), the rewritten locations,
and, once `tools/upstream_evidence.py` has measured it, how its representative models fare on the patched
transformers tree before and after the patch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from codemods import UPSTREAM_CODEMODS

from .pipeline import Change, unified_diff

_GENERATED_FROM = re.compile(r"This file was automatically generated from (src/transformers/\S+?\.py)")
_DESCRIPTIONS = {codemod.NAME: codemod.DESCRIPTION for codemod in UPSTREAM_CODEMODS}


@dataclass(frozen=True)
class Edit:
    """One codemod's change to one file: the text before and after it."""

    change: Change
    before: str
    after: str

    def diff(self) -> str:
        return unified_diff(self.before, self.after, f"src/transformers/{self.change.relpath}")


def generated_from(change: Change) -> str | None:
    """The modular source a modeling file is generated from, per its own header."""
    match = _GENERATED_FROM.search(change.original[:4000])
    return match.group(1) if match else None


def patch_text(changes: tuple[Change, ...]) -> str:
    return "".join(change.diff() for change in sorted(changes, key=lambda change: change.relpath))


def pr_description(
    codemod: str,
    edits: list[Edit],
    evidence: dict[str, dict],
    version: str,
    model_types: list[str],
    torch: str = "",
    test: dict | None = None,
) -> str:
    """Markdown for the patch of one codemod. `evidence` maps model types to their records before and after the patch
    (`tools/upstream_evidence.py`: `{"before": summary, "after": summary}`, summaries of `verify_model` records:
    ok, failure, message, how many cases ran and their largest max|diff|); `test` is the PR's
    test and its verdicts there (`{"model_type", "path", "text", "before", "after"}`, or `{"why"}` when it has none).
    """
    lines = [f"# torch.export support: `{codemod}`\n"]
    lines.append(
        f"Against transformers {version}; produced by exportsmith (`exportsmith diff`). One mechanism: every change "
        "this rewrite makes, applied on top of the patches before it in `series`.\n"
    )
    if test and "text" not in test:
        lines.append(
            f"**Not ready to send**: {test['why']} (see Evidence). A PR needs a test that fails without it.\n"
        )
    lines.append("## What changed and why\n")
    lines.append(_DESCRIPTIONS.get(codemod, ""))
    shown = ", ".join(model_types[:40]) + (f" and {len(model_types) - 40} more" if len(model_types) > 40 else "")
    lines.append(f"\nModels whose files it edits ({len(model_types)}): {shown or 'none (shared modules only)'}.")
    lines.append("\n## Files\n")
    lines.append("| file | kind |")
    lines.append("|---|---|")
    changed_paths = {f"src/transformers/{edit.change.relpath}" for edit in edits}
    for edit in edits:
        source = generated_from(edit.change)
        if source:
            kind = f"generated from `{source}`: keep it in sync with `python utils/modular_model_converter.py`"
            if source not in changed_paths:
                kind += "; the rewritten classes come into it from another model's modular file, by the converter"
        elif "/modular_" in edit.change.relpath:
            kind = "source (modular file)"
        else:
            kind = "source"
        lines.append(f"| `src/transformers/{edit.change.relpath}` | {kind} |")
    lines.append("\n## Rewritten locations\n")
    for edit in edits:
        for finding in edit.change.findings:
            if finding.kind == "rewritten" and finding.codemod == codemod:
                lines.append(
                    f"- `src/transformers/{edit.change.relpath}:{finding.line}` {finding.construct}: {finding.reason}"
                )
    lines.append("\n## Evidence, measured on the patched transformers tree\n")
    if not evidence:
        lines.append(
            "Not measured yet: `python tools/upstream_evidence.py --series DIR`, then `exportsmith diff --all --out DIR "
            "--evidence DIR/evidence.json`."
        )
    else:
        lines.append(_evidence(evidence, version, torch))
    if test:
        lines.append("\n## Test\n")
        lines.append(_test(test))
    return "\n".join(lines).rstrip("\n") + "\n"


def _test(test: dict) -> str:
    if "text" not in test:
        return f"None yet: {test['why']}."
    before, after = (test[state].replace("`", "'") for state in ("before", "after"))
    settings = ", ".join(f"`{key}={value!r}`" for key, value in sorted(test.get("overrides", {}).items()))
    return (
        f"`{test['path']}` (added by this patch) exports {test['model_type']}'s tiny model"
        + (f" ({settings})" if settings else "")
        + " and checks the program against eager at other shapes. pytest on the tree without this patch: "
        f"{before.split(': ', 1)[0]}"
        + (f" (`{before.split(': ', 1)[1][:200]}`)" if ": " in before else "")
        + f"; with it: {after.split(': ', 1)[0]}"
        + (f" (`{after.split(': ', 1)[1][:200]}`)" if ": " in after else "")
        + ".\n"
    )


def new_file_diff(path: str, text: str) -> str:
    """A git-style diff that creates the file `path` (a path inside transformers' repository) holding `text`."""
    lines = text.splitlines(keepends=True)
    body = "".join(f"+{line}" for line in lines)
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


def _evidence(evidence: dict[str, dict], version: str, torch: str) -> str:
    head = (
        f"On transformers {version} and torch {torch}, the series applied without this patch (before) and the "
        "whole series (after): transformers' own classes, caches registered the way transformers' exporters register "
        "them, exported (non-strict) with dynamic batch, new-token and past dims in three dynamic-shape styles, run "
        "at every case (batch 1 to 4, 1-token prompts, a 1-token cache, ...) against eager, saved and loaded in a "
        "fresh process, and for an LM driven in greedy loops against `generate()`.\n"
    )
    rows = ["| model | before | after | cases | max abs diff vs eager |", "|---|---|---|---|---|"]
    for model_type, pair in sorted(evidence.items()):
        after = pair["after"]
        largest = "-" if after.get("max_diff") is None else f"{after['max_diff']:.2g}"
        rows.append(
            f"| {model_type} | {_outcome(pair['before'])} | {_outcome(after)} | {after.get('cases', 0)} | {largest} |"
        )
    return head + "\n" + "\n".join(rows) + "\n"


def _outcome(record: dict) -> str:
    if record["ok"]:
        return "verified"
    message = record.get("message") or ""
    message = message.split("; ")[0].replace("|", "\\|").replace("`", "'")
    return f"{record['failure']}: `{message[:160]}`" if message else str(record["failure"])


def patch_series(
    groups: dict[str, tuple[Change, ...]], evidence: dict, model_types: dict[str, list[str]], version: str
) -> dict[str, str]:
    """File name -> text: `NNNN-<codemod>.patch` and `.md` for every codemod that changed something, and `series`
    (their order, the pipeline's).

    `groups` is `Rendered.upstream` (the shared modules first); `model_types` maps a module to its model types;
    `evidence` is what `tools/upstream_evidence.py` measured (empty when it has not run), per patch."""
    shared = next(iter(groups), None)
    edits: dict[str, list[Edit]] = {codemod.NAME: [] for codemod in UPSTREAM_CODEMODS}
    module_of = {}
    for group, changes in groups.items():
        for change in changes:
            module_of[change.relpath] = group
            for name, before, after in change.by_codemod():
                edits[name].append(Edit(change, before, after))
    files, order = {}, []
    for name, found in edits.items():
        found.sort(key=lambda edit: edit.change.relpath)
        patch = "".join(edit.diff() for edit in found)
        if not patch:
            continue
        stem = f"{len(order):04d}-{name}"
        modules = {module_of[edit.change.relpath] for edit in found}
        types = sorted({t for module in modules - {shared} for t in model_types.get(module, [])})
        ours = evidence.get("transformers") == version
        measured = evidence.get("patches", {}).get(stem, {}) if ours else {}
        test = evidence.get("tests", {}).get(stem) if ours else None
        if test and "text" in test:
            patch += new_file_diff(test["path"], test["text"])
        files[f"{stem}.patch"] = patch
        files[f"{stem}.md"] = pr_description(name, found, measured, version, types, evidence.get("torch", ""), test)
        order.append(f"{stem}.patch")
    files["series"] = "".join(f"{name}\n" for name in order)
    return files
