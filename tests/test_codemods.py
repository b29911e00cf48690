"""Codemod fixture pairs (`fixtures/<codemod>/<case>.in.py` -> `.out.py`) and the invariants every codemod keeps."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from codemods import ALL_CODEMODS, UPSTREAM_CODEMODS
from codemods.cache_pytree import CachePytreeRegistration
from codemods.cond_branches import TRAINING_ONLY, load_targets
from exportsmith.pipeline import run_codemods

FIXTURES = Path(__file__).parent / "fixtures"
EVERY_CODEMOD = tuple(dict.fromkeys(ALL_CODEMODS + UPSTREAM_CODEMODS))  # both forms: vendored and upstream
BY_NAME = {codemod.NAME.replace("-", "_"): codemod for codemod in EVERY_CODEMOD}
# A fixture's dotted module name inside transformers; `remote_code` has none, like a file given to `rewrite`.
MODULE_NAMES = {
    "cache_api": "transformers.cache_utils",
    "remote_code": None,
    "shared_module": "transformers.masking_utils",
    "vision_helpers": "transformers.vision_utils",
    "masking_utils_helper": "transformers.masking_utils",
    "exporter_dynamo": "transformers.exporters.exporter_dynamo",
    "exporter_unknown_branch": "transformers.exporters.exporter_dynamo",
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
    targets = path.with_name(f"{case}.targets.json")  # cond-branches: the sites a fixture's targets file lists
    if targets.exists():
        codemod = codemod.with_targets(load_targets(targets))
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
    # the whole pipeline of the fixture's form: the upstream one for the codemod only it has
    pipeline = ALL_CODEMODS if BY_NAME[path.parent.name] in ALL_CODEMODS else UPSTREAM_CODEMODS
    again = run_codemods(
        change.rewritten, path.name, MODULE_NAMES.get(path.name.removesuffix(".in.py"), DEFAULT_MODULE), pipeline
    )
    assert not again.changed


def test_registry_names_are_unique_and_every_module_is_registered():
    names = [codemod.NAME for codemod in EVERY_CODEMOD]
    assert len(names) == len(set(names))
    modules = {p.stem for p in (Path(__file__).parents[1] / "codemods").glob("*.py") if not p.stem.startswith("_")}
    assert modules - {"base"} == {codemod.__module__.rsplit(".", 1)[1] for codemod in EVERY_CODEMOD}
    assert all(codemod.DESCRIPTION and codemod.__module__ for codemod in EVERY_CODEMOD)
    # the two forms differ in how caches are exported, and the upstream one leaves out what no model needs
    assert [c.NAME for c in ALL_CODEMODS if c not in UPSTREAM_CODEMODS] == [
        "cache-pytree",
        "cond-branches",
        "exclusive-cumsum",
        "cdist-mode",
    ]
    assert [c.NAME for c in UPSTREAM_CODEMODS if c not in ALL_CODEMODS] == ["cache-export"]


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


_CANNOT_ALIAS = "which torch.cond cannot alias"


def test_cond_branches_rewrites_an_arm_that_computes_from_a_view():
    source = (
        "import torch\n\n\ndef f(hidden_states, mask):\n    if mask.any():\n"
        "        hidden_states = hidden_states.view(-1)\n        hidden_states = hidden_states * 2\n"
        "    return hidden_states\n"
    )
    change = run_codemods(source, "demo.py", DEFAULT_MODULE, codemods=(BY_NAME["cond_branches"],))
    assert [f.kind for f in change.findings] == ["rewritten"] and "torch.cond(" in change.rewritten


def _cond_findings(case: str):
    change = _run(FIXTURES / "cond_branches" / f"{case}.in.py")
    return change, [(f.line, f.kind, f.construct, f.reason) for f in change.findings]


def test_cond_branches_reports_each_rewrite_with_its_shape():
    _, findings = _cond_findings("select_fp16_clamp")
    assert findings == [
        (
            15,
            "rewritten",
            "hidden_states.dtype == torch.float16 and not torch.isfinite(hidden_states).all()",
            "select -> torch.cond",
        ),
        (
            25,
            "rewritten",
            "self.config.clamp_fp16_activations_in_every_block and hidden_states.dtype == torch.float16 and "
            "torch.isinf(hidden_states).any()",
            "select -> torch.cond",
        ),
        (36, "refused", "not torch.isfinite(hidden_states).all()", TRAINING_ONLY),  # inside `if self.training:`
    ]
    _, findings = _cond_findings("raise_torch_all")
    assert [(line, kind, reason) for line, kind, _, reason in findings] == [
        (7, "rewritten", "raise -> torch._assert_async"),
        (13, "rewritten", "raise -> torch._assert_async"),
    ]


def test_cond_branches_rewrites_size_tests_that_export_would_specialise():
    change, findings = _cond_findings("select_size_tests")
    assert [(line, kind, construct, reason) for line, kind, construct, reason in findings] == [
        (6, "rewritten", "q_len == 1", "if/else -> torch.cond"),
        (14, "rewritten", "hidden_states.size(1) > 1", "select -> torch.cond"),
        (22, "rewritten", "q_len == kv_len", "if/else -> torch.cond"),
        (
            30,
            "refused",
            "hidden_states.shape[0] == 0",
            "a size test whose branch only raises: export assumes sizes >= 2 (torch._check is the fix)",
        ),
    ]  # `if seq_len == 1` on a parameter (line 38) is not known to be a size: silent
    # The predicate is the size test itself: a SymBool under export
    assert "scores = torch.cond(q_len == 1, true_fn, false_fn, ())" in change.rewritten


def test_cond_branches_operands_are_the_results_bound_where_the_if_runs():
    change, findings = _cond_findings("select_bindings")
    assert [(line, kind, reason) for line, kind, _, reason in findings] == [
        (6, "rewritten", "elif chain -> nested torch.cond"),
        (16, "rewritten", "elif chain -> nested torch.cond"),
        (32, "rewritten", "if/else -> torch.cond"),
        (34, "rewritten", "select -> torch.cond"),  # `scaled`, bound earlier in the arm, is its operand
        (45, "rewritten", "if/else -> torch.cond"),
        (59, "rewritten", "select -> torch.cond"),  # `index` is unpacked first in both arms: local to them
    ]
    # `y` is bound in the arms only: no arm function of the chain takes it (it did, and eager raised
    # UnboundLocalError on the `elif` and `else` paths)
    assert "def true_fn(y)" not in change.rewritten and "(y,)" not in change.rewritten
    # `shifted` is bound before the `if` on some paths only, and no arm reads it: no operand either
    assert "shifted = torch.cond(mask.any(), true_fn, false_fn, ())" in change.rewritten
    # `index` is bound only in the other arm of the enclosing `if` (rt_detr's post-processing): neither an operand nor
    # a result (it was an operand, and eager raised UnboundLocalError)
    assert "def true_fn(scores, labels):" in change.rewritten


def test_cond_branches_passes_returning_arms_the_names_they_rebind_after_reading():
    change, findings = _cond_findings("select_returns")
    assert [(line, kind, reason) for line, kind, _, reason in findings] == [
        (5, "rewritten", "return -> torch.cond"),
        (13, "rewritten", "return -> torch.cond"),
    ]
    # `hidden_states = hidden_states * 2` in an arm: its function reads the value from before the `if` as an operand
    # (it read it from the closure, where the assignment made it a local: UnboundLocalError in eager)
    assert "return torch.cond(mask.any(), true_fn, false_fn, (hidden_states,))" in change.rewritten
    assert "return torch.cond(mask.any(), true_fn, false_fn, ())" in change.rewritten  # a pair, nothing rebound


def test_cond_branches_rewrites_an_early_return_with_the_rest_of_its_block_as_the_else_arm():
    change, findings = _cond_findings("select_early_return")
    assert [(line, kind, construct, reason) for line, kind, construct, reason in findings] == [
        (5, "rewritten", "query.shape[1] == 1", "early return -> torch.cond"),
        (11, "rewritten", "mask.any()", "early return -> torch.cond"),
        (21, "rewritten", "(hidden_states > 1).all()", "early return -> torch.cond"),
        (30, "rewritten", "(hidden_states > 2).all()", "early return -> torch.cond"),
        (32, "rewritten", "mask.any()", "early return -> torch.cond"),  # inside the first one's `false_fn`
        (39, "rewritten", "mask.all()", "early return -> torch.cond"),  # in a Python `if` whose block ends in return
    ]
    # the size test is a cond on the SymBool, and each arm is emitted once
    assert "return torch.cond(query.shape[1] == 1, true_fn, false_fn, ())" in change.rewritten
    assert change.rewritten.count("hidden_states = hidden_states * 3") == 1


_ALIAS = (
    "is not assigned on every path of an arm: that arm would return its input unchanged, which torch.cond cannot alias"
)


def test_cond_branches_reports_every_shape_it_rewrites():
    change, findings = _cond_findings("select_shapes")
    assert [(line, kind, reason) for line, kind, _, reason in findings] == [
        (5, "rewritten", "if/else -> torch.cond"),
        (15, "rewritten", "elif chain -> nested torch.cond"),
        (25, "rewritten", "return -> torch.cond"),
        (33, "rewritten", "select -> torch.cond"),
        (39, "rewritten", "select -> torch.cond"),  # nested: rewritten inside the outer branch function
        (47, "rewritten", "select -> torch.cond"),
        (53, "rewritten", "select -> torch.cond"),  # a comparison of a whole-tensor reduction
        (59, "rewritten", "if/else -> torch.cond"),  # `.item()` of an `all` test: the tensor form drops it
        (68, "rewritten", "select -> torch.cond"),  # `seq_len` is bound only from a reduction
    ]
    # Each branch body is emitted once, as a function; eager calls it, export passes it to torch.cond
    assert change.rewritten.count("hidden_states = hidden_states * scale") == 1
    assert change.rewritten.count("masked = logits.masked_fill(mask, -1.0)") == 1


@pytest.mark.parametrize(
    "case, expected",
    [
        (
            "refuse_attribute_write",
            [(7, "torch.isnan(hidden_states).any()", "the branch writes the attribute `self.saw_nan`")],
        ),
        (
            "refuse_return",
            [
                (
                    6,
                    "cache.is_initialized and blank_mask.all()",
                    "early return: a Python condition `and`-joined to the tensor test: the statements after the `if` "
                    "run when either is false, so they would be the `else` arm of both",
                )
            ],
        ),
        (
            "refuse_logger",
            [(9, "(input_ids[:, -1] == pad_token_id).any()", "the branch calls `logger.warning` (a side effect)")],
        ),
        ("refuse_loop", [(5, "masks.any()", "a loop in the branch")]),
        (
            "refuse_other",
            [
                (
                    6,
                    "(input_ids == image_token_id).any()",
                    "`image_embeds` may be `None` before the branch, and the other arm would return it",
                ),
                (
                    8,
                    "not torch.all(scores == 0) and threshold > 0",
                    "a Python condition follows the tensor test in the `and` chain: it cannot be split off exactly",
                ),
                (
                    10,
                    "stats.item() > 0",
                    "`.item()` reads a tensor into a Python number: no tensor form in this slice",
                ),
                (13, "mask.any()", "the branch assigns to `inputs_embeds[mask]` in place"),
                (15, "mask.any()", "the branch calls the in-place `.masked_fill_(...)`"),
                (17, "mask.any()", "`offset` has no value before the branch, so the other arm has nothing to return"),
            ],
        ),
        (
            "refuse_shapes",
            [
                (5, "(gate > 0).any()", f"`gate` {_ALIAS}"),
                (14, "mask.any()", "the branch returns the non-tensor value `None`"),
                (21, "mask.any()", "the branch returns `logits` unchanged, which torch.cond cannot alias"),
                (28, "hidden_states.isnan().any()", "the branch has an assignment expression, `yield` or `await`"),
                (
                    34,
                    "training and hidden_states.isnan().any()",
                    "a Python condition joined to the tensor test, with an `else`: it would run both ways",
                ),
                (42, "(scores > 0).all()", "the branch sets `scale` to the non-tensor value `1.0`"),
                (50, "hidden_states.isnan().any()", "the name `true_fn` for a branch function is taken"),
                (56, "hidden_states.isnan().any()", f"`hidden_states` {_ALIAS}"),
                (
                    63,
                    "(seq_len > self.max_seq_len_cached).any()",
                    "the branch calls `.register_buffer(...)`, which mutates its object",
                ),
            ],
        ),
        (
            "refuse_views",
            [
                (5, "mask.any()", f"the branch may leave `hidden_states` a view of `hidden_states`, {_CANNOT_ALIAS}"),
                (11, "mask.all()", f"the branch may leave `hidden_states` a view of `hidden_states`, {_CANNOT_ALIAS}"),
                (19, "mask.any()", f"the branch may leave `hidden_states` a view of `hidden_states`, {_CANNOT_ALIAS}"),
                (28, "mask.any()", f"the branch may leave `hidden_states` a view of `hidden_states`, {_CANNOT_ALIAS}"),
                (34, "mask.any()", f"the branch may leave `hidden_states` a view of `hidden_states`, {_CANNOT_ALIAS}"),
            ],
        ),
        (
            "refuse_bindings",
            [
                (
                    7,
                    "mask.any()",
                    "`shifted` has a value before the branch on some paths only, so the other arm may have nothing to "
                    "return",
                ),
                (
                    15,
                    "mask.any()",
                    "an arm reads `shifted` before assigning it, and `shifted` has a value before the branch on some "
                    "paths only: the arm's function would not see it",
                ),
                (
                    25,
                    "mask.any()",
                    "`scale` is read by a nested function outside the branch, which would not see the arm's assignment",
                ),
                (33, "mask.any()", "`LAST` is declared `global` or `nonlocal`: the arm's function would bind a local"),
            ],
        ),
        (
            "refuse_returns",
            [
                (
                    5,
                    "mask.any()",
                    "the branch returns `hidden_states.transpose(0, 1)`, which may be a view of `hidden_states`: "
                    "torch.cond cannot alias an input",
                ),
                (12, "mask.any()", "the arms return tuples of different lengths: torch.cond needs the same structure"),
                (
                    21,
                    "mask.any()",
                    "an arm reads `factor` before assigning it, and `factor` has a value before the branch on some "
                    "paths only: the arm's function would not see it",
                ),
            ],
        ),
        (
            "refuse_early_return",
            [
                (
                    6,
                    "batch_size == 1",
                    "early return: the branch returns `pred_masks` unchanged, which torch.cond cannot alias",
                ),
                (12, "mask.any()", "early return: a loop in the branch"),
                (20, "mask.any()", "early return: the branch assigns to `hidden_states[mask]` in place"),
                (
                    27,
                    "query.shape[1] == 1",
                    "early return: the branch returns `query.transpose(1, 2)`, which may be a view of `query`: "
                    "torch.cond cannot alias an input",
                ),
            ],
        ),
        ("no_torch_import", [(6, "hidden_states.isnan().any()", "the module does not `import torch`")]),
        # A shared module: silent
        ("shared_module", []),
    ],
)
def test_cond_branches_refusals_leave_the_module_unchanged_and_say_why(case, expected):
    change, findings = _cond_findings(case)
    assert not change.changed and change.applied == ()
    assert findings == [(line, "refused", construct, reason) for line, construct, reason in expected]


def test_cond_branches_emits_transformers_style():
    import black

    for path in sorted((FIXTURES / "cond_branches").glob("*.out.py")):
        text = path.read_text()
        assert black.format_str(text, mode=black.Mode(line_length=119)) == text, path.name


def test_an_import_that_grows_past_the_line_length_is_parenthesized_one_name_a_line():
    from codemods._imports import add_from_import

    names = ", ".join(f"SomeLongClassName{index}" for index in range(4))
    module = cst.parse_module(f"from ...cache_utils import {names}\n\nx = 1\n")
    assert len(module.code.splitlines()[0]) < 119
    code = add_from_import(module, "cache_utils", 3, "register_cache_pytree_node").code
    expected = "".join(f"    SomeLongClassName{index},\n" for index in range(4))
    assert code.startswith(f"from ...cache_utils import (\n{expected}    register_cache_pytree_node,\n)\n\nx = 1")
    short = add_from_import(cst.parse_module("from ...cache_utils import Cache\n"), "cache_utils", 3, "Dynamic")
    assert short.code == "from ...cache_utils import Cache, Dynamic\n"


def test_an_added_import_name_goes_where_ruff_sorts_it():
    from codemods._imports import add_from_import

    one_line = cst.parse_module("from ...masking_utils import create_causal_mask, sdpa_mask\n")
    code = add_from_import(one_line, "masking_utils", 3, "block_diagonal_mask").code
    assert code == "from ...masking_utils import block_diagonal_mask, create_causal_mask, sdpa_mask\n"
    code = add_from_import(one_line, "masking_utils", 3, "packed_mask").code
    assert code == "from ...masking_utils import create_causal_mask, packed_mask, sdpa_mask\n"
    one_a_line = cst.parse_module("from ...cache_utils import (\n    CONSTANT,\n    Cache,\n    zeta,\n)\n")
    code = add_from_import(one_a_line, "cache_utils", 3, "DynamicCache").code
    assert code == "from ...cache_utils import (\n    CONSTANT,\n    Cache,\n    DynamicCache,\n    zeta,\n)\n"
    unsorted = cst.parse_module("from ...cache_utils import b, a\n")  # not ruff's order: the name goes last
    assert add_from_import(unsorted, "cache_utils", 3, "c").code == "from ...cache_utils import b, a, c\n"


def _vmap_findings(case: str):
    change = _run(FIXTURES / "vmap_masks" / f"{case}.in.py")
    return change, [(f.line, f.kind, f.construct, f.reason) for f in change.findings]


def test_vmap_masks_rewrites_the_expansion_helpers_of_both_transformers_lines():
    for case, helper, line in (
        ("masking_utils_expansion", "_vmap_expansion_sdpa", 33),
        ("vmap_for_bhqkv", "_vmap_for_bhqkv", 8),
    ):
        change, findings = _vmap_findings(case)
        assert findings == [
            (line, "rewritten", f"def {helper}", "nested torch.vmap -> broadcast index tensors + expand")
        ]
        _assert_export_only(change.rewritten)
    # Broadcast-safe mask functions of the module are left byte-identical
    change, _ = _vmap_findings("masking_utils_expansion")
    assert "return padding_mask[batch_idx, kv_idx]" in change.rewritten
    assert "return abs(q_idx - kv_idx) <= sliding_window" in change.rewritten


def test_vmap_masks_rewrites_a_helper_beside_a_mask_function_it_rewrites():
    # Both rewrites are made in one pass: a helper was once reported rewritten and left as it was, because the mask
    # rewrite had rebuilt every node before the helper was looked up by identity
    change, findings = _vmap_findings("helper_beside_rewritten_mask")
    assert findings == [
        (10, "rewritten", "max(q_idx - sliding_window, 0)", "max -> tensor op"),
        (15, "rewritten", "def _vmap_for_bhqkv", "nested torch.vmap -> broadcast index tensors + expand"),
    ]
    assert "torch.clamp(q_idx - sliding_window, min=0)" in change.rewritten
    _assert_export_only(change.rewritten)


def _assert_export_only(rewritten: str) -> None:
    """The broadcast form runs under export only: eager keeps its vmap loop and its TransformGetItemToIndex context
    (vmap-style mask functions that users pass, `pm[b][kv]`, work only there)."""
    exporting, eager = rewritten.split("if torch.compiler.is_exporting():\n", 1)[1].split(
        "return broadcast_mask_function", 1
    )
    assert "def broadcast_mask_function(*indices):" in exporting and "torch.vmap(" not in exporting
    assert "torch.vmap(" in eager.split("\ndef ", 1)[0]  # the helper's own loop, right after the export form
    assert rewritten.count("with TransformGetItemToIndex():") == 0
    for line in rewritten.splitlines():
        if "TransformGetItemToIndex()" in line and line.lstrip().startswith("with "):
            assert "nullcontext() if torch.compiler.is_exporting() else TransformGetItemToIndex():" in line


def test_vmap_masks_makes_mask_functions_broadcast_safe_and_says_what_it_did():
    _, findings = _vmap_findings("chained_indexing")
    assert [(line, kind, reason) for line, kind, _, reason in findings] == [
        (8, "rewritten", "x[i][j] -> x[i, j]"),
        (8, "rewritten", "x[i][j] -> x[i, j]"),
        (9, "rewritten", "x[i][j] -> x[i, j]"),
        (9, "rewritten", "x[i][j] -> x[i, j]"),
        (17, "rewritten", "max -> tensor op"),
        (18, "rewritten", "min -> tensor op"),
        (25, "rewritten", "a if c else b -> torch.where(c, a, b)"),
    ]


@pytest.mark.parametrize(
    "case, expected",
    [
        (
            "refuse_not_broadcast_safe",
            [
                (
                    10,
                    "q_idx - kv_idx > window",
                    "Python `if` on an index value: its truth value is one element under vmap only",
                ),
                (19, "lengths[batch_idx].sum()", "`.sum()` of an index value is not elementwise"),
                (
                    20,
                    "(kv_idx < total) and (q_idx.shape[0] > 0)",
                    "`and`/`or` on an index value: Python truth value of a tensor",
                ),
                (20, "q_idx.shape", "`.shape` of an index value: 0-d under vmap, 4-D when broadcast"),
                (27, "table[rows][kv_idx]", "chained indexing whose inner index is not an index value or an int"),
                (
                    32,
                    "def _vmap_expansion_sdpa",
                    "the module's mask functions at lines 9, 18, 26, 44 are not broadcast-safe",
                ),
                (
                    45,
                    "_first_allowed(q_idx, window)",
                    "`_first_allowed` of an index value: not a mask function, not analysed",
                ),
                (45, "math.floor(q_idx)", "`math.floor` of an index value: not a mask function, not analysed"),
            ],
        ),
        (
            "refuse_dimensions",
            [
                (6, "def expansion_from_argument", "`dimensions` is not a literal list of one-axis in_dims tuples"),
                (
                    13,
                    "def expansion_out_dims",
                    "a torch.vmap loop of another shape than f = torch.vmap(f, in_dims=dims, out_dims=0); return f",
                ),
                (20, "def expansion_two_axes", "`dimensions` is not a literal list of one-axis in_dims tuples"),
            ],
        ),
    ],
)
def test_vmap_masks_refusals_leave_the_module_unchanged_and_say_why(case, expected):
    change, findings = _vmap_findings(case)
    assert not change.changed and change.applied == ()
    assert findings == [(line, "refused", construct, reason) for line, construct, reason in expected]


def test_vmap_masks_emits_transformers_style():
    import black

    for path in sorted((FIXTURES / "vmap_masks").glob("*.out.py")):
        if path.name.startswith("masking_utils_expansion"):
            continue  # its input keeps a hand-wrapped call that black would join; the rewrite never touches it
        text = path.read_text()
        assert black.format_str(text, mode=black.Mode(line_length=119)) == text, path.name


_UNBACKED = (
    "an arm reads `{}`, an int the listed test compares: where it is what export found data-dependent (an unbacked "
    "SymInt), torch.cond rejects it in a branch's closure (torch 2.13)"
)


def test_cond_branches_takes_the_sites_its_targets_file_lists():
    # `gate > 0` (a subscript of a tensor) and `count < limit` (a name bound from `.item()`) are no tensor tests to
    # the static rules: only the fixture's targets file makes them candidates. Sites are keyed by the function's
    # qualname and the test, not the line (the file gives wrong lines on purpose: 50 for a site that is not there)
    change, findings = _cond_findings("listed_targets")
    assert findings == [
        (7, "rewritten", "gate > 0", "if/else -> torch.cond"),
        (24, "rewritten", "mask is not None and count < limit", "select -> torch.cond"),
        (30, "refused", "count < limit", _UNBACKED.format("count")),
        (39, "refused", "length <= max_pad", _UNBACKED.format("length") + "; the padding is a size: no tensor form"),
        (
            46,
            "refused",
            "durations.sum() == 0",
            "the branch assigns to `durations[durations.sum(dim=1).eq(0)]` in place",
        ),
        (50, "note", "x.sum() > 0", "listed in cond_targets.json, but this module has no such `if` in that function"),
    ]
    # The same test in a function the file does not list (`not_listed`, listed only for another module) stays
    assert "    if gate > 0:  # the same test in a function" in change.rewritten
    # The leading Python conjunct stays a plain `if` around the rewrite; the listed comparison is the predicate
    assert "if mask is not None:\n" in change.rewritten and "torch.cond(\n                    count < limit," in (
        change.rewritten
    )
    # Without the targets file none of them is a candidate
    plain = run_codemods(
        (FIXTURES / "cond_branches" / "listed_targets.in.py").read_text(),
        "listed_targets.in.py",
        DEFAULT_MODULE,
        codemods=(BY_NAME["cond_branches"].with_targets([]),),
    )
    assert [(f.line, f.kind) for f in plain.findings] == [(46, "refused")]  # `durations.sum() == 0` is static


def test_cond_branches_refuses_listed_sites_in_shared_modules_with_a_reason():
    sites = [{"file": "integrations/sdpa_attention.py", "function": "f", "line": 3, "test": "q_length == 1"}]
    source = "import torch\n\n\ndef f(q_length, x):\n    if q_length == 1:\n        x = x * 2\n    return x\n"
    change = run_codemods(
        source,
        "integrations/sdpa_attention.py",
        "transformers.integrations.sdpa_attention",
        codemods=(BY_NAME["cond_branches"].with_targets(sites),),
    )
    assert not change.changed
    [finding] = change.findings
    assert (finding.kind, finding.construct) == ("refused", "q_length == 1")
    assert "shared module" in finding.reason


def test_committed_targets_are_keyed_by_file_function_and_test():
    from codemods.cond_branches import CondBranches, site_test

    keys = [(site["file"], site["function"], site["test"]) for site in CondBranches.TARGETS]
    assert keys == sorted(set(keys))
    for site in CondBranches.TARGETS:
        assert site_test(cst.parse_expression(site["test"])) == site["test"]  # written as the codemod reads it


def test_a_listed_site_applies_to_the_modular_file_its_modeling_file_is_generated_from():
    sites = [{"file": "models/toy/modeling_toy.py", "function": "f", "line": 5, "test": "gate > 0", "why": "w"}]
    source = "import torch\n\n\ndef f(x, gate):\n    if gate > 0:\n        x = x * 2\n    return x\n"
    codemod = BY_NAME["cond_branches"].with_targets(sites)
    for relpath, rewritten in (
        ("models/toy/modeling_toy.py", True),
        ("models/toy/modular_toy.py", True),
        ("models/other/modular_toy.py", False),
    ):
        change = run_codemods(source, relpath, DEFAULT_MODULE, codemods=(codemod,))
        assert change.changed is rewritten, relpath


def test_every_committed_site_with_a_reason_is_refused_with_it_in_the_installed_transformers():
    # the hand-written reasons (clvp's memo branch, the eager mask skips of masking_utils, ...) reach the findings
    from codemods.cond_branches import CondBranches
    from exportsmith.discover import find_transformers

    tf = find_transformers()
    for site in CondBranches.TARGETS:
        if not site.get("why"):
            continue
        path = tf.root / site["file"]
        change = run_codemods(path.read_text(), site["file"], tf.module_name(path), codemods=(CondBranches,))
        reasons = [f.reason for f in change.findings if f.kind == "refused" and f.construct == site["test"]]
        assert reasons and all(reason.endswith(site["why"]) for reason in reasons), site["function"]


_MODULAR = """import torch
from torch import nn


