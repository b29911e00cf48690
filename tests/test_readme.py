"""The README's "Export a model" code, run as written: the export in one process, the load in a fresh one, and the
program at the first decode step of a 1-token prompt (a 1-token cache, 1 new token), the shape users met rejected."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]

FIRST_STEP = """
import torch
import generated

program = torch.export.load("llama.pt2")
import generated.llama  # only to make the 1-token cache of a prompt
from transformers import LlamaConfig

config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2)
cache = generated.llama.LlamaForCausalLM(config).eval()(torch.tensor([[5]]), use_cache=True).cache
out = program.module()(input_ids=torch.tensor([[7]]), attention_mask=torch.ones(1, 2, dtype=torch.long), cache=cache,
                       use_cache=True)
print(tuple(out.logits.shape), out.cache.get_seq_length())
"""


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Export a model") : text.index("## Commands")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)


def test_the_readme_exports_then_loads_in_a_fresh_process(tmp_path):
    export, load = python_blocks()
    result = run(export, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert {path.name for path in tmp_path.iterdir()} >= {"llama.pt2", "inputs.pt"}
    result = run(load + "\nprint(type(outputs).__name__, tuple(outputs.logits.shape))\n", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "CausalLMOutputWithPast (2, 3, 128)"
    result = run(FIRST_STEP, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "(1, 1, 128) 2"
