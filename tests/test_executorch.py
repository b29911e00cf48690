"""The ExecuTorch check: generated copies lowered to XNNPACK and run in the ExecuTorch runtime against the original's
eager outputs, at the shapes `verify` checks (a decoder LM's decode program with its cache, from a 1-token cache
on, and greedy loops against generate(); an encoder's and a vision model's forward at other batch sizes and lengths).

These need the `executorch` extra; CI runs them in an environment of their own (executorch installs torchao, which
transformers then imports with every model). Without it, only the refusal to run is tested."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

import generated  # noqa: F401  (registers the cache pytree nodes)

HAS_EXECUTORCH = importlib.util.find_spec("executorch") is not None
needs_executorch = pytest.mark.skipif(not HAS_EXECUTORCH, reason="needs the executorch extra")


@pytest.mark.skipif(HAS_EXECUTORCH, reason="executorch is installed")
def test_without_executorch_verify_says_which_extra_to_install():
    run = subprocess.run(
        [sys.executable, "-m", "exportsmith", "verify", "bert", "--executorch"], capture_output=True, text=True
    )
    assert run.returncode != 0
    assert "pip install 'exportsmith[executorch]'" in run.stderr
    assert "Traceback" not in run.stderr


@needs_executorch
def test_verify_runs_the_executorch_check_in_a_child_and_reports_it():
    run = subprocess.run(
        [sys.executable, "-m", "exportsmith", "verify", "bert", "--executorch"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "bert: ExecuTorch ok max|diff|=" in run.stdout


@needs_executorch
@pytest.mark.parametrize("model_type", ["llama", "bert", "vit"])  # a decoder LM, an encoder, a vision model
def test_generated_copy_runs_in_executorch_and_matches_eager(model_type: str):
    from exportsmith.verify.executorch_check import EXECUTORCH_MAX_ABS_DIFF, verify_executorch

    result = verify_executorch(model_type)
    assert result.ok, result.summary
    names = {case.name for case in result.cases}
    if model_type == "llama":
        # the first decode step of a 1-token prompt, and a 1-token prefill, through the lowered programs
        assert {"first-step", "first-step-batch4", "two-tokens-past1", "prefill-one-token"} <= names
        # and generate()'s tokens from greedy loops that only the two lowered programs drive (prompts of 1, 2, 12)
        assert {(loop["batch"], loop["prompt"]) for loop in result.greedy} >= {(1, 1), (2, 12)}
        assert all(loop["error"] is None and (loop["match"] or loop["tie"]) for loop in result.greedy), result.greedy
    else:
        assert any(case.batch == 1 for case in result.cases) and not result.greedy
    assert all(case.max_diff <= EXECUTORCH_MAX_ABS_DIFF for case in result.cases)


@needs_executorch
def test_a_wrong_output_is_a_mismatch(monkeypatch):
    from exportsmith.verify import executorch_check

    call = executorch_check.EtProgram.__call__

    def off_by_a_little(self, **inputs):
        output = call(self, **inputs)
        output.logits = output.logits + 1e-2
        return output

    monkeypatch.setattr(executorch_check.EtProgram, "__call__", off_by_a_little)
    result = executorch_check.verify_executorch("bert")
    assert not result.ok and result.failure == "mismatch", result.summary


class _Padded(torch.nn.Module):
    """A length padded up to a minimum, as the generated copies' masks are under export: `torch.sym_max` in the graph."""

    def forward(self, x):
        kept = torch.sym_max(x.shape[-1], 4)
        return torch.cat([x, x.new_zeros(x.shape[0], 4)], dim=-1)[:, :kept] * 2


@needs_executorch
@pytest.mark.parametrize("example", [6, 2])  # traced longer / shorter than the minimum
def test_a_length_padded_to_a_minimum_lowers_and_is_right_on_both_sides(example: int):
    from executorch.exir import to_edge_transform_and_lower

    from exportsmith.verify.executorch_check import EtProgram

    def export():
        shapes = {"x": {1: torch.export.Dim.DYNAMIC(max=64)}}
        return torch.export.export(_Padded(), (torch.randn(2, example),), dynamic_shapes=shapes, strict=False)

    with pytest.raises(AssertionError):  # the edge verifier refuses the Python function by default
        to_edge_transform_and_lower(export())
    program = EtProgram(export())
    for length in (1, 3, 4, 9):
        x = torch.randn(2, length)
        expected = torch.nn.functional.pad(x, (0, max(4 - length, 0))) * 2
        assert torch.equal(program(x), expected), length


class _TwoInputs(torch.nn.Module):
    def forward(self, a, b, scale=2.0):
        return a * scale - b


@needs_executorch
def test_keyword_inputs_in_another_order_reach_the_inputs_of_their_names():
    """generate() calls a program with the keywords in its own order: they are fed by name."""
    from exportsmith.verify.executorch_check import EtProgram

    a, b = torch.randn(2, 3), torch.randn(2, 3)
    exported = torch.export.export(_TwoInputs(), (), {"a": a, "b": b, "scale": 2.0}, strict=False)
    program = EtProgram(exported)
    assert torch.equal(program(b=b, a=a), a * 2.0 - b)  # the constant `scale` as traced
    with pytest.raises(RuntimeError, match="hold no b"):
        program(a=a, c=b)
