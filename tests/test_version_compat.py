"""The pipeline on every supported transformers line (4.56.x, 4.57.x, 5.x): discovery, the codemods, vendoring and
verification, with the differences between the lines handled by what the code finds, not by the version number.

CI runs this module again in environments with transformers 4.57 and with the newest 5.x release (`.ci/run`). The
parts that make sense on every line run on every line; generate + verify of the eight decoder LMs into a temporary
package runs on every release but the one `generated/` is committed for, which tests/test_generated_models.py
covers. Known failures are strict
xfails: each asserts its exact failure kind first, so an unrelated failure fails the test and a fix turns it into an
XPASS, which fails until the entry is removed.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from typer.testing import CliRunner

from exportsmith.cli import app
from exportsmith.discover import find_transformers, torch_modeling_files
from exportsmith.generate import generated_version
from exportsmith.verify import verify_model
from exportsmith.verify.check import DIM_STYLES
from exportsmith.verify.inputs import cache_keyword, output_cache
from exportsmith.verify.tiny import init_fields, tiny_config

TF = find_transformers()
MAJOR = int(TF.version.split(".")[0])
ON_4X = MAJOR == 4
ROOT = Path(__file__).parents[1]
COMMITTED = generated_version(ROOT / "generated")
ON_COMMITTED = TF.version == COMMITTED

MODELS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gpt2", "mixtral")
# A name that cannot collide with the committed `generated` package, which refuses to import on another version.
PACKAGE = "compat_generated"

# model -> ((failure kind, a phrase of its message), ...), why: each a strict xfail on the releases it names. Empty: in 4.56/4.57 every
# sdpa mask is built with torch.vmap (removed by vmap-masks), the sliding-window layers' sizes guard on the side of the
# window (sliding-window-cache, both the 4.56 and the 4.57 form) and mixtral loops over the experts hit
# (moe-expert-loop); all eight models now verify on both lines.
KNOWN_FAILURES: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {}


class KnownFailure(AssertionError):
    """The model failed exactly as KNOWN_FAILURES says (the only exception its strict xfail accepts)."""


# --- every line ---------------------------------------------------------------------------------------------------


def test_discovery_skips_tensorflow_and_flax_modeling_files(tmp_path):
    for name in ("modeling_demo.py", "modeling_tf_demo.py", "modeling_flax_demo.py", "modeling_demo_utils.py"):
        (tmp_path / name).write_text("")
    assert [path.name for path in torch_modeling_files(tmp_path)] == ["modeling_demo.py", "modeling_demo_utils.py"]


def test_no_discovered_model_reads_a_tensorflow_or_flax_file():
    names = [path.name for model in TF.models.values() for path in model.modeling]
    assert names and not [name for name in names if name.startswith(("modeling_tf_", "modeling_flax_"))]
    if ON_4X:  # the 4.x wheel ships them, and discovery left them out
        assert (TF.root / "models" / "bert" / "modeling_tf_bert.py").is_file()
        assert [path.name for path in TF.resolve("bert").modeling] == ["modeling_bert.py"]


def test_output_cache_reads_either_field():
    @dataclasses.dataclass
    class Output4x:
        logits: object = None
        past_key_values: object = None

    @dataclasses.dataclass
    class Output5x:
        logits: object = None
        cache: object = None

    assert output_cache(Output4x(past_key_values="kv")) == "kv"
    assert output_cache(Output5x(cache="kv")) == "kv"
    assert output_cache(Output5x()) is None


def test_cache_keyword_and_output_cache_match_the_installed_forward():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_config("llama")).eval()
    keyword = cache_keyword(model)
    assert keyword == ("past_key_values" if ON_4X else "cache")
    with torch.no_grad():
        prefix = model(torch.tensor([[5, 6, 7]]), use_cache=True)
        cache = output_cache(prefix)
        assert isinstance(cache, transformers.DynamicCache) and cache.get_seq_length() == 3
        model(torch.tensor([[8]]), **{keyword: cache}, use_cache=True)
    assert cache.get_seq_length() == 4  # the forward took the cache by that keyword and grew it


def test_init_fields_of_a_plain_config_class_come_from_its_init_chain():
    class Base:
        def __init__(self, pad_token_id=None, **kwargs):
            pass

    class Plain(Base):
        def __init__(self, hidden_size=64, *args, num_layers=2, **kwargs):
            super().__init__(**kwargs)

    assert init_fields(Plain) == {"hidden_size", "num_layers", "pad_token_id"}
    assert "hidden_size" in init_fields(type(tiny_config("llama")))


@pytest.mark.parametrize("model_type", ["kolibri1_1", "pi0", "pi05"])
def test_the_harness_builds_these_types_and_runs_their_inputs_in_eager(model_type: str):
    """Types whose tiny config or inputs the harness once got wrong (5.25: kolibri1_1's index layers collapsed into
    repeats its validator refuses; PI0.5's prompt was left without its camera images)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from exportsmith.verify.check import build_pair, programs_for, run

    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {TF.version} has no {model_type}")
    original, _ = build_pair(model_type, None)
    for program in programs_for(original):
        run(original, program.cases[0])


# --- every release but the committed one: generate + verify into a temporary package ---------------------------

needs_4x = pytest.mark.skipif(not ON_4X, reason="4.x code (vmap-built masks)")
needs_another_release = pytest.mark.skipif(
    ON_COMMITTED, reason=f"on {COMMITTED} the committed generated/ is verified by test_generated_models"
)


@pytest.fixture(scope="module")
def compat_package(tmp_path_factory):
    """The eight models generated from the installed transformers into an importable temporary package."""
    root = tmp_path_factory.mktemp("compat")
    result = CliRunner().invoke(app, ["generate", *MODELS, "--out", str(root / PACKAGE)])
    assert result.exit_code == 0, result.output
    sys.path.insert(0, str(root))
    try:
        yield root / PACKAGE
    finally:
        sys.path.remove(str(root))
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@needs_another_release
def test_generated_package_names_the_installed_version_and_is_up_to_date(compat_package):
    package = importlib.import_module(PACKAGE)
    assert package.TRANSFORMERS_VERSION == importlib.metadata.version("transformers")
    assert set(package.MODELS) == set(MODELS)
    shared = (compat_package / "_shared" / "cache_utils.py").read_text()
    for layer in ("DynamicLayer", "DynamicSlidingWindowLayer", "DynamicCache", "EncoderDecoderCache"):
        assert f"register_cache_pytree_node({layer}" in shared
    if ON_4X:
        _assert_4x_forms(compat_package, shared)
    result = CliRunner().invoke(app, ["check", str(compat_package)])
    assert result.exit_code == 0, result.output


def _assert_4x_forms(compat_package, shared: str) -> None:
    # the sliding layer's token counter changes every call: a dynamic leaf, not a context value
    # (transformers' own class: the vendored subclass of the same name, with the rewritten methods, inherits them)
    assert (
        "register_cache_pytree_node(transformers.cache_utils.DynamicSlidingWindowLayer, "
        'counters=("cumulative_length",))'
    ) in shared
    # the 4.x sparse MoE block loops over every expert under export (its loop over the experts hit is data-dependent)
    mixtral = (compat_package / "mixtral" / "modeling_mixtral.py").read_text()
    assert "for expert_idx in range(expert_mask.shape[0]):" in mixtral
    # both forms of the sliding layer's mask sizes are rewritten (4.56: a tensor offset; 4.57: an int counter)
    assert (
        "past = torch.sym_min(self.get_seq_length(), self.sliding_window - 1)" in shared  # 4.56
        or "kv_length = torch.sym_min(self.cumulative_length, self.sliding_window - 1)" in shared  # 4.57
    )


def _same(before, after) -> bool:
    if isinstance(before, torch.Tensor):
        return isinstance(after, torch.Tensor) and before.dtype == after.dtype and torch.equal(before, after)
    if isinstance(before, dict):
        return before.keys() == after.keys() and all(_same(before[key], after[key]) for key in before)
    if isinstance(before, (list, tuple)):
        return type(before) is type(after) and len(before) == len(after) and all(map(_same, before, after))
    return before == after


@needs_another_release
@pytest.mark.parametrize("record_past", [False, True])
def test_linear_attention_layer_state_round_trips_through_pytree(compat_package, record_past: bool):
    """The linear-attention layer's state, whatever the release gives it (5.25: a tensor token counter
    `cumulative_length_linear` and, when recording, a recurrent-state history), comes back exactly."""
    from torch.utils import _pytree as pytree

    importlib.import_module(PACKAGE)  # registers the cache classes
    layer_class = getattr(transformers.cache_utils, "LinearAttentionLayer", None)
    if layer_class is None:
        pytest.skip(f"transformers {TF.version} has no LinearAttentionLayer")
    layer = layer_class(number_of_states=2)
    if record_past:
        if not hasattr(layer, "activate_past_recording"):
            pytest.skip(f"transformers {TF.version} does not record past states")
        layer.activate_past_recording()
    g = torch.Generator().manual_seed(0)
    for step, length in enumerate((3, 1, 1)):
        for state in range(2):
            layer.update_conv_state(torch.randn(2, 6, length + state, generator=g), state_idx=state)
            layer.update_recurrent_state(torch.randn(2, 2, 4, 4, generator=g), state_idx=state)
    leaves, spec = pytree.tree_flatten(layer)
    rebuilt = pytree.tree_unflatten([leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)
    assert type(rebuilt) is layer_class and vars(rebuilt).keys() == vars(layer).keys()
    for name, value in vars(layer).items():
        assert _same(value, vars(rebuilt)[name]), name
    if hasattr(layer, "cumulative_length_linear"):  # a tensor that grows every step: a leaf, not a constant
        paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(layer)[0]]
        assert ".cumulative_length_linear" in paths
        assert int(rebuilt.get_seq_length()) == int(layer.get_seq_length()) == 5
    spec_loaded = pytree.treespec_loads(pytree.treespec_dumps(spec))
    assert spec_loaded == spec


@needs_another_release
def test_upstream_patches_apply_to_the_installed_transformers_tree(compat_package, tmp_path):
    patches = sorted(compat_package.glob("*/upstream.patch"))
    assert all(path.read_text() for path in patches)  # a model without changes has no patch file
    assert compat_package / "_shared" / "upstream.patch" in patches  # cache_utils.py gets the counters, masks
    for patch in patches:
        for relpath in re.findall(r"^diff --git a/src/transformers/(\S+)", patch.read_text(), re.MULTILINE):
            target = tmp_path / "src" / "transformers" / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(TF.root / relpath, target)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    for patch in patches:
        result = subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, f"{patch}: {result.stderr}"


def known(model: str):
    if model not in KNOWN_FAILURES:
        return model
    return pytest.param(
        model, marks=pytest.mark.xfail(reason=KNOWN_FAILURES[model][1], raises=KnownFailure, strict=True)
    )


@needs_another_release
@pytest.mark.parametrize("model", [known(model) for model in MODELS])
def test_generated_model_verifies_on_another_release(model: str, compat_package):
    result = verify_model(model, package=PACKAGE)
    # every known failure comes after the generated copy was built and matched the original bit for bit in eager
    assert result.eager_identical, result.summary
    if model in KNOWN_FAILURES:
        failures, why = KNOWN_FAILURES[model]
        if not result.ok:
            where = f"{result.message} {result.location}"
            assert any(result.failure == kind and phrase in where for kind, phrase in failures), result.summary
            raise KnownFailure(f"{why}: {result.summary}")
    assert result.ok, result.summary
    assert {record.program for record in result.cases} == {"decode", "prefill"}
    assert {record.dims for record in result.cases} == set(DIM_STYLES)  # sliding-window models in every dims style
    assert any(r.program == "decode" and r.batch == 1 and r.new_tokens == 1 and r.past == 1 for r in result.cases)
    assert len(result.greedy) == 6  # the greedy loops ran (result.ok: they gave generate()'s tokens)


# What vmap-built masks leave in a graph: functorch batching ops and the getitem wrapper's flat_apply
VMAP_MARKERS = ("vmap", "functorch", "flat_apply", "batch_dim")


def _vmap_nodes(program: torch.export.ExportedProgram) -> list[str]:
    return [
        f"{node.op} {node.target}"
        for module in program.graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if any(marker in f"{node.op} {node.target}".lower() for marker in VMAP_MARKERS)
    ]


@needs_4x
@pytest.mark.parametrize("model", ["llama", "gemma2"])
def test_generated_graphs_hold_no_vmap_node(model: str, compat_package):
    from exportsmith.verify.check import build_pair, export_program, programs_for, varying_dims

    _, generated = build_pair(model, PACKAGE)
    for program in programs_for(generated):
        exported = export_program(generated, program.cases[0].inputs(), varying_dims(program))
        assert _vmap_nodes(exported) == [], program.name


@needs_4x
def test_the_original_prefill_graph_holds_vmap_nodes():
    """In 4.x the default sdpa mask is built with torch.vmap: what the test above looks for is there in transformers'
    own llama (its gemma2 does not export at all on 4.56)."""
    from exportsmith.verify.check import build_pair, export_program, programs_for, varying_dims

    original, _ = build_pair("llama", None)
    prefill = next(program for program in programs_for(original) if program.name == "prefill")
    assert _vmap_nodes(export_program(original, prefill.cases[0].inputs(), varying_dims(prefill))) != []
