"""Line numbers and qualified names for the few top-level statements of a module that hold a codemod's candidates."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from ._statement_codes import NodeLineState
from ._walks import holds
from .base import Codemod


def qualified_names(wrapper: MetadataWrapper):
    """node -> the set of its qualified names (`torch.nn.functional.pad`): what libcst's QualifiedNameProvider gives,
    asked of the node's scope (that provider does the same for every node of the module, a visit of its own)."""
    scopes = wrapper.resolve(ScopeProvider)

    def qualified(node: cst.CSTNode) -> set[str]:
        scope = scopes.get(node)
        return {name.name for name in scope.get_qualified_names_for(node)} if scope else set()

    return qualified


class CandidateStatements:
    """Line numbers and qualified names for the nodes of the few top-level statements of `tree` that hold a codemod's
    candidates, paid for those statements alone, not for the whole module:

    - lines (and columns) where libcst's PositionProvider starts each node of `kinds` (but an `IndentedBlock`, which
      the provider starts at its first statement), from one printing of each of `statements`, offset by the line
      where it starts (`Codemod.first_line`: counted in the source where the engine knows it, else printed);
    - qualified names from the scope analysis of a copy of `tree` in which only the bodies of `scopes` (the defs,
      lambdas or other nodes inside `statements` whose names are asked; default: `statements` whole) and of the
      defs and classes around them are kept, every other def's or class's body being `...` (and the def or class
      nothing but its name when its top-level statement has no `:=`). A name in a kept body resolves the same: its
      own and enclosing scopes are kept, a class body is not a scope of its methods, a def's or class's decorators,
      parameters, annotations and bases bind no name but through `:=`, and a body binds a name outside itself only
      through `global` (a statement that has the word keeps all its bodies) or `nonlocal` (in an enclosing def,
      kept whole).

    Each is worked out at the first question, so a codemod that asks none pays nothing. Nodes outside `statements`
    have no line, and nodes outside `scopes` may have no qualified name: ask only of nodes inside them."""

    def __init__(
        self, codemod: Codemod, tree: cst.Module, statements, scopes=None, kinds: tuple[type, ...] = (cst.CSTNode,)
    ):
        self.codemod, self.tree, self.kinds = codemod, tree, kinds
        self.statements = {id(stmt) for stmt in statements}
        self.scopes = {id(node) for node in scopes} if scopes is not None else None
        self._lines: dict[int, int] | None = None
        self._columns: dict[int, int] = {}
        self._qualified = None

    def _print(self) -> None:
        tree, lines = self.tree, {}
        for index, stmt in enumerate(tree.body):
            if id(stmt) not in self.statements:
                continue
            line = self.codemod.first_line(tree, index)  # from the source where the engine knows it, not a print
            state = NodeLineState(
                default_indent=tree.default_indent, default_newline=tree.default_newline, kinds=self.kinds
            )
            stmt._codegen(state)
            code = "".join(state.tokens)
            self.codemod.remember_statement_code(tree, stmt, code)
            lines.update((key, line - 1 + at) for key, at in state.lines.items())
            self._columns.update(state.columns)
        self._lines = lines

    def line(self, node: cst.CSTNode) -> int:
        if self._lines is None:
            self._print()
        return self._lines[id(node)]

    def column(self, node: cst.CSTNode) -> int:
        if self._lines is None:
            self._print()
        return self._columns[id(node)]

    def qualified(self, node: cst.CSTNode) -> set[str]:
        """The set of `node`'s qualified names (`torch.nn.functional.pad`)."""
        if self._qualified is None:
            if self._lines is None:
                self._print()  # prints the kept statements once, for the lines and the test for `global` below
            body = []
            for stmt in self.tree.body:
                if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                    code = self.codemod.statement_code(self.tree, stmt)
                    # Without `:=` in it, a def's or class's decorators, parameters, annotations and bases only read
                    # names: its name alone binds what it binds
                    named_only = ":=" not in code
                    if "global" in code:
                        pass
                    elif id(stmt) not in self.statements:
                        stmt = _elided(stmt, named_only)
                    elif self.scopes is not None:
                        stmt = self._elided_around_scopes(stmt, named_only)
                body.append(stmt)
            elided = self.tree.with_changes(body=body)
            self._qualified = qualified_names(MetadataWrapper(elided, unsafe_skip_copy=True))
        return self._qualified(node)

    def _elided_around_scopes(self, definition: cst.FunctionDef | cst.ClassDef, named_only: bool):
        """`definition` with each def and class in it that holds no scope elided (a def that holds one is kept
        whole: its nested defs may read its names)."""
        scopes = self.scopes
        if id(definition) in scopes:
            return definition
        if not holds(definition, lambda node: id(node) in scopes):
            return _elided(definition, named_only)
        if isinstance(definition, cst.FunctionDef) or not isinstance(definition.body, cst.IndentedBlock):
            return definition
        members = [
            (
                self._elided_around_scopes(member, named_only)
                if isinstance(member, (cst.FunctionDef, cst.ClassDef))
                else member
            )
            for member in definition.body.body
        ]
        return definition.with_changes(body=definition.body.with_changes(body=members))


def _elided(definition: cst.FunctionDef | cst.ClassDef, named_only: bool) -> cst.FunctionDef | cst.ClassDef:
    """`definition` with the body `...`, and nothing but its name when `named_only`."""
    if not named_only:
        return definition.with_changes(body=_ELLIPSIS_BODY)
    if isinstance(definition, cst.FunctionDef):
        return cst.FunctionDef(name=definition.name, params=cst.Parameters(), body=_ELLIPSIS_BODY)
    return cst.ClassDef(name=definition.name, body=_ELLIPSIS_BODY)


_ELLIPSIS_BODY = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Expr(cst.Ellipsis())])])
