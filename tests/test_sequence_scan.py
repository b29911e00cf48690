"""sequence-scan: which loops it rewrites or refuses (with reasons), and, at run time, the rewritten forms of
`fixtures/sequence_scan/selective_scan.in.py` (Mamba's reference selective scan, and a recurrence carrying two
states) are bit-identical to the originals in eager and under the export arm at every length, and one program
exported with `Dim("tokens", min=1)` matches them at every length of it, where the originals' export pins the length
(the unrolled loop)."""

from __future__ import annotations

import importlib
from pathlib import Path
from unittest import mock

import libcst as cst
import pytest
import torch
from torch.export import Dim

from codemods.sequence_scan import SequenceScan
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods
from source_modules import module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "sequence_scan"
LENGTHS = (1, 2, 3, 7, 33)


def _change(case: str, module: str = "transformers.models.toy.modeling_toy"):
    path = FIXTURES / f"{case}.in.py"
    return run_codemods(path.read_text(), path.name, module, codemods=(SequenceScan,))


def test_findings_name_each_rewrite_and_each_refusal_with_its_reason():
    rewritten = {f.construct: f.reason for f in _change("selective_scan").findings if f.kind == "rewritten"}
    assert rewritten == {
        "selective_scan": "one scan over the sequence under export, carrying `ssm_state`",
        "two_states": "one scan over the sequence under export, carrying `level`, `trend`",
    }
    change = _change("refuse_other_loops")
    assert not change.changed
    assert {f.construct: f.reason for f in change.findings} == {
        "index_arithmetic": "`index` is used otherwise than to take a step's slice of a tensor",
        "step_output_read_after": "the function reads `doubled` outside the loop",
        "stacked_in_the_return": "the list is not stacked by `Y = torch.stack(L, dim=D)` right after the loop",
        "a_branch_in_the_body": "the body is not assignments to names, then the append of the step's output",
        "a_loop_else": "the loop has an `else`",
        "indexed_along_two_dims": "`x` is indexed by `index` along two dims",
        "names_taken": "the function already uses `scan_step`",
    }
    # a loop that carries no state is no recurrence: not a candidate, no finding
    assert not {"no_state", "concatenated"} & {f.construct for f in change.findings}
    assert [f.reason for f in _change("refuse_no_torch_import").findings] == ["the module does not `import torch`"]


def _inputs(length: int, batch: int = 2):
    generator = torch.Generator().manual_seed(length)
    hidden = torch.randn(batch, 4, length, generator=generator)
    dt = torch.rand(batch, 4, length, generator=generator)
    A = -torch.rand(4, 3, generator=generator)
    B, C = torch.randn(batch, length, 3, generator=generator), torch.randn(batch, length, 3, generator=generator)
    return hidden, dt, A, B, C


def _functions():
    change = _change("selective_scan")
    return (
        module_from_source(change.original, "sequence_scan_original"),
        module_from_source(change.rewritten, "sequence_scan_rewritten"),
    )


def _same(actual, expected) -> bool:
    return all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True))


def test_both_arms_are_bit_identical_to_the_loop():
    original, rewritten = _functions()
    for length in LENGTHS:
        expected = original.selective_scan(*_inputs(length))
        assert _same(rewritten.selective_scan(*_inputs(length)), expected), length
        x, decay = torch.randn(2, length, 5), torch.tensor(0.7)
        two = original.two_states(x, decay, length)
        assert _same(rewritten.two_states(x, decay, length), two), length
        with mock.patch("torch.compiler.is_exporting", return_value=True):
            assert _same(rewritten.selective_scan(*_inputs(length)), expected), length
            assert _same(rewritten.two_states(x, decay, length), two), length


class _Scan(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, hidden, dt, A, B, C):
        return self.function(hidden, dt, A, B, C)


def test_one_program_over_a_range_from_one_token_matches_the_loop():
    original, rewritten = _functions()
    tokens, batch = Dim("tokens", min=1, max=64), Dim("batch", min=1, max=8)
    sequence, positions = {0: batch, 2: tokens}, {0: batch, 1: tokens}
    shapes = (sequence, sequence, None, positions, positions)
    with pytest.raises(Exception, match=r"Constraints violated"):
        torch.export.export(_Scan(original.selective_scan), _inputs(5), dynamic_shapes=shapes, strict=False)
    program = torch.export.export(_Scan(rewritten.selective_scan), _inputs(5), dynamic_shapes=shapes, strict=False)
    for length in LENGTHS:
        for size in (1, 3):
            inputs = _inputs(length, size)
            assert _same(program.module()(*inputs), original.selective_scan(*inputs)), (length, size)


def _selective_scan_inputs(length: int, batch: int = 2) -> dict:
    """Inputs of transformers' `mamba_selective_scan` (the reference path): states `[batch, channels, length]`, B and C
    `[batch, state, length]`, with the skip, gate, bias and softplus every caller passes."""
    generator = torch.Generator().manual_seed(length)
    channels, state = 4, 3
    return {
        "hidden_states": torch.randn(batch, channels, length, generator=generator),
        "dt": torch.randn(batch, channels, length, generator=generator),
        "A": -torch.rand(channels, state, generator=generator),
        "B": torch.randn(batch, state, length, generator=generator),
        "C": torch.randn(batch, state, length, generator=generator),
        "D": torch.randn(channels, generator=generator),
        "z": torch.randn(batch, channels, length, generator=generator),
        "delta_bias": torch.randn(channels, generator=generator),
        "delta_softplus": True,
        "return_last_state": True,
    }


def test_every_site_generate_rewrites_is_bit_identical_on_both_arms():
    """Each function sequence-scan rewrites in the installed transformers' modeling files, compiled in its own
    module's namespace, against the module's own function: the same outputs and final state, in eager and under the
    export arm, at lengths from 1."""
    tf = find_transformers()
    paths = [
        path
        for folder in sorted((tf.root / "models").iterdir())
        for path in sorted(folder.glob("modeling_*.py"))
        if "torch.stack(" in (text := path.read_text(encoding="utf-8")) and " in range(" in text
    ]
    rewritten = 0
    for path in paths:
        change = run_codemods(
            path.read_text(encoding="utf-8"), path.name, tf.module_name(path), codemods=(SequenceScan,)
        )
        constructs = {f.construct for f in change.findings if f.kind == "rewritten"}
        if not constructs:
            continue
        assert constructs == {"mamba_selective_scan"}, path  # the inputs below are that function's
        module = importlib.import_module(tf.module_name(path))
        namespace = dict(vars(module))
        tree = cst.parse_module(change.rewritten)
        (function,) = [
            stmt for stmt in tree.body if isinstance(stmt, cst.FunctionDef) and stmt.name.value in constructs
        ]
        exec(compile(tree.code_for_node(function), str(path), "exec"), namespace)
        original, copy = getattr(module, "mamba_selective_scan"), namespace["mamba_selective_scan"]
        for length in LENGTHS:
            expected = original(**_selective_scan_inputs(length))
            assert _same(copy(**_selective_scan_inputs(length)), expected), (path, length)
            with mock.patch("torch.compiler.is_exporting", return_value=True):
                assert _same(copy(**_selective_scan_inputs(length)), expected), (path, length)
        rewritten += 1
    assert rewritten >= 4  # mamba, falcon_mamba, jamba, zamba
