"""`StatementCodes` prints a module as libcst does and tells a changed module from an unchanged one as a comparison
of the whole printed text would."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from codemods._statement_codes import StatementCodes

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*/*.py"))
SOURCE = (
    "# header\n\nimport torch\n\n\nclass A:\n    x = 1\n\n    # trailing comment of A\n\n\ndef f():\n    return 2\n"
)


@pytest.mark.parametrize("path", FIXTURES[:12], ids=lambda path: f"{path.parent.name}/{path.name}")
def test_module_code_is_the_printed_module(path):
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    assert StatementCodes().module_code(module) == module.code


@pytest.mark.parametrize("source", ["", "\n", "x = 1", "# only a comment", "x = 1\r\ny = 2\r\n", "if x:\n\ty = 1\n"])
def test_module_code_at_the_printer_special_cases(source):
    module = cst.parse_module(source)
    assert StatementCodes().module_code(module) == module.code == source


def test_rebuilt_statements_with_the_same_text_are_not_a_change():
    module = cst.parse_module(SOURCE)
    rebuilt = module.with_changes(body=[stmt.with_changes() for stmt in module.body])
    assert rebuilt.body[1] is not module.body[1]
    assert not StatementCodes().prints_differently(module, rebuilt)


def test_a_changed_statement_is_a_change():
    module = cst.parse_module(SOURCE)
    function = module.body[2]
    changed = module.with_changes(body=[*module.body[:2], function.with_changes(name=cst.Name("g"))])
    assert StatementCodes().prints_differently(module, changed)
    added = module.with_changes(body=[*module.body, cst.parse_statement("y = 3\n")])
    assert StatementCodes().prints_differently(module, added)
    assert StatementCodes().prints_differently(module, module.with_changes(header=[]))


def test_text_moved_between_statements_compares_as_the_whole_text():
    # The comment leaves class A's footer for the leading lines of `f`: each statement prints differently, the module
    # the same, and the whole text decides
    module = cst.parse_module(SOURCE)
    cls, function = module.body[1], module.body[2]
    # In the class footer the comment takes the block's indentation; at the top level it keeps it as whitespace
    footer = [
        line.with_changes(indent=False, whitespace=cst.SimpleWhitespace("    ") if line.comment else line.whitespace)
        for line in cls.body.footer
    ]
    moved = module.with_changes(
        body=[
            module.body[0],
            cls.with_changes(body=cls.body.with_changes(footer=[])),
            function.with_changes(leading_lines=[*footer, *function.leading_lines]),
        ]
    )
    codes = StatementCodes()
    assert codes.code(module, cls) != codes.code(moved, moved.body[1])
    assert moved.code == module.code
    assert not codes.prints_differently(module, moved)


CRLF_SOURCE = "def f(x):\r\n    # c\r\n    if x.any():\r\n        y = 1\r\n    elif x.all():\r\n        y = 2\r\n    return y\r\n"


@pytest.mark.parametrize(
    "source",
    [SOURCE, CRLF_SOURCE, *(path.read_text(encoding="utf-8") for path in FIXTURES if "cond_branches" in path.parts)],
)
def test_if_lines_are_the_position_providers(source):
    from libcst.metadata import MetadataWrapper, PositionProvider

    from codemods._statement_codes import NodeLineState

    module = cst.parse_module(source)
    for stmt in module.body:
        state = NodeLineState(
            default_indent=module.default_indent, default_newline=module.default_newline, kinds=(cst.If,)
        )
        stmt._codegen(state)
        assert "".join(state.tokens) == module.code_for_node(stmt)
        alone = module.with_changes(header=[], body=[stmt], footer=[])
        positions = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
        expected = {id(node): span.start.line for node, span in positions.items() if isinstance(node, cst.If)}
        assert state.lines == expected


# Sources where statement texts repeat at line starts (in a docstring, as duplicates), with header and footer
# comments, CRLF newlines and tabs: placing a statement by its text must never pick the wrong place
TRICKY_SOURCES = [
    SOURCE,
    '"""Doc.\n\nimport torch\nx = 1\n"""\n\nimport torch\nx = 1\nx = 1\n\n\ndef f():\n    return x\n# footer\n',
    "# a\r\n\r\nimport os\r\n\r\n\r\nclass A:\r\n\tdef f(self):\r\n\t\treturn 1\r\n\r\n\r\nclass A:\r\n\tdef f(self):\r\n"
    "\t\treturn 1\r\n",
    "x = 1\n" * 5 + "def g():\n    x = 1\n    return x\n",
    "x = 1\ny = 2",  # no trailing newline: printed as libcst prints it
]


def _variants(module: cst.Module):
    """Modules a codemod could make of `module`: statements replaced, removed, added, moved."""
    body = list(module.body)
    new = cst.parse_statement("added = 1\n")
    yield module
    for index in range(len(body)):
        yield module.with_changes(body=[*body[:index], new, *body[index + 1 :]])
        yield module.with_changes(body=[*body[:index], *body[index + 1 :]])
        yield module.with_changes(body=[*body[:index], new, *body[index:]])
    yield module.with_changes(body=body[::-1])


@pytest.mark.parametrize(
    "source",
    [*TRICKY_SOURCES, *(path.read_text(encoding="utf-8") for path in FIXTURES[::4])],
    ids=[f"tricky{i}" for i in range(len(TRICKY_SOURCES))] + [f"{p.parent.name}/{p.name}" for p in FIXTURES[::4]],
)
def test_codes_from_the_source_are_the_printed_ones(source):
    """Whatever was printed before (nothing, every other statement, everything), a module derived from the parsed
    source prints, and numbers its lines, as libcst does."""
    original = cst.parse_module(source)
    for printed in (0, 2, 1):
        for module in _variants(original):
            codes = StatementCodes(source, original)
            for stmt in original.body[::printed] if printed else ():
                codes.code(original, stmt)
            assert codes.module_code(module) == module.code
            lines = 1 + len(module.header)
            for index, stmt in enumerate(module.body):
                assert codes.first_line(module, index) == lines
                lines += module.code_for_node(stmt).count("\n")


def test_the_statements_of_the_source_are_not_printed(monkeypatch):
    source = (Path(__file__).parent / "fixtures" / "cond_branches" / "select_if_else.in.py").read_text()
    original = cst.parse_module(source)
    codes = StatementCodes(source, original)
    middle = len(original.body) // 2
    codes.code(original, original.body[middle])  # a candidate a codemod printed
    changed = original.with_changes(body=[*original.body[:middle], cst.parse_statement("y = 2\n")])
    printed = []
    monkeypatch.setattr(cst.Module, "code_for_node", lambda self, node: printed.append(node) or "?")
    assert codes.first_line(original, middle) > 1
    assert codes.module_code(original) == source
    assert codes.module_code(changed).endswith("?")  # only the new statement is printed
    assert printed == [changed.body[-1]]
