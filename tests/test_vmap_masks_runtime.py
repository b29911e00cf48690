"""Runtime tests of `vmap-masks` on the installed transformers: the vendored `generated/_shared/masking_utils.py`
builds the same masks as transformers' vmap path, and models using it export without functorch nodes.

1. masks: for every mask function that a `use_vmap` caller of transformers passes (gemma3's blockwise overlay and
   bidirectional window, t5gemma2 / moonshine_streaming / gemma4 windows, nemotron's chunked window, esmc's packed
   sequences, masking_utils' own sliding, chunked and padding functions), `sdpa_mask` and `eager_mask` of the
   vendored module equal the original's with `use_vmap=True` bit for bit, at many shapes: padding, batch 1, a
   decode step with an offset, windows shorter and longer than the sequence;
2. the rewritten helper equals nested `torch.vmap` for the 4.56/4.57 form too (with and without batch/head axes);
3. export: a mask built by the vendored module exports with no vmap/functorch/`flat_apply` node and round-trips
   through `torch.export.save`/`load` without `run_decompositions`; the same through transformers' module keeps
   such nodes (the check can fail);
4. gemma3 with image tokens (the blockwise overlay takes the vmap path): the generated copy's logits equal the
   original's in eager, its exported graph is vmap-free, save/load works, and the programs match eager.
"""

from __future__ import annotations

import importlib
import inspect
import os
import tempfile
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
import transformers.masking_utils as original_masks
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.moonshine_streaming import modeling_moonshine_streaming
from transformers.models.nemotron_asr_streaming import modeling_nemotron_asr_streaming
from transformers.models.t5gemma2 import modeling_t5gemma2

import generated._shared.masking_utils as vendored_masks
from codemods.vmap_masks import VmapMasks
from exportsmith.pipeline import run_codemods

FIXTURES = Path(__file__).parent / "fixtures" / "vmap_masks"
# Node names that vmap-built masks leave in a graph (functorch batching ops, the getitem wrapper's flat_apply)
VMAP_MARKERS = ("vmap", "functorch", "flat_apply", "batch_dim", "_add_batch_dim", "_remove_batch_dim")


