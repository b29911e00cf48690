"""Runtime tests of `cond-branches`: the rewritten fixture functions (`fixtures/cond_branches/*.in.py` run through
`run_codemods` here) behave exactly like the originals in eager, and export.

For every supported shape:
1. eager: original and rewritten give bit-identical results on inputs that take each arm, and raise the same
   exception with the same message where the original raises;
2. `torch.export.export(..., strict=False)` of the rewritten function succeeds; its graph holds a `cond` (select) or
   an `_assert_async` (raise); the exported program matches eager bit for bit on inputs that take each arm, at other
   sizes than the traced ones, and raises on an input the original rejects.
"""

from __future__ import annotations

import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.export import Dim

from codemods.cond_branches import CondBranches
from exportsmith.pipeline import run_codemods
from source_modules import module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "cond_branches"


def _original_and_rewritten(case: str) -> tuple[types.ModuleType, types.ModuleType]:
    source = (FIXTURES / f"{case}.in.py").read_text()
    change = run_codemods(source, f"{case}.py", "transformers.models.toy.modeling_toy", codemods=(CondBranches,))
    assert change.applied == ("cond-branches",)
    return module_from_source(source, f"{case}_original"), module_from_source(change.rewritten, f"{case}_rewritten")


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A view that compares NaNs and signed zeros bit for bit."""
    if tensor.dtype.is_floating_point:
        return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])
    return tensor


def assert_identical(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(_bits(actual), _bits(expected))


class _Call(torch.nn.Module):
    def __init__(self, function, *constants):
        super().__init__()
        self.function, self.constants = function, constants

    def forward(self, *tensors):
        return self.function(*tensors, *self.constants)


def _export(module: torch.nn.Module, args: tuple) -> torch.export.ExportedProgram:
    dynamic = tuple({dim: Dim.AUTO for dim in range(arg.dim())} for arg in args)
    if isinstance(module, _Call):
        dynamic = (dynamic,)  # `forward(*tensors)`: one argument, the tuple
    return torch.export.export(module, args, dynamic_shapes=dynamic, strict=False)


def _targets(program: torch.export.ExportedProgram) -> list[str]:
    return [str(node.target) for node in program.graph.nodes if node.op == "call_function"]


def _conds(program: torch.export.ExportedProgram) -> int:
    """`cond` nodes in the program and in its branch subgraphs (a nested cond lives in its parent's branch)."""
    graphs = [module.graph for module in program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)]
    return sum(1 for graph in graphs for node in graph.nodes if node.target is torch.ops.higher_order.cond)


def _raises(function, *args) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        function(*args)
    return info.type, str(info.value)


# ----------------------------------------------------------------------------------------------------------------
# Raise-only branches -> torch._assert_async
# ----------------------------------------------------------------------------------------------------------------

RAISE_CASES = [
    # case, function, constants, traced input, other passing input, violating input
    (
        "raise_any",
        "check_lengths",
        (),
        (torch.tensor([3, 5, 2]),),
        (torch.tensor([7, 1, 4, 9, 2]),),
        (torch.tensor([3, 0, 2, 1]),),
    ),
    (
        # uint8: `.any()` is uint8 and the assertion must be a logical not, not `~`
        "raise_any",
        "check_mask",
        (),
        (torch.zeros(2, 3, dtype=torch.uint8),),
        (torch.zeros(4, 5, dtype=torch.uint8),),
        (torch.tensor([[0, 2, 0], [0, 0, 0]], dtype=torch.uint8),),
    ),
    (
        "raise_not",
        "box_iou",
        (),
        (torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 3.0, 2.0]]), torch.tensor([[0.0, 0.0, 2.0, 2.0]] * 3)),
        (torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 4), torch.tensor([[0.5, 0.5, 2.0, 2.0]] * 2)),
        (torch.tensor([[0.0, 0.0, 1.0, 1.0], [2.0, 1.0, 1.0, 2.0]]), torch.tensor([[0.0, 0.0, 2.0, 2.0]] * 3)),
    ),
    (
        "raise_torch_all",
        "check_attention_mask",
        (),
        (torch.tensor([[1, 1, 0], [1, 0, 0]]), torch.ones(2, 3, dtype=torch.long)),
        (torch.tensor([[0, 0, 0, 1]] * 3), torch.ones(3, 4, dtype=torch.long)),
        (torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)),
    ),
    (
        # the Python conjunct (a string compared at trace time) stays an outer `if`
        "raise_torch_all",
        "check_target",
        ("negative_binomial",),
        (torch.tensor([1.0, 2.0, 0.0]),),
        (torch.tensor([4.0, 0.0, 3.0, 2.0, 1.0]),),
        (torch.tensor([1.0, -2.0, 0.0]),),
    ),
]


