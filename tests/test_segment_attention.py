"""segment-attention at run time, and over every site `exportsmith generate --all` rewrites.

1. The fixture's packed attentions (`fixtures/segment_attention/packed_attention.in.py`, both forms, sdpa and eager
   attention): eager is bit-identical to the original; the export arm, run in eager (`torch.compiler.is_exporting()`
   patched to True), matches the original within rounding (`tolerance.allowed`) for one segment, several, an empty
   one and one position each.
2. The original does not export (the split's sizes are data-dependent); the rewritten module exports once and the
   program matches the original for other numbers of segments of other lengths, and rejects lengths that do not
   cover the sequence (as `torch.split` does in eager).
3. The refusals are reported with their reasons.
4. Every site the codemods rewrite in the installed transformers' modeling and modular files: both arms of the
   twin, run on the same queries, keys and values with transformers' sdpa and eager attention, agree within
   rounding (where the original runs: transformers' sdpa fails on an empty segment).
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import libcst as cst
import pytest
import torch
from torch.export import Dim
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen2_vl.modeling_qwen2_vl import eager_attention_forward

from codemods.base import EXPORTING
from codemods.segment_attention import HELPER, SegmentAttention
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods
from exportsmith.verify.tolerance import allowed
from source_modules import model_pair

FIXTURES = Path(__file__).parent / "fixtures" / "segment_attention"
VENDORED_IMPORT = f"from generated._shared.masking_utils import {HELPER}"
DIM, HEADS = 16, 2
# segment lengths: one, several, an empty one, one position each
LAYOUTS = [[9], [3, 7, 1], [4, 0, 6], [1, 1, 1, 1], [2, 5]]


def _change(case: str):
    source = (FIXTURES / f"{case}.in.py").read_text()
    return run_codemods(source, f"{case}.py", "transformers.models.toy.modeling_toy", codemods=(SegmentAttention,))


def _inputs(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    cu_seqlens = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    hidden = torch.randn(sum(lengths), DIM, generator=torch.Generator().manual_seed(seed))
    return hidden, cu_seqlens


def _vendored(change):
    """`change` with the rewritten module importing the mask helper as the vendored copy does (from
    `generated._shared.masking_utils`, which segment-attention wrote into the committed copy of masking_utils)."""
    rewritten = change.rewritten.replace(f"from ...masking_utils import {HELPER}", VENDORED_IMPORT)
    assert rewritten != change.rewritten
    return SimpleNamespace(original=change.original, rewritten=rewritten)


def _pair(model_class: str, implementation: str):
    change = _change("packed_attention")
    assert change.applied == ("segment-attention",)
    change = _vendored(change)
    original, rewritten = model_pair(change, model_class, f"segments_{model_class}_{implementation}")
    original.implementation = rewritten.implementation = implementation
    return original, rewritten


def _output(result) -> tuple[torch.Tensor, list | None]:
    """(output, per-piece weights) of a fixture module: LoopAttention returns its weights too."""
    return result if isinstance(result, tuple) else (result, None)


def _same_weights(actual: list, expected: list) -> bool:
    return len(actual) == len(expected) and all(
        a is e is None or (a is not None and e is not None and torch.equal(a, e)) for a, e in zip(actual, expected)
    )


def _check_block_weights(whole: list, pieces: list, lengths: list[int]) -> None:
    """The export arm's one entry of weights against eager's per-piece ones: each piece's a diagonal block (within
    rounding), exactly 0 across pieces; None where the attention function returns none."""
    assert len(whole) == 1
    if whole[0] is None:
        assert all(piece is None for piece in pieces)
        return
    starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
    outside = torch.ones_like(whole[0], dtype=torch.bool)
    for start, end, piece in zip(starts, starts[1:], pieces):
        block = whole[0][..., start:end, start:end]
        assert (block - piece).abs().max().item() <= allowed([piece]) if piece.numel() else block.numel() == 0
        outside[..., start:end, start:end] = False
    assert torch.all(whole[0][outside] == 0)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("model_class", ["PackedAttention", "InlineAttention", "LoopAttention"])
def test_eager_is_unchanged_and_the_export_arm_matches_it(model_class: str, implementation: str):
    original, rewritten = _pair(model_class, implementation)
    for seed, lengths in enumerate(LAYOUTS):
        hidden, cu_seqlens = _inputs(lengths, seed)
        with torch.no_grad():
            expected, expected_weights = _output(original(hidden, cu_seqlens))
            output, weights = _output(rewritten(hidden, cu_seqlens))
            assert torch.equal(output, expected)
            with mock.patch("torch.compiler.is_exporting", return_value=True):
                actual, actual_weights = _output(rewritten(hidden, cu_seqlens))
        assert actual.shape == expected.shape
        assert (actual - expected).abs().max().item() <= allowed([expected]), lengths
        if expected_weights is not None:
            assert _same_weights(weights, expected_weights)
            _check_block_weights(actual_weights, expected_weights, lengths)


def _export(module: torch.nn.Module, lengths: list[int]) -> torch.export.ExportedProgram:
    shapes = ({0: Dim.DYNAMIC}, {0: Dim.DYNAMIC})
    with torch.no_grad():
        return torch.export.export(module, _inputs(lengths), dynamic_shapes=shapes, strict=False)


def test_the_original_does_not_export():
    original, _ = _pair("PackedAttention", "sdpa")
    with pytest.raises(Exception, match="data-dependent"):
        _export(original, [3, 5])


@pytest.mark.parametrize("model_class", ["PackedAttention", "InlineAttention", "LoopAttention"])
def test_one_program_serves_any_number_of_segments_of_any_lengths(model_class: str):
    original, rewritten = _pair(model_class, "sdpa")
    program = _export(rewritten, [3, 5]).module()
    for seed, lengths in enumerate([[7], [2, 2, 2, 2], [1, 6, 3], [4, 0, 6], [3, 5]]):
        hidden, cu_seqlens = _inputs(lengths, seed)
        with torch.no_grad():
            expected, _ = _output(original(hidden, cu_seqlens))
            actual, _ = _output(program(hidden, cu_seqlens))
        assert (actual - expected).abs().max().item() <= allowed([expected]), lengths


def test_lengths_that_do_not_cover_the_sequence_are_rejected():
    original, rewritten = _pair("PackedAttention", "sdpa")
    program = _export(rewritten, [3, 5]).module()
    hidden, _ = _inputs([3, 5])
    short = torch.tensor([0, 3, 6], dtype=torch.int32)  # 6 of the 8 positions
    with pytest.raises(RuntimeError):
        original(hidden, short)  # torch.split
    with pytest.raises(RuntimeError):
        program(hidden, short)


def test_refusals_are_reported_with_their_reasons():
    change = _change("refuse_other_forms")
    assert not change.changed
    reasons = {finding.construct: finding.reason for finding in change.findings}
    assert set(reasons) == {
        "weights_kept",
        "mask_passed",
        "lengths_read_after",
        "names_taken",
        "causality_of_the_module",
        "loop_weight_read_after",
    }
    for construct in ("weights_kept", "mask_passed", "causality_of_the_module"):
        assert "is_causal=False" in reasons[construct]
    # the loop form, refused where its last piece's weight is read after it (under export: the whole sequence's)
    assert reasons["loop_weight_read_after"] == "the function reads `weight` outside the split attention"
    assert reasons["lengths_read_after"] == "the function reads `lengths` outside the split attention"
    assert reasons["names_taken"] == "the function already uses `segment_mask`"
    change = _change("refuse_no_torch_import")
    assert [finding.reason for finding in change.findings] == ["the module does not `import torch`"]
    change = _change("refuse_helper_defined")
    assert not change.changed
    assert [finding.reason for finding in change.findings] == [f"the module already defines `{HELPER}`"]


class _Module:
    """What an attention function and a site's call read of `self`."""

    training = False
    num_key_value_groups = 1  # as many key and value heads as query heads

    def __getattr__(self, name: str):
        if "scal" in name:
            return 0.3
        if "dropout" in name:
            return 0.0
        raise AttributeError(name)