def _groups(batch: int, length: int, seed: int) -> torch.Tensor:
    """Block ids like gemma3's: -1 for text, a group id per image run."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((batch, length), -1)
    for row in range(batch):
        start = int(torch.randint(0, max(1, length - 3), (1,), generator=generator))
        ids[row, start : start + 3] = row
        if length > 8:
            ids[row, length - 2 :] = batch + row
    return ids


def _padding(batch: int, length: int) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, : min(2, length - 1)] = 0  # left padding on the first sequence
    return mask


def _packed(batch: int, length: int) -> torch.Tensor:
    return (torch.arange(length)[None, :] >= length // 2).long().expand(batch, -1) + torch.arange(batch)[:, None]


# name -> factory(masks module, batch, total kv length) -> mask function
MASK_FUNCTIONS = {
    "causal": lambda mu, b, n: mu.causal_mask_function,
    "sliding-window-3": lambda mu, b, n: mu.sliding_window_causal_mask_function(3),
    "chunked-3": lambda mu, b, n: mu.chunked_causal_mask_function(3, torch.tensor([1] + [0] * (b - 1))),
    "bidirectional-window-2": lambda mu, b, n: mu.sliding_window_bidirectional_mask_function(2),
    "gemma3-blockwise": lambda mu, b, n: mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(_groups(b, n, 0))),
    "gemma3-blockwise-sliding": lambda mu, b, n: mu.and_masks(
        mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(_groups(b, n, 1))), mu.sliding_window_overlay(4)
    ),
    "gemma3-bidirectional-window": lambda mu, b, n: mu.or_masks(
        mu.causal_mask_function, modeling_gemma3._bidirectional_window_overlay(3)
    ),
    "gemma3-full": lambda mu, b, n: mu.or_masks(mu.causal_mask_function, lambda *args: torch.tensor(True)),
    "packed-sequences": lambda mu, b, n: mu.and_masks(
        mu.causal_mask_function, mu.packed_sequence_mask_function(_packed(b, n))
    ),
    "remapped-positions": lambda mu, b, n: mu.remap_positions_for_packed_sequence(
        mu.causal_mask_function, torch.arange(n).remainder(5)[None, :].expand(b, -1)
    ),
    "t5gemma2-window": lambda mu, b, n: mu.and_masks(
        mu.bidirectional_mask_function, modeling_t5gemma2.sliding_window_mask_function(4, is_causal=False)
    ),
    "moonshine-window": lambda mu, b, n: mu.and_masks(
        mu.bidirectional_mask_function, modeling_moonshine_streaming.sliding_window_mask_function((3, 1))
    ),
    "nemotron-chunked-limited": lambda mu, b, n: mu.and_masks(
        mu.bidirectional_mask_function, modeling_nemotron_asr_streaming.chunked_limited_mask_function(4, 1)
    ),
    # a mask function a user passes (`or_mask_function`), written for vmap's 0-d indices: chained indexing fails on
    # broadcast index tensors, so eager must keep vmap (the vendored module once raised IndexError here)
    "user-vmap-style": lambda mu, b, n: mu.or_masks(
        mu.causal_mask_function, _chained_padding_mask(_padding(b, n).bool())
    ),
}


def _chained_padding_mask(padding):
    def user_mask(batch_idx, head_idx, q_idx, kv_idx):
        return padding[batch_idx][kv_idx] & (kv_idx <= q_idx + 1)

    return user_mask


# (batch, q_length, kv_length, q_offset, kv_offset, padded)
SHAPES = [
    (2, 7, 7, 0, 0, False),
    (3, 5, 5, 0, 0, True),
    (1, 6, 6, 0, 0, True),
    (2, 1, 9, 8, 0, True),  # a decode step after 8 tokens
    (1, 1, 4, 11, 8, False),  # a decode step in a sliding cache: kv starts at 8
    (2, 4, 12, 8, 0, False),
    (4, 13, 13, 0, 0, True),  # longer than every window
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-q{}-kv{}-qo{}-kvo{}{}".format(*s[:5], "-pad" * s[5]))
@pytest.mark.parametrize("name", sorted(MASK_FUNCTIONS))
def test_vendored_masks_equal_the_vmap_masks(name, shape):
    batch, q_length, kv_length, q_offset, kv_offset, padded = shape
    total = kv_offset + kv_length
    attention_mask = _padding(batch, total).bool() if padded else None  # as create_causal_mask passes it
    for interface in ("sdpa_mask", "eager_mask"):
        masks = []
        for mu in (original_masks, vendored_masks):
            masks.append(
                getattr(mu, interface)(
                    batch_size=batch,
                    q_length=q_length,
                    kv_length=kv_length,
                    q_offset=q_offset,
                    kv_offset=kv_offset,
                    mask_function=MASK_FUNCTIONS[name](mu, batch, total),
                    attention_mask=attention_mask,
                    allow_is_causal_skip=False,
                    use_vmap=True,
                )
            )
        expected, actual = masks
        assert actual.shape == expected.shape == (batch, 1, q_length, kv_length)
        assert actual.dtype == expected.dtype
        assert torch.equal(actual, expected), (interface, name, shape)
    # The shapes are not degenerate: the mask has both values somewhere in the set
    if shape == SHAPES[0] and name == "gemma3-blockwise":
        assert expected.any() and not expected.all()


def _helpers(case: str, helper: str):
    source = (FIXTURES / f"{case}.in.py").read_text()
    change = run_codemods(source, f"{case}.py", "transformers.masking_utils", codemods=(VmapMasks,))
    assert change.applied == ("vmap-masks",)
    original, rewritten = {}, {}
    exec(compile(source, f"{case}_original.py", "exec"), original)
    exec(compile(change.rewritten, f"{case}_rewritten.py", "exec"), rewritten)
    return original[helper], rewritten[helper]


def test_the_4_56_helper_equals_nested_vmap_with_and_without_batch_and_head_axes():
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    original, rewritten = _helpers("vmap_for_bhqkv", "_vmap_for_bhqkv")
    table = torch.randint(0, 3, (3, 10))

    def mask_function(batch_idx, head_idx, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (table[batch_idx, kv_idx] == table[batch_idx, q_idx])

    def window(batch_idx, head_idx, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx > q_idx - 3)

    arguments = (torch.arange(3), torch.arange(2), torch.arange(4, 10), torch.arange(10))
    with TransformGetItemToIndex():
        expected = original(mask_function)(*arguments)
        expected_qkv = original(window, bh_indices=False)(None, None, *arguments[2:])
        # eager keeps vmap: the same function calls, and the mask functions vmap alone supports still work
        assert torch.equal(rewritten(mask_function)(*arguments), expected)
        chained = rewritten(lambda b, h, q, kv: table[b][kv] == table[b][q])(*arguments)
        assert torch.equal(chained, original(lambda b, h, q, kv: table[b][kv] == table[b][q])(*arguments))
    with patch.object(torch.compiler, "is_exporting", return_value=True):  # the form an exported graph holds
        actual = rewritten(mask_function)(*arguments)
        actual_qkv = rewritten(window, bh_indices=False)(None, None, *arguments[2:])
    assert actual.shape == expected.shape == (3, 2, 6, 10) and torch.equal(actual, expected)
    assert actual_qkv.shape == expected_qkv.shape == (6, 10) and torch.equal(actual_qkv, expected_qkv)


def _vmap_nodes(program: torch.export.ExportedProgram) -> list[str]:
    found = []
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                text = f"{node.op} {node.target}".lower()
                if any(marker in text for marker in VMAP_MARKERS):
                    found.append(text)
    return found


def _save_and_load(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "program.pt2")
        torch.export.save(program, path)
        return torch.export.load(path)


class _BlockwiseMask(torch.nn.Module):
    """gemma3's sliding mask for image tokens: AND(sliding window, OR(causal, blockwise)) with padding."""

    def __init__(self, masks) -> None:
        super().__init__()
        self.masks = masks

    def forward(self, block_sequence_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mu = self.masks
        function = mu.and_masks(
            mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(block_sequence_ids)),
            mu.sliding_window_overlay(4),
        )
        batch, length = attention_mask.shape
        return mu.sdpa_mask(
            batch_size=batch,
            q_length=length,
            kv_length=length,
            mask_function=function,
            attention_mask=attention_mask,
            allow_is_causal_skip=False,
            use_vmap=True,
        )


