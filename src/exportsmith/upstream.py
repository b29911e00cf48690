"""Renders `Change`s as an upstream patch series: one patch per mechanism (codemod), each with a PR description.

A reviewer reads one mechanism at a time: the series has a patch per codemod that changed something, in pipeline
order, holding that codemod's change to every file (shared modules and models alike); each applies on top of the ones
before it (a file two codemods change is in both patches, as the first left it and as the second changes it). The PR
text says what changed and why, which models it serves, which files are sources and which are generated from a
`modular_*.py` (regenerate those with transformers' `utils/modular_model_converter.py`), the rewritten locations,
and, where `exportsmith verify --record` left a record, the export error of the original model quoted from that run
and how the rewrite was verified.
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
    codemod: str, edits: list[Edit], records: dict[str, dict], version: str, model_types: list[str]
) -> str:
    """Markdown for the patch of one codemod. `records` maps model types to their `VERIFY.json` content."""
    lines = [f"# torch.export support: `{codemod}`\n"]
    lines.append(
        f"Against transformers {version}; produced by exportsmith (`exportsmith diff`). One mechanism: every change "
        "this rewrite makes, applied on top of the patches before it in `series`.\n"
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
    lines.append("\n## The error this removes, and verification\n")
    if not records:
        lines.append("No verification record: run `exportsmith verify --record MODEL` and regenerate this text.")
    for model_type, record in sorted(records.items()):
        lines.append(f"### {model_type}\n")
        error = record.get("original_export_error")
        if error:
            lines.append("Exporting the original model (decode step with a `DynamicCache`) fails today with:\n")
            lines.append(f"```\n{error}\n```\n")
        else:
            lines.append("The original model exports without this patch.\n")
        lines.append(_verification(record))
    return "\n".join(lines).rstrip("\n") + "\n"


def _verification(record: dict) -> str:
    cases = record.get("cases", [])
    head = (
        f"With the patch, on transformers {record.get('transformers')} and torch {record.get('torch')}: "
        f"{'verified' if record.get('ok') else 'NOT verified: ' + str(record.get('failure'))}. The copy is "
        f"{'bit-identical' if record.get('eager_identical') else 'not identical'} to the original in eager; "
        "exported with dynamic batch, new-token and past dims (non-strict), then run at other shapes:\n"
    )
    rows = ["| program | case | batch | new tokens | past | max abs diff vs eager |", "|---|---|---|---|---|---|"]
    for case in cases:
        result = f"{case['max_diff']:.3g}" if case.get("max_diff") is not None else f"error: {case.get('error')}"
        rows.append(
            f"| {case['program']} | {case['name']} | {case['batch']} | {case['new_tokens']} | {case['past']} | "
            f"{result} |"
        )
    return head + "\n" + "\n".join(rows) + "\n"


def patch_series(
    groups: dict[str, tuple[Change, ...]], records: dict[str, dict], model_types: dict[str, list[str]], version: str
) -> dict[str, str]:
    """File name -> text: `NNNN-<codemod>.patch` and `.md` for every codemod that changed something, and `series`
    (their order, the pipeline's).

    `groups` is `Rendered.upstream` (the shared modules first); `model_types` maps a module to its model types, whose
    records go into the PR text of each codemod that edits the module's files (a codemod that edits a shared module
    gets every record: every model uses it)."""
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
        relevant = records if shared in modules else {t: records[t] for t in types if t in records}
        files[f"{stem}.patch"] = patch
        files[f"{stem}.md"] = pr_description(name, found, relevant, version, types)
        order.append(f"{stem}.patch")
    files["series"] = "".join(f"{name}\n" for name in order)
    return files
