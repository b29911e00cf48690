"""The committed `generated/` models: each verifies, loads the original's checkpoints, and refuses a wrong version."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exportsmith.generate import generated_modules
from exportsmith.verify import tiny_config, verify_model
from exportsmith.verify.check import DIM_STYLES

ROOT = Path(__file__).parents[1]
MODELS = generated_modules(ROOT / "generated")


# The programs each committed model is verified with: decoder LMs decode and prefill; encoder-decoders decode (encoder
# outputs and an EncoderDecoderCache) and a full forward; encoders, vision and audio models one forward.
PROGRAMS = {"t5": {"decode", "forward"}, "bert": {"forward"}, "vit": {"forward"}, "wav2vec2": {"forward"}}
DECODERS = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "mixtral", "olmo2", "granite", "qwen2_moe"}


def test_the_committed_models_are_the_promised_ones():
    # decoders, an encoder, an encoder-decoder, a vision and an audio model: CI's subset of every task
    assert DECODERS | set(PROGRAMS) <= set(MODELS)


# Committed models that do not verify yet: model -> (failure kind, why). The test fails when the failure changes,
# and when the model starts verifying (then remove it from here).
KNOWN_FAILURES: dict[str, tuple[str, str]] = {}


@pytest.mark.parametrize("model", MODELS)
def test_generated_model_verifies(model: str):
    result = verify_model(model, package="generated")
    if model in KNOWN_FAILURES:
        kind, why = KNOWN_FAILURES[model]
        assert not result.ok, f"{model} verifies now: remove it from KNOWN_FAILURES"
        assert result.failure == kind, result.summary
        pytest.xfail(why)
    assert result.ok, result.summary
    assert result.eager_identical
    assert {record.program for record in result.cases} == PROGRAMS.get(model, {"decode", "prefill"})
    assert {record.dims for record in result.cases} == set(DIM_STYLES)
    assert any(record.batch == 1 for record in result.cases)
    if "decode" in PROGRAMS.get(model, {"decode"}):
        # what users of an LM do: the first decode step of a 1-token prompt, and greedy loops that match generate()
        first_steps = {(r.batch, r.new_tokens, r.past) for r in result.cases if r.program == "decode"}
        assert {(1, 1, 1), (4, 1, 1), (1, 2, 1), (1, 1, 2)} <= first_steps
        assert len(result.greedy) == 6, result.greedy


def test_checkpoint_of_the_original_loads_into_the_generated_class(tmp_path):
    import generated.llama
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    original = LlamaForCausalLM(tiny_config("llama")).eval()
    original.save_pretrained(tmp_path)
    loaded, info = generated.llama.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded) is generated.llama.LlamaForCausalLM
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    ids = torch.randint(0, 100, (1, 6))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids).logits, original(ids).logits)


def test_importing_a_package_built_for_another_version_says_how_to_regenerate(tmp_path):
    package = tmp_path / "generated"
    shutil.copytree(ROOT / "generated", package)
    init = package / "__init__.py"
    text = init.read_text()
    version = text.split('TRANSFORMERS_VERSION = "')[1].split('"')[0]
    init.write_text(text.replace(f'TRANSFORMERS_VERSION = "{version}"', 'TRANSFORMERS_VERSION = "0.0.1"'))
    result = subprocess.run(
        [sys.executable, "-c", "import generated.llama"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert "built for transformers 0.0.1" in message and f"transformers {version} is installed" in message
    assert "exportsmith generate" in message
