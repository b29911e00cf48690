"""What every codemod shares: the `Finding` value and the `Codemod` base class.

A codemod is a libcst `Codemod` with a stable `NAME` and a one-line `DESCRIPTION`. It rewrites
only what it can prove equivalent and reports everything else as a `Finding` (a value, never an exception), so the
engine can run it over hundreds of files and summarise.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.codemod import Codemod as LibcstCodemod

# transformers' line length (ruff, black): emitted code is laid out to it, so a patch passes its style checks.
LINE_LENGTH = 119


@dataclass(frozen=True, order=True)
class Finding:
    """One thing a codemod noticed: `rewritten` or `refused` (left as it was), with where and why."""

    filename: str
    line: int
    codemod: str
    kind: str
    construct: str
    reason: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}: [{self.codemod}] {self.kind} {self.construct}: {self.reason}"


class Codemod(LibcstCodemod):
    """Base of every codemod. Subclasses implement `transform_module_impl(tree) -> tree` and return `tree` itself
    when they change nothing."""

    NAME: str = ""
    DESCRIPTION: str = ""
    # The shared module (dotted) whose vendored rewrite depends on this codemod accepting the model module: a model
    # module where it refuses something keeps importing transformers' own copy of that module
    SHARED_MODULE: str | None = None

    @classmethod
    def might_apply(cls, source: str) -> bool:
        """A cheap textual test: False only when the codemod cannot change `source`, so the engine skips it."""
        return True

    def transform_module(self, tree: cst.Module) -> cst.Module:
        # No codemod declares metadata dependencies, so skip libcst's defensive deep copy of the whole tree
        return self.transform_module_impl(tree)

    def report(self, line: int, kind: str, construct: str, reason: str) -> None:
        """Records a finding on the shared context."""
        findings = self.context.scratch.setdefault("findings", [])
        findings.append(Finding(self.context.filename or "<string>", line, self.NAME, kind, construct, reason))


def top_level_lines(module: cst.Module) -> dict[int, int]:
    """id(statement) -> the 1-based line of its first token (after decorators: the `def`/`class` line), for the
    module's top-level statements. Cheaper than resolving position metadata over the whole tree."""
    lines = {}
    line = 1 + len(module.header)
    for stmt in module.body:
        start = line + len(stmt.leading_lines)
        if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
            start += sum(1 + len(d.leading_lines) for d in stmt.decorators) + len(stmt.lines_after_decorators)
        lines[id(stmt)] = start
        line += module.code_for_node(stmt).count("\n")
    return lines
