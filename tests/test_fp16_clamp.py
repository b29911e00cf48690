"""fp16-clamp: the branch-free clamp gives the original's tensor bit for bit, over every site it rewrites in the
installed transformers, and exports in fp16 where the original stops.

1. Every site `exportsmith generate` would rewrite (modeling and modular files): the original `if` and the rewritten
   one run on fp16 tensors with and without infinities, with NaN, with values beyond the clamp value, and on fp32 and
   bf16 (where neither clamps): the same bits.
2. The fixture's layer exports in fp16 once rewritten (the original stops on the data-dependent test), and the program
   gives eager's tensor with and without infinities.
3. Other forms are not candidates.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest
import torch

from codemods.fp16_clamp import Fp16Clamp
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods
from source_modules import model_pair

FIXTURES = Path(__file__).parent / "fixtures" / "fp16_clamp"
BIG = 65000.0  # beyond finfo(float16).max - 1000, below the largest finite value


def _values(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    base = torch.linspace(-3, 3, 24).reshape(2, 3, 4)
    cases = {"finite": base.clone()}
    for name, values in {
        "inf": [float("inf")],
        "-inf": [float("-inf")],
        "nan": [float("nan")],
        "big": [BIG, -BIG],
        "big and inf": [BIG, float("inf")],
        "nan and -inf": [float("nan"), float("-inf")],
    }.items():
        tensor = base.clone().flatten()
        tensor[: len(values)] = torch.tensor(values)
        cases[name] = tensor.reshape(base.shape)
    return {name: tensor.to(dtype) for name, tensor in cases.items()}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16) if tensor.element_size() == 2 else tensor.view(torch.int32)


def _ifs(tree: cst.Module, hidden_dtype_test: bool) -> list[cst.If]:
    found = []

    class Finder(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> None:
            code = cst.Module([]).code_for_node(node.test)
            if "torch.float16" in code and ("isinf" in code or "isfinite" in code) == hidden_dtype_test:
                if "torch.clamp(" in cst.Module([node]).code:
                    found.append(node)

    tree.visit(Finder())
    return found


def _run(node: cst.If, hidden: str, tensor: torch.Tensor) -> torch.Tensor:
    namespace = {"torch": torch, hidden: tensor.clone()}
    exec(compile(textwrap.dedent(cst.Module([node]).code), "<site>", "exec"), namespace)
    return namespace[hidden]


def test_every_site_gives_the_original_bits():
    tf = find_transformers()
    paths = [
        path
        for folder in sorted((tf.root / "models").iterdir())
        for path in sorted(folder.glob("modeling_*.py")) + sorted(folder.glob("modular_*.py"))
        if Fp16Clamp.might_apply(path.read_text(encoding="utf-8"))
    ]
    sites = 0
    for path in paths:
        source = path.read_text(encoding="utf-8")
        change = run_codemods(source, path.name, tf.module_name(path), codemods=(Fp16Clamp,))
        rewritten = [f for f in change.findings if f.kind == "rewritten"]
        before = _ifs(cst.parse_module(source), hidden_dtype_test=True)
        after = _ifs(cst.parse_module(change.rewritten), hidden_dtype_test=False)
        assert len(before) == len(after) == len(rewritten), path
        for original, new in zip(before, after):
            hidden = cst.Module([]).code_for_node(new.test).split(".dtype")[0]
            for dtype in (torch.float16, torch.float32, torch.bfloat16):
                for name, tensor in _values(dtype).items():
                    expected, actual = _run(original, hidden, tensor), _run(new, hidden, tensor)
                    assert actual.dtype == expected.dtype and torch.equal(_bits(actual), _bits(expected)), (path, name)
            sites += 1
    assert sites >= 18  # longt5, pix2struct, nllb-moe, bart and the others of transformers 5.24


def _layers():
    source = (FIXTURES / "encoder_layer.in.py").read_text()
    change = run_codemods(source, "encoder_layer.py", "transformers.models.toy.modeling_toy", codemods=(Fp16Clamp,))
    assert [f.construct for f in change.findings] == ["EncoderLayer.forward", "DecoderLayer.forward"]
    return change


@pytest.mark.parametrize("model_class", ["EncoderLayer", "DecoderLayer"])
def test_the_rewritten_layer_exports_in_fp16_and_matches_eager(model_class: str):
    original, rewritten = model_pair(_layers(), model_class, f"fp16_clamp_{model_class}")
    original.fc = rewritten.fc = torch.nn.Identity()
    example = (_values(torch.float16)["big and inf"],)
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(original, example, strict=False)
    program = torch.export.export(rewritten, example, strict=False).module()
    for name, tensor in _values(torch.float16).items():
        expected = original(tensor)
        assert torch.equal(_bits(program(tensor)), _bits(expected)), name


def test_other_forms_are_not_candidates():
    source = textwrap.dedent(
        """
        import torch

        def nan_only(h):
            if h.dtype == torch.float16 and torch.isnan(h).any():
                clamp_value = torch.finfo(h.dtype).max - 1000
                h = torch.clamp(h, min=-clamp_value, max=clamp_value)
            return h

        def with_else(h):
            if h.dtype == torch.float16 and torch.isinf(h).any():
                clamp_value = torch.finfo(h.dtype).max - 1000
                h = torch.clamp(h, min=-clamp_value, max=clamp_value)
            else:
                h = h + 1
            return h

        def other_tensor(h, g):
            if h.dtype == torch.float16 and torch.isinf(g).any():
                clamp_value = torch.finfo(h.dtype).max - 1000
                h = torch.clamp(h, min=-clamp_value, max=clamp_value)
            return h

        def more_statements(h):
            if h.dtype == torch.float16 and torch.isinf(h).any():
                clamp_value = torch.finfo(h.dtype).max - 1000
                h = torch.clamp(h, min=-clamp_value, max=clamp_value)
                print("clamped")
            return h
        """
    )
    change = run_codemods(source, "toy.py", "transformers.models.toy.modeling_toy", codemods=(Fp16Clamp,))
    assert not change.changed and not change.findings


def test_a_module_that_does_not_import_torch_is_refused():
    source = textwrap.dedent(
        """
        from torch import clamp

        def clamped(h):
            if h.dtype == torch.float16 and torch.isinf(h).any():
                clamp_value = torch.finfo(h.dtype).max - 1000
                h = torch.clamp(h, min=-clamp_value, max=clamp_value)
            return h
        """
    )
    change = run_codemods(source, "toy.py", "transformers.models.toy.modeling_toy", codemods=(Fp16Clamp,))
    assert not change.changed
    assert [(f.kind, f.construct, f.reason) for f in change.findings] == [
        ("refused", "clamped", "the module does not `import torch`")
    ]
