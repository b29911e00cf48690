"""The real-configuration set: checkpoint configs written out in the project, loaded with their layers reduced, and
verified end to end through `exportsmith verify --config` (the two smallest here; `tools/real_configs.py` runs all)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exportsmith.cli import app
from exportsmith.verify.real import CONFIG_DIR, DEFAULT_LAYERS, LAYERS, real_config, real_config_names
from exportsmith.verify.real import sliding_window, window_cases

ROOT_TOOLS = Path(__file__).parents[1] / "tools"

# The popular checkpoints the set must hold (issue: at least 10)
CHECKPOINTS = {
    "meta-llama--Llama-3.2-1B",
    "Qwen--Qwen2.5-0.5B",
    "Qwen--Qwen3-0.6B",
    "HuggingFaceTB--SmolLM2-360M",
    "google--gemma-3-1b-it",
    "openai-community--gpt2",
    "allenai--OLMo-2-0425-1B",
    "microsoft--Phi-3-mini-4k-instruct",
    "mistralai--Mistral-7B-v0.1",
    "mistralai--Mixtral-8x7B-v0.1",
}


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_the_set_holds_the_popular_checkpoints():
    assert CHECKPOINTS <= set(real_config_names())
    assert run("list", "--real-configs").stdout.split() == real_config_names()


@pytest.mark.parametrize("name", real_config_names())
def test_a_real_config_keeps_every_field_but_the_layer_count(name):
    fields = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    config = real_config(name)
    assert config.model_type == fields["model_type"]
    assert config.num_hidden_layers == LAYERS.get(name, DEFAULT_LAYERS)
    for key in (
        "vocab_size",
        "hidden_size",
        "n_embd",
        "d_model",
        "intermediate_size",
        "head_dim",
        "num_key_value_heads",
    ):
        if key in fields:
            assert getattr(config, key) == fields[key], key
    for key, value in config.to_dict().items():  # lists of one entry per layer are cut to the new count
        if key.startswith("layer_types"):
            assert len(value) == config.num_hidden_layers


def test_gemma3_keeps_both_kinds_of_layer_and_the_windowed_models_get_window_cases():
    assert set(real_config("google--gemma-3-1b-it").layer_types) == {"sliding_attention", "full_attention"}
    windows = {name: sliding_window(real_config(name)) for name in real_config_names()}
    assert windows["google--gemma-3-1b-it"] == 512
    assert windows["microsoft--Phi-3-mini-4k-instruct"] == 2047
    assert windows["mistralai--Mistral-7B-v0.1"] == 4096
    assert windows["Qwen--Qwen2.5-0.5B"] is None  # `use_sliding_window: false`
    assert windows["meta-llama--Llama-3.2-1B"] is None
    decode, prefill = window_cases(real_config("google--gemma-3-1b-it"))
    straddle, crossed = decode
    assert straddle.past < 512 < straddle.past + straddle.new_tokens  # a chunk across the window
    assert crossed.past > 512 and crossed.new_tokens == 1
    assert prefill[0].new_tokens > 512
    assert window_cases(real_config("meta-llama--Llama-3.2-1B")) == ((), ())


def test_verify_config_runs_the_whole_harness_at_real_widths():
    result = run("verify", "--config", "openai-community--gpt2")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("gpt2: ok ")


def test_verify_config_takes_a_config_json_and_a_layer_count(tmp_path, monkeypatch):
    import exportsmith.verify
    from exportsmith.verify import VerifyResult
    from exportsmith.verify.check import CaseRecord

    seen = []

    def verify_model(model_type, package, subject, config):
        seen.append((model_type, config))
        return VerifyResult(model_type, ok=True, cases=[CaseRecord("decode", "x", 1, 1, 1, max_diff=0.0)])

    monkeypatch.setattr(exportsmith.verify, "verify_model", verify_model)
    path = tmp_path / "config.json"
    path.write_text((CONFIG_DIR / "HuggingFaceTB--SmolLM2-360M.json").read_text())
    result = run("verify", "--config", str(path), "--layers", "1")
    assert result.exit_code == 0, result.output
    [(model_type, config)] = seen
    assert model_type == "llama" and config.num_hidden_layers == 1 and config.hidden_size == 960


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "no-such-checkpoint"], "error: no real config 'no-such-checkpoint'; one of: "),
        (["--config", "openai-community--gpt2", "llama"], "error: --config verifies the one model type of the config"),
        (["llama", "--layers", "2"], "error: --layers goes with --config"),
        (["--config", "openai-community--gpt2", "--layers", "0"], "error: --layers must be 1 or more"),
    ],
)
def test_verify_config_refuses_bad_input_in_one_line(args, message):
    result = run("verify", *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)


def test_verify_config_refuses_a_file_that_is_not_a_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 8}')
    result = run("verify", "--config", str(path))
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {path}: not a transformers config (no model_type)"


def test_a_checkpoint_over_the_memory_budget_runs_only_when_named_and_the_table_says_why():
    import importlib.util

    spec = importlib.util.spec_from_file_location("real_configs_tool", ROOT_TOOLS / "real_configs.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    names = real_config_names()
    assert "mistralai--Mixtral-8x7B-v0.1" in names
    assert tool.within_budget(names) == [name for name in names if name != "mistralai--Mixtral-8x7B-v0.1"]
    row = next(line for line in tool.markdown({}, names).splitlines() if "Mixtral" in line)
    assert "not run: one float32 layer is 6.9 GB" in row and "over the 8 GB budget" in row