class ToyLayer(nn.Module):
    def forward(self, hidden_states):
        if not torch.isfinite(hidden_states).all():
            hidden_states = torch.nan_to_num(hidden_states)
        return hidden_states


class ToyImageProcessor:
    def post_process(self, scores):
        if (scores < 0).any():
            scores = scores.clamp(min=0)
        return scores
"""


def test_a_modular_file_is_rewritten_only_where_it_defines_modeling_code():
    """The converter puts `ToyLayer` in the modeling file and `ToyImageProcessor` in another file the patch does not
    hold: only the first is rewritten, and the second's site is reported refused, as it was written."""
    from exportsmith.pipeline import OUTSIDE_MODELING_CODE

    expansion = "import torch\n\n\nclass ToyLayer(nn.Module):\n    pass\n"
    relpath, module = "models/toy/modular_toy.py", "transformers.models.toy.modular_toy"
    change = run_codemods(_MODULAR, relpath, module, (BY_NAME["cond_branches"],), expansions=(expansion,))
    assert [(f.line, f.kind, f.reason) for f in change.findings] == [
        (7, "rewritten", "select -> torch.cond"),
        (14, "refused", OUTSIDE_MODELING_CODE),
    ]
    assert change.rewritten.endswith(_MODULAR[_MODULAR.index("\n\nclass ToyImageProcessor") :])
    # with no expansion (a modeling file), both are rewritten
    alone = run_codemods(_MODULAR, relpath, module, (BY_NAME["cond_branches"],))
    assert [f.kind for f in alone.findings] == ["rewritten", "rewritten"]


