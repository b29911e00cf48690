"""Runs the codemods over one module's source: source text in, a `Change` out.

Parses once, applies the selected codemods in registry order on the same tree, and collects their findings. A file
that does not parse gives a `Change` with an error, never an exception, so one bad file cannot stop a run.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile

from codemods import ALL_CODEMODS, Codemod, Finding


@dataclass(frozen=True)
class Change:
    """One module before and after the codemods. `relpath` is its path inside the transformers package."""

    relpath: str
    original: str
    rewritten: str
    findings: tuple[Finding, ...] = ()
    applied: tuple[str, ...] = ()  # names of the codemods that changed the module
    error: str | None = None

    @property
    def changed(self) -> bool:
        return self.rewritten != self.original

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
    for codemod in codemods:
        context = CodemodContext(filename=relpath, full_module_name=module_name)
        try:
            new_tree = codemod(context).transform_module(tree)
        except SkipFile:
            continue
        run.findings.extend(context.scratch.get("findings", []))
        if new_tree is not tree and new_tree.code != tree.code:
            run.applied.append(codemod.NAME)
        tree = new_tree
    return Change(relpath, source, tree.code, tuple(sorted(run.findings)), tuple(run.applied))