@pytest.mark.parametrize(
    "case, name, constants, traced, passing, violating", RAISE_CASES, ids=[f"{c[0]}.{c[1]}" for c in RAISE_CASES]
)
def test_raise_branch_asserts_in_the_exported_program(case, name, constants, traced, passing, violating):
    original, rewritten = _original_and_rewritten(case)
    before, after = getattr(original, name), getattr(rewritten, name)
    for args in (traced, passing):
        assert_identical(after(*args, *constants), before(*args, *constants))
    # Eager raises exactly as before: same type, same message
    assert _raises(after, *violating, *constants) == _raises(before, *violating, *constants)

    module = _Call(after, *constants)
    program = _export(module, traced)
    assert "aten._assert_async.msg" in _targets(program)
    for args in (traced, passing):
        assert_identical(program.module()(*args), module(*args))
    with pytest.raises(RuntimeError):
        program.module()(*violating)


def test_raise_branch_with_a_python_conjunct_that_is_false_exports_no_assertion():
    _, rewritten = _original_and_rewritten("raise_torch_all")
    program = _export(_Call(rewritten.check_target, "normal"), (torch.tensor([1.0, -2.0, 0.0]),))
    assert "aten._assert_async.msg" not in _targets(program)
    assert_identical(program.module()(torch.tensor([-1.0, 2.0])), torch.tensor([-1.0, 2.0]))


# ----------------------------------------------------------------------------------------------------------------
# Select branches -> torch.cond
# ----------------------------------------------------------------------------------------------------------------


def _identity_layer(cls, hidden_size: int, dtype: torch.dtype) -> torch.nn.Module:
    layer = cls(hidden_size)
    with torch.no_grad():
        layer.fc.weight.copy_(torch.eye(hidden_size))
        layer.fc.bias.zero_()
    return layer.to(dtype).eval()


def _hidden_states(dtype: torch.dtype, batch: int, length: int, overflow: bool) -> torch.Tensor:
    """Small values; with `overflow`, a few that the layer doubles past the fp16 range (inf in fp16)."""
    hidden_states = torch.linspace(-1, 1, batch * length * 8).reshape(batch, length, 8).to(dtype)
    if overflow:
        hidden_states[0, 0, :3] = 60000.0
        hidden_states[-1, -1, -1] = -50000.0
    return hidden_states


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp16_clamp_exports_with_cond_and_matches_eager_in_both_arms(dtype):
    original, rewritten = _original_and_rewritten("select_fp16_clamp")
    before = _identity_layer(original.ToyEncoderLayer, 8, dtype)
    after = _identity_layer(rewritten.ToyEncoderLayer, 8, dtype)
    after.load_state_dict(before.state_dict())
    cases = [_hidden_states(dtype, b, n, overflow) for b, n in ((2, 3), (1, 5)) for overflow in (False, True)]
    clamped = _hidden_states(dtype, 2, 3, True)
    if dtype == torch.float16:
        assert not torch.isfinite(clamped * 2).all()  # the non-finite arm is taken
    for hidden_states in cases:
        assert_identical(after(hidden_states), before(hidden_states))

    program = _export(after, (_hidden_states(dtype, 2, 3, False),))
    # In fp32 the dtype test (plain Python) is False at trace time: no cond, as in eager
    assert ("cond" in _targets(program)) == (dtype == torch.float16)
    for hidden_states in cases:
        assert_identical(program.module()(hidden_states), before(hidden_states))
    if dtype == torch.float16:
        expected = torch.finfo(torch.float16).max - 1000
        assert program.module()(clamped).abs().max().item() == pytest.approx(expected, rel=1e-3)


