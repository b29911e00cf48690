"""`CandidateStatements` answers as the whole-module metadata would: lines and columns as PositionProvider gives
them, from printing only the kept statements, and qualified names as QualifiedNameProvider gives them over the whole
module, from a module whose other bodies are elided; `replace_in_statements` puts replacements where a transformer
would."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from codemods._candidates import CandidateStatements
from codemods._walks import ReplaceNodes, replace_in_statements
from codemods.tensor_len import TensorLen

FIXTURES = Path(__file__).parent / "fixtures"
SOURCES = [
    path.read_text(encoding="utf-8")
    for folder in ("tensor_len", "take_along_dim_gather", "pad_to_min_length", "vmap_masks")
    for path in sorted((FIXTURES / folder).glob("*.in.py"))
]
CRLF = "# c\r\n\r\nclass A:\r\n    @staticmethod\r\n    def f(x):\r\n        return (\r\n\tx)\r\n\r\n\r\ndef g(): pass\r\n"
SCOPES = """import torch
from torch import cat as join


def rebinds():
    global stack
    stack = join


def shadows():
    import numpy as torch

    return torch


def default(arg=(assigned := join)):
    return arg


class Model:
    len = 3

    def other(self):
        join = None
        return join

    def forward(self, x):
        y = join([x, x])
        z = stack([x]) + assigned([x])

        def inner():
            return len(y) + torch.cat([y]).shape[0]

        return torch.cat([y, z]), len(y), inner, other
"""


def _codemod() -> TensorLen:
    return TensorLen(CodemodContext())


def _nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    found = []

    class _Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            found.append(node)
            return True

    node.visit(_Collect())
    return found


@pytest.mark.parametrize("source", [*SOURCES, CRLF])
@pytest.mark.parametrize("every", [1, 2])
def test_lines_and_columns_are_the_position_providers(source: str, every: int):
    module = cst.parse_module(source)
    kept = module.body[every - 1 :: every]
    statements = CandidateStatements(_codemod(), module, kept)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    checked = 0
    for stmt in kept:
        for node in _nodes(stmt):
            if node in positions and not isinstance(node, cst.IndentedBlock):
                start = positions[node].start
                assert (statements.line(node), statements.column(node)) == (start.line, start.column), node
                checked += 1
    assert checked or not kept


def _qualified(module: cst.Module):
    resolved = MetadataWrapper(module, unsafe_skip_copy=True).resolve(QualifiedNameProvider)

    def qualified(node: cst.CSTNode) -> set[str]:
        value = resolved.get(node, ())
        return {name.name for name in (value() if callable(value) else value)}  # libcst resolves them lazily

    return qualified


def test_qualified_names_are_the_whole_modules_inside_the_scopes():
    module = cst.parse_module(SCOPES)
    model = module.body[-1]
    forward = model.body.body[-1]
    statements = CandidateStatements(_codemod(), module, [model], [forward])
    expected = _qualified(module)
    names = [node for node in _nodes(forward) if isinstance(node, (cst.Name, cst.Attribute))]
    assert [statements.qualified(node) for node in names] == [expected(node) for node in names]
    # What the elision has to keep: the binding made through `global` in another function and by `:=` in another
    # function's default, the class's own `len` not being a scope of its methods, the import of `torch` in another
    # function not reaching here
    spelled = {cst.Module(body=[]).code_for_node(node): statements.qualified(node) for node in names}
    assert spelled["stack"] == {"stack"}
    assert spelled["assigned"] == {"assigned"}
    assert spelled["len"] == {"builtins.len"}
    assert spelled["torch.cat"] == {"torch.cat"}
    assert spelled["join"] == {"torch.cat"}


def test_statements_without_the_scopes_are_elided_whole():
    module = cst.parse_module(SCOPES)
    model = module.body[-1]
    statements = CandidateStatements(_codemod(), module, [model])
    expected = _qualified(module)
    names = [node for node in _nodes(model) if isinstance(node, (cst.Name, cst.Attribute))]
    assert [statements.qualified(node) for node in names] == [expected(node) for node in names]


def test_replace_in_statements_is_a_transformers_replacement_and_keeps_the_other_statements():
    module = cst.parse_module(SCOPES)
    model = module.body[-1]
    forward = model.body.body[-1]
    first, last = forward.body.body[0], forward.body.body[-1]
    replacements = {
        first: cst.parse_statement("y = torch.cat([x, x])\n"),
        last: cst.parse_statement("return y\n"),
    }
    replaced = replace_in_statements(module, replacements, [model])
    assert replaced.code == module.visit(ReplaceNodes(replacements)).code
    assert "return y\n" in replaced.code and "return torch.cat([y, z])" not in replaced.code
    assert all(new is old for new, old in zip(replaced.body[:-1], module.body[:-1]))
    assert replace_in_statements(module, {}, [model]) is module
