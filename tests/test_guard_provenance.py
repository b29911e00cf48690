"""Guard provenance: a guard-rejected program and a refused dynamic dim name the line that made the guard."""

import importlib.util
from pathlib import Path

import pytest
import torch

from exportsmith.verify.check import Case, Program, VerifyResult, check_programs, run
from exportsmith.verify.guards import GuardLog, construct_at, guard_source

MODELS = Path(__file__).parent / "guard_models" / "shape_tests.py"
PACKAGES = ("guard_models",)  # the fixture modules' directory: frames there are the "user" frames
DYNAMIC = ("dynamic",)


def fixture_module():
    spec = importlib.util.spec_from_file_location("guard_models_shape_tests", MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def line_of(text: str) -> int:
    """The line number of `text` in the fixture models (so the tests do not hard-code numbers)."""
    lines = MODELS.read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.strip() == text)


def program_of(batches: tuple[int, ...]) -> Program:
    def inputs(batch):
        return {"x": torch.randn(batch, 4, generator=torch.Generator().manual_seed(batch))}

    cases = tuple(Case(f"batch{b}", b, 0, 0, lambda b=b: inputs(b)) for b in batches)
    return Program("forward", cases)


def verify(model: torch.nn.Module, batches: tuple[int, ...]) -> VerifyResult:
    program = program_of(batches)
    references = {(program.name, case.name): run(model, case) for case in program.cases}
    # Dim.DYNAMIC: named dims (the primary style) turn a guard on the batch into an export error
    return check_programs(VerifyResult("fixture", "original"), model, [program], references, PACKAGES, styles=DYNAMIC)


def test_a_guard_rejected_program_names_the_branch_that_made_the_guard():
    result = verify(fixture_module().BatchBranch().eval(), (10, 3, 12))
    assert result.failure == "guard-rejected", result.summary
    assert "Guard failed: x.size()[0] >= 8" in result.message
    where = f"guard_models/shape_tests.py:{line_of('if x.shape[0] >= 8:')}"
    assert result.location == where
    assert result.guard == {
        "guard": "L['x'].size()[0] >= 8",
        "case": "batch3",
        "location": where,
        "line": "if x.shape[0] >= 8:",
        "construct": "if",
        "branch": True,
    }
    assert result.record()["guard"] == result.guard
    assert result.summary.endswith(f"at {where} (if: if x.shape[0] >= 8:)")


def test_a_refused_dynamic_dim_names_the_elif_that_pins_it():
    result = verify(fixture_module().PinnedBatch().eval(), (4, 2, 6))
    assert result.failure == "export-error" and "Constraints violated" in result.message, result.summary
    where = f"guard_models/shape_tests.py:{line_of('elif x.shape[0] == 4:')}"
    assert result.location == where
    assert result.guard["line"] == "elif x.shape[0] == 4:"
    assert result.guard["construct"] == "elif" and result.guard["branch"]
    assert result.guard["case"] == "batch2"


def test_a_guard_made_by_an_operation_is_not_a_branch():
    result = verify(fixture_module().TrimmedBatch().eval(), (10, 3))
    assert result.failure == "guard-rejected", result.summary
    assert result.location == f"guard_models/shape_tests.py:{line_of('return x[: x.shape[0] - 5].sum(0)')}"
    assert result.guard["construct"] == "statement" and not result.guard["branch"]


def test_a_size_refused_by_a_derived_range_names_the_guard_it_came_from():
    def inputs(x, y):
        seeded = torch.Generator().manual_seed
        return lambda: {"x": torch.randn(x, 4, generator=seeded(x)), "y": torch.randn(y, 4, generator=seeded(y))}

    program = Program("forward", (Case("3-4", 3, 0, 0, inputs(3, 4)), Case("7-1", 7, 0, 0, inputs(7, 1))))
    model = fixture_module().ShortPair().eval()
    references = {(program.name, case.name): run(model, case) for case in program.cases}
    result = check_programs(
        VerifyResult("fixture", "original"), model, [program], references, PACKAGES, styles=DYNAMIC
    )
    assert result.failure == "guard-rejected" and "x.size()[0] <= 6" in result.message, result.summary
    assert result.guard["case"] == "7-1"
    # the guard itself, which holds at (7, 1) (sympy orders the terms)
    assert result.guard["guard"] in (
        "L['x'].size()[0] + L['y'].size()[0] <= 8",
        "L['y'].size()[0] + L['x'].size()[0] <= 8",
    )
    assert result.location == f"guard_models/shape_tests.py:{line_of('if x.shape[0] + y.shape[0] <= 8:')}"
    assert result.guard["construct"] == "if"


