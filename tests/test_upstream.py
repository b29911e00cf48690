"""The upstream patches: they apply to a pristine transformers tree, and the patched transformers exports."""

from __future__ import annotations

import collections
import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codemods import UPSTREAM_CODEMODS
from exportsmith.discover import find_transformers
from exportsmith.generate import generated_modules, render
from exportsmith.upstream import generated_from, patch_series
from exportsmith.verify.check import MAX_ABS_DIFF
from exportsmith.verify.patched_tree import write_register_module

ROOT = Path(__file__).parents[1]
TF = find_transformers()


def pristine_tree(root: Path, only: list[str] | None = None) -> Path:
    """`root/src/transformers` laid out from the installed package (or just the files `only` names, enough for
    `git apply`), as a git work tree."""
    target = root / "src" / "transformers"
    if only is None:
        shutil.copytree(TF.root, target, ignore=shutil.ignore_patterns("__pycache__"))
    for relpath in only or ():
        (target / relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(TF.root / relpath, target / relpath)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def apply(root: Path, patch: Path) -> None:
    result = subprocess.run(["git", "apply", str(patch)], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, f"{patch.name}: {result.stderr}"


# Runs with the patched transformers first on sys.path and without `generated`: verifies the ORIGINAL classes, i.e.
# transformers as the patches leave it, exported the way transformers' exporters register caches (`patched_tree.REGISTER_CACHES`).
PATCHED_VERIFY = """
import json, sys
import transformers
from torch.utils import _pytree as pytree
from transformers import DynamicCache
registered_at_import = DynamicCache in pytree.SUPPORTED_NODES
import register_transformers_caches
from exportsmith.verify.check import verify_model
assert "generated" not in sys.modules
result = {"transformers": transformers.__file__, "registered_at_import": registered_at_import, "records": {}}
for model_type in sys.argv[1:]:
    result["records"][model_type] = verify_model(model_type, subject="original", imports=("register_transformers_caches",)).record()
assert "generated" not in sys.modules
print(json.dumps(result))
"""
# One model per task, plus those whose patches go beyond the cache registration: gemma3
# (the vmap-free masking_utils, sliding-window layers), mistral (sliding-window layers).
PATCHED_MODELS = ["llama", "qwen2_moe", "gemma3", "mistral", "t5", "bert", "vit", "wav2vec2"]


def _case_outcome(case: dict) -> str:
    if case["error"] is not None:
        return "raised"
    return "within tolerance" if case["max_diff"] <= case.get("tolerance", MAX_ABS_DIFF) else "over tolerance"


def _outcome(record: dict) -> dict:
    """What must be the same for the patched transformers here and the committed record of the generated copy:
    verdict, failure kind, and per evaluation case whether it raised or where its max|diff| lies against the harness's
    tolerance. Not the max|diff| itself: the record was measured on another CPU, whose kernels round differently
    (gemma3's decode-step-batch4 was recorded at 7.2e-7 and gives 1.2e-6 on an AVX2-only machine)."""
    cases = [(case["program"], case.get("dims"), case["name"], _case_outcome(case)) for case in record["cases"]]
    return {"ok": record["ok"], "failure": record["failure"], "cases": cases}


def test_outcomes_ignore_rounding_but_not_a_wrong_program_or_a_raised_case():
    case = dict(program="decode", name="step", max_diff=7.152557373046875e-07, error=None)
    committed = {"ok": True, "failure": None, "cases": [case]}
    elsewhere = {**committed, "cases": [{**case, "max_diff": 1.1920928955078125e-06}]}
    assert _outcome(elsewhere) == _outcome(committed)
    wrong = {"ok": False, "failure": "silent-specialisation", "cases": [{**case, "max_diff": 0.25}]}
    raised = {"ok": False, "failure": "guard-rejected", "cases": [{**case, "max_diff": None, "error": "Guard"}]}
    for other in (wrong, raised, {**committed, "cases": [{**case, "name": "other"}]}):
        assert _outcome(other) != _outcome(committed)


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory) -> Path:
    """The installed transformers with the committed patches applied (`src/transformers` under the returned root)."""
    root = pristine_tree(tmp_path_factory.mktemp("patched"))
    patches = [ROOT / "generated" / "_shared" / "upstream.patch"]
    patches += [ROOT / "generated" / module / "upstream.patch" for module in generated_modules(ROOT / "generated")]
    for patch in patches:
        if patch.is_file():  # a model the codemods leave as it is has none
            apply(root, patch)
    return root


def test_committed_patches_apply_and_the_patched_transformers_verifies_as_the_generated_copies(tmp_path, patched_tree):
    root = patched_tree
    write_register_module(tmp_path)  # registers the caches the way transformers' exporters do
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(tmp_path)])}
    result = subprocess.run(
        [sys.executable, "-c", PATCHED_VERIFY, *PATCHED_MODELS], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["transformers"].startswith(str(root))  # the patched tree, not the installed package
    # no side effect at import: transformers' exporters register the caches, with the counters the patches declare
    assert not data["registered_at_import"]
    for model in PATCHED_MODELS:  # the committed records of the generated copies (`exportsmith verify --record`)
        committed = json.loads((ROOT / "generated" / model / "VERIFY.json").read_text())
        assert _outcome(data["records"][model]) == _outcome(committed), model


# transformers' ExecuTorch integration exports a sliding-window Mistral with a `DynamicCache` (as its
# `test_dynamic_cache_exportability` does) and prints what the program takes and returns
EXECUTORCH_EXPORT = """
import torch
from transformers import MistralConfig, MistralForCausalLM
from transformers.integrations.executorch import export_with_dynamic_cache

config = MistralConfig(
    vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, sliding_window=4,
)
torch.manual_seed(0)
model = MistralForCausalLM(config).eval()
program = export_with_dynamic_cache(model, torch.randint(0, 99, (1, 6)), torch.ones(1, 6, dtype=torch.long))
signature = program.graph_signature
print(len(signature.user_inputs), len(signature.user_outputs), " ".join(str(program.call_spec.in_spec).split()))
"""


def last_lines_on_both_trees(code: str, cwd: Path, patched_tree: Path) -> dict[str, str]:
    """{"released": ..., "patched": ...}: the last line `code` prints with the installed transformers and with the
    patched tree's."""
    outputs = {}
    for name, path in (("released", ""), ("patched", str(patched_tree / "src"))):
        env = {**os.environ, "PYTHONPATH": path}
        result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{name}: {result.stderr[-2000:]}"
        outputs[name] = result.stdout.strip().splitlines()[-1]
    return outputs


def test_the_executorch_integration_exports_a_sliding_window_model_as_before_on_the_patched_tree(
    tmp_path, patched_tree
):
    """The patches add no registration of their own: transformers' ExecuTorch integration registers `DynamicCache`
    its way and its program keeps its signature (a registration at import would win over it)."""
    outputs = last_lines_on_both_trees(EXECUTORCH_EXPORT, tmp_path, patched_tree)
    assert outputs["patched"] == outputs["released"]
    assert outputs["released"].startswith("3 5 ")  # input ids, mask, the cache's keys and values


# Masks built from mask functions a user passes (`or_mask_function`/`and_mask_function`, public API), written for
# vmap's 0-d indices: `padding[b][kv]` fails on the broadcast index tensors of the export path, so eager must keep vmap
USER_MASKS = """
import torch
import transformers.masking_utils as mu

padding = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]]).bool()
segments = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 2]])

def chained_padding(batch_idx, head_idx, q_idx, kv_idx):
    return padding[batch_idx][kv_idx] & (kv_idx <= q_idx + 1)

def same_segment(batch_idx, head_idx, q_idx, kv_idx):
    return segments[batch_idx][q_idx] == segments[batch_idx][kv_idx]

masks = []
for interface in (mu.sdpa_mask, mu.eager_mask):
    for function in (mu.or_masks(mu.causal_mask_function, chained_padding), mu.and_masks(mu.causal_mask_function, same_segment)):
        for q_length, q_offset in ((6, 0), (1, 5)):
            masks.append(
                interface(
                    batch_size=2, q_length=q_length, kv_length=6, q_offset=q_offset, mask_function=function,
                    attention_mask=padding, allow_is_causal_skip=False, use_vmap=True,
                )
            )
print(repr([mask.tolist() for mask in masks]))
"""


def test_user_vmap_style_mask_functions_give_the_same_masks_on_the_patched_tree(tmp_path, patched_tree):
    """Eager is unchanged for the public mask-function API: a vmap-style function (chained indexing) builds
    the same sdpa and eager masks on the released and the patched transformers (the patched tree once raised
    `IndexError` here)."""
    outputs = last_lines_on_both_trees(USER_MASKS, tmp_path, patched_tree)
    assert outputs["patched"] == outputs["released"]
    assert "True" in outputs["released"] and "False" in outputs["released"]  # masks that say something


@pytest.fixture(scope="module")
def series():
    """The `--all` series. Models that no codemod's prefilter admits have empty patches (a property the generate
    tests check), so rendering only the admitted ones gives the same series in a fraction of the time."""

    def admitted(module: str) -> bool:
        paths = TF.models[module].modeling + TF.models[module].modular
        return any(codemod.might_apply(path.read_text()) for codemod in UPSTREAM_CODEMODS for path in paths)

    rendered = render(TF, [module for module in TF.models if admitted(module)], jobs=os.cpu_count() or 1)
    model_types = {module: list(TF.models[module].model_types) for module in TF.models}
    return rendered, patch_series(rendered.upstream, {}, model_types, TF.version)


def test_the_all_models_series_applies_in_order(tmp_path, series):
    rendered, files = series
    changed = [change.relpath for group in rendered.upstream.values() for change in group if change.changed]
    root = pristine_tree(tmp_path, only=changed)
    order = files["series"].split()
    # one patch per mechanism, in pipeline order, every codemod that rewrites something in 5.24 among them
    names = [name.split("-", 1)[1].removesuffix(".patch") for name in order]
    assert names == [codemod.NAME for codemod in UPSTREAM_CODEMODS if codemod.NAME in names] and len(names) >= 10
    for name in order:
        (tmp_path / name).write_text(files[name])
        apply(root, tmp_path / name)
        assert files[name.replace(".patch", ".md")].startswith("# torch.export support: ")


def test_a_model_with_a_modular_file_gets_its_modular_file_edited(series):
    rendered, files = series
    changed = {change.relpath: change for change in rendered.upstream["deepseek_v4"] if change.changed}
    assert set(changed) == {"models/deepseek_v4/modeling_deepseek_v4.py", "models/deepseek_v4/modular_deepseek_v4.py"}
    assert generated_from(changed["models/deepseek_v4/modeling_deepseek_v4.py"]) == (
        "src/transformers/models/deepseek_v4/modular_deepseek_v4.py"
    )
    text = next(text for name, text in files.items() if name.endswith("-cache-export.md"))
    assert "| `src/transformers/models/deepseek_v4/modular_deepseek_v4.py` | source (modular file) |" in text
    assert "generated from `src/transformers/models/deepseek_v4/modular_deepseek_v4.py`" in text
    patch = next(text for name, text in files.items() if name.endswith("-cache-export.patch"))
    for stem in ("modeling", "modular"):  # the same class, the same declaration, in both
        section = patch.split(f"b/src/transformers/models/deepseek_v4/{stem}_deepseek_v4.py\n", 1)[1].split(
            "diff --git"
        )[0]
        assert '+    _export_counters = ("cumulative_length",)' in section


def test_a_modular_class_that_inherits_its_init_gets_the_rewrite_of_its_generated_class(series):
    """`DeepseekV4Experts(MixtralExperts)` assigns its parameters in Mixtral's `__init__`: read in the generated
    modeling file, they let the modular file get the MoE rewrite its modeling file gets (else transformers'
    `check_modular_conversion` fails and `make fix-repo` reverts the fix)."""
    rendered, _ = series
    changes = {change.relpath: change for change in rendered.upstream["deepseek_v4"]}
    for stem in ("modeling", "modular"):
        change = changes[f"models/deepseek_v4/{stem}_deepseek_v4.py"]
        findings = [finding for finding in change.findings if finding.codemod == "moe-expert-loop"]
        assert [f.kind for f in findings] == ["rewritten"], (stem, findings)


def test_a_class_inherited_through_the_modular_converter_is_explained(series):
    _, files = series
    text = next(text for name, text in files.items() if name.endswith("-moe-expert-loop.md"))
    # minimax's experts are Mixtral's: the converter writes them into modeling_minimax.py from modular_mixtral.py
    row = next(line for line in text.splitlines() if "models/minimax/modeling_minimax.py" in line)
    assert "come into it from another model's modular file" in row


def test_pr_text_carries_the_evidence_measured_before_and_after_the_patch():
    from exportsmith.upstream import Edit, pr_description

    rendered = render(TF, ["minimax"])
    before = {"ok": False, "failure": "export-error", "message": "decode: GuardOnDataDependentSymNode: u0 > 0; more"}
    after = {"ok": True, "failure": None, "message": "", "cases": 2, "max_diff": 2.5e-7}
    evidence = {"minimax": {"before": before, "after": after}}
    edits = [Edit(change, change.original, change.rewritten) for change in rendered.upstream["minimax"]]
    text = pr_description("moe-expert-loop", edits, evidence, TF.version, ["minimax"], "2.13.0")
    assert "## Evidence, measured on the patched transformers tree" in text
    assert "| minimax | export-error: `decode: GuardOnDataDependentSymNode: u0 > 0` | verified | 2 | 2.5e-07 |" in text
    unmeasured = pr_description("moe-expert-loop", edits, {}, TF.version, ["minimax"])
    assert "Not measured yet: `python tools/upstream_evidence.py" in unmeasured
    test = dict(model_type="minimax", path="tests/exporters/test_moe_expert_loop.py", text="", after="passed")
    test["overrides"] = {"experts_implementation": "eager"}
    test["before"] = "failed: GuardOnDataDependentSymNode: u0"
    with_test = pr_description("moe-expert-loop", edits, evidence, TF.version, ["minimax"], "2.13.0", test)
    assert "## Test\n\n`tests/exporters/test_moe_expert_loop.py` (added by this patch)" in with_test
    assert "exports minimax's tiny model (`experts_implementation='eager'`) and checks" in with_test
    assert "without this patch: failed (`GuardOnDataDependentSymNode: u0`); with it: passed." in with_test
    assert "Not ready to send" not in with_test
    untested = pr_description("moe-expert-loop", edits, evidence, TF.version, ["minimax"], "2.13.0", {"why": "none"})
    assert "**Not ready to send**: none (see Evidence)." in untested


def test_patches_are_byte_stable_across_processes(tmp_path):
    outputs = []
    for seed in ("1", "999"):
        out = tmp_path / seed
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(
            [sys.executable, "-m", "exportsmith", "diff", "minimax", "llama", "--out", str(out)],
            check=True,
            env=env,
            capture_output=True,
        )
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] == outputs[1] and "series" in outputs[0]


RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
# The rule families transformers' CI lints with; what matters is that a patch adds no finding, not the exact set.
RUFF_RULES = "E,F,I,W,C4,SIM,UP"


def _ruff(args: list[str], text: str, path: str) -> str:
    result = subprocess.run(
        [RUFF, *args, "--line-length", "119", "--stdin-filename", path, "-"],
        input=text,
        capture_output=True,
        text=True,
    )
    assert result.returncode in (0, 1), result.stderr
    return result.stdout


def _opcodes(before: str, after: str) -> list:
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    return [opcode for opcode in matcher.get_opcodes() if opcode[0] != "equal"]


def _added_lines(original: str, rewritten: str) -> set[int]:
    """0-based numbers of the lines of `rewritten` that are not in `original`."""
    return {line for _, _, _, j1, j2 in _opcodes(original, rewritten) for line in range(j1, j2)}


def _reformatted_lines(text: str, formatted: str) -> set[int]:
    """0-based numbers of the lines of `text` that formatting changes (or inserts lines next to)."""
    return {line for _, i1, i2, _, _ in _opcodes(text, formatted) for line in range(max(i1 - 1, 0), max(i2, i1 + 1))}


def _lint(text: str, path: str) -> collections.Counter:
    """ruff's findings, without line numbers, so that the original's and the patched file's compare."""
    output = _ruff(["check", "--select", RUFF_RULES, "--ignore", "E501", "--output-format", "json"], text, path)
    return collections.Counter((item["code"], item["message"]) for item in json.loads(output or "[]"))