def test_fp16_clamp_split_out_of_a_parenthesized_test_and_the_training_only_branch_left_as_written():
    """The clamp under `if self.training:` is not rewritten (an inference export never traces it): the program of the
    module in eval mode holds the other clamp's cond, and eager is identical in both modes."""
    original, rewritten = _original_and_rewritten("select_fp16_clamp")
    config = SimpleNamespace(clamp_fp16_activations_in_every_block=True)
    before, after = original.ToyBlock(), rewritten.ToyBlock()
    for block in (before, after):
        block.config = config
        block.eval()
    traced = _hidden_states(torch.float16, 2, 3, False)
    program = _export(after, (traced,))
    assert _targets(program).count("cond") == 1
    others = (_hidden_states(torch.float16, 3, 4, True), _hidden_states(torch.float16, 1, 2, True))
    for hidden_states in (traced, *others):
        assert_identical(after(hidden_states), before(hidden_states))
        assert_identical(program.module()(hidden_states), before(hidden_states))
    for block in (before, after):
        block.train()
    for hidden_states in (traced, *others):
        assert_identical(after(hidden_states), before(hidden_states))


def _scaled_iou(boxes: torch.Tensor, pred_boxes: torch.Tensor) -> torch.Tensor:
    return boxes[:, None, 0] - pred_boxes[None, :, 0] + 0.5


SELECT_CASES = [
    # case, function, constants, traced input, inputs that take each arm
    (
        "select_torch_any_helper",
        "limit_magnitude",
        (2.0,),
        (torch.tensor([[0.5, -1.0, 1.5], [0.25, 0.0, -0.5]]),),
        [(torch.tensor([[0.5, -1.0], [0.1, 0.2]]),), (torch.tensor([[0.5, -4.0, 3.0, 1.0]]),)],
    ),
    (
        "select_torch_any_helper",
        "fall_back_to_generalized_iou",
        (_scaled_iou,),
        (torch.tensor([[0.5, 0.0], [0.0, 0.3]]), torch.rand(2, 4), torch.rand(2, 4)),
        [
            (torch.tensor([[0.5, 0.0, 0.1], [0.0, 0.3, 0.0]]), torch.rand(2, 4), torch.rand(3, 4)),
            (torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.3, 0.0]]), torch.rand(2, 4), torch.rand(3, 4)),
        ],
    ),
]


@pytest.mark.parametrize(
    "case, name, constants, traced, arms", SELECT_CASES, ids=[f"{c[0]}.{c[1]}" for c in SELECT_CASES]
)
def test_select_branch_exports_with_cond_and_matches_eager_in_both_arms(case, name, constants, traced, arms):
    original, rewritten = _original_and_rewritten(case)
    before, after = getattr(original, name), getattr(rewritten, name)
    module = _Call(after, *constants)
    program = _export(module, traced)
    assert "cond" in _targets(program)
    for args in (traced, *arms):
        expected = before(*args, *constants)
        assert_identical(after(*args, *constants), expected)
        assert_identical(program.module()(*args), expected)


# ----------------------------------------------------------------------------------------------------------------
# Every shape of `select_shapes`: if/else, several results, elif chains, both-arm returns, nested ifs
# ----------------------------------------------------------------------------------------------------------------


def _flat(value) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