def test_a_copy_of_code_outside_the_models_keeps_its_text():
    """owlvit's `generalized_box_iou` is `# Copied from transformers.loss...`, which no codemod rewrites: rewriting
    the copy alone would fail transformers' check_copies, so it is refused and left as written."""
    from exportsmith.pipeline import COPIED_FROM

    source = (
        "import torch\n\n\n# Copied from transformers.loss.loss_for_object_detection.generalized_box_iou\n"
        "def generalized_box_iou(boxes1):\n    if not (boxes1[:, 2:] >= boxes1[:, :2]).all():\n"
        '        raise ValueError("corner format")\n    return boxes1\n\n\n'
        "# Copied from transformers.models.detr.modeling_detr.box_check\n"
        "def box_check(boxes1):\n    if not (boxes1[:, 2:] >= boxes1[:, :2]).all():\n"
        '        raise ValueError("corner format")\n    return boxes1\n'
    )
    change = run_codemods(source, "models/toy/modeling_toy.py", DEFAULT_MODULE, (BY_NAME["cond_branches"],))
    source_name = "transformers.loss.loss_for_object_detection.generalized_box_iou"
    assert [(f.line, f.kind, f.reason) for f in change.findings] == [
        (6, "refused", COPIED_FROM.format(source_name)),
        (13, "rewritten", "raise -> torch._assert_async"),  # a copy of another model: rewritten there alike
    ]
    assert change.rewritten.startswith(source[: source.index("# Copied from transformers.models")])