@pytest.mark.skipif(RUFF is None, reason="ruff is part of the test extra")
def test_patched_code_is_formatted_and_linted_as_transformers_wants(series):
    """New lines are laid out as `ruff format` (line length 119, as transformers) lays them out, and a patch adds no
    lint finding. Some transformers files are not ruff-stable themselves, so only the patch's own lines count."""
    rendered, _ = series
    changed = [change for change in rendered.changes if change.changed]
    assert changed
    problems = []
    for change in changed:
        path = f"src/transformers/{change.relpath}"
        formatted = _ruff(["format"], change.rewritten, path)
        unformatted = sorted(
            _reformatted_lines(change.rewritten, formatted) & _added_lines(change.original, change.rewritten)
        )
        if unformatted:
            problems.append(f"{path}: ruff format changes added lines {[line + 1 for line in unformatted[:5]]}")
        added = _lint(change.rewritten, path) - _lint(change.original, path)
        if added:
            problems.append(f"{path}: new lint findings {sorted(added)[:3]}")
    assert not problems, "\n".join(problems)


def test_a_pr_test_fails_on_the_released_tree_and_passes_on_the_patched_one(tmp_path, patched_tree):
    """The transformers-style test written for a PR (here the cache counters', on a sliding-window Mistral: its
    decode program must serve every cache length) is one that can fail: it fails without the patches."""
    from exportsmith.upstream import new_file_diff
    from exportsmith.upstream_tests import export_test
    from exportsmith.verify.patched_tree import run_test_on_tree

    path, text = export_test("mistral", "cache-export")
    assert path == "tests/exporters/test_cache_export.py"
    assert "class MistralForCausalLMCacheExportExportTest(unittest.TestCase):" in text
    compile(text, path, "exec")
    assert run_test_on_tree(patched_tree / "src", text, tmp_path) == "passed"
    released = run_test_on_tree(TF.root.parent, text, tmp_path)
    assert released.startswith("failed: ")
    # the patch adds it as a new file
    (tmp_path / "repo").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tmp_path / "repo", check=True)
    (tmp_path / "test.patch").write_text(new_file_diff(path, text))
    apply(tmp_path / "repo", tmp_path / "test.patch")
    assert (tmp_path / "repo" / path).read_text() == text