def test_a_vendored_mask_exports_without_vmap_nodes_and_round_trips_through_save():
    dim = torch.export.Dim.DYNAMIC
    example = (_groups(2, 9, 0), _padding(2, 9).bool())
    shapes = ({0: dim, 1: dim}, {0: dim, 1: dim})
    program = torch.export.export(_BlockwiseMask(vendored_masks), example, dynamic_shapes=shapes, strict=False)
    assert _vmap_nodes(program) == []
    loaded = _save_and_load(program)  # no run_decompositions
    reference = _BlockwiseMask(original_masks)
    for batch, length in ((2, 9), (1, 5), (3, 12)):
        inputs = (_groups(batch, length, batch), _padding(batch, length).bool())
        expected = reference(*inputs)
        assert torch.equal(program.module()(*inputs), expected)
        assert torch.equal(loaded.module()(*inputs), expected)
    # The same mask through transformers' own module keeps vmap nodes: the check above can fail
    original = torch.export.export(_BlockwiseMask(original_masks), example, dynamic_shapes=shapes, strict=False)
    assert _vmap_nodes(original) != []


@pytest.fixture(scope="module")
def gemma3_pair():
    from exportsmith.verify.check import build_pair

    original, generated = build_pair("gemma3", "generated")
    assert type(generated).__module__ == "generated.gemma3.modeling_gemma3"
    return original, generated


def _gemma3_inputs(model, batch: int, seed: int) -> dict:
    from exportsmith.verify.tasks import InputShape, dummy_inputs

    inputs = dummy_inputs(model, shape=InputShape(batch=batch, text_length=6, decoder_length=3, seed=seed))
    inputs["token_type_ids"] = (inputs["input_ids"] == model.config.image_token_id).long()
    assert inputs["token_type_ids"].any()  # image tokens: the blockwise overlay, hence the vmap path, is taken
    inputs["attention_mask"][0, :2] = 0  # left padding
    inputs["use_cache"] = False
    return inputs