def _rewritten_sites(tree: cst.Module) -> list[list[cst.BaseStatement]]:
    """The statements of each site segment-attention rewrote: the `if torch.compiler.is_exporting():` that chooses
    `split_sizes, segment_mask`, through the `torch.cat` of the attention outputs."""
    found = []

    class Finder(cst.CSTVisitor):
        def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
            body = list(node.body)
            for index, statement in enumerate(body):
                if not isinstance(statement, cst.If) or not cst.matchers.matches(statement.test, EXPORTING):
                    continue
                if "split_sizes, segment_mask = " not in _code([statement]):
                    continue
                end = next(
                    j for j in range(index + 1, len(body)) if re.match(r"\w+ = torch\.cat\(", _code(body[j : j + 1]))
                )
                found.append(body[index : end + 1])

    tree.visit(Finder())
    return found


def _code(statements) -> str:
    return textwrap.dedent("".join(cst.Module([]).code_for_node(statement) for statement in statements).lstrip("\n"))


def _as_written(site: list[cst.BaseStatement]) -> str:
    """The statements the site had before the rewrite: its lengths (the choice's eager arm), the split at
    `lengths.tolist()`, the calls without a mask."""
    lengths = site[0].orelse.body.body[0]
    name = lengths.body[0].targets[0].target.value
    after = (
        _code(site[1:])
        .replace("split_sizes", f"{name}.tolist()")
        .replace("attention_mask=segment_mask", "attention_mask=None")
    )
    return _code([lengths]) + after