def test_a_forward_pr_test_writes_its_inputs_out():
    """A model without a decode step gets its forward at the harness's shapes, integer inputs as they are."""
    from exportsmith.upstream_tests import export_test

    path, text = export_test("qwen2_5_vl_vision", "vision-grid-loops")
    assert path == "tests/exporters/test_vision_grid_loops.py"
    assert '"grid_thw": torch.tensor([[1, 8, 8], [1, 10, 6]], dtype=torch.int64)' in text
    assert "def test_forward_exports_and_matches_eager_at_other_shapes(self):" in text
    compile(text, path, "exec")


def test_a_decode_test_can_declare_its_new_tokens_with_a_named_dim():
    import torch

    from exportsmith.upstream_tests import NAMED_TOKENS, NoTest, export_test

    _, text = export_test("llama", "chunk-padding", named_tokens=True)
    compile(text, "test_chunk_padding.py", "exec")
    assert "def with_named_tokens(shapes):" in text
    assert "dynamic_shapes=with_named_tokens(dynamic_shapes(example, inputs[1:]))" in text
    namespace = {"torch": torch}
    exec(NAMED_TOKENS, namespace)  # the helper the test carries, run
    shapes = namespace["with_named_tokens"]({"input_ids": {0: torch.export.Dim.AUTO}, "attention_mask": None})
    assert shapes["input_ids"][0] is torch.export.Dim.AUTO and shapes["input_ids"][1].__name__ == "tokens"
    _, plain = export_test("llama", "chunk-padding")
    assert "with_named_tokens" not in plain
    with pytest.raises(NoTest, match="decoder LM only"):
        export_test("bert", "chunk-padding", named_tokens=True)


