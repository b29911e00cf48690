"""What every codemod shares: the `Finding` value and the `Codemod` base class.

A codemod is a libcst `Codemod` with a stable `NAME` and a one-line `DESCRIPTION`. It rewrites
only what it can prove equivalent and reports everything else as a `Finding` (a value, never an exception), so the
engine can run it over hundreds of files and summarise.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field, fields

import libcst as cst
import libcst.matchers as m
from libcst._nodes.internal import CodegenState
from libcst.codemod import Codemod as LibcstCodemod
from libcst.metadata import MetadataWrapper, ScopeProvider

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

    def statement_codes(self) -> "StatementCodes":
        """The engine's `StatementCodes` when it shares one (so a statement printed here is not printed again, and
        statements the engine knows in the source are not printed at all), else one of this run's own."""
        codes = self.context.scratch.get(StatementCodes.SCRATCH_KEY)
        if codes is None:
            codes = self.context.scratch[StatementCodes.SCRATCH_KEY] = StatementCodes()
        return codes

    def statement_code(self, module: cst.Module, stmt: cst.CSTNode) -> str:
        """`module.code_for_node(stmt)` for a top-level statement, printed once."""
        return self.statement_codes().code(module, stmt)

    def first_line(self, module: cst.Module, index: int) -> int:
        """The line where the code of top-level statement `module.body[index]` starts (leading lines included)."""
        return self.statement_codes().first_line(module, index)

    def top_level_line(self, module: cst.Module, stmt: cst.CSTNode) -> int:
        """The line of a top-level statement's first token (after decorators: the `def`/`class` line), as
        `top_level_lines` gives it, without printing the statements before it where the engine knows the source."""
        index = next(index for index, other in enumerate(module.body) if other is stmt)
        return self.first_line(module, index) + _lines_before_keyword(stmt)

    def remember_statement_code(self, module: cst.Module, stmt: cst.CSTNode, code: str) -> None:
        """Gives the engine's `StatementCodes` the code of a top-level statement the codemod printed itself."""
        self.statement_codes().remember(module, stmt, code)

    def report(self, line: int, kind: str, construct: str, reason: str) -> None:
        """Records a finding on the shared context."""
        findings = self.context.scratch.setdefault("findings", [])
        findings.append(Finding(self.context.filename or "<string>", line, self.NAME, kind, construct, reason))


def _lines_code(module: cst.Module, lines) -> str:
    """The code of a module's header or footer lines, from one printing."""
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    for line in lines:
        line._codegen(state)
    return "".join(state.tokens)


def _prints_as_its_parts(module: cst.Module) -> bool:
    """Whether `module.code` is the codes of its header, statements and footer joined: the printer treats a module
    without a trailing newline, and an empty one, specially at the end."""
    return module.has_trailing_newline and bool(module.header or module.body or module.footer)


