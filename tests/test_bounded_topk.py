"""bounded-topk: which `K = min(A, X.shape[D])` statements it rewrites or refuses (with reasons), and, at run time, the
DeepSeek-V3.2 indexer's selection (`fixtures/bounded_topk/indexer.in.py` run through the codemod here) is
bit-identical to the original in eager, and one program exported with a named token range that crosses `index_topk`
matches the original at every length of it, where the original's export is rejected."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from codemods.bounded_topk import BoundedTopk
from exportsmith.pipeline import run_codemods
from source_modules import model_pair, module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "bounded_topk"
LENGTHS = (1, 2, 3, 4, 5, 9, 16)  # index_topk is 4: below, at and above it


def _change(case: str, module: str = "transformers.models.toy.modeling_toy"):
    path = FIXTURES / f"{case}.in.py"
    return run_codemods(path.read_text(), path.name, module, codemods=(BoundedTopk,))


def test_findings_name_each_rewrite_and_each_refusal_with_its_reason():
    assert [f.line for f in _change("indexer").findings if f.kind == "rewritten"] == [16, 23]
    refused = {f.construct: f.reason for f in _change("refuse_other_uses").findings}
    assert refused == {
        "k_in_a_loop": "`k` is used otherwise than as the k of `scores`'s top-k: an unbacked size there would need "
        "guards of its own",
        "another_dim": "`k` is the k of a top-k over another dim than 1",
        "another_tensor": "`k` is the k of a top-k of another tensor than `scores`",
        "topk_size": "the module already uses the name `topk_size`",
    }  # `not_a_topk` and `shadowed` (a `min` that is not the builtin) are no candidates
    assert not _change("refuse_other_uses").changed
    assert [f.reason for f in _change("refuse_no_torch_import").findings] == ["the module does not `import torch`"]


def test_shared_modules_are_refused():
    change = _change("indexer", module="transformers.masking_utils")
    assert not change.changed
    assert {f.reason for f in change.findings} == {
        "`transformers.masking_utils` is a shared module, whose classes must stay transformers' own"
    }


def _inputs(length: int, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(length)
    hidden = torch.randn(batch, length, 8, generator=generator)
    causal = torch.full((length, length), float("-inf")).triu(1).expand(batch, length, length)
    return hidden, causal.contiguous()


def _export(model):
    tokens = Dim("tokens", min=1, max=16)
    shapes = ({0: Dim.AUTO, 1: tokens}, {0: Dim.AUTO, 1: tokens, 2: tokens})
    with torch.no_grad():
        return torch.export.export(model, _inputs(5), dynamic_shapes=shapes, strict=False)


@pytest.mark.parametrize("model_class", ["ToyIndexer", "ToyPooledIndexer"])
def test_eager_is_bit_identical(model_class: str):
    original, rewritten = model_pair(_change("indexer"), model_class, "bounded_topk")
    with torch.no_grad():
        for length in LENGTHS:
            assert torch.equal(original(*_inputs(length)), rewritten(*_inputs(length))), length


@pytest.mark.parametrize("model_class", ["ToyIndexer", "ToyPooledIndexer"])
def test_one_program_over_a_range_crossing_the_bound_matches_the_original(model_class: str):
    original, rewritten = model_pair(_change("indexer"), model_class, "bounded_topk")
    with pytest.raises(Exception, match=r"Constraints violated \(tokens\)"):
        _export(original)
    program = _export(rewritten).module()
    for length in LENGTHS:
        with torch.no_grad():
            expected = original(*_inputs(length, batch=1 + length % 3))
        actual = program(*_inputs(length, batch=1 + length % 3))
        if model_class == "ToyIndexer":
            assert expected.shape[-1] == min(length, 4)  # the range covers both of min's arms
        assert torch.equal(expected, actual), length


def test_the_helper_is_min_and_checks_its_size_under_export():
    helper = module_from_source(_change("indexer").rewritten, "bounded_topk_helper").topk_size
    assert [helper(4, n) for n in (1, 4, 9)] == [1, 4, 4]

    class Picked(torch.nn.Module):
        def forward(self, scores):
            return scores.topk(helper(4, scores.shape[-1])).indices

    program = torch.export.export(
        Picked(), (torch.randn(2, 6),), dynamic_shapes=({1: Dim("n", min=1, max=32)},), strict=False
    )
    assert "_assert_scalar" in program.graph_module.code  # the checks are asserted at run time
    for n in (1, 3, 4, 20):
        scores = torch.randn(2, n)
        assert torch.equal(program.module()(scores), scores.topk(min(4, n)).indices)