_GATE = torch.tensor([[-1.0, 2.0, 0.5], [0.25, -3.0, 1.0]])
SHAPE_CASES = [
    # function, constants, traced input, inputs that take each arm (and other sizes), conds in the program
    (
        "several_results",
        (torch.tensor(1.5),),
        (torch.randn(2, 3, generator=torch.Generator().manual_seed(0)), _GATE),
        [(torch.ones(3, 4), -torch.ones(3, 4)), (torch.ones(1, 2), torch.tensor([[0.0, 1.0]]))],
        1,
    ),
    (
        "elif_chain",
        (0.5,),
        (torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]),),
        [
            (torch.tensor([[1.0, 2.0], [0.75, 3.0]]),),  # all above: first arm
            (torch.tensor([[-1.0, -2.0, -0.75]]),),  # all below: elif arm
            (torch.tensor([[1.0], [-1.0], [0.0]]),),  # else arm
        ],
        2,
    ),
    (
        "both_arms_return",
        (),
        (torch.randn(2, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([[True, False, False]] * 2)),
        [
            (torch.randn(3, 4, generator=torch.Generator().manual_seed(2)), torch.zeros(3, 4, dtype=torch.bool)),
            (torch.randn(1, 2, generator=torch.Generator().manual_seed(3)), torch.tensor([[False, True]])),
        ],
        1,
    ),
    (
        "nested_ifs",
        (True, torch.tensor(0.25)),
        (torch.tensor([[1.0, float("nan"), 3.0], [4.0, 5.0, 6.0]]),),
        [
            (torch.tensor([[1.0, 2.0], [3.0, 4.0]]),),  # no NaN: outer arm not taken
            (torch.tensor([[float("nan"), 3.0, 4.0]]),),  # NaN, then all > 1 after the bias: inner arm taken
            (torch.tensor([[float("nan")], [-4.0]]),),  # NaN, inner arm not taken
        ],
        2,
    ),
    (
        "reduction_comparison",
        (torch.tensor(1.0),),
        (torch.tensor([[0.5, 0.25, 1.0], [0.0, 0.5, 0.5]]),),
        [(torch.tensor([[0.1, 0.2], [0.3, 0.1]]),), (torch.tensor([[2.0, 3.0, 1.0, 1.0]]),)],
        1,
    ),
    (
        # the arms give different sizes: torch.cond returns an unbacked size
        "item_of_a_test",
        (7,),
        (torch.tensor([[3, 4, 5], [1, 2, 3]]),),
        [(torch.tensor([[7, 4], [7, 2]]),), (torch.tensor([[1, 2, 3, 4, 5]]),)],
        1,
    ),
    (
        "bound_from_a_reduction",
        (torch.tensor([1.0, 2.0]), 8),
        (torch.arange(6).repeat(2, 1), torch.tensor([0.5, 0.25])),
        [(torch.arange(12).repeat(3, 1), torch.tensor([0.5, 0.25])), (torch.arange(3)[None], torch.ones(2))],
        1,
    ),
    (
        "tensor_elif_after_python_test",
        (False,),
        (torch.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, 6.0]]),),
        [(torch.tensor([[1.0, 2.0], [3.0, 4.0]]),), (torch.tensor([[-1.0, 2.0, -3.0]]),)],
        1,
    ),
]


@pytest.mark.parametrize("name, constants, traced, arms, conds", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_every_shape_takes_both_arms_in_eager_and_in_the_exported_program(name, constants, traced, arms, conds):
    original, rewritten = _original_and_rewritten("select_shapes")
    before, after = getattr(original, name), getattr(rewritten, name)
    module = _Call(after, *constants)
    program = _export(module, traced)
    assert _conds(program) == conds
    for args in (traced, *arms):
        expected = _flat(before(*args, *constants))
        for actual in (_flat(after(*args, *constants)), _flat(program.module()(*args))):
            assert len(actual) == len(expected)
            for a, e in zip(actual, expected):
                assert_identical(a, e)


def test_the_python_test_before_a_tensor_elif_is_taken_at_trace_time():
    original, rewritten = _original_and_rewritten("select_shapes")
    args = (torch.tensor([[-1.0, 2.0]]),)
    program = _export(_Call(rewritten.tensor_elif_after_python_test, True), args)
    assert "cond" not in _targets(program)
    assert_identical(program.module()(*args), original.tensor_elif_after_python_test(*args, True))


def test_eager_never_enters_torch_cond(monkeypatch):
    _, rewritten = _original_and_rewritten("select_shapes")

    def forbidden(*args, **kwargs):
        raise AssertionError("torch.cond called in eager")

    monkeypatch.setattr(torch, "cond", forbidden)
    rewritten.several_results(torch.ones(2, 2), torch.ones(2, 2), 2.0)
    rewritten.elif_chain(torch.ones(2, 2), 0.5)
    rewritten.both_arms_return(torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool))
    rewritten.nested_ifs(torch.full((2, 2), float("nan")), True, 2.0)


