"""The sliding-window rewrites: what they refuse, and the rewritten layer against transformers' at lengths on both
sides of the window, in eager and through torch.export (one program for all lengths)."""

from __future__ import annotations

from pathlib import Path

from exportsmith.pipeline import run_codemods

FIXTURES = Path(__file__).parent / "fixtures"


def _findings(codemod: str, case: str):
    path = FIXTURES / codemod / f"{case}.in.py"
    return [(f.kind, f.construct, f.reason) for f in run_codemods(path.read_text(), path.name).findings]


def test_other_forms_of_the_layer_are_refused_with_a_reason():
    assert _findings("sliding_window_cache", "refuse_other_forms") == [
        (
            "refused",
            "DynamicSlidingWindowLayer.get_mask_sizes",
            "not transformers' `is_full`/`max` form of the window sizes",
        ),
        ("refused", "DynamicSlidingWindowLayer.update", "no `self.keys = A[:, :, -self.sliding_window + 1 :, :]` pair"),
    ]


def test_the_4_57_layer_is_rewritten_too():
    kinds = [kind for kind, _, _ in _findings("sliding_window_cache", "layer_457")]
    assert kinds == ["rewritten", "rewritten"]


def test_an_early_return_is_refused_when_something_else_runs_first():
    assert _findings("export_early_return", "refuse_side_effect") == [
        ("refused", "def logs_first", "a statement before the export test does more than bind locals"),
        ("refused", "def writes_an_attribute", "a statement before the export test does more than bind locals"),
    ]