def test_a_program_that_passes_every_case_has_no_failing_guard():
    module = fixture_module()
    program = program_of((10, 9, 12))
    with GuardLog(PACKAGES) as log:
        exported = torch.export.export(
            module.BatchBranch(), (), program.cases[0].inputs(), dynamic_shapes={"x": {0: torch.export.Dim.DYNAMIC}}
        )
    assert log.sites  # the guard was seen...
    assert guard_source(exported, log, [(case.name, case.inputs()) for case in program.cases]) is None  # ...and holds


def test_only_a_rejected_program_is_exported_under_the_guard_log(monkeypatch):
    # the log turns on torch's guard logging and its stack summaries: a program that passes must not pay for it
    entered = []
    original_enter = GuardLog.__enter__
    monkeypatch.setattr(GuardLog, "__enter__", lambda self: entered.append(self) or original_enter(self))
    assert verify(fixture_module().BatchBranch().eval(), (10, 9, 12)).failure is None
    assert entered == []
    assert verify(fixture_module().BatchBranch().eval(), (10, 3, 12)).failure == "guard-rejected"
    assert len(entered) == 1 and entered[0].sites


def test_the_guard_log_leaves_the_shape_env_logger_as_it_was():
    import logging

    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    before = (logger.level, logger.propagate, list(logger.handlers), logger.isEnabledFor(logging.INFO))
    with GuardLog(PACKAGES):
        assert logger.isEnabledFor(logging.INFO)
    assert (logger.level, logger.propagate, list(logger.handlers), logger.isEnabledFor(logging.INFO)) == before


SOURCE = """\
def f(x, n):
    if n > 1:
        pass
    elif n == 0:
        pass
    y = 2 if n > 3 else 1
    while n > 4:
        n -= 1
    z = [i for i in range(3) if i < n]
    for i in range(n):
        pass
    assert n != 5
    if (n > 6) if n else n < 7:
        pass
    return torch.cat([x, x])
"""


@pytest.mark.parametrize(
    "line, column, construct",
    [
        (2, 7, "if"),
        (4, 9, "elif"),
        (6, 13, "ternary"),
        (6, 8, "statement"),  # the conditional expression's value, not its test
        (7, 10, "while"),
        (9, 32, "comprehension"),
        (10, 13, "for"),
        (12, 11, "assert"),
        (13, 18, "ternary"),  # the test of a conditional expression inside an if's test: the innermost wins
        (13, 8, "if"),  # the conditional expression's value is the if's test
        (13, None, "if"),  # without a column, the line's outermost test
        (15, 11, "statement"),
    ],
)
def test_the_construct_of_a_line_is_read_from_its_syntax_tree(tmp_path, line, column, construct):
    path = tmp_path / "shapes.py"
    path.write_text(SOURCE)
    assert construct_at(str(path), line, column) == construct


def test_a_guard_on_a_named_dim_is_an_export_error_that_names_the_style_and_the_branch():
    # with Dim("batch", min=1) the range says the batch may be anything from 1: the branch's guard contradicts it
    program = program_of((10, 3, 12))
    model = fixture_module().BatchBranch().eval()
    references = {(program.name, case.name): run(model, case) for case in program.cases}
    result = check_programs(
        VerifyResult("fixture", "original"), model, [program], references, PACKAGES, styles=("dynamic", "named")
    )
    assert result.failure == "export-error", result.summary
    assert result.message.startswith("forward (named dims): ") and "Constraints violated" in result.message
    assert result.guard["line"] == "if x.shape[0] >= 8:" and result.guard["branch"]
    assert {record.dims for record in result.cases} == {"dynamic"}  # the program that exported ran its cases


def test_an_unprovable_guard_on_a_named_dim_is_named_in_the_message():
    # torch 2.13 cannot prove `t * min(64, 64 t) == 64 t` for t >= 1 (docs/TORCH_BUGS.md, 3): the first line names
    # only the dim; the message says which guard
    class FlattenUnflatten(torch.nn.Module):
        def forward(self, x):
            return x.view(-1, x.size(-1)).view(x.shape) * 2

    def inputs(batch, tokens):
        return lambda: {"x": torch.randn(batch, tokens, 64, generator=torch.Generator().manual_seed(tokens))}

    program = Program("forward", (Case("2-5", 2, 5, 0, inputs(2, 5)), Case("1-3", 1, 3, 0, inputs(1, 3))))
    model = FlattenUnflatten()
    references = {(program.name, case.name): run(model, case) for case in program.cases}
    result = check_programs(VerifyResult("fixture", "original"), model, [program], references, PACKAGES)
    assert result.failure == "export-error", result.summary
    assert result.message.startswith("forward: UserError: Constraints violated (tokens)!")
    assert "Unsatisfied for some tokens: (L['x'].size()[1]*min(64, 64*L['x'].size()[1])) == (64*L['x'].size()[1])" in (
        result.message
    )
