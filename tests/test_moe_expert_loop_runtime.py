"""Runtime tests of `moe-expert-loop`: the rewritten fixture blocks (`fixtures/moe_expert_loop/*.in.py` run through
`run_codemods` here) give bit-identical results to the originals, on both paths, and export.

1. eager (the original loop) and the export twin run in eager (`torch.compiler.is_exporting()` patched to True) both
   equal the original bit for bit, on inputs where some experts receive no tokens, where one receives all, with
   dropped tokens (the 5.x extra mask class) and with top-1 and top-2 routing, for the 4.x ModuleList block, the 5.x
   3D experts and the 4.x gpt-oss form (the unpacked expert id in a multi-element index): visiting the experts
   without tokens adds nothing and keeps the order of accumulation;
2. the original fails to export (data-dependent loop); the rewritten block exports with the token count dynamic,
   its graph reads no tensor value back into Python, the program matches the original bit for bit at other token
   counts (1 token included), and `torch.export.save`/`load` keeps it;
3. the refusals are reported with their reasons and leave the source unchanged.
"""

from __future__ import annotations

import io
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.export import Dim

from codemods.moe_expert_loop import MoeExpertLoop
from exportsmith.pipeline import run_codemods
from source_modules import module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "moe_expert_loop"
HIDDEN, EXPERTS = 16, 4


def _pair(case: str) -> tuple[types.ModuleType, types.ModuleType]:
    source = (FIXTURES / f"{case}.in.py").read_text()
    change = run_codemods(source, f"{case}.py", "transformers.models.toy.modeling_toy", codemods=(MoeExpertLoop,))
    assert change.applied == ("moe-expert-loop",)
    return module_from_source(source, f"moe_{case}_original"), module_from_source(
        change.rewritten, f"moe_{case}_rewritten"
    )


def _config(top_k: int) -> SimpleNamespace:
    return SimpleNamespace(
        hidden_size=HIDDEN, intermediate_size=24, num_local_experts=EXPERTS, num_experts_per_tok=top_k, dropout=0.0
    )


def _same_weights(original: torch.nn.Module, rewritten: torch.nn.Module) -> None:
    torch.manual_seed(0)
    for parameter in original.parameters():
        torch.nn.init.normal_(parameter, std=0.5)
    rewritten.load_state_dict(original.state_dict())


def _identical(actual, expected) -> None:
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _identical(a, e)
        return
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual.view(torch.int32), expected.view(torch.int32))  # bit for bit, signed zeros included


def _blocks(top_k: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    original, rewritten = _pair("sparse_moe_block_4x")
    blocks = original.ToySparseMoeBlock(_config(top_k)).eval(), rewritten.ToySparseMoeBlock(_config(top_k)).eval()
    _same_weights(*blocks)
    return blocks


def _block_inputs() -> list[tuple[torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, tokens, HIDDEN, generator=generator),) for batch, tokens in ((1, 1), (2, 3), (1, 9))]


def _experts() -> tuple[torch.nn.Module, torch.nn.Module]:
    original, rewritten = _pair("experts_3d_524")
    experts = original.ToyExperts(_config(2)), rewritten.ToyExperts(_config(2))
    _same_weights(*experts)
    return experts