def test_cache_export_refuses_a_flattener_it_does_not_know_and_says_why():
    (finding,) = _run(FIXTURES / "cache_export" / "exporter_unknown_branch.in.py").findings
    assert (finding.kind, finding.construct) == ("refused", "def _flatten_to_context")
    assert "counters not added" in finding.reason
    (finding,) = _run(FIXTURES / "cache_export" / "exporter_dynamo.in.py").findings
    assert finding.kind == "rewritten"


def test_a_helper_added_for_rewrites_outside_modeling_code_is_taken_back_with_them():
    """conditional_detr's modular file defines its image processor's post-processing (a top-k bounded by `min`),
    which the converter puts in another file than the modeling file: the rewrite is refused, and the helper the
    codemod would add at the top level is not left behind."""
    from exportsmith.pipeline import OUTSIDE_MODELING_CODE

    source = (
        "import torch\n\n\nclass ToyLayer:\n    pass\n\n\nclass ToyImageProcessor:\n"
        "    def post_process(self, prob, top_k):\n        k_value = min(top_k, prob.size(1))\n"
        "        return torch.topk(prob, k_value, dim=1)\n"
    )
    expansion = "import torch\n\n\nclass ToyLayer(nn.Module):\n    pass\n"
    relpath, module = "models/toy/modular_toy.py", "transformers.models.toy.modular_toy"
    change = run_codemods(source, relpath, module, (BY_NAME["bounded_topk"],), expansions=(expansion,))
    assert [(f.kind, f.reason) for f in change.findings] == [("refused", OUTSIDE_MODELING_CODE)]
    assert not change.changed and change.rewritten == source
    alone = run_codemods(source, relpath, module, (BY_NAME["bounded_topk"],))
    assert "def topk_size" in alone.rewritten and [f.kind for f in alone.findings] == ["rewritten"]
