"""`codemods._bindings.bound_at` (which names have a value where an `if` runs: cond-branches' operands) against the
independent analysis of `rewritten_regions` (on Python's `ast`), at every `if` and `elif` of the snippets below and
of the cond-branches fixtures; and the answers that matter, spelled out."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import libcst.matchers as m
import pytest

from codemods._bindings import bound_at
from rewritten_regions import bound_at as bound_at_on_ast

SNIPPETS = {
    "elif_chain": """
def f(x):
    s = x.sum()
    if s > 10:
        y = x * 2
    elif s > 0:
        y = x + 1
    else:
        y = x - 1
    if y.any():
        z = y
    return y
""",
    "arms_that_return": """
def f(x, flag):
    if flag:
        return x
    else:
        a = x
    if a.any():
        b = a
    else:
        raise ValueError
    if b.all():
        pass
""",
    "loops": """
def f(xs, n):
    for i, x in enumerate(xs):
        if x.any():
            last = x
        if i.any():
            pass
    while n:
        w = n
        if w.all():
            pass
    if last.any():
        pass
""",
    "try_with_del_walrus": """
def f(x, path):
    try:
        t = x.sum()
    except ValueError as error:
        t = error
    finally:
        done = True
    with open(path) as (a, b):
        c = a
    del c
    if (k := x.max()) > 0:
        pass
    if t.any():
        pass
    import math as mm, os.path
    from os import sep
    def helper():
        inner = 1
    class Local:
        member = 1
    if mm.any():
        pass
""",
    "nested_scopes": """
def f(x, *args, key=None, **kwargs):
    squares = [v * v for v in x]
    g = lambda q: q
    if x.any():
        h = 1
        if h.all():
            j = 2
        if j.any():
            pass
""",
}


def _libcst_ifs(function: cst.FunctionDef) -> list[cst.If]:
    return list(m.findall(function.body, m.If()))


def _ast_ifs(statements: list[ast.stmt]) -> list[ast.If]:
    found = []
    for stmt in statements:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, ast.If):
            found.append(stmt)
        for block in ("body", "orelse", "finalbody"):
            found += _ast_ifs(getattr(stmt, block, []))
        for handler in getattr(stmt, "handlers", []):
            found += _ast_ifs(handler.body)
    return found


def _ast_functions(node: ast.AST) -> list[ast.FunctionDef]:
    """The functions in `node`, in source order (as a libcst matcher search finds them)."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef):
            found.append(child)
        found += _ast_functions(child)
    return found


def _functions(source: str):
    cst_functions = list(m.findall(cst.parse_module(source), m.FunctionDef()))
    ast_functions = _ast_functions(ast.parse(source))
    assert [f.name.value for f in cst_functions] == [f.name for f in ast_functions]
    return list(zip(cst_functions, ast_functions))


def _cases():
    sources = dict(SNIPPETS)
    for path in sorted((Path(__file__).parent / "fixtures" / "cond_branches").glob("*.in.py")):
        sources[path.name] = path.read_text()
    return [pytest.param(source, id=name) for name, source in sources.items()]


@pytest.mark.parametrize("source", _cases())
def test_both_analyses_agree_at_every_if(source):
    compared = 0
    for cst_function, ast_function in _functions(source):
        cst_ifs, ast_ifs = _libcst_ifs(cst_function), _ast_ifs(ast_function.body)
        assert len(cst_ifs) == len(ast_ifs)
        for cst_if, ast_if in zip(cst_ifs, ast_ifs):
            binding = bound_at(cst_function, cst_if)
            assert (binding.definite, binding.possible) == bound_at_on_ast(ast_function, ast_if), ast_if.lineno
            compared += 1
    assert compared


def _at(source: str, index: int):
    function = cst.parse_module(source).body[0]
    return bound_at(function, _libcst_ifs(function)[index])


def test_an_elif_sees_what_was_bound_before_the_if_not_in_the_arm_before_it():
    elif_ = _at(SNIPPETS["elif_chain"], 1)
    assert "y" not in elif_.possible and {"x", "s"} <= elif_.definite
    assert "y" in _at(SNIPPETS["elif_chain"], 2).definite  # bound in every arm


def test_an_arm_that_cannot_fall_through_binds_nothing_after_the_if():
    assert "a" in _at(SNIPPETS["arms_that_return"], 1).definite
    assert "b" in _at(SNIPPETS["arms_that_return"], 2).definite


def test_a_loop_body_may_see_an_earlier_iteration_and_may_not_run():
    in_loop = _at(SNIPPETS["loops"], 0)
    assert {"i", "x"} <= in_loop.definite and "last" in in_loop.possible - in_loop.definite
    after = _at(SNIPPETS["loops"], 3)
    assert {"last", "w", "i"} <= after.possible and not {"last", "w", "i"} & after.definite


def test_try_with_del_walrus_imports_and_definitions():
    at_end = _at(SNIPPETS["try_with_del_walrus"], 2)
    assert {"t", "done", "a", "b", "mm", "os", "sep", "helper", "Local"} <= at_end.definite
    assert "c" not in at_end.definite and "k" in at_end.possible - at_end.definite
    assert "error" in at_end.possible - at_end.definite
    assert "inner" not in at_end.possible and "member" not in at_end.possible


def test_comprehension_and_lambda_variables_are_their_own_scope():
    binding = _at(SNIPPETS["nested_scopes"], 0)
    assert {"x", "args", "key", "kwargs", "squares", "g"} <= binding.definite
    assert not {"v", "q"} & binding.possible
    assert "j" in _at(SNIPPETS["nested_scopes"], 2).possible - _at(SNIPPETS["nested_scopes"], 2).definite