class StatementCodes:
    """The printed code of top-level statements, by identity, for one module run: the codemods (line numbers), the
    engine (did a codemod change the text, the rewritten text) and the vendoring all need it, and printing is a cost
    of the order of parsing, so each statement object is printed once. Codemods rebuild only the statements they
    change; the others stay the same objects from tree to tree.

    Given the `source` that `original` was parsed from, the statements of `original` need no printing at all where
    their place in the source is known: a parsed module prints back to its source byte for byte (header, statements,
    footer in turn), so a run of consecutive original statements is the source between where the first starts and
    the last ends. Those offsets come from the ends of the module, from statements printed anyway (a codemod's
    candidates: a text found once at a line start is where that statement is) and from adding up the lengths of
    printed neighbours; a run whose ends stay unknown is printed, statement by statement, as without a source."""

    SCRATCH_KEY = "statement_codes"

    def __init__(self, source: str | None = None, original: cst.Module | None = None) -> None:
        # The statement is kept alive with its code, so its id cannot be reused by another object
        self._codes: dict[tuple[int, str, str], tuple[cst.CSTNode, str]] = {}
        self._source = source
        self._original = original
        # original statement k -> the offset in `source` where its code starts (len(body): where the footer starts)
        self._starts: dict[int, int] = {}
        self._searched: set[int] = set()  # original statements whose printed code was looked for in the source
        self._index: dict[int, int] = {}
        self._frame = ("", "")  # the original's header and footer code
        if source is not None and original is not None and _prints_as_its_parts(original):
            header, footer = _lines_code(original, original.header), _lines_code(original, original.footer)
            if source.startswith(header) and source.endswith(footer) and len(header) + len(footer) <= len(source):
                self._starts = {0: len(header), len(original.body): len(source) - len(footer)}
                self._index = {id(stmt): k for k, stmt in enumerate(original.body)}
                self._frame = (header, footer)
        if not self._index:
            self._source = self._original = None  # no slicing: every statement is printed

    def code(self, module: cst.Module, stmt: cst.CSTNode) -> str:
        key = (id(stmt), module.default_indent, module.default_newline)
        entry = self._codes.get(key)
        if entry is None or entry[0] is not stmt:
            entry = self._codes[key] = (stmt, module.code_for_node(stmt))
        return entry[1]

    def remember(self, module: cst.Module, stmt: cst.CSTNode, code: str) -> None:
        """Records `code`, which must be `module.code_for_node(stmt)`, printed by other means."""
        self._codes[(id(stmt), module.default_indent, module.default_newline)] = (stmt, code)

    def module_code(self, module: cst.Module) -> str:
        """`module.code`, from the statements' codes: a module prints as its header, statements and footer in turn
        (each top-level statement starts at indentation zero, so printing one alone gives the same text)."""
        if not _prints_as_its_parts(module):
            return module.code  # the printer's special cases at the end of the file
        original = self._original
        same = original is not None and (module.default_indent, module.default_newline) == (
            original.default_indent,
            original.default_newline,
        )
        parts = [self._frame[0] if same and module.header is original.header else _lines_code(module, module.header)]
        pieces = self._pieces(module, len(module.body))
        if pieces is None:
            parts += [self.code(module, stmt) for stmt in module.body]
        else:
            source = self._source
            parts += [source[piece[0] : piece[1]] if type(piece) is tuple else piece for piece in pieces]
        parts.append(
            self._frame[1] if same and module.footer is original.footer else _lines_code(module, module.footer)
        )
        return "".join(parts)

    def first_line(self, module: cst.Module, index: int) -> int:
        """The 1-based line where the code of `module.body[index]` starts (its leading blank lines and comments
        included) in `module.code`: the statements before it printed, or their lines counted in the source."""
        pieces = self._pieces(module, index)
        if pieces is None:
            pieces = [self.code(module, stmt) for stmt in module.body[:index]]
        source = self._source
        return (
            1
            + len(module.header)
            + sum(source.count("\n", *piece) if type(piece) is tuple else piece.count("\n") for piece in pieces)
        )

    def _pieces(self, module: cst.Module, stop: int) -> list[str | tuple[int, int]] | None:
        """The codes of `module.body[:stop]`: printed texts, and (start, end) spans of the source for the runs of
        original statements whose ends are known. None without a source to take them from."""
        original = self._original
        if (
            original is None
            or module.default_indent != original.default_indent
            or module.default_newline != original.default_newline
        ):
            return None
        body, pieces, index = module.body, [], 0
        while index < stop:
            first = self._original_index(body[index])
            if first is None:
                pieces.append(self.code(module, body[index]))
                index += 1
                continue
            end = index + 1
            while end < stop and self._original_index(body[end]) == first + end - index:
                end += 1
            after = first + end - index  # the original statement after the run
            # Printing a neighbour outside the run first: a statement a codemod replaced was usually printed already
            start_offset = self._offset(first, (first - 1, first))
            end_offset = self._offset(after, (after, after - 1)) if start_offset is not None else None
            if end_offset is None:
                pieces += [self.code(module, stmt) for stmt in body[index:end]]
            else:
                pieces.append((start_offset, end_offset))
            index = end
        return pieces

    def _original_index(self, stmt: cst.CSTNode) -> int | None:
        index = self._index.get(id(stmt))
        return index if index is not None and self._original.body[index] is stmt else None

    def _original_code(self, index: int) -> str | None:
        """The code of original statement `index` if it was printed."""
        original = self._original
        stmt = original.body[index]
        entry = self._codes.get((id(stmt), original.default_indent, original.default_newline))
        return entry[1] if entry is not None and entry[0] is stmt else None

    def _offset(self, index: int, printable: tuple[int, int]) -> int | None:
        """Where original statement `index` starts in the source; when nothing printed so far tells, the original
        statements `printable` are printed, in turn, until one does."""
        found = self._start(index)
        for other in printable:
            if found is not None:
                break
            if 0 <= other < len(self._original.body):
                self.code(self._original, self._original.body[other])
                found = self._start(index)
        return found

    def _start(self, index: int) -> int | None:
        starts = self._starts
        if index in starts:
            return starts[index]
        count = len(self._original.body)
        for near in (index, index - 1):
            if 0 <= near < count:
                self._locate(near)
        if index in starts:
            return starts[index]
        # From the nearest known offset, over printed statements only
        total, other = 0, index
        while other > 0:
            code = self._original_code(other - 1)
            if code is None:
                break
            other, total = other - 1, total + len(code)
            self._locate(other)
            if other in starts:
                starts[index] = starts[other] + total
                return starts[index]
        total, other = 0, index
        while other < count:
            code = self._original_code(other)
            if code is None:
                break
            self._locate(other)
            other, total = other + 1, total + len(code)
            if other in starts:
                starts[index] = starts[other] - total
                return starts[index]
        return None

    def _locate(self, index: int) -> None:
        """Places original statement `index` by its printed code, when that occurs at exactly one line start of the
        source (every statement starts at one: the code before it ends with a newline)."""
        if index in self._searched:
            return
        code = self._original_code(index)
        if code is None:
            return
        self._searched.add(index)
        source, found = self._source, None
        position = source.find(code)
        while position != -1:
            if position == 0 or source[position - 1] in "\r\n":
                if found is not None:
                    return  # more than one place
                found = position
            position = source.find(code, position + 1)
        if found is not None:
            self._starts[index] = found
            self._starts[index + 1] = found + len(code)

    def prints_differently(self, old: cst.Module, new: cst.Module) -> bool:
        """`old.code != new.code`, printing only the statements between the longest runs of identical statement
        objects at both ends (equal text before and after cancels out of the comparison)."""
        if new is old:
            return False
        same_frame = (
            old.header is new.header
            and old.footer is new.footer
            and (old.default_indent, old.default_newline, old.has_trailing_newline)
            == (new.default_indent, new.default_newline, new.has_trailing_newline)
        )
        if not same_frame:
            return self.module_code(old) != self.module_code(new)
        start, old_end, new_end = 0, len(old.body), len(new.body)
        while start < min(old_end, new_end) and old.body[start] is new.body[start]:
            start += 1
        while old_end > start and new_end > start and old.body[old_end - 1] is new.body[new_end - 1]:
            old_end, new_end = old_end - 1, new_end - 1
        old_middle = "".join(self.code(old, stmt) for stmt in old.body[start:old_end])
        return old_middle != "".join(self.code(new, stmt) for stmt in new.body[start:new_end])


