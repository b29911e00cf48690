"""What every codemod shares: the `Finding` value and the `Codemod` base class.

A codemod is a libcst `VisitorBasedCodemodCommand` with a stable `NAME` and a one-line `DESCRIPTION`. It rewrites
only what it can prove equivalent and reports everything else as a `Finding` (a value, never an exception), so the
engine can run it over hundreds of files and summarise.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.codemod import VisitorBasedCodemodCommand
from libcst.metadata import PositionProvider


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


class Codemod(VisitorBasedCodemodCommand):
    NAME: str = ""
    DESCRIPTION: str = ""
    METADATA_DEPENDENCIES = (PositionProvider,)

    def report(self, node: cst.CSTNode, kind: str, construct: str, reason: str) -> None:
        """Records a finding on the shared context, at the line of `node` (an original, not an updated node)."""
        line = self.get_metadata(PositionProvider, node).start.line
        findings = self.context.scratch.setdefault("findings", [])
        findings.append(Finding(self.context.filename or "<string>", line, self.NAME, kind, construct, reason))