# ----------------------------------------------------------------------------------------------------------------
# Operands are the results bound where the `if` runs (`select_bindings`): elif chains whose results are bound only in
# their arms raised UnboundLocalError in eager on the `elif` and `else` paths
# ----------------------------------------------------------------------------------------------------------------

BINDING_CASES = [
    # function, constants, traced input, inputs that take each arm (and other sizes), conds in the program
    (
        "elif_chain_bound_in_its_arms",
        (),
        (torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),),  # sum 21 > 10
        [
            (torch.tensor([[1.0, 2.0], [0.5, 0.25]]),),  # 0 < sum <= 10: the elif arm
            (torch.tensor([[-1.0, -2.0, 0.5]]),),  # sum <= 0: the else arm
            (torch.full((3, 4), 2.0),),
        ],
        2,
    ),
    (
        "long_elif_chain",
        (),
        (torch.tensor([[4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]), torch.tensor(0.5)),
        [
            (torch.tensor([[2.5, 3.0]]), torch.tensor(1.5)),  # all > 2
            (torch.tensor([[0.0, 1.5], [0.5, 0.25]]), torch.tensor(-1.0)),  # some > 1
            (torch.tensor([[0.0, -1.0, 0.5]]), torch.tensor(2.0)),  # else
        ],
        3,
    ),
    (
        "bound_earlier_in_the_arm",
        (),
        (torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([True, False])),
        [
            (torch.tensor([[0.25, 2.0], [4.0, 5.0]]), torch.tensor([True])),  # outer arm, inner not taken
            (torch.tensor([[0.25, 2.0, 3.0]]), torch.tensor([False, False, False])),  # else arm
        ],
        2,
    ),
    (
        "bound_on_some_paths_before",
        (True, torch.tensor(0.5)),
        (torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([True, False])),
        [(torch.tensor([[0.25, 2.0]]), torch.tensor([False, False, False]))],
        1,
    ),
]


@pytest.mark.parametrize("name, constants, traced, arms, conds", BINDING_CASES, ids=[c[0] for c in BINDING_CASES])
def test_operands_bound_where_the_if_runs_take_every_arm_in_eager_and_in_the_exported_program(
    name, constants, traced, arms, conds
):
    original, rewritten = _original_and_rewritten("select_bindings")
    before, after = getattr(original, name), getattr(rewritten, name)
    module = _Call(after, *constants)
    program = _export(module, traced)
    assert _conds(program) == conds
    for args in (traced, *arms):
        expected = _flat(before(*args, *constants))
        for actual in (_flat(after(*args, *constants)), _flat(program.module()(*args))):
            assert len(actual) == len(expected)
            for a, e in zip(actual, expected):
                assert_identical(a, e)


RETURN_CASES = [
    # function, traced input, inputs that take each arm (and other sizes)
    (
        "arm_rebinds_what_it_reads",
        (torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([True, False])),
        [(torch.tensor([[0.5, 2.0]]), torch.tensor([False, False, False])), (torch.ones(3, 1), torch.ones(1) > 0)],
    ),
    (
        "returns_a_pair",
        (torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([False, True])),
        [(torch.tensor([[0.5, 2.0]]), torch.tensor([False, False, False]))],
    ),
]


@pytest.mark.parametrize("name, traced, arms", RETURN_CASES, ids=[c[0] for c in RETURN_CASES])
def test_returning_arms_take_every_arm_in_eager_and_in_the_exported_program(name, traced, arms):
    original, rewritten = _original_and_rewritten("select_returns")
    before, after = getattr(original, name), getattr(rewritten, name)
    program = _export(_Call(after), traced)
    assert _conds(program) == 1
    for args in (traced, *arms):
        expected = _flat(before(*args))
        for actual in (_flat(after(*args)), _flat(program.module()(*args))):
            assert len(actual) == len(expected)
            for a, e in zip(actual, expected):
                assert_identical(a, e)