def _run(code: str, names: dict) -> dict:
    namespace = dict(names)
    exec(compile(code, "<site>", "exec"), namespace)
    return namespace


def _statement_runs(module: ast.Module) -> set[tuple[str, ...]]:
    """Every run of consecutive statements of every block in `module`, as `ast.dump`s."""
    runs = set()
    for node in ast.walk(module):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                dumps = [ast.dump(statement) for statement in block]
                runs.update(
                    tuple(dumps[i:j]) for i in range(len(dumps)) for j in range(i + 1, min(i + 5, len(dumps)) + 1)
                )
    return runs


def _site_names(code: str) -> tuple[str, tuple[str, str, str], str, str]:
    """(cu_seqlens name, (Q, K, V) names, attention function name, result name) read from the original statements."""
    cu = re.search(r"= (\w+)\[1:\] - \1\[:-1\]", code).group(1)
    qkv = re.search(r"for \w+ in \((\w+), (\w+), (\w+)\)", code).groups()
    function = re.search(r"(\w+)\(\s*[^()]*?\b\w+,\s*\w+,\s*\w+,\s*attention_mask=None", code, re.S).group(1)
    result = re.findall(r"^(\w+) = torch\.cat\(", code, re.M)[-1]
    return cu, qkv, function, result


def test_every_site_generate_rewrites_gives_the_same_attention_on_both_arms():
    """Each site's statements as written (found among the original file's statements), run against the rewritten
    ones: bit-identical in eager, within rounding under export."""
    from generated._shared.masking_utils import block_diagonal_mask

    tf = find_transformers()
    paths = [
        path
        for folder in sorted((tf.root / "models").iterdir())
        for path in sorted(folder.glob("modeling_*.py")) + sorted(folder.glob("modular_*.py"))
        if "lengths.tolist()" in path.read_text(encoding="utf-8")
    ]
    sites = exercised = loops = 0
    for path in paths:
        source = path.read_text(encoding="utf-8")
        change = run_codemods(source, path.name, tf.module_name(path))
        rewritten = [f for f in change.findings if f.codemod == SegmentAttention.NAME and f.kind == "rewritten"]
        found = _rewritten_sites(cst.parse_module(change.rewritten))
        assert len(found) == len(rewritten), path
        sites += len(rewritten)
        written = _statement_runs(ast.parse(source))
        for site in found:
            original = _as_written(site)
            assert tuple(ast.dump(s) for s in ast.parse(original).body) in written, (path, original)
            after = _code(site)
            cu, (q, k, v), function, result = _site_names(original)
            weights = re.search(r"^\w+, (\w+) = \[\], \[\]$", original, re.M)
            weights = weights and weights.group(1)
            for seed, lengths in enumerate(LAYOUTS):
                generator = torch.Generator().manual_seed(seed)
                tensors = [torch.randn(1, HEADS, sum(lengths), 8, generator=generator) for _ in range(3)]
                cu_seqlens = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
                for attention in (sdpa_attention_forward, eager_attention_forward):
                    names = {"torch": torch, "self": _Module(), "kwargs": {}, cu: cu_seqlens, function: attention}
                    names.update(zip((q, k, v), tensors), **{HELPER: block_diagonal_mask})
                    try:
                        expected = _run(original, names)
                    except RuntimeError:  # transformers' sdpa cannot reshape an empty segment: nothing to match
                        assert 0 in lengths and attention is sdpa_attention_forward, path
                        continue
                    eager = _run(after, names)
                    assert torch.equal(eager[result], expected[result]), path
                    with mock.patch("torch.compiler.is_exporting", return_value=True):
                        exported = _run(after, names)
                    actual = exported[result]
                    assert actual.shape == expected[result].shape, path
                    assert (actual - expected[result]).abs().max().item() <= allowed([expected[result]]), path
                    if weights is not None:  # a loop keeps each piece's weights
                        assert _same_weights(eager[weights], expected[weights]), path
                        _check_block_weights(exported[weights], expected[weights], lengths)
                        loops += 1
            exercised += 1
    assert exercised == sites > 0
    assert loops > 0  # the loop form's weights were compared