def _expert_inputs() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(hidden states, top-k expert ids, top-k weights): random routing, every token on experts 0 and 2 (1 and 3 get
    nothing), one token, and dropped tokens (id EXPERTS, the extra mask class)."""
    generator = torch.Generator().manual_seed(2)
    cases = []
    for routing in (
        torch.stack([torch.randperm(EXPERTS, generator=generator)[:2] for _ in range(7)]),
        torch.tensor([[0, 2], [2, 0], [0, 2]]),
        torch.tensor([[3, 1]]),
        torch.tensor([[EXPERTS, 1], [2, EXPERTS], [1, 3], [EXPERTS, EXPERTS]]),
    ):
        tokens = routing.shape[0]
        weights = torch.rand(tokens, 2, generator=generator)
        cases.append((torch.randn(tokens, HIDDEN, generator=generator), routing, weights))
    return cases


@pytest.mark.parametrize("top_k", [1, 2])
def test_sparse_block_eager_and_export_twin_are_bit_identical(top_k, monkeypatch):
    original, rewritten = _blocks(top_k)
    with torch.no_grad():
        for inputs in _block_inputs():
            expected = original(*inputs)
            _identical(rewritten(*inputs), expected)
            with monkeypatch.context() as patch:
                patch.setattr(torch.compiler, "is_exporting", lambda: True)
                _identical(rewritten(*inputs), expected)


def test_experts_eager_and_export_twin_are_bit_identical(monkeypatch):
    original, rewritten = _experts()
    with torch.no_grad():
        for inputs in _expert_inputs():
            expected = original(*inputs)
            _identical(rewritten(*inputs), expected)
            with monkeypatch.context() as patch:
                patch.setattr(torch.compiler, "is_exporting", lambda: True)
                _identical(rewritten(*inputs), expected)


def test_the_twin_visits_experts_without_tokens(monkeypatch):
    """The bit-identity above is not vacuous: the twin calls every expert, the original only those hit."""
    original, rewritten = _blocks(2)
    calls = {"original": [], "rewritten": []}
    for name, block in (("original", original), ("rewritten", rewritten)):
        for index, expert in enumerate(block.experts):
            expert.register_forward_hook(lambda module, args, out, i=index, n=name: calls[n].append(i))
    inputs = _block_inputs()[0]  # one token, top-2: two experts hit
    with torch.no_grad():
        original(*inputs)
        monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
        rewritten(*inputs)
    assert len(calls["original"]) == 2 and calls["rewritten"] == list(range(EXPERTS))


def _export(module: torch.nn.Module, inputs: tuple) -> torch.export.ExportedProgram:
    tokens = Dim("tokens", min=1)
    if len(inputs) == 1:
        dynamic = ({0: Dim("batch", min=1), 1: tokens},)
    else:
        dynamic = ({0: tokens}, {0: tokens}, {0: tokens})
    return torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)


def _reads_values_back(program: torch.export.ExportedProgram) -> list[str]:
    """Nodes that turn a tensor value into a Python number (a data-dependent scalar)."""
    scalar = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}
    return [str(node.target) for node in program.graph.nodes if node.target in scalar]


def _saved_and_loaded(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer)


def test_original_sparse_block_does_not_export():
    original, _ = _blocks(2)
    with pytest.raises(Exception, match="data-dependent|GuardOnDataDependentSymNode"):
        _export(original, (torch.randn(2, 5, HIDDEN),))


@pytest.mark.parametrize("top_k", [1, 2])
def test_sparse_block_exports_and_matches_at_other_token_counts(top_k):
    original, rewritten = _blocks(top_k)
    with torch.no_grad():
        program = _export(rewritten, (torch.randn(2, 5, HIDDEN),))
    assert not _reads_values_back(program)
    loaded = _saved_and_loaded(program)
    with torch.no_grad():
        for inputs in _block_inputs():
            expected = original(*inputs)
            _identical(program.module()(*inputs), expected)
            _identical(loaded.module()(*inputs), expected)


def test_original_experts_do_not_export():
    original, _ = _experts()
    with pytest.raises(Exception, match="data-dependent|GuardOnDataDependentSymNode"):
        _export(original, _expert_inputs()[0])


def test_experts_export_and_match_with_dropped_tokens_and_idle_experts():
    original, rewritten = _experts()
    with torch.no_grad():
        program = _export(rewritten, _expert_inputs()[0])
    assert not _reads_values_back(program)
    loaded = _saved_and_loaded(program)
    with torch.no_grad():
        for inputs in _expert_inputs():
            expected = original(*inputs)
            _identical(program.module()(*inputs), expected)
            _identical(loaded.module()(*inputs), expected)


def _gpt_oss_experts() -> tuple[torch.nn.Module, torch.nn.Module]:
    original, rewritten = _pair("experts_multi_index_4x")
    experts = original.ToyGptOssExperts(_config(2)), rewritten.ToyGptOssExperts(_config(2))
    _same_weights(*experts)
    return experts


def _gpt_oss_inputs() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(hidden states, top-k expert ids with EXPERTS the extra class, per-expert weights)."""
    return [
        (hidden, routing, torch.rand(hidden.shape[0], EXPERTS, generator=torch.Generator().manual_seed(3)))
        for hidden, routing, _ in _expert_inputs()
    ]


def test_multi_index_experts_eager_and_export_twin_are_bit_identical(monkeypatch):
    original, rewritten = _gpt_oss_experts()
    with torch.no_grad():
        for inputs in _gpt_oss_inputs():
            expected = original(*inputs)
            _identical(rewritten(*inputs), expected)
            with monkeypatch.context() as patch:
                patch.setattr(torch.compiler, "is_exporting", lambda: True)
                _identical(rewritten(*inputs), expected)


def test_multi_index_experts_export_and_match():
    original, rewritten = _gpt_oss_experts()
    with torch.no_grad():
        program = _export(rewritten, _gpt_oss_inputs()[0])
    assert not _reads_values_back(program)
    loaded = _saved_and_loaded(program)
    with torch.no_grad():
        for inputs in _gpt_oss_inputs():
            expected = original(*inputs)
            _identical(program.module()(*inputs), expected)
            _identical(loaded.module()(*inputs), expected)


def test_refusals_are_reported_and_leave_the_source_unchanged():
    path = FIXTURES / "refuse_forms.in.py"
    change = run_codemods(
        path.read_text(), path.name, "transformers.models.toy.modeling_toy", codemods=(MoeExpertLoop,)
    )
    assert not change.changed
    assert [(f.line, f.kind, f.reason) for f in change.findings] == [
        (
            20,
            "refused",
            "`expert_idx` is used in `out[0] * routing_weights[token_idx, expert_idx, None]` other than as the only index",
        ),
        (31, "refused", "`current_state` is bound in the loop and used outside it (its value after the loop differs)"),
        (
            42,
            "refused",
            "`if self.dropout > 0:` in the loop body is not an assignment to local names or an `index_add_`",
        ),
        (54, "refused", "an in-place call `.mul_(...)` in the loop body"),
        (65, "refused", "an `index_add_` whose index does not come from `torch.where` over the expert's mask row"),
        (
            75,
            "refused",
            "`self.scales[expert_idx]` indexes neither the expert mask nor a parameter or module list that `__init__` "
            "assigns",
        ),
    ]


def test_a_module_without_import_torch_is_refused():
    source = (FIXTURES / "experts_3d_524.in.py").read_text().replace("import torch\n", "", 1)
    change = run_codemods(source, "toy.py", "transformers.models.toy.modeling_toy", codemods=(MoeExpertLoop,))
    assert not change.changed
    assert [f.reason for f in change.findings] == ["the module does not `import torch`"]