# What libcst's PositionProvider counts as a line break
_NEWLINE = re.compile(r"\r\n?|\n")


@dataclass
class _NodeLineState(CodegenState):
    """A plain code generation that notes the line and column where each node of `kinds` starts as it prints it:
    where libcst's PositionProvider starts the node, without that provider's bookkeeping at every node."""

    kinds: tuple[type, ...] = ()
    lines: dict[int, int] = field(default_factory=dict)  # id(node) -> 1-based line in the printed code
    columns: dict[int, int] = field(default_factory=dict)  # id(node) -> 0-based column, as PositionProvider's
    _line: int = 1
    _column: int = 0
    _counted: int = 0  # tokens already counted into `_line` and `_column`

    def before_codegen(self, node) -> None:
        # PositionProvider starts a node that records no syntactic position (a parameter, an argument) here
        if isinstance(node, self.kinds):
            self._note(node)

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        if isinstance(node, self.kinds):
            self._note(node)
        return contextlib.nullcontext()

    def _note(self, node) -> None:
        for token in self.tokens[self._counted :]:
            if "\n" in token or "\r" in token:
                segments = _NEWLINE.split(token)
                self._line += len(segments) - 1
                self._column = len(segments[-1])
            else:
                self._column += len(token)
        self._counted = len(self.tokens)
        self.lines[id(node)] = self._line
        self.columns[id(node)] = self._column