def test_gemma3_with_image_tokens_is_identical_in_eager_and_exports_without_vmap(gemma3_pair):
    original, generated = gemma3_pair
    generated_masks = importlib.import_module("generated.gemma3.modeling_gemma3").create_causal_mask
    assert generated_masks.__module__ == "generated._shared.masking_utils"
    inputs = _gemma3_inputs(original, 2, 0)
    with torch.no_grad():
        expected = original(**inputs).logits
        assert torch.equal(generated(**inputs).logits, expected)
        for batch, seed in ((1, 1), (3, 2)):
            other = _gemma3_inputs(original, batch, seed)
            assert torch.equal(generated(**other).logits, original(**other).logits)
    program = torch.export.export(generated, (), inputs, strict=False)
    assert _vmap_nodes(program) == []
    loaded = _save_and_load(program)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(**inputs).logits, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(loaded.module()(**inputs).logits, expected, rtol=0, atol=1e-5)
    # transformers' own model takes the vmap path on these inputs: its graph holds what the copy's does not
    assert _vmap_nodes(torch.export.export(original, (), inputs, strict=False)) != []


# Other `use_vmap` callers whose tiny models build and take the vmap path with the harness's inputs (esmc with
# `sequence_id`, its packed-sequence and_mask_function). Rendered for this test, not committed. Not here:
# nemotron_asr_streaming builds its encoder (the vmap caller) with `AutoModel.from_config`, which gives transformers'
# own class inside the vendored model; moonshine_streaming, esmfold2, gemma4, step3p7 have no working tiny model.
OTHER_CALLERS = ("t5gemma2", "unlimited_ocr", "esmc")


@pytest.fixture(scope="module")
def other_callers(tmp_path_factory):
    import sys

    from exportsmith.discover import find_transformers
    from exportsmith.generate import render, write_tree

    tf = find_transformers()
    out = tmp_path_factory.mktemp("vmap") / "vmap_generated"
    write_tree(render(tf, [tf.resolve(model).module for model in OTHER_CALLERS]).files, out)
    sys.path.insert(0, str(out.parent))
    yield "vmap_generated"
    sys.path.remove(str(out.parent))


def _caller_inputs(model) -> dict:
    from exportsmith.verify.tasks import dummy_inputs

    inputs = dummy_inputs(model)
    if "sequence_id" in inspect.signature(model.forward).parameters:
        ids = inputs["input_ids"]
        inputs["sequence_id"] = (torch.arange(ids.shape[1]) >= ids.shape[1] // 2).long().expand_as(ids).clone()
    return inputs


def _tensors(output) -> list[torch.Tensor]:
    return [leaf for leaf in torch.utils._pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)]


@pytest.mark.parametrize("model_type", OTHER_CALLERS)
def test_other_vmap_callers_are_identical_in_eager_and_export_without_vmap(model_type, other_callers):
    from exportsmith.verify.check import build_pair

    original, generated = build_pair(model_type, other_callers)
    inputs = _caller_inputs(original)
    calls = []
    spied = original_masks._vmap_expansion_sdpa
    try:
        original_masks._vmap_expansion_sdpa = lambda function: calls.append(1) or spied(function)
        with torch.no_grad():
            expected = _tensors(original(**inputs))
    finally:
        original_masks._vmap_expansion_sdpa = spied
    assert calls, f"{model_type}: the original does not take the vmap path on these inputs"
    with torch.no_grad():
        actual = _tensors(generated(**inputs))
    assert len(actual) == len(expected) and all(torch.equal(a, e) for a, e in zip(actual, expected))
    program = torch.export.export(generated, (), inputs, strict=False)
    assert _vmap_nodes(program) == []
    loaded = _save_and_load(program)
    with torch.no_grad():
        for outputs in (program.module()(**inputs), loaded.module()(**inputs)):
            for a, e in zip(_tensors(outputs), expected, strict=True):
                torch.testing.assert_close(a, e, rtol=0, atol=1e-5)
