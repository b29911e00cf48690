"""cdist-mode: which cdist calls it rewrites or refuses (with reasons); the helper is torch.cdist bit for bit on both
sides of its 25-row threshold; one program of `fixtures/cdist_mode/quantizer.in.py` (Mimi's codebook) exported with a
dynamic number of frames matches the original at every number, where the original's export fails; and every
statement it rewrites in the installed transformers gives the same distances on both arms."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import libcst as cst
import pytest
import torch
from torch.export import Dim

from codemods.base import EXPORTING
from codemods.cdist_mode import HELPER_CODE, CdistMode
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods
from source_modules import module_from_source

FIXTURES = Path(__file__).parent / "fixtures" / "cdist_mode"


def _change(case: str, module: str = "transformers.models.toy.modeling_toy"):
    path = FIXTURES / f"{case}.in.py"
    return run_codemods(path.read_text(), path.name, module, codemods=(CdistMode,))


def test_findings_name_each_rewrite_and_each_refusal_with_its_reason():
    findings = [(f.line, f.kind, f.construct, f.reason) for f in _change("quantizer").findings]
    assert [(line, kind, construct) for line, kind, construct, _ in findings] == [
        (14, "rewritten", "Codebook.forward"),
        (19, "rewritten", "nearest"),
        (27, "refused", "manhattan"),
    ]
    assert findings[-1][-1] == "`p` is not the literal 2"
    assert [(f.line, f.reason) for f in _change("refuse_no_torch_import").findings] == [
        (6, "the module does not `import torch`")
    ]
    others = _change("refuse_other_calls")
    assert not others.changed
    assert [(f.line, f.construct, f.reason) for f in others.findings] == [
        (10, "nearest", "the module already uses the name `euclidean_cdist`"),
        (19, "unpacked", "the call has other arguments"),
        (23, "one_input", "the call does not give both inputs"),
    ]  # and `chosen_positionally`, which gives the algorithm, has no finding
    shared = _change("quantizer", module="transformers.integrations.toy")
    assert not shared.changed
    assert {f.reason for f in shared.findings} == {
        "`transformers.integrations.toy` is a shared module, whose classes must stay transformers' own"
    }


@pytest.mark.parametrize(("rows", "codes"), [(3, 4), (30, 4), (3, 30), (30, 30), (25, 25), (26, 1)])
def test_the_helper_is_cdist_bit_for_bit_on_both_sides_of_the_threshold(rows: int, codes: int):
    helper = module_from_source(_change("quantizer").rewritten, "cdist_mode_helper").euclidean_cdist
    generator = torch.Generator().manual_seed(rows * 100 + codes)
    for batch in ((), (2,)):
        x1 = torch.randn(*batch, rows, 5, generator=generator) * 100
        x2 = torch.randn(*batch, codes, 5, generator=generator) * 100
        assert torch.equal(helper(x1, x2), torch.cdist(x1, x2)), (rows, codes, batch)
    # the two algorithms do differ: the helper's choice is what makes it equal
    x1, x2 = torch.randn(30, 5, generator=generator) * 100, torch.randn(30, 5, generator=generator) * 100
    direct = torch.cdist(x1, x2, compute_mode="donot_use_mm_for_euclid_dist")
    assert not torch.equal(direct, torch.cdist(x1, x2))


def test_one_program_over_any_number_of_frames_matches_the_original():
    change = _change("quantizer")
    torch.manual_seed(0)
    original = module_from_source(change.original, "cdist_mode_original").Codebook()
    rewritten = module_from_source(change.rewritten, "cdist_mode_rewritten").Codebook()
    rewritten.load_state_dict(original.state_dict())

    def frames(n: int) -> torch.Tensor:
        return torch.randn(2, n, 4, generator=torch.Generator().manual_seed(n))

    shapes = ({1: Dim("frames", min=1, max=64)},)
    with pytest.raises(Exception, match="Constraints violated|Expected op to be"):
        torch.export.export(original, (frames(5),), dynamic_shapes=shapes, strict=False)
    program = torch.export.export(rewritten, (frames(5),), dynamic_shapes=shapes, strict=False).module()
    with torch.no_grad():
        for n in (1, 2, 5, 12, 13, 30, 64):
            assert torch.equal(program(frames(n)), original(frames(n))), n
            with mock.patch("torch.compiler.is_exporting", return_value=True):
                assert torch.equal(rewritten(frames(n)), original(frames(n))), n


def test_every_site_generate_rewrites_gives_the_same_distances_on_both_arms():
    """Each statement cdist-mode rewrites in the installed transformers (Mimi's codebook), run as both arms against
    the statement as written, frames from 1 to 40 against a codebook of 2048 and of 8: bit-identical."""
    tf = find_transformers()
    code = cst.Module([]).code_for_node
    exercised = 0
    for path in sorted((tf.root / "models").glob("*/modeling_*.py")):
        source = path.read_text(encoding="utf-8")
        if not CdistMode.might_apply(source):
            continue
        change = run_codemods(source, path.name, tf.module_name(path), codemods=(CdistMode,))
        if not change.changed:
            continue
        assert HELPER_CODE in change.rewritten  # the helper the export arm calls, added once
        helper = module_from_source("import torch\n\n\n" + HELPER_CODE, "cdist_mode_transformers_helper")
        twins = [
            node
            for node in cst.matchers.findall(cst.parse_module(change.rewritten), cst.matchers.If(test=EXPORTING))
            if "cdist's algorithm" in code(node)
        ]
        assert len(twins) == sum(f.kind == "rewritten" for f in change.findings), path
        for twin in twins:
            (exported,), (eager,) = twin.body.body, twin.orelse.body.body
            assert code(eager).strip() in change.original
            target = eager.body[0].targets[0].target.value
            for codebook in (2048, 8):
                for n in (1, 13, 40):
                    generator = torch.Generator().manual_seed(n)
                    names = {
                        "torch": torch,
                        "euclidean_cdist": helper.euclidean_cdist,
                        "hidden_states": torch.randn(n, 16, generator=generator),
                        "self": SimpleNamespace(embed=torch.randn(codebook, 16, generator=generator)),
                    }
                    values = []
                    for statement in (eager, exported):
                        namespace = dict(names)
                        exec(compile(code(statement), str(path), "exec"), namespace)
                        values.append(namespace[target])
                    assert torch.equal(*values), (path, codebook, n)
            exercised += 1
    assert exercised >= 1  # mimi