def test_a_prefill_test_declares_the_prompt_length_with_a_named_dim():
    """bounded-topk's site is the sparse indexer's top-k over a prompt longer than `index_topk`: its test exports the
    prefill, the prompt length `Dim("tokens", min=1, max=64)`, with the configuration's `index_topk` at 4."""
    from exportsmith.upstream_tests import NoTest, export_test

    _, text = export_test("deepseek_v32", "bounded-topk", overrides={"index_topk": 4}, prefill=True)
    compile(text, "test_bounded_topk.py", "exec")
    assert "def test_prefill_exports_and_matches_eager_at_other_prompt_lengths(self):" in text
    assert 'tokens = torch.export.Dim("tokens", min=1, max=64)' in text
    assert '"index_topk": 4,' in text and "shapes = [(2, 5), (1, 1), (4, 3), (1, 12)]" in text
    assert "decode_inputs" not in text
    with pytest.raises(NoTest, match="decoder LM only"):
        export_test("bert", "bounded-topk", prefill=True)


def test_the_loading_process_allows_every_cache_layer_class(tmp_path):
    """A saved program's example inputs hold cache layers: linear-attention ones (a mixin of their own) included."""
    import subprocess
    import sys

    from exportsmith.verify.patched_tree import REGISTER_MODULE

    write_register_module(tmp_path)
    check = (
        f"import torch, {REGISTER_MODULE}\n"
        "from transformers.cache_utils import DynamicLayer, LinearAttentionLayer\n"
        "allowed = set(torch.serialization.get_safe_globals())\n"
        "assert {DynamicLayer, LinearAttentionLayer} <= allowed, allowed\n"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_pr_test_checks_the_program_as_exported_before_it_saves_it():
    """A program whose example inputs are cleared (as a save without them does) checks no guards in torch 2.13, so
    the PR tests run the program as exported first: a guard that rejects a valid input fails them."""
    import torch

    from exportsmith.upstream_tests import export_test

    class Branch(torch.nn.Module):
        def forward(self, x, n):
            return x + 1 if x.shape[0] <= n.shape[0] else x - 1

    auto = {0: torch.export.Dim.AUTO}
    program = torch.export.export(Branch(), (torch.ones(3), torch.ones(5)), dynamic_shapes=(auto, auto), strict=False)
    with pytest.raises(AssertionError, match="Guard failed"):
        program.module()(torch.ones(6), torch.ones(5))
    program.example_inputs = None
    assert torch.equal(program.module()(torch.ones(6), torch.ones(5)), torch.full((6,), 2.0))  # the traced branch
    for model_type in ("llama", "bert"):  # a decode step and a forward
        _, text = export_test(model_type, "tensor-len")
        assert "for saved in (False, True):" in text
        assert "exported = saved_and_loaded(program) if saved else program" in text
        assert text.count("saved_and_loaded(program)") == 2  # the helper's definition and its one call


def test_the_vision_grid_loops_pr_text_names_the_api_it_adds():
    from exportsmith.upstream import pr_description

    text = pr_description("vision-grid-loops", [], {}, TF.version, [])
    assert "optional `num_patches`" in text and "default None, ignored in eager" in text


def test_an_audio_models_pr_test_gives_its_audio_in_the_layout_it_runs_at():
    """Mimi takes raw audio as (batch, 1, samples): its PR test's inputs have that layout (they had (batch, samples),
    which its encoder cannot unpack), at the harness's three lengths."""
    from exportsmith.upstream_tests import export_test

    _, text = export_test("mimi_encoder", "conv-padding-ints")
    for size in ("(2, 1, 4400)", "(1, 1, 3200)", "(3, 1, 5600)"):
        assert f"torch.randn({size}" in text, size
