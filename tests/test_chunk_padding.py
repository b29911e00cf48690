"""chunk-padding at run time: the chunked scans of `fixtures/chunk_padding/chunk_scans.in.py`, rewritten, give the
original's results in eager through either arm, and export with named dims where the originals cannot."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from codemods.chunk_padding import ChunkPadding
from exportsmith.pipeline import run_codemods
from source_modules import module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "chunk_padding"
SOURCE = FIXTURES / "chunk_scans.in.py"
CHUNK = 16


def _modules():
    source = SOURCE.read_text()
    change = run_codemods(source, SOURCE.name, "transformers.models.toy.modeling_toy", codemods=(ChunkPadding,))
    assert [finding.kind for finding in change.findings] == ["rewritten"] * 4
    return module_from_source(source, "chunk_scans_original"), module_from_source(change.rewritten, "chunk_scans")


def _states(length: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape[:-1], length, shape[-1], generator=torch.Generator().manual_seed(length))


@pytest.mark.parametrize("exporting", [False, True])
@pytest.mark.parametrize("length", [1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK])
def test_both_arms_give_the_original_results(length: int, exporting: bool, monkeypatch):
    """Eager through the original statements, and through the export arm (is_exporting forced): the same tensors."""
    original, rewritten = _modules()
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: exporting)
    query = _states(length, 2, 3, 4)  # (batch, heads, length, dim)
    expected = original.gated_delta_chunks(query, chunk_size=CHUNK)
    actual = rewritten.gated_delta_chunks(query, chunk_size=CHUNK)
    assert actual.shape == expected.shape and torch.equal(actual, expected)
    hidden = _states(length, 2, 5)  # (batch, length, dim)
    expected = original.mamba_chunks(hidden, CHUNK)
    actual = rewritten.mamba_chunks(hidden, CHUNK)
    assert actual.shape == expected.shape and torch.equal(actual, expected)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 64])
def test_the_export_padding_is_the_remainder_padding_for_every_length(chunk_size: int):
    """The two expressions of the padding, side by side over lengths 0..200 (the export arm asserts chunk_size > 0)."""
    for length in range(201):
        assert (length + chunk_size - 1) // chunk_size * chunk_size - length == (
            chunk_size - length % chunk_size
        ) % chunk_size


class _Scan(torch.nn.Module):
    def __init__(self, module, name: str):
        super().__init__()
        self.function = getattr(module, name)

    def forward(self, states):
        return self.function(states, CHUNK)


# the lengths of one chunk, the range the harness declares for a chunk size of 64 (`Dim("tokens", max=64)`)
TOKENS = Dim("tokens", min=1, max=CHUNK)


def _export(module, name: str, shape: tuple[int, ...], axis: int):
    example = _states(5, *shape)
    return torch.export.export(_Scan(module, name), (example,), dynamic_shapes=({axis: TOKENS},), strict=False)


@pytest.mark.parametrize(
    ("name", "shape", "axis"), [("gated_delta_chunks", (2, 3, 4), 2), ("mamba_chunks", (2, 5), 1)]
)
def test_one_program_with_named_dims_serves_every_length(name: str, shape, axis: int):
    original, rewritten = _modules()
    program = _export(rewritten, name, shape, axis)
    for length in (1, 2, 5, CHUNK - 1, CHUNK):
        states = _states(length, *shape)
        assert torch.equal(program.module()(states), getattr(original, name)(states, CHUNK)), length
    with pytest.raises(Exception, match="Constraints violated"):
        _export(original, name, shape, axis)


def test_a_module_without_import_torch_is_refused():
    path = FIXTURES / "refuse_no_torch_import.in.py"
    change = run_codemods(
        path.read_text(), path.name, "transformers.models.toy.modeling_toy", codemods=(ChunkPadding,)
    )
    assert not change.changed
    assert {(finding.kind, finding.reason) for finding in change.findings} == {
        ("refused", "the module does not `import torch`")
    }