def statement_node_lines(module: cst.Module, stmt: cst.CSTNode, kinds: tuple[type, ...]) -> tuple[str, dict[int, int]]:
    """The code of a top-level statement of `module` (`module.code_for_node(stmt)`) and id(node) -> the line (1 for
    the statement's first line, leading blank lines and comments included) where each node of `kinds` in it starts,
    from one printing."""
    state = _NodeLineState(default_indent=module.default_indent, default_newline=module.default_newline, kinds=kinds)
    stmt._codegen(state)
    return "".join(state.tokens), state.lines


def top_level_lines(module: cst.Module, code=None) -> dict[int, int]:
    """id(statement) -> the 1-based line of its first token (after decorators: the `def`/`class` line), for the
    module's top-level statements. Cheaper than resolving position metadata over the whole tree. `code` prints a
    statement (default `module.code_for_node`; `Codemod.statement_code` shares the engine's printing)."""
    code = code if code is not None else module.code_for_node
    lines = {}
    line = 1 + len(module.header)
    for stmt in module.body:
        lines[id(stmt)] = line + _lines_before_keyword(stmt)
        line += code(stmt).count("\n")
    return lines


def _lines_before_keyword(stmt: cst.CSTNode) -> int:
    """The lines of a top-level statement's code before its first token (after decorators: the `def`/`class`)."""
    lines = len(stmt.leading_lines)
    if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
        lines += sum(1 + len(d.leading_lines) for d in stmt.decorators) + len(stmt.lines_after_decorators)
    return lines


# `torch.compiler.is_exporting()`: the test of every export twin
EXPORTING = m.Call(
    func=m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("compiler")), attr=m.Name("is_exporting"))
)
_IMPORT_TORCH = m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"), asname=None)])])


def imports_torch(module: cst.Module) -> bool:
    """Whether `import torch` binds `torch` at the top of the module (also inside a top-level `if` or `try`): the
    name every export form calls."""
    for stmt in module.body:
        inner = stmt.body.body if isinstance(stmt, (cst.If, cst.Try)) else (stmt,)
        if any(m.matches(line, _IMPORT_TORCH) for line in inner):
            return True
    return False