_H = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
EARLY_RETURN_CASES = [
    # function, constants, traced input, inputs that take each arm (and other sizes), conds in the program
    ("any_masked", (), (_H, _H > 5), [(_H[:1], _H[:1] > 9), (_H.T, _H.T < 2)], 1),
    ("tail_rebinds_what_it_reads", (), (_H, _H > 0), [(_H * 0.1, _H > 0), (_H[:, :2], _H[:, :2] > 0)], 1),
    (
        "two_early_returns",
        (),
        (_H, _H > 5),
        [(_H + 2, _H > 9), (_H - 3, _H > 9), (_H[:1] - 3, _H[:1] > 0)],  # first arm, else of both, second arm
        2,
    ),
    ("early_return_in_a_python_branch", (True,), (_H, _H > 5), [(_H[:1], _H[:1] > 0), (_H.T, _H.T > 0)], 1),
]


@pytest.mark.parametrize(
    "name, constants, traced, arms, conds", EARLY_RETURN_CASES, ids=[c[0] for c in EARLY_RETURN_CASES]
)
def test_early_return_takes_every_arm_in_eager_and_in_the_exported_program(name, constants, traced, arms, conds):
    original, rewritten = _original_and_rewritten("select_early_return")
    before, after = getattr(original, name), getattr(rewritten, name)
    program = _export(_Call(after, *constants), traced)
    assert _conds(program) == conds
    for args in (traced, *arms):
        expected = before(*args, *constants)
        assert_identical(after(*args, *constants), expected)
        assert_identical(program.module()(*args), expected)


def test_early_return_size_test_exported_at_one_size_is_right_at_the_other():
    original, rewritten = _original_and_rewritten("select_early_return")
    traced, single = (_Q, _K[:, :3]), (_Q[:, :1], _K[:, :1])
    # Why the rewrite: the original exports with no guard and is wrong at size 1
    specialised = _export(_Call(original.single_step_or_sequence), traced)
    assert not torch.equal(specialised.module()(*single), original.single_step_or_sequence(*single))
    program = _export(_Call(rewritten.single_step_or_sequence), traced)
    assert _conds(program) == 1
    for args in (traced, single, (_Q[:1, :2], _K[:1, :2]), (_Q[:1, :1], _K[:1, :1])):
        expected = original.single_step_or_sequence(*args)
        assert_identical(rewritten.single_step_or_sequence(*args), expected)
        assert_identical(program.module()(*args), expected)


def test_a_name_bound_only_in_another_arm_of_an_enclosing_if_is_local_to_the_arms_in_eager():
    # rt_detr's post-processing: `index` was an operand and eager raised UnboundLocalError when the topk arm ran.
    # Export is not checked: torch.cond rejects topk's `Max(1, s)` strides (the docstring's known limit)
    original, rewritten = _original_and_rewritten("select_bindings")
    for args in (
        (torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(6)), torch.zeros(2, 3, 4), False),  # topk
        (torch.randn(1, 2, 4, generator=torch.Generator().manual_seed(7)), torch.zeros(1, 3, 4), False),
        (torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(8)), torch.zeros(2, 3, 4), True),
    ):
        expected = original.bound_only_in_another_arm(*args)
        actual = rewritten.bound_only_in_another_arm(*args)
        for a, e in zip(actual, expected, strict=True):
            assert_identical(a, e)


def test_a_result_bound_on_some_paths_before_the_if_needs_no_value_in_eager():
    original, rewritten = _original_and_rewritten("select_bindings")
    args = (torch.tensor([[1.0, -2.0]]), torch.tensor([False, True]), False, torch.tensor(0.5))  # `shifted` unbound
    assert_identical(rewritten.bound_on_some_paths_before(*args), original.bound_on_some_paths_before(*args))


# ----------------------------------------------------------------------------------------------------------------
# Size tests: traced at sizes >= 2, the program must still take the other arm at size 1
# ----------------------------------------------------------------------------------------------------------------

