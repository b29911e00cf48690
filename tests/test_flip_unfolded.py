"""flip-unfolded: which flips of unfolded windows it rewrites or refuses (with reasons), and, at run time, the
rewritten forms of `fixtures/flip_unfolded/windows.in.py` (Inkling2's dynamic short convolution and its windows of
sequence ids) are bit-identical to the originals in eager and under the export arm at every length, and one program
exported with `Dim("tokens", min=1)` matches them at every length of it, where the originals' export is rejected (the
flip of the overlapping windows guards the length to be at least the window)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import libcst as cst
import pytest
import torch
from torch.export import Dim

from codemods.base import EXPORTING
from codemods.flip_unfolded import FlipUnfolded
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods
from source_modules import model_pair, module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "flip_unfolded"
LENGTHS = (1, 2, 3, 4, 7, 32)


def _change(case: str, module: str = "transformers.models.toy.modeling_toy"):
    path = FIXTURES / f"{case}.in.py"
    return run_codemods(path.read_text(), path.name, module, codemods=(FlipUnfolded,))


def test_findings_name_each_rewrite_and_each_refusal_with_its_reason():
    assert [f.line for f in _change("windows").findings if f.kind == "rewritten"] == [21, 26]
    assert [f.reason for f in _change("refuse_no_torch_import").findings] == ["the module does not `import torch`"]
    shared = _change("windows", module="transformers.masking_utils")
    assert not shared.changed
    assert {f.reason for f in shared.findings} == {
        "`transformers.masking_utils` is a shared module, whose classes must stay transformers' own"
    }


def _states(length: int) -> torch.Tensor:
    return torch.randn(2, length, 8, generator=torch.Generator().manual_seed(length))


def _ids(length: int) -> torch.Tensor:
    return torch.randint(0, 5, (2, length), generator=torch.Generator().manual_seed(length))


def test_both_arms_are_bit_identical_to_the_original():
    original, rewritten = model_pair(_change("windows"), "ShortConvolution", "flip_unfolded")
    functions = [module_from_source(source, f"flip_unfolded_{name}") for name, source in _sources()]
    with torch.no_grad():
        for length in LENGTHS:
            expected = original(_states(length))
            assert torch.equal(rewritten(_states(length)), expected), length
            with mock.patch("torch.compiler.is_exporting", return_value=True):
                assert torch.equal(rewritten(_states(length)), expected), length
                exported_ids = functions[1].window_ids(_ids(length), 4)
            assert torch.equal(functions[1].window_ids(_ids(length), 4), functions[0].window_ids(_ids(length), 4))
            assert torch.equal(exported_ids, functions[0].window_ids(_ids(length), 4)), length


def _sources():
    change = _change("windows")
    return (("original", change.original), ("rewritten", change.rewritten))


def test_one_program_over_a_range_from_one_token_matches_the_original():
    tokens = Dim("tokens", min=1, max=64)
    original, rewritten = model_pair(_change("windows"), "ShortConvolution", "flip_unfolded")
    with pytest.raises(Exception, match=r"Constraints violated \(tokens\)"):
        torch.export.export(original, (_states(5),), dynamic_shapes=({1: tokens},), strict=False)
    program = torch.export.export(rewritten, (_states(5),), dynamic_shapes=({1: tokens},), strict=False).module()
    for length in LENGTHS:
        with torch.no_grad():
            assert torch.equal(program(_states(length)), original(_states(length))), length


def _sites(source: str) -> list[cst.If]:
    """The export twins flip-unfolded wrote into `source` (their comment says so)."""
    return [
        node
        for node in cst.matchers.findall(cst.parse_module(source), cst.matchers.If(test=EXPORTING))
        if "flipped as a contiguous copy" in cst.Module([]).code_for_node(node)
    ]


def test_every_site_generate_rewrites_gives_the_same_windows_on_both_arms():
    """Each statement flip-unfolded rewrites in the installed transformers, run as both arms (Inkling2's windows of
    states and of sequence ids) at lengths from 1, against the statement as written: bit-identical."""
    tf = find_transformers()
    paths = [
        path
        for folder in sorted((tf.root / "models").iterdir())
        for path in sorted(folder.glob("modeling_*.py")) + sorted(folder.glob("modular_*.py"))
        if ".unfold(" in (text := path.read_text(encoding="utf-8")) and ".flip(" in text
    ]
    exercised = 0
    for path in paths:
        change = run_codemods(
            path.read_text(encoding="utf-8"), path.name, tf.module_name(path), codemods=(FlipUnfolded,)
        )
        sites = _sites(change.rewritten)
        assert len(sites) == sum(f.kind == "rewritten" for f in change.findings), path
        code = cst.Module([]).code_for_node
        for site in sites:
            (exported,), (eager,) = site.body.body, site.orelse.body.body
            assert code(eager).strip() in change.original  # the eager arm is the statement as written
            target = eager.body[0].targets[0].target.value
            for length in (1, 2, 3, 7):
                generator = torch.Generator().manual_seed(length)
                names = {
                    "torch": torch,
                    "self": SimpleNamespace(conv_kernel_size=4),
                    "context": torch.randn(2, 6, length + 3, generator=generator),
                    "context_seq_idx": torch.randint(0, 3, (2, length + 3), generator=generator),
                }
                values = []
                for statement in (eager, exported):
                    namespace = dict(names)
                    exec(compile(code(statement), str(path), "exec"), namespace)
                    values.append(namespace[target])
                assert torch.equal(*values), (path, length)
            exercised += 1
    assert exercised >= 4  # inkling2 and inkling2_loop, modeling and modular: the windows and the ids
