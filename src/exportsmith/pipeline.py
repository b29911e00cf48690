"""Runs the codemods over one module's source: source text in, a `Change` out.

Parses once, applies the selected codemods in registry order on the same tree (skipping those whose cheap textual
test says they cannot apply), and collects their findings. The tree stays on the `Change` for rendering. A file
that does not parse gives a `Change` with an error, never an exception, so one bad file cannot stop a run.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import astuple, dataclass, field, replace

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile

from codemods import ALL_CODEMODS, Codemod, Finding
from codemods.base import EXPANSIONS_KEY
from codemods._statement_codes import StatementCodes


@dataclass(frozen=True)
class Change:
    """One module before and after the codemods. `relpath` is its path inside the transformers package."""

    relpath: str
    original: str
    rewritten: str
    findings: tuple[Finding, ...] = ()
    applied: tuple[str, ...] = ()  # names of the codemods that changed the module
    error: str | None = None
    # The text after each codemod of `applied` but the last (after the last it is `rewritten`): the upstream series
    # sends each codemod's change as its own patch
    steps: tuple[str, ...] = ()
    # The parsed rewritten module, so rendering does not parse again; not part of the value
    tree: cst.Module | None = field(default=None, compare=False, repr=False)
    # The printed code of the tree's statements, so vendoring prints only the statements it changes
    codes: StatementCodes | None = field(default=None, compare=False, repr=False)
    # The parsed original, so vendoring a shared module does not parse it again
    original_tree: cst.Module | None = field(default=None, compare=False, repr=False)

    @property
    def changed(self) -> bool:
        return self.rewritten != self.original

    def to_json(self) -> dict:
        """Everything but the original text (which the caller has) and the tree."""
        return {
            "relpath": self.relpath,
            "rewritten": self.rewritten if self.changed else None,
            "findings": [list(astuple(finding)) for finding in self.findings],
            "applied": list(self.applied),
            "error": self.error,
            "steps": list(self.steps),
        }

    @classmethod
    def from_json(cls, data: dict, original: str) -> "Change":
        findings = tuple(Finding(*finding) for finding in data["findings"])
        rewritten = original if data["rewritten"] is None else data["rewritten"]
        return cls(
            data["relpath"], original, rewritten, findings, tuple(data["applied"]), data["error"], tuple(data["steps"])
        )

    def by_codemod(self) -> list[tuple[str, str, str]]:
        """(codemod, text before it, text after it) for each codemod that changed the module, in order."""
        texts = [self.original, *self.steps, self.rewritten]
        return [(name, texts[index], texts[index + 1]) for index, name in enumerate(self.applied)]

    def diff(self, prefix: str = "src/transformers/") -> str:
        """A git-style unified diff against the transformers source tree; empty when nothing changed."""
        return unified_diff(self.original, self.rewritten, prefix + self.relpath)


def unified_diff(before: str, after: str, path: str) -> str:
    """A git-style unified diff of one file at `path`; empty when the texts are equal."""
    if before == after:
        return ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


_TOP_LEVEL_DEFINITION = re.compile(r"^(?:class|def) (\w+)", re.MULTILINE)
# `# Copied from transformers.loss.loss_for_object_detection.box_iou`: a copy whose source no codemod rewrites
_COPIED_FROM_OUTSIDE_MODELS = re.compile(r"#\s*Copied from (transformers\.(?!models\.)[\w.]+)")
OUTSIDE_MODELING_CODE = (
    "not modeling code: transformers' converter puts it in no modeling file (an image processor, a processor, ...), "
    "which nothing exports"
)
COPIED_FROM = "a copy of `{}`, which stays as it is: the copy must stay equal to its source (transformers' check_copies)"


def _left_as_written(stmt: cst.CSTNode, modeling: set[str] | None) -> str | None:
    """Why a top-level class or function keeps its original text whatever the codemods do to it, or None.
    `modeling`: for a modular file, the names its generated modeling files define."""
    if not isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
        return None
    for line in stmt.leading_lines:
        copied = _COPIED_FROM_OUTSIDE_MODELS.search(line.comment.value) if line.comment else None
        if copied:
            return COPIED_FROM.format(copied.group(1))
    if modeling is not None and stmt.name.value not in modeling:
        return OUTSIDE_MODELING_CODE
    return None


def _keep_as_written(
    new: cst.Module, old: cst.Module, findings: list[Finding], codes: StatementCodes, modeling: set[str] | None
) -> tuple[cst.Module, list[Finding]]:
    """`new` with every top-level class or function that must keep its text (`_left_as_written`) as it is in `old`;
    a rewrite reported inside one becomes a refusal with the reason. When no rewrite is left, `old` itself (without
    a helper the codemod added at the top level for the rewrites taken back)."""
    if new is old:
        return new, findings
    before = {}  # name -> (position in `old`, statement, why it keeps its text)
    for position, stmt in enumerate(old.body):
        why = _left_as_written(stmt, modeling)
        if why:
            before[stmt.name.value] = (position, stmt, why)
    body, spans = list(new.body), []
    for index, stmt in enumerate(body):
        if not isinstance(stmt, (cst.ClassDef, cst.FunctionDef)) or stmt.name.value not in before:
            continue
        position, written, why = before[stmt.name.value]
        if written is not stmt:
            body[index] = written
            end = codes.first_line(old, position + 1) if position + 1 < len(old.body) else float("inf")
            spans.append((codes.first_line(old, position), end, why))
    if not spans:
        return new, findings
    kept = []
    for finding in findings:
        reason = next((why for start, end, why in spans if start <= finding.line < end), None)
        if finding.kind == "rewritten" and reason:
            finding = replace(finding, kind="refused", reason=reason)
        kept.append(finding)
    if not any(finding.kind == "rewritten" for finding in kept):
        return old, kept  # every rewrite was taken back: so are the helpers the codemod added for them
    return new.with_changes(body=body), kept


@dataclass
class _Run:
    findings: list[Finding] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    trees: list[cst.Module] = field(default_factory=list)  # the module after each codemod in `applied`


def run_codemods(
    source: str,
    relpath: str,
    module_name: str | None = None,
    codemods: tuple[type[Codemod], ...] = ALL_CODEMODS,
    expansions: tuple[str, ...] = (),
) -> Change:
    """Applies `codemods` in order to `source`. `module_name` (dotted) lets codemods resolve relative imports. For a
    `modular_*.py`, `expansions` are the sources of the modeling files transformers generated from it: a class that
    inherits its `__init__` from another model is read there, so the modular file gets the rewrites its modeling
    file gets (transformers' `check_modular_conversion` compares the two)."""
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        message = str(error).splitlines()[0]
        return Change(relpath, source, source, error=f"does not parse: {message}")
    run = _Run()
    original_tree = tree
    codes = StatementCodes(source, tree)  # the original's statements come from the source text
    # a modular file is rewritten where it defines modeling code only
    modeling = {name for text in expansions for name in _TOP_LEVEL_DEFINITION.findall(text)} if expansions else None
    for codemod in codemods:
        if not codemod.might_apply(source):
            continue
        context = CodemodContext(filename=relpath, full_module_name=module_name)
        context.scratch[StatementCodes.SCRATCH_KEY] = codes
        context.scratch[EXPANSIONS_KEY] = expansions
        try:
            new_tree = codemod(context).transform_module(tree)
        except SkipFile:
            continue
        new_tree, findings = _keep_as_written(new_tree, tree, context.scratch.get("findings", []), codes, modeling)
        run.findings.extend(findings)
        if codes.prints_differently(tree, new_tree):
            run.applied.append(codemod.NAME)
            run.trees.append(new_tree)
        tree = new_tree
    rewritten = codes.module_code(tree) if run.applied else source
    return Change(
        relpath,
        source,
        rewritten,
        tuple(sorted(run.findings)),
        tuple(run.applied),
        steps=tuple(codes.module_code(step) for step in run.trees[:-1]),
        tree=tree,
        codes=codes,
        original_tree=original_tree,
    )