_Q = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(4))
_K = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(5))
SIZE_CASES = [
    # function, traced input, inputs at other sizes (the other arm among them)
    ("decode_or_prefill", (_Q, _K), [(_Q[:, :1], _K), (_Q[:1, :2], _K[:1, :4])]),
    ("squeeze_single_step", (_Q,), [(_Q[:, :1],), (_K,)]),
]
# `same_lengths` (q_len == kv_len) is rewritten but does not export on torch 2.13: torch.cond rejects the
# `Max(1, s)` strides of its slices ("output stride is not a simple accumulative multiplication of sizes").


@pytest.mark.parametrize("name, traced, others", SIZE_CASES, ids=[c[0] for c in SIZE_CASES])
def test_size_test_exported_at_one_size_is_right_at_the_other(name, traced, others):
    original, rewritten = _original_and_rewritten("select_size_tests")
    before, after = getattr(original, name), getattr(rewritten, name)
    program = _export(_Call(after), traced)
    assert _conds(program) == 1
    for args in (traced, *others):
        expected = before(*args)
        assert_identical(after(*args), expected)
        assert_identical(program.module()(*args), expected)


def test_the_original_size_test_is_silently_specialised():
    """Why the rewrite: the original exports with no guard and gives a wrong answer at size 1."""
    original, _ = _original_and_rewritten("select_size_tests")
    program = _export(_Call(original.squeeze_single_step), (_Q,))
    single = _Q[:, :1]
    assert not torch.equal(program.module()(single), original.squeeze_single_step(single))


# ----------------------------------------------------------------------------------------------------------------
# Sites that only a targets file makes candidates (`listed_targets.targets.json`)
# ----------------------------------------------------------------------------------------------------------------


def _listed_original_and_rewritten() -> tuple[types.ModuleType, types.ModuleType]:
    from codemods.cond_branches import load_targets

    source = (FIXTURES / "listed_targets.in.py").read_text()
    codemod = CondBranches.with_targets(load_targets(FIXTURES / "listed_targets.targets.json"))
    change = run_codemods(source, "listed_targets.in.py", "transformers.models.toy.modeling_toy", codemods=(codemod,))
    assert change.applied == ("cond-branches",)
    return module_from_source(source, "listed_targets_original"), module_from_source(
        change.rewritten, "listed_targets_rewritten"
    )


def test_listed_tensor_test_exports_with_cond_and_matches_eager_in_both_arms():
    original, rewritten = _listed_original_and_rewritten()
    traced = (torch.randn(2, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([[0.5, -1.0], [2.0, 3.0]]))
    program = _export(_Call(rewritten.gate_by_first_score), traced)
    assert _conds(program) == 1
    arms = [
        (torch.randn(3, 4), torch.tensor([[-0.25, 1.0, 1.0]])),  # gate <= 0: the else arm, at other sizes
        (torch.randn(1, 2), torch.tensor([[4.0]])),  # gate > 0, batch 1
    ]
    for args in (traced, *arms):
        expected = original.gate_by_first_score(*args)
        assert_identical(rewritten.gate_by_first_score(*args), expected)
        assert_identical(program.module()(*args), expected)


def test_listed_comparison_of_an_item_is_a_symbool_predicate_in_both_arms():
    original, rewritten = _listed_original_and_rewritten()
    before, after = original.ToyPadder(), rewritten.ToyPadder()
    limit = 3
    traced = (torch.randn(2, 3, generator=torch.Generator().manual_seed(2)), torch.tensor([[1, 0, 1], [0, 0, 0]]))
    program = _export(_Call(after.scale_by_count, limit), traced)
    assert _conds(program) == 1
    arms = [
        (torch.randn(3, 2), torch.ones(3, 2, dtype=torch.long)),  # count 6 >= limit: the input, cloned
        (torch.randn(1, 4), torch.tensor([[0, 1, 0, 0]])),  # count 1 < limit
    ]
    for args in (traced, *arms):
        expected = before.scale_by_count(*args, limit)
        assert_identical(after.scale_by_count(*args, limit), expected)
        assert_identical(program.module()(*args), expected)
