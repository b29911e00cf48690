"""The printed code of a module's top-level statements, printed once and shared by the codemods and the engine, and
the line numbers of nodes from printing only the statements that hold them (cheaper than position metadata over a
whole module)."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState


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
class NodeLineState(CodegenState):
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
    state = NodeLineState(default_indent=module.default_indent, default_newline=module.default_newline, kinds=kinds)
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
        lines[id(stmt)] = line + lines_before_keyword(stmt)
        line += code(stmt).count("\n")
    return lines


def lines_before_keyword(stmt: cst.CSTNode) -> int:
    """The lines of a top-level statement's code before its first token (after decorators: the `def`/`class`)."""
    lines = len(stmt.leading_lines)
    if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
        lines += sum(1 + len(d.leading_lines) for d in stmt.decorators) + len(stmt.lines_after_decorators)
    return lines
