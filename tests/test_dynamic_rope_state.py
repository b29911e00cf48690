"""`dynamic_rope_update` (transformers/modeling_rope_utils.py) is refused by `cond-branches`, and this is why: the
dynamic RoPE keeps state across calls (`max_seq_len_cached` only grows, `inv_freq` is a buffer rewritten in a
branch), so its output for one input depends on the inputs of earlier calls. No function of the current inputs
alone, and so no `torch.cond`/`torch.where` rewrite, can be equivalent in eager.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from codemods.cond_branches import CondBranches
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods


def _rope() -> LlamaRotaryEmbedding:
    config = LlamaConfig(
        hidden_size=32,
        num_attention_heads=4,
        max_position_embeddings=16,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    return LlamaRotaryEmbedding(config)


def _cos(rope: LlamaRotaryEmbedding, length: int) -> torch.Tensor:
    x = torch.zeros(1, length, 32)
    return rope(x, torch.arange(length)[None])[0]


def test_dynamic_rope_output_depends_on_earlier_calls():
    fresh = _rope()
    after_long = _rope()
    _cos(after_long, 40)  # grows max_seq_len_cached to 40 and rescales inv_freq for it
    # Same input (20 positions, beyond the original 16), different history, different output
    assert not torch.equal(_cos(fresh, 20), _cos(after_long, 20))
    assert after_long.max_seq_len_cached == 40 and fresh.max_seq_len_cached == 20
    # Back inside the original length both reset to the original frequencies
    assert torch.equal(_cos(fresh, 8), _cos(after_long, 8))


def test_cond_branches_leaves_modeling_rope_utils_unchanged():
    tf = find_transformers()
    path = tf.root / "modeling_rope_utils.py"
    change = run_codemods(path.read_text(), tf.relpath(path), tf.module_name(path), codemods=(CondBranches,))
    assert not change.changed and change.findings == ()
