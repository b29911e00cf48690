"""Renders `Change`s as an upstream patch series: numbered git patches, each with a PR description beside it.

The series is the shared modules first, then one patch per model that has a change, in module order. Each file of
transformers belongs to exactly one patch (a shared module to the first, a model's files to its own), so the series
applies in order without conflicts. The PR text says what changed and why, which files are sources and which are
generated from a `modular_*.py` (regenerate those with transformers' `utils/modular_model_converter.py`), the
rewritten locations, and, where `exportsmith verify --record` left a record, the export error of the original model
quoted from that run and how the rewrite was verified.
"""

from __future__ import annotations

import re

from codemods import ALL_CODEMODS

from .pipeline import Change

_GENERATED_FROM = re.compile(r"This file was automatically generated from (src/transformers/\S+?\.py)")
_DESCRIPTIONS = {codemod.NAME: codemod.DESCRIPTION for codemod in ALL_CODEMODS}


def generated_from(change: Change) -> str | None:
    """The modular source a modeling file is generated from, per its own header."""
    match = _GENERATED_FROM.search(change.original[:4000])
    return match.group(1) if match else None


def patch_text(changes: tuple[Change, ...]) -> str:
    return "".join(change.diff() for change in sorted(changes, key=lambda change: change.relpath))


def pr_description(title: str, changes: tuple[Change, ...], records: dict[str, dict], version: str) -> str:
    """Markdown for one patch. `records` maps model types to their `VERIFY.json` content."""
    changed = [change for change in changes if change.changed]
    applied = sorted({name for change in changed for name in change.applied})
    lines = [f"# torch.export support: {title}\n"]
    lines.append(f"Against transformers {version}; produced by exportsmith (`exportsmith diff`).\n")
    lines.append("## What changed and why\n")
    for name in applied:
        lines.append(f"- `{name}`: {_DESCRIPTIONS.get(name, '')}")
    lines.append("\n## Files\n")
    lines.append("| file | kind |")
    lines.append("|---|---|")
    changed_paths = {f"src/transformers/{change.relpath}" for change in changed}
    for change in sorted(changed, key=lambda change: change.relpath):
        source = generated_from(change)
        if source:
            kind = f"generated from `{source}`: keep it in sync with `python utils/modular_model_converter.py`"
            if source not in changed_paths:
                kind += "; the rewritten classes come into it from another model's modular file, by the converter"
        elif "/modular_" in change.relpath:
            kind = "source (modular file)"
        else:
            kind = "source"
        lines.append(f"| `src/transformers/{change.relpath}` | {kind} |")
    lines.append("\n## Rewritten locations\n")
    for change in sorted(changed, key=lambda change: change.relpath):
        for finding in change.findings:
            if finding.kind == "rewritten":
                lines.append(
                    f"- `src/transformers/{change.relpath}:{finding.line}` {finding.construct}: {finding.reason}"
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
    """File name -> text: `NNNN-<group>.patch` and `.md` for every group with a change, and `series` (their order).

    `groups` is `Rendered.groups` (the shared modules first); `model_types` maps a module to its model types, whose
    records go into its PR text (the shared patch gets every record: it is what the models need)."""
    files = {}
    order = []
    for group, changes in groups.items():
        patch = patch_text(changes)
        if not patch:
            continue
        stem = f"{len(order):04d}-{group.strip('_')}"
        shared = group == next(iter(groups))
        title = "shared modules" if shared else group
        relevant = records if shared else {t: records[t] for t in model_types.get(group, []) if t in records}
        files[f"{stem}.patch"] = patch
        files[f"{stem}.md"] = pr_description(title, changes, relevant, version)
        order.append(f"{stem}.patch")
    files["series"] = "".join(f"{name}\n" for name in order)
    return files
