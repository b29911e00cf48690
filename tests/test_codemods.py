"""Codemod fixture pairs (`fixtures/<codemod>/<case>.in.py` -> `.out.py`) and the invariants every codemod keeps."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from codemods import ALL_CODEMODS
from codemods.cache_pytree import CachePytreeRegistration
from exportsmith.pipeline import run_codemods

FIXTURES = Path(__file__).parent / "fixtures"
BY_NAME = {codemod.NAME.replace("-", "_"): codemod for codemod in ALL_CODEMODS}
# A fixture's dotted module name inside transformers; `remote_code` has none, like a file given to `rewrite`.
MODULE_NAMES = {
    "cache_api": "transformers.cache_utils",
    "remote_code": None,
}
DEFAULT_MODULE = "transformers.models.toy.modeling_toy"


def _cases():
    return [
        pytest.param(path, id=f"{path.parent.name}/{path.name.removesuffix('.in.py')}")
        for path in sorted(FIXTURES.glob("*/*.in.py"))
    ]


def _run(path: Path):
    codemod = BY_NAME[path.parent.name]
    case = path.name.removesuffix(".in.py")
    return run_codemods(path.read_text(), path.name, MODULE_NAMES.get(case, DEFAULT_MODULE), codemods=(codemod,))


@pytest.mark.parametrize("path", _cases())
def test_fixture(path: Path, update_fixtures: bool):
    change = _run(path)
    expected = path.with_name(path.name.replace(".in.py", ".out.py"))
    if update_fixtures:
        expected.write_text(change.rewritten)
    assert change.error is None
    assert change.rewritten == expected.read_text()


@pytest.mark.parametrize("path", _cases())
def test_second_run_is_a_no_op_and_output_parses(path: Path):
    change = _run(path)
    cst.parse_module(change.rewritten)
    compile(change.rewritten, str(path), "exec")
    again = run_codemods(
        change.rewritten, path.name, MODULE_NAMES.get(path.name.removesuffix(".in.py"), DEFAULT_MODULE)
    )
    assert not again.changed


def test_registry_names_are_unique_and_every_module_is_registered():
    names = [codemod.NAME for codemod in ALL_CODEMODS]
    assert len(names) == len(set(names))
    modules = {p.stem for p in (Path(__file__).parents[1] / "codemods").glob("*.py") if not p.stem.startswith("_")}
    assert modules - {"base"} == {codemod.__module__.rsplit(".", 1)[1] for codemod in ALL_CODEMODS}
    assert all(codemod.DESCRIPTION and codemod.__module__ for codemod in ALL_CODEMODS)


def _findings(case: str):
    return _run(FIXTURES / "cache_pytree" / f"{case}.in.py").findings


def test_cache_api_registers_concrete_classes_and_skips_abstract_ones():
    change = _run(FIXTURES / "cache_pytree" / "cache_api.in.py")
    registered = [f.construct for f in change.findings if f.kind == "rewritten"]
    assert registered == [
        "class DynamicLayer",
        "class DynamicSlidingWindowLayer",
        "class DummyLayer",
        "class Cache",
        "class DynamicCache",
    ]
    assert "register_cache_pytree_node(CacheLayerMixin)" not in change.rewritten  # abstract
    assert "register_cache_pytree_node(KVSharingDict)" not in change.rewritten  # not a cache


def test_cache_named_by_convention_is_reported():
    notes = [f for f in _findings("named_cache_without_import") if f.kind == "note"]
    assert [(n.line, n.construct) for n in notes] == [(7, "class ToyConvPaddingCache")]
    assert "ends in `Cache`" in notes[0].reason


def test_refusals_leave_the_module_unchanged():
    for case in ("already_registered", "already_decorated", "no_cache"):
        change = _run(FIXTURES / "cache_pytree" / f"{case}.in.py")
        assert not change.changed, case
        assert change.applied == ()


def test_unparsable_source_is_an_error_value_not_an_exception():
    change = run_codemods("def broken(:\n", "broken.py", None, codemods=(CachePytreeRegistration,))
    assert change.error is not None and "does not parse" in change.error
    assert change.rewritten == change.original


def test_emitted_machinery_is_in_transformers_style():
    import black

    from codemods.cache_pytree import MACHINERY

    assert black.format_str(MACHINERY, mode=black.Mode(line_length=119)) == MACHINERY.lstrip("\n")
    assert max(len(line) for line in MACHINERY.splitlines()) <= 119


def test_counters_are_the_int_attributes_that_methods_update():
    change = _run(FIXTURES / "cache_pytree" / "cache_api.in.py")
    # cumulative_length: set in __init__, updated by `update` -> dynamic; the window size and the flag are not
    assert 'register_cache_pytree_node(DynamicSlidingWindowLayer, counters=("cumulative_length",))' in change.rewritten
    assert "register_cache_pytree_node(DynamicLayer)\n" in change.rewritten
    local = _run(FIXTURES / "cache_pytree" / "model_local_counter.in.py").rewritten
    assert '@register_cache_pytree_node(counters=("offset",))\nclass ToyOffsetCache(DynamicCache):' in local