def export_twin(
    template: str,
    eager: cst.If | list[cst.BaseStatement],
    leading_lines,
    export: list[cst.BaseStatement] | None = None,
) -> cst.If:
    """The one shape of an export twin: `if torch.compiler.is_exporting()...:` the export form, `else:` the original
    statements (or `elif` the original `if`), so eager runs the original code unchanged. `template` is the `if`, with
    `else: pass` unless `eager` is an `if`; `export`, when given, replaces the template's body (its first statement
    keeps the template's comments). The twin takes the `leading_lines` of what it replaces."""
    choice = cst.parse_statement(template)
    if export is not None:
        first, *rest = export
        body = [first.with_changes(leading_lines=choice.body.body[0].leading_lines), *rest]
        choice = choice.with_changes(body=choice.body.with_changes(body=body))
    if isinstance(eager, cst.If):
        return choice.with_changes(leading_lines=leading_lines, orelse=eager.with_changes(leading_lines=()))
    first, *rest = eager
    block = choice.orelse.body.with_changes(body=[first.with_changes(leading_lines=()), *rest])
    return choice.with_changes(leading_lines=leading_lines, orelse=choice.orelse.with_changes(body=block))


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
            state = _NodeLineState(
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


def nodes_in(node: cst.CSTNode, wanted) -> list[cst.CSTNode]:
    """The nodes in `node` (itself included) that `wanted(node)` accepts, from a walk of the fields (see
    `child_nodes`), several times cheaper than a matcher search; not in source order."""
    found, pending = [], [node]
    while pending:
        node = pending.pop()
        if wanted(node):
            found.append(node)
        pending.extend(child_nodes(node))
    return found


def holds(node: cst.CSTNode, found) -> bool:
    """Whether `node` or a node inside it is one that `found(node)` accepts: a walk of the fields (see
    `child_nodes`), several times cheaper than a visitor or a matcher search."""
    pending = [node]
    while pending:
        node = pending.pop()
        if found(node):
            return True
        pending.extend(child_nodes(node))
    return False


def candidates_in_statements(tree: cst.Module, test, find) -> tuple[list, dict]:
    """The candidates `find(statement)` gives (tuples whose first item is the candidate node) in the top-level
    statements of `tree` that `holds` a node `test` accepts, and candidate node -> the statement holding it."""
    candidates, owners = [], {}
    for owner in tree.body:
        if holds(owner, test):
            for found in find(owner):
                candidates.append(found)
                owners[found[0]] = owner
    return candidates, owners


class ReplaceNodes(cst.CSTTransformer):
    """Puts each replacement where its original node is (by identity)."""

    def __init__(self, replacements: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.replacements = replacements

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        replacement = self.replacements.get(original_node)
        return replacement if replacement is not None else super().on_leave(original_node, updated_node)


def replace_in_statements(tree: cst.Module, replacements: dict[cst.CSTNode, cst.CSTNode], statements) -> cst.Module:
    """`tree` with each replacement where its original node is (by identity). Only `statements` (the top-level
    statements that hold the originals) are walked, and only the nodes on the way down to an original are rebuilt:
    the others stay the same objects (the engine prints an unchanged top-level statement once), without a
    transformer's visit, which rebuilds every node."""
    if not replacements:
        return tree
    new_of = {id(original): new for original, new in replacements.items()}
    rebuilt = {id(stmt) for stmt in statements}
    return tree.with_changes(body=[_rebuilt(stmt, new_of) if id(stmt) in rebuilt else stmt for stmt in tree.body])


def _rebuilt(node: cst.CSTNode, new_of: dict[int, cst.CSTNode]) -> cst.CSTNode:
    new = new_of.get(id(node))
    if new is not None:
        return new
    changes = {}
    for name in _child_fields(node):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            items = [_rebuilt(item, new_of) if descends(type(item)) else item for item in value]
            if any(item is not old for item, old in zip(items, value)):
                changes[name] = items
        elif descends(kind):
            item = _rebuilt(value, new_of)
            if item is not value:
                changes[name] = item
    return node.with_changes(**changes) if changes else node


def scoped_nodes(node: cst.CSTNode, kinds: tuple[type, ...]) -> list[tuple[cst.CSTNode, str, tuple]]:
    """(found, qualname, functions) for each node of exactly one of `kinds` in `node` (itself included): `qualname`
    the names of the classes and defs around it in `node` joined (`Class.method`), `functions` the defs around it,
    innermost last. A walk of the fields (several times cheaper than a visitor); not in source order."""
    found = []
    pending = [(node, (), ())]
    while pending:
        node, scopes, functions = pending.pop()
        kind = type(node)
        if kind in kinds:
            found.append((node, ".".join(scopes), functions))
        if kind is cst.ClassDef:
            scopes = (*scopes, node.name.value)
        elif kind is cst.FunctionDef:
            scopes, functions = (*scopes, node.name.value), (*functions, node)
        pending.extend((child, scopes, functions) for child in child_nodes(node))
    return found


# Nodes that hold only whitespace, comments and punctuation: searches for statements and expressions skip them
_TOKENS = (
    cst.BaseParenthesizableWhitespace,
    cst.EmptyLine,
    cst.TrailingWhitespace,
    cst.Newline,
    cst.Comment,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Comma,
    cst.Semicolon,
    cst.Dot,
    cst.Colon,
    cst.AssignEqual,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
# type -> whether its instances are nodes to descend into (not tokens). libcst's base classes are ABCs, whose
# isinstance checks cost more than the walk; a dict lookup by exact type does not.
_DESCEND: dict[type, bool] = {}


def descends(kind: type) -> bool:
    found = _DESCEND.get(kind)
    if found is None:
        found = _DESCEND[kind] = issubclass(kind, cst.CSTNode) and not issubclass(kind, _TOKENS)
    return found


# Nodes whose fields hold only a value and parentheses, the most frequent nodes of a module (names above all)
_LEAVES = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis})


def _child_fields(node: cst.CSTNode) -> tuple[str, ...]:
    names = _CHILD_FIELDS.get(type(node))
    if names is None:
        names = _CHILD_FIELDS[type(node)] = tuple(f.name for f in fields(node))
    return names


def child_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of `node` but tokens, read from its fields: what a libcst visitor would descend into, without
    the visitor's dispatch at every node (several times the cost). Order is field order, not always source order:
    for searches whose answer is a set."""
    if type(node) in _LEAVES:
        return []
    found = []
    for name in _child_fields(node):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            found.extend(item for item in value if descends(type(item)))
        elif descends(kind):
            found.append(value)
    return found


def _suites(node: cst.CSTNode) -> list:
    kind = type(node)
    if kind is cst.If or kind is cst.For or kind is cst.While:
        return [node.body, node.orelse]
    if kind is cst.Try or kind is cst.TryStar:
        return [node.body, *node.handlers, node.orelse, node.finalbody]
    if kind is cst.Match:
        return list(node.cases)
    return [node.body]


# type -> how to find the statements inside its instances (see `statement_children`)
_STATEMENT_CHILDREN: dict[type, object] = {}


def statement_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The statements, blocks and small statements directly inside `node`, in source order: all a search for
    statements (an `if`, an assignment, a `def`) needs to descend into. Expressions, parameters, decorators and the
    other fields hold no statement, and skipping them makes the search several times cheaper than `child_nodes`."""
    kind = type(node)
    how = _STATEMENT_CHILDREN.get(kind)
    if how is None:
        if issubclass(kind, (cst.IndentedBlock, cst.SimpleStatementSuite, cst.SimpleStatementLine)):
            how = "body"
        elif issubclass(kind, cst.BaseSmallStatement):
            how = "none"
        elif issubclass(
            kind,
            (
                cst.ClassDef,
                cst.FunctionDef,
                cst.With,
                cst.For,
                cst.While,
                cst.If,
                cst.Try,
                cst.TryStar,
                cst.Else,
                cst.Finally,
                cst.ExceptHandler,
                cst.ExceptStarHandler,
                cst.Match,
                cst.MatchCase,
            ),
        ):
            how = "suites"
        else:
            how = "fields"  # anything else: every child node, as `child_nodes` gives them
        _STATEMENT_CHILDREN[kind] = how
    if how == "body":
        return list(node.body)
    if how == "none":
        return []
    if how == "suites":
        return [suite for suite in _suites(node) if suite is not None]
    return child_nodes(node)


def walk_statements(node: cst.CSTNode):
    """`node` and every statement, block and small statement inside it (nested defs included), in source order: what
    `m.findall` of a statement or small statement matcher visits, without a visitor's dispatch at every node."""
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(reversed(statement_children(current)))


def name_values(node: cst.CSTNode) -> set[str]:
    """The values of every `Name` node in `node` (attribute names included), as `m.findall(node, m.Name())` finds
    them, from a walk of the fields."""
    values, pending = set(), [node]
    while pending:
        current = pending.pop()
        if type(current) is cst.Name:
            values.add(current.value)
        else:
            pending.extend(child_nodes(current))
    return values
