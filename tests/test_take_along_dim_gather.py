"""take-along-dim-gather: which calls it rewrites or refuses (with reasons), and, at run time, PP-DocLayoutV2's
post-processing form (`fixtures/take_along_dim_gather/detections.in.py` run through the codemod here) is
bit-identical to the original in eager, and one program exported with a dynamic batch matches the original at other
batch sizes, where the original specialises the batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from codemods.take_along_dim_gather import TakeAlongDimGather
from exportsmith.pipeline import run_codemods
from source_modules import model_pair, module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "take_along_dim_gather"


def _change(case: str, module: str = "transformers.models.toy.modeling_toy"):
    path = FIXTURES / f"{case}.in.py"
    return run_codemods(path.read_text(), path.name, module, codemods=(TakeAlongDimGather,))


def test_findings_name_each_rewrite_and_each_refusal_with_its_reason():
    assert [f.line for f in _change("detections").findings if f.kind == "rewritten"] == [19, 20, 21, 22]
    refused = {f.construct: f.reason for f in _change("refuse_other_forms").findings}
    statement = "the call is not the whole value of a `Y = torch.take_along_dim(X, I, dim=D)` statement"
    assert refused == {
        "flattened": "the call does not give `dim` (it flattens) or has other arguments",
        "in_a_return": statement,
        "two_targets": statement,
        "gather_along_dim": "the module already uses the name `gather_along_dim`",
    }
    assert not _change("refuse_other_forms").changed
    assert [f.reason for f in _change("refuse_no_torch_import").findings] == ["the module does not `import torch`"]


def test_shared_modules_are_refused():
    change = _change("detections", module="transformers.modeling_utils")
    assert not change.changed
    assert {f.reason for f in change.findings} == {
        "`transformers.modeling_utils` is a shared module, whose classes must stay transformers' own"
    }


def _models():
    change = _change("detections")
    assert change.applied == ("take-along-dim-gather",)
    return model_pair(change, "ToyDetector", "take_along_dim")


def _hidden(batch: int) -> torch.Tensor:
    return torch.randn(batch, 7, 6, generator=torch.Generator().manual_seed(batch))


def _export(model, batch: int = 2):
    with torch.no_grad():
        return torch.export.export(model, (_hidden(batch),), dynamic_shapes=({0: Dim.DYNAMIC},), strict=False)


def _equal(expected, actual) -> bool:
    return all(torch.equal(e, a) for e, a in zip(expected, actual, strict=True))


@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_eager_is_bit_identical(batch: int):
    original, rewritten = _models()
    with torch.no_grad():
        assert _equal(original(_hidden(batch)), rewritten(_hidden(batch)))


def test_one_exported_program_matches_the_original_at_other_batch_sizes():
    original, rewritten = _models()
    program = _export(rewritten)
    for batch in (1, 2, 3, 5):
        with torch.no_grad():
            expected = original(_hidden(batch))
        actual = program.module()(_hidden(batch))
        assert expected[0].shape[0] == batch
        assert _equal(expected, actual), batch


def test_the_original_take_along_dim_specialises_the_batch():
    original, _ = _models()
    with pytest.raises(Exception, match=r"Constraints violated"):
        _export(original)


def test_the_helper_asserts_the_sizes_take_along_dim_would_broadcast():
    """An index of size 1 outside `dim`: take_along_dim broadcasts it, gather would return fewer values, so the helper
    refuses it (`torch._check`); an index of the input's sizes gives take_along_dim's values."""
    helper = module_from_source(_change("detections").rewritten, "take_along_dim_helper").gather_along_dim
    scores, indices = torch.randn(3, 4), torch.tensor([[2, 0, 1, 3]])
    assert torch.equal(helper(scores, indices.expand(3, 4), 1), torch.take_along_dim(scores, indices, dim=1))
    assert torch.equal(helper(scores, indices.expand(3, 4), -1), torch.take_along_dim(scores, indices, dim=-1))
    with pytest.raises(RuntimeError):
        helper(scores, indices, 1)
    with pytest.raises(RuntimeError):
        helper(scores, indices[0], 1)
