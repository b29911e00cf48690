"""What every codemod shares: the `Finding` value, the `Codemod` base class and the export twin.

A codemod is a libcst `Codemod` with a stable `NAME` and a one-line `DESCRIPTION`. It rewrites
only what it can prove equivalent and reports everything else as a `Finding` (a value, never an exception), so the
engine can run it over hundreds of files and summarise. Its analysis helpers live beside it: `_statement_codes`
(the printed code and line numbers of top-level statements), `_walks` (field walks over nodes) and `_candidates`
(lines and qualified names for the statements that hold candidates).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import Codemod as LibcstCodemod

from ._statement_codes import StatementCodes, lines_before_keyword
from ._walks import holds, replace_in_statements, scoped_nodes

# The context scratch key of a modular file's generated modeling sources (see `Codemod.expanded_class`)
EXPANSIONS_KEY = "expansions"

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
        return self.first_line(module, index) + lines_before_keyword(stmt)

    def remember_statement_code(self, module: cst.Module, stmt: cst.CSTNode, code: str) -> None:
        """Gives the engine's `StatementCodes` the code of a top-level statement the codemod printed itself."""
        self.statement_codes().remember(module, stmt, code)

    def expanded_class(self, name: str) -> cst.ClassDef | None:
        """In a `modular_*.py`, the class `name` as transformers' converter expanded it into the generated modeling
        files beside it (the run's `expansions`): what the class holds at run time, inherited `__init__` included.
        None elsewhere, or when no expansion defines it."""
        expansions = self.context.scratch.get(EXPANSIONS_KEY)
        if not expansions:
            return None
        classes = self.context.scratch.get("expanded classes")
        if classes is None:  # parsed once a run, only when a codemod asks
            classes = self.context.scratch["expanded classes"] = {}
            for source in expansions:
                for stmt in cst.parse_module(source).body:
                    if isinstance(stmt, cst.ClassDef):
                        classes.setdefault(stmt.name.value, stmt)
        return classes.get(name)

    def report(self, line: int, kind: str, construct: str, reason: str) -> None:
        """Records a finding on the shared context."""
        findings = self.context.scratch.setdefault("findings", [])
        findings.append(Finding(self.context.filename or "<string>", line, self.NAME, kind, construct, reason))


def formatted_block(statements: list[cst.BaseStatement], depth: int, indent: int) -> cst.IndentedBlock:
    """`statements` as a block, formatted by black as they would be `depth` levels deep."""
    import black  # only when there is something to emit: importing black costs a tenth of a second

    wrapped = cst.Module(body=[cst.If(test=cst.Name("True"), body=cst.IndentedBlock(body=statements))]).code
    line_length = max(LINE_LENGTH - indent * depth + 4, 40)
    # transformers' targets (Python 3.10+): a call exploded one argument per line ends `**kwargs,` as ruff lays it out
    mode = black.Mode(line_length=line_length, target_versions={black.TargetVersion.PY310})
    formatted = black.format_str(wrapped, mode=mode)
    return cst.parse_module(formatted).body[0].body


def eager_arm(statements: list[cst.BaseStatement], depth: int, indent: int) -> list[cst.BaseStatement]:
    """`statements` as the eager arm of an export twin, `depth` levels deep (one more than where they were): as they
    are, but laid out again by black when a line would pass the line length there (`ruff format` would split it)."""
    code = cst.Module(body=[]).code_for_node
    widest = max(len(line) for stmt in statements for line in code(stmt).splitlines())
    if widest + indent * depth <= LINE_LENGTH:
        return statements
    return list(formatted_block(statements, depth, indent).body)


class ModuleHelper:
    """A helper function a codemod adds to a module once, before its first class or function, for the statements it
    rewrites: whether the module holds it already (a second run), or uses its name otherwise (then it is refused)."""

    def __init__(self, tree: cst.Module, name: str, code: str):
        self.name, self.code = name, code
        helpers = [stmt for stmt in tree.body if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name]
        self.present = len(helpers) == 1 and tree.code_for_node(helpers[0]).strip() == code.strip()
        self._tree, self._clashes = tree, None

    def clashes(self) -> bool:
        """Whether the module names the helper otherwise (a walk of it, made once when asked)."""
        if self._clashes is None:

            def named(node: cst.CSTNode) -> bool:
                return type(node) is cst.Name and node.value == self.name

            self._clashes = not self.present and any(holds(stmt, named) for stmt in self._tree.body)
        return self._clashes

    def added_to(self, rewritten: cst.Module) -> cst.Module:
        """`rewritten` (the module with its statements rewritten) with the helper, unless it holds it already."""
        if self.present:
            return rewritten
        # before the first class or function (the rewritten statements are in one of them)
        index = next(
            (i for i, stmt in enumerate(rewritten.body) if isinstance(stmt, (cst.ClassDef, cst.FunctionDef))),
            len(rewritten.body),
        )
        helper = cst.parse_statement(self.code).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        return rewritten.with_changes(body=[*rewritten.body[:index], helper, *rewritten.body[index:]])


# `torch.compiler.is_exporting()`: the test of every export twin
EXPORTING = m.Call(
    func=m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("compiler")), attr=m.Name("is_exporting"))
)
_IMPORT_TORCH = m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"), asname=None)])])


def scoped_outside_export_twins(owner: cst.CSTNode, kinds: tuple[type, ...]) -> list:
    """`scoped_nodes(owner, kinds)` (node, qualname, functions around it), but the eager arm of every export twin in
    `owner` (`if torch.compiler.is_exporting(): ... else: <arm>`, a rewrite's: a second run leaves it alone), the
    arm's block and its statements."""
    found, arms = [], set()
    for node, qualname, functions in scoped_nodes(owner, (cst.If, *kinds)):
        kind = type(node)
        if kind is cst.If and type(node.test) is cst.Call and m.matches(node.test, EXPORTING):
            if isinstance(node.orelse, cst.Else):
                arms.add(id(node.orelse.body))
                arms.update(id(stmt) for stmt in node.orelse.body.body)
        if kind in kinds:
            found.append((node, qualname, functions))
    return [entry for entry in found if id(entry[0]) not in arms]


def shared_module_refusal(module: str | None) -> str | None:
    """The refusal of a rewrite in a shared module (`transformers.` outside `models`), whose classes must stay
    transformers' own; None in a model module or a file outside transformers."""
    if module is not None and module.startswith("transformers.") and not module.startswith("transformers.models."):
        return f"`{module}` is a shared module, whose classes must stay transformers' own"
    return None


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


def replaced_in_statement(stmt: cst.SimpleStatementLine, replacements: dict) -> cst.SimpleStatementLine:
    """`stmt` with each replacement where its original node is (by identity), without its leading lines and its
    trailing comment: the export arm's form of it (the comments stay with the original, in the eager arm)."""
    exported = replace_in_statements(cst.Module(body=[stmt]), replacements, [stmt]).body[0]
    return exported.with_changes(leading_lines=(), trailing_whitespace=cst.TrailingWhitespace())


def statement_twin(
    template: str, stmt: cst.BaseStatement, export: list[cst.BaseStatement], depth: int, indent: int
) -> cst.If:
    """The export twin that replaces the statement `stmt`, `depth` levels deep: `export` laid out by black one level
    deeper as the export arm (its first statement under the template's comment), `stmt` as the eager arm."""
    exported = formatted_block(export, depth + 1, indent).body
    eager = eager_arm([stmt.with_changes(leading_lines=())], depth + 1, indent)
    return export_twin(template, eager, stmt.leading_lines, list(exported))
