"""Runs the codemods over one module's source: source text in, a `Change` out.

Parses once, applies the selected codemods in registry order on the same tree (skipping those whose cheap textual
test says they cannot apply), and collects their findings. The tree stays on the `Change` for rendering. A file
that does not parse gives a `Change` with an error, never an exception, so one bad file cannot stop a run.
"""

from __future__ import annotations

import difflib
from dataclasses import astuple, dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile

from codemods import ALL_CODEMODS, Codemod, Finding
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
        }

    @classmethod
    def from_json(cls, data: dict, original: str) -> "Change":
        findings = tuple(Finding(*finding) for finding in data["findings"])
        rewritten = original if data["rewritten"] is None else data["rewritten"]
        return cls(data["relpath"], original, rewritten, findings, tuple(data["applied"]), data["error"])

    def diff(self, prefix: str = "src/transformers/") -> str:
        """A git-style unified diff against the transformers source tree; empty when nothing changed."""
        if not self.changed:
            return ""
        path = prefix + self.relpath
        lines = difflib.unified_diff(
            self.original.splitlines(keepends=True),
            self.rewritten.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
        return f"diff --git a/{path} b/{path}\n" + "".join(lines)


@dataclass
class _Run:
    findings: list[Finding] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)


def run_codemods(
    source: str,
    relpath: str,
    module_name: str | None = None,
    codemods: tuple[type[Codemod], ...] = ALL_CODEMODS,
) -> Change:
    """Applies `codemods` in order to `source`. `module_name` (dotted) lets codemods resolve relative imports."""
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        message = str(error).splitlines()[0]
        return Change(relpath, source, source, error=f"does not parse: {message}")
    run = _Run()
    original_tree = tree
    codes = StatementCodes(source, tree)  # the original's statements come from the source text
    for codemod in codemods:
        if not codemod.might_apply(source):
            continue
        context = CodemodContext(filename=relpath, full_module_name=module_name)
        context.scratch[StatementCodes.SCRATCH_KEY] = codes
        try:
            new_tree = codemod(context).transform_module(tree)
        except SkipFile:
            continue
        run.findings.extend(context.scratch.get("findings", []))
        if codes.prints_differently(tree, new_tree):
            run.applied.append(codemod.NAME)
        tree = new_tree
    rewritten = codes.module_code(tree) if run.applied else source
    return Change(
        relpath,
        source,
        rewritten,
        tuple(sorted(run.findings)),
        tuple(run.applied),
        tree=tree,
        codes=codes,
        original_tree=original_tree,
    )
