"""shift-by-one: which shifts it rewrites or refuses (with reasons), and, at run time, the shifted forms of
`fixtures/shift_by_one/shifts.in.py` (Zaya's delayed values, Grounding DINO's previous special token, MobileBERT's
trigram input, NeoMME's previous ids) run through the codemod here are bit-identical to the originals in eager at
every length, and one program exported with a named token range that holds 2 matches them at every length of it,
where the originals' export is rejected (`L - 1 != 1`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from codemods.shift_by_one import ShiftByOne
from exportsmith.pipeline import run_codemods
from source_modules import model_pair, module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "shift_by_one"
LENGTHS = (1, 2, 3, 7)


def _change(case: str, module: str = "transformers.models.toy.modeling_toy"):
    path = FIXTURES / f"{case}.in.py"
    return run_codemods(path.read_text(), path.name, module, codemods=(ShiftByOne,))


def test_findings_name_each_rewrite_and_each_refusal_with_its_reason():
    assert [f.line for f in _change("shifts").findings if f.kind == "rewritten"] == [14, 15, 25, 30, 36, 47]
    refused = {f.construct: f.reason for f in _change("refuse_other_forms").findings}
    not_a_name = "the shifted tensor is not a name: its size check would evaluate it a second time"
    assert refused == {"not_a_name": not_a_name, "pad_of_an_expression": not_a_name}
    # no candidates: a slice along another dim than the concatenation's, three pieces, a padding on the cut side (it
    # would shift the padding too), a reflection (it reads the values next to the cut)
    assert not _change("refuse_other_forms").changed
    assert [f.reason for f in _change("refuse_no_torch_import").findings] == ["the module does not `import torch`"]


def test_shared_modules_are_refused():
    change = _change("shifts", module="transformers.masking_utils")
    assert not change.changed
    assert {f.reason for f in change.findings} == {
        "`transformers.masking_utils` is a shared module, whose classes must stay transformers' own"
    }


def _values(length: int, batch: int = 2):
    generator = torch.Generator().manual_seed(length)
    return torch.randn(batch, length, 4, generator=generator), torch.randn(batch, 1, 4, generator=generator)


def _special(length: int, batch: int = 2) -> torch.Tensor:
    return torch.rand(batch, length, generator=torch.Generator().manual_seed(length)) > 0.6


def _functions():
    change = _change("shifts")
    original = module_from_source(change.original, "shift_by_one_original")
    rewritten = module_from_source(change.rewritten, "shift_by_one_rewritten")
    return original, rewritten


def test_eager_is_bit_identical():
    original, rewritten = model_pair(_change("shifts"), "ToyDelayedValues", "shift_by_one")
    functions = _functions()
    with torch.no_grad():
        for length in LENGTHS:
            assert torch.equal(original(*_values(length)), rewritten(*_values(length))), length
            expected, actual = (f.previous_special(_special(length)) for f in functions)
            assert torch.equal(expected, actual), length
            embeddings, ids = _values(length)[0], torch.randint(0, 9, (2, length))
            assert torch.equal(functions[0].trigram(embeddings), functions[1].trigram(embeddings)), length
            assert torch.equal(functions[0].previous_ids(ids, 3), functions[1].previous_ids(ids, 3)), length
            rows, first = torch.randn(length, 3), torch.randn(2, 3)
            assert torch.equal(
                functions[0].along_the_first_dim(first, rows), functions[1].along_the_first_dim(first, rows)
            )


class _Function(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, tensor):
        return self.function(tensor)


def test_one_program_over_a_range_holding_two_matches_the_original():
    tokens = Dim("tokens", min=2, max=32)
    original, rewritten = model_pair(_change("shifts"), "ToyDelayedValues", "shift_by_one")
    shapes = ({1: tokens}, None)
    with pytest.raises(Exception, match=r"Constraints violated \(tokens\)"):
        torch.export.export(original, _values(5), dynamic_shapes=shapes, strict=False)
    program = torch.export.export(rewritten, _values(5), dynamic_shapes=shapes, strict=False).module()
    for length in (2, 3, 7, 32):
        with torch.no_grad():
            assert torch.equal(original(*_values(length)), program(*_values(length))), length

    functions = _functions()
    for name, inputs in (("previous_special", _special), ("trigram", lambda length: _values(length)[0])):
        original_function, rewritten_function = (getattr(module, name) for module in functions)
        with pytest.raises(Exception, match=r"Constraints violated \(tokens\)"):
            torch.export.export(
                _Function(original_function), (inputs(5),), dynamic_shapes=({1: tokens},), strict=False
            )
        program = torch.export.export(
            _Function(rewritten_function), (inputs(5),), dynamic_shapes=({1: tokens},), strict=False
        ).module()
        for length in (2, 3, 7, 32):
            assert torch.equal(original_function(inputs(length)), program(inputs(length))), (name, length)
