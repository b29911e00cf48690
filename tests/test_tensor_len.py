"""tensor-len: which `len()`s it rewrites or refuses (with reasons), and, at run time, the RT-DETR decoder-input form
(`fixtures/tensor_len/decoder_inputs.in.py` run through the codemod here) is bit-identical to the original in eager,
and one program exported with a dynamic batch matches the original at other batch sizes, where the original
specialises the batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from codemods.tensor_len import TensorLen
from exportsmith.pipeline import run_codemods
from source_modules import model_pair

FIXTURES = Path(__file__).parent / "fixtures" / "tensor_len"
MODULE = "transformers.models.toy.modeling_toy"


def _change(case: str):
    path = FIXTURES / f"{case}.in.py"
    return run_codemods(path.read_text(), path.name, MODULE, codemods=(TensorLen,))


def test_findings_name_each_rewrite_and_each_refusal_with_its_reason():
    rewritten = [(f.line, f.construct) for f in _change("decoder_inputs").findings if f.kind == "rewritten"]
    assert rewritten == [
        (21, "ToyDetrModel.forward"),
        (28, "stacked"),
        (36, "concatenated_by_alias"),
        (42, "with_a_long_line"),
    ]
    refused = {f.construct: f.reason for f in _change("refuse_other_forms").findings}
    assert refused == {
        "read_between": "a statement between the concatenation and the len() names `joined`",
        "rebound_between": "a statement between the concatenation and the len() names `joined`",
        "other_block": "`joined` is not bound by a concatenation earlier in the same block",
        "list_in_one_arm": "`seq` is not bound by a concatenation earlier in the same block",
        "named_in_a_closure": "`joined` is named in a nested function, lambda or global/nonlocal",
    }  # not_a_concatenation and shadowed_len are not candidates
    assert not _change("refuse_other_forms").changed
    assert [f.reason for f in _change("refuse_no_torch_import").findings] == ["the module does not `import torch`"]


def _models():
    change = _change("decoder_inputs")
    assert change.applied == ("tensor-len",)
    return model_pair(change, "ToyDetrModel", "tensor_len")


def _pixels(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(batch))


def _export(model, batch: int = 2):
    with torch.no_grad():
        return torch.export.export(model, (_pixels(batch),), dynamic_shapes=({0: Dim.DYNAMIC},), strict=False)


@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_eager_is_bit_identical(batch: int):
    original, rewritten = _models()
    with torch.no_grad():
        assert torch.equal(original(_pixels(batch)), rewritten(_pixels(batch)))


def test_one_exported_program_matches_the_original_at_other_batch_sizes():
    original, rewritten = _models()
    program = _export(rewritten)
    for batch in (1, 2, 3, 5):
        with torch.no_grad():
            expected = original(_pixels(batch))
        actual = program.module()(_pixels(batch))
        assert expected.shape[0] == batch
        assert torch.equal(expected, actual), batch


def test_the_original_len_specialises_the_batch():
    original, _ = _models()
    with pytest.raises(Exception, match=r"Constraints violated"):
        _export(original)


def test_the_prefilter_needs_a_len_of_a_name_that_a_concatenation_binds():
    assert TensorLen.might_apply("x = torch.cat([a, b], 1)\nn = len(x)\n")
    assert TensorLen.might_apply("x = torch.stack(parts)\nn = len(x)\n")
    # `len(` and `cat(` in the file, but the counted name is never a concatenation's result
    assert not TensorLen.might_apply("x = torch.cat([a, b], 1)\nn = len(items)\n")
    assert not TensorLen.might_apply("y = torch.cat([a, b], 1)\n")
